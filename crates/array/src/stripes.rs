//! The stripe layer: the members as a store of sealed stripes, and the
//! state that layer owns (`Stripes`).
//!
//! It reads a stripe's data area, or a range of it, straight from the
//! data chunks' members, side by side on the read threads; decodes a
//! range that lies on a member that is out from K others; rebuilds a
//! whole stripe from any K good chunks, checked against its Merkle root,
//! once for all readers (the reconstruction cache); rewrites the chunks
//! a rebuild found bad; reads chunk headers and summaries; and keeps the
//! spare data areas and sealed-stripe buffers the layers above reuse.
//!
//! # Guarantees
//!
//! - Nothing read here is handed on unchecked: a range is checked by the
//!   caller's block CRCs or digests (`raw_ok`, `checked_blocks`), a
//!   rebuilt stripe against its Merkle root, a summary against the digest
//!   in its chunk's header.
//! - It knows nothing of the map, the slot table or volumes: callers name
//!   the slot and the sequence of the stripe they want, and keep the slot
//!   pinned while they read it, so no slot is rewritten under a reader.
//! - Its own lock is the spares' mutex, a leaf held to take or give back
//!   a buffer, never across I/O or an allocation of page-locked memory.
//!   The reconstruction cache, the members and their queues keep theirs
//!   (`docs/ENGINE.md`); none is held across a read here but a stripe's
//!   own slot in the cache while that stripe is rebuilt.

use crate::cache::ReconstructCache;
use crate::counters::Counters;
use crate::device::AlignedBuf;
use crate::error::ArrayError;
use crate::format::{ChunkHeader, Extent, Geometry, Record, BLOCK_BYTES, SECTOR_BYTES};
use crate::io::MemberIo;
use crate::limits::{IO_POOL_THREADS_MAX, IO_POOL_THREADS_MIN, IO_POOL_THREADS_PER_MEMBER};
use crate::members::Members;
use crate::stripe::{self, Built, RebuildError, Rebuilt};
use std::sync::{Arc, Mutex, MutexGuard};
use tessera_accel::Accelerator;
use tessera_checksum::Algorithm;

/// Reads of at most this many bytes read their pieces (at most two or
/// three chunks) one after the other on the calling thread: handing a few
/// kilobytes to the read threads costs more in wake-ups than the reads do.
const SERIAL_READ_BYTES_MAX: usize = 16 << 10;

/// What the stripe layer owns: the members and their I/O, the array's
/// shape and accelerator, the reconstruction cache and the spare buffers.
/// The engine (`Shared`) holds one; nothing here refers back to it.
pub(crate) struct Stripes {
    pub geometry: Geometry,
    pub array_uuid: [u8; 16],
    /// A random number, not zero, for this opening of the array, in the
    /// header of every stripe it seals (`ChunkHeader::opening`).
    pub opening: u64,
    pub accel: Arc<dyn Accelerator>,
    pub members: Members,
    /// Each member's queue of chunk writes, its threads, and syncs.
    pub io: MemberIo,
    /// Threads for work in parallel that waits on members: the stripes
    /// of a rebuild batch, opening's scans and page reads.
    pub io_pool: rayon::ThreadPool,
    /// Threads that only wait on members: the chunk reads of one request
    /// go out side by side on them (`in_parallel`).
    pub reads: crate::fanout::Fanout,
    pub cache: ReconstructCache,
    /// The engine's counters, kept here, the lowest layer that counts
    /// (checksum errors, repairs, reconstructions); the layers above
    /// count through it.
    pub counters: Counters,
    spares: Mutex<Spares>,
}

/// Spare buffers, so sealing and rebuilding allocate little.
#[derive(Default)]
struct Spares {
    areas: Vec<AlignedBuf>,
    built: Vec<Built>,
    /// The accelerator's memory new stripe buffers are made in, if it
    /// lends any (see `tessera_accel::HostMemory`).
    memory: Option<Arc<dyn tessera_accel::HostMemory>>,
}

/// Spares kept at most of each kind.
const SPARES_MAX: usize = 64;

