//! The volume: logical 4 KiB blocks mapped to extents in stripes, the
//! write path (pack, seal, write whole stripes), the read path (verify,
//! reconstruct), garbage collection, and recovery from the stripes' own
//! summaries.
//!
//! # Guarantees
//!
//! - A write is in memory until FLUSH or FUA; those return only after
//!   every stripe holding it is on the members and the members are synced.
//! - Every extent read is checked against its digest; a failed member or a
//!   mismatch is answered from any K good chunks of the stripe, or with an
//!   error, never with wrong bytes.
//! - A slot is rewritten only after all its live data lives in newer
//!   stripes that are synced, so a crash at any point leaves every flushed
//!   block readable: recovery replays every valid stripe in sequence order
//!   (the newest record of a block wins) and drops unsynced stripes a crash
//!   tore.
//!
//! # Map
//!
//! `map` holds ranges of blocks: `start -> Mapping { blocks, target }`,
//! non-overlapping. A target is a slice of an extent, or zeros recorded in
//! a stripe (TRIM, WRITE_ZEROES over written blocks; the record must
//! outlive older data for those blocks, so garbage collection carries it
//! forward like data). Unwritten blocks have no mapping and read as zeros.

use crate::device::{AlignedBuf, Device};
use crate::format::{
    self, Checkpoint, CheckpointMapping, CheckpointRef, CheckpointTarget, ChunkHeader, Extent, Geometry, Record,
    Stream, Superblock, BLOCK_BYTES, CHECKPOINT_SLOTS_MAX, SECTOR_BYTES,
};
use crate::stripe::{self, OpenStripe};
use crate::ArrayError;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, Sender, SyncSender};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use tessera_compress::policy::{Hint, Policy};

/// Blocks in one extent at most (64 KiB): the compression unit, and what a
/// partial overwrite may force a reader to decompress. Smaller where a
/// stripe's data area is (see [`extent_blocks_max`]).
pub const EXTENT_BLOCKS_MAX: usize = 16;

/// Blocks per extent for a geometry: an extent and its summary record
/// always fit an empty stripe.
pub fn extent_blocks_max(geometry: &Geometry) -> usize {
    let room = geometry
        .data_area_bytes()
        .saturating_sub(format::summary_bytes(geometry.checksum, 1));
    (room / BLOCK_BYTES).min(EXTENT_BLOCKS_MAX)
}
/// Free slots kept for garbage collection's own writes.
const GC_RESERVE_SLOTS: usize = 2;
/// A victim must be at most this full of live data to be worth collecting.
const GC_VICTIM_LIVE_FRACTION_MAX: f64 = 0.95;
/// Bytes of reconstructed stripes kept for sequential degraded reads:
/// room for the stripes of every request a connection has in flight (16
/// workers, each on about three stripes of 8+2 with 64 KiB chunks).
const RECONSTRUCT_CACHE_BYTES_MAX: usize = 32 << 20;
/// Stripes kept whatever their size: a few for wide ones, at most enough
/// that the cache's linear lookup stays cheap.
const RECONSTRUCT_CACHE_STRIPES_MIN: usize = 4;
const RECONSTRUCT_CACHE_STRIPES_MAX: usize = 64;
/// Slots a checkpoint's window holds at most: recovery reads the headers
/// of these, so this bounds its time; a checkpoint is written each time
/// the volume has used them up. An eighth of the slots, within bounds.
const CHECKPOINT_WINDOW_MAX: u64 = 512;
const CHECKPOINT_WINDOW_MIN: u64 = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberState {
    Healthy,
    /// Marked failed (by `tessera fail` or after an I/O error).
    Failed,
    /// Absent when the array was opened.
    Missing,
}

pub struct Member {
    pub name: String,
    pub uuid: [u8; 16],
    pub device: Option<Arc<dyn Device>>,
    pub state: MemberState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotStatus {
    Free,
    Open,
    Sealed,
    /// Empty, rewritable once the data that superseded it is synced.
    Draining,
    /// Holds the durable map checkpoint: rewritable once a newer one is.
    Checkpoint,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    status: SlotStatus,
    sequence: u64,
    live_data_blocks: u64,
    live_zero_ranges: u64,
}

impl Slot {
    /// A slot holding no live data (yet).
    fn empty(status: SlotStatus, sequence: u64) -> Slot {
        Slot {
            status,
            sequence,
            live_data_blocks: 0,
            live_zero_ranges: 0,
        }
    }
}

#[derive(Clone, Debug)]
enum Target {
    Zero { slot: u64 },
    Data { extent: Arc<Extent>, skip: u32 },
}

#[derive(Clone, Debug)]
struct Mapping {
    blocks: u32,
    target: Target,
}

/// Counters, readable while the array serves.
#[derive(Default)]
struct Counters {
    user_bytes_written: AtomicU64,
    member_bytes_written: AtomicU64,
    stripes_sealed: AtomicU64,
    short_stripes_sealed: AtomicU64,
    checksum_errors: AtomicU64,
    chunks_repaired: AtomicU64,
    reconstructed_reads: AtomicU64,
    stripes_reconstructed: AtomicU64,
    unrecoverable_reads: AtomicU64,
    gc_stripes_collected: AtomicU64,
    checkpoints_written: AtomicU64,
}

struct State {
    members: Vec<Member>,
    superblock: Superblock,
    map: BTreeMap<u64, Mapping>,
    slots: Vec<Slot>,
    free: BTreeSet<u64>,
    draining: Vec<u64>,
    open: HashMap<Stream, OpenStripe>,
    next_sequence: u64,
    synced_through: u64,
    /// Data areas of sealed stripes the writer has not finished writing.
    in_flight: HashMap<u64, Arc<AlignedBuf>>,
    /// Buffers kept between stripes, so sealing allocates nothing.
    spare_areas: Vec<AlignedBuf>,
    /// The slots new stripes may use until the next checkpoint: the
    /// durable checkpoint's window (recovery rolls forward over these
    /// only); `None` when there is no checkpoint and any free slot will do.
    window: Option<BTreeSet<u64>>,
    /// Slots allocated since the last checkpoint.
    allocated_since_checkpoint: u64,
    /// Free slots user data leaves for the next checkpoint's stripes.
    checkpoint_reserve: usize,
    recovery: Recovery,
}

/// What opening the array found and did, for `status`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Recovery {
    /// The checkpoint recovery started from (0: none, every slot scanned).
    pub checkpoint_sequence: u64,
    /// Why a checkpoint the superblock names was not used, if it was not.
    pub checkpoint_error: Option<String>,
    pub slots_scanned: u64,
    pub stripes_replayed: u64,
    /// Stripes newer than the last sync that a crash left incomplete.
    pub torn_stripes_dropped: u64,
    pub milliseconds: u64,
}

/// A stripe's identity: (slot, sequence).
type StripeKey = (u64, u64);

/// A reconstructed data area, filled once by the reader that rebuilds it
/// (`None` if that failed); readers of the same stripe wait on it.
type Rebuilt = Arc<std::sync::OnceLock<Option<Arc<AlignedBuf>>>>;

/// An open array.
pub struct Array {
    geometry: Geometry,
    codec: tessera_ec::Codec,
    policy: Option<Policy>,
    state: RwLock<State>,
    counters: Arc<Counters>,
    cache: Mutex<VecDeque<(StripeKey, Rebuilt)>>,
    /// Stripes the reconstruction cache holds.
    cache_stripes: usize,
    writer: Writer,
}

/// Sealed stripes queued for the writer thread, which builds their chunks
/// (parity, leaves, headers) and writes them while the volume packs the
/// next stripe. Until a stripe's write is done its data area stays in
/// memory (`State::in_flight`) and reads are served from there; FLUSH
/// waits for the queue to drain before it syncs.
struct Writer {
    sender: Mutex<Option<SyncSender<Job>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    progress: Arc<(Mutex<Progress>, Condvar)>,
    /// Stripes sealed and not yet written, at most: sealing waits below it.
    stripes_max: usize,
}

/// Bytes of stripes the writer may hold (queued, being built, or being
/// written): enough that each member's thread finds several chunks
/// waiting and writes them with one call, few enough to bound memory for
/// wide stripes.
const WRITE_BYTES_IN_FLIGHT_MAX: usize = 64 << 20;
/// Stripes in flight, whatever their size: at least two, so one is built
/// while one is written; at most enough for long runs per member.
const WRITE_STRIPES_IN_FLIGHT_MIN: usize = 2;
const WRITE_STRIPES_IN_FLIGHT_MAX: usize = 32;
/// Bytes one member's thread writes with one call at most (after the
/// first chunk, which always goes).
const WRITE_RUN_BYTES_MAX: usize = 2 << 20;
// `clamp` needs each minimum at most its maximum.
const _: () = assert!(WRITE_STRIPES_IN_FLIGHT_MIN <= WRITE_STRIPES_IN_FLIGHT_MAX);
const _: () = assert!(RECONSTRUCT_CACHE_STRIPES_MIN <= RECONSTRUCT_CACHE_STRIPES_MAX);

struct Job {
    info: stripe::StripeInfo,
    area: Arc<AlignedBuf>,
    /// Members writable when the stripe was sealed.
    devices: Vec<Option<Arc<dyn Device>>>,
}

#[derive(Default)]
struct Progress {
    in_flight: usize,
    done: Vec<Done>,
}

struct Done {
    slot: u64,
    failed_members: Vec<usize>,
}

