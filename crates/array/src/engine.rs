//! The engine: the state an open array shares among client threads, member
//! I/O threads and background work, and the public [`Array`].
//!
//! The threads, the locks, their order and what each protects are in
//! `docs/ENGINE.md`; in short, no lock is held across device I/O or a
//! sync by the paths clients take, and every critical section only moves
//! indexes. The layers below, which `Shared` holds and which know nothing
//! of it: the stripes on the members (`Stripes`, `stripes.rs`); over
//! them the index (`Catalog`, `catalog.rs`: the map and the slot table
//! under the index's lock, the pins, the map cache); over both the lanes
//! (`Lanes`, `lanes.rs`: the open stripes, sealing, handing stripes to the
//! members, syncs, sequences); the read path over those (`Reader`,
//! `read.rs`); the intent log (`IntentLog`, `intent.rs`) and the work
//! opening left for later (`Deferred`, `deferred.rs`) over the lanes;
//! the checkpoints over those (`Checkpoints`, `checkpoint.rs`); and
//! recovery (`recovery::Opening`). The modules beside this one each add
//! one part of the engine proper, which need each other (a writer that
//! finds no room runs GC, GC packs its copies as a writer does):
//!
//! - `write`: admission, packing extents into the lanes, FLUSH, finding
//!   room.
//! - `gc`: garbage collection.
//! - `repair`, `rebuild`, `heal`: rewriting bad chunks, scrub; a member
//!   rebuilt; stripes moved off an out member.
//! - `volumes`: the volumes' gates and operations.
//! - `maintenance`: the background thread that runs GC and checkpoints.
//! - `status`: counters and `tessera status`.

use crate::counters::Counters;
use crate::error::ArrayError;
use crate::format::{Geometry, Superblock, BLOCK_BYTES};
use crate::index::Index;
use crate::map::Map;
use crate::members::{Member, Members};
use crate::options::EngineOptions;
use crate::recovery::Recovery;
use crate::slots::{Pins, SlotTable};
use crate::status::Status;
use crate::stripes::Stripes;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tessera_accel::Accelerator;
use tessera_compress::policy::Policy;

pub(crate) struct Shared {
    /// The stripe layer: the members, their I/O, the array's shape and
    /// accelerator, reading and rebuilding stripes (`stripes.rs`).
    pub stripes: Arc<Stripes>,
    /// The index layer over it: the map and the slot table under the
    /// index's lock, the slots' pins, the map cache (`catalog.rs`).
    pub catalog: Arc<crate::catalog::Catalog>,
    /// The lanes over it: the open stripes, sealing, handing stripes to
    /// the members, syncs, and the sequences' tracker (`lanes.rs`).
    pub lanes: Arc<crate::lanes::Lanes>,
    /// The write path's state: partial-block locks, admitted bytes, the
    /// compression policy.
    pub writes: crate::write::Writes,
    /// The scrub, rebuild and heal running now, one of each at most.
    pub jobs: crate::repair::Jobs,
    /// What happened since the array was opened.
    pub events: Arc<crate::events::Events>,
    /// Garbage collection's state: one round at a time.
    pub gc: crate::gc::Rounds,
    /// The checkpoint layer: writes checkpoints, one at a time.
    pub checkpoints: crate::checkpoint::Checkpoints,
    /// Wakes and stops the maintenance thread.
    pub maintenance: crate::maintenance::Signal,
    /// What this opening's recovery found (`status`).
    pub recovery: Mutex<Recovery>,
    /// The volumes' gates, and the lock volume operations take.
    pub volumes: crate::volumes::Gates,
    /// The work opening left for after it: slot pages not read, a
    /// replay's records not mapped (`deferred`).
    pub deferred: Arc<crate::deferred::Deferred>,
    /// The intent log, if the array has an area for one.
    pub intent: Option<Arc<crate::intent::IntentLog>>,
    pub options: EngineOptions,
}

