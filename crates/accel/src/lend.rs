//! A bounded, caching lender of host memory (a [`crate::HostMemory`]),
//! over a [`Source`] of allocations: the CUDA backend's page-locked
//! memory (`cuda::pinned`), or plain aligned memory ([`Aligned`], for
//! tests and measurements of the seam without a GPU).
//!
//! A source's allocations may be slow to make (page-locking pins every
//! page) and limited (a machine has only so much memory to pin), so the
//! lender:
//! - keeps what it is given back, up to `keep` bytes, for the next request
//!   of the same size (the array asks for few sizes: a data area, a
//!   stripe's parity);
//! - holds at most `limit` bytes in all (lent and kept), giving kept ones
//!   back to the source to make room, then answers `None` (the caller uses
//!   plain memory, which every backend also takes, only more slowly);
//! - records every range it holds, so that a batch can ask which
//!   allocation a buffer lies in ([`Lender::block`]).
//!
//! Locking: one mutex over the ranges and the kept list; the source is
//! never called under it.

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Where a [`Lender`] gets its memory.
pub trait Source: Send + Sync {
    /// `bytes` (> 0) aligned to [`crate::HOST_MEMORY_ALIGN`], or `None`.
    fn allocate(&self, bytes: usize) -> Option<NonNull<u8>>;

    /// Gives back what `allocate` returned.
    ///
    /// # Safety
    /// `ptr` and `bytes` are one `allocate`'s, not released before, and
    /// nothing uses the memory afterwards.
    unsafe fn release(&self, ptr: NonNull<u8>, bytes: usize);
}

#[derive(Default)]
struct State {
    /// Every range the source gave and the lender still holds (lent or
    /// kept): start address -> bytes.
    ranges: BTreeMap<usize, usize>,
    /// Ranges given back and kept: (start address, bytes).
    kept: Vec<(usize, usize)>,
    kept_bytes: usize,
    /// Bytes of `ranges`, plus those being allocated.
    held: usize,
}

pub struct Lender<S: Source> {
    source: S,
    limit: usize,
    keep: usize,
    state: Mutex<State>,
    refused: AtomicU64,
}

