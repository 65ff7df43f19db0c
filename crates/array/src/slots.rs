//! The slot table: what each stripe slot holds, how much of it is live,
//! and which slots new stripes may take.
//!
//! # Guarantees
//!
//! - Live data is counted in stored bytes (what a stripe's data area
//!   holds, summary entries included), exactly, from the map's deltas: a
//!   compressed stripe is never more than full, and a slot's count is zero
//!   exactly when nothing in the map points into it.
//! - A slot is handed out only when it is free: empty, and the stripes
//!   holding what superseded its data are synced (it went through
//!   `Draining`), and no reader has it pinned. So a slot is rewritten only
//!   when no durable state and no reader in progress needs what it held.
//! - With a checkpoint, slots are handed out only from its window, the
//!   slots recovery scans; without one, from any free slot.
//!
//! # States
//!
//! ```text
//!  Free --allocate--> Open --seal--> Sealed --last piece gone--> Draining
//!   ^                                                               |
//!   +------------ the superseding stripes are synced ---------------+
//!  Free --checkpoint--> Checkpoint --next checkpoint durable--> Free
//! ```

use crate::format;
use crate::limits::{GC_BACKGROUND_LIVE_MAX, GC_VICTIMS_REMEMBERED, GC_VICTIM_SEARCH_SLOTS, LIVE_SCALE};
use crate::map::{DataRecord, Delta, Target};
use crate::slot_set::{SlotPages, SlotSet};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use tessera_checksum::Algorithm;

/// Readers using each slot's chunks, counted outside the index's lock: a
/// reader pins the slots it will read while it holds the lock's read side,
/// so a slot the allocator (holding the write side) sees unpinned cannot
/// gain a reader of its old contents.
///
/// The counts are a fixed table (`PIN_COUNTS` at most), a slot's count
/// at its number modulo the table's size: slots that far apart share one,
/// so one of them pinned makes the others look pinned too. Whoever asks
/// (allocation, a checkpoint's slots, garbage collection's victims,
/// healing's room) passes such a slot over or waits, so a shared count
/// delays a slot's reuse for as long as a read, and never lets a slot be
/// rewritten under a reader. A count per slot cost 4 bytes of RAM a used
/// slot beside its `Slot` (counted from the types: 840 MB for 100 TiB of
/// 8+2 data in 64 KiB chunks, 210 M stripes).
pub struct Pins {
    counts: Box<[AtomicU32]>,
}

/// Pin counts at most: 256 KiB, and exact (a count a slot) for arrays of
/// up to this many slots. A request pins the few slots it reads, and
/// neighbouring slots never share a count.
const PIN_COUNTS: u64 = 65_536;

impl Pins {
    pub fn new(count: u64) -> Pins {
        Pins {
            counts: (0..count.clamp(1, PIN_COUNTS)).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    fn count(&self, slot: u64) -> &AtomicU32 {
        &self.counts[(slot % self.counts.len() as u64) as usize]
    }

    pub fn pin(&self, slot: u64) {
        self.count(slot).fetch_add(1, Ordering::AcqRel);
    }

    pub fn unpin(&self, slot: u64) {
        let before = self.count(slot).fetch_sub(1, Ordering::AcqRel);
        assert!(before > 0, "slot {slot} unpinned more than pinned");
    }

    /// Whether a reader may be reading `slot` (or a slot sharing its
    /// count).
    pub fn pinned(&self, slot: u64) -> bool {
        self.count(slot).load(Ordering::Acquire) > 0
    }
}

/// Slots pinned for as long as this lives.
pub struct Pinned<'a> {
    pins: &'a Pins,
    slots: Vec<u64>,
}

impl<'a> Pinned<'a> {
    pub fn new(pins: &'a Pins) -> Pinned<'a> {
        Pinned {
            pins,
            slots: Vec::new(),
        }
    }

    /// Pins `slot` (call with the index's lock held).
    pub fn add(&mut self, slot: u64) {
        self.pins.pin(slot);
        self.slots.push(slot);
    }
}

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        for &slot in &self.slots {
            self.pins.unpin(slot);
        }
    }
}

pub use crate::slot_set::SlotState;

/// A slot as the table's users see it (`SlotTable::get`); the table keeps
/// it packed in 16 bytes (`Packed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    pub state: SlotState,
    /// Sequence of the stripe in it (0 while open or free).
    pub sequence: u64,
    /// Live bytes times LIVE_SCALE: stored bytes and summary entries of
    /// what the map points at here.
    pub live: u64,
    /// Map pieces pointing into this slot.
    pub pieces: u32,
    /// Whether the durable slot pages list it (a root alone names those
    /// pages again, so no checkpoint stripe may go in it, free or not).
    pub listed: bool,
}

/// What a slot no page holds yet is.
const FREE_SLOT: Slot = Slot::empty(SlotState::Free, 0);

impl Default for Slot {
    fn default() -> Slot {
        FREE_SLOT
    }
}

impl Slot {
    /// Empty in `state`, still listed as the durable pages list it.
    fn empty_as(&mut self, state: SlotState) {
        *self = Slot {
            listed: self.listed,
            ..Slot::empty(state, 0)
        };
    }

    const fn empty(state: SlotState, sequence: u64) -> Slot {
        Slot {
            listed: false,
            state,
            sequence,
            live: 0,
            pieces: 0,
        }
    }
}

/// A slot packed in 16 bytes, as the table holds every used slot (a
/// `Slot` takes 24): the sequence, then one word of the state (bits 0-2),
/// whether the durable pages list it (bit 3), its live units (the
/// `Packing`'s bits from bit 4) and its pieces (the bits left). All zero
/// is a free slot, so a page of them comes from the allocator untouched.
/// Counts too large for their bits are kept beside (`SlotTable::wide`),
/// the pieces' bits all set.
#[derive(Clone, Copy, Default)]
struct Packed {
    sequence: u64,
    word: u64,
}

/// How a table packs its counts: live units in as many bits as a full
/// stripe's need (`SlotTable::with_live_max`), pieces in the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Packing {
    live_bits: u32,
    /// Kept for the loops that walk every slot: `(1 << live_bits) - 1`,
    /// and the pieces' bits all set (`wide`).
    live_mask: u64,
    wide: u64,
}

const PACKED_FLAG_BITS: u32 = 4;

/// The states by their packed code (bits 0-2 of `Packed::word`): a
/// state's code is its discriminant, so packing is a cast.
const PACKED_STATES: [SlotState; 5] = [
    SlotState::Free,
    SlotState::Open,
    SlotState::Sealed,
    SlotState::Draining,
    SlotState::Checkpoint,
];
const _: () = {
    let mut code = 0;
    while code < PACKED_STATES.len() {
        assert!(PACKED_STATES[code] as usize == code);
        code += 1;
    }
};

impl Packing {
    /// Live units up to `live_max` in their bits, and at least 4 bits of
    /// pieces; `wide`, the pieces' bits all set, says the counts are kept
    /// beside.
    fn new(live_max: u64) -> Packing {
        let live_bits = (u64::BITS - live_max.leading_zeros()).clamp(1, u64::BITS - PACKED_FLAG_BITS - 4);
        Packing {
            live_bits,
            live_mask: (1 << live_bits) - 1,
            wide: (1 << (u64::BITS - PACKED_FLAG_BITS - live_bits)) - 1,
        }
    }

    #[cfg(test)]
    fn pieces_bits(self) -> u32 {
        u64::BITS - PACKED_FLAG_BITS - self.live_bits
    }

    /// `s` packed, and whether its counts go beside.
    #[inline]
    fn pack(self, s: &Slot) -> (Packed, bool) {
        let flags = s.state as u64 | u64::from(s.listed) << 3;
        let fits = s.live >> self.live_bits == 0 && u64::from(s.pieces) < self.wide;
        let (live, pieces) = match fits {
            true => (s.live, u64::from(s.pieces)),
            false => (0, self.wide),
        };
        let word = flags | live << PACKED_FLAG_BITS | pieces << (PACKED_FLAG_BITS + self.live_bits);
        (
            Packed {
                sequence: s.sequence,
                word,
            },
            !fits,
        )
    }

    /// Slot `slot`'s counts kept beside (out of the loops that walk slots).
    #[cold]
    #[inline(never)]
    fn beside(slot: u64, wide: &HashMap<u64, (u64, u32)>) -> (u64, u32) {
        *wide.get(&slot).expect("counts kept beside")
    }

    /// Slot `slot` from `p`, its counts from `wide` where they went beside.
    #[inline]
    fn unpack(self, slot: u64, p: Packed, wide: &HashMap<u64, (u64, u32)>) -> Slot {
        let state = PACKED_STATES[(p.word & 7) as usize];
        let pieces = p.word >> (PACKED_FLAG_BITS + self.live_bits);
        let (live, pieces) = match pieces == self.wide {
            false => ((p.word >> PACKED_FLAG_BITS) & self.live_mask, pieces as u32),
            true => Self::beside(slot, wide),
        };
        Slot {
            state,
            sequence: p.sequence,
            live,
            pieces,
            listed: p.word & 8 != 0,
        }
    }
}

pub struct SlotTable {
    algorithm: Algorithm,
    /// Allocated by the page when one of its slots first leaves `Free`.
    slots: SlotPages<Packed>,
    packing: Packing,
    /// The counts of slots whose counts do not fit their packed bits
    /// (`Packed`): none where a stripe's data area is under 64 MiB and
    /// its blocks are stored raw (a piece a block at most).
    wide: HashMap<u64, (u64, u32)>,
    free: SlotSet,
    /// The checkpoint's window: the slots new stripes may use until the
    /// next checkpoint; `None` when there is none and any free slot will do.
    window: Option<BTreeSet<u64>>,
    /// Free slots in the window, and, while a checkpoint is being written,
    /// in `restrict` too; `None` with neither: every free slot.
    usable: Option<BTreeSet<u64>>,
    /// The next checkpoint's window while it is being written: slots
    /// outside it are not handed out meanwhile.
    restrict: Option<BTreeSet<u64>>,
    /// While a checkpoint is written and writers may go on past the
    /// window (`restrict_usable`'s `early`): the free slots of its window
    /// that the durable one does not hold, handed out once `usable` has
    /// none left. Recovery finds a stripe in one only from the checkpoint
    /// being written (`outside_window`), so nothing in it counts as
    /// durable until that checkpoint is.
    early: Option<BTreeSet<u64>>,
    /// Empty slots and the sequence that must be synced before each is free.
    draining: Vec<(u64, u64)>,
    /// Totals over all slots.
    live_total: u128,
    stored_total: u128,
    mapped_data_blocks: u64,
    /// Mapped data blocks and stored bytes (times LIVE_SCALE) by volume
    /// id (ids are small and dense: `volume::VOLUME_COUNT_MAX`).
    by_volume: Vec<(u64, u128)>,
    /// The durable form's pages (`SLOT_TABLE_PAGE_SLOTS` slots each) a
    /// slot of which changed since the last checkpoint's pages were
    /// taken: only these are written again.
    dirty_pages: SlotSet,
    /// Slots whose entry may differ from what their page's durable image
    /// lists (changed since that image was taken): a page's delta over
    /// its image lists these (FORMAT.md, "Slot page deltas").
    changed: SlotSet,
    /// Slots sealed since then: a root alone names them with the pages
    /// it names again (`resealed`). A few windows' worth at most.
    resealed: BTreeSet<u64>,
    /// By user stripe serial, the slots a write into that stripe
    /// superseded a record in: until the stripe is sealed and synced, such
    /// a slot may hold the last durable copy of a block (`superseded_by`).
    /// Kept for the stripes open and those sealed while an older one is
    /// open (`forget_superseded`): a stripe's writes supersede at most a
    /// record a block, so this holds a few hundred slots where a field
    /// of every slot cost 8 bytes of RAM a used slot.
    superseded: BTreeMap<u64, HashSet<u64>>,
    /// A checkpoint's copy of the durable pages, being taken.
    snapshot: Option<Snapshot>,
    /// Opening serves before it has read every durable page
    /// (`defer_pages`): those not read yet, with where each one's
    /// image is and how many free slots it counts for in `free_count`.
    /// Empty once every page is read.
    unread: BTreeMap<u64, Unread>,
    /// Free slots in the pages not read yet, as the root counts them.
    unread_free: u64,
    /// What the map's deltas took from slots of pages not read yet
    /// (live units, pieces), by page and slot, taken from what the page
    /// lists when it is.
    pending: HashMap<u64, BTreeMap<u64, (i128, i64)>>,
    /// A page not read yet could not be read (past repair, or not adding
    /// up): the next opening must read every page, and scan every slot
    /// if one still fails (`activity`'s mark says so).
    unreadable: bool,
    /// While a replay's records are mapped page by page after opening
    /// (`index::Pending`), the slots it replayed: they gain pieces as
    /// their pages are mapped, so one left with none meanwhile is not
    /// emptied (it stays sealed) until every page is (`release_held`).
    held: Option<SlotSet>,
    /// Where garbage collection's choice of victims goes on from
    /// (`victims`).
    search: std::sync::Mutex<VictimSearch>,
    /// Stripes newer than a checkpoint's start that `sealed_after` found
    /// outside the window, where it looked at every slot too: none, or
    /// the window would have lost them (`check` reports them).
    window_missed: AtomicU64,
}

