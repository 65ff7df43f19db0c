//! The engine's limits and defaults, each with why, in one place; the
//! relations between them are asserted at compile time.

/// Blocks in one extent at most (64 KiB): the compression unit, and what a
/// partial overwrite may force a reader to decompress. Smaller where a
/// stripe's data area is (`volume::extent_blocks_max`).
pub const EXTENT_BLOCKS_MAX: usize = 16;

/// Live data is counted in units of 1/LIVE_SCALE byte so that a block of
/// any extent (its stored bytes shared among its 1..=16 blocks) counts
/// exactly: 720720 is the least common multiple of 1..=16. Counts return
/// to zero exactly when the last block of a stripe is overwritten.
pub const LIVE_SCALE: u64 = 720_720;
const _: () = {
    let mut blocks = 1;
    while blocks <= EXTENT_BLOCKS_MAX {
        assert!(LIVE_SCALE.is_multiple_of(blocks as u64));
        blocks += 1;
    }
};

/// Stripe slots an array needs at least: the reserves (GC, open stripes,
/// a checkpoint) and a window.
pub const SLOTS_MIN: u64 = 16;

/// Free slots user writes leave to garbage collection: one for the GC
/// stream's open stripe, one to seal it into while its victims drain.
pub const GC_RESERVE_SLOTS: usize = 2;

/// Times a writer that needs a slot goes through `make_room` while
/// stripes are still being sealed (others write, so the array is not
/// wedged) before it is refused: the slots its collection freed may have
/// been taken by other writers first.
pub const MAKE_ROOM_TRIES: usize = 8;

/// User stripes open at once, each filled by the writers that find it
/// free: copying a request's bytes in and mapping them happen under the
/// open stripe's lock, so one open stripe serialized every writer (on 16
/// cores, writes ran at 4.4-4.8 GB/s from 1 to 16 threads with 4-5 cores
/// busy). One per 256 slots, at most 4, so small arrays keep their slots.
pub const USER_LANES_MAX: usize = 4;
pub const SLOTS_PER_USER_LANE: u64 = 256;
/// Blocks of the volume (4 MiB) that go to one user lane in turn: large
/// enough that a region written in order fills stripes in order, small
/// enough that one client's queue of sequential writes spans all lanes.
pub const LANE_REGION_BLOCKS: u64 = 1024;

/// User stripes open at once in an array of `slots` slots.
pub fn user_lanes(slots: u64) -> usize {
    (slots / SLOTS_PER_USER_LANE).clamp(1, USER_LANES_MAX as u64) as usize
}

/// Open stripes (the user lanes and the GC stream's) that hold a slot at
/// any time.
pub fn open_stripe_count(slots: u64) -> usize {
    user_lanes(slots) + 1
}

/// Garbage collection runs in the background while fewer slots than this
/// fraction of the array (within the bounds below) are free: enough that
/// writers find a free slot while a round of collection goes on.
pub const GC_FREE_TARGET_DIVISOR: u64 = 16;
pub const GC_FREE_TARGET_MIN: u64 = 4;
pub const GC_FREE_TARGET_MAX: u64 = 256;
const _: () = assert!(GC_FREE_TARGET_MIN <= GC_FREE_TARGET_MAX);

/// A round of garbage collection relocates victims (best first) until
/// their garbage adds up to this many stripes, so that it frees at least
/// one slot net (its copies fill about a stripe fewer than it empties),
/// and at least the minimum of them; at most the maximum, which bounds the
/// work a writer waiting for the round sees.
pub const GC_ROUND_GARBAGE: f64 = 1.5;
pub const GC_VICTIMS_PER_ROUND_MIN: usize = 4;
pub const GC_VICTIMS_PER_ROUND_MAX: usize = 64;
const _: () = assert!(GC_VICTIMS_PER_ROUND_MIN <= GC_VICTIMS_PER_ROUND_MAX);

/// Live data is admitted up to this fraction of what the slots can hold
/// (after the reserves): the rest is garbage collection's slack, so that
/// a full array still has garbage spread thick enough to collect.
pub const ADMIT_FRACTION: f64 = 0.97;

/// Background collection leaves alone stripes fuller than this (of what a
/// stripe can hold): relocating them would copy much to free little. A
/// writer that finds no free slot takes any stripe with garbage.
pub const GC_BACKGROUND_LIVE_MAX: f64 = 0.85;

