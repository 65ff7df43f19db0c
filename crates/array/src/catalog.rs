//! The index layer: the index's lock over the map and the slot table
//! (`index::Index`), the slots' pins, and the map cache over the stripe
//! layer. A map page held only as its durable image (evicted, or not
//! looked at since the array opened) is read from its map stripe when a
//! request needs it, outside every lock; pages a write or a collection
//! will change are pinned from before it looks at them until it has
//! changed them; past the cache's size, clean pages are evicted, least
//! recently looked at first.
//!
//! # Guarantees
//!
//! - A page is evicted only while it is as its durable image says (the
//!   map drops a page's image when it changes), never while pinned, and
//!   never while a checkpoint still has to copy it.
//! - A page is installed only if its image is still the one it was read
//!   from (a checkpoint may have moved it meanwhile) and checks: its
//!   digest (a stripe that fails it is rebuilt and repaired, as data is),
//!   every field, every slot it points into sealed. A page a read looks
//!   at once and lets go (`with_mappings`, past a full cache) is checked
//!   so too, its slots in the entries looked at, under the read side,
//!   the map unchanged; one with a replay's records waiting for it, or
//!   in a volume deleted since its image was written, is installed.
//! - No lock is held while an image is read: the map stripes a load
//!   reads are pinned (as a reader pins data stripes), so none is
//!   rewritten under it.
//! - Records of a volume deleted after the page's image was written are
//!   dropped as the page is installed, and the slot table told; a
//!   replay's records waiting for the page are mapped before anything
//!   sees it.
//! - It knows nothing of the layers above it (the write path,
//!   checkpoints, GC, recovery): they reach the index through it.

use crate::counters::Counters;
use crate::error::{ArrayError, CheckpointFault};
use crate::format::{PageImage, SlotEntry};
use crate::index::{map_waiting, Index};
use crate::limits::{SLOT_TABLE_PAGE_SLOTS, SLOT_WALK_CHUNK};
use crate::map::directory::DirEntries;
use crate::map::{LoadedPage, Map, Needed, Overlapping, ReadOnce};
use crate::slots::{Pinned, Pins, SlotState};
use crate::stripes::Stripes;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The index layer (see the module's doc).
pub(crate) struct Catalog {
    /// The stripe layer, which the engine holds too.
    pub stripes: Arc<Stripes>,
    /// The map and the slot table, under the lock whose critical
    /// sections only move indexes (`docs/ENGINE.md`).
    index: RwLock<Index>,
    /// Slots pinned against being rewritten while someone reads them.
    pub pins: Pins,
    page_pins: PinTable,
    /// Bytes of map pages kept in memory (`EngineOptions::map_cache_bytes`).
    cache_bytes: usize,
    /// Slots a walk over every slot looks at per hold of the index's lock
    /// (`EngineOptions::slot_walk_chunk`).
    walk_chunk: u64,
    /// Pages lately read once (`with_mappings`).
    read_once: Doorkeeper,
}

/// Pages lately read once and not kept (`Catalog::with_mappings`): a page
/// read once again while it is still remembered here is kept. Each page
/// has one place, by a hash of its number, which holds the last page
/// read once there: what it remembers ages as pages are read once,
/// whatever their numbers, and it takes 8 bytes a place
/// (`limits::READ_ONCE_PLACES_MAX` at most). A page read once over a
/// cache full of others is kept, and evicts one, only on its second
/// look, as 2Q and TinyLFU's doorkeeper admit: where reads fall at random
/// over a map larger than its cache, the cache holds as many of their
/// pages whichever it keeps, and a lookup that keeps none takes no
/// write lock and evicts nothing; where some pages are looked at again
/// and again, those are kept.
struct Doorkeeper {
    /// A power of two of them.
    places: Box<[std::sync::atomic::AtomicU64]>,
}

impl Doorkeeper {
    /// Places for about one page in 16 KiB of the cache (a power of two,
    /// 64 to `READ_ONCE_PLACES_MAX`).
    fn new(cache_bytes: usize) -> Doorkeeper {
        let places = (cache_bytes / (16 << 10))
            .clamp(64, crate::limits::READ_ONCE_PLACES_MAX)
            .next_power_of_two();
        Doorkeeper {
            places: (0..places).map(|_| std::sync::atomic::AtomicU64::new(0)).collect(),
        }
    }

    /// Whether page `page` is the last read once at its place; it is
    /// from now on.
    fn seen_again(&self, page: u64) -> bool {
        let bits = self.places.len().trailing_zeros();
        let place = (page.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as usize;
        let mark = page + 1;
        self.places[place].swap(mark, std::sync::atomic::Ordering::Relaxed) == mark
    }
}

/// What became of a page read for a look (`Catalog::look_once`).
enum Once<R> {
    /// Looked at once, and the look's answer.
    Done(R),
    /// Moved by a checkpoint meanwhile: to be looked up again.
    Moved,
    /// To be installed: the cache has room for it, or the look needs the
    /// map's own pages (a replay's records wait for it, or a volume was
    /// deleted since its image was written).
    Install(LoadedPage),
}

/// Map pages pinned in memory (`PagePins`), and by how many. Taken under
/// the index's lock (either side) when pinning or evicting; alone when
/// unpinning.
#[derive(Default)]
struct PinTable(std::sync::Mutex<std::collections::HashMap<u64, u32>>);

impl PinTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, u32>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Pages pinned in memory for as long as this lives.
pub(crate) struct PagePins<'a> {
    catalog: &'a Catalog,
    pages: Vec<u64>,
}

impl Drop for PagePins<'_> {
    fn drop(&mut self) {
        let mut pins = self.catalog.page_pins.lock();
        for page in &self.pages {
            let count = pins.get_mut(page).expect("a pinned page is counted");
            *count -= 1;
            if *count == 0 {
                pins.remove(page);
            }
        }
    }
}

