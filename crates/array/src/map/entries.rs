//! A page's entries, packed: each field of an [`Entry`] kept in as few
//! bits as the page's own values need.
//!
//! An `Entry` is 40 bytes so that every shape of record fits it; a page
//! of randomly written raw blocks needs far less. Every entry of a page
//! has the same layout: a column per field, each with a base, a shift
//! and a width in bits, the entry `stride` whole bytes. A field is kept
//! as `(value - base) >> shift` in `width` bits; a field every entry
//! shares takes no bits at all.
//!
//! ```text
//!  a page of 512 random raw blocks (CRC32C), 1 M blocks written:
//!  start 9 bits | version - base 22 | slot 15 | offset >> 12 8 | CRC 32
//!  = 86 bits, a stride of 11 bytes (40 unpacked, and the CRC in the
//!  page's arena); blocks, stored bytes, codec, skip... are the same in
//!  every entry and take none
//! ```
//!
//! A page of fewer than `OWN_LAYOUT_ENTRIES_MIN` entries in memory
//! takes no table of its own: it shares `WIDE` (every field as wide as
//! its type, 38 bytes an entry), since a table (208 bytes) would cost
//! more than packing saves on so few.
//!
//! Entries are read one at a time by index, so a search stays a binary
//! search. Replacing a run of entries moves the bytes after it, as a
//! `Vec` would; a new entry that does not fit the layout (a version past
//! the headroom, a field no entry had before) repacks the page with a
//! layout that fits them all: O(page), and rare, since the columns that
//! grow (version, slot, offset, words) are given twice the range their
//! values span.

use super::Entry;
use crate::limits::MAP_PAGE_BLOCKS;

const COLUMNS: usize = 13;
/// Columns read on their own (the order of `FIELDS`).
const VERSION: usize = 0;
pub(super) const SLOT: usize = 1;
pub(super) const OFFSET: usize = 2;
pub(super) const STORED_BYTES: usize = 3;
pub(super) const WORDS: usize = 4;
pub(super) const START: usize = 5;
pub(super) const BLOCKS: usize = 6;
pub(super) const SKIP: usize = 8;
/// Read and written 16 bytes at a time: a field of at most 64 bits that
/// starts at any bit of a byte fits.
const PAD: usize = 16;

/// One field's place in a packed entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Column {
    base: u64,
    shift: u8,
    width: u8,
    /// Bit offset in the entry.
    at: u16,
}

impl Column {
    /// This field of an entry whose bits are `row` (from its first byte).
    fn unpack(&self, row: u128) -> u64 {
        match self.width {
            0 => self.base,
            width => self.base + (((row >> self.at) as u64 & low_bits(width)) << self.shift),
        }
    }

    fn fits(&self, value: u64) -> bool {
        let Some(d) = value.checked_sub(self.base) else {
            return false;
        };
        d & low_bits(self.shift) == 0 && (d >> self.shift) <= low_bits(self.width)
    }
}

/// A mask of the low `n` bits (n <= 64).
fn low_bits(n: u8) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

fn bits(x: u64) -> u8 {
    (64 - x.leading_zeros()) as u8
}

/// How a column's layout is chosen from the values it must hold.
#[derive(Clone, Copy)]
enum Fit {
    /// From the smallest value, exactly as wide as the values span.
    Exact,
    /// From the smallest value, twice the span: versions only grow.
    Rising,
    /// From zero, twice the largest value: slots, offsets, arena words.
    FromZero,
    /// A key in the page: from zero, as wide as the page's last key.
    Key,
}

use crate::format::{PAGE_IMAGE_COLUMNS_BYTES as IMAGE_COLUMNS_BYTES, PAGE_IMAGE_ENTRY_BYTES};
// An image's column table: a base u64, a shift u8 and a width u8 for
// each field.
const _: () = assert!(IMAGE_COLUMNS_BYTES == COLUMNS * 10);

/// An entry's field as a column: its name (in errors), the bits of its
/// type, how its layout is chosen.
struct Field {
    name: &'static str,
    bits: u8,
    fit: Fit,
}

/// Entries from which a page in memory has a layout of its own: its
/// table takes 208 bytes (13 columns of 16), which packing saves on
/// about eight entries (a random raw block: 11 bytes packed, 38 wide).
const OWN_LAYOUT_ENTRIES_MIN: usize = 8;

