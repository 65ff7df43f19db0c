//! Checkpoints: the map written to stripes of the Meta stream and named by
//! the superblocks, so that opening reads it and rolls forward over the
//! slots of its window instead of reading every stripe's summary.
//!
//! # How a checkpoint is taken while clients write
//!
//! 1. Note the last sequence sealed, S. Choose the window: the slots new
//!    stripes may take until the next checkpoint. It holds every slot a
//!    stripe newer than S may be in (the open stripes' slots, any sealed
//!    since S, and the usable free slots, to which allocation is narrowed
//!    until the checkpoint is durable; a window's worth of them at most),
//!    then the durable checkpoint's own slots (free, and usable at once,
//!    when this one is durable), then a window's worth of other free
//!    slots (or, on a full array, the stripes garbage collection will
//!    empty first).
//!    No slot is freed until the checkpoint is done: the copy may point
//!    into slots that drain meanwhile, and step 4 takes free slots.
//! 2. Copy the map in pieces, each under one short hold of the index's
//!    read lock. Writes go on between pieces, so the copy is "fuzzy": a
//!    block may be copied before or after a write to it. Every write the
//!    copy may have missed or caught half-way is in a stripe newer than S,
//!    in the window, and recovery keeps the newest version of each block,
//!    so replaying those stripes over the copy gives the right map.
//! 3. Seal and sync the open stripes: everything the copy points at is
//!    durable.
//! 4. Write the copy to free slots (outside the window where it can) as Meta stripes
//!    (consecutive sequences), sync, then point the superblocks at them.
//!    Only then is the old checkpoint's space free and the new window the
//!    one allocation uses.
//!
//! A checkpoint of more stripes than the superblock lists (480) is
//! followed by its directory, which lists them; the superblock lists the
//! directory's stripes. Without room for the checkpoint (no free slots,
//! or a directory past 480 stripes), the superblocks say "no checkpoint":
//! recovery then scans every slot, and any free slot may be used.

use crate::engine::{Index, Resident, Shared};
use crate::format::{
    self, CheckpointBody, CheckpointMapping, CheckpointRef, CheckpointTarget, Stream, CHECKPOINT_SLOTS_MAX,
};
use crate::limits::{
    CHECKPOINT_MAPPINGS_PER_LOCK, CHECKPOINT_WINDOW_DIVISOR, CHECKPOINT_WINDOW_MAX, CHECKPOINT_WINDOW_MIN,
};
use crate::map::Target;
use crate::slots::SlotState;
use crate::status::Counters;
use crate::stripe::OpenStripe;
use crate::ArrayError;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A checkpoint being taken: the map's copy, encoded, and the tables
/// that go before it (filled in as the steps go).
struct MapCopy {
    sequence: u64,
    next_version: u64,
    stripes: Vec<(u64, u64)>,
    window: Vec<u64>,
    body: CheckpointBody,
}

impl MapCopy {
    fn encode(&self, algorithm: tessera_checksum::Algorithm) -> Vec<u8> {
        self.body
            .encode(algorithm, self.sequence, self.next_version, &self.stripes, &self.window)
    }
}

impl Shared {
    /// Slots a checkpoint adds to its window: a quarter of the array, within bounds.
    pub(crate) fn window_slots(&self) -> u64 {
        (self.geometry.slot_count() / CHECKPOINT_WINDOW_DIVISOR).clamp(CHECKPOINT_WINDOW_MIN, CHECKPOINT_WINDOW_MAX)
    }

    /// Slots the next checkpoint may need, and one more for it to be
    /// written beside the durable one: sized from the map as it is now, at
    /// the worst a mapping can cost (its own extent, with a CRC for each of
    /// the most blocks an extent holds), the slots in use and a window as
    /// large as the array. The reserve the last checkpoint's size gave was
    /// too small once the map fragmented after it (a compact map, then
    /// random overwrites: a checkpoint of 7 slots against a reserve of 2),
    /// and writes filled what the next checkpoint needed (`tests/space.rs`).
    /// At most what a checkpoint may take: past that none is written.
    pub(crate) fn checkpoint_reserve(&self, index: &Index) -> usize {
        let g = &self.geometry;
        let ranges = index.map.len();
        let used = index.slots.count() as usize - index.slots.free_count();
        let bytes = format::checkpoint_bytes(
            g.checksum,
            used,
            index.slots.count() as usize,
            ranges,
            ranges * crate::limits::EXTENT_BLOCKS_MAX,
            ranges,
        );
        checkpoint_stripes(g.checksum, self.meta_stripe_bytes(), bytes).map_or(0, |(body, directory)| body + directory)
            + 1
    }