/// What `tessera status` reports.
#[derive(Clone, Debug, Serialize)]
pub struct Status {
    pub array_uuid: String,
    pub data: usize,
    pub parity: usize,
    pub chunk_bytes: usize,
    pub checksum: String,
    pub compression: String,
    pub members: Vec<MemberStatus>,
    pub members_unavailable: usize,
    pub stripes_total: u64,
    pub stripes_used: u64,
    pub stripes_degraded: u64,
    pub raw_bytes: u64,
    pub usable_bytes: u64,
    pub logical_bytes: u64,
    pub mapped_bytes: u64,
    pub stored_bytes: u64,
    pub compression_ratio: f64,
    pub user_bytes_written: u64,
    pub member_bytes_written: u64,
    pub write_amplification: f64,
    pub stripes_sealed: u64,
    pub short_stripes_sealed: u64,
    pub gc_stripes_collected: u64,
    pub checksum_errors: u64,
    pub chunks_repaired: u64,
    pub reconstructed_reads: u64,
    /// Stripes rebuilt from K chunks to serve reads (each once, however
    /// many reads it serves from the cache).
    pub stripes_reconstructed: u64,
    pub unrecoverable_reads: u64,
    /// Sequence of the newest durable map checkpoint (0: none).
    pub checkpoint_sequence: u64,
    pub checkpoints_written: u64,
    pub recovery: Recovery,
}

#[derive(Clone, Debug, Serialize)]
pub struct MemberStatus {
    pub index: usize,
    pub name: String,
    pub state: MemberState,
}

fn lock_poisoned<T>(_: T) -> ArrayError {
    ArrayError::Poisoned
}

impl Array {
    /// Builds the in-memory array from opened members and replays the
    /// stripes (called by `crate::create` and `crate::open`).
    pub(crate) fn assemble(superblock: Superblock, members: Vec<Member>) -> Result<Array, ArrayError> {
        let geometry = superblock.geometry.clone();
        let codec = tessera_ec::Codec::new(geometry.data, geometry.parity, tessera_ec::MatrixKind::Cauchy)
            .map_err(ArrayError::Codec)?;
        let policy = geometry.compression.map(|codec| Policy {
            mode: tessera_compress::policy::Mode::Aggressive,
            codec,
            min_blob: BLOCK_BYTES,
            max_blob: extent_blocks_max(&geometry) * BLOCK_BYTES,
            ..Policy::default()
        });
        let slot_count = geometry.slot_count();
        let array = Array {
            codec,
            policy,
            state: RwLock::new(State {
                members,
                superblock,
                map: BTreeMap::new(),
                slots: vec![Slot::empty(SlotStatus::Free, 0); slot_count as usize],
                free: BTreeSet::new(),
                draining: Vec::new(),
                open: HashMap::new(),
                next_sequence: 1,
                synced_through: 0,
                in_flight: HashMap::new(),
                spare_areas: Vec::new(),
                window: None,
                allocated_since_checkpoint: 0,
                checkpoint_reserve: 0,
                recovery: Recovery::default(),
            }),
            counters: Arc::new(Counters::default()),
            cache: Mutex::new(VecDeque::new()),
            cache_stripes: (RECONSTRUCT_CACHE_BYTES_MAX / geometry.data_area_bytes())
                .clamp(RECONSTRUCT_CACHE_STRIPES_MIN, RECONSTRUCT_CACHE_STRIPES_MAX),
            writer: Writer {
                sender: Mutex::new(None),
                thread: Mutex::new(None),
                progress: Arc::new((Mutex::new(Progress::default()), Condvar::new())),
                stripes_max: (WRITE_BYTES_IN_FLIGHT_MAX / (geometry.width() * (SECTOR_BYTES + geometry.chunk_bytes)))
                    .clamp(WRITE_STRIPES_IN_FLIGHT_MIN, WRITE_STRIPES_IN_FLIGHT_MAX),
            },
            geometry,
        };
        array.start_writer()?;
        array.recover()?;
        Ok(array)
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    pub fn logical_bytes(&self) -> u64 {
        self.geometry.logical_bytes
    }

    // ---- recovery -------------------------------------------------------

    /// Rebuilds the map: from the newest checkpoint plus the stripes
    /// written since in its window, or, without a usable checkpoint, from
    /// every stripe's summary. Either way the newer stripes are replayed in
    /// sequence order. Then writes a checkpoint if there was none.
    fn recover(&self) -> Result<(), ArrayError> {
        let started = std::time::Instant::now();
        let g = &self.geometry;
        let mut state = self.state.write().map_err(lock_poisoned)?;
        let uuid = state.superblock.array_uuid;
        let mut recovery = Recovery::default();
        let mut from = 0;
        let mut max_sequence = 0;
        let mut scan: Vec<u64> = (0..g.slot_count()).collect();
        if let Some(reference) = state.superblock.checkpoint.clone() {
            match self.load_checkpoint(&mut state, &reference) {
                Ok(window) => {
                    from = reference.sequence;
                    max_sequence = reference.first_stripe_sequence + reference.slots.len() as u64 - 1;
                    scan = window.iter().copied().collect();
                    state.window = Some(window);
                }
                Err(error) => {
                    // Every stripe is self-describing: a full scan still
                    // finds every acknowledged write.
                    state.reset_map();
                    recovery.checkpoint_error = Some(error.to_string());
                }
            }
        }
        recovery.checkpoint_sequence = from;
        recovery.slots_scanned = scan.len() as u64;
        // Pass 1: the headers of every chunk in the scanned slots.
        let mut newest: HashMap<u64, ChunkHeader> = HashMap::new();
        let mut synced_through = from;
        for &slot in &scan {
            for j in 0..g.width() {
                let Some(header) = self.read_header(&state, slot, j) else {
                    continue;
                };
                if header.array_uuid != uuid || header.slot != slot || header.index != j {
                    continue;
                }
                max_sequence = max_sequence.max(header.sequence);
                if header.sequence <= from || header.stream == Stream::Meta {
                    continue;
                }
                synced_through = synced_through.max(header.synced_through);
                let best = newest.entry(slot).or_insert_with(|| header.clone());
                if best.sequence < header.sequence {
                    *best = header;
                }
            }
        }
        // Pass 2: each slot's newest stripe, checked, its summary read.
        let mut stripes: Vec<(u64, u64, Vec<Record>)> = Vec::new();
        let mut torn = Vec::new();
        for (&slot, header) in &newest {
            let verify_all = header.sequence > synced_through;
            match self.read_summary(&state, header, verify_all) {
                Ok(records) => stripes.push((header.sequence, slot, records)),
                // Written after the last sync and torn by a crash: it held
                // nothing acknowledged.
                Err(_) if verify_all => torn.push(slot),
                Err(error) => return Err(error),
            }
        }
        stripes.sort_by_key(|s| s.0);
        recovery.stripes_replayed = stripes.len() as u64;
        for (sequence, slot, records) in stripes {
            let s = &mut state.slots[slot as usize];
            s.status = SlotStatus::Sealed;
            s.sequence = sequence;
            for record in &records {
                state.apply(slot, record);
            }
        }
        state.draining.clear();
        for slot in 0..g.slot_count() {
            let s = state.slots[slot as usize];
            let live = s.status == SlotStatus::Sealed && s.live_data_blocks + s.live_zero_ranges > 0;
            if !live && s.status != SlotStatus::Checkpoint {
                state.slots[slot as usize].status = SlotStatus::Free;
                state.free.insert(slot);
            }
        }
        // A torn stripe's headers are erased: once later stripes say they
        // are synced past its sequence, nothing could tell it was torn.
        recovery.torn_stripes_dropped = torn.len() as u64;
        for slot in torn {
            for j in 0..g.width() {
                let (member, row) = g.place(slot, j);
                if let Some(device) = state.readable(member) {
                    // A member that cannot be written fails at the sync below.
                    let _ = device.write_at(&[0u8; SECTOR_BYTES], g.row_offset(row));
                }
            }
        }
        state.next_sequence = max_sequence + 1;
        // Everything replayed is now made durable, so later stripes may say so.
        self.sync_members(&mut state)?;
        state.synced_through = max_sequence;
        recovery.milliseconds = started.elapsed().as_millis() as u64;
        state.recovery = recovery;
        if state.window.is_none() {
            self.checkpoint_locked(&mut state)?;
        }
        Ok(())
    }

    /// Loads the checkpoint `reference` names into the (empty) map and
    /// slot table; returns its window.
    fn load_checkpoint(&self, state: &mut State, reference: &CheckpointRef) -> Result<BTreeSet<u64>, ArrayError> {
        let g = &self.geometry;
        let unreadable = |why: String| ArrayError::CheckpointUnreadable { why };
        let per_stripe = g.data_area_bytes() - format::summary_bytes(g.checksum, 0);
        let stripes: Vec<(u64, u64)> = (reference.first_stripe_sequence..)
            .zip(&reference.slots)
            .map(|(sequence, &slot)| (slot, sequence))
            .collect();
        // Every stripe holds part of it, all but the last full.
        let total = reference.bytes as usize;
        if total > stripes.len() * per_stripe || total <= (stripes.len() - 1) * per_stripe {
            return Err(unreadable(format!("{total} bytes in {} stripes", stripes.len())));
        }
        let length = |i: usize| (total - i * per_stripe).min(per_stripe);
        // Straight from the data chunks; if that does not match the digest,
        // from every stripe rebuilt and checked chunk by chunk.
        let mut bytes = vec![0u8; reference.bytes as usize];
        let direct = stripes.iter().enumerate().all(|(i, &(slot, _))| {
            let at = i * per_stripe;
            self.read_area_into(state, slot, 0, &mut bytes[at..at + length(i)])
        });
        if !direct || g.checksum.digest(&bytes) != reference.digest {
            for (i, &(slot, sequence)) in stripes.iter().enumerate() {
                let (area, _bad) = self.reconstruct(state, slot, sequence, true)?;
                let at = i * per_stripe;
                bytes[at..at + length(i)].copy_from_slice(&area[..length(i)]);
            }
            if g.checksum.digest(&bytes) != reference.digest {
                return Err(unreadable("its digest does not match".to_string()));
            }
        }
        let checkpoint = Checkpoint::decode(&bytes, g).map_err(|e| unreadable(e.to_string()))?;
        if checkpoint.sequence != reference.sequence {
            return Err(unreadable(format!(
                "it says sequence {}, the superblock {}",
                checkpoint.sequence, reference.sequence
            )));
        }
        let meta: BTreeSet<u64> = reference.slots.iter().copied().collect();
        let clash = checkpoint
            .stripes
            .iter()
            .map(|(slot, _)| slot)
            .chain(&checkpoint.window)
            .find(|slot| meta.contains(slot));
        if let Some(slot) = clash {
            return Err(unreadable(format!(
                "slot {slot} is both the checkpoint's and listed in it"
            )));
        }
        for &(slot, sequence) in &stripes {
            state.slots[slot as usize] = Slot::empty(SlotStatus::Checkpoint, sequence);
        }
        for &(slot, sequence) in &checkpoint.stripes {
            let s = &mut state.slots[slot as usize];
            s.status = SlotStatus::Sealed;
            s.sequence = sequence;
        }
        let extents: Vec<Arc<Extent>> = checkpoint.extents.into_iter().map(Arc::new).collect();
        for m in checkpoint.mappings {
            let target = match m.target {
                CheckpointTarget::Zero { slot } => Target::Zero { slot },
                CheckpointTarget::Data { extent, skip } => Target::Data {
                    extent: extents[extent].clone(),
                    skip,
                },
            };
            state.put(m.lba, m.blocks, target);
        }
        Ok(checkpoint.window.into_iter().collect())
    }

    fn read_header(&self, state: &State, slot: u64, index: usize) -> Option<ChunkHeader> {
        let (member, row) = self.geometry.place(slot, index);
        let device = state.readable(member)?;
        let mut sector = vec![0u8; SECTOR_BYTES];
        device.read_at(&mut sector, self.geometry.row_offset(row)).ok()?;
        ChunkHeader::decode(&sector, self.geometry.checksum).ok()
    }

    /// The summary of the stripe one of whose chunk `header`s was read.
    /// With `verify_all`, every chunk is checked (a stripe a crash may have
    /// torn); otherwise only the chunks holding the summary, reconstructing
    /// if one is missing or bad.
    fn read_summary(&self, state: &State, header: &ChunkHeader, verify_all: bool) -> Result<Vec<Record>, ArrayError> {
        let g = &self.geometry;
        let (slot, sequence) = (header.slot, header.sequence);
        let area = g.data_area_bytes();
        let len = header.summary_bytes as usize;
        if len > area {
            return Err(ArrayError::Unreadable { slot });
        }
        let parse = |bytes: &[u8]| -> Option<Vec<Record>> {
            if self.geometry.checksum.digest(bytes) != header.summary_digest {
                return None;
            }
            format::decode_summary(bytes, g, slot).ok()
        };
        if !verify_all {
            let mut bytes = vec![0u8; len];
            if self.read_area_into(state, slot, area - len, &mut bytes) {
                if let Some(records) = parse(&bytes) {
                    return Ok(records);
                }
            }
        }
        let (data, _bad) = self.reconstruct(state, slot, sequence, true)?;
        parse(&data[area - len..]).ok_or(ArrayError::Unreadable { slot })
    }

    // ---- reads ----------------------------------------------------------

    /// Reads `buf.len()` bytes at byte `offset` of the volume.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ArrayError> {
        self.check_range(offset, buf.len() as u64)?;
        let state = self.state.read().map_err(lock_poisoned)?;
        let block = BLOCK_BYTES as u64;
        let first = offset / block;
        let last = (offset + buf.len() as u64).div_ceil(block);
        if offset.is_multiple_of(block) && buf.len().is_multiple_of(BLOCK_BYTES) {
            return self.read_blocks_into(&state, first, buf);
        }
        let blocks = self.read_blocks(&state, first, last - first)?;
        let skip = (offset - first * block) as usize;
        buf.copy_from_slice(&blocks[skip..skip + buf.len()]);
        Ok(())
    }

