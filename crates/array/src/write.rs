//! The write path: extents prepared outside every lock, admitted, packed
//! into the open stripe of their stream (the lanes, `lanes.rs`, place,
//! map, seal and hand them to the members); FLUSH; and finding a slot
//! when none is free (syncs, garbage collection, checkpoints).
//!
//! # Guarantees
//!
//! - A write returns once its data is in an open or sealed stripe and in
//!   the map (reads see it); FLUSH and FUA return only once every stripe
//!   holding what was written before them is on the members and synced.
//! - Compression and hashing run before any lock is taken; the open
//!   stripe's lock is held while the bytes are copied in and the records
//!   mapped, the index's only while they are mapped. Sealing a full stripe
//!   (parity, leaves, headers) and writing it happen after both are let go,
//!   so writers never queue behind one another's sealing or syncing.
//! - Every write takes the next version when it is mapped, and its record
//!   carries it; a relocated copy keeps the version it copied and is
//!   mapped only where the map still points at what was copied.
//! - Writes are admitted only if live data after them fits the array
//!   (less its reserves): a full array refuses a write with NoSpace before
//!   anything changes. Writes that overwrite as much as they add are
//!   always admitted.
//! - Syncs are shared: FLUSHes that arrive while one syncs wait for it and
//!   are covered by the next, one sync for all of them.

use crate::counters::Counters;
use crate::engine::Shared;
use crate::error::ArrayError;
use crate::format::{self, Stream, BLOCK_BYTES};
use crate::lanes::{block_crcs, folded_digest, piece_ranges, Origin, Piece, Placed, Sealing, Stored};
use crate::limits::{
    ADMIT_FRACTION, EXTENT_BLOCKS_MAX, GC_RESERVE_SLOTS, LIVE_SCALE, MAP_PAGE_BLOCKS, PARTIAL_WRITE_LOCK_COUNT,
};
use crate::slots::SlotState;
use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Mutex;
use tessera_checksum::Digest;
use tessera_compress::policy::{Blob, Hint, Policy};

/// The write path's own state, which `Shared` holds.
pub(crate) struct Writes {
    /// Read-modify-writes of partial blocks, by block number.
    pub partial: Vec<Mutex<()>>,
    /// Live bytes (times LIVE_SCALE) admitted for writes not yet mapped.
    pub admitted: Mutex<u128>,
    /// How writes are compressed (`None`: the array stores them raw).
    pub policy: Option<Policy>,
    /// Live bytes a stripe can be counted on to hold (admission).
    pub fill_bytes: u64,
}

impl Writes {
    pub fn new(geometry: &crate::format::Geometry, policy: Option<Policy>) -> Writes {
        Writes {
            partial: (0..PARTIAL_WRITE_LOCK_COUNT).map(|_| Mutex::new(())).collect(),
            admitted: Mutex::new(0),
            fill_bytes: stripe_fill_bytes(geometry, policy.as_ref()),
            policy,
        }
    }
}

/// Blocks per extent for a geometry: a raw extent of this many blocks,
/// with its summary entry, always fits an empty stripe.
pub fn extent_blocks_max(geometry: &crate::format::Geometry) -> usize {
    let algorithm = geometry.checksum;
    (1..=EXTENT_BLOCKS_MAX)
        .rev()
        .find(|&blocks| {
            blocks * BLOCK_BYTES + format::SUMMARY_HEADER_BYTES + format::data_record_bytes(algorithm, blocks)
                <= geometry.data_area_bytes()
        })
        .unwrap_or(0)
}

/// Live bytes (footprint: stored bytes and summary entries) one stripe
/// can be counted on to hold: as many raw blocks of whole extents as fit,
/// less, with compression on, half the largest compressed extent (the gap
/// a compressed extent that does not fit leaves at a stripe's end, on
/// average). What admission reckons the array holds per slot.
pub fn stripe_fill_bytes(geometry: &crate::format::Geometry, policy: Option<&tessera_compress::policy::Policy>) -> u64 {
    let algorithm = geometry.checksum;
    let per_extent = extent_blocks_max(geometry).max(1);
    let footprint = |blocks: usize| {
        let records = blocks.div_ceil(per_extent);
        blocks * (BLOCK_BYTES + 4) + records * format::data_record_bytes(algorithm, 0)
    };
    let room = geometry.data_area_bytes() - format::SUMMARY_HEADER_BYTES;
    let blocks = (0..=room / BLOCK_BYTES)
        .rev()
        .find(|&b| footprint(b) <= room)
        .unwrap_or(0);
    let gap = policy.map_or(0.0, |p| p.required_ratio * (per_extent * BLOCK_BYTES) as f64 / 2.0);
    (footprint(blocks) as f64 - gap).max(0.0) as u64
}