/// Every field as wide as its type, from zero: the layout of a page of
/// fewer than `OWN_LAYOUT_ENTRIES_MIN` entries, shared by all of them.
const WIDE: [Column; COLUMNS] = {
    let mut columns = [Column {
        base: 0,
        shift: 0,
        width: 0,
        at: 0,
    }; COLUMNS];
    let (mut k, mut at) = (0, 0u16);
    while k < COLUMNS {
        columns[k].width = FIELDS[k].bits;
        columns[k].at = at;
        at += FIELDS[k].bits as u16;
        k += 1;
    }
    columns
};
const WIDE_STRIDE: usize = {
    let last = &WIDE[COLUMNS - 1];
    (last.at as usize + last.width as usize).div_ceil(8)
};

/// The fields in column order (as `fields` and `entry` take them).
#[rustfmt::skip]
const FIELDS: [Field; COLUMNS] = [
    Field { name: "version", bits: 64, fit: Fit::Rising },
    Field { name: "slot", bits: 64, fit: Fit::FromZero },
    Field { name: "offset", bits: 32, fit: Fit::FromZero },
    Field { name: "stored_bytes", bits: 32, fit: Fit::Exact },
    Field { name: "words", bits: 32, fit: Fit::FromZero },
    Field { name: "start", bits: 16, fit: Fit::Key },
    Field { name: "blocks", bits: 16, fit: Fit::Exact },
    Field { name: "record_blocks", bits: 8, fit: Fit::Exact },
    Field { name: "skip", bits: 8, fit: Fit::Exact },
    Field { name: "crcs", bits: 8, fit: Fit::Exact },
    Field { name: "codec", bits: 8, fit: Fit::Exact },
    Field { name: "flags", bits: 8, fit: Fit::Exact },
    Field { name: "digest_bytes", bits: 8, fit: Fit::Exact },
];

// The most bytes a packed entry takes in an image: every field as wide
// as its type (38).
const _: () = {
    let mut sum = 0;
    let mut k = 0;
    while k < COLUMNS {
        sum += FIELDS[k].bits as usize;
        k += 1;
    }
    assert!(sum.div_ceil(8) <= PAGE_IMAGE_ENTRY_BYTES);
};

fn fields(e: &Entry) -> [u64; COLUMNS] {
    [
        e.version,
        e.slot,
        u64::from(e.offset),
        u64::from(e.stored_bytes),
        u64::from(e.words),
        u64::from(e.start),
        u64::from(e.blocks),
        u64::from(e.record_blocks),
        u64::from(e.skip),
        u64::from(e.crcs),
        u64::from(e.codec),
        u64::from(e.flags),
        u64::from(e.digest_bytes),
    ]
}

fn entry(f: [u64; COLUMNS]) -> Entry {
    // Every value was an entry's field of that type when it was packed.
    Entry {
        version: f[0],
        slot: f[1],
        offset: f[2] as u32,
        stored_bytes: f[3] as u32,
        words: f[4] as u32,
        start: f[5] as u16,
        blocks: f[6] as u16,
        record_blocks: f[7] as u8,
        skip: f[8] as u8,
        crcs: f[9] as u8,
        codec: f[10] as u8,
        flags: f[11] as u8,
        digest_bytes: f[12] as u8,
    }
}

/// The entries of a page, in order, packed.
#[derive(Default)]
pub(super) struct Entries {
    /// The page's own layout; `None`: every field as wide as its type
    /// (`WIDE`), which a page of few entries takes (its own table would
    /// cost more than it saves).
    own: Option<Box<[Column; COLUMNS]>>,
    /// Bytes an entry takes (0 while the layout is unset).
    stride: usize,
    /// `len() * stride` bytes of entries, then `PAD` zero bytes (once the
    /// page has held an entry): the count of entries is not kept beside
    /// them (a page in memory is 96 bytes, not 112, so the many pages of a
    /// thinly written map take a smaller allocation each).
    bytes: Vec<u8>,
}

impl Entries {
    /// `entries` laid out as memory holds them (room to grow).
    pub(super) fn from_slice(entries: &[Entry]) -> Entries {
        let mut packed = Entries::default();
        packed.repack(entries);
        packed
    }

