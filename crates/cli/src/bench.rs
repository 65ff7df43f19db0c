//! `tessera bench`: Tessera measured against its peers on this machine,
//! in the same run (ISA-L, openssl, b3sum, zstd, lz4), and the array
//! engine in process.

use anyhow::Result;
use clap::Subcommand;
use std::path::PathBuf;

use crate::ec_files::Shape;
use crate::{bench_array, bench_data, bench_ec, bench_slots, size};

#[derive(Subcommand)]
pub enum BenchCommand {
    /// The array engine in process (no NBD): throughput, IOPS, latency and CPU per GB.
    Array {
        /// Data chunks per stripe (K).
        #[arg(long, default_value_t = 8)]
        data: usize,
        /// Parity chunks per stripe (M).
        #[arg(long, default_value_t = 2)]
        parity: usize,
        /// Members (N >= K+M).
        #[arg(long, default_value_t = 10)]
        devices: usize,
        /// Size of each member.
        #[arg(long, value_parser = size::parse, default_value = "1G")]
        device_size: u64,
        /// Bytes per chunk.
        #[arg(long, value_parser = size::parse, default_value = "64K")]
        chunk_size: u64,
        #[arg(long, default_value = "crc32c")]
        checksum: tessera_checksum::Algorithm,
        /// lz4, zstd[:LEVEL], ... or none.
        #[arg(long, default_value = "none")]
        compress: String,
        /// Member files in a temporary directory under DIR (default: the
        /// system's temporary directory); `memory` keeps members in memory.
        #[arg(long)]
        members: Option<String>,
        /// Client threads.
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Requests each thread keeps in flight (each a worker of its own).
        #[arg(long, default_value_t = 1)]
        queue_depth: usize,
        /// seq or rand.
        #[arg(long, default_value = "seq")]
        pattern: String,
        /// read or write.
        #[arg(long, default_value = "write")]
        rw: String,
        /// Bytes per request.
        #[arg(long, value_parser = size::parse, default_value = "1M")]
        block_size: u64,
        /// Bytes moved by the timed pass.
        #[arg(long, value_parser = size::parse, default_value = "1G")]
        bytes: u64,
        /// Members to fail before the timed pass (at most M).
        #[arg(long, default_value_t = 0)]
        fail: usize,
        /// random, or compressible (about 2:1).
        #[arg(long, default_value = "random")]
        data_kind: String,
        /// Backend for parity, rebuilds and hashes: auto, cpu or cuda.
        #[arg(long, default_value = "auto")]
        accel: tessera_accel::Kind,
        /// Each writer FLUSHes after every N writes (0: only once, at the
        /// end), and the FLUSHes' latency is reported apart.
        #[arg(long, default_value_t = 0)]
        flush_every: usize,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Encode and decode speed, Tessera against ISA-L on the same buffers.
    Ec {
        #[command(flatten)]
        shape: Shape,
        /// Bytes per shard (suffixes K, M, G: powers of 1024).
        #[arg(long, value_parser = size::parse)]
        shard_bytes: u64,
        /// Bytes of stripes swept per pass; larger than the last-level cache measures memory-bound speed.
        #[arg(long, value_parser = size::parse, default_value = "256M")]
        working_set: u64,
        /// Threads, for Tessera and ISA-L alike.
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Alternating rounds of each measurement; the median is reported.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Minimum seconds per measurement.
        #[arg(long, default_value_t = 0.3)]
        seconds: f64,
        /// How a stripe's shards lie in memory: area (4 KiB-aligned, one
        /// after the other, as the array holds them) or skewed (each 320
        /// bytes further into its page than the last).
        #[arg(long, value_enum, default_value = "area")]
        layout: bench_ec::Layout,
        /// cpu, or cuda to add the GPU's figures: PCIe both ways, the
        /// kernel on device-resident data, and the backend end to end.
        #[arg(long, default_value = "cpu")]
        accel: tessera_accel::Kind,
        /// Bytes of data per GPU batch.
        #[arg(long, value_parser = size::parse, default_value = "1G")]
        gpu_batch: u64,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Checksum speed per core, against openssl speed or b3sum in the same run.
    Hash {
        /// crc32c, xxh3, blake3, sha256 or sha3-512 (default: all).
        #[arg(long)]
        algorithm: Option<tessera_checksum::Algorithm>,
        /// Bytes of random data hashed per pass.
        #[arg(long, value_parser = size::parse, default_value = "64M")]
        bytes: u64,
        /// Bytes per digest (a block).
        #[arg(long, value_parser = size::parse, default_value = "64K")]
        block_bytes: u64,
        /// cpu, or cuda to add the GPU's figures for SHA-256 and SHA3-512:
        /// Merkle leaves and roots of stripes of 16 blocks, device-resident
        /// and end to end, beside the PCIe bandwidth.
        #[arg(long, default_value = "cpu")]
        accel: tessera_accel::Kind,
        /// Bytes of blocks per GPU batch.
        #[arg(long, value_parser = size::parse, default_value = "1G")]
        gpu_batch: u64,
        /// Print JSON: one object for one algorithm, {"algorithms": [...]} for all.
        #[arg(long)]
        json: bool,
    },
    /// The slot-table work a GC round and a checkpoint do under the
    /// index lock, timed against how many slots the array has used.
    Slots {
        /// Sealed slots in the table.
        #[arg(long, default_value_t = 1_000_000)]
        used: u64,
        /// Calls of each kind timed.
        #[arg(long, default_value_t = 20)]
        rounds: usize,
        /// Seed of the slots' random fill.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Compression speed per core and ratio, against zstd -b or lz4 -b in the same run.
    Compress {
        /// lz4, zstd[:LEVEL], deflate[:LEVEL], gzip[:LEVEL], zlib[:LEVEL], snappy.
        #[arg(long, default_value = "lz4")]
        codec: tessera_compress::Codec,
        /// File to compress (default: 64 MiB of generated text).
        #[arg(long)]
        input: Option<PathBuf>,
        /// Bytes per independently compressed blob.
        #[arg(long, value_parser = size::parse, default_value = "64K")]
        block_bytes: u64,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

/// Runs a benchmark and prints its figures (a table, or JSON).
pub fn run(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Array {
            data,
            parity,
            devices,
            device_size,
            chunk_size,
            checksum,
            compress,
            members,
            threads,
            queue_depth,
            pattern,
            rw,
            block_size,
            bytes,
            fail,
            data_kind,
            accel,
            flush_every,
            json,
        } => {
            let report = bench_array::run(&bench_array::Options {
                data,
                parity,
                devices,
                device_bytes: device_size,
                chunk_bytes: usize::try_from(chunk_size)?,
                checksum,
                compression: crate::create::compression(&compress).map_err(anyhow::Error::msg)?.0,
                dir: match members.as_deref() {
                    Some("memory") => None,
                    Some(dir) => Some(PathBuf::from(dir)),
                    None => Some(std::env::temp_dir()),
                },
                threads,
                queue_depth,
                random: match pattern.as_str() {
                    "seq" => false,
                    "rand" => true,
                    other => anyhow::bail!("--pattern {other}: use seq or rand"),
                },
                write: match rw.as_str() {
                    "write" => true,
                    "read" => false,
                    other => anyhow::bail!("--rw {other}: use read or write"),
                },
                block_bytes: usize::try_from(block_size)?,
                bytes,
                failed: fail,
                accel,
                flush_every,
                compressible: match data_kind.as_str() {
                    "random" => false,
                    "compressible" => true,
                    other => anyhow::bail!("--data-kind {other}: use random or compressible"),
                },
            })?;
            if json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                bench_array::print(&report);
            }
            Ok(())
        }
        BenchCommand::Ec {
            shape,
            shard_bytes,
            working_set,
            threads,
            rounds,
            seconds,
            layout,
            accel,
            gpu_batch,
            json,
        } => {
            let gpu = gpu_bench(accel)?;
            let report = bench_ec::run(&bench_ec::Options {
                data: shape.data,
                parity: shape.parity,
                shard_bytes: usize::try_from(shard_bytes)?,
                working_set_bytes: usize::try_from(working_set)?,
                threads: threads.max(1),
                kernel: shape.kernel,
                matrix: shape.matrix,
                rounds,
                seconds,
                layout,
            })?;
            let gpu = match gpu {
                Some(gpu) => {
                    let shape = tessera_accel::Shape {
                        data: shape.data,
                        parity: shape.parity,
                        chunk_bytes: usize::try_from(shard_bytes)?,
                        checksum: tessera_checksum::Algorithm::Crc32c,
                    };
                    let work = tessera_accel::cuda::bench::Work::Encode;
                    Some(tessera_accel::cuda::bench::run(
                        &gpu,
                        &shape,
                        work,
                        usize::try_from(gpu_batch)?,
                        seconds.max(1.0),
                    )?)
                }
                None => None,
            };
            if json {
                let mut value = serde_json::to_value(&report)?;
                value["gpu"] = serde_json::to_value(&gpu)?;
                println!("{value}");
            } else {
                print_ec_report(&report);
                if let Some(gpu) = &gpu {
                    print_gpu_figures("encode", gpu);
                }
            }
            Ok(())
        }
        BenchCommand::Hash {
            algorithm,
            bytes,
            block_bytes,
            accel,
            gpu_batch,
            json,
        } => bench_hash(algorithm, bytes, block_bytes, accel, gpu_batch, json),
        BenchCommand::Slots {
            used,
            rounds,
            seed,
            json,
        } => {
            let report = bench_slots::run(&bench_slots::Options { used, rounds, seed })?;
            if json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                bench_slots::print(&report);
            }
            Ok(())
        }
        BenchCommand::Compress {
            codec,
            input,
            block_bytes,
            json,
        } => {
            anyhow::ensure!(block_bytes > 0, "--block-bytes must be at least 1");
            let r = bench_data::compress(codec, input.as_deref(), usize::try_from(block_bytes)?)?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "{} on {} ({} bytes, {} B blobs): ratio {:.3}",
                    r.codec, r.input, r.input_bytes, r.block_bytes, r.ratio
                );
                println!(
                    "tessera    compress {:7.3} GB/s  decompress {:7.3} GB/s",
                    r.gbps, r.decompress_gbps
                );
                match (&r.reference, r.reference_gbps, r.reference_decompress_gbps) {
                    (Some(name), Some(c), Some(d)) => println!(
                        "reference  compress {c:7.3} GB/s  decompress {d:7.3} GB/s  ({name}); ratios {:.2}x, {:.2}x",
                        r.gbps / c,
                        r.decompress_gbps / d
                    ),
                    _ => println!("reference  (none for this codec, or the tool is not installed)"),
                }
            }
            Ok(())
        }
    }
}