/// Live bytes a write has been admitted for and not yet mapped.
pub(crate) struct Admitted<'a> {
    shared: &'a Shared,
    units: u128,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        *self.shared.writes.admitted.lock().unwrap_or_else(|p| p.into_inner()) -= self.units;
    }
}

impl Shared {
    /// Writes `data` at byte `offset`. Unaligned edges are merged with the
    /// blocks' current contents under a lock on those blocks, so partial
    /// writes to one block never undo each other.
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ArrayError> {
        self.check_range(offset, data.len() as u64)?;
        self.stripes.members.check_writable()?;
        if data.is_empty() {
            return Ok(());
        }
        let block = BLOCK_BYTES as u64;
        let first = offset / block;
        let last = (offset + data.len() as u64).div_ceil(block);
        if offset.is_multiple_of(block) && data.len().is_multiple_of(BLOCK_BYTES) {
            self.write_blocks(first, data)?;
        } else {
            let _locks = self.lock_partial(first, last - 1);
            let mut blocks = vec![0u8; (last - first) as usize * BLOCK_BYTES];
            self.reader().read_blocks_into(first, &mut blocks)?;
            let skip = (offset - first * block) as usize;
            blocks[skip..skip + data.len()].copy_from_slice(data);
            self.write_blocks(first, &blocks)?;
        }
        Counters::add(&self.stripes.counters.user_bytes_written, data.len() as u64);
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    /// The partial-write locks of blocks `first` and `last`, in order.
    fn lock_partial(&self, first: u64, last: u64) -> Vec<std::sync::MutexGuard<'_, ()>> {
        let n = self.writes.partial.len() as u64;
        let mut locks = vec![(first % n) as usize, (last % n) as usize];
        locks.sort_unstable();
        locks.dedup();
        locks
            .into_iter()
            .map(|i| self.writes.partial[i].lock().unwrap_or_else(|p| p.into_inner()))
            .collect()
    }

