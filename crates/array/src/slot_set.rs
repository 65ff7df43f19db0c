//! Per-slot state that costs memory for the slots an array uses, not for
//! its size (six 8 TiB members have 126 million slots):
//!
//! - [`SlotSet`], a set of slot numbers as a bitmap with a summary level:
//!   one bit per slot where an ordered set cost about 11 bytes each, and
//!   iteration in order that skips empty stretches 4,096 slots at a time.
//! - [`SlotPages`], a value per slot, in pages of `SLOT_PAGE` allocated
//!   when one of their slots is first changed (through `&mut self`).
//! - [`SlotState`], what a slot holds (here so that `error` can name it
//!   without importing the slot table).
//!
//! # Guarantees
//!
//! - `words[w]` bit b is set exactly when slot 64w+b is in the set, and
//!   `summary[w / 64]` bit w % 64 exactly when `words[w]` is not zero.
//! - `len` is the number of slots in the set.
//! - A slot whose page was never allocated holds `T::default()`.

use std::sync::OnceLock;

/// What a slot holds now (the slot table's `Slot::state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    Free,
    /// An open stripe is being filled in it.
    Open,
    /// A sealed stripe (being written, or on the members).
    Sealed,
    /// Empty, rewritable once the stripes that superseded it are synced.
    Draining,
    /// Holds part of the durable map checkpoint: rewritable once a newer
    /// checkpoint is durable.
    Checkpoint,
}

/// Slots per page of a [`SlotPages`].
pub const SLOT_PAGE: usize = 4096;

pub struct SlotPages<T> {
    count: u64,
    pages: Vec<OnceLock<Box<[T]>>>,
    /// Pages allocated: counted, so that `status` (under the index's
    /// lock, every second) does not walk 51,000 of them at 100 TiB.
    allocated: usize,
}

impl<T: Default> SlotPages<T> {
    pub fn new(count: u64) -> SlotPages<T> {
        SlotPages {
            count,
            pages: (0..(count as usize).div_ceil(SLOT_PAGE))
                .map(|_| OnceLock::new())
                .collect(),
            allocated: 0,
        }
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    fn page(&self, slot: u64) -> (&OnceLock<Box<[T]>>, usize) {
        assert!(slot < self.count, "slot {slot} of {}", self.count);
        (&self.pages[slot as usize / SLOT_PAGE], slot as usize % SLOT_PAGE)
    }

    fn new_page() -> Box<[T]> {
        let mut page: Box<[T]> = (0..SLOT_PAGE).map(|_| T::default()).collect();
        // A page of defaults that are all zero bytes comes from the
        // allocator untouched, its memory mapped by the first access: where
        // that is a read (whether a slot is free, before it is taken), the
        // kernel maps its zero page, and the write after faults again.
        // Writing each 4 KiB first makes it one fault: opening 745,642
        // used slots took 70 ms where it took 83 (docs/PERFORMANCE.md,
        // "One page fault a page").
        // (Only for values with nothing to drop: the default written over
        // is forgotten, not dropped.)
        if !std::mem::needs_drop::<T>() {
            let per_os_page = (4096 / std::mem::size_of::<T>().max(1)).max(1);
            for value in page.iter_mut().step_by(per_os_page) {
                // SAFETY: `value` is a valid, aligned, exclusive reference,
                // and what it holds needs no drop; the write is volatile
                // only so that the compiler keeps it.
                unsafe { std::ptr::write_volatile(value, T::default()) };
            }
        }
        page
    }

    /// Slot `slot`'s value, `None` while its page was never allocated.
    pub fn get(&self, slot: u64) -> Option<&T> {
        let (page, i) = self.page(slot);
        page.get().map(|page| &page[i])
    }

    pub fn get_mut(&mut self, slot: u64) -> &mut T {
        assert!(slot < self.count, "slot {slot} of {}", self.count);
        let page = &mut self.pages[slot as usize / SLOT_PAGE];
        if page.get().is_none() {
            page.get_or_init(Self::new_page);
            self.allocated += 1;
        }
        &mut page.get_mut().expect("allocated above")[slot as usize % SLOT_PAGE]
    }

    /// The slots of every allocated page, in order (every slot left out
    /// holds the default).
    pub fn iter(&self) -> impl Iterator<Item = (u64, &T)> {
        let count = self.count;
        self.pages
            .iter()
            .enumerate()
            .filter_map(|(p, page)| page.get().map(|page| (p, page)))
            .flat_map(move |(p, page)| {
                page.iter()
                    .enumerate()
                    .map(move |(i, value)| ((p * SLOT_PAGE + i) as u64, value))
                    .take_while(move |&(slot, _)| slot < count)
            })
    }

    /// The slots of every allocated page in `[start, end)`, in order.
    pub fn iter_range(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, &T)> {
        let end = end.min(self.count);
        let first = (start as usize / SLOT_PAGE).min(self.pages.len());
        let last = (end as usize).div_ceil(SLOT_PAGE).clamp(first, self.pages.len());
        self.pages[first..last]
            .iter()
            .enumerate()
            .filter_map(move |(p, page)| page.get().map(|page| (first + p, page)))
            .flat_map(move |(p, page)| {
                page.iter()
                    .enumerate()
                    .map(move |(i, value)| ((p * SLOT_PAGE + i) as u64, value))
                    .skip_while(move |&(slot, _)| slot < start)
                    .take_while(move |&(slot, _)| slot < end)
            })
    }

    #[cfg(test)]
    pub fn pages_allocated(&self) -> usize {
        self.allocated() as usize / SLOT_PAGE
    }

    /// Slots in the allocated pages.
    pub fn allocated(&self) -> u64 {
        (self.allocated * SLOT_PAGE) as u64
    }

    /// Whether the pages counted allocated are those allocated (walks
    /// every page: for the engine's check).
    pub fn check_allocated(&self) -> Result<(), String> {
        let walked = self.pages.iter().filter(|page| page.get().is_some()).count();
        match walked == self.allocated {
            true => Ok(()),
            false => Err(format!(
                "{walked} slot table pages allocated, {} counted",
                self.allocated
            )),
        }
    }
}

/// Set bits of `word`, lowest first.
fn bits(mut word: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (word != 0).then(|| {
            let bit = word.trailing_zeros() as usize;
            word &= word - 1;
            bit
        })
    })
}

