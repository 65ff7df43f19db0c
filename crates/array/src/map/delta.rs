//! Map page deltas: a page written as the keys changed since its image.
//!
//! Under uniform random overwrites every page changes between two
//! checkpoints, but only a few of its keys do: 26 of 512 on the default
//! array, where writing every changed page whole cost 5.2% of the client
//! bytes (PERFORMANCE.md, "What a checkpoint writes, by part"). A
//! checkpoint may write such a page as a delta instead: the keys changed
//! since the page's image (its base) and the entries that map them now.
//! The page is then its base with those keys as the delta has them
//! (`Page::overlay`). A delta holds every change since the base, not
//! since the last delta, so a page is never more than two images (one
//! more read when it is loaded); so each delta is larger than the last,
//! and a page is written whole again once its deltas since the base
//! would have held more keys than it has entries. That balances the two
//! costs whatever the rate of change: with c keys changed a checkpoint
//! and n entries, about sqrt(2n/c) deltas between whole images, each
//! page costing about sqrt(2nc) entries a checkpoint instead of n (26
//! keys of 512 on the default array: ~150 instead of 512; 3 keys, as a
//! window 1/8 of that leaves: ~55).
//!
//! A page in memory keeps what it knows of its base (`Page::since_base`,
//! a `Since`): the keys changed since it, marked by every change (the
//! keys it changed, not those it covered and left: `Pieces::take`), and
//! the keys its deltas since it held; set from the delta when the page
//! is loaded, cleared when a checkpoint takes the page whole (and given
//! back if that checkpoint fails). `None` when unknown (a page new in
//! memory, whose base, if any, is of a page since emptied) or not kept
//! (a page of fewer entries than a delta is worth, as its base has it):
//! such a page is written whole.
//!
//! ```text
//!  delta image: 0 page u64 | 8 keys changed, a bit each [64] (key k: bit k % 64 of word k / 64, little-endian)
//!               72 keys the deltas since the base held, this one's included u32 | 76 reserved u32 (0)
//!               80 a page image (FORMAT.md, "Map pages") of the entries in those keys, cut to them;
//!                  nothing if they map no key (all trimmed)
//! ```

use super::{Entry, Page};
use crate::format::{FormatError, Geometry, DELTA_HEADER_BYTES};
use crate::limits::MAP_PAGE_BLOCKS;

/// A page's keys, a bit each.
pub(crate) type Keys = [u64; (MAP_PAGE_BLOCKS / 64) as usize];

/// No key.
pub(super) const NO_KEYS: Keys = [0; (MAP_PAGE_BLOCKS / 64) as usize];

/// What a page knows of its base image: the keys changed since it, and
/// the keys the deltas written over it since held (each delta's count).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Since {
    pub keys: Keys,
    pub written: u32,
}

impl Since {
    /// Whether a page of `entries` entries (enough to keep a `Since`) is
    /// better written as a delta than whole: its deltas since the base,
    /// this one included, would hold at most as many keys as it has
    /// entries.
    pub(super) fn worth_a_delta(&self, entries: usize) -> bool {
        u64::from(self.written) + u64::from(count(&self.keys)) <= entries as u64
    }
}

/// Marks keys [lo, hi).
pub(super) fn mark(keys: &mut Keys, lo: u16, hi: u16) {
    for k in lo..hi {
        keys[usize::from(k / 64)] |= 1 << (k % 64);
    }
}

/// Keys marked.
pub(super) fn count(keys: &Keys) -> u32 {
    keys.iter().map(|w| w.count_ones()).sum()
}

fn is_marked(keys: &Keys, k: u16) -> bool {
    keys[usize::from(k / 64)] & (1 << (k % 64)) != 0
}

/// The keys of [from, to) cut where they go from marked to not or back:
/// (start, end, marked) each.
fn runs(keys: &Keys, from: u16, to: u16) -> impl Iterator<Item = (u16, u16, bool)> + '_ {
    let mut at = from;
    std::iter::from_fn(move || {
        if at >= to {
            return None;
        }
        let marked = is_marked(keys, at);
        let start = at;
        while at < to && is_marked(keys, at) == marked {
            at += 1;
        }
        Some((start, at, marked))
    })
}

