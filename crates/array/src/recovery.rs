//! Recovery: the map rebuilt when the array opens.
//!
//! # Guarantees
//!
//! - From the newest checkpoint the superblocks name, rolled forward over
//!   the stripes newer than it in its window; without a usable checkpoint,
//!   from every stripe's summary. Either way every write a FLUSH or FUA
//!   acknowledged is found: stripes are self-describing.
//! - Replay keeps, block by block, the record with the highest version,
//!   so the order stripes were written in does not matter (a relocated
//!   copy never undoes a newer write).
//! - Stripes written after the last sync are read whole and checked
//!   against their Merkle root; one a crash tore (fewer than K good
//!   chunks) held nothing acknowledged and is dropped, and its headers are
//!   erased, so that later stripes saying "synced through" past it cannot
//!   bring it back. One with K or more good chunks is kept and its missing
//!   chunks rewritten. A slot's newest stripe whose headers are on fewer
//!   than K chunks is read whole and checked so at any sequence: the scan
//!   reads M+1 headers of a slot first and the rest only where one is
//!   newer than the checkpoint or in doubt (`read_window_headers`), so an
//!   earlier opening may have left a torn one behind, and later stripes
//!   may say they are synced past it.
//! - A slot whose newest chunk is a checkpoint's is not replayed: a
//!   checkpoint takes only free slots, so the older stripe a torn
//!   checkpoint stripe left behind on its other chunks was garbage.
//! - If the checkpoint cannot be read, or replay finds the map pointing
//!   into a slot that holds a newer stripe than the one it was copied
//!   from, recovery starts over from every stripe's summary and says why
//!   in `status`.
//! - The records are left to be mapped after opening, page by page,
//!   before anything looks at a page, each page then checked as eager
//!   replay checks the map (`replay.rs`); mapped before serving where a
//!   replayed slot's slot table page is unread, where the records would
//!   take too much memory, and where the members ask for it
//!   (`Start::Suspect`).

use crate::catalog::Catalog;
use crate::checkpoint::Checkpoints;
use crate::error::{ArrayError, CheckpointFault};
use crate::format::{Checkpoint, CheckpointRef, ChunkHeader, PageImage, Record, Stream, SUMMARY_HEADER_BYTES};
use crate::index::{target_of, Index};
use crate::lanes::Lanes;
use crate::limits::MAP_PAGE_BLOCKS;
use crate::map::{Location, Map, Rule};
use crate::options::EngineOptions;
use crate::slot_set::SlotSet;
use crate::slots::{SlotState, SlotTable};
use crate::stripes::Stripes;
use serde::Serialize;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

/// What opening the array found and did, for `status`.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct Recovery {
    /// The checkpoint recovery started from (`None`: none, every slot
    /// scanned).
    pub checkpoint_sequence: Option<u64>,
    /// Why a checkpoint the superblock names was not used, if it was not.
    pub checkpoint_error: Option<String>,
    pub slots_scanned: u64,
    /// Chunk header sectors the scan read: M+1 of a slot no newer stripe
    /// was written to, or whose newer stripe its opening had said was
    /// synced; K+M of the others (`read_window_headers`).
    #[serde(default)]
    pub headers_read: u64,
    /// Of the stripes found newer than the checkpoint, those taken as
    /// whole on M+1 headers, where the opening that wrote them had said
    /// they were synced (`read_window_headers`).
    #[serde(default)]
    pub stripes_whole_on_m_plus_1: u64,
    pub stripes_replayed: u64,
    /// Stripes a crash left incomplete: newer than the last sync, or
    /// with headers on fewer than K chunks, and not readable whole.
    pub torn_stripes_dropped: u64,
    /// Chunks of kept stripes that were missing or bad, and rewritten.
    pub chunks_repaired: u64,
    /// A clean stop left the checkpoint, and nothing after it: no stripe
    /// header was read.
    #[serde(default)]
    pub clean_stop: bool,
    /// Slot table pages the root names, and those of them opening left to
    /// be read after it (all but those of the window's slots and of the
    /// stripes sealed since the pages; none where the members' activity
    /// records asked for every page, `Start::Suspect`).
    #[serde(default)]
    pub slot_pages: u64,
    #[serde(default)]
    pub slot_pages_deferred: u64,
    /// What the intent log held (`None`: the array has no log).
    pub log: Option<crate::intent::LogRecovery>,
    pub milliseconds: u64,
    /// Where the time went, for whoever tunes opening after a crash.
    #[serde(default)]
    pub phases: RecoveryPhases,
    /// Map pages whose replayed records were left to be mapped after
    /// opening (`index::Pending`); 0 where replay mapped them before
    /// serving.
    #[serde(default)]
    pub pages_mapped_later: u64,
    /// Of `stripes_replayed` where they were mapped after opening, those
    /// in slots that held pieces in the slot table the checkpoint
    /// restored (on a full array, stripes garbage collection emptied and
    /// wrote again): each page is checked for the map pointing into
    /// their older stripes as it is mapped (`replay.rs`).
    #[serde(default)]
    pub replayed_slots_reused: u64,
}

/// Milliseconds of an opening's steps: the checkpoint's root and pages
/// read, the scanned slots' chunk headers read, the replayed stripes'
/// summaries read, the map pages they land in brought in, their records
/// mapped (with the order they are mapped in), and the map checked
/// against them (no mapping left pointing at a place they overwrote)
/// and the slots nothing points at freed; then what is made durable
/// after, and the intent log's replay.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct RecoveryPhases {
    pub checkpoint: u64,
    pub headers: u64,
    pub summaries: u64,
    pub map_pages: u64,
    pub mapping: u64,
    pub check: u64,
    /// The torn stripes erased, the members synced, and a checkpoint
    /// where there was none.
    #[serde(default)]
    pub settle: u64,
    /// The intent log's blocks read and replayed (`Shared::replay_log`).
    #[serde(default)]
    pub log: u64,
}

/// Milliseconds since `since`, and `since` moved to now.
fn lap(since: &mut std::time::Instant) -> u64 {
    let now = std::time::Instant::now();
    let ms = (now - *since).as_millis() as u64;
    *since = now;
    ms
}

/// What opening knows of the members before recovery reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Start {
    /// Just created: its superblocks are the first thing written to its
    /// members, so no stripe of this array is anywhere.
    Fresh,
    /// Every member says a clean stop left the checkpoint of this
    /// sequence and wrote nothing after it (`activity::clean_at`).
    Clean(u64),
    /// Anything may be there: the checkpoint's window (or every slot) is
    /// scanned.
    Unknown,
    /// As `Unknown`, and what an opening before this one left for later
    /// failed (`activity::pages_suspect`: a slot table page could not be
    /// read, or a page the replay mapped later was stale), or this
    /// opening's first try found the map stale (`open_with`): every slot
    /// page is read and the replay mapped before serving, and if a page
    /// still cannot be read or the map is stale, every slot is scanned.
    Suspect,
}

/// A chunk header recovery reads: where on its member, and its slot and
/// chunk index.
type HeaderRead = (u64, u64, usize);

/// What a chunk's header sector says to recovery's scan.
enum Seen {
    /// This array's header of this chunk of this slot.
    Header(Box<ChunkHeader>),
    /// Zeros, or a whole header of another array, slot or chunk: no
    /// stripe of this slot wrote this chunk.
    Other,
    /// Unreadable, or neither a whole header nor zeros (torn, corrupt):
    /// it may be a newer stripe's.
    Doubt,
}

