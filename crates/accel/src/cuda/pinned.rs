//! Page-locked host memory the CUDA backend lends (the allocator seam,
//! [`crate::HostMemory`]): stripes the array builds in it are copied to
//! and from the GPU by its copy engines straight from where they lie,
//! where pageable memory must first be packed into a staging buffer by
//! the CPU (that copy held the backend at a third to a half of the link's
//! speed end to end).
//!
//! The driver's page-locked allocations are slow to make (they pin every
//! page) and a machine has only so much memory to pin, so the pool:
//! - keeps what it is given back, up to [`CACHE_BYTES`], for the next
//!   request of the same size (the array asks for few sizes: a data area,
//!   a stripe's parity);
//! - lends at most `limit` bytes in all (live and kept), then answers
//!   `None`, and the array uses plain memory, which the backend still
//!   takes through its staging buffers;
//! - records every range it holds, so that a batch can ask whether a
//!   job's buffers lie in it ([`Pinned::holds`]).
//!
//! Locking: one mutex over the ranges and the kept list; no driver call
//! is made under it.

use cudarc::driver::{result as cu, CudaContext};
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

/// Bytes of given-back allocations kept for reuse.
pub const CACHE_BYTES: usize = 256 << 20;

/// Bytes the pool lends at most by default (`TESSERA_CUDA_PINNED_MAX`
/// overrides it, in MiB): the array's spare and in-flight stripes of a
/// wide shape come to a few hundred MiB.
pub const DEFAULT_LIMIT: usize = 2 << 30;

#[derive(Default)]
struct State {
    /// Every range the driver gave and the pool still holds (lent or
    /// kept): start address -> bytes.
    ranges: BTreeMap<usize, usize>,
    /// Ranges given back and kept: (start address, bytes).
    kept: Vec<(usize, usize)>,
    kept_bytes: usize,
    /// Bytes of `ranges`, plus those being allocated.
    held: usize,
    lent: u64,
    lent_bytes: u64,
}

pub struct Pinned {
    ctx: Arc<CudaContext>,
    limit: usize,
    state: Mutex<State>,
}

impl Pinned {
    pub fn new(ctx: Arc<CudaContext>, limit: usize) -> Pinned {
        Pinned {
            ctx,
            limit,
            state: Mutex::new(State::default()),
        }
    }

    /// The limit `TESSERA_CUDA_PINNED_MAX` (MiB) names, else the default.
    pub fn limit_from_env() -> usize {
        std::env::var("TESSERA_CUDA_PINNED_MAX")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .map_or(DEFAULT_LIMIT, |mib| mib << 20)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The range this pool holds that `bytes` lie wholly inside (its
    /// start address), if any.
    pub fn block(&self, bytes: &[u8]) -> Option<usize> {
        let (start, len) = (bytes.as_ptr() as usize, bytes.len());
        let state = self.lock();
        let (&at, &size) = state.ranges.range(..=start).next_back()?;
        (start + len <= at + size).then_some(at)
    }

    /// Whether `bytes` lie wholly inside one range this pool holds.
    pub fn holds(&self, bytes: &[u8]) -> bool {
        self.block(bytes).is_some()
    }

    /// Gives ranges back to the driver.
    fn release(&self, ranges: Vec<(usize, usize)>) {
        if ranges.is_empty() {
            return;
        }
        // The context must be current for the driver to free its memory.
        self.ctx.bind_to_thread().ok();
        for (at, _) in ranges {
            // SAFETY: `at` came from `malloc_host` and is no longer lent or kept.
            unsafe { cu::free_host(at as _).ok() };
        }
    }
}

impl crate::HostMemory for Pinned {
    fn alloc(&self, bytes: usize) -> Option<NonNull<u8>> {
        if bytes == 0 {
            return None;
        }
        let mut state = self.lock();
        if let Some(i) = state.kept.iter().position(|&(_, size)| size == bytes) {
            let (at, _) = state.kept.swap_remove(i);
            state.kept_bytes -= bytes;
            state.lent += 1;
            state.lent_bytes += bytes as u64;
            drop(state);
            // SAFETY: the range is the pool's, now lent to this caller alone.
            unsafe { std::ptr::write_bytes(at as *mut u8, 0, bytes) };
            return NonNull::new(at as *mut u8);
        }
        // Room: kept ranges go back to the driver before a request is refused.
        let mut dropped = Vec::new();
        while state.held + bytes > self.limit {
            let Some((at, size)) = state.kept.pop() else { break };
            state.kept_bytes -= size;
            state.held -= size;
            state.ranges.remove(&at);
            dropped.push((at, size));
        }
        if state.held + bytes > self.limit {
            drop(state);
            self.release(dropped);
            return None;
        }
        state.held += bytes;
        drop(state);
        self.release(dropped);
        let made = self
            .ctx
            .bind_to_thread()
            .ok()
            // SAFETY: a plain allocation; the pointer is checked below.
            .and_then(|_| unsafe { cu::malloc_host(bytes, 0) }.ok())
            .map(|p| p as usize)
            .filter(|&at| at != 0 && at % crate::HOST_MEMORY_ALIGN == 0);
        let mut state = self.lock();
        let Some(at) = made else {
            state.held -= bytes;
            return None;
        };
        state.ranges.insert(at, bytes);
        state.lent += 1;
        state.lent_bytes += bytes as u64;
        drop(state);
        // SAFETY: `bytes` were just allocated at `at`.
        unsafe { std::ptr::write_bytes(at as *mut u8, 0, bytes) };
        NonNull::new(at as *mut u8)
    }

    unsafe fn free(&self, ptr: NonNull<u8>, bytes: usize) {
        let at = ptr.as_ptr() as usize;
        let mut state = self.lock();
        debug_assert_eq!(state.ranges.get(&at), Some(&bytes), "freed what the pool lent");
        state.lent -= 1;
        state.lent_bytes -= bytes as u64;
        if state.kept_bytes + bytes <= CACHE_BYTES {
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
        (state.lent, state.lent_bytes)
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // Only kept ranges are left: a lent buffer holds the pool.
        let kept = std::mem::take(&mut self.lock().kept);
        self.release(kept);
    }
}