/// Slots garbage collection's choice of victims looks at, at least, each
/// time (those of pages of the slot table never used are not counted),
/// going on from where the last choice stopped and adding the best it
/// found then (`GC_VICTIMS_REMEMBERED`) and the window's: every slot of an
/// array that has used fewer is looked at each time, as before (the
/// default 8+2 array of 10 x 1 GiB has 15,405), and one of hundreds of
/// millions costs no more. The choice holds the index's read lock, and a
/// writer waits for it: looking at every used slot took 20 ms at a
/// million (512 GiB of 8+2 data) and 230 ms at ten million, where rounds
/// run a hundred times a second on a full array; with this many (and the
/// window's 8,192), 0.32-0.34 ms at any size (PERFORMANCE.md, "Garbage
/// collection's choice of victims, bounded").
/// 65,536 did as well in the engine, holding the lock 1.4 ms a round.
pub const GC_VICTIM_SEARCH_SLOTS: u64 = 16_384;
/// The best victims a choice found that it did not return, kept to be
/// weighed again with the next choice's slots.
pub const GC_VICTIMS_REMEMBERED: usize = 1024;

/// Slots a walk over every used slot (the stripes a scrub or a rebuild
/// goes through, a heal's degraded stripes, `status`'s count of those)
/// looks at per hold of the index's read lock: 0.09-0.15 ms a hold,
/// where one hold for all of them took 112 ms at 100 million
/// (`Catalog::walk_slots`; `tessera bench slots`).
pub const SLOT_WALK_CHUNK: u64 = 65_536;

/// The most places the map cache's memory of pages read once has
/// (`catalog::Doorkeeper`, 8 bytes each): one per 16 KiB of the cache up
/// to a 1 GiB cache, 512 KiB at most.
pub const READ_ONCE_PLACES_MAX: usize = 65_536;

/// Slots a checkpoint adds to its window: a quarter of the array, within
/// bounds. Recovery after a crash reads a header for each chunk of the
/// window's slots (at most about twice this many slots), so this bounds
/// its time; new stripes go only to window slots, so a larger window
/// means fewer checkpoints and syncs per GiB written (each costs the
/// members a sync).
pub const CHECKPOINT_WINDOW_DIVISOR: u64 = 4;
pub const CHECKPOINT_WINDOW_MAX: u64 = 8192;
pub const CHECKPOINT_WINDOW_MIN: u64 = 16;
const _: () = assert!(CHECKPOINT_WINDOW_MIN <= CHECKPOINT_WINDOW_MAX);
/// Chunks in a window at most (its slots times the stripe's width): what
/// recovery reads grows with the chunks, not the slots. 8,192 slots of
/// 92+8 were 819,200 header reads a window, and opening a killed 92+8
/// array took 20.5 s (PERFORMANCE.md, "A window bounded in chunks").
/// This many is 8,192 slots of 8+2, so no stripe of 10 chunks or fewer
/// gets a smaller window than before, and no wider one reads more (92+8
/// gets 819 slots). Data a window holds stays about the same across
/// widths at one chunk size, so checkpoints come about as often per GiB
/// written.
pub const CHECKPOINT_WINDOW_CHUNKS_MAX: u64 = 81_920;
const _: () = assert!(CHECKPOINT_WINDOW_MIN * 256 <= CHECKPOINT_WINDOW_CHUNKS_MAX);
/// A new checkpoint starts in the background once fewer than this
/// fraction of the window's slots are left free: it takes a while, and
/// writers need the rest meanwhile.
pub const CHECKPOINT_WINDOW_LOW_DIVISOR: u64 = 2;