/// Used slots up to which `sealed_after` looks at every one, besides the
/// window's, to check that none is outside it: at about a nanosecond a
/// slot, 0.07 ms at most under the index's write lock.
const SEALED_AFTER_CHECKED_SLOTS: u64 = 65_536;

/// Garbage collection's walk over the used slots: how many it looks at
/// each time, at least, where the last choice stopped, and the best slots
/// it found.
struct VictimSearch {
    slots: u64,
    cursor: u64,
    remembered: Vec<u64>,
}

impl Default for VictimSearch {
    fn default() -> VictimSearch {
        VictimSearch {
            slots: GC_VICTIM_SEARCH_SLOTS,
            cursor: 0,
            remembered: Vec::new(),
        }
    }
}

/// A durable page not read yet: where its image is, and the free slots
/// it counts for.
struct Unread {
    image: std::sync::Arc<format::PageImage>,
    free: u64,
}

/// The durable pages a checkpoint takes as they were at one instant
/// (`begin_snapshot`), copied a few at a time (`copy_snapshot`), and
/// each before a slot of it changes.
struct Snapshot {
    pending: SlotSet,
    copied: BTreeMap<u64, TakenPage>,
    resealed: Vec<u64>,
}

/// A checkpoint's copy of the slot table's durable pages: each page's
/// entries as they were, and the slots sealed before, to be marked
/// again if the checkpoint fails.
pub struct TakenPages {
    pub pages: Vec<TakenPage>,
    resealed: Vec<u64>,
}

/// A durable page as a checkpoint took it: its entries, and the slots
/// that changed since its image was taken (what a delta over that image
/// lists).
pub struct TakenPage {
    pub page: u64,
    pub entries: Vec<format::SlotEntry>,
    pub changed: Vec<u64>,
}

const PAGE_SLOTS: u64 = crate::limits::SLOT_TABLE_PAGE_SLOTS;

/// What a durable page lists of slot `slot` (`SlotTable::page_entries`).
fn durable_entry(slot: u64, s: &Slot) -> Option<format::SlotEntry> {
    let sealed = matches!(s.state, SlotState::Sealed | SlotState::Draining);
    (sealed || s.pieces > 0).then_some(format::SlotEntry {
        slot,
        sequence: if sealed { s.sequence } else { 0 },
        live: s.live,
        pieces: s.pieces,
    })
}

/// Live bytes (times LIVE_SCALE) one block of `record` stands for: its
/// share of the stored bytes and of its summary entry.
fn block_live(algorithm: Algorithm, record: &DataRecord) -> (u64, u64) {
    let entry = format::data_record_bytes(algorithm, record.crcs as usize) as u64;
    let per = |bytes: u64| bytes * LIVE_SCALE / u64::from(record.blocks);
    (
        per(u64::from(record.stored_bytes) + entry),
        per(u64::from(record.stored_bytes)),
    )
}

/// Live bytes times LIVE_SCALE that `record` stands for while mapped
/// whole, its checksums of `algorithm` (as `SlotTable::footprint` counts
/// its target).
pub fn record_live(algorithm: Algorithm, record: &format::Record) -> u64 {
    match record {
        format::Record::Data { extent, .. } => {
            block_live(algorithm, &DataRecord::of(extent)).0 * u64::from(extent.blocks)
        }
        format::Record::Zero { .. } => format::zero_record_bytes() as u64 * LIVE_SCALE,
    }
}

impl SlotTable {
    /// A table of `count` free slots and no window.
    pub fn new(algorithm: Algorithm, count: u64) -> SlotTable {
        SlotTable {
            algorithm,
            slots: SlotPages::new(count),
            packing: Packing::new(u64::MAX),
            wide: HashMap::new(),
            free: SlotSet::full(count),
            window: None,
            usable: None,
            restrict: None,
            early: None,
            draining: Vec::new(),
            live_total: 0,
            stored_total: 0,
            mapped_data_blocks: 0,
            by_volume: Vec::new(),
            dirty_pages: SlotSet::empty(count.div_ceil(PAGE_SLOTS)),
            changed: SlotSet::empty(count),
            resealed: BTreeSet::new(),
            superseded: BTreeMap::new(),
            snapshot: None,
            unread: BTreeMap::new(),
            unread_free: 0,
            pending: HashMap::new(),
            unreadable: false,
            held: None,
            search: std::sync::Mutex::default(),
            window_missed: AtomicU64::new(0),
        }
    }

    /// The table, its choice of victims looking at `slots` used slots at
    /// least each time (`limits::GC_VICTIM_SEARCH_SLOTS` by default).
    pub fn with_victim_search(self, slots: u64) -> SlotTable {
        self.search.lock().unwrap_or_else(|p| p.into_inner()).slots = slots.max(1);
        self
    }

    /// The table, its slots' live units packed in the bits `live_max`
    /// takes (a full stripe's: the data area's bytes times LIVE_SCALE), the
    /// pieces in the rest. Without this, live units take all but 8 of the
    /// bits, and most counts of many pieces are kept beside.
    pub fn with_live_max(mut self, live_max: u64) -> SlotTable {
        assert!(self.slots.allocated() == 0, "packing chosen before any slot is used");
        self.packing = Packing::new(live_max);
        self
    }

    pub fn count(&self) -> u64 {
        self.slots.count()
    }

    /// Bytes of memory the table takes, counted from its types: the
    /// packed slots of its allocated pages, the counts kept beside, and
    /// the bitmaps a slot (free, changed) or page (dirty) each. Not the
    /// window's sets nor what is kept while pages are unread or a
    /// checkpoint copies them: those are bounded by the window, not by
    /// the used slots.
    pub fn memory_bytes(&self) -> u64 {
        let packed = self.slots.allocated() as usize * std::mem::size_of::<Packed>();
        // A hash map's entry, and its control byte.
        let beside = self.wide.capacity() * (std::mem::size_of::<(u64, (u64, u32))>() + 1);
        let bitmaps = self.free.heap_bytes() + self.changed.heap_bytes() + self.dirty_pages.heap_bytes();
        (packed + beside + bitmaps) as u64
    }

    pub fn get(&self, slot: u64) -> Slot {
        match self.slots.get(slot) {
            Some(&p) => self.packing.unpack(slot, p, &self.wide),
            None => FREE_SLOT,
        }
    }

    /// Slot `slot`'s state alone: its packed bits, its counts not
    /// unpacked (nor looked up beside).
    pub fn state(&self, slot: u64) -> SlotState {
        self.slots
            .get(slot)
            .map_or(SlotState::Free, |p| PACKED_STATES[(p.word & 7) as usize])
    }

    /// Changes slot `slot` with `change`, packed again after.
    fn modify<R>(&mut self, slot: u64, change: impl FnOnce(&mut Slot) -> R) -> R {
        let mut s = self.get(slot);
        let result = change(&mut s);
        let (packed, wide) = self.packing.pack(&s);
        *self.slots.get_mut(slot) = packed;
        match wide {
            true => self.wide.insert(slot, (s.live, s.pieces)),
            false if self.wide.is_empty() => None,
            false => self.wide.remove(&slot),
        };
        result
    }

    /// Changes slot `slot` with `change`; its durable page is dirty from
    /// then if what the page lists of it changed.
    fn change<R>(&mut self, slot: u64, change: impl FnOnce(&mut Slot) -> R) -> R {
        let page = slot / PAGE_SLOTS;
        if self.snapshot.as_ref().is_some_and(|s| s.pending.contains(page)) {
            self.copy_page(page);
        }
        let (result, changed) = self.modify(slot, |s| {
            let before = durable_entry(slot, s);
            let result = change(s);
            (result, durable_entry(slot, s) != before)
        });
        if changed {
            self.dirty_pages.insert(slot / PAGE_SLOTS);
            self.changed.insert(slot);
        }
        result
    }