#[derive(Clone, Debug)]
pub struct SlotSet {
    words: Vec<u64>,
    summary: Vec<u64>,
    len: usize,
}

impl SlotSet {
    /// No slot of `count`.
    pub fn empty(count: u64) -> SlotSet {
        let words = (count as usize).div_ceil(64);
        SlotSet {
            words: vec![0; words],
            summary: vec![0; words.div_ceil(64)],
            len: 0,
        }
    }

    /// Every slot of `count`.
    pub fn full(count: u64) -> SlotSet {
        let mut set = SlotSet::empty(count);
        let whole = count as usize / 64;
        set.words[..whole].fill(u64::MAX);
        if !count.is_multiple_of(64) {
            set.words[whole] = (1u64 << (count % 64)) - 1;
        }
        for (w, &word) in set.words.iter().enumerate() {
            if word != 0 {
                set.summary[w / 64] |= 1 << (w % 64);
            }
        }
        set.len = count as usize;
        set
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes of memory the set's bitmaps take.
    pub fn heap_bytes(&self) -> usize {
        (self.words.capacity() + self.summary.capacity()) * std::mem::size_of::<u64>()
    }

    pub fn contains(&self, slot: u64) -> bool {
        let (w, b) = (slot as usize / 64, slot % 64);
        self.words.get(w).is_some_and(|word| word & (1 << b) != 0)
    }

    /// Adds `slot`; whether it was not in the set.
    pub fn insert(&mut self, slot: u64) -> bool {
        let (w, b) = (slot as usize / 64, slot % 64);
        let word = &mut self.words[w];
        let added = *word & (1 << b) == 0;
        *word |= 1 << b;
        self.summary[w / 64] |= 1 << (w % 64);
        self.len += usize::from(added);
        added
    }

    /// Takes `slot` out; whether it was in the set.
    pub fn remove(&mut self, slot: u64) -> bool {
        let (w, b) = (slot as usize / 64, slot % 64);
        let word = &mut self.words[w];
        let removed = *word & (1 << b) != 0;
        *word &= !(1 << b);
        if *word == 0 {
            self.summary[w / 64] &= !(1 << (w % 64));
        }
        self.len -= usize::from(removed);
        removed
    }

    /// Takes slots [start, end) out; how many were in the set.
    pub fn remove_range(&mut self, start: u64, end: u64) -> usize {
        let mut removed = 0;
        let mut slot = start;
        while slot < end {
            let (w, b) = (slot as usize / 64, slot % 64);
            let bits = (end - slot).min(64 - b);
            let mask = if bits == 64 {
                u64::MAX
            } else {
                ((1u64 << bits) - 1) << b
            };
            let word = &mut self.words[w];
            removed += (*word & mask).count_ones() as usize;
            *word &= !mask;
            if *word == 0 {
                self.summary[w / 64] &= !(1 << (w % 64));
            }
            slot += bits;
        }
        self.len -= removed;
        removed
    }

    /// Takes slots [start, end) out (`start` a multiple of 64); those
    /// that were in the set, in order.
    pub fn take_range(&mut self, start: u64, end: u64) -> Vec<u64> {
        debug_assert!(start.is_multiple_of(64));
        let mut taken = Vec::new();
        for w in start as usize / 64..(end as usize).div_ceil(64) {
            let word = self.words[w];
            if word == 0 {
                continue;
            }
            let low = (w as u64) * 64;
            taken.extend(bits(word).map(|b| low + b as u64).filter(|&slot| slot < end));
        }
        for &slot in &taken {
            self.remove(slot);
        }
        taken
    }

    /// The set, leaving an empty one of the same size in its place.
    pub fn take(&mut self) -> SlotSet {
        let empty = SlotSet {
            words: vec![0; self.words.len()],
            summary: vec![0; self.summary.len()],
            len: 0,
        };
        std::mem::replace(self, empty)
    }

    /// The slots in the set, in order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.summary
            .iter()
            .enumerate()
            .flat_map(|(s, &summary)| bits(summary).map(move |b| s * 64 + b))
            .flat_map(move |w| bits(self.words[w]).map(move |b| (w * 64 + b) as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use std::collections::BTreeSet;

    /// The pages allocated are counted as they are allocated (once each,
    /// however often written), and the check walks them to agree.
    #[test]
    fn pages_allocated_are_counted() {
        let count = 5 * SLOT_PAGE as u64 + 100;
        let mut pages: SlotPages<u64> = SlotPages::new(count);
        assert_eq!((pages.allocated(), pages.check_allocated()), (0, Ok(())));
        for slot in [3, 4, 2 * SLOT_PAGE as u64 + 7, count - 1, 5] {
            *pages.get_mut(slot) += 1;
        }
        assert_eq!(pages.allocated(), 3 * SLOT_PAGE as u64);
        assert_eq!(pages.check_allocated(), Ok(()));
        pages.allocated += 1;
        assert_eq!(
            pages.check_allocated(),
            Err("3 slot table pages allocated, 4 counted".to_string())
        );
    }

    /// The slots of a range, walked in pieces that do not fall on page
    /// boundaries, are those of the whole walk: each once, in order, and
    /// none of a page never used.
    #[test]
    fn ranges_walked_in_pieces_are_the_whole_walk() {
        let count = 5 * SLOT_PAGE as u64 + 100;
        let mut pages: SlotPages<u64> = SlotPages::new(count);
        for slot in [3, 2 * SLOT_PAGE as u64 + 7, count - 1] {
            *pages.get_mut(slot) = slot + 1;
        }
        let whole: Vec<(u64, u64)> = pages.iter().map(|(slot, &v)| (slot, v)).collect();
        assert_eq!(whole.len(), 2 * SLOT_PAGE + 100, "the three pages used");
        for piece in [1u64, 1000, 4095, 4096, 4097, 65_536] {
            let mut walked = Vec::new();
            let mut start = 0;
            while start < count {
                let end = (start + piece).min(count);
                walked.extend(pages.iter_range(start, end).map(|(slot, &v)| (slot, v)));
                start = end;
            }
            assert_eq!(walked, whole, "pieces of {piece}");
        }
        assert_eq!(pages.iter_range(count, count + 10).count(), 0);
        assert_eq!(pages.iter_range(7, 3).count(), 0);
    }

    /// Against an ordered set, over sizes around the word and summary
    /// boundaries, with random inserts and removes.
    #[test]
    fn slot_sets_agree_with_an_ordered_set() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for count in [1u64, 63, 64, 65, 4095, 4096, 4097, 10_000] {
            let mut set = SlotSet::full(count);
            let mut model: BTreeSet<u64> = (0..count).collect();
            assert!(set.iter().eq(model.iter().copied()), "{count}");
            for _ in 0..3 * count {
                let slot = rng.gen_range(0..count);
                if rng.gen_bool(0.05) {
                    // A range, from within a word to past several.
                    let end = (slot + rng.gen_range(0..200)).min(count);
                    let gone: Vec<u64> = model.range(slot..end).copied().collect();
                    for s in &gone {
                        model.remove(s);
                    }
                    assert_eq!(set.remove_range(slot, end), gone.len(), "{count}: {slot}..{end}");
                } else if rng.gen_bool(0.6) {
                    assert_eq!(set.remove(slot), model.remove(&slot));
                } else {
                    assert_eq!(set.insert(slot), model.insert(slot));
                }
                assert_eq!(set.contains(slot), model.contains(&slot));
            }
            assert_eq!(set.len(), model.len(), "{count}");
            assert!(set.iter().eq(model.iter().copied()), "{count}");
            let mut taken = set.clone();
            let whole = taken.take();
            assert!(whole.iter().eq(model.iter().copied()), "{count}");
            assert!(taken.len() == 0 && taken.iter().next().is_none(), "{count}");
            assert!((0..count).all(|slot| !taken.contains(slot)), "{count}");
            taken.insert(count - 1);
            assert!(taken.iter().eq([count - 1]), "{count}: the taken set keeps its size");
            let empty = SlotSet::empty(count);
            assert!(empty.len() == 0 && empty.iter().next().is_none());
            assert!(!empty.contains(count), "a slot past the end is not in it");
        }
    }
}
