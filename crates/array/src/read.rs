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

use crate::device::AlignedBuf;
use crate::engine::{block_range, Resident, Shared};
use crate::error::ArrayError;
use crate::format::{Extent, BLOCK_BYTES, SECTOR_BYTES};
use crate::map::Target;
use crate::slots::Pinned;
use crate::status::Counters;
use crate::stripe::{self, RebuildError, Rebuilt};
use std::sync::Arc;
use tessera_checksum::Algorithm;

/// Reads of at most this many bytes read their pieces (at most two or
/// three chunks) one after the other on the calling thread: handing a few
/// kilobytes to the I/O pool costs more in wake-ups than the reads do.
const SERIAL_READ_BYTES_MAX: usize = 16 << 10;

/// Where a stripe's data area is.
pub(crate) enum Where {
    Memory(Arc<AlignedBuf>),
    /// In the open stripe of this lane.
    Open(usize),
    Members {
        sequence: u64,
    },
    /// On the members, in a slot whose slot table page opening left to be
    /// read later: `Shared::slot_sequence` reads it.
    Unread,
}

impl Shared {
    /// Reads `buf.len()` bytes at byte `offset` of the volume.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ArrayError> {
        self.check_range(offset, buf.len() as u64)?;
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
        self.check_range(offset, len)?;
        if self.members.unavailable() == 0 {
            return Ok(());
        }
        let block = BLOCK_BYTES as u64;
        let (first, end) = (offset / block, (offset + len).div_ceil(block));
        let mut pinned = Pinned::new(&self.pins);
        let mut stripes: Vec<u64> = Vec::new();
        self.with_pages(&[(first, end)], |index| {
            for (_, mapping) in index.map.overlapping(first, end) {
                if let Target::Data { extent, .. } = &mapping.target {
                    let on_members = matches!(where_is(index, extent.slot), Where::Members { .. } | Where::Unread);
                    if on_members && !stripes.contains(&extent.slot) && !self.data_readable(extent.slot) {
                        pinned.add(extent.slot);
                        stripes.push(extent.slot);
                    }
                }
            }
        })?;
        // More than the cache holds would push out the first ones rebuilt.
        // (A pinned slot is not taken again, so its sequence holds.)
        for &slot in stripes.iter().take(self.cache.capacity()) {
            self.rebuilt_area(slot, self.slot_sequence(slot)?)?;
        }
        Ok(())
    }

    /// Fills `out` with whole blocks from `lba`; holes and zero ranges are
    /// zeros.
    pub(crate) fn read_blocks_into(&self, lba: u64, out: &mut [u8]) -> Result<(), ArrayError> {
        let end = lba + (out.len() / BLOCK_BYTES) as u64;
        let mut pinned = Pinned::new(&self.pins);
        let mut plan: Vec<Piece> = Vec::new();
        self.with_pages(&[(lba, end)], |index| {
            for (start, mapping) in index.map.overlapping(lba, end) {
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
                    sequence: self.slot_sequence(extent.slot)?,
                };
            }
        }
        // Stripes this read wants most of: rebuilt whole if degraded (and
        // kept for the next reads); of the others only the ranges wanted
        // are read or decoded. "Most" is by what reading the ranges would
        // cost: a range on a member that is out costs K times its length.
        // With every member in, nothing is rebuilt for want of one.
        let mut cost: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
        if self.members.unavailable() > 0 {
            for (lo, hi, source) in &plan {
                if let Some((extent, skip, Where::Members { .. })) = source {
                    let (offset, len) = stored_range(extent, *skip, (hi - lo) as usize * BLOCK_BYTES);
                    *cost.entry(extent.slot).or_default() += self.range_cost(extent.slot, offset, len).0;
                }
            }
        }
        // A read that is large in all and covers a good part of the
        // stripes it touches (a streaming reader's, most likely) takes each
        // degraded one whole: its next request will want the rest of the
        // stripe it only begins here. One whose blocks are scattered over
        // many stripes (written at random) does not: each would be a
        // stripe read for a block.
        let area = self.geometry.data_area_bytes();
        let total: usize = cost.values().sum();
        let large = 2 * total >= area && 4 * total >= cost.len() * area;
        let wide = |slot: u64| large || cost.get(&slot).is_some_and(|&bytes| 2 * bytes >= area);
        let at_once = if self.members.unavailable() == 0 {
            self.read_runs_at_once(&plan, lba, out)
        } else {
            Vec::new()
        };
        let mut at_once = at_once.into_iter().peekable();
        let mut filled = lba;
        let mut i = 0;
        while i < plan.len() {
            let (lo, hi) = (plan[i].0, plan[i].1);
            out[block_range(lba, filled, lo)].fill(0);
            if let Some((_, run)) = at_once.next_if(|&(first, _)| first == i) {
                filled = plan[i + run - 1].1;
                i += run;
                continue;
            }
            // Raw pieces that lie end to end in one stripe on the members
            // are read together: one read per chunk, not per extent.
            let run = raw_run(&plan[i..]);
            if run > 1 {
                let run_hi = plan[i + run - 1].1;
                if self.read_run(&plan[i..i + run], &mut out[block_range(lba, lo, run_hi)]) {
                    filled = run_hi;
                    i += run;
                    continue;
                }
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

    /// Where a read's raw pieces on the members lie in more than one
    /// stripe: reads every chunk they need in one round, side by side,
    /// rather than a stripe after another (a 504 KiB read of a KV table
    /// over three stripes of a 4+2 array took ~1 ms so on a 2-core VM).
    /// Returns the runs (first piece, pieces; as `raw_run` finds them)
    /// read and checked, in order, their blocks in `out`; the caller reads
    /// the rest, and any run that failed, the usual way.
    fn read_runs_at_once(&self, plan: &[Piece], lba: u64, out: &mut [u8]) -> Vec<(usize, usize)> {
        let g = &self.geometry;
        // (first piece, pieces, slot, data-area offset)
        let mut runs: Vec<(usize, usize, u64, usize)> = Vec::new();
        let mut i = 0;
        while i < plan.len() {
            let run = raw_run(&plan[i..]).max(1);
            if let Some((extent, skip, Where::Members { sequence })) = &plan[i].2 {
                if extent.codec.is_none() && self.cache.peek((extent.slot, *sequence)).is_none() {
                    let start = extent.offset as usize + *skip as usize * BLOCK_BYTES;
                    runs.push((i, run, extent.slot, start));
                }
            }
            i += run;
        }
        let bytes: u64 = runs
            .iter()
            .map(|&(first, run, ..)| plan[first + run - 1].1 - plan[first].0)
            .sum::<u64>()
            * BLOCK_BYTES as u64;
        let stripes = runs.iter().map(|r| r.2).collect::<std::collections::HashSet<_>>().len();
        if stripes < 2 || bytes <= SERIAL_READ_BYTES_MAX as u64 {
            return Vec::new();
        }
        // Every run's chunk pieces, each with its part of `out`.
        let mut jobs: Vec<(usize, usize, u64, &mut [u8], bool)> = Vec::new();
        let (mut rest, mut rest_lba) = (&mut out[..], lba);
        for (n, &(first, run, slot, start)) in runs.iter().enumerate() {
            let (lo, hi) = (plan[first].0, plan[first + run - 1].1);
            let skipped = (lo - rest_lba) as usize * BLOCK_BYTES;
            let (mine, tail) = std::mem::take(&mut rest)[skipped..].split_at_mut((hi - lo) as usize * BLOCK_BYTES);
            (rest, rest_lba) = (tail, hi);
            let mut mine = mine;
            for (chunk, within, len, _) in stripe::pieces(g, start, (hi - lo) as usize * BLOCK_BYTES) {
                let (piece, tail) = std::mem::take(&mut mine).split_at_mut(len);
                mine = tail;
                let (member, row) = g.place(slot, chunk);
                let position = g.row_offset(row) + (SECTOR_BYTES + within) as u64;
                jobs.push((n, member, position, piece, false));
            }
        }
        self.in_parallel(&mut jobs, |(_, member, position, piece, ok)| {
            *ok = self.members.read(*member, |device| device.read_at(piece, *position));
        });
        let mut read = vec![true; runs.len()];
        for job in &jobs {
            read[job.0] &= job.4;
        }
        drop(jobs);
        // Each run checked against its extents' CRCs, as `read_run` does.
        let algorithm = g.checksum;
        runs.iter()
            .zip(read)
            .filter(|&(&(first, run, ..), read)| {
                let mut at = block_range(lba, lba, plan[first].0).end;
                read && plan[first..first + run].iter().all(|(lo, hi, source)| {
                    let (extent, skip, _) = source.as_ref().expect("runs hold data");
                    let bytes = &out[at..at + (hi - lo) as usize * BLOCK_BYTES];
                    at += bytes.len();
                    raw_ok(algorithm, extent, *skip, bytes)
                })
            })
            .map(|(&(first, run, ..), _)| (first, run))
            .collect()
    }

    /// Reads pieces `raw_run` found adjacent with one read per chunk and
    /// checks each; false (and nothing trusted) if a member is out, the
    /// stripe has been rebuilt, or a check fails: the caller then reads
    /// them one by one, rebuilding as needed.
    fn read_run(&self, run: &[Piece], out: &mut [u8]) -> bool {
        let Some((first, skip, Where::Members { sequence })) = &run[0].2 else {
            return false;
        };
        if self.cache.peek((first.slot, *sequence)).is_some() {
            return false;
        }
        let start = first.offset as usize + *skip as usize * BLOCK_BYTES;
        if !self.read_area_into(first.slot, start, out) {
            return false;
        }
        let algorithm = self.geometry.checksum;
        let mut at = 0;
        run.iter().all(|(lo, hi, source)| {
            let (extent, skip, _) = source.as_ref().expect("raw runs hold data");
            let bytes = &out[at..at + (hi - lo) as usize * BLOCK_BYTES];
            at += bytes.len();
            raw_ok(algorithm, extent, *skip, bytes)
        })
    }

    /// Blocks [skip, skip+blocks) of `extent` into `out`, checked; its
    /// slot is pinned by the caller. `whole`: the caller wants most of the
    /// stripe (by what decoding its ranges would cost), so a degraded
    /// stripe is rebuilt whole, once for every reader, instead of its
    /// healthy chunks read now and again by a rebuild.
    pub(crate) fn read_extent(
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
                    let open = self.open_lane(lane);
                    if let Some(open) = open.as_ref().filter(|o| o.slot == extent.slot) {
                        return copy_blocks(extent, skip, &open.data, out);
                    }
                    drop(open);
                    at = where_is(&self.index(), extent.slot);
                }
                Where::Members { sequence } => {
                    return self.read_from_members(extent, skip, blocks, sequence, whole, out)
                }
                Where::Unread => {
                    at = Where::Members {
                        sequence: self.slot_sequence(extent.slot)?,
                    }
                }
            }
        }
        unreachable!("a stripe is open, then in memory, then on the members")
    }

    /// An extent's blocks read from the members and checked. Where a
    /// member holding them is out: the range decoded from the others (a
    /// small read), or the stripe rebuilt (a read of most of it, or when
    /// that fails); the stripe rebuilt too when a check fails.
    fn read_from_members(
        &self,
        extent: &Extent,
        skip: u32,
        blocks: u32,
        sequence: u64,
        whole: bool,
        out: &mut [u8],
    ) -> Result<(), ArrayError> {
        let key = (extent.slot, sequence);
        if let Some(area) = self.cache.peek(key) {
            return self.serve_rebuilt(extent, skip, &area, out);
        }
        let algorithm = self.geometry.checksum;
        let raw = extent.codec.is_none();
        let (offset, len) = stored_range(extent, skip, out.len());
        let (_, out_of_reach) = self.range_cost(extent.slot, offset, len);
        if whole && !self.data_readable(extent.slot) {
            let area = self.rebuilt_area(extent.slot, sequence)?;
            return self.serve_rebuilt(extent, skip, &area, out);
        }
        let check = |bytes: &[u8], out: &mut [u8]| {
            if raw {
                out.copy_from_slice(bytes);
                raw_ok(algorithm, extent, skip, out)
            } else {
                algorithm.digest(bytes) == extent.digest && decompress_blocks(extent, bytes, skip, out).is_ok()
            }
        };
        if !out_of_reach {
            let mut stored = vec![0u8; if raw { 0 } else { len }];
            let direct = if raw {
                self.read_area_into(extent.slot, offset, out) && raw_ok(algorithm, extent, skip, out)
            } else {
                self.read_area_into(extent.slot, offset, &mut stored) && check(&stored, out)
            };
            if direct {
                return Ok(());
            }
        } else if !whole {
            if let Some(bytes) = self.decode_range(extent.slot, offset, len) {
                if check(&bytes, out) {
                    Counters::add(&self.counters.ranges_decoded, 1);
                    Counters::add(&self.counters.reconstructed_reads, 1);
                    return Ok(());
                }
            }
        }
        debug_assert_eq!(out.len(), blocks as usize * BLOCK_BYTES);
        let area = self.rebuilt_area(extent.slot, sequence)?;
        self.serve_rebuilt(extent, skip, &area, out)
    }

    /// Bytes reading data-area range [offset, offset+len) of `slot` takes
    /// (its length where it lies on readable members, K times that where
    /// it must be decoded from K others), and whether any of it must be.
    fn range_cost(&self, slot: u64, offset: usize, len: usize) -> (usize, bool) {
        let g = &self.geometry;
        let (mut cost, mut out_of_reach) = (0, false);
        for (chunk, _, n, _) in stripe::pieces(g, offset, len) {
            if self.members.is_readable(g.place(slot, chunk).0) {
                cost += n;
            } else {
                cost += g.data * n;
                out_of_reach = true;
            }
        }
        (cost, out_of_reach)
    }

    /// An extent's blocks from a rebuilt data area, checked again.
    fn serve_rebuilt(&self, extent: &Extent, skip: u32, area: &[u8], out: &mut [u8]) -> Result<(), ArrayError> {
        if !checked_blocks(self.geometry.checksum, extent, skip, area, out) {
            Counters::add(&self.counters.unrecoverable_reads, 1);
            return Err(ArrayError::Unreadable { slot: extent.slot });
        }
        Counters::add(&self.counters.reconstructed_reads, 1);
        Ok(())
    }

    /// Data-area bytes [offset, offset+len) of the stripe in `slot`: what
    /// lies on available members read straight, what lies on unavailable
    /// ones decoded from the same byte range of K other chunks. No header
    /// is read, so nothing here is trusted until the caller's digests
    /// check it; `None` if a read fails.
    fn decode_range(&self, slot: u64, offset: usize, len: usize) -> Option<Vec<u8>> {
        let g = &self.geometry;
        let mut out = vec![0u8; len];
        for (chunk, within, n, at) in stripe::pieces(g, offset, len) {
            let read = |j: usize, buf: &mut [u8]| {
                let (member, row) = g.place(slot, j);
                let position = g.row_offset(row) + (SECTOR_BYTES + within) as u64;
                self.members.read(member, |device| device.read_at(buf, position))
            };
            if read(chunk, &mut out[at..at + n]) {
                continue;
            }
            // K sources: the other data chunks first, then parity.
            let sources: Vec<usize> = (0..g.width())
                .filter(|&j| j != chunk && self.members.is_readable(g.place(slot, j).0))
                .take(g.data)
                .collect();
            if sources.len() < g.data {
                return None;
            }
            let mut pieces = vec![vec![0u8; n]; g.width()];
            let mut jobs: Vec<(usize, &mut Vec<u8>, bool)> = pieces
                .iter_mut()
                .enumerate()
                .filter(|(j, _)| sources.contains(j))
                .map(|(j, piece)| (j, piece, false))
                .collect();
            self.in_parallel(&mut jobs, |(j, piece, ok)| *ok = read(*j, piece));
            if !jobs.iter().all(|job| job.2) {
                return None;
            }
            drop(jobs);
            let missing: Vec<usize> = (0..g.width()).filter(|j| !sources.contains(j)).collect();
            let shape = tessera_accel::Shape {
                chunk_bytes: n,
                ..stripe::shape(g)
            };
            let mut jobs = [tessera_accel::ReconstructJob {
                chunks: pieces.iter_mut().map(|p| &mut p[..]).collect(),
                missing,
            }];
            self.accel.decode(&shape, &mut jobs).ok()?;
            out[at..at + n].copy_from_slice(&pieces[chunk]);
        }
        Some(out)
    }

    /// Fills `out` with data-area bytes from `offset`, straight from the
    /// data chunks' members (in parallel); false if a member is out or a
    /// read fails.
    pub(crate) fn read_area_into(&self, slot: u64, offset: usize, out: &mut [u8]) -> bool {
        let g = &self.geometry;
        let pieces = stripe::pieces(g, offset, out.len());
        if pieces
            .iter()
            .any(|&(chunk, ..)| !self.members.is_readable(g.place(slot, chunk).0))
        {
            return false;
        }
        let out_len = out.len();
        let mut rest = out;
        let mut jobs: Vec<(usize, usize, &mut [u8], bool)> = Vec::with_capacity(pieces.len());
        for (chunk, within, n, _) in pieces {
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut(n);
            rest = tail;
            jobs.push((chunk, within, piece, false));
        }
        let read = |(chunk, within, piece, ok): &mut (usize, usize, &mut [u8], bool)| {
            let (member, row) = g.place(slot, *chunk);
            let position = g.row_offset(row) + (SECTOR_BYTES + *within) as u64;
            *ok = self.members.read(member, |device| device.read_at(piece, position));
        };
        if out_len <= SERIAL_READ_BYTES_MAX {
            jobs.iter_mut().for_each(read);
        } else {
            self.in_parallel(&mut jobs, read);
        }
        jobs.iter().all(|job| job.3)
    }

    /// Runs `each` on every job side by side when there are several, on
    /// the read threads (each job blocks on a member, and must not fan out
    /// again: `fanout.rs`), returning when all are done.
    pub(crate) fn in_parallel<T: Send>(&self, jobs: &mut [T], each: impl Fn(&mut T) + Sync) {
        self.reads.run(jobs, each);
    }

    /// A stripe's data area rebuilt from any K good chunks, once for all
    /// readers; bad chunks on healthy members are rewritten.
    pub(crate) fn rebuilt_area(&self, slot: u64, sequence: u64) -> Result<Arc<AlignedBuf>, ArrayError> {
        self.cache.get_or_build(
            (slot, sequence),
            || {
                Counters::add(&self.counters.stripes_reconstructed, 1);
                let rebuilt = self.rebuild_stripe(slot, sequence, false)?;
                self.repair(slot, &rebuilt);
                Ok(rebuilt.area)
            },
            |area| self.recycle_area(area),
        )
    }

    /// Reads stripe (`slot`, `sequence`) back whole, rebuilding what is
    /// out or bad and checking the Merkle root; with `check_all`, every
    /// chunk is read and checked.
    pub(crate) fn rebuild_stripe(&self, slot: u64, sequence: u64, check_all: bool) -> Result<Rebuilt, ArrayError> {
        let g = &self.geometry;
        let area = self.spare_area();
        let which = stripe::Which {
            slot,
            sequence,
            array_uuid: self.array_uuid,
        };
        stripe::reconstruct(
            g,
            self.accel.as_ref(),
            which,
            check_all,
            area,
            |j| self.members.is_readable(g.place(slot, j).0),
            |reads| {
                self.in_parallel(reads, |r| {
                    let (member, row) = g.place(slot, r.index);
                    r.ok = self.members.read(member, |d| {
                        d.read_vectored_at(&mut [&mut *r.header, &mut *r.payload], g.row_offset(row))
                    });
                })
            },
        )
        .map_err(|error| match error {
            RebuildError::TooFewChunks { good } => ArrayError::TooFewChunks {
                slot,
                good,
                need: g.data,
            },
            RebuildError::RootMismatch => ArrayError::Unreadable { slot },
            RebuildError::Accel(e) => ArrayError::Accel(e),
        })
    }
}

