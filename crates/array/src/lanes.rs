//! The lanes: the open stripes writes are packed into (one per region
//! of the user stream, then garbage collection's), each piece placed and
//! its record mapped under the open stripe's lock; sealing a stripe with
//! the next sequence; building sealed stripes and handing them to the
//! members; and syncing them. The write path (admission, FLUSH, finding
//! room), garbage collection, checkpoints and the intent log are built on
//! it; it knows nothing of them (a caller that finds no slot makes room
//! itself, and says what reserve a slot must leave).
//!
//! # Guarantees
//!
//! - A piece's bytes are in its open stripe before its record is mapped,
//!   and both happen under the open stripe's lock, so a reader that finds
//!   the mapping finds the bytes (in the open stripe, the sealed area kept
//!   in memory, or the members).
//! - Every new write takes the next version when it is mapped, and its
//!   record carries it; a relocated copy keeps the version it copied and
//!   is mapped only where the map still points at what was copied.
//! - A slot emptied drains only after the stripe that emptied it is
//!   synced and, where a write into a user stripe still open superseded
//!   one of its records, once every user stripe up to that one is sealed
//!   (`Index::drain_emptied`).
//! - A sealed stripe's area stays readable in memory until all its chunks
//!   are on the members (or for good, once writes are refused and some
//!   member did not take it); the bytes handed to the members and not
//!   yet written stay bounded (`Tracker::wait_for_room`).
//! - Syncs are shared: callers that arrive while one syncs wait for it
//!   and are covered by the next, one sync for all of them; a member
//!   whose sync fails is failed.

use crate::catalog::Catalog;
use crate::counters::Counters;
use crate::error::ArrayError;
use crate::format::{self, Extent, Record, Stream, BLOCK_BYTES, SECTOR_BYTES};
use crate::index::{Index, Resident};
use crate::io::{StripeDone, StripeWrite};
use crate::map::{Rule, Target};
use crate::slots::SlotState;
use crate::stripe::{self, Built, OpenStripe, StripeInfo};
use crate::stripes::Stripes;
use crate::tracker::Tracker;
use std::borrow::Cow;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use tessera_checksum::{Algorithm, Digest};

/// Bytes of one sealed stripe on the members.
pub(crate) fn stripe_bytes(geometry: &format::Geometry) -> usize {
    geometry.width() * (SECTOR_BYTES + geometry.chunk_bytes)
}

/// What one record of a write stores.
pub(crate) enum Stored<'a> {
    Zero,
    /// Raw blocks, the CRC32C of each, and the digest of them all.
    Raw {
        bytes: Cow<'a, [u8]>,
        crcs: format::BlockCrcs,
        digest: Digest,
    },
    Compressed {
        codec: tessera_compress::Codec,
        bytes: Vec<u8>,
        digest: Digest,
    },
}

/// One record to pack: blocks [lba, lba+blocks) and what they store.
pub(crate) struct Piece<'a> {
    pub lba: u64,
    pub blocks: u32,
    pub stored: Stored<'a>,
    pub origin: Origin,
}

/// Where a piece comes from, which sets the version it is mapped with.
#[derive(Clone)]
pub(crate) enum Origin {
    /// A client's write: the next version, over whatever is there.
    Write,
    /// Garbage collection's copy of a target at that write's version:
    /// mapped only where the map still points at what was copied.
    Relocates(Target, u64),
    /// An intent log record replayed at open, with its write's version:
    /// mapped where nothing newer is.
    Replays(u64),
}

impl Origin {
    /// The origin of the part `blocks` blocks into a piece of this one.
    pub fn advanced_by(&self, blocks: u64) -> Origin {
        match self {
            Origin::Relocates(target, version) => Origin::Relocates(target.advanced_by(blocks), *version),
            other => other.clone(),
        }
    }
}

impl Piece<'_> {
    /// Bytes it will take in a stripe, its summary entry included.
    pub fn footprint(&self, algorithm: Algorithm) -> u64 {
        (match &self.stored {
            Stored::Zero => format::zero_record_bytes(),
            Stored::Raw { bytes, crcs, .. } => bytes.len() + format::data_record_bytes(algorithm, crcs.len()),
            Stored::Compressed { bytes, .. } => bytes.len() + format::data_record_bytes(algorithm, 0),
        }) as u64
    }
}

