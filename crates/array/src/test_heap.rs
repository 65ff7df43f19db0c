//! The test binary's allocator: the system's, counting what each thread
//! allocated less what it freed (the heap its own work holds: each test
//! runs on a thread of its own), and the most it held since asked to
//! watch. Memory a thread allocates and another frees (a stripe handed
//! to the lanes) counts as the first's.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static HELD: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

pub struct Counting;

#[global_allocator]
static COUNTING: Counting = Counting;

fn add(bytes: isize) {
    // (Not while the thread's own storage is being torn down.)
    let _ = HELD.try_with(|held| {
        let now = held.get() + bytes;
        held.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

/// What this thread holds now.
pub fn held() -> isize {
    HELD.with(Cell::get)
}

/// Starts watching for this thread's peak: returns what it holds now.
pub fn watch() -> isize {
    let now = held();
    PEAK.with(|peak| peak.set(now));
    now
}

/// The most this thread held since `watch`.
pub fn peak() -> isize {
    PEAK.with(Cell::get)
}

// SAFETY: each call is passed to the system allocator unchanged;
// counting allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(layout.size() as isize);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        add(layout.size() as isize);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, at: *mut u8, layout: Layout) {
        add(-(layout.size() as isize));
        // SAFETY: as above.
        unsafe { System.dealloc(at, layout) }
    }

    unsafe fn realloc(&self, at: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        add(size as isize - layout.size() as isize);
        // SAFETY: as above.
        unsafe { System.realloc(at, layout, size) }
    }
}