/// The headers a window scan kept (`read_window_headers`).
struct WindowHeaders {
    headers: Vec<(u64, usize, ChunkHeader)>,
    /// Header sectors read.
    reads: u64,
    /// Slots whose newest stripe was taken as whole on M+1 headers.
    whole: HashSet<u64>,
}

/// Adds to `vouched` (each opening's newest "synced through"; opening 0:
/// headers written before openings were numbered, which vouch for
/// nothing) what the user and GC stripes newer than `from` among `seen`
/// say. The greatest of them is the scan's "synced through".
fn vouch(vouched: &mut HashMap<u64, u64>, seen: &[(u64, usize, Seen)], from: u64) {
    for (_, _, seen) in seen {
        if let Seen::Header(h) = seen {
            if h.sequence > from && h.stream != Stream::Meta {
                let t = vouched.entry(h.opening).or_default();
                *t = (*t).max(h.synced_through);
            }
        }
    }
}

/// Folds `header` (of `slot`, newer than the checkpoint) into `newest`:
/// each slot's newest stripe and how many of its chunks were found.
fn fold_newest(newest: &mut HashMap<u64, (ChunkHeader, usize)>, slot: u64, header: ChunkHeader) {
    match newest.entry(slot) {
        std::collections::hash_map::Entry::Occupied(mut best) => match best.get().0.sequence {
            s if s < header.sequence => {
                best.insert((header, 1));
            }
            s if s == header.sequence => best.get_mut().1 += 1,
            _ => {}
        },
        std::collections::hash_map::Entry::Vacant(place) => {
            place.insert((header, 1));
        }
    }
}

/// What a replay found, for the steps after it.
struct Replayed {
    recovery: Recovery,
    window: Option<BTreeSet<u64>>,
    max_sequence: u64,
    torn: Vec<u64>,
}

/// Recovery's view of the layers it rebuilds: the stripes it reads, the
/// index it fills, the lanes' tracker it sets, the checkpoints it loads
/// (and writes one of, where there was none).
pub(crate) struct Opening<'a> {
    pub stripes: &'a Stripes,
    pub catalog: &'a Catalog,
    pub lanes: &'a Lanes,
    pub checkpoints: &'a Checkpoints,
    pub options: &'a EngineOptions,
}

