//! The map: logical 4 KiB blocks to where they are stored (L2P).
//!
//! # Guarantees
//!
//! - Ranges are disjoint: `start -> Mapping { blocks, version, target }`.
//!   A target is a slice of an extent (from its block `skip`), or zeros
//!   recorded in a stripe (TRIM, WRITE_ZEROES over written blocks: the
//!   record must outlive older data for those blocks, so it is carried
//!   forward like data). Blocks without a mapping were never written and
//!   read as zeros.
//! - Every change is reported as [`Delta`]s, pieces of targets gained or
//!   lost, so the slot table's live counts follow the map exactly.
//! - [`Map::insert`] replaces only the pieces a [`Rule`] allows: all of
//!   them for a new write, those with a version no newer for recovery's
//!   replay (so the newest write of each block wins whatever order the
//!   stripes are replayed in), those still pointing at what garbage
//!   collection copied for a relocation (so a write that raced with the
//!   copy is never undone).
//!
//! # How it is held
//!
//! Keys are cut into pages of `MAP_PAGE_BLOCKS` (512) keys; a mapping
//! never crosses a page (a write across a page boundary is one mapping in
//! each). A page keeps its mappings as entries sorted by first block,
//! each naming its record inline (slot, offset, stored bytes, codec,
//! version: an [`Entry`], 40 bytes), packed field by field in as few bits
//! as the page's own values need (`entries.rs`), and the variable part of
//! the records (the digest, a raw record's CRC per block) in one arena of
//! 32-bit words beside them, shared by the pieces a cut record leaves; a
//! record with only one word (a raw block's CRC, a compressed record's
//! CRC32C) has it in its entry instead. A randomly written raw 4 KiB
//! block costs one packed entry, its CRC included: 10-11 bytes, where an
//! entry in a `BTreeMap` pointing at a shared `Arc<Extent>` cost ~250,
//! and an unpacked entry and its word 44. The arena is compacted when
//! more than half of it is no longer referred to. A page's image
//! (FORMAT.md, "Map pages") is packed the same way, without the headroom
//! memory keeps.
//!
//! ```text
//!  page 7 (keys 3584..4096)
//!  entries: [start 0, 1 block, v 90, slot 12 @ 81920, word: its crc]
//!           [start 1, 15 blocks, v 41, slot 3 @ 0, skip 1, words 0]  <- the tail of a
//!           [start 16, 3 blocks, zero, slot 9]                           16-block record
//!  words:   [digest, crc x16]
//! ```
//!
//! A lookup rebuilds the `Target` (an `Extent` in an `Arc`) from the entry
//! and its words; callers hold it for one request. Records are told
//! apart by (slot, offset, version): a slot is rewritten only once nothing
//! maps into it.
//!
//! A page is resident, or held only as its durable image (evicted, or
//! not read since opening: `crate::pages` reads it back when a request
//! needs it). A resident page names its durable image, and is clean
//! while it is as that image says; a change makes it not, so only a
//! clean page is evicted.
//! Changing a page that is not resident is a bug the map panics on.
//!
//! What this costs beyond a `BTreeMap` of ranges: a range of zeros is an
//! entry in every page it covers, so zeros are recorded only over runs
//! of blocks written before (`Shared::drop_needless_zeros`: a 4 TiB
//! shrink over three written places took 2 million entries before that);
//! a lookup builds an `Extent` (~170 bytes) where it cloned an `Arc`.

use crate::format::{
    codec_code, codec_from_code, Extent, FormatError, Geometry, PageImage,
    PAGE_IMAGE_COLUMNS_BYTES as IMAGE_COLUMNS_BYTES, PAGE_IMAGE_ENTRY_BYTES as IMAGE_ENTRY_BYTES,
    PAGE_IMAGE_HEADER_BYTES as IMAGE_HEADER_BYTES, PAGE_IMAGE_WORDS_PER_ENTRY_MAX as IMAGE_WORDS_PER_ENTRY_MAX,
};
use crate::limits::{EXTENT_BLOCKS_MAX, MAP_DIRECTORY_PAGES, MAP_PAGE_BLOCKS};
mod delta;
pub mod directory;
mod entries;
use directory::{under_directory_page, DirEntries, Directory, Lookup, NewDir};
use entries::Entries;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tessera_checksum::Digest;

/// Where a range of blocks is.
#[derive(Clone, Debug)]
pub enum Target {
    Zero { slot: u64 },
    Data { extent: Arc<Extent>, skip: u32 },
}

impl Target {
    pub fn slot(&self) -> u64 {
        match self {
            Target::Zero { slot } => *slot,
            Target::Data { extent, .. } => extent.slot,
        }
    }

    /// The same target, `blocks` further in.
    pub fn advanced_by(&self, blocks: u64) -> Target {
        self.advanced(u32::try_from(blocks).expect("a target is shorter than 2^32 blocks"))
    }

    fn advanced(&self, blocks: u32) -> Target {
        match self {
            Target::Data { extent, skip } => Target::Data {
                extent: extent.clone(),
                skip: skip + blocks,
            },
            zero => zero.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Mapping {
    pub blocks: u32,
    /// The version of the write this range holds.
    pub version: u64,
    pub target: Target,
}

/// Where a mapping points, without its record's checksums: what
/// recovery's checks want of every mapping, at no allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Location {
    pub slot: u64,
    /// The record's offset in the stripe's data area; `None` for zeros.
    pub offset: Option<u32>,
    pub version: u64,
}

/// A piece of a record that the map gained (`pieces` +1) or lost (-1),
/// `blocks` long: what the slot table counts, with no checksums (a
/// write's deltas are made under the index's write lock).
#[derive(Clone, Copy, Debug)]
pub struct Delta {
    /// The map key of the piece's first block.
    pub lba: u64,
    pub blocks: u32,
    pub gained: bool,
    /// The record's slot.
    pub slot: u64,
    /// A data record's place and size; `None` for zeros.
    pub data: Option<DataRecord>,
}

/// Where a data record lies in its slot and what it takes there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataRecord {
    pub offset: u32,
    pub stored_bytes: u32,
    pub blocks: u32,
    /// Its block CRCs (its blocks if raw, none if compressed).
    pub crcs: u32,
}

impl DataRecord {
    pub fn of(extent: &Extent) -> DataRecord {
        DataRecord {
            offset: extent.offset,
            stored_bytes: extent.stored_bytes,
            blocks: extent.blocks,
            crcs: extent.block_crcs.len() as u32,
        }
    }
}

impl Delta {
    /// `blocks` blocks from `lba` of `target` gained or lost.
    pub fn new(lba: u64, blocks: u32, target: &Target, gained: bool) -> Delta {
        Delta {
            lba,
            blocks,
            gained,
            slot: target.slot(),
            data: match target {
                Target::Data { extent, .. } => Some(DataRecord::of(extent)),
                Target::Zero { .. } => None,
            },
        }
    }
}

/// Which existing pieces an insert replaces.
#[derive(Clone, Copy, Debug)]
pub enum Rule<'a> {
    /// All of them, and the gaps between: a new write.
    Always,
    /// Those whose version is at most the new one, and the gaps: replay.
    /// One that already points at the same record (a checkpoint's page
    /// holding a write its window replays) is left as it is.
    IfNotNewer,
    /// Those that are still `target` at `version`, and no gaps: a
    /// relocation by garbage collection.
    IfStill { target: &'a Target, version: u64 },
}

impl Rule<'_> {
    /// Whether `existing` gives way to `new` (which starts at page key
    /// `lo`) at `version`.
    fn replaces(&self, existing: &Entry, version: u64, new: &Target, lo: u16) -> bool {
        match self {
            Rule::Always => true,
            Rule::IfNotNewer => {
                existing.version < version || (existing.version == version && !existing.is_placed_as(new, lo))
            }
            Rule::IfStill { target, version } => existing.version == *version && existing.is(target),
        }
    }

    fn fills_gaps(&self) -> bool {
        !matches!(self, Rule::IfStill { .. })
    }
}

/// `Entry::flags`: the entry maps zeros (no record words).
const ZERO: u8 = 1;
/// `Entry::flags`: the record's digest is its only block's CRC32C (a raw
/// one-block record in an array that checksums with CRC32C), kept once.
const DIGEST_IS_CRC: u8 = 2;

/// One mapping in a page: `blocks` keys from `start` (within the page)
/// to a record, from its block `skip`.
#[derive(Clone, Copy, Debug)]
struct Entry {
    version: u64,
    slot: u64,
    offset: u32,
    stored_bytes: u32,
    /// Where the record's words start in the page's arena.
    words: u32,
    start: u16,
    blocks: u16,
    record_blocks: u8,
    skip: u8,
    /// Block CRCs the record has (its blocks if raw, else none).
    crcs: u8,
    codec: u8,
    flags: u8,
    digest_bytes: u8,
}
const _: () = assert!(std::mem::size_of::<Entry>() == 40);

impl Entry {
    fn end(&self) -> u16 {
        self.start + self.blocks
    }

    fn is_zero(&self) -> bool {
        self.flags & ZERO != 0
    }

    /// Words of the arena the entry takes: its record's words, unless it
    /// has only one, which the entry holds itself (`words`).
    fn arena_words(&self) -> usize {
        match self.word_count() {
            1 => 0,
            n => n,
        }
    }

    /// Words the record has: the digest (unless it is the CRC), a raw
    /// record's CRCs. One (a raw block's CRC, a compressed record's
    /// CRC32C) is held in the entry, not the arena.
    fn word_count(&self) -> usize {
        if self.is_zero() {
            return 0;
        }
        let digest = if self.flags & DIGEST_IS_CRC != 0 {
            0
        } else {
            usize::from(self.digest_bytes).div_ceil(4)
        };
        digest + usize::from(self.crcs)
    }

    fn location(&self) -> Location {
        Location {
            slot: self.slot,
            offset: (!self.is_zero()).then_some(self.offset),
            version: self.version,
        }
    }

    /// This entry's blocks, from page key `base`, gained or lost.
    fn delta(&self, base: u64, gained: bool) -> Delta {
        Delta {
            lba: base + u64::from(self.start),
            blocks: u32::from(self.blocks),
            gained,
            slot: self.slot,
            data: (!self.is_zero()).then_some(DataRecord {
                offset: self.offset,
                stored_bytes: self.stored_bytes,
                blocks: u32::from(self.record_blocks),
                crcs: u32::from(self.crcs),
            }),
        }
    }

    /// Whether this entry points at `target`'s record.
    fn is(&self, target: &Target) -> bool {
        match target {
            Target::Zero { slot } => self.is_zero() && self.slot == *slot,
            Target::Data { extent, .. } => !self.is_zero() && self.slot == extent.slot && self.offset == extent.offset,
        }
    }

    /// Whether this entry already maps its keys as `target`, starting at
    /// page key `lo`, would: the same record (a slot may have been
    /// rewritten since a checkpoint's page was copied, and a relocated
    /// piece of the same write land at the same offset, so the record's
    /// first key, length and stored form are compared too).
    fn is_placed_as(&self, target: &Target, lo: u16) -> bool {
        match target {
            Target::Zero { .. } => self.is(target),
            Target::Data { extent, skip } => {
                self.is(target)
                    && i64::from(self.start) - i64::from(self.skip) == i64::from(lo) - i64::from(*skip)
                    && u32::from(self.record_blocks) == extent.blocks
                    && self.stored_bytes == extent.stored_bytes
                    && self.codec == codec_code(extent.codec).0
            }
        }
    }

    /// The same entry from key `start` on (a tail), or cut to `blocks`.
    fn cut(&self, start: u16, end: u16) -> Entry {
        debug_assert!(self.start <= start && start < end && end <= self.end());
        let mut piece = *self;
        if !self.is_zero() {
            piece.skip += (start - self.start) as u8;
        }
        piece.start = start;
        piece.blocks = end - start;
        piece
    }
}

// What `Page::bytes` counts a page itself as: its fields packed to a size
// class of the allocator's (96), not 112.
const _: () = assert!(std::mem::size_of::<Page>() == 96);

/// The heap a `BTreeMap` (or `BTreeSet`) takes for each entry whose key
/// and value take `key` and `value` bytes, at worst: the standard
/// library's nodes hold at most 11 entries (a leaf: its parent's address
/// and two u16s, then the keys and the values; an internal node, 12
/// addresses of children more) and, the root aside, at least 5; an
/// internal node has at least 6 children, so at most one node in 6 is
/// internal. (Counted as an entry's bytes and 16 more, the index of pages
/// took 219 bytes a page, by heaptrack, where the count said 136:
/// PERFORMANCE.md, "RAM the map's count left out".)
pub(crate) const fn btree_entry_bytes(key: usize, value: usize) -> usize {
    const CAPACITY: usize = 11;
    const LEAST: usize = 5;
    let leaf = (12 + CAPACITY * (key + value)).next_multiple_of(8);
    let internal = leaf + (CAPACITY + 1) * 8;
    (5 * leaf + internal).div_ceil(6 * LEAST)
}

/// The mappings of `MAP_PAGE_BLOCKS` consecutive keys.
#[derive(Default)]
struct Page {
    /// Sorted by `start`, disjoint; packed (`entries.rs`).
    entries: Entries,
    words: Vec<u32>,
    /// The sum of the entries' word counts (pieces of one record count
    /// once each, so this overstates what is live, never understates);
    /// `referred`, `set_referred`. (A u32: a page in memory is 96 bytes.)
    words_referred: u32,
    /// The page's durable image (`None`: it has none), set by loading it
    /// and by a durable checkpoint that wrote it: a changed page names
    /// the image the next checkpoint replaces (`Map::durable_image`), so
    /// its directory page may leave memory before it is written.
    durable: Option<Arc<PageImage>>,
    /// Whether the page is as `durable` says (loaded, or written by a
    /// durable checkpoint and not changed since): what lets it be
    /// evicted. A change clears it; a checkpoint that took the page and
    /// is not durable yet leaves it cleared.
    clean: bool,
    /// The map's clock when the page was last looked at (for eviction,
    /// least recently used first).
    used: AtomicU64,
    /// What it knows of its base image (the keys changed since it, the
    /// keys its deltas held), for a checkpoint to write it as a delta
    /// over that image (`delta.rs`); `None`: not known, or not kept.
    since_base: Option<Box<delta::Since>>,
}

impl Page {
    /// Bytes the page holds: its entries, its arena, itself (a box of
    /// its own) and its place in the index of pages (`btree_entry_bytes`),
    /// and the durable image it names (an allocation of its own, 136
    /// bytes with one piece: on pages of a few entries, as writes spread
    /// thinly make them, the process held twice what the count said
    /// before it was counted; PERFORMANCE.md, "A 1.5 TiB thin export of
    /// 64 KiB chunks").
    fn bytes(&self) -> usize {
        let keys = self
            .since_base
            .as_ref()
            .map_or(0, |_| std::mem::size_of::<delta::Since>());
        let durable = self.durable.as_deref().map_or(0, image_heap_bytes);
        self.entries.heap_bytes()
            + self.words.capacity() * 4
            + std::mem::size_of::<Page>()
            + btree_entry_bytes(8, std::mem::size_of::<Box<Page>>())
            + keys
            + durable
    }

    fn referred(&self) -> usize {
        self.words_referred as usize
    }

    fn set_referred(&mut self, words: usize) {
        self.words_referred = u32::try_from(words).expect("a page refers to fewer than 2^32 arena words");
    }

    /// The index of the first entry that ends after `key`.
    fn first_ending_after(&self, key: u16) -> usize {
        self.entries.first_ending_after(key)
    }

    fn target(&self, e: &Entry) -> Target {
        if e.is_zero() {
            return Target::Zero { slot: e.slot };
        }
        let held = [e.words];
        let rest = match e.word_count() {
            1 => &held[..],
            n => &self.words[e.words as usize..e.words as usize + n],
        };
        // As on the members, the codec without its level: only compressing
        // needs one.
        let codec = codec_from_code(e.codec, 0).expect("the map keeps only codecs it was given");
        let (digest, crcs) = if e.flags & DIGEST_IS_CRC != 0 {
            (tessera_checksum::crc32c_digest(rest[0]), rest)
        } else {
            let (digest, crcs) = rest.split_at(usize::from(e.digest_bytes).div_ceil(4));
            let mut bytes = [0u8; 64];
            for (i, word) in digest.iter().enumerate() {
                bytes[4 * i..4 * i + 4].copy_from_slice(&word.to_le_bytes());
            }
            (Digest::from_bytes(&bytes[..usize::from(e.digest_bytes)]), crcs)
        };
        Target::Data {
            extent: Arc::new(Extent {
                slot: e.slot,
                offset: e.offset,
                stored_bytes: e.stored_bytes,
                blocks: u32::from(e.record_blocks),
                codec,
                digest,
                block_crcs: crcs.iter().copied().collect(),
            }),
            skip: u32::from(e.skip),
        }
    }

    fn mapping(&self, base: u64, e: &Entry) -> (u64, Mapping) {
        let mapping = Mapping {
            blocks: u32::from(e.blocks),
            version: e.version,
            target: self.target(e),
        };
        (base + u64::from(e.start), mapping)
    }

