//! `tessera bench slots`: what the slot-table work a garbage-collection
//! round and a checkpoint do under the index lock costs, against how many
//! slots the array has used.
//!
//! A slot table of `--used` sealed slots (and a sixteenth as many free)
//! is built in memory, each sealed slot holding a random share of a
//! stripe of 8 data chunks of 64 KiB; its window is 8,192 slots, the last
//! 64 sealed and then free ones. Then,
//! `--rounds` times each: a writer's round choosing its victims (the most
//! garbage first), a background round's (cost-benefit), a checkpoint on a
//! full array filling its window with victims (8,192 of them), and a
//! checkpoint finding the stripes sealed since it began, and a scrub
//! listing the stripes on the members (every used slot) at one hold and
//! a chunk of `limits::SLOT_WALK_CHUNK` slots per hold. Each call's time
//! is what the engine holds the index's lock for (the read lock for a
//! round's choice and a scrub's list, the write lock for the
//! checkpoint's). No I/O.

use anyhow::Result;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::collections::BTreeSet;
use std::time::Instant;
use tessera_array::limits::SLOT_WALK_CHUNK;
use tessera_array::slots::{Pins, Slot, SlotState, SlotTable};

/// What a stripe of 8 data chunks of 64 KiB holds at most, as the
/// victims' `fill` (a slot's share of it is its utilization).
const FILL: u64 = 8 * 64 * 1024;
/// Slots in a window, the engine's cap.
const WINDOW: usize = tessera_array::limits::CHECKPOINT_WINDOW_MAX as usize;

pub struct Options {
    pub used: u64,
    pub rounds: usize,
    pub seed: u64,
}

#[derive(Serialize)]
pub struct Timing {
    pub what: &'static str,
    pub median_ms: f64,
    pub max_ms: f64,
    /// Slots the last call returned.
    pub returned: usize,
}

#[derive(Serialize)]
pub struct Report {
    pub used: u64,
    pub slots: u64,
    pub build_s: f64,
    pub timings: Vec<Timing>,
}

pub fn run(options: &Options) -> Result<Report> {
    anyhow::ensure!(options.used > 0, "--used must be at least 1");
    anyhow::ensure!(options.rounds > 0, "--rounds must be at least 1");
    let began = Instant::now();
    let slots = options.used + options.used / 16 + WINDOW as u64;
    let mut table = SlotTable::new(tessera_checksum::Algorithm::Crc32c, slots)
        .with_live_max(FILL * tessera_array::limits::LIVE_SCALE);
    let pins = Pins::new(slots);
    let mut rng = rand::rngs::StdRng::seed_from_u64(options.seed);
    for slot in 0..options.used {
        let stored_bytes = rng.gen_range(4096..=FILL as u32 - 4096);
        table.seal_one_record(slot, slot + 1, stored_bytes, &pins);
    }
    // The window: the last 64 slots sealed (those newer than when the
    // checkpoint began, below), then free ones.
    let first = options.used.saturating_sub(64);
    let window: BTreeSet<u64> = (first..first + WINDOW as u64).collect();
    table.set_window(Some(window.clone()));
    let build_s = began.elapsed().as_secs_f64();
    let next = options.used + 1;
    // The stripes sealed since a checkpoint began: the last 64 (as the
    // engine has them, in the window).
    let start = first;
    let mut timings = Vec::new();
    // `call` returns what it found, and the time the lock is held if that
    // is not the whole call's.
    let mut time = |what: &'static str, call: &dyn Fn() -> (usize, Option<f64>)| {
        let mut ms = Vec::with_capacity(options.rounds);
        let mut returned = 0;
        for _ in 0..options.rounds {
            let t = Instant::now();
            let (found, held_ms) = std::hint::black_box(call());
            ms.push(held_ms.unwrap_or(t.elapsed().as_secs_f64() * 1e3));
            returned = found;
        }
        ms.sort_by(f64::total_cmp);
        timings.push(Timing {
            what,
            median_ms: ms[ms.len() / 2],
            max_ms: ms[ms.len() - 1],
            returned,
        });
    };
    // A round leaves out the slots readers pin (the engine also those
    // open or held, a few); the checkpoint those its window holds.
    let round = |greedy: bool| (table.victims(FILL, next, 64, greedy, |s| pins.pinned(s)).len(), None);
    time("GC round, a writer's (64 victims, most garbage)", &|| round(true));
    time("GC round, background (64 victims, cost-benefit)", &|| round(false));
    time("checkpoint, a full array's window (8,192 victims)", &|| {
        (
            table.victims(FILL, next, WINDOW, true, |s| window.contains(&s)).len(),
            None,
        )
    });
    time("checkpoint, stripes sealed since it began", &|| {
        (table.sealed_after(start).len(), None)
    });
    // A scrub's list of the stripes on the members: every used slot at
    // one hold of the lock, and the same walk a chunk per hold (its
    // longest chunk is the hold).
    let on_members = |(slot, s): (u64, Slot)| {
        matches!(s.state, SlotState::Sealed | SlotState::Checkpoint).then_some((slot, s.sequence))
    };
    time("a scrub's list of stripes, at one hold", &|| {
        (table.iter().filter_map(on_members).count(), None)
    });
    time("a scrub's list of stripes, its longest chunk", &|| {
        let mut longest = 0f64;
        let mut listed = 0;
        for lo in (0..slots).step_by(SLOT_WALK_CHUNK as usize) {
            let t = Instant::now();
            listed += table
                .iter_range(lo, lo + SLOT_WALK_CHUNK)
                .filter_map(on_members)
                .count();
            longest = longest.max(t.elapsed().as_secs_f64() * 1e3);
        }
        (listed, Some(longest))
    });
    Ok(Report {
        used: options.used,
        slots,
        build_s,
        timings,
    })
}

pub fn print(report: &Report) {
    println!(
        "{} used slots of {} (table built in {:.1} s)",
        report.used, report.slots, report.build_s
    );
    println!(
        "{:<52} {:>10} {:>10} {:>9}",
        "work under the index lock", "median ms", "max ms", "returned"
    );
    for t in &report.timings {
        println!(
            "{:<52} {:>10.3} {:>10.3} {:>9}",
            t.what, t.median_ms, t.max_ms, t.returned
        );
    }
}