    /// Bytes of checkpoint (or directory) one Meta stripe holds.
    pub(crate) fn meta_stripe_bytes(&self) -> usize {
        self.geometry.data_area_bytes() - format::summary_bytes(self.geometry.checksum, &[])
    }

    /// Writes a checkpoint of the map now.
    pub fn checkpoint(&self) -> Result<(), ArrayError> {
        self.members.check_writable()?;
        let _one = self.checkpoint_lock.lock().unwrap_or_else(|p| p.into_inner());
        let start = self.tracker.last_sequence();
        let mut window = self.choose_window(start);
        let (mut checkpoint, referenced) = self.copy_map(start, &window);
        // 3. Everything the copy points at is made durable.
        let sealed: Vec<_> = (0..self.open.len()).filter_map(|lane| self.seal_lane(lane)).collect();
        if let Err(error) = self
            .submit(sealed)
            .and_then(|()| self.sync_through(self.tracker.last_sequence()))
        {
            self.end_restriction();
            return Err(error);
        }
        {
            let index = self.index();
            checkpoint.stripes = referenced
                .into_iter()
                .map(|(slot, sequence)| {
                    let s = index.slots.get(slot);
                    (
                        slot,
                        if s.state == SlotState::Sealed {
                            s.sequence
                        } else {
                            sequence
                        },
                    )
                })
                .collect();
        }
        match self.write_checkpoint(&mut checkpoint, &mut window) {
            Ok(Some(meta)) => {
                let synced = self.tracker.lock().synced_through;
                let mut index = self.index_mut();
                index.slots.set_window(Some(window));
                index.slots.release_drained(synced);
                let old = std::mem::replace(&mut index.checkpoint_slots, meta);
                for slot in old {
                    index.slots.free(slot);
                }
                drop(index);
                Counters::add(&self.counters.checkpoints_written, 1);
                Ok(())
            }
            Ok(None) => self.drop_checkpoint(),
            Err(error) => {
                self.end_restriction();
                Err(error)
            }
        }
    }

    /// Ends a failed checkpoint's narrowing of allocation, and frees what
    /// drained meanwhile.
    fn end_restriction(&self) {
        let synced = self.tracker.lock().synced_through;
        let mut index = self.index_mut();
        index.slots.lift_restriction();
        index.slots.release_drained(synced);
    }

    /// Step 1: the next window; allocation is narrowed to it meanwhile.
    fn choose_window(&self, start: u64) -> BTreeSet<u64> {
        let size = self.window_slots() as usize;
        let mut index = self.index_mut();
        // Slots that may hold stripes newer than `start` before the new
        // checkpoint is durable: all of them go in, whatever the size.
        let mut window: BTreeSet<u64> = index
            .resident
            .iter()
            .filter(|(_, r)| matches!(r, Resident::Open(_)))
            .map(|(&slot, _)| slot)
            .collect();
        window.extend(
            index
                .slots
                .iter()
                .filter(|(_, s)| s.state == SlotState::Sealed && s.sequence > start)
                .map(|(slot, _)| slot),
        );
        // Up to a window's worth of the usable slots stay (allocation goes
        // on from them, and from nothing else, until this is durable); a
        // window's worth of other free slots join.
        let usable = self.healthy_first(|| index.slots.usable_slots(), size);
        window.extend(usable);
        // The current checkpoint's slots are free once this one is
        // durable, and only then: in the window, they serve at once (on a
        // full array, each checkpoint took free slots for its stripes and
        // gave back the old ones outside the window, unusable, until
        // garbage collection found no slot for its copies).
        window.extend(index.checkpoint_slots.iter().copied());
        let floor = window.len();
        let other_free = self.healthy_first(|| index.slots.free_slots().filter(|s| !window.contains(s)), size);
        window.extend(other_free);
        // On a full array, also the stripes garbage collection empties
        // first: emptied, they serve without waiting for a checkpoint.
        if window.len() < floor + size {
            let area = self.stripe_live_max;
            let next = start + 1;
            let victims = index
                .slots
                .victims(area, next, floor + size - window.len(), true, |slot| {
                    window.contains(&slot)
                });
            window.extend(victims);
        }
        index.slots.restrict_usable(&window);
        window
    }

