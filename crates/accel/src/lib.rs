//! The accelerator seam: the arithmetic an array does in bulk, behind one
//! trait that takes batches.
//!
//! Guarantees: every backend computes exactly what the reference functions
//! compute (`tessera_ec::Codec` with the Cauchy matrix for parity and
//! rebuilt chunks, `tessera_checksum` for digests and Merkle trees), so a
//! stripe sealed by one backend is read back by any other. The CPU backend
//! is that reference; a GPU backend is tested against it.
//!
//! Three kinds of work cross the seam, each as a batch, so that a backend
//! can spread it as it likes (a thread pool, GPU streams):
//!
//! - [`Accelerator::seal`]: for each stripe, the M parity chunks of its K
//!   data chunks, the Merkle leaf of every chunk and the stripe's root.
//! - [`Accelerator::reconstruct`]: for each stripe, its missing chunks from
//!   any K others, then every leaf and the root, which the caller compares
//!   with the stored ones (so chunks that pass their own checksums but do
//!   not belong together are caught).
//! - [`Accelerator::hash`]: the digest of each buffer.
//!
//! [`select`] picks a backend by name (`auto`, `cpu`, `cuda`).
//!
//! Beside the work, a backend may lend host memory it reads and writes
//! directly ([`Accelerator::host_memory`], a [`HostMemory`]): page-locked
//! memory on a GPU, which its copy engines move without the extra copy
//! into staging buffers that pageable memory costs. The array builds its
//! stripes in it; a backend with none (the CPU) leaves them in plain
//! aligned memory.

pub mod batch;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod lend;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tessera_checksum::{Algorithm, Digest};

/// A stripe's shape: K data and M parity chunks of `chunk_bytes`, hashed
/// with `checksum`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    pub data: usize,
    pub parity: usize,
    pub chunk_bytes: usize,
    pub checksum: Algorithm,
}

impl Shape {
    pub fn new(data: usize, parity: usize, chunk_bytes: usize, checksum: Algorithm) -> Shape {
        Shape {
            data,
            parity,
            chunk_bytes,
            checksum,
        }
    }

    pub fn width(&self) -> usize {
        self.data + self.parity
    }
}

/// One stripe to seal: its K data chunks laid end to end, and room for its
/// M parity chunks laid end to end.
pub struct SealJob<'a> {
    pub data: &'a [u8],
    pub parity: &'a mut [u8],
}

/// One stripe to rebuild: all K+M chunks (data first, then parity), each
/// `chunk_bytes` long; those listed in `missing` are rebuilt, whatever
/// they held.
pub struct ReconstructJob<'a> {
    pub chunks: Vec<&'a mut [u8]>,
    pub missing: Vec<usize>,
}

/// What sealing or rebuilding a stripe yields besides chunk bytes: the
/// Merkle leaf of each of its K+M chunks, in order, and the root over them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leaves {
    pub leaves: Vec<Digest>,
    pub root: Digest,
}

#[derive(Debug, thiserror::Error)]
pub enum AccelError {
    #[error("{0}")]
    Codec(#[from] tessera_ec::EcError),
    #[error("stripe {index} of the batch has {got} bytes where {want} are expected")]
    WrongSize { index: usize, got: usize, want: usize },
    #[error("the '{name}' accelerator is not available: {why}")]
    Unavailable { name: String, why: String },
    #[error("unknown accelerator '{name}': use auto, cpu or cuda")]
    UnknownKind { name: String },
}

/// The work a backend has done since it started, for `status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Work {
    pub stripes_sealed: u64,
    pub stripes_reconstructed: u64,
    /// Bytes read to seal and rebuild (data chunks in, all chunks hashed).
    pub bytes_coded: u64,
    pub buffers_hashed: u64,
    pub bytes_hashed: u64,
    /// Bytes of chunks coded or hashed on a GPU (the rest were on the CPU).
    pub bytes_on_device: u64,
}