impl Opening<'_> {
    /// Rebuilds the map and the slot table, then syncs, so that new
    /// stripes may say everything before them is durable, and writes a
    /// checkpoint if it found none to start from. No slot is scanned for
    /// a fresh array (a member's older contents belong to no array of
    /// this UUID anyway), nor after a clean stop. The intent log is
    /// replayed after it, by the engine (its records are written as
    /// clients' are).
    pub(crate) fn recover(&self, start: Start) -> Result<Recovery, ArrayError> {
        let reference = self.stripes.members.superblock().checkpoint.clone();
        let replayed = match self.replay(reference.as_ref(), start) {
            Err(error @ ArrayError::CheckpointUnreadable { .. }) => {
                // Every stripe is self-describing: a full scan still finds
                // every acknowledged write.
                self.reset_index();
                let mut replayed = self.replay(None, Start::Unknown)?;
                replayed.recovery.checkpoint_error = Some(error.to_string());
                replayed
            }
            other => other?,
        };
        let Replayed {
            mut recovery,
            window,
            max_sequence,
            torn,
        } = replayed;
        let settling = std::time::Instant::now();
        let g = &self.stripes.geometry;
        recovery.torn_stripes_dropped = torn.len() as u64;
        for slot in torn {
            for j in 0..g.width() {
                let (member, row) = g.place(slot, j);
                self.stripes.members.erase_sector(member, g.row_offset(row));
            }
        }
        {
            let mut t = self.lanes.tracker.lock();
            t.next_sequence = max_sequence + 1;
        }
        {
            let mut index = self.catalog.index_mut();
            index.last_sealed = max_sequence;
            // After a clean stop no data stripe is newer than the
            // checkpoint; else any may be, as far as a later clean stop
            // knows.
            index.last_data_sealed = match (recovery.clean_stop, recovery.checkpoint_sequence) {
                (true, Some(sequence)) => sequence,
                _ => max_sequence,
            };
            // Writes to a volume created after the last write recovery saw
            // must still be newer than the volume.
            index.next_version = index.next_version.max(index.volumes.newest() + 1);
        }
        // Everything replayed, and the erasures, are made durable, so
        // later stripes may say so.
        for (member, error) in self.stripes.io.sync(&self.stripes.writable_members()) {
            self.stripes.members.failed_io(member, &error)?;
        }
        self.lanes.tracker.lock().synced_through = max_sequence;
        let has_window = window.is_some();
        self.catalog.index_mut().slots.set_window(window);
        if !has_window {
            self.checkpoints.checkpoint()?;
        }
        recovery.phases.settle = settling.elapsed().as_millis() as u64;
        Ok(recovery)
    }

    /// What the chunk headers of the `chunks` (slot, chunk index) say, in
    /// slot and then chunk order. Read a member at a time, many at once
    /// (`Device::read_sectors`), the members side by side on the I/O pool:
    /// read one by one on 40 threads, a window's 163,840 headers took
    /// 1.5 s of a 4 s opening on a 2-vCPU VM, most of it the kernel's
    /// (PERFORMANCE.md, "Opening after kill -9: the headers read through
    /// io_uring"). A chunk on a member that cannot be read is `Doubt`.
    fn read_headers(&self, chunks: &[(u64, usize)]) -> Vec<(u64, usize, Seen)> {
        use rayon::prelude::*;
        let g = &self.stripes.geometry;
        // Each member's reads: where, and which slot and chunk.
        let mut reads: Vec<Vec<HeaderRead>> = vec![Vec::new(); g.members];
        for &(slot, j) in chunks {
            let (member, row) = g.place(slot, j);
            reads[member].push((g.row_offset(row), slot, j));
        }
        let pieces: Vec<(usize, &[HeaderRead])> = reads
            .iter()
            .enumerate()
            .flat_map(|(member, reads)| {
                reads
                    .chunks(crate::limits::SCAN_READS_PER_TASK)
                    .map(move |r| (member, r))
            })
            .collect();
        let mut found: Vec<(u64, usize, Seen)> = self.stripes.io_pool.install(|| {
            pieces
                .par_iter()
                .flat_map_iter(|&(member, reads)| {
                    let Some(device) = self.stripes.members.readable(member) else {
                        return reads.iter().map(|&(_, slot, j)| (slot, j, Seen::Doubt)).collect();
                    };
                    let mut found = Vec::with_capacity(reads.len());
                    let offsets: Vec<u64> = reads.iter().map(|r| r.0).collect();
                    device.read_sectors(&offsets, &mut |i, bytes| {
                        let (_, slot, j) = reads[i];
                        found.push((slot, j, self.seen(bytes.ok(), slot, j)));
                    });
                    found
                })
                .collect()
        });
        found.sort_unstable_by_key(|&(slot, j, _)| (slot, j));
        found
    }

    /// What a chunk's header sector (`None`: unreadable) says of chunk
    /// `j` of `slot`.
    fn seen(&self, sector: Option<&[u8]>, slot: u64, j: usize) -> Seen {
        let Some(sector) = sector else {
            return Seen::Doubt;
        };
        match ChunkHeader::decode(sector, self.stripes.geometry.checksum) {
            Ok(header) if header.array_uuid == self.stripes.array_uuid && header.slot == slot && header.index == j => {
                Seen::Header(Box::new(header))
            }
            // A whole header, but of another array or place: no chunk of
            // this slot wrote it.
            Ok(_) => Seen::Other,
            // Never written.
            Err(_) if sector.iter().all(|&b| b == 0) => Seen::Other,
            // Torn, corrupt, or foreign bytes: a new chunk's, for all
            // anyone knows.
            Err(_) => Seen::Doubt,
        }
    }

    /// This array's headers of the chunks of `slots` that may hold a
    /// stripe newer than sequence `from`, in slot and then chunk order,
    /// how many header sectors were read, and the slots whose newest
    /// stripe was taken as whole on M+1 headers. First M+1 chunks of each
    /// slot on members that can be read (rotating, so that the members
    /// share the reads); the slot's other readable chunks are read too
    /// (and counted: members that cannot be read are not) unless those
    /// M+1 settle it:
    ///
    /// - each holds a header of sequence `from` or older, or no header:
    ///   the slot holds no stripe newer than `from` with K or more chunks
    ///   (such a stripe is on all but M of the chunks at least). A window
    ///   slot no stripe was written to after the checkpoint costs M+1
    ///   reads, not K+M (8+2: 3, not 10). What a skipped chunk may hold
    ///   is a stripe newer than `from` on fewer than K chunks: torn by a
    ///   crash before it was acknowledged. Recovery reads such a stripe
    ///   whole wherever it finds one, as it reads those newer than the
    ///   last sync, whatever the stripes after it say was synced
    ///   (`replay`), and so drops it as torn.
    /// - each holds a header of one stripe newer than `from` (one
    ///   sequence, opening and Merkle root; not a checkpoint's), and a
    ///   header of that opening read so far (in `vouched`) says it was
    ///   synced: a synced stripe was on every chunk but those of members
    ///   failed when it was written, which hold another header or none
    ///   (one among the M+1 makes them disagree). Only the opening that wrote
    ///   a stripe vouches for it: a stripe torn on chunks an earlier
    ///   opening did not read may share its sequence with one written
    ///   since. Its slot is in the set returned; where its summary cannot
    ///   be read, `replay` reads the other headers and decides again.
    ///   After a crash most of a window's slots hold a synced stripe, so
    ///   this is most of what opening reads: M+1 headers, not K+M.
    ///
    /// Anything else (a newer sequence that is not vouched for, headers
    /// that disagree, one unreadable, torn or corrupt, fewer than M+1
    /// members readable) reads the rest.
    fn read_window_headers(&self, slots: &[u64], from: u64, vouched: &mut HashMap<u64, u64>) -> WindowHeaders {
        let g = &self.stripes.geometry;
        let width = g.width();
        let readable: Vec<bool> = (0..g.members)
            .map(|m| self.stripes.members.readable(m).is_some())
            .collect();
        let readable = |slot: u64, j: usize| readable[g.place(slot, j).0];
        let first: Vec<(u64, usize)> = slots
            .iter()
            .flat_map(|&slot| {
                (0..width)
                    .map(move |t| (slot, ((slot % width as u64) as usize + t) % width))
                    .filter(|&(slot, j)| readable(slot, j))
                    .take(g.parity + 1)
            })
            .collect();
        let seen = self.read_headers(&first);
        vouch(vouched, &seen, from);
        let mut rest: Vec<(u64, usize)> = Vec::new();
        let mut whole = HashSet::new();
        for run in seen.chunk_by(|a, b| a.0 == b.0) {
            let slot = run[0].0;
            // Settled by M+1 headers only (a slot with fewer readable
            // chunks is read whole, which is what it has).
            let m_plus_1 = run.len() == g.parity + 1;
            let older = run.iter().all(|(_, _, seen)| match seen {
                Seen::Header(header) => header.sequence <= from,
                Seen::Other => true,
                Seen::Doubt => false,
            });
            let synced = match &run[0].2 {
                Seen::Header(first) => {
                    first.sequence > from
                        && first.stream != Stream::Meta
                        && first.opening != 0
                        && vouched.get(&first.opening).is_some_and(|&t| t >= first.sequence)
                        && run.iter().all(|(_, _, seen)| {
                            matches!(seen, Seen::Header(h) if h.sequence == first.sequence
                                && h.opening == first.opening
                                && h.root == first.root)
                        })
                }
                _ => false,
            };
            if m_plus_1 && synced {
                whole.insert(slot);
            } else if !(m_plus_1 && older) {
                rest.extend(
                    (0..width)
                        .filter(|&j| readable(slot, j) && !run.iter().any(|r| r.1 == j))
                        .map(|j| (slot, j)),
                );
            }
        }
        let reads = (first.len() + rest.len()) as u64;
        let rest = self.read_headers(&rest);
        vouch(vouched, &rest, from);
        let mut headers: Vec<(u64, usize, ChunkHeader)> = seen
            .into_iter()
            .chain(rest)
            .filter_map(|(slot, j, seen)| match seen {
                Seen::Header(header) => Some((slot, j, *header)),
                _ => None,
            })
            .collect();
        headers.sort_unstable_by_key(|&(slot, j, _)| (slot, j));
        WindowHeaders { headers, reads, whole }
    }

    /// This array's headers of every readable chunk of `slot`, and how
    /// many were read: a slot taken as whole on M+1 headers whose
    /// summary could not be read, read again.
    fn read_slot_headers(&self, slot: u64) -> (Vec<ChunkHeader>, u64) {
        let g = &self.stripes.geometry;
        let chunks: Vec<(u64, usize)> = (0..g.width())
            .filter(|&j| self.stripes.members.readable(g.place(slot, j).0).is_some())
            .map(|j| (slot, j))
            .collect();
        let headers = self
            .read_headers(&chunks)
            .into_iter()
            .filter_map(|(_, _, seen)| match seen {
                Seen::Header(header) => Some(*header),
                _ => None,
            })
            .collect();
        (headers, chunks.len() as u64)
    }

    fn reset_index(&self) {
        let mut index = self.catalog.index_mut();
        index.map = Map::new(self.options.map_delta_entries_min);
        index.slots = SlotTable::new(self.stripes.geometry.checksum, self.stripes.geometry.slot_count());
        index.checkpoint_slots.clear();
        index.map_stripes = 0;
        drop(index);
        *self.checkpoints.durable() = crate::checkpoint::Durable::default();
        let mut index = self.catalog.index_mut();
        index.drain_after_user.clear();
        index.drain_at_seal.clear();
        index.pending = None;
        index.user_open.clear();
        index.next_version = 1;
    }

    /// Loads the checkpoint (if any) and replays the stripes newer than it
    /// in its window (or every slot; none if fresh, or if a clean stop
    /// left this checkpoint).
    fn replay(&self, reference: Option<&CheckpointRef>, start: Start) -> Result<Replayed, ArrayError> {
        let g = &self.stripes.geometry;
        let mut recovery = Recovery::default();
        let mut clock = std::time::Instant::now();
        let (mut from, mut max_sequence, mut window) = (0, 0, None);
        // The slots to scan: the window's, none (fresh), or every one.
        let scan: Box<dyn Iterator<Item = u64>> = if let Some(reference) = reference {
            let loaded = self.load_checkpoint(reference, start != Start::Suspect, &mut recovery)?;
            from = reference.sequence;
            let stripes = reference.stripe_count(self.checkpoints.meta_stripe_bytes());
            max_sequence = reference.first_stripe_sequence + stripes as u64 - 1;
            recovery.clean_stop = start == Start::Clean(reference.sequence);
            let scan: Vec<u64> = if recovery.clean_stop {
                Vec::new()
            } else {
                loaded.iter().copied().collect()
            };
            window = Some(loaded);
            Box::new(scan.into_iter())
        } else if start == Start::Fresh {
            Box::new(std::iter::empty())
        } else {
            Box::new(0..g.slot_count())
        };
        recovery.checkpoint_sequence = reference.map(|r| r.sequence);
        recovery.phases.checkpoint = lap(&mut clock);
        // Pass 1: the headers of every chunk in the scanned slots, read on
        // the I/O pool (the reads only wait on the members), each slot's
        // folded to what the passes after need.
        // In batches, so that a full scan of a huge array holds one batch.
        let mut scan = scan;
        // Each slot's newest header newer than `from`, and how many of its
        // chunks hold that stripe.
        let mut newest: HashMap<u64, (ChunkHeader, usize)> = HashMap::new();
        // Each opening's newest "synced through" read so far (`vouch`), and
        // the slots taken as whole on M+1 headers (`read_window_headers`).
        let mut vouched: HashMap<u64, u64> = HashMap::new();
        let mut whole: HashSet<u64> = HashSet::new();
        loop {
            let slots = (crate::limits::SCAN_BATCH_CHUNKS / g.width()).max(1);
            let batch: Vec<u64> = scan.by_ref().take(slots).collect();
            if batch.is_empty() {
                break;
            }
            recovery.slots_scanned += batch.len() as u64;
            // Folded a slot at a time, its chunks in order: the newest
            // sequence any of them holds, and the newest of those newer
            // than `from` (its first chunk's header) with its count.
            let scanned = self.read_window_headers(&batch, from, &mut vouched);
            recovery.headers_read += scanned.reads;
            whole.extend(scanned.whole);
            for (slot, _, header) in scanned.headers {
                max_sequence = max_sequence.max(header.sequence);
                if header.sequence > from {
                    fold_newest(&mut newest, slot, header);
                }
            }
        }
        // The newest "synced through" of the user and GC stripes newer
        // than `from`, whichever opening wrote them.
        let synced_through = vouched.values().copied().fold(from, u64::max);
        recovery.stripes_whole_on_m_plus_1 = whole.len() as u64;
        // A slot whose newest chunk belongs to a checkpoint's stripe holds
        // no data: a checkpoint takes only free slots, so whatever older
        // stripe its other chunks still hold (where power loss tore the
        // checkpoint's) was garbage, and may have fewer than K chunks left.
        newest.retain(|_, (header, _)| header.stream != Stream::Meta);
        // A stripe on fewer than K chunks was torn by a crash before it was
        // acknowledged (an acknowledged stripe is on all chunks but those of
        // members that had failed when it was written, M at most), or lies
        // on members this opening cannot read: read whole and checked, as
        // a stripe newer than the last sync is, whatever "synced through"
        // the stripes after it say, and dropped as torn where fewer than K
        // chunks are good. A scan that read only M+1 chunks of a slot may
        // have left one behind (`read_window_headers`), under a sequence
        // a stripe written since may hold too. (A slot taken as whole on
        // M+1 headers holds a synced stripe: its count is not known.)
        recovery.phases.headers = lap(&mut clock);
        // Pass 2: each slot's newest stripe, checked, its summary read,
        // on the I/O pool (a full window is ~8,000 stripes, a read or two
        // each: one after another, they took ~0.6 s of a 6 s opening).
        let mut stripes: Vec<(u64, u64, Vec<Record>)> = Vec::new();
        let mut torn = Vec::new();
        let mut todo: Vec<u64> = newest.keys().copied().collect();
        // Twice at most: a slot taken as whole on M+1 headers whose summary
        // cannot be read has its other headers read, and is decided again
        // as any other slot is.
        while !todo.is_empty() {
            let summaries: Vec<(u64, u64, bool, Result<_, ArrayError>)> = self.stripes.io_pool.install(|| {
                use rayon::prelude::*;
                todo.par_iter()
                    .map(|&slot| {
                        let (header, chunks) = &newest[&slot];
                        let verify_all =
                            header.sequence > synced_through || (*chunks < g.data && !whole.contains(&slot));
                        (header.sequence, slot, verify_all, self.read_summary(header, verify_all))
                    })
                    .collect()
            });
            let mut again = Vec::new();
            for (sequence, slot, verify_all, summary) in summaries {
                match summary {
                    Ok((records, repaired)) => {
                        recovery.chunks_repaired += repaired;
                        stripes.push((sequence, slot, records));
                    }
                    // Written after the last sync (or found on fewer than K
                    // chunks) and torn by a crash: it held nothing acknowledged.
                    Err(_) if verify_all => torn.push(slot),
                    Err(_) if whole.remove(&slot) => again.push(slot),
                    Err(error) => return Err(error),
                }
            }
            for &slot in &again {
                newest.remove(&slot);
                let (headers, reads) = self.read_slot_headers(slot);
                recovery.headers_read += reads;
                for header in headers {
                    max_sequence = max_sequence.max(header.sequence);
                    if header.sequence > from {
                        fold_newest(&mut newest, slot, header);
                    }
                }
                // Its newest a checkpoint's: no data, as above.
                if newest
                    .get(&slot)
                    .is_some_and(|(header, _)| header.stream == Stream::Meta)
                {
                    newest.remove(&slot);
                }
            }
            todo = again.into_iter().filter(|slot| newest.contains_key(slot)).collect();
        }
        stripes.sort_by_key(|s| s.0);
        recovery.phases.summaries = lap(&mut clock);
        recovery.stripes_replayed = stripes.len() as u64;
        // Not after an opening whose replay mapped later found the map
        // pointing into a replayed slot (`Start::Suspect`): mapped now,
        // the check below finds it again, and the full scan follows.
        let later = window.is_some() && start != Start::Suspect;
        let stripes = match self.replay_later(later, stripes) {
            Ok((pages, reused)) => {
                recovery.pages_mapped_later = pages as u64;
                recovery.replayed_slots_reused = reused as u64;
                recovery.phases.check = lap(&mut clock);
                return Ok(Replayed {
                    recovery,
                    window,
                    max_sequence,
                    torn,
                });
            }
            Err(stripes) => stripes,
        };
        let mut replayed_slots = SlotSet::empty(g.slot_count());
        // A list, sorted once all are in, not a hash set: a set's inserts
        // (and rehashes as it grew) took 0.25 s of mapping a full window.
        let mut fresh: Vec<Location> = Vec::with_capacity(stripes.iter().map(|s| s.2.len()).sum());
        // In groups whose pages the map cache holds at once: a group's
        // pages read in parallel and pinned (any evicted since read
        // again), then its stripes mapped in order, then what the cache
        // has no room for evicted.
        // (A zero record may span a whole volume: a stripe with one that
        // spans more than the cache holds is a group of its own.)
        let cache_pages = self.catalog.cache_pages();
        let mut stripes = stripes.into_iter().peekable();
        while stripes.peek().is_some() {
            let mut group = Vec::new();
            let (mut pages, mut full) = (BTreeSet::new(), false);
            while let Some(stripe) = stripes.next_if(|_| group.is_empty() || (!full && pages.len() < cache_pages)) {
                for (first, last) in stripe.2.iter().filter_map(|r| pages_of(r.keys())) {
                    match last - first < cache_pages as u64 {
                        true => pages.extend(first..=last),
                        false => full = true,
                    }
                }
                group.push(stripe);
            }
            let ranges = page_runs(group.iter().flat_map(|s| s.2.iter().map(Record::keys)));
            self.catalog.install_missing(&ranges)?;
            // Pinned once for the group (a page evicted since is read
            // again), not once a stripe: ~1 M lookups for a full window.
            let pins = self.catalog.pin_pages(&ranges)?;
            recovery.phases.map_pages += lap(&mut clock);
            self.replay_group(group, &pins, &mut replayed_slots, &mut fresh);
            drop(pins);
            self.catalog.evict_pages(&mut self.catalog.index_mut());
            recovery.phases.mapping += lap(&mut clock);
        }
        // The checkpoint's copy of the map must not point into a slot that
        // now holds a newer stripe: every such block was overwritten by a
        // replayed write. If one is left, the checkpoint is not trusted.
        // (Checked over the pages in memory: those replay changed.)
        fresh.sort_unstable();
        let mut index = self.catalog.index_mut();
        let replayed = &replayed_slots;
        // Both lists sorted and walked together: a search of `fresh` for
        // each of the ~1 M places of a full window took 0.57 s.
        let mut kept: Vec<(Location, u64)> = index
            .map
            .locations_in_slots(|slot| replayed.contains(slot))
            .filter(|(_, at)| at.offset.is_some())
            .map(|(lba, at)| (at, lba))
            .collect();
        kept.sort_unstable();
        let mut fresh = fresh.iter().peekable();
        let stale = kept.into_iter().find_map(|(at, lba)| {
            while fresh.next_if(|&&f| f < at).is_some() {}
            (fresh.peek() != Some(&&at)).then_some((lba, at.slot))
        });
        if let Some((lba, slot)) = stale {
            return Err(ArrayError::CheckpointUnreadable {
                why: CheckpointFault::Stale { lba, slot },
            });
        }
        // What nothing points at is free; everything replayed is durable.
        free_unpointed(&mut index.slots, |_| false);
        recovery.phases.check = lap(&mut clock);
        Ok(Replayed {
            recovery,
            window,
            max_sequence,
            torn,
        })
    }

    /// Leaves the records of `stripes` (sequence, slot, records, in
    /// sequence order) to be mapped after opening (`index::Pending`),
    /// where `later` (that is on, there is a checkpoint), the slot table
    /// the checkpoint restored has read every replayed slot's page, and
    /// the records fit; returns the pages they wait for and how many of
    /// the replayed slots held pieces, or the stripes back. The slots
    /// are sealed as their stripes left them, and held so
    /// (`SlotTable::hold`); the other slots nothing points at are freed,
    /// as after eager replay. The replayed slots that hold pieces in that
    /// table (on a full array, the window's stripes garbage collection
    /// emptied and wrote again) are those the map may still point into
    /// where the replay leaves it so: each page is checked for that as
    /// it is mapped (`Pending::new`'s `check`).
    #[allow(clippy::type_complexity)]
    fn replay_later(
        &self,
        later: bool,
        stripes: Vec<(u64, u64, Vec<Record>)>,
    ) -> Result<(usize, usize), Vec<(u64, u64, Vec<Record>)>> {
        if !self.options.replay_later || !later || stripes.is_empty() {
            return Err(stripes);
        }
        let mut check = SlotSet::empty(self.stripes.geometry.slot_count());
        {
            let index = self.catalog.index();
            if stripes.iter().any(|&(_, slot, _)| index.slots.is_unread(slot)) {
                return Err(stripes);
            }
            for &(_, slot, _) in stripes.iter().filter(|s| index.slots.get(s.1).pieces > 0) {
                check.insert(slot);
            }
        }
        // Sorted with no lock held.
        let algorithm = self.stripes.geometry.checksum;
        let live = |record: &Record| crate::slots::record_live(algorithm, record);
        let reused = check.len();
        let pending = crate::index::Pending::new(stripes, check, live)?;
        let newest = pending.newest();
        let mut index = self.catalog.index_mut();
        index.next_version = index.next_version.max(newest.map_or(0, |v| v + 1));
        let replayed = pending.slots(self.stripes.geometry.slot_count());
        for (sequence, slot) in pending.sealed() {
            index.slots.set(slot, SlotState::Sealed, sequence);
        }
        // What nothing points at is free, but the replayed slots: their
        // pieces come as their pages are mapped.
        free_unpointed(&mut index.slots, |slot| replayed.contains(slot));
        index.slots.hold(replayed);
        let pages = pending.pages_left();
        index.pending = Some(Box::new(pending));
        Ok((pages, reused))
    }

    /// Maps the records of a replay group's stripes (sequence, slot,
    /// records, in sequence order; every page they land in in memory,
    /// held there by `_pinned`, the group's pins), each newer than what
    /// the map holds of its keys; their slots are then sealed, and noted
    /// in `replayed_slots`, their data records' places in `fresh`.
    ///
    /// Page by page (`page_order`), so that the map's page index and
    /// dirty set are walked in order, not at random: a full window of
    /// random writes lands each record in a page of its own, among
    /// ~500 k, and this took mapping from 1.4-1.6 s to 0.8-1.1 s (PERFORMANCE.md,
    /// "Opening after kill -9: the records mapped page by page"). A
    /// page's records keep their order: one copied by garbage collection
    /// keeps its version, and the copy is mapped over the original only
    /// by coming later. A long run of records that each fall in one page
    /// is mapped in parts of whole pages, side by side
    /// (`Map::insert_parts`), which changes nothing a page sees.
    fn replay_group(
        &self,
        group: Vec<(u64, u64, Vec<Record>)>,
        _pinned: &crate::catalog::PagePins<'_>,
        replayed_slots: &mut SlotSet,
        fresh: &mut Vec<Location>,
    ) {
        // Ordered (a sort of ~1 M places for a full window) before the
        // index's lock is taken.
        let order = page_order(&group);
        let mut index = self.catalog.index_mut();
        let newest = group.iter().flat_map(|s| s.2.iter()).map(Record::version).max();
        index.next_version = index.next_version.max(newest.map_or(0, |v| v + 1));
        let min = self.options.replay_part_records.max(1);
        let mut start = 0;
        for end in order.spanning.iter().copied().chain([order.places.len()]) {
            map_run(&mut index, &group, &order.places[start..end], min, fresh);
            if let Some(&(_, stripe, at)) = order.places.get(end) {
                let (_, slot, records) = &group[stripe as usize];
                map_record(&mut index, *slot, &records[at as usize], fresh);
            }
            start = end + 1;
        }
        // Sealed once their records are mapped: a slot that held an older
        // stripe loses its pieces, and turns draining at none, before or
        // after its new one gains, as the pages come; sealed first, it
        // would be left draining with pieces.
        for &(sequence, slot, _) in &group {
            index.slots.set(slot, SlotState::Sealed, sequence);
            replayed_slots.insert(slot);
        }
    }

    /// What `parse` makes of the data areas of `stripes` (slot, sequence),
    /// `total` bytes from their starts (`read_meta_bytes`).
    fn read_meta_stripes<T>(
        &self,
        stripes: &[(u64, u64)],
        total: usize,
        parse: impl Fn(&[u8]) -> Result<T, CheckpointFault>,
    ) -> Result<T, ArrayError> {
        let bytes = self.read_meta_bytes(stripes, 0, total, |b| parse(b).map(|_| ()))?;
        parse(&bytes).map_err(|why| ArrayError::CheckpointUnreadable { why })
    }

    /// The data areas of `stripes` (slot, sequence) as one run of bytes
    /// (`meta_stripe_bytes` of each), `total` of them from `skip` into
    /// the first: all full but the last (`skip` 0: a directory), or all
    /// but the first (a root, ending where the last one's room does),
    /// that `good` accepts: read
    /// straight from the data chunks, or, if `good` refuses those, from
    /// every stripe rebuilt and checked chunk by chunk.
    fn read_meta_bytes(
        &self,
        stripes: &[(u64, u64)],
        skip: usize,
        total: usize,
        good: impl Fn(&[u8]) -> Result<(), CheckpointFault>,
    ) -> Result<Vec<u8>, ArrayError> {
        let unreadable = |why: CheckpointFault| ArrayError::CheckpointUnreadable { why };
        let per_stripe = self.checkpoints.meta_stripe_bytes();
        let spanned = skip + total;
        if skip >= per_stripe
            || spanned > stripes.len() * per_stripe
            || spanned <= (stripes.len().max(1) - 1) * per_stripe
        {
            return Err(unreadable(CheckpointFault::Length {
                total,
                stripes: stripes.len(),
            }));
        }
        // Stripe i's part: its area from `from(i)`, into `bytes` at
        // `at(i)`, `length(i)` long.
        let from = |i: usize| if i == 0 { skip } else { 0 };
        let at = |i: usize| (i * per_stripe).saturating_sub(skip);
        let length = |i: usize| (spanned - i * per_stripe).min(per_stripe) - from(i);
        let mut bytes = vec![0u8; total];
        let direct = stripes.iter().enumerate().all(|(i, &(slot, _))| {
            self.stripes
                .read_area_into(slot, from(i), &mut bytes[at(i)..at(i) + length(i)])
        });
        if direct && good(&bytes).is_ok() {
            return Ok(bytes);
        }
        for (i, &(slot, sequence)) in stripes.iter().enumerate() {
            let rebuilt = self.stripes.rebuild_stripe(slot, sequence, true).map_err(|e| {
                unreadable(CheckpointFault::Stripe {
                    slot,
                    source: Box::new(e),
                })
            })?;
            bytes[at(i)..at(i) + length(i)].copy_from_slice(&rebuilt.area[from(i)..from(i) + length(i)]);
        }
        good(&bytes).map_err(unreadable)?;
        Ok(bytes)
    }

    /// Loads the checkpoint `reference` names into the (empty) map and
    /// slot table; returns its window. With `defer`, the slot pages that
    /// do not list the window's slots are left to be read later.
    fn load_checkpoint(
        &self,
        reference: &CheckpointRef,
        defer: bool,
        recovery: &mut Recovery,
    ) -> Result<BTreeSet<u64>, ArrayError> {
        let g = &self.stripes.geometry;
        let unreadable = |why: CheckpointFault| ArrayError::CheckpointUnreadable { why };
        let per_stripe = self.checkpoints.meta_stripe_bytes();
        let total = reference.bytes as usize;
        let body = reference.body_stripes(per_stripe);
        // The checkpoint's slots: listed, or in its directory, whose
        // stripes follow the checkpoint's in sequence.
        let listed: Vec<(u64, u64)> = if reference.directory {
            let first = reference.first_stripe_sequence + body as u64;
            let directory: Vec<(u64, u64)> = reference.slots.iter().copied().zip(first..).collect();
            let bytes = crate::format::checkpoint_directory_bytes(g.checksum, body);
            let slots = self.read_meta_stripes(&directory, bytes, |b| {
                crate::format::decode_checkpoint_directory(b, g, body).map_err(CheckpointFault::from)
            })?;
            slots
                .into_iter()
                .zip(reference.first_stripe_sequence..)
                .chain(directory)
                .collect()
        } else {
            reference
                .slots
                .iter()
                .copied()
                .zip(reference.first_stripe_sequence..)
                .collect()
        };
        let own = if reference.directory {
            &listed[..body]
        } else {
            &listed[..]
        };
        let skip = reference.root_offset(per_stripe);
        let bytes = self.read_meta_bytes(own, skip, total, |b| match g.checksum.digest(b) == reference.digest {
            true => Ok(()),
            false => Err(CheckpointFault::Digest),
        })?;
        let checkpoint = Checkpoint::decode(&bytes, g).map_err(|e| unreadable(e.into()))?;
        drop(bytes);
        if checkpoint.sequence != reference.sequence {
            return Err(unreadable(CheckpointFault::Sequence {
                found: checkpoint.sequence,
                expected: reference.sequence,
            }));
        }
        let meta: BTreeSet<u64> = listed.iter().map(|&(slot, _)| slot).collect();
        if meta.len() != listed.len() {
            return Err(unreadable(CheckpointFault::OwnSlotTwice));
        }
        let map_stripes = &checkpoint.images.stripes;
        // The root's first stripe may be the map stripe its page images
        // end in (the same stripe: its sequence; images only before the
        // root), and no other of its stripes a map stripe.
        let shared = listed.first().copied().filter(|&(slot, sequence)| {
            skip > 0
                && map_stripes
                    .get(&slot)
                    .is_some_and(|s| s.sequence == sequence && s.live <= skip as u64)
        });
        let own = |slot: &u64| meta.contains(slot) && shared.is_none_or(|(first, _)| first != *slot);
        // (A set: the window has up to two windows' worth of slots, and a
        // scan of its list for each slot listed took 50 ms at 15,000.)
        let in_window: std::collections::HashSet<u64> = checkpoint.window.iter().copied().collect();
        let clash = checkpoint
            .resealed
            .iter()
            .map(|(slot, _)| slot)
            .chain(&checkpoint.window)
            .find(|slot| meta.contains(slot) || (in_window.contains(slot) && map_stripes.contains_key(slot)))
            .or_else(|| map_stripes.keys().find(|slot| own(slot)));
        if let Some(slot) = clash {
            return Err(unreadable(CheckpointFault::ListedTwice { slot: *slot }));
        }
        // The checkpoint's own slots and its map stripes first: the slot
        // table's pages are read from those (and rebuilt, if need be).
        {
            let mut index = self.catalog.index_mut();
            let in_map_stripes = map_stripes.iter().map(|(&slot, stripe)| (slot, stripe.sequence));
            for (slot, sequence) in listed.iter().copied().chain(in_map_stripes) {
                index.slots.set(slot, SlotState::Checkpoint, sequence);
            }
        }
        // The slot table takes its pages as they are (the counts the
        // map's pages add up to), a batch at a time, then the stripes
        // sealed since; the map's pages stay on the members until
        // something looks at them. Only the pages listing the slots new
        // stripes may go to (the window's, which are all that replay
        // after a crash seals) and those sealed since are read now: the
        // others are read after opening (`slot_loader`), the root's
        // counts standing for them until then, and the deltas of the
        // stripes replayed kept aside for them as a client write's are.
        // Not where a page left for later failed to read before
        // (`Start::Suspect`): then all are read now, and one that fails
        // sends opening to the full scan.
        let per_page = crate::limits::SLOT_TABLE_PAGE_SLOTS;
        let now: BTreeSet<u64> = match defer {
            true => checkpoint
                .window
                .iter()
                .chain(checkpoint.resealed.iter().map(|(slot, _)| slot))
                .map(|slot| slot / per_page)
                .collect(),
            false => checkpoint.images.slot_pages.keys().copied().collect(),
        };
        let (read_now, later): (Vec<_>, Vec<_>) = checkpoint
            .images
            .slot_pages
            .iter()
            .map(|(&page, p)| (page, p.clone()))
            .partition(|(page, _)| now.contains(page));
        recovery.slot_pages = checkpoint.images.slot_pages.len() as u64;
        recovery.slot_pages_deferred = later.len() as u64;
        let mut live = 0u128;
        for batch in read_now.chunks(self.options.open_slot_pages_per_batch.max(1)) {
            let images: Vec<(u64, Arc<PageImage>)> = batch.iter().map(|(page, p)| (*page, p.image.clone())).collect();
            let read = self.catalog.read_slot_pages(&images).map_err(unreadable)?;
            let mut index = self.catalog.index_mut();
            for ((page, entries, changed), (_, p)) in read.iter().zip(batch) {
                let (page_live, kept) = index.slots.restore_page(*page, entries, changed).map_err(unreadable)?;
                if kept != p.kept {
                    return Err(unreadable(CheckpointFault::KeptTooMany { page: *page, kept }));
                }
                live += page_live;
            }
        }
        let stale_volume_pages: Vec<crate::map::Needed> = {
            let mut index = self.catalog.index_mut();
            let root_live = checkpoint.images.slot_live;
            match later.is_empty() {
                true if live != root_live => {
                    return Err(unreadable(CheckpointFault::LiveTotal {
                        listed: live,
                        root: root_live,
                    }));
                }
                true => {}
                false => index.slots.defer_pages(later).map_err(unreadable)?,
            }
            index.slots.restored(&checkpoint.volumes, root_live);
            for &(slot, sequence) in &checkpoint.resealed {
                index.slots.set(slot, SlotState::Sealed, sequence);
            }
            index.slots.check_counted().map_err(unreadable)?;
            let images = &checkpoint.images;
            index.map.open_from(&images.dirs, (images.pages, images.page_bytes));
            index.next_version = checkpoint.next_version.max(1);
            // Freed once a newer root is durable: not the stripe shared
            // with page images (a map stripe, freed once they are not
            // named).
            index.checkpoint_slots = listed.iter().map(|&(slot, _)| slot).filter(|slot| own(slot)).collect();
            index.map_stripes = map_stripes.len();
            // Pages of volumes deleted (or created again) since the pages
            // were taken hold records no volume admits: they are read now,
            // and those records dropped, so that their slots drain.
            // A directory page lies in one volume, as a page does.
            let floors = &index.volumes;
            let per_dir = crate::limits::MAP_DIRECTORY_PAGES;
            checkpoint
                .images
                .dirs
                .iter()
                .filter(|(&dir, _)| {
                    let key = dir * per_dir * crate::limits::MAP_PAGE_BLOCKS;
                    !floors.admits(key, checkpoint.next_version.saturating_sub(1))
                })
                .map(|(&dir, image)| crate::map::Needed::Dir {
                    dir,
                    image: image.clone(),
                    pages: vec![(dir * per_dir, (dir + 1) * per_dir - 1)],
                })
                .collect()
        };
        for batch in stale_volume_pages.chunks(1) {
            self.catalog.install_pages(batch.to_vec())?;
            self.catalog.evict_pages(&mut self.catalog.index_mut());
        }
        let window = checkpoint.window.iter().copied().collect();
        // The next checkpoint writes pages: this process knows nothing of
        // the roots since (their windows are in this one's).
        *self.checkpoints.durable() = crate::checkpoint::Durable {
            images: checkpoint.images,
            since: None,
        };
        Ok(window)
    }

    /// The summary of the stripe one of whose chunk `header`s was read.
    /// With `verify_all`, every chunk is read and checked against the
    /// root (a stripe a crash may have torn), and missing or bad ones are
    /// rewritten; otherwise only the tail of the data area is read,
    /// rebuilding the stripe if that fails. Returns the records and how
    /// many chunks were rewritten.
    fn read_summary(&self, header: &ChunkHeader, verify_all: bool) -> Result<(Vec<Record>, u64), ArrayError> {
        let g = &self.stripes.geometry;
        let slot = header.slot;
        let area = g.data_area_bytes();
        let len = header.summary_bytes as usize;
        if len > area || len < SUMMARY_HEADER_BYTES {
            return Err(ArrayError::Unreadable { slot });
        }
        if !verify_all {
            let mut tail = vec![0u8; len];
            if self.stripes.read_area_into(slot, area - len, &mut tail) {
                if let Some(records) = self.stripes.parse_summary(&tail, header) {
                    return Ok((records, 0));
                }
            }
        }
        let rebuilt = self.stripes.rebuild_stripe(slot, header.sequence, verify_all)?;
        let records = self
            .stripes
            .parse_summary(&rebuilt.area, header)
            .ok_or(ArrayError::Unreadable { slot })?;
        let repaired = match verify_all {
            true => self.stripes.repair(slot, &rebuilt).1,
            false => 0,
        };
        Ok((records, repaired))
    }
}