/// Where in its stripe's data area `blocks_bytes` of an extent from block
/// `skip` are stored: those blocks of a raw extent, all of a compressed one.
fn stored_range(extent: &Extent, skip: u32, blocks_bytes: usize) -> (usize, usize) {
    match extent.codec {
        None => (extent.offset as usize + skip as usize * BLOCK_BYTES, blocks_bytes),
        Some(_) => (extent.offset as usize, extent.stored_bytes as usize),
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
pub(crate) fn where_is(index: &crate::engine::Index, slot: u64) -> Where {
    match index.resident.get(&slot) {
        Some(Resident::Open(lane)) => Where::Open(*lane),
        Some(Resident::Sealed(area)) => Where::Memory(area.clone()),
        None if index.slots.is_unread(slot) => Where::Unread,
        None => Where::Members {
            sequence: index.slots.get(slot).sequence,
        },
    }
}

/// Whether raw blocks [skip, ..) of `extent` read into `bytes` are right:
/// by their block CRCs, or by the extent's digest when read whole with a
/// stronger algorithm than CRC32C.
fn raw_ok(algorithm: Algorithm, extent: &Extent, skip: u32, bytes: &[u8]) -> bool {
    let whole = skip == 0 && bytes.len() == extent.stored_bytes as usize;
    if whole && algorithm != Algorithm::Crc32c {
        return algorithm.digest(bytes) == extent.digest;
    }
    bytes
        .chunks(BLOCK_BYTES)
        .zip(&extent.block_crcs[skip as usize..])
        .all(|(block, &crc)| tessera_checksum::crc32c(block) == crc)
}

/// Blocks [skip, ..) of `extent` from its stripe's data area `area` into
/// `out`, if they check (as read from the members).
pub(crate) fn checked_blocks(algorithm: Algorithm, extent: &Extent, skip: u32, area: &[u8], out: &mut [u8]) -> bool {
    let stored = &area[extent.offset as usize..(extent.offset + extent.stored_bytes) as usize];
    match extent.codec {
        None => {
            let from = skip as usize * BLOCK_BYTES;
            out.copy_from_slice(&stored[from..from + out.len()]);
            raw_ok(algorithm, extent, skip, out)
        }
        Some(_) => algorithm.digest(stored) == extent.digest && decompress_blocks(extent, stored, skip, out).is_ok(),
    }
}

/// Blocks [skip, ..) of a compressed extent's stored bytes, into `out`.
fn decompress_blocks(extent: &Extent, stored: &[u8], skip: u32, out: &mut [u8]) -> Result<(), ArrayError> {
    let codec = extent.codec.expect("compressed");
    let bytes = codec
        .decompress(stored, extent.blocks as usize * BLOCK_BYTES)
        .map_err(|_| ArrayError::Unreadable { slot: extent.slot })?;
    let from = skip as usize * BLOCK_BYTES;
    out.copy_from_slice(&bytes[from..from + out.len()]);
    Ok(())
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
