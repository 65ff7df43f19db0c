//! Sequences and the progress of writes and syncs: every stripe sealed
//! takes the next sequence and is in flight until its chunks are on the
//! members; a sync moves `synced_through`. Writers, syncs, checkpoints
//! and the intent log wait on its condvar.
//!
//! # Guarantees
//!
//! - Sequences are handed out once each, consecutively, from 1.
//! - `written_through` never passes a stripe still in flight, and
//!   `recoverable_through` never passes a stripe recovery from the
//!   durable checkpoint would not find (what a FLUSH acknowledges).
//! - The bytes handed to the members and not yet written stay within
//!   `WRITE_BYTES_IN_FLIGHT_MAX` (but for one hand-off that alone is
//!   larger).

use crate::limits::WRITE_BYTES_IN_FLIGHT_MAX;
use std::collections::BTreeSet;
use std::sync::{Condvar, Mutex, MutexGuard};

/// Sequences and the progress of writes and syncs.
#[derive(Default)]
pub(crate) struct TrackerState {
    pub next_sequence: u64,
    /// Sealed stripes not yet on the members.
    pub in_flight: BTreeSet<u64>,
    /// Bytes of stripes handed to the members and not yet written.
    pub submitted_bytes: usize,
    pub synced_through: u64,
    pub syncing: bool,
    /// The first sequence sealed (since the durable checkpoint) in a slot
    /// outside that checkpoint's window, taken early while the next one
    /// was written (`SlotTable::outside_window`): recovery from the
    /// durable checkpoint would not find it, nor anything after it, so
    /// nothing from it on counts as durable until a checkpoint that names
    /// it is (`recoverable_through`).
    pub unnamed_from: Option<u64>,
}

impl TrackerState {
    /// Every stripe up to this sequence is synced and found by recovery
    /// from the durable checkpoint: what a FLUSH acknowledges, and what
    /// a slot that drained, or the intent log's blocks, wait for.
    pub fn recoverable_through(&self) -> u64 {
        match self.unnamed_from {
            Some(first) => self.synced_through.min(first - 1),
            None => self.synced_through,
        }
    }

    /// Every stripe up to this sequence is on the members (not yet synced).
    pub fn written_through(&self) -> u64 {
        match self.in_flight.first() {
            Some(&oldest) => oldest - 1,
            None => self.next_sequence - 1,
        }
    }
}

pub(crate) struct Tracker {
    state: Mutex<TrackerState>,
    pub changed: Condvar,
}

impl Tracker {
    pub fn new() -> Tracker {
        Tracker {
            state: Mutex::new(TrackerState {
                next_sequence: 1,
                ..TrackerState::default()
            }),
            changed: Condvar::new(),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, TrackerState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn wait<'a>(&self, guard: MutexGuard<'a, TrackerState>) -> MutexGuard<'a, TrackerState> {
        self.changed.wait(guard).unwrap_or_else(|p| p.into_inner())
    }

    /// The next `count` sequences (consecutive), registered as in flight
    /// until each is `written`; returns the first.
    pub fn assign_many(&self, count: usize) -> u64 {
        let mut t = self.lock();
        let first = t.next_sequence;
        t.next_sequence += count as u64;
        t.in_flight.extend(first..first + count as u64);
        first
    }

    pub fn last_sequence(&self) -> u64 {
        self.lock().next_sequence - 1
    }

    /// Waits until `bytes` more may be handed to the members.
    pub fn wait_for_room(&self, bytes: usize) {
        let mut t = self.lock();
        while t.submitted_bytes > 0 && t.submitted_bytes + bytes > WRITE_BYTES_IN_FLIGHT_MAX {
            t = self.wait(t);
        }
        t.submitted_bytes += bytes;
    }

    /// Waits until every stripe up to `sequence` is written (not synced).
    pub fn wait_written(&self, sequence: u64) {
        let mut t = self.lock();
        while t.written_through() < sequence {
            t = self.wait(t);
        }
    }

    pub fn written(&self, sequence: u64, bytes: usize) {
        let mut t = self.lock();
        assert!(
            t.in_flight.remove(&sequence),
            "stripe {sequence} reported written twice"
        );
        t.submitted_bytes -= bytes;
        drop(t);
        self.changed.notify_all();
    }
}
