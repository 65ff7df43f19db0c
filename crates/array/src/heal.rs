//! Heal: redundancy restored without a new drive, on arrays with more
//! members than a stripe is wide (N > K+M).
//!
//! Stripes rotate over the members, so while a member is out some slots
//! have no chunk on it. A stripe with a chunk on an out member survives
//! fewer failures than M; healing relocates its live data, as garbage
//! collection does, into new stripes, and the allocator puts new stripes
//! in slots whose members are all healthy whenever one is free. The old
//! stripe then drains and is freed like any collected one. What ZFS's
//! dRAID does with distributed spares, for any parity.
//!
//! # Guarantees
//!
//! - Only what GC already does: copies are mapped only where the map still
//!   points at what was copied, and the victims are freed once the copies
//!   are synced. Clients read and write throughout.
//! - It stops (without error) once no free slot on healthy members is
//!   left: moving a stripe into another degraded slot gains nothing.
//!   `stripes_degraded` in the report says what is left.
//! - It runs in batches under the GC lock, so it never stalls a writer
//!   for longer than a batch; one heal runs at a time.
//! - Checkpoint stripes are not moved; the checkpoint written at the end
//!   goes to healthy slots like any new stripe.

use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::engine::{Array, Shared};
use crate::error::ArrayError;
use crate::repair::Throttle;
use crate::slots::SlotState;

/// Stripes relocated between two syncs.
const HEAL_BATCH: usize = 8;

/// What a heal did (so far, while it runs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HealReport {
    /// Data stripes with a chunk on a member that is out, when it began.
    pub stripes_total: u64,
    /// Of those, dealt with (relocated, or gone meanwhile).
    pub stripes_done: u64,
    /// Of those, relocated by this heal.
    pub stripes_healed: u64,
    /// Client bytes copied.
    pub bytes_relocated: u64,
    /// Data stripes still short of full redundancy at the end: no room
    /// left on healthy members, or too few healthy members. (Checkpoint
    /// stripes are not counted: each checkpoint replaces them, and the
    /// map can be found without them.)
    pub stripes_degraded: u64,
    /// Stopped by its caller before the end.
    pub stopped: bool,
    pub milliseconds: u64,
}

impl Array {
    /// Relocates every data stripe that has a chunk on a member that is
    /// out into stripes on healthy members only, while there is room; see
    /// the module's guarantees. At most `rate` client bytes a second
    /// copied; `progress` is called after each batch (false stops it).
    pub fn heal_with(
        &self,
        rate: Option<u64>,
        progress: impl FnMut(&HealReport) -> bool,
    ) -> Result<HealReport, ArrayError> {
        self.shared.heal_with(rate, progress)
    }

    /// The heal running now, its report so far (`None`: none runs).
    pub fn heal_progress(&self) -> Option<HealReport> {
        self.shared.jobs.heal.get()
    }
}

impl Shared {
    /// Whether `slot` (`s`) holds a sealed data stripe, written, with a
    /// chunk on a member that is out.
    fn degraded(&self, index: &crate::index::Index, slot: u64, s: &crate::slots::Slot) -> bool {
        s.state == SlotState::Sealed && !index.resident.contains_key(&slot) && !self.stripes.all_healthy(slot)
    }

    /// Whether a free slot that new stripes may take lies on healthy
    /// members only.
    fn room_on_healthy_members(&self) -> bool {
        let index = self.catalog.index();
        let found = index
            .slots
            .usable_slots()
            .any(|slot| !self.catalog.pins.pinned(slot) && self.stripes.all_healthy(slot));
        found
    }

    fn heal_with(
        &self,
        rate: Option<u64>,
        mut progress: impl FnMut(&HealReport) -> bool,
    ) -> Result<HealReport, ArrayError> {
        self.deferred.finish()?;
        let g = &self.stripes.geometry;
        if g.members <= g.width() {
            return Err(ArrayError::NoRoomToHeal {
                members: g.members,
                width: g.width(),
            });
        }
        self.stripes.members.check_writable()?;
        let started = Instant::now();
        // The degraded stripes there when it begins, counted first, then
        // listed and healed a chunk of slots at a time.
        let began = self.lanes.tracker.last_sequence();
        self.lanes.tracker.wait_written(began);
        let there = |index: &crate::index::Index, slot, s: &crate::slots::Slot| {
            self.degraded(index, slot, s) && s.sequence <= began
        };
        let mut report = HealReport {
            stripes_total: self.catalog.count_where(there),
            ..HealReport::default()
        };
        let Ok(_running) = self.jobs.heal.begin(report) else {
            return Err(ArrayError::HealRunning);
        };
        let mut throttle = Throttle::new(rate, rate);
        let batches = self.catalog.slot_chunks().flat_map(|range| {
            let victims: Vec<u64> = self
                .catalog
                .slots_where(range, there)
                .into_iter()
                .map(|(slot, _)| slot)
                .collect();
            victims.chunks(HEAL_BATCH).map(<[u64]>::to_vec).collect::<Vec<_>>()
        });
        for batch in batches {
            if !self.room_on_healthy_members() {
                break;
            }
            let copied = {
                let _round = self.gc.one_at_a_time();
                // Only this batch relocates while the lock is held.
                let before = self.stripes.counters.gc_bytes_relocated.load(Ordering::Relaxed);
                for &victim in &batch {
                    // Still a degraded stripe (not collected meanwhile,
                    // nor healed by a member's return)?
                    let degraded = {
                        let index = self.catalog.index();
                        self.degraded(&index, victim, &index.slots.get(victim))
                    };
                    if degraded {
                        self.relocate(victim)?;
                        report.stripes_healed += 1;
                    }
                }
                self.lanes
                    .submit(self.lanes.seal_lane(self.lanes.gc_lane()).into_iter().collect())?;
                self.lanes.sync_through(self.lanes.tracker.last_sequence())?;
                self.stripes.counters.gc_bytes_relocated.load(Ordering::Relaxed) - before
            };
            report.bytes_relocated += copied;
            report.stripes_done += batch.len() as u64;
            report.milliseconds = started.elapsed().as_millis() as u64;
            self.jobs.heal.set(report);
            throttle.step(copied, &self.stripes.counters);
            if !progress(&report) {
                report.stopped = true;
                break;
            }
        }
        // The map's checkpoint, where it can be, on healthy members too.
        if report.stripes_healed > 0 {
            let _ = self.checkpoints.checkpoint();
        }
        report.stripes_degraded = self.catalog.count_where(|index, slot, s| self.degraded(index, slot, s));
        report.milliseconds = started.elapsed().as_millis() as u64;
        self.events.record(crate::events::What::HealEnded {
            stripes_healed: report.stripes_healed,
            stripes_degraded: report.stripes_degraded,
            stopped: report.stopped,
        });
        Ok(report)
    }
}
