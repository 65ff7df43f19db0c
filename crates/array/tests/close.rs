//! A clean stop (`Array::close`): the next opening reads no stripe header,
//! and the mark it leaves never outlives the opening after it.

use crate::common::{self, named, open_list, written_4_plus_2_on};
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tessera_array::device::{Faults, MemoryDevice, RandomFaults};
use tessera_array::{Array, ArrayError};

fn reopen(devices: &[Arc<MemoryDevice>], missing: &[usize]) -> Array {
    tessera_array::open_with(open_list(devices, missing), tessera_array::EngineOptions::default()).unwrap()
}

/// Power loss: what the members were not made to sync is gone.
fn power_loss(array: Array, devices: &[Arc<MemoryDevice>]) {
    drop(array);
    for d in devices {
        d.crash(0);
    }
}

fn read(array: &Array, offset: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    array.read(offset, &mut out).unwrap();
    out
}

/// After `close`, opening scans no slot and everything reads back; after
/// an opening that writes and FLUSHes, then loses power, the mark is gone
/// (the opening's own activity record, synced first, cleared it) and the
/// window is scanned, so the FLUSHed writes come back. With the opening's
/// first record left out (seen), the stale mark skipped the scan and lost
/// them.
#[test]
fn a_clean_close_skips_the_scan_once_and_only_once() {
    let (devices, array, data) = written_4_plus_2_on(6, 64 << 20, 1, 3 << 20);
    array.close().unwrap();
    drop(array);
    let array = reopen(&devices, &[]);
    let recovery = array.status().unwrap().recovery;
    assert!(recovery.clean_stop, "{recovery:?}");
    assert_eq!(recovery.slots_scanned, 0, "{recovery:?}");
    assert_eq!(read(&array, 0, data.len()), data);
    array.check().unwrap();

    // Written and FLUSHed after a clean opening, then power loss.
    let mut more = vec![0u8; 1 << 20];
    rand::rngs::StdRng::seed_from_u64(2).fill(&mut more[..]);
    let at = 5 << 20;
    array.write(at, &more, false).unwrap();
    array.flush().unwrap();
    power_loss(array, &devices);
    let array = reopen(&devices, &[]);
    let recovery = array.status().unwrap().recovery;
    assert!(!recovery.clean_stop, "{recovery:?}");
    assert!(recovery.slots_scanned > 0, "{recovery:?}");
    assert_eq!(read(&array, at, more.len()), more, "FLUSHed after a clean opening");
    assert_eq!(read(&array, 0, data.len()), data);
    array.check().unwrap();
}

/// A clean stop refuses writes and FLUSH after it (reads go on); an array
/// opened only to be looked at and closed writes no new checkpoint.
#[test]
fn close_refuses_later_writes_and_looking_writes_no_checkpoint() {
    let (devices, array, data) = written_4_plus_2_on(6, 64 << 20, 3, 1 << 20);
    array.close().unwrap();
    assert!(matches!(array.write(0, &[1u8; 4096], false), Err(ArrayError::Closed)));
    assert!(matches!(array.flush(), Err(ArrayError::Closed)));
    assert_eq!(read(&array, 0, data.len()), data);
    let checkpoint = array.status().unwrap().checkpoint_sequence;
    drop(array);
    for _ in 0..2 {
        let array = reopen(&devices, &[]);
        let status = array.status().unwrap();
        assert!(status.recovery.clean_stop, "{:?}", status.recovery);
        array.close().unwrap();
        assert_eq!(array.status().unwrap().checkpoint_sequence, checkpoint);
        assert_eq!(array.status().unwrap().checkpoints_written, 0);
    }
}

/// The mark is trusted only if every healthy member holds it, for the
/// checkpoint the superblocks name: one member whose record names another
/// checkpoint, or has no mark, means a scan. A member that was away is
/// stale and not asked (its chunks are not read either).
#[test]
fn the_mark_counts_only_where_every_healthy_member_holds_it() {
    use tessera_array::activity;
    let devices: Vec<_> = (0..6).map(|_| Arc::new(MemoryDevice::new(64 << 20))).collect();
    let array = tessera_array::create(named(&devices), &tessera_array::CreateOptions::new(4, 2)).unwrap();
    array.write(0, &[7u8; 1 << 20], false).unwrap();
    array.close().unwrap();
    drop(array);
    // Member 5 away while the array is written and closed again.
    let array = reopen(&devices, &[5]);
    assert!(array.status().unwrap().recovery.clean_stop);
    array.write(1 << 20, &[8u8; 1 << 20], false).unwrap();
    array.close().unwrap();
    drop(array);
    let array = reopen(&devices, &[]);
    assert!(array.status().unwrap().recovery.clean_stop);
    assert_eq!(read(&array, 0, 1 << 20), vec![7u8; 1 << 20]);
    assert_eq!(read(&array, 1 << 20, 1 << 20), vec![8u8; 1 << 20]);
    array.close().unwrap();
    drop(array);
    for change in [
        |r: &mut activity::Record| r.clean_at = r.clean_at.map(|s| s - 1),
        |r: &mut activity::Record| r.clean_at = None,
    ] {
        // Every member marked clean again, then member 0's record changed.
        let array = reopen(&devices, &[]);
        array.close().unwrap();
        drop(array);
        let mut record = activity::read(devices[0].as_ref()).expect("a record");
        assert!(record.clean_at.is_some(), "the close marked it");
        change(&mut record);
        activity::write(devices[0].as_ref(), &record).unwrap();
        let array = reopen(&devices, &[]);
        let recovery = array.status().unwrap().recovery;
        assert!(!recovery.clean_stop && recovery.slots_scanned > 0, "{recovery:?}");
        assert_eq!(read(&array, 1 << 20, 1 << 20), vec![8u8; 1 << 20]);
        drop(array);
    }
}

