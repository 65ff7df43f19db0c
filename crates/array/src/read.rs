//! The read path: the map says where each block is; it is copied from
//! memory (a stripe being filled or written) or read from its members and
//! checked, or, when a member is out or a check fails, taken from the
//! stripe rebuilt from any K good chunks.
//!
//! # Guarantees
//!
//! - Every byte returned from the members is checked: the CRC32C of each
//!   4 KiB block of a raw extent read in part, the extent's digest (the
//!   array's algorithm) for one read whole or compressed. A mismatch is
//!   answered from the rebuilt stripe, checked again, or with an error;
//!   never with wrong bytes.
//! - Reads hold the index's lock only to look up where blocks are; the
//!   slots they will read are pinned meanwhile, so no slot is rewritten
//!   under a reader.
//! - Reads of chunks on healthy members go straight to them; a stripe is
//!   rebuilt only when a chunk a read needs is out or bad, and then once
//!   for all readers (the reconstruction cache).

use crate::catalog::Catalog;
use crate::device::AlignedBuf;
use crate::error::ArrayError;
use crate::format::{Extent, BLOCK_BYTES};
use crate::index::Resident;
use crate::lanes::Lanes;
use crate::map::Target;
use crate::slots::Pinned;
use crate::stripes::{decompress_blocks, raw_ok, stored_range, Stripes};
use std::sync::Arc;

/// Where a stripe's data area is.
pub(crate) enum Where {
    Memory(Arc<AlignedBuf>),
    /// In the open stripe of this lane.
    Open(usize),
    Members {
        sequence: u64,
    },
    /// On the members, in a slot whose slot table page opening left to be
    /// read later: `Catalog::slot_sequence` reads it.
    Unread,
}

/// The read path over the stripes, the index and the lanes (see the
/// module's doc): a view of the layers it reads through, made for each
/// request (`Shared::reader`), holding nothing of its own.
pub(crate) struct Reader<'a> {
    pub stripes: &'a Stripes,
    pub catalog: &'a Catalog,
    pub lanes: &'a Lanes,
}

