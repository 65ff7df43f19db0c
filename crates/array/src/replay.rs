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
//!   reads and writes bring a page in through `Shared::pin_pages` or
//!   `with_pages`, which map the page's waiting records (in their
//!   stripes' order, as eager replay does) under the same hold of the
//!   index's write lock that finds it in memory. A write's newer version
//!   wins over a replayed record whichever is mapped first (replay maps
//!   only where the map holds nothing newer), so the order between a
//!   client's writes and the replay does not matter; between two records
//!   of one version (a copy garbage collection made, and its original) it
//!   does, and a page's records keep it.
//! - Nothing that looks at the whole map or at every slot runs before
//!   every page is mapped (`Shared::finish_replay`): a checkpoint, garbage
//!   collection, a scrub, a rebuild, a heal, the engine's check. So no
//!   checkpoint is written, and a crash before the end opens from the
//!   same root and replays the same stripes.
//! - A replayed slot gains pieces as its pages are mapped: until every
//!   page is, one left with none is not emptied (`SlotTable::hold`).
//!   Other slots only lose pieces to a replay, so they empty as usual.
//! - Admission counts what the waiting records will add as live.
//! - Mapped so only where the checkpoint's map cannot point into a
//!   replayed slot (each was empty in its slot table), so that the check
//!   eager replay makes for that (`CheckpointFault::Stale`) has nothing
//!   to find; where one was not, and where the records would take too much
//!   memory to hold this way, the replay is mapped before serving, as
//!   before.

use crate::engine::{Index, Shared};
use crate::error::ArrayError;
use crate::format::Record;
use crate::limits::{MAP_PAGE_BLOCKS as PAGE, REPLAY_LATER_PLACES_MAX, REPLAY_LATER_SPAN_PAGES_MAX};
use crate::map::Rule;
use crate::slot_set::SlotSet;

/// A replay's records, waiting to be mapped page by page.
pub(crate) struct Pending {
    /// The replayed stripes (sequence, slot, records), in sequence order.
    stripes: Vec<(u64, u64, Vec<Record>)>,
    /// Each record's page, stripe and place in its stripe, once a page it
    /// covers; sorted, so a page's records keep their stripes' order.
    places: Vec<(u64, u32, u32)>,
    /// The pages `places` holds, in order.
    pages: Vec<WaitingPage>,
    /// Pages not mapped yet, and the live units their records stand for.
    left: usize,
    live_left: u128,
    /// Where the background thread looks next (every page before is done).
    cursor: usize,
    newest: Option<u64>,
}

struct WaitingPage {
    page: u64,
    /// Its first place in `places` (the next page's is its end).
    start: usize,
    /// Live units its records stand for, whole (one spanning pages is
    /// counted in each: admission overcounts, never under).
    live: u64,
    done: bool,
}

impl Pending {
    /// The records of `stripes` (sequence, slot, records, in sequence
    /// order) to be mapped page by page, each standing for `live_of` live
    /// units; the stripes back if a record spans more than
    /// `REPLAY_LATER_SPAN_PAGES_MAX` pages (a TRIM of a whole volume) or
    /// they would be more than `REPLAY_LATER_PLACES_MAX` places.
    pub fn new(
        stripes: Vec<(u64, u64, Vec<Record>)>,
        live_of: impl Fn(&Record) -> u64,
    ) -> Result<Pending, Vec<(u64, u64, Vec<Record>)>> {
        let place = |n: usize| u32::try_from(n).expect("a replay's stripes and a stripe's records fit in u32");
        let records: usize = stripes.iter().map(|s| s.2.len()).sum();
        let mut places = Vec::with_capacity(records);
        // Each record's live units, by its place in `stripes` taken as one
        // list (`first`: each stripe's first), and the newest version:
        // gathered in the one pass that reads the records in memory order;
        // looked up in page order, the records themselves (~180 bytes each)
        // took most of the time this takes.
        let (mut lives, mut first, mut newest) = (Vec::with_capacity(records), Vec::with_capacity(stripes.len()), None);
        for (stripe, (_, _, records)) in stripes.iter().enumerate() {
            first.push(lives.len());
            for (at, record) in records.iter().enumerate() {
                lives.push(live_of(record));
                newest = newest.max(Some(record.version()));
                let (lba, end) = record.keys();
                if end <= lba {
                    continue;
                }
                let (first, last) = (lba / PAGE, (end - 1) / PAGE);
                if last - first >= REPLAY_LATER_SPAN_PAGES_MAX || places.len() > REPLAY_LATER_PLACES_MAX {
                    return Err(stripes);
                }
                places.extend((first..=last).map(|page| (page, place(stripe), place(at))));
            }
        }
        // (page, stripe, place) is unique: an unstable sort keeps a
        // page's records in their stripes' order.
        places.sort_unstable();
        let mut pages: Vec<WaitingPage> = Vec::new();
        for (i, &(page, stripe, at)) in places.iter().enumerate() {
            let live = lives[first[stripe as usize] + at as usize];
            match pages.last_mut() {
                Some(last) if last.page == page => last.live += live,
                _ => pages.push(WaitingPage {
                    page,
                    start: i,
                    live,
                    done: false,
                }),
            }
        }
        Ok(Pending {
            left: pages.len(),
            live_left: pages.iter().map(|p| u128::from(p.live)).sum(),
            stripes,
            places,
            pages,
            cursor: 0,
            newest,
        })
    }

