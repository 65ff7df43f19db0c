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
//!   parity chunk that does not match the data changes the root.

use crate::device::AlignedBuf;
use crate::engine::Shared;
use crate::format::SECTOR_BYTES;
use crate::slots::{Pinned, SlotState};
use crate::status::Counters;
use crate::stripe::Rebuilt;
use crate::ArrayError;
use serde::Serialize;

/// What a scrub found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ScrubReport {
    pub stripes_checked: u64,
    /// Chunks that were unreadable, stale, corrupt or not the stripe's.
    pub chunks_bad: u64,
    pub chunks_repaired: u64,
    /// Stripes with fewer than K good chunks: their data is lost.
    pub stripes_unrecoverable: u64,
}

impl Shared {
    /// Rewrites the chunks of `rebuilt` found bad that are on healthy
    /// members (the rest are on failed ones); returns how many were bad
    /// there and how many were rewritten. A rewrite that fails is left for
    /// the next read or scrub.
    pub(crate) fn repair(&self, slot: u64, rebuilt: &Rebuilt) -> (u64, u64) {
        let g = &self.geometry;
        let bad: Vec<usize> = rebuilt
            .bad
            .iter()
            .copied()
            .filter(|&j| self.members.readable(g.place(slot, j).0).is_some())
            .collect();
        Counters::add(&self.counters.checksum_errors, bad.len() as u64);
        let mut header = AlignedBuf::zeroed(SECTOR_BYTES);
        let mut repaired = 0;
        for &j in &bad {
            let (bytes, payload) = rebuilt.chunk(g, j);
            header.copy_from_slice(&bytes);
            let (member, row) = g.place(slot, j);
            let written = self
                .members
                .readable(member)
                .is_some_and(|device| device.write_vectored_at(&[&header, payload], g.row_offset(row)).is_ok());
            if written {
                repaired += 1;
            }
        }
        Counters::add(&self.counters.chunks_repaired, repaired);
        (bad.len() as u64, repaired)
    }

    /// Checks every stripe, one at a time, repairing what it can.
    pub fn scrub(&self) -> Result<ScrubReport, ArrayError> {
        let mut report = ScrubReport::default();
        for slot in 0..self.geometry.slot_count() {
            self.scrub_slot(slot, &mut report);
        }
        Ok(report)
    }

    /// Checks the stripe in `slot`, if it holds one on the members.
    pub(crate) fn scrub_slot(&self, slot: u64, report: &mut ScrubReport) {
        let mut pinned = Pinned::new(&self.pins);
        let sequence = {
            let index = self.index();
            let s = index.slots.get(slot);
            let on_members =
                matches!(s.state, SlotState::Sealed | SlotState::Checkpoint) && !index.resident.contains_key(&slot);
            if !on_members {
                return;
            }
            pinned.add(slot);
            s.sequence
        };
        report.stripes_checked += 1;
        match self.rebuild_stripe(slot, sequence, true) {
            Ok(rebuilt) => {
                report.chunks_bad += rebuilt.bad.len() as u64;
                report.chunks_repaired += self.repair(slot, &rebuilt).1;
                self.recycle_area(std::sync::Arc::new(rebuilt.area));
            }
            Err(_) => report.stripes_unrecoverable += 1,
        }
    }
}