/// The key ranges pieces cover.
pub(crate) fn piece_ranges(pieces: &[Piece<'_>]) -> Vec<(u64, u64)> {
    pieces.iter().map(|p| (p.lba, p.lba + u64::from(p.blocks))).collect()
}

// `crc32c_of_4k_blocks` (a raw extent's digest from its blocks' CRCs).
const _: () = assert!(BLOCK_BYTES == 4096);

pub(crate) fn block_crcs(bytes: &[u8]) -> format::BlockCrcs {
    bytes.chunks(BLOCK_BYTES).map(tessera_checksum::crc32c).collect()
}

/// A raw extent's digest from its blocks' CRCs, with no pass over its
/// bytes, where the array's digest is CRC32C (the CRC of the blocks one
/// after another); `None` for the other algorithms, which hash the bytes.
pub(crate) fn folded_digest(algorithm: Algorithm, crcs: &[u32]) -> Option<Digest> {
    (algorithm == Algorithm::Crc32c)
        .then(|| tessera_checksum::crc32c_digest(tessera_checksum::crc32c_of_4k_blocks(crcs)))
}

/// A stripe sealed (sequence given, data area final) and not yet built.
pub(crate) struct Sealing {
    pub info: StripeInfo,
    pub area: Arc<crate::device::AlignedBuf>,
}

/// The lanes and what they stand on (see the module's doc).
pub(crate) struct Lanes {
    /// These lanes, for the stripes handed to the member threads, which
    /// report back when each is written.
    me: Weak<Lanes>,
    stripes: Arc<Stripes>,
    catalog: Arc<Catalog>,
    /// The open stripes: the user lanes, then the GC stream's (last).
    pub open: Vec<Mutex<Option<OpenStripe>>>,
    /// Sequences, and how far writes and syncs have gone.
    pub tracker: Tracker,
}

impl Lanes {
    /// `lanes` open stripes (the GC stream's included), none open yet.
    pub fn new(stripes: Arc<Stripes>, catalog: Arc<Catalog>, lanes: usize) -> Arc<Lanes> {
        Arc::new_cyclic(|me| Lanes {
            me: me.clone(),
            stripes,
            catalog,
            open: (0..lanes).map(|_| Mutex::new(None)).collect(),
            tracker: Tracker::new(),
        })
    }

    /// The open stripe of `lane` (see `open`), locked.
    pub fn open_lane(&self, lane: usize) -> MutexGuard<'_, Option<OpenStripe>> {
        self.open[lane].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The GC stream's lane.
    pub fn gc_lane(&self) -> usize {
        self.open.len() - 1
    }

    /// The user lanes.
    pub fn user_lanes(&self) -> std::ops::Range<usize> {
        0..self.open.len() - 1
    }

    /// The lane a writer of `stream` at block `lba` fills, locked. User
    /// data goes by region of the volume (`LANE_REGION_BLOCKS`), so that
    /// writers of different regions fill different stripes at once, while
    /// a region written in order lies in order in its lane's stripes (a
    /// later sequential read reads whole chunks, not pieces of four
    /// interleaved stripes).
    pub fn lane_for(&self, stream: Stream, lba: u64) -> (usize, MutexGuard<'_, Option<OpenStripe>>) {
        let lane = match stream {
            Stream::Gc => self.gc_lane(),
            Stream::Meta => unreachable!("checkpoint stripes are never left open"),
            Stream::User => (lba / crate::limits::LANE_REGION_BLOCKS % self.user_lanes().len() as u64) as usize,
        };
        (lane, self.open_lane(lane))
    }

    /// Puts as much of `piece` as fits into `open`.
    pub fn place<'a>(&self, open: &mut OpenStripe, piece: Piece<'a>) -> Placed<'a> {
        let algorithm = self.stripes.geometry.checksum;
        let slot = open.slot;
        match piece.stored {
            Stored::Zero => {
                if !open.fits(false, 0, format::zero_record_bytes()) {
                    return Placed::Nothing(piece);
                }
                open.push_record(
                    algorithm,
                    Record::Zero {
                        lba: piece.lba,
                        blocks: piece.blocks,
                        version: 0,
                    },
                );
                Placed::All
            }
            Stored::Compressed {
                codec,
                ref bytes,
                digest,
            } => {
                if !open.fits(false, bytes.len(), format::data_record_bytes(algorithm, 0)) {
                    return Placed::Nothing(piece);
                }
                let offset = open.push_data(bytes, false);
                let extent = Extent {
                    slot,
                    offset,
                    stored_bytes: bytes.len() as u32,
                    blocks: piece.blocks,
                    codec: Some(codec),
                    digest,
                    block_crcs: format::BlockCrcs::new(),
                };
                open.push_record(algorithm, data_record(piece.lba, extent));
                Placed::All
            }
            Stored::Raw { .. } => {
                let fit = open.raw_blocks_that_fit(algorithm, piece.blocks as usize);
                if fit == 0 {
                    return Placed::Nothing(piece);
                }
                let (head, rest) = if fit < piece.blocks as usize {
                    let (head, rest) = split_raw(algorithm, piece, fit);
                    (head, Some(rest))
                } else {
                    (piece, None)
                };
                let Stored::Raw { bytes, crcs, digest } = head.stored else {
                    unreachable!("split keeps raw pieces raw")
                };
                let offset = open.push_data(&bytes, true);
                let extent = Extent {
                    slot,
                    offset,
                    stored_bytes: bytes.len() as u32,
                    blocks: head.blocks,
                    codec: None,
                    digest,
                    block_crcs: crcs,
                };
                open.push_record(algorithm, data_record(head.lba, extent));
                match rest {
                    Some(rest) => Placed::Part(rest),
                    None => Placed::All,
                }
            }
        }
    }

    /// Maps the records `open` took since it was last mapped, in order:
    /// each new write takes the next version; each relocation keeps its
    /// version and maps only where the map still points at what it copied.
    /// Slots this empties drain once `open` is synced.
    pub fn map_records(&self, open: &mut OpenStripe, origins: Vec<Origin>) {
        debug_assert_eq!(open.mapped + origins.len(), open.records.len());
        let mut index = self.catalog.index_mut();
        for (record, origin) in open.records[open.mapped..].iter_mut().zip(origins) {
            let (lba, blocks, target) = match &*record {
                Record::Data { lba, extent, .. } => (
                    *lba,
                    extent.blocks,
                    Target::Data {
                        extent: Arc::new(extent.clone()),
                        skip: 0,
                    },
                ),
                Record::Zero { lba, blocks, .. } => (*lba, *blocks, Target::Zero { slot: open.slot }),
            };
            let deltas = match origin {
                Origin::Write => {
                    let version = index.next_version;
                    index.next_version += 1;
                    record.set_version(version);
                    let deltas = index.map.insert(lba, blocks, version, &target, Rule::Always);
                    if let Some(&serial) = index.user_open.get(&open.slot) {
                        index.slots.superseded(&deltas, serial);
                    }
                    deltas
                }
                Origin::Relocates(copied, version) => {
                    record.set_version(version);
                    let rule = Rule::IfStill {
                        target: &copied,
                        version,
                    };
                    index.map.insert(lba, blocks, version, &target, rule)
                }
                Origin::Replays(version) => {
                    record.set_version(version);
                    index.next_version = index.next_version.max(version + 1);
                    // A logged write to a volume deleted since is not mapped.
                    let deltas = match index.volumes.admits(lba, version) {
                        true => index.map.insert(lba, blocks, version, &target, Rule::IfNotNewer),
                        false => Vec::new(),
                    };
                    if let Some(&serial) = index.user_open.get(&open.slot) {
                        index.slots.superseded(&deltas, serial);
                    }
                    deltas
                }
            };
            let emptied = index.slots.account(&deltas);
            if !emptied.is_empty() {
                index.drain_at_seal.entry(open.slot).or_default().extend(emptied);
            }
        }
        open.mapped = open.records.len();
    }

    /// A new open stripe for `stream` in a usable slot, if `room` (the
    /// caller's reserve rule, looked at under the index's lock) allows one.
    pub fn open_slot(&self, stream: Stream, lane: usize, room: &dyn Fn(&Index) -> bool) -> Option<OpenStripe> {
        let area = self.stripes.spare_area();
        let mut index = self.catalog.index_mut();
        if !room(&index) {
            drop(index);
            self.stripes.recycle_area(Arc::new(area));
            return None;
        }
        let slot = index
            .slots
            .allocate(|s| self.stripes.all_healthy(s), &self.catalog.pins)?;
        index.resident.insert(slot, Resident::Open(lane));
        if stream == Stream::User {
            let serial = index.user_serial_next;
            index.user_serial_next += 1;
            index.user_open.insert(slot, serial);
        }
        drop(index);
        Some(OpenStripe::new(slot, stream, area, &self.stripes.geometry))
    }

    /// Seals an open stripe with the next sequence; an open stripe that
    /// took nothing gives its slot back instead.
    pub fn seal_open(&self, open: OpenStripe, state: SlotState) -> Option<Sealing> {
        if open.is_empty() && open.stream != Stream::Meta {
            let mut index = self.catalog.index_mut();
            index.resident.remove(&open.slot);
            index.slots.release_open(open.slot);
            if open.stream == Stream::User {
                // It held no records: none of the slots waiting on it is
                // waiting for anything but stripes sealed already.
                index.user_open.remove(&open.slot);
                let sealed = index.last_sealed;
                user_stripe_done(&mut index, sealed);
            }
            return None;
        }
        let sequence = self.tracker.assign_many(1);
        Some(self.seal_as(open, state, sequence))
    }

    /// Seals an open stripe as `sequence` (assigned to it): its summary
    /// into the data area, and the area kept in memory for readers until
    /// it is written. Slots its records emptied drain once it is synced,
    /// and the user stripes holding writes that superseded what they held
    /// are sealed and synced too.
    pub fn seal_as(&self, mut open: OpenStripe, state: SlotState, sequence: u64) -> Sealing {
        let synced_through = self.tracker.lock().synced_through;
        let info = stripe::finish(
            &self.stripes.geometry,
            &mut open,
            sequence,
            synced_through,
            self.stripes.opening,
        );
        open.sealed_as.store(sequence, std::sync::atomic::Ordering::Release);
        let area = Arc::new(std::mem::take(&mut open.data));
        let mut index = self.catalog.index_mut();
        if open.stream != Stream::Meta && index.slots.outside_window(open.slot) {
            // Taken early: durable only once the checkpoint being written
            // (or a later one) is (a checkpoint names its own stripes).
            let mut t = self.tracker.lock();
            t.unnamed_from = Some(t.unnamed_from.map_or(sequence, |first| first.min(sequence)));
            Counters::add(&self.stripes.counters.stripes_sealed_early, 1);
        }
        let empty = index.slots.sealed(open.slot, sequence, state);
        index.resident.insert(open.slot, Resident::Sealed(area.clone()));
        index.last_sealed = index.last_sealed.max(sequence);
        if open.stream != Stream::Meta {
            index.last_data_sealed = index.last_data_sealed.max(sequence);
        }
        // A slot emptied here (by this stripe's records, or this stripe
        // itself, all it took overwritten while it was open) may hold the
        // last durable copy of blocks whose newer writes are in a user
        // stripe still open: garbage collection leaves behind records a
        // write superseded, and a crash loses open stripes. Such a slot
        // drains once that user stripe is sealed too (any sealed before
        // this one has a smaller sequence, and is synced with it).
        let mut drains = index.drain_at_seal.remove(&open.slot).unwrap_or_default();
        if empty {
            drains.push(open.slot);
        }
        if open.stream == Stream::User {
            index.user_open.remove(&open.slot);
        }
        for slot in drains {
            index.drain_emptied(slot, sequence);
        }
        if open.stream == Stream::User {
            user_stripe_done(&mut index, sequence);
        }
        drop(index);
        Counters::add(&self.stripes.counters.stripes_sealed, 1);
        Sealing { info, area }
    }

    /// Builds sealed stripes (one accelerator batch) and hands their
    /// chunks to the members, waiting while too much is in flight.
    pub fn submit(&self, sealed: Vec<Sealing>) -> Result<(), ArrayError> {
        if sealed.is_empty() {
            return Ok(());
        }
        let mut built = self.stripes.spare_built(sealed.len());
        {
            let mut batch: Vec<(&[u8], &StripeInfo, &mut Built)> = sealed
                .iter()
                .zip(built.iter_mut())
                .map(|(s, b)| (&s.area[..], &s.info, b))
                .collect();
            stripe::build(
                &self.stripes.geometry,
                self.stripes.accel.as_ref(),
                self.stripes.array_uuid,
                &mut batch,
            )
            .expect("the accelerator seals stripes of the array's own shape");
        }
        let done: Arc<dyn StripeDone> = self.me.upgrade().expect("the lanes outlive their writers");
        let bytes = stripe_bytes(&self.stripes.geometry);
        for (s, b) in sealed.into_iter().zip(built) {
            let started = std::time::Instant::now();
            self.tracker.wait_for_room(bytes);
            Counters::add(
                &self.stripes.counters.waited_for_members_us,
                started.elapsed().as_micros() as u64,
            );
            let write = StripeWrite::new(s.info.slot, s.info.sequence, s.area, b, bytes, done.clone());
            self.stripes
                .io
                .submit(Arc::new(write), |m| self.stripes.members.writable(m));
        }
        Ok(())
    }

    /// Seals the open stripe of `lane`, however full (FLUSH, checkpoints).
    pub fn seal_lane(&self, lane: usize) -> Option<Sealing> {
        // Sealed under the open stripe's lock: a reader that found the
        // stripe open and waits for the lock then finds it sealed.
        let mut guard = self.open_lane(lane);
        let open = guard.take()?;
        let sealing = self.seal_open(open, SlotState::Sealed);
        drop(guard);
        let sealing = sealing?;
        Counters::add(&self.stripes.counters.short_stripes_sealed, 1);
        Some(sealing)
    }

    /// Seals every open user stripe, however full, and submits them;
    /// returns how many there were.
    pub fn seal_user_lanes(&self) -> Result<usize, ArrayError> {
        let sealed: Vec<Sealing> = self.user_lanes().filter_map(|lane| self.seal_lane(lane)).collect();
        let count = sealed.len();
        self.submit(sealed)?;
        Ok(count)
    }

    /// Seals the open user stripes, short if need be, when emptied slots
    /// wait for them (see `seal_as`): a writer that needs room, or
    /// maintenance when usable slots run low, does this rather than wait
    /// for clients to fill them. Returns whether it sealed any.
    pub fn seal_awaited_user_stripes(&self) -> Result<bool, ArrayError> {
        if self.catalog.index().drain_after_user.is_empty() {
            return Ok(false);
        }
        Ok(self.seal_user_lanes()? > 0)
    }

    /// Returns once every stripe up to `target` is written and synced. One
    /// caller syncs the members at a time; the others wait and are covered
    /// by the sync that follows. Members whose sync fails are failed.
    pub fn sync_through(&self, target: u64) -> Result<(), ArrayError> {
        let mut t = self.tracker.lock();
        // Each pass either returns, syncs, or waits for a write or a sync
        // to finish; every stripe in flight finishes.
        loop {
            if t.synced_through >= target {
                return Ok(());
            }
            if t.syncing || t.written_through() < target {
                t = self.tracker.wait(t);
                continue;
            }
            t.syncing = true;
            let written = t.written_through();
            drop(t);
            let failures = self.stripes.io.sync(&self.stripes.writable_members());
            for (member, error) in &failures {
                // A member past the parity marks the array lost; the
                // caller's check of it reports that.
                let _ = self.stripes.members.failed_io(*member, error);
            }
            t = self.tracker.lock();
            t.syncing = false;
            t.synced_through = t.synced_through.max(written);
            let recoverable = t.recoverable_through();
            self.tracker.changed.notify_all();
            drop(t);
            Counters::add(&self.stripes.counters.syncs, 1);
            self.catalog.index_mut().slots.release_drained(recoverable);
            t = self.tracker.lock();
        }
    }
}