/// An open array.
pub struct Array {
    pub(crate) shared: Arc<Shared>,
    /// The default volume, which `read`, `write` and the rest reach.
    default: crate::volumes::Volume,
    /// The maintenance thread, and the one reading the slot pages
    /// opening left unread.
    background: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Keeps the members' activity records moving; dropped last, after
    /// the member threads stopped, it marks them closed.
    heartbeat: crate::activity::Heartbeat,
}

fn poisoned<T>(guard: std::sync::PoisonError<T>) -> T {
    guard.into_inner()
}

impl Shared {
    /// Counts a client request (background work yields to them).
    pub fn client_request(&self) {
        Counters::add(&self.stripes.counters.client_requests, 1);
    }

    /// Checks a range of the map's key space in bytes (every volume's:
    /// a volume's own bounds are checked by its `Volume` handle).
    pub fn check_range(&self, offset: u64, len: u64) -> Result<(), ArrayError> {
        let size = (crate::volume::VOLUME_COUNT_MAX as u64) * crate::volume::VOLUME_BYTES_MAX;
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(ArrayError::OutOfRange { offset, len, size }),
        }
    }

    /// The read path over the stripes, the catalog and the lanes.
    pub fn reader(&self) -> crate::read::Reader<'_> {
        crate::read::Reader {
            stripes: &self.stripes,
            catalog: &self.catalog,
            lanes: &self.lanes,
        }
    }

    /// Reads `buf.len()` bytes at byte `offset` of the map's key space.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ArrayError> {
        self.check_range(offset, buf.len() as u64)?;
        self.reader().read(offset, buf)
    }

    /// NBD_CMD_CACHE over [offset, offset+len) (`Reader::prefetch`).
    pub fn prefetch(&self, offset: u64, len: u64) -> Result<(), ArrayError> {
        self.check_range(offset, len)?;
        self.reader().prefetch(offset, len)
    }
}

impl Shared {
    /// Opening's recovery (`recovery::Opening::recover`: the map and the
    /// slot table rebuilt from the checkpoint and the stripes since, or
    /// from every stripe), then the intent log's records replayed into
    /// stripes through the write path.
    fn recover(&self, start: crate::recovery::Start) -> Result<(), ArrayError> {
        let started = std::time::Instant::now();
        let opening = crate::recovery::Opening {
            stripes: &self.stripes,
            catalog: &self.catalog,
            lanes: &self.lanes,
            checkpoints: &self.checkpoints,
            options: &self.options,
        };
        let mut recovery = opening.recover(start)?;
        if let Some(log) = &self.intent {
            let replaying = std::time::Instant::now();
            recovery.log = Some(self.replay_log(log)?);
            recovery.phases.log = replaying.elapsed().as_millis() as u64;
        }
        // Pages replay pinned (and the log's, looked at to see whether
        // its records are mapped) go, past the cache's size.
        self.catalog.evict_pages(&mut self.catalog.index_mut());
        recovery.milliseconds = started.elapsed().as_millis() as u64;
        *self.recovery.lock().unwrap_or_else(poisoned) = recovery;
        Ok(())
    }

