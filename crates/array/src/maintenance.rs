//! Background work: one thread that syncs slots that drained free, writes
//! checkpoints before the window runs out, and collects garbage before
//! free slots do, so that writers rarely find any of it to do themselves.
//!
//! # Guarantees
//!
//! - It takes the same locks as a writer, for as short a time, and holds
//!   none of them across I/O; a round of collection or a checkpoint never
//!   stalls a client for longer than one stripe's packing.
//! - It is woken when a slot is taken and otherwise looks twice a second;
//!   dropping the array stops it before the members' threads stop.

use crate::engine::Shared;
use crate::limits::CHECKPOINT_WINDOW_LOW_DIVISOR;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// How long the thread sleeps when nobody wakes it.
const IDLE_WAIT: Duration = Duration::from_millis(500);
/// Rounds of collection one wake-up runs at most before it looks at
/// checkpoints and stopping again.
const GC_ROUNDS_PER_WAKE: usize = 64;
/// A sync frees drained slots once half a window's worth of them wait.
const DRAIN_SYNC_DIVISOR: usize = 2;

#[derive(Default)]
pub struct Signal {
    state: Mutex<(bool, bool)>,
    changed: Condvar,
}

impl Signal {
    fn lock(&self) -> std::sync::MutexGuard<'_, (bool, bool)> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Asks the thread to look now.
    pub fn wake(&self) {
        self.lock().0 = true;
        self.changed.notify_one();
    }

    pub fn stop(&self) {
        self.lock().1 = true;
        self.changed.notify_one();
    }

    pub fn stopped(&self) -> bool {
        self.lock().1
    }

    /// Waits for a wake-up or the idle time; true once stopped.
    fn wait(&self) -> bool {
        let mut state = self.lock();
        if !state.0 && !state.1 {
            state = self
                .changed
                .wait_timeout(state, IDLE_WAIT)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        state.0 = false;
        state.1
    }
}

impl Shared {
    /// The maintenance thread's loop, until the array is dropped.
    pub(crate) fn maintain(&self) {
        while !self.maintenance.wait() {
            if self.stripes.members.lost().is_some() {
                continue;
            }
            if self.awaited_user_stripes_due() {
                // A failure is reported when a writer or FLUSH syncs.
                let _ = self.lanes.seal_awaited_user_stripes();
            }
            if let Some(sequence) = self.drain_sync_due() {
                // A failure is reported when a writer or FLUSH syncs.
                let _ = self.lanes.sync_through(sequence);
            }
            if self.catalog.dirty_pages_over_cache() {
                // Only written pages can leave the cache.
                let _ = self.checkpoints.checkpoint();
            } else if self.needs_checkpoint() {
                // A failure is reported when a writer needs the checkpoint.
                let _ = self.checkpoints.checkpoint_as_needed();
            }
            for _ in 0..GC_ROUNDS_PER_WAKE {
                if self.maintenance.stopped() || !self.needs_gc() {
                    break;
                }
                match self.collect_garbage(false) {
                    Ok(Some(0) | None) | Err(_) => break,
                    Ok(Some(_)) => {}
                }
            }
        }
    }

    /// The sequence to sync through, when enough slots wait for a sync to
    /// be free (overwrites empty slots; without FLUSHes nothing would sync
    /// them): half a window's worth, or any once usable slots run low. A
    /// sync costs the members, so it waits until its slots are wanted.
    pub(crate) fn drain_sync_due(&self) -> Option<u64> {
        let window = self.checkpoints.window_slots() as usize;
        let index = self.catalog.index();
        let draining = index.slots.draining_count();
        let low = index.slots.usable_count() < window / CHECKPOINT_WINDOW_LOW_DIVISOR as usize;
        let due = draining >= (window / DRAIN_SYNC_DIVISOR).max(1) || (low && draining > 0);
        due.then(|| index.slots.draining_sequence_max()).flatten()
    }

    /// Whether emptied slots wait for open user stripes while usable
    /// slots run low: the stripes are then sealed short, as a writer
    /// needing room would, instead of waiting for clients to fill them.
    pub(crate) fn awaited_user_stripes_due(&self) -> bool {
        let window = self.checkpoints.window_slots() as usize;
        let index = self.catalog.index();
        !index.drain_after_user.is_empty()
            && index.slots.usable_count() < window / CHECKPOINT_WINDOW_LOW_DIVISOR as usize
    }

    /// Whether the window is running low while free slots lie outside it,
    /// or there is no checkpoint and enough free slots for a window.
    pub(crate) fn needs_checkpoint(&self) -> bool {
        let window = self.checkpoints.window_slots() as usize;
        // Not under the index's lock: the superblock's is held across I/O.
        let has_checkpoint = self.stripes.members.superblock().checkpoint.is_some();
        let index = self.catalog.index();
        let (usable, free) = (index.slots.usable_count(), index.slots.free_count());
        match index.slots.window() {
            Some(_) => {
                usable < window / CHECKPOINT_WINDOW_LOW_DIVISOR as usize
                    && free > usable + self.checkpoints.checkpoint_reserve(&index)
            }
            None => free >= window / 2 && !has_checkpoint,
        }
    }
}