    /// An entry for `target` (its words added to the arena), to be given
    /// its keys and version.
    fn store(&mut self, target: &Target) -> Entry {
        let mut entry = Entry {
            version: 0,
            slot: target.slot(),
            offset: 0,
            stored_bytes: 0,
            words: 0,
            start: 0,
            blocks: 0,
            record_blocks: 0,
            skip: 0,
            crcs: 0,
            codec: 0,
            flags: ZERO,
            digest_bytes: 0,
        };
        let Target::Data { extent, skip } = target else {
            return entry;
        };
        let small = "an extent holds at most EXTENT_BLOCKS_MAX blocks";
        let digest = extent.digest.as_bytes();
        let (codec, _level) = codec_code(extent.codec);
        let digest_is_crc = codec == 0 && extent.block_crcs.len() == 1 && digest == extent.block_crcs[0].to_be_bytes();
        entry = Entry {
            offset: extent.offset,
            stored_bytes: extent.stored_bytes,
            words: u32::try_from(self.words.len()).expect("a page's arena is small"),
            record_blocks: u8::try_from(extent.blocks).expect(small),
            skip: u8::try_from(*skip).expect(small),
            crcs: u8::try_from(extent.block_crcs.len()).expect(small),
            codec,
            flags: if digest_is_crc { DIGEST_IS_CRC } else { 0 },
            digest_bytes: u8::try_from(digest.len()).expect("a digest has at most 64 bytes"),
            ..entry
        };
        let digest_words = digest.chunks(4).filter(|_| !digest_is_crc).map(|c| {
            let mut word = [0u8; 4];
            word[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(word)
        });
        let mut words = digest_words.chain(extent.block_crcs.iter().copied());
        if entry.word_count() == 1 {
            entry.words = words.next().expect("one word");
            return entry;
        }
        let at = self.words.len();
        grow(&mut self.words, entry.word_count());
        self.words.extend(words);
        debug_assert_eq!(self.words.len() - at, entry.word_count());
        entry
    }

    /// Maps keys [lo, hi) of the page to `target` (which starts at `lo`)
    /// at `version`, over the entries `rule` allows; what changed goes to
    /// `gained` and `lost`. Returns the change in the number of entries.
    #[allow(clippy::too_many_arguments)]
    fn insert(
        &mut self,
        base: u64,
        (lo, hi): (u16, u16),
        version: u64,
        target: &Target,
        rule: Rule<'_>,
        gained: &mut Vec<Delta>,
        lost: &mut Vec<Delta>,
    ) -> isize {
        let first = self.first_ending_after(lo);
        let last = self.entries.first_starting_at_or_after(hi).max(first);
        let old: Vec<Entry> = (first..last).map(|i| self.entries.get(i)).collect();
        let mut pieces = Pieces {
            entries: Vec::with_capacity(old.len() + 3),
            new: Vec::new(),
            stored: None,
        };
        let mut cursor = lo;
        for e in &old {
            let (from, to) = (e.start.max(lo), e.end().min(hi));
            if cursor < from && rule.fills_gaps() {
                pieces.take(self, target, (lo, version), cursor, from);
            }
            cursor = to;
            if !rule.replaces(e, version, target, lo) {
                pieces.entries.push(*e);
                continue;
            }
            lost.push(e.delta(base, false));
            if e.start < from {
                let head = e.cut(e.start, from);
                gained.push(head.delta(base, true));
                pieces.entries.push(head);
            }
            pieces.take(self, target, (lo, version), from, to);
            if e.end() > to {
                let tail = e.cut(to, e.end());
                gained.push(tail.delta(base, true));
                pieces.entries.push(tail);
            }
        }
        if cursor < hi && rule.fills_gaps() {
            pieces.take(self, target, (lo, version), cursor, hi);
        }
        for &i in &pieces.new {
            let piece = &pieces.entries[i];
            gained.push(Delta::new(
                base + u64::from(piece.start),
                u32::from(piece.blocks),
                target,
                true,
            ));
        }
        let removed: usize = old.iter().map(Entry::arena_words).sum();
        let added: usize = pieces.entries.iter().map(Entry::arena_words).sum();
        self.set_referred(self.referred() + added - removed);
        let change = pieces.entries.len() as isize - old.len() as isize;
        self.entries.splice(first..last, &pieces.entries);
        if self.words.len() > 2 * self.referred() + 32 {
            self.compact();
        }
        change
    }

    /// Rewrites the arena with only the words entries refer to, each
    /// record's once.
    fn compact(&mut self) {
        let (words, at) = self.packed();
        let mut entries = self.entries.to_vec();
        for (e, at) in entries.iter_mut().zip(at) {
            e.words = at;
        }
        self.entries.repack(&entries);
        self.words = words;
    }

    /// The words the entries refer to in the arena, each record's once,
    /// and where each entry's start in them (0 for an entry without words;
    /// the word itself for an entry that holds its one word).
    fn packed(&self) -> (Vec<u32>, Vec<u32>) {
        self.packed_of(self.entries.iter())
    }

    /// `packed` of `entries` (the page's, or some cut from them).
    fn packed_of(&self, entries: impl Iterator<Item = Entry>) -> (Vec<u32>, Vec<u32>) {
        let mut words = Vec::with_capacity(self.referred());
        let mut moved: HashMap<u32, u32> = HashMap::new();
        let at = entries
            .map(|e| {
                let count = e.word_count();
                match count {
                    0 => return 0,
                    1 => return e.words,
                    _ => {}
                }
                *moved.entry(e.words).or_insert_with(|| {
                    let at = words.len() as u32;
                    words.extend_from_slice(&self.words[e.words as usize..e.words as usize + count]);
                    at
                })
            })
            .collect();
        (words, at)
    }

    /// The page's image (FORMAT.md, "Map pages"), appended to `out`.
    fn encode(&self, p: u64, out: &mut Vec<u8>) {
        self.encode_entries(p, &self.entries.to_vec(), out);
    }

    /// A page image of `entries` (the page's, or some cut from them,
    /// sorted and disjoint) as page `p`'s, appended to `out`.
    fn encode_entries(&self, p: u64, entries: &[Entry], out: &mut Vec<u8>) {
        let (words, at) = self.packed_of(entries.iter().copied());
        let entries: Vec<Entry> = entries.iter().zip(at).map(|(e, words)| Entry { words, ..*e }).collect();
        let packed = Entries::exact(&entries);
        out.reserve(IMAGE_HEADER_BYTES + entries.len() * IMAGE_ENTRY_BYTES + 4 * words.len());
        out.extend_from_slice(&p.to_le_bytes());
        out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        out.extend_from_slice(&(words.len() as u32).to_le_bytes());
        packed.write_image(out);
        for word in words {
            out.extend_from_slice(&word.to_le_bytes());
        }
    }

    /// A page from its image, every field checked: against the geometry
    /// and the page's own entries (sorted, disjoint, inside the page, each
    /// record's words inside the arena). Returns the page's number too.
    /// (Whether the slots it points into hold stripes it may point into
    /// is `Map::install`'s to check, under the index's lock.)
    fn decode(image: &[u8], geometry: &Geometry) -> Result<(u64, Page), FormatError> {
        Page::decode_checked(image, geometry, None, true)
    }

    /// `decode`, checking a page of one record shape as one
    /// (`by_uniform`; the tests compare it with checking each entry),
    /// and each slot with `live` too if given (whether a slot holds a
    /// stripe the map may point into).
    fn decode_checked(
        image: &[u8],
        geometry: &Geometry,
        live: Option<&dyn Fn(u64) -> bool>,
        by_uniform: bool,
    ) -> Result<(u64, Page), FormatError> {
        const WHAT: &str = "map page";
        let field = |field, value: u64| FormatError::Field {
            what: WHAT,
            field,
            value,
        };
        let get = |at: usize, n: usize| -> u64 {
            let mut b = [0u8; 8];
            b[..n].copy_from_slice(&image[at..at + n]);
            u64::from_le_bytes(b)
        };
        if image.len() < IMAGE_HEADER_BYTES {
            return Err(field("length", image.len() as u64));
        }
        let (p, count, word_count) = (get(0, 8), get(8, 4) as usize, get(12, 4) as usize);
        if count == 0 || count > MAP_PAGE_BLOCKS as usize || word_count > count * IMAGE_WORDS_PER_ENTRY_MAX {
            return Err(field("entries", count as u64));
        }
        let (entries, packed_bytes) =
            Entries::read_image(&image[IMAGE_HEADER_BYTES..], count).map_err(|(name, value)| field(name, value))?;
        let words_at = IMAGE_HEADER_BYTES + packed_bytes;
        if image.len() != words_at + 4 * word_count {
            return Err(field("length", image.len() as u64));
        }
        let first_key = p.saturating_mul(MAP_PAGE_BLOCKS);
        if !crate::format::within_one_volume(first_key, MAP_PAGE_BLOCKS as u32) {
            return Err(field("page", p));
        }
        let mut page = Page {
            words: (0..word_count).map(|i| get(words_at + 4 * i, 4) as u32).collect(),
            ..Page::default()
        };
        let uniform = by_uniform
            .then(|| check_uniform(&entries, geometry, word_count, live))
            .flatten();
        page.set_referred(
            uniform
                .unwrap_or_else(|| check_each(&entries, geometry, word_count, live))
                .map_err(|(name, value)| field(name, value))?,
        );
        // Held as the image packs it (a change that does not fit its
        // layout repacks it with room to grow), or wide if it has few.
        page.entries = entries;
        Ok((p, page))
    }
}

/// The checks of a page's entries one by one, in order: each in its
/// place (`check_place`); a zero entry with nothing else set; a data
/// entry's record shape (`record_shape`) and the fields that place it in
/// its record, stripe and arena (`check_within`). Returns the arena
/// words the entries refer to.
fn check_each(
    entries: &Entries,
    geometry: &Geometry,
    word_count: usize,
    live: Option<&dyn Fn(u64) -> bool>,
) -> Result<usize, (&'static str, u64)> {
    let limits = Limits::new(geometry, word_count);
    let mut referred = 0;
    let mut end = 0;
    for e in entries.iter() {
        let varying = Varying {
            start: u64::from(e.start),
            blocks: u64::from(e.blocks),
            slot: e.slot,
            skip: u64::from(e.skip),
            offset: u64::from(e.offset),
            stored_bytes: u64::from(e.stored_bytes),
            words: u64::from(e.words),
        };
        check_place(&varying, &mut end, &limits, live)?;
        if e.is_zero() {
            let rest = [u64::from(e.offset), u64::from(e.stored_bytes), u64::from(e.words)];
            let record = [e.record_blocks, e.skip, e.crcs, e.codec, e.digest_bytes];
            if e.flags != ZERO || rest != [0; 3] || record != [0; 5] {
                return Err(("zero", e.slot));
            }
        } else {
            let shape = record_shape(&e, geometry)?;
            check_within(&varying, shape, &limits)?;
            referred += shape.arena_words;
        }
    }
    Ok(referred)
}

/// The checks of a page whose entries all have one data record's shape
/// (flags, record blocks, CRCs, codec, digest size: the layout gives
/// each no bits): that shape once, then what the columns' bounds do not
/// settle (`every_entry_passes`); only a page an entry of which fails
/// (or may) goes through `check_each`, which names the first failure.
/// `None` if the page's entries differ in shape (or map zeros); else
/// the arena words the entries refer to. A page of random 4 KiB writes
/// is such a page, and checking every field of each of its ~500 entries
/// was the largest cost of a read with a small map cache.
fn check_uniform(
    entries: &Entries,
    geometry: &Geometry,
    word_count: usize,
    live: Option<&dyn Fn(u64) -> bool>,
) -> Option<Result<usize, (&'static str, u64)>> {
    let (least, most) = entries.bounds();
    let shared = least.flags == most.flags
        && least.record_blocks == most.record_blocks
        && least.crcs == most.crcs
        && least.codec == most.codec
        && least.digest_bytes == most.digest_bytes;
    if !shared || least.is_zero() {
        return None;
    }
    let limits = Limits::new(geometry, word_count);
    if let Ok(shape) = record_shape(&least, geometry) {
        if every_entry_passes(entries, (&least, &most), shape, &limits, live) {
            return Some(Ok(shape.arena_words * entries.len()));
        }
    }
    // One fails (or may): checking each entry in turn finds which.
    Some(check_each(entries, geometry, word_count, live))
}

/// Whether every entry of a page of one record shape (`shape`, already
/// checked) passes `check_place` and `check_within`: `false` if one may
/// not. A check that the columns' bounds (`least`, `most`: no entry's
/// field lies outside them) pass for every entry is not made entry by
/// entry; the others are, each over the one or two columns it reads.
/// The pages of random 4 KiB writes measured (docs/PERFORMANCE.md) pass
/// every check but the keys' order from their bounds.
fn every_entry_passes(
    entries: &Entries,
    (least, most): (&Entry, &Entry),
    shape: Shape,
    limits: &Limits,
    live: Option<&dyn Fn(u64) -> bool>,
) -> bool {
    use entries::{BLOCKS, OFFSET, SKIP, SLOT, START, STORED_BYTES, WORDS};
    let n = entries.len();
    let (start, blocks) = (entries.column(START), entries.column(BLOCKS));
    let mut end = 0;
    let placed = least.blocks > 0
        && match blocks.constant() {
            // Each entry as long as the others (random writes of one
            // size): the keys read alone.
            Some(blocks) => start.all(|start| {
                let fits = start >= end && start + blocks <= MAP_PAGE_BLOCKS;
                end = start + blocks;
                fits
            }),
            None => (0..n).all(|i| {
                let (start, blocks) = (start.get(i), blocks.get(i));
                let fits = start >= end && start + blocks <= MAP_PAGE_BLOCKS;
                end = start + blocks;
                fits
            }),
        };
    let in_slots = match live {
        None if most.slot < limits.slots => true,
        _ => entries
            .column(SLOT)
            .all(|slot| slot < limits.slots && live.is_none_or(|live| live(slot))),
    };
    let skip = entries.column(SKIP);
    let in_record = u64::from(most.skip) + u64::from(most.blocks) <= shape.record_blocks
        || (0..n).all(|i| skip.get(i) + blocks.get(i) <= shape.record_blocks);
    let (offset, stored) = (entries.column(OFFSET), entries.column(STORED_BYTES));
    let in_area = least.stored_bytes > 0 && u64::from(most.offset) + u64::from(most.stored_bytes) <= limits.area
        || (0..n).all(|i| {
            let stored = stored.get(i);
            stored > 0 && offset.get(i) + stored <= limits.area
        });
    let in_arena = shape.arena_words == 0
        || most.words as usize + shape.arena_words <= limits.word_count
        || entries
            .column(WORDS)
            .all(|words| words as usize + shape.arena_words <= limits.word_count);
    placed && in_slots && in_record && in_area && in_arena
}

/// An entry's fields that vary from entry to entry in a page of one
/// record shape.
struct Varying {
    start: u64,
    blocks: u64,
    slot: u64,
    skip: u64,
    offset: u64,
    stored_bytes: u64,
    words: u64,
}

/// What a data entry's record shape gives the checks of its place.
#[derive(Clone, Copy)]
struct Shape {
    record_blocks: u64,
    /// Arena words the entry refers to.
    arena_words: usize,
}

/// What an entry's fields must stay within, the geometry's figures taken
/// once a page.
struct Limits {
    slots: u64,
    /// Bytes of a stripe's data area.
    area: u64,
    /// Words of the page's arena.
    word_count: usize,
}

impl Limits {
    fn new(geometry: &Geometry, word_count: usize) -> Limits {
        Limits {
            slots: geometry.slot_count(),
            area: geometry.data_area_bytes() as u64,
            word_count,
        }
    }
}

/// An entry's place: within the page, after the one before it (which
/// ended at `end`, moved past this one), in a slot that holds a live
/// stripe.
fn check_place(
    v: &Varying,
    end: &mut u64,
    limits: &Limits,
    live: Option<&dyn Fn(u64) -> bool>,
) -> Result<(), (&'static str, u64)> {
    if v.start < *end || v.blocks == 0 || v.start + v.blocks > MAP_PAGE_BLOCKS {
        return Err(("start", v.start));
    }
    *end = v.start + v.blocks;
    if v.slot >= limits.slots || !live.is_none_or(|live| live(v.slot)) {
        return Err(("slot", v.slot));
    }
    Ok(())
}

/// The checks of a data entry's record shape: its flags, its record's
/// blocks, codec, checksums (the field at fault, and its value, if one
/// fails).
fn record_shape(e: &Entry, geometry: &Geometry) -> Result<Shape, (&'static str, u64)> {
    let flags = u64::from(e.flags);
    if e.flags & !(ZERO | DIGEST_IS_CRC) != 0 {
        return Err(("flags", flags));
    }
    let record_blocks = usize::from(e.record_blocks);
    if record_blocks == 0 || record_blocks > EXTENT_BLOCKS_MAX {
        return Err(("record_blocks", u64::from(e.record_blocks)));
    }
    if codec_from_code(e.codec, 0).is_none() {
        return Err(("codec", u64::from(e.codec)));
    }
    let crcs = if e.codec == 0 { record_blocks } else { 0 };
    if usize::from(e.crcs) != crcs {
        return Err(("block_crcs", u64::from(e.crcs)));
    }
    if usize::from(e.digest_bytes) != geometry.checksum.digest_bytes() {
        return Err(("digest_bytes", u64::from(e.digest_bytes)));
    }
    if e.flags & DIGEST_IS_CRC != 0
        && (e.codec != 0 || e.crcs != 1 || geometry.checksum != tessera_checksum::Algorithm::Crc32c)
    {
        return Err(("flags", flags));
    }
    Ok(Shape {
        record_blocks: u64::from(e.record_blocks),
        arena_words: e.arena_words(),
    })
}

/// The checks of a data entry's place in its record, stripe and arena.
fn check_within(v: &Varying, shape: Shape, limits: &Limits) -> Result<(), (&'static str, u64)> {
    if v.skip + v.blocks > shape.record_blocks {
        return Err(("record_blocks", shape.record_blocks));
    }
    if v.offset + v.stored_bytes > limits.area || v.stored_bytes == 0 {
        return Err(("offset", v.offset));
    }
    if shape.arena_words > 0 && v.words as usize + shape.arena_words > limits.word_count {
        return Err(("words", v.words));
    }
    Ok(())
}

/// The most bytes images of `pages` pages holding `entries` entries in
/// all may take as stored: every entry with its own words, the most a
/// record has, none compressed.
pub fn images_bytes_max(algorithm: tessera_checksum::Algorithm, pages: usize, entries: usize) -> usize {
    let words = algorithm.digest_bytes().div_ceil(4) + EXTENT_BLOCKS_MAX;
    // A delta's header and its page image's, at most: it has at most as
    // many entries as keys, and no more keys than its page has entries
    // (`delta::Since::worth_a_delta`).
    let stored = crate::format::STORED_IMAGE_HEADER_BYTES + crate::format::DELTA_HEADER_BYTES;
    pages * (IMAGE_HEADER_BYTES + IMAGE_COLUMNS_BYTES + stored) + entries * (IMAGE_ENTRY_BYTES + 4 * words)
}

/// The entries that replace a page's overlapped ones, being built.
struct Pieces {
    entries: Vec<Entry>,
    /// Which of `entries` are the new target's.
    new: Vec<usize>,
    /// The new target's entry, once its words are in the arena (stored
    /// at the first piece taken, so that a relocation that takes nothing
    /// adds nothing).
    stored: Option<Entry>,
}

impl Pieces {
    /// Keys [from, to) go to the target that starts at key `lo`, as a
    /// new entry or as more of the last one where they follow it; they
    /// are marked changed since the page's base. (Only they: an entry a
    /// rule keeps may reach past the keys a change covers, and a delta
    /// cuts what it holds to the keys marked, so marking all of a change's
    /// keys would cut such an entry in two when the page is read back,
    /// one more piece than the slot table counts.)
    fn take(&mut self, page: &mut Page, target: &Target, (lo, version): (u16, u64), from: u16, to: u16) {
        page.mark_changed(from, to);
        if let Some(&i) = self.new.last() {
            if i + 1 == self.entries.len() && self.entries[i].end() == from {
                self.entries[i].blocks = to - self.entries[i].start;
                return;
            }
        }
        let stored = *self.stored.get_or_insert_with(|| page.store(target));
        let skip = if stored.is_zero() {
            0
        } else {
            stored.skip + (from - lo) as u8
        };
        self.new.push(self.entries.len());
        self.entries.push(Entry {
            version,
            start: from,
            blocks: to - from,
            skip,
            ..stored
        });
    }
}

/// Room for `more` items, growing by an eighth rather than doubling:
/// pages are many and small, and doubling would leave a third of their
/// memory unused on average.
fn grow<T>(vec: &mut Vec<T>, more: usize) {
    let want = vec.len() + more;
    if want > vec.capacity() {
        vec.reserve_exact((want - vec.len()).max(vec.capacity() / 8).max(4));
    }
}

/// The mappings overlapping a range of keys (`Map::overlapping`): the
/// pages it spans looked up one at a time (a read spans one or two), each
/// searched for its first entry that ends inside the range.
pub struct Overlapping<'a> {
    pages: &'a BTreeMap<u64, Box<Page>>,
    next_page: u64,
    last_page: u64,
    /// The first page and the range's first key in it.
    first: (u64, u16),
    end: u64,
    /// The page being read: its first key, the page, the next entry.
    current: Option<(u64, &'a Page, usize)>,
    done: bool,
    /// The map's clock, for the pages looked at.
    now: u64,
}

impl<'a> Overlapping<'a> {
    /// The mappings of `pages` overlapping blocks [lba, end), the pages
    /// looked at marked with `now`.
    fn new(pages: &'a BTreeMap<u64, Box<Page>>, lba: u64, end: u64, now: u64) -> Overlapping<'a> {
        let (first, key) = page_of(lba);
        Overlapping {
            pages,
            next_page: first,
            last_page: if end > lba { (end - 1) / MAP_PAGE_BLOCKS } else { 0 },
            first: (first, key),
            end,
            current: None,
            done: end <= lba,
            now,
        }
    }

    /// Where each mapping starts and how many blocks it maps, without
    /// building its target.
    pub fn spans(mut self) -> impl Iterator<Item = (u64, u32)> + 'a {
        std::iter::from_fn(move || {
            self.next_entry()
                .map(|(base, _, e)| (base + u64::from(e.start), u32::from(e.blocks)))
        })
    }