    /// Makes `len` bytes at `offset` read as zeros. Unaligned edges are
    /// written as zeros; whole blocks become zero records (or nothing,
    /// where no block was ever written).
    pub fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), ArrayError> {
        self.check_range(offset, len)?;
        self.stripes.members.check_writable()?;
        if len == 0 {
            return Ok(());
        }
        let block = BLOCK_BYTES as u64;
        let first_whole = offset.div_ceil(block);
        let end_whole = (offset + len) / block;
        if first_whole >= end_whole {
            return self.write(offset, &vec![0u8; len as usize], fua);
        }
        if offset < first_whole * block {
            self.write(offset, &vec![0u8; (first_whole * block - offset) as usize], false)?;
        }
        if offset + len > end_whole * block {
            let tail = (offset + len - end_whole * block) as usize;
            self.write(end_whole * block, &vec![0u8; tail], false)?;
        }
        let mut pieces = Vec::new();
        let mut lba = first_whole;
        while lba < end_whole {
            let blocks = (end_whole - lba).min(u64::from(u32::MAX)) as u32;
            pieces.push(Piece {
                lba,
                blocks,
                stored: Stored::Zero,
                origin: Origin::Write,
            });
            lba += u64::from(blocks);
        }
        self.store(Stream::User, pieces)?;
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes whole blocks from `lba`.
    fn write_blocks(&self, lba: u64, data: &[u8]) -> Result<(), ArrayError> {
        let pieces = self.prepare(lba, data, Origin::Write)?;
        self.store(Stream::User, pieces)
    }

    /// Cuts whole blocks from `lba` into extents, each compressed (per the
    /// policy), hashed, or found to be zeros; no lock is held. With
    /// `Origin::Relocates`, the pieces are copies of that target at that version.
    pub(crate) fn prepare<'a>(&self, lba: u64, data: &'a [u8], origin: Origin) -> Result<Vec<Piece<'a>>, ArrayError> {
        debug_assert_eq!(data.len() % BLOCK_BYTES, 0);
        let algorithm = self.stripes.geometry.checksum;
        let per_extent = extent_blocks_max(&self.stripes.geometry) * BLOCK_BYTES;
        let mut pieces = Vec::new();
        let mut to_hash: Vec<(usize, &[u8])> = Vec::new();
        // What each extent's bytes become. Extents are compressed on all
        // cores at once: a client with one request in flight is not held to
        // one core's speed.
        enum Kind {
            Zero,
            Raw,
            Compressed(Blob),
        }
        let classify = |bytes: &[u8]| -> Result<Kind, ArrayError> {
            if bytes.iter().all(|&b| b == 0) {
                return Ok(Kind::Zero);
            }
            let Some(policy) = &self.writes.policy else {
                return Ok(Kind::Raw);
            };
            let blob = policy.compress_blob(bytes, Hint::None).map_err(ArrayError::Compress)?;
            Ok(if blob.codec.is_some() {
                Kind::Compressed(blob)
            } else {
                Kind::Raw
            })
        };
        let classes: Vec<Kind> = if self.writes.policy.is_some() && data.len() > per_extent {
            use rayon::prelude::*;
            data.par_chunks(per_extent).map(classify).collect::<Result<_, _>>()?
        } else {
            data.chunks(per_extent).map(classify).collect::<Result<_, _>>()?
        };
        for ((i, bytes), class) in data.chunks(per_extent).enumerate().zip(classes) {
            let piece_lba = lba + (i * per_extent / BLOCK_BYTES) as u64;
            let blocks = (bytes.len() / BLOCK_BYTES) as u32;
            let stored = match class {
                Kind::Zero => Stored::Zero,
                Kind::Compressed(blob) => {
                    to_hash.push((pieces.len(), &[]));
                    Stored::Compressed {
                        codec: blob.codec.expect("classified compressed"),
                        bytes: blob.bytes,
                        digest: Digest::from_bytes(&[]),
                    }
                }
                Kind::Raw => {
                    let crcs = block_crcs(bytes);
                    // Digests that do not follow from the CRCs are the
                    // accelerator's, in one batch below.
                    let digest = folded_digest(algorithm, &crcs).unwrap_or_else(|| {
                        to_hash.push((pieces.len(), bytes));
                        Digest::from_bytes(&[])
                    });
                    Stored::Raw {
                        bytes: Cow::Borrowed(bytes),
                        crcs,
                        digest,
                    }
                }
            };
            pieces.push(Piece {
                lba: piece_lba,
                blocks,
                stored,
                origin: origin.advanced_by(piece_lba - lba),
            });
        }
        // Digests the accelerator computes, as one batch.
        if !to_hash.is_empty() {
            let inputs: Vec<&[u8]> = to_hash
                .iter()
                .map(|&(i, raw)| match &pieces[i].stored {
                    Stored::Compressed { bytes, .. } => &bytes[..],
                    _ => raw,
                })
                .collect();
            let digests = self.stripes.accel.hash(algorithm, &inputs);
            for (&(i, _), digest) in to_hash.iter().zip(digests) {
                match &mut pieces[i].stored {
                    Stored::Compressed { digest: d, .. } | Stored::Raw { digest: d, .. } => *d = digest,
                    Stored::Zero => unreachable!("zeros are not hashed"),
                }
            }
        }
        Ok(merge_zero_runs(pieces))
    }

    /// Admits, packs, seals and submits pieces of `stream`.
    pub(crate) fn store(&self, stream: Stream, pieces: Vec<Piece<'_>>) -> Result<(), ArrayError> {
        // The pages the pieces land in stay in memory until mapped.
        let _pages = self.catalog.pin_pages(&piece_ranges(&pieces))?;
        let pieces = self.drop_needless_zeros(pieces);
        if pieces.is_empty() {
            return Ok(());
        }
        let claim = match stream {
            Stream::User if pieces.iter().all(|p| matches!(p.stored, Stored::Zero)) => Claim::Freeing,
            Stream::User => Claim::Write,
            _ => Claim::Collect,
        };
        let _admitted = match claim {
            Claim::Write => Some(self.admit(&pieces)?),
            _ => None,
        };
        let sealed = self.pack(stream, claim, pieces)?;
        self.lanes.submit(sealed)
    }

    /// Zero pieces need a record only over blocks that are mapped: the
    /// others read as zeros already, and no older record of them can come
    /// back at recovery (a write is mapped when it takes its version; a
    /// deleted volume's records are barred by its floor). So a client's
    /// zero piece is cut to the runs of mapped blocks in it (runs closer
    /// than a map page merged): zeroing a huge, thinly written range (a
    /// shrink, a TRIM of a whole device) records and maps zeros only where
    /// data was, as the map holds zeros as an entry per page they cover.
    /// Relocations of zero records are kept whole.
    fn drop_needless_zeros<'a>(&self, pieces: Vec<Piece<'a>>) -> Vec<Piece<'a>> {
        let client_zeros = |p: &Piece<'_>| matches!((&p.stored, &p.origin), (Stored::Zero, Origin::Write));
        if !pieces.iter().any(client_zeros) {
            return pieces;
        }
        let index = self.catalog.index();
        let mut kept = Vec::with_capacity(pieces.len());
        for piece in pieces {
            if !client_zeros(&piece) {
                kept.push(piece);
                continue;
            }
            let end = piece.lba + u64::from(piece.blocks);
            let mut runs: Vec<(u64, u64)> = Vec::new();
            for (start, blocks) in index.map.overlapping(piece.lba, end).spans() {
                let (lo, hi) = (start.max(piece.lba), (start + u64::from(blocks)).min(end));
                match runs.last_mut() {
                    Some(run) if lo < run.1 + MAP_PAGE_BLOCKS => run.1 = hi,
                    _ => runs.push((lo, hi)),
                }
            }
            kept.extend(runs.into_iter().map(|(lo, hi)| Piece {
                lba: lo,
                blocks: u32::try_from(hi - lo).expect("a run lies inside its piece"),
                stored: Stored::Zero,
                origin: Origin::Write,
            }));
        }
        kept
    }

    /// Checks that live data after these pieces fits, counting what they
    /// overwrite as freed; refuses with NoSpace, changing nothing.
    ///
    /// While a replay's records wait to be mapped (`index::Pending`), the
    /// slot table still counts what they overwrite as live beside what
    /// they add: where that count refuses, every waiting record is mapped
    /// (`Deferred::finish_replay`) and the write asked about again.
    fn admit(&self, pieces: &[Piece<'_>]) -> Result<Admitted<'_>, ArrayError> {
        match self.admit_now(pieces) {
            Err(ArrayError::NoSpace) if self.catalog.index().pending.is_some() => {
                self.deferred.finish_replay()?;
                self.admit_now(pieces)
            }
            other => other,
        }
    }

    fn admit_now(&self, pieces: &[Piece<'_>]) -> Result<Admitted<'_>, ArrayError> {
        let algorithm = self.stripes.geometry.checksum;
        let incoming: u128 =
            pieces.iter().map(|p| u128::from(p.footprint(algorithm))).sum::<u128>() * u128::from(LIVE_SCALE);
        let index = self.catalog.index();
        let mut overwritten: u128 = 0;
        for p in pieces {
            for (start, mapping) in index.map.overlapping(p.lba, p.lba + u64::from(p.blocks)) {
                let lo = start.max(p.lba);
                let hi = (start + u64::from(mapping.blocks)).min(p.lba + u64::from(p.blocks));
                overwritten += u128::from(index.slots.footprint(&mapping.target, (hi - lo) as u32));
            }
        }
        // Slots that never hold live data: GC's reserve, the open stripes,
        // the durable checkpoint (its root and map stripes) and room for
        // the next, and one more for the open stripes' tails.
        let reserved_slots = GC_RESERVE_SLOTS
            + self.lanes.open.len()
            + index.checkpoint_slots.len()
            + index.map_stripes
            + self.checkpoints.checkpoint_reserve(&index)
            + 1;
        let slots = (index.slots.count() as usize).saturating_sub(reserved_slots) as u128;
        let capacity = (slots as f64 * self.writes.fill_bytes as f64 * ADMIT_FRACTION) as u128 * u128::from(LIVE_SCALE);
        // With what a replay's records not mapped yet will add.
        let live = index.slots.live_units() + index.pending.as_ref().map_or(0, |p| p.live_left());
        drop(index);
        // Summary entries are not held against a write: an overwrite may
        // cut its extents where the write it replaces did not, and must
        // not be refused for the few bytes of entries that costs.
        let entries: u128 = pieces
            .iter()
            .map(|p| match &p.stored {
                Stored::Zero => 0,
                Stored::Raw { crcs, .. } => format::data_record_bytes(algorithm, crcs.len()) as u128,
                Stored::Compressed { .. } => format::data_record_bytes(algorithm, 0) as u128,
            })
            .sum::<u128>()
            * u128::from(LIVE_SCALE);
        let units = incoming.saturating_sub(overwritten + entries);
        let mut admitted = self.writes.admitted.lock().unwrap_or_else(|p| p.into_inner());
        // A write that adds nothing net is always taken, even when the
        // reserves grew past what is live.
        if units > 0 && live + *admitted + units > capacity {
            return Err(ArrayError::NoSpace);
        }
        *admitted += units;
        Ok(Admitted { shared: self, units })
    }

    /// Packs pieces into `stream`'s open stripe, opening and sealing
    /// stripes as they fill; returns the stripes sealed.
    pub(crate) fn pack(
        &self,
        stream: Stream,
        claim: Claim,
        pieces: Vec<Piece<'_>>,
    ) -> Result<Vec<Sealing>, ArrayError> {
        // Nothing to place opens no stripe: where the window has no usable
        // slot that would collect garbage, which first maps every record a
        // replay left for after opening (1.2 s of a 2.2-2.3 s opening of a
        // killed full array, for an intent log whose records were all in
        // stripes already: PERFORMANCE.md, "Opening after kill -9: M+1
        // headers a slot").
        if pieces.is_empty() {
            return Ok(Vec::new());
        }
        let mut queue: VecDeque<Piece> = pieces.into();
        let mut sealed = Vec::new();
        // Each round packs at least one piece or finds a slot; a slot that
        // other writers keep taking first ends in NoSpace, not forever.
        for _ in 0..(16 + 4 * queue.len()) * 64 {
            let lba = queue.front().map_or(0, |p| p.lba);
            let (mut lane, mut guard) = self.lanes.lane_for(stream, lba);
            let mut stream = stream;
            if guard.is_none() && claim == Claim::CollectMixed {
                // A client stripe opened for GC's copies would take GC's
                // reserve, and clients would fill it: GC's own lane.
                drop(guard);
                stream = Stream::Gc;
                (lane, guard) = self.lanes.lane_for(stream, lba);
            }
            if guard.is_none() {
                match self.lanes.open_slot(stream, lane, &|index| self.has_room(index, claim)) {
                    Some(open) => {
                        *guard = Some(open);
                        self.maintenance.wake();
                    }
                    None => {
                        drop(guard);
                        // What this request filled goes out first: its
                        // drains may be what frees a slot.
                        self.lanes.submit(std::mem::take(&mut sealed))?;
                        let started = std::time::Instant::now();
                        let made = self.make_room(claim);
                        Counters::add(
                            &self.stripes.counters.waited_for_slot_us,
                            started.elapsed().as_micros() as u64,
                        );
                        made?;
                        continue;
                    }
                }
            }
            let open = guard.as_mut().expect("opened above");
            let mut origins = Vec::new();
            while let Some(piece) = queue.pop_front() {
                let origin = piece.origin.clone();
                match self.lanes.place(open, piece) {
                    Placed::All => origins.push(origin),
                    Placed::Part(rest) => {
                        origins.push(origin);
                        queue.push_front(rest);
                        break;
                    }
                    Placed::Nothing(piece) => {
                        assert!(!open.is_empty(), "one extent always fits an empty stripe");
                        queue.push_front(piece);
                        break;
                    }
                }
            }
            self.lanes.map_records(open, origins);
            if queue.is_empty() {
                return Ok(sealed);
            }
            // Full: sealed now, a new one opened next round.
            let full = guard.take().expect("open");
            sealed.extend(self.lanes.seal_open(full, SlotState::Sealed));
        }
        self.lanes.submit(sealed)?;
        Err(ArrayError::NoSpace)
    }

    /// Whether `claim` may take a usable slot: user data leaves garbage
    /// collection its reserve and the next checkpoint its stripes; zero
    /// records, which free space, leave collection its last slot.
    pub(crate) fn has_room(&self, index: &crate::index::Index, claim: Claim) -> bool {
        let (usable, free) = (index.slots.usable_count(), index.slots.free_count());
        match claim {
            Claim::Write => {
                usable > GC_RESERVE_SLOTS && free > GC_RESERVE_SLOTS + self.checkpoints.checkpoint_reserve(index)
            }
            Claim::Freeing => usable > 1 && free > 1,
            Claim::Collect | Claim::CollectMixed => usable > 0,
        }
    }

    /// FLUSH: logs what the open user stripes hold (or, without a log,
    /// seals them short) and returns once every stripe sealed so far is on
    /// the members and synced. Garbage collection's copies need not be
    /// durable (what they copied stays until they are).
    pub fn flush(&self) -> Result<(), ArrayError> {
        self.stripes.members.check_writable()?;
        match &self.intent {
            Some(log) => log.commit()?,
            None => {
                self.lanes.seal_user_lanes()?;
            }
        }
        let target = self.lanes.tracker.last_sequence();
        self.lanes.sync_through(target)?;
        self.wait_named(target)?;
        Counters::add(&self.stripes.counters.flushes, 1);
        self.stripes.members.check_writable()
    }

    /// Returns once recovery from the durable checkpoint finds every
    /// stripe up to `target`: at once, unless one was sealed in a slot
    /// taken early (`TrackerState::unnamed_from`); then once the
    /// checkpoint being written is durable, or one taken here is (the one
    /// under way may have failed).
    fn wait_named(&self, target: u64) -> Result<(), ArrayError> {
        let named = || self.lanes.tracker.lock().recoverable_through() >= target;
        if named() {
            return Ok(());
        }
        let started = std::time::Instant::now();
        self.checkpoints.wait_for_one_under_way();
        // The stripes up to `target` are sealed, so a checkpoint that
        // begins after this names them (those taken early are in its
        // pages, or in its window), and syncs them: one pass.
        if !named() {
            self.checkpoints.take_checkpoint(false)?;
        }
        debug_assert!(named(), "a checkpoint names every stripe sealed before it");
        Counters::add(
            &self.stripes.counters.flushes_waited_for_checkpoint_ms,
            started.elapsed().as_millis() as u64,
        );
        Ok(())
    }

    /// Finds a usable slot for `claim` when there is none: syncs stripes
    /// whose drains would free slots, writes a checkpoint if free slots
    /// lie outside the window, or collects garbage (not for the GC stream
    /// itself); as a last resort takes a checkpoint anyway, or drops it;
    /// NoSpace if none of that frees a slot, tried again while stripes are
    /// sealed meanwhile (`MAKE_ROOM_TRIES`): writers race for the slots
    /// collection frees, and on a nearly full array of eight random
    /// overwriters (`tests/space.rs`, looped) one lost every slot its
    /// rounds freed to the other seven and was refused (round 7 of a loop;
    /// with the retries, 300 rounds were refused nothing).
    fn make_room(&self, claim: Claim) -> Result<(), ArrayError> {
        let mut sealed = self.lanes.tracker.last_sequence();
        let mut tries = 1;
        loop {
            match self.make_room_once(claim) {
                Err(ArrayError::NoSpace)
                    if tries < crate::limits::MAKE_ROOM_TRIES && self.lanes.tracker.last_sequence() != sealed =>
                {
                    sealed = self.lanes.tracker.last_sequence();
                    tries += 1;
                }
                made => return made,
            }
        }
    }

    /// One try of `make_room`.
    fn make_room_once(&self, claim: Claim) -> Result<(), ArrayError> {
        let room = |shared: &Shared| shared.has_room(&shared.catalog.index(), claim);
        // Nothing is freed while a checkpoint is written: wait for one in
        // progress, which frees what drained meanwhile as it ends.
        self.checkpoints.wait_for_one_under_way();
        if room(self) {
            return Ok(());
        }
        // Emptied slots that wait for open user stripes (a write in one
        // superseded their blocks), or for a sync, are freed by sealing
        // those and syncing: writers that need room fill no stripe.
        let drain = || -> Result<Option<u64>, ArrayError> {
            self.lanes.seal_awaited_user_stripes()?;
            let drained = self.catalog.index().slots.draining_sequence_max();
            if let Some(sequence) = drained {
                self.lanes.sync_through(sequence)?;
            }
            Ok(drained)
        };
        let drained = drain()?;
        if drained.is_some() && room(self) {
            return Ok(());
        }
        let outside = {
            let index = self.catalog.index();
            index.slots.free_count() > index.slots.usable_count() + self.checkpoints.checkpoint_reserve(&index)
        };
        if outside {
            self.checkpoints.checkpoint_as_needed()?;
            if room(self) {
                return Ok(());
            }
        }
        let collect = || -> Result<bool, ArrayError> {
            if matches!(claim, Claim::Collect | Claim::CollectMixed) {
                return Ok(false);
            }
            // Rounds go on while they empty stripes; admission keeps live
            // data below what the array holds, so some stripe holds garbage.
            for _ in 0..self.stripes.geometry.slot_count() {
                let emptied = self.collect_garbage(true)?;
                self.checkpoints.wait_for_one_under_way();
                if room(self) {
                    return Ok(true);
                }
                // Victims a write superseded blocks of drain only once the
                // user stripe holding the write is sealed (see `drain`).
                if emptied.is_some_and(|n| n > 0) {
                    drain()?;
                    if room(self) {
                        return Ok(true);
                    }
                }
                if emptied == Some(0) {
                    break;
                }
            }
            Ok(false)
        };
        if collect()? {
            return Ok(());
        }
        // The window is spent, the free slots outside it are fewer than a
        // checkpoint may need at worst, and collection found no slot for
        // its copies (`tests/space.rs` once wedged here) or nothing to
        // empty (a replay's records still waiting may hide the garbage:
        // the checkpoint maps them first). The checkpoint
        // the map needs now may still fit (the reserve is its worst case);
        // if not, it is dropped: the superblocks say there is none, its
        // slots are freed and every free slot is usable (recovery scans
        // them all until the next checkpoint is written).
        if !outside && self.catalog.index().slots.window().is_some() {
            Counters::add(&self.stripes.counters.checkpoints_forced, 1);
            self.checkpoints.checkpoint_as_needed()?;
            if room(self) || collect()? {
                return Ok(());
            }
        }
        Err(ArrayError::NoSpace)
    }
}

/// Who asks for a slot, which sets how much of the reserve it may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Client data.
    Write,
    /// Only zero records (TRIM, WRITE_ZEROES): they free space.
    Freeing,
    /// Garbage collection's copies.
    Collect,
    /// Garbage collection's copies, into the client stripe open where
    /// each goes, or GC's own where none is (`EngineOptions::gc_stream`
    /// off).
    CollectMixed,
}

/// Joins consecutive zero pieces of a new write into one record.
fn merge_zero_runs(pieces: Vec<Piece<'_>>) -> Vec<Piece<'_>> {
    let mut out: Vec<Piece> = Vec::with_capacity(pieces.len());
    for piece in pieces {
        if let (Some(last), Stored::Zero) = (out.last_mut(), &piece.stored) {
            let adjacent = last.lba + u64::from(last.blocks) == piece.lba;
            let both_written = matches!((&last.origin, &piece.origin), (Origin::Write, Origin::Write));
            if matches!(last.stored, Stored::Zero) && adjacent && both_written {
                last.blocks += piece.blocks;
                continue;
            }
        }
        out.push(piece);
    }
    out
}
