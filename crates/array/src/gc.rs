//! Garbage collection: the live data of stripes that are mostly garbage is
//! copied into the GC stream, and the emptied slots become free once the
//! copies are synced.
//!
//! # Guarantees
//!
//! - Victims are chosen over the whole array by cost-benefit (the slot
//!   table's `victims`), by live stored bytes, so compressed stripes are
//!   weighed by what they really hold.
//! - A round needs one free slot (the GC stream's stripe, kept from user
//!   data by the reserve) and frees every victim it empties: it seals the
//!   GC stream's stripe and syncs before it ends. So collection progresses
//!   whenever some stripe holds garbage, which the admission of writes
//!   ensures while the array is not truly full.
//! - A copy is mapped only where the map still points at what was copied
//!   (a client write that raced with the copy wins), and keeps the copied
//!   write's version, so recovery never prefers it to a newer write.
//! - A victim's summary says what it held; nothing scans the map.

use crate::counters::Counters;
use crate::engine::Shared;
use crate::error::ArrayError;
use crate::format::{Record, Stream, BLOCK_BYTES};
use crate::lanes::{Origin, Piece, Stored};
use crate::limits::{
    GC_FREE_TARGET_DIVISOR, GC_FREE_TARGET_MAX, GC_FREE_TARGET_MIN, GC_RESERVE_SLOTS, GC_ROUND_GARBAGE,
    GC_VICTIMS_PER_ROUND_MAX, GC_VICTIMS_PER_ROUND_MIN,
};
use crate::map::Target;
use crate::slots::{Pinned, SlotState};
use crate::write::Claim;

/// Garbage collection's own state, which `Shared` holds.
#[derive(Default)]
pub(crate) struct Rounds {
    /// One round at a time; held across its I/O (a heal's batch takes it
    /// too: it relocates as a round does).
    lock: std::sync::Mutex<()>,
}

impl Rounds {
    /// The round lock (`gc_lock` in `docs/ENGINE.md`).
    pub fn one_at_a_time(&self) -> std::sync::MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A live piece of a victim: blocks, the version they hold, where.
struct Live {
    lba: u64,
    blocks: u32,
    version: u64,
    target: Target,
}

impl Shared {
    /// Free slots background collection keeps: a sixteenth of the array,
    /// within bounds, above what user writes must leave free anyway.
    pub(crate) fn gc_free_target(&self) -> usize {
        let slots = self.stripes.geometry.slot_count();
        let target = (slots / GC_FREE_TARGET_DIVISOR).clamp(GC_FREE_TARGET_MIN, GC_FREE_TARGET_MAX) as usize;
        target + GC_RESERVE_SLOTS + self.checkpoints.checkpoint_reserve(&self.catalog.index())
    }

    /// Whether fewer slots are free than collection keeps.
    pub(crate) fn needs_gc(&self) -> bool {
        let target = self.gc_free_target();
        self.catalog.index().slots.free_count() < target
    }