/// The GPU backend for a benchmark's `--accel`: None for the CPU alone.
fn gpu_bench(accel: tessera_accel::Kind) -> Result<Option<tessera_accel::cuda::Cuda>> {
    match accel {
        tessera_accel::Kind::Cpu => Ok(None),
        tessera_accel::Kind::Cuda => Ok(Some(tessera_accel::cuda::Cuda::open(
            tessera_accel::cuda::Policy::Always,
            tessera_accel::cpu::default_threads(),
        )?)),
        tessera_accel::Kind::Auto => Ok(tessera_accel::cuda::Cuda::open(
            tessera_accel::cuda::Policy::Always,
            tessera_accel::cpu::default_threads(),
        )
        .ok()),
    }
}

fn print_gpu_figures(what: &str, f: &tessera_accel::cuda::bench::Figures) {
    println!(
        "GPU {} ({what}, batches of {} MiB): PCIe host->device {:.1} GB/s, device->host {:.1} GB/s",
        f.device,
        f.batch_bytes >> 20,
        f.host_to_device_gbps,
        f.device_to_host_gbps
    );
    println!(
        "    device-resident {:9.1} GB/s   end to end {:7.1} GB/s = {:.2}x host->device",
        f.resident_gbps,
        f.end_to_end_gbps,
        f.end_to_end_gbps / f.host_to_device_gbps
    );
    if let Some(pinned) = f.end_to_end_pinned_gbps {
        println!(
            "    end to end from lent page-locked memory {:7.1} GB/s = {:.2}x host->device",
            pinned,
            pinned / f.host_to_device_gbps
        );
    }
}