    /// At open, after the stripes are recovered: replays the intent
    /// log's blocks from the newest one's tail on into stripes, sealed and
    /// synced (`IntentLog::read_for_replay`); the log then starts after
    /// the newest block.
    fn replay_log(&self, log: &crate::intent::IntentLog) -> Result<crate::intent::LogRecovery, ArrayError> {
        let (mut found, blocks) = log.read_for_replay(self.options.discard_missing_log)?;
        let mut pieces = Vec::new();
        // The pages the records land in stay in memory until mapped.
        let ranges: Vec<(u64, u64)> = blocks
            .iter()
            .flatten()
            .map(|(record, _)| (record.lba, record.lba + u64::from(record.blocks)))
            .collect();
        let _pages = self.catalog.pin_pages(&ranges)?;
        {
            // A record mapped at its version or a newer one is in a
            // stripe already (the stripe it went to was sealed after
            // all, or its blocks were written again): not written again.
            let index = self.catalog.index();
            for records in blocks.iter().filter(|records| !records.is_empty()) {
                found.blocks_replayed += 1;
                for (record, bytes) in records {
                    let end = record.lba + u64::from(record.blocks);
                    if index.map.mapped_at_least(record.lba, end, record.version) {
                        found.records_already_mapped += 1;
                        continue;
                    }
                    found.records_replayed += 1;
                    pieces.push(crate::intent::replayed_piece(record, bytes));
                }
            }
        }
        // No admission: this was admitted before the crash.
        let replayed = self
            .pack(crate::format::Stream::User, crate::write::Claim::Collect, pieces)
            .and_then(|sealed| self.lanes.submit(sealed))
            .and_then(|_| self.lanes.seal_user_lanes())
            .and_then(|_| self.lanes.sync_through(self.lanes.tracker.last_sequence()));
        // What was replayed is sealed and synced: the next opening need
        // not look at it again.
        let replayed = replayed.and_then(|()| log.retire());
        match replayed {
            // Members failed past the parity while the records were
            // written: the stripes that hold them stay in memory and are
            // read from there, the log keeps them (nothing is synced, so
            // no log block is retired), and the array opens with writes
            // refused, saying why, for the operator to bring the members
            // back; the next opening replays them again.
            Err(ArrayError::WritesRefused { why }) => {
                found.replay_failed = Some(why.to_string());
                Ok(found)
            }
            other => other.map(|()| found),
        }
    }
}

