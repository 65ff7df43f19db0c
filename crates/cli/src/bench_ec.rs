//! `tessera bench ec`: Tessera's codec and the system's ISA-L on the same
//! buffers in the same run.
//!
//! The working set (stripes of K+M shards) is allocated once and filled with
//! random bytes; each measurement sweeps all of it repeatedly for a minimum
//! time, and Tessera and ISA-L alternate over several rounds so that noise
//! from a shared machine falls on both. The median round is reported. Work is
//! cut into the same pieces (a stripe, or a column range of one) for both, and
//! spread over `--threads` threads the same way.
//!
//! A stripe's buffers lie in one allocation, laid out as `--layout` says:
//! `area` (the default), each shard 4 KiB-aligned right after the last, as
//! the array holds a stripe's chunks; or `skewed`, each shard 320 bytes
//! further into its page than the last, as separate allocations often
//! fall. The layout moves both implementations' speed by up to 2.4x (in
//! `area`, every shard's bytes at one offset share a set of the L1
//! cache), so a comparison names it; `scripts/bench-ec-isa.sh` runs ISA-L
//! on the same layouts.

use anyhow::{bail, Result};
use rand::RngCore;
use serde::Serialize;
use std::time::{Duration, Instant};
use tessera_ec::{Codec, Kernel, MatrixKind};
use tessera_isal::{Isal, Tables};

pub struct Options {
    pub data: usize,
    pub parity: usize,
    pub shard_bytes: usize,
    pub working_set_bytes: usize,
    pub threads: usize,
    pub kernel: Option<Kernel>,
    pub matrix: MatrixKind,
    pub rounds: usize,
    pub seconds: f64,
    pub layout: Layout,
}

/// How a stripe's buffers lie in memory (see the module's text).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    Area,
    Skewed,
}

impl Layout {
    /// Bytes from one shard's start to the next for shards of `n` bytes.
    fn stride(self, n: usize) -> usize {
        match self {
            Layout::Area => n.next_multiple_of(4096),
            Layout::Skewed => n.next_multiple_of(64) + SKEW_BYTES,
        }
    }
}

/// How much further into its page each shard of a skewed layout starts.
const SKEW_BYTES: usize = 320;

#[derive(Serialize)]
pub struct Report {
    pub data: usize,
    pub parity: usize,
    pub shard_bytes: usize,
    pub stripes: usize,
    pub working_set_bytes: usize,
    pub threads: usize,
    pub kernel: &'static str,
    pub matrix: &'static str,
    pub layout: Layout,
    pub cpu: String,
    pub encode_gbps: f64,
    pub decode_gbps: f64,
    pub isal_encode_gbps: Option<f64>,
    pub isal_decode_gbps: Option<f64>,
    pub encode_ratio: Option<f64>,
    pub decode_ratio: Option<f64>,
}

/// A stripe's buffers, in one allocation: K data shards, M parity, and
/// room for the M shards a decode rebuilds, `stride` bytes apart from
/// `start` (a 4 KiB boundary).
struct Stripe {
    area: Vec<u8>,
    start: usize,
    stride: usize,
    shard_bytes: usize,
    data: usize,
    parity: usize,
}

impl Stripe {
    fn new(data: usize, parity: usize, shard_bytes: usize, layout: Layout, rng: &mut impl RngCore) -> Stripe {
        let stride = layout.stride(shard_bytes);
        let mut area = vec![0u8; (data + 2 * parity) * stride + 4096];
        let start = area.as_ptr().align_offset(4096);
        rng.fill_bytes(&mut area[start..start + data * stride]);
        Stripe {
            area,
            start,
            stride,
            shard_bytes,
            data,
            parity,
        }
    }

    /// Buffer `i`: data shards first, then parity, then the rebuilt.
    fn shard(&self, i: usize) -> &[u8] {
        let at = self.start + i * self.stride;
        &self.area[at..at + self.shard_bytes]
    }

    /// Every buffer, writable: (data, parity, rebuilt).
    fn buffers(&mut self) -> [Vec<&mut [u8]>; 3] {
        let (n, stride) = (self.shard_bytes, self.stride);
        let mut all: Vec<&mut [u8]> = self.area[self.start..]
            .chunks_mut(stride)
            .take(self.data + 2 * self.parity)
            .map(|c| &mut c[..n])
            .collect();
        let rebuilt = all.split_off(self.data + self.parity);
        let parity = all.split_off(self.data);
        [all, parity, rebuilt]
    }
}

/// A unit of work: the same column range of every buffer of one stripe.
struct View<'a> {
    data: Vec<&'a mut [u8]>,
    parity: Vec<&'a mut [u8]>,
    rebuilt: Vec<&'a mut [u8]>,
}