impl Stripes {
    /// The stripe layer over `members`, its threads started: each
    /// member's writers (which write through the members' counted
    /// devices), the I/O pool and the read threads (4 per member, 8 to
    /// 256); a reconstruction cache of `cache_bytes`.
    pub fn start(
        geometry: Geometry,
        array_uuid: [u8; 16],
        accel: Arc<dyn Accelerator>,
        members: Members,
        cache_bytes: usize,
    ) -> Result<Stripes, ArrayError> {
        let counters = Counters::default();
        let failed = |what| move |source| ArrayError::ThreadStart { what, source };
        let devices = (0..members.count()).map(|i| members.device(i)).collect();
        let io = MemberIo::start(&geometry, devices, counters.member_bytes_written.clone())
            .map_err(failed("member I/O threads"))?;
        let io_threads =
            (geometry.members * IO_POOL_THREADS_PER_MEMBER).clamp(IO_POOL_THREADS_MIN, IO_POOL_THREADS_MAX);
        let io_pool = rayon::ThreadPoolBuilder::new()
            .num_threads(io_threads)
            .thread_name(|i| format!("tessera-io-{i}"))
            .build()
            .map_err(|e| failed("I/O pool threads")(std::io::Error::other(e)))?;
        let reads = crate::fanout::Fanout::start(io_threads, "tessera-read").map_err(failed("read threads"))?;
        let cache = ReconstructCache::new(cache_bytes, geometry.data_area_bytes());
        let memory = accel.host_memory();
        Ok(Stripes {
            geometry,
            array_uuid,
            opening: rand::random::<u64>().max(1),
            accel,
            members,
            io,
            io_pool,
            reads,
            cache,
            counters,
            spares: Mutex::new(Spares {
                memory,
                ..Spares::default()
            }),
        })
    }

    /// Whether every data chunk of slot `slot` is on a readable member.
    pub fn data_readable(&self, slot: u64) -> bool {
        let g = &self.geometry;
        (0..g.data).all(|j| self.members.is_readable(g.place(slot, j).0))
    }

    /// Whether every chunk of slot `slot` is on a healthy member.
    pub fn all_healthy(&self, slot: u64) -> bool {
        let g = &self.geometry;
        (0..g.width()).all(|j| self.members.is_readable(g.place(slot, j).0))
    }

    /// Members a sync or a stripe is written to (a member being rebuilt
    /// is synced too: once it is readmitted, what a FLUSH covered before
    /// must be durable on it as well).
    pub fn writable_members(&self) -> Vec<usize> {
        (0..self.members.count())
            .filter(|&m| self.members.writable(m))
            .collect()
    }

    fn spares(&self) -> MutexGuard<'_, Spares> {
        self.spares.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A data area: a spare, or a new one in the accelerator's memory
    /// (made outside the spares' lock: pinning memory takes a while).
    pub fn spare_area(&self) -> AlignedBuf {
        let bytes = self.geometry.data_area_bytes();
        let (spare, memory) = {
            let mut spares = self.spares();
            (spares.areas.pop(), spares.memory.clone())
        };
        let mut area = spare.unwrap_or_else(|| AlignedBuf::zeroed_in(memory.as_ref(), bytes));
        area.resize(bytes);
        area
    }

    /// Keeps a data area for the next open stripe, if it is not shared.
    pub fn recycle_area(&self, area: Arc<AlignedBuf>) {
        if let Ok(area) = Arc::try_unwrap(area) {
            let mut spares = self.spares();
            if spares.areas.len() < SPARES_MAX {
                spares.areas.push(area);
            }
        }
    }

    /// `count` buffers for sealed stripes: spares, or new ones in the
    /// accelerator's memory (made outside the spares' lock).
    pub fn spare_built(&self, count: usize) -> Vec<Built> {
        let (mut built, memory) = {
            let mut spares = self.spares();
            let at = spares.built.len() - spares.built.len().min(count);
            (spares.built.split_off(at), spares.memory.clone())
        };
        built.resize_with(count, Built::default);
        built
            .into_iter()
            .map(|b| b.sized(&self.geometry, memory.as_ref()))
            .collect()
    }

    /// Keeps a sealed stripe's buffers for the next one.
    pub fn recycle_built(&self, built: Built) {
        let mut spares = self.spares();
        if spares.built.len() < SPARES_MAX {
            spares.built.push(built);
        }
    }

    /// Runs `each` on every job side by side when there are several, on
    /// the read threads (each job blocks on a member, and must not fan out
    /// again: `fanout.rs`), returning when all are done.
    pub(crate) fn in_parallel<T: Send>(&self, jobs: &mut [T], each: impl Fn(&mut T) + Sync) {
        self.reads.run(jobs, each);
    }

    /// Fills `out` with data-area bytes from `offset`, straight from the
    /// data chunks' members; false if a member is out or a read fails.
    pub(crate) fn read_area_into(&self, slot: u64, offset: usize, out: &mut [u8]) -> bool {
        self.read_areas_into(&mut [(slot, offset, out)])[0]
    }