impl Array {
    /// Builds the engine over opened members and recovers the map (called
    /// by `crate::create` and `crate::open`).
    /// `fresh`: the array was just created, so no slot holds a stripe of
    /// it and opening scans none.
    pub(crate) fn assemble(
        superblock: Superblock,
        members: Vec<Member>,
        options: EngineOptions,
        rejected: Vec<crate::error::Rejected>,
        log_devices: Vec<crate::intent::LogDevice>,
        start: crate::recovery::Start,
    ) -> Result<Array, ArrayError> {
        let geometry = superblock.geometry.clone();
        let volume_table = superblock
            .volume_table
            .clone()
            .unwrap_or_else(|| Arc::new(crate::volume::VolumeTable::default_for(geometry.logical_bytes)));
        let accel = match &options.accel {
            Some(accel) => accel.clone(),
            None => tessera_accel::Kind::from_env()
                .and_then(tessera_accel::select)
                .map_err(ArrayError::Accel)?,
        };
        // A backend that measures where work runs (auto with a GPU) does
        // so for this shape now, not during the first writes.
        accel.prepare(&crate::stripe::shape(&geometry));
        let policy = geometry.compression.map(|codec| Policy {
            mode: tessera_compress::policy::Mode::Aggressive,
            codec,
            min_blob: BLOCK_BYTES,
            max_blob: crate::write::extent_blocks_max(&geometry) * BLOCK_BYTES,
            ..Policy::default()
        });
        let array_uuid = superblock.array_uuid;
        // The members' devices count their I/O; the writers get the
        // counted ones.
        let events = Arc::new(crate::events::Events::default());
        let members = Members::new(members, superblock, rejected, options.member_errors_max, events.clone());
        let slot_count = geometry.slot_count();
        let stripes = Arc::new(Stripes::start(
            geometry.clone(),
            array_uuid,
            accel,
            members,
            options.reconstruct_cache_bytes,
        )?);
        let catalog = Arc::new(
            crate::catalog::Catalog::new(
                stripes.clone(),
                Index {
                    map: Map::new(options.map_delta_entries_min),
                    slots: SlotTable::new(geometry.checksum, slot_count)
                        .with_live_max(match options.slot_counts_narrow {
                            true => u64::MAX,
                            false => geometry.data_area_bytes() as u64 * crate::limits::LIVE_SCALE,
                        })
                        .with_victim_search(options.gc_victim_search_slots),
                    resident: HashMap::new(),
                    next_version: 1,
                    checkpoint_slots: Vec::new(),
                    map_stripes: 0,
                    drain_after_user: Vec::new(),
                    drain_at_seal: HashMap::new(),
                    user_open: HashMap::new(),
                    user_serial_next: 1,
                    last_sealed: 0,
                    last_data_sealed: 0,
                    volumes: crate::index::Floors::of(&volume_table),
                    pending: None,
                },
                Pins::new(slot_count),
                options.map_cache_bytes,
            )
            .with_walk_chunk(options.slot_walk_chunk),
        );
        // The user lanes, and the GC stream's.
        let lanes = options
            .user_lanes
            .unwrap_or_else(|| crate::limits::user_lanes(slot_count))
            .clamp(1, crate::limits::USER_LANES_MAX)
            + 1;
        let lanes = crate::lanes::Lanes::new(stripes.clone(), catalog.clone(), lanes);
        let intent = geometry.has_log().then(|| {
            Arc::new(crate::intent::IntentLog::new(
                stripes.clone(),
                lanes.clone(),
                log_devices,
            ))
        });
        let deferred = Arc::new(crate::deferred::Deferred::new(
            catalog.clone(),
            lanes.clone(),
            events.clone(),
            options.open_slot_pages_per_batch,
        ));
        let checkpoints = crate::checkpoint::Checkpoints::new(
            lanes.clone(),
            intent.clone(),
            deferred.clone(),
            options.window_slots,
            options.next_window_early,
        );
        let shared = Arc::new(Shared {
            stripes,
            catalog,
            lanes,
            jobs: Default::default(),
            events,
            writes: crate::write::Writes::new(&geometry, policy),
            gc: crate::gc::Rounds::default(),
            checkpoints,
            maintenance: crate::maintenance::Signal::default(),
            recovery: Mutex::new(Recovery::default()),
            volumes: crate::volumes::Gates::of(&volume_table),
            deferred,
            intent,
            options,
        });
        // The mark to do before serving what opening leaves for later
        // (read every slot page, map the replay) stays on the members
        // while a slot page left for later is unreadable or a map page
        // the replay mapped later is stale, and, where this opening found
        // it, until its recovery (which does both) is done.
        let recovering_suspect = Arc::new(std::sync::atomic::AtomicBool::new(
            start == crate::recovery::Start::Suspect,
        ));
        let heartbeat = {
            let (shared, marked) = (shared.clone(), shared.clone());
            let recovering = recovering_suspect.clone();
            let devices = move || {
                shared
                    .stripes
                    .writable_members()
                    .into_iter()
                    .filter_map(|m| shared.stripes.members.device(m))
                    .collect()
            };
            let array_uuid = marked.stripes.array_uuid;
            let read_pages = move || {
                let index = marked.catalog.index();
                recovering.load(std::sync::atomic::Ordering::Relaxed)
                    || index.slots.pages_unreadable()
                    || index.pending.as_ref().is_some_and(|p| p.stale().is_some())
            };
            crate::activity::Heartbeat::start(array_uuid, devices, read_pages).map_err(|source| {
                ArrayError::ThreadStart {
                    what: "activity thread",
                    source,
                }
            })?
        };
        let default = crate::volumes::open_volume(&shared, crate::volume::DEFAULT_VOLUME_NAME)?;
        let array = Array {
            shared,
            default,
            background: Mutex::new(Vec::new()),
            heartbeat,
        };
        array.shared.recover(start)?;
        recovering_suspect.store(false, std::sync::atomic::Ordering::Relaxed);
        {
            let r = array.shared.recovery.lock().unwrap_or_else(poisoned).clone();
            array.shared.events.record(crate::events::What::Opened {
                milliseconds: r.milliseconds,
                clean_stop: r.clean_stop,
                slots_scanned: r.slots_scanned,
                stripes_replayed: r.stripes_replayed,
            });
        }
        if array.shared.options.background {
            array.spawn("tessera-maintenance", "maintenance thread", Shared::maintain)?;
        }
        let (unread, waiting) = array.shared.deferred.anything_left();
        if unread && array.shared.options.slot_pages_in_background {
            array.spawn("tessera-slot-pages", "slot page thread", |shared| {
                shared.deferred.read_slot_pages_in_background()
            })?;
        }
        if waiting && array.shared.options.background {
            array.spawn("tessera-replay", "replay thread", |shared| {
                shared.deferred.finish_replay_in_background()
            })?;
        }
        Ok(array)
    }