    /// The slots of every page in use, in order: every slot that is not
    /// free is among them (those left out are free).
    pub fn iter(&self) -> impl Iterator<Item = (u64, Slot)> + '_ {
        let (packing, wide) = (self.packing, &self.wide);
        self.slots
            .iter()
            .map(move |(slot, &p)| (slot, packing.unpack(slot, p, wide)))
    }

    /// The slots of `[start, end)` in pages of the table ever used, in
    /// order.
    pub fn iter_range(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, Slot)> + '_ {
        let (packing, wide) = (self.packing, &self.wide);
        self.slots
            .iter_range(start, end)
            .map(move |(slot, &p)| (slot, packing.unpack(slot, p, wide)))
    }

    /// Live bytes in the array (stored data and summary entries).
    pub fn live_bytes(&self) -> u64 {
        (self.live_total / u128::from(LIVE_SCALE)) as u64
    }

    /// Live bytes times LIVE_SCALE.
    pub fn live_units(&self) -> u128 {
        self.live_total
    }

    /// Live bytes times LIVE_SCALE that `blocks` blocks of `target` stand for.
    pub fn footprint(&self, target: &Target, blocks: u32) -> u64 {
        match target {
            Target::Data { extent, .. } => block_live(self.algorithm, &DataRecord::of(extent)).0 * u64::from(blocks),
            Target::Zero { .. } => format::zero_record_bytes() as u64 * LIVE_SCALE,
        }
    }

    /// Stored bytes of live data (without summary entries).
    pub fn stored_bytes(&self) -> u64 {
        (self.stored_total / u128::from(LIVE_SCALE)) as u64
    }

    pub fn mapped_data_blocks(&self) -> u64 {
        self.mapped_data_blocks
    }

    /// Volume `id`'s mapped data blocks and stored bytes.
    pub fn volume_usage(&self, id: u32) -> (u64, u64) {
        self.by_volume.get(id as usize).map_or((0, 0), |&(blocks, stored)| {
            (blocks, (stored / u128::from(LIVE_SCALE)) as u64)
        })
    }

    /// Free slots, those of the pages not read yet as the root counts them.
    pub fn free_count(&self) -> usize {
        self.free.len() + self.unread_free as usize
    }

    /// Free slots new stripes may take now (in the window, or in the
    /// next one's early).
    pub fn usable_count(&self) -> usize {
        self.usable.as_ref().map_or(self.free.len(), |u| u.len()) + self.early.as_ref().map_or(0, |e| e.len())
    }

    pub fn draining_count(&self) -> usize {
        self.draining.len()
    }

    /// The sequence whose sync frees every draining slot.
    pub fn draining_sequence_max(&self) -> Option<u64> {
        self.draining.iter().map(|&(_, sequence)| sequence).max()
    }

    /// The usable slots, those in the durable window first.
    pub fn usable_slots(&self) -> Box<dyn Iterator<Item = u64> + '_> {
        let early = self.early.iter().flatten().copied();
        match &self.usable {
            Some(usable) => Box::new(usable.iter().copied().chain(early)),
            None => Box::new(self.free.iter().chain(early)),
        }
    }

    pub fn is_usable(&self, slot: u64) -> bool {
        self.usable
            .as_ref()
            .map_or(self.free.contains(slot), |u| u.contains(&slot))
            || self.early.as_ref().is_some_and(|e| e.contains(&slot))
    }

    /// Whether a stripe in `slot` lies outside the durable checkpoint's
    /// window: recovery from it would not find the stripe (it was taken
    /// early, while the next checkpoint was written).
    pub fn outside_window(&self, slot: u64) -> bool {
        self.window.as_ref().is_some_and(|w| !w.contains(&slot))
    }

    pub fn window(&self) -> Option<&BTreeSet<u64>> {
        self.window.as_ref()
    }

    pub fn free_slots(&self) -> impl Iterator<Item = u64> + '_ {
        self.free.iter()
    }

    /// By volume id: mapped data blocks, stored bytes times LIVE_SCALE.
    pub fn volumes(&self) -> Vec<(u64, u128)> {
        self.by_volume.clone()
    }

    /// Durable page `page`'s entries now: every sealed or draining slot
    /// in it, with its counts, and every open one the map points into
    /// (its counts, no sequence: the root lists its stripe, sealed
    /// before the root is written).
    fn page_entries(&self, page: u64) -> Vec<format::SlotEntry> {
        let end = ((page + 1) * PAGE_SLOTS).min(self.count());
        (page * PAGE_SLOTS..end)
            .filter_map(|slot| durable_entry(slot, &self.get(slot)))
            .collect()
    }

    /// Begins a checkpoint's copy of the durable pages that changed
    /// since the last one's, and of `also` (those it moves out of sparse
    /// map stripes), as they are now: taken with the map's dirty pages,
    /// so that the counts are what those pages add up to. Returns the
    /// pages; `copy_snapshot` copies them.
    pub fn begin_snapshot(&mut self, also: &BTreeSet<u64>) -> BTreeSet<u64> {
        assert!(self.snapshot.is_none(), "one checkpoint at a time");
        let mut pending = self.dirty_pages.take();
        for &page in also {
            pending.insert(page);
        }
        let pages = pending.iter().collect();
        self.snapshot = Some(Snapshot {
            pending,
            copied: BTreeMap::new(),
            resealed: std::mem::take(&mut self.resealed).into_iter().collect(),
        });
        pages
    }

    /// Copies durable page `page` into the snapshot, as it is now, with
    /// the slots changed since its image (no longer changed: marked
    /// again if the page is written as a delta, or not at all).
    fn copy_page(&mut self, page: u64) {
        let entries = self.page_entries(page);
        let changed = self
            .changed
            .take_range(page * PAGE_SLOTS, ((page + 1) * PAGE_SLOTS).min(self.count()));
        let snapshot = self.snapshot.as_mut().expect("a snapshot is being taken");
        snapshot.pending.remove(page);
        snapshot.copied.insert(page, TakenPage { page, entries, changed });
    }

    /// Copies up to `count` of the snapshot's pages not copied yet;
    /// whether every one is.
    pub fn copy_snapshot(&mut self, count: usize) -> bool {
        let snapshot = self.snapshot.as_ref().expect("a snapshot is being taken");
        let next: Vec<u64> = snapshot.pending.iter().take(count).collect();
        for page in next {
            self.copy_page(page);
        }
        self.snapshot.as_ref().is_some_and(|s| s.pending.len() == 0)
    }

    /// The snapshot, every page copied.
    pub fn end_snapshot(&mut self) -> TakenPages {
        let snapshot = self.snapshot.take().expect("a snapshot is being taken");
        assert_eq!(snapshot.pending.len(), 0, "every page copied");
        TakenPages {
            pages: snapshot.copied.into_values().collect(),
            resealed: snapshot.resealed,
        }
    }

    /// Marks a failed checkpoint's pages as changed again.
    pub fn give_back_pages(&mut self, taken: &TakenPages) {
        for page in &taken.pages {
            self.dirty_pages.insert(page.page);
            self.still_changed(&page.changed);
        }
        for &slot in &taken.resealed {
            self.resealed.insert(slot);
        }
    }

    /// The slots sealed since the last pages were taken, where they are
    /// still sealed or draining, with their sequences.
    pub fn resealed(&self) -> Vec<(u64, u64)> {
        self.resealed
            .iter()
            .map(|&slot| (slot, self.get(slot)))
            .filter(|(_, s)| matches!(s.state, SlotState::Sealed | SlotState::Draining))
            .map(|(slot, s)| (slot, s.sequence))
            .collect()
    }

    /// The slots `changed` still differ from their page's durable image:
    /// a delta over it listed them, or the checkpoint that took them
    /// failed.
    pub fn still_changed(&mut self, changed: &[u64]) {
        for &slot in changed {
            self.changed.insert(slot);
        }
    }

    /// Whether the durable pages list `slot`.
    pub fn listed(&self, slot: u64) -> bool {
        self.get(slot).listed
    }

    /// Durable page `page` lists `entries` now.
    pub fn page_durable(&mut self, page: u64, entries: &[format::SlotEntry]) {
        let end = ((page + 1) * PAGE_SLOTS).min(self.count());
        for slot in page * PAGE_SLOTS..end {
            if self.get(slot).listed {
                self.modify(slot, |s| s.listed = false);
            }
        }
        for entry in entries {
            self.modify(entry.slot, |s| s.listed = true);
        }
    }

    /// Takes a durable page's entries (opening: the table holds no
    /// mapping yet, and none of their slots is taken); an entry with no
    /// sequence only counts (the root lists its stripe: `check_counted`).
    /// Nothing is marked changed: the table is as the durable pages are
    /// (`restored` follows). Written for speed, as opening may do this for
    /// every used slot: at 300,000 used slots, going through `set` (which
    /// lists each sealed slot as resealed, a set `restored` empties) and
    /// `change` took a quarter of opening's time. Returns the live units
    /// the page lists, and the slots it keeps (`SlotPageImage::kept`),
    /// for opening to check against the root.
    pub fn restore_page(
        &mut self,
        page: u64,
        entries: &[format::SlotEntry],
        changed: &[u64],
    ) -> Result<(u128, u32), crate::error::CheckpointFault> {
        debug_assert!(self.snapshot.is_none() && self.usable.is_none());
        // (The page's decoding checked that its entries lie in it, in order.)
        debug_assert!(entries.iter().all(|e| e.slot / PAGE_SLOTS == page));
        let mut live = 0u128;
        for entry in entries {
            // (Looked at and changed in one unpacking.)
            let taken = self.modify(entry.slot, |s| {
                if s.state != SlotState::Free {
                    return true;
                }
                s.live = entry.live;
                s.pieces = entry.pieces;
                s.listed = true;
                if entry.sequence != 0 {
                    s.state = SlotState::Sealed;
                    s.sequence = entry.sequence;
                }
                false
            });
            if taken {
                return Err(crate::error::CheckpointFault::ListedTwice { slot: entry.slot });
            }
            if entry.sequence != 0 {
                self.free.remove(entry.slot);
            }
            live += u128::from(entry.live);
        }
        // What the page's delta changed, its next delta lists too.
        self.still_changed(changed);
        Ok((live, format::SlotPageImage::kept_of(entries)))
    }

    /// Opening (after a clean stop or a crash), with the root's pages but
    /// `pages` read (and the checkpoint's own slots taken): those are
    /// read later (`restore_unread`), and until then their slots are not
    /// handed out and count as free as the root says (`kept`).
    pub fn defer_pages(
        &mut self,
        pages: impl IntoIterator<Item = (u64, format::SlotPageImage)>,
    ) -> Result<(), crate::error::CheckpointFault> {
        for (page, format::SlotPageImage { image, kept, .. }) in pages {
            let end = ((page + 1) * PAGE_SLOTS).min(self.count());
            // Free now: all but the checkpoint's own slots.
            let free = self.free.remove_range(page * PAGE_SLOTS, end) as u64;
            let free = free
                .checked_sub(u64::from(kept))
                .ok_or(crate::error::CheckpointFault::KeptTooMany { page, kept })?;
            self.unread_free += free;
            self.unread.insert(page, Unread { image, free });
        }
        Ok(())
    }

    /// What a slot a durable page lists holds once `deltas` (kept aside
    /// while the page was not read) are taken into it: live units and
    /// pieces, `None` where one would fall below zero or overflow.
    fn net_of(e: &format::SlotEntry, deltas: Option<&(i128, i64)>) -> (Option<u64>, Option<u32>) {
        let &(live, pieces) = deltas.unwrap_or(&(0, 0));
        (
            u64::try_from(i128::from(e.live) + live).ok(),
            u32::try_from(i64::from(e.pieces) + pieces).ok(),
        )
    }

    /// Whether `slot` is in a durable page not read yet.
    pub fn is_unread(&self, slot: u64) -> bool {
        !self.unread.is_empty() && self.unread.contains_key(&(slot / PAGE_SLOTS))
    }

    /// A page not read yet failed to read: until every page is read,
    /// the next opening is to read them all (`pages_unreadable`).
    pub fn mark_unreadable(&mut self) {
        self.unreadable = true;
    }

    /// Whether a page is still unread after one of them failed to read.
    pub fn pages_unreadable(&self) -> bool {
        self.unreadable && !self.unread.is_empty()
    }

    /// Durable pages not read yet.
    pub fn unread_count(&self) -> usize {
        self.unread.len()
    }

    /// Up to `count` of the durable pages in `pages` not read yet, with
    /// where their images are.
    pub fn unread_pages(
        &self,
        pages: impl std::ops::RangeBounds<u64>,
        count: usize,
    ) -> Vec<(u64, std::sync::Arc<format::PageImage>)> {
        self.unread
            .range(pages)
            .take(count)
            .map(|(&page, unread)| (page, unread.image.clone()))
            .collect()
    }

    /// Whether the map may point into `slot`: it is sealed, or in a page
    /// not read yet (whose reading checks what the map counts there).
    pub fn may_hold_data(&self, slot: u64) -> bool {
        self.state(slot) == SlotState::Sealed || self.is_unread(slot)
    }

    /// Takes durable page `page`, read after opening (nothing if it was
    /// read already): its slots as it lists them, less what the map's
    /// deltas took from them since (`pending`). A sealed slot emptied so
    /// is `Draining` and returned, for the caller to say after what it
    /// may be freed; a listed slot the root's pages already emptied is
    /// free, as opening frees it. Refused if the page does not add up
    /// with the root and the deltas (nothing is changed then).
    pub fn restore_unread(
        &mut self,
        page: u64,
        entries: &[format::SlotEntry],
        changed: &[u64],
    ) -> Result<Vec<u64>, crate::error::CheckpointFault> {
        use crate::error::CheckpointFault;
        // (A reader may bring in a page read meanwhile by the thread, and
        // a checkpoint begun since: it is dropped here.)
        let Some(page_free) = self.unread.get(&page).map(|unread| unread.free) else {
            return Ok(Vec::new());
        };
        debug_assert!(self.snapshot.is_none(), "no checkpoint while pages are unread");
        let (start, end) = (page * PAGE_SLOTS, ((page + 1) * PAGE_SLOTS).min(self.count()));
        let pending = self.pending.remove(&page).unwrap_or_default();
        // Checked before anything changes.
        let kept = u64::from(format::SlotPageImage::kept_of(entries));
        let listed = |slot: u64| entries.binary_search_by_key(&slot, |e| e.slot).is_ok();
        let unlisted = pending.keys().find(|&&slot| !listed(slot)).copied();
        let free_slots = (start..end).filter(|&slot| self.state(slot) == SlotState::Free).count() as u64;
        let check = || {
            if let Some(slot) = unlisted {
                return Err(CheckpointFault::CountsUnderrun { slot });
            }
            for e in entries {
                let (live, pieces) = Self::net_of(e, pending.get(&e.slot));
                let state = self.state(e.slot);
                if e.slot < start || e.slot >= end || state != SlotState::Free {
                    return Err(CheckpointFault::ListedTwice { slot: e.slot });
                }
                if e.sequence == 0 && e.pieces > 0 {
                    return Err(CheckpointFault::CountsUnsealed { slot: e.slot, state });
                }
                if live.is_none() || pieces.is_none() || (pieces == Some(0)) != (live == Some(0)) {
                    return Err(CheckpointFault::CountsUnderrun { slot: e.slot });
                }
            }
            match free_slots.checked_sub(kept) == Some(page_free) {
                true => Ok(()),
                false => Err(CheckpointFault::KeptTooMany {
                    page,
                    kept: kept as u32,
                }),
            }
        };
        if let Err(fault) = check() {
            self.pending.insert(page, pending);
            return Err(fault);
        }
        self.unread.remove(&page);
        self.unread_free -= free_slots - kept;
        // Those the page's delta changed, and those the map's deltas
        // changed meanwhile, differ from its image.
        self.still_changed(changed);
        for &slot in pending.keys() {
            self.changed.insert(slot);
        }
        let mut emptied = Vec::new();
        let mut entries = entries.iter().peekable();
        for slot in start..end {
            let Some(e) = entries.next_if(|e| e.slot == slot) else {
                if self.state(slot) == SlotState::Free {
                    self.list_free(slot);
                }
                continue;
            };
            let (live, pieces) = Self::net_of(e, pending.get(&slot));
            let (live, pieces) = (live.expect("checked"), pieces.expect("checked"));
            let sealed = e.sequence != 0 && pieces > 0;
            let drained = e.sequence != 0 && e.pieces > 0 && !sealed;
            self.modify(slot, |s| {
                (s.live, s.pieces) = (live, pieces);
                s.listed = true;
                // Emptied before the root: free, as opening frees it.
                s.sequence = if sealed || drained { e.sequence } else { 0 };
                if sealed {
                    s.state = SlotState::Sealed;
                } else if drained {
                    s.state = SlotState::Draining;
                }
            });
            if drained {
                emptied.push(slot);
            } else if !sealed {
                // The page is written again by the next checkpoint.
                self.dirty_pages.insert(page);
                self.changed.insert(slot);
                self.list_free(slot);
            }
        }
        Ok(emptied)
    }

    /// Opening, once the durable pages and the stripes sealed since are
    /// restored: every slot counted must be sealed.
    pub fn check_counted(&self) -> Result<(), crate::error::CheckpointFault> {
        match self.iter().find(|(_, s)| s.pieces > 0 && s.state != SlotState::Sealed) {
            Some((slot, s)) => Err(crate::error::CheckpointFault::CountsUnsealed { slot, state: s.state }),
            None => Ok(()),
        }
    }

    /// Opening, once the durable pages are restored (or deferred): they
    /// are as the table is, so none is dirty; and the volumes' counts and
    /// the live units as of them.
    pub fn restored(&mut self, volumes: &[(u64, u128)], live: u128) {
        self.dirty_pages.take();
        self.resealed.clear();
        self.live_total = live;
        self.by_volume = volumes.to_vec();
        self.stored_total = volumes.iter().map(|&(_, stored)| stored).sum();
        self.mapped_data_blocks = volumes.iter().map(|&(blocks, _)| blocks).sum();
    }

    /// Applies the map's deltas; returns the sealed slots they emptied
    /// (now `Draining`, waiting for `drain_after`).
    pub fn account(&mut self, deltas: &[Delta]) -> Vec<u64> {
        let mut emptied = Vec::new();
        for delta in deltas {
            let slot = delta.slot;
            let (live, stored, data_blocks) = match &delta.data {
                Some(record) => {
                    let (live, stored) = block_live(self.algorithm, record);
                    let blocks = u64::from(delta.blocks);
                    (live * blocks, stored * blocks, blocks)
                }
                None => (format::zero_record_bytes() as u64 * LIVE_SCALE, 0, 0),
            };
            let id = crate::volume::volume_of(delta.lba) as usize;
            if id >= self.by_volume.len() {
                self.by_volume.resize(id + 1, (0, 0));
            }
            let volume = &mut self.by_volume[id];
            if delta.gained {
                volume.0 += data_blocks;
                volume.1 += u128::from(stored);
                self.live_total += u128::from(live);
                self.stored_total += u128::from(stored);
                self.mapped_data_blocks += data_blocks;
            } else {
                volume.0 -= data_blocks;
                volume.1 -= u128::from(stored);
                self.live_total -= u128::from(live);
                self.stored_total -= u128::from(stored);
                self.mapped_data_blocks -= data_blocks;
            }
            if self.is_unread(slot) {
                // Taken into what the page lists once it is read. (A
                // stripe there gains pieces where an overwrite cuts one
                // of its extents in two.)
                let page = slot / PAGE_SLOTS;
                let (sign, live) = (if delta.gained { 1 } else { -1 }, i128::from(live));
                let counts = self.pending.entry(page).or_default().entry(slot).or_default();
                *counts = (counts.0 + sign * live, counts.1 + sign as i64);
                self.dirty_pages.insert(page);
                self.changed.insert(slot);
                continue;
            }
            if delta.gained {
                self.change(slot, |s| {
                    s.live += live;
                    s.pieces += 1;
                });
            } else {
                let held = self.is_held(slot);
                let drained = self.change(slot, |s| {
                    s.live = s.live.checked_sub(live).expect("a slot loses only what it gained");
                    s.pieces = s.pieces.checked_sub(1).expect("a slot loses only pieces it has");
                    let drained = s.pieces == 0 && s.state == SlotState::Sealed && !held;
                    if s.pieces == 0 {
                        assert_eq!(s.live, 0, "slot {slot}: no pieces, yet live bytes");
                    }
                    if drained {
                        s.state = SlotState::Draining;
                    }
                    drained
                });
                if drained {
                    emptied.push(slot);
                }
            }
        }
        emptied
    }

    /// Holds the slots `replayed` sealed whatever pieces they lose, until
    /// `release_held` (a replay mapped after opening).
    pub fn hold(&mut self, replayed: SlotSet) {
        self.held = Some(replayed);
    }

    /// Whether `slot` is held sealed by a replay not mapped yet (`hold`):
    /// what it holds is not all counted until every page is mapped, and
    /// it is not emptied before, so garbage collection leaves it be.
    pub fn is_held(&self, slot: u64) -> bool {
        self.held.as_ref().is_some_and(|held| held.contains(slot))
    }

    /// Ends the hold: the held slots left with no pieces are `Draining`
    /// and returned, for the caller to say after what each may be freed.
    pub fn release_held(&mut self) -> Vec<u64> {
        let Some(held) = self.held.take() else {
            return Vec::new();
        };
        let emptied: Vec<u64> = held
            .iter()
            .filter(|&slot| {
                let s = self.get(slot);
                s.state == SlotState::Sealed && s.pieces == 0
            })
            .collect();
        for &slot in &emptied {
            self.change(slot, |s| s.state = SlotState::Draining);
        }
        emptied
    }

    /// Records that a write into user stripe `serial` superseded what
    /// the map pointed at in the slots `deltas` took pieces from.
    pub fn superseded(&mut self, deltas: &[Delta], serial: u64) {
        for delta in deltas.iter().filter(|d| !d.gained) {
            self.superseded.entry(serial).or_default().insert(delta.slot);
        }
    }

    /// The serial of the newest user stripe a write went to that
    /// superseded a record in `slot` (0: none), of those not forgotten.
    /// One recorded before the slot was last freed is older than every
    /// stripe open since (serials only grow, and the slot drained only
    /// once no stripe up to it was open), so it never holds the slot back.
    pub fn superseded_by(&self, slot: u64) -> u64 {
        self.superseded
            .iter()
            .rev()
            .find(|(_, slots)| slots.contains(&slot))
            .map_or(0, |(&serial, _)| serial)
    }

    /// Forgets what the user stripes before serial `open_min` (the oldest
    /// open: every one before it is sealed) superseded.
    pub fn forget_superseded(&mut self, open_min: u64) {
        self.superseded = self.superseded.split_off(&open_min);
    }

    /// Slot `slot` (draining) may be freed once `sequence` is synced.
    pub fn drain_after(&mut self, slot: u64, sequence: u64) {
        debug_assert_eq!(self.state(slot), SlotState::Draining);
        self.draining.push((slot, sequence));
    }

    /// Forgets which slots drain after which sequence (recovery: all it
    /// replayed is durable, and it frees every empty slot itself).
    pub fn forget_draining(&mut self) {
        self.draining.clear();
    }

    /// Frees the draining slots whose superseding stripes are synced
    /// through `synced`; returns how many. None is freed while a
    /// checkpoint is being written (its copy of the map may point into
    /// them, and its own stripes are put in free slots).
    pub fn release_drained(&mut self, synced: u64) -> usize {
        if self.restrict.is_some() {
            return 0;
        }
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.draining)
            .into_iter()
            .partition(|&(_, sequence)| sequence <= synced);
        self.draining = waiting;
        for &(slot, _) in &ready {
            let s = self.get(slot);
            assert_eq!(s.pieces, 0, "slot {slot} drained with live data");
            if s.state == SlotState::Draining {
                self.set_free(slot);
            }
        }
        ready.len()
    }

    fn set_free(&mut self, slot: u64) {
        self.change(slot, |s| s.empty_as(SlotState::Free));
        self.list_free(slot);
    }

    /// Lists `slot` as free, and usable if it may be used.
    fn list_free(&mut self, slot: u64) {
        self.free.insert(slot);
        if self.may_use(slot) {
            if let Some(usable) = self.usable.as_mut() {
                usable.insert(slot);
            }
        } else if self.may_use_early(slot) {
            if let Some(early) = self.early.as_mut() {
                early.insert(slot);
            }
        }
    }

    /// Takes `slot` off the free (and usable) slots; whether it was free.
    fn unlist_free(&mut self, slot: u64) -> bool {
        if let Some(usable) = self.usable.as_mut() {
            usable.remove(&slot);
        }
        if let Some(early) = self.early.as_mut() {
            early.remove(&slot);
        }
        self.free.remove(slot)
    }

    /// Whether a free slot the window does not hold may be handed out
    /// early: the checkpoint being written names it.
    fn may_use_early(&self, slot: u64) -> bool {
        self.early.is_some() && self.restrict.as_ref().is_some_and(|r| r.contains(&slot))
    }

    /// Whether a free slot may be handed out: in the window and the
    /// restriction, where there are these.
    fn may_use(&self, slot: u64) -> bool {
        [&self.window, &self.restrict]
            .iter()
            .all(|set| set.as_ref().is_none_or(|s| s.contains(&slot)))
    }

    /// Frees a slot that holds nothing anyone needs (a checkpoint stripe
    /// superseded, or one that was never named by a superblock).
    pub fn free(&mut self, slot: u64) {
        assert_eq!(self.get(slot).pieces, 0, "slot {slot} freed with live data");
        self.set_free(slot);
    }

    /// Gives back an open slot whose stripe took nothing.
    pub fn release_open(&mut self, slot: u64) {
        assert_eq!(self.state(slot), SlotState::Open, "slot {slot} is not open");
        self.free(slot);
    }

    /// Takes a usable slot for a new open stripe, preferring one for which
    /// `preferred` holds (all its members healthy); pinned slots are skipped.
    /// Those of the durable window first: one taken early makes what is
    /// written to it wait for the next checkpoint to be durable.
    pub fn allocate(&mut self, preferred: impl Fn(u64) -> bool, pins: &Pins) -> Option<u64> {
        let pick = |slots: &mut dyn Iterator<Item = u64>| {
            let mut candidates = slots.filter(|&s| !pins.pinned(s));
            let first = candidates.next()?;
            Some(
                std::iter::once(first)
                    .chain(candidates)
                    .find(|&s| preferred(s))
                    .unwrap_or(first),
            )
        };
        let slot = match &self.usable {
            Some(usable) => pick(&mut usable.iter().copied()),
            None => pick(&mut self.free.iter()),
        }
        .or_else(|| pick(&mut self.early.iter().flatten().copied()))?;
        self.take(slot, SlotState::Open, pins);
        Some(slot)
    }

    /// Takes free slot `slot` (usable or not) into `state`. A slot a
    /// reader has pinned is never taken: it may still be reading what the
    /// slot held before it was freed.
    pub fn take(&mut self, slot: u64, state: SlotState, pins: &Pins) {
        assert!(!pins.pinned(slot), "slot {slot} is pinned by a reader");
        assert!(self.unlist_free(slot), "slot {slot} is not free");
        self.change(slot, |s| s.empty_as(state));
    }

    /// Records the stripe sealed into open slot `slot`. Returns true if
    /// everything it held was overwritten while it was open: it is then
    /// `Draining`, and the caller says after what it may be freed.
    pub fn sealed(&mut self, slot: u64, sequence: u64, state: SlotState) -> bool {
        let empty = self.change(slot, |s| {
            assert_eq!(s.state, SlotState::Open, "slot {slot} sealed without being open");
            s.sequence = sequence;
            s.state = state;
            let empty = state == SlotState::Sealed && s.pieces == 0;
            if empty {
                s.state = SlotState::Draining;
            }
            empty
        });
        if state == SlotState::Sealed {
            self.resealed.insert(slot);
        }
        empty
    }

    /// Sets a slot's state and sequence as recovery or a checkpoint found them.
    pub fn set(&mut self, slot: u64, state: SlotState, sequence: u64) {
        self.change(slot, |s| {
            s.state = state;
            s.sequence = sequence;
        });
        if state == SlotState::Sealed {
            self.resealed.insert(slot);
        }
        if state == SlotState::Free {
            self.list_free(slot);
        } else {
            self.unlist_free(slot);
        }
    }

    /// Makes `window` the slots new stripes may use (`None`: any free
    /// slot), ending any restriction.
    pub fn set_window(&mut self, window: Option<BTreeSet<u64>>) {
        self.window = window;
        self.restrict = None;
        self.early = None;
        self.recompute_usable();
    }

    /// Narrows the usable slots to those in `keep` too, until the window
    /// is set or the restriction lifted: while a checkpoint is written,
    /// the slots both its window and the current one hold, and with
    /// `early` (once those run out) the free slots of its window that
    /// the current one does not hold.
    pub fn restrict_usable(&mut self, keep: &BTreeSet<u64>, early: bool) {
        self.restrict = Some(keep.clone());
        self.early = (early && self.window.is_some()).then(BTreeSet::new);
        self.recompute_usable();
    }

    pub fn lift_restriction(&mut self) {
        self.restrict = None;
        self.early = None;
        self.recompute_usable();
    }

    /// Takes `slot` out of the restriction: the checkpoint being written
    /// took it from its window and gives it back unused, so its root
    /// does not name it, and nothing may be written to it before the
    /// next one does.
    pub fn narrow(&mut self, slot: u64) {
        if let Some(restrict) = self.restrict.as_mut() {
            restrict.remove(&slot);
        }
        if let Some(usable) = self.usable.as_mut() {
            usable.remove(&slot);
        }
        if let Some(early) = self.early.as_mut() {
            early.remove(&slot);
        }
    }

    fn recompute_usable(&mut self) {
        // From the smallest set that bounds them: the window (or the
        // restriction) holds thousands of slots, the free set maybe
        // hundreds of millions.
        let bound = [&self.window, &self.restrict]
            .into_iter()
            .flatten()
            .min_by_key(|set| set.len());
        self.usable = bound.map(|set| {
            set.iter()
                .copied()
                .filter(|&s| self.free.contains(s) && self.may_use(s))
                .collect()
        });
        if self.early.is_some() {
            let early = self.restrict.iter().flatten().copied();
            self.early = Some(
                early
                    .filter(|&s| self.free.contains(s) && !self.may_use(s) && self.may_use_early(s))
                    .collect(),
            );
        }
    }

    /// Seals free slot `slot` as the stripe of `sequence`, holding one
    /// record of one block in `stored_bytes`: a table filled as an
    /// array's is, for `tessera bench slots` and tests.
    pub fn seal_one_record(&mut self, slot: u64, sequence: u64, stored_bytes: u32, pins: &Pins) {
        self.take(slot, SlotState::Open, pins);
        let record = DataRecord {
            offset: 0,
            stored_bytes,
            blocks: 1,
            crcs: 1,
        };
        self.account(&[Delta {
            lba: slot,
            blocks: 1,
            gained: true,
            slot,
            data: Some(record),
        }]);
        assert!(!self.sealed(slot, sequence, SlotState::Sealed), "it holds a record");
    }

    /// The sealed slots whose stripes are newer than `sequence`, the last
    /// one assigned when the caller (a checkpoint) began. Such a stripe
    /// was given its slot since then, from the usable slots, which a
    /// window bounds (with a checkpoint's restriction, and the slots it
    /// lets writers take early, while one is written): only those are
    /// looked at, not every used slot, unless there is no window (every
    /// free slot is usable then). Where the used slots are few enough
    /// that looking at every one costs no more (as on every test's
    /// array), they are looked at too: a stripe found outside the window
    /// is taken all the same, and counted for `check` to report.
    pub fn sealed_after(&self, sequence: u64) -> Vec<u64> {
        let newer = |(slot, s): (u64, Slot)| (s.state == SlotState::Sealed && s.sequence > sequence).then_some(slot);
        let every = || self.iter().filter_map(newer).collect::<Vec<u64>>();
        let Some(window) = &self.window else {
            return every();
        };
        let bounded: BTreeSet<u64> = window
            .iter()
            .chain(self.restrict.iter().flatten())
            .chain(self.early.iter().flatten())
            .copied()
            .collect();
        let found: Vec<u64> = bounded
            .into_iter()
            .filter_map(|slot| newer((slot, self.get(slot))))
            .collect();
        if self.slots.allocated() <= SEALED_AFTER_CHECKED_SLOTS {
            let all = every();
            if all != found {
                let missed = all.iter().filter(|slot| !found.contains(slot)).count();
                self.window_missed.fetch_add(missed as u64, Ordering::Relaxed);
                return all;
            }
        }
        found
    }

    /// Fraction of `fill` bytes (what a stripe can hold at most) a
    /// slot's live data fills.
    pub fn utilization(&self, slot: u64, fill: u64) -> f64 {
        self.get(slot).live as f64 / (fill as f64 * LIVE_SCALE as f64)
    }

    /// Up to `count` sealed slots garbage collection should empty first,
    /// best first, with `next_sequence` as now; `fill` is what a stripe
    /// can hold at most (one holding that much has nothing to collect). Cost-benefit, as in LFS:
    /// what a relocation frees (1 - u) for what it copies (u), times the
    /// age of the data (old data is unlikely to be overwritten soon, so
    /// copying it now is not wasted). Slots in the window score as if twice
    /// their age: only there does an emptied slot serve before the next
    /// checkpoint. `greedy` (a writer waits for a slot): the most garbage
    /// first, whatever its age; otherwise only slots live below
    /// GC_BACKGROUND_LIVE_MAX. Full slots, and those `skip` names (pinned, or still
    /// being written), are never chosen.
    ///
    /// Chosen among the slots of the window, those the last choice found
    /// best (`GC_VICTIMS_REMEMBERED`), and at least
    /// `GC_VICTIM_SEARCH_SLOTS` used slots from where the last choice
    /// stopped, more until `count` are found: on an array that has used
    /// fewer, among every slot (the best of all, as ever); on a larger one
    /// in bounded time, every slot looked at once every so many choices
    /// (as F2FS's `max_victim_search`).
    pub fn victims(
        &self,
        fill: u64,
        next_sequence: u64,
        count: usize,
        greedy: bool,
        skip: impl Fn(u64) -> bool,
    ) -> Vec<u64> {
        let score = |slot: u64, s: &Slot, in_window: bool| -> Option<(f64, u64)> {
            if s.state != SlotState::Sealed || skip(slot) {
                return None;
            }
            let u = self.utilization(slot, fill);
            if u >= if greedy { 1.0 } else { GC_BACKGROUND_LIVE_MAX } {
                return None;
            }
            let weight = if in_window { 2.0 } else { 1.0 };
            if greedy {
                return Some(((1.0 - u) * weight, slot));
            }
            let age = next_sequence.saturating_sub(s.sequence) as f64 + 1.0;
            Some(((1.0 - u) * age * weight / (u + 0.01), slot))
        };
        let mut search = self.search.lock().unwrap_or_else(|p| p.into_inner());
        let slots = self.count();
        let start = search.cursor.min(slots);
        let mut scored: Vec<(f64, u64)> = Vec::new();
        let mut looked = 0u64;
        // Where the walk stopped short of every slot, if it did.
        let mut stopped = None;
        'walk: for (lo, hi) in [(start, slots), (0, start)] {
            // The window's slots in the range, walked beside it.
            let mut window = self.window.as_ref().map(|w| w.range(lo..hi).copied().peekable());
            for (slot, s) in self.iter_range(lo, hi) {
                if looked >= search.slots && scored.len() >= count {
                    stopped = Some(slot);
                    break 'walk;
                }
                looked += 1;
                let in_window = match window.as_mut() {
                    None => true,
                    Some(w) => {
                        while w.next_if(|&x| x < slot).is_some() {}
                        w.peek() == Some(&slot)
                    }
                };
                scored.extend(score(slot, &s, in_window));
            }
        }
        if let Some(stop) = stopped {
            search.cursor = stop;
            // Looked at: from `start` on, up to `stop` (past the end and
            // round from 0 if `stop` is below `start`).
            let looked_at = |slot: u64| match start <= stop {
                true => (start..stop).contains(&slot),
                false => slot >= start || slot < stop,
            };
            // (With no window every slot counts as in it.)
            let window = self.window.iter().flatten().map(|&slot| (slot, true));
            let remembered = search.remembered.iter().filter_map(|&slot| match &self.window {
                Some(w) => (!w.contains(&slot)).then_some((slot, false)),
                None => Some((slot, true)),
            });
            for (slot, in_window) in window.chain(remembered).filter(|&(slot, _)| !looked_at(slot)) {
                scored.extend(score(slot, &self.get(slot), in_window));
            }
        }
        // The best `count` first, in order, without sorting the rest (an
        // array's sealed slots may be millions); the best few after them
        // (and them) weighed again next time.
        let best_first = |a: &(f64, u64), b: &(f64, u64)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        if GC_VICTIMS_REMEMBERED < scored.len() {
            scored.select_nth_unstable_by(GC_VICTIMS_REMEMBERED, best_first);
        }
        search.remembered = scored
            .iter()
            .take(GC_VICTIMS_REMEMBERED)
            .map(|&(_, slot)| slot)
            .collect();
        if count < scored.len() {
            scored.select_nth_unstable_by(count, best_first);
            scored.truncate(count);
        }
        scored.sort_by(best_first);
        scored.into_iter().map(|(_, slot)| slot).collect()
    }

    /// The map's pieces in `slot`, for a message: the first few, as
    /// `lba+blocks vVERSION @offset/skip` (`zeros` for a zero record).
    fn pieces_in(map: &crate::map::Map, slot: u64) -> String {
        const SHOWN: usize = 16;
        let mut shown = Vec::new();
        let mut count = 0usize;
        for (lba, m) in map.iter().filter(|(_, m)| m.target.slot() == slot) {
            count += 1;
            if shown.len() < SHOWN {
                shown.push(match &m.target {
                    crate::map::Target::Zero { .. } => format!("{lba}+{} v{} zeros", m.blocks, m.version),
                    crate::map::Target::Data { extent, skip } => format!(
                        "{lba}+{} v{} @{}/{} ({} blocks, {} bytes)",
                        m.blocks, m.version, extent.offset, skip, extent.blocks, extent.stored_bytes
                    ),
                });
            }
        }
        if count > SHOWN {
            shown.push(format!("and {} more", count - SHOWN));
        }
        shown.join(", ")
    }

    /// Recomputes what the map says each slot holds and compares it with
    /// the counts kept: the engine's invariant, checked by tests. A slot
    /// draining must be on its way to free: listed as draining here, or
    /// by `awaiting` (waiting for an open user stripe to be sealed).
    pub fn check(&self, map: &crate::map::Map, awaiting: impl Fn(u64) -> bool) -> Result<(), String> {
        let missed = self.window_missed.load(Ordering::Relaxed);
        if missed > 0 {
            return Err(format!(
                "{missed} stripes newer than a checkpoint's start were outside the window"
            ));
        }
        if !self.unread.is_empty() || !self.pending.is_empty() || self.unread_free != 0 {
            return Err(format!(
                "{} slot pages unread, deltas kept for {} pages, {} free slots counted in them",
                self.unread.len(),
                self.pending.len(),
                self.unread_free
            ));
        }
        let mut expected = SlotTable::new(self.algorithm, self.count());
        let deltas: Vec<Delta> = map
            .iter()
            .map(|(lba, m)| Delta::new(lba, m.blocks, &m.target, true))
            .collect();
        expected.account(&deltas);
        let draining: HashSet<u64> = self.draining.iter().map(|&(slot, _)| slot).collect();
        for slot in 0..self.count() {
            let (s, want) = (self.get(slot), expected.get(slot));
            if (s.live, s.pieces) != (want.live, want.pieces) {
                return Err(format!(
                    "slot {slot} ({:?}, sequence {}): counted {} live units in {} pieces, the map says {} in {}: {}",
                    s.state,
                    s.sequence,
                    s.live,
                    s.pieces,
                    want.live,
                    want.pieces,
                    Self::pieces_in(map, slot)
                ));
            }
            let free = self.free.contains(slot);
            if free != (s.state == SlotState::Free) {
                return Err(format!("slot {slot} is {:?} but free-listed: {free}", s.state));
            }
            if s.pieces > 0 && !matches!(s.state, SlotState::Sealed | SlotState::Open) {
                return Err(format!("slot {slot} is {:?} with {} live pieces", s.state, s.pieces));
            }
            if s.pieces == 0 && s.state == SlotState::Sealed {
                return Err(format!("slot {slot} is sealed with nothing live, and not draining"));
            }
            if self.is_usable(slot) && !free {
                return Err(format!("slot {slot} is usable but not free"));
            }
            if s.state == SlotState::Draining && !draining.contains(&slot) && !awaiting(slot) {
                return Err(format!(
                    "slot {slot} is draining but waits for nothing: it is never freed"
                ));
            }
        }
        self.slots.check_allocated()?;
        // Counts are kept beside only while they do not fit their bits.
        if let Some((&slot, &(live, pieces))) = self.wide.iter().find(|&(&slot, &(live, pieces))| {
            let s = Slot {
                live,
                pieces,
                ..self.get(slot)
            };
            !self.packing.pack(&s).1
        }) {
            return Err(format!(
                "slot {slot}: {live} live units in {pieces} pieces kept beside, yet they fit {:?}",
                self.packing
            ));
        }
        let volumes = |v: &[(u64, u128)]| -> Vec<(u64, u128)> {
            let mut v = v.to_vec();
            while v.last() == Some(&(0, 0)) {
                v.pop();
            }
            v
        };
        if volumes(&self.by_volume) != volumes(&expected.by_volume) {
            return Err(format!(
                "volumes: counted {:?}, the map says {:?}",
                self.by_volume, expected.by_volume
            ));
        }
        if (self.live_total, self.mapped_data_blocks) != (expected.live_total, expected.mapped_data_blocks) {
            return Err(format!(
                "totals: {} live units and {} mapped blocks counted, the map says {} and {}",
                self.live_total, self.mapped_data_blocks, expected.live_total, expected.mapped_data_blocks
            ));
        }
        for &(slot, _) in &self.draining {
            if self.state(slot) != SlotState::Draining {
                return Err(format!(
                    "slot {slot} is listed as draining but is {:?}",
                    self.state(slot)
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::map::{Delta, Target};
    use crate::slot_set::SLOT_PAGE;

    #[test]
    fn a_used_slot_costs_16_bytes_of_ram() {
        // docs/ENGINE.md counts the slot table's RAM at scale from this.
        assert_eq!(std::mem::size_of::<Packed>(), 16);
        assert_eq!(std::mem::size_of::<Slot>(), 24, "as its users see it");
        // `status` reports it: a page of 4,096 slots allocated as one is
        // first used, beside two bits a slot of the array.
        let count = 1 << 20;
        let mut table = SlotTable::new(Algorithm::Crc32c, count).with_live_max((512 << 10) * LIVE_SCALE);
        let bitmaps = table.memory_bytes();
        assert!(bitmaps >= count / 4 && bitmaps < count / 4 + count / 128, "{bitmaps}");
        let pins = Pins::new(count);
        table.seal_one_record(5, 1, 4096, &pins);
        assert_eq!(table.memory_bytes(), bitmaps + 4096 * 16);
        table.seal_one_record(4097, 2, 4096, &pins);
        assert_eq!(table.memory_bytes(), bitmaps + 2 * 4096 * 16);
    }

    /// Every state, flag and count comes back as it went in, whether the
    /// counts fit their bits or are kept beside; the latter only while
    /// they do not fit.
    #[test]
    fn a_slot_packed_in_16_bytes_comes_back_as_it_was() {
        // 8+2 of 64 KiB chunks: 39 bits of live units, 21 of pieces.
        let data = 8 * 64 * 1024u64;
        let mut table = SlotTable::new(Algorithm::Crc32c, 64).with_live_max(data * LIVE_SCALE);
        assert_eq!((table.packing.live_bits, table.packing.pieces_bits()), (39, 21));
        let states = [
            SlotState::Free,
            SlotState::Open,
            SlotState::Sealed,
            SlotState::Draining,
            SlotState::Checkpoint,
        ];
        let wide = table.packing.wide;
        let counts = [
            (0, 0),
            (1, 1),
            (data * LIVE_SCALE, (data / 4096) as u32),
            ((1 << 39) - 1, wide as u32 - 1),
            (1 << 39, 1),
            (5, wide as u32),
            (u64::MAX, u32::MAX),
        ];
        let mut slot = 0;
        for (i, &state) in states.iter().enumerate() {
            for (j, &(live, pieces)) in counts.iter().enumerate() {
                let s = Slot {
                    state,
                    sequence: u64::MAX - (i * 7 + j) as u64,
                    live,
                    pieces,
                    listed: (i + j) % 2 == 0,
                };
                table.modify(slot % 64, |t| *t = s);
                assert_eq!(table.get(slot % 64), s);
                assert_eq!(table.state(slot % 64), state, "the state read alone");
                let beside = live >= 1 << 39 || u64::from(pieces) >= wide;
                assert_eq!(table.wide.contains_key(&(slot % 64)), beside, "{s:?}");
                slot += 1;
            }
        }
        // Counts that fit again go back into their bits.
        for slot in 0..64 {
            table.modify(slot, |s| (s.live, s.pieces) = (3, 2));
            assert_eq!((table.get(slot).live, table.get(slot).pieces), (3, 2));
        }
        assert!(table.wide.is_empty());
        // What fits where a stripe's blocks are stored raw (a piece a
        // block at most, stored bytes times LIVE_SCALE live units at most).
        for (k, chunk) in [
            (4u64, 4096u64),
            (8, 64 << 10),
            (8, 1 << 20),
            (16, 2 << 20),
            (31, 1 << 20),
            (92, 64 << 10),
        ] {
            let data = k * chunk;
            let packing = Packing::new(data * LIVE_SCALE);
            let full = Slot {
                live: data * LIVE_SCALE,
                pieces: (data / 4096) as u32,
                ..Slot::empty(SlotState::Sealed, 1)
            };
            assert!(!packing.pack(&full).1, "{k} x {chunk}: {packing:?}");
        }
        // 64 MiB of data a stripe (16 x 4 MiB, 64 x 1 MiB) is past it: a
        // full raw stripe's counts go beside.
        let data = 64 << 20;
        let full = Slot {
            live: data * LIVE_SCALE,
            pieces: (data / 4096) as u32,
            ..Slot::empty(SlotState::Sealed, 1)
        };
        assert!(Packing::new(data * LIVE_SCALE).pack(&full).1);
    }

    /// Pin counts are a fixed table: a slot shares its count with the
    /// slots `PIN_COUNTS` apart, and allocation passes them all over while
    /// one is pinned; neighbours are not held up, and the others are
    /// taken again once it is unpinned.
    #[test]
    fn slots_sharing_a_pin_count_are_passed_over_together() {
        let count = 2 * PIN_COUNTS + 8;
        let mut table = SlotTable::new(Algorithm::Crc32c, count);
        let pins = Pins::new(count);
        assert_eq!(pins.counts.len() as u64, PIN_COUNTS);
        pins.pin(3);
        pins.pin(3);
        let sharing = [3, 3 + PIN_COUNTS, 3 + 2 * PIN_COUNTS];
        assert!(sharing.iter().all(|&s| pins.pinned(s)));
        assert!(!pins.pinned(2) && !pins.pinned(4) && !pins.pinned(4 + PIN_COUNTS));
        let taken: Vec<u64> = (0..5).map(|_| table.allocate(|_| true, &pins).unwrap()).collect();
        assert_eq!(taken, [0, 1, 2, 4, 5]);
        // Preferring the slots that share the count takes another.
        let preferred = |s: u64| s % PIN_COUNTS == 3;
        let other = table.allocate(preferred, &pins).unwrap();
        assert!(!sharing.contains(&other), "slot {other} taken while pinned");
        pins.unpin(3);
        assert!(sharing.iter().all(|&s| pins.pinned(s)), "still pinned once");
        pins.unpin(3);
        assert!(!sharing.iter().any(|&s| pins.pinned(s)));
        assert_eq!(table.allocate(preferred, &pins), Some(3));
        // A small array's table has a count a slot.
        assert_eq!(Pins::new(100).counts.len(), 100);
    }

    /// What user stripe superseded a record in a slot last, kept apart from
    /// the slots (`Index::drain_emptied` reads it; the GC test
    /// `an_emptied_gc_stripe_waits_for_the_writes_that_emptied_it` fails
    /// with it always 0): the newest stripe that did, until every stripe up
    /// to it is sealed; a slot a write only added to is not superseded.
    #[test]
    fn a_slot_is_superseded_by_the_newest_stripe_not_yet_forgotten() {
        let mut table = SlotTable::new(Algorithm::Crc32c, 64);
        let delta = |slot: u64, gained: bool| Delta {
            lba: 0,
            blocks: 1,
            gained,
            slot,
            data: None,
        };
        table.superseded(&[delta(5, false), delta(6, true)], 3);
        table.superseded(&[delta(5, false), delta(7, false)], 9);
        table.superseded(&[delta(7, false)], 4);
        assert_eq!(
            [5, 6, 7, 8].map(|slot| table.superseded_by(slot)),
            [9, 0, 9, 0],
            "a slot gained in is not superseded"
        );
        // Stripes before 4 sealed: 3 forgotten, the newer ones kept.
        table.forget_superseded(4);
        assert_eq!([5, 7].map(|slot| table.superseded_by(slot)), [9, 9]);
        table.superseded(&[delta(8, false)], 4);
        table.forget_superseded(9);
        assert_eq!([5, 7, 8].map(|slot| table.superseded_by(slot)), [9, 9, 0]);
        // None open: every one forgotten.
        table.forget_superseded(u64::MAX);
        assert_eq!([5, 7].map(|slot| table.superseded_by(slot)), [0, 0]);
        assert!(table.superseded.is_empty());
    }
    use rand::{Rng, SeedableRng};
    use std::sync::Arc;

    /// The best `count` victims are the first `count` of the full order,
    /// whatever `count` (they are picked without sorting the rest), and
    /// pages of the table are only allocated for slots that were used.
    #[test]
    fn victims_are_the_head_of_the_full_order() {
        let algorithm = Algorithm::Crc32c;
        let mut table = SlotTable::new(algorithm, 3 * SLOT_PAGE as u64);
        let pins = Pins::new(table.count());
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        // 200 sealed slots in the first page, each with one live extent
        // of a random size, some of equal size (ties).
        for slot in 0..200u64 {
            table.take(slot, SlotState::Open, &pins);
            let extent = Arc::new(format::Extent {
                slot,
                offset: 0,
                stored_bytes: 4096 * rng.gen_range(1..=8),
                blocks: 1,
                codec: Some(tessera_compress::Codec::Lz4),
                digest: algorithm.digest(b""),
                block_crcs: format::BlockCrcs::new(),
            });
            table.account(&[Delta::new(slot, 1, &Target::Data { extent, skip: 0 }, true)]);
            assert!(!table.sealed(slot, slot + 1, SlotState::Sealed), "it holds data");
        }
        let fill = 64 << 10;
        for greedy in [true, false] {
            let all = table.victims(fill, 1000, usize::MAX, greedy, |_| false);
            for count in [0, 1, 7, 50, 199, 200, 500] {
                let best = table.victims(fill, 1000, count, greedy, |_| false);
                assert_eq!(best[..], all[..count.min(all.len())], "greedy {greedy}, count {count}");
            }
        }
        assert_eq!(table.slots.pages_allocated(), 1);
        assert_eq!(table.iter().count(), SLOT_PAGE, "the used page's slots only");
        assert_eq!(table.free_count(), 3 * SLOT_PAGE - 200);
    }

    /// A table of `count` slots, the first `used` sealed, slot s holding
    /// `stored(s)` bytes of a stripe of `FILL`, the last slot's stripe
    /// the oldest.
    fn sealed_table(count: u64, used: u64, stored: impl Fn(u64) -> u32) -> SlotTable {
        let mut table = SlotTable::new(Algorithm::Crc32c, count);
        let pins = Pins::new(count);
        for slot in 0..used {
            table.seal_one_record(slot, used - slot, stored(slot), &pins);
        }
        table
    }

    /// A stripe's data area in `sealed_table`.
    const FILL: u64 = 256 << 10;

    /// On a table of more used slots than the choice of victims looks at,
    /// a choice looks at about that many (it looked at every used slot,
    /// under the index's lock, before it was bounded), goes on from where
    /// the last stopped, so that every slot is looked at within a few
    /// choices, and keeps the best it found: the emptiest slot (and one of
    /// the oldest), wherever it is, is found and stays first until it is
    /// taken, by the most garbage or by cost-benefit.
    #[test]
    fn victims_are_chosen_among_a_bounded_number_of_slots() {
        let used = 8 * SLOT_PAGE as u64;
        let search = SLOT_PAGE as u64;
        let emptiest = used - 5;
        let table = sealed_table(used + 64, used, |slot| match slot == emptiest {
            true => 4096,
            false => (FILL / 2) as u32 + (slot % 97) as u32 * 1024,
        })
        .with_victim_search(search);
        for greedy in [true, false] {
            let mut first_seen = None;
            for call in 0..12 {
                let looked = std::cell::Cell::new(0u64);
                let best = table.victims(FILL, used + 1, 4, greedy, |_| {
                    looked.set(looked.get() + 1);
                    false
                });
                assert_eq!(best.len(), 4);
                // The walk, and the remembered slots weighed again.
                let most = search + GC_VICTIMS_REMEMBERED as u64;
                assert!(looked.get() <= most, "call {call} looked at {} slots", looked.get());
                if best[0] == emptiest {
                    first_seen.get_or_insert(call);
                } else {
                    assert!(first_seen.is_none(), "call {call} lost the emptiest slot ({best:?})");
                }
            }
            let seen = first_seen.expect("the emptiest slot was never chosen");
            assert!(seen <= used / search, "found at call {seen} (greedy {greedy})");
        }
        // Where every used slot fits the walk, the choice is as it ever was.
        let small = sealed_table(used + 64, used, |slot| (slot % 251) as u32 * 1024 + 4096);
        let everything = small.victims(FILL, used + 1, usize::MAX, true, |_| false);
        let small = small.with_victim_search(used);
        for _ in 0..3 {
            assert_eq!(small.victims(FILL, used + 1, 64, true, |_| false)[..], everything[..64]);
        }
    }

    /// The window's slots are weighed by every choice, wherever the walk
    /// is: only an emptied window slot serves before the next checkpoint.
    #[test]
    fn the_window_is_weighed_whatever_the_walk() {
        let used = 8 * SLOT_PAGE as u64;
        // Every slot half full; the window's, in the last page, a little
        // fuller: only weighed twice do they come first.
        let window: BTreeSet<u64> = (used - 16..used).collect();
        let mut table = sealed_table(used, used, |slot| match window.contains(&slot) {
            true => (FILL * 5 / 8) as u32,
            false => (FILL / 2) as u32,
        })
        .with_victim_search(SLOT_PAGE as u64);
        table.set_window(Some(window.clone()));
        for _ in 0..3 {
            let best = table.victims(FILL, used + 1, 16, true, |_| false);
            assert_eq!(best.into_iter().collect::<BTreeSet<_>>(), window);
        }
    }

    /// A checkpoint's window takes the stripes sealed since it began from
    /// the window's slots; one outside it (which the window's rules should
    /// never leave) is found all the same on a table this small, and
    /// `check` reports it.
    #[test]
    fn a_stripe_newer_than_a_checkpoint_outside_the_window_is_caught() {
        let pins = Pins::new(64);
        let mut table = SlotTable::new(Algorithm::Crc32c, 64);
        table.set_window(Some((0..16).collect()));
        let start = 10;
        for (slot, sequence) in [(3, 9), (4, 11), (5, 12)] {
            table.allocate(|s| s == slot, &pins);
            assert_eq!(table.state(slot), SlotState::Open);
            table.sealed(slot, sequence, SlotState::Checkpoint);
            table.set(slot, SlotState::Sealed, sequence);
        }
        // (Stripes with nothing live: `check` finds that wrong too, after.)
        let window_error = |table: &SlotTable| {
            let error = table.check(&crate::map::Map::new(1), |_| false).err();
            error.filter(|e| e.contains("outside the window"))
        };
        assert_eq!(table.sealed_after(start), [4, 5]);
        assert_eq!(window_error(&table), None);
        // Slot 40, outside the window, sealed newer than `start`.
        table.take(40, SlotState::Open, &pins);
        table.sealed(40, 13, SlotState::Checkpoint);
        table.set(40, SlotState::Sealed, 13);
        assert_eq!(table.sealed_after(start), [4, 5, 40]);
        let error = window_error(&table).expect("the stripe outside the window reported");
        assert!(error.starts_with("1 stripes newer"), "{error}");
    }

    /// Opening reads some pages and defers the others
    /// (`defer_pages`); deltas on their slots wait, and each page read
    /// later (`restore_unread`) must leave the table as reading every
    /// page at opening, freeing what nothing points at, and then taking
    /// the same deltas would: every slot's state, sequence, counts, free
    /// listing, and the slots emptied.
    #[test]
    fn a_page_read_after_opening_is_as_if_read_at_opening_then_changed() {
        let algorithm = Algorithm::Crc32c;
        let count = 3 * PAGE_SLOTS + 100;
        let mut table = SlotTable::new(algorithm, count);
        let pins = Pins::new(count);
        let target = |slot: u64| Target::Data {
            extent: Arc::new(format::Extent {
                slot,
                offset: 0,
                stored_bytes: 8192,
                blocks: 2,
                codec: None,
                digest: algorithm.digest(b""),
                block_crcs: format::BlockCrcs::new(),
            }),
            skip: 0,
        };
        let delta = |slot: u64, gained: bool| Delta::new(slot, 1, &target(slot), gained);
        // Sealed slots with one to three pieces, free ones between; some
        // in pages 0 and 1 emptied before the pages are taken (listed,
        // nothing live), so that pages 2 and 3 change only by the deltas.
        let mut held = Vec::new();
        for (i, slot) in (3..count).step_by(7).enumerate() {
            let pieces = 1 + i % 3;
            table.take(slot, SlotState::Open, &pins);
            for _ in 0..pieces {
                table.account(&[delta(slot, true)]);
            }
            table.sealed(slot, 1000 + slot, SlotState::Sealed);
            held.push((slot, pieces));
        }
        for &(slot, pieces) in held.iter().step_by(10).filter(|(slot, _)| *slot < 2 * PAGE_SLOTS) {
            let emptied = table.account(&vec![delta(slot, false); pieces]);
            assert_eq!(emptied, vec![slot]);
        }
        let pages: Vec<(u64, Vec<format::SlotEntry>)> = (0..4).map(|page| (page, table.page_entries(page))).collect();
        // After opening: slots emptied, others losing a piece, others
        // gaining one (an overwrite cutting an extent in two), in every
        // page but 1 (which changes only by the slots opening frees).
        let mut deltas = Vec::new();
        let emptied_before = |i: usize, slot: u64| i.is_multiple_of(10) && slot < 2 * PAGE_SLOTS;
        for (i, &(slot, pieces)) in held
            .iter()
            .enumerate()
            .filter(|&(i, &(slot, _))| !emptied_before(i, slot) && slot / PAGE_SLOTS != 1)
        {
            match i % 5 {
                1 => deltas.extend(vec![delta(slot, false); pieces]),
                2 => deltas.push(delta(slot, false)),
                3 => deltas.extend([delta(slot, true), delta(slot, false), delta(slot, true)]),
                _ => {}
            }
        }
        // Opening, every page read, and its walk: what nothing points at is free.
        let opened = |table: &mut SlotTable| {
            let empty: Vec<u64> = table
                .iter()
                .filter(|(_, s)| s.pieces == 0 && s.state != SlotState::Free)
                .map(|(slot, _)| slot)
                .collect();
            for slot in empty {
                table.set(slot, SlotState::Free, 0);
            }
        };
        let mut eager = SlotTable::new(algorithm, count);
        let mut live = 0;
        for (page, entries) in &pages {
            live += eager.restore_page(*page, entries, &[]).unwrap().0;
        }
        eager.restored(&table.volumes(), live);
        opened(&mut eager);
        // Page 0 read at opening, the others deferred.
        let mut lazy = SlotTable::new(algorithm, count);
        lazy.restore_page(0, &pages[0].1, &[]).unwrap();
        let image = Arc::new(format::PageImage {
            bytes: 0,
            digest: algorithm.digest(b""),
            pieces: Vec::new(),
            delta: None,
        });
        let later = pages[1..].iter().map(|(page, entries)| {
            let kept = format::SlotPageImage::kept_of(entries);
            (
                *page,
                format::SlotPageImage {
                    image: image.clone(),
                    kept,
                    deltas: 0,
                },
            )
        });
        lazy.defer_pages(later).unwrap();
        lazy.restored(&table.volumes(), live);
        opened(&mut lazy);
        assert_eq!(lazy.free_count(), eager.free_count(), "the root's count of free slots");
        assert_eq!(lazy.unread_count(), 3);
        assert!(lazy.is_unread(PAGE_SLOTS) && !lazy.is_unread(PAGE_SLOTS - 1));
        let mut emptied_eager = eager.account(&deltas);
        let mut emptied_lazy = lazy.account(&deltas);
        assert_eq!(lazy.live_units(), eager.live_units());
        // A page that does not add up with the root is refused, and
        // changes nothing.
        let mut wrong = pages[2].1.clone();
        wrong.retain(|e| e.pieces == 0);
        assert!(lazy.restore_unread(2, &wrong, &[]).is_err());
        assert!(lazy.restore_unread(2, &pages[3].1, &[]).is_err());
        // (One sealed slot fewer than the root counts, none of its deltas
        // left without a slot.)
        let mut wrong = pages[2].1.clone();
        let untouched = wrong
            .iter()
            .position(|e| e.pieces > 0 && !deltas.iter().any(|d| d.slot == e.slot))
            .unwrap();
        wrong.remove(untouched);
        assert!(matches!(
            lazy.restore_unread(2, &wrong, &[]),
            Err(crate::error::CheckpointFault::KeptTooMany { page: 2, .. })
        ));
        assert_eq!(lazy.unread_count(), 3);
        for (page, entries) in pages[1..].iter().rev() {
            emptied_lazy.extend(lazy.restore_unread(*page, entries, &[]).unwrap());
            assert!(
                lazy.restore_unread(*page, entries, &[]).unwrap().is_empty(),
                "read once"
            );
        }
        emptied_eager.sort();
        emptied_lazy.sort();
        assert!(!emptied_eager.is_empty());
        assert_eq!(emptied_lazy, emptied_eager);
        assert_eq!(lazy.unread_count(), 0);
        for slot in 0..count {
            let (l, e) = (lazy.get(slot), eager.get(slot));
            assert_eq!(
                (l.state, l.sequence, l.live, l.pieces, l.listed),
                (e.state, e.sequence, e.live, e.pieces, e.listed),
                "slot {slot}"
            );
            assert_eq!(lazy.free.contains(slot), eager.free.contains(slot), "slot {slot}");
        }
        assert_eq!(lazy.free_count(), eager.free_count());
        assert_eq!(lazy.live_units(), eager.live_units());
        // A page that now lists other than its durable image is written
        // again by the next checkpoint: page 1 changed by what opening
        // freed alone, pages 2 and 3 by the deltas alone.
        for (page, entries) in &pages {
            let changed = lazy.page_entries(*page) != *entries;
            assert!(changed || *page == 0, "page {page} unchanged");
            assert!(
                !changed || lazy.dirty_pages.contains(*page),
                "page {page} changed, not dirty"
            );
            // And a delta over it lists every slot that differs.
            let now = lazy.page_entries(*page);
            let of = |entries: &[format::SlotEntry], slot| entries.iter().find(|e| e.slot == slot).copied();
            for slot in page * PAGE_SLOTS..(page + 1) * PAGE_SLOTS {
                assert!(
                    of(&now, slot) == of(entries, slot) || lazy.changed.contains(slot),
                    "slot {slot} differs from its page's image, not marked changed"
                );
            }
        }
    }

    /// Opening takes the durable pages straight into the table
    /// (`restore_page`, not through `set`): the table it makes is the one
    /// the pages were taken from, and what cannot be (a slot counted
    /// that no stripe is listed for, a slot listed that the checkpoint
    /// holds) is refused.
    #[test]
    fn a_table_restored_from_its_pages_is_the_one_they_were_taken_from() {
        let algorithm = Algorithm::Crc32c;
        let count = 3 * PAGE_SLOTS;
        let mut table = SlotTable::new(algorithm, count);
        let pins = Pins::new(count);
        let extent = |slot: u64, blocks: u32| {
            Arc::new(format::Extent {
                slot,
                offset: 0,
                stored_bytes: 4096 * blocks,
                blocks,
                codec: None,
                digest: algorithm.digest(b""),
                block_crcs: format::BlockCrcs::new(),
            })
        };
        // Sealed slots over the three pages, some holding data, one
        // emptied (draining) and one still open (holding none yet).
        for (i, slot) in (3..count).step_by(11).enumerate() {
            table.take(slot, SlotState::Open, &pins);
            if i % 3 != 0 {
                let target = Target::Data {
                    extent: extent(slot, 1 + i as u32 % 4),
                    skip: 0,
                };
                table.account(&[Delta::new(slot, 1, &target, true)]);
            }
            if i != 6 {
                table.sealed(slot, 1000 + slot, SlotState::Sealed);
            }
        }
        let emptied = 3 + 11 * 7;
        let target = Target::Data {
            extent: extent(emptied, 1 + 7 % 4),
            skip: 0,
        };
        table.account(&[Delta::new(emptied, 1, &target, false)]);
        let pages: Vec<(u64, Vec<format::SlotEntry>)> = (0..3).map(|page| (page, table.page_entries(page))).collect();
        assert!(pages.iter().all(|(_, entries)| !entries.is_empty()));

        let mut restored = SlotTable::new(algorithm, count);
        let mut live = 0;
        for (page, entries) in &pages {
            let (page_live, kept) = restored.restore_page(*page, entries, &[]).unwrap();
            assert_eq!(kept, format::SlotPageImage::kept_of(entries));
            live += page_live;
        }
        restored.restored(&[], live);
        restored.check_counted().unwrap();
        for slot in 0..count {
            let (was, is) = (table.get(slot), restored.get(slot));
            let listed = durable_entry(slot, &was);
            assert_eq!(is.listed, listed.is_some(), "slot {slot}");
            assert_eq!((is.live, is.pieces), (was.live, was.pieces), "slot {slot}");
            match listed {
                Some(entry) if entry.sequence != 0 => {
                    assert_eq!(
                        (is.state, is.sequence),
                        (SlotState::Sealed, was.sequence),
                        "slot {slot}"
                    )
                }
                _ => assert_eq!(is.state, SlotState::Free, "slot {slot}"),
            }
        }
        assert_eq!(restored.live_units(), table.live_units());
        let open = 3 + 11 * 6;
        assert_eq!(
            restored.free_count(),
            table.free_count() + 1,
            "the open slot is free again"
        );
        assert!(!restored.listed(open));

        // A slot the pages count in but list no stripe for must be among
        // the stripes sealed since (the root's list).
        let counted = format::SlotEntry {
            slot: 5,
            sequence: 0,
            live: LIVE_SCALE,
            pieces: 1,
        };
        let mut unsealed = SlotTable::new(algorithm, count);
        unsealed.restore_page(0, &[counted], &[]).unwrap();
        unsealed.restored(&[], LIVE_SCALE.into());
        assert!(matches!(
            unsealed.check_counted(),
            Err(crate::error::CheckpointFault::CountsUnsealed { slot: 5, .. })
        ));
        unsealed.set(5, SlotState::Sealed, 9);
        unsealed.check_counted().unwrap();
        // A slot the checkpoint holds cannot be listed by its pages.
        let mut own = SlotTable::new(algorithm, count);
        own.set(5, SlotState::Checkpoint, 3);
        assert!(matches!(
            own.restore_page(0, &[format::SlotEntry { sequence: 4, ..counted }], &[]),
            Err(crate::error::CheckpointFault::ListedTwice { slot: 5 })
        ));
        // (And left as it was.)
        let s = own.get(5);
        assert_eq!(
            (s.state, s.sequence, s.live, s.pieces, s.listed),
            (SlotState::Checkpoint, 3, 0, 0, false)
        );
    }
}
