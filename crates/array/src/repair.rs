//! Repair and scrub: chunks found bad are rewritten from the stripe
//! rebuilt around them; scrub reads every chunk of every stripe.
//!
//! # Guarantees
//!
//! - A chunk is rewritten only from a stripe rebuilt and checked against
//!   its Merkle root, only on a healthy member, and only while the slot is
//!   pinned (so it still holds the stripe that was rebuilt).
//! - Scrub takes one stripe at a time: it pins that slot and holds no lock
//!   while it reads, so clients go on meanwhile. A chunk is checked against
//!   its own leaf, and all K+M against the root, which covers parity: a
//!   parity chunk that does not match the data changes the root. Parity
//!   is also encoded afresh from the data and compared, which catches
//!   parity that was wrong when the stripe was sealed (its leaf and the
//!   root were computed over it). One scrub runs at a time, at a rate a
//!   caller chooses.

use crate::counters::Counters;
use crate::engine::Shared;
use crate::error::ArrayError;
use crate::format::SECTOR_BYTES;
use crate::index::Index;
use crate::slots::{Pinned, Slot, SlotState};
use serde::Serialize;

/// What a scrub found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ScrubReport {
    pub stripes_checked: u64,
    /// Chunks that were unreadable, stale, corrupt or not the stripe's.
    pub chunks_bad: u64,
    pub chunks_repaired: u64,
    /// Stripes with fewer than K good chunks: their data is lost.
    pub stripes_unrecoverable: u64,
    /// Stripes whose stored parity is not what their data encodes to.
    pub parity_mismatches: u64,
    /// Bytes read from the members.
    pub bytes_read: u64,
    /// Stripes on the members when the scrub began (its 100%).
    pub stripes_total: u64,
    /// Stopped before the end (the caller asked to).
    pub stopped: bool,
    /// How long it has run, as the rebuild's and the heal's reports say
    /// (the dashboard's time left comes from it).
    #[serde(default)]
    pub milliseconds: u64,
}

/// The longest paced work sleeps at once.
const PACE_SLEEP_MAX: std::time::Duration = std::time::Duration::from_millis(250);

/// Keeps background work (scrub, rebuild) to a rate of bytes a second:
/// `busy_rate` after client requests were seen since the last step,
/// `rate` otherwise (each `None` or 0: no limit). Time not used is not
/// saved up (an idle spell does not buy a burst later).
pub(crate) struct Throttle {
    rate: Option<u64>,
    busy_rate: Option<u64>,
    next: std::time::Instant,
    requests_seen: u64,
}

impl Throttle {
    pub fn new(rate: Option<u64>, busy_rate: Option<u64>) -> Throttle {
        Throttle {
            rate: rate.filter(|&r| r > 0),
            busy_rate: busy_rate.filter(|&r| r > 0),
            next: std::time::Instant::now(),
            requests_seen: 0,
        }
    }

    /// `bytes` more were moved; `counters` say how many client requests
    /// came so far.
    pub fn step(&mut self, bytes: u64, counters: &Counters) {
        let requests = counters.client_requests.load(std::sync::atomic::Ordering::Relaxed);
        let busy = requests != self.requests_seen;
        self.requests_seen = requests;
        let Some(rate) = (if busy { self.busy_rate } else { self.rate }) else {
            return;
        };
        let now = std::time::Instant::now();
        self.next = self.next.max(now) + std::time::Duration::from_secs_f64(bytes as f64 / rate as f64);
        if let Some(ahead) = self.next.checked_duration_since(now) {
            std::thread::sleep(ahead.min(PACE_SLEEP_MAX));
        }
    }
}

/// The long jobs that run one at a time (a scrub, a rebuild, a heal),
/// each with its report so far, for `status`.
#[derive(Default)]
pub(crate) struct Jobs {
    pub scrub: Running<ScrubReport>,
    pub rebuild: Running<crate::rebuild::RebuildReport>,
    pub heal: Running<crate::heal::HealReport>,
}

/// The report of background work running now (a scrub, a rebuild), for
/// `status`; `None` when none runs, which is also what lets one begin.
#[derive(Default)]
pub(crate) struct Running<T>(std::sync::Mutex<Option<T>>);

