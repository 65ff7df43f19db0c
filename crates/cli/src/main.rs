//! `tessera`: the command line. Each subcommand parses its flags here and
//! calls into the library crates; output meant for tools is JSON on stdout,
//! progress and diagnostics go to stderr.

mod api;
mod array_cmd;
mod bench_array;
mod bench_data;
mod bench_ec;
mod ec_files;
mod heal;
mod metrics;
mod replace;
mod serve;
mod size;
mod tco;
mod volume_cmd;

use anyhow::{Context, Result};

/// The server allocates and frees stripe-sized buffers at a high rate;
/// glibc hands large ones to mmap and back, page-faulting each time, while
/// mimalloc keeps them (degraded reads, A/B in docs/PERFORMANCE.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Returns memory freed in bulk to the system at once. Opening an array
/// decodes its checkpoint whole beside the map it fills (~200 bytes a
/// mapping, the map ~47), and mimalloc keeps freed pages a while: right
/// after opening 4 M random mappings the process held 897 MB where the
/// map held 188 (`scripts/bench-metadata.sh 4M`).
pub(crate) fn give_back_freed_memory() {
    // SAFETY: mi_collect only frees and purges the allocator's own free
    // pages; it takes nothing of ours.
    unsafe { libmimalloc_sys::mi_collect(true) }
}
/// mimalloc commits each arena (1 GiB) whole by default where the system
/// overcommits, and asks for transparent huge pages: the pages the
/// server touches then come in 2 MiB at a time, so RSS grew in steps
/// unrelated to what it held (an empty array's server held 27 MB, 12 MB
/// with arenas committed on demand; after reading 1 M random blocks back,
/// 56 MB against 28: `scripts/bench-map-rss.sh`, PERFORMANCE.md).
/// The option must be set before the first arena is reserved, which is
/// the first allocation Rust makes, before `main`: so it is set by a
/// constructor, which the loader runs before Rust's runtime starts.
/// Where `MIMALLOC_ARENA_EAGER_COMMIT` is in the environment it is left
/// to mimalloc (setting the option would override it): how its default
/// is measured against this (`scripts/bench-map-rss.sh`).
#[cfg(target_os = "linux")]
#[used]
#[link_section = ".init_array"]
static COMMIT_ALLOCATOR_MEMORY_ON_DEMAND: extern "C" fn() = {
    extern "C" fn commit_on_demand() {
        const ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
        // SAFETY: getenv reads the environment, which nothing changes
        // before main; the option is set before anything has allocated
        // through the allocator.
        unsafe {
            if libc::getenv(c"MIMALLOC_ARENA_EAGER_COMMIT".as_ptr()).is_null() {
                libmimalloc_sys::mi_option_set(ARENA_EAGER_COMMIT, 0);
            }
        }
    }
    commit_on_demand
};

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use tessera_ec::{Codec, Kernel, MatrixKind};

