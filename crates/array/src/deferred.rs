//! The work opening leaves for after it, a layer over the index and the
//! lanes: the slot table's pages it did not read (`slot_loader`) and the
//! records of a replay it did not map (`replay`). Each is done a batch at
//! a time by a background thread, and at once, all of it, by whatever
//! needs every page or every slot first (`Deferred::finish`): a
//! checkpoint, a scrub, a rebuild, a heal, the engine's check. Garbage
//! collection reads every slot page, and maps a replay's records only
//! as it brings its victims' pages in (`Shared::collect_garbage`).
//!
//! # Guarantees
//!
//! - One finisher of each kind at a time: whoever does the rest of a kind
//!   holds its lock (`slot_loading`, `replay_finishing`) from its first
//!   batch to its last, and the background thread holds it for each of
//!   its batches, so no two of them take the same batch. (A client
//!   request that needs one page reads or maps that page itself,
//!   without the lock: `slot_loader`, `replay`.)
//! - The background threads stop between batches once the array closes
//!   (`Deferred::stop`); whoever needs the rest then does it.
//! - While clients make requests, a background thread takes at most half
//!   the time (`batches_in_background`).

use crate::catalog::Catalog;
use crate::error::ArrayError;
use crate::events::{Events, What};
use crate::lanes::Lanes;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The longest rest after a batch of work opening left for later
/// (`batches_in_background`).
const BACKGROUND_REST_MAX: Duration = Duration::from_millis(20);

/// What opening left for later, and who is doing it.
pub(crate) struct Deferred {
    pub(crate) catalog: Arc<Catalog>,
    /// The tracker's recoverable sequence, for the replayed slots freed
    /// at the end of a replay.
    pub(crate) lanes: Arc<Lanes>,
    pub(crate) events: Arc<Events>,
    /// Held by whoever reads every slot page opening left unread.
    pub(crate) slot_loading: Mutex<()>,
    /// Held by whoever maps the rest of a replay left for after opening.
    pub(crate) replay_finishing: Mutex<()>,
    /// Slot pages read at once (`EngineOptions::open_slot_pages_per_batch`).
    pub(crate) slot_pages_per_batch: usize,
    /// Set once the array closes: background threads stop between batches.
    stopped: AtomicBool,
}

impl Deferred {
    pub fn new(catalog: Arc<Catalog>, lanes: Arc<Lanes>, events: Arc<Events>, slot_pages_per_batch: usize) -> Deferred {
        Deferred {
            catalog,
            lanes,
            events,
            slot_loading: Mutex::new(()),
            replay_finishing: Mutex::new(()),
            slot_pages_per_batch: slot_pages_per_batch.max(1),
            stopped: AtomicBool::new(false),
        }
    }

    /// Every slot page read and every replayed record mapped: what
    /// anything that looks at every slot or the whole map calls first.
    pub fn finish(&self) -> Result<(), ArrayError> {
        self.read_every_slot_page()?;
        self.finish_replay()
    }

    /// Whether anything is left: an unread slot page, or a replay's
    /// records not mapped yet.
    pub fn anything_left(&self) -> (bool, bool) {
        let index = self.catalog.index();
        (index.slots.unread_count() > 0, index.pending.is_some())
    }

    /// Stops the background threads between batches (the array closes).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
    }

    /// Work opening left for after it, done now by one that needs all of
    /// it: `batch` (false once none is left) until it is, holding `one`
    /// so that the background thread does not do the same batches.
    pub(crate) fn every_batch(
        &self,
        one: &Mutex<()>,
        batch: impl Fn() -> Result<bool, ArrayError>,
    ) -> Result<(), ArrayError> {
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
        batch: impl Fn() -> Result<bool, ArrayError>,
        event: impl Fn(String) -> What,
    ) {
        let counters = &self.catalog.stripes.counters;
        let requests = || counters.client_requests.load(Ordering::Relaxed);
        let mut seen = requests();
        while !self.stopped.load(Ordering::Acquire) {
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
            shared.deferred.batches_in_background(
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