impl Page {
    /// Its entries cut to the keys `keys` marks (`marked`), or to those
    /// it does not, in order.
    fn entries_cut_to(&self, keys: &Keys, marked: bool) -> Vec<Entry> {
        let mut cut = Vec::new();
        for e in self.entries.iter() {
            let pieces = runs(keys, e.start, e.end()).filter(|&(_, _, m)| m == marked);
            cut.extend(pieces.map(|(start, end, _)| e.cut(start, end)));
        }
        cut
    }

    /// Marks keys [lo, hi) changed since the base, if those are known.
    pub(super) fn mark_changed(&mut self, lo: u16, hi: u16) {
        if let Some(since) = &mut self.since_base {
            mark(&mut since.keys, lo, hi);
        }
    }

    /// The delta image of keys `since.keys` of page `p` as they are now
    /// (see the module's notes), appended to `out`.
    pub(super) fn encode_delta(&self, p: u64, since: &Since, out: &mut Vec<u8>) {
        let keys = &since.keys;
        out.extend_from_slice(&p.to_le_bytes());
        for word in keys {
            out.extend_from_slice(&word.to_le_bytes());
        }
        out.extend_from_slice(&since.written.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        let cut = self.entries_cut_to(keys, true);
        if !cut.is_empty() {
            self.encode_entries(p, &cut, out);
        }
    }

    /// This page (a base) with keys `since.keys` as `delta` (its entries,
    /// all in those keys) maps them; an error if that leaves it empty.
    pub(super) fn overlay(mut self, since: Since, delta: Option<Page>) -> Result<Page, FormatError> {
        let mut entries = self.entries_cut_to(&since.keys, false);
        if let Some(delta) = delta {
            let shift = u32::try_from(self.words.len()).expect("a page's arena is small");
            self.words.extend_from_slice(&delta.words);
            for mut e in delta.entries.iter() {
                if e.arena_words() > 0 {
                    e.words += shift;
                }
                entries.push(e);
            }
        }
        if entries.is_empty() {
            return Err(FormatError::Field {
                what: "map page delta",
                field: "entries",
                value: 0,
            });
        }
        entries.sort_unstable_by_key(|e| e.start);
        self.set_referred(entries.iter().map(Entry::arena_words).sum());
        self.entries = super::Entries::from_slice(&entries);
        self.compact();
        self.since_base = Some(Box::new(since));
        Ok(self)
    }
}

/// A delta image (see the module's notes), every field checked: its
/// page, its keys (at least one, and no more than its deltas held), the
/// page image of its entries (as `Page::decode` checks one), each entry
/// in those keys.
pub(super) fn decode_delta(image: &[u8], geometry: &Geometry) -> Result<(u64, Since, Option<Page>), FormatError> {
    let field = |field, value: u64| FormatError::Field {
        what: "map page delta",
        field,
        value,
    };
    if image.len() < DELTA_HEADER_BYTES {
        return Err(field("length", image.len() as u64));
    }
    let p = u64::from_le_bytes(image[..8].try_into().expect("8 bytes"));
    let mut keys = NO_KEYS;
    for (i, word) in keys.iter_mut().enumerate() {
        *word = u64::from_le_bytes(image[8 + 8 * i..16 + 8 * i].try_into().expect("8 bytes"));
    }
    if count(&keys) == 0 {
        return Err(field("keys", 0));
    }
    let word = |at: usize| u32::from_le_bytes(image[at..at + 4].try_into().expect("4 bytes"));
    let since = Since {
        keys,
        written: word(72),
    };
    if since.written < count(&keys) || word(76) != 0 {
        return Err(field("written", u64::from(since.written)));
    }
    if image.len() == DELTA_HEADER_BYTES {
        return Ok((p, since, None));
    }
    let (q, page) = Page::decode(&image[DELTA_HEADER_BYTES..], geometry)?;
    if q != p {
        return Err(field("page", q));
    }
    if let Some(e) = page
        .entries
        .iter()
        .find(|e| runs(&keys, e.start, e.end()).any(|(_, _, m)| !m))
    {
        return Err(field("entry_keys", u64::from(e.start)));
    }
    Ok((p, since, Some(page)))
}

#[cfg(test)]
mod tests {
    use super::super::{Map, Rule, Target};
    use super::*;
    use crate::format::Extent;
    use rand::{Rng, SeedableRng};
    use std::collections::BTreeSet;
    use std::sync::Arc;
    use tessera_checksum::{Algorithm, Digest};