    /// One round of collection: relocates the live data of the best
    /// victims, then seals and syncs the copies so the victims are free.
    /// Returns how many slots it emptied, or `None` if a round that ran
    /// while this one waited to start already made the room. `urgent`: a
    /// writer found no free slot and waits for this round.
    ///
    /// A replay opening left for later is not mapped first: each victim's
    /// pages are as its records are relocated (`relocate` pins them, which
    /// maps their waiting records), and the replay's held slots are not
    /// victims. On a killed full 8+2 array of 24 GiB, mapping every
    /// waiting page first took 1.6 s of the round a writer waited for.
    /// Slots not held only lose pieces to the records still waiting, so
    /// their garbage may be undercounted, never overcounted. Where that
    /// leaves a writer's round nothing to empty, the writer's last resort
    /// is a checkpoint (`make_room`), which maps the whole replay first; a
    /// background round leaves the replay to its own thread, which rests
    /// while clients make requests.
    pub(crate) fn collect_garbage(&self, urgent: bool) -> Result<Option<usize>, ArrayError> {
        // It chooses among every sealed slot.
        self.deferred.read_every_slot_page()?;
        let _round = self.gc.one_at_a_time();
        // A round that ran while this one waited may have done the work.
        let done = if urgent {
            self.has_room(&self.catalog.index(), crate::write::Claim::Write)
        } else {
            !self.needs_gc()
        };
        if done {
            return Ok(None);
        }
        let next = self.lanes.tracker.last_sequence() + 1;
        let candidates: Vec<(u64, f64)> = {
            let index = self.catalog.index();
            let fill = crate::format::stripe_live_max(&self.stripes.geometry);
            index
                .slots
                .victims(fill, next, GC_VICTIMS_PER_ROUND_MAX, urgent, |slot| {
                    self.catalog.pins.pinned(slot) || index.resident.contains_key(&slot) || index.slots.is_held(slot)
                })
                .into_iter()
                .map(|slot| (slot, index.slots.utilization(slot, fill)))
                .collect()
        };
        if candidates.is_empty() {
            return Ok(Some(0));
        }
        Counters::add(&self.stripes.counters.gc_rounds, 1);
        // Victims are taken until their garbage adds up to a stripe and a
        // half: the copies then fill about one stripe fewer than the
        // victims emptied, so the round frees at least one slot net.
        let mut victims = Vec::new();
        let mut garbage = 0.0;
        for (victim, utilization) in candidates {
            self.relocate(victim)?;
            victims.push(victim);
            garbage += 1.0 - utilization;
            if garbage >= GC_ROUND_GARBAGE && victims.len() >= GC_VICTIMS_PER_ROUND_MIN {
                break;
            }
        }
        // The copies are made durable; then the victims drain.
        self.lanes
            .submit(self.lanes.seal_lane(self.lanes.gc_lane()).into_iter().collect())?;
        let emptied = {
            let index = self.catalog.index();
            victims
                .iter()
                .filter(|&&v| index.slots.state(v) == SlotState::Draining)
                .count()
        };
        self.lanes.sync_through(self.lanes.tracker.last_sequence())?;
        Counters::add(&self.stripes.counters.gc_stripes_collected, emptied as u64);
        Ok(Some(emptied))
    }

    /// Copies what is still live in `victim` into the GC stream.
    pub(crate) fn relocate(&self, victim: u64) -> Result<(), ArrayError> {
        let mut pinned = Pinned::new(&self.catalog.pins);
        let sequence = {
            let index = self.catalog.index();
            let s = index.slots.get(victim);
            if s.state != SlotState::Sealed || index.resident.contains_key(&victim) {
                return Ok(());
            }
            pinned.add(victim);
            s.sequence
        };
        let (mut area, records) = self.stripes.stripe_contents(victim, sequence)?;
        // The pages its records are in stay in memory until the copies
        // are mapped.
        let ranges: Vec<(u64, u64)> = records.iter().map(Record::keys).collect();
        let _pages = self.catalog.pin_pages(&ranges)?;
        let live = self.live_pieces(victim, &records);
        for piece in live {
            let stored = match &piece.target {
                Target::Zero { .. } => Stored::Zero,
                Target::Data { extent, skip } => {
                    let mut bytes = vec![0u8; piece.blocks as usize * BLOCK_BYTES];
                    if !self.stripes.extent_from_area(extent, *skip, &area, &mut bytes) {
                        // A bad chunk: the stripe rebuilt, checked again.
                        area = self.stripes.rebuilt_area(victim, sequence)?;
                        if !self.stripes.extent_from_area(extent, *skip, &area, &mut bytes) {
                            Counters::add(&self.stripes.counters.unrecoverable_reads, 1);
                            return Err(ArrayError::Unreadable { slot: victim });
                        }
                    }
                    Counters::add(&self.stripes.counters.gc_bytes_relocated, bytes.len() as u64);
                    let pieces = self.prepare(
                        piece.lba,
                        &bytes,
                        Origin::Relocates(piece.target.clone(), piece.version),
                    )?;
                    self.store_copies(pieces)?;
                    continue;
                }
            };
            let origin = Origin::Relocates(piece.target, piece.version);
            self.store_copies(vec![Piece {
                lba: piece.lba,
                blocks: piece.blocks,
                stored,
                origin,
            }])?;
        }
        Ok(())
    }

    /// Writes relocated copies: into the GC stream's own stripes (cold
    /// data apart from what clients overwrite), or, with
    /// `EngineOptions::gc_stream` off, into the client stripes open at
    /// the time (GC's own only where none is), for measuring what the
    /// separation saves.
    fn store_copies(&self, pieces: Vec<Piece<'_>>) -> Result<(), ArrayError> {
        let sealed = if self.options.gc_stream {
            self.pack(Stream::Gc, Claim::Collect, pieces)?
        } else {
            self.pack(Stream::User, Claim::CollectMixed, pieces)?
        };
        self.lanes.submit(sealed)
    }