/// Map keys (4 KiB blocks) in one page of the map (2 MiB of a volume): a
/// page holds at most this many mappings, so inserting into its sorted
/// entries moves at most ~20 KiB, and a write of one extent touches at
/// most two pages. Pages are the unit the map is held in (`map.rs`).
pub const MAP_PAGE_BLOCKS: u64 = 512;
/// What a checkpoint holds while it writes, a page it takes, beyond the
/// page's own bytes in the cache (its image copied and compressed, its
/// entry in its directory page's new image, the page's new image as the
/// map will name it, the list of pages taken): the cache keeps this
/// room for the pages changed since the last checkpoint, and for those
/// the checkpoint under way took, so that the map and its checkpoint
/// together stay within the cache, beside a fixed part (a directory
/// page read and rewritten at a time, a stripe being built). Measured
/// (`checkpoint::tests::a_checkpoint_holds_little_beside_the_pages_it_writes`,
/// which holds the checkpoint to this room): a checkpoint held 410 bytes
/// a page of one block, which takes 192 in the cache (218 beside it),
/// and 641 a page of 16 blocks, which takes 527 (114 beside it).
pub const CHECKPOINT_PAGE_WORK_BYTES: usize = 256;
/// Bytes of map pages `serve` keeps in memory by default (`--map-cache`):
/// about 45 M randomly written blocks (170 GiB of them) at ~12 bytes each.
pub const MAP_CACHE_BYTES_DEFAULT: usize = 512 << 20;
const _: () = assert!(MAP_PAGE_BLOCKS <= u16::MAX as u64 && MAP_PAGE_BLOCKS >= EXTENT_BLOCKS_MAX as u64);
/// Map pages one page of the map's directory names the images of (1 GiB
/// of a volume's keys): the root lists directory pages, not map pages, so
/// that it and the memory that names where images are grow by ~40 bytes
/// per GiB of keys written, not per 2 MiB. A full directory page is
/// 512 x (20 + 4 + 16) bytes with CRC32C (20 KiB), 50 KiB with SHA3-512:
/// rewritten whole when one of its pages moves, so not much larger.
pub const MAP_DIRECTORY_PAGES: u64 = 512;
const _: () = assert!(MAP_DIRECTORY_PAGES * MAP_PAGE_BLOCKS <= u32::MAX as u64);
const _: () = assert!(EXTENT_BLOCKS_MAX <= u8::MAX as usize);

/// Slots one page of the slot table's durable form holds (a checkpoint
/// writes only the pages whose slots changed since the last pages were
/// written, and the root names pages, not slots): each field packed in
/// the bits the page's values span (`format::encode_slot_page_image`),
/// about 9 bytes a used slot of 8+2 (at most 20, plus 187 a page), and
/// the root's entry for it some 40-100 bytes.
pub const SLOT_TABLE_PAGE_SLOTS: u64 = 1024;

/// Slot table pages opening reads at once, in parallel on the I/O pool,
/// before taking them into the table: what it holds meanwhile is one
/// batch's entries (some 8 MB), not the whole table's.
pub const OPEN_SLOT_PAGES_PER_BATCH: usize = 256;

/// Slot table pages a checkpoint copies under one hold of the index
/// (1,024 slots looked at each): writers wait a fraction of a millisecond.
pub const CHECKPOINT_SLOT_PAGES_PER_LOCK: usize = 64;

/// How long a checkpoint copies page images under one hold of the map's
/// read lock (a page at least, copied whole): writers wait for it.
/// Encoding a page is the cost, not the copy: the 1 MiB this once was
/// (195 pages) took 13-20 ms on a 2-vCPU Zen 3 under client writes.
pub const CHECKPOINT_COPY_HOLD_MAX: std::time::Duration = std::time::Duration::from_millis(1);

/// The stripes of a checkpoint's images sealed and submitted at once: a
/// batch's data areas, parity chunks and headers are held together (16
/// stripes of 8+2 at 64 KiB chunks: ~11 MiB), where a checkpoint of every
/// changed page once held its whole run's.
pub const CHECKPOINT_STRIPES_PER_SUBMIT: usize = 16;

/// A checkpoint for a spent window writes the changed pages only once
/// that costs at most 1/this of the client bytes written since the pages
/// were last written; until then it writes a new root alone, naming the
/// same pages with a longer window.
pub const CHECKPOINT_PAGES_COST_DIVISOR: u64 = 20;

/// Roots alone written in a row at most (each also only while at most a
/// window's worth of stripes were sealed since the pages were written,
/// which is what bounds replay after a crash).
pub const CHECKPOINT_ROOTS_PER_PAGES_MAX: usize = 8;

/// Map stripes a checkpoint lets stand per stripe the page images named
/// need (and one more): past that, the next checkpoint writes again the
/// pages whose images are in the sparsest, so that those are freed.
pub const MAP_STRIPES_PER_NEEDED: usize = 2;

/// Bytes of sealed stripes (all K+M chunks) not yet on the members, at
/// most: writers wait below it, which bounds memory and keeps each
/// member's queue deep enough for long runs of adjacent chunks.
pub const WRITE_BYTES_IN_FLIGHT_MAX: usize = 128 << 20;

/// Bytes one member's I/O thread writes with one call at most (after the
/// first chunk, which always goes).
pub const WRITE_RUN_BYTES_MAX: usize = 2 << 20;

/// I/O threads per member: while one writes, the next run gathers, so a
/// member always has a write in flight.
pub const MEMBER_IO_THREADS: usize = 2;