/// The pages that keys `ranges` fall in, as runs of whole pages, in order
/// and merged: what a replay group looks up once a run (`install_missing`)
/// rather than once a record. A window full of random writes is ~1 M
/// records, and looking up each one's pages took about a quarter of the
/// time spent bringing them in (PERFORMANCE.md, "Opening after kill -9:
/// a group's pages looked up a run at a time").
fn page_runs(ranges: impl Iterator<Item = (u64, u64)>) -> Vec<(u64, u64)> {
    let mut pages: Vec<(u64, u64)> = ranges
        .filter_map(pages_of)
        .map(|(first, last)| (first * MAP_PAGE_BLOCKS, (last + 1).saturating_mul(MAP_PAGE_BLOCKS)))
        .collect();
    pages.sort_unstable();
    let mut runs: Vec<(u64, u64)> = Vec::with_capacity(pages.len());
    for (start, end) in pages {
        match runs.last_mut() {
            Some(run) if start <= run.1 => run.1 = run.1.max(end),
            _ => runs.push((start, end)),
        }
    }
    runs
}

/// The first and last map pages that keys [lba, end) fall in; none for
/// no keys.
fn pages_of((lba, end): (u64, u64)) -> Option<(u64, u64)> {
    (end > lba).then(|| (lba / MAP_PAGE_BLOCKS, (end - 1) / MAP_PAGE_BLOCKS))
}

