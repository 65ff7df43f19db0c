//! Measurements of the GPU for `tessera bench ec|hash --accel cuda`: the
//! PCIe link (pinned buffers, both ways), the kernels on data already in
//! device memory (timed with CUDA events), and the backend end to end
//! (host memory in, host memory out, through `encode` or `reconstruct`,
//! timed by the wall clock), all in one run.

use super::*;
use std::time::{Duration, Instant};

/// What one measurement found, in GB/s (10^9 bytes per second).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Figures {
    pub device: String,
    /// Host to device, pinned memory.
    pub host_to_device_gbps: f64,
    /// Device to host, pinned memory.
    pub device_to_host_gbps: f64,
    /// The kernels alone, on data in device memory (bytes of input: data
    /// chunks for encoding, all chunks for hashing).
    pub resident_gbps: f64,
    /// The backend's call, from the caller's memory back to it (pageable
    /// memory, which the backend packs into its staging buffers).
    pub end_to_end_gbps: f64,
    /// The same, from and to the page-locked memory the backend lends
    /// (`HostMemory`), which it copies without packing (encoding only:
    /// a rebuild's chunks are always packed).
    pub end_to_end_pinned_gbps: Option<f64>,
    /// Bytes of input per timed batch.
    pub batch_bytes: usize,
}

/// What to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    /// Parity of K data chunks per stripe.
    Encode,
    /// Merkle leaves and root of all K+M chunks per stripe.
    Merkle(Algorithm),
}

struct Events {
    start: cudarc::driver::CudaEvent,
    end: cudarc::driver::CudaEvent,
}

impl Events {
    fn new(ctx: &Arc<CudaContext>) -> Result<Events, AccelError> {
        Ok(Events {
            start: ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(driver)?,
            end: ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(driver)?,
        })
    }

    /// Median seconds of `rounds` runs of `work` on `stream`, each timed by events.
    fn time(
        &self,
        stream: &CudaStream,
        rounds: usize,
        mut work: impl FnMut() -> Result<(), AccelError>,
    ) -> Result<f64, AccelError> {
        work()?; // warm up
        let mut seconds = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            self.start.record(stream).map_err(driver)?;
            work()?;
            self.end.record(stream).map_err(driver)?;
            self.end.synchronize().map_err(driver)?;
            seconds.push(f64::from(self.start.elapsed_ms(&self.end).map_err(driver)?) / 1e3);
        }
        seconds.sort_by(f64::total_cmp);
        Ok(seconds[seconds.len() / 2])
    }
}