/// Threads that read chunks in parallel for one request or rebuild: a few
/// per member, so every member can have reads queued, within bounds. They
/// only wait on the members.
pub const IO_POOL_THREADS_PER_MEMBER: usize = 4;
pub const IO_POOL_THREADS_MIN: usize = 8;
pub const IO_POOL_THREADS_MAX: usize = 256;
const _: () = assert!(IO_POOL_THREADS_MIN <= IO_POOL_THREADS_MAX);

/// Bytes of rebuilt stripes the reconstruction cache keeps by default;
/// `EngineOptions::reconstruct_cache_bytes` changes it.
pub const RECONSTRUCT_CACHE_BYTES_DEFAULT: usize = 256 << 20;
/// Stripes it keeps whatever their size: as many as the readers that may
/// be rebuilding at once, so that none evicts a stripe another still needs.
pub const RECONSTRUCT_CACHE_STRIPES_MIN: usize = 64;

/// The largest request the array is sized for: the NBD server's maximum
/// request. The default exported size leaves room to rewrite this much of
/// a full array at once.
pub const REQUEST_BYTES_MAX: u64 = 32 << 20;

/// Fraction of the usable capacity exported by default, at most: the rest
/// is what garbage collection works with.
pub const DEFAULT_LOGICAL_FRACTION: f64 = 0.8;

/// Locks serializing read-modify-writes of partial blocks, chosen by block
/// number: partial writes to different blocks rarely share one.
pub const PARTIAL_WRITE_LOCK_COUNT: usize = 64;

/// Read and checksum errors after which a member is failed automatically
/// (if the parity still covers one more): a drive that keeps returning
/// errors or bad data costs a reconstruction on every read of it, and
/// will likely fail outright. ZFS faults a device after ten errors in ten
/// minutes; this counts from open, so it is higher. 0 turns it off.
pub const MEMBER_ERRORS_MAX_DEFAULT: u64 = 32;

pub const LOG_BYTES_MIN: u64 = 1 << 20;
/// A log device's area by default: all of it, up to this. The live part
/// of the log is bounded by the open stripes (a few times their data
/// areas), and opening reads the whole area.
pub const LOG_DEVICE_BYTES_DEFAULT_MAX: u64 = 256 << 20;

/// Chunk headers recovery reads at once, in parallel on the I/O pool:
/// a window's worth (it is at most about twice
/// `CHECKPOINT_WINDOW_CHUNKS_MAX`), and a full scan of a huge array holds
/// one batch's headers at a time (~300 bytes each decoded: ~50 MB).
pub const SCAN_BATCH_CHUNKS: usize = 163_840;
const _: () = assert!(SCAN_BATCH_CHUNKS as u64 >= 2 * CHECKPOINT_WINDOW_CHUNKS_MAX);
/// Chunk headers of one member one task of recovery's scan reads (in
/// flight `RING_DEPTH` at a time): a window's 16,384 slots of 8+2 give
/// 80 tasks, so the I/O pool's threads share them out.
pub const SCAN_READS_PER_TASK: usize = 2_048;
/// Records a part of a replayed run has at least, where the run is mapped
/// in parts side by side (`Map::insert_parts`), and parts at most: a
/// thread each, so a part is worth its start.
pub const REPLAY_PART_RECORDS_MIN: usize = 16_384;
pub const REPLAY_PARTS_MAX: usize = 8;
/// A replay is mapped after opening (`index::Pending`) only where its
/// records fall in at most this many (page, record) places (16 bytes
/// each, beside the records: a full window of random writes is ~1 M),
/// and none spans more than `REPLAY_LATER_SPAN_PAGES_MAX` pages (a TRIM
/// of a whole volume would be a place for each of its pages); else it is
/// mapped before serving.
pub const REPLAY_LATER_PLACES_MAX: usize = 8 << 20;
pub const REPLAY_LATER_SPAN_PAGES_MAX: u64 = 64;
/// Pages a replay's records are mapped into at a time (fewer if the map
/// cache holds fewer): one hold of the index's write lock each, so
/// clients go on between. The background thread takes fewer, and rests
/// between batches while clients are about: 1,024 pages held the lock
/// ~5 ms (2-vCPU Zen 3; 128 were not timed).
pub const REPLAY_LATER_BATCH_PAGES: usize = 1_024;
pub const REPLAY_LATER_BACKGROUND_PAGES: usize = 128;

/// A page with fewer entries is always written whole (its image is small
/// whatever changed: `map/delta.rs`).
pub const MAP_DELTA_ENTRIES_MIN: usize = 64;