/// The order `replay_group` maps a replay group's records in (its
/// stripes' sequence, slot and records, in sequence order): runs of
/// records that each fall in one page, sorted by page (stably: a page's
/// records keep their order), and a record spanning pages where it
/// stands, between the runs before and after it. So every page sees the
/// records that fall in it in their stripes' order.
///
/// What is sorted is each record's page and place (16 bytes), not the
/// record (~180 bytes with its digest and block CRCs): sorting and
/// moving a full window's ~1 M records took ~14% of an opening's samples
/// (PERFORMANCE.md, "Opening after kill -9 on a Zen 3: replay's order
/// sorted by place").
struct PageOrder {
    /// Each record's page (0 for one spanning pages), stripe and place
    /// in its stripe, in the order they are mapped.
    places: Vec<(u64, u32, u32)>,
    /// Where in `places` the records spanning pages stand, in order.
    spanning: Vec<usize>,
}

fn page_order(group: &[(u64, u64, Vec<Record>)]) -> PageOrder {
    let place = |n: usize| u32::try_from(n).expect("a replay group's stripes and a stripe's records fit in u32");
    let mut places: Vec<(u64, u32, u32)> = Vec::with_capacity(group.iter().map(|s| s.2.len()).sum());
    let mut spanning = Vec::new();
    let mut run = 0;
    for (stripe, (_, _, records)) in group.iter().enumerate() {
        for (at, record) in records.iter().enumerate() {
            match pages_of(record.keys()) {
                Some((first, last)) if first == last => places.push((first, place(stripe), place(at))),
                _ => {
                    // (page, stripe, record) is unique, so an unstable
                    // sort keeps a page's records in their order.
                    places[run..].sort_unstable();
                    spanning.push(places.len());
                    places.push((0, place(stripe), place(at)));
                    run = places.len();
                }
            }
        }
    }
    places[run..].sort_unstable();
    PageOrder { places, spanning }
}