    /// Up to `count` of the slots `slots` yields, those on healthy members
    /// first, each kind in the order given. Taken as they come, not
    /// collected and sorted: an array may have hundreds of millions of
    /// free slots, and a checkpoint wants a window's worth.
    fn healthy_first<I: Iterator<Item = u64>>(&self, slots: impl Fn() -> I, count: usize) -> Vec<u64> {
        let mut picked: Vec<u64> = slots().filter(|&s| self.all_healthy(s)).take(count).collect();
        if picked.len() < count {
            let wanted = count - picked.len();
            picked.extend(slots().filter(|&s| !self.all_healthy(s)).take(wanted));
        }
        picked
    }

    /// Step 2: the map, copied in pieces and encoded as it goes, and the
    /// slots it points into with their sequences as seen then.
    fn copy_map(&self, start: u64, window: &BTreeSet<u64>) -> (MapCopy, BTreeMap<u64, u64>) {
        let mut copy = MapCopy {
            sequence: start,
            next_version: 0,
            stripes: Vec::new(),
            window: window.iter().copied().collect(),
            body: CheckpointBody::default(),
        };
        // Extents are numbered by identity: their place in their slot (a
        // slot is rewritten only once nothing maps into it).
        let mut numbers: HashMap<(u64, u32), usize> = HashMap::new();
        let mut referenced = BTreeMap::new();
        let mut cursor = 0u64;
        loop {
            let index = self.index();
            copy.next_version = index.next_version;
            let mut copied = 0;
            // The cursor is where the last mapping copied ends: none
            // starts before it and reaches past it.
            for (lba, mapping) in index
                .map
                .overlapping(cursor, u64::MAX)
                .take(CHECKPOINT_MAPPINGS_PER_LOCK)
            {
                let slot = mapping.target.slot();
                referenced.entry(slot).or_insert_with(|| index.slots.get(slot).sequence);
                let target = match &mapping.target {
                    Target::Zero { slot } => CheckpointTarget::Zero { slot: *slot },
                    Target::Data { extent, skip } => CheckpointTarget::Data {
                        extent: *numbers
                            .entry((extent.slot, extent.offset))
                            .or_insert_with(|| copy.body.push_extent(extent)),
                        skip: *skip,
                    },
                };
                copy.body.push_mapping(&CheckpointMapping {
                    lba,
                    blocks: mapping.blocks,
                    version: mapping.version,
                    target,
                });
                cursor = lba + u64::from(mapping.blocks);
                copied += 1;
            }
            if copied < CHECKPOINT_MAPPINGS_PER_LOCK {
                return (copy, referenced);
            }
        }
    }

