//! The index: what the engine's index lock (`RwLock<Index>`, held by
//! `catalog::Catalog`) protects: the map, the slot table, where stripes
//! not yet on the members are, the versions and sequences writes take,
//! the slots waiting to drain, which volumes' records are mapped, and a
//! replay's records not mapped yet. Its operations only move indexes: no
//! I/O, no waiting.
//!
//! # Guarantees
//!
//! - A slot emptied drains (becomes free once synced) only after the
//!   stripe that emptied it and, where a write into a user stripe still
//!   open superseded one of its records, only once every user stripe up
//!   to that one is sealed (`drain_emptied`): the newest durable copy of
//!   every block survives a crash.
//! - A replay's waiting records are mapped into a page in their stripes'
//!   order, where nothing newer is (`map_waiting`), so a page a replay
//!   mapped after opening is as one mapped before serving would be
//!   (`replay.rs` says how the engine uses this).
//! - A record of a volume deleted since it was written is never mapped
//!   (`Floors`).

use crate::device::AlignedBuf;
use crate::format::Record;
use crate::limits::{MAP_PAGE_BLOCKS as PAGE, REPLAY_LATER_PLACES_MAX, REPLAY_LATER_SPAN_PAGES_MAX};
use crate::map::{Location, Map, Rule, Target};
use crate::slot_set::SlotSet;
use crate::slots::SlotTable;
use crate::volume::{volume_of, VolumeTable};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Where a slot's data area is while it is not (only) on the members.
pub(crate) enum Resident {
    /// Being filled: the open stripe of that lane (`Lanes::open`), under
    /// its lock.
    Open(usize),
    /// Sealed, being written: immutable in memory until the write is done.
    Sealed(Arc<AlignedBuf>),
}

/// What the index's lock protects: the map, the slot table and where
/// unwritten stripes are. Critical sections only move indexes.
pub(crate) struct Index {
    pub map: Map,
    pub slots: SlotTable,
    pub resident: HashMap<u64, Resident>,
    /// The version the next mapped write gets.
    pub next_version: u64,
    /// The durable checkpoint's own stripes (its root).
    pub checkpoint_slots: Vec<u64>,
    /// Map stripes holding the durable checkpoint's page images
    /// (the checkpoint's lock guards which).
    pub map_stripes: usize,
    /// Slots emptied (by overwrites or by garbage collection's copies)
    /// while a user stripe that holds a write superseding one of their
    /// records was open, with the serial of the newest such stripe and
    /// the sequence of the stripe that emptied them: each drains once
    /// every user stripe up to that serial is sealed, and after both.
    pub drain_after_user: Vec<(u64, u64, u64)>,
    /// Slots emptied by the records mapped into an open stripe, by that
    /// stripe's slot: each drains once it is sealed (`Lanes::seal`).
    /// Kept here, not with the stripe, so that the engine's check finds
    /// every draining slot on its way to free.
    pub drain_at_seal: HashMap<u64, Vec<u64>>,
    /// The open user stripes' slots, with their serials (user stripes are
    /// numbered as they open, from 1).
    pub user_open: HashMap<u64, u64>,
    /// The serial the next user stripe gets.
    pub user_serial_next: u64,
    /// The newest sequence sealed so far.
    pub last_sealed: u64,
    /// The newest user or GC stripe's sequence (not a checkpoint's): a
    /// clean stop's checkpoint must be as of this or later.
    pub last_data_sealed: u64,
    /// Which volumes' records are mapped.
    pub volumes: Floors,
    /// A replay's records not mapped yet.
    pub pending: Option<Box<Pending>>,
}

impl Index {
    /// Slot `slot`, just emptied, drains once `sequence` is synced and, if a
    /// write into a user stripe still open superseded one of its records,
    /// once every user stripe up to that one is sealed (and not before
    /// `sequence` either: that stripe may hold the copies).
    pub fn drain_emptied(&mut self, slot: u64, sequence: u64) {
        let open_serial_min = self.user_open.values().copied().min().unwrap_or(u64::MAX);
        let needed = self.slots.superseded_by(slot);
        if needed < open_serial_min {
            self.slots.drain_after(slot, sequence);
        } else {
            self.drain_after_user.push((slot, needed, sequence));
        }
    }

    /// Slots emptied with no new stripe of their own (records dropped,
    /// deltas taken in late): each drains after the last stripe sealed, or
    /// after the open user stripe that superseded it (`drain_emptied`).
    pub fn drain_emptied_now(&mut self, emptied: Vec<u64>) {
        let after = self.last_sealed;
        for slot in emptied {
            self.drain_emptied(slot, after);
        }
    }
}

/// What the engine's mapping checks: each volume's `created` version, by
/// id. A record (or a checkpoint's mapping) of a volume not here, or
/// older than its volume, belongs to a deleted volume and is not mapped.
#[derive(Clone, Debug, Default)]
pub struct Floors {
    created: std::collections::HashMap<u32, u64>,
}

impl Floors {
    pub fn of(table: &VolumeTable) -> Floors {
        Floors {
            created: table.entries.iter().map(|e| (e.id, e.created_version)).collect(),
        }
    }

    /// The oldest version a record at map key `key` may have to be its
    /// volume's; `None` if that volume is not a current one.
    pub fn floor(&self, key: u64) -> Option<u64> {
        self.created.get(&volume_of(key)).copied()
    }