/// Maps the records at `run` (page, stripe, place: each in one page, in
/// page order) of a replay group's stripes, as `map_record` does one by
/// one, in parts of whole pages side by side where the run is long
/// (`min` records a part at least), one a core (any number up to
/// `limits::REPLAY_PARTS_MAX` where `min` is below the default, for
/// tests).
fn map_run(
    index: &mut Index,
    group: &[(u64, u64, Vec<Record>)],
    run: &[(u64, u32, u32)],
    min: usize,
    fresh: &mut Vec<Location>,
) {
    use crate::limits::{REPLAY_PARTS_MAX, REPLAY_PART_RECORDS_MIN};
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let most = match min < REPLAY_PART_RECORDS_MIN {
        true => REPLAY_PARTS_MAX,
        false => cores.min(REPLAY_PARTS_MAX),
    };
    let parts = (run.len() / min).clamp(1, most);
    if parts == 1 {
        for &(_, stripe, at) in run {
            let (_, slot, records) = &group[stripe as usize];
            map_record(index, *slot, &records[at as usize], fresh);
        }
        return;
    }
    let cuts = crate::map::page_cuts(run.len(), parts, |i| run[i].0);
    let Index {
        map, slots, volumes, ..
    } = index;
    let volumes = &*volumes;
    let mut placed: Vec<Vec<Location>> = (0..parts).map(|_| Vec::new()).collect();
    let inserts: Vec<_> = cuts
        .windows(2)
        .zip(placed.iter_mut())
        .map(|(cut, placed)| {
            let part = &run[cut[0]..cut[1]];
            let first = part.first().map_or(u64::MAX, |p| p.0);
            let records = part.iter().filter_map(move |&(_, stripe, at)| {
                let (_, slot, records) = &group[stripe as usize];
                let (lba, blocks, version, target, at) = target_of(*slot, &records[at as usize]);
                (volumes.admits(lba, version)).then(|| {
                    placed.extend(at);
                    (lba, blocks, version, target)
                })
            });
            (first, records)
        })
        .collect();
    for deltas in map.insert_parts(inserts, Rule::IfNotNewer) {
        slots.account(&deltas);
    }
    for mut placed in placed {
        fresh.append(&mut placed);
    }
}