    /// The pieces of the map that still point into `victim`, as its
    /// summary's records name them.
    fn live_pieces(&self, victim: u64, records: &[Record]) -> Vec<Live> {
        let index = self.catalog.index();
        let mut live = Vec::new();
        for record in records {
            let (lba, blocks, version) = match record {
                Record::Data { lba, version, extent } => (*lba, extent.blocks, *version),
                Record::Zero { lba, blocks, version } => (*lba, *blocks, *version),
            };
            for (start, mapping) in index.map.overlapping(lba, lba + u64::from(blocks)) {
                let belongs = mapping.version == version
                    && match (&mapping.target, record) {
                        (Target::Zero { slot }, Record::Zero { .. }) => *slot == victim,
                        (Target::Data { extent, .. }, Record::Data { extent: x, .. }) => {
                            extent.slot == victim && extent.offset == x.offset
                        }
                        _ => false,
                    };
                if !belongs {
                    continue;
                }
                let lo = start.max(lba);
                let hi = (start + u64::from(mapping.blocks)).min(lba + u64::from(blocks));
                let target = match &mapping.target {
                    Target::Data { extent, skip } => Target::Data {
                        extent: extent.clone(),
                        skip: skip + (lo - start) as u32,
                    },
                    zero => zero.clone(),
                };
                live.push(Live {
                    lba: lo,
                    blocks: (hi - lo) as u32,
                    version,
                    target,
                });
            }
        }
        live
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::create::CreateOptions;
    use crate::device::{Device, MemoryDevice};
    use crate::map::Target;
    use crate::options::EngineOptions;
    use crate::slots::SlotState;
    use std::sync::Arc;

    /// 4+2 with 16 KiB chunks, no log: FLUSH seals the user stripe (with
    /// a log it would stay open).
    fn options() -> CreateOptions {
        CreateOptions {
            data: 4,
            parity: 2,
            chunk_bytes: 16 << 10,
            checksum: tessera_checksum::Algorithm::Crc32c,
            compression: None,
            logical_bytes: None,
            log_bytes: Some(0),
        }
    }

    /// No background work: the tests collect and sync by hand.
    fn engine() -> EngineOptions {
        EngineOptions {
            background: false,
            ..EngineOptions::default()
        }
    }

    /// A new array of `options()` on six 4 MiB memory devices.
    pub(crate) fn memory_array() -> crate::engine::Array {
        let devices: Vec<(String, Arc<dyn Device>)> = (0..6)
            .map(|i| (format!("m{i}"), Arc::new(MemoryDevice::new(4 << 20)) as Arc<dyn Device>))
            .collect();
        crate::create::create_with(devices, &options(), engine()).unwrap()
    }

    /// A GC copy overwritten by a client write that is still in the open
    /// user stripe: the GC stripe, sealed empty, must not be freed (and
    /// rewritten) before that user stripe is durable, or a crash would
    /// lose both the copy and the write it should fall back to. It failed
    /// before GC stripes sealed empty waited for the user stream.
    #[test]
    fn an_emptied_gc_stripe_waits_for_the_writes_that_emptied_it() {
        let array = memory_array();
        let shared = &array.shared;
        array.write(0, &[1u8; 4096], true).unwrap();
        let victim = slot_of(shared, 0);
        shared.relocate(victim).unwrap();
        let copy = shared
            .lanes
            .open_lane(shared.lanes.gc_lane())
            .as_ref()
            .expect("a GC stripe took the copy")
            .slot;
        // The client overwrites the block: the copy is garbage, and what
        // replaced it is only in the open user stripe.
        array.write(0, &[2u8; 4096], false).unwrap();
        shared
            .lanes
            .submit(shared.lanes.seal_lane(shared.lanes.gc_lane()).into_iter().collect())
            .unwrap();
        shared.lanes.sync_through(shared.lanes.tracker.last_sequence()).unwrap();
        assert_ne!(
            shared.catalog.index().slots.state(copy),
            SlotState::Free,
            "the emptied GC stripe was freed before the write that emptied it is durable"
        );
        array.flush().unwrap();
        shared.lanes.sync_through(shared.lanes.tracker.last_sequence()).unwrap();
        assert_eq!(
            shared.catalog.index().slots.state(copy),
            SlotState::Free,
            "and freed after"
        );
        array.check().unwrap();
    }

    /// The slot block `lba` of the default volume maps into (its page
    /// brought in first, with any replayed records waiting for it).
    fn slot_of(shared: &crate::engine::Shared, lba: u64) -> u64 {
        let target = shared
            .catalog
            .with_mappings(lba, lba + 1, |_, mut mappings| {
                mappings.next().map(|(_, m)| m.target.clone())
            })
            .unwrap();
        match target {
            Some(Target::Data { extent, .. }) => extent.slot,
            other => panic!("block {lba} maps to {other:?}"),
        }
    }

    /// A stripe written after the last checkpoint, then collected: after
    /// a kill -9, replay meets both the original and its GC copy, with
    /// the same versions. The copy must win (it comes later), so that
    /// the victim's slot stays free and what the collection freed stays
    /// freed. Mapped the other way round, every block still reads back
    /// right, so no data check would see it: this one looks at where
    /// the blocks map. It failed with each page's records replayed in
    /// reverse order.
    #[test]
    fn a_gc_copy_wins_over_its_original_when_both_are_replayed() {
        let devices: Vec<Arc<MemoryDevice>> = (0..6).map(|_| Arc::new(MemoryDevice::new(4 << 20))).collect();
        let named = || -> Vec<(String, Arc<dyn Device>)> {
            devices
                .iter()
                .enumerate()
                .map(|(i, d)| (format!("m{i}"), d.clone() as Arc<dyn Device>))
                .collect()
        };
        let array = crate::create::create_with(named(), &options(), engine()).unwrap();
        let shared = &array.shared;
        // Sixteen blocks of their own bytes, in one stripe; then most of
        // them overwritten, so that stripe is mostly garbage.
        let block = |lba: u64, round: u8| vec![(lba as u8) ^ round.wrapping_mul(0x5b); 4096];
        for lba in 0..16 {
            array.write(lba * 4096, &block(lba, 1), false).unwrap();
        }
        array.flush().unwrap();
        let victim = slot_of(shared, 0);
        for lba in 4..16 {
            array.write(lba * 4096, &block(lba, 2), false).unwrap();
        }
        array.flush().unwrap();
        shared.relocate(victim).unwrap();
        shared
            .lanes
            .submit(shared.lanes.seal_lane(shared.lanes.gc_lane()).into_iter().collect())
            .unwrap();
        shared.lanes.sync_through(shared.lanes.tracker.last_sequence()).unwrap();
        let copy = slot_of(shared, 0);
        assert_ne!(copy, victim, "block 0 was not relocated");
        assert_eq!(shared.catalog.index().slots.state(victim), SlotState::Free);
        let before: Vec<u64> = (0..16).map(|lba| slot_of(shared, lba)).collect();
        // kill -9: the members take nothing more.
        let dead = Arc::new(std::sync::atomic::AtomicBool::new(true));
        for d in &devices {
            d.set_faults(crate::device::Faults {
                dead: Some(dead.clone()),
                ..Default::default()
            });
        }
        drop(array);
        for d in &devices {
            d.set_faults(crate::device::Faults::default());
        }
        let list = named().into_iter().map(|(name, d)| (name, Some(d))).collect();
        let array = crate::open::open_with(list, engine()).unwrap();
        let shared = &array.shared;
        let replayed = array.status().unwrap().recovery.stripes_replayed;
        assert!(
            replayed >= 3,
            "only {replayed} stripes replayed: the victim was checkpointed"
        );
        let after: Vec<u64> = (0..16).map(|lba| slot_of(shared, lba)).collect();
        assert_eq!(
            after, before,
            "blocks map elsewhere after replay (victim slot {victim}, copy {copy})"
        );
        // Where the replay was left for after opening, the victim (a
        // replayed slot) is held until every page is mapped, then freed.
        shared.deferred.finish().unwrap();
        assert_eq!(
            shared.catalog.index().slots.state(victim),
            SlotState::Free,
            "the victim holds data again"
        );
        for lba in 0..16 {
            let mut got = vec![0u8; 4096];
            array.read(lba * 4096, &mut got).unwrap();
            assert!(got == block(lba, if lba < 4 { 1 } else { 2 }), "block {lba}");
        }
        array.check().unwrap();
    }
}
