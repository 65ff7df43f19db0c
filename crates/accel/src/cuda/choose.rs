//! What `--accel auto` sends to the GPU, chosen by measuring.
//!
//! When an array opens, it names its stripe shape ([`Accelerator::prepare`]).
//! Under [`Policy::Auto`] the backend then measures two kinds of work,
//! each both ways, and keeps the faster for each:
//!
//! - **Seals** (and rebuilds) of that shape, by throughput: one batch of
//!   about [`MEASURE_BYTES`] of random data, in memory it lends (as the
//!   array's stripes are), on the CPU's pool and on the GPU, twice each
//!   after a first GPU run that compiles the shape's kernels. Stripes are
//!   sealed in the background of client writes, so what counts is bytes
//!   per second.
//! - **Hashes** with the shape's checksum, by latency: a client write's
//!   digests ([`HASH_MEASURE_INPUTS`] extents of [`HASH_MEASURE_BYTES`],
//!   a 1 MiB write as the array cuts it), the median of five each way. A
//!   client waits for these, and one GPU thread hashes one input: SHA3-512
//!   over 64 KiB is about 900 sequential permutations, milliseconds on a
//!   GPU thread and a fraction of one on a CPU core, so a GPU that seals
//!   ten times faster than the CPU can still hash a write slower.
//!
//! `status` shows the figures and the choices ([`Cuda::detail`]).
//!
//! Shapes never prepared (`bench`, tools) keep the fixed rule: SHA-256 and
//! SHA3-512 batches on the GPU, the rest on the CPU. Batches under
//! [`AUTO_BATCH_BYTES_MIN`] stay on the CPU either way: a measurement of a
//! large batch says nothing of a small one's round trip.

use super::*;
use std::time::Instant;

/// Bytes of data one measuring batch holds (at least one stripe).
pub const MEASURE_BYTES: usize = 32 << 20;

/// The inputs of the hash measurement: a 1 MiB client write in the
/// array's largest extents (16 blocks of 4 KiB).
pub const HASH_MEASURE_INPUTS: usize = 16;
pub const HASH_MEASURE_BYTES: usize = 64 << 10;

/// What was measured for a shape, and chosen.
#[derive(Clone, Copy, Debug)]
pub struct Choice {
    /// Seals and rebuilds of the shape on the GPU.
    pub gpu: bool,
    /// Data bytes sealed per second (10^9), best of two runs each.
    pub gpu_gbps: f64,
    pub cpu_gbps: f64,
    /// Hashes with the shape's checksum on the GPU.
    pub hash_gpu: bool,
    /// Median seconds to hash one client write's extents.
    pub hash_gpu_seconds: f64,
    pub hash_cpu_seconds: f64,
}

impl Cuda {
    /// Measures `shape` both ways (once per shape) under `Policy::Auto`.
    pub(super) fn choose(&self, shape: &Shape) {
        if self.policy != Policy::Auto || self.failed.get().is_some() || shape.width() > 256 {
            return;
        }
        if self
            .choices
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(shape)
        {
            return;
        }
        let choice = match self.measure(shape) {
            Ok(choice) => choice,
            Err(e) => {
                self.give_up(&e);
                return;
            }
        };
        eprintln!("tessera: auto: {}", describe(shape, &choice));
        self.choices
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(*shape, choice);
    }

    fn measure(&self, shape: &Shape) -> Result<Choice, AccelError> {
        use crate::HostMemory;
        let (k, m, c) = (shape.data, shape.parity, shape.chunk_bytes);
        let stripe = (k + m) * c;
        let stripes = (MEASURE_BYTES / (k * c).max(1)).max(1);
        let bytes = stripes * stripe;
        let lent = self.pinned.alloc(bytes);
        let mut pageable = Vec::new();
        let buffer: &mut [u8] = match lent {
            // SAFETY: lent for `bytes`, freed below after its last use.
            Some(at) => unsafe { std::slice::from_raw_parts_mut(at.as_ptr(), bytes) },
            None => {
                pageable.resize(bytes, 0);
                &mut pageable
            }
        };
        fill_pseudo_random(buffer, 0x9e37_79b9_7f4a_7c15);
        let mut best = |gpu: bool, runs: usize| -> Result<f64, AccelError> {
            let mut fastest = f64::INFINITY;
            for _ in 0..runs {
                let mut jobs = crate::seal_jobs(shape, buffer);
                let started = Instant::now();
                if gpu {
                    self.seal_gpu(shape, &mut jobs, true)?;
                } else {
                    self.cpu.seal(shape, &mut jobs)?;
                }
                fastest = fastest.min(started.elapsed().as_secs_f64());
            }
            Ok((stripes * k * c) as f64 / fastest / 1e9)
        };
        let measured = (|| {
            best(true, 1)?; // compiles the shape's kernels, grows the staging
            Ok::<_, AccelError>((best(true, 2)?, best(false, 2)?))
        })();
        if let Some(at) = lent {
            // SAFETY: lent above for `bytes`; the jobs are gone.
            unsafe { self.pinned.free(at, bytes) };
        }
        let (gpu_gbps, cpu_gbps) = measured?;
        let (hash_gpu_seconds, hash_cpu_seconds) = self.measure_hash(shape.checksum)?;
        Ok(Choice {
            gpu: gpu_gbps > cpu_gbps,
            gpu_gbps,
            cpu_gbps,
            hash_gpu: hash_gpu_seconds < hash_cpu_seconds,
            hash_gpu_seconds,
            hash_cpu_seconds,
        })
    }