    /// Whole blocks [lba, lba+count) as bytes; holes and zero ranges are zeros.
    fn read_blocks(&self, state: &State, lba: u64, count: u64) -> Result<Vec<u8>, ArrayError> {
        let mut out = vec![0u8; count as usize * BLOCK_BYTES];
        self.read_blocks_into(state, lba, &mut out)?;
        Ok(out)
    }

    /// Fills `out` (whole blocks from `lba`). A raw extent read whole goes
    /// straight from the member into `out` and is verified there.
    fn read_blocks_into(&self, state: &State, lba: u64, out: &mut [u8]) -> Result<(), ArrayError> {
        let end = lba + (out.len() / BLOCK_BYTES) as u64;
        let mut filled = lba;
        for (start, mapping) in state.overlapping(lba, end) {
            let lo = start.max(lba);
            let hi = (start + u64::from(mapping.blocks)).min(end);
            out[block_range_end(lba, filled, lo)].fill(0);
            filled = hi;
            let target = &mut out[block_range_end(lba, lo, hi)];
            let Target::Data { extent, skip } = &mapping.target else {
                target.fill(0);
                continue;
            };
            let whole = *skip == 0 && lo == start && hi - lo == u64::from(extent.blocks);
            if whole && extent.codec.is_none() {
                // A raw extent read whole lands in `out` without a copy.
                self.read_stored_into(state, extent, target)?;
                continue;
            }
            let bytes = self.extent_bytes(state, extent)?;
            let from = (u64::from(*skip) + lo - start) as usize * BLOCK_BYTES;
            target.copy_from_slice(&bytes[from..from + target.len()]);
        }
        out[block_range_end(lba, filled, end)].fill(0);
        Ok(())
    }

    /// Whether a sealed stripe has a data chunk on an unavailable member:
    /// its extents are then all served from one cached reconstruction, so
    /// sequential degraded reads read each stripe about once.
    fn stripe_is_degraded(&self, state: &State, slot: u64) -> bool {
        let g = &self.geometry;
        (0..g.data).any(|j| state.readable(g.place(slot, j).0).is_none())
    }

    /// An extent's stored bytes into `out`, verified: from memory (a stripe
    /// not yet on the members), straight from the members, or from a
    /// (cached) reconstruction when a member is out or the digest fails.
    fn read_stored_into(&self, state: &State, extent: &Extent, out: &mut [u8]) -> Result<(), ArrayError> {
        let (offset, len) = (extent.offset as usize, extent.stored_bytes as usize);
        debug_assert_eq!(out.len(), len);
        if let Some(area) = state.in_memory(extent.slot) {
            out.copy_from_slice(&area[offset..offset + len]);
            return Ok(());
        }
        let algorithm = self.geometry.checksum;
        if !self.stripe_is_degraded(state, extent.slot)
            && self.read_area_into(state, extent.slot, offset, out)
            && algorithm.digest(out) == extent.digest
        {
            return Ok(());
        }
        let sequence = state.slots[extent.slot as usize].sequence;
        let area = self.cached_or_reconstruct(state, extent.slot, sequence)?;
        let bytes = &area[offset..offset + len];
        if algorithm.digest(bytes) != extent.digest {
            self.counters.unrecoverable_reads.fetch_add(1, Ordering::Relaxed);
            return Err(ArrayError::Unreadable { slot: extent.slot });
        }
        self.counters.reconstructed_reads.fetch_add(1, Ordering::Relaxed);
        out.copy_from_slice(bytes);
        Ok(())
    }

    /// An extent's logical bytes, verified and decompressed.
    fn extent_bytes(&self, state: &State, extent: &Extent) -> Result<Vec<u8>, ArrayError> {
        let mut stored = vec![0u8; extent.stored_bytes as usize];
        self.read_stored_into(state, extent, &mut stored)?;
        match extent.codec {
            None => Ok(stored),
            Some(codec) => codec
                .decompress(&stored, extent.blocks as usize * BLOCK_BYTES)
                .map_err(|_| ArrayError::Unreadable { slot: extent.slot }),
        }
    }

    /// Fills `out` with data-area bytes from `offset`, straight from the
    /// data chunks' members; false if a member is out or a read fails.
    fn read_area_into(&self, state: &State, slot: u64, offset: usize, out: &mut [u8]) -> bool {
        let g = &self.geometry;
        stripe::pieces(g, offset, out.len())
            .into_iter()
            .all(|(chunk, within, n, at)| {
                let (member, row) = g.place(slot, chunk);
                let position = g.row_offset(row) + (SECTOR_BYTES + within) as u64;
                state
                    .readable(member)
                    .is_some_and(|device| device.read_at(&mut out[at..at + n], position).is_ok())
            })
    }