    pub fn geometry(&self) -> &Geometry {
        &self.shared.stripes.geometry
    }

    /// The default volume's size now.
    pub fn logical_bytes(&self) -> u64 {
        self.default.size()
    }

    /// Reads `buf.len()` bytes at byte `offset` of the default volume.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ArrayError> {
        self.default.read(offset, buf)
    }

    /// [`Volume::prefetch`](crate::volumes::Volume::prefetch) on the default volume.
    pub fn prefetch(&self, offset: u64, len: u64) -> Result<(), ArrayError> {
        self.default.prefetch(offset, len)
    }

    /// [`Volume::allocation`](crate::volumes::Volume::allocation) on the default volume.
    pub fn allocation(&self, offset: u64, len: u64) -> Result<Vec<(u64, bool)>, ArrayError> {
        self.default.allocation(offset, len)
    }

    /// Writes `data` at byte `offset` of the default volume; with `fua`,
    /// returns once it is durable.
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ArrayError> {
        self.default.write(offset, data, fua)
    }

    /// Makes `len` bytes at `offset` read as zeros and frees their space.
    pub fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), ArrayError> {
        self.default.write_zeroes(offset, len, fua)
    }

    /// TRIM: the same as WRITE_ZEROES here (discarded blocks read as zeros).
    pub fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), ArrayError> {
        self.default.write_zeroes(offset, len, fua)
    }

    /// FLUSH: returns once every write that returned before it is durable.
    pub fn flush(&self) -> Result<(), ArrayError> {
        self.default.flush()
    }

    /// Writes a map checkpoint now (a clean shutdown does, so the next
    /// start reads it and few headers).
    pub fn checkpoint(&self) -> Result<(), ArrayError> {
        self.shared.checkpoints.checkpoint()
    }

    /// Writes the checkpoint a spent window needs (what the engine does
    /// when one runs out): a new root alone, with a longer window, while
    /// the changed pages would cost more than 1/20 of the client bytes
    /// since they were last written (at most 8 in a row); else the pages
    /// too.
    pub fn checkpoint_as_needed(&self) -> Result<(), ArrayError> {
        self.shared.checkpoints.checkpoint_as_needed()
    }

    /// Marks member `index` failed (as if pulled) and records it in the
    /// superblocks, its own included: at the next open it is `failed`,
    /// not `stale`, and is not resynced until asked. Refused if more than
    /// M would be gone.
    ///
    /// A healthy member first gets a map checkpoint in its superblock, so
    /// that if it comes back, a resync trusts what it holds up to now and
    /// looks only at what was written while it was away (best effort: a
    /// checkpoint that cannot be written leaves the last one).
    pub fn fail_member(&self, index: usize) -> Result<(), ArrayError> {
        if index < self.shared.stripes.members.count() && self.shared.stripes.members.is_readable(index) {
            let _ = self.shared.checkpoints.checkpoint();
        }
        self.shared.stripes.members.set_aside(index)?;
        self.shared.maintenance.wake();
        Ok(())
    }

    /// Reads every chunk of every stripe, checks each against its leaf and
    /// the stripe's Merkle root, and rewrites the bad ones from the others.
    pub fn scrub(&self) -> Result<crate::repair::ScrubReport, ArrayError> {
        self.shared.scrub()
    }

    /// [`Array::scrub`] at most `rate` bytes a second from the members,
    /// calling `progress` after each stripe (false stops it).
    pub fn scrub_with(
        &self,
        rate: Option<u64>,
        progress: impl FnMut(&crate::repair::ScrubReport) -> bool,
    ) -> Result<crate::repair::ScrubReport, ArrayError> {
        self.shared.scrub_with(rate, progress)
    }

    /// The scrub running now, its report so far (`None`: none runs).
    pub fn scrub_progress(&self) -> Option<crate::repair::ScrubReport> {
        self.shared.jobs.scrub.get()
    }

    pub fn status(&self) -> Result<Status, ArrayError> {
        Ok(self.shared.status())
    }

    /// Client requests carried out since the array was opened: background
    /// work that sees it move yields to clients.
    pub fn client_requests(&self) -> u64 {
        self.shared
            .stripes
            .counters
            .client_requests
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Checks that the map, the slots' live counts and the free set agree;
    /// tests call it between operations.
    pub fn check(&self) -> Result<(), String> {
        self.shared.deferred.finish().map_err(|e| e.to_string())?;
        self.shared.checkpoints.check_map_stripes()?;
        self.shared
            .catalog
            .with_every_page(|index| {
                let awaiting = |slot| {
                    index.drain_after_user.iter().any(|d| d.0 == slot)
                        || index.drain_at_seal.values().any(|drains| drains.contains(&slot))
                };
                index.map.check_bytes()?;
                index.map.check_durable()?;
                index.slots.check(&index.map, awaiting)
            })
            .map_err(|e| e.to_string())?
    }

    /// The accelerator the array uses.
    pub fn accelerator(&self) -> &Arc<dyn Accelerator> {
        &self.shared.stripes.accel
    }
}