pub(crate) enum Placed<'a> {
    All,
    /// The head went in; this is the rest.
    Part(Piece<'a>),
    Nothing(Piece<'a>),
}

fn data_record(lba: u64, extent: Extent) -> Record {
    Record::Data {
        lba,
        version: 0,
        extent,
    }
}

/// Cuts a raw piece after `blocks` blocks; each part gets its own digest.
fn split_raw<'a>(algorithm: Algorithm, piece: Piece<'a>, blocks: usize) -> (Piece<'a>, Piece<'a>) {
    let Stored::Raw { bytes, crcs, .. } = piece.stored else {
        unreachable!("only raw pieces are split")
    };
    let at = blocks * BLOCK_BYTES;
    let (head_bytes, rest_bytes): (Cow<[u8]>, Cow<[u8]>) = match bytes {
        Cow::Borrowed(b) => (Cow::Borrowed(&b[..at]), Cow::Borrowed(&b[at..])),
        Cow::Owned(b) => (Cow::Owned(b[..at].to_vec()), Cow::Owned(b[at..].to_vec())),
    };
    let (head_crcs, rest_crcs) = (
        crcs[..blocks].iter().copied().collect(),
        crcs[blocks..].iter().copied().collect(),
    );
    let part = |lba: u64, bytes: Cow<'a, [u8]>, crcs: format::BlockCrcs, origin: Origin| Piece {
        lba,
        blocks: crcs.len() as u32,
        stored: Stored::Raw {
            digest: folded_digest(algorithm, &crcs).unwrap_or_else(|| algorithm.digest(&bytes)),
            bytes,
            crcs,
        },
        origin,
    };
    let rest_origin = piece.origin.advanced_by(blocks as u64);
    (
        part(piece.lba, head_bytes, head_crcs, piece.origin),
        part(piece.lba + blocks as u64, rest_bytes, rest_crcs, rest_origin),
    )
}