impl<T: Copy> Running<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<T>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self) -> Option<T> {
        *self.lock()
    }

    /// The work's report so far.
    pub fn set(&self, report: T) {
        *self.lock() = Some(report);
    }

    /// Begins work with `report`, unless some runs (its report is
    /// returned); the guard clears the report when the work ends.
    pub fn begin(&self, report: T) -> Result<RunningGuard<'_, T>, T> {
        let mut running = self.lock();
        if let Some(other) = *running {
            return Err(other);
        }
        *running = Some(report);
        Ok(RunningGuard(self))
    }
}

pub(crate) struct RunningGuard<'a, T: Copy>(&'a Running<T>);

impl<T: Copy> Drop for RunningGuard<'_, T> {
    fn drop(&mut self) {
        *self.0.lock() = None;
    }
}

/// Whether `slot` (`s`) holds a stripe on the members: sealed data or a
/// checkpoint's, not one still being written. What a scrub checks and a
/// rebuild rewrites.
pub(crate) fn on_members(index: &Index, slot: u64, s: &Slot) -> bool {
    matches!(s.state, SlotState::Sealed | SlotState::Checkpoint) && !index.resident.contains_key(&slot)
}

impl Shared {
    /// Checks every stripe, one at a time, repairing what it can.
    pub fn scrub(&self) -> Result<ScrubReport, ArrayError> {
        self.scrub_with(None, |_| true)
    }

    /// [`Shared::scrub`], reading at most `rate` bytes a second from the
    /// members (`None`: as fast as they go), and calling `progress` with
    /// the report so far after each stripe; it stops early when that
    /// returns false. Refused while another scrub runs.
    pub fn scrub_with(
        &self,
        rate: Option<u64>,
        mut progress: impl FnMut(&ScrubReport) -> bool,
    ) -> Result<ScrubReport, ArrayError> {
        self.deferred.finish()?;
        // The stripes on the members when it begins, as a rebuild takes
        // them (so the total counted and those checked agree whatever
        // clients write meanwhile): counted first, then listed and checked
        // a chunk of slots at a time, as a list of every one would cost 16
        // bytes a stripe (3 GB at 100 TiB).
        let began = self.lanes.tracker.last_sequence();
        self.lanes.tracker.wait_written(began);
        let there = |index: &Index, slot, s: &Slot| on_members(index, slot, s) && s.sequence <= began;
        let mut report = ScrubReport {
            stripes_total: self.catalog.count_where(there),
            ..ScrubReport::default()
        };
        let Ok(_running) = self.jobs.scrub.begin(report) else {
            return Err(ArrayError::ScrubRunning);
        };
        let mut throttle = Throttle::new(rate, rate);
        let started = std::time::Instant::now();
        'chunks: for range in self.catalog.slot_chunks() {
            for (slot, _) in self.catalog.slots_where(range, there) {
                let read_before = report.bytes_read;
                self.scrub_slot(slot, &mut report);
                report.milliseconds = started.elapsed().as_millis() as u64;
                self.jobs.scrub.set(report);
                throttle.step(report.bytes_read - read_before, &self.stripes.counters);
                if !progress(&report) {
                    report.stopped = true;
                    break 'chunks;
                }
            }
        }
        self.events.record(crate::events::What::ScrubEnded {
            stripes_checked: report.stripes_checked,
            chunks_bad: report.chunks_bad,
            chunks_repaired: report.chunks_repaired,
            stopped: report.stopped,
        });
        Ok(report)
    }

    /// Checks the stripe in `slot`, if it holds one on the members.
    pub(crate) fn scrub_slot(&self, slot: u64, report: &mut ScrubReport) {
        let mut pinned = Pinned::new(&self.catalog.pins);
        let sequence = {
            let index = self.catalog.index();
            let s = index.slots.get(slot);
            if !on_members(&index, slot, &s) {
                return;
            }
            pinned.add(slot);
            s.sequence
        };
        report.stripes_checked += 1;
        let g = &self.stripes.geometry;
        report.bytes_read += (g.width() * (g.chunk_bytes + SECTOR_BYTES)) as u64;
        match self.stripes.rebuild_stripe(slot, sequence, true) {
            Ok(rebuilt) => {
                report.chunks_bad += rebuilt.bad.len() as u64;
                report.chunks_repaired += self.stripes.repair(slot, &rebuilt).1;
                if !self.stripes.parity_matches(&rebuilt) {
                    report.parity_mismatches += 1;
                }
                self.stripes.recycle_area(std::sync::Arc::new(rebuilt.area));
            }
            Err(_) => report.stripes_unrecoverable += 1,
        }
    }
}