/// Measures `work` on stripes of `shape` (`shape.checksum` is ignored for
/// [`Work::Encode`]), with batches of about `batch_bytes` of input, for at
/// least `seconds` end to end.
pub fn run(gpu: &Cuda, shape: &Shape, work: Work, batch_bytes: usize, seconds: f64) -> Result<Figures, AccelError> {
    let (k, c) = (shape.data, shape.chunk_bytes);
    let width = shape.width();
    if width > 256 {
        return Err(AccelError::WrongSize {
            index: 0,
            got: width,
            want: 256,
        });
    }
    let input_per_stripe = match work {
        Work::Encode => k * c,
        Work::Merkle(_) => width * c,
    };
    let stripes = (batch_bytes / input_per_stripe).max(1);
    let batch = stripes * input_per_stripe;
    let random = |bytes: &mut [u8]| fill_pseudo_random(bytes, 0x9e37_79b9_7f4a_7c15);

    // The link and the kernels, on one slot's buffers.
    gpu.ctx.bind_to_thread().map_err(driver)?;
    let mut slot = gpu.take_slot();
    let measured = (|| -> Result<(f64, f64, f64), AccelError> {
        let algorithm = match work {
            Work::Encode => None,
            Work::Merkle(a) => Some(
                kernel_algorithm(a)
                    .ok_or_else(|| unavailable(&format!("the GPU has no kernel for {a}; use sha256 or sha3-512")))?,
            ),
        };
        let codec = gpu.cpu.codec(shape)?;
        let encoder = gpu.encoder(shape, &codec);
        let params = gf_params(
            &(0..k).collect::<Vec<_>>(),
            &(k..width).collect::<Vec<_>>(),
            &codec.encoding_matrix()[k * k..],
        );
        let layout = Layout::new(stripes, width, c, params.len());
        let stream = slot.stream.clone();
        let buffers = slot.reserve(layout.end).map_err(driver)?;
        let device = buffers.device;
        let host = buffers.host();
        random(&mut host[..layout.params]);
        for (w, word) in params.iter().enumerate() {
            host[layout.params + 4 * w..][..4].copy_from_slice(&word.to_le_bytes());
        }
        let events = Events::new(&gpu.ctx)?;
        let cs = stream.cu_stream();
        let link = layout.params;
        let up = events.time(&stream, 5, || unsafe {
            cu::memcpy_htod_async(device, &host[..link], cs).map_err(driver)
        })?;
        let host = slot.buffers.as_mut().expect("reserved").host();
        let down = events.time(&stream, 5, || unsafe {
            cu::memcpy_dtoh_async(&mut host[..link], device, cs).map_err(driver)
        })?;
        unsafe { cu::memcpy_htod_async(device, &host[..layout.leaves], cs) }.map_err(driver)?;
        let resident = events.time(&stream, 9, || match algorithm {
            None => gpu.launch_encode(encoder.as_ref(), &stream, device, &layout, shape),
            Some(algorithm) => gpu.launch_hash(&stream, device, &layout, algorithm, c),
        })?;
        Ok((
            link as f64 / up / 1e9,
            link as f64 / down / 1e9,
            batch as f64 / resident / 1e9,
        ))
    })();
    slot.stream.synchronize().ok();
    gpu.put_slot(slot);
    let (host_to_device_gbps, device_to_host_gbps, resident_gbps) = measured?;

    // End to end: the backend's own calls on pageable host memory, then
    // (encoding) on memory it lends.
    let mut data = vec![0u8; stripes * width * c];
    random(&mut data);
    let end_to_end_gbps = end_to_end(gpu, shape, work, &mut data, seconds)?;
    let end_to_end_pinned_gbps = match work {
        Work::Encode => {
            use crate::HostMemory;
            let bytes = data.len();
            let lent = gpu
                .pinned
                .alloc(bytes)
                .ok_or_else(|| unavailable("the GPU lent no page-locked memory for the batch"))?;
            // SAFETY: `bytes` lent at `lent`, ours until freed below.
            let pinned = unsafe { std::slice::from_raw_parts_mut(lent.as_ptr(), bytes) };
            pinned.copy_from_slice(&data);
            let before = gpu.direct_stripes();
            let measured = end_to_end(gpu, shape, work, pinned, seconds);
            let direct = gpu.direct_stripes() - before;
            // SAFETY: as lent, and `pinned` is not used after this.
            unsafe { gpu.pinned.free(lent, bytes) };
            let measured = measured?;
            if direct == 0 {
                return Err(unavailable("the batch in lent memory was packed, not copied in place"));
            }
            Some(measured)
        }
        Work::Merkle(_) => None,
    };
    Ok(Figures {
        device: gpu.device().to_string(),
        host_to_device_gbps,
        device_to_host_gbps,
        resident_gbps,
        end_to_end_gbps,
        end_to_end_pinned_gbps,
        batch_bytes: batch,
    })
}

