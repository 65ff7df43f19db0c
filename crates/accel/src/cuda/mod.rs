//! The CUDA backend: parity, rebuilt chunks, Merkle leaves and roots on an
//! NVIDIA GPU, through the driver API loaded at run time.
//!
//! Nothing here links against CUDA: `cudarc` opens `libcuda` and `libnvrtc`
//! when [`Cuda::open`] is called, after checking that both are there (the
//! driver's absence would otherwise be a panic), and the kernels in
//! `kernels.cu` are compiled by NVRTC for the GPU found. A machine without
//! a GPU, a driver or NVRTC gets [`AccelError::Unavailable`] with the
//! reason, and `--accel auto` the CPU.
//!
//! # How a batch flows
//!
//! A batch is cut into pieces of at most [`PIECE_BYTES`]; each piece is
//! packed into a pinned host buffer (stripe s, chunk j in slot
//! `s * width + j`, slots rounded up to 16 bytes), copied to the device,
//! coded, hashed (leaves, then one block per stripe for the root) and its
//! outputs copied back, all on one stream. A call holds two staging slots
//! with a stream each and alternates pieces between them, so the next
//! piece is packed and copied while the last one computes. Calls from
//! several threads take different slots (there are [`SLOTS`]).
//!
//! A stripe whose data and parity lie in the page-locked memory this
//! backend lends ([`pinned::Pinned`], [`Accelerator::host_memory`]) is not
//! packed: its data chunks are copied to the device straight from the
//! caller's buffer and its parity straight back into the caller's (chunk
//! sizes that are a multiple of 16, where the slots are the chunks).
//!
//! # What stays on the CPU
//!
//! [`Accelerator::decode`] (a read's byte range of a few chunks: a PCIe
//! round trip costs more than the arithmetic), leaves for checksums the
//! GPU has no kernel for (CRC-32C, XXH3, BLAKE3: parity is still computed
//! here), and under [`Policy::Auto`] every batch whose checksum is cheap on
//! a CPU or which is too small to pay for the copies.
//!
//! # Failure
//!
//! Any error from the driver (a kernel fault, a GPU that fell off the bus)
//! gives the GPU up for the life of the backend: the batch is redone on
//! the CPU, which is safe because nothing is written into the caller's
//! buffers before a piece's stream has finished, and later batches go
//! straight to the CPU. `status` shows the reason.

pub mod bench;
mod choose;
mod encoder;
pub mod pinned;

use crate::cpu::Cpu;
use crate::{AccelError, Accelerator, Leaves, ReconstructJob, SealJob, Shape, Work, WorkCounters};
use cudarc::driver::{result as cu, sys, CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use rayon::prelude::*;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use tessera_checksum::{Algorithm, Digest};
use tessera_ec::Codec;

/// The kernels' source, compiled at run time.
pub const KERNELS: &str = include_str!("kernels.cu");

/// The most bytes of chunk slots one piece of a batch stages (a single
/// stripe larger than this is a piece of its own).
pub const PIECE_BYTES: usize = 256 << 20;

/// Staging slots (a stream and its pinned and device buffers each, grown
/// on first use). A seal or rebuild call of one piece takes one, of
/// several two; a hash call one. The batches in front of the backend
/// (`batch::Batching`: 4 seal batches and 8 hash batches in flight by
/// default, each smaller than a piece) take 16 at most, so they never
/// wait for one.
pub const SLOTS: usize = 16;

/// Under [`Policy::Auto`], batches with fewer data bytes than this run on
/// the CPU: below it, the copies and launches cost more than they save.
pub const AUTO_BATCH_BYTES_MIN: usize = 1 << 20;

/// Rows of a coefficient matrix one `gf_dot` pass computes (ROWS in the kernel).
const KERNEL_ROWS: usize = 8;

/// Slack after every buffer: the kernels' word loads may read up to 15
/// bytes past a chunk, never using them.
const SLACK: usize = 64;

/// Bytes a digest takes in the kernels' output (the widest digest).
const DIGEST_SLOT: usize = 64;

/// Launches of at most this many SHA3-512 messages hash each with a warp
/// (kernels.cu, `sha3_512_warp`), larger ones each with a thread. A warp
/// finishes one message sooner, a thread per message finishes a GPU's
/// worth of them sooner; where they cross was measured with `tessera
/// bench hash --accel cuda` (docs/PERFORMANCE.md). `TESSERA_CUDA_WARP_MAX`
/// overrides it (0: always a thread).
pub const WARP_HASH_MAX: u64 = 2048;

/// How a launch hashes its SHA3-512 messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum HashForm {
    /// One thread a message (every algorithm).
    Thread,
    /// One warp a message, its 25 lanes the state's (SHA3-512 only).
    Warp,
}

/// Which work goes to the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Everything the GPU has kernels for (`--accel cuda`).
    Always,
    /// Only where it wins (`--accel auto`): for a shape the array named
    /// ([`Accelerator::prepare`]), whichever sealed a batch of it faster
    /// when measured (`choose`); otherwise batches of at least
    /// [`AUTO_BATCH_BYTES_MIN`] whose checksum is SHA-256 or SHA3-512,
    /// which a CPU core hashes at 0.2-1.2 GB/s (parity alone, or with a
    /// checksum a core computes at several GB/s, is usually cheaper on the
    /// host's SIMD units than the PCIe round trip).
    Auto,
}

/// The algorithm number the kernels use, if they have one.
fn kernel_algorithm(algorithm: Algorithm) -> Option<i32> {
    match algorithm {
        Algorithm::Sha256 => Some(0),
        Algorithm::Sha3_512 => Some(ALG_SHA3_512),
        _ => None,
    }
}

/// Whether the shared libraries a CUDA backend needs can be loaded, and if
/// not, why. Loading them is all this does: no context is created.
pub fn probe() -> Result<(), String> {
    // SAFETY: these only try to dlopen the libraries by name.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("no NVIDIA driver library (libcuda.so) was found".to_string());
    }
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(
            "the NVRTC library (libnvrtc.so) was not found; install the CUDA toolkit or the \
                    nvidia-cuda-nvrtc wheel and put its lib folder on LD_LIBRARY_PATH"
                .to_string(),
        );
    }
    Ok(())
}

/// Compiles the kernels for compute capability `major.minor` and returns
/// the PTX. Needs only NVRTC, not a GPU (CI checks that they compile).
pub fn compile(major: i32, minor: i32) -> Result<String, AccelError> {
    compile_source(KERNELS, major, minor)
}

