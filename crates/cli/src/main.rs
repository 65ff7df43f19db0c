//! `tessera`: the command line. Each subcommand parses its flags here and
//! calls into the library crates; output meant for tools is JSON on stdout,
//! progress and diagnostics go to stderr.

mod bench_ec;
mod ec_files;
mod size;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use tessera_ec::{Codec, Kernel, MatrixKind};

#[derive(Parser)]
#[command(name = "tessera", version, about = "Erasure-coded, self-checking block storage")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Erasure-code shard files in a directory.
    #[command(subcommand)]
    Ec(EcCommand),
    /// Measure Tessera against its peers on this machine.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Args)]
struct Shape {
    /// Data shards (K).
    #[arg(long)]
    data: usize,
    /// Parity shards (M).
    #[arg(long)]
    parity: usize,
    /// Encoding matrix: cauchy (any K+M <= 256) or vandermonde (ISA-L's gf_gen_rs_matrix).
    #[arg(long, default_value = "cauchy")]
    matrix: MatrixKind,
    /// Force a kernel: reference, avx2, avx512, avx512-gfni (default: the fastest; also TESSERA_EC_KERNEL).
    #[arg(long)]
    kernel: Option<Kernel>,
}

impl Shape {
    fn codec(&self) -> Result<Codec> {
        let codec = Codec::new(self.data, self.parity, self.matrix)?;
        Ok(match self.kernel {
            Some(kernel) => codec.with_kernel(kernel)?,
            None => codec,
        })
    }
}

#[derive(Subcommand)]
enum EcCommand {
    /// Write parity files K..K+M-1 from data files 0..K-1 in DIR.
    Encode {
        #[command(flatten)]
        shape: Shape,
        dir: PathBuf,
    },
    /// Recreate every missing file among 0..K+M-1 in DIR.
    Decode {
        #[command(flatten)]
        shape: Shape,
        dir: PathBuf,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
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
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Ec(EcCommand::Encode { shape, dir }) => ec_files::encode(&shape.codec()?, &dir),
        Command::Ec(EcCommand::Decode { shape, dir }) => ec_files::decode(&shape.codec()?, &dir),
        Command::Bench(BenchCommand::Ec {
            shape,
            shard_bytes,
            working_set,
            threads,
            rounds,
            seconds,
            json,
        }) => {
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
            })?;
            if json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                print_ec_report(&report);
            }
            Ok(())
        }
    }
}

fn print_ec_report(r: &bench_ec::Report) {
    let ratio = |ours: f64, theirs: Option<f64>| match theirs {
        Some(t) => format!("{t:8.2} GB/s   {:.2}x", ours / t),
        None => "  (ISA-L not installed)".to_string(),
    };
    println!(
        "{}+{} {} matrix, {} B shards, {} stripes ({} MiB), {} thread(s), kernel {}, on {}",
        r.data,
        r.parity,
        r.matrix,
        r.shard_bytes,
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