impl Reader<'_> {
    /// Which of key-space bytes [offset, offset+len) are stored (see
    /// `Volume::allocation`).
    pub fn allocation(&self, offset: u64, len: u64) -> Result<Vec<(u64, bool)>, ArrayError> {
        let end = offset + len;
        let block = BLOCK_BYTES as u64;
        let (first, last) = (offset / block, end.div_ceil(block));
        let mut runs: Vec<(u64, bool)> = Vec::new();
        let mut push = |from: u64, to: u64, stored: bool| {
            let (from, to) = ((from * block).max(offset), (to * block).min(end));
            if from >= to {
                return;
            }
            match runs.last_mut() {
                Some(last) if last.1 == stored => last.0 += to - from,
                _ => runs.push((to - from, stored)),
            }
        };
        self.catalog.with_mappings(first, last, |_, mappings| {
            let mut at = first;
            for (start, mapping) in mappings {
                let stop = start + u64::from(mapping.blocks);
                push(at, start.max(at), false);
                let stored = matches!(mapping.target, crate::map::Target::Data { .. });
                push(start.max(at), stop.min(last), stored);
                at = stop.min(last);
            }
            push(at, last, false);
        })?;
        Ok(runs)
    }

    /// Reads `buf.len()` bytes at byte `offset` of the map's key space
    /// (in range: the caller checks).
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ArrayError> {
        let block = BLOCK_BYTES as u64;
        let first = offset / block;
        if offset.is_multiple_of(block) && buf.len().is_multiple_of(BLOCK_BYTES) {
            return self.read_blocks_into(first, buf);
        }
        let last = (offset + buf.len() as u64).div_ceil(block);
        let mut blocks = vec![0u8; (last - first) as usize * BLOCK_BYTES];
        self.read_blocks_into(first, &mut blocks)?;
        let skip = (offset - first * block) as usize;
        buf.copy_from_slice(&blocks[skip..skip + buf.len()]);
        Ok(())
    }

    /// Rebuilds now, into the reconstruction cache, every stripe holding
    /// data of [offset, offset+len) that a read would have to rebuild (a
    /// data chunk on a member that is out), as many as the cache holds:
    /// NBD_CMD_CACHE, so that the reads that follow cost no decoding.
    /// With every member in, nothing needs doing.
    pub fn prefetch(&self, offset: u64, len: u64) -> Result<(), ArrayError> {
        if self.stripes.members.unavailable() == 0 {
            return Ok(());
        }
        let block = BLOCK_BYTES as u64;
        let (first, end) = (offset / block, (offset + len).div_ceil(block));
        let mut pinned = Pinned::new(&self.catalog.pins);
        let mut stripes: Vec<u64> = Vec::new();
        self.catalog.with_mappings(first, end, |index, mappings| {
            for (_, mapping) in mappings {
                if let Target::Data { extent, .. } = &mapping.target {
                    let on_members = matches!(where_is(index, extent.slot), Where::Members { .. } | Where::Unread);
                    if on_members && !stripes.contains(&extent.slot) && !self.stripes.data_readable(extent.slot) {
                        pinned.add(extent.slot);
                        stripes.push(extent.slot);
                    }
                }
            }
        })?;
        // More than the cache holds would push out the first ones rebuilt.
        // (A pinned slot is not taken again, so its sequence holds.)
        for &slot in stripes.iter().take(self.stripes.cache.capacity()) {
            self.stripes.rebuilt_area(slot, self.catalog.slot_sequence(slot)?)?;
        }
        Ok(())
    }

    /// Fills `out` with whole blocks from `lba`; holes and zero ranges are
    /// zeros.
    pub fn read_blocks_into(&self, lba: u64, out: &mut [u8]) -> Result<(), ArrayError> {
        let end = lba + (out.len() / BLOCK_BYTES) as u64;
        let mut pinned = Pinned::new(&self.catalog.pins);
        let mut plan: Vec<Piece> = Vec::new();
        self.catalog.with_mappings(lba, end, |index, mappings| {
            for (start, mapping) in mappings {
                let (lo, hi) = (start.max(lba), (start + u64::from(mapping.blocks)).min(end));
                if let Target::Data { extent, skip } = &mapping.target {
                    pinned.add(extent.slot);
                    let at = where_is(index, extent.slot);
                    let skip = skip + (lo - start) as u32;
                    plan.push((lo, hi, Some((extent.clone(), skip, at))));
                } else {
                    plan.push((lo, hi, None));
                }
            }
        })?;
        for (_, _, source) in &mut plan {
            if let Some((extent, _, at @ Where::Unread)) = source {
                *at = Where::Members {
                    sequence: self.catalog.slot_sequence(extent.slot)?,
                };
            }
        }
        // Raw pieces whose chunks are all on readable members are read
        // straight (`read_runs`). Of the rest, those in stripes this read
        // wants most of come from the stripe rebuilt whole (kept for the
        // next reads); in the others only the ranges wanted are read or
        // decoded. "Most" is by what reading the ranges would cost: a
        // range on a member that is out costs K times its length. With
        // every member in, nothing is rebuilt for want of one.
        let mut cost: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
        if self.stripes.members.unavailable() > 0 {
            for (lo, hi, source) in &plan {
                if let Some((extent, skip, Where::Members { .. })) = source {
                    let (offset, len) = stored_range(extent, *skip, (hi - lo) as usize * BLOCK_BYTES);
                    *cost.entry(extent.slot).or_default() += self.stripes.range_cost(extent.slot, offset, len).0;
                }
            }
        }
        // A read that is large in all and covers a good part of the
        // stripes it touches (a streaming reader's, most likely) takes each
        // degraded one whole: its next request will want the rest of the
        // stripe it only begins here. One whose blocks are scattered over
        // many stripes (written at random) does not: each would be a
        // stripe read for a block.
        let area = self.stripes.geometry.data_area_bytes();
        let total: usize = cost.values().sum();
        let large = 2 * total >= area && 4 * total >= cost.len() * area;
        let wide = |slot: u64| large || cost.get(&slot).is_some_and(|&bytes| 2 * bytes >= area);
        // A degraded stripe read whole is rebuilt for this request: its
        // healthy chunks are not read beside that.
        let rebuilt = |slot: u64| wide(slot) && !self.stripes.data_readable(slot);
        let mut read = self.read_runs(&plan, lba, out, rebuilt).into_iter().peekable();
        let mut filled = lba;
        let mut i = 0;
        while i < plan.len() {
            let (lo, hi) = (plan[i].0, plan[i].1);
            out[block_range(lba, filled, lo)].fill(0);
            if let Some((_, run)) = read.next_if(|&(first, _)| first == i) {
                filled = plan[i + run - 1].1;
                i += run;
                continue;
            }
            filled = hi;
            let target = &mut out[block_range(lba, lo, hi)];
            match plan[i].2.take() {
                None => target.fill(0),
                Some((extent, skip, at)) => {
                    let whole = wide(extent.slot);
                    self.read_extent(&extent, skip, (hi - lo) as u32, at, whole, target)?
                }
            }
            i += 1;
        }
        out[block_range(lba, filled, end)].fill(0);
        Ok(())
    }

    /// The raw pieces of `plan` on the members, taken in runs (`raw_run`:
    /// pieces end to end in one stripe) and read together: every run's
    /// chunks in one round of reads side by side (`Stripes::read_areas_into`;
    /// a request over three stripes of a 4+2 array took ~1 ms more read
    /// a stripe after another on a 2-core VM), one read a chunk, not one
    /// an extent; then each run checked against its extents' CRCs.
    /// Returns the runs (first piece, pieces) read and checked, in order,
    /// their blocks in `out`. The caller reads the rest the usual way (a
    /// run whose stripe is rebuilt, or is to be: `rebuilt`, or with a chunk
    /// on a member that is out, or that failed its check), rebuilding as
    /// needed.
    fn read_runs(
        &self,
        plan: &[Piece],
        lba: u64,
        out: &mut [u8],
        rebuilt: impl Fn(u64) -> bool,
    ) -> Vec<(usize, usize)> {
        // (first piece, pieces, slot, data-area offset)
        let mut runs: Vec<(usize, usize, u64, usize)> = Vec::new();
        let mut i = 0;
        while i < plan.len() {
            let run = raw_run(&plan[i..]).max(1);
            if let Some((extent, skip, Where::Members { sequence })) = &plan[i].2 {
                let from_rebuild = rebuilt(extent.slot) || self.stripes.cache.peek((extent.slot, *sequence)).is_some();
                if extent.codec.is_none() && !from_rebuild {
                    let start = extent.offset as usize + *skip as usize * BLOCK_BYTES;
                    runs.push((i, run, extent.slot, start));
                }
            }
            i += run;
        }
        // Each run's part of `out`.
        let mut areas: Vec<(u64, usize, &mut [u8])> = Vec::with_capacity(runs.len());
        let (mut rest, mut rest_lba) = (&mut out[..], lba);
        for &(first, run, slot, start) in &runs {
            let (lo, hi) = (plan[first].0, plan[first + run - 1].1);
            let skipped = (lo - rest_lba) as usize * BLOCK_BYTES;
            let (mine, tail) = std::mem::take(&mut rest)[skipped..].split_at_mut((hi - lo) as usize * BLOCK_BYTES);
            (rest, rest_lba) = (tail, hi);
            areas.push((slot, start, mine));
        }
        let read = self.stripes.read_areas_into(&mut areas);
        let algorithm = self.stripes.geometry.checksum;
        runs.iter()
            .zip(&areas)
            .zip(read)
            .filter(|&((&(first, run, ..), (_, _, bytes)), read)| {
                let mut at = 0;
                read && plan[first..first + run].iter().all(|(lo, hi, source)| {
                    let (extent, skip, _) = source.as_ref().expect("runs hold data");
                    let blocks = &bytes[at..at + (hi - lo) as usize * BLOCK_BYTES];
                    at += blocks.len();
                    raw_ok(algorithm, extent, *skip, blocks)
                })
            })
            .map(|((&(first, run, ..), _), _)| (first, run))
            .collect()
    }

    /// Blocks [skip, skip+blocks) of `extent` into `out`, checked; its
    /// slot is pinned by the caller. `whole`: the caller wants most of the
    /// stripe (by what decoding its ranges would cost), so a degraded
    /// stripe is rebuilt whole, once for every reader, instead of its
    /// healthy chunks read now and again by a rebuild.
    pub fn read_extent(
        &self,
        extent: &Extent,
        skip: u32,
        blocks: u32,
        mut at: Where,
        whole: bool,
        out: &mut [u8],
    ) -> Result<(), ArrayError> {
        // A stripe only moves on (open, written, on the members), so the
        // second look finds it in memory or on the members.
        for _ in 0..3 {
            match at {
                Where::Memory(area) => return copy_blocks(extent, skip, &area, out),
                Where::Open(lane) => {
                    let open = self.lanes.open_lane(lane);
                    if let Some(open) = open.as_ref().filter(|o| o.slot == extent.slot) {
                        return copy_blocks(extent, skip, &open.data, out);
                    }
                    drop(open);
                    at = where_is(&self.catalog.index(), extent.slot);
                }
                Where::Members { sequence } => {
                    return self
                        .stripes
                        .read_from_members(extent, skip, blocks, sequence, whole, out)
                }
                Where::Unread => {
                    at = Where::Members {
                        sequence: self.catalog.slot_sequence(extent.slot)?,
                    }
                }
            }
        }
        unreachable!("a stripe is open, then in memory, then on the members")
    }
}