impl Array {
    /// Starts a background thread running `work`, joined by
    /// `stop_background`.
    fn spawn(&self, name: &str, what: &'static str, work: fn(&Shared)) -> Result<(), ArrayError> {
        let shared = self.shared.clone();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || work(&shared))
            .map_err(|source| ArrayError::ThreadStart { what, source })?;
        self.background.lock().unwrap_or_else(poisoned).push(thread);
        Ok(())
    }

    fn stop_background(&self) {
        self.shared.maintenance.stop();
        self.shared.deferred.stop();
        for thread in std::mem::take(&mut *self.background.lock().unwrap_or_else(poisoned)) {
            let _ = thread.join();
        }
    }

    /// A clean stop: stops the background work, waits for the client
    /// requests in flight, refuses every write and FLUSH after them
    /// (`ArrayError::Closed`; reads go on), seals and syncs the open
    /// stripes and writes a checkpoint. If no stripe was sealed after that
    /// checkpoint, the members' activity records say so, synced, and the
    /// next opening reads no stripe header (`Recovery::clean_stop`).
    /// Callers stop their own writers first (a rebuild, a heal): one that
    /// seals a stripe after the check costs the next opening its scan at
    /// worst, never data.
    pub fn close(&self) -> Result<(), ArrayError> {
        self.stop_background();
        let shared = &self.shared;
        let _volumes = shared.volumes.operation();
        let gates = shared.volumes.all();
        let _requests: Vec<_> = gates.iter().map(|g| g.size.write().unwrap_or_else(poisoned)).collect();
        let checkpointed = shared.checkpoints.checkpoint_to_close();
        shared.stripes.members.close_for_writes();
        checkpointed?;
        let clean = shared.checkpoints.nothing_after_checkpoint();
        if let Some(sequence) = clean {
            self.heartbeat.close_clean(sequence);
        }
        shared
            .events
            .record(crate::events::What::Closed { clean: clean.is_some() });
        Ok(())
    }

    /// What happened since the array was opened, oldest first (the
    /// newest `events::EVENTS_MAX`).
    pub fn events(&self) -> Vec<crate::events::Event> {
        self.shared.events.list()
    }

    /// The events recorded after the first `seen` since opening (those
    /// still kept), and how many have been: see `events::Events::since`.
    pub fn events_since(&self, seen: u64) -> (Vec<crate::events::Event>, u64) {
        self.shared.events.since(seen)
    }
}

impl Drop for Array {
    /// Stops background work, then lets the member threads write what was
    /// sealed, as a clean shutdown must; what is still in open stripes is
    /// dropped, as a crash would (callers flush first, or close).
    fn drop(&mut self) {
        self.stop_background();
        self.shared.stripes.io.stop();
    }
}