    fn geometry() -> Geometry {
        super::super::tests::image_geometry(Algorithm::Crc32c)
    }

    /// A write of `blocks` blocks at `lba`, of a random record (raw with
    /// CRCs, or compressed), or zeros.
    fn write(map: &mut Map, rng: &mut rand::rngs::StdRng, lba: u64, blocks: u32, version: u64) {
        let target = record(rng, blocks);
        map.insert(lba, blocks, version, &target, Rule::Always);
    }

    /// A random record of `blocks` blocks (raw with CRCs, or compressed),
    /// or zeros.
    fn record(rng: &mut rand::rngs::StdRng, blocks: u32) -> Target {
        if rng.gen_ratio(1, 10) {
            Target::Zero {
                slot: rng.gen_range(0..1000),
            }
        } else {
            let raw = rng.gen_bool(0.8);
            let crcs: crate::format::BlockCrcs = match raw {
                true => (0..blocks).map(|_| rng.gen()).collect(),
                false => crate::format::BlockCrcs::new(),
            };
            let digest = match crcs.as_slice() {
                [crc] => Digest::from_bytes(&crc.to_be_bytes()),
                _ => Digest::from_bytes(&rng.gen::<u32>().to_be_bytes()),
            };
            let extent = Arc::new(Extent {
                slot: rng.gen_range(0..1000),
                offset: rng.gen_range(0..200u32) * 4096,
                stored_bytes: if raw { blocks * 4096 } else { 4096 },
                blocks,
                codec: (!raw).then_some(tessera_compress::Codec::Lz4),
                digest,
                block_crcs: crcs,
            });
            Target::Data { extent, skip: 0 }
        }
    }

    /// A change that may leave some of the entries it covers as they are:
    /// a replay of an older write (which keeps the newer ones), or a
    /// relocation of what maps `lba` now, over a range that may pass it
    /// (which keeps what is not that record).
    fn keep_some(map: &mut Map, rng: &mut rand::rngs::StdRng, lba: u64, blocks: u32, version: u64) {
        let target = record(rng, blocks);
        if rng.gen_bool(0.5) {
            map.insert(lba, blocks, rng.gen_range(1..version), &target, Rule::IfNotNewer);
            return;
        }
        if let Some((_, now)) = map.overlapping(lba, lba + 1).next() {
            let rule = Rule::IfStill {
                target: &now.target,
                version: now.version,
            };
            map.insert(lba, blocks, now.version, &target, rule);
        }
    }

    /// Each mapping of page `p` as text: keys, version, where, what.
    fn described(map: &Map, p: u64) -> Vec<String> {
        let base = p * MAP_PAGE_BLOCKS;
        map.overlapping(base, base + MAP_PAGE_BLOCKS)
            .map(|m| format!("{m:?}"))
            .collect()
    }