    /// Fills each area's buffer with data-area bytes of its slot from its
    /// offset, straight from the data chunks' members: every chunk piece
    /// of every area side by side on the read threads, or one after the
    /// other on this thread where they come to at most
    /// `SERIAL_READ_BYTES_MAX`. Whether each area was read: not where a
    /// member it needs is out (nothing of it is read) or a read failed.
    pub(crate) fn read_areas_into(&self, areas: &mut [(u64, usize, &mut [u8])]) -> Vec<bool> {
        let g = &self.geometry;
        let mut read = vec![true; areas.len()];
        let total: usize = areas.iter().map(|area| area.2.len()).sum();
        // (area, member, position, its part of the area's buffer, done)
        let mut jobs: Vec<(usize, usize, u64, &mut [u8], bool)> = Vec::new();
        for (n, (slot, offset, out)) in areas.iter_mut().enumerate() {
            let pieces = stripe::pieces(g, *offset, out.len());
            if pieces
                .iter()
                .any(|&(chunk, ..)| !self.members.is_readable(g.place(*slot, chunk).0))
            {
                read[n] = false;
                continue;
            }
            let mut rest = &mut out[..];
            for (chunk, within, len, _) in pieces {
                let (piece, tail) = std::mem::take(&mut rest).split_at_mut(len);
                rest = tail;
                let (member, row) = g.place(*slot, chunk);
                jobs.push((
                    n,
                    member,
                    g.row_offset(row) + (SECTOR_BYTES + within) as u64,
                    piece,
                    false,
                ));
            }
        }
        let each = |(_, member, position, piece, done): &mut (usize, usize, u64, &mut [u8], bool)| {
            *done = self.members.read(*member, |device| device.read_at(piece, *position));
        };
        if total <= SERIAL_READ_BYTES_MAX {
            jobs.iter_mut().for_each(each);
        } else {
            self.in_parallel(&mut jobs, each);
        }
        for job in &jobs {
            read[job.0] &= job.4;
        }
        read
    }