#[derive(Parser)]
#[command(name = "tessera", version, about = "Erasure-coded, self-checking block storage")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// A volume and a size for it (`volume create`, `volume resize`).
#[derive(clap::Args)]
struct VolumeSize {
    dir: PathBuf,
    name: String,
    #[arg(long, value_parser = size::parse)]
    size: u64,
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum VolumeAction {
    /// A new volume of SIZE; it reads as zeros and takes no space until written.
    Create(VolumeSize),
    /// Every volume, with its size and what it maps and stores.
    List {
        dir: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// A new size: growing adds zeros, shrinking discards the blocks cut off.
    Resize(VolumeSize),
    /// Deletes a volume and its data (garbage collection frees the space).
    Delete {
        dir: PathBuf,
        name: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum Command {
    /// Make an array of N members (files in DIR, or --device paths).
    Create {
        /// Data chunks per stripe (K).
        #[arg(long)]
        data: usize,
        /// Parity chunks per stripe (M): the members that may fail.
        #[arg(long)]
        parity: usize,
        /// Directory for the array (its member list, and member files with --devices).
        #[arg(long)]
        dir: PathBuf,
        /// Make this many member files in DIR.
        #[arg(long, conflicts_with = "device")]
        devices: Option<usize>,
        /// Size of each member file (suffixes K, M, G, T).
        #[arg(long, value_parser = size::parse)]
        device_size: Option<u64>,
        /// An explicit member (file or block device); repeat for each.
        #[arg(long = "device")]
        device: Vec<PathBuf>,
        /// Bytes per chunk (a multiple of 4K).
        #[arg(long, value_parser = size::parse, default_value = "64K")]
        chunk_size: u64,
        /// Checksum for every extent and chunk: crc32c, xxh3, blake3, sha256, sha3-512.
        #[arg(long, default_value = "crc32c")]
        checksum: tessera_checksum::Algorithm,
        /// Compress extents: lz4, zstd[:LEVEL], deflate[:LEVEL], snappy, or none.
        #[arg(long, default_value = "none")]
        compress: String,
        /// Exported size (may exceed the raw space: thin provisioning); default 80% of usable.
        #[arg(long, value_parser = size::parse)]
        size: Option<u64>,
        /// Space for the intent log, which makes FLUSH after a small write
        /// cheap: on each member (0: none; FLUSH then seals a short
        /// stripe), or on each --log-device. Default: on the members, room
        /// for the open stripes, 1 MiB to 1/16 of a member; on log
        /// devices, all of the smallest, up to 256 MiB.
        #[arg(long, value_parser = size::parse)]
        log_size: Option<u64>,
        /// A dedicated log device (file or block device, e.g. a fast SSD
        /// in front of slow members) holding the whole intent log instead
        /// of the members; give it twice (up to 4) for a mirror. One alone
        /// is a single point of failure for the last FLUSHed writes if it
        /// dies together with a crash.
        #[arg(long = "log-device")]
        log_device: Vec<PathBuf>,
        /// Overwrite --device members that hold data or another array's superblock.
        #[arg(long)]
        force: bool,
    },
    /// Serve the array in DIR over NBD (export name "tessera") until SIGINT or SIGTERM.
    Serve {
        dir: PathBuf,
        /// TCP address to listen on (default 127.0.0.1:10809).
        #[arg(long, conflicts_with = "socket")]
        listen: Option<String>,
        /// Unix socket to listen on instead of TCP.
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Mode of the --socket file, in octal (0660 lets its group in).
        #[arg(long, default_value = "600", value_parser = parse_mode, requires = "socket")]
        socket_mode: u32,
        /// Backend for parity, rebuilds and hashes: auto, cpu or cuda.
        #[arg(long, default_value = "auto")]
        accel: tessera_accel::Kind,
        /// Bytes of rebuilt stripes kept for degraded reads (at least 64 stripes).
        #[arg(long, value_parser = size::parse, default_value = "256M")]
        reconstruct_cache: u64,
        /// Bytes of map pages kept in memory; the rest stay on the
        /// members and are read when needed. Pages changed since the last
        /// checkpoint stay too, until it writes them.
        #[arg(long, value_parser = size::parse, default_value = "512M")]
        map_cache: u64,
        /// NBD connections served at once; more are closed at once.
        #[arg(long, default_value_t = 64)]
        max_connections: usize,
        /// Request bytes (read replies, write payloads) all connections
        /// together may hold; one connection holds at most 64M.
        #[arg(long, value_parser = size::parse, default_value = "1G")]
        max_bytes_in_flight: u64,
        /// Threads carrying out requests, shared by all connections
        /// (default: 4 per core, at least 16).
        #[arg(long)]
        workers: Option<usize>,
        /// Close a connection that has sent nothing for this many seconds
        /// with nothing in flight (0: never; guests and the kernel client
        /// may stay idle for hours).
        #[arg(long, default_value_t = 0)]
        idle_timeout: u64,
        /// TLS: off, on (clients choose) or require. Default: require
        /// when --tls-certificates or --tls-psk is given, else off.
        #[arg(long)]
        tls: Option<TlsMode>,
        /// Directory with server-cert.pem, server-key.pem (and ca-cert.pem
        /// for --tls-verify-peer), as qemu-nbd and nbdkit lay it out.
        #[arg(long, conflicts_with = "tls_psk")]
        tls_certificates: Option<PathBuf>,
        /// Pre-shared keys file in psktool's format (`identity:hexkey` lines).
        #[arg(long)]
        tls_psk: Option<PathBuf>,
        /// Require a client certificate signed by ca-cert.pem.
        #[arg(long, requires = "tls_certificates")]
        tls_verify_peer: bool,
        /// Fail a member once it has shown this many read and checksum
        /// errors since the server started, if the parity covers it (0: never).
        #[arg(long, default_value_t = tessera_array::limits::MEMBER_ERRORS_MAX_DEFAULT)]
        member_errors_max: u64,
        /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9810).
        #[arg(long)]
        metrics: Option<String>,
        /// Serve the dashboard and the control API over HTTP at ADDR (e.g.
        /// 127.0.0.1:9811). Read-only unless --http-token-file is given;
        /// an address other than loopback needs TLS and a token.
        #[arg(long)]
        http: Option<String>,
        /// PEM certificate (chain) for HTTPS on --http.
        #[arg(long, requires = "http", requires = "http_tls_key")]
        http_tls_cert: Option<PathBuf>,
        /// PEM private key of --http-tls-cert.
        #[arg(long, requires = "http_tls_cert")]
        http_tls_key: Option<PathBuf>,
        /// File whose first line is the token an HTTP client sends
        /// (`Authorization: Bearer TOKEN`) to change the array (fail,
        /// scrub, heal, replace, volumes); 16 characters at least.
        #[arg(long, requires = "http")]
        http_token_file: Option<PathBuf>,
        /// Open even if no log device of the array can be read, giving up
        /// the FLUSHed writes that only they held (without it, refused).
        #[arg(long)]
        discard_missing_log: bool,
        /// Open even if the members' activity records show the array open
        /// elsewhere (another host that died with it open: only once that
        /// host is known to be down; two writers corrupt the array)
        #[arg(long)]
        force: bool,
        /// Put garbage collection's copies into the client stripes open at
        /// the time (GC's own stripes only where none is) instead of
        /// stripes of their own: for measuring what the separation saves
        /// (scripts/bench-waf.sh).
        #[arg(long)]
        no_gc_stream: bool,
        /// Leave stale members (present but out of date: away while the
        /// array went on, or failed for errors) out instead of resyncing
        /// them at start; `tessera online` resyncs one when asked.
        #[arg(long)]
        no_auto_resync: bool,
        /// Leave stripes with a chunk on a member that is out where they
        /// are, instead of healing them onto the healthy members in the
        /// background (arrays with more members than a stripe is wide).
        #[arg(long)]
        no_auto_heal: bool,
    },
    /// Health, capacity, compression, write amplification and errors of the array in DIR.
    Status {
        dir: PathBuf,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Reads and writes per second of the served array in DIR, per volume and per member, every SECONDS (like `zpool iostat -v`).
    Iostat {
        dir: PathBuf,
        /// Seconds between reports.
        #[arg(default_value_t = 1.0)]
        seconds: f64,
        /// Reports to print, then stop (default: until Ctrl-C).
        #[arg(long)]
        count: Option<u64>,
    },
    /// What happened to the served array in DIR since it was opened (members failed, rebuilds, scrubs, heals), oldest first.
    Events {
        dir: PathBuf,
        /// Print one JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Mark member I failed, as if pulled; a served array goes on degraded.
    Fail {
        dir: PathBuf,
        #[arg(long = "device")]
        index: usize,
    },
    /// Check every chunk of every stripe of the array in DIR (checksums,
    /// Merkle roots, parity) and repair what is bad, served or not.
    /// The array's thin volumes, each served as its own NBD export by
    /// name (the default one, "tessera", is what `serve` exported before
    /// volumes); served or not.
    Volume {
        #[command(subcommand)]
        action: VolumeAction,
    },
    Scrub {
        dir: PathBuf,
        /// Bytes a second to read from the members at most (0: no limit).
        #[arg(long, value_parser = size::parse, default_value = "256M")]
        rate: u64,
        /// Print the summary as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Move the stripes that have a chunk on a member that is out onto the
    /// healthy members (arrays with more members than a stripe is wide),
    /// so they survive M more failures again without a new drive; served
    /// or not. A served array does it by itself after a failure.
    Heal {
        dir: PathBuf,
        /// Bytes a second to copy at most (0: no limit).
        #[arg(long, value_parser = size::parse, default_value = "0")]
        rate: u64,
        /// Print the summary as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Rebuild failed or missing member I of the array in DIR onto its own
    /// device or a new one, and make it healthy again. On a served array
    /// the server rebuilds it while clients go on; stopped or killed, it
    /// goes on where it was at the next start.
    Replace {
        dir: PathBuf,
        #[arg(long = "device")]
        index: usize,
        /// The new device or file (created at the members' size if it does
        /// not exist); default: the member's own, if it is there.
        #[arg(long)]
        with: Option<PathBuf>,
        /// Bytes a second to write at most while clients are idle (0: no limit).
        #[arg(long, value_parser = size::parse, default_value = "0")]
        rate: u64,
        /// Bytes a second to write at most while clients do I/O (0: as --rate).
        #[arg(long, value_parser = size::parse, default_value = "32M")]
        busy_rate: u64,
        /// Use a --with device even if it holds data or another array's superblock.
        #[arg(long)]
        force: bool,
        /// On a served array, return once the rebuild has started.
        #[arg(long)]
        detach: bool,
    },
    /// Bring member I of the array in DIR back on its own device (stale,
    /// or failed by hand): only the stripes written while it was out are
    /// rebuilt onto it. `replace --device I` without --with, by another name.
    Online {
        dir: PathBuf,
        #[arg(long = "device")]
        index: usize,
        /// Bytes a second to write at most while clients are idle (0: no limit).
        #[arg(long, value_parser = size::parse, default_value = "0")]
        rate: u64,
        /// Bytes a second to write at most while clients do I/O (0: as --rate).
        #[arg(long, value_parser = size::parse, default_value = "32M")]
        busy_rate: u64,
        /// On a served array, return once the resync has started.
        #[arg(long)]
        detach: bool,
    },
    /// Erasure-code shard files in a directory.
    #[command(subcommand)]
    Ec(EcCommand),
    /// Measure Tessera against its peers on this machine.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Probability of data loss for layouts SPANSxK+M: exact, Monte Carlo, and over time.
    Resilience {
        /// A layout such as 10x8+2 or 1x92+8; repeat to compare.
        #[arg(long = "layout", required = true)]
        layouts: Vec<tessera_model::resilience::Layout>,
        /// Drive annual failure rate (0.01 = 1%), for MTTDL.
        #[arg(long)]
        afr: Option<f64>,
        /// Hours to rebuild one failed drive.
        #[arg(long, default_value_t = 24.0)]
        rebuild_hours: f64,
        /// Mission time for the probability of loss over time.
        #[arg(long, default_value_t = 5.0)]
        mission_years: f64,
        /// Monte Carlo draws for each number of failed drives.
        #[arg(long, default_value_t = 10_000)]
        trials: u64,
        /// Monte Carlo seed (printed, so a run can be repeated).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Write the loss curves of all layouts to this file: .svg, or .png (drawn with the system's fonts).
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Print one JSON object: {"layouts": [...]}.
        #[arg(long)]
        json: bool,
    },
    /// Total cost of ownership per effective TB of one rack over its term (the SNIA model).
    Tco {
        /// A scenario: a TOML file, or a built-in example (snia-baseline, snia-csd-3.84, snia-csd-15.36).
        scenario: Option<String>,
        /// Two scenarios (files or examples) side by side, with B's saving over A.
        #[arg(long, num_args = 2, value_names = ["A", "B"])]
        compare: Vec<String>,
        #[command(flatten)]
        overrides: Box<tco::Overrides>,
        /// Print the scenario (after flags) as TOML, a starting point for a file of your own.
        #[arg(long)]
        print_toml: bool,
        /// Print one JSON object: {"inputs": ..., "report": ...}.
        #[arg(long)]
        json: bool,
    },
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
    /// Force a kernel: reference, avx2, avx2-gfni, avx512, avx512-gfni (default: the fastest; also TESSERA_EC_KERNEL).
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

/// Output that cannot be written (`tessera status >/dev/full`) ends the
/// command with a clear error and exit code 1: `println!` reports it by
/// panicking, which would otherwise print a panic and exit 101.
fn exit_cleanly_when_output_fails() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if let Some(why) = message.strip_prefix("failed printing to stdout: ") {
            eprintln!("tessera: cannot write the output: {why}");
            std::process::exit(1);
        }
        default(info);
    }));
}

fn main() -> Result<()> {
    exit_cleanly_when_output_fails();
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve { .. }) {
        // Commands that print end quietly when what reads them stops
        // (`tessera status | head`), as command-line tools do; the server
        // keeps SIGPIPE ignored and sees a closed client as an error.
        // SAFETY: setting a signal's disposition to the default, before
        // any other thread exists.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    match cli.command {
        Command::Create {
            data,
            parity,
            dir,
            devices,
            device_size,
            device,
            chunk_size,
            checksum,
            compress,
            size,
            log_size,
            log_device,
            force,
        } => array_cmd::create(&array_cmd::Create {
            data,
            parity,
            dir,
            devices,
            device_size,
            device_paths: device,
            chunk_bytes: usize::try_from(chunk_size)?,
            checksum,
            compression: parse_compression(&compress)?,
            logical_bytes: size,
            log_bytes: log_size,
            log_device_paths: log_device,
            force,
        }),
        Command::Serve {
            dir,
            listen,
            socket,
            socket_mode,
            accel,
            reconstruct_cache,
            map_cache,
            max_connections,
            max_bytes_in_flight,
            workers,
            idle_timeout,
            tls,
            tls_certificates,
            tls_psk,
            tls_verify_peer,
            member_errors_max,
            metrics,
            http,
            http_tls_cert,
            http_tls_key,
            http_token_file,
            discard_missing_log,
            force,
            no_gc_stream,
            no_auto_resync,
            no_auto_heal,
        } => {
            let defaults = tessera_nbd::Limits::default();
            let http = http
                .map(|address| {
                    serve::http::Options::from_flags(
                        address,
                        http_tls_cert.as_deref(),
                        http_tls_key.as_deref(),
                        http_token_file.as_deref(),
                    )
                })
                .transpose()?;
            serve::serve(serve::Serve {
                dir,
                listen,
                socket,
                socket_mode,
                accel,
                reconstruct_cache_bytes: usize::try_from(reconstruct_cache)?,
                map_cache_bytes: usize::try_from(map_cache)?,
                member_errors_max,
                metrics,
                discard_missing_log,
                ignore_activity: force,
                gc_stream: !no_gc_stream,
                auto_resync: !no_auto_resync,
                auto_heal: !no_auto_heal,
                limits: tessera_nbd::Limits {
                    max_connections,
                    total_bytes: usize::try_from(max_bytes_in_flight)?,
                    workers: workers.unwrap_or(defaults.workers),
                    idle_timeout: (idle_timeout > 0).then(|| std::time::Duration::from_secs(idle_timeout)),
                    ..defaults
                },
                tls: tls_settings(tls, tls_certificates, tls_psk, tls_verify_peer)?,
                http,
            })
        }
        Command::Bench(BenchCommand::Array {
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
            json,
        }) => {
            let report = bench_array::run(&bench_array::Options {
                data,
                parity,
                devices,
                device_bytes: device_size,
                chunk_bytes: usize::try_from(chunk_size)?,
                checksum,
                compression: parse_compression(&compress)?,
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
        Command::Status { dir, json } => array_cmd::status(&dir, json),
        Command::Iostat { dir, seconds, count } => array_cmd::iostat(&dir, seconds, count),
        Command::Events { dir, json } => array_cmd::events(&dir, json),
        Command::Fail { dir, index } => array_cmd::fail(&dir, index),
        Command::Volume { action } => {
            use api::VolumeChange;
            use volume_cmd::Request;
            let (dir, request, json) = match action {
                VolumeAction::Create(v) => (
                    v.dir,
                    Request::Change(VolumeChange::Create {
                        name: v.name,
                        bytes: v.size,
                    }),
                    v.json,
                ),
                VolumeAction::List { dir, json } => (dir, Request::List, json),
                VolumeAction::Resize(v) => (
                    v.dir,
                    Request::Change(VolumeChange::Resize {
                        name: v.name,
                        bytes: v.size,
                    }),
                    v.json,
                ),
                VolumeAction::Delete { dir, name, json } => (dir, Request::Change(VolumeChange::Delete { name }), json),
            };
            volume_cmd::volume(&dir, &request, json)
        }
        Command::Scrub { dir, rate, json } => array_cmd::scrub(&dir, rate, json),
        Command::Heal { dir, rate, json } => heal::heal(&dir, rate, json),
        Command::Replace {
            dir,
            index,
            with,
            rate,
            busy_rate,
            force,
            detach,
        } => replace::replace(
            &dir,
            replace::Request {
                member: index,
                with,
                rate,
                busy_rate,
                force,
            },
            detach,
        ),
        Command::Online {
            dir,
            index,
            rate,
            busy_rate,
            detach,
        } => replace::replace(
            &dir,
            replace::Request {
                member: index,
                with: None,
                rate,
                busy_rate,
                force: false,
            },
            detach,
        ),
        Command::Ec(EcCommand::Encode { shape, dir }) => ec_files::encode(&shape.codec()?, &dir),
        Command::Ec(EcCommand::Decode { shape, dir }) => ec_files::decode(&shape.codec()?, &dir),
        Command::Bench(BenchCommand::Ec {
            shape,
            shard_bytes,
            working_set,
            threads,
            rounds,
            seconds,
            accel,
            gpu_batch,
            json,
        }) => {
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
        Command::Resilience {
            layouts,
            afr,
            rebuild_hours,
            mission_years,
            trials,
            seed,
            plot,
            json,
        } => resilience(
            &layouts,
            afr,
            rebuild_hours,
            mission_years,
            trials,
            seed,
            plot.as_deref(),
            json,
        ),
        Command::Tco {
            scenario,
            compare,
            overrides,
            print_toml,
            json,
        } => tco::run(&tco::Options {
            scenario: scenario.as_deref(),
            compare: &compare,
            overrides: &overrides,
            print_toml,
            json,
        }),
        Command::Bench(BenchCommand::Hash {
            algorithm,
            bytes,
            block_bytes,
            accel,
            gpu_batch,
            json,
        }) => bench_hash(algorithm, bytes, block_bytes, accel, gpu_batch, json),
        Command::Bench(BenchCommand::Compress {
            codec,
            input,
            block_bytes,
            json,
        }) => {
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

/// `none`, or a codec name with its level (`zstd:3`).
/// A file mode in octal, at most 0777.
fn parse_mode(text: &str) -> Result<u32, String> {
    u32::from_str_radix(text, 8)
        .ok()
        .filter(|&mode| mode <= 0o777)
        .ok_or_else(|| format!("'{text}' is not a file mode in octal (like 600 or 0660)"))
}

/// `--tls`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum TlsMode {
    Off,
    On,
    Require,
}

/// The TLS a server offers, from `serve`'s flags; `None` for plaintext.
fn tls_settings(
    mode: Option<TlsMode>,
    certificates: Option<PathBuf>,
    psk: Option<PathBuf>,
    verify_peer: bool,
) -> Result<Option<tessera_nbd::Tls>> {
    let credentials = certificates.is_some() || psk.is_some();
    let mode = mode.unwrap_or(if credentials { TlsMode::Require } else { TlsMode::Off });
    let required = match mode {
        TlsMode::Off if credentials => {
            anyhow::bail!("--tls off with --tls-certificates or --tls-psk: drop one or the other")
        }
        TlsMode::Off => return Ok(None),
        _ if !credentials => anyhow::bail!("--tls on or require needs --tls-certificates DIR or --tls-psk FILE"),
        TlsMode::On => false,
        TlsMode::Require => true,
    };
    Ok(Some(match (certificates, psk) {
        (Some(dir), _) => tessera_nbd::Tls::x509(&dir, verify_peer, required)?,
        (None, Some(file)) => tessera_nbd::Tls::psk(&file, required)?,
        (None, None) => unreachable!("credentials were checked above"),
    }))
}

fn parse_compression(name: &str) -> Result<Option<tessera_compress::Codec>> {
    Ok(match name {
        "none" => None,
        name => Some(name.parse()?),
    })
}

#[allow(clippy::too_many_arguments)]
fn resilience(
    layouts: &[tessera_model::resilience::Layout],
    afr: Option<f64>,
    rebuild_hours: f64,
    mission_years: f64,
    trials: u64,
    seed: u64,
    plot: Option<&std::path::Path>,
    json: bool,
) -> Result<()> {
    use tessera_model::resilience::{self, Reliability, HOURS_PER_YEAR};
    if let Some(afr) = afr {
        anyhow::ensure!(
            afr > 0.0 && afr < 1.0,
            "--afr must be between 0 and 1 (0.01 is 1% a year)"
        );
    }
    anyhow::ensure!(rebuild_hours > 0.0, "--rebuild-hours must be positive");
    anyhow::ensure!(trials > 0, "--trials must be at least 1");
    let reliability = afr.map(|afr| Reliability {
        afr,
        rebuild_hours,
        mission_hours: mission_years * HOURS_PER_YEAR,
    });
    let reports: Vec<_> = layouts
        .iter()
        .map(|l| resilience::report(l, trials, seed, reliability))
        .collect();
    if let Some(path) = plot {
        let curves: Vec<(String, Vec<f64>)> = reports
            .iter()
            .map(|r| (r.layout.clone(), r.loss_probability.clone()))
            .collect();
        let svg = tessera_model::plot::loss_curves("Probability of data loss by drives failed", &curves);
        let png = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("png"));
        let bytes = if png {
            tessera_model::plot::svg_to_png(&svg)?
        } else {
            svg.into_bytes()
        };
        std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if json {
        println!("{}", serde_json::json!({ "layouts": reports }));
        return Ok(());
    }
    println!("Monte Carlo: {trials} draws per row, seed {seed}; interval is 95% (Wilson)");
    for r in &reports {
        println!("\n{} ({} drives)", r.layout, r.drives);
        if let Some(mttdl) = r.mttdl_hours {
            println!(
                "  MTTDL {:.3e} hours ({:.3e} years); P(loss within {mission_years} years) = {:.3e}",
                mttdl,
                mttdl / HOURS_PER_YEAR,
                r.mission_loss_probability.unwrap_or(0.0)
            );
        }
        println!(
            "  {:>6} {:>14} {:>14} {:>25}",
            "failed", "P(loss) exact", "monte carlo", "95% interval"
        );
        // Rows from the last certain survival to the first certain loss.
        let first = r.loss_probability.iter().rposition(|&p| p == 0.0).unwrap_or(0);
        let last = r.loss_probability.iter().position(|&p| p >= 1.0).unwrap_or(r.drives);
        for f in first..=last.min(r.drives) {
            let mc = &r.monte_carlo[f];
            println!(
                "  {f:>6} {:>14.6e} {:>14.6e}   [{:.4e}, {:.4e}]",
                r.loss_probability[f], mc.probability, mc.low, mc.high
            );
        }
    }
    Ok(())
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
    if json {
        if !gpu_figures.is_empty() {
            let gpu: Vec<_> = gpu_figures
                .iter()
                .map(|(a, f)| serde_json::json!({ "algorithm": a.name(), "figures": f }))
                .collect();
            println!("{}", serde_json::json!({ "algorithms": reports, "gpu": gpu }));
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
    Ok(())
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