    /// Step 4: the encoded checkpoint into Meta stripes in free slots
    /// (outside `window` where there are enough; those taken from it leave
    /// it), followed by its directory's where it has more stripes than the
    /// superblock lists, synced, then named by the superblocks. Returns
    /// its slots (the directory's too), or `None` if it does not fit.
    fn write_checkpoint(
        &self,
        checkpoint: &mut MapCopy,
        window: &mut BTreeSet<u64>,
    ) -> Result<Option<Vec<u64>>, ArrayError> {
        let g = &self.geometry;
        let algorithm = g.checksum;
        let start = checkpoint.sequence;
        let per_stripe = self.meta_stripe_bytes();
        let mut bytes = checkpoint.encode(algorithm);
        let Some((body, directory)) = checkpoint_stripes(algorithm, per_stripe, bytes.len()) else {
            return Ok(None);
        };
        let count = body + directory;
        let mut meta: Vec<u64> = {
            let mut index = self.index_mut();
            // A free slot has held nothing since the checkpoint began (no
            // slot drains free while allocation is restricted), so one in
            // the window may be taken (it then leaves the window).
            // Outside the window first, on healthy members first.
            let mut free: Vec<u64> = Vec::with_capacity(count);
            let window: &BTreeSet<u64> = window;
            for in_window in [false, true] {
                let wanted = count - free.len();
                let more = self.healthy_first(
                    || {
                        index
                            .slots
                            .free_slots()
                            .filter(move |&s| !self.pins.pinned(s) && window.contains(&s) == in_window)
                    },
                    wanted,
                );
                free.extend(more);
            }
            if free.len() < count {
                return Ok(None);
            }
            for &slot in &free {
                index.slots.take(slot, SlotState::Open, &self.pins);
            }
            free
        };
        // Slots taken from the window leave it, and the copy says so (it
        // only shrinks, so it needs no more stripes).
        // (Every one is removed: `any` would stop at the first.)
        let taken_from_window = meta.iter().filter(|slot| window.remove(slot)).count();
        let (mut body, mut directory) = (body, directory);
        if taken_from_window > 0 {
            checkpoint.window = window.iter().copied().collect();
            bytes = checkpoint.encode(algorithm);
            (body, directory) = checkpoint_stripes(algorithm, per_stripe, bytes.len())
                .expect("a checkpoint whose window shrank needs no more stripes");
            let spare = meta.split_off(body + directory);
            let mut index = self.index_mut();
            for slot in spare {
                index.slots.release_open(slot);
            }
        }
        // The checkpoint's stripes, then its directory's (listing theirs).
        let listing = (directory > 0).then(|| format::encode_checkpoint_directory(algorithm, &meta[..body]));
        let pieces: Vec<&[u8]> = bytes
            .chunks(per_stripe)
            .chain(listing.iter().flat_map(|d| d.chunks(per_stripe)))
            .collect();
        assert_eq!(pieces.len(), meta.len());
        let bytes = &bytes[..];
        let first = self.tracker.assign_many(meta.len());
        let sealed: Vec<_> = meta
            .iter()
            .zip(pieces)
            .enumerate()
            .map(|(i, (&slot, piece))| {
                let mut open = OpenStripe::new(slot, Stream::Meta, self.spares().areas.pop(), g);
                open.push_data(piece, false);
                self.seal_as(open, SlotState::Checkpoint, first + i as u64)
            })
            .collect();
        let written = self
            .submit(sealed)
            .and_then(|()| self.sync_through(first + meta.len() as u64 - 1));
        if written.is_ok() {
            Counters::add(
                &self.counters.checkpoint_bytes_written,
                (meta.len() * crate::engine::stripe_bytes(g)) as u64,
            );
        }
        let reference = CheckpointRef {
            sequence: start,
            bytes: bytes.len() as u64,
            first_stripe_sequence: first,
            digest: algorithm.digest(bytes),
            slots: if directory > 0 {
                meta[body..].to_vec()
            } else {
                meta.clone()
            },
            directory: directory > 0,
        };
        let published = written.and_then(|()| {
            let mut superblock = self.members.superblock();
            let mut template = superblock.clone();
            template.checkpoint = Some(reference);
            self.members.publish_locked(&mut superblock, template)
        });
        if let Err(error) = published {
            // The old checkpoint stays the durable one; these slots are
            // free again once their writes are done.
            self.wait_written(first + meta.len() as u64 - 1);
            let mut index = self.index_mut();
            for &slot in &meta {
                index.slots.free(slot);
            }
            return Err(error);
        }
        Ok(Some(meta))
    }

    /// Makes the superblocks say there is no checkpoint, so that any free
    /// slot may be written: recovery will scan them all.
    fn drop_checkpoint(&self) -> Result<(), ArrayError> {
        let mut superblock = self.members.superblock();
        if superblock.checkpoint.is_some() {
            let mut template = superblock.clone();
            template.checkpoint = None;
            self.members.publish_locked(&mut superblock, template)?;
            Counters::add(&self.counters.checkpoints_dropped, 1);
        }
        drop(superblock);
        let synced = self.tracker.lock().synced_through;
        let mut index = self.index_mut();
        index.slots.set_window(None);
        index.slots.release_drained(synced);
        for slot in std::mem::take(&mut index.checkpoint_slots) {
            index.slots.free(slot);
        }
        Ok(())
    }
}

/// Stripes a checkpoint of `bytes` takes, `per_stripe` bytes each: its
/// own, and its directory's (0 when the superblock can list its own);
/// `None` past what a directory the superblock lists can hold.
fn checkpoint_stripes(
    algorithm: tessera_checksum::Algorithm,
    per_stripe: usize,
    bytes: usize,
) -> Option<(usize, usize)> {
    let body = bytes.div_ceil(per_stripe);
    if body <= CHECKPOINT_SLOTS_MAX {
        return Some((body, 0));
    }
    let directory = format::checkpoint_directory_bytes(algorithm, body).div_ceil(per_stripe);
    (directory <= CHECKPOINT_SLOTS_MAX).then_some((body, directory))
}