    /// Median seconds to hash one client write's extents on the GPU and
    /// on the CPU (infinite on the GPU for a checksum it has no kernel for).
    fn measure_hash(&self, algorithm: Algorithm) -> Result<(f64, f64), AccelError> {
        let inputs: Vec<Vec<u8>> = (0..HASH_MEASURE_INPUTS)
            .map(|i| {
                let mut input = vec![0u8; HASH_MEASURE_BYTES];
                fill_pseudo_random(&mut input, 0x2545_f491_4f6c_dd1d + i as u64);
                input
            })
            .collect();
        let inputs: Vec<&[u8]> = inputs.iter().map(|i| &i[..]).collect();
        let median = |mut run: Box<dyn FnMut() -> Result<(), AccelError> + '_>| -> Result<f64, AccelError> {
            run()?; // warm up
            let mut seconds = Vec::with_capacity(5);
            for _ in 0..5 {
                let started = Instant::now();
                run()?;
                seconds.push(started.elapsed().as_secs_f64());
            }
            seconds.sort_by(f64::total_cmp);
            Ok(seconds[2])
        };
        let gpu = match kernel_algorithm(algorithm) {
            Some(number) => median(Box::new(|| {
                self.hash_gpu(number, algorithm.digest_bytes(), &inputs).map(|_| ())
            }))?,
            None => f64::INFINITY,
        };
        let cpu = median(Box::new(|| {
            self.cpu.hash(algorithm, &inputs);
            Ok(())
        }))?;
        Ok((gpu, cpu))
    }

    /// Whether a batch of `bytes` goes to the GPU: of stripes of `shape`,
    /// or (None) hashes with `algorithm`.
    pub(super) fn wants(&self, algorithm: Algorithm, shape: Option<&Shape>, bytes: usize) -> bool {
        if self.failed.get().is_some() {
            return false;
        }
        if self.policy == Policy::Always {
            return true;
        }
        if bytes < AUTO_BATCH_BYTES_MIN {
            return false;
        }
        let choices = self.choices.lock().unwrap_or_else(|p| p.into_inner());
        let measured = match shape {
            Some(shape) => choices.get(shape).map(|c| c.gpu),
            None => choices
                .iter()
                .find(|(s, _)| s.checksum == algorithm)
                .map(|(_, c)| c.hash_gpu),
        };
        measured.unwrap_or_else(|| kernel_algorithm(algorithm).is_some())
    }

    /// Whether anything goes to the GPU under this policy: always under
    /// `Always`; under `Auto`, unless every shape measured chose the CPU
    /// for both kinds of work (then lending page-locked memory would pin
    /// it for nothing).
    pub(super) fn uses_gpu(&self) -> bool {
        if self.failed.get().is_some() {
            return false;
        }
        let choices = self.choices.lock().unwrap_or_else(|p| p.into_inner());
        self.policy == Policy::Always || choices.is_empty() || choices.values().any(|c| c.gpu || c.hash_gpu)
    }

    /// The choices made, for `detail`.
    pub(super) fn choices_made(&self) -> String {
        let choices = self.choices.lock().unwrap_or_else(|p| p.into_inner());
        let mut made: Vec<String> = choices.iter().map(|(s, c)| describe(s, c)).collect();
        made.sort();
        made.join(", ")
    }
}

/// What was chosen for `shape`, and the figures it was chosen by.
fn describe(shape: &Shape, c: &Choice) -> String {
    let side = |gpu: bool| if gpu { "GPU" } else { "CPU" };
    let hashes = if c.hash_gpu_seconds.is_finite() {
        format!(
            "write hashes on the {} (GPU {:.2} ms, CPU {:.2} ms)",
            side(c.hash_gpu),
            c.hash_gpu_seconds * 1e3,
            c.hash_cpu_seconds * 1e3
        )
    } else {
        "write hashes on the CPU (no GPU kernel)".to_string()
    };
    format!(
        "{}+{} {} seals on the {} (GPU {:.2} GB/s, CPU {:.2}), {hashes}",
        shape.data,
        shape.parity,
        shape.checksum,
        side(c.gpu),
        c.gpu_gbps,
        c.cpu_gbps
    )
}