    /// `entries` packed as tightly as their values allow, with no room
    /// to grow: an image's layout.
    pub(super) fn exact(entries: &[Entry]) -> Entries {
        let mut packed = Entries::default();
        packed.pack(entries, false);
        packed
    }

    /// The image's part (FORMAT.md, "Map pages"): the column table, then
    /// the packed entries.
    pub(super) fn write_image(&self, out: &mut Vec<u8>) {
        for c in self.columns() {
            out.extend_from_slice(&c.base.to_le_bytes());
            out.extend_from_slice(&[c.shift, c.width]);
        }
        out.extend_from_slice(&self.bytes[..self.len() * self.stride]);
    }

    /// The least and the most each field can be as the layout bounds it:
    /// `base`, and `base` plus the widest value its bits hold, or the
    /// field type's most where that is more (`read_image` refused any
    /// entry past it). Whatever the entries hold, they hold no less and
    /// no more.
    pub(super) fn bounds(&self) -> (Entry, Entry) {
        let mut least = [0u64; COLUMNS];
        let mut most = [0u64; COLUMNS];
        for (k, c) in self.columns().iter().enumerate() {
            let d = low_bits(c.width);
            let top = d
                .checked_shl(u32::from(c.shift))
                .filter(|v| v >> c.shift == d)
                .and_then(|v| v.checked_add(c.base))
                .unwrap_or(u64::MAX);
            (least[k], most[k]) = (c.base, top.min(low_bits(FIELDS[k].bits)));
        }
        (entry(least), entry(most))
    }