impl StripeDone for Lanes {
    /// A stripe's chunks are all written: members whose writes failed are
    /// failed (before any FLUSH can see the stripe as written), readers go
    /// to the members from now on, and FLUSHes waiting for it are woken.
    fn stripe_written(&self, stripe: &StripeWrite, failed: Vec<(usize, std::io::Error)>) {
        for (member, error) in &failed {
            let _ = self.stripes.members.failed_io(*member, error);
        }
        // A stripe some members did not take, once writes are refused
        // (more members lost than the parity covers), may be on fewer
        // than K of them: it stays in memory, and readers are served from
        // there (what was in flight then, a bounded amount; no more comes).
        let kept = !failed.is_empty() && self.stripes.members.lost().is_some();
        if !kept {
            let mut index = self.catalog.index_mut();
            if let Some(Resident::Sealed(area)) = index.resident.get(&stripe.slot) {
                if Arc::ptr_eq(area, &stripe.area) {
                    index.resident.remove(&stripe.slot);
                }
            }
        }
        self.tracker.written(stripe.sequence, stripe.bytes);
    }

    fn recycle(&self, area: Arc<crate::device::AlignedBuf>, built: Built) {
        self.stripes.recycle_area(area);
        self.stripes.recycle_built(built);
    }
}

/// A user stripe was sealed as `sequence` (or gave its slot back, nothing
/// in it, `sequence` the last sealed): the emptied slots that waited for
/// it, and for no user stripe still open, drain after it (and after the
/// stripe that emptied them).
fn user_stripe_done(index: &mut Index, sequence: u64) {
    let open_serial_min = index.user_open.values().copied().min().unwrap_or(u64::MAX);
    index.slots.forget_superseded(open_serial_min);
    let mut waiting = std::mem::take(&mut index.drain_after_user);
    waiting.retain(|&(slot, needed, floor)| {
        let ready = needed < open_serial_min;
        if ready {
            index.slots.drain_after(slot, sequence.max(floor));
        }
        !ready
    });
    index.drain_after_user = waiting;
}