    /// Pages written at random, taken whole (their base), changed at
    /// random again (writes of 1-16 blocks, zeros, replays and
    /// relocations that keep some of what they cover, a volume's range
    /// removed): each page's base with its delta over it is the page as
    /// it is now, and keeps the keys changed; a page taken whole again
    /// has none changed.
    #[test]
    fn a_page_is_its_base_with_its_delta_over_it() {
        let g = geometry();
        for seed in 0..20u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut map = Map::default();
            let pages = 4u64;
            let mut version = 1;
            for _ in 0..3000 {
                let lba = rng.gen_range(0..pages * MAP_PAGE_BLOCKS);
                let room = (MAP_PAGE_BLOCKS - lba % MAP_PAGE_BLOCKS) as u32;
                let blocks = if rng.gen_ratio(1, 8) { rng.gen_range(1..=16) } else { 1 };
                write(&mut map, &mut rng, lba, blocks.min(room), version);
                version += 1;
            }
            let taken = map.take_dirty();
            assert!(
                map.begin_snapshot(&taken, &|_| false).is_empty(),
                "no page has a base yet"
            );
            let mut bases = std::collections::BTreeMap::new();
            for &p in &taken {
                let mut image = Vec::new();
                assert!(map.snapshot_image(p, &mut image));
                bases.insert(p, image);
            }
            map.end_snapshot();
            let changes = rng.gen_range(1..200);
            for _ in 0..changes {
                let lba = rng.gen_range(0..pages * MAP_PAGE_BLOCKS);
                let room = (MAP_PAGE_BLOCKS - lba % MAP_PAGE_BLOCKS) as u32;
                let blocks = rng.gen_range(1..=16).min(room);
                match rng.gen_ratio(1, 3) {
                    true => keep_some(&mut map, &mut rng, lba, blocks, version),
                    false => write(&mut map, &mut rng, lba, blocks, version),
                }
                version += 1;
            }
            if seed % 4 == 0 {
                // Keys removed, as a deleted volume's are.
                let lba = rng.gen_range(0..pages * MAP_PAGE_BLOCKS - 40);
                map.remove_from(lba, lba + 40);
            }
            for (&p, base) in &bases {
                let Some(page) = map.pages.get(&p) else { continue };
                let since = Since {
                    written: rng.gen_range(600..700),
                    ..**page.since_base.as_ref().expect("a page taken whole knows its changes")
                };
                let keys = since.keys;
                let mut delta = Vec::new();
                page.encode_delta(p, &since, &mut delta);
                if count(&keys) == 0 {
                    continue;
                }
                let loaded = Map::decode_with_delta(base, &delta, &g).unwrap();
                let mut alone = Map::default();
                alone.pages.insert(p, loaded.body);
                // Entry for entry: the slot table counts the pieces.
                let (read, held) = (described(&alone, p), described(&map, p));
                let differ = read.iter().zip(&held).position(|(a, b)| a != b);
                assert!(
                    read.len() == held.len() && differ.is_none(),
                    "seed {seed} page {p}: read back {} entries, held {}; the first that differ: {:?}",
                    read.len(),
                    held.len(),
                    differ.map(|i| (&read[i], &held[i]))
                );
                assert_eq!(alone.pages[&p].since_base.as_deref(), Some(&since));
                // The delta holds no more than the keys changed.
                let (_, _, over) = decode_delta(&delta, &g).unwrap();
                let held = over.map_or(0, |o| o.entries.iter().map(|e| u32::from(e.blocks)).sum::<u32>());
                assert!(held <= count(&keys), "seed {seed} page {p}");
            }
        }
    }

    /// A checkpoint takes a page of many entries with few keys changed as
    /// a delta, and the others whole, until the page's deltas since its
    /// base would hold more keys than it has entries; one that fails
    /// gives each page what it knew of its base back, with the keys
    /// changed since.
    #[test]
    fn a_snapshot_takes_deltas_where_worth_it_and_gives_back_what_it_took() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut map = Map::new(crate::limits::MAP_DELTA_ENTRIES_MIN);
        let since = |map: &Map, p: u64| map.pages[&p].since_base.as_deref().cloned();
        // Page 0: every key its own write; page 1: one long write.
        for k in 0..MAP_PAGE_BLOCKS {
            write(&mut map, &mut rng, k, 1, 1 + k);
        }
        map.insert(MAP_PAGE_BLOCKS, 16, 600, &Target::Zero { slot: 3 }, Rule::Always);
        let taken = map.take_dirty();
        map.begin_snapshot(&taken, &|_| false);
        map.end_snapshot();
        // As a durable checkpoint leaves them: named by the directory.
        let held = taken
            .iter()
            .map(|&p| (p, super::super::tests::image_of(&map, p)))
            .collect();
        super::super::tests::publish(&mut map, &Default::default(), &held, &taken);
        let mut version = 1000;
        let mut change = |map: &mut Map, keys: &mut Keys, range: std::ops::Range<u64>| {
            for k in range {
                write(map, &mut rng, k, 1, version);
                version += 1;
                let key = (k % MAP_PAGE_BLOCKS) as u16;
                mark(keys, key, key + 1);
            }
        };
        let mut keys = NO_KEYS;
        change(&mut map, &mut keys, 5..6);
        change(&mut map, &mut NO_KEYS.clone(), MAP_PAGE_BLOCKS + 2..MAP_PAGE_BLOCKS + 3);
        let taken = map.take_dirty();
        let deltas = map.begin_snapshot(&taken, &|_| false);
        assert_eq!(
            deltas,
            BTreeSet::from([0]),
            "page 0 a delta, page 1 (two entries) whole"
        );
        let mut image = Vec::new();
        assert!(map.snapshot_image(0, &mut image));
        let (p, taken_as, _) = decode_delta(&image, &geometry()).unwrap();
        assert_eq!((p, taken_as.clone()), (0, Since { keys, written: 1 }));
        assert!(map.snapshot_image(1, &mut Vec::new()));
        map.end_snapshot();
        // Page 1 has too few entries to keep what changed.
        assert!(map.pages[&1].since_base.is_none());
        assert_eq!(since(&map, 0), Some(taken_as.clone()), "a delta keeps its keys");