/// A root alone (a spent window's checkpoint that names the last pages
/// again) is as of those pages: the stripes since are in its window, to be
/// replayed. Closing right after one must write a checkpoint of its own
/// before marking the stop clean; it once trusted the root alone and the
/// next opening lost everything written since the pages (seen in the
/// simulation, and here).
#[test]
fn a_root_alone_is_not_a_clean_stop_s_checkpoint() {
    let devices: Vec<_> = (0..6).map(|_| Arc::new(MemoryDevice::new(64 << 20))).collect();
    // No log: FLUSH seals the trims' stripe before the root alone.
    let options = tessera_array::CreateOptions {
        log_bytes: Some(0),
        ..tessera_array::CreateOptions::new(4, 2)
    };
    let array = tessera_array::create(named(&devices), &options).unwrap();
    // 64 KiB at the start of each of 64 map pages (512 blocks each).
    let page = 512 * 4096u64;
    let chunk = vec![0x5au8; 64 << 10];
    for k in 0..64 {
        array.write(k * page, &chunk, false).unwrap();
    }
    array.flush().unwrap();
    array.checkpoint().unwrap();
    // A block trimmed in each: every page changed, no client bytes, so
    // the spent window's checkpoint is a root alone.
    for k in 0..64 {
        array.trim(k * page, 4096, false).unwrap();
    }
    array.flush().unwrap();
    array.checkpoint_as_needed().unwrap();
    assert_eq!(
        array.status().unwrap().checkpoints_root_only,
        1,
        "a root alone was written"
    );
    array.close().unwrap();
    drop(array);
    let array = reopen(&devices, &[]);
    for k in 0..64 {
        let back = read(&array, k * page, chunk.len());
        assert!(back[..4096].iter().all(|&b| b == 0), "page {k}: the trim lost");
        assert!(back[4096..] == chunk[4096..], "page {k}: the data");
    }
    array.check().unwrap();
}

/// kill -9 or power loss at any point of a clean stop (its seal, the log's
/// retirement, its checkpoint, the mark): every FLUSHed write comes back,
/// and the opening after trusts no mark the stop did not finish.
#[test]
fn a_crash_during_close_loses_nothing_flushed() {
    for seed in common::seeds("TESSERA_CLOSE_SEEDS", 0..24) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let (devices, array, data) = written_4_plus_2_on(6, 64 << 20, seed, 2 << 20);
        // FLUSHed small writes after it (in the log), and unflushed ones.
        let mut flushed = data.clone();
        for _ in 0..8 {
            let at = rng.gen_range(0..flushed.len() / 4096) * 4096;
            let block = vec![rng.gen::<u8>(); 4096];
            array.write(at as u64, &block, false).unwrap();
            flushed[at..at + 4096].copy_from_slice(&block);
        }
        array.flush().unwrap();
        array.write(3 << 20, &[9u8; 8192], false).unwrap();
        let dead = Arc::new(AtomicBool::new(false));
        for d in &devices {
            d.set_faults(Faults {
                dead: Some(dead.clone()),
                random: Some(RandomFaults {
                    seed,
                    latency_max_us: 200,
                    ..RandomFaults::default()
                }),
                ..Faults::default()
            });
        }
        let delay = std::time::Duration::from_micros(rng.gen_range(0..12_000));
        let closed = std::thread::scope(|scope| {
            let closing = scope.spawn(|| array.close().is_ok());
            std::thread::sleep(delay);
            dead.store(true, Ordering::SeqCst);
            closing.join().unwrap()
        });
        drop(array);
        let power_loss = seed % 2 == 0;
        for d in &devices {
            d.set_faults(Faults::default());
            let keep = if power_loss {
                rng.gen_range(0..=d.pending_writes())
            } else {
                d.pending_writes()
            };
            d.crash(keep);
        }
        let array = reopen(&devices, &[]);
        let recovery = array.status().unwrap().recovery;
        assert!(
            read(&array, 0, flushed.len()) == flushed,
            "seed {seed} (closed {closed}, {recovery:?}): a FLUSHed write lost"
        );
        array.check().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    }
}

/// A volume deleted and the array stopped cleanly with no stripe sealed
/// since: the clean opening still reads the deleted volume's pages and
/// drains what they held, the other volume reads back, and the counts
/// agree with the map.
#[test]
fn a_volume_deleted_before_a_clean_stop_drains_after_it() {
    let devices: Vec<_> = (0..6).map(|_| Arc::new(MemoryDevice::new(64 << 20))).collect();
    let array = tessera_array::create(named(&devices), &tessera_array::CreateOptions::new(4, 2)).unwrap();
    let scratch = array.create_volume("scratch", 8 << 20).unwrap();
    scratch.write(0, &vec![3u8; 4 << 20], false).unwrap();
    array.write(0, &vec![4u8; 1 << 20], false).unwrap();
    array.flush().unwrap();
    array.close().unwrap();
    drop((scratch, array));
    let array = reopen(&devices, &[]);
    assert!(array.status().unwrap().recovery.clean_stop);
    array.delete_volume("scratch").unwrap();
    array.close().unwrap();
    drop(array);
    let array = reopen(&devices, &[]);
    let status = array.status().unwrap();
    assert!(status.recovery.clean_stop, "{:?}", status.recovery);
    assert_eq!(status.volumes.len(), 1, "{:?}", status.volumes);
    assert_eq!(status.mapped_bytes, 1 << 20, "only the default volume's data is mapped");
    assert!(read(&array, 0, 1 << 20).iter().all(|&b| b == 4));
    array.check().unwrap();
}