fn bench_hash(
    algorithm: Option<tessera_checksum::Algorithm>,
    bytes: u64,
    block_bytes: u64,
    accel: tessera_accel::Kind,
    gpu_batch: u64,
    json: bool,
) -> Result<()> {
    let algorithms = match algorithm {
        Some(a) => vec![a],
        None => tessera_checksum::Algorithm::ALL.to_vec(),
    };
    anyhow::ensure!(block_bytes > 0, "--block-bytes must be at least 1");
    let gpu = gpu_bench(accel)?;
    let mut reports = Vec::new();
    let mut gpu_figures = Vec::new();
    for a in algorithms {
        reports.push(bench_data::hash(
            a,
            usize::try_from(bytes)?,
            usize::try_from(block_bytes)?,
        )?);
        if let Some(gpu) = &gpu {
            if matches!(
                a,
                tessera_checksum::Algorithm::Sha256 | tessera_checksum::Algorithm::Sha3_512
            ) {
                let shape = tessera_accel::Shape {
                    data: 14,
                    parity: 2,
                    chunk_bytes: usize::try_from(block_bytes)?,
                    checksum: a,
                };
                let work = tessera_accel::cuda::bench::Work::Merkle(a);
                gpu_figures.push((
                    a,
                    tessera_accel::cuda::bench::run(gpu, &shape, work, usize::try_from(gpu_batch)?, 1.0)?,
                ));
            }
        }
    }
    // What bounds the SHA3 kernels on this GPU, measured beside them.
    let ceiling = match &gpu {
        Some(gpu)
            if gpu_figures
                .iter()
                .any(|(a, _)| *a == tessera_checksum::Algorithm::Sha3_512) =>
        {
            Some(tessera_accel::cuda::bench::ceiling(gpu)?)
        }
        _ => None,
    };
    // SHA3-512 a thread and a warp a message, from one message to a GPU's
    // worth: what sets the backend's WARP_HASH_MAX.
    let forms = match (&gpu, &ceiling) {
        (Some(gpu), Some(_)) => Some(tessera_accel::cuda::bench::hash_forms(
            gpu,
            usize::try_from(block_bytes)?,
            &[1, 16, 128, 512, 2048, 8192, 16384],
        )?),
        _ => None,
    };
    if json {
        if !gpu_figures.is_empty() {
            let gpu: Vec<_> = gpu_figures
                .iter()
                .map(|(a, f)| serde_json::json!({ "algorithm": a.name(), "figures": f }))
                .collect();
            println!(
                "{}",
                serde_json::json!({ "algorithms": reports, "gpu": gpu, "sha3_ceiling": ceiling, "sha3_forms": forms })
            );
            return Ok(());
        }
        match &reports[..] {
            [one] => println!("{}", serde_json::to_string(one)?),
            all => println!("{}", serde_json::json!({ "algorithms": all })),
        }
        return Ok(());
    }
    println!("{:<10} {:>10} {:>12}  reference", "algorithm", "GB/s", "ratio");
    for r in &reports {
        let reference = match (&r.reference, r.reference_gbps) {
            (Some(name), Some(gbps)) => format!("{gbps:.3} GB/s ({name})"),
            (Some(name), None) => format!("({name} not available)"),
            _ => "(no reference tool)".to_string(),
        };
        let ratio = r.ratio.map_or("-".to_string(), |x| format!("{x:.2}x"));
        println!("{:<10} {:>10.3} {:>12}  {reference}", r.algorithm, r.gbps, ratio);
    }
    for (algorithm, figures) in &gpu_figures {
        print_gpu_figures(&format!("{algorithm} Merkle leaves and roots"), figures);
    }
    if let Some(c) = ceiling {
        print_sha3_ceiling(&c);
    }
    for f in forms.iter().flatten() {
        let gbps = |us: f64| (f.messages * f.message_bytes) as f64 / us / 1e3;
        println!(
            "SHA3-512 leaves of {} x {} B, device-resident: a thread a message {:.1} us ({:.1} GB/s), \
             a warp a message {:.1} us ({:.1} GB/s); the backend uses {:?}",
            f.messages,
            f.message_bytes,
            f.thread_us,
            gbps(f.thread_us),
            f.warp_us,
            gbps(f.warp_us),
            f.chosen
        );
    }
    Ok(())
}

