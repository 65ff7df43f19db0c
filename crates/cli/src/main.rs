//! `tessera`: the command line. Each command is a module of its own with
//! its flags (clap's `Args`) and what it does; this file only lists them
//! and dispatches. Output meant for tools is JSON on stdout, progress and
//! diagnostics go to stderr.

mod api;
mod array_dir;
mod bench;
mod bench_array;
mod bench_data;
mod bench_ec;
mod bench_slots;
mod create;
mod ec_files;
mod events;
mod fail;
mod heal;
mod history;
mod iostat;
mod kv;
mod metrics;
mod replace;
mod resilience;
mod scrub;
mod serve;
mod size;
mod status;
mod stop;
mod tco;
mod volume;

use anyhow::Result;

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
/// Two of mimalloc's defaults, changed so that RSS follows what the
/// server holds:
/// - It commits each arena (1 GiB) whole where the system overcommits,
///   and asks for transparent huge pages: the pages the server touches
///   then come in 2 MiB at a time, so RSS grew in steps unrelated to what
///   it held (an empty array's server held 27 MB, 12 MB with arenas
///   committed on demand; after reading 1 M random blocks back, 56 MB
///   against 28: `scripts/bench-map-rss.sh`, PERFORMANCE.md).
/// - It gives freed memory back to the system 10 ms after it was freed,
///   each further free in the same segment putting that off by 1 ms, and
///   only when the segment is next used (mimalloc 2's `segment.c`): a
///   segment under steady churn, or one whose thread then waits (a
///   checkpoint done), keeps it. With a map past its cache, pages read
///   in, evicted and written by checkpoints come and go all the time:
///   under 1 M scattered writes with a 32 MiB cache the server peaked at
///   149-171 MB; at 114-120 MB with the delay at 0 or 1 ms. At 0 every
///   span freed is given back, and page-faulted in again when next used:
///   reading a map back in took 2.7-4x the page faults (139-210 k against
///   52 k); at 1 ms, 55-76 k (PERFORMANCE.md, "Freed memory given back
///   within a millisecond").
///
/// The options must be set before the first arena is reserved, which is
/// the first allocation Rust makes, before `main`: so they are set by a
/// constructor, which the loader runs before Rust's runtime starts.
/// Where `MIMALLOC_<OPTION>` is in the environment that option is left
/// to mimalloc (setting it would override the environment): how its
/// default is measured against this (`scripts/bench-map-rss.sh`).
#[cfg(target_os = "linux")]
#[used]
#[link_section = ".init_array"]
static SET_ALLOCATOR_OPTIONS: extern "C" fn() = {
    extern "C" fn set_options() {
        for (option, name, value) in ALLOCATOR_OPTIONS {
            // SAFETY: getenv reads the environment, which nothing changes
            // before main; the options are set before anything has
            // allocated through the allocator.
            unsafe {
                if libc::getenv(name.as_ptr()).is_null() {
                    libmimalloc_sys::mi_option_set(option, value);
                }
            }
        }
    }
    set_options
};

/// mimalloc's options the server sets (their numbers in mimalloc 2's
/// `mi_option_e`, which `libmimalloc-sys` does not name), each with the
/// environment variable that overrides it and its value.
#[cfg(target_os = "linux")]
const ALLOCATOR_OPTIONS: [(libmimalloc_sys::mi_option_t, &std::ffi::CStr, std::ffi::c_long); 2] = [
    // mi_option_arena_eager_commit: arenas committed on demand.
    (4, c"MIMALLOC_ARENA_EAGER_COMMIT", 0),
    // mi_option_purge_delay: freed memory given back after 1 ms.
    (15, c"MIMALLOC_PURGE_DELAY", 1),
];

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "tessera", version, about = "Erasure-coded, self-checking block storage")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Make an array of N members (files in DIR, or --device paths).
    Create(create::Create),
    /// Serve the array in DIR over NBD (export name "tessera") until SIGINT or SIGTERM.
    Serve(Box<serve::Serve>),
    /// Health, capacity, compression, write amplification and errors of the array in DIR.
    ///
    /// Asked of the array's server if one serves it. Otherwise the array is
    /// opened here and closed cleanly: after a crash it is recovered first,
    /// as `serve` would, and the close writes a checkpoint of what was
    /// recovered; after a clean stop only the members' activity records
    /// are written.
    Status(status::Args),
    /// Reads and writes per second of the served array in DIR, per volume and per member, every SECONDS (like `zpool iostat -v`).
    Iostat(iostat::Args),
    /// What happened to the served array in DIR since it was opened (members failed, rebuilds, scrubs, heals), oldest first.
    Events(events::Args),
    /// Mark member I failed, as if pulled; a served array goes on degraded.
    Fail(fail::Args),
    /// The array's thin volumes, each served as its own NBD export by
    /// name (the default one, "tessera", is what `serve` exported before
    /// volumes); served or not.
    Volume {
        #[command(subcommand)]
        action: volume::Action,
    },
    /// Check every chunk of every stripe of the array in DIR (checksums,
    /// Merkle roots, parity) and repair what is bad, served or not.
    Scrub(scrub::Args),
    /// Move the stripes that have a chunk on a member that is out onto the
    /// healthy members (arrays with more members than a stripe is wide),
    /// so they survive M more failures again without a new drive; served
    /// or not. A served array does it by itself after a failure.
    Heal(heal::Args),
    /// Rebuild failed or missing member I of the array in DIR onto its own
    /// device or a new one, and make it healthy again. On a served array
    /// the server rebuilds it while clients go on; stopped or killed, it
    /// goes on where it was at the next start.
    Replace(replace::Replace),
    /// Bring member I of the array in DIR back on its own device (stale,
    /// or failed by hand): only the stripes written while it was out are
    /// rebuilt onto it. `replace --device I` without --with, by another name.
    Online(replace::Online),
    /// Stop the scrub, heal or rebuild the server of the array in DIR is
    /// running (a rebuild stopped goes on at the server's next start, or
    /// with `replace`/`online` again).
    Stop(stop::Args),
    /// KV spaces of a served array (`serve DIR --kv ADDR`): create, insert
    /// records in bulk, finalize (the server then sorts and indexes),
    /// query, status, drop.
    Kv(kv::Args),
    /// Erasure-code shard files in a directory.
    #[command(subcommand)]
    Ec(ec_files::EcCommand),
    /// Measure Tessera against its peers on this machine.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Probability of data loss for layouts SPANSxK+M: exact, Monte Carlo, and over time.
    Resilience(resilience::Resilience),
    /// Total cost of ownership per effective TB of one rack over its term (the SNIA model).
    Tco(tco::Options),
}

