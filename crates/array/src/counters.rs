//! The engine's counters: atomics, bumped where the work happens (the
//! stripe layer, the write path, GC, checkpoints, the intent log) and read
//! without a lock by `status`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Counters, readable while the array serves.
#[derive(Default)]
pub struct Counters {
    /// Reads, writes, zeroes and FLUSHes clients asked for.
    pub client_requests: AtomicU64,
    /// Lookups that found every map page they needed in memory, pages
    /// read from their images, pages evicted.
    pub map_page_hits: AtomicU64,
    pub map_page_misses: AtomicU64,
    pub map_pages_evicted: AtomicU64,
    /// Pages read for one lookup and not kept (`Catalog::with_mappings`).
    pub map_pages_read_once: AtomicU64,
    /// Reads of map stripes for page and directory page images: pages
    /// lying near each other in one stripe are read together.
    pub map_page_reads: AtomicU64,
    pub user_bytes_written: AtomicU64,
    /// Shared with the member I/O threads, which add what they write.
    pub member_bytes_written: Arc<AtomicU64>,
    pub stripes_sealed: AtomicU64,
    pub short_stripes_sealed: AtomicU64,
    pub flushes: AtomicU64,
    pub syncs: AtomicU64,
    pub checksum_errors: AtomicU64,
    pub chunks_repaired: AtomicU64,
    pub reconstructed_reads: AtomicU64,
    pub stripes_reconstructed: AtomicU64,
    pub ranges_decoded: AtomicU64,
    pub unrecoverable_reads: AtomicU64,
    pub gc_rounds: AtomicU64,
    pub gc_stripes_collected: AtomicU64,
    pub gc_bytes_relocated: AtomicU64,
    pub checkpoints_written: AtomicU64,
    pub checkpoints_forced: AtomicU64,
    pub checkpoints_dropped: AtomicU64,
    pub checkpoint_bytes_written: AtomicU64,
    /// What the checkpoints wrote, by part, in stored bytes (before
    /// parity and the stripes' unused tails): page images (whole), page
    /// deltas, directory pages, slot table pages, roots (with their
    /// listings); and of the page images, those moved out of sparse map
    /// stripes.
    pub checkpoint_page_image_bytes: AtomicU64,
    pub checkpoint_page_delta_bytes: AtomicU64,
    pub checkpoint_page_moved_bytes: AtomicU64,
    pub checkpoint_directory_bytes: AtomicU64,
    pub checkpoint_slot_page_bytes: AtomicU64,
    pub checkpoint_slot_delta_bytes: AtomicU64,
    pub checkpoint_directory_delta_bytes: AtomicU64,
    pub checkpoint_root_bytes: AtomicU64,
    pub checkpoints_root_only: AtomicU64,
    pub log_blocks_written: AtomicU64,
    pub log_bytes_written: AtomicU64,
    pub flushes_logged: AtomicU64,
    pub log_stripes_sealed_instead: AtomicU64,
    pub log_write_failures: AtomicU64,
    /// Microseconds writers waited for the members (writes in flight at
    /// the bound), and for a free slot.
    pub waited_for_members_us: AtomicU64,
    pub waited_for_slot_us: AtomicU64,
    /// Stripes sealed in slots taken early (the next window's, while a
    /// checkpoint was written), and milliseconds FLUSHes waited for the
    /// checkpoint that names them.
    pub stripes_sealed_early: AtomicU64,
    pub flushes_waited_for_checkpoint_ms: AtomicU64,
}

impl Counters {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
