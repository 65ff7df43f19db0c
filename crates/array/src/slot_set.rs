//! A set of slot numbers as a bitmap with a summary level: one bit per
//! slot (16 MiB for the 126 million slots of six 8 TiB members) where an
//! ordered set of them cost about 11 bytes each, and iteration in order
//! that skips empty stretches 4,096 slots at a time.
//!
//! # Guarantees
//!
//! - `words[w]` bit b is set exactly when slot 64w+b is in the set, and
//!   `summary[w / 64]` bit w % 64 exactly when `words[w]` is not zero.
//! - `len` is the number of slots in the set.

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
                if rng.gen_bool(0.6) {
                    assert_eq!(set.remove(slot), model.remove(&slot));
                } else {
                    assert_eq!(set.insert(slot), model.insert(slot));
                }
                assert_eq!(set.contains(slot), model.contains(&slot));
            }
            assert_eq!(set.len(), model.len(), "{count}");
            assert!(set.iter().eq(model.iter().copied()), "{count}");
            let empty = SlotSet::empty(count);
            assert!(empty.len() == 0 && empty.iter().next().is_none());
            assert!(!empty.contains(count), "a slot past the end is not in it");
        }
    }
}