    /// A degraded stripe's data area, rebuilt once: the first reader to
    /// miss the cache rebuilds it (in the buffer of the stripe it evicts)
    /// while other readers of the same stripe wait for that, rather than
    /// rebuild it again; neighbouring requests of a sequential reader share
    /// their boundary stripes.
    fn cached_or_reconstruct(&self, state: &State, slot: u64, sequence: u64) -> Result<Arc<AlignedBuf>, ArrayError> {
        let key = (slot, sequence);
        let (entry, recycled) = {
            let mut cache = self.cache.lock().map_err(lock_poisoned)?;
            match cache.iter().find(|(k, _)| *k == key) {
                Some((_, entry)) => (entry.clone(), None),
                None => {
                    let evicted = if cache.len() >= self.cache_stripes {
                        cache.pop_front()
                    } else {
                        None
                    };
                    let entry = Rebuilt::default();
                    cache.push_back((key, entry.clone()));
                    (entry, evicted.and_then(|(_, old)| Arc::try_unwrap(old).ok()))
                }
            }
        };
        let mut error = None;
        let area = entry.get_or_init(|| {
            // A buffer no reader holds any more is reused.
            let buffer = recycled
                .and_then(|cell| cell.into_inner().flatten())
                .and_then(|area| Arc::try_unwrap(area).ok());
            self.counters.stripes_reconstructed.fetch_add(1, Ordering::Relaxed);
            match self.reconstruct_into(state, slot, sequence, false, buffer.unwrap_or_default()) {
                Ok((area, bad)) => {
                    self.repair(state, slot, sequence, &area, &bad);
                    Some(Arc::new(area))
                }
                Err(e) => {
                    error = Some(e);
                    None
                }
            }
        });
        if let Some(area) = area {
            return Ok(area.clone());
        }
        // Not kept: the next read tries again.
        let mut cache = self.cache.lock().map_err(lock_poisoned)?;
        cache.retain(|(k, e)| !(*k == key && Arc::ptr_eq(e, &entry)));
        Err(error.unwrap_or(ArrayError::Unreadable { slot }))
    }

    /// Counts and rewrites the chunks of `bad` that are on healthy members
    /// (the rest are on failed ones), from the stripe's verified data area:
    /// their content is known, so the stripe is whole again. A failed
    /// rewrite is left for the next read or scrub. Returns the count.
    fn repair(&self, state: &State, slot: u64, sequence: u64, area: &[u8], bad: &[usize]) -> u64 {
        let g = &self.geometry;
        let bad: Vec<usize> = bad
            .iter()
            .copied()
            .filter(|&j| state.readable(g.place(slot, j).0).is_some())
            .collect();
        if bad.is_empty() {
            return 0;
        }
        self.counters
            .checksum_errors
            .fetch_add(bad.len() as u64, Ordering::Relaxed);
        let Some(template) = (0..g.width())
            .filter(|j| !bad.contains(j))
            .filter_map(|j| self.read_header(state, slot, j))
            .find(|h| h.sequence == sequence && h.slot == slot)
        else {
            return bad.len() as u64;
        };
        // The stripe's chunks rebuilt exactly as sealing built them.
        let info = stripe::StripeInfo {
            slot,
            stream: template.stream,
            sequence,
            synced_through: template.synced_through,
            summary_bytes: template.summary_bytes,
            data_bytes: template.data_bytes,
            summary_digest: template.summary_digest,
        };
        let mut built = stripe::Built::default();
        stripe::build(g, &self.codec, template.array_uuid, area, &info, &mut built);
        for &j in &bad {
            let (header, payload) = built.chunk(g, area, j);
            let (member, row) = g.place(slot, j);
            let written = state
                .readable(member)
                .is_some_and(|device| write_chunk(device.as_ref(), g, row, header, payload).is_ok());
            if written {
                self.counters.chunks_repaired.fetch_add(1, Ordering::Relaxed);
            }
        }
        bad.len() as u64
    }

    fn reconstruct(
        &self,
        state: &State,
        slot: u64,
        sequence: u64,
        check_all: bool,
    ) -> Result<(AlignedBuf, Vec<usize>), ArrayError> {
        self.reconstruct_into(state, slot, sequence, check_all, AlignedBuf::default())
    }

    fn reconstruct_into(
        &self,
        state: &State,
        slot: u64,
        sequence: u64,
        check_all: bool,
        buffer: AlignedBuf,
    ) -> Result<(AlignedBuf, Vec<usize>), ArrayError> {
        let g = &self.geometry;
        stripe::reconstruct(
            g,
            &self.codec,
            slot,
            sequence,
            check_all,
            buffer,
            |j, header, payload| {
                let (member, row) = g.place(slot, j);
                let Some(device) = state.readable(member) else {
                    return false;
                };
                device
                    .read_vectored_at(&mut [header, payload], g.row_offset(row))
                    .is_ok()
            },
        )
        .map_err(|good| ArrayError::TooFewChunks {
            slot,
            good,
            need: g.data,
        })
    }

    // ---- writes ---------------------------------------------------------