    /// Where each mapping starts and where it points, without its
    /// record's checksums.
    pub fn locations(mut self) -> impl Iterator<Item = (u64, Location)> + 'a {
        std::iter::from_fn(move || {
            self.next_entry()
                .map(|(base, _, e)| (base + u64::from(e.start), e.location()))
        })
    }

    fn next_entry(&mut self) -> Option<(u64, &'a Page, Entry)> {
        loop {
            if let Some((base, page, i)) = &mut self.current {
                if let Some(e) = page
                    .entries
                    .get_opt(*i)
                    .filter(|e| *base + u64::from(e.start) < self.end)
                {
                    *i += 1;
                    return Some((*base, *page, e));
                }
                self.current = None;
            }
            if self.done {
                return None;
            }
            // The next page that exists: found directly when it is the
            // last, else by a search (a long range may cross many gaps).
            let found = if self.next_page == self.last_page {
                self.pages.get(&self.next_page).map(|page| (self.next_page, page))
            } else {
                self.pages
                    .range(self.next_page..=self.last_page)
                    .next()
                    .map(|(&p, page)| (p, page))
            };
            let Some((p, page)) = found else {
                self.done = true;
                return None;
            };
            self.done = p == self.last_page;
            self.next_page = p + 1;
            // Written only when it changes: readers share the page's line.
            if page.used.load(Ordering::Relaxed) != self.now {
                page.used.store(self.now, Ordering::Relaxed);
            }
            let from = if p == self.first.0 {
                page.first_ending_after(self.first.1)
            } else {
                0
            };
            self.current = Some((p * MAP_PAGE_BLOCKS, page, from));
        }
    }
}

impl Iterator for Overlapping<'_> {
    type Item = (u64, Mapping);

    fn next(&mut self) -> Option<(u64, Mapping)> {
        self.next_entry().map(|(base, page, e)| page.mapping(base, &e))
    }
}

#[derive(Default)]
pub struct Map {
    /// The pages held in memory (resident).
    pages: BTreeMap<u64, Box<Page>>,
    /// Where the durable image of every page is: a page not resident is
    /// held only as the image the directory names (evicted, or not
    /// looked at since the array opened), unless it is in `emptied`.
    directory: Directory,
    /// Pages emptied in memory whose image the directory may still name
    /// (until a checkpoint that wrote them is durable), each with its
    /// durable image (`None`: it has none), as a changed page holds it
    /// (`Page::was`), so that its directory page may leave memory.
    emptied: BTreeMap<u64, Option<Arc<PageImage>>>,
    /// Entries in the resident pages.
    len: usize,
    /// What `Page::bytes` adds up to over the resident pages.
    bytes: usize,
    /// Pages changed (or emptied) since their image was last taken
    /// (`take_dirty`): what the next checkpoint writes.
    dirty: BTreeSet<u64>,
    /// A checkpoint's copy of the pages it took, as they were when it
    /// took them (`begin_snapshot`).
    snapshot: Mutex<Option<Snapshot>>,
    /// What the pages the checkpoint being written takes knew of their
    /// base when taken (`begin_snapshot`), given back to them if it
    /// fails (`give_back`); `None` where not known.
    rebased: BTreeMap<u64, Option<Box<delta::Since>>>,
    /// A page of fewer entries is written whole (`EngineOptions::map_delta_entries_min`).
    delta_entries_min: usize,
    /// Ticks once per load or eviction: pages looked at since share a tick.
    clock: AtomicU64,
    /// The bytes held after an eviction that could not bring them down
    /// to its target (the rest changed since the last checkpoint, or
    /// pinned), lowered where the map shrank since (at a later call of
    /// `evict`): the next walk waits until they have grown by an eighth of
    /// the limit, or a checkpoint made pages clean (`publish`). Each
    /// eviction walks every page in memory; before, a cache full of
    /// changed pages walked them all at each page read in, under the
    /// index's lock (PERFORMANCE.md, "Evictions past a cache full of
    /// changed pages").
    evict_stuck_at: Option<usize>,
    /// Evictions that walked the pages (`evict`), for the tests.
    #[cfg(test)]
    eviction_walks: u64,
}

/// The pages a checkpoint took and has not copied yet: a page is copied
/// as it was when taken, by the first of the checkpoint (from the page)
/// or a change to it (which keeps its image first).
#[derive(Default)]
struct Snapshot {
    pending: BTreeSet<u64>,
    /// Images kept before a change: `None` for a page that was empty.
    kept: HashMap<u64, Option<Vec<u8>>>,
    /// The pages taken as deltas, with the keys each holds and the keys
    /// written in deltas since the base, its own included.
    deltas: HashMap<u64, delta::Since>,
}

impl Snapshot {
    /// Page `p`'s image as taken (whole, or its delta), appended to `out`.
    fn encode(&self, p: u64, page: &Page, out: &mut Vec<u8>) {
        match self.deltas.get(&p) {
            Some(since) => page.encode_delta(p, since, out),
            None => page.encode(p, out),
        }
    }
}

/// What must be read before the pages of a range are all in memory.
#[derive(Clone, Debug)]
pub enum Needed {
    /// A map page held only as its image.
    Page(u64, Arc<PageImage>),
    /// A directory page held only as its image, and the ranges of map
    /// pages (first, last, inclusive) whose images it may name, each to
    /// be read once it is: only those asked for, not every page between
    /// them (a replay's records scattered over a directory page's range
    /// read all 512 of its pages where they needed 8).
    Dir {
        dir: u64,
        image: Arc<PageImage>,
        pages: Vec<(u64, u64)>,
    },
}

/// A directory's update from a durable checkpoint (`Map::publish`).
pub struct DirUpdate {
    pub dir: u64,
    /// Pages it named before, and their images' bytes.
    pub old: (u64, u64),
    /// Its new image; `None`: it names no page any more.
    pub new: Option<NewDir>,
}

/// A page decoded from its image outside every lock, to be installed
/// (`Map::install`).
pub struct LoadedPage {
    page: u64,
    body: Box<Page>,
}

impl LoadedPage {
    pub fn page(&self) -> u64 {
        self.page
    }

    /// The bytes it would hold in memory (`Page::bytes`).
    pub fn bytes(&self) -> usize {
        self.body.bytes()
    }

    /// The first slot, in entry order, that one of its entries points
    /// into and `live` refuses. Neighbouring entries written together
    /// share a slot: each run of one is asked about once.
    fn refused_slot(&self, live: impl Fn(u64) -> bool) -> Option<u64> {
        let slots = self.body.entries.slots();
        let mut asked = None;
        (0..self.body.entries.len()).map(|i| slots.get(i)).find(|&slot| {
            let ask = asked != Some(slot);
            asked = Some(slot);
            ask && !live(slot)
        })
    }
}

/// A page read in for one look and not kept (`Map::read_once`): where
/// keeping it would evict another, a read whose page is not in memory
/// looks at it so and lets it go (`Catalog::with_mappings`).
pub struct ReadOnce {
    /// The page, alone: looked at as the map's own are.
    pages: BTreeMap<u64, Box<Page>>,
}

impl ReadOnce {
    /// Mappings of the page overlapping blocks [lba, end), in order:
    /// those of keys outside the page are not there.
    pub fn overlapping(&self, lba: u64, end: u64) -> Overlapping<'_> {
        Overlapping::new(&self.pages, lba, end, 0)
    }

    /// Whether every entry of the page is of version `floor` or later
    /// (`Map::versions_at_least`).
    pub fn versions_at_least(&self, floor: u64) -> bool {
        self.pages.values().all(|page| page.entries.versions_at_least(floor))
    }

    /// The page, to be installed after all (`Map::install`).
    pub fn into_loaded(self) -> LoadedPage {
        let (page, body) = self.pages.into_iter().next().expect("a page read once");
        LoadedPage { page, body }
    }
}

/// Where an eviction past `limit` brings the map (`Map::evict`): an
/// eighth below it, so that each walk over the pages pays for an eighth
/// of the cache loaded or changed since the last.
pub fn eviction_target(limit: usize) -> usize {
    limit - limit / 8
}

/// A page read in that points into a slot that may hold no data.
fn refused_slot_error(slot: u64) -> FormatError {
    FormatError::Field {
        what: "map page",
        field: "slot",
        value: slot,
    }
}

/// The page of key `lba`, and the key's place in it.
fn page_of(lba: u64) -> (u64, u16) {
    (lba / MAP_PAGE_BLOCKS, (lba % MAP_PAGE_BLOCKS) as u16)
}

/// Where to cut `len` items, in page order (`page` of each), into about
/// `parts` parts of whole pages for `Map::insert_parts`: near each k/parts,
/// moved on to where the page changes; cuts that meet leave no part.
/// Starts with 0 and ends with `len`.
pub(crate) fn page_cuts(len: usize, parts: usize, page: impl Fn(usize) -> u64) -> Vec<usize> {
    let mut cuts = vec![0];
    for k in 1..parts.max(1) {
        let mut cut = (len * k / parts).max(*cuts.last().expect("a cut"));
        while cut > 0 && cut < len && page(cut) == page(cut - 1) {
            cut += 1;
        }
        cuts.push(cut);
    }
    cuts.push(len);
    cuts.dedup();
    cuts
}

/// Checks that an insert of `insert_parts` lies within one page of its
/// part's pages [first, next).
fn in_part(lba: u64, blocks: u32, (first, next): (u64, u64)) {
    let (p, key) = page_of(lba);
    assert!(
        p >= first && p < next && u64::from(key) + u64::from(blocks) <= MAP_PAGE_BLOCKS,
        "an insert of keys {lba} + {blocks} outside its part's pages {first}..{next}"
    );
}

/// The pages of a map (or a part of them, `Map::insert_parts`) as one
/// insert changes them, and what their entries and bytes changed by.
struct PagesMut<'a> {
    pages: &'a mut BTreeMap<u64, Box<Page>>,
    emptied: &'a mut BTreeMap<u64, Option<Arc<PageImage>>>,
    dirty: &'a mut BTreeSet<u64>,
    directory: &'a Directory,
    len: isize,
    bytes: isize,
}

/// Whether page `p`, not among the pages held, is in memory all the
/// same: emptied since its image, or never written.
fn in_memory(emptied: &BTreeMap<u64, Option<Arc<PageImage>>>, directory: &Directory, p: u64) -> bool {
    emptied.contains_key(&p) || matches!(directory.lookup(p), Lookup::None)
}

impl PagesMut<'_> {
    /// Maps keys [key, hi) of page `p` to `piece` at `version`, over the
    /// entries `rule` allows (`Page::insert`); the page is made dirty if
    /// that changed anything, and taken out if it is left empty. (A page
    /// a checkpoint's snapshot still waits for is kept by the caller
    /// first.)
    #[allow(clippy::too_many_arguments)]
    fn insert(
        &mut self,
        p: u64,
        (key, hi): (u16, u16),
        version: u64,
        piece: &Target,
        rule: Rule<'_>,
        gained: &mut Vec<Delta>,
        lost: &mut Vec<Delta>,
    ) {
        let exists = self.pages.contains_key(&p);
        assert!(
            exists || in_memory(self.emptied, self.directory, p),
            "map page {p} changed while not in memory (not loaded and pinned first)"
        );
        if !exists && !rule.fills_gaps() {
            return;
        }
        // A page made again where it was emptied replaces the image
        // `emptied` kept; one never written has none.
        let durable = match exists {
            true => None,
            false => self.emptied.remove(&p).flatten(),
        };
        let page = self.pages.entry(p).or_default();
        if !exists {
            page.durable = durable;
        }
        let before = if exists { page.bytes() } else { 0 };
        let changes = gained.len() + lost.len();
        self.len += page.insert(p * MAP_PAGE_BLOCKS, (key, hi), version, piece, rule, gained, lost);
        if gained.len() + lost.len() > changes {
            self.dirty.insert(p);
            page.clean = false;
        }
        let after = if page.entries.is_empty() {
            let page = self.pages.remove(&p).expect("held");
            self.emptied.insert(p, page.durable);
            0
        } else {
            page.bytes()
        };
        self.bytes += after as isize - before as isize;
    }
}

/// Heap bytes of a page image held in an `Arc` (its counts, the image,
/// its pieces), with the delta over it.
fn image_heap_bytes(image: &PageImage) -> usize {
    2 * std::mem::size_of::<usize>()
        + std::mem::size_of::<PageImage>()
        + image.pieces.capacity() * std::mem::size_of::<crate::format::ImagePiece>()
        + image.delta.as_deref().map_or(0, image_heap_bytes)
}

/// Sets `page`'s `since_base`, with what the map's pages hold (`bytes`) as
/// its size changes; returns what it was. (Taken out first, it would not
/// be counted going: the count only grew, until the cache evicted every
/// page to make room for bytes nothing held.)
fn set_since_base(bytes: &mut usize, page: &mut Page, since: Option<Box<delta::Since>>) -> Option<Box<delta::Since>> {
    let before = page.bytes();
    let was = std::mem::replace(&mut page.since_base, since);
    *bytes = *bytes + page.bytes() - before;
    was
}

impl Map {
    /// An empty map whose pages of fewer than `delta_entries_min` entries
    /// are always written whole (`delta.rs`).
    pub fn new(delta_entries_min: usize) -> Map {
        Map {
            delta_entries_min,
            ..Map::default()
        }
    }

    /// Mappings held (a write across a page boundary counts one per page).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Pages holding mappings.
    pub fn page_count(&self) -> usize {
        self.pages.len()
    }

    /// Whether every mapping of page `p` (in memory) is of a version at
    /// least `floor`.
    pub fn versions_at_least(&self, p: u64, floor: u64) -> bool {
        self.pages
            .get(&p)
            .is_none_or(|page| page.entries.versions_at_least(floor))
    }

    /// The pages changed since the last call, which the caller writes
    /// (or gives back with `mark_dirty` if it could not).
    pub fn take_dirty(&mut self) -> BTreeSet<u64> {
        std::mem::take(&mut self.dirty)
    }

    pub fn dirty_count(&self) -> usize {
        self.dirty.len()
    }

    pub fn mark_dirty(&mut self, pages: impl IntoIterator<Item = u64>) {
        self.dirty.extend(pages);
    }

    /// Gives back the pages a checkpoint took and could not write: dirty
    /// again, each with what it knew of its base when taken (`Since`):
    /// the keys changed since the base then, and those changed since;
    /// the keys its deltas wrote then.
    pub fn give_back(&mut self, pages: impl IntoIterator<Item = u64>) {
        self.mark_dirty(pages);
        for (p, then) in std::mem::take(&mut self.rebased) {
            if let Some(page) = self.pages.get_mut(&p) {
                let given = match (then, page.since_base.as_deref()) {
                    (Some(mut then), Some(now)) => {
                        then.keys.iter_mut().zip(now.keys.iter()).for_each(|(k, s)| *k |= s);
                        Some(then)
                    }
                    _ => None,
                };
                set_since_base(&mut self.bytes, page, given);
            }
        }
    }

    /// Whether every block of [lba, end) is mapped by a write of
    /// `version` or a newer one.
    pub fn mapped_at_least(&self, lba: u64, end: u64, version: u64) -> bool {
        let mut next = lba;
        let mut entries = self.overlapping(lba, end);
        while let Some((base, _, e)) = entries.next_entry() {
            if base + u64::from(e.start) > next || e.version < version {
                return false;
            }
            next = base + u64::from(e.end());
        }
        next >= end
    }

    /// Appends page `p`'s image (FORMAT.md, "Map pages") to `out`: its
    /// entries as they are held, then the words they refer to, each
    /// record's once. False, appending nothing, if no page `p` is held.
    pub fn encode_page(&self, p: u64, out: &mut Vec<u8>) -> bool {
        let Some(page) = self.pages.get(&p) else {
            return false;
        };
        page.encode(p, out);
        true
    }

    /// Map pages the durable directory names, and their images' stored bytes.
    pub fn directory_totals(&self) -> (u64, u64) {
        self.directory.totals()
    }

    /// Directory pages, and those in memory.
    pub fn directory_counts(&self) -> (usize, usize) {
        self.directory.counts()
    }