/// A planned piece of a read: blocks [lo, hi) and where they are (`None`:
/// zeros).
type Piece = (u64, u64, Option<(Arc<Extent>, u32, Where)>);

/// How many pieces from the first are raw extents on the members of one
/// stripe, each starting in the data area where the one before ends.
fn raw_run(plan: &[Piece]) -> usize {
    let stored = |piece: &Piece| match &piece.2 {
        Some((extent, skip, Where::Members { sequence })) if extent.codec.is_none() => {
            let start = extent.offset as u64 + u64::from(*skip) * BLOCK_BYTES as u64;
            Some((
                extent.slot,
                *sequence,
                start,
                start + (piece.1 - piece.0) * BLOCK_BYTES as u64,
            ))
        }
        _ => None,
    };
    let Some(mut last) = stored(&plan[0]) else { return 0 };
    let mut count = 1;
    for (previous, piece) in plan.iter().zip(&plan[1..]) {
        match stored(piece) {
            Some(next) if previous.1 == piece.0 && (next.0, next.1, next.2) == (last.0, last.1, last.3) => {
                last = next;
                count += 1;
            }
            _ => break,
        }
    }
    count
}

/// Where slot `slot`'s data area is, as the index says now.
pub(crate) fn where_is(index: &crate::index::Index, slot: u64) -> Where {
    match index.resident.get(&slot) {
        Some(Resident::Open(lane)) => Where::Open(*lane),
        Some(Resident::Sealed(area)) => Where::Memory(area.clone()),
        None if index.slots.is_unread(slot) => Where::Unread,
        None => Where::Members {
            sequence: index.slots.get(slot).sequence,
        },
    }
}

/// An extent's blocks from a data area in memory (what this process
/// wrote: not checked again).
fn copy_blocks(extent: &Extent, skip: u32, area: &[u8], out: &mut [u8]) -> Result<(), ArrayError> {
    let stored = &area[extent.offset as usize..(extent.offset + extent.stored_bytes) as usize];
    match extent.codec {
        None => {
            let from = skip as usize * BLOCK_BYTES;
            out.copy_from_slice(&stored[from..from + out.len()]);
            Ok(())
        }
        Some(_) => decompress_blocks(extent, stored, skip, out),
    }
}

/// Byte range in a block buffer starting at `lba` for blocks [from, end).
fn block_range(lba: u64, from: u64, end: u64) -> std::ops::Range<usize> {
    (from - lba) as usize * BLOCK_BYTES..(end - lba) as usize * BLOCK_BYTES
}