    /// Whether a record at map key `key` with `version` is a current volume's.
    pub fn admits(&self, key: u64, version: u64) -> bool {
        self.created
            .get(&volume_of(key))
            .is_some_and(|&created| version >= created)
    }

    /// The newest created version (the next write version must pass it).
    pub fn newest(&self) -> u64 {
        self.created.values().copied().max().unwrap_or(0)
    }
}

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
    /// The replayed slots whose older stripes the map may still point
    /// into (each holds pieces in the slot table the checkpoint
    /// restored): once a page's records are mapped, no mapping of it may
    /// point into one but at a record the replay put there.
    check: SlotSet,
    /// The pages that one did (map key and slot, the first found): never
    /// handed to anyone (`stale_in`), and the replay is never finished.
    stale: BTreeMap<u64, (u64, u64)>,
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
    /// units, each page checked once mapped for mappings into the slots
    /// of `check` (see `Pending::check`); the stripes back if a record
    /// spans more than `REPLAY_LATER_SPAN_PAGES_MAX` pages (a TRIM of a
    /// whole volume) or they would be more than `REPLAY_LATER_PLACES_MAX`
    /// places.
    pub fn new(
        stripes: Vec<(u64, u64, Vec<Record>)>,
        check: SlotSet,
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
            check,
            stale: BTreeMap::new(),
        })
    }

    /// The first mapping found pointing into a replayed slot where the
    /// replay put nothing (map key, slot), in a page of `ranges`.
    pub fn stale_in(&self, ranges: &[(u64, u64)]) -> Option<(u64, u64)> {
        ranges.iter().find_map(|&(lba, end)| {
            let (first, last) = (lba / PAGE, end.saturating_sub(1) / PAGE);
            (end > lba).then(|| self.stale.range(first..=last).next().map(|(_, &found)| found))?
        })
    }

    /// The first such mapping found in any page, and in how many pages.
    pub fn stale(&self) -> Option<((u64, u64), usize)> {
        self.stale.values().next().map(|&found| (found, self.stale.len()))
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
    pub fn next_pages(&mut self, most: usize) -> Vec<u64> {
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
    // The places the page's records wrote, where it is to be checked.
    let checked = pending.check.len() > 0;
    let mut fresh = Vec::new();
    for &(_, stripe, at) in &pending.places[start..end] {
        let (_, slot, records) = &pending.stripes[stripe as usize];
        let (lba, blocks, version, target, place) = target_of(*slot, &records[at as usize]);
        // A record of a volume deleted since is not mapped.
        if !index.volumes.admits(lba, version) {
            continue;
        }
        if checked {
            fresh.extend(place);
        }
        let (from, to) = (lba.max(base), (lba + u64::from(blocks)).min(limit));
        let target = target.advanced_by(from - lba);
        let blocks = u32::try_from(to - from).expect("a page's part of a record");
        let deltas = index.map.insert(from, blocks, version, &target, Rule::IfNotNewer);
        // A slot the replay emptied drains as after eager replay (a
        // replayed one is held until every page is mapped): dropped, it
        // stayed draining and was never freed.
        let emptied = index.slots.account(&deltas);
        index.drain_emptied_now(emptied);
    }
    if checked {
        check_page(pending, p, fresh, index);
    }
}

/// Notes page `p` as stale (`Pending::stale`) if, its records mapped, a
/// mapping of it points into a slot of `Pending::check` at a place none
/// of them wrote (`fresh`): the checkpoint's mapping of a block that a
/// replayed stripe should have overwritten, in a slot a newer stripe now
/// holds. (What eager replay checks over every page it read:
/// `CheckpointFault::Stale`.) A mapping of a volume deleted since is
/// left out, as eager replay drops those before it looks.
fn check_page(pending: &mut Pending, p: u64, mut fresh: Vec<Location>, index: &Index) {
    let check = &pending.check;
    fresh.sort_unstable();
    let stale = index
        .map
        .page_locations_in_slots(p, |slot| check.contains(slot))
        .filter(|(lba, at)| at.offset.is_some() && index.volumes.admits(*lba, at.version))
        .find(|(_, at)| fresh.binary_search(at).is_err());
    if let Some((lba, at)) = stale {
        pending.stale.insert(p, (lba, at.slot));
    }
}

/// What a mapping found pointing into a replayed slot where the replay
/// put nothing (block `lba`, slot `slot`) fails with.
pub(crate) fn stale_error(lba: u64, slot: u64) -> crate::error::ArrayError {
    crate::error::ArrayError::CheckpointUnreadable {
        why: crate::error::CheckpointFault::Stale { lba, slot },
    }
}

/// What `record`, of the stripe replayed in `slot`, maps: its keys,
/// blocks, version and target, and a data record's place.
pub(crate) fn target_of(slot: u64, record: &Record) -> (u64, u32, u64, Target, Option<Location>) {
    let version = record.version();
    match record {
        Record::Data { lba, extent, .. } => (
            *lba,
            extent.blocks,
            version,
            Target::Data {
                extent: Arc::new(extent.clone()),
                skip: 0,
            },
            Some(Location {
                slot,
                offset: Some(extent.offset),
                version,
            }),
        ),
        Record::Zero { lba, blocks, .. } => (*lba, *blocks, version, Target::Zero { slot }, None),
    }
}
