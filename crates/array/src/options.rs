//! How an open array is run: the engine's choices, given to `create`
//! and `open`, never stored on disk.

use crate::limits::RECONSTRUCT_CACHE_BYTES_DEFAULT;
use std::sync::Arc;
use tessera_accel::Accelerator;

/// How an array is run (not stored on disk).
#[derive(Clone)]
pub struct EngineOptions {
    /// The accelerator for parity, rebuilds and hashes (default: the CPU).
    pub accel: Option<Arc<dyn Accelerator>>,
    /// Bytes of rebuilt stripes kept for degraded reads.
    pub reconstruct_cache_bytes: usize,
    /// Whether a background thread collects garbage and writes
    /// checkpoints ahead of need; without it, writers do so when they must.
    pub background: bool,
    /// User stripes open at once (`None`: by the array's size, see
    /// `limits::user_lanes`). Each holds a slot.
    pub user_lanes: Option<usize>,
    /// Read and checksum errors after which a member is failed
    /// automatically (0: never).
    pub member_errors_max: u64,
    /// Dedicated log devices, named for messages: `create` formats them
    /// (each holds a copy of the intent log, instead of the members);
    /// `open` takes them by their headers, in any order.
    pub log_devices: Vec<(String, Arc<dyn crate::device::Device>)>,
    /// Opens even when every log device that may hold log blocks is
    /// missing, the FLUSHed writes only they held given up (without it,
    /// such an open is refused).
    pub discard_missing_log: bool,
    /// Garbage collection writes its copies to stripes of its own (the
    /// default), apart from client writes; off, into the clients'
    /// stripes (to measure what the separation saves).
    pub gc_stream: bool,
    /// Opens even when the members' activity records say another process
    /// (on this host or another) has the array open (`serve --force`): for
    /// a host that died with the array open, once it is known to be down.
    pub ignore_activity: bool,
    /// Bytes of map pages kept in memory (`serve --map-cache`): past it,
    /// clean pages are evicted, least recently used first. Dirty pages
    /// stay until a checkpoint writes them, so the map may pass it by
    /// what changed since the last one.
    pub map_cache_bytes: usize,
    /// A map page of fewer entries is always written whole by a
    /// checkpoint, never as a delta over its image
    /// (`limits::MAP_DELTA_ENTRIES_MIN`). Fewer, for tests that want
    /// deltas of small pages.
    pub map_delta_entries_min: usize,
    /// Slot table pages read at once while opening, in parallel, and
    /// taken into the table before the next are read: what opening holds
    /// of them is about 32 KiB a page (`limits::OPEN_SLOT_PAGES_PER_BATCH`
    /// by default). Fewer, to test opening in many batches.
    pub open_slot_pages_per_batch: usize,
    /// Whether a thread reads the slot pages opening left unread
    /// (`slot_loader`); without it they are read when something needs
    /// them (tests that look at the table half read).
    pub slot_pages_in_background: bool,
    /// Slots a checkpoint adds to its window (`None`: a quarter of the
    /// array's, at most `limits::CHECKPOINT_WINDOW_MAX` and
    /// `CHECKPOINT_WINDOW_CHUNKS_MAX` chunks). Fewer, for tests
    /// that want a window small beside the array, as on a large one.
    pub window_slots: Option<u64>,
    /// Records a part has at least where replay maps a long run of
    /// records in parts side by side, one a core
    /// (`limits::REPLAY_PART_RECORDS_MIN`). Fewer, for tests that want
    /// small replays mapped in parts, which then get up to
    /// `limits::REPLAY_PARTS_MAX` parts whatever the cores.
    pub replay_part_records: usize,
    /// Whether a replay after a crash is mapped after opening, page by
    /// page as they are needed and by a background thread
    /// (`index::Pending`); off, before serving (tests do both).
    pub replay_later: bool,
    /// Whether writers may take the next window's slots while a
    /// checkpoint is written, once the current window's run out, rather
    /// than wait for it; a FLUSH then waits for that checkpoint to be
    /// durable (`SlotTable::early`). Off by default: it shortened a
    /// sequential fill's longest write about threefold, but raised p99.9
    /// under random writes and GC, and `bench-nbd.sh`'s sequential write
    /// ran at 0.77-0.78x in two of three rounds (PERFORMANCE.md, "Writers
    /// into the next window's slots while a checkpoint is written").
    pub next_window_early: bool,
    /// Used slots garbage collection's choice of victims looks at, at
    /// least, each time (`limits::GC_VICTIM_SEARCH_SLOTS`). Fewer, for
    /// tests that want the choice bounded on a small array, as on a large
    /// one.
    pub gc_victim_search_slots: u64,
    /// Slots a walk over every slot (a scrub's and a rebuild's stripes, a
    /// heal's degraded ones) looks at per hold of the index's lock
    /// (`limits::SLOT_WALK_CHUNK`). Fewer, for tests that want such walks
    /// in many chunks on a small array, as on a large one.
    pub slot_walk_chunk: u64,
    /// Whether the slot table packs its counts with 4 bits of pieces
    /// (live units in the rest), not in the bits the stripe's size needs:
    /// a slot of 15 pieces or more then keeps its counts in the map beside
    /// the table (`SlotTable::wide`), which a large stripe's slots need
    /// only past 64 MiB of data. For tests that want that map used on a
    /// small array.
    pub slot_counts_narrow: bool,
}

impl Default for EngineOptions {
    fn default() -> EngineOptions {
        EngineOptions {
            accel: None,
            reconstruct_cache_bytes: RECONSTRUCT_CACHE_BYTES_DEFAULT,
            map_cache_bytes: crate::limits::MAP_CACHE_BYTES_DEFAULT,
            map_delta_entries_min: crate::limits::MAP_DELTA_ENTRIES_MIN,
            background: true,
            user_lanes: None,
            member_errors_max: crate::limits::MEMBER_ERRORS_MAX_DEFAULT,
            log_devices: Vec::new(),
            discard_missing_log: false,
            gc_stream: true,
            ignore_activity: false,
            open_slot_pages_per_batch: crate::limits::OPEN_SLOT_PAGES_PER_BATCH,
            slot_pages_in_background: true,
            window_slots: None,
            replay_part_records: crate::limits::REPLAY_PART_RECORDS_MIN,
            replay_later: true,
            next_window_early: false,
            gc_victim_search_slots: crate::limits::GC_VICTIM_SEARCH_SLOTS,
            slot_walk_chunk: crate::limits::SLOT_WALK_CHUNK,
            slot_counts_narrow: false,
        }
    }
}
