//! A replay mapped after opening: after kill -9, opening reads the
//! window's chunk headers and the summaries of the stripes newer than the
//! checkpoint, then serves; the records are mapped into each map page
//! when something first needs that page, and by a background thread for
//! the rest. Opening so no longer reads the map pages a replay lands in
//! nor maps its records before serving (on a 2-vCPU VM, 1.3-1.4 s of a
//! 2.7-3.2 s opening with a full window of random writes: PERFORMANCE.md,
//! "Opening after kill -9: the replay mapped after serving").
//!
//! # Guarantees
//!
//! - Every page is as eager replay leaves it before anything looks at it:
//!   reads and writes bring a page in through `Catalog::pin_pages` or
//!   `with_mappings`, which map the page's waiting records (in their
//!   stripes' order, as eager replay does) under the same hold of the
//!   index's write lock that finds it in memory. A write's newer version
//!   wins over a replayed record whichever is mapped first (replay maps
//!   only where the map holds nothing newer), so the order between a
//!   client's writes and the replay does not matter; between two records
//!   of one version (a copy garbage collection made, and its original) it
//!   does, and a page's records keep it.
//! - Nothing that looks at the whole map runs before every page is
//!   mapped (`Deferred::finish`): a checkpoint, a scrub, a rebuild, a
//!   heal, the engine's check. So no checkpoint is written, and a crash
//!   before the end opens from the same root and replays the same
//!   stripes. Garbage collection does run: it relocates only what the
//!   pages of its victims' records map, brought in (so mapped) first,
//!   and takes no held slot as a victim (`Shared::collect_garbage`).
//! - A replayed slot gains pieces as its pages are mapped: until every
//!   page is, one left with none is not emptied (`SlotTable::hold`).
//!   Other slots only lose pieces to a replay, so they empty as usual.
//! - Each page is checked as it is mapped, as eager replay checks the
//!   pages it read (`CheckpointFault::Stale`), for a mapping into a
//!   replayed slot that held pieces in the slot table the checkpoint
//!   restored (on a full array, the window's stripes that garbage
//!   collection emptied and wrote again) at a place no record of the
//!   page wrote: the checkpoint's mapping of a block that a stripe the
//!   window should hold overwrote. A page found so is never handed out
//!   (reads and writes of it fail, naming the block and slot), the
//!   replay never finishes (so no checkpoint is written, and what needs
//!   every page fails), and the members' activity records ask the next
//!   opening to map the replay before serving, which finds it again,
//!   refuses the checkpoint and scans every slot. Found while opening
//!   (the intent log's replay), opening starts again so (`open_with`).
//! - Admission counts the waiting records as live beside what they
//!   overwrote: where that refuses a write, the replay is finished and
//!   the write asked about again (`Shared::admit`).
//! - Where a replayed slot's slot table page is not read yet, and where
//!   the records would take too much memory to hold this way, the replay
//!   is mapped before serving, as before.

use crate::deferred::Deferred;
use crate::error::ArrayError;
use crate::events::What;
use crate::index::map_waiting;
use crate::limits::MAP_PAGE_BLOCKS as PAGE;

impl Deferred {
    /// Maps every record a replay left waiting (reading their pages in
    /// batches the cache holds, each batch's mapped under one hold of the
    /// index's write lock, so clients go on between), then ends the
    /// replayed slots' hold.
    pub(crate) fn finish_replay(&self) -> Result<(), ArrayError> {
        if self.catalog.index().pending.is_none() {
            return Ok(());
        }
        self.every_batch(&self.replay_finishing, || {
            self.map_waiting_batch(crate::limits::REPLAY_LATER_BATCH_PAGES)
        })
    }

    /// The background thread's work after opening (`finish_replay`),
    /// stopping between batches once the array closes (the checkpoint
    /// closing writes finishes it). An error is reported as an event: what
    /// needs the page fails with it again.
    pub(crate) fn finish_replay_in_background(&self) {
        self.batches_in_background(
            &self.replay_finishing,
            || self.map_waiting_batch(crate::limits::REPLAY_LATER_BACKGROUND_PAGES),
            |why| What::ReplayUnfinished { why },
        );
    }

    /// Reads and maps a batch of at most `most` waiting pages; false once
    /// none is left (the hold then ended).
    fn map_waiting_batch(&self, most: usize) -> Result<bool, ArrayError> {
        let most = self.catalog.cache_pages().clamp(1, most);
        let pages = match self.catalog.index_mut().pending.as_mut() {
            Some(pending) => pending.next_pages(most),
            None => return Ok(false),
        };
        if pages.is_empty() {
            let synced = self.lanes.tracker.lock().recoverable_through();
            let mut index = self.catalog.index_mut();
            // A page found stale: the replay is never finished, so no
            // checkpoint is written and the next opening replays the same
            // stripes (before serving, as the members' mark asks, and
            // then scans every slot).
            if let Some(((lba, slot), _)) = index.pending.as_ref().and_then(|p| p.stale()) {
                return Err(crate::index::stale_error(lba, slot));
            }
            let mut done = None;
            if index.pending.as_ref().is_some_and(|p| p.pages_left() == 0) {
                done = index.pending.take();
                // Emptied as any slot is, and free at once where what
                // emptied them is synced (as after eager replay, where
                // nothing was written since).
                let emptied = index.slots.release_held();
                index.drain_emptied_now(emptied);
                index.slots.release_drained(synced);
            }
            // The records (~90 MB for a full window) freed with no lock held.
            drop(index);
            drop(done);
            return Ok(false);
        }
        let ranges: Vec<(u64, u64)> = pages.iter().map(|&p| (p * PAGE, (p + 1) * PAGE)).collect();
        // Read in, and mapped under the hold that installs them.
        self.catalog.install_missing(&ranges)?;
        map_waiting(&mut self.catalog.index_mut(), &ranges);
        self.catalog.evict_pages(&mut self.catalog.index_mut());
        Ok(true)
    }
}