pub fn run(options: &Options) -> Result<Report> {
    let (k, m, n) = (options.data, options.parity, options.shard_bytes);
    if n == 0 {
        bail!("--shard-bytes must be at least 1");
    }
    if m == 0 {
        bail!("--parity must be at least 1 to measure decoding");
    }
    let mut codec = Codec::new(k, m, options.matrix)?;
    if let Some(kernel) = options.kernel {
        codec = codec.with_kernel(kernel)?;
    }
    let stripe_bytes = (k + m) * n;
    let stripe_count = (options.working_set_bytes / stripe_bytes).max(1);
    let mut rng = rand::thread_rng();
    let mut stripes: Vec<Stripe> = (0..stripe_count)
        .map(|_| Stripe::new(k, m, n, options.layout, &mut rng))
        .collect();

    // Lose data shards first (the costly case), then parity if M > K.
    let lost: Vec<usize> = (0..k).take(m).chain(k..k + m.saturating_sub(k)).collect();
    let survivors: Vec<usize> = (0..k + m).filter(|i| !lost.contains(i)).take(k).collect();
    let isal = Isal::load().ok();

    let threads = options.threads;
    // Each measurement lays out its calls' shard lists once (`Job`s), and
    // its sweeps only call the codecs, as a C loop over prepared pointer
    // arrays calls ISA-L (`scripts/bench-ec-isa.sh`). Laid out each sweep,
    // they slowed both on small shards: 4+2 of 4 KiB, ISA-L 2.30 10-14 ->
    // 16-18 GB/s, Tessera's AVX2+GFNI 19-29 -> 26-42 (with its pointer
    // lists off the heap too; docs/PERFORMANCE.md).
    let encode_ours = |job: &mut Job<'_>| codec.encode(&job.inputs, &mut job.outputs).expect("valid shape");
    let decode_ours = |job: &mut Job<'_>| codec.reconstruct(&mut job.outputs, &lost).expect("at most M lost");

    run_jobs(&mut encode_jobs(&mut stripes, n, threads), threads, encode_ours);
    let mut isal_tables = None;
    if let Some(isal) = &isal {
        let matrix = codec.encoding_matrix();
        let encode_tables = isal.init_tables(m, k, &matrix[k * k..]);
        // ISA-L decodes with the same matrix the codec derives: it is a
        // property of the code, not of the implementation.
        let (sources, decode_rows) = codec.decode_matrix(&lost)?;
        assert_eq!(sources, survivors);
        let decode_tables = isal.init_tables(lost.len(), k, &decode_rows);
        isal_tables = Some((encode_tables, decode_tables));
    }
    let isal_call = |isal: &Isal, tables: &Tables, job: &mut Job<'_>| {
        isal.encode_data(tables, &job.inputs, &mut job.outputs)
            .expect("shape fits ISA-L")
    };
    if let (Some(isal), Some((encode_tables, _))) = (&isal, &isal_tables) {
        let parity = |stripe: &Stripe| (k..k + m).map(|i| stripe.shard(i).to_vec()).collect::<Vec<_>>();
        let ours = parity(&stripes[0]);
        run_jobs(&mut encode_jobs(&mut stripes, n, threads), threads, |job| {
            isal_call(isal, encode_tables, job)
        });
        if parity(&stripes[0]) != ours {
            bail!("Tessera's parity differs from ISA-L's for {k}+{m}: refusing to report speeds");
        }
    }

    let data_bytes = (k * n * stripe_count) as f64;
    let minimum = Duration::from_secs_f64(options.seconds);
    let mut samples: [Vec<f64>; 4] = Default::default();
    for _ in 0..options.rounds.max(1) {
        let mut jobs = encode_jobs(&mut stripes, n, threads);
        samples[0].push(gbps(data_bytes, minimum, || run_jobs(&mut jobs, threads, encode_ours)));
        let mut jobs = decode_jobs(&mut stripes, n, threads, &lost);
        samples[1].push(gbps(data_bytes, minimum, || run_jobs(&mut jobs, threads, decode_ours)));
        if let (Some(isal), Some((encode_tables, decode_tables))) = (&isal, &isal_tables) {
            let mut jobs = encode_jobs(&mut stripes, n, threads);
            samples[2].push(gbps(data_bytes, minimum, || {
                run_jobs(&mut jobs, threads, |job| isal_call(isal, encode_tables, job))
            }));
            let mut jobs = isal_decode_jobs(&mut stripes, n, threads, &survivors);
            samples[3].push(gbps(data_bytes, minimum, || {
                run_jobs(&mut jobs, threads, |job| isal_call(isal, decode_tables, job))
            }));
        }
    }
    // The rebuilt shards must be the lost ones, or the decode timing is meaningless.
    for (i, &index) in lost.iter().enumerate() {
        if stripes[0].shard(k + m + i) != stripes[0].shard(index) {
            bail!("decoding did not rebuild shard {index}: refusing to report speeds");
        }
    }
    let [encode, decode, isal_encode, isal_decode] = samples.map(median);
    Ok(Report {
        data: k,
        parity: m,
        shard_bytes: n,
        stripes: stripe_count,
        working_set_bytes: stripe_count * stripe_bytes,
        threads: options.threads,
        kernel: codec.kernel().name(),
        layout: options.layout,
        matrix: codec.matrix_kind().name(),
        cpu: cpu_model(),
        encode_gbps: encode.unwrap_or(0.0),
        decode_gbps: decode.unwrap_or(0.0),
        encode_ratio: isal_encode.map(|i| encode.unwrap_or(0.0) / i),
        decode_ratio: isal_decode.map(|i| decode.unwrap_or(0.0) / i),
        isal_encode_gbps: isal_encode,
        isal_decode_gbps: isal_decode,
    })
}

