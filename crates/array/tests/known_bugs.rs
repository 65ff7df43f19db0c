//! A known bug, kept as its reproducer (run with `--ignored`): an array
//! at its default exported size (80% of usable), written full in order,
//! reopened, then overwritten at random by 8 threads, sometimes refuses
//! writes with NoSpace although a quarter of its stripes is garbage.
//! What the engine shows then: every slot of the checkpoint window
//! sealed (no usable slot), 2-4 free slots outside it, the checkpoint
//! that would move the window needing 7, and GC needing a window slot
//! for its copies: no way forward. Seen in about one round in three,
//! with and without the separate GC stream, on the code before the
//! intent log's log devices too. Tried and not enough: GC choosing only
//! window victims (worse: thrash, a hang); GC leaving the checkpoint its
//! slots. Likely cause: the checkpoint's reserve is the last checkpoint's
//! size, one slot for the compact map the fill leaves; the overwrites
//! split it into ~94,000 pieces, and the one checkpoint the run takes
//! needs 6 slots and raises the reserve to 7-8, past the free slots left.
//! Sizing the reserve from the current map is the next thing to try.
//! `tests/crash.rs` met it too, with small maps (4+2 of 64 KiB chunks on
//! six 8 MiB members, four clients overwriting at random, at the default
//! export in most seeds): no window slot free, 1-3 free outside it, and
//! each checkpoint taking free slots for its stripes while the old ones it
//! gave back lay outside the new window. Two changes made it rare (80
//! seeds of 6 rounds at the default export: one failed, seed 64, and
//! passed when run again): the window takes the durable
//! checkpoint's slots, and the reserve is sized from the current map at
//! the worst a mapping can cost (`Shared::checkpoint_reserve`). With them
//! this reproducer fails far less often: 6 runs of 6 rounds passed in a
//! row, then a 7th failed in round 4 (on a machine busy with a build;
//! before, it failed about one round in three). In an earlier state of
//! those changes it failed with the window exhausted (usable 0) and 14-15
//! free slots outside it against a reserve of 15: no checkpoint moved the
//! window, and GC found no slot for its copies.
//! Remove the `ignore` once fixed.

mod common;
use common::{create_options, named, open_list};
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use tessera_array::device::MemoryDevice;
use tessera_array::EngineOptions;

#[test]
#[ignore = "known bug: NoSpace on random overwrites of a full array after a restart"]
fn random_overwrites_of_a_full_array_after_a_restart_never_run_out_of_space() {
    for round in 0..6u64 {
        let devices: Vec<Arc<MemoryDevice>> = (0..10).map(|_| Arc::new(MemoryDevice::new(64 << 20))).collect();
        let array =
            tessera_array::create_with(named(&devices), &create_options(8, 2), EngineOptions::default()).unwrap();
        let size = array.logical_bytes();
        let chunk = vec![7u8; 1 << 20];
        let mut at = 0;
        while at < size {
            let len = (size - at).min(1 << 20) as usize;
            array.write(at, &chunk[..len], false).unwrap();
            at += len as u64;
        }
        drop(array);
        let array = Arc::new(tessera_array::open_with(open_list(&devices, &[]), EngineOptions::default()).unwrap());
        let blocks = size / 4096;
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let array = array.clone();
                std::thread::spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(round * 100 + t);
                    let data = vec![t as u8; 4096];
                    for i in 0..blocks / 8 {
                        if let Err(e) = array.write(rng.gen_range(0..blocks) * 4096, &data, false) {
                            return Some((i, e.to_string()));
                        }
                    }
                    None
                })
            })
            .collect();
        let errors: Vec<_> = threads.into_iter().filter_map(|t| t.join().unwrap()).collect();
        assert!(errors.is_empty(), "round {round}: {errors:?}");
    }
}