    fn check_range(&self, offset: u64, len: u64) -> Result<(), ArrayError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.geometry.logical_bytes => Ok(()),
            _ => Err(ArrayError::OutOfRange {
                offset,
                len,
                size: self.geometry.logical_bytes,
            }),
        }
    }

    /// Writes `data` at byte `offset`. Unaligned edges are merged with the
    /// blocks' current contents under the write lock, so they are atomic.
    /// With `fua`, returns after the data is durable.
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ArrayError> {
        self.check_range(offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        let mut state = self.state.write().map_err(lock_poisoned)?;
        let block = BLOCK_BYTES as u64;
        let first = offset / block;
        let last = (offset + data.len() as u64).div_ceil(block);
        self.drain_writer(&mut state)?;
        self.ensure_room_for(&mut state, (last - first) as usize * BLOCK_BYTES)?;
        let aligned = offset.is_multiple_of(block) && data.len().is_multiple_of(BLOCK_BYTES);
        if aligned {
            self.write_blocks(&mut state, first, data, Stream::User)?;
        } else {
            let mut blocks = self.read_blocks(&state, first, last - first)?;
            let skip = (offset - first * block) as usize;
            blocks[skip..skip + data.len()].copy_from_slice(data);
            self.write_blocks(&mut state, first, &blocks, Stream::User)?;
        }
        self.counters
            .user_bytes_written
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        if fua {
            self.flush_locked(&mut state)?;
        }
        Ok(())
    }

    /// Makes `len` bytes at `offset` read as zeros and frees their space.
    /// Unaligned edges are written as zeros; whole blocks become a zero
    /// record (or nothing, where the blocks were never written).
    pub fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), ArrayError> {
        self.check_range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let block = BLOCK_BYTES as u64;
        let first_whole = offset.div_ceil(block);
        let end_whole = (offset + len) / block;
        if first_whole >= end_whole {
            // No whole block: write the zero bytes.
            return self.write(offset, &vec![0u8; len as usize], fua);
        }
        if offset < first_whole * block {
            self.write(offset, &vec![0u8; (first_whole * block - offset) as usize], false)?;
        }
        if offset + len > end_whole * block {
            self.write(
                end_whole * block,
                &vec![0u8; (offset + len - end_whole * block) as usize],
                false,
            )?;
        }
        let mut state = self.state.write().map_err(lock_poisoned)?;
        let mut lba = first_whole;
        while lba < end_whole {
            let blocks = (end_whole - lba).min(u64::from(u32::MAX)) as u32;
            self.zero_blocks(&mut state, lba, blocks, Stream::User)?;
            lba += u64::from(blocks);
        }
        if fua {
            self.flush_locked(&mut state)?;
        }
        Ok(())
    }

    /// TRIM: the same as WRITE_ZEROES here (discarded blocks read as zeros).
    pub fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), ArrayError> {
        self.write_zeroes(offset, len, fua)
    }

    /// Checks, before anything changes, that `bytes` of user data will
    /// find stripes: what the open stripe holds, plus free slots.
    fn ensure_room_for(&self, state: &mut State, bytes: usize) -> Result<(), ArrayError> {
        let area = self.geometry.data_area_bytes();
        let per_stripe = area - format::summary_bytes(self.geometry.checksum, area / BLOCK_BYTES);
        let open_room = state.open.get(&Stream::User).map_or(0, |o| area - o.used);
        let needed = bytes.saturating_sub(open_room).div_ceil(per_stripe);
        if needed == 0 {
            return Ok(());
        }
        self.ensure_free(state, needed, Self::reserve(state, Stream::User), true)
    }

    fn write_blocks(&self, state: &mut State, lba: u64, data: &[u8], stream: Stream) -> Result<(), ArrayError> {
        debug_assert_eq!(data.len() % BLOCK_BYTES, 0);
        let per_extent = extent_blocks_max(&self.geometry);
        let algorithm = self.geometry.checksum;
        let mut done = 0;
        while done < data.len() {
            let at = lba + (done / BLOCK_BYTES) as u64;
            let mut take = (data.len() - done).min(per_extent * BLOCK_BYTES);
            let room_blocks = state.open.get(&stream).map_or(0, |open| {
                let summary = format::summary_bytes(algorithm, open.records.len() + 1);
                open.data.len().saturating_sub(open.used + summary) / BLOCK_BYTES
            });
            // Raw extents are cut to the open stripe's room, so stripes are
            // sealed full; compressed ones are sized only after compressing.
            if self.policy.is_none() && room_blocks > 0 {
                take = take.min(room_blocks * BLOCK_BYTES);
            }
            if data[done..done + take].iter().all(|&b| b == 0) {
                self.zero_blocks(state, at, (take / BLOCK_BYTES) as u32, stream)?;
                done += take;
                continue;
            }
            let (codec, stored) = match &self.policy {
                Some(policy) => {
                    let blob = policy
                        .compress_blob(&data[done..done + take], Hint::None)
                        .map_err(ArrayError::Compress)?;
                    if blob.codec.is_none() && room_blocks > 0 && take > room_blocks * BLOCK_BYTES {
                        // Stored raw after all: cut it to the room like any raw extent.
                        take = room_blocks * BLOCK_BYTES;
                        (None, std::borrow::Cow::Borrowed(&data[done..done + take]))
                    } else {
                        (blob.codec, std::borrow::Cow::Owned(blob.bytes))
                    }
                }
                None => (None, std::borrow::Cow::Borrowed(&data[done..done + take])),
            };
            let blocks = (take / BLOCK_BYTES) as u32;
            done += take;
            let digest = algorithm.digest(&stored);
            let slot = self.room(state, stream, stored.len(), Self::reserve(state, stream))?;
            let open = state.open.get_mut(&stream).expect("room opened it");
            let record = Record::Data {
                lba: at,
                extent: Extent {
                    slot,
                    offset: open.push_data(&stored),
                    stored_bytes: stored.len() as u32,
                    blocks,
                    codec,
                    digest,
                },
            };
            state.log(stream, slot, record);
        }
        Ok(())
    }

    /// Records that blocks read as zeros. A zero record frees space, so it
    /// may use the GC reserve but its last slot.
    fn log_zero(&self, state: &mut State, stream: Stream, lba: u64, blocks: u32) -> Result<(), ArrayError> {
        let slot = self.room(state, stream, 0, Self::reserve(state, stream).min(1))?;
        state.log(stream, slot, Record::Zero { lba, blocks });
        Ok(())
    }

    fn zero_blocks(&self, state: &mut State, lba: u64, blocks: u32, stream: Stream) -> Result<(), ArrayError> {
        let end = lba + u64::from(blocks);
        // Blocks never written already read as zeros and need no record.
        if state.overlapping(lba, end).next().is_none() {
            return Ok(());
        }
        self.log_zero(state, stream, lba, blocks)
    }

    /// Makes room in `stream`'s open stripe for `bytes` and one record,
    /// opening a new stripe in a free slot if need be (leaving `reserve`
    /// slots free); returns its slot.
    fn room(&self, state: &mut State, stream: Stream, bytes: usize, reserve: usize) -> Result<u64, ArrayError> {
        let algorithm = self.geometry.checksum;
        if let Some(open) = state.open.get(&stream) {
            if open.fits(algorithm, bytes) {
                return Ok(open.slot);
            }
            self.seal(state, stream, false)?;
        }
        let slot = self.allocate(state, stream, reserve)?;
        let open = OpenStripe::new(slot, stream, state.spare_areas.pop(), &self.geometry);
        assert!(open.fits(algorithm, bytes), "one extent always fits an empty stripe");
        state.open.insert(stream, open);
        Ok(slot)
    }

    /// Free slots a stream must leave: GC may use them all; user data
    /// leaves GC its reserve and the next checkpoint its room.
    fn reserve(state: &State, stream: Stream) -> usize {
        match stream {
            Stream::Gc | Stream::Meta => 0,
            Stream::User => GC_RESERVE_SLOTS + state.checkpoint_reserve,
        }
    }

    /// Makes `needed` slots more than the reserve free, collecting garbage
    /// (unless GC itself is asking) and syncing as needed, or fails with
    /// `NoSpace` having changed no data.
    fn ensure_free(&self, state: &mut State, needed: usize, reserve: usize, collect: bool) -> Result<(), ArrayError> {
        if collect && state.free.len() < reserve + needed {
            self.collect_garbage(state, reserve + needed)?;
        }
        if state.free.len() < reserve + needed && !state.draining.is_empty() {
            self.flush_locked(state)?;
        }
        if state.free.len() < reserve + needed {
            return Err(ArrayError::NoSpace);
        }
        Ok(())
    }

    fn allocate(&self, state: &mut State, stream: Stream, reserve: usize) -> Result<u64, ArrayError> {
        self.ensure_free(state, 1, reserve, stream == Stream::User)?;
        let mut slot = self.pick_slot(state);
        if slot.is_none() || state.window.is_none() && state.allocated_since_checkpoint >= self.window_slots() {
            self.checkpoint_locked(state)?;
            slot = self.pick_slot(state);
        }
        let slot = slot.ok_or(ArrayError::NoSpace)?;
        state.free.remove(&slot);
        state.allocated_since_checkpoint += 1;
        let s = &mut state.slots[slot as usize];
        *s = Slot::empty(SlotStatus::Open, 0);
        Ok(slot)
    }

    /// A free slot in the window (any free slot without one), preferring
    /// one whose members are all healthy, so new stripes avoid failed
    /// members where the geometry leaves a choice (N > K+M).
    fn pick_slot(&self, state: &State) -> Option<u64> {
        let healthy = |slot: &u64| self.all_healthy(state, *slot);
        match &state.window {
            Some(window) => {
                let mut free = window.iter().copied().filter(|s| state.free.contains(s));
                let first = free.next()?;
                Some(std::iter::once(first).chain(free).find(healthy).unwrap_or(first))
            }
            None => {
                let first = state.free.first().copied()?;
                Some(state.free.iter().copied().find(healthy).unwrap_or(first))
            }
        }
    }

    /// Whether every chunk of slot `slot` is on a healthy member.
    fn all_healthy(&self, state: &State, slot: u64) -> bool {
        let g = &self.geometry;
        (0..g.width()).all(|j| state.readable(g.place(slot, j).0).is_some())
    }

    /// Slots in a checkpoint's window: an eighth of the array, within bounds.
    fn window_slots(&self) -> u64 {
        (self.geometry.slot_count() / 8).clamp(CHECKPOINT_WINDOW_MIN, CHECKPOINT_WINDOW_MAX)
    }

    /// Writes a checkpoint now (a clean shutdown does, so the next start
    /// reads it and few headers).
    pub fn checkpoint(&self) -> Result<(), ArrayError> {
        let mut state = self.state.write().map_err(lock_poisoned)?;
        self.checkpoint_locked(&mut state)
    }

    /// Flushes, writes the map and a new window to checkpoint stripes in
    /// free slots, syncs, then points the superblocks at them. Only then
    /// are the old checkpoint's slots free, and new stripes go to the new
    /// window. Without room for both, the superblocks say "no checkpoint"
    /// (recovery then scans every slot) and any free slot may be used.
    fn checkpoint_locked(&self, state: &mut State) -> Result<(), ArrayError> {
        self.flush_locked(state)?;
        let g = &self.geometry;
        let algorithm = g.checksum;
        let mut checkpoint = Checkpoint {
            sequence: state.next_sequence - 1,
            ..Checkpoint::default()
        };
        checkpoint.stripes = (0..g.slot_count())
            .filter(|&slot| state.slots[slot as usize].status == SlotStatus::Sealed)
            .map(|slot| (slot, state.slots[slot as usize].sequence))
            .collect();
        let mut numbers: HashMap<*const Extent, usize> = HashMap::new();
        for (&lba, mapping) in &state.map {
            let target = match &mapping.target {
                Target::Zero { slot } => CheckpointTarget::Zero { slot: *slot },
                Target::Data { extent, skip } => {
                    let extent = *numbers.entry(Arc::as_ptr(extent)).or_insert_with(|| {
                        checkpoint.extents.push(Extent::clone(extent));
                        checkpoint.extents.len() - 1
                    });
                    CheckpointTarget::Data { extent, skip: *skip }
                }
            };
            checkpoint.mappings.push(CheckpointMapping {
                lba,
                blocks: mapping.blocks,
                target,
            });
        }
        let window_slots = self.window_slots() as usize;
        let per_stripe = g.data_area_bytes() - format::summary_bytes(algorithm, 0);
        let bytes_max = Checkpoint::encoded_bytes(
            algorithm,
            checkpoint.stripes.len(),
            window_slots,
            checkpoint.extents.len(),
            checkpoint.mappings.len(),
        );
        let stripes = bytes_max.div_ceil(per_stripe);
        // Free slots, those on healthy members first (as `pick_slot`).
        let mut candidates: Vec<u64> = state.free.iter().copied().collect();
        candidates.sort_by_key(|&slot| !self.all_healthy(state, slot));
        if stripes > CHECKPOINT_SLOTS_MAX || candidates.len() < stripes + 1 {
            return self.drop_checkpoint(state);
        }
        let mut window: Vec<u64> = candidates.split_off(stripes).into_iter().take(window_slots).collect();
        let mut meta = candidates;
        // Too few free slots (a full array): the window also takes the live
        // stripes garbage collection will empty first, so that it does not
        // shrink to a checkpoint every few stripes. Recovery tells their
        // new stripes from the old ones by sequence.
        if window.len() < window_slots {
            let mut emptiest: Vec<u64> = (0..g.slot_count())
                .filter(|&slot| state.slots[slot as usize].status == SlotStatus::Sealed)
                .collect();
            emptiest.sort_by_key(|&slot| state.slots[slot as usize].live_data_blocks);
            window.extend(emptiest.into_iter().take(window_slots - window.len()));
        }
        checkpoint.window = window.clone();
        let bytes = checkpoint.encode(algorithm);
        // The size was reckoned with a full window: a smaller one may need
        // a stripe less.
        meta.truncate(bytes.len().div_ceil(per_stripe));
        let first_stripe_sequence = state.next_sequence;
        for (slot, piece) in meta.iter().zip(bytes.chunks(per_stripe)) {
            state.free.remove(slot);
            state.slots[*slot as usize].status = SlotStatus::Open;
            let mut open = OpenStripe::new(*slot, Stream::Meta, state.spare_areas.pop(), g);
            open.push_data(piece);
            state.open.insert(Stream::Meta, open);
            self.seal(state, Stream::Meta, false)?;
        }
        self.wait_writer_idle()?;
        self.drain_writer(state)?;
        self.sync_members(state)?;
        state.synced_through = state.next_sequence - 1;
        let reference = CheckpointRef {
            sequence: checkpoint.sequence,
            bytes: bytes.len() as u64,
            first_stripe_sequence,
            digest: algorithm.digest(&bytes),
            slots: meta.clone(),
        };
        if let Err(error) = self.point_superblocks(state, Some(reference)) {
            // The old checkpoint stays the durable one; its window too.
            for &slot in &meta {
                state.slots[slot as usize].status = SlotStatus::Free;
                state.free.insert(slot);
            }
            return Err(error);
        }
        state.window = Some(window.into_iter().collect());
        state.checkpoint_reserve = stripes;
        self.counters.checkpoints_written.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Makes the superblocks say there is no checkpoint, so that any free
    /// slot may be written: recovery will scan them all.
    fn drop_checkpoint(&self, state: &mut State) -> Result<(), ArrayError> {
        if state.superblock.checkpoint.is_some() {
            self.point_superblocks(state, None)?;
        }
        state.window = None;
        state.allocated_since_checkpoint = 0;
        Ok(())
    }

    /// Writes `reference` to every member's superblocks; once they are
    /// durable, the slots of the checkpoint they named before are free.
    fn point_superblocks(&self, state: &mut State, reference: Option<CheckpointRef>) -> Result<(), ArrayError> {
        let mut template = state.superblock.clone();
        let old = std::mem::replace(&mut template.checkpoint, reference);
        self.publish_superblock(state, template)?;
        state.allocated_since_checkpoint = 0;
        for slot in old.map_or_else(Vec::new, |o| o.slots) {
            let s = &mut state.slots[slot as usize];
            if s.status == SlotStatus::Checkpoint {
                s.status = SlotStatus::Free;
                state.free.insert(slot);
            }
        }
        Ok(())
    }

    /// Writes `stream`'s open stripe to the members (padding a short one).
    fn seal(&self, state: &mut State, stream: Stream, short: bool) -> Result<(), ArrayError> {
        let Some(mut open) = state.open.remove(&stream) else {
            return Ok(());
        };
        let slot = open.slot;
        if open.records.is_empty() && stream != Stream::Meta {
            state.slots[slot as usize].status = SlotStatus::Free;
            state.free.insert(slot);
            return Ok(());
        }
        let sequence = state.next_sequence;
        state.next_sequence += 1;
        let info = stripe::finish(&self.geometry, &mut open, sequence, state.synced_through);
        let area = Arc::new(std::mem::take(&mut open.data));
        state.in_flight.insert(slot, area.clone());
        let devices = (0..state.members.len()).map(|m| state.readable(m).cloned()).collect();
        {
            // Wait for room: every stripe written wakes this.
            let (lock, changed) = &*self.writer.progress;
            let mut progress = lock.lock().map_err(lock_poisoned)?;
            while progress.in_flight >= self.writer.stripes_max {
                progress = changed.wait(progress).map_err(lock_poisoned)?;
            }
            progress.in_flight += 1;
        }
        let sender = self.writer.sender.lock().map_err(lock_poisoned)?;
        let sent = sender.as_ref().map(|s| s.send(Job { info, area, devices }).is_ok());
        if sent != Some(true) {
            return Err(ArrayError::Poisoned);
        }
        drop(sender);
        self.counters.stripes_sealed.fetch_add(1, Ordering::Relaxed);
        if short {
            self.counters.short_stripes_sealed.fetch_add(1, Ordering::Relaxed);
        }
        let s = &mut state.slots[slot as usize];
        s.status = SlotStatus::Sealed;
        s.sequence = sequence;
        if stream == Stream::Meta {
            s.status = SlotStatus::Checkpoint;
        } else if s.live_data_blocks + s.live_zero_ranges == 0 {
            // Everything in it was overwritten while it was open.
            s.status = SlotStatus::Draining;
            state.draining.push(slot);
        }
        Ok(())
    }

    fn start_writer(&self) -> Result<(), ArrayError> {
        let (sender, receiver) = sync_channel::<Job>(self.writer.stripes_max);
        let geometry = self.geometry.clone();
        let codec = tessera_ec::Codec::new(geometry.data, geometry.parity, tessera_ec::MatrixKind::Cauchy)
            .map_err(ArrayError::Codec)?;
        let uuid = self.state.read().map_err(lock_poisoned)?.superblock.array_uuid;
        let progress = self.writer.progress.clone();
        let counters = self.counters.clone();
        let thread = std::thread::Builder::new()
            .name("tessera-writer".to_string())
            .spawn(move || write_stripes(receiver, &geometry, &codec, uuid, progress, counters))
            .map_err(|e| ArrayError::Io {
                member: 0,
                name: "writer thread".to_string(),
                source: e,
            })?;
        *self.writer.sender.lock().map_err(lock_poisoned)? = Some(sender);
        *self.writer.thread.lock().map_err(lock_poisoned)? = Some(thread);
        Ok(())
    }

    /// Waits until the writer has written every queued stripe.
    fn wait_writer_idle(&self) -> Result<(), ArrayError> {
        let (lock, idle) = &*self.writer.progress;
        let mut progress = lock.lock().map_err(lock_poisoned)?;
        while progress.in_flight > 0 {
            progress = idle.wait(progress).map_err(lock_poisoned)?;
        }
        Ok(())
    }

    /// Takes in what the writer finished: frees the in-memory copies and
    /// fails members whose writes failed.
    fn drain_writer(&self, state: &mut State) -> Result<(), ArrayError> {
        let done = std::mem::take(&mut self.writer.progress.0.lock().map_err(lock_poisoned)?.done);
        for d in done {
            if let Some(area) = state.in_flight.remove(&d.slot) {
                if let Ok(buffer) = Arc::try_unwrap(area) {
                    state.spare_areas.push(buffer);
                }
            }
            for member in d.failed_members {
                self.fail_member_locked(state, member)?;
            }
        }
        Ok(())
    }

    /// FLUSH: seals the open stripes and syncs every member.
    pub fn flush(&self) -> Result<(), ArrayError> {
        let mut state = self.state.write().map_err(lock_poisoned)?;
        self.flush_locked(&mut state)
    }

    fn flush_locked(&self, state: &mut State) -> Result<(), ArrayError> {
        for stream in [Stream::Gc, Stream::User] {
            self.seal(state, stream, true)?;
        }
        self.wait_writer_idle()?;
        self.drain_writer(state)?;
        self.sync_members(state)?;
        state.synced_through = state.next_sequence - 1;
        // Slots emptied before this sync may now be rewritten.
        for slot in std::mem::take(&mut state.draining) {
            let s = &mut state.slots[slot as usize];
            assert_eq!(s.live_data_blocks + s.live_zero_ranges, 0, "a draining slot is empty");
            if s.status == SlotStatus::Draining {
                s.status = SlotStatus::Free;
                state.free.insert(slot);
            }
        }
        Ok(())
    }

    fn sync_members(&self, state: &mut State) -> Result<(), ArrayError> {
        let devices: Vec<(usize, Arc<dyn Device>)> = (0..state.members.len())
            .filter(|&m| state.writable(m))
            .filter_map(|m| state.members[m].device.clone().map(|d| (m, d)))
            .collect();
        let results: Vec<(usize, std::io::Result<()>)> = std::thread::scope(|scope| {
            let handles: Vec<_> = devices
                .iter()
                .map(|(m, d)| (*m, scope.spawn(move || d.sync())))
                .collect();
            handles
                .into_iter()
                .map(|(m, h)| {
                    (
                        m,
                        h.join().unwrap_or_else(|_| Err(std::io::Error::other("sync panicked"))),
                    )
                })
                .collect()
        });
        for (member, result) in results {
            if result.is_err() {
                self.fail_member_locked(state, member)?;
            }
        }
        Ok(())
    }

    // ---- garbage collection ----------------------------------------------

    /// Moves the live data of the emptiest stripes into the GC stream until
    /// enough slots are free, or nothing is worth moving.
    fn collect_garbage(&self, state: &mut State, target: usize) -> Result<(), ArrayError> {
        let capacity_blocks = (self.geometry.data_area_bytes() / BLOCK_BYTES) as f64;
        for _ in 0..state.slots.len() {
            if state.free.len() + state.draining.len() >= target {
                break;
            }
            // Victims in the window first: only there can an emptied slot
            // be written again before the next checkpoint.
            let outside = |s: u64| state.window.as_ref().is_some_and(|w| !w.contains(&s));
            let victim = (0..state.slots.len() as u64)
                .filter(|&s| state.slots[s as usize].status == SlotStatus::Sealed)
                .min_by_key(|&s| (outside(s), state.slots[s as usize].live_data_blocks));
            let Some(victim) = victim else { break };
            let live = state.slots[victim as usize].live_data_blocks as f64;
            if live > capacity_blocks * GC_VICTIM_LIVE_FRACTION_MAX {
                break;
            }
            self.relocate(state, victim)?;
            self.counters.gc_stripes_collected.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn relocate(&self, state: &mut State, victim: u64) -> Result<(), ArrayError> {
        let ranges: Vec<(u64, Mapping)> = state
            .map
            .iter()
            .filter(|(_, m)| m.target.slot() == victim)
            .map(|(&start, m)| (start, m.clone()))
            .collect();
        for (start, mapping) in ranges {
            match mapping.target {
                Target::Zero { .. } => self.log_zero(state, Stream::Gc, start, mapping.blocks)?,
                Target::Data { .. } => {
                    let data = self.read_blocks(state, start, u64::from(mapping.blocks))?;
                    self.write_blocks(state, start, &data, Stream::Gc)?;
                }
            }
        }
        let s = state.slots[victim as usize];
        assert_eq!(
            s.live_data_blocks + s.live_zero_ranges,
            0,
            "a relocated stripe is empty"
        );
        Ok(())
    }

    // ---- scrub --------------------------------------------------------------

    /// Reads every chunk of every stripe, checks it against its header's
    /// leaf, and rewrites the bad ones from the others. Returns (stripes
    /// checked, bad chunks found); unreadable stripes are an error.
    pub fn scrub(&self) -> Result<(u64, u64), ArrayError> {
        let state = self.state.read().map_err(lock_poisoned)?;
        // Stripes still being written are checked once they are on the members.
        self.wait_writer_idle()?;
        let (mut stripes, mut bad_total) = (0u64, 0u64);
        for slot in 0..self.geometry.slot_count() {
            let s = state.slots[slot as usize];
            if !matches!(
                s.status,
                SlotStatus::Sealed | SlotStatus::Draining | SlotStatus::Checkpoint
            ) {
                continue;
            }
            let (area, bad) = self.reconstruct(&state, slot, s.sequence, true)?;
            stripes += 1;
            bad_total += self.repair(&state, slot, s.sequence, &area, &bad);
        }
        Ok((stripes, bad_total))
    }

    // ---- members ----------------------------------------------------------

    /// Marks member `index` failed (as if pulled) and records it in the
    /// other members' superblocks. Refused if that would leave fewer than K.
    pub fn fail_member(&self, index: usize) -> Result<(), ArrayError> {
        let mut state = self.state.write().map_err(lock_poisoned)?;
        if index >= state.members.len() {
            return Err(ArrayError::NoSuchMember {
                index,
                members: state.members.len(),
            });
        }
        self.fail_member_locked(&mut state, index)
    }

    fn fail_member_locked(&self, state: &mut State, index: usize) -> Result<(), ArrayError> {
        if state.members[index].state != MemberState::Healthy {
            return Ok(());
        }
        self.mark_failed(state, index)?;
        let mut template = state.superblock.clone();
        template.set_failed(index);
        self.publish_superblock(state, template)
    }

    /// Marks healthy member `index` failed in memory, if the parity still
    /// covers one more; the caller records it in the superblocks.
    fn mark_failed(&self, state: &mut State, index: usize) -> Result<(), ArrayError> {
        let unavailable = state.members.iter().filter(|m| m.state != MemberState::Healthy).count();
        if unavailable + 1 > self.geometry.parity {
            return Err(ArrayError::TooManyFailed {
                failed: unavailable + 1,
                parity: self.geometry.parity,
            });
        }
        state.members[index].state = MemberState::Failed;
        Ok(())
    }

    /// Writes `template` (with the next generation) to every healthy
    /// member's superblocks, and makes it the array's. A member whose
    /// superblock cannot be written is failed like any other, and recorded
    /// in a next generation written to the rest; more failures than the
    /// parity covers are an error, with the array's superblock unchanged.
    fn publish_superblock(&self, state: &mut State, mut template: Superblock) -> Result<(), ArrayError> {
        // Each round fails one more member, so this ends by the parity.
        for _ in 0..=self.geometry.parity {
            template.generation = state.superblock.generation.max(template.generation) + 1;
            let member = match crate::write_superblocks(&template, &state.members) {
                Ok(()) => {
                    state.superblock = template;
                    return Ok(());
                }
                Err(ArrayError::Io { member, .. }) => member,
                Err(error) => return Err(error),
            };
            self.mark_failed(state, member)?;
            template.set_failed(member);
        }
        unreachable!("a write failure fails a member, and at most M may fail")
    }

    // ---- status -------------------------------------------------------------

    pub fn status(&self) -> Result<Status, ArrayError> {
        let state = self.state.read().map_err(lock_poisoned)?;
        let g = &self.geometry;
        let c = &self.counters;
        let used: Vec<u64> = (0..g.slot_count())
            .filter(|&s| state.slots[s as usize].status != SlotStatus::Free)
            .collect();
        let degraded = used.iter().filter(|&&s| !self.all_healthy(&state, s)).count() as u64;
        let (mut mapped, mut stored) = (0u64, 0u64);
        let mut seen = BTreeSet::new();
        for mapping in state.map.values() {
            if let Target::Data { extent, .. } = &mapping.target {
                mapped += u64::from(mapping.blocks) * BLOCK_BYTES as u64;
                if seen.insert(Arc::as_ptr(extent)) {
                    stored += u64::from(extent.stored_bytes);
                }
            }
        }
        let user = c.user_bytes_written.load(Ordering::Relaxed);
        let member = c.member_bytes_written.load(Ordering::Relaxed);
        Ok(Status {
            array_uuid: hex(&state.superblock.array_uuid),
            data: g.data,
            parity: g.parity,
            chunk_bytes: g.chunk_bytes,
            checksum: g.checksum.name().to_string(),
            compression: g.compression.map_or("none".to_string(), |c| c.to_string()),
            members: state
                .members
                .iter()
                .enumerate()
                .map(|(index, m)| MemberStatus {
                    index,
                    name: m.name.clone(),
                    state: m.state,
                })
                .collect(),
            members_unavailable: state.members.iter().filter(|m| m.state != MemberState::Healthy).count(),
            stripes_total: g.slot_count(),
            stripes_used: used.len() as u64,
            stripes_degraded: degraded,
            raw_bytes: g.member_bytes * g.members as u64,
            usable_bytes: g.slot_count() * g.data_area_bytes() as u64,
            logical_bytes: g.logical_bytes,
            mapped_bytes: mapped,
            stored_bytes: stored,
            compression_ratio: if stored == 0 {
                1.0
            } else {
                mapped as f64 / stored as f64
            },
            user_bytes_written: user,
            member_bytes_written: member,
            write_amplification: if user == 0 { 0.0 } else { member as f64 / user as f64 },
            stripes_sealed: c.stripes_sealed.load(Ordering::Relaxed),
            short_stripes_sealed: c.short_stripes_sealed.load(Ordering::Relaxed),
            gc_stripes_collected: c.gc_stripes_collected.load(Ordering::Relaxed),
            checksum_errors: c.checksum_errors.load(Ordering::Relaxed),
            chunks_repaired: c.chunks_repaired.load(Ordering::Relaxed),
            reconstructed_reads: c.reconstructed_reads.load(Ordering::Relaxed),
            stripes_reconstructed: c.stripes_reconstructed.load(Ordering::Relaxed),
            unrecoverable_reads: c.unrecoverable_reads.load(Ordering::Relaxed),
            checkpoint_sequence: state.superblock.checkpoint.as_ref().map_or(0, |c| c.sequence),
            checkpoints_written: c.checkpoints_written.load(Ordering::Relaxed),
            recovery: state.recovery.clone(),
        })
    }
}

/// Writes a chunk's header and payload to its row. They are adjacent on
/// the member; one vectored write lets the payload go from the data area
/// uncopied.
fn write_chunk(
    device: &dyn Device,
    geometry: &Geometry,
    row: u64,
    header: &[u8],
    payload: &[u8],
) -> std::io::Result<()> {
    device.write_vectored_at(&[header, payload], geometry.row_offset(row))
}

/// A stripe being written. Each of its chunk writes holds it; when the
/// last lets go, `Drop` reports the stripe done, so no thread has to wait
/// to collect the writes.
struct StripeWrite {
    slot: u64,
    /// `Some` until `Drop`, which lets go of them before reporting.
    area: Option<Arc<AlignedBuf>>,
    built: Option<stripe::Built>,
    failed: Mutex<Vec<usize>>,
    progress: Arc<(Mutex<Progress>, Condvar)>,
    recycle: Sender<stripe::Built>,
}

impl StripeWrite {
    fn chunk(&self, geometry: &Geometry, j: usize) -> (&[u8], &[u8]) {
        let (built, area) = (self.built.as_ref(), self.area.as_ref());
        built.expect("until drop").chunk(geometry, area.expect("until drop"), j)
    }
}

impl Drop for StripeWrite {
    fn drop(&mut self) {
        // The data area goes first, so the volume can reuse it once told.
        self.area.take();
        if let Some(built) = self.built.take() {
            let _ = self.recycle.send(built);
        }
        let failed_members = std::mem::take(self.failed.get_mut().unwrap_or_else(|e| e.into_inner()));
        let (lock, idle) = &*self.progress;
        // A poisoned lock means the volume panicked; nothing is left to tell.
        let Ok(mut progress) = lock.lock() else { return };
        progress.in_flight -= 1;
        progress.done.push(Done {
            slot: self.slot,
            failed_members,
        });
        idle.notify_all();
    }
}

/// One chunk for a member's writer thread.
struct ChunkWrite {
    device: Arc<dyn Device>,
    member: usize,
    row: u64,
    j: usize,
    stripe: Arc<StripeWrite>,
}

/// A member's writer thread. It writes the chunks it is given in order,
/// and those waiting when it comes round (up to [`WRITE_RUN_BYTES_MAX`])
/// that lie end to end on the member with one vectored write: consecutive
/// stripes' chunks do, so when the member is the bottleneck it does fewer,
/// larger writes by itself.
fn write_member_chunks(geometry: &Geometry, chunks: Receiver<ChunkWrite>, counters: &Counters) {
    let chunk_bytes = SECTOR_BYTES + geometry.chunk_bytes;
    while let Ok(first) = chunks.recv() {
        let mut batch = vec![first];
        while batch.len() * chunk_bytes < WRITE_RUN_BYTES_MAX {
            match chunks.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let mut start = 0;
        while start < batch.len() {
            let mut end = start + 1;
            while end < batch.len() && batch[end].row == batch[end - 1].row + 1 {
                end += 1;
            }
            write_run(geometry, &batch[start..end], counters);
            start = end;
        }
        // Dropping the batch lets go of its stripes: the last reports each.
    }
}

/// Writes chunks that lie end to end on one member with one call.
fn write_run(geometry: &Geometry, run: &[ChunkWrite], counters: &Counters) {
    let pieces: Vec<&[u8]> = run
        .iter()
        .flat_map(|w| {
            let (header, payload) = w.stripe.chunk(geometry, w.j);
            [header, payload]
        })
        .collect();
    let written = run[0]
        .device
        .write_vectored_at(&pieces, geometry.row_offset(run[0].row));
    if written.is_ok() {
        let bytes: usize = pieces.iter().map(|p| p.len()).sum();
        counters.member_bytes_written.fetch_add(bytes as u64, Ordering::Relaxed);
        return;
    }
    for w in run {
        if let Ok(mut failed) = w.stripe.failed.lock() {
            failed.push(w.member);
        }
    }
}

/// The writer thread: builds each queued stripe, in order, and hands its
/// K+M chunks to the members' threads, which write them at once (with
/// direct I/O each write waits for its device). It goes on to the next
/// stripe meanwhile; each stripe reports itself done when its last chunk
/// is written.
fn write_stripes(
    jobs: Receiver<Job>,
    geometry: &Geometry,
    codec: &tessera_ec::Codec,
    array_uuid: [u8; 16],
    progress: Arc<(Mutex<Progress>, Condvar)>,
    counters: Arc<Counters>,
) {
    let (recycle, recycled) = std::sync::mpsc::channel::<stripe::Built>();
    type MemberThread = (Sender<ChunkWrite>, std::thread::JoinHandle<()>);
    let threads: Vec<Option<MemberThread>> = (0..geometry.members)
        .map(|m| {
            // Unbounded: `Writer::stripes_max` bounds what is in flight.
            let (sender, chunks) = std::sync::mpsc::channel::<ChunkWrite>();
            let (g, counters) = (geometry.clone(), counters.clone());
            std::thread::Builder::new()
                .name(format!("tessera-member-{m}"))
                .spawn(move || write_member_chunks(&g, chunks, &counters))
                .ok()
                .map(|thread| (sender, thread))
        })
        .collect();
    for job in jobs {
        let mut built = recycled.try_recv().unwrap_or_default();
        stripe::build(geometry, codec, array_uuid, &job.area, &job.info, &mut built);
        let stripe = Arc::new(StripeWrite {
            slot: job.info.slot,
            area: Some(job.area),
            built: Some(built),
            failed: Mutex::new(Vec::new()),
            progress: progress.clone(),
            recycle: recycle.clone(),
        });
        for j in 0..geometry.width() {
            let (member, row) = geometry.place(job.info.slot, j);
            // A member unavailable when the stripe was sealed gets no chunk.
            let Some(device) = job.devices[member].clone() else {
                continue;
            };
            let write = ChunkWrite {
                device,
                member,
                row,
                j,
                stripe: stripe.clone(),
            };
            // Without a thread for this member, the chunk is written here.
            let unsent = match &threads[member] {
                Some((sender, _)) => sender.send(write).err().map(|e| e.0),
                None => Some(write),
            };
            if let Some(write) = unsent {
                write_run(geometry, std::slice::from_ref(&write), &counters);
            }
        }
    }
    // Every chunk is written before the writer is done (`Drop for Array`
    // waits for it): the member threads write what they were given, then
    // see their queues close.
    for (sender, thread) in threads.into_iter().flatten() {
        drop(sender);
        let _ = thread.join();
    }
}

impl Drop for Array {
    /// Stops the writer after it has written what was queued, as a clean
    /// shutdown must; unflushed data is then on the members but not synced.
    fn drop(&mut self) {
        if let Ok(mut sender) = self.writer.sender.lock() {
            sender.take();
        }
        if let Some(thread) = self.writer.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = thread.join();
        }
    }
}

/// Byte range in a block buffer starting at `lba` for blocks [from, end).
fn block_range_end(lba: u64, from: u64, end: u64) -> std::ops::Range<usize> {
    (from - lba) as usize * BLOCK_BYTES..(end - lba) as usize * BLOCK_BYTES
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Target {
    fn slot(&self) -> u64 {
        match self {
            Target::Zero { slot } => *slot,
            Target::Data { extent, .. } => extent.slot,
        }
    }
}

impl State {
    /// The data area of a stripe not (yet) on the members: open, or queued
    /// for the writer.
    fn in_memory(&self, slot: u64) -> Option<&[u8]> {
        self.open
            .values()
            .find(|o| o.slot == slot)
            .map(|o| &o.data[..])
            .or_else(|| self.in_flight.get(&slot).map(|a| &a[..]))
    }

    /// Forgets the map and every slot's state (a checkpoint that failed
    /// to load half-way).
    fn reset_map(&mut self) {
        self.map.clear();
        self.free.clear();
        for s in &mut self.slots {
            *s = Slot::empty(SlotStatus::Free, 0);
        }
    }

    fn readable(&self, member: usize) -> Option<&Arc<dyn Device>> {
        let m = &self.members[member];
        match m.state {
            MemberState::Healthy => m.device.as_ref(),
            _ => None,
        }
    }

    fn writable(&self, member: usize) -> bool {
        self.readable(member).is_some()
    }

    /// Mappings overlapping blocks [lba, end), in order.
    fn overlapping(&self, lba: u64, end: u64) -> impl Iterator<Item = (u64, &Mapping)> {
        let before = self
            .map
            .range(..lba)
            .next_back()
            .filter(|(&s, m)| s + u64::from(m.blocks) > lba)
            .map(|(&s, m)| (s, m));
        before.into_iter().chain(
            self.map
                .range((Bound::Included(lba), Bound::Excluded(end)))
                .map(|(&s, m)| (s, m)),
        )
    }

    fn account(&mut self, target: &Target, blocks: u32, sign: i64) {
        let s = &mut self.slots[target.slot() as usize];
        match target {
            Target::Data { .. } => {
                s.live_data_blocks = s.live_data_blocks.wrapping_add_signed(sign * i64::from(blocks));
            }
            Target::Zero { .. } => s.live_zero_ranges = s.live_zero_ranges.wrapping_add_signed(sign),
        }
        if s.status == SlotStatus::Sealed && s.live_data_blocks + s.live_zero_ranges == 0 {
            s.status = SlotStatus::Draining;
            let slot = target.slot();
            self.draining.push(slot);
        }
    }

    /// Adds a record to `stream`'s open stripe (in `slot`) and maps it.
    fn log(&mut self, stream: Stream, slot: u64, record: Record) {
        self.apply(slot, &record);
        self.open.get_mut(&stream).expect("room opened it").records.push(record);
    }

    /// Maps what a record in stripe `slot` says, over what was there.
    fn apply(&mut self, slot: u64, record: &Record) {
        match record {
            Record::Data { lba, extent } => {
                debug_assert_eq!(extent.slot, slot);
                let extent = Arc::new(extent.clone());
                self.insert(*lba, extent.blocks, Target::Data { extent, skip: 0 });
            }
            Record::Zero { lba, blocks } => self.insert(*lba, *blocks, Target::Zero { slot }),
        }
    }

    /// Maps blocks [lba, lba+blocks) to `target`, cutting what was there.
    fn insert(&mut self, lba: u64, blocks: u32, target: Target) {
        let end = lba + u64::from(blocks);
        let old: Vec<(u64, Mapping)> = self.overlapping(lba, end).map(|(s, m)| (s, m.clone())).collect();
        for (start, mapping) in old {
            self.map.remove(&start);
            let mapping_end = start + u64::from(mapping.blocks);
            if start < lba {
                let head = (lba - start) as u32;
                self.put(start, head, mapping.target.clone());
            }
            if mapping_end > end {
                let cut = (end - start) as u32;
                let tail_target = match &mapping.target {
                    Target::Data { extent, skip } => Target::Data {
                        extent: extent.clone(),
                        skip: skip + cut,
                    },
                    zero => zero.clone(),
                };
                self.put(end, (mapping_end - end) as u32, tail_target);
            }
            // Last, so a stripe keeping a head or tail is never seen empty.
            self.account(&mapping.target, mapping.blocks, -1);
        }
        self.put(lba, blocks, target);
    }

    fn put(&mut self, lba: u64, blocks: u32, target: Target) {
        self.account(&target, blocks, 1);
        self.map.insert(lba, Mapping { blocks, target });
    }
}