    /// An opening's map: the directory the root names, no page of it or of
    /// the map in memory. The map must be empty.
    pub fn open_from(&mut self, dirs: &BTreeMap<u64, Arc<PageImage>>, (pages, page_bytes): (u64, u64)) {
        assert!(
            self.pages.is_empty() && self.directory.counts().0 == 0,
            "opened into an empty map"
        );
        self.directory = Directory::open(dirs, pages, page_bytes);
    }

    /// What must be read for every page of keys [lba, end) to be in
    /// memory: pages held only as their image, and directory pages held
    /// only as theirs (which may name more).
    pub fn missing(&self, lba: u64, end: u64) -> Vec<Needed> {
        let mut needed = Vec::new();
        if end <= lba {
            return needed;
        }
        let (first, last) = (lba / MAP_PAGE_BLOCKS, (end - 1) / MAP_PAGE_BLOCKS);
        // A request's page or two, all in memory: nothing to look up (nor
        // a directory page to mark used: one whose pages are all in
        // memory is not needed).
        if last - first < 4 && (first..=last).all(|p| self.pages.contains_key(&p)) {
            return needed;
        }
        self.directory.touch(first, last, self.clock.load(Ordering::Relaxed));
        for page in self.directory.named_in(first, last) {
            if !self.pages.contains_key(&page) && !self.emptied.contains_key(&page) {
                let Lookup::Image(image) = self.directory.lookup(page) else {
                    unreachable!("a page named by a resident directory page has an image")
                };
                needed.push(Needed::Page(page, image));
            }
        }
        for (dir, image) in self.directory.evicted_in(first, last) {
            let (from, to) = (dir * MAP_DIRECTORY_PAGES, (dir + 1) * MAP_DIRECTORY_PAGES - 1);
            needed.push(Needed::Dir {
                dir,
                image: image.clone(),
                pages: vec![(first.max(from), last.min(to))],
            });
        }
        needed
    }

    /// Whether directory page `dir` is in memory.
    pub fn directory_page_resident(&self, dir: u64) -> bool {
        self.directory.is_resident(dir)
    }

    /// Whether page `p` is as it is in memory: held, emptied, or never
    /// written (not held only as its image, nor named by a directory page
    /// held only as its own).
    pub fn in_memory(&self, p: u64) -> bool {
        self.pages.contains_key(&p) || in_memory(&self.emptied, &self.directory, p)
    }

    /// Whether page `page` is held only as its image, and not yet read.
    pub fn held_only_as(&self, page: u64, image: &PageImage) -> bool {
        !self.pages.contains_key(&page)
            && !self.emptied.contains_key(&page)
            && matches!(self.directory.lookup(page), Lookup::Image(held) if *held == *image)
    }

    /// Everything to read for every page to be in memory.
    pub fn all_missing(&self) -> Vec<Needed> {
        self.missing(0, u64::MAX)
    }

    /// Page `p`'s durable image (`None`: it has none): as a page in
    /// memory or emptied in memory holds it, else as its directory page
    /// names it, which must be in memory.
    pub fn durable_image(&self, p: u64) -> Option<Arc<PageImage>> {
        if let Some(page) = self.pages.get(&p) {
            return page.durable.clone();
        }
        if let Some(was) = self.emptied.get(&p) {
            return was.clone();
        }
        match self.directory.lookup(p) {
            Lookup::None => None,
            Lookup::Image(image) => Some(image),
            Lookup::NotInMemory(dir) => panic!("directory page {dir} of changed page {p} not in memory"),
        }
    }

    /// The entries of directory page `dir`, if it is in memory.
    pub fn directory_page(&self, dir: u64) -> Option<DirEntries> {
        self.directory.resident(dir)
    }

    /// Whether directory page `dir` is held only as `image`.
    pub fn directory_page_held_only_as(&self, dir: u64, image: &PageImage) -> bool {
        self.directory.held_only_as(dir, image)
    }

    /// Every directory page with its own image.
    #[cfg(test)]
    pub fn directory_images(&self) -> Vec<(u64, Arc<PageImage>)> {
        self.directory.own_images().map(|(d, i)| (d, i.clone())).collect()
    }

    /// Puts directory page `dir`, read from `own`, in memory: `Ok(false)`
    /// if it is no longer held as that image; an error if an image it
    /// names is in a slot `map_stripe` refuses.
    pub fn install_dir(
        &mut self,
        dir: u64,
        entries: DirEntries,
        own: &PageImage,
        map_stripe: &dyn Fn(u64) -> bool,
    ) -> Result<bool, FormatError> {
        // A copy read before a checkpoint moved the page (and freed the
        // map stripes it points into) is dropped, not refused.
        if !self.directory.held_only_as(dir, own) {
            return Ok(false);
        }
        let pieces = entries.images.values().flat_map(|image| image.all_pieces());
        if let Some(piece) = pieces.into_iter().find(|piece| !map_stripe(piece.slot)) {
            return Err(FormatError::Field {
                what: "map directory page",
                field: "piece_slot",
                value: piece.slot,
            });
        }
        let now = self.clock.fetch_add(1, Ordering::Relaxed) + 1;
        Ok(self.directory.install(dir, entries, own, now))
    }