/// Frees every slot nothing points at (no piece; not a checkpoint's),
/// but those `keep` names, once replay has made everything durable (no
/// slot waits to drain).
fn free_unpointed(slots: &mut SlotTable, keep: impl Fn(u64) -> bool) {
    slots.forget_draining();
    let empty: Vec<u64> = slots
        .iter()
        .filter(|&(slot, s)| {
            s.state != SlotState::Checkpoint && s.state != SlotState::Free && s.pieces == 0 && !keep(slot)
        })
        .map(|(slot, _)| slot)
        .collect();
    for slot in empty {
        slots.set(slot, SlotState::Free, 0);
    }
}

/// Maps `record`, of the stripe replayed in `slot`, where it is newer
/// than what the map holds of its keys (and its volume admits it), and
/// counts what the slots gain and lose; a data record's place goes in
/// `fresh`. (The versions to come were moved past its group's by
/// `replay_group`.)
fn map_record(index: &mut Index, slot: u64, record: &Record, fresh: &mut Vec<Location>) {
    let (lba, blocks, version, target, at) = target_of(slot, record);
    // A record of a volume deleted since is not mapped.
    if !index.volumes.admits(lba, version) {
        return;
    }
    fresh.extend(at);
    let deltas = index.map.insert(lba, blocks, version, &target, Rule::IfNotNewer);
    index.slots.account(&deltas);
}