    /// Bytes reading data-area range [offset, offset+len) of `slot` takes
    /// (its length where it lies on readable members, K times that where
    /// it must be decoded from K others), and whether any of it must be.
    pub(crate) fn range_cost(&self, slot: u64, offset: usize, len: usize) -> (usize, bool) {
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

    /// An extent's blocks read from the members and checked. Where a
    /// member holding them is out: the range decoded from the others (a
    /// small read), or the stripe rebuilt (a read of most of it, or when
    /// that fails); the stripe rebuilt too when a check fails.
    pub(crate) fn read_from_members(
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

    /// An extent's blocks from a rebuilt data area, checked again.
    pub(crate) fn serve_rebuilt(
        &self,
        extent: &Extent,
        skip: u32,
        area: &[u8],
        out: &mut [u8],
    ) -> Result<(), ArrayError> {
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
    pub(crate) fn decode_range(&self, slot: u64, offset: usize, len: usize) -> Option<Vec<u8>> {
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

    /// Rewrites the chunks of `rebuilt` found bad that are on healthy
    /// members (the rest are on failed ones); returns how many were bad
    /// there and how many were rewritten. A rewrite that fails is left for
    /// the next read or scrub.
    pub(crate) fn repair(&self, slot: u64, rebuilt: &Rebuilt) -> (u64, u64) {
        let g = &self.geometry;
        let bad: Vec<usize> = rebuilt
            .bad
            .iter()
            .copied()
            .filter(|&j| self.members.is_readable(g.place(slot, j).0))
            .collect();
        Counters::add(&self.counters.checksum_errors, bad.len() as u64);
        let mut header = AlignedBuf::zeroed(SECTOR_BYTES);
        let mut repaired = 0;
        for &j in &bad {
            let (bytes, payload) = rebuilt.chunk(g, j);
            header.copy_from_slice(&bytes);
            let (member, row) = g.place(slot, j);
            let written = self
                .members
                .readable(member)
                .is_some_and(|device| device.write_vectored_at(&[&header, payload], g.row_offset(row)).is_ok());
            if written {
                repaired += 1;
                self.members.repaired(member);
            }
            // Counted after the rewrite: an error that fails the member
            // must not stop the repair of the chunk that showed it.
            self.members.checksum_error(member);
        }
        Counters::add(&self.counters.chunks_repaired, repaired);
        (bad.len() as u64, repaired)
    }

    /// Whether the stripe's parity is what its data encodes to now.
    pub(crate) fn parity_matches(&self, rebuilt: &Rebuilt) -> bool {
        let g = &self.geometry;
        let data_bytes = g.data * g.chunk_bytes;
        let mut parity = AlignedBuf::zeroed(rebuilt.parity.len());
        let mut jobs = [tessera_accel::SealJob {
            data: &rebuilt.area[..data_bytes],
            parity: &mut parity,
        }];
        // An accelerator that fails is no evidence against the stripe.
        self.accel.seal(&crate::stripe::shape(g), &mut jobs).is_err() || parity[..] == rebuilt.parity[..]
    }

    pub(crate) fn read_header(&self, slot: u64, index: usize) -> Option<ChunkHeader> {
        let (member, row) = self.geometry.place(slot, index);
        let device = self.members.readable(member)?;
        let mut sector = AlignedBuf::zeroed(SECTOR_BYTES);
        device.read_at(&mut sector, self.geometry.row_offset(row)).ok()?;
        ChunkHeader::decode(&sector, self.geometry.checksum).ok()
    }

    /// The header of any chunk of stripe (`slot`, `sequence`) that reads back.
    pub(crate) fn stripe_header(&self, slot: u64, sequence: u64) -> Option<ChunkHeader> {
        (0..self.geometry.width())
            .filter_map(|j| self.read_header(slot, j))
            .find(|h| h.sequence == sequence && h.slot == slot && h.array_uuid == self.array_uuid)
    }

    /// The records of the summary at the tail of `area`, if it matches
    /// the digest in `header`.
    pub(crate) fn parse_summary(&self, area: &[u8], header: &ChunkHeader) -> Option<Vec<Record>> {
        let len = header.summary_bytes as usize;
        let bytes = area.get(area.len().checked_sub(len)?..)?;
        if self.geometry.checksum.digest(bytes) != header.summary_digest {
            return None;
        }
        crate::format::decode_summary(bytes, &self.geometry, header.slot).ok()
    }

    /// A stripe's data area (read straight from its data chunks, or
    /// rebuilt if that fails) and its summary's records.
    pub(crate) fn stripe_contents(
        &self,
        slot: u64,
        sequence: u64,
    ) -> Result<(Arc<AlignedBuf>, Vec<Record>), ArrayError> {
        let header = self
            .stripe_header(slot, sequence)
            .ok_or(ArrayError::Unreadable { slot })?;
        let mut area = self.spare_area();
        if self.read_area_into(slot, 0, &mut area) {
            if let Some(records) = self.parse_summary(&area, &header) {
                return Ok((Arc::new(area), records));
            }
        }
        let area = self.rebuilt_area(slot, sequence)?;
        let records = self
            .parse_summary(&area, &header)
            .ok_or(ArrayError::Unreadable { slot })?;
        Ok((area, records))
    }

    /// Blocks [skip, ..) of `extent` from its stripe's data area into
    /// `out`, if they check.
    pub(crate) fn extent_from_area(&self, extent: &Extent, skip: u32, area: &[u8], out: &mut [u8]) -> bool {
        checked_blocks(self.geometry.checksum, extent, skip, area, out)
    }
}

/// Where in its stripe's data area `blocks_bytes` of an extent from block
/// `skip` are stored: those blocks of a raw extent, all of a compressed one.
pub(crate) fn stored_range(extent: &Extent, skip: u32, blocks_bytes: usize) -> (usize, usize) {
    match extent.codec {
        None => (extent.offset as usize + skip as usize * BLOCK_BYTES, blocks_bytes),
        Some(_) => (extent.offset as usize, extent.stored_bytes as usize),
    }
}

/// Whether raw blocks [skip, ..) of `extent` read into `bytes` are right:
/// by their block CRCs, or by the extent's digest when read whole with a
/// stronger algorithm than CRC32C.
pub(crate) fn raw_ok(algorithm: Algorithm, extent: &Extent, skip: u32, bytes: &[u8]) -> bool {
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
pub(crate) fn decompress_blocks(extent: &Extent, stored: &[u8], skip: u32, out: &mut [u8]) -> Result<(), ArrayError> {
    let codec = extent.codec.expect("compressed");
    let bytes = codec
        .decompress(stored, extent.blocks as usize * BLOCK_BYTES)
        .map_err(|_| ArrayError::Unreadable { slot: extent.slot })?;
    let from = skip as usize * BLOCK_BYTES;
    out.copy_from_slice(&bytes[from..from + out.len()]);
    Ok(())
}
