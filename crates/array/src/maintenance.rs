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
use std::sync::atomic::Ordering;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long the thread sleeps when nobody wakes it.
const IDLE_WAIT: Duration = Duration::from_millis(500);
/// Rounds of collection one wake-up runs at most before it looks at
/// checkpoints and stopping again.
const GC_ROUNDS_PER_WAKE: usize = 64;
/// A sync frees drained slots once half a window's worth of them wait.
const DRAIN_SYNC_DIVISOR: usize = 2;
/// The longest rest after a batch of work opening left for later
/// (`batches_in_background`).
const BACKGROUND_REST_MAX: Duration = Duration::from_millis(20);

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
    /// Work opening left for after it, done now by one that needs all of
    /// it: `batch` (false once none is left) until it is, holding `one`
    /// so that the background thread does not do the same batches.
    pub(crate) fn every_batch(
        &self,
        one: &Mutex<()>,
        batch: impl Fn() -> Result<bool, crate::error::ArrayError>,
    ) -> Result<(), crate::error::ArrayError> {
        let _one = one.lock().unwrap_or_else(|p| p.into_inner());
        while batch()? {}
        Ok(())
    }

    /// The same work in a background thread: a batch at a time under
    /// `one`, stopping between batches once the array closes (whoever
    /// needs the rest then does it). An error ends it, with the event
    /// `event` makes of it: what needs the rest fails with it again.
    ///
    /// While clients make requests it takes at most half the time: after
    /// each batch it sleeps as long as the batch took (at most
    /// `BACKGROUND_REST_MAX`). A batch holds the index's write lock; with
    /// no rest, a client waiting for the index waited through batch after
    /// batch (tens of ms): the thread that let the lock go took it again
    /// before the client woken for it ran, as far as timers showed.
    pub(crate) fn batches_in_background(
        &self,
        one: &Mutex<()>,
        batch: impl Fn() -> Result<bool, crate::error::ArrayError>,
        event: impl Fn(String) -> crate::events::What,
    ) {
        let requests = || self.stripes.counters.client_requests.load(Ordering::Relaxed);
        let mut seen = requests();
        while !self.maintenance.stopped() {
            let more = {
                let _one = one.lock().unwrap_or_else(|p| p.into_inner());
                // Timed from when `one` is held: waiting for whoever did
                // the rest of the work is not this thread's to rest for.
                let started = Instant::now();
                batch().map(|more| (more, started.elapsed()))
            };
            let took = match more {
                Ok((true, took)) => took,
                Ok((false, _)) => return,
                Err(error) => {
                    self.events.record(event(error.to_string()));
                    return;
                }
            };
            let now = requests();
            if now != seen {
                std::thread::sleep(took.min(BACKGROUND_REST_MAX));
            }
            seen = now;
        }
    }

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
                let _ = self.checkpoint();
            } else if self.needs_checkpoint() {
                // A failure is reported when a writer needs the checkpoint.
                let _ = self.checkpoint_as_needed();
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
        let window = self.window_slots() as usize;
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
        let window = self.window_slots() as usize;
        let index = self.catalog.index();
        !index.drain_after_user.is_empty()
            && index.slots.usable_count() < window / CHECKPOINT_WINDOW_LOW_DIVISOR as usize
    }

    /// Whether the window is running low while free slots lie outside it,
    /// or there is no checkpoint and enough free slots for a window.
    pub(crate) fn needs_checkpoint(&self) -> bool {
        let window = self.window_slots() as usize;
        // Not under the index's lock: the superblock's is held across I/O.
        let has_checkpoint = self.stripes.members.superblock().checkpoint.is_some();
        let index = self.catalog.index();
        let (usable, free) = (index.slots.usable_count(), index.slots.free_count());
        match index.slots.window() {
            Some(_) => {
                usable < window / CHECKPOINT_WINDOW_LOW_DIVISOR as usize
                    && free > usable + self.checkpoint_reserve(&index)
            }
            None => free >= window / 2 && !has_checkpoint,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    /// Background batches rest as long as they took while clients make
    /// requests, and run back to back while none does. It failed (the
    /// busy run took as long as the idle one) before the rest: a client
    /// waiting for the index's lock then waited through batch after
    /// batch, 114-135 ms at the longest with the replay mapped in the
    /// background (docs/PERFORMANCE.md).
    #[test]
    fn background_batches_leave_clients_half_the_time() {
        let array = crate::gc::tests::memory_array();
        let shared = &array.shared;
        let one = Mutex::new(());
        const BATCHES: u32 = 10;
        const BATCH: Duration = Duration::from_millis(5);
        let run = |busy: bool| {
            let left = std::sync::atomic::AtomicU32::new(BATCHES);
            let started = Instant::now();
            shared.batches_in_background(
                &one,
                || {
                    std::thread::sleep(BATCH);
                    if busy {
                        shared.stripes.counters.client_requests.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(left.fetch_sub(1, Ordering::Relaxed) > 1)
                },
                |why| crate::events::What::ReplayUnfinished { why },
            );
            started.elapsed()
        };
        let busy = run(true);
        // Each batch but the last rests at least as long as it took.
        assert!(busy >= BATCH * (2 * BATCHES - 1), "busy: {busy:?}");
        let idle = run(false);
        assert!(idle < busy, "idle {idle:?}, busy {busy:?}");
    }
}
