//! `tessera bench array`: the engine driven in process (no NBD), so that
//! anyone can measure it, on any number of cores, without fio.
//!
//! Workers (threads x queue depth) each issue one request at a time to a
//! fresh array on member files (or in memory), sequentially over their own
//! part of the volume or at random over all of it. Reads read what a
//! first, untimed pass wrote. The process's CPU time over the run
//! (getrusage) is reported per GB moved: what the engine costs the host.

use anyhow::{bail, ensure, Context, Result};
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_array::device::{Device, FileDevice, RamDevice};
use tessera_array::{Array, CreateOptions, EngineOptions};

pub struct Options {
    pub data: usize,
    pub parity: usize,
    pub devices: usize,
    pub device_bytes: u64,
    pub chunk_bytes: usize,
    pub checksum: tessera_checksum::Algorithm,
    pub compression: Option<tessera_compress::Codec>,
    /// Member files go here (a temporary directory under it); `None`:
    /// members in memory.
    pub dir: Option<PathBuf>,
    pub threads: usize,
    pub queue_depth: usize,
    pub random: bool,
    pub write: bool,
    pub block_bytes: usize,
    /// Bytes moved by the timed pass (in all).
    pub bytes: u64,
    pub failed: usize,
    pub accel: tessera_accel::Kind,
    /// Writers FLUSH after every this many writes (0: never in the pass).
    pub flush_every: usize,
    /// Data that compresses about 2:1, rather than random bytes.
    pub compressible: bool,
}

/// Bytes each worker draws its writes from, so that making data costs the
/// benchmark nothing: random, and for `compressible` every other 512-byte
/// run zeroed (about 2:1).
const POOL_BYTES: usize = 8 << 20;

fn pool(seed: u64, compressible: bool) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut bytes = vec![0u8; POOL_BYTES];
    rng.fill(&mut bytes[..]);
    if compressible {
        bytes.chunks_mut(512).step_by(2).for_each(|run| run.fill(0));
    }
    bytes
}