    /// The newest version a replayed record has.
    pub fn newest(&self) -> Option<u64> {
        self.newest
    }

    /// Each replayed stripe's sequence and slot.
    pub fn sealed(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.stripes.iter().map(|&(sequence, slot, _)| (sequence, slot))
    }

    /// The slots replayed.
    pub fn slots(&self, count: u64) -> SlotSet {
        let mut slots = SlotSet::empty(count);
        for &(_, slot, _) in &self.stripes {
            slots.insert(slot);
        }
        slots
    }

    /// Pages whose records are not mapped yet.
    pub fn pages_left(&self) -> usize {
        self.left
    }

    /// Live units the records not mapped yet stand for.
    pub fn live_left(&self) -> u128 {
        self.live_left
    }

    /// Indexes in `pages` of the pages keys [lba, end) fall in.
    fn pages_in(&self, lba: u64, end: u64) -> std::ops::Range<usize> {
        if end <= lba {
            return 0..0;
        }
        let (first, last) = (lba / PAGE, (end - 1) / PAGE);
        let from = self.pages.partition_point(|p| p.page < first);
        let to = self.pages.partition_point(|p| p.page <= last);
        from..to
    }

    /// Whether a page of `ranges` has records not mapped yet.
    pub fn waiting_in(&self, ranges: &[(u64, u64)]) -> bool {
        ranges
            .iter()
            .any(|&(lba, end)| self.pages[self.pages_in(lba, end)].iter().any(|p| !p.done))
    }

    /// Up to `most` pages not mapped yet, from the first.
    fn next_pages(&mut self, most: usize) -> Vec<u64> {
        while self.pages.get(self.cursor).is_some_and(|p| p.done) {
            self.cursor += 1;
        }
        self.pages[self.cursor..]
            .iter()
            .filter(|p| !p.done)
            .take(most)
            .map(|p| p.page)
            .collect()
    }
}

/// Maps the waiting records of every page of `ranges` that is in memory
/// (`Map::in_memory`), in their order, where nothing newer is mapped.
pub(crate) fn map_waiting(index: &mut Index, ranges: &[(u64, u64)]) {
    let Some(mut pending) = index.pending.take() else {
        return;
    };
    for &(lba, end) in ranges {
        for i in pending.pages_in(lba, end) {
            let page = &pending.pages[i];
            if page.done || !index.map.in_memory(page.page) {
                continue;
            }
            map_page(&mut pending, i, index);
        }
    }
    index.pending = Some(pending);
}

/// Maps page `i`'s records: for each, its keys in that page.
fn map_page(pending: &mut Pending, i: usize, index: &mut Index) {
    let page = &mut pending.pages[i];
    page.done = true;
    pending.left -= 1;
    pending.live_left -= u128::from(page.live);
    let (p, start) = (page.page, page.start);
    let end = pending.pages.get(i + 1).map_or(pending.places.len(), |next| next.start);
    let (base, limit) = (p * PAGE, (p + 1) * PAGE);
    for &(_, stripe, at) in &pending.places[start..end] {
        let (_, slot, records) = &pending.stripes[stripe as usize];
        let (lba, blocks, version, target, _) = crate::recovery::target_of(*slot, &records[at as usize]);
        // A record of a volume deleted since is not mapped.
        if !index.volumes.admits(lba, version) {
            continue;
        }
        let (from, to) = (lba.max(base), (lba + u64::from(blocks)).min(limit));
        let target = target.advanced_by(from - lba);
        let blocks = u32::try_from(to - from).expect("a page's part of a record");
        let deltas = index.map.insert(from, blocks, version, &target, Rule::IfNotNewer);
        index.slots.account(&deltas);
    }
}

impl Shared {
    /// Maps every record a replay left waiting (reading their pages in
    /// batches the cache holds, each batch's mapped under one hold of the
    /// index's write lock, so clients go on between), then ends the
    /// replayed slots' hold.
    pub(crate) fn finish_replay(&self) -> Result<(), ArrayError> {
        if self.index().pending.is_none() {
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
            |why| crate::events::What::ReplayUnfinished { why },
        );
    }

    /// Reads and maps a batch of at most `most` waiting pages; false once
    /// none is left (the hold then ended).
    fn map_waiting_batch(&self, most: usize) -> Result<bool, ArrayError> {
        let most = self.cache_pages().clamp(1, most);
        let pages = match self.index_mut().pending.as_mut() {
            Some(pending) => pending.next_pages(most),
            None => return Ok(false),
        };
        if pages.is_empty() {
            let synced = self.tracker.lock().recoverable_through();
            let mut index = self.index_mut();
            let mut done = None;
            if index.pending.as_ref().is_some_and(|p| p.pages_left() == 0) {
                done = index.pending.take();
                // Emptied as any slot is, and free at once where what
                // emptied them is synced (as after eager replay, where
                // nothing was written since).
                let emptied = index.slots.release_held();
                crate::write::drain_emptied_now(&mut index, emptied);
                index.slots.release_drained(synced);
            }
            // The records (~90 MB for a full window) freed with no lock held.
            drop(index);
            drop(done);
            return Ok(false);
        }
        let ranges: Vec<(u64, u64)> = pages.iter().map(|&p| (p * PAGE, (p + 1) * PAGE)).collect();
        // Read in, and mapped under the hold that installs them.
        self.install_missing(&ranges)?;
        map_waiting(&mut self.index_mut(), &ranges);
        self.evict_pages(&mut self.index_mut());
        Ok(true)
    }
}
