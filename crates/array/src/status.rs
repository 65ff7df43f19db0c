//! What `tessera status` reports.
//!
//! Counters (`counters.rs`) are atomics, read without a lock; the rest
//! of the report is read from the index under its read lock, from
//! totals the slot table keeps, so a status request costs a pass over
//! the slots (not the map) and never stalls writers for long.

use crate::checkpoint::CheckpointParts;
use crate::engine::Shared;
use crate::format::hex;
use crate::members::MemberState;
use crate::recovery::Recovery;
use crate::slots::SlotState;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};

/// What `tessera status` reports.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Status {
    pub array_uuid: String,
    pub data: usize,
    pub parity: usize,
    pub chunk_bytes: usize,
    pub checksum: String,
    pub compression: String,
    /// The accelerator in use and the work it has done.
    pub accelerator: AcceleratorStatus,
    pub members: Vec<MemberStatus>,
    pub members_unavailable: usize,
    /// Devices given at open that were left out (not this array's
    /// members, or damaged), and why.
    pub devices_rejected: Vec<crate::error::Rejected>,
    /// The scrub running now, its report so far (`null`: none runs).
    pub scrub: Option<crate::repair::ScrubReport>,
    /// The rebuild running now, its report so far (`null`: none runs).
    pub rebuild: Option<crate::rebuild::RebuildReport>,
    /// The heal running now, its report so far (`null`: none runs).
    #[serde(default)]
    pub heal: Option<crate::heal::HealReport>,
    /// Why writes and FLUSH are refused (more than M members failed), if
    /// they are; `null` otherwise.
    pub writes_refused: Option<String>,
    pub stripes_total: u64,
    pub stripes_used: u64,
    pub stripes_free: u64,
    pub stripes_degraded: u64,
    pub raw_bytes: u64,
    /// Client data the stripes can hold, uncompressed (`create::usable_bytes`).
    pub usable_bytes: u64,
    /// The default volume's size.
    pub logical_bytes: u64,
    /// Every volume, by id (the default first), with what it maps and stores.
    #[serde(default)]
    pub volumes: Vec<crate::volumes::VolumeStatus>,
    pub mapped_bytes: u64,
    /// Stored bytes of live data (compressed size where compressed).
    pub stored_bytes: u64,
    pub compression_ratio: f64,
    pub user_bytes_written: u64,
    pub member_bytes_written: u64,
    /// Bytes written to the members and log devices per user byte.
    pub write_amplification: f64,
    /// The part of it written as stripes, and as intent log blocks (on
    /// the members or the log devices).
    pub write_amplification_stripes: f64,
    pub write_amplification_log: f64,
    /// The intent log (`null`: the array has none).
    pub log: Option<crate::intent::LogStatus>,
    pub stripes_sealed: u64,
    pub short_stripes_sealed: u64,
    pub flushes: u64,
    pub syncs: u64,
    pub gc_rounds: u64,
    pub gc_stripes_collected: u64,
    pub gc_bytes_relocated: u64,
    pub checksum_errors: u64,
    pub chunks_repaired: u64,
    pub reconstructed_reads: u64,
    /// Stripes rebuilt from K chunks to serve reads (each once, however
    /// many reads it serves from the cache).
    pub stripes_reconstructed: u64,
    /// Small degraded reads served by decoding only the byte range wanted.
    pub ranges_decoded: u64,
    pub unrecoverable_reads: u64,
    /// Sequence of the newest durable map checkpoint (`None`: none).
    pub checkpoint_sequence: Option<u64>,
    pub checkpoints_written: u64,
    /// Checkpoints taken as a last resort for room (the free slots outside
    /// the window fewer than a checkpoint's worst case), and those dropped
    /// for want of room or of space in the superblock (recovery then scans
    /// every slot until the next one is written).
    pub checkpoints_forced: u64,
    pub checkpoints_dropped: u64,
    /// Of `checkpoints_written`, those that wrote a new root alone (the
    /// pages of the last, a longer window), the changed pages costing
    /// more than 1/20 of the client bytes since they were last written.
    #[serde(default)]
    pub checkpoints_root_only: u64,
    /// Bytes of checkpoint stripes (the map's durable copy, with parity)
    /// written to the members: the map's share of `member_bytes_written`,
    /// beside `user_bytes_written` and `gc_bytes_relocated`.
    pub checkpoint_bytes_written: u64,
    /// What those stripes held, by part, in stored bytes (before parity
    /// and the stripes' unused tails): the map's page images, its
    /// directory pages, the slot table's pages and the roots (with their
    /// listings). Which part grows with the array is what bounds the
    /// metadata's cost (docs/PERFORMANCE.md, "Metadata writes as the
    /// array grows").
    #[serde(default)]
    pub checkpoint_parts: CheckpointParts,
    /// The map in memory: its mappings (a write across a 2 MiB page of a
    /// volume is one per page), and the bytes they take.
    #[serde(default)]
    pub map_mappings: u64,
    #[serde(default)]
    pub map_bytes: u64,
    /// The map cache: its size (`serve --map-cache`), the pages whose
    /// image is on the members (as the durable directory names them,
    /// whether in memory or not) and their stored bytes, lookups that
    /// found their pages in memory, pages read in, pages evicted.
    #[serde(default)]
    pub map_cache_bytes: u64,
    #[serde(default)]
    pub map_pages_on_members: u64,
    #[serde(default)]
    pub map_bytes_on_members: u64,
    /// Pages of the map's directory (each names where 512 map pages'
    /// images are), and those of them in memory.
    #[serde(default)]
    pub map_directory_pages: u64,
    #[serde(default)]
    pub map_directory_pages_in_memory: u64,
    #[serde(default)]
    pub map_page_hits: u64,
    #[serde(default)]
    pub map_page_misses: u64,
    #[serde(default)]
    pub map_pages_evicted: u64,
    /// Pages read for one lookup and not kept: the cache had no room
    /// and they were not read so lately (`Catalog::with_mappings`).
    #[serde(default)]
    pub map_pages_read_once: u64,
    /// Reads of map stripes that brought pages and directory pages in
    /// (pages near each other in one stripe are read at once).
    #[serde(default)]
    pub map_page_reads: u64,
    /// Bytes of memory the slot table takes (`SlotTable::memory_bytes`):
    /// 16 bytes a used slot, in pages of 4,096 allocated as first used,
    /// and two bits a slot of the array. What grows with the data outside
    /// the map's cache.
    #[serde(default)]
    pub slot_table_bytes: u64,
    /// Slot table pages opening left to be read after it that are still
    /// unread (garbage collection, checkpoints, rebuilds and scrubs wait
    /// for them; `recovery` says how many there were).
    #[serde(default)]
    pub slot_pages_unread: u64,
    /// One of them could not be read (its map stripe past repair, or its
    /// counts not adding up): the members' activity records ask the next
    /// opening to read every slot page, and to scan every slot if one
    /// still fails. Until then no checkpoint can be written.
    #[serde(default)]
    pub slot_pages_unreadable: bool,
    /// Map pages a replay after a crash left for after opening whose
    /// records are not mapped yet (checkpoints, garbage collection,
    /// rebuilds and scrubs wait for them; `recovery.pages_mapped_later`
    /// says how many there were).
    #[serde(default)]
    pub replay_pages_waiting: u64,
    /// Of the pages that replay mapped, those found pointing into a
    /// replayed slot at a place the replay did not write (the
    /// checkpoint's map missed an overwrite): reads and writes there
    /// fail, no checkpoint can be written, and the members' activity
    /// records ask the next opening to replay before serving, which then
    /// refuses the checkpoint and scans every slot.
    #[serde(default)]
    pub replay_pages_stale: u64,
    /// Its pages in memory (512 blocks of a volume each), those changed since the
    /// last checkpoint (the next one writes their images), and the map
    /// stripes holding the durable checkpoint's images.
    #[serde(default)]
    pub map_pages: u64,
    #[serde(default)]
    pub map_dirty_pages: u64,
    #[serde(default)]
    pub map_stripes: u64,
    /// Milliseconds writers spent waiting for the members to take more
    /// (the write bound), and for a free slot (sync, GC, checkpoint).
    pub writers_waited_for_members_ms: u64,
    pub writers_waited_for_slot_ms: u64,
    /// Stripes written to the next window's slots while a checkpoint
    /// was written (rather than waiting for it), and milliseconds
    /// FLUSHes then waited for that checkpoint to be durable.
    #[serde(default)]
    pub stripes_sealed_early: u64,
    #[serde(default)]
    pub flushes_waited_for_checkpoint_ms: u64,
    pub recovery: Recovery,
}