    /// Each entry's slot, from the slot column alone.
    pub(super) fn slots(&self) -> ColumnValues<'_> {
        self.column(SLOT)
    }

    /// Column `k`'s value (`START`, `SLOT`...) of each entry in turn.
    pub(super) fn column(&self, k: usize) -> ColumnValues<'_> {
        let c = self.columns()[k];
        ColumnValues {
            entries: self,
            byte: usize::from(c.at) / 8,
            bit: u32::from(c.at % 8),
            mask: low_bits(c.width),
            narrow: u32::from(c.at % 8) + u32::from(c.width) <= 64,
            c,
        }
    }

    /// Whether every entry's version is at least `floor`: at once where
    /// the version column's base is (no value is below its base), else
    /// from the column.
    pub(super) fn versions_at_least(&self, floor: u64) -> bool {
        self.columns()[VERSION].base >= floor || self.column(VERSION).all(|version| version >= floor)
    }

    /// `count` entries from an image's column table and packed entries
    /// at the start of `image`, as memory holds them, and the bytes they
    /// took; the field at fault (and its value) if the table or a value
    /// does not fit an entry. (What the values mean is the caller's to
    /// check.)
    pub(super) fn read_image(image: &[u8], count: usize) -> Result<(Entries, usize), (&'static str, u64)> {
        if image.len() < IMAGE_COLUMNS_BYTES {
            return Err(("length", image.len() as u64));
        }
        let mut columns = [Column::default(); COLUMNS];
        let mut at = 0u16;
        for (k, c) in columns.iter_mut().enumerate() {
            let b = &image[10 * k..10 * k + 10];
            let (base, shift, width) = (u64::from_le_bytes(b[..8].try_into().expect("8 bytes")), b[8], b[9]);
            if shift >= 64 || width > FIELDS[k].bits {
                return Err(("column", k as u64));
            }
            *c = Column { base, shift, width, at };
            at += u16::from(width);
        }
        let stride = usize::from(at).div_ceil(8).max(1);
        let body = count * stride;
        if image.len() < IMAGE_COLUMNS_BYTES + body {
            return Err(("length", image.len() as u64));
        }
        let mut bytes = Vec::with_capacity(body + PAD);
        bytes.extend_from_slice(&image[IMAGE_COLUMNS_BYTES..IMAGE_COLUMNS_BYTES + body]);
        bytes.resize(body + PAD, 0);
        let packed = Entries {
            own: Some(Box::new(columns)),
            stride,
            bytes,
        };
        // A field is `base + (d << shift)`, d below 2^width. Where even the
        // largest d gives a value of the field's type (a writer's exact
        // table, nearly always), no entry needs its value checked; else
        // each entry's is, before anything reads it.
        for (k, c) in columns.iter().enumerate() {
            let fits = |d: u64| {
                d.checked_shl(u32::from(c.shift))
                    .filter(|v| v >> c.shift == d)
                    .and_then(|v| v.checked_add(c.base))
                    .is_some_and(|v| bits(v) <= FIELDS[k].bits)
            };
            if fits(low_bits(c.width)) {
                continue;
            }
            let raw = Column {
                base: 0,
                shift: 0,
                ..*c
            };
            if let Some(d) = (0..count).map(|i| packed.read(i, &raw)).find(|&d| !fits(d)) {
                return Err((FIELDS[k].name, d));
            }
        }
        // A page of few entries shares the wide layout.
        let held = match count < OWN_LAYOUT_ENTRIES_MIN {
            true => Entries::from_slice(&packed.to_vec()),
            false => packed,
        };
        Ok((held, IMAGE_COLUMNS_BYTES + body))
    }

    pub(super) fn len(&self) -> usize {
        match self.stride {
            0 => 0,
            stride => self.bytes.len().saturating_sub(PAD) / stride,
        }
    }

    fn columns(&self) -> &[Column; COLUMNS] {
        layout(&self.own)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.bytes.len() <= PAD
    }

    /// Bytes held on the heap.
    pub(super) fn heap_bytes(&self) -> usize {
        self.bytes.capacity()
            + self
                .own
                .as_ref()
                .map_or(0, |_| std::mem::size_of::<[Column; COLUMNS]>())
    }

    /// Entry i's bytes (with what follows them) in one load: the whole
    /// entry where `stride <= PAD`.
    fn row(&self, i: usize) -> u128 {
        let at = i * self.stride;
        u128::from_le_bytes(self.bytes[at..at + PAD].try_into().expect("PAD bytes"))
    }

    fn read(&self, i: usize, c: &Column) -> u64 {
        if c.width == 0 {
            return c.base;
        }
        let bit = i * self.stride * 8 + usize::from(c.at);
        let at = bit / 8;
        let raw = u128::from_le_bytes(self.bytes[at..at + PAD].try_into().expect("PAD bytes"));
        let d = (raw >> (bit % 8)) as u64 & low_bits(c.width);
        c.base + (d << c.shift)
    }

    pub(super) fn get(&self, i: usize) -> Entry {
        assert!(
            (i + 1) * self.stride + PAD <= self.bytes.len(),
            "entry {i} of {}",
            self.len()
        );
        let mut f = [0u64; COLUMNS];
        if self.stride <= PAD {
            // The whole entry in one load (every entry starts on a byte,
            // and the bytes end in PAD of slack): each field a shift and
            // a mask of it, where `read` loads once per field.
            let raw = self.row(i);
            for (value, c) in f.iter_mut().zip(self.columns()) {
                *value = c.unpack(raw);
            }
        } else {
            for (value, c) in f.iter_mut().zip(self.columns()) {
                *value = self.read(i, c);
            }
        }
        entry(f)
    }

    pub(super) fn get_opt(&self, i: usize) -> Option<Entry> {
        (i < self.len()).then(|| self.get(i))
    }

    fn start(&self, i: usize) -> u16 {
        self.read(i, &self.columns()[START]) as u16
    }

    fn end(&self, i: usize) -> u16 {
        self.start(i) + self.read(i, &self.columns()[BLOCKS]) as u16
    }

    /// The index of the first entry whose start is not below `key`.
    pub(super) fn first_starting_at_or_after(&self, key: u16) -> usize {
        partition(self.len(), |i| self.start(i) < key)
    }

    /// The index of the first entry that starts after `key`.
    pub(super) fn first_starting_after(&self, key: u16) -> usize {
        partition(self.len(), |i| self.start(i) <= key)
    }

    /// The index of the first entry that ends after `key`.
    pub(super) fn first_ending_after(&self, key: u16) -> usize {
        partition(self.len(), |i| self.end(i) <= key)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = Entry> + '_ {
        // Every entry read in turn: the fields no entry varies (width 0)
        // are set once, and only the others are taken from each entry (a
        // page of random raw blocks varies 5 of the 13).
        let columns = self.columns();
        let constant: [u64; COLUMNS] = std::array::from_fn(|k| columns[k].base);
        let varying: Vec<(usize, Column)> = columns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.width > 0)
            .map(|(k, c)| (k, *c))
            .collect();
        let whole = self.stride <= PAD;
        (0..self.len()).map(move |i| {
            if !whole {
                return self.get(i);
            }
            let raw = self.row(i);
            let mut f = constant;
            for &(k, c) in &varying {
                f[k] = c.unpack(raw);
            }
            entry(f)
        })
    }

    pub(super) fn to_vec(&self) -> Vec<Entry> {
        self.iter().collect()
    }

    fn write(&mut self, i: usize, e: &Entry) {
        let from = i * self.stride;
        self.bytes[from..from + self.stride].fill(0);
        for (value, c) in fields(e).into_iter().zip(layout(&self.own)) {
            if c.width == 0 {
                continue;
            }
            let bit = from * 8 + usize::from(c.at);
            let at = bit / 8;
            let slot: &mut [u8; PAD] = (&mut self.bytes[at..at + PAD]).try_into().expect("PAD bytes");
            let d = u128::from((value - c.base) >> c.shift) << (bit % 8);
            *slot = (u128::from_le_bytes(*slot) | d).to_le_bytes();
        }
    }

    /// Replaces the entries in `range` with `with`, as `Vec::splice`.
    pub(super) fn splice(&mut self, range: std::ops::Range<usize>, with: &[Entry]) {
        let old = self.len();
        assert!(range.start <= range.end && range.end <= old);
        let len = old - range.len() + with.len();
        // A page that grows past a few entries gets a table of its own.
        let fits = self.stride > 0
            && (self.own.is_some() || len < OWN_LAYOUT_ENTRIES_MIN)
            && with
                .iter()
                .all(|e| fields(e).iter().zip(self.columns()).all(|(v, c)| c.fits(*v)));
        if !fits {
            let mut all = Vec::with_capacity(len);
            all.extend((0..range.start).map(|i| self.get(i)));
            all.extend_from_slice(with);
            all.extend((range.end..old).map(|i| self.get(i)));
            self.repack(&all);
            return;
        }
        let want = len * self.stride + PAD;
        if want > self.bytes.len() {
            if want > self.bytes.capacity() {
                // An eighth more, not double: pages are many and small.
                let more = (want - self.bytes.len()).max(self.bytes.capacity() / 8);
                self.bytes.reserve_exact(more);
            }
            self.bytes.resize(want, 0);
        }
        let tail = (range.end * self.stride)..(old * self.stride);
        self.bytes.copy_within(tail, (range.start + with.len()) * self.stride);
        for (k, e) in with.iter().enumerate() {
            self.write(range.start + k, e);
        }
        self.bytes[len * self.stride..].fill(0);
        self.bytes.truncate(len * self.stride + PAD);
        if self.bytes.capacity() > 2 * self.bytes.len() + 64 {
            self.bytes.shrink_to_fit();
        }
    }

    /// Lays the page out anew for `entries`, with room for the columns
    /// that grow.
    pub(super) fn repack(&mut self, entries: &[Entry]) {
        self.pack(entries, true);
    }

    /// Lays the page out for `entries` (every field of them fits), with
    /// the growing columns' `headroom` or exactly.
    fn pack(&mut self, entries: &[Entry], headroom: bool) {
        let mut low = [u64::MAX; COLUMNS];
        let mut high = [0u64; COLUMNS];
        let mut seen = [0u64; COLUMNS];
        for e in entries {
            for (k, v) in fields(e).into_iter().enumerate() {
                low[k] = low[k].min(v);
                high[k] = high[k].max(v);
            }
        }
        let fit = |k: usize| if headroom { FIELDS[k].fit } else { Fit::Exact };
        for e in entries {
            for (k, v) in fields(e).into_iter().enumerate() {
                let base = if matches!(fit(k), Fit::FromZero | Fit::Key) {
                    0
                } else {
                    low[k]
                };
                seen[k] |= v - base;
            }
        }
        let mut columns = [Column::default(); COLUMNS];
        let mut at = 0u16;
        for k in 0..COLUMNS {
            let base = match fit(k) {
                _ if entries.is_empty() => 0,
                Fit::FromZero | Fit::Key => 0,
                Fit::Exact | Fit::Rising => low[k],
            };
            let shift = match fit(k) {
                Fit::Key => 0,
                _ if seen[k] == 0 => 0,
                _ => seen[k].trailing_zeros() as u8,
            };
            let span = high[k].saturating_sub(base) >> shift;
            let width = match fit(k) {
                Fit::Exact => bits(span),
                Fit::Rising | Fit::FromZero => (bits(span) + 1).min(FIELDS[k].bits),
                Fit::Key => bits(MAP_PAGE_BLOCKS - 1).max(bits(span)),
            };
            columns[k] = Column { base, shift, width, at };
            at += u16::from(width);
        }
        if headroom && entries.len() < OWN_LAYOUT_ENTRIES_MIN {
            self.own = None;
            self.stride = WIDE_STRIDE;
        } else {
            self.own = Some(Box::new(columns));
            self.stride = usize::from(at).div_ceil(8).max(1);
        }
        self.bytes = vec![0; entries.len() * self.stride + PAD];
        for (i, e) in entries.iter().enumerate() {
            self.write(i, e);
        }
    }
}