/// Compiles `source` (the kernels, or the kernels and more) for
/// `major.minor` with the kernels' options.
fn compile_source(source: &str, major: i32, minor: i32) -> Result<String, AccelError> {
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(unavailable("the NVRTC library (libnvrtc.so) was not found"));
    }
    let options = cudarc::nvrtc::CompileOptions {
        options: vec![
            format!("--gpu-architecture=compute_{major}{minor}"),
            "--std=c++17".to_string(),
            "-default-device".to_string(),
            format!("-DKECCAK_ROT={}", keccak_rotation()),
        ],
        name: Some("tessera_kernels.cu".to_string()),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(source, options)
        .map_err(|e| unavailable(&format!("NVRTC could not compile the kernels: {e:?}")))?;
    Ok(ptx.to_src())
}

/// How the SHA3 kernels rotate the permutation's lanes (kernels.cu,
/// KECCAK_ROT): `TESSERA_CUDA_KECCAK_ROT=1` with multiplies, otherwise
/// with shifts.
pub fn keccak_rotation() -> u32 {
    match std::env::var("TESSERA_CUDA_KECCAK_ROT").as_deref() {
        Ok("1") => 1,
        _ => 0,
    }
}

/// The kernels for `major.minor`, compiled once per process (NVRTC takes
/// about a second; every array opened compiles nothing after the first).
fn compiled(major: i32, minor: i32) -> Result<String, AccelError> {
    static PTX: Mutex<Vec<((i32, i32), String)>> = Mutex::new(Vec::new());
    let mut cache = PTX.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, ptx)) = cache.iter().find(|(arch, _)| *arch == (major, minor)) {
        return Ok(ptx.clone());
    }
    let ptx = compile(major, minor)?;
    cache.push(((major, minor), ptx.clone()));
    Ok(ptx)
}

fn unavailable(why: &str) -> AccelError {
    AccelError::Unavailable {
        name: "cuda".to_string(),
        why: why.to_string(),
    }
}

fn driver(e: cu::DriverError) -> AccelError {
    unavailable(&format!("the CUDA driver failed: {e}"))
}

/// Memory the driver gave: device memory or pinned host memory.
struct Buffers {
    host: *mut u8,
    device: sys::CUdeviceptr,
    bytes: usize,
}

// SAFETY: the pointers are owned by the slot that holds them, and a slot is
// used by one thread at a time (it is taken out of the pool to be used).
unsafe impl Send for Buffers {}

impl Buffers {
    fn new(bytes: usize) -> Result<Buffers, cu::DriverError> {
        let host = unsafe { cu::malloc_host(bytes + SLACK, 0)? } as *mut u8;
        let device = match unsafe { cu::malloc_sync(bytes + SLACK) } {
            Ok(device) => device,
            Err(e) => {
                unsafe { cu::free_host(host as _).ok() };
                return Err(e);
            }
        };
        Ok(Buffers { host, device, bytes })
    }

    fn host(&mut self) -> &mut [u8] {
        // SAFETY: `bytes` were allocated at `host`, and `&mut self` is the only way in.
        unsafe { std::slice::from_raw_parts_mut(self.host, self.bytes) }
    }
}

impl Drop for Buffers {
    fn drop(&mut self) {
        unsafe {
            cu::free_sync(self.device).ok();
            cu::free_host(self.host as _).ok();
        }
    }
}

/// A stream with its staging buffers, grown on demand.
struct Slot {
    stream: Arc<CudaStream>,
    buffers: Option<Buffers>,
}

impl Slot {
    /// Buffers of at least `bytes`.
    fn reserve(&mut self, bytes: usize) -> Result<&mut Buffers, cu::DriverError> {
        if self.buffers.as_ref().is_none_or(|b| b.bytes < bytes) {
            self.buffers = None;
            self.buffers = Some(Buffers::new(bytes.next_power_of_two())?);
        }
        Ok(self.buffers.as_mut().expect("just made"))
    }
}

struct Kernels {
    gf_dot: CudaFunction,
    leaves: CudaFunction,
    roots: CudaFunction,
    digests: CudaFunction,
    leaves_warp: CudaFunction,
    digests_warp: CudaFunction,
}

/// Where a piece's regions lie in its slot's buffers (byte offsets).
#[derive(Clone, Copy, Debug)]
struct Layout {
    stripes: usize,
    width: usize,
    slot: usize,
    chunks: usize,
    params: usize,
    leaves: usize,
    roots: usize,
    end: usize,
}

impl Layout {
    fn new(stripes: usize, width: usize, chunk_bytes: usize, param_words: usize) -> Layout {
        let slot = chunk_bytes.next_multiple_of(16).max(16);
        let chunks = 0;
        let params = chunks + stripes * width * slot;
        let leaves = params + (param_words * 4).next_multiple_of(64);
        let roots = leaves + stripes * width * DIGEST_SLOT;
        let end = roots + stripes * DIGEST_SLOT;
        Layout {
            stripes,
            width,
            slot,
            chunks,
            params,
            leaves,
            roots,
            end,
        }
    }

    fn chunk(&self, stripe: usize, index: usize) -> usize {
        self.chunks + (stripe * self.width + index) * self.slot
    }
}

/// The words `gf_dot` takes: source slots, destination slots, then 8
/// masks per coefficient (all ones where the coefficient's bit is set),
/// the masks starting on a 16-byte boundary.
fn gf_params(sources: &[usize], targets: &[usize], rows: &[u8]) -> Vec<u32> {
    let k = sources.len();
    debug_assert_eq!(rows.len(), k * targets.len());
    let mut words: Vec<u32> = sources.iter().chain(targets).map(|&i| i as u32).collect();
    words.resize((k + targets.len()).next_multiple_of(4), 0);
    for &c in rows {
        words.extend((0..8).map(|b| if c >> b & 1 == 1 { u32::MAX } else { 0 }));
    }
    words
}

/// `slots` as runs of adjacent indexes, (first, count), in the order given.
pub(crate) fn runs(slots: &[usize]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &slot in slots {
        match runs.last_mut() {
            Some((first, count)) if *first + *count == slot => *count += 1,
            _ => runs.push((slot, 1)),
        }
    }
    runs
}

/// Where a stripe copied in place lies: its input's and output's
/// addresses, and the page-locked allocations holding each (their start
/// addresses). A 2D copy may span only one allocation: the driver refuses
/// (`CUDA_ERROR_INVALID_VALUE`) rows whose gaps are not page-locked with
/// them, as seen on an H100.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Direct {
    pub input: usize,
    pub output: usize,
    pub blocks: (usize, usize),
}

/// Stripes of a piece whose copies go together: one packed stripe
/// (`direct` None), or direct stripes in a row, in the same allocations,
/// whose inputs lie `in_stride` bytes apart and outputs `out_stride` apart
/// (one 2D copy each way instead of one copy per stripe; a copy costs
/// microseconds to issue, which for small stripes bounds the rate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Run {
    pub first: usize,
    pub count: usize,
    /// Where the first stripe lies, if it is copied in place.
    pub direct: Option<Direct>,
    pub in_stride: usize,
    pub out_stride: usize,
}