/// Output that cannot be written (`tessera status >/dev/full`) ends the
/// command with a clear error and exit code 1: `println!` reports it by
/// panicking, which would otherwise print a panic and exit 101. Output
/// whose reader is gone (`tessera status | head`) ends it quietly
/// (`reader_gone`).
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
            if why == std::io::Error::from_raw_os_error(libc::EPIPE).to_string() {
                reader_gone();
            }
            eprintln!("tessera: cannot write the output: {why}");
            std::process::exit(1);
        }
        default(info);
    }));
}

/// Ends the command quietly because what read its output is gone, as
/// command-line tools do, with the status a shell reports for one that
/// SIGPIPE ended (128 + 13). SIGPIPE itself stays ignored (Rust's
/// default) in every command: a socket whose peer went away (a gRPC
/// client's vectored write to a server that closed the connection) is
/// then an error the command reports, not a silent death.
pub(crate) fn reader_gone() -> ! {
    std::process::exit(128 + libc::SIGPIPE)
}

/// `result` of a write to standard output, ending the command quietly
/// if its reader is gone (`reader_gone`).
pub(crate) fn to_stdout<T>(result: std::io::Result<T>) -> std::io::Result<T> {
    if matches!(&result, Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe) {
        reader_gone();
    }
    result
}

/// Standard output for writers that pass its errors on as their own
/// (the CSV writer's become strings): its reader gone ends the command
/// quietly first, as `println!`'s does.
pub(crate) struct Stdout;

impl std::io::Write for Stdout {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        to_stdout(std::io::stdout().write(bytes))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        to_stdout(std::io::stdout().flush())
    }
}

fn main() -> Result<()> {
    exit_cleanly_when_output_fails();
    let cli = Cli::parse();
    match cli.command {
        Command::Create(c) => create::create(&c),
        Command::Serve(s) => serve::serve(*s),
        Command::Status(a) => status::run(&a),
        Command::Iostat(a) => iostat::run(&a),
        Command::Events(a) => events::run(&a),
        Command::Fail(a) => fail::run(&a),
        Command::Volume { action } => volume::run(action),
        Command::Kv(a) => kv::run(a),
        Command::Scrub(a) => scrub::run(&a),
        Command::Heal(a) => heal::run(&a),
        Command::Replace(r) => replace::replace(&r.dir, r.request, r.detach),
        Command::Online(o) => replace::replace(&o.dir, o.request(), o.detach),
        Command::Stop(a) => stop::run(&a),
        Command::Ec(command) => ec_files::run(command),
        Command::Bench(command) => bench::run(command),
        Command::Resilience(r) => resilience::run(&r),
        Command::Tco(t) => tco::run(&t),
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::ALLOCATOR_OPTIONS;

    /// Set in the process this test runs again, with other values in the
    /// options' own variables.
    const CHILD: &str = "TESSERA_ALLOCATOR_OPTIONS_CHILD";

    /// Each option the server sets has its value; and in a second run of
    /// this test with `MIMALLOC_<OPTION>` set to other values, mimalloc
    /// reads those back through the same numbers, so each number is the
    /// option its variable names (`libmimalloc-sys` names neither).
    #[test]
    fn the_allocator_commits_on_demand_and_gives_freed_memory_back_within_a_millisecond() {
        // Values unlike the server's and mimalloc's defaults (2 and 10).
        let others: [std::ffi::c_long; 2] = [1, 7];
        let child = std::env::var_os(CHILD).is_some();
        for ((option, name, value), other) in ALLOCATOR_OPTIONS.into_iter().zip(others) {
            let name = name.to_str().expect("ASCII");
            let wanted = match (child, std::env::var(name)) {
                (true, _) => other,
                (false, Ok(_)) => continue,
                (false, Err(_)) => value,
            };
            // SAFETY: reads an option, which mimalloc keeps for the process.
            let got = unsafe { libmimalloc_sys::mi_option_get(option) };
            assert_eq!(got, wanted, "{name}");
        }
        if child {
            return;
        }
        let mut again = std::process::Command::new(std::env::current_exe().expect("this test's binary"));
        again
            .args([
                "tests::the_allocator_commits_on_demand_and_gives_freed_memory_back_within_a_millisecond",
                "--exact",
            ])
            .env(CHILD, "1");
        for ((_, name, _), other) in ALLOCATOR_OPTIONS.into_iter().zip(others) {
            again.env(name.to_str().expect("ASCII"), other.to_string());
        }
        let out = again.output().expect("the test run again");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && said.contains("1 passed"),
            "with other values in the environment: {said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
