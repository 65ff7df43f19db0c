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

use crate::format::Extent;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

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

    /// Whether two targets are the same stored record (not just equal bytes).
    pub fn same_record(&self, other: &Target) -> bool {
        match (self, other) {
            (Target::Zero { slot: a }, Target::Zero { slot: b }) => a == b,
            (Target::Data { extent: a, .. }, Target::Data { extent: b, .. }) => Arc::ptr_eq(a, b),
            _ => false,
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

/// A piece of a target that the map gained (`pieces` +1) or lost (-1),
/// `blocks` long.
#[derive(Clone, Debug)]
pub struct Delta {
    /// The map key of the piece's first block.
    pub lba: u64,
    pub target: Target,
    pub blocks: u32,
    pub gained: bool,
}

/// Which existing pieces an insert replaces.
#[derive(Clone, Copy, Debug)]
pub enum Rule<'a> {
    /// All of them, and the gaps between: a new write.
    Always,
    /// Those whose version is at most the new one, and the gaps: replay.
    IfNotNewer,
    /// Those that are still `target` at `version`, and no gaps: a
    /// relocation by garbage collection.
    IfStill { target: &'a Target, version: u64 },
}

impl Rule<'_> {
    fn replaces(&self, existing: &Mapping, version: u64) -> bool {
        match self {
            Rule::Always => true,
            Rule::IfNotNewer => existing.version <= version,
            Rule::IfStill { target, version } => existing.version == *version && existing.target.same_record(target),
        }
    }

    fn fills_gaps(&self) -> bool {
        !matches!(self, Rule::IfStill { .. })
    }
}

#[derive(Default)]
pub struct Map {
    ranges: BTreeMap<u64, Mapping>,
}

impl Map {
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    pub fn clear(&mut self) {
        self.ranges.clear();
    }

    /// Every mapping, in block order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Mapping)> {
        self.ranges.iter().map(|(&s, m)| (s, m))
    }

    /// Mappings from block `lba` on, in order.
    pub fn from(&self, lba: u64) -> impl Iterator<Item = (u64, &Mapping)> {
        self.ranges.range(lba..).map(|(&s, m)| (s, m))
    }

    /// Mappings overlapping blocks [lba, end), in order.
    pub fn overlapping(&self, lba: u64, end: u64) -> impl Iterator<Item = (u64, &Mapping)> {
        let before = self
            .ranges
            .range(..lba)
            .next_back()
            .filter(|(&s, m)| s + u64::from(m.blocks) > lba)
            .map(|(&s, m)| (s, m));
        before.into_iter().chain(
            self.ranges
                .range((Bound::Included(lba), Bound::Excluded(end)))
                .map(|(&s, m)| (s, m)),
        )
    }

    /// Maps blocks [lba, lba+blocks) to `target` at `version`, over the
    /// pieces `rule` allows. Returns what changed, gains before losses (so
    /// a slot keeping the head or tail of a cut piece is never seen empty).
    pub fn insert(&mut self, lba: u64, blocks: u32, version: u64, target: &Target, rule: Rule<'_>) -> Vec<Delta> {
        let end = lba + u64::from(blocks);
        let old: Vec<(u64, Mapping)> = self.overlapping(lba, end).map(|(s, m)| (s, m.clone())).collect();
        let (mut gained, mut lost) = (Vec::new(), Vec::new());
        // The pieces of [lba, end) the new target takes, in order.
        let mut taken: Vec<(u64, u64)> = Vec::new();
        let mut take = |lo: u64, hi: u64| match taken.last_mut() {
            Some(last) if last.1 == lo => last.1 = hi,
            _ => taken.push((lo, hi)),
        };
        let mut cursor = lba;
        for (start, mapping) in old {
            let mapping_end = start + u64::from(mapping.blocks);
            let (lo, hi) = (start.max(lba), mapping_end.min(end));
            if cursor < lo && rule.fills_gaps() {
                take(cursor, lo);
            }
            cursor = hi;
            if !rule.replaces(&mapping, version) {
                continue;
            }
            self.ranges.remove(&start);
            lost.push(Delta {
                lba: start,
                target: mapping.target.clone(),
                blocks: mapping.blocks,
                gained: false,
            });
            if start < lo {
                gained.push(self.put(start, (lo - start) as u32, mapping.version, mapping.target.clone()));
            }
            if mapping_end > hi {
                let target = mapping.target.advanced((hi - start) as u32);
                gained.push(self.put(hi, (mapping_end - hi) as u32, mapping.version, target));
            }
            take(lo, hi);
        }
        if cursor < end && rule.fills_gaps() {
            take(cursor, end);
        }
        for (lo, hi) in taken {
            let piece = target.advanced((lo - lba) as u32);
            gained.push(self.put(lo, (hi - lo) as u32, version, piece));
        }
        gained.extend(lost);
        gained
    }

    /// Removes every mapping that starts in [lba, end) (a deleted
    /// volume's: none crosses a volume's bounds); returns what was lost.
    pub fn remove_from(&mut self, lba: u64, end: u64) -> Vec<Delta> {
        let starts: Vec<u64> = self.ranges.range(lba..end).map(|(&s, _)| s).collect();
        starts
            .into_iter()
            .filter_map(|start| self.ranges.remove(&start).map(|m| (start, m)))
            .map(|(start, m)| Delta {
                lba: start,
                target: m.target,
                blocks: m.blocks,
                gained: false,
            })
            .collect()
    }

    fn put(&mut self, lba: u64, blocks: u32, version: u64, target: Target) -> Delta {
        debug_assert!(blocks > 0);
        self.ranges.insert(
            lba,
            Mapping {
                blocks,
                version,
                target: target.clone(),
            },
        );
        Delta {
            lba,
            target,
            blocks,
            gained: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_checksum::Algorithm;

    fn extent(slot: u64, blocks: u32) -> Arc<Extent> {
        Arc::new(Extent {
            slot,
            offset: 0,
            stored_bytes: blocks * 4096,
            blocks,
            codec: None,
            digest: Algorithm::Crc32c.digest(b""),
            block_crcs: vec![0; blocks as usize],
        })
    }

    fn data(extent: &Arc<Extent>) -> Target {
        Target::Data {
            extent: extent.clone(),
            skip: 0,
        }
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
            *net.entry(d.target.slot()).or_insert(0) += if d.gained { 1 } else { -1 } * i64::from(d.blocks);
        }
        net.retain(|_, v| *v != 0);
        net
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