    /// The pages of [lba, end) in memory: held, or emptied there. (A pin
    /// on an emptied page keeps its directory page too, which
    /// `remove_from` needs in memory: it asks `missing` of the range.)
    pub fn in_memory_in(&self, lba: u64, end: u64) -> impl Iterator<Item = u64> + '_ {
        let pages = match end > lba {
            true => lba / MAP_PAGE_BLOCKS..(end - 1) / MAP_PAGE_BLOCKS + 1,
            false => 0..0,
        };
        let held = self.pages.range(pages.clone()).map(|(&p, _)| p);
        held.chain(self.emptied.range(pages).map(|(&p, _)| p))
    }

    /// A page from its image (as `format::load_page_image` gives it back),
    /// decoded and checked outside every lock; the slots it points into
    /// are checked when it is installed.
    pub fn decode_image(image: &[u8], geometry: &Geometry) -> Result<LoadedPage, FormatError> {
        let (page, mut body) = Page::decode(image, geometry)?;
        body.since_base = Some(Box::default());
        Ok(LoadedPage {
            page,
            body: Box::new(body),
        })
    }

    /// `decode_image` of a page's image and the delta over it (as
    /// `format::load_delta_image` gives it back): the page as the two say.
    pub fn decode_with_delta(image: &[u8], delta: &[u8], geometry: &Geometry) -> Result<LoadedPage, FormatError> {
        let (page, body) = Page::decode(image, geometry)?;
        let (of, since, over) = delta::decode_delta(delta, geometry)?;
        if of != page {
            return Err(FormatError::Field {
                what: "map page delta",
                field: "page",
                value: of,
            });
        }
        let body = body.overlay(since, over)?;
        Ok(LoadedPage {
            page,
            body: Box::new(body),
        })
    }

    /// Puts a page held only as `image` back in memory, clean: `Ok(false)`
    /// (and nothing done) if that is no longer how the page is held
    /// (another thread loaded it, or a checkpoint moved its image); an
    /// error if it points into a slot `live` refuses.
    pub fn install(
        &mut self,
        loaded: LoadedPage,
        image: &Arc<PageImage>,
        live: impl Fn(u64) -> bool,
    ) -> Result<bool, FormatError> {
        if !self.held_only_as(loaded.page, image) {
            return Ok(false);
        }
        if let Some(slot) = loaded.refused_slot(live) {
            return Err(refused_slot_error(slot));
        }
        let LoadedPage { page: p, mut body } = loaded;
        if body.words.len() > 2 * body.referred() + 32 {
            body.compact();
        }
        // A page too small ever to be written as a delta does not keep
        // what it knows of its base (the many pages of a sparsely written
        // map would hold 72 bytes more each); `begin_snapshot` likewise.
        if body.entries.len() < self.delta_entries_min {
            body.since_base = None;
        }
        (body.durable, body.clean) = (Some(image.clone()), true);
        body.used = AtomicU64::new(self.clock.fetch_add(1, Ordering::Relaxed) + 1);
        self.len += body.entries.len();
        self.bytes += body.bytes();
        self.pages.insert(p, body);
        Ok(true)
    }

    /// A page held only as `image`, read in, to be looked at once for
    /// blocks [lba, end) and not kept (`ReadOnce`), checked as `install`
    /// checks a page, but only in the entries looked at: `Ok(None)` if
    /// that is no longer how the page is held; an error if one of those
    /// points into a slot `live` refuses. Nothing in the map changes.
    pub fn read_once(
        &self,
        loaded: LoadedPage,
        image: &PageImage,
        (lba, end): (u64, u64),
        live: impl Fn(u64) -> bool,
    ) -> Result<Option<ReadOnce>, FormatError> {
        if !self.held_only_as(loaded.page, image) {
            return Ok(None);
        }
        let once = ReadOnce {
            pages: BTreeMap::from([(loaded.page, loaded.body)]),
        };
        let mut looked_at = once.overlapping(lba, end);
        if let Some(slot) = std::iter::from_fn(|| looked_at.next_entry())
            .map(|(_, _, e)| e.slot)
            .find(|&slot| !live(slot))
        {
            return Err(refused_slot_error(slot));
        }
        Ok(Some(once))
    }

    /// A durable checkpoint's directory pages (`dirs`), and the pages it
    /// wrote with their new images (`None`: it wrote the page empty): a
    /// page is as its image says unless it changed since it was taken
    /// (dirty again).
    /// `pages` in page order.
    pub fn publish(&mut self, dirs: Vec<DirUpdate>, pages: Vec<(u64, Option<Arc<PageImage>>)>) {
        debug_assert!(pages.windows(2).all(|two| two[0].0 < two[1].0));
        for update in dirs {
            let written = under_directory_page(&pages, update.dir, |p| p.0);
            self.directory.publish(update.dir, update.old, update.new, written);
        }
        self.rebased.clear();
        // Pages it wrote are clean now: the next eviction may take them.
        self.evict_stuck_at = None;
        for (p, image) in pages {
            // The image written is the page's durable one now, whether it
            // is as that says or changed again (or emptied) since.
            if let Some(page) = self.pages.get_mut(&p) {
                let before = page.bytes();
                page.clean = image.is_some() && !self.dirty.contains(&p);
                page.durable = image;
                self.bytes = self.bytes + page.bytes() - before;
            } else if image.is_none() {
                self.emptied.remove(&p);
            } else if let Some(was) = self.emptied.get_mut(&p) {
                *was = image;
            }
        }
    }

    /// Each page in memory, and each emptied in memory, against its
    /// directory page where that is in memory too: the durable image the
    /// page holds (`durable_image`) must be the one its directory page
    /// names (`Array::check` runs it, every page in memory).
    pub fn check_durable(&self) -> Result<(), String> {
        for p in self.pages.keys().chain(self.emptied.keys()) {
            let own = self.durable_image(*p);
            let named = match self.directory.lookup(*p) {
                Lookup::NotInMemory(_) => continue,
                Lookup::None => None,
                Lookup::Image(image) => Some(image),
            };
            if named != own {
                return Err(format!(
                    "map page {p} holds {own:?} as its durable image, its directory page names {named:?}"
                ));
            }
        }
        Ok(())
    }

    /// Bytes held by the pages and directory pages in memory, and by the
    /// sets of pages changed and emptied (their entries in them).
    pub fn held_bytes(&self) -> usize {
        let sets = self.dirty.len() * btree_entry_bytes(8, 0)
            + self.emptied.len() * btree_entry_bytes(8, std::mem::size_of::<Option<Arc<PageImage>>>());
        self.bytes + self.directory.bytes() + sets
    }

    /// The bytes counted as held (`held_bytes`) against those the pages
    /// and directory pages in memory hold, counted again: the cache is
    /// sized by the count, so a count that drifted up would evict every
    /// page at each checkpoint (`Array::check` runs it).
    pub fn check_bytes(&self) -> Result<(), String> {
        let pages: usize = self.pages.values().map(|page| page.bytes()).sum();
        let dirs = self.directory.bytes_counted_again();
        match (pages == self.bytes, dirs == self.directory.bytes()) {
            (true, true) => Ok(()),
            _ => Err(format!(
                "the map counts {} bytes of pages and {} of directory pages held; they hold {pages} and {dirs}",
                self.bytes,
                self.directory.bytes()
            )),
        }
    }

    /// Evicts clean pages, least recently looked at first, none that
    /// `pinned` names; then, if that was not enough, directory pages
    /// other than `pinned_dir`; until they hold at
    /// most `limit` bytes (or a few less, so that it is not done at every
    /// load). Nothing while the last could not get down to that and the
    /// map has grown by less than an eighth of `limit` since (since the
    /// least it held at an eviction after, where it shrank), with no
    /// checkpoint published (`evict_stuck_at`). Returns the map pages
    /// evicted.
    pub fn evict(&mut self, limit: usize, pinned: &dyn Fn(u64) -> bool, pinned_dir: &dyn Fn(u64) -> bool) -> usize {
        let held = self.held_bytes();
        // A map that shrank since (pages emptied or freed) is stuck at
        // the lower mark: what grew since is what waits to be evicted.
        if let Some(at) = self.evict_stuck_at.as_mut() {
            *at = (*at).min(held);
        }
        if held <= limit || self.evict_stuck_at.is_some_and(|at| held < at + limit / 8) {
            return 0;
        }
        #[cfg(test)]
        {
            self.eviction_walks += 1;
        }
        let target = eviction_target(limit);
        // Pages first: no checkpoint still has to copy a clean page (a
        // change clears `clean`, a checkpoint takes only changed pages,
        // and its `publish` sets it again on those not changed since).
        let mut pages: Vec<(u64, u64)> = self
            .pages
            .iter()
            .filter(|(p, page)| page.clean && !pinned(**p))
            .map(|(&p, page)| {
                debug_assert!(!self.dirty.contains(&p), "page {p} dirty and clean");
                (page.used.load(Ordering::Relaxed), p)
            })
            .collect();
        pages.sort_unstable();
        let mut evicted = 0;
        for (_, p) in pages {
            if self.held_bytes() <= target {
                break;
            }
            let page = self.pages.remove(&p).expect("listed just now");
            self.bytes -= page.bytes();
            self.len -= page.entries.len();
            evicted += 1;
        }
        // Then directory pages not pinned. A page in memory names its
        // durable image itself (`Page::durable`), which a checkpoint asks
        // of each page it writes (`durable_image`), and so does an
        // emptied one (`emptied`); a checkpoint reads the directory pages
        // it rewrites from their map stripes where they are not in
        // memory. (Until 2026-12-01 any page in memory kept its directory
        // page: writes scattered over 1 TiB kept all 1,024 of them, 23
        // MiB past an 8 MiB cache; until 2026-12-03 an emptied one did,
        // from when `emptied` held no image.)
        if self.held_bytes() > target {
            let mut dirs = self.directory.eviction_candidates(pinned_dir);
            dirs.sort_unstable();
            for (_, d) in dirs {
                if self.held_bytes() <= target {
                    break;
                }
                self.directory.evict(d);
            }
        }
        self.evict_stuck_at = Some(self.held_bytes()).filter(|&held| held > target);
        self.clock.fetch_add(1, Ordering::Relaxed);
        evicted
    }

    /// Evictions that walked the pages in memory.
    #[cfg(test)]
    fn eviction_walks(&self) -> u64 {
        self.eviction_walks
    }

    /// Takes a snapshot of `pages` (a checkpoint's dirty pages, just
    /// taken): `snapshot_image` gives each as it is now, whatever changes
    /// it before being copied; as a delta over its durable image where
    /// that is worth it (`delta.rs`) and `whole` does not ask for it
    /// whole. Returns the pages taken as deltas. The others are taken
    /// whole: their keys changed since their base are those changed from
    /// now on (what they were is kept for `give_back`).
    pub fn begin_snapshot(&mut self, pages: &BTreeSet<u64>, whole: &dyn Fn(u64) -> bool) -> BTreeSet<u64> {
        let mut deltas = HashMap::new();
        self.rebased.clear();
        for &p in pages {
            let Some(page) = self.pages.get_mut(&p) else {
                continue;
            };
            // Its durable image, if it has one, is the delta's base (the
            // page names it: its directory page may not be in memory).
            let based = page.durable.is_some();
            let entries = page.entries.len();
            let keeps = entries >= self.delta_entries_min;
            match page.since_base.as_deref_mut() {
                Some(since) if based && keeps && !whole(p) && since.worth_a_delta(entries) => {
                    self.rebased.insert(p, Some(Box::new(since.clone())));
                    since.written += delta::count(&since.keys);
                    deltas.insert(p, since.clone());
                }
                _ => {
                    let then = set_since_base(&mut self.bytes, page, keeps.then(Box::default));
                    self.rebased.insert(p, then);
                }
            }
        }
        let taken = deltas.keys().copied().collect();
        *self.snapshot.get_mut().unwrap_or_else(|p| p.into_inner()) = Some(Snapshot {
            pending: pages.clone(),
            kept: HashMap::new(),
            deltas,
        });
        taken
    }

    /// Appends page `p`'s image as it was when the snapshot was taken;
    /// false (nothing appended) if it was empty then.
    pub fn snapshot_image(&self, p: u64, out: &mut Vec<u8>) -> bool {
        let mut snapshot = self.snapshot.lock().unwrap_or_else(|p| p.into_inner());
        let snapshot = snapshot.as_mut().expect("a snapshot is being copied");
        if let Some(kept) = snapshot.kept.remove(&p) {
            return kept.is_some_and(|image| {
                out.extend_from_slice(&image);
                true
            });
        }
        assert!(snapshot.pending.remove(&p), "page {p} copied twice, or not taken");
        let Some(page) = self.pages.get(&p) else {
            return false;
        };
        snapshot.encode(p, page, out);
        true
    }

    /// Ends the snapshot (every page taken copied, or the checkpoint gave up).
    pub fn end_snapshot(&self) {
        *self.snapshot.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Keeps page `p`'s image before it changes, if a snapshot still
    /// wants it as it was.
    fn preserve(&mut self, p: u64) {
        let Some(snapshot) = self.snapshot.get_mut().unwrap_or_else(|p| p.into_inner()).as_mut() else {
            return;
        };
        if !snapshot.pending.remove(&p) {
            return;
        }
        let mut image = Vec::new();
        let kept = match self.pages.get(&p) {
            Some(page) => {
                snapshot.encode(p, page, &mut image);
                Some(image)
            }
            None => None,
        };
        snapshot.kept.insert(p, kept);
    }

    /// Bytes the map holds in memory: its pages' entries and arenas, and
    /// the index of pages.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// What the checkpoint under way, and the next, hold while they
    /// write the pages they take (the pages changed since the last, and
    /// those the one under way took): each page's own bytes again, at the
    /// average page's, and `CHECKPOINT_PAGE_WORK_BYTES`. The cache keeps
    /// this room (`Catalog::evict_pages`).
    pub fn checkpoint_work_bytes(&self) -> usize {
        let per_page = self.bytes / self.pages.len().max(1);
        (self.dirty.len() + self.rebased.len()) * (per_page + crate::limits::CHECKPOINT_PAGE_WORK_BYTES)
    }

    /// Every mapping, in block order.
    pub fn iter(&self) -> Overlapping<'_> {
        self.overlapping(0, u64::MAX)
    }

    /// The mappings (key and location) of the pages in memory whose slot
    /// `in_slot` admits, in order: each page's slot column read alone,
    /// and only the entries it admits read whole (what `iter().locations()`
    /// filtered by slot gives, without unpacking every entry).
    pub fn locations_in_slots<'a>(
        &'a self,
        in_slot: impl Fn(u64) -> bool + Copy + 'a,
    ) -> impl Iterator<Item = (u64, Location)> + 'a {
        self.pages
            .iter()
            .flat_map(move |(&p, page)| page_locations_in_slots(p, page, in_slot))
    }

    /// `locations_in_slots` of page `p` alone (nothing if it is not in
    /// memory).
    pub fn page_locations_in_slots<'a>(
        &'a self,
        p: u64,
        in_slot: impl Fn(u64) -> bool + Copy + 'a,
    ) -> impl Iterator<Item = (u64, Location)> + 'a {
        self.pages
            .get(&p)
            .into_iter()
            .flat_map(move |page| page_locations_in_slots(p, page, in_slot))
    }

    /// Mappings overlapping blocks [lba, end), in order.
    pub fn overlapping(&self, lba: u64, end: u64) -> Overlapping<'_> {
        Overlapping::new(&self.pages, lba, end, self.clock.load(Ordering::Relaxed))
    }

    /// Maps blocks [lba, lba+blocks) to `target` at `version`, over the
    /// pieces `rule` allows. Returns what changed, gains before losses (so
    /// a slot keeping the head or tail of a cut piece is never seen empty).
    pub fn insert(&mut self, lba: u64, blocks: u32, version: u64, target: &Target, rule: Rule<'_>) -> Vec<Delta> {
        let end = lba + u64::from(blocks);
        let (mut gained, mut lost) = (Vec::new(), Vec::new());
        let mut cursor = lba;
        while cursor < end {
            let (p, key) = page_of(cursor);
            let base = p * MAP_PAGE_BLOCKS;
            let page_end = (base + MAP_PAGE_BLOCKS).min(end);
            let hi = (page_end - base) as u16;
            let piece = target.advanced_by(cursor - lba);
            // (Whether the page will change, asked only of a rule that may
            // leave it as it is: a write's costs no second lookup.)
            if rule.fills_gaps() || self.pages.contains_key(&p) {
                self.preserve(p);
            }
            let mut pages = PagesMut {
                pages: &mut self.pages,
                emptied: &mut self.emptied,
                dirty: &mut self.dirty,
                directory: &self.directory,
                len: 0,
                bytes: 0,
            };
            pages.insert(p, (key, hi), version, &piece, rule, &mut gained, &mut lost);
            let (len, bytes) = (pages.len, pages.bytes);
            self.len = self.len.checked_add_signed(len).expect("the map counts its entries");
            self.bytes = self.bytes.checked_add_signed(bytes).expect("the map counts its bytes");
            cursor = page_end;
        }
        gained.extend(lost);
        gained
    }

    /// As `insert` of each of `parts`' inserts (keys, blocks, version,
    /// target) in turn, the parts side by side, each on a thread: a part
    /// is the first page it may change and its inserts, each within one
    /// page, none before that page nor at or after the next part's. Returns
    /// each part's deltas, in order: what `insert` gives for each in turn.
    /// While a checkpoint's snapshot is being copied (pages must be kept
    /// before they change), one by one.
    ///
    /// A replay's ~1 M records took 1.6 s one by one on a 2-vCPU VM,
    /// with the other core idle (PERFORMANCE.md, "Opening after kill
    /// -9: the headers read through io_uring, the records mapped on
    /// every core").
    pub fn insert_parts<I>(&mut self, parts: Vec<(u64, I)>, rule: Rule<'_>) -> Vec<Vec<Delta>>
    where
        I: Iterator<Item = (u64, u32, u64, Target)> + Send,
    {
        let bounds: Vec<(u64, u64)> = (0..parts.len())
            .map(|k| (parts[k].0, parts.get(k + 1).map_or(u64::MAX, |next| next.0)))
            .collect();
        assert!(bounds.iter().all(|&(first, next)| first <= next), "parts out of order");
        let snapshot = self.snapshot.get_mut().unwrap_or_else(|p| p.into_inner());
        if parts.len() < 2 || snapshot.as_ref().is_some_and(|s| !s.pending.is_empty()) {
            return parts
                .into_iter()
                .zip(&bounds)
                .map(|((_, part), &bound)| {
                    part.flat_map(|(lba, blocks, version, target)| {
                        in_part(lba, blocks, bound);
                        self.insert(lba, blocks, version, &target, rule)
                    })
                    .collect()
                })
                .collect();
        }
        // Each part's pages taken out of the map, the last first.
        let mut taken = Vec::with_capacity(parts.len());
        for &(first, _) in bounds[1..].iter().rev() {
            taken.push((
                self.pages.split_off(&first),
                self.emptied.split_off(&first),
                self.dirty.split_off(&first),
            ));
        }
        taken.push((
            std::mem::take(&mut self.pages),
            std::mem::take(&mut self.emptied),
            std::mem::take(&mut self.dirty),
        ));
        taken.reverse();
        let directory = &self.directory;
        let done: Vec<_> = std::thread::scope(|scope| {
            let running: Vec<_> = parts
                .into_iter()
                .zip(taken)
                .zip(bounds)
                .map(|(((_, part), (mut pages, mut emptied, mut dirty)), bound)| {
                    scope.spawn(move || {
                        let mut into = PagesMut {
                            pages: &mut pages,
                            emptied: &mut emptied,
                            dirty: &mut dirty,
                            directory,
                            len: 0,
                            bytes: 0,
                        };
                        let (mut deltas, mut gained, mut lost) = (Vec::new(), Vec::new(), Vec::new());
                        for (lba, blocks, version, target) in part.filter(|r| r.1 > 0) {
                            in_part(lba, blocks, bound);
                            let (p, key) = page_of(lba);
                            let hi = key + u16::try_from(blocks).expect("an insert within a page");
                            into.insert(p, (key, hi), version, &target, rule, &mut gained, &mut lost);
                            deltas.append(&mut gained);
                            deltas.append(&mut lost);
                        }
                        let (len, bytes) = (into.len, into.bytes);
                        (deltas, len, bytes, pages, emptied, dirty)
                    })
                })
                .collect();
            running
                .into_iter()
                .map(|thread| thread.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
                .collect()
        });
        let mut all = Vec::with_capacity(done.len());
        for (deltas, len, bytes, mut pages, mut emptied, mut dirty) in done {
            self.pages.append(&mut pages);
            self.emptied.append(&mut emptied);
            self.dirty.append(&mut dirty);
            self.len = self.len.checked_add_signed(len).expect("the map counts its entries");
            self.bytes = self.bytes.checked_add_signed(bytes).expect("the map counts its bytes");
            all.push(deltas);
        }
        all
    }

    /// Removes every mapping that starts in [lba, end) (a deleted
    /// volume's: none crosses a volume's bounds); returns what was lost.
    pub fn remove_from(&mut self, lba: u64, end: u64) -> Vec<Delta> {
        let mut lost = Vec::new();
        if end <= lba {
            return lost;
        }
        let (first, key) = page_of(lba);
        let (last, last_key) = page_of(end - 1);
        assert!(
            self.missing(lba, end).is_empty(),
            "map pages removed from while not in memory"
        );
        let pages: Vec<u64> = self.pages.range(first..=last).map(|(&p, _)| p).collect();
        for p in pages {
            self.preserve(p);
            let page = self.pages.get_mut(&p).expect("listed just now");
            self.bytes -= page.bytes();
            let base = p * MAP_PAGE_BLOCKS;
            let from = if p == first {
                page.entries.first_starting_at_or_after(key)
            } else {
                0
            };
            let to = if p == last {
                page.entries.first_starting_after(last_key)
            } else {
                page.entries.len()
            };
            let gone: Vec<Entry> = (from..to).map(|i| page.entries.get(i)).collect();
            for e in &gone {
                lost.push(e.delta(base, false));
                page.mark_changed(e.start, e.end());
            }
            if to > from {
                self.dirty.insert(p);
                page.clean = false;
            }
            let removed: usize = gone.iter().map(Entry::arena_words).sum();
            page.set_referred(page.referred() - removed);
            page.entries.splice(from..to, &[]);
            self.len -= to - from;
            if page.entries.is_empty() {
                let page = self.pages.remove(&p).expect("held");
                self.emptied.insert(p, page.durable);
            } else {
                if page.words.len() > 2 * page.referred() + 32 {
                    page.compact();
                }
                self.bytes += page.bytes();
            }
        }
        lost
    }
}

/// The mappings of page `p` (`page`) whose slot `in_slot` admits: the
/// page's slot column read alone, and only the entries it admits read
/// whole.
fn page_locations_in_slots<'a>(
    p: u64,
    page: &'a Page,
    in_slot: impl Fn(u64) -> bool + Copy + 'a,
) -> impl Iterator<Item = (u64, Location)> + 'a {
    let slots = page.entries.slots();
    (0..page.entries.len())
        .filter(move |&i| in_slot(slots.get(i)))
        .map(move |i| {
            let e = page.entries.get(i);
            (p * MAP_PAGE_BLOCKS + u64::from(e.start), e.location())
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_checksum::Algorithm;

    use crate::test_heap as heap;

    fn extent(slot: u64, blocks: u32) -> Arc<Extent> {
        Arc::new(Extent {
            slot,
            offset: 0,
            stored_bytes: blocks * 4096,
            blocks,
            codec: None,
            digest: Algorithm::Crc32c.digest(b""),
            block_crcs: (0..blocks).map(|_| 0).collect(),
        })
    }

    impl Map {
        /// A map of the same mappings, its pages all in memory and none
        /// dirty.
        fn clone_pages(&self) -> Map {
            let mut copy = Map::default();
            for (lba, m) in self.iter() {
                copy.insert(lba, m.blocks, m.version, &m.target, Rule::Always);
            }
            copy.take_dirty();
            copy
        }
    }

    fn data(extent: &Arc<Extent>) -> Target {
        Target::Data {
            extent: extent.clone(),
            skip: 0,
        }
    }

    /// A map holding the pages `images` are of, each installed as when
    /// it is read back from the members (every field checked, `live`
    /// for the slots it points into).
    fn load(images: &[&[u8]], g: &Geometry, live: &dyn Fn(u64) -> bool) -> Result<Map, FormatError> {
        let decoded = images
            .iter()
            .map(|image| Map::decode_image(image, g))
            .collect::<Result<Vec<_>, _>>()?;
        let held: BTreeMap<u64, Arc<PageImage>> = decoded
            .iter()
            .zip(images)
            .map(|(page, image)| {
                let image = PageImage {
                    bytes: image.len() as u32,
                    digest: Algorithm::Crc32c.digest(image),
                    pieces: Vec::new(),
                    delta: None,
                };
                (page.page(), Arc::new(image))
            })
            .collect();
        let mut map = Map::default();
        publish(&mut map, &BTreeMap::new(), &held, &BTreeSet::new());
        for page in decoded {
            let image = held[&page.page()].clone();
            assert!(map.install(page, &image, live)?, "each page installed once");
        }
        Ok(map)
    }

    /// The images of `held` that directory page `dir` names.
    fn in_dir(held: &BTreeMap<u64, Arc<PageImage>>, dir: u64) -> BTreeMap<u64, Arc<PageImage>> {
        held.range(directory::pages_under(dir))
            .map(|(&p, i)| (p, i.clone()))
            .collect()
    }

    /// The directory a durable checkpoint leaves naming `held` (map page
    /// to image) where it named `before`, published, with the pages.
    /// `written`: pages the checkpoint took besides (emptied ones).
    pub(super) fn publish(
        map: &mut Map,
        before: &BTreeMap<u64, Arc<PageImage>>,
        held: &BTreeMap<u64, Arc<PageImage>>,
        written: &BTreeSet<u64>,
    ) {
        let pages: BTreeSet<u64> = before.keys().chain(held.keys()).chain(written).copied().collect();
        let dirs: BTreeSet<u64> = pages.iter().map(|&p| directory::dir_of(p)).collect();
        let totals = |m: &BTreeMap<u64, Arc<PageImage>>| (m.len() as u64, m.values().map(|i| i.stored_bytes()).sum());
        let updates = dirs
            .iter()
            .map(|&dir| {
                let (old, new) = (in_dir(before, dir), in_dir(held, dir));
                let made = |new: &BTreeMap<u64, Arc<PageImage>>| {
                    let image = crate::format::encode_directory_image(Algorithm::Crc32c, dir, new);
                    let own = Arc::new(PageImage {
                        bytes: image.len() as u32,
                        digest: Algorithm::Crc32c.digest(&image),
                        pieces: Vec::new(),
                        delta: None,
                    });
                    NewDir::whole(dir, &image, 4, own)
                };
                DirUpdate {
                    dir,
                    old: totals(&old),
                    new: (!new.is_empty()).then(|| made(&new)),
                }
            })
            .collect();
        let pages: Vec<(u64, Option<Arc<PageImage>>)> = pages.iter().map(|&p| (p, held.get(&p).cloned())).collect();
        map.publish(updates, pages);
        assert_eq!(map.directory_totals(), totals(held));
    }

    /// Reads into `map` every page and directory page it lacks, from
    /// `held` (the directory) and `images` (the pages' images).
    fn read_back(map: &mut Map, held: &BTreeMap<u64, Arc<PageImage>>, images: &BTreeMap<u64, Vec<u8>>, g: &Geometry) {
        for _ in 0..3 {
            let missing = map.all_missing();
            if missing.is_empty() {
                return;
            }
            for needed in missing {
                match needed {
                    Needed::Dir { dir, image, .. } => {
                        assert_eq!(
                            map.install_dir(dir, unchanged(in_dir(held, dir)), &image, &|_| true),
                            Ok(true)
                        );
                    }
                    Needed::Page(p, image) => {
                        let page = Map::decode_image(&images[&p], g).unwrap();
                        assert_eq!(map.install(page, &image, |_| true), Ok(true));
                    }
                }
            }
        }
        panic!("pages still missing after reading their directory pages");
    }

    /// (start, blocks, version, slot, skip) of every mapping.
    fn ranges(map: &Map) -> Vec<(u64, u32, u64, u64, u32)> {
        map.iter()
            .map(|(s, m)| {
                let skip = match &m.target {
                    Target::Data { skip, .. } => *skip,
                    Target::Zero { .. } => 0,
                };
                (s, m.blocks, m.version, m.target.slot(), skip)
            })
            .collect()
    }

    /// Net blocks per slot that the deltas add up to.
    fn net(deltas: &[Delta]) -> BTreeMap<u64, i64> {
        let mut net = BTreeMap::new();
        for d in deltas {
            *net.entry(d.slot).or_insert(0) += if d.gained { 1 } else { -1 } * i64::from(d.blocks);
        }
        net.retain(|_, v| *v != 0);
        net
    }

    /// A record of `blocks` blocks in `slot` at `offset`, raw or
    /// compressed, with random checksums of `algorithm`'s length (for a raw
    /// one-block record in CRC32C, sometimes the digest its CRC gives).
    fn random_extent(
        rng: &mut impl rand::Rng,
        algorithm: Algorithm,
        slot: u64,
        offset: u32,
        blocks: u32,
    ) -> Arc<Extent> {
        use tessera_compress::Codec;
        // As summaries and checkpoints give codecs back: without a level.
        let codec = match rng.gen_range(0..4) {
            0 => Some(Codec::Lz4),
            1 => Some(Codec::Zstd { level: 0 }),
            _ => None,
        };
        let block_crcs: crate::format::BlockCrcs = match codec {
            None => (0..blocks).map(|_| rng.gen()).collect(),
            Some(_) => crate::format::BlockCrcs::new(),
        };
        let digest_bytes: Vec<u8> = (0..algorithm.digest_bytes()).map(|_| rng.gen()).collect();
        let digest = match (algorithm, block_crcs.as_slice()) {
            (Algorithm::Crc32c, [crc]) if rng.gen_bool(0.7) => Digest::from_bytes(&crc.to_be_bytes()),
            _ => Digest::from_bytes(&digest_bytes),
        };
        Arc::new(Extent {
            slot,
            offset,
            stored_bytes: blocks * 4096,
            blocks,
            codec,
            digest,
            block_crcs,
        })
    }

    /// An array whose stripes can hold any record the tests make.
    pub(super) fn image_geometry(checksum: Algorithm) -> Geometry {
        Geometry {
            data: 1,
            parity: 1,
            members: 2,
            chunk_bytes: 16 << 20,
            rows: 1 << 20,
            member_bytes: 1 << 45,
            logical_bytes: 1 << 30,
            checksum,
            compression: None,
            log_bytes: 0,
            log_devices: 0,
            log_device_bytes: 0,
        }
    }

    /// Page images with bytes changed at random either load as a page
    /// that passed every check, or are refused with an error; none panics.
    #[test]
    fn mangled_page_images_are_refused_without_panicking() {
        use rand::{Rng, SeedableRng};
        for algorithm in [Algorithm::Crc32c, Algorithm::Blake3] {
            let mut rng = rand::rngs::StdRng::seed_from_u64(7);
            let mut map = Map::default();
            for i in 0..300u32 {
                let blocks = rng.gen_range(1..=16);
                let lba = rng.gen_range(0..MAP_PAGE_BLOCKS - 16);
                let extent = random_extent(&mut rng, algorithm, u64::from(i % 9), i * 4096, blocks);
                map.insert(
                    lba,
                    blocks,
                    u64::from(i),
                    &Target::Data { extent, skip: 0 },
                    Rule::Always,
                );
                if i % 7 == 0 {
                    map.insert(lba, 3, u64::from(i), &Target::Zero { slot: 4 }, Rule::Always);
                }
            }
            let mut image = Vec::new();
            assert!(map.encode_page(0, &mut image));
            assert!(!map.encode_page(1, &mut Vec::new()));
            let g = image_geometry(algorithm);
            let (mut accepted, mut refused) = (0, 0);
            for seed in 0..3000u64 {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
                let mut bad = image.clone();
                for _ in 0..rng.gen_range(1..=3) {
                    let at = rng.gen_range(0..bad.len());
                    bad[at] = rng.gen();
                }
                if seed % 5 == 0 {
                    bad.truncate(rng.gen_range(0..bad.len()));
                }
                let outcome = std::panic::catch_unwind(|| load(&[&bad], &g, &|s| s < 9).is_ok());
                match outcome {
                    Ok(true) => accepted += 1,
                    Ok(false) => refused += 1,
                    Err(_) => panic!("seed {seed}: the decoder panicked"),
                }
            }
            // Digest and CRC bytes may take any value: some changes pass.
            assert!(accepted > 0 && refused > 1000, "{accepted} accepted, {refused} refused");
            // A slot the caller says holds no live stripe is refused.
            assert!(load(&[&image], &g, &|s| s != 4).is_err());
            // Installed once: a second copy read meanwhile is left out.
            let held = Arc::new(PageImage {
                bytes: image.len() as u32,
                digest: Algorithm::Crc32c.digest(&image),
                pieces: Vec::new(),
                delta: None,
            });
            let mut twice = Map::default();
            let held_map = BTreeMap::from([(0, held.clone())]);
            publish(&mut twice, &BTreeMap::new(), &held_map, &BTreeSet::new());
            for (dir, own) in twice.directory_images() {
                // Held in memory from the publish: not installed again.
                assert_eq!(
                    twice.install_dir(dir, unchanged(in_dir(&held_map, dir)), &own, &|_| true),
                    Ok(false)
                );
                // Nor refused for where a copy read before a checkpoint
                // moved it points (map stripes since freed): it is not
                // how the page is held, so it is dropped unlooked at.
                let piece = crate::format::ImagePiece {
                    slot: 7,
                    offset: 0,
                    bytes: held.bytes,
                };
                let stale = Arc::new(PageImage {
                    pieces: vec![piece],
                    ..(*held).clone()
                });
                let read_before = BTreeMap::from([(0, stale)]);
                assert_eq!(
                    twice.install_dir(dir, unchanged(read_before), &own, &|_| false),
                    Ok(false)
                );
            }
            for installed in [true, false] {
                let page = Map::decode_image(&image, &g).unwrap();
                assert_eq!(twice.install(page, &held, |_| true), Ok(installed));
            }
        }
    }

    /// A page read in is refused for any slot of its entries that `live`
    /// refuses, though its neighbours share that slot (each run of a slot
    /// is asked about once), and names the slot refused.
    #[test]
    fn a_page_is_refused_for_any_slot_of_a_run_live_refuses() {
        let slots = [2, 2, 2, 5, 5, 2, 9, 9, 2];
        let mut map = Map::default();
        for (i, &slot) in slots.iter().enumerate() {
            let e = Arc::new(Extent {
                offset: i as u32 * 4096,
                ..(*extent(slot, 1)).clone()
            });
            map.insert(i as u64 * 2, 1, 1, &data(&e), Rule::Always);
        }
        let mut image = Vec::new();
        assert!(map.encode_page(0, &mut image));
        let g = image_geometry(Algorithm::Crc32c);
        let asked = std::cell::RefCell::new(Vec::new());
        let all = load(&[&image], &g, &|s| {
            asked.borrow_mut().push(s);
            true
        })
        .expect("every slot live");
        assert_eq!(ranges(&all), ranges(&map));
        assert_eq!(asked.into_inner(), [2, 5, 2, 9, 2]);
        for refused in [2, 5, 9] {
            let refusal = load(&[&image], &g, &|s| s != refused).err();
            let expected = FormatError::Field {
                what: "map page",
                field: "slot",
                value: refused,
            };
            assert_eq!(refusal, Some(expected), "slot {refused}");
        }
    }

    /// Pages of one record shape (as random 4 KiB writes make them) are
    /// checked as one; changed at random, every image is accepted or
    /// refused exactly as checking each entry does, with the same error
    /// and the same arena words; and one entry of another shape, in any
    /// of the shape's fields, makes the page one to check entry by entry.
    #[test]
    fn a_page_of_one_record_shape_is_checked_as_one_as_each_entry_would_be() {
        use rand::{Rng, SeedableRng};
        use tessera_compress::Codec;
        let shapes = [
            (Algorithm::Crc32c, None),
            (Algorithm::Sha3_512, None),
            (Algorithm::Sha3_512, Some(Codec::Lz4)),
        ];
        let mut proven_refused = 0;
        for (algorithm, codec) in shapes {
            let mut rng = rand::rngs::StdRng::seed_from_u64(25);
            let mut map = Map::default();
            for i in 0..400u32 {
                let lba = rng.gen_range(0..MAP_PAGE_BLOCKS);
                let crc: u32 = rng.gen();
                let digest = match (algorithm, codec) {
                    (Algorithm::Crc32c, None) => Digest::from_bytes(&crc.to_be_bytes()),
                    _ => Digest::from_bytes(&(0..algorithm.digest_bytes()).map(|_| rng.gen()).collect::<Vec<u8>>()),
                };
                let extent = Arc::new(Extent {
                    slot: rng.gen_range(0..9),
                    offset: i * 4096,
                    stored_bytes: if codec.is_some() { 1000 } else { 4096 },
                    blocks: 1,
                    codec,
                    digest,
                    block_crcs: match codec {
                        None => [crc].into_iter().collect(),
                        Some(_) => crate::format::BlockCrcs::new(),
                    },
                });
                map.insert(lba, 1, u64::from(i), &Target::Data { extent, skip: 0 }, Rule::Always);
            }
            let mut image = Vec::new();
            assert!(map.encode_page(0, &mut image));
            let g = image_geometry(algorithm);
            let live = |s: u64| s < 9;
            let count = u32::from_le_bytes(image[8..12].try_into().unwrap()) as usize;
            let words = u32::from_le_bytes(image[12..16].try_into().unwrap()) as usize;
            let (entries, _) = Entries::read_image(&image[IMAGE_HEADER_BYTES..], count).expect("entries");
            assert!(
                matches!(check_uniform(&entries, &g, words, Some(&live)), Some(Ok(_))),
                "{algorithm:?} {codec:?}: a uniform page is checked as one"
            );
            // As pages are read in (no `live`: `install` checks the
            // slots) and with `live`.
            let outcome = |bytes: &[u8], by_uniform: bool| {
                let with_live = Page::decode_checked(bytes, &g, Some(&live), by_uniform)
                    .map(|(p, page)| (p, page.referred(), page.entries.len()));
                let without = Page::decode_checked(bytes, &g, None, by_uniform)
                    .map(|(p, page)| (p, page.referred(), page.entries.len()));
                (with_live, without)
            };
            assert!(matches!(outcome(&image, true), (Ok(_), Ok(_))));
            for seed in 0..3000u64 {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
                let mut bad = image.clone();
                for _ in 0..rng.gen_range(1..=3) {
                    // Mostly the column table and the entries, where the
                    // proof and the checks look.
                    let at = if rng.gen_bool(0.8) {
                        rng.gen_range(0..(IMAGE_HEADER_BYTES + IMAGE_COLUMNS_BYTES + 64).min(bad.len()))
                    } else {
                        rng.gen_range(0..bad.len())
                    };
                    bad[at] = rng.gen();
                }
                let proven = outcome(&bad, true);
                assert_eq!(proven, outcome(&bad, false), "{algorithm:?} {codec:?}, seed {seed}");
                if proven.0.is_err() {
                    proven_refused += 1;
                }
            }
            // One entry of another record shape, each shape field in
            // turn: the page is not checked as one.
            let (_, page) = Page::decode_checked(&image, &g, Some(&live), true).unwrap();
            let uniform = page.entries.to_vec();
            let odd: [fn(&mut Entry); 7] = [
                |e| e.codec = 9,
                |e| e.crcs += 1,
                |e| e.record_blocks = 0,
                |e| e.digest_bytes += 1,
                |e| e.flags ^= DIGEST_IS_CRC,
                |e| e.flags |= ZERO,
                |e| e.flags |= 0x80,
            ];
            for (n, change) in odd.iter().enumerate() {
                let mut entries = uniform.clone();
                let middle = entries.len() / 2;
                change(&mut entries[middle]);
                assert!(
                    check_uniform(&Entries::from_slice(&entries), &g, words, Some(&live)).is_none(),
                    "{algorithm:?} {codec:?}, change {n}"
                );
            }
            // A slot the caller says holds no live stripe is refused.
            assert!(Page::decode_checked(&image, &g, Some(&|s| s != 4), true).is_err());
            // One entry just past each bound a column's least and most may
            // prove for every entry (and one just within it), in the
            // image's layout and in memory's, with `live` and without:
            // checked as one, refused or accepted as checking each entry
            // does.
            let limits = Limits::new(&g, words);
            let (mid, last) = (uniform.len() / 2, uniform.len() - 1);
            let (e, arena) = (uniform[mid], uniform[mid].arena_words());
            let mut past: Vec<(&str, Change)> = vec![
                ("start", Box::new(move |es| es[mid].start = es[mid - 1].start)),
                ("start", Box::new(move |es| es[last].start = MAP_PAGE_BLOCKS as u16)),
                ("blocks", Box::new(move |es| es[mid].blocks = 0)),
                (
                    "blocks",
                    Box::new(move |es| es[mid].blocks = es[mid + 1].start - es[mid].start + 1),
                ),
                ("slot", Box::new(move |es| es[mid].slot = limits.slots)),
                ("skip", Box::new(move |es| es[mid].skip = es[mid].record_blocks)),
                (
                    "offset",
                    Box::new(move |es| es[mid].offset = (limits.area - u64::from(e.stored_bytes) + 1) as u32),
                ),
                ("stored", Box::new(move |es| es[mid].stored_bytes = 0)),
                (
                    "stored",
                    Box::new(move |es| es[mid].stored_bytes = (limits.area - u64::from(e.offset) + 1) as u32),
                ),
            ];
            let mut within: Vec<(&str, Change)> = vec![
                ("slot", Box::new(move |es| es[mid].slot = limits.slots - 1)),
                (
                    "offset",
                    Box::new(move |es| es[mid].offset = (limits.area - u64::from(e.stored_bytes)) as u32),
                ),
                (
                    "stored",
                    Box::new(move |es| es[mid].stored_bytes = (limits.area - u64::from(e.offset)) as u32),
                ),
            ];
            if arena > 0 {
                let count = limits.word_count;
                past.push(("words", Box::new(move |es| es[mid].words = (count - arena + 1) as u32)));
                within.push(("words", Box::new(move |es| es[mid].words = (count - arena) as u32)));
            }
            check_bounds(&past, &within, &uniform, &g, words, &live, (algorithm, codec));
        }
        assert!(proven_refused > 1000, "{proven_refused} refused");
    }

    /// The mappings in chosen slots, found from each page's slot column,
    /// are those the whole walk finds in them, in the same order (replay's
    /// check that the checkpoint's map points into no slot replayed over
    /// uses the one; it used the other).
    #[test]
    fn mappings_in_chosen_slots_are_found_from_the_slot_column() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(26);
        let mut map = Map::default();
        for version in 1..4000u64 {
            let lba = rng.gen_range(0..8 * MAP_PAGE_BLOCKS);
            let blocks = rng.gen_range(1..=4);
            let slot = rng.gen_range(0..40);
            let target = if rng.gen_bool(0.1) {
                Target::Zero { slot }
            } else {
                let crc: u32 = rng.gen();
                Target::Data {
                    extent: Arc::new(Extent {
                        slot,
                        offset: rng.gen_range(0..1000) * 4096,
                        stored_bytes: blocks * 4096,
                        blocks,
                        codec: None,
                        digest: Digest::from_bytes(&crc.to_be_bytes()),
                        block_crcs: (0..blocks).map(|_| rng.gen()).collect(),
                    }),
                    skip: 0,
                }
            };
            map.insert(lba, blocks, version, &target, Rule::Always);
        }
        let mut found = 0;
        for chosen in [vec![], vec![3], vec![0, 7, 39], (0..40).collect::<Vec<u64>>()] {
            let walked: Vec<(u64, Location)> = map
                .iter()
                .locations()
                .filter(|(_, at)| chosen.contains(&at.slot))
                .collect();
            let by_column: Vec<(u64, Location)> = map.locations_in_slots(|slot| chosen.contains(&slot)).collect();
            assert_eq!(by_column, walked, "slots {chosen:?}");
            found += walked.len();
        }
        assert!(found > 1000, "{found} mappings found");
    }

    /// A change to a page's entries.
    type Change = Box<dyn Fn(&mut [Entry])>;

    /// Each change of `past` makes `uniform` a page both ways refuse
    /// alike, each of `within` one both ways accept (with `live`, they
    /// agree).
    fn check_bounds(
        past: &[(&str, Change)],
        within: &[(&str, Change)],
        uniform: &[Entry],
        g: &Geometry,
        words: usize,
        live: &dyn Fn(u64) -> bool,
        shape: (Algorithm, Option<tessera_compress::Codec>),
    ) {
        for (refused, changes) in [(true, past), (false, within)] {
            for (name, change) in changes {
                let mut entries = uniform.to_vec();
                change(&mut entries);
                for packed in [Entries::exact(&entries), Entries::from_slice(&entries)] {
                    for live in [None, Some(live)] {
                        let each = check_each(&packed, g, words, live);
                        let as_one = check_uniform(&packed, g, words, live);
                        assert_eq!(as_one, Some(each), "{shape:?}: {name}");
                        if live.is_none() {
                            assert_eq!(each.is_err(), refused, "{shape:?}: {name}");
                        }
                    }
                }
            }
        }
    }

    /// Pages 0 and 1 (both of directory page 0) of four blocks each,
    /// written, taken and published: the map and their images.
    fn two_durable_pages(rng: &mut rand::rngs::StdRng) -> (Map, BTreeMap<u64, Arc<PageImage>>) {
        let mut map = Map::default();
        write_four(&mut map, rng, 0, 1);
        write_four(&mut map, rng, MAP_PAGE_BLOCKS, 2);
        let dirty = map.take_dirty();
        let held: BTreeMap<u64, Arc<PageImage>> = dirty.iter().map(|&p| (p, image_of(&map, p))).collect();
        publish(&mut map, &BTreeMap::new(), &held, &dirty);
        (map, held)
    }

    /// Blocks `lba..lba + 4` mapped by a write of `version`.
    fn write_four(map: &mut Map, rng: &mut rand::rngs::StdRng, lba: u64, version: u64) {
        let extent = random_extent(rng, Algorithm::Crc32c, version, 0, 4);
        map.insert(lba, 4, version, &Target::Data { extent, skip: 0 }, Rule::Always);
    }

    /// Page `p`'s image as it is now, as a checkpoint would store it.
    pub(super) fn image_of(map: &Map, p: u64) -> Arc<PageImage> {
        let mut image = Vec::new();
        assert!(map.encode_page(p, &mut image));
        Arc::new(PageImage {
            bytes: image.len() as u32,
            digest: Algorithm::Crc32c.digest(&image),
            pieces: Vec::new(),
            delta: None,
        })
    }

    /// A page a checkpoint took (changed, its image not yet written) keeps
    /// its directory page in memory through evictions: a checkpoint that
    /// fails gives its pages back as changed, and the next one asks each
    /// for the image it replaces. (The simulation, with a map cache of a
    /// byte and faulty members, panicked in `durable_image` where the
    /// directory page had been evicted meanwhile.)
    #[test]
    fn a_page_a_checkpoint_took_keeps_its_directory_page_through_evictions() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let (mut map, held) = two_durable_pages(&mut rng);
        // Page 0 changes, a checkpoint takes it, and everything that may
        // go is evicted meanwhile.
        write_four(&mut map, &mut rng, 0, 3);
        let taken = map.take_dirty();
        assert_eq!(taken, BTreeSet::from([0]));
        map.evict(0, &|_| false, &|_| false);
        assert_eq!(map.page_count(), 1, "page 1 evicted, page 0 kept");
        // The checkpoint fails: page 0 is changed again, its old image known.
        map.mark_dirty(taken);
        assert_eq!(map.durable_image(0), Some(held[&0].clone()));
    }

    /// A directory page goes while pages of it stay in memory: a page
    /// names its durable image itself, clean, changed or emptied since,
    /// so a write to it after its directory page went still knows the
    /// image it replaces (before 2026-12-01 any page in memory kept its
    /// directory page, and writes scattered over 1 TiB kept all of them,
    /// 23 MiB past an 8 MiB cache). Once a checkpoint is durable, a page
    /// changed again names the image it wrote.
    #[test]
    fn a_directory_page_goes_while_its_pages_stay_and_they_name_their_images() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(6);
        let (mut map, held) = two_durable_pages(&mut rng);
        // Page 0 stays (pinned), page 1 goes, and the directory page.
        map.evict(0, &|p| p == 0, &|_| false);
        assert_eq!((map.page_count(), map.directory_counts().1), (1, 0));
        assert_eq!(map.durable_image(0), Some(held[&0].clone()), "clean");
        write_four(&mut map, &mut rng, 0, 3);
        assert_eq!(map.take_dirty(), BTreeSet::from([0]));
        assert_eq!(map.durable_image(0), Some(held[&0].clone()), "changed");
        // Published while changed again: it names what was written.
        let written = image_of(&map, 0);
        write_four(&mut map, &mut rng, 4, 4);
        let now = BTreeMap::from([(0, written.clone()), (1, held[&1].clone())]);
        publish(&mut map, &held, &now, &BTreeSet::from([0]));
        assert_eq!(map.durable_image(0), Some(written.clone()), "changed again");
        // Emptied, with no directory page in memory: it still names it.
        map.evict(0, &|p| p == 0, &|_| false);
        assert_eq!(map.directory_counts().1, 0);
        let lost = map.remove_from(0, MAP_PAGE_BLOCKS);
        assert!(!lost.is_empty() && map.page_count() == 0);
        assert_eq!(map.durable_image(0), Some(written), "emptied");
    }

    /// A directory page goes while a page it names is emptied in memory:
    /// the emptied page names the image it replaces itself (`emptied`),
    /// so its directory page need not stay (until 2026-12-03 `evict`
    /// kept it, a rule left from when `emptied` held no image, and the
    /// checkpoint kept it in memory once written). Read back, the
    /// directory page brings its other page and not the emptied one's
    /// old image; the checkpoint that writes the page empty leaves the
    /// directory page out of memory, naming the other page alone.
    #[test]
    fn a_directory_page_goes_while_a_page_it_names_is_emptied() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(8);
        let (mut map, held) = two_durable_pages(&mut rng);
        let images: BTreeMap<u64, Vec<u8>> = [0, 1]
            .into_iter()
            .map(|p| {
                let mut image = Vec::new();
                assert!(map.encode_page(p, &mut image));
                (p, image)
            })
            .collect();
        let page_one = ranges(&map)
            .into_iter()
            .filter(|r| r.0 >= MAP_PAGE_BLOCKS)
            .collect::<Vec<_>>();
        assert!(!map.remove_from(0, MAP_PAGE_BLOCKS).is_empty());
        map.evict(0, &|_| false, &|_| false);
        assert_eq!(
            (map.page_count(), map.directory_counts().1),
            (0, 0),
            "page 1 and the directory page went"
        );
        assert!(map.in_memory(0) && !map.in_memory(1));
        assert_eq!(map.durable_image(0), Some(held[&0].clone()), "emptied");
        // Read back: page 1 from its image, page 0 still empty.
        read_back(&mut map, &held, &images, &image_geometry(Algorithm::Crc32c));
        assert_eq!(ranges(&map), page_one);
        assert_eq!(map.check_durable(), Ok(()));
        // Out of memory again, and the checkpoint that writes page 0
        // empty published: the directory page stays out, naming page 1.
        map.evict(0, &|_| false, &|_| false);
        assert_eq!((map.page_count(), map.directory_counts().1), (0, 0));
        let dirty = map.take_dirty();
        assert_eq!(dirty, BTreeSet::from([0]));
        let now = BTreeMap::from([(1, held[&1].clone())]);
        publish(&mut map, &held, &now, &dirty);
        assert_eq!(map.directory_counts(), (1, 0));
        assert!(!map.in_memory(0), "page 0 is as its directory page says");
        read_back(&mut map, &now, &images, &image_geometry(Algorithm::Crc32c));
        assert_eq!(ranges(&map), page_one);
        assert_eq!(map.durable_image(0), None);
    }

    /// A page read once (`Map::read_once`) shows the mappings it would
    /// show installed, leaves the map as it was, is checked in the
    /// entries looked at and no others, and is refused once the page is
    /// in memory; given back, it installs as read.
    #[test]
    fn a_page_read_once_is_looked_at_as_installed_and_leaves_the_map_as_it_was() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let (mut map, held) = two_durable_pages(&mut rng);
        let g = image_geometry(Algorithm::Crc32c);
        let (mut image, page_one) = (Vec::new(), MAP_PAGE_BLOCKS);
        assert!(map.encode_page(1, &mut image));
        let shown = |o: Overlapping<'_>| {
            o.map(|(s, m)| (s, m.blocks, m.version, m.target.slot()))
                .collect::<Vec<_>>()
        };
        let want = shown(map.overlapping(page_one, page_one + 8));
        assert_eq!(want.len(), 1, "four blocks of one write");
        let slot = want[0].3;
        // The pages go, their directory page stays (as `missing` would
        // have it read first).
        map.evict(0, &|_| false, &|_| true);
        assert_eq!((map.page_count(), map.directory_counts().1), (0, 1));
        let read = || Map::decode_image(&image, &g).unwrap();
        let once = map.read_once(read(), &held[&1], (page_one, page_one + 8), |_| true);
        let once = once.unwrap().expect("held only as that image");
        assert_eq!(shown(once.overlapping(page_one, page_one + 8)), want);
        assert_eq!(shown(once.overlapping(page_one + 2, page_one + 3)), vec![want[0]]);
        assert!(!map.in_memory(1) && map.page_count() == 0, "the map as it was");
        // Checked where looked at only.
        let refused = |s: u64| s != slot;
        assert_eq!(
            map.read_once(read(), &held[&1], (page_one + 1, page_one + 2), refused)
                .err(),
            Some(refused_slot_error(slot))
        );
        let past = map.read_once(read(), &held[&1], (page_one + 100, page_one + 101), refused);
        assert!(shown(past.unwrap().unwrap().overlapping(page_one + 100, page_one + 101)).is_empty());
        // Installed as read, given back; then no page is read once.
        assert_eq!(map.install(once.into_loaded(), &held[&1], |_| true), Ok(true));
        assert_eq!(shown(map.overlapping(page_one, page_one + 8)), want);
        let again = map.read_once(read(), &held[&1], (page_one, page_one + 8), |_| true);
        assert!(again.unwrap().is_none(), "in memory now");
    }

    /// A page whose directory page left memory is still taken as a delta
    /// over its image where a few of its keys changed (before, the
    /// snapshot asked the directory page whether the page had an image,
    /// and took the page whole once it had gone).
    #[test]
    fn a_page_whose_directory_page_went_is_still_taken_as_a_delta() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut map = Map::default();
        for i in 0..64 {
            write_four(&mut map, &mut rng, 4 * i, 1);
        }
        let dirty = map.take_dirty();
        assert!(map.begin_snapshot(&dirty, &|_| false).is_empty(), "taken whole");
        map.end_snapshot();
        let held: BTreeMap<u64, Arc<PageImage>> = dirty.iter().map(|&p| (p, image_of(&map, p))).collect();
        publish(&mut map, &BTreeMap::new(), &held, &dirty);
        map.evict(0, &|p| p == 0, &|_| false);
        assert_eq!((map.page_count(), map.directory_counts().1), (1, 0));
        write_four(&mut map, &mut rng, 8, 2);
        let dirty = map.take_dirty();
        assert_eq!(map.begin_snapshot(&dirty, &|_| false), BTreeSet::from([0]));
        map.end_snapshot();
    }

    /// A map of 64 pages, all changed since the last checkpoint, with a
    /// limit of half what it holds and one eviction walked (which could
    /// evict none), and the random source (`seed`) that wrote it.
    fn stuck_past_half(seed: u64) -> (Map, rand::rngs::StdRng, usize) {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut map = Map::default();
        for p in 0..64 {
            write_four(&mut map, &mut rng, p * MAP_PAGE_BLOCKS, 1);
        }
        let limit = map.held_bytes() / 2;
        assert_eq!(map.evict(limit, &|_| false, &|_| false), 0);
        assert_eq!(map.eviction_walks(), 1);
        (map, rng, limit)
    }

    /// Past a cache full of pages changed since the last checkpoint, an
    /// eviction walks the pages in memory again only once they hold an
    /// eighth of the limit more, or a checkpoint made pages clean. Before,
    /// every page read in walked them all, under the index's lock: a thin
    /// 1 TiB array written at random with a 32 MiB cache fell to ~1,300
    /// writes a second (PERFORMANCE.md, "Evictions past a cache full of
    /// changed pages").
    #[test]
    fn evictions_past_a_cache_full_of_changed_pages_walk_the_pages_only_as_they_grow() {
        // Every page changed: nothing may go, and one walk finds that.
        let (mut map, mut rng, limit) = stuck_past_half(7);
        let none = |_: u64| false;
        // More pages changed, one at a time, each followed by an eviction
        // (as a write after each page read in): no walk until they hold
        // an eighth of the limit more.
        let stuck = map.held_bytes();
        let mut p = 64;
        loop {
            assert!(p < 64 + 4096, "an eighth of the limit never held");
            write_four(&mut map, &mut rng, p * MAP_PAGE_BLOCKS, 2);
            p += 1;
            if map.held_bytes() >= stuck + limit / 8 {
                break;
            }
            assert_eq!(map.evict(limit, &none, &none), 0);
            let held = map.held_bytes();
            assert_eq!(map.eviction_walks(), 1, "walked again with {held} bytes held");
        }
        assert!(p > 65, "the test grows the pages by more than one page");
        assert_eq!(map.evict(limit, &none, &none), 0);
        assert_eq!(map.eviction_walks(), 2);
        // A checkpoint writes them: clean, they go down to the target.
        let dirty = map.take_dirty();
        let held: BTreeMap<u64, Arc<PageImage>> = dirty.iter().map(|&p| (p, image_of(&map, p))).collect();
        publish(&mut map, &BTreeMap::new(), &held, &dirty);
        assert!(map.evict(limit, &none, &none) > 0);
        assert_eq!(map.eviction_walks(), 3);
        assert!(map.held_bytes() <= limit - limit / 8);
    }

    /// A map stuck past its limit that then shrinks (pages emptied, freed)
    /// is stuck at its lower mark: the next walk waits on an eighth of the
    /// limit grown since, not since the higher mark. Until 2026-12-03 it
    /// waited on the higher one: a volume deleted all over (its pages read
    /// in, then emptied) left the mark far above, and the directory pages
    /// read in after it were never evicted while reads installed no page
    /// (`map_pages::a_volume_deleted_all_over_lets_its_directory_pages_go`).
    #[test]
    fn a_map_that_shrank_while_stuck_walks_again_as_it_grows_from_there() {
        let (mut map, mut rng, limit) = stuck_past_half(8);
        let none = |_: u64| false;
        let stuck = map.held_bytes();
        map.remove_from(16 * MAP_PAGE_BLOCKS, u64::MAX);
        let low = map.held_bytes();
        assert!(low + limit / 4 < stuck, "the map shrank: {low} of {stuck} bytes");
        // Still over the limit: nothing goes, and no walk.
        assert_eq!(map.evict(limit, &none, &none), 0);
        assert_eq!(map.eviction_walks(), 1);
        let mut p = 64;
        while map.held_bytes() < low + limit / 8 {
            assert!(p < 64 + 4096, "an eighth of the limit never held");
            write_four(&mut map, &mut rng, p * MAP_PAGE_BLOCKS, 2);
            p += 1;
        }
        assert!(map.held_bytes() < stuck, "grown back to the higher mark");
        assert_eq!(map.evict(limit, &none, &none), 0);
        assert_eq!(
            map.eviction_walks(),
            2,
            "no walk an eighth of the limit past the lower mark"
        );
    }

    /// Random writes, replays, relocations and removals over a few pages,
    /// checked block by block against a plain model: every block maps to
    /// the record and version the model says, every record comes back
    /// with the checksums it went in with, and the deltas add up to what
    /// each record has mapped.
    #[test]
    fn pages_agree_with_a_block_by_block_model() {
        use rand::{Rng, SeedableRng};
        type Held = (u64, Target, u64, u32); // version, target as inserted (skip 0), its first key, block in it
        let identity = |t: &Target| match t {
            Target::Zero { slot } => (*slot, None),
            Target::Data { extent, .. } => (extent.slot, Some(extent.offset)),
        };
        for seed in 0..24u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let algorithm = [Algorithm::Crc32c, Algorithm::Xxh3, Algorithm::Sha3_512][seed as usize % 3];
            let span = 3 * MAP_PAGE_BLOCKS + 7;
            let mut map = Map::default();
            let mut model: Vec<Option<Held>> = vec![None; span as usize];
            let mut live: BTreeMap<(u64, Option<u32>), i64> = BTreeMap::new();
            let mut version = 0u64;
            let mut images: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
            let mut durable: BTreeMap<u64, Arc<PageImage>> = BTreeMap::new();
            for op in 0..2500u32 {
                let (lba, blocks, target_version, target, rule_kind) = match rng.gen_range(0..20) {
                    // A relocation of the record some block maps to now.
                    0..=2 => {
                        let b = rng.gen_range(0..span) as usize;
                        let Some((v, old, first, _)) = model[b].clone() else {
                            continue;
                        };
                        let blocks = match &old {
                            Target::Data { extent, .. } => extent.blocks,
                            Target::Zero { .. } => continue,
                        };
                        let copy = random_extent(&mut rng, algorithm, 1000 + u64::from(op), 0, blocks);
                        (first, blocks, v, Target::Data { extent: copy, skip: 0 }, Some(old))
                    }
                    kind => {
                        let zero = kind == 3;
                        let blocks = if zero {
                            rng.gen_range(1..700)
                        } else {
                            rng.gen_range(1..=16)
                        };
                        let lba = rng.gen_range(0..span - u64::from(blocks));
                        let slot = rng.gen_range(0..40);
                        let target = if zero {
                            Target::Zero { slot }
                        } else {
                            let extent = random_extent(&mut rng, algorithm, slot, op * 4096, blocks);
                            Target::Data { extent, skip: 0 }
                        };
                        // A replay's version may be older than what it meets.
                        let replay = kind < 7;
                        version += 1;
                        let v = if replay { rng.gen_range(0..version + 3) } else { version };
                        (
                            lba,
                            blocks,
                            v,
                            target,
                            replay.then_some(Target::Zero { slot: u64::MAX }),
                        )
                    }
                };
                let rule = match &rule_kind {
                    None => Rule::Always,
                    Some(Target::Zero { slot: u64::MAX }) => Rule::IfNotNewer,
                    Some(old) => Rule::IfStill {
                        target: old,
                        version: target_version,
                    },
                };
                for b in lba..lba + u64::from(blocks) {
                    let held = &mut model[b as usize];
                    let replaces = match (&rule, held.as_ref()) {
                        (Rule::Always, _) | (Rule::IfNotNewer, None) => true,
                        (Rule::IfNotNewer, Some(h)) => h.0 <= target_version,
                        (
                            Rule::IfStill {
                                target: old,
                                version: v,
                            },
                            Some(h),
                        ) => h.0 == *v && identity(&h.1) == identity(old),
                        (Rule::IfStill { .. }, None) => false,
                    };
                    if replaces {
                        *held = Some((target_version, target.clone(), lba, (b - lba) as u32));
                    }
                }
                for delta in map.insert(lba, blocks, target_version, &target, rule) {
                    *live.entry((delta.slot, delta.data.map(|d| d.offset))).or_default() +=
                        if delta.gained { 1 } else { -1 } * i64::from(delta.blocks);
                }
                if op % 97 == 0 {
                    // A volume's worth of keys removed, somewhere in the span.
                    let (from, to) = (rng.gen_range(0..span), rng.gen_range(0..span));
                    let (from, to) = (from.min(to), from.max(to));
                    let straddling = map.overlapping(from, from + 1).find(|(s, _)| *s < from);
                    if straddling.is_none() && map.overlapping(to, to + 1).all(|(s, _)| s >= to) {
                        for delta in map.remove_from(from, to) {
                            assert!(!delta.gained);
                            *live.entry((delta.slot, delta.data.map(|d| d.offset))).or_default() -=
                                i64::from(delta.blocks);
                        }
                        model[from as usize..to as usize].fill(None);
                    }
                }
                if op % 3 == 2 {
                    // A page not marked dirty since its image was taken
                    // still encodes to the same bytes.
                    let dirty = map.take_dirty();
                    for p in 0..span.div_ceil(MAP_PAGE_BLOCKS) {
                        let mut image = Vec::new();
                        let held = map.encode_page(p, &mut image);
                        let same = images.get(&p) == held.then_some(&image);
                        assert!(
                            same || dirty.contains(&p),
                            "seed {seed} op {op}: page {p} changed unmarked"
                        );
                        match held {
                            true => images.insert(p, image),
                            false => images.remove(&p),
                        };
                    }
                    // Clean now: each page gets its image, and sometimes
                    // every page not pinned is evicted and read back.
                    let held: BTreeMap<u64, Arc<PageImage>> = images
                        .iter()
                        .map(|(&p, image)| {
                            let image = PageImage {
                                bytes: image.len() as u32,
                                digest: Algorithm::Crc32c.digest(image),
                                pieces: Vec::new(),
                                delta: None,
                            };
                            (p, Arc::new(image))
                        })
                        .collect();
                    publish(&mut map, &durable, &held, &dirty);
                    durable = held;
                    if op % 9 == 8 {
                        let before = ranges(&map);
                        let pinned = |p: u64| p.is_multiple_of(3);
                        let evicted = map.evict(0, &pinned, &|_| false);
                        let expected = durable.keys().filter(|&&p| !pinned(p)).count();
                        assert_eq!(evicted, expected, "seed {seed} op {op}: evicted");
                        assert_eq!(map.page_count(), durable.len() - expected, "seed {seed} op {op}");
                        assert_eq!(
                            map.directory_counts().1,
                            0,
                            "seed {seed} op {op}: the directory page goes, pages of it pinned or not"
                        );
                        read_back(&mut map, &durable, &images, &image_geometry(algorithm));
                        assert_eq!(ranges(&map), before, "seed {seed} op {op}: read back");
                    }
                }
                if op % 50 != 49 {
                    continue;
                }
                let mut expected: BTreeMap<(u64, Option<u32>), i64> = BTreeMap::new();
                let mut seen = vec![None; span as usize];
                for (start, m) in map.iter() {
                    for i in 0..m.blocks {
                        let skip = match &m.target {
                            Target::Data { skip, .. } => skip + i,
                            Target::Zero { .. } => 0,
                        };
                        seen[(start + u64::from(i)) as usize] = Some((m.version, m.target.clone(), skip));
                    }
                }
                for (b, (held, got)) in model.iter().zip(&seen).enumerate() {
                    match (held, got) {
                        (None, None) => {}
                        (Some((v, t, _, i)), Some((gv, gt, gi))) => {
                            *expected.entry(identity(t)).or_default() += 1;
                            assert_eq!((v, identity(t)), (gv, identity(gt)), "seed {seed} op {op} block {b}");
                            if let (Target::Data { extent: a, .. }, Target::Data { extent: g, .. }) = (t, gt) {
                                assert_eq!(**a, **g, "seed {seed} op {op} block {b}");
                                assert_eq!(i, gi, "seed {seed} op {op} block {b}");
                            }
                        }
                        _ => panic!("seed {seed} op {op} block {b}: model {held:?}, map {got:?}"),
                    }
                }
                live.retain(|_, n| *n != 0);
                assert_eq!(live, expected, "seed {seed} op {op}: deltas against what is mapped");
                assert_eq!(map.len(), map.iter().count());
                assert_eq!(map.bytes(), map.pages.values().map(|page| page.bytes()).sum::<usize>());
                assert_eq!(map.iter().locations().count(), map.len());
                // Lookups of any range give the same pieces as the whole.
                let (from, to) = (rng.gen_range(0..span), rng.gen_range(0..span));
                let (from, to) = (from.min(to), from.max(to) + 1);
                let pieces: Vec<u64> = map.overlapping(from, to).map(|(s, _)| s).collect();
                let all: Vec<u64> = map
                    .iter()
                    .filter(|(s, m)| *s < to && s + u64::from(m.blocks) > from)
                    .map(|(s, _)| s)
                    .collect();
                assert_eq!(pieces, all, "seed {seed} op {op}: overlapping({from}, {to})");
                let spans: Vec<u64> = map.overlapping(from, to).spans().map(|(s, _)| s).collect();
                assert_eq!(spans, pieces, "seed {seed} op {op}: spans({from}, {to})");
                // The pages' images load back into the same map.
                let images: Vec<Vec<u8>> = (0..span.div_ceil(MAP_PAGE_BLOCKS))
                    .filter_map(|p| {
                        let mut image = Vec::new();
                        map.encode_page(p, &mut image).then_some(image)
                    })
                    .collect();
                let images: Vec<&[u8]> = images.iter().map(Vec::as_slice).collect();
                let loaded = load(&images, &image_geometry(algorithm), &|_| true).unwrap();
                assert_eq!(ranges(&loaded), ranges(&map), "seed {seed} op {op}");
                let targets = |m: &Map| m.iter().map(|(_, m)| format!("{:?}", m.target)).collect::<Vec<_>>();
                assert_eq!(targets(&loaded), targets(&map), "seed {seed} op {op}");
                assert_eq!(
                    (loaded.len(), loaded.dirty_count()),
                    (map.len(), 0),
                    "loaded pages are clean"
                );
            }
            // The arena holds no more than twice what is referred to.
            for page in map.pages.values() {
                assert!(page.words.len() <= 2 * page.referred() + 32);
            }
        }
    }

    #[test]
    fn a_random_block_costs_an_entry_and_a_word() {
        // Every key of 64 pages written once, in random order, each to a
        // slot and offset of its own, as `bench-metadata.sh` writes 1 M
        // blocks (a version each; ~16,000 slots of 128 blocks).
        use rand::seq::SliceRandom;
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let pages = 64u64;
        let mut keys: Vec<u64> = (0..pages * MAP_PAGE_BLOCKS).collect();
        keys.shuffle(&mut rng);
        let mut map = Map::default();
        for (v, lba) in keys.into_iter().enumerate() {
            let crc: u32 = rng.gen();
            let extent = Arc::new(Extent {
                slot: rng.gen_range(0..16_000),
                offset: rng.gen_range(0..128u32) * 4096,
                stored_bytes: 4096,
                blocks: 1,
                codec: None,
                digest: Digest::from_bytes(&crc.to_be_bytes()),
                block_crcs: [crc].into_iter().collect(),
            });
            let version = 1_000_000 + v as u64 * 30;
            map.insert(lba, 1, version, &Target::Data { extent, skip: 0 }, Rule::Always);
        }
        let per_block = map.bytes() as f64 / (pages * MAP_PAGE_BLOCKS) as f64;
        // An entry packed in 11 bytes (entries.rs) with its CRC, the
        // arrays' spare eighth, the page's own share.
        assert!(per_block < 16.0, "{per_block:.1} bytes per block");
    }

    /// A page in memory counts the durable image it names (an allocation
    /// of its own, the size of a page of a few entries): pages of one
    /// entry each, as writes spread over a large export leave them, held
    /// twice what the count said without it. Installed with an image of
    /// three pieces, a page counts their bytes more than with one; a
    /// checkpoint that names a new image keeps the count right.
    #[test]
    fn a_page_counts_the_durable_image_it_names() {
        use crate::format::ImagePiece;
        use rand::SeedableRng;
        let g = image_geometry(Algorithm::Crc32c);
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let mut source = Map::default();
        source.insert(
            5,
            1,
            1,
            &data(&random_extent(&mut rng, Algorithm::Crc32c, 7, 0, 1)),
            Rule::Always,
        );
        let mut image = Vec::new();
        assert!(source.encode_page(0, &mut image));
        let held_with = |pieces: u32| {
            let piece = |slot| ImagePiece {
                slot,
                offset: 0,
                bytes: 1,
            };
            let named = Arc::new(PageImage::whole(
                image.len() as u32,
                Algorithm::Crc32c.digest(&image),
                (0..pieces).map(|i| piece(u64::from(i) + 20)).collect(),
            ));
            let mut map = Map::default();
            let held = BTreeMap::from([(0, named.clone())]);
            publish(&mut map, &BTreeMap::new(), &held, &BTreeSet::new());
            let loaded = Map::decode_image(&image, &g).unwrap();
            assert!(map.install(loaded, &named, |_| true).unwrap());
            map.check_bytes().unwrap();
            map
        };
        let (one, three) = (held_with(1), held_with(3));
        let piece = std::mem::size_of::<ImagePiece>();
        assert_eq!(three.bytes() - one.bytes(), 2 * piece);
        // A checkpoint names a new image of the page: the count follows.
        let mut map = three;
        let newer = Arc::new(PageImage::whole(9, Algorithm::Crc32c.digest(b"newer"), Vec::new()));
        map.publish(Vec::new(), vec![(0, Some(newer))]);
        map.check_bytes().unwrap();
        assert_eq!(map.bytes(), one.bytes() - piece);
    }

    /// The count bounds what the pages take (the cache is sized by it):
    /// thinly written pages of one entry each, made in random order and in
    /// order, then half of them emptied, then their changes taken
    /// (`take_dirty`, as a checkpoint takes them).
    #[test]
    fn the_count_bounds_the_heap_the_pages_take() {
        use rand::seq::SliceRandom;
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(25);
        const PAGES: u64 = 20_000;
        let extents: Vec<Target> = (0..PAGES)
            .map(|i| data(&random_extent(&mut rng, Algorithm::Crc32c, i + 1, 0, 1)))
            .collect();
        let mut shuffled: Vec<u64> = (0..PAGES).collect();
        shuffled.shuffle(&mut rng);
        for order in [shuffled, (0..PAGES).collect()] {
            let before = heap::held();
            let mut map = Map::default();
            for &p in &order {
                map.insert(p * MAP_PAGE_BLOCKS + 7, 1, 1, &extents[p as usize], Rule::Always);
            }
            let check = |map: &Map, what: &str| {
                let (held, counted) = ((heap::held() - before) as usize, map.held_bytes());
                assert!(
                    held <= counted && counted <= held + held / 4,
                    "{what}: the pages hold {held} bytes, {} a page; the map counts {counted}, {} a page",
                    held / map.page_count(),
                    counted / map.page_count()
                );
            };
            check(&map, "written");
            for &p in order.iter().step_by(2) {
                map.remove_from(p * MAP_PAGE_BLOCKS, (p + 1) * MAP_PAGE_BLOCKS);
            }
            check(&map, "half emptied");
            map.take_dirty();
            check(&map, "taken");
        }
    }

    /// What a page image costs a randomly written raw block, as encoded
    /// (packed: 10.6 bytes) and as a checkpoint stores it (zstd 1: 10.4; 44
    /// and 16 before format version 7): 20,000 writes at
    /// random over 64 pages, each of a random slot, offset, CRC and a
    /// version of its own, as uniform random overwrites leave them.
    #[test]
    fn a_random_block_costs_11_bytes_of_image_and_stored() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let mut map = Map::default();
        for v in 0..20_000u64 {
            let crc: u32 = rng.gen();
            let extent = Arc::new(Extent {
                slot: rng.gen_range(0..15_405),
                offset: rng.gen_range(0..127u32) * 4096,
                stored_bytes: 4096,
                blocks: 1,
                codec: None,
                digest: Digest::from_bytes(&crc.to_be_bytes()),
                block_crcs: [crc].into_iter().collect(),
            });
            let lba = rng.gen_range(0..64 * MAP_PAGE_BLOCKS);
            map.insert(lba, 1, 1000 + 7 * v, &Target::Data { extent, skip: 0 }, Rule::Always);
        }
        let (mut raw, mut stored) = (0, 0);
        for p in 0..64 {
            let mut image = Vec::new();
            assert!(map.encode_page(p, &mut image));
            raw += image.len();
            stored += crate::format::store_page_image(&image).len();
        }
        let entries = map.len() as f64;
        let (raw, stored) = (raw as f64 / entries, stored as f64 / entries);
        eprintln!("{raw:.1} bytes a block encoded, {stored:.1} stored");
        assert!(raw < 11.0 && stored < 11.0, "{raw:.1} encoded, {stored:.1} stored");
    }

    /// A directory page's entries with no delta over its image.
    fn unchanged(images: BTreeMap<u64, Arc<PageImage>>) -> DirEntries {
        DirEntries {
            images,
            changed: BTreeSet::new(),
        }
    }

    #[test]
    fn a_write_cuts_what_it_overlaps_and_reports_the_difference() {
        let mut map = Map::default();
        let (a, b) = (extent(1, 10), extent(2, 4));
        map.insert(0, 10, 1, &data(&a), Rule::Always);
        let deltas = map.insert(3, 4, 2, &data(&b), Rule::Always);
        assert_eq!(ranges(&map), [(0, 3, 1, 1, 0), (3, 4, 2, 2, 0), (7, 3, 1, 1, 7)]);
        assert_eq!(net(&deltas), BTreeMap::from([(1, -4), (2, 4)]));
        // Gains come first: slot 1 is never seen with nothing live.
        let first_loss = deltas.iter().position(|d| !d.gained).unwrap();
        assert!(deltas[first_loss..].iter().all(|d| !d.gained));
        // A write over everything and past it, into the gap beyond.
        let c = extent(3, 16);
        let deltas = map.insert(0, 16, 3, &data(&c), Rule::Always);
        assert_eq!(ranges(&map), [(0, 16, 3, 3, 0)]);
        assert_eq!(net(&deltas), BTreeMap::from([(1, -6), (2, -4), (3, 16)]));
    }

    /// Replay leaves an entry alone only where it already points at the
    /// very record replayed: a slot rewritten since the checkpoint may
    /// hold, at the same offset and version, a relocated piece of the
    /// same write, which maps the keys from another block of its record.
    /// (`regressions.rs::relocated_copies_never_replace_newer_writes_at_recovery`
    /// read wrong blocks 2 times in 40 while only slot, offset and
    /// version were compared.)
    /// A checkpoint's snapshot gives each page taken as it was when
    /// taken, whether a change came first (the page kept before it) or
    /// not; a page that was empty then gives nothing.
    #[test]
    fn a_snapshot_gives_pages_as_they_were_when_taken() {
        let mut map = Map::default();
        map.insert(0, 4, 1, &data(&extent(1, 4)), Rule::Always);
        map.insert(600, 1, 2, &data(&extent(2, 1)), Rule::Always);
        let taken = map.take_dirty();
        let taken: BTreeSet<u64> = taken.into_iter().chain([2]).collect();
        let image = |map: &Map, p: u64| {
            let mut out = Vec::new();
            map.encode_page(p, &mut out).then_some(out)
        };
        let (page0, page1) = (image(&map, 0), image(&map, 1));
        map.begin_snapshot(&taken, &|_| true);
        // Pages 0 and 2 change before they are copied; page 1 does not.
        map.insert(1, 1, 3, &data(&extent(3, 1)), Rule::Always);
        map.insert(1024, 1, 4, &data(&extent(4, 1)), Rule::Always);
        let copied = |p: u64| {
            let mut out = Vec::new();
            map.snapshot_image(p, &mut out).then_some(out)
        };
        assert_eq!(copied(0), page0, "page 0 as taken, not as changed");
        assert_eq!(copied(1), page1);
        assert_eq!(copied(2), None, "page 2 was empty when taken");
        map.end_snapshot();
        assert_ne!(image(&map, 0), page0, "the change is in the map");
        assert_eq!(map.dirty_count(), 2);
    }

    /// The bytes the map counts as held stay those its pages hold while
    /// checkpoints take pages whole and give them back (the count grew
    /// by a page's keys changed since its base each time, 72 bytes,
    /// until the cache evicted every page after each checkpoint).
    #[test]
    fn the_bytes_counted_stay_those_held_as_pages_are_taken_and_given_back() {
        let mut map = Map::new(1);
        for round in 0..4u64 {
            map.insert(round, 2, round + 1, &data(&extent(1, 2)), Rule::Always);
            let taken = map.take_dirty();
            map.begin_snapshot(&taken, &|_| true);
            map.end_snapshot();
            map.check_bytes().unwrap();
            if round % 2 == 1 {
                map.give_back(taken);
                map.check_bytes().unwrap();
            }
        }
    }

    #[test]
    fn replay_replaces_a_same_versioned_record_placed_otherwise() {
        let mut map = Map::default();
        // Blocks 100..108 from an 8-block record in slot 5 at offset 0.
        let whole = extent(5, 8);
        map.insert(100, 8, 7, &data(&whole), Rule::Always);
        assert_eq!(map.take_dirty().len(), 1);
        // The same record replayed: nothing changes, nothing is dirty.
        assert!(map.insert(100, 8, 7, &data(&whole), Rule::IfNotNewer).is_empty());
        assert_eq!(map.dirty_count(), 0);
        // A 3-block piece of the same write (version 7), relocated into
        // slot 5 again at offset 0 after the slot was rewritten: it maps
        // blocks 103..106 from its own first block.
        let piece = extent(5, 3);
        let deltas = map.insert(103, 3, 7, &data(&piece), Rule::IfNotNewer);
        assert!(!deltas.is_empty(), "the piece takes its blocks");
        assert_eq!(
            ranges(&map),
            vec![(100, 3, 7, 5, 0), (103, 3, 7, 5, 0), (106, 2, 7, 5, 6)]
        );
    }

    /// Inserts in parts side by side leave the map, its counts and its
    /// dirty and emptied pages as the same inserts one by one do, and
    /// give the same deltas in the same order: over a map with pages
    /// before, between and after the parts', records that overwrite,
    /// lose to newer ones or are zeros, and parts of one page.
    #[test]
    fn inserts_in_parts_side_by_side_change_what_one_by_one_do() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let p = MAP_PAGE_BLOCKS;
        for round in 0..20 {
            let mut before = Map::default();
            for i in 0..300u64 {
                let lba = rng.gen_range(0..40 * p);
                let blocks = rng.gen_range(1..=(p - lba % p).min(16) as u32);
                before.insert(lba, blocks, i + 1, &data(&extent(i % 7, blocks)), Rule::Always);
            }
            let taken = before.take_dirty();
            assert!(!taken.is_empty());
            // Records within one page each, in page order (stably), split
            // where the page changes into 1-4 parts.
            let mut records: Vec<(u64, u32, u64, Target)> = (0..500u64)
                .map(|i| {
                    let lba = rng.gen_range(5 * p..35 * p);
                    let blocks = rng.gen_range(1..=(p - lba % p).min(16) as u32);
                    let version = rng.gen_range(1..600);
                    let target = match rng.gen_bool(0.2) {
                        true => Target::Zero { slot: 50 + i % 3 },
                        false => data(&extent(20 + i % 5, blocks)),
                    };
                    (lba, blocks, version, target)
                })
                .collect();
            records.sort_by_key(|r| r.0 / p);
            let cuts = page_cuts(records.len(), 1 + round % 4, |i| records[i].0 / p);
            let mut one_by_one = before.clone_pages();
            let mut side_by_side = before.clone_pages();
            let expected: Vec<Delta> = records
                .iter()
                .flat_map(|(lba, blocks, version, target)| {
                    one_by_one.insert(*lba, *blocks, *version, target, Rule::IfNotNewer)
                })
                .collect();
            let inserts: Vec<_> = cuts
                .windows(2)
                .map(|cut| {
                    let part = &records[cut[0]..cut[1]];
                    (part.first().map_or(u64::MAX, |r| r.0 / p), part.iter().cloned())
                })
                .collect();
            let got: Vec<Delta> = side_by_side
                .insert_parts(inserts, Rule::IfNotNewer)
                .into_iter()
                .flatten()
                .collect();
            let key = |d: &Delta| (d.lba, d.blocks, d.gained, d.slot, d.data);
            assert_eq!(
                got.iter().map(key).collect::<Vec<_>>(),
                expected.iter().map(key).collect::<Vec<_>>(),
                "round {round}: the deltas"
            );
            assert_eq!(ranges(&side_by_side), ranges(&one_by_one), "round {round}: the map");
            assert_eq!(side_by_side.len(), one_by_one.len());
            assert_eq!(side_by_side.bytes(), one_by_one.bytes());
            assert_eq!(side_by_side.page_count(), one_by_one.page_count());
            assert_eq!(
                side_by_side.emptied, one_by_one.emptied,
                "round {round}: the emptied pages"
            );
            assert_eq!(
                side_by_side.take_dirty(),
                one_by_one.take_dirty(),
                "round {round}: the dirty pages"
            );
        }
    }

    #[test]
    fn replay_keeps_the_newest_version_of_each_block_in_any_order() {
        let (a, b, z) = (extent(1, 8), extent(2, 4), Target::Zero { slot: 9 });
        let writes = [(0u64, 8u32, 5u64, data(&a)), (2, 4, 7, data(&b)), (1, 2, 6, z.clone())];
        let mut results = Vec::new();
        // Every order of the three writes gives the same map.
        for order in [[0, 1, 2], [2, 1, 0], [1, 0, 2], [2, 0, 1]] {
            let mut map = Map::default();
            for i in order {
                let (lba, blocks, version, target) = &writes[i];
                map.insert(*lba, *blocks, *version, target, Rule::IfNotNewer);
            }
            results.push(ranges(&map));
        }
        assert!(results.windows(2).all(|w| w[0] == w[1]), "{results:?}");
        assert_eq!(
            results[0],
            [(0, 1, 5, 1, 0), (1, 1, 6, 9, 0), (2, 4, 7, 2, 0), (6, 2, 5, 1, 6)]
        );
    }

    #[test]
    fn a_relocation_takes_only_what_still_points_at_the_copied_record() {
        let mut map = Map::default();
        let (old, newer, copy) = (extent(1, 8), extent(2, 2), extent(3, 8));
        map.insert(0, 8, 4, &data(&old), Rule::Always);
        // A write lands on blocks 3-4 after garbage collection read blocks 0-8.
        map.insert(3, 2, 9, &data(&newer), Rule::Always);
        let deltas = map.insert(
            0,
            8,
            4,
            &data(&copy),
            Rule::IfStill {
                target: &data(&old),
                version: 4,
            },
        );
        assert_eq!(
            ranges(&map),
            [(0, 3, 4, 3, 0), (3, 2, 9, 2, 0), (5, 3, 4, 3, 5)],
            "the newer write survives"
        );
        assert_eq!(net(&deltas), BTreeMap::from([(1, -6), (3, 6)]));
        // Nothing points at the old record any more: a second relocation is a no-op.
        assert!(map
            .insert(
                0,
                8,
                4,
                &data(&copy),
                Rule::IfStill {
                    target: &data(&old),
                    version: 4
                }
            )
            .is_empty());
        // Relocations never fill gaps.
        let mut map = Map::default();
        assert!(map
            .insert(
                0,
                4,
                1,
                &data(&copy),
                Rule::IfStill {
                    target: &data(&old),
                    version: 1
                }
            )
            .is_empty());
        assert!(map.is_empty());
    }
}