fn print_sha3_ceiling(c: &tessera_accel::cuda::bench::Ceiling) {
    use tessera_accel::cuda::bench::Ceiling;
    println!(
        "GPU issue rates, per multiprocessor per clock ({} SMs at the rated {:.0} MHz): \
         LOP3 {:.1}, SHF {:.1}, IMAD {:.1}",
        c.multiprocessors, c.clock_mhz, c.lop3_per_sm_clock, c.shf_per_sm_clock, c.imad_per_sm_clock
    );
    for (name, rate, rotation) in [
        ("shifts", c.keccak_shifts_per_s, 0),
        ("multiplies", c.keccak_multiplies_per_s, 1),
    ] {
        println!(
            "Keccak-f[1600] in registers, rotating with {name}: {:.2} G/s = {:.1} GB/s of SHA3-512 input{}",
            rate / 1e9,
            Ceiling::sha3_512_gbps(rate),
            if rotation == c.kernels_rotation {
                " (the kernels' way)"
            } else {
                ""
            }
        );
    }
}

fn print_ec_report(r: &bench_ec::Report) {
    let ratio = |ours: f64, theirs: Option<f64>| match theirs {
        Some(t) => format!("{t:8.2} GB/s   {:.2}x", ours / t),
        None => "  (ISA-L not installed)".to_string(),
    };
    println!(
        "{}+{} {} matrix, {} B shards ({:?} layout), {} stripes ({} MiB), {} thread(s), kernel {}, on {}",
        r.data,
        r.parity,
        r.matrix,
        r.shard_bytes,
        r.layout,
        r.stripes,
        r.working_set_bytes >> 20,
        r.threads,
        r.kernel,
        r.cpu
    );
    println!("          tessera      isa-l         ratio");
    println!(
        "encode  {:8.2} GB/s {}",
        r.encode_gbps,
        ratio(r.encode_gbps, r.isal_encode_gbps)
    );
    println!(
        "decode  {:8.2} GB/s {}",
        r.decode_gbps,
        ratio(r.decode_gbps, r.isal_decode_gbps)
    );
}