#[cfg(test)]
mod tests {
    use super::{page_order, page_runs};
    use crate::format::Record;
    use crate::limits::MAP_PAGE_BLOCKS as P;

    /// Every page sees the records that fall in it in their stripes'
    /// order, whatever the order they are mapped in; records that each
    /// fall in one page, between those that span pages, come in page
    /// order; none is lost or added.
    #[test]
    fn page_order_keeps_each_pages_records_in_order() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(8);
        for spanning in [0.0, 0.05, 0.3] {
            // Versions number the records in their stripes' order.
            let mut version = 0;
            let group: Vec<(u64, u64, Vec<Record>)> = (0..40)
                .map(|stripe| {
                    let records = (0..rng.gen_range(0..30))
                        .map(|_| {
                            version += 1;
                            let lba = rng.gen_range(0..8 * P);
                            let blocks = match rng.gen_bool(spanning) {
                                true => rng.gen_range(1..3 * P as u32),
                                false => rng.gen_range(1..=(P - lba % P) as u32),
                            };
                            Record::Zero { lba, blocks, version }
                        })
                        .collect();
                    (stripe + 100, stripe, records)
                })
                .collect();
            let pages_touched = |r: &Record| {
                let (lba, end) = r.keys();
                lba / P..=(end - 1) / P
            };
            let by_page = |records: &mut dyn Iterator<Item = &Record>| {
                let mut seen: std::collections::BTreeMap<u64, Vec<u64>> = Default::default();
                for r in records {
                    for page in pages_touched(r) {
                        seen.entry(page).or_default().push(r.version());
                    }
                }
                seen
            };
            let order = page_order(&group);
            assert!(order.spanning.iter().all(|&at| {
                let (_, stripe, at) = order.places[at];
                pages_touched(&group[stripe as usize].2[at as usize]).count() > 1
            }));
            let spans = group
                .iter()
                .flat_map(|s| s.2.iter())
                .filter(|r| pages_touched(r).count() > 1);
            assert_eq!(
                order.spanning.len(),
                spans.count(),
                "every record spanning pages listed"
            );
            let ordered: Vec<(u64, Record)> = order
                .places
                .iter()
                .map(|&(_, stripe, at)| (group[stripe as usize].1, group[stripe as usize].2[at as usize].clone()))
                .collect();
            assert!(ordered
                .iter()
                .all(|(slot, r)| group[*slot as usize].2.iter().any(|g| g.version() == r.version())));
            let mut versions: Vec<u64> = ordered.iter().map(|(_, r)| r.version()).collect();
            versions.sort_unstable();
            assert_eq!(versions, (1..=version).collect::<Vec<_>>(), "every record once");
            assert_eq!(
                by_page(&mut ordered.iter().map(|(_, r)| r)),
                by_page(&mut group.iter().flat_map(|s| s.2.iter())),
                "a page's records out of order"
            );
            // Between records spanning pages, page order.
            for run in ordered.split(|(_, r)| pages_touched(r).count() > 1) {
                assert!(run.windows(2).all(|w| w[0].1.lba() / P <= w[1].1.lba() / P));
            }
            if spanning == 0.0 {
                assert!(ordered.windows(2).all(|w| w[0].1.lba() / P <= w[1].1.lba() / P));
            }
        }
    }

    /// Every page a record's keys touch is in a run, whole, and no other:
    /// records in one page make one run, neighbouring pages merge, a
    /// record across a page boundary takes both, an empty one none.
    #[test]
    fn page_runs_cover_exactly_the_pages_of_the_keys() {
        let ranges = [
            (5 * P + 3, 5 * P + 4),
            (5 * P + 100, 5 * P + 101),
            (9 * P + 7, 9 * P + 7),
            (2 * P - 1, 2 * P + 1),
            (6 * P, 6 * P + 1),
            (40 * P + 511, 40 * P + 512),
        ];
        assert_eq!(
            page_runs(ranges.into_iter()),
            [(P, 3 * P), (5 * P, 7 * P), (40 * P, 41 * P)]
        );
        assert!(page_runs(std::iter::empty()).is_empty());
    }
}