/// One column of a page's entries (`Entries::column`). A field
/// within 64 bits of its entry's byte (all but a wide one that does not
/// start on a byte) is one 8-byte load, a shift and a mask an entry,
/// where `Entries::read` loads 16 bytes and shifts them as a `u128`; a
/// field every entry shares (width 0, mask 0) is its base.
pub(super) struct ColumnValues<'a> {
    entries: &'a Entries,
    c: Column,
    /// The field's first byte and bit in an entry.
    byte: usize,
    bit: u32,
    mask: u64,
    narrow: bool,
}

impl ColumnValues<'_> {
    /// Entry `i`'s value (`i` below the page's entries).
    #[inline(always)]
    pub(super) fn get(&self, i: usize) -> u64 {
        let e = self.entries;
        if !self.narrow {
            return e.read(i, &self.c);
        }
        // `PAD` bytes follow the last entry: 8 from any of an entry's
        // bytes are there.
        let at = i * e.stride + self.byte;
        let raw = u64::from_le_bytes(e.bytes[at..at + 8].try_into().expect("8 bytes"));
        self.c.base + (((raw >> self.bit) & self.mask) << self.c.shift)
    }

    /// Whether `f` holds of every entry's value, in order.
    #[inline(always)]
    pub(super) fn all(&self, mut f: impl FnMut(u64) -> bool) -> bool {
        (0..self.entries.len()).all(|i| f(self.get(i)))
    }

    /// The value every entry shares, if the layout gives the field no
    /// bits.
    pub(super) fn constant(&self) -> Option<u64> {
        (self.c.width == 0).then_some(self.c.base)
    }
}