/// GB/s of input through the backend's own calls on `data` (stripes of
/// K+M chunks laid end to end), for at least `seconds` and three rounds.
fn end_to_end(gpu: &Cuda, shape: &Shape, work: Work, data: &mut [u8], seconds: f64) -> Result<f64, AccelError> {
    let (k, c, width) = (shape.data, shape.chunk_bytes, shape.width());
    let stripes = data.len() / (width * c);
    let batch = stripes
        * match work {
            Work::Encode => k * c,
            Work::Merkle(_) => width * c,
        };
    let start = Instant::now();
    let mut rounds = 0u32;
    while rounds < 3 || start.elapsed() < Duration::from_secs_f64(seconds) {
        match work {
            Work::Encode => {
                gpu.encode(shape, &mut crate::seal_jobs(shape, data))?;
            }
            Work::Merkle(algorithm) => {
                let shape = Shape {
                    checksum: algorithm,
                    ..*shape
                };
                let mut jobs: Vec<ReconstructJob> = data
                    .chunks_mut(width * c)
                    .map(|stripe| ReconstructJob {
                        chunks: stripe.chunks_mut(c).collect(),
                        missing: Vec::new(),
                    })
                    .collect();
                gpu.reconstruct_gpu(&shape, &mut jobs)?;
            }
        }
        rounds += 1;
    }
    Ok(batch as f64 * f64::from(rounds) / start.elapsed().as_secs_f64() / 1e9)
}

/// The probe kernels (probes.cu), compiled after the kernels.
const PROBES: &str = include_str!("probes.cu");

/// What the GPU can issue, and what SHA3 can do at most with the
/// kernels' permutation ([`ceiling`]).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Ceiling {
    pub multiprocessors: u32,
    /// The rated (boost) SM clock; under load it may run slower.
    pub clock_mhz: f64,
    /// Instructions per multiprocessor per clock at the rated clock:
    /// three-input XOR (LOP3), funnel shift (SHF), 32-bit multiply-add.
    pub lop3_per_sm_clock: f64,
    pub shf_per_sm_clock: f64,
    pub imad_per_sm_clock: f64,
    /// Keccak-f[1600] on registers, permutations per second, rotating
    /// with shifts and with multiplies.
    pub keccak_shifts_per_s: f64,
    pub keccak_multiplies_per_s: f64,
    /// The rotation the hash kernels were compiled with (KECCAK_ROT).
    pub kernels_rotation: u32,
}

impl Ceiling {
    /// SHA3-512 input a permutation rate stands for (72-byte blocks), GB/s.
    pub fn sha3_512_gbps(permutations_per_s: f64) -> f64 {
        permutations_per_s * 72.0 / 1e9
    }
}