impl Catalog {
    pub fn new(stripes: Arc<Stripes>, index: Index, pins: Pins, cache_bytes: usize) -> Catalog {
        Catalog {
            stripes,
            index: RwLock::new(index),
            pins,
            page_pins: PinTable::default(),
            cache_bytes,
            walk_chunk: SLOT_WALK_CHUNK,
            read_once: Doorkeeper::new(cache_bytes),
        }
    }

    /// The catalog, its walks over every slot looking at `slots` per hold
    /// of the index's lock.
    pub fn with_walk_chunk(mut self, slots: u64) -> Catalog {
        self.walk_chunk = slots.max(1);
        self
    }

    /// The array's slots, cut into the ranges a walk over every slot
    /// looks at per hold of the index's lock: a scrub, a rebuild and a
    /// heal list their stripes one range at a time.
    pub fn slot_chunks(&self) -> impl Iterator<Item = std::ops::Range<u64>> {
        let (slots, chunk) = (self.stripes.geometry.slot_count(), self.walk_chunk);
        (0..slots)
            .step_by(chunk as usize)
            .map(move |start| start..(start + chunk).min(slots))
    }

    /// The index, read.
    pub fn index(&self) -> RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Calls `f` with the index and each slot of `range` in pages of the
    /// slot table ever used, in order, holding the index's read lock for
    /// `walk_chunk` slots at a time (`limits::SLOT_WALK_CHUNK`): a walk
    /// over hundreds of millions never holds writers back for long. What
    /// `f` sees of one chunk and the next may be of different instants.
    pub fn walk_slots(&self, range: std::ops::Range<u64>, mut f: impl FnMut(&Index, u64, &crate::slots::Slot)) {
        let mut start = range.start;
        while start < range.end {
            let end = start.saturating_add(self.walk_chunk).min(range.end);
            let index = self.index();
            for (slot, s) in index.slots.iter_range(start, end) {
                f(&index, slot, &s);
            }
            drop(index);
            start = end;
        }
    }

    /// The slots of `range` that `keep` takes, with their sequences, in
    /// order (walked as `walk_slots` walks): one chunk's list for a scrub,
    /// a rebuild or a heal.
    pub fn slots_where(
        &self,
        range: std::ops::Range<u64>,
        keep: impl Fn(&Index, u64, &crate::slots::Slot) -> bool,
    ) -> Vec<(u64, u64)> {
        let mut kept = Vec::new();
        self.walk_slots(range, |index, slot, s| {
            if keep(index, slot, s) {
                kept.push((slot, s.sequence));
            }
        });
        kept
    }

    /// How many of the array's slots `keep` takes (walked as `walk_slots`
    /// walks): counted, not listed.
    pub fn count_where(&self, keep: impl Fn(&Index, u64, &crate::slots::Slot) -> bool) -> u64 {
        let mut count = 0;
        self.walk_slots(0..self.stripes.geometry.slot_count(), |index, slot, s| {
            count += u64::from(keep(index, slot, s));
        });
        count
    }