#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct MemberStatus {
    pub index: usize,
    pub name: String,
    pub state: MemberState,
    #[serde(flatten)]
    pub errors: crate::members::MemberErrors,
    /// Its reads and writes since the array was opened (chunks, log
    /// blocks, superblocks): what `tessera iostat` shows the rates of.
    #[serde(default)]
    pub io: crate::device::IoTotals,
}

#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct AcceleratorStatus {
    pub name: String,
    /// What the backend runs on (a GPU's name; a fallback and its reason).
    pub detail: String,
    pub stripes_sealed: u64,
    pub stripes_reconstructed: u64,
    pub bytes_coded: u64,
    pub bytes_hashed: u64,
    /// Bytes of chunks coded or hashed on a GPU.
    pub bytes_on_device: u64,
}

impl Shared {
    pub fn status(&self) -> Status {
        let g = &self.stripes.geometry;
        let c = &self.stripes.counters;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let (used, free, mapped, stored, map, slot_pages) = {
            let index = self.catalog.index();
            // Counted, not walked: `status` is asked every second by the
            // dashboard and `iostat`, and a walk of every slot in use
            // under the index's lock held writers back on a large array.
            // A slot is free-listed exactly when its state is free
            // (`SlotTable::check`, which the tests run), so the free count
            // gives the used one.
            let used = index.slots.count() - index.slots.free_count() as u64;
            (
                used,
                index.slots.free_count() as u64,
                index.slots.mapped_data_blocks() * crate::format::BLOCK_BYTES as u64,
                index.slots.stored_bytes(),
                (
                    index.map.len() as u64,
                    index.map.held_bytes() as u64,
                    index.map.page_count() as u64,
                    index.map.dirty_count() as u64,
                    index.map_stripes as u64,
                    index.map.directory_totals().0,
                    index.map.directory_totals().1,
                    index.map.directory_counts(),
                ),
                (
                    index.slots.unread_count() as u64,
                    index.slots.pages_unreadable(),
                    index.slots.memory_bytes(),
                    index.pending.as_ref().map_or(0, |p| p.pages_left() as u64),
                    index.pending.as_ref().and_then(|p| p.stale()).map_or(0, |s| s.1 as u64),
                ),
            )
        };
        let volumes = self.volume_statuses();
        // Degraded stripes are walked for only while a member is out, a
        // chunk of slots per hold of the index's lock.
        let out = (0..self.stripes.members.count()).any(|m| !self.stripes.members.is_readable(m));
        let degraded = match out {
            true => self
                .catalog
                .count_where(|_, slot, s| s.state != SlotState::Free && !self.stripes.all_healthy(slot)),
            false => 0,
        };
        let user = load(&c.user_bytes_written);
        let member = load(&c.member_bytes_written);
        let log_bytes = load(&c.log_bytes_written);
        // Log blocks on the members are counted in theirs.
        let stripes = match &self.intent {
            Some(log) if !log.on_devices() => member.saturating_sub(log_bytes),
            _ => member,
        };
        let ratio = |bytes: u64| if user == 0 { 0.0 } else { bytes as f64 / user as f64 };
        let work = self.stripes.accel.work();
        let members = &self.stripes.members;
        Status {
            array_uuid: hex(&self.stripes.array_uuid),
            data: g.data,
            parity: g.parity,
            chunk_bytes: g.chunk_bytes,
            checksum: g.checksum.name().to_string(),
            compression: g.compression.map_or("none".to_string(), |c| c.to_string()),
            accelerator: AcceleratorStatus {
                name: self.stripes.accel.name().to_string(),
                detail: self.stripes.accel.detail(),
                stripes_sealed: work.stripes_sealed,
                stripes_reconstructed: work.stripes_reconstructed,
                bytes_coded: work.bytes_coded,
                bytes_hashed: work.bytes_hashed,
                bytes_on_device: work.bytes_on_device,
            },
            members: (0..members.count())
                .map(|index| {
                    let errors = members.errors(index);
                    let state = match members.state(index) {
                        MemberState::Healthy if members.lost().is_some() && errors.write_errors > 0 => {
                            MemberState::Failing
                        }
                        state => state,
                    };
                    MemberStatus {
                        index,
                        name: members.name(index),
                        state,
                        errors,
                        io: members.io(index),
                    }
                })
                .collect(),
            members_unavailable: members.unavailable(),
            devices_rejected: members.rejected().to_vec(),
            scrub: self.jobs.scrub.get(),
            rebuild: self.jobs.rebuild.get(),
            heal: self.jobs.heal.get(),
            writes_refused: members.lost().map(ToString::to_string),
            stripes_total: g.slot_count(),
            stripes_used: used,
            stripes_free: free,
            stripes_degraded: degraded,
            raw_bytes: g.member_bytes * g.members as u64,
            usable_bytes: crate::create::usable_bytes(g),
            logical_bytes: volumes.first().map_or(g.logical_bytes, |v| v.bytes),
            volumes,
            mapped_bytes: mapped,
            stored_bytes: stored,
            compression_ratio: if stored == 0 {
                1.0
            } else {
                mapped as f64 / stored as f64
            },
            user_bytes_written: user,
            member_bytes_written: member,
            write_amplification: ratio(stripes + log_bytes),
            write_amplification_stripes: ratio(stripes),
            write_amplification_log: ratio(log_bytes),
            log: self.intent.as_ref().map(|log| log.status()),
            stripes_sealed: load(&c.stripes_sealed),
            short_stripes_sealed: load(&c.short_stripes_sealed),
            flushes: load(&c.flushes),
            syncs: load(&c.syncs),
            gc_rounds: load(&c.gc_rounds),
            gc_stripes_collected: load(&c.gc_stripes_collected),
            gc_bytes_relocated: load(&c.gc_bytes_relocated),
            checksum_errors: load(&c.checksum_errors),
            chunks_repaired: load(&c.chunks_repaired),
            reconstructed_reads: load(&c.reconstructed_reads),
            stripes_reconstructed: load(&c.stripes_reconstructed),
            ranges_decoded: load(&c.ranges_decoded),
            unrecoverable_reads: load(&c.unrecoverable_reads),
            checkpoint_sequence: members.superblock().checkpoint.as_ref().map(|c| c.sequence),
            checkpoints_written: load(&c.checkpoints_written),
            checkpoints_forced: load(&c.checkpoints_forced),
            checkpoints_dropped: load(&c.checkpoints_dropped),
            checkpoints_root_only: load(&c.checkpoints_root_only),
            checkpoint_bytes_written: load(&c.checkpoint_bytes_written),
            checkpoint_parts: CheckpointParts {
                page_images: load(&c.checkpoint_page_image_bytes),
                page_deltas: load(&c.checkpoint_page_delta_bytes),
                page_images_moved: load(&c.checkpoint_page_moved_bytes),
                directory_pages: load(&c.checkpoint_directory_bytes),
                slot_pages: load(&c.checkpoint_slot_page_bytes),
                slot_page_deltas: load(&c.checkpoint_slot_delta_bytes),
                directory_page_deltas: load(&c.checkpoint_directory_delta_bytes),
                roots: load(&c.checkpoint_root_bytes),
            },
            map_mappings: map.0,
            map_bytes: map.1,
            map_pages: map.2,
            map_dirty_pages: map.3,
            map_stripes: map.4,
            map_cache_bytes: self.options.map_cache_bytes as u64,
            map_pages_on_members: map.5,
            map_bytes_on_members: map.6,
            map_directory_pages: map.7 .0 as u64,
            map_directory_pages_in_memory: map.7 .1 as u64,
            map_page_hits: load(&c.map_page_hits),
            map_page_misses: load(&c.map_page_misses),
            map_page_reads: load(&c.map_page_reads),
            map_pages_evicted: load(&c.map_pages_evicted),
            map_pages_read_once: load(&c.map_pages_read_once),
            slot_pages_unread: slot_pages.0,
            slot_pages_unreadable: slot_pages.1,
            slot_table_bytes: slot_pages.2,
            replay_pages_waiting: slot_pages.3,
            replay_pages_stale: slot_pages.4,
            writers_waited_for_members_ms: load(&c.waited_for_members_us) / 1000,
            writers_waited_for_slot_ms: load(&c.waited_for_slot_us) / 1000,
            stripes_sealed_early: load(&c.stripes_sealed_early),
            flushes_waited_for_checkpoint_ms: load(&c.flushes_waited_for_checkpoint_ms),
            recovery: self.recovery.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        }
    }
}