/// The columns of a page whose own table is `own`.
fn layout(own: &Option<Box<[Column; COLUMNS]>>) -> &[Column; COLUMNS] {
    own.as_deref().unwrap_or(&WIDE)
}

/// The first index in [0, len) where `below` turns false (it is true for
/// a prefix), as `slice::partition_point`.
fn partition(len: usize, below: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, len);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if below(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(start: u16, version: u64, slot: u64, offset: u32, words: u32) -> Entry {
        Entry {
            version,
            slot,
            offset,
            stored_bytes: 4096,
            words,
            start,
            blocks: 1,
            record_blocks: 1,
            skip: 0,
            crcs: 1,
            codec: 0,
            flags: super::super::DIGEST_IS_CRC,
            digest_bytes: 4,
        }
    }

    fn same(a: &Entry, b: &Entry) -> bool {
        fields(a) == fields(b)
    }

    #[test]
    fn random_raw_blocks_pack_into_a_few_bytes_each() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let entries: Vec<Entry> = (0..512u16)
            .map(|i| {
                raw(
                    i,
                    1_000_000 + next() % 1_000_000,
                    next() % 16_000,
                    (next() % 128) as u32 * 4096,
                    // The block's CRC, held in the entry.
                    next() as u32,
                )
            })
            .collect();
        let packed = Entries::from_slice(&entries);
        // start 9 bits, version 21, slot 15, offset >> 12 8, CRC 32.
        assert!(packed.stride <= 11, "stride {}", packed.stride);
        assert!(Entries::exact(&entries).stride <= 11);
        for (i, e) in entries.iter().enumerate() {
            assert!(same(&packed.get(i), e), "entry {i}");
        }
        // Read in turn (constant fields set once), and from the image.
        assert_eq!(packed.iter().count(), entries.len());
        for (i, (got, e)) in packed.iter().zip(&entries).enumerate() {
            assert!(same(&got, e), "entry {i} read in turn");
        }
    }

    #[test]
    fn images_round_trip_and_refuse_values_past_their_types() {
        // Flags of 100 and 255: an exact column from 100, 8 bits wide, whose
        // largest code (100 + 255) is past a u8, so each value is checked.
        let mut entries: Vec<Entry> = (0..40u16).map(|i| raw(i, 7 + u64::from(i), 3, 0, 9)).collect();
        entries[3].flags = 100;
        entries[4].flags = 255;
        entries[5].version = u64::MAX;
        entries[6].slot = 0;
        let mut image = Vec::new();
        Entries::exact(&entries).write_image(&mut image);
        let (back, used) = Entries::read_image(&image, entries.len()).unwrap();
        assert_eq!(used, image.len());
        for (i, e) in entries.iter().enumerate() {
            assert!(same(&back.get(i), e), "entry {i}");
        }
        // A page of few entries is read back into the shared wide layout.
        let few = &entries[..OWN_LAYOUT_ENTRIES_MIN - 1];
        let mut small = Vec::new();
        Entries::exact(few).write_image(&mut small);
        let (back, _) = Entries::read_image(&small, few.len()).unwrap();
        assert!(back.own.is_none() && back.stride == WIDE_STRIDE);
        for (i, e) in few.iter().enumerate() {
            assert!(same(&back.get(i), e), "entry {i} of a small page");
        }
        // The same table with a flag's code raised past 255: refused.
        let flags_column = 11;
        let at: u16 = {
            let packed = Entries::exact(&entries);
            packed.columns()[flags_column].at
        };
        let stride = Entries::exact(&entries).stride;
        let mut bad = image.clone();
        let bit = 4 * stride * 8 + usize::from(at);
        for b in 0..8 {
            let k = bit + b;
            bad[IMAGE_COLUMNS_BYTES + k / 8] |= 1 << (k % 8);
        }
        assert_eq!(Entries::read_image(&bad, entries.len()).err(), Some(("flags", 255)));
        // A width past its field's type, a shift of 64, a short image.
        let mut wide = image.clone();
        wide[10 * flags_column + 9] = 9;
        assert!(Entries::read_image(&wide, entries.len()).is_err());
        let mut shifted = image.clone();
        shifted[10 * 2 + 8] = 64;
        assert!(Entries::read_image(&shifted, entries.len()).is_err());
        assert!(Entries::read_image(&image[..image.len() - 1], entries.len()).is_err());
    }

    #[test]
    fn a_misfit_repacks_and_every_entry_survives() {
        let mut entries: Vec<Entry> = (0..100u16)
            .map(|i| raw(i * 2, 10 + u64::from(i), 3, 0, u32::from(i)))
            .collect();
        let mut packed = Entries::from_slice(&entries);
        let stride = packed.stride;
        // Fits: the same shapes, a newer version within the headroom.
        let fits = raw(1, 150, 2, 0, 7);
        packed.splice(1..1, &[fits]);
        entries.insert(1, fits);
        assert_eq!(packed.stride, stride);
        // A zero entry, a huge version, a compressed record: repacked.
        let mut odd = raw(3, u64::MAX - 1, 1 << 40, 12_345, u32::MAX);
        odd.codec = 2;
        odd.crcs = 0;
        odd.flags = 0;
        odd.blocks = 1;
        packed.splice(2..4, &[odd]);
        entries.splice(2..4, [odd]);
        assert!(packed.stride > stride);
        packed.splice(10..30, &[]);
        entries.drain(10..30);
        assert_eq!(packed.len(), entries.len());
        for (i, e) in entries.iter().enumerate() {
            assert!(
                same(&packed.get(i), e),
                "entry {i}: {:?} against {:?}",
                packed.get(i),
                e
            );
        }
        assert_eq!(
            packed.first_starting_at_or_after(20),
            entries.partition_point(|e| e.start < 20)
        );
        assert_eq!(
            packed.first_ending_after(21),
            entries.partition_point(|e| e.end() <= 21)
        );
        // Wider than one load now: read in turn the slow way.
        assert!(packed.stride > PAD, "stride {}", packed.stride);
        for (i, (got, e)) in packed.iter().zip(&entries).enumerate() {
            assert!(same(&got, e), "entry {i} read in turn");
        }
        packed.splice(0..packed.len(), &[]);
        assert!(packed.is_empty());
    }
}