        // 299 keys more: a delta of 300 (301 held since the base).
        change(&mut map, &mut keys, 10..309);
        let taken = map.take_dirty();
        assert_eq!(map.begin_snapshot(&taken, &|_| false), BTreeSet::from([0]));
        assert_eq!(since(&map, 0), Some(Since { keys, written: 301 }));
        map.end_snapshot();
        // A change after the pages were taken, then the checkpoint fails:
        // the keys changed since the base are those before and since, the
        // deltas' keys what they were.
        change(&mut map, &mut keys, 400..401);
        map.give_back(taken.iter().copied());
        assert_eq!(since(&map, 0), Some(Since { keys, written: 1 }));
        // Taken again (302 held), then 10 keys more: 302 + 311 is more
        // than the page's 512 entries, so it is taken whole.
        let taken = map.take_dirty();
        assert_eq!(map.begin_snapshot(&taken, &|_| false), BTreeSet::from([0]));
        map.end_snapshot();
        change(&mut map, &mut keys, 450..460);
        let taken = map.take_dirty();
        assert!(map.begin_snapshot(&taken, &|_| false).is_empty());
        assert_eq!(since(&map, 0), Some(Since::default()));
        map.end_snapshot();
        change(&mut map, &mut keys, 301..302);
        map.give_back(taken.iter().copied());
        assert_eq!(since(&map, 0), Some(Since { keys, written: 302 }));
        assert!(map.take_dirty().contains(&0));
    }

    /// A delta whose entries leave its keys, that names no key, or that
    /// is of another page is refused; so is one that leaves its page empty.
    #[test]
    fn bad_deltas_are_refused() {
        let g = geometry();
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let mut map = Map::default();
        write(&mut map, &mut rng, 0, 4, 1);
        write(&mut map, &mut rng, 10, 1, 2);
        let mut base = Vec::new();
        assert!(map.encode_page(0, &mut base));
        let page = &map.pages[&0];
        let mut keys = NO_KEYS;
        mark(&mut keys, 0, 2);
        let since = |keys: Keys| Since { keys, written: 2 };
        let mut good = Vec::new();
        page.encode_delta(0, &since(keys), &mut good);
        assert!(Map::decode_with_delta(&base, &good, &g).is_ok());
        // An entry past its keys: key 2 unmarked.
        let mut wide = NO_KEYS;
        mark(&mut wide, 0, 4);
        let mut bad = Vec::new();
        page.encode_delta(0, &since(wide), &mut bad);
        bad[8..16].copy_from_slice(&keys[0].to_le_bytes());
        assert!(matches!(
            Map::decode_with_delta(&base, &bad, &g),
            Err(FormatError::Field {
                field: "entry_keys",
                ..
            })
        ));
        let mut none = good.clone();
        none[8..72].fill(0);
        assert!(Map::decode_with_delta(&base, &none, &g).is_err());
        // Fewer keys held by the deltas than this one holds; a reserved
        // field set.
        for at in [72, 76] {
            let mut bad = good.clone();
            bad[at..at + 4].copy_from_slice(&[1, 0, 0, 0]);
            assert!(matches!(
                Map::decode_with_delta(&base, &bad, &g),
                Err(FormatError::Field { field: "written", .. })
            ));
        }
        let mut other = good.clone();
        other[0] = 1;
        assert!(Map::decode_with_delta(&base, &other, &g).is_err());
        assert!(Map::decode_with_delta(&base, &good[..40], &g).is_err());
        // Every key of both entries trimmed: nothing left.
        let mut all = NO_KEYS;
        mark(&mut all, 0, 11);
        let mut empty = Vec::new();
        empty.extend_from_slice(&0u64.to_le_bytes());
        all.iter().for_each(|w| empty.extend_from_slice(&w.to_le_bytes()));
        empty.extend_from_slice(&[11, 0, 0, 0, 0, 0, 0, 0]);
        assert!(matches!(
            Map::decode_with_delta(&base, &empty, &g),
            Err(FormatError::Field { field: "entries", .. })
        ));
    }
}