/// The largest pitch a 2D copy is given (the driver's limit is larger).
const PITCH_MAX: usize = 1 << 30;

/// Cuts a piece's stripes into [`Run`]s. `(in_bytes, out_bytes)` are
/// what each copy moves per stripe: a stride below it (overlapping rows)
/// or above [`PITCH_MAX`] ends a run.
pub(crate) fn strided_runs(direct: &[Option<Direct>], (in_bytes, out_bytes): (usize, usize)) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for (s, &d) in direct.iter().enumerate() {
        if let (Some(run), Some(this)) = (runs.last_mut(), d) {
            if let Some(first) = run.direct.filter(|first| first.blocks == this.blocks) {
                let in_stride = this.input.wrapping_sub(first.input);
                let out_stride = this.output.wrapping_sub(first.output);
                let fits = |stride: usize, bytes: usize| (bytes.max(1)..=PITCH_MAX).contains(&stride);
                let next = run.first + run.count == s;
                let strided = if run.count == 1 {
                    fits(in_stride, in_bytes) && fits(out_stride, out_bytes)
                } else {
                    in_stride == run.in_stride * run.count && out_stride == run.out_stride * run.count
                };
                if next && strided {
                    if run.count == 1 {
                        (run.in_stride, run.out_stride) = (in_stride, out_stride);
                    }
                    run.count += 1;
                    continue;
                }
            }
        }
        runs.push(Run {
            first: s,
            count: 1,
            direct: d,
            in_stride: 0,
            out_stride: 0,
        });
    }
    runs
}

/// One end of a 2D copy: an address and the pitch between its rows.
enum Side {
    Host(usize, usize),
    Device(u64, usize),
}

/// Copies `rows` rows of `width` bytes between host and device on `stream`.
///
/// # Safety
/// Every row on each side lies in memory that stays valid until the
/// stream has finished with it; host memory is page-locked.
unsafe fn copy_2d(from: Side, to: Side, width: usize, rows: usize, stream: sys::CUstream) -> Result<(), AccelError> {
    use sys::CUmemorytype::{CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_HOST};
    // Each side as (memory type, host address, device address, pitch).
    let side = |side: Side| match side {
        Side::Host(at, pitch) => (CU_MEMORYTYPE_HOST, at, 0, pitch),
        Side::Device(at, pitch) => (CU_MEMORYTYPE_DEVICE, 0, at, pitch),
    };
    let (src_type, src_host, src_device, src_pitch) = side(from);
    let (dst_type, dst_host, dst_device, dst_pitch) = side(to);
    let copy = sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: src_type,
        srcHost: src_host as *const std::ffi::c_void,
        srcDevice: src_device,
        srcArray: std::ptr::null_mut(),
        srcPitch: src_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: dst_type,
        dstHost: dst_host as *mut std::ffi::c_void,
        dstDevice: dst_device,
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch,
        WidthInBytes: width,
        Height: rows,
    };
    // SAFETY: the caller vouches for the memory; every field is set.
    unsafe { sys::cuMemcpy2DAsync_v2(&copy, stream) }
        .result()
        .map_err(driver)
}

/// Fills `bytes` with a fixed pseudo-random sequence from `seed`
/// (xorshift64), for measurements: random enough that no kernel or cache
/// sees zeros, and the same every run.
pub(crate) fn fill_pseudo_random(bytes: &mut [u8], seed: u64) {
    let mut state = seed | 1;
    for word in bytes.chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        word.copy_from_slice(&state.to_le_bytes()[..word.len()]);
    }
}

/// Splits `count` stripes of `stripe_bytes` into pieces of at most
/// [`PIECE_BYTES`] (at least one stripe each): (first stripe, stripes).
pub(crate) fn pieces(count: usize, stripe_bytes: usize) -> Vec<(usize, usize)> {
    let per = (PIECE_BYTES / stripe_bytes.max(1)).max(1);
    (0..count)
        .step_by(per)
        .map(|first| (first, per.min(count - first)))
        .collect()
}

/// The kernels' number for SHA3-512 (ALG_SHA3_512).
const ALG_SHA3_512: i32 = 1;