#[derive(Serialize)]
pub struct Report {
    pub accelerator: String,
    pub layout: String,
    pub members: String,
    pub pattern: String,
    pub block_bytes: usize,
    pub threads: usize,
    pub queue_depth: usize,
    pub members_failed: usize,
    pub bytes: u64,
    pub seconds: f64,
    pub gbps: f64,
    pub iops: f64,
    pub latency_us_p50: f64,
    pub latency_us_p99: f64,
    /// FLUSHes issued in the pass (`--flush-every`) and their latency.
    pub flushes: usize,
    pub flush_us_p50: f64,
    pub flush_us_p99: f64,
    /// Process CPU (user + system) seconds per GB moved.
    pub cpu_seconds_per_gb: f64,
    /// Cores the process kept busy on average.
    pub cores_busy: f64,
    pub write_amplification: f64,
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// The members, named; the directory holding their files (removed when
/// dropped); and what they are, in words.
type Members = (Vec<(String, Arc<dyn Device>)>, Option<tempfile::TempDir>, String);

fn members(o: &Options) -> Result<Members> {
    match &o.dir {
        Some(dir) => {
            let temp = tempfile::Builder::new()
                .prefix("tessera-bench-array.")
                .tempdir_in(dir)
                .with_context(|| format!("making a directory in {}", dir.display()))?;
            let mut members = Vec::new();
            for i in 0..o.devices {
                let path = temp.path().join(format!("member-{i:03}"));
                let device = FileDevice::create(&path, o.device_bytes)
                    .with_context(|| format!("creating {}", path.display()))?;
                members.push((path.display().to_string(), Arc::new(device) as Arc<dyn Device>));
            }
            let kind = format!("{} files in {}", o.devices, dir.display());
            Ok((members, Some(temp), kind))
        }
        None => {
            let members = (0..o.devices)
                .map(|i| {
                    (
                        format!("m{i}"),
                        Arc::new(RamDevice::new(o.device_bytes)) as Arc<dyn Device>,
                    )
                })
                .collect();
            Ok((members, None, format!("{} in memory", o.devices)))
        }
    }
}

/// One worker's requests: (offset, length) in order.
fn requests(o: &Options, worker: usize, workers: usize, size: u64, count: usize) -> Vec<u64> {
    let block = o.block_bytes as u64;
    let mut rng = rand::rngs::StdRng::seed_from_u64(worker as u64);
    if o.random {
        (0..count).map(|_| rng.gen_range(0..size / block) * block).collect()
    } else {
        let span = size / workers as u64 / block * block;
        let start = span * worker as u64;
        (0..count as u64)
            .map(|i| start + (i * block) % span.max(block))
            .collect()
    }
}

/// Runs `count` requests per worker, reading or writing; returns the
/// latencies of the requests, and of the FLUSHes writers issued.
fn pass(array: &Array, o: &Options, write: bool, offsets: &[Vec<u64>]) -> Result<(Vec<Duration>, Vec<Duration>)> {
    type Latencies = (Vec<Duration>, Vec<Duration>);
    let results: Vec<Result<Latencies>> = std::thread::scope(|scope| {
        let handles: Vec<_> = offsets
            .iter()
            .enumerate()
            .map(|(w, offsets)| {
                scope.spawn(move || -> Result<Latencies> {
                    let mut buffer = if write { Vec::new() } else { vec![0u8; o.block_bytes] };
                    let pool = if write {
                        pool(w as u64, o.compressible)
                    } else {
                        Vec::new()
                    };
                    let mut latencies = Vec::with_capacity(offsets.len());
                    let mut flushes = Vec::new();
                    for (i, &offset) in offsets.iter().enumerate() {
                        let started = Instant::now();
                        if write {
                            // Each request starts at another 4 KiB of the pool.
                            let at = (i * 7 * 4096) % (POOL_BYTES - o.block_bytes);
                            array.write(offset, &pool[at..at + o.block_bytes], false)?;
                        } else {
                            array.read(offset, &mut buffer)?;
                        }
                        latencies.push(started.elapsed());
                        if write && o.flush_every > 0 && (i + 1) % o.flush_every == 0 {
                            let started = Instant::now();
                            array.flush()?;
                            flushes.push(started.elapsed());
                        }
                    }
                    Ok((latencies, flushes))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| bail!("a worker panicked")))
            .collect()
    });
    let (mut all, mut flushes) = (Vec::new(), Vec::new());
    for r in results {
        let (latencies, flushed) = r?;
        all.extend(latencies);
        flushes.extend(flushed);
    }
    Ok((all, flushes))
}

pub fn run(o: &Options) -> Result<Report> {
    ensure!(
        o.threads > 0 && o.queue_depth > 0,
        "--threads and --queue-depth must be at least 1"
    );
    ensure!(
        o.block_bytes > 0 && o.block_bytes.is_multiple_of(4096),
        "--block-size must be a multiple of 4K"
    );
    ensure!(
        o.block_bytes <= POOL_BYTES / 2,
        "--block-size is at most {} here",
        POOL_BYTES / 2
    );
    ensure!(
        o.failed <= o.parity,
        "--fail {} is more than the parity ({})",
        o.failed,
        o.parity
    );
    let accel = tessera_accel::select(o.accel)?;
    let (devices, _temp, members_kind) = members(o)?;
    let create = CreateOptions {
        data: o.data,
        parity: o.parity,
        chunk_bytes: o.chunk_bytes,
        checksum: o.checksum,
        compression: o.compression,
        logical_bytes: None,
        log_bytes: None,
    };
    let engine = EngineOptions {
        accel: Some(accel.clone()),
        ..EngineOptions::default()
    };
    let array = tessera_array::create_with(devices, &create, engine)?;
    let size = array.logical_bytes();
    let workers = o.threads * o.queue_depth;
    let total = o.bytes.min(size) / o.block_bytes as u64;
    let count = (total as usize / workers).max(1);
    ensure!(
        (o.block_bytes as u64) * workers as u64 <= size,
        "the array's {size} bytes are fewer than one block per worker"
    );
    let offsets: Vec<Vec<u64>> = (0..workers).map(|w| requests(o, w, workers, size, count)).collect();
    if !o.write {
        // What the reads read: written once, flushed, not timed.
        pass(&array, o, true, &offsets)?;
        array.flush()?;
    }
    for member in 0..o.failed {
        array.fail_member(member)?;
    }
    let before = array.status()?;
    let (cpu, started) = (cpu_seconds(), Instant::now());
    let (mut latencies, mut flushes) = pass(&array, o, o.write, &offsets)?;
    if o.write {
        array.flush()?;
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu;
    let after = array.status()?;
    latencies.sort();
    flushes.sort();
    let percentile = |of: &[Duration], p: f64| match of.len() {
        0 => 0.0,
        n => of[((n - 1) as f64 * p) as usize].as_secs_f64() * 1e6,
    };
    let bytes = (latencies.len() * o.block_bytes) as u64;
    let user = after.user_bytes_written - before.user_bytes_written;
    let member = after.member_bytes_written - before.member_bytes_written;
    Ok(Report {
        accelerator: match accel.detail() {
            detail if detail.is_empty() => accel.name().to_string(),
            detail if accel.name() == "cpu" => format!("cpu ({detail})"),
            detail => format!(
                "{} ({detail}; {} MB on the device)",
                accel.name(),
                accel.work().bytes_on_device / 1_000_000
            ),
        },
        layout: format!(
            "{}+{} on {} members, {} KiB chunks",
            o.data,
            o.parity,
            o.devices,
            o.chunk_bytes >> 10
        ),
        members: members_kind,
        pattern: format!(
            "{} {}",
            if o.random { "random" } else { "sequential" },
            if o.write { "write" } else { "read" }
        ),
        block_bytes: o.block_bytes,
        threads: o.threads,
        queue_depth: o.queue_depth,
        members_failed: o.failed,
        bytes,
        seconds,
        gbps: bytes as f64 / seconds / 1e9,
        iops: latencies.len() as f64 / seconds,
        latency_us_p50: percentile(&latencies, 0.5),
        latency_us_p99: percentile(&latencies, 0.99),
        flushes: flushes.len(),
        flush_us_p50: percentile(&flushes, 0.5),
        flush_us_p99: percentile(&flushes, 0.99),
        cpu_seconds_per_gb: cpu / (bytes as f64 / 1e9),
        cores_busy: cpu / seconds,
        write_amplification: if user == 0 { 0.0 } else { member as f64 / user as f64 },
    })
}

pub fn print(r: &Report) {
    println!(
        "{} ({}), accelerator {}: {} of {} KiB, {} thread(s) x depth {}{}",
        r.layout,
        r.members,
        r.accelerator,
        r.pattern,
        r.block_bytes >> 10,
        r.threads,
        r.queue_depth,
        if r.members_failed > 0 {
            format!(", {} member(s) failed", r.members_failed)
        } else {
            String::new()
        }
    );
    println!(
        "{:.3} GB/s, {:.0} IOPS; latency p50 {:.0} us, p99 {:.0} us; {:.2} CPU-seconds per GB ({:.2} cores busy); write amplification {:.2}",
        r.gbps, r.iops, r.latency_us_p50, r.latency_us_p99, r.cpu_seconds_per_gb, r.cores_busy, r.write_amplification
    );
    if r.flushes > 0 {
        println!(
            "{} FLUSHes: latency p50 {:.0} us, p99 {:.0} us",
            r.flushes, r.flush_us_p50, r.flush_us_p99
        );
    }
}
