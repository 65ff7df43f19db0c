//! Page-locked host memory the CUDA backend lends (the allocator seam,
//! [`crate::HostMemory`]): stripes the array builds in it are copied to
//! and from the GPU by its copy engines straight from where they lie,
//! where pageable memory must first be packed into a staging buffer by
//! the CPU (that copy held the backend at a third to a half of the link's
//! speed end to end). The bookkeeping (reuse, the limit, which allocation
//! a buffer lies in) is [`crate::lend::Lender`]'s; this is its source.

use crate::lend::{Lender, Source};
use cudarc::driver::{result as cu, CudaContext};
use std::ptr::NonNull;
use std::sync::Arc;

/// Bytes of given-back allocations kept for reuse.
pub const CACHE_BYTES: usize = 256 << 20;

/// Bytes lent at most by default (`TESSERA_CUDA_PINNED_MAX` overrides it,
/// in MiB): the array's spare and in-flight stripes of a wide shape come
/// to a few hundred MiB.
pub const DEFAULT_LIMIT: usize = 2 << 30;

/// The driver's page-locked allocations, in the backend's context.
pub struct Driver {
    ctx: Arc<CudaContext>,
}

impl Source for Driver {
    fn allocate(&self, bytes: usize) -> Option<NonNull<u8>> {
        self.ctx.bind_to_thread().ok()?;
        // SAFETY: a plain allocation; the lender checks its alignment.
        NonNull::new(unsafe { cu::malloc_host(bytes, 0) }.ok()? as *mut u8)
    }

    unsafe fn release(&self, ptr: NonNull<u8>, _bytes: usize) {
        // The context must be current for the driver to free its memory.
        self.ctx.bind_to_thread().ok();
        // SAFETY: `ptr` came from `malloc_host` and is used no more.
        unsafe { cu::free_host(ptr.as_ptr() as _).ok() };
    }
}

/// The page-locked memory a CUDA backend lends.
pub type Pinned = Lender<Driver>;

/// A lender of page-locked memory in `ctx`, of at most `limit` bytes.
pub fn lender(ctx: Arc<CudaContext>, limit: usize) -> Pinned {
    Lender::new(Driver { ctx }, limit, CACHE_BYTES)
}

/// The limit `TESSERA_CUDA_PINNED_MAX` (MiB) names, else the default.
pub fn limit_from_env() -> usize {
    std::env::var("TESSERA_CUDA_PINNED_MAX")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(DEFAULT_LIMIT, |mib| mib << 20)
}