    /// The index, to change.
    pub fn index_mut(&self) -> RwLockWriteGuard<'_, Index> {
        self.index.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` under the index's lock with the mappings overlapping
    /// blocks [lba, end): the map's own, once every page holding those
    /// keys is in memory (under the write side if it had to load some,
    /// so that none is evicted before `f` has looked); or, where the
    /// range lies in one page not in memory, the cache has no room for
    /// it and it was not read once lately (`Doorkeeper`), the page's as
    /// read for this look alone (`Map::read_once`), under the read side
    /// (the write side where its directory page was read and installed
    /// with it), the map's pages left as they were (`look_once`).
    pub(crate) fn with_mappings<R>(
        &self,
        lba: u64,
        end: u64,
        f: impl FnOnce(&Index, Overlapping<'_>) -> R,
    ) -> Result<R, ArrayError> {
        let f = std::cell::Cell::new(Some(f));
        let run = |index: &Index, once: Option<&ReadOnce>| {
            let mappings = match once {
                Some(once) => once.overlapping(lba, end),
                None => index.map.overlapping(lba, end),
            };
            f.take().expect("called once")(index, mappings)
        };
        self.resident_then(&[(lba, end)], true, &run)
    }

    /// `then` under the index's lock once every page of `ranges` is in
    /// memory: under the read side if they all were, else under the
    /// write side that installed the last of them; or, with `once` (one
    /// range), with the page read for it where `look_once` takes it (its
    /// directory page, read with it, installed first).
    fn resident_then<R>(
        &self,
        ranges: &[(u64, u64)],
        once: bool,
        then: &dyn Fn(&Index, Option<&ReadOnce>) -> R,
    ) -> Result<R, ArrayError> {
        loop {
            let missing = {
                let index = self.index();
                if let Some(refused) = stale(&index, ranges) {
                    return Err(refused);
                }
                let missing = missing(&index.map, ranges);
                if missing.is_empty() && !waiting(&index, ranges) {
                    Counters::add(&self.stripes.counters.map_page_hits, 1);
                    return Ok(then(&index, None));
                }
                missing
            };
            if missing.is_empty() {
                // In memory, with a replay's records waiting for them.
                map_waiting(&mut self.index_mut(), ranges);
                continue;
            }
            let mut loaded = self.read_pages(missing, false)?;
            match once.then(|| the_page_of(ranges, &loaded)).flatten() {
                Some(With::Page) => {
                    let Some(Loaded::Page(page, image)) = loaded.pop() else {
                        unreachable!("one page read")
                    };
                    match self.look_once(&self.index(), page, &image, ranges, then)? {
                        Once::Done(done) => return Ok(done),
                        Once::Moved => continue,
                        Once::Install(page) => loaded.push(Loaded::Page(page, image)),
                    }
                }
                Some(With::Directory) => {
                    // Its directory page read with it: that is installed
                    // (it names the images of many pages), and the page
                    // looked at once under the same hold of the write
                    // side, before an eviction may take the directory
                    // page again.
                    let Some(Loaded::Page(page, image)) = loaded.pop() else {
                        unreachable!("the page read last")
                    };
                    let mut index = self.index_mut();
                    self.install_loaded(&mut index, loaded)?;
                    let looked = self.look_once(&index, page, &image, ranges, then)?;
                    let loaded = match looked {
                        Once::Done(done) => {
                            self.evict_pages(&mut index);
                            return Ok(done);
                        }
                        Once::Moved => continue,
                        Once::Install(page) => vec![Loaded::Page(page, image)],
                    };
                    if let Some(done) = self.install_then_under(&mut index, loaded, ranges, then)? {
                        return Ok(done);
                    }
                    continue;
                }
                None => {}
            }
            let mut index = self.index_mut();
            if let Some(done) = self.install_then_under(&mut index, loaded, ranges, then)? {
                return Ok(done);
            }
        }
    }

    /// Page `page`, read in as held by `image`, looked at once for
    /// `ranges` (which lie in it) under `index` (the read side, or the
    /// write side that installed its directory page) and let go
    /// (counted in `map_pages_read_once`), where the cache has no room
    /// for it and it was not read once so lately (`Doorkeeper`);
    /// otherwise, or where the look needs the map's own pages, given back
    /// to be installed. Checked as `install` checks (`Map::read_once`).
    fn look_once<R>(
        &self,
        index: &Index,
        page: LoadedPage,
        image: &PageImage,
        ranges: &[(u64, u64)],
        then: &dyn Fn(&Index, Option<&ReadOnce>) -> R,
    ) -> Result<Once<R>, ArrayError> {
        let p = page.page();
        // Room below where an eviction brings the map (`Map::evict`):
        // past that, keeping it would evict another, sooner or later.
        let limit = self.cache_limit(index);
        let room = index.map.held_bytes() + page.bytes() <= crate::map::eviction_target(limit);
        // A replay's records waiting for the page are mapped only as it
        // is installed, and so are a deleted volume's records refused.
        let floor = index.volumes.floor(p * PAGE);
        if room || waiting(index, ranges) || stale(index, ranges).is_some() || self.read_once.seen_again(p) {
            return Ok(Once::Install(page));
        }
        let slots = &index.slots;
        let Some(once) = index
            .map
            .read_once(page, image, ranges[0], |slot| slots.may_hold_data(slot))
            .map_err(|source| ArrayError::MapPage { page: p, source })?
        else {
            return Ok(Once::Moved);
        };
        if floor.is_some_and(|floor| !once.versions_at_least(floor)) {
            return Ok(Once::Install(once.into_loaded()));
        }
        Counters::add(&self.stripes.counters.map_pages_read_once, 1);
        Ok(Once::Done(then(index, Some(&once))))
    }

    /// Pins every page holding keys of `ranges` in memory (loading those
    /// that are not) until the pins are dropped.
    pub(crate) fn pin_pages(&self, ranges: &[(u64, u64)]) -> Result<PagePins<'_>, ArrayError> {
        self.resident_then(ranges, false, &|index, _| self.pin(index, ranges))
    }

    /// Pins the pages of `ranges` (all in memory, the index's lock held).
    fn pin(&self, index: &Index, ranges: &[(u64, u64)]) -> PagePins<'_> {
        // Every page number of a range of a few pages (one that does not
        // exist yet may be made, written and evicted by others before
        // this maps into it); of a longer one (a TRIM of a whole device),
        // the pages in memory, emptied ones included (their pins keep
        // their directory pages).
        let mut pages = Vec::new();
        for &(lba, end) in ranges {
            let (first, last) = (lba / PAGE, end.saturating_sub(1) / PAGE);
            if end > lba && last - first < PINNED_PAGES_PER_RANGE_MAX {
                pages.extend(first..=last);
            } else {
                pages.extend(index.map.in_memory_in(lba, end));
            }
        }
        let mut pins = self.page_pins.lock();
        for &page in &pages {
            *pins.entry(page).or_default() += 1;
        }
        PagePins { catalog: self, pages }
    }

    /// Runs `check` under the index's lock with every page in memory,
    /// whatever the cache's size (the engine's check, which compares the
    /// whole map with the slot table): the pages are read with no lock
    /// held, then installed and looked at under one hold of the write
    /// side, so none is evicted between (one a checkpoint moved
    /// meanwhile is read again).
    pub(crate) fn with_every_page<R>(&self, check: impl FnOnce(&Index) -> R) -> Result<R, ArrayError> {
        loop {
            let missing = self.index().map.all_missing();
            let loaded = self.read_pages(missing, true)?;
            let mut index = self.index_mut();
            self.install_loaded(&mut index, loaded)?;
            if index.map.all_missing().is_empty() {
                return Ok(check(&index));
            }
        }
    }

    /// Checks and installs the pages `loaded` (read by `read_pages`);
    /// then, under the same hold of the index's write lock, runs `then` if
    /// every page of `ranges` is in memory; then evicts what the cache
    /// has no room for.
    fn install_then_under<R>(
        &self,
        index: &mut Index,
        loaded: Vec<Loaded>,
        ranges: &[(u64, u64)],
        then: &dyn Fn(&Index, Option<&ReadOnce>) -> R,
    ) -> Result<Option<R>, ArrayError> {
        self.install_loaded(index, loaded)?;
        map_waiting(index, ranges);
        // (A page found stale is refused by the caller's next look.)
        let ready = self::missing(&index.map, ranges).is_empty() && !waiting(index, ranges);
        let done = (ready && stale(index, ranges).is_none()).then(|| then(index, None));
        self.evict_pages(index);
        Ok(done)
    }

    /// Brings the pages `missing` names in, evicting none: read on the I/O
    /// pool (`read_pages`), as the reads only wait on the members, then
    /// installed together. (Replay reads a group of stripes' pages so
    /// before it maps their records, where `pin_pages` would read them one
    /// after another.)
    pub(crate) fn install_pages(&self, missing: Vec<Needed>) -> Result<(), ArrayError> {
        let loaded = self.read_pages(missing, true)?;
        let mut index = self.index_mut();
        self.install_loaded(&mut index, loaded)
    }

    /// The pages of `ranges` not in memory, brought in (`install_pages`).
    pub(crate) fn install_missing(&self, ranges: &[(u64, u64)]) -> Result<(), ArrayError> {
        let missing = missing(&self.index().map, ranges);
        self.install_pages(missing)
    }

    /// Pages of the map the cache holds at once, at the average size of
    /// those in memory (at least 1).
    pub(crate) fn cache_pages(&self) -> usize {
        let index = self.index();
        let per_page = (index.map.bytes() / index.map.page_count().max(1)).max(PAGE_BYTES_LEAST);
        (self.cache_bytes / per_page).max(1)
    }

    /// Evicts clean pages, none pinned, past the cache's limit
    /// (`cache_limit`).
    pub(crate) fn evict_pages(&self, index: &mut Index) {
        let pins = self.page_pins.lock();
        // The pinned pages' directory pages, gathered only if directory
        // pages are to go (most calls evict nothing, or pages alone).
        let dirs = std::cell::OnceCell::new();
        let pinned_dir = |dir: u64| {
            dirs.get_or_init(|| {
                pins.keys()
                    .map(|&p| crate::map::directory::dir_of(p))
                    .collect::<std::collections::HashSet<u64>>()
            })
            .contains(&dir)
        };
        let limit = self.cache_limit(index);
        let evicted = index.map.evict(limit, &|page| pins.contains_key(&page), &pinned_dir);
        Counters::add(&self.stripes.counters.map_pages_evicted, evicted as u64);
    }

    /// The bytes the map may hold before pages are evicted: the cache's
    /// size less what the checkpoints that write the changed pages will
    /// hold (`Map::checkpoint_work_bytes`).
    fn cache_limit(&self, index: &Index) -> usize {
        self.cache_bytes.saturating_sub(index.map.checkpoint_work_bytes())
    }

    /// Whether the pages changed since the last checkpoint, with what the
    /// checkpoint that writes them will hold, fill more than half the
    /// cache, and the cache is full: only a checkpoint that writes them
    /// lets them go.
    pub(crate) fn dirty_pages_over_cache(&self) -> bool {
        let index = self.index();
        let map = &index.map;
        let per_page = map.bytes() / map.page_count().max(1);
        let work = map.checkpoint_work_bytes();
        map.bytes() + work > self.cache_bytes && map.dirty_count() * per_page + work > self.cache_bytes / 2
    }

    /// The pages `missing` names, read from their map stripes (pinned
    /// meanwhile) and decoded, outside every lock, with the directory
    /// pages it names and the pages of its range those name; those a
    /// checkpoint moved meanwhile are left out (the caller looks again).
    /// Directory pages first, then the pages, those whose images lie near
    /// each other in one map stripe read at once (`runs`): a checkpoint
    /// writes its pages' images one after another in page order, so the
    /// pages a replay needs lie in a few long runs, where reading each on
    /// its own took a member read a page (205,000 of them opening a
    /// killed 1 TiB array). With `side_by_side`, the directory pages and
    /// the runs are each read on the I/O pool.
    fn read_pages(&self, missing: Vec<Needed>, side_by_side: bool) -> Result<Vec<Loaded>, ArrayError> {
        let mut pinned = Pinned::new(&self.pins);
        let mut dirs = Vec::new();
        let mut pages = Vec::new();
        {
            let _index = self.index();
            for needed in missing {
                let (Needed::Page(_, image) | Needed::Dir { image, .. }) = &needed;
                for piece in image.all_pieces() {
                    pinned.add(piece.slot);
                }
                match needed {
                    Needed::Page(page, image) => pages.push((page, image)),
                    Needed::Dir { dir, image, pages } => dirs.push((dir, image, pages)),
                }
            }
        }
        let dirs: Vec<Option<DirRead>> = self.read_each(dirs, side_by_side, |(dir, image, ranges)| {
            self.read_dir_and_names(dir, image, ranges)
        })?;
        let mut loaded = Vec::new();
        {
            // Their pages' stripes are pinned before their own pins go
            // (with them, their pages' images stay). Pages already in
            // memory, or emptied there, are not read: `Map::install`
            // would not take them.
            let index = self.index();
            for (dir, mut named) in dirs.into_iter().flatten() {
                named.retain(|&page, _| !index.map.in_memory(page));
                for image in named.values() {
                    for piece in image.all_pieces() {
                        pinned.add(piece.slot);
                    }
                }
                pages.extend(named);
                loaded.push(dir);
            }
        }
        // A batch at a time, in page order (a checkpoint writes images in
        // page order, so batches cut few runs), so that what is read and
        // not decoded yet stays bounded.
        pages.sort_unstable_by_key(|(page, _)| *page);
        while !pages.is_empty() {
            let rest = pages.split_off(pages.len().min(PAGES_DECODED_TOGETHER_MAX));
            loaded.extend(self.read_and_decode(std::mem::replace(&mut pages, rest), side_by_side)?);
        }
        Ok(loaded)
    }

    /// Pages `pages` (each with the image the map holds it as) read and
    /// decoded: their images, then the deltas of those that have one,
    /// each read in runs (a checkpoint writes the deltas it writes side
    /// by side, as it does the images), then decoded on the I/O pool with
    /// `side_by_side`. Pages a checkpoint moved meanwhile are left out.
    fn read_and_decode(
        &self,
        pages: Vec<(u64, Arc<PageImage>)>,
        side_by_side: bool,
    ) -> Result<Vec<Loaded>, ArrayError> {
        let parts: Vec<PagePart> = pages
            .into_iter()
            .map(|(page, image)| PagePart {
                page,
                part: image.clone(),
                held: image,
            })
            .collect();
        let images = self.read_parts(parts, side_by_side)?;
        let deltas: Vec<PagePart> = images
            .iter()
            .filter_map(|(p, _)| {
                let part = p.held.delta.clone()?;
                Some(PagePart {
                    page: p.page,
                    held: p.held.clone(),
                    part,
                })
            })
            .collect();
        let mut deltas: std::collections::HashMap<u64, Vec<u8>> = self
            .read_parts(deltas, side_by_side)?
            .into_iter()
            .map(|(p, stored)| (p.page, stored))
            .collect();
        let with_deltas: Vec<_> = images
            .into_iter()
            .filter_map(|(p, stored)| match p.held.delta {
                None => Some((p, stored, None)),
                // Left out where the page moved meanwhile.
                Some(_) => deltas.remove(&p.page).map(|delta| (p, stored, Some(delta))),
            })
            .collect();
        let pages = self.read_each(with_deltas, side_by_side, |(p, stored, delta)| {
            match self.decode_page(p.page, &stored, delta.as_deref()) {
                Ok(body) => Ok(Some(Loaded::Page(body, p.held))),
                Err(_) if !self.still_held_as(p.page, &p.held) => Ok(None),
                Err(error) => Err(error),
            }
        })?;
        Ok(pages.into_iter().flatten().collect())
    }

    /// The stored bytes of each of `parts`, read in runs (`runs`), side by
    /// side with `side_by_side`.
    fn read_parts(&self, parts: Vec<PagePart>, side_by_side: bool) -> Result<Vec<(PagePart, Vec<u8>)>, ArrayError> {
        let read = self.read_each(runs(parts), side_by_side, |run| self.read_run(run))?;
        Ok(read.into_iter().flatten().collect())
    }

    /// `read` of each of `items`, in order: side by side on the I/O pool
    /// with `side_by_side` where there are several, else one after another
    /// on this thread.
    fn read_each<T: Send, R: Send, E: Send>(
        &self,
        items: Vec<T>,
        side_by_side: bool,
        read: impl Fn(T) -> Result<R, E> + Sync + Send,
    ) -> Result<Vec<R>, E> {
        use rayon::prelude::*;
        match side_by_side && items.len() > 1 {
            true => self
                .stripes
                .io_pool
                .install(|| items.into_par_iter().map(read).collect()),
            false => items.into_iter().map(read).collect(),
        }
    }

    /// Directory page `dir`, held as `image`, read and decoded, with the
    /// images it names of the pages of `ranges` (first, last inclusive,
    /// which may overlap), each once; `None` if a checkpoint moved it
    /// meanwhile.
    fn read_dir_and_names(
        &self,
        dir: u64,
        image: Arc<PageImage>,
        ranges: Vec<(u64, u64)>,
    ) -> Result<Option<DirRead>, ArrayError> {
        Counters::add(&self.stripes.counters.map_page_reads, image.all_pieces().count() as u64);
        let entries = match self.read_directory_page(dir, &image) {
            Ok(entries) => entries,
            Err(_) if !self.dir_still_held_as(dir, &image) => return Ok(None),
            Err(error) => return Err(error),
        };
        let named = ranges
            .iter()
            .flat_map(|&(first, last)| entries.images.range(first..=last))
            .map(|(&p, i)| (p, i.clone()))
            .collect();
        Ok(Some((Loaded::Dir { dir, entries, image }, named)))
    }

    /// The stored bytes of the parts of `run` (see `runs`), read with one
    /// read of their map stripe where there are several; a part whose
    /// bytes so read do not match its digest (or all of them, if the read
    /// failed) is read again on its own, as `read_page_image` reads
    /// (rebuilding its stripe if need be). Parts of pages a checkpoint
    /// moved meanwhile are left out.
    fn read_run(&self, run: Vec<PagePart>) -> Result<Vec<(PagePart, Vec<u8>)>, ArrayError> {
        let together = match run.as_slice() {
            [first, .., last] => {
                let (first, last) = (&first.part.pieces[0], &last.part.pieces[0]);
                let start = first.offset as usize;
                let mut bytes = vec![0u8; (last.offset + last.bytes) as usize - start];
                Counters::add(&self.stripes.counters.map_page_reads, 1);
                self.stripes
                    .read_area_into(first.slot, start, &mut bytes)
                    .then_some((start, bytes))
            }
            _ => None,
        };
        let algorithm = self.stripes.geometry.checksum;
        let mut read = Vec::with_capacity(run.len());
        for p in run {
            let read_with_others = together.as_ref().and_then(|(start, bytes)| {
                let piece = &p.part.pieces[0];
                let from = piece.offset as usize - start;
                let stored = &bytes[from..from + piece.bytes as usize];
                (algorithm.digest(stored) == p.part.digest).then(|| stored.to_vec())
            });
            let stored = match read_with_others {
                Some(stored) => stored,
                None => {
                    Counters::add(&self.stripes.counters.map_page_reads, p.part.pieces.len() as u64);
                    match self.read_page_image(p.page, &p.part) {
                        Ok(stored) => stored,
                        Err(_) if !self.still_held_as(p.page, &p.held) => continue,
                        Err(error) => return Err(error),
                    }
                }
            };
            read.push((p, stored));
        }
        Ok(read)
    }

    /// Page `page` from its image's stored bytes (`stored`) and its
    /// delta's (`delta`, where its image has one): decoded and checked.
    fn decode_page(&self, page: u64, stored: &[u8], delta: Option<&[u8]>) -> Result<LoadedPage, ArrayError> {
        let bad = |source| ArrayError::MapPage { page, source };
        let raw = crate::format::load_page_image(stored).map_err(bad)?;
        let g = &self.stripes.geometry;
        let body = match delta {
            None => Map::decode_image(&raw, g).map_err(bad)?,
            Some(delta) => {
                let over = crate::format::load_delta_image(delta).map_err(bad)?;
                Map::decode_with_delta(&raw, &over, g).map_err(bad)?
            }
        };
        if body.page() != page {
            return Err(bad(crate::format::FormatError::Field {
                what: "map page",
                field: "page",
                value: body.page(),
            }));
        }
        Ok(body)
    }

    /// Installs pages read (those still held as the images they were
    /// read from), dropping the records of volumes deleted since.
    fn install_loaded(&self, index: &mut Index, loaded: Vec<Loaded>) -> Result<(), ArrayError> {
        for loaded in loaded {
            let (body, image) = match loaded {
                Loaded::Dir { dir, entries, image } => {
                    let slots = &index.slots;
                    index
                        .map
                        .install_dir(dir, entries, &image, &|slot| slots.state(slot) == SlotState::Checkpoint)
                        .map_err(|source| ArrayError::MapDirectoryPage { dir, source })?;
                    continue;
                }
                Loaded::Page(body, image) => (body, image),
            };
            let page = body.page();
            let slots = &index.slots;
            let installed = index
                .map
                .install(body, &image, |slot| slots.may_hold_data(slot))
                .map_err(|source| ArrayError::MapPage { page, source })?;
            if !installed {
                continue;
            }
            Counters::add(&self.stripes.counters.map_page_misses, 1);
            let (base, end) = (page * PAGE, (page + 1) * PAGE);
            // A replay's records waiting for it, mapped before anything
            // sees it.
            map_waiting(index, &[(base, end)]);
            // A page lies in one volume: where every mapping is newer
            // than the volume's floor (as all are, but where a volume was
            // deleted and its keys used again since), none is refused.
            let floor = index.volumes.floor(base);
            if floor.is_some_and(|floor| index.map.versions_at_least(page, floor)) {
                continue;
            }
            let refused: Vec<u64> = index
                .map
                .overlapping(base, end)
                .locations()
                .filter(|(lba, at)| !index.volumes.admits(*lba, at.version))
                .map(|(lba, _)| lba)
                .collect();
            for lba in refused {
                let lost = index.map.remove_from(lba, lba + 1);
                let emptied = index.slots.account(&lost);
                index.drain_emptied_now(emptied);
            }
        }
        Ok(())
    }

    /// Whether page `page` is still held only as `image`.
    fn still_held_as(&self, page: u64, image: &PageImage) -> bool {
        self.index().map.held_only_as(page, image)
    }

    /// Whether directory page `dir` is still held only as `image`.
    fn dir_still_held_as(&self, dir: u64, image: &PageImage) -> bool {
        self.index().map.directory_page_held_only_as(dir, image)
    }

    /// Directory page `dir`, held as `image`: its image and the delta
    /// over it (if one was written since) read (`read_page_image`) and
    /// decoded, each of which must say it is that page, the delta's
    /// entries laid over the image's.
    fn read_directory_page(&self, dir: u64, image: &PageImage) -> Result<DirEntries, ArrayError> {
        let bad = |source| ArrayError::MapDirectoryPage { dir, source };
        let read = |image: &PageImage| {
            self.read_page_image(dir, image).map_err(|error| match error {
                ArrayError::MapPage { source, .. } => bad(source),
                error => error,
            })
        };
        let number = |number: u64| match number == dir {
            true => Ok(()),
            false => Err(bad(crate::format::FormatError::Field {
                what: "map directory page",
                field: "number",
                value: number,
            })),
        };
        let g = &self.stripes.geometry;
        let (at, images) = crate::format::decode_directory_image(&read(image)?, g).map_err(bad)?;
        number(at)?;
        let Some(delta) = &image.delta else {
            return Ok(DirEntries {
                images,
                changed: BTreeSet::new(),
            });
        };
        let delta = crate::format::decode_directory_delta_image(&read(delta)?, g).map_err(bad)?;
        number(delta.dir)?;
        Ok(DirEntries {
            images: delta.over(images),
            changed: delta.changed,
        })
    }

    /// The entries of directory page `dir`, held as `own`: from memory,
    /// or read from its map stripes (`read_directory_page`).
    pub(crate) fn directory_page(&self, dir: u64, own: &PageImage) -> Result<DirEntries, ArrayError> {
        if let Some(entries) = self.index().map.directory_page(dir) {
            return Ok(entries);
        }
        self.read_directory_page(dir, own)
    }

    /// A page's stored image, as its digest says it is: read from its
    /// map stripes' data chunks, or, if that fails, from the stripes
    /// rebuilt and checked chunk by chunk (their bad chunks rewritten).
    pub(crate) fn read_page_image(&self, page: u64, image: &PageImage) -> Result<Vec<u8>, ArrayError> {
        let algorithm = self.stripes.geometry.checksum;
        let mut bytes = vec![0u8; image.bytes as usize];
        let mut at = 0;
        let direct = image.pieces.iter().all(|piece| {
            let len = piece.bytes as usize;
            let ok = self
                .stripes
                .read_area_into(piece.slot, piece.offset as usize, &mut bytes[at..at + len]);
            at += len;
            ok
        });
        if direct && algorithm.digest(&bytes) == image.digest {
            return Ok(bytes);
        }
        let mut at = 0;
        let mut rebuilt = std::collections::HashSet::new();
        for piece in &image.pieces {
            let len = piece.bytes as usize;
            let sequence = self.index().slots.get(piece.slot).sequence;
            let stripe = self.stripes.rebuild_stripe(piece.slot, sequence, true)?;
            let from = piece.offset as usize;
            bytes[at..at + len].copy_from_slice(&stripe.area[from..from + len]);
            if rebuilt.insert(piece.slot) {
                self.stripes.repair(piece.slot, &stripe);
            }
            at += len;
        }
        if algorithm.digest(&bytes) != image.digest {
            return Err(ArrayError::MapPage {
                page,
                source: crate::format::FormatError::Crc { what: "map page image" },
            });
        }
        Ok(bytes)
    }

    /// The sequence of the stripe in `slot` (on the members), its slot
    /// page read first if opening left it unread.
    pub fn slot_sequence(&self, slot: u64) -> Result<u64, ArrayError> {
        let page = {
            let index = self.index();
            if !index.slots.is_unread(slot) {
                return Ok(index.slots.get(slot).sequence);
            }
            let page = slot / SLOT_TABLE_PAGE_SLOTS;
            index.slots.unread_pages(page..=page, 1)
        };
        // Taken in here, or by another meanwhile: either way it is read.
        self.take_unread(&page)?;
        Ok(self.index().slots.get(slot).sequence)
    }

    /// Reads `pages` and takes them into the slot table (those another
    /// took meanwhile are dropped); a slot emptied by the deltas kept
    /// aside drains as one a write empties does. If one cannot be taken,
    /// the table is marked so, and the activity records then tell the
    /// next opening to read every page at once (where a page past repair
    /// sends it to the full scan) instead of leaving them for later
    /// again.
    pub fn take_unread(&self, pages: &[(u64, Arc<PageImage>)]) -> Result<(), ArrayError> {
        let taken = self.take_unread_now(pages);
        if taken.is_err() {
            self.index_mut().slots.mark_unreadable();
        }
        taken
    }

    pub fn take_unread_now(&self, pages: &[(u64, Arc<PageImage>)]) -> Result<(), ArrayError> {
        let unreadable = |why: CheckpointFault| ArrayError::CheckpointUnreadable { why };
        let read = self.read_slot_pages(pages).map_err(unreadable)?;
        // A hold of the index a page (1,024 slots), not a batch: clients
        // go on between.
        for (page, entries, changed) in read {
            let mut index = self.index_mut();
            let emptied = index.slots.restore_unread(page, &entries, &changed).map_err(|fault| {
                unreadable(CheckpointFault::SlotPage {
                    page,
                    source: Box::new(unreadable(fault)),
                })
            })?;
            // Every stripe that superseded what they held is sealed by
            // now, or open and known to `superseded` (garbage collection,
            // which relocates, waits for every page).
            index.drain_emptied_now(emptied);
        }
        Ok(())
    }
    /// Slot table pages a root names, read from its map stripes (whose
    /// slots the table knows) in parallel on the I/O pool, each checked
    /// against its number, and each taken with its delta where it has
    /// one: the page's entries then, and the slots its delta changed.
    pub fn read_slot_pages(&self, pages: &[(u64, Arc<PageImage>)]) -> Result<Vec<SlotPageRead>, CheckpointFault> {
        let read = |(page, image): &(u64, Arc<PageImage>)| {
            let page = *page;
            let unreadable = |source| CheckpointFault::SlotPage {
                page,
                source: Box::new(source),
            };
            let stored = self.read_page_image(page, image).map_err(unreadable)?;
            let (number, entries) = crate::format::decode_slot_page_image(&stored, &self.stripes.geometry)?;
            let wrong =
                |what, field, value| CheckpointFault::Format(crate::format::FormatError::Field { what, field, value });
            if number != page {
                return Err(wrong("slot table page", "number", number));
            }
            let Some(delta) = &image.delta else {
                return Ok((page, entries, Vec::new()));
            };
            let stored = self.read_page_image(page, delta).map_err(unreadable)?;
            let delta = crate::format::decode_slot_delta_image(&stored, &self.stripes.geometry)?;
            if delta.page != page {
                return Err(wrong("slot table page delta", "number", delta.page));
            }
            // A page listing no slot is not named.
            let entries = delta.over(&entries);
            if entries.is_empty() {
                return Err(wrong("slot table page delta", "entries", 0));
            }
            Ok((page, entries, delta.changed))
        };
        self.read_each(pages.iter().collect(), true, read)
    }
}

/// A slot page read: its number, its entries (with its delta's), and the
/// slots its delta changed.
pub type SlotPageRead = (u64, Vec<SlotEntry>, Vec<u64>);

const PAGE: u64 = crate::limits::MAP_PAGE_BLOCKS;
/// The least a page in memory is taken to cost in `cache_pages` (with few
/// pages in memory, their average says little).
const PAGE_BYTES_LEAST: usize = 4096;
/// Past this many pages, a range pins only the pages that exist.
const PINNED_PAGES_PER_RANGE_MAX: u64 = 4096;

/// Pages read (their stored images and deltas) before they are decoded:
/// 2,048 pages of 512 random blocks are about 11 MB stored, where a
/// replay's group of pages is as many as the map cache holds.
const PAGES_DECODED_TOGETHER_MAX: usize = 2048;

/// Images this close to each other in one map stripe are read at once:
/// a member read costs about as much as this many bytes more of it
/// (25-30 us on the development VM, at 1-2 GB/s).
const PAGE_RUN_GAP_BYTES: u32 = 32 << 10;
/// The most one read of a run of images takes.
const PAGE_RUN_BYTES_MAX: u32 = 256 << 10;

/// `parts` cut into runs to read at once: stored images of one piece
/// each, in one map stripe, in order, each starting at most
/// `PAGE_RUN_GAP_BYTES` past where the one before ends, spanning at most
/// `PAGE_RUN_BYTES_MAX` (or one image, if longer). An image in several
/// pieces is a run of its own.
fn runs(mut parts: Vec<PagePart>) -> Vec<Vec<PagePart>> {
    let place = |image: &PageImage| match image.pieces.as_slice() {
        [piece] => (0, piece.slot, piece.offset),
        _ => (1, 0, 0),
    };
    parts.sort_unstable_by_key(|p| (place(&p.part), p.page));
    let mut runs: Vec<Vec<PagePart>> = Vec::new();
    for p in parts {
        let joins = |run: &Vec<PagePart>| {
            let ([first], [last], [piece]) = (
                run[0].part.pieces.as_slice(),
                run[run.len() - 1].part.pieces.as_slice(),
                p.part.pieces.as_slice(),
            ) else {
                return false;
            };
            let end = last.offset + last.bytes;
            piece.slot == first.slot
                && piece.offset >= end
                && piece.offset - end <= PAGE_RUN_GAP_BYTES
                && piece.offset + piece.bytes - first.offset <= PAGE_RUN_BYTES_MAX
        };
        match runs.last_mut() {
            Some(run) if joins(run) => run.push(p),
            _ => runs.push(vec![p]),
        }
    }
    runs
}

/// Whether a page of `ranges` has a replay's records waiting for it
/// (`index::Pending`).
fn waiting(index: &Index, ranges: &[(u64, u64)]) -> bool {
    index.pending.as_ref().is_some_and(|pending| pending.waiting_in(ranges))
}

/// The error for a page of `ranges` that a replay mapped after opening
/// found pointing into a replayed slot (`Pending::stale_in`): the map
/// cannot be trusted there until an opening scans every slot.
fn stale(index: &Index, ranges: &[(u64, u64)]) -> Option<ArrayError> {
    let (lba, slot) = index.pending.as_ref()?.stale_in(ranges)?;
    Some(crate::index::stale_error(lba, slot))
}

/// What was read for the one page that the one range of `ranges` lies
/// in (`None`: something else).
#[derive(Clone, Copy, PartialEq, Debug)]
enum With {
    /// That page alone.
    Page,
    /// Its directory page, then that page.
    Directory,
}

/// What `loaded` is, where it is the page that the one range of `ranges`
/// lies in, read alone or after its directory page.
fn the_page_of(ranges: &[(u64, u64)], loaded: &[Loaded]) -> Option<With> {
    let ([(lba, end)], Some((Loaded::Page(page, _), before))) = (ranges, loaded.split_last()) else {
        return None;
    };
    if page.page() != lba / PAGE || end.saturating_sub(1) / PAGE != lba / PAGE {
        return None;
    }
    match before {
        [] => Some(With::Page),
        [Loaded::Dir { dir, .. }] if *dir == page.page() / crate::limits::MAP_DIRECTORY_PAGES => Some(With::Directory),
        _ => None,
    }
}

/// What must be read for the pages of `ranges` to be in memory.
fn missing(map: &Map, ranges: &[(u64, u64)]) -> Vec<Needed> {
    let mut missing: Vec<Needed> = ranges.iter().flat_map(|&(lba, end)| map.missing(lba, end)).collect();
    if missing.len() > 1 {
        // A directory page once, with the pages of every range it holds.
        let key = |n: &Needed| match n {
            Needed::Page(page, _) => (*page, 1),
            Needed::Dir { dir, .. } => (dir * crate::limits::MAP_DIRECTORY_PAGES, 0),
        };
        missing.sort_unstable_by_key(key);
        missing.dedup_by(|later, earlier| match (earlier, later) {
            (Needed::Page(a, _), Needed::Page(b, _)) => a == b,
            (
                Needed::Dir { dir: a, pages, .. },
                Needed::Dir {
                    dir: b, pages: more, ..
                },
            ) if a == b => {
                pages.append(more);
                true
            }
            _ => false,
        });
    }
    missing
}

/// A directory page read and decoded, with the images it names of the
/// pages asked for.
type DirRead = (Loaded, BTreeMap<u64, Arc<PageImage>>);

/// A stored image to read of a page: its image, or its image's delta
/// (`part`), and the image the map holds it as (`held`).
struct PagePart {
    page: u64,
    held: Arc<PageImage>,
    part: Arc<PageImage>,
}

/// A page or a directory page read and decoded, to be installed.
enum Loaded {
    Dir {
        dir: u64,
        entries: DirEntries,
        image: Arc<PageImage>,
    },
    Page(LoadedPage, Arc<PageImage>),
}