/// Measures the GPU's issue rates and the permutation's rate in
/// registers, each the median of five launches timed by events.
pub fn ceiling(gpu: &Cuda) -> Result<Ceiling, AccelError> {
    use sys::CUdevice_attribute::{CU_DEVICE_ATTRIBUTE_CLOCK_RATE, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT};
    let ctx = &gpu.ctx;
    ctx.bind_to_thread().map_err(driver)?;
    let (major, minor) = ctx.compute_capability().map_err(driver)?;
    let ptx = compile_source(&format!("{KERNELS}\n{PROBES}"), major, minor)?;
    let module = ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx)).map_err(driver)?;
    let sms = ctx
        .attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(driver)? as u32;
    let clock_hz = f64::from(ctx.attribute(CU_DEVICE_ATTRIBUTE_CLOCK_RATE).map_err(driver)?) * 1e3;
    let stream = ctx.new_stream().map_err(driver)?;
    let events = Events::new(ctx)?;
    // 16 blocks of 128 threads per multiprocessor: as many threads as one
    // holds, so that every scheduler has warps to issue from.
    let config = LaunchConfig {
        grid_dim: (sms * 16, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    let threads = u64::from(sms) * 16 * 128;
    let mut out = stream.alloc_zeros::<u64>(threads as usize).map_err(driver)?;
    let mut rate = |name: &str, repeat: u32, per_repeat: f64| -> Result<f64, AccelError> {
        let function = module.load_function(name).map_err(driver)?;
        let seconds = events.time(&stream, 5, || {
            let mut launch = stream.launch_builder(&function);
            launch.arg(&repeat).arg(&mut out);
            // SAFETY: every probe writes one word per thread of the grid
            // into `out` (u32 or u64), which holds a u64 per thread.
            unsafe { launch.launch(config) }.map(|_| ()).map_err(driver)
        })?;
        Ok(threads as f64 * f64::from(repeat) * per_repeat / seconds)
    };
    // 32 instructions an iteration (probes.cu).
    let per_sm_clock = |per_s: f64| per_s / f64::from(sms) / clock_hz;
    let lop3 = per_sm_clock(rate("probe_lop3", 4096, 32.0)?);
    let shf = per_sm_clock(rate("probe_shf", 4096, 32.0)?);
    let imad = per_sm_clock(rate("probe_imad", 4096, 32.0)?);
    let keccak_shifts = rate("probe_keccak_shifts", 64, 1.0)?;
    let keccak_multiplies = rate("probe_keccak_multiplies", 64, 1.0)?;
    Ok(Ceiling {
        multiprocessors: sms,
        clock_mhz: clock_hz / 1e6,
        lop3_per_sm_clock: lop3,
        shf_per_sm_clock: shf,
        imad_per_sm_clock: imad,
        keccak_shifts_per_s: keccak_shifts,
        keccak_multiplies_per_s: keccak_multiplies,
        kernels_rotation: keccak_rotation(),
    })
}

/// One launch size of SHA3-512 leaves, timed on data in device memory
/// both ways ([`hash_forms`]).
#[derive(Clone, Debug, serde::Serialize)]
pub struct FormFigures {
    pub messages: usize,
    pub message_bytes: usize,
    /// Median microseconds of a launch, a thread a message.
    pub thread_us: f64,
    /// The same, a warp a message.
    pub warp_us: f64,
    /// Which of the two the backend uses for this many messages.
    pub chosen: HashForm,
}

/// Times launches of the SHA3-512 leaves kernel over `counts` messages of
/// `bytes` bytes each, a thread a message and a warp a message (the
/// median of nine launches each, by events): where the two cross is
/// where [`WARP_HASH_MAX`] belongs.
pub fn hash_forms(gpu: &Cuda, bytes: usize, counts: &[usize]) -> Result<Vec<FormFigures>, AccelError> {
    let most = counts.iter().copied().max().unwrap_or(0).max(1);
    gpu.ctx.bind_to_thread().map_err(driver)?;
    let mut slot = gpu.take_slot();
    let measured = (|| -> Result<Vec<FormFigures>, AccelError> {
        let stream = slot.stream.clone();
        let widest = Layout::new(most, 1, bytes, 0);
        let buffers = slot.reserve(widest.end).map_err(driver)?;
        let device = buffers.device;
        let host = buffers.host();
        fill_pseudo_random(&mut host[..widest.params], 0x5348_4133);
        let cs = stream.cu_stream();
        unsafe { cu::memcpy_htod_async(device, &host[..widest.params], cs) }.map_err(driver)?;
        let events = Events::new(&gpu.ctx)?;
        let mut figures = Vec::new();
        for &count in counts {
            let layout = Layout::new(count.max(1), 1, bytes, 0);
            let time = |form| {
                events.time(&stream, 9, || {
                    gpu.launch_leaves(&stream, device, &layout, ALG_SHA3_512, bytes, form)
                })
            };
            figures.push(FormFigures {
                messages: layout.stripes,
                message_bytes: bytes,
                thread_us: time(HashForm::Thread)? * 1e6,
                warp_us: time(HashForm::Warp)? * 1e6,
                chosen: gpu.hash_form(ALG_SHA3_512, layout.stripes as u64),
            });
        }
        Ok(figures)
    })();
    slot.stream.synchronize().ok();
    gpu.put_slot(slot);
    measured
}