#[derive(Clone, Copy)]
enum Which {
    Data,
    Parity,
    Rebuilt,
}

/// Cuts every stripe into column ranges of whole cache lines, at least
/// `threads` views in all.
fn views<'a>(stripes: &'a mut [Stripe], shard_bytes: usize, threads: usize) -> Vec<View<'a>> {
    let per_stripe = threads.div_ceil(stripes.len()).max(1);
    let width = shard_bytes.div_ceil(per_stripe).next_multiple_of(64);
    let mut views = Vec::new();
    for stripe in stripes {
        let first = views.len();
        let pieces = shard_bytes.div_ceil(width);
        for _ in 0..pieces {
            views.push(View {
                data: Vec::new(),
                parity: Vec::new(),
                rebuilt: Vec::new(),
            });
        }
        let mut cut_into = |buffers: Vec<&'a mut [u8]>, which: Which| {
            for buffer in buffers {
                for (i, chunk) in buffer.chunks_mut(width).enumerate() {
                    let view = &mut views[first + i];
                    match which {
                        Which::Data => view.data.push(chunk),
                        Which::Parity => view.parity.push(chunk),
                        Which::Rebuilt => view.rebuilt.push(chunk),
                    }
                }
            }
        };
        let [data, parity, rebuilt] = stripe.buffers();
        cut_into(data, Which::Data);
        cut_into(parity, Which::Parity);
        cut_into(rebuilt, Which::Rebuilt);
    }
    views
}

/// One call's shard lists, laid out before the timing: the inputs and the
/// outputs (for our decode, every shard, in `outputs`).
struct Job<'a> {
    inputs: Vec<&'a [u8]>,
    outputs: Vec<&'a mut [u8]>,
}

/// Encoding: the data shards in, the parity out.
fn encode_jobs<'a>(stripes: &'a mut [Stripe], shard_bytes: usize, threads: usize) -> Vec<Job<'a>> {
    let views = views(stripes, shard_bytes, threads);
    views
        .into_iter()
        .map(|view| Job {
            inputs: view.data.into_iter().map(|d| &*d).collect(),
            outputs: view.parity,
        })
        .collect()
}

/// Our decoding: every shard, each `lost` one replaced by a scratch
/// buffer (so the rebuild really writes fresh bytes).
fn decode_jobs<'a>(stripes: &'a mut [Stripe], shard_bytes: usize, threads: usize, lost: &[usize]) -> Vec<Job<'a>> {
    let views = views(stripes, shard_bytes, threads);
    views
        .into_iter()
        .map(|view| {
            let mut rebuilt = view.rebuilt.into_iter();
            let outputs = (view.data.into_iter().chain(view.parity).enumerate())
                .map(|(index, shard)| match lost.contains(&index) {
                    true => rebuilt.next().expect("one per lost shard"),
                    false => shard,
                })
                .collect();
            Job {
                inputs: Vec::new(),
                outputs,
            }
        })
        .collect()
}

/// ISA-L's decoding: the `survivors` in, the scratch buffers out.
fn isal_decode_jobs<'a>(
    stripes: &'a mut [Stripe],
    shard_bytes: usize,
    threads: usize,
    survivors: &[usize],
) -> Vec<Job<'a>> {
    let views = views(stripes, shard_bytes, threads);
    views
        .into_iter()
        .map(|view| {
            let all: Vec<&[u8]> = view.data.into_iter().chain(view.parity).map(|s| &*s).collect();
            Job {
                inputs: survivors.iter().map(|&s| all[s]).collect(),
                outputs: view.rebuilt,
            }
        })
        .collect()
}

/// Runs `work` on every job, `threads` runs of consecutive jobs at once.
fn run_jobs(jobs: &mut [Job<'_>], threads: usize, work: impl Fn(&mut Job<'_>) + Sync) {
    if threads <= 1 {
        jobs.iter_mut().for_each(work);
        return;
    }
    let per_thread = jobs.len().div_ceil(threads);
    let work = &work;
    std::thread::scope(|scope| {
        for mine in jobs.chunks_mut(per_thread) {
            scope.spawn(move || mine.iter_mut().for_each(work));
        }
    });
}

/// GB/s of `bytes` per sweep, sweeping until `minimum` has passed.
fn gbps(bytes: f64, minimum: Duration, mut sweep: impl FnMut()) -> f64 {
    let start = Instant::now();
    let mut sweeps = 0u32;
    while sweeps == 0 || start.elapsed() < minimum {
        sweep();
        sweeps += 1;
    }
    bytes * f64::from(sweeps) / start.elapsed().as_secs_f64() / 1e9
}

fn median(mut samples: Vec<f64>) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_by(f64::total_cmp);
    Some(samples[samples.len() / 2])
}

/// The CPU's model name, as /proc/cpuinfo gives it.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".to_string())
}