impl<S: Source> Lender<S> {
    /// Lends from `source` at most `limit` bytes at once, keeping up to
    /// `keep` bytes of what is given back.
    pub fn new(source: S, limit: usize, keep: usize) -> Lender<S> {
        Lender {
            source,
            limit,
            keep,
            state: Mutex::new(State::default()),
            refused: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The allocation (its start address) that `bytes` lie wholly inside,
    /// if this lender holds one.
    pub fn block(&self, bytes: &[u8]) -> Option<usize> {
        let (start, len) = (bytes.as_ptr() as usize, bytes.len());
        let state = self.lock();
        let (&at, &size) = state.ranges.range(..=start).next_back()?;
        (start + len <= at + size).then_some(at)
    }

    /// Requests answered `None` (the limit reached, or the source had none).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Gives ranges back to the source.
    fn release(&self, ranges: Vec<(usize, usize)>) {
        for (at, bytes) in ranges {
            // SAFETY: `at` came from `allocate` for `bytes` and is no
            // longer lent or kept.
            unsafe {
                self.source
                    .release(NonNull::new(at as *mut u8).expect("allocated"), bytes)
            };
        }
    }

    fn refuse(&self) -> Option<NonNull<u8>> {
        self.refused.fetch_add(1, Ordering::Relaxed);
        None
    }
}

impl<S: Source> crate::HostMemory for Lender<S> {
    fn alloc(&self, bytes: usize) -> Option<NonNull<u8>> {
        if bytes == 0 {
            return None;
        }
        let mut state = self.lock();
        if let Some(i) = state.kept.iter().position(|&(_, size)| size == bytes) {
            let (at, _) = state.kept.swap_remove(i);
            state.kept_bytes -= bytes;
            drop(state);
            // SAFETY: the range is the lender's, now lent to this caller alone.
            unsafe { std::ptr::write_bytes(at as *mut u8, 0, bytes) };
            return NonNull::new(at as *mut u8);
        }
        // Room: kept ranges go back to the source before a request is refused.
        let mut dropped = Vec::new();
        while state.held + bytes > self.limit {
            let Some((at, size)) = state.kept.pop() else { break };
            state.kept_bytes -= size;
            state.held -= size;
            state.ranges.remove(&at);
            dropped.push((at, size));
        }
        let room = state.held + bytes <= self.limit;
        if room {
            state.held += bytes;
        }
        drop(state);
        self.release(dropped);
        if !room {
            return self.refuse();
        }
        let made = self
            .source
            .allocate(bytes)
            .filter(|p| (p.as_ptr() as usize).is_multiple_of(crate::HOST_MEMORY_ALIGN));
        let mut state = self.lock();
        let Some(ptr) = made else {
            state.held -= bytes;
            return self.refuse();
        };
        state.ranges.insert(ptr.as_ptr() as usize, bytes);
        drop(state);
        // SAFETY: `bytes` were just allocated at `ptr`.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, bytes) };
        Some(ptr)
    }

    unsafe fn free(&self, ptr: NonNull<u8>, bytes: usize) {
        let at = ptr.as_ptr() as usize;
        let mut state = self.lock();
        assert_eq!(state.ranges.get(&at), Some(&bytes), "given back what was lent");
        debug_assert!(!state.kept.iter().any(|&(k, _)| k == at), "given back twice");
        if state.kept_bytes + bytes <= self.keep {
            state.kept.push((at, bytes));
            state.kept_bytes += bytes;
            return;
        }
        state.ranges.remove(&at);
        state.held -= bytes;
        drop(state);
        self.release(vec![(at, bytes)]);
    }

    fn lent(&self) -> (u64, u64) {
        let state = self.lock();
        let held: usize = state.ranges.values().sum();
        (
            (state.ranges.len() - state.kept.len()) as u64,
            (held - state.kept_bytes) as u64,
        )
    }
}

impl<S: Source> Drop for Lender<S> {
    fn drop(&mut self) {
        // Only kept ranges are left: a lent buffer holds the lender.
        let kept = std::mem::take(&mut self.lock().kept);
        self.release(kept);
    }
}

/// Plain memory from the global allocator, aligned as lent memory is.
#[derive(Default)]
pub struct Aligned;

impl Aligned {
    fn layout(bytes: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(bytes, crate::HOST_MEMORY_ALIGN).expect("a buffer's size")
    }
}

impl Source for Aligned {
    fn allocate(&self, bytes: usize) -> Option<NonNull<u8>> {
        // SAFETY: `bytes` > 0 (the lender asks for no empty buffer).
        NonNull::new(unsafe { std::alloc::alloc(Aligned::layout(bytes)) })
    }

    unsafe fn release(&self, ptr: NonNull<u8>, bytes: usize) {
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(ptr.as_ptr(), Aligned::layout(bytes)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HostMemory;
    use std::sync::atomic::AtomicUsize;

    /// Aligned memory, counting what is allocated and released.
    #[derive(Default)]
    struct Counted {
        allocated: AtomicUsize,
        released: AtomicUsize,
    }

    impl Source for Counted {
        fn allocate(&self, bytes: usize) -> Option<NonNull<u8>> {
            self.allocated.fetch_add(1, Ordering::Relaxed);
            Aligned.allocate(bytes)
        }
        unsafe fn release(&self, ptr: NonNull<u8>, bytes: usize) {
            self.released.fetch_add(1, Ordering::Relaxed);
            unsafe { Aligned.release(ptr, bytes) }
        }
    }

    #[test]
    fn lent_memory_is_zeroed_kept_for_reuse_bounded_and_given_back() {
        let lender = Lender::new(Counted::default(), 1 << 20, 1 << 20);
        let a = lender.alloc(768 << 10).expect("within the limit");
        // SAFETY: lent for 768 KiB.
        let bytes = unsafe { std::slice::from_raw_parts_mut(a.as_ptr(), 768 << 10) };
        assert!(bytes.iter().all(|&b| b == 0), "lent zeroed");
        assert!((a.as_ptr() as usize).is_multiple_of(crate::HOST_MEMORY_ALIGN));
        assert_eq!(lender.block(&bytes[100..200]), Some(a.as_ptr() as usize));
        assert_eq!(lender.block(bytes), Some(a.as_ptr() as usize));
        assert_eq!(lender.block(&[0u8; 64]), None);
        bytes.fill(7);
        assert!(lender.alloc(512 << 10).is_none(), "over the limit");
        assert_eq!(lender.refused(), 1);
        assert_eq!(lender.lent(), (1, 768 << 10));
        unsafe { lender.free(a, 768 << 10) };
        assert_eq!(lender.lent(), (0, 0));
        let again = lender.alloc(768 << 10).expect("kept");
        assert_eq!(again, a, "the same size reuses what was given back");
        // SAFETY: lent again for 768 KiB.
        assert!(unsafe { std::slice::from_raw_parts(again.as_ptr(), 768 << 10) }
            .iter()
            .all(|&b| b == 0));
        assert_eq!(lender.source.allocated.load(Ordering::Relaxed), 1);
        unsafe { lender.free(again, 768 << 10) };
        // A size not kept: what is kept goes back to the source to make room.
        let other = lender.alloc(512 << 10).expect("room made");
        assert_eq!(lender.source.released.load(Ordering::Relaxed), 1);
        unsafe { lender.free(other, 512 << 10) };
        assert_eq!(lender.lent(), (0, 0));
    }

    #[test]
    fn what_is_not_kept_goes_back_to_the_source_at_once_and_the_rest_on_drop() {
        let counted = Counted::default();
        let lender = Lender::new(counted, 1 << 20, 64 << 10);
        let (a, b) = (lender.alloc(64 << 10).unwrap(), lender.alloc(64 << 10).unwrap());
        unsafe { lender.free(a, 64 << 10) }; // kept: 64 KiB of 64
        unsafe { lender.free(b, 64 << 10) }; // over what is kept: released
        assert_eq!(lender.source.released.load(Ordering::Relaxed), 1);
        assert_eq!(lender.lent(), (0, 0));
        let source = std::sync::Arc::new(Counted::default());
        struct Shared(std::sync::Arc<Counted>);
        impl Source for Shared {
            fn allocate(&self, bytes: usize) -> Option<NonNull<u8>> {
                self.0.allocate(bytes)
            }
            unsafe fn release(&self, ptr: NonNull<u8>, bytes: usize) {
                unsafe { self.0.release(ptr, bytes) }
            }
        }
        let lender = Lender::new(Shared(source.clone()), 1 << 20, 1 << 20);
        let c = lender.alloc(4096).unwrap();
        unsafe { lender.free(c, 4096) };
        assert_eq!(source.released.load(Ordering::Relaxed), 0, "kept");
        drop(lender);
        assert_eq!(source.released.load(Ordering::Relaxed), 1, "released on drop");
    }
}