/// Counters a backend bumps as it works.
#[derive(Default)]
pub struct WorkCounters {
    stripes_sealed: AtomicU64,
    stripes_reconstructed: AtomicU64,
    bytes_coded: AtomicU64,
    buffers_hashed: AtomicU64,
    bytes_hashed: AtomicU64,
    bytes_on_device: AtomicU64,
}

impl WorkCounters {
    pub fn sealed(&self, stripes: usize, bytes: usize) {
        self.stripes_sealed.fetch_add(stripes as u64, Ordering::Relaxed);
        self.bytes_coded.fetch_add(bytes as u64, Ordering::Relaxed);
    }
    pub fn reconstructed(&self, stripes: usize, bytes: usize) {
        self.stripes_reconstructed.fetch_add(stripes as u64, Ordering::Relaxed);
        self.bytes_coded.fetch_add(bytes as u64, Ordering::Relaxed);
    }
    pub fn hashed(&self, buffers: usize, bytes: usize) {
        self.buffers_hashed.fetch_add(buffers as u64, Ordering::Relaxed);
        self.bytes_hashed.fetch_add(bytes as u64, Ordering::Relaxed);
    }
    /// Bytes a GPU coded or hashed (counted besides sealed/hashed).
    pub fn on_device(&self, bytes: usize) {
        self.bytes_on_device.fetch_add(bytes as u64, Ordering::Relaxed);
    }
    pub fn snapshot(&self) -> Work {
        Work {
            stripes_sealed: self.stripes_sealed.load(Ordering::Relaxed),
            stripes_reconstructed: self.stripes_reconstructed.load(Ordering::Relaxed),
            bytes_coded: self.bytes_coded.load(Ordering::Relaxed),
            buffers_hashed: self.buffers_hashed.load(Ordering::Relaxed),
            bytes_hashed: self.bytes_hashed.load(Ordering::Relaxed),
            bytes_on_device: self.bytes_on_device.load(Ordering::Relaxed),
        }
    }
}

/// Alignment of what a [`HostMemory`] gives: a page, so that a buffer can
/// also go to the members with direct I/O.
pub const HOST_MEMORY_ALIGN: usize = 4096;

/// Host memory lent by a backend, which it reads and writes without
/// copying it first (page-locked memory on a GPU).
///
/// Guarantees: what [`HostMemory::alloc`] returns is `bytes` long, zeroed,
/// aligned to [`HOST_MEMORY_ALIGN`] and the caller's until it is given
/// back with [`HostMemory::free`]. `None` means none is left to lend (a
/// backend bounds what it pins): the caller then uses plain memory, which
/// every backend also takes, only more slowly.
pub trait HostMemory: Send + Sync {
    fn alloc(&self, bytes: usize) -> Option<std::ptr::NonNull<u8>>;

    /// Gives back what `alloc` lent.
    ///
    /// # Safety
    /// `ptr` and `bytes` are exactly what one `alloc` of this memory
    /// returned and was asked for, not given back before, and nothing
    /// uses the memory afterwards.
    unsafe fn free(&self, ptr: std::ptr::NonNull<u8>, bytes: usize);

    /// (buffers, bytes) lent now, for `status`.
    fn lent(&self) -> (u64, u64);
}

/// A backend for the array's bulk arithmetic.
pub trait Accelerator: Send + Sync {
    /// The backend's name, as `status` and `bench` print it.
    fn name(&self) -> &str;

    /// What the backend runs on, for `status` and `bench` (the GPU's name,
    /// a fallback and why); empty for the CPU.
    fn detail(&self) -> String {
        String::new()
    }