/// How to launch a hash kernel of `form` over `count` messages: 128
/// threads a block, a message a thread or a warp.
fn hash_launch(form: HashForm, count: u64) -> LaunchConfig {
    let per_block = match form {
        HashForm::Thread => 128,
        HashForm::Warp => 4,
    };
    LaunchConfig {
        grid_dim: (count.div_ceil(per_block).clamp(1, 65_535) as u32, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The CUDA backend.
pub struct Cuda {
    device: String,
    ctx: Arc<CudaContext>,
    kernels: Kernels,
    policy: Policy,
    slots: Mutex<Vec<Slot>>,
    slot_free: Condvar,
    /// Encoding kernels compiled for a shape (None: NVRTC failed, use gf_dot).
    encoders: Mutex<std::collections::HashMap<(usize, usize), Option<Encoder>>>,
    /// How those kernels are generated.
    tuning: encoder::Tuning,
    cpu: Cpu,
    /// Why the GPU was given up, once it was.
    failed: OnceLock<String>,
    counters: WorkCounters,
    /// Tests: fail the next batch as a lost GPU would.
    inject_failure: std::sync::atomic::AtomicBool,
    /// The page-locked memory lent to callers.
    pinned: Arc<pinned::Pinned>,
    /// Stripes copied straight from and to their callers' memory.
    direct_stripes: std::sync::atomic::AtomicU64,
    /// What `auto` measured and chose, per shape (see `choose`).
    choices: Mutex<std::collections::HashMap<Shape, choose::Choice>>,
    /// Launches of at most this many SHA3-512 messages take a warp each
    /// ([`WARP_HASH_MAX`]).
    warp_max: u64,
}

/// A shape's own encoding kernels, one per group of parity rows.
type Encoder = Arc<Vec<CudaFunction>>;

/// What a batch stages and brings back, per stripe (see [`Cuda::pipeline`]).
struct Plan<'p> {
    shape: &'p Shape,
    /// The generic kernel's words (none with a shape's own kernels).
    params: &'p [u32],
    /// Slots 0..copy_in of each stripe are copied in.
    copy_in: usize,
    /// Slots copied back: one run of adjacent slots where jobs may be
    /// direct (see [`Cuda::pipeline`]).
    outputs: &'p [usize],
    /// The hash kernels' algorithm, when leaves are computed on the GPU.
    algorithm: Option<i32>,
}

/// A piece in flight: its slot and which stripes it holds.
struct Pending {
    slot: Slot,
    layout: Layout,
    first: usize,
}

impl Cuda {
    /// Opens GPU 0: loads the driver, creates a context, compiles the kernels.
    pub fn open(policy: Policy, cpu_threads: usize) -> Result<Cuda, AccelError> {
        probe().map_err(|why| unavailable(&why))?;
        let ctx = CudaContext::new(0).map_err(|e| unavailable(&format!("no usable GPU: {e}")))?;
        // A thread waiting for the GPU sleeps until the driver wakes it;
        // by default it spins on its core (one context, many cores), and
        // the backend's waiting threads took cores from the CPU's share
        // of the work. TESSERA_CUDA_SPIN=1 keeps the spinning, and so does
        // a driver without cuCtxSetFlags (before CUDA 12.1): slower to
        // share, not wrong.
        if std::env::var("TESSERA_CUDA_SPIN").as_deref() != Ok("1") {
            ctx.set_blocking_synchronize().ok();
        }
        let (major, minor) = ctx.compute_capability().map_err(driver)?;
        let ptx = compiled(major, minor)?;
        let module = ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx)).map_err(driver)?;
        let load = |name: &str| module.load_function(name).map_err(driver);
        let kernels = Kernels {
            gf_dot: load("gf_dot")?,
            leaves: load("leaves")?,
            roots: load("roots")?,
            digests: load("digests")?,
            leaves_warp: load("leaves_warp")?,
            digests_warp: load("digests_warp")?,
        };
        let name = ctx.name().map_err(driver)?;
        let mut slots = Vec::with_capacity(SLOTS);
        for _ in 0..SLOTS {
            slots.push(Slot {
                stream: ctx.new_stream().map_err(driver)?,
                buffers: None,
            });
        }
        Ok(Cuda {
            device: format!("{name}, sm_{major}{minor}"),
            pinned: Arc::new(pinned::lender(ctx.clone(), pinned::limit_from_env())),
            direct_stripes: Default::default(),
            choices: Default::default(),
            ctx,
            kernels,
            policy,
            slots: Mutex::new(slots),
            slot_free: Condvar::new(),
            encoders: Mutex::new(Default::default()),
            tuning: encoder::Tuning::from_env(),
            cpu: Cpu::new(cpu_threads),
            failed: OnceLock::new(),
            counters: WorkCounters::default(),
            inject_failure: Default::default(),
            warp_max: std::env::var("TESSERA_CUDA_WARP_MAX")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(WARP_HASH_MAX),
        })
    }

    /// The GPU's name and compute capability.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// Why the GPU was given up, if it was.
    pub fn failure(&self) -> Option<&str> {
        self.failed.get().map(|s| s.as_str())
    }

    /// Makes the next batch fail as a GPU that fell off the bus would (for
    /// tests of the fallback).
    pub fn inject_failure(&self) {
        self.inject_failure.store(true, Ordering::SeqCst);
    }

    /// Bytes of chunks the GPU has coded or hashed.
    pub fn bytes_on_device(&self) -> u64 {
        self.counters.snapshot().bytes_on_device
    }

    /// Stripes copied straight from and to their callers' page-locked
    /// memory, without packing.
    pub fn direct_stripes(&self) -> u64 {
        self.direct_stripes.load(Ordering::Relaxed)
    }

    /// Gives the GPU up after `error`; later work goes to the CPU.
    fn give_up(&self, error: &AccelError) {
        let why = error.to_string();
        if self.failed.set(why.clone()).is_ok() {
            eprintln!("tessera: the GPU failed ({why}); its work goes to the CPU from now on");
        }
    }

    fn take_slot(&self) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(slot) = slots.pop() {
                return slot;
            }
            slots = self.slot_free.wait(slots).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn put_slot(&self, slot: Slot) {
        self.slots.lock().unwrap_or_else(|p| p.into_inner()).push(slot);
        self.slot_free.notify_one();
    }

    /// Gives a call's slots back, draining the streams of pieces an error
    /// left in flight first.
    fn release(&self, in_flight: VecDeque<Pending>, spare: Vec<Slot>) {
        for pending in in_flight {
            pending.slot.stream.synchronize().ok();
            self.put_slot(pending.slot);
        }
        for slot in spare {
            self.put_slot(slot);
        }
    }

    fn check_injected(&self) -> Result<(), AccelError> {
        if self.inject_failure.swap(false, Ordering::SeqCst) {
            return Err(unavailable("injected failure (test)"));
        }
        Ok(())
    }

    fn launch_gf(
        &self,
        stream: &CudaStream,
        device: u64,
        layout: &Layout,
        k: usize,
        rows: usize,
    ) -> Result<(), AccelError> {
        if rows == 0 {
            return Ok(());
        }
        let units = layout.stripes * layout.slot / 16;
        let blocks = units.div_ceil(256).min(65_535) as u32;
        let config = LaunchConfig {
            grid_dim: (blocks, rows.div_ceil(KERNEL_ROWS) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (buffer, params) = (device + layout.chunks as u64, device + layout.params as u64);
        let (width, slot, stripes) = (layout.width as u32, layout.slot as u64, layout.stripes as u64);
        let (k, rows) = (k as u32, rows as u32);
        let mut launch = stream.launch_builder(&self.kernels.gf_dot);
        launch
            .arg(&buffer)
            .arg(&width)
            .arg(&slot)
            .arg(&stripes)
            .arg(&params)
            .arg(&k)
            .arg(&rows);
        // SAFETY: the arguments match the kernel's signature, and every slot
        // it touches lies inside the piece's buffer (Layout).
        unsafe { launch.launch(config) }.map_err(driver)?;
        Ok(())
    }

    /// The shape's own encoding kernels, compiled on first use (about a
    /// second with NVRTC; the array's shape is one, so once per process).
    fn encoder(&self, shape: &Shape, codec: &Codec) -> Option<Encoder> {
        let key = (shape.data, shape.parity);
        let mut encoders = self.encoders.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(found) = encoders.get(&key) {
            return found.clone();
        }
        let (k, m) = key;
        let tuning = self.tuning;
        if k > tuning.data_max {
            return None;
        }
        let made = (|| -> Result<Vec<CudaFunction>, String> {
            let source = encoder::source(k, &codec.encoding_matrix()[k * k..], m, tuning.group);
            let (major, minor) = self.ctx.compute_capability().map_err(|e| e.to_string())?;
            let options = cudarc::nvrtc::CompileOptions {
                options: vec![format!("--gpu-architecture=compute_{major}{minor}")],
                name: Some(format!("tessera_encode_{k}_{m}.cu")),
                ..Default::default()
            };
            let ptx = cudarc::nvrtc::compile_ptx_with_opts(source, options).map_err(|e| format!("{e:?}"))?;
            let module = self.ctx.load_module(ptx).map_err(|e| e.to_string())?;
            (0..encoder::kernels(k, m, tuning.group))
                .map(|g| module.load_function(&format!("encode_{g}")).map_err(|e| e.to_string()))
                .collect()
        })();
        let made = match made {
            Ok(kernels) => Some(Arc::new(kernels)),
            Err(why) => {
                eprintln!("tessera: the {k}+{m} encoding kernels did not compile ({why}); the generic one is used");
                None
            }
        };
        encoders.insert(key, made.clone());
        made
    }

    /// Parity of every stripe of the piece: the shape's own kernels, or
    /// the generic product kernel when they are not there.
    /// (`encoder` from [`Cuda::encoder`]; the generic kernel reads the
    /// staged coefficient words.)
    fn launch_encode(
        &self,
        encoder: Option<&Encoder>,
        stream: &CudaStream,
        device: u64,
        layout: &Layout,
        shape: &Shape,
    ) -> Result<(), AccelError> {
        let Some(kernels) = encoder else {
            return self.launch_gf(stream, device, layout, shape.data, shape.parity);
        };
        let units = layout.stripes * layout.slot / 8;
        let config = LaunchConfig {
            grid_dim: (units.div_ceil(256).min(1 << 20) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (buffer, width, slot, stripes) = (
            device + layout.chunks as u64,
            layout.width as u32,
            layout.slot as u64,
            layout.stripes as u64,
        );
        for kernel in kernels.iter() {
            let mut launch = stream.launch_builder(kernel);
            launch.arg(&buffer).arg(&width).arg(&slot).arg(&stripes);
            // SAFETY: the generated kernels take these four arguments and
            // touch slots 0..K+M of each stripe of the piece.
            unsafe { launch.launch(config) }.map_err(driver)?;
        }
        Ok(())
    }

    /// How a launch of `count` messages of `algorithm` hashes them.
    pub(crate) fn hash_form(&self, algorithm: i32, count: u64) -> HashForm {
        if algorithm == ALG_SHA3_512 && count <= self.warp_max {
            HashForm::Warp
        } else {
            HashForm::Thread
        }
    }

    fn launch_hash(
        &self,
        stream: &CudaStream,
        device: u64,
        layout: &Layout,
        algorithm: i32,
        chunk_bytes: usize,
    ) -> Result<(), AccelError> {
        let count = (layout.stripes * layout.width) as u64;
        let form = self.hash_form(algorithm, count);
        self.launch_leaves(stream, device, layout, algorithm, chunk_bytes, form)?;
        let roots = device + layout.roots as u64;
        let (leaves, width) = (device + layout.leaves as u64, layout.width as u32);
        let config = LaunchConfig {
            grid_dim: (layout.stripes as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = stream.launch_builder(&self.kernels.roots);
        launch.arg(&algorithm).arg(&leaves).arg(&width).arg(&roots);
        // SAFETY: one block per stripe, width <= 256 (the kernel's level array).
        unsafe { launch.launch(config) }.map_err(driver)?;
        Ok(())
    }

    /// The leaf of every chunk of a staged piece, hashed `form`'s way.
    fn launch_leaves(
        &self,
        stream: &CudaStream,
        device: u64,
        layout: &Layout,
        algorithm: i32,
        chunk_bytes: usize,
        form: HashForm,
    ) -> Result<(), AccelError> {
        let count = (layout.stripes * layout.width) as u64;
        let (buffer, leaves) = (device + layout.chunks as u64, device + layout.leaves as u64);
        let (width, slot, bytes) = (layout.width as u32, layout.slot as u64, chunk_bytes as u64);
        let mut launch = stream.launch_builder(match form {
            HashForm::Thread => &self.kernels.leaves,
            HashForm::Warp => &self.kernels.leaves_warp,
        });
        if form == HashForm::Thread {
            launch.arg(&algorithm);
        }
        launch
            .arg(&buffer)
            .arg(&width)
            .arg(&slot)
            .arg(&bytes)
            .arg(&count)
            .arg(&leaves);
        // SAFETY: as in launch_gf; leaves has a 64-byte slot per chunk,
        // and the warp kernel is launched only for SHA3-512 (hash_form).
        unsafe { launch.launch(hash_launch(form, count)) }.map_err(driver)?;
        Ok(())
    }

    /// Waits for a piece staged in `slot` and reads its leaves (if hashed on the GPU).
    fn finish(
        &self,
        slot: &mut Slot,
        layout: Layout,
        hashed: bool,
        algorithm: Algorithm,
    ) -> Result<Vec<Option<Leaves>>, AccelError> {
        slot.stream.synchronize().map_err(driver)?;
        let digest_bytes = algorithm.digest_bytes();
        let host = slot.buffers.as_mut().expect("staged").host();
        Ok((0..layout.stripes)
            .map(|s| {
                hashed.then(|| {
                    let leaf = |i: usize| {
                        let at = layout.leaves + (s * layout.width + i) * DIGEST_SLOT;
                        Digest::from_bytes(&host[at..at + digest_bytes])
                    };
                    let at = layout.roots + s * DIGEST_SLOT;
                    Leaves {
                        leaves: (0..layout.width).map(leaf).collect(),
                        root: Digest::from_bytes(&host[at..at + digest_bytes]),
                    }
                })
            })
            .collect())
    }

    /// Carries a batch of stripes through the GPU in pieces, two in flight:
    /// `pack` fills a stripe's slots from its job, slots `0..copy_in` of
    /// each stripe are copied in, `code` launches the arithmetic, the
    /// leaves and roots are computed when `plan.algorithm` says so, slots
    /// `plan.outputs` come back, and `unpack` hands them (and the leaves,
    /// if any) to the job.
    ///
    /// A job for which `direct` gives (input, output) addresses is not
    /// packed: slots `0..copy_in` are copied from `input` (as many bytes,
    /// laid end to end) and the one run of output slots into `output`, by
    /// the copy engines; `unpack` is told so (its `bool`) and takes only
    /// the leaves. `direct` answers only for memory the copy engines read
    /// in place (page-locked) and only when the slots are the chunks
    /// (`chunk_bytes` a multiple of 16) and the outputs one run.
    ///
    /// Packed jobs get nothing before their piece's stream has finished;
    /// direct ones get parts of their outputs while it runs. Either way a
    /// call that fails leaves the jobs' outputs unspecified (and no copy
    /// in flight: every stream is drained before the call returns), so the
    /// batch can be redone elsewhere.
    fn pipeline<J: Send + Sync, T: Send>(
        &self,
        plan: &Plan<'_>,
        jobs: &mut [J],
        pack: impl Fn(&J, &mut [u8]) + Sync,
        direct: impl Fn(&J) -> Option<Direct>,
        code: impl Fn(&CudaStream, u64, &Layout) -> Result<(), AccelError>,
        unpack: impl Fn(&mut J, &[u8], Option<Leaves>, bool) -> T + Sync,
    ) -> Result<Vec<T>, AccelError> {
        self.check_injected()?;
        let (width, c) = (plan.shape.width(), plan.shape.chunk_bytes);
        let hashed = plan.algorithm.is_some();
        // One copy per run of adjacent output slots (a stripe's parity is
        // one run): a copy costs microseconds to issue whatever its size.
        let outputs = runs(plan.outputs);
        // Where each job's buffers are the slots themselves, their addresses.
        let direct: Vec<Option<Direct>> = if c % 16 == 0 && outputs.len() == 1 {
            jobs.iter().map(direct).collect()
        } else {
            vec![None; jobs.len()]
        };
        let direct = &direct;
        let mut results = Vec::with_capacity(jobs.len());
        let mut in_flight: VecDeque<Pending> = VecDeque::new();
        let mut spare: Vec<Slot> = Vec::new();
        let complete = |done: &mut Pending, jobs: &mut [J], results: &mut Vec<T>| -> Result<(), AccelError> {
            let leaves = self.finish(&mut done.slot, done.layout, hashed, plan.shape.checksum)?;
            let layout = done.layout;
            let stripe_bytes = width * layout.slot;
            let host = done.slot.buffers.as_mut().expect("staged").host();
            let mut unpacked = Vec::with_capacity(layout.stripes);
            let range = done.first..done.first + layout.stripes;
            self.cpu.install(|| {
                jobs[range.clone()]
                    .par_iter_mut()
                    .zip(host[..layout.stripes * stripe_bytes].par_chunks(stripe_bytes))
                    .zip(leaves)
                    .zip(&direct[range])
                    .map(|(((job, slots), leaves), direct)| unpack(job, slots, leaves, direct.is_some()))
                    .collect_into_vec(&mut unpacked)
            });
            results.extend(unpacked);
            Ok(())
        };
        let outcome = (|| -> Result<(), AccelError> {
            for (first, stripes) in pieces(jobs.len(), width * c.next_multiple_of(16)) {
                if in_flight.len() == 2 {
                    let mut done = in_flight.pop_front().expect("two in flight");
                    complete(&mut done, jobs, &mut results)?;
                    spare.push(done.slot);
                }
                let mut slot = spare.pop().unwrap_or_else(|| self.take_slot());
                let layout = Layout::new(stripes, width, c, plan.params.len());
                self.ctx.bind_to_thread().map_err(driver)?;
                let stream = slot.stream.clone();
                if let Err(e) = slot.reserve(layout.end) {
                    spare.push(slot);
                    return Err(driver(e));
                }
                let buffers = slot.buffers.as_mut().expect("reserved");
                let device = buffers.device;
                let host = buffers.host();
                let stripe_bytes = width * layout.slot;
                let packing = &jobs[first..first + stripes];
                let piece_direct = &direct[first..first + stripes];
                self.cpu.install(|| {
                    host[..stripes * stripe_bytes]
                        .par_chunks_mut(stripe_bytes)
                        .zip(packing.par_iter())
                        .zip(piece_direct)
                        .filter(|(_, direct)| direct.is_none())
                        .for_each(|((slots, job), _)| pack(job, slots))
                });
                let any_direct = piece_direct.iter().any(Option::is_some);
                let in_bytes = plan.copy_in * layout.slot;
                let out_bytes = outputs.first().map_or(0, |&(_, count)| count * layout.slot);
                // Cut once: the copies in and out go by the same runs.
                let runs = strided_runs(piece_direct, (in_bytes, out_bytes));
                for (w, word) in plan.params.iter().enumerate() {
                    host[layout.params + 4 * w..][..4].copy_from_slice(&word.to_le_bytes());
                }
                let cs = stream.cu_stream();
                let mut staged = || -> Result<(), AccelError> {
                    // SAFETY (copies): every range lies inside the slot's
                    // buffers, which outlive the stream's use of them (a
                    // slot goes back only after its stream is synchronized).
                    unsafe {
                        if !plan.params.is_empty() {
                            let words = &host[layout.params..layout.leaves];
                            cu::memcpy_htod_async(device + layout.params as u64, words, cs).map_err(driver)?;
                        }
                        let stripe_slots = width * layout.slot;
                        if plan.copy_in == width && !any_direct {
                            cu::memcpy_htod_async(device, &host[..layout.params], cs).map_err(driver)?;
                        } else {
                            let bytes = in_bytes;
                            for run in &runs {
                                let at = layout.chunk(run.first, 0);
                                match run.direct.map(|d| d.input) {
                                    None => {
                                        cu::memcpy_htod_async(device + at as u64, &host[at..at + bytes], cs)
                                            .map_err(driver)?;
                                    }
                                    // SAFETY: `direct` named each job's input, `bytes`
                                    // long (slots are chunks), borrowed for this call;
                                    // a run's inputs lie `stride` apart.
                                    Some(input) if run.count == 1 => {
                                        let from = std::slice::from_raw_parts(input as *const u8, bytes);
                                        cu::memcpy_htod_async(device + at as u64, from, cs).map_err(driver)?;
                                    }
                                    Some(input) => copy_2d(
                                        Side::Host(input, run.in_stride),
                                        Side::Device(device + at as u64, stripe_slots),
                                        bytes,
                                        run.count,
                                        cs,
                                    )?,
                                }
                            }
                        }
                    }
                    code(&stream, device, &layout)?;
                    if let Some(algorithm) = plan.algorithm {
                        self.launch_hash(&stream, device, &layout, algorithm, c)?;
                    }
                    unsafe {
                        let stripe_slots = width * layout.slot;
                        for run in &runs {
                            for &(j, count) in &outputs {
                                let at = layout.chunk(run.first, j);
                                let bytes = count * layout.slot;
                                match run.direct.map(|d| d.output) {
                                    None => cu::memcpy_dtoh_async(&mut host[at..at + bytes], device + at as u64, cs)
                                        .map_err(driver)?,
                                    // SAFETY: as for the input; the output is one run.
                                    Some(output) if run.count == 1 => {
                                        let into = std::slice::from_raw_parts_mut(output as *mut u8, bytes);
                                        cu::memcpy_dtoh_async(into, device + at as u64, cs).map_err(driver)?;
                                    }
                                    Some(output) => copy_2d(
                                        Side::Device(device + at as u64, stripe_slots),
                                        Side::Host(output, run.out_stride),
                                        bytes,
                                        run.count,
                                        cs,
                                    )?,
                                }
                            }
                        }
                        if hashed {
                            let digests = &mut host[layout.leaves..layout.end];
                            cu::memcpy_dtoh_async(digests, device + layout.leaves as u64, cs).map_err(driver)?;
                        }
                    }
                    Ok(())
                };
                let staged = staged();
                in_flight.push_back(Pending { slot, layout, first });
                staged?;
            }
            while let Some(mut done) = in_flight.pop_front() {
                complete(&mut done, jobs, &mut results)?;
                spare.push(done.slot);
            }
            Ok(())
        })();
        self.release(in_flight, spare);
        outcome?;
        self.counters.on_device(jobs.len() * width * c);
        let direct_stripes = direct.iter().filter(|d| d.is_some()).count();
        self.direct_stripes.fetch_add(direct_stripes as u64, Ordering::Relaxed);
        Ok(results)
    }

    /// Computes the parity of each job on the GPU, and no leaves (for
    /// `bench ec`: the erasure code alone, host memory in and out).
    pub fn encode(&self, shape: &Shape, jobs: &mut [SealJob<'_>]) -> Result<(), AccelError> {
        crate::check_seal_jobs(shape, jobs)?;
        self.seal_gpu(shape, jobs, false).map(|_| ())
    }

    /// Seals on the GPU, with leaves when `hash` (computed on the GPU for
    /// SHA-256 and SHA3-512, on the CPU otherwise).
    fn seal_gpu(&self, shape: &Shape, jobs: &mut [SealJob<'_>], hash: bool) -> Result<Vec<Leaves>, AccelError> {
        let codec = self.cpu.codec(shape)?;
        let (k, m, c) = (shape.data, shape.parity, shape.chunk_bytes);
        let encoder = self.encoder(shape, &codec);
        // The generic kernel's coefficients, needed only without the shape's own kernels.
        let params = match encoder {
            Some(_) => Vec::new(),
            None => gf_params(
                &(0..k).collect::<Vec<_>>(),
                &(k..k + m).collect::<Vec<_>>(),
                &codec.encoding_matrix()[k * k..],
            ),
        };
        let outputs: Vec<usize> = (k..k + m).collect();
        let plan = Plan {
            shape,
            params: &params,
            copy_in: k,
            outputs: &outputs,
            algorithm: kernel_algorithm(shape.checksum).filter(|_| hash),
        };
        let pack = |job: &SealJob<'_>, slots: &mut [u8]| {
            let slot = slots.len() / shape.width();
            for (j, chunk) in job.data.chunks(c).enumerate() {
                slots[j * slot..][..c].copy_from_slice(chunk);
            }
        };
        let code = |stream: &CudaStream, device: u64, layout: &Layout| {
            self.launch_encode(encoder.as_ref(), stream, device, layout, shape)
        };
        // Stripes whose data and parity are in the memory this backend
        // lends go straight from and to it.
        let direct = |job: &SealJob<'_>| {
            Some(Direct {
                input: job.data.as_ptr() as usize,
                output: job.parity.as_ptr() as usize,
                blocks: (self.pinned.block(job.data)?, self.pinned.block(job.parity)?),
            })
        };
        let unpack = |job: &mut SealJob<'_>, slots: &[u8], leaves: Option<Leaves>, direct: bool| {
            let slot = slots.len() / shape.width();
            if !direct {
                for (p, chunk) in job.parity.chunks_mut(c).enumerate() {
                    chunk.copy_from_slice(&slots[(k + p) * slot..][..c]);
                }
            }
            hash.then(|| {
                leaves.unwrap_or_else(|| {
                    let chunks: Vec<&[u8]> = job.data.chunks(c).chain(job.parity.chunks(c)).collect();
                    crate::cpu::leaves(shape.checksum, &chunks, false)
                })
            })
        };
        let sealed = self.pipeline(&plan, jobs, pack, direct, code, unpack)?;
        Ok(sealed.into_iter().flatten().collect())
    }

    /// Rebuilds on the GPU; jobs are taken in runs with the same missing chunks.
    fn reconstruct_gpu(&self, shape: &Shape, jobs: &mut [ReconstructJob<'_>]) -> Result<Vec<Leaves>, AccelError> {
        let codec = self.cpu.codec(shape)?;
        let mut results = Vec::with_capacity(jobs.len());
        let mut start = 0;
        while start < jobs.len() {
            let missing = jobs[start].missing.clone();
            let end = start + jobs[start..].iter().take_while(|j| j.missing == missing).count();
            results.extend(self.reconstruct_run(&codec, shape, &mut jobs[start..end], &missing)?);
            start = end;
        }
        Ok(results)
    }

    /// Rebuilds `missing` in every job (all of them lack the same chunks).
    fn reconstruct_run(
        &self,
        codec: &Codec,
        shape: &Shape,
        jobs: &mut [ReconstructJob<'_>],
        missing: &[usize],
    ) -> Result<Vec<Leaves>, AccelError> {
        let (sources, rows) = if missing.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            codec.decode_matrix(missing)?
        };
        // The decode matrix's rows are for the missing chunks in ascending order.
        let mut targets = missing.to_vec();
        targets.sort_unstable();
        let params = gf_params(&sources, &targets, &rows);
        let c = shape.chunk_bytes;
        let plan = Plan {
            shape,
            params: &params,
            copy_in: shape.width(),
            outputs: missing,
            algorithm: kernel_algorithm(shape.checksum),
        };
        let pack = |job: &ReconstructJob<'_>, slots: &mut [u8]| {
            let slot = slots.len() / shape.width();
            for (j, chunk) in job.chunks.iter().enumerate() {
                if !missing.contains(&j) {
                    slots[j * slot..][..c].copy_from_slice(chunk);
                }
            }
        };
        let code = |stream: &CudaStream, device: u64, layout: &Layout| {
            self.launch_gf(stream, device, layout, sources.len(), targets.len())
        };
        let unpack = |job: &mut ReconstructJob<'_>, slots: &[u8], leaves: Option<Leaves>, _direct: bool| {
            let slot = slots.len() / shape.width();
            for &j in missing {
                job.chunks[j].copy_from_slice(&slots[j * slot..][..c]);
            }
            leaves.unwrap_or_else(|| {
                let chunks: Vec<&[u8]> = job.chunks.iter().map(|c| &**c).collect();
                crate::cpu::leaves(shape.checksum, &chunks, false)
            })
        };
        // A rebuild's chunks are separate buffers: always packed.
        self.pipeline(&plan, jobs, pack, |_| None, code, unpack)
    }

    /// Hashes on the GPU.
    fn hash_gpu(&self, algorithm: i32, digest_bytes: usize, inputs: &[&[u8]]) -> Result<Vec<Digest>, AccelError> {
        self.check_injected()?;
        let mut digests = Vec::with_capacity(inputs.len());
        let mut slot = self.take_slot();
        let outcome = (|| -> Result<(), AccelError> {
            let mut start = 0;
            while start < inputs.len() {
                // A piece: inputs up to PIECE_BYTES (at least one).
                let mut bytes = 0;
                let mut end = start;
                while end < inputs.len() && (end == start || bytes + inputs[end].len() + 16 <= PIECE_BYTES) {
                    bytes += inputs[end].len().next_multiple_of(16);
                    end += 1;
                }
                let count = end - start;
                let tables = bytes.next_multiple_of(64);
                let out = tables + count * 16;
                let total = out + count * DIGEST_SLOT;
                self.ctx.bind_to_thread().map_err(driver)?;
                let stream = slot.stream.clone();
                let buffers = slot.reserve(total).map_err(driver)?;
                let device = buffers.device;
                let host = buffers.host();
                let mut at = 0;
                for (i, input) in inputs[start..end].iter().enumerate() {
                    host[at..at + input.len()].copy_from_slice(input);
                    host[tables + 8 * i..][..8].copy_from_slice(&(at as u64).to_le_bytes());
                    host[tables + 8 * (count + i)..][..8].copy_from_slice(&(input.len() as u64).to_le_bytes());
                    at += input.len().next_multiple_of(16);
                }
                let cs = stream.cu_stream();
                unsafe { cu::memcpy_htod_async(device, &host[..out], cs) }.map_err(driver)?;
                let form = self.hash_form(algorithm, count as u64);
                let config = hash_launch(form, count as u64);
                let (offsets, lengths, output, n) = (
                    device + tables as u64,
                    device + (tables + 8 * count) as u64,
                    device + out as u64,
                    count as u64,
                );
                let mut launch = stream.launch_builder(match form {
                    HashForm::Thread => &self.kernels.digests,
                    HashForm::Warp => &self.kernels.digests_warp,
                });
                if form == HashForm::Thread {
                    launch.arg(&algorithm);
                }
                launch.arg(&device).arg(&offsets).arg(&lengths).arg(&n).arg(&output);
                // SAFETY: the tables name ranges inside the staged buffer.
                unsafe { launch.launch(config) }.map_err(driver)?;
                unsafe { cu::memcpy_dtoh_async(&mut host[out..total], output, cs) }.map_err(driver)?;
                stream.synchronize().map_err(driver)?;
                let host = slot.buffers.as_mut().expect("staged").host();
                digests.extend((0..count).map(|i| Digest::from_bytes(&host[out + i * DIGEST_SLOT..][..digest_bytes])));
                start = end;
            }
            Ok(())
        })();
        slot.stream.synchronize().ok();
        self.put_slot(slot);
        outcome?;
        self.counters.on_device(inputs.iter().map(|i| i.len()).sum());
        Ok(digests)
    }
}

impl Accelerator for Cuda {
    fn name(&self) -> &str {
        "cuda"
    }

    fn detail(&self) -> String {
        match self.failure() {
            Some(why) => format!("{}; failed, CPU in use: {why}", self.device),
            None => {
                use crate::HostMemory;
                let (buffers, bytes) = self.pinned.lent();
                let lent = format!(
                    "{buffers} page-locked buffers lent ({} MiB), {} stripes copied in place; \
                     SHA3-512 a warp a message in launches of up to {}",
                    bytes >> 20,
                    self.direct_stripes(),
                    self.warp_max
                );
                match self.policy {
                    Policy::Always => format!("{}; {lent}", self.device),
                    Policy::Auto => match self.choices_made() {
                        made if made.is_empty() => {
                            format!("{}; auto: SHA-256/SHA3-512 batches only; {lent}", self.device)
                        }
                        made => format!("{}; auto: {made}; {lent}", self.device),
                    },
                }
            }
        }
    }

    fn seal(&self, shape: &Shape, jobs: &mut [SealJob<'_>]) -> Result<Vec<Leaves>, AccelError> {
        crate::check_seal_jobs(shape, jobs)?;
        let bytes = jobs.len() * shape.data * shape.chunk_bytes;
        if shape.width() <= 256 && self.wants(shape.checksum, Some(shape), bytes) {
            match self.seal_gpu(shape, jobs, true) {
                Ok(leaves) => {
                    self.counters.sealed(jobs.len(), bytes);
                    return Ok(leaves);
                }
                Err(AccelError::Codec(e)) => return Err(e.into()),
                Err(e) => self.give_up(&e),
            }
        }
        let result = self.cpu.seal(shape, jobs);
        self.counters.sealed(jobs.len(), bytes);
        result
    }

    fn reconstruct(&self, shape: &Shape, jobs: &mut [ReconstructJob<'_>]) -> Result<Vec<Leaves>, AccelError> {
        crate::check_reconstruct_jobs(shape, jobs)?;
        let bytes = jobs.len() * shape.width() * shape.chunk_bytes;
        if shape.width() <= 256 && self.wants(shape.checksum, Some(shape), bytes) {
            match self.reconstruct_gpu(shape, jobs) {
                Ok(leaves) => {
                    self.counters.reconstructed(jobs.len(), bytes);
                    return Ok(leaves);
                }
                Err(AccelError::Codec(e)) => return Err(e.into()),
                Err(e) => self.give_up(&e),
            }
        }
        let result = self.cpu.reconstruct(shape, jobs);
        self.counters.reconstructed(jobs.len(), bytes);
        result
    }

    fn decode(&self, shape: &Shape, jobs: &mut [ReconstructJob<'_>]) -> Result<(), AccelError> {
        self.cpu.decode(shape, jobs)
    }

    fn hash(&self, algorithm: Algorithm, inputs: &[&[u8]]) -> Vec<Digest> {
        let bytes: usize = inputs.iter().map(|i| i.len()).sum();
        if let Some(number) = kernel_algorithm(algorithm) {
            if self.wants(algorithm, None, bytes) {
                match self.hash_gpu(number, algorithm.digest_bytes(), inputs) {
                    Ok(digests) => {
                        self.counters.hashed(inputs.len(), bytes);
                        return digests;
                    }
                    Err(e) => self.give_up(&e),
                }
            }
        }
        let digests = self.cpu.hash(algorithm, inputs);
        self.counters.hashed(inputs.len(), bytes);
        digests
    }

    fn work(&self) -> Work {
        self.counters.snapshot()
    }

    fn host_memory(&self) -> Option<Arc<dyn crate::HostMemory>> {
        self.uses_gpu()
            .then(|| self.pinned.clone() as Arc<dyn crate::HostMemory>)
    }

    fn prepare(&self, shape: &Shape) {
        self.choose(shape);
    }
}

#[cfg(test)]
mod tests;