    /// Computes each job's parity, then the leaves and root of its K+M
    /// chunks. Results are in job order.
    fn seal(&self, shape: &Shape, jobs: &mut [SealJob<'_>]) -> Result<Vec<Leaves>, AccelError>;

    /// Rebuilds each job's missing chunks (at most M), then computes the
    /// leaves and root of all K+M. Results are in job order.
    fn reconstruct(&self, shape: &Shape, jobs: &mut [ReconstructJob<'_>]) -> Result<Vec<Leaves>, AccelError>;

    /// Rebuilds each job's missing *data* chunks (at most M missing) from
    /// the others, computing no leaves: for reads of a byte range of a
    /// stripe, where every chunk holds the same range and the caller checks
    /// what it gets by its own digests. `shape.chunk_bytes` is the range's
    /// length.
    fn decode(&self, shape: &Shape, jobs: &mut [ReconstructJob<'_>]) -> Result<(), AccelError>;

    /// The digest of each input, in order.
    fn hash(&self, algorithm: Algorithm, inputs: &[&[u8]]) -> Vec<Digest>;

    /// The work done so far.
    fn work(&self) -> Work;

    /// Host memory this backend works on without copying it first, if it
    /// has any: stripes built in it reach a GPU straight from it.
    fn host_memory(&self) -> Option<Arc<dyn HostMemory>> {
        None
    }

    /// Told once by an array as it opens: its stripes have `shape`. A
    /// backend that chooses where work runs by measuring (`auto` with a
    /// GPU) measures this shape now rather than during the first writes.
    fn prepare(&self, _shape: &Shape) {}
}

/// Which backend to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Kind {
    /// A GPU for the work where it is faster, the CPU otherwise.
    #[default]
    Auto,
    Cpu,
    Cuda,
}

impl std::str::FromStr for Kind {
    type Err = AccelError;
    fn from_str(name: &str) -> Result<Kind, AccelError> {
        match name.to_ascii_lowercase().as_str() {
            "auto" => Ok(Kind::Auto),
            "cpu" => Ok(Kind::Cpu),
            "cuda" | "gpu" => Ok(Kind::Cuda),
            _ => Err(AccelError::UnknownKind { name: name.to_string() }),
        }
    }
}

impl Kind {
    /// The kind `TESSERA_ACCEL` names (auto when it is unset): what an
    /// array opened without an explicit backend uses, so that a test suite
    /// can be run on a GPU with `TESSERA_ACCEL=cuda`.
    pub fn from_env() -> Result<Kind, AccelError> {
        match std::env::var("TESSERA_ACCEL") {
            Ok(name) if !name.is_empty() => name.parse(),
            _ => Ok(Kind::Auto),
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Kind::Auto => "auto",
            Kind::Cpu => "cpu",
            Kind::Cuda => "cuda",
        })
    }
}

/// The backend `kind` names. `Cpu` is the host's SIMD units and threads;
/// `Cuda` is GPU 0 for all the work it has kernels for, refused with the
/// reason when there is no GPU, driver or NVRTC; `Auto` is the GPU for
/// the batches where it wins (SHA-256 and SHA3-512 checksums, see
/// [`cuda::Policy::Auto`]) when one opens, and the CPU otherwise.
///
/// A GPU backend is wrapped in [`batch::Batching`], so that the stripes
/// and hashes many client threads ask for at once reach it as a few large
/// batches. `TESSERA_ACCEL_BATCH` overrides that, for measurements and
/// tests: `off` (or `0`) never batches, a number N batches every backend,
/// the CPU's included, with N batches in flight of each class (seals,
/// hashes); `TESSERA_ACCEL_HASH_LANES` sets the hash batches in flight
/// apart. A GPU's default is [`batch::DEFAULT_LANES`] seal batches and
/// [`batch::DEFAULT_HASH_LANES`] hash batches.
pub fn select(kind: Kind) -> Result<Arc<dyn Accelerator>, AccelError> {
    let threads = cpu::default_threads();
    let (backend, gpu): (Arc<dyn Accelerator>, bool) = match kind {
        Kind::Cpu => (Arc::new(cpu::Cpu::new(threads)), false),
        #[cfg(feature = "cuda")]
        Kind::Cuda => (Arc::new(cuda::Cuda::open(cuda::Policy::Always, threads)?), true),
        #[cfg(feature = "cuda")]
        Kind::Auto => match cuda::Cuda::open(cuda::Policy::Auto, threads) {
            Ok(gpu) => (Arc::new(gpu), true),
            Err(_) => (Arc::new(cpu::Cpu::new(threads)), false),
        },
        #[cfg(not(feature = "cuda"))]
        Kind::Cuda => {
            return Err(AccelError::Unavailable {
                name: "cuda".to_string(),
                why: "this build has no CUDA backend (the 'cuda' feature is off); use --accel cpu".to_string(),
            })
        }
        #[cfg(not(feature = "cuda"))]
        Kind::Auto => (Arc::new(cpu::Cpu::new(threads)), false),
    };
    // Seal lanes (and hash lanes) from TESSERA_ACCEL_BATCH, or a GPU's
    // defaults; hash lanes from TESSERA_ACCEL_HASH_LANES above all.
    let batch = lanes_from_env("TESSERA_ACCEL_BATCH")?;
    let lanes = match batch {
        Some(0) => None,
        Some(lanes) => Some(lanes),
        None => gpu.then_some(batch::DEFAULT_LANES),
    };
    let hash_lanes = lanes_from_env("TESSERA_ACCEL_HASH_LANES")?;
    Ok(match lanes {
        Some(lanes) => {
            let hash_lanes = hash_lanes.unwrap_or(if batch.is_some() {
                lanes
            } else {
                batch::DEFAULT_HASH_LANES
            });
            Arc::new(batch::Batching::new(backend, lanes, batch::DEFAULT_MAX_BYTES).with_hash_lanes(hash_lanes))
        }
        None => backend,
    })
}

/// Batches in flight that `variable` names: `None` where it is unset or
/// empty, 0 for `off`.
fn lanes_from_env(variable: &str) -> Result<Option<usize>, AccelError> {
    match std::env::var(variable) {
        Ok(v) if v == "off" => Ok(Some(0)),
        Ok(v) if !v.is_empty() => v.parse().map(Some).map_err(|_| AccelError::Unavailable {
            name: "batch".to_string(),
            why: format!("{variable} is '{v}': use off or a number of batches in flight"),
        }),
        _ => Ok(None),
    }
}

/// Seal jobs over stripes laid end to end in `stripes`, each its K data
/// chunks then room for its M parity chunks (a partial stripe at the end
/// is left out).
pub fn seal_jobs<'a>(shape: &Shape, stripes: &'a mut [u8]) -> Vec<SealJob<'a>> {
    let (width, data) = (shape.width() * shape.chunk_bytes, shape.data * shape.chunk_bytes);
    stripes
        .chunks_exact_mut(width.max(1))
        .map(|stripe| {
            let (data, parity) = stripe.split_at_mut(data);
            SealJob { data, parity }
        })
        .collect()
}

/// Checks that every seal job has K data and M parity chunks of the shape.
fn check_seal_jobs(shape: &Shape, jobs: &[SealJob<'_>]) -> Result<(), AccelError> {
    for (index, job) in jobs.iter().enumerate() {
        for (got, chunks) in [(job.data.len(), shape.data), (job.parity.len(), shape.parity)] {
            let want = chunks * shape.chunk_bytes;
            if got != want {
                return Err(AccelError::WrongSize { index, got, want });
            }
        }
    }
    Ok(())
}

/// Checks that every rebuild job has K+M chunks of the shape and at most
/// M missing, each named once.
fn check_reconstruct_jobs(shape: &Shape, jobs: &[ReconstructJob<'_>]) -> Result<(), AccelError> {
    for (index, job) in jobs.iter().enumerate() {
        if job.chunks.len() != shape.width() {
            return Err(AccelError::WrongSize {
                index,
                got: job.chunks.len(),
                want: shape.width(),
            });
        }
        if let Some(chunk) = job.chunks.iter().find(|c| c.len() != shape.chunk_bytes) {
            return Err(AccelError::WrongSize {
                index,
                got: chunk.len(),
                want: shape.chunk_bytes,
            });
        }
        if job.missing.len() > shape.parity {
            return Err(tessera_ec::EcError::TooManyMissing {
                missing: job.missing.len(),
                parity: shape.parity,
            }
            .into());
        }
    }
    Ok(())
}
