//! `tessera iostat`: a served array's reads and writes per second, per
//! volume and per member, like `zpool iostat -v`.

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;
use tessera_array::Status;

use crate::api::{self, Request};
use crate::status::status_of;

/// `tessera iostat`'s flags.
#[derive(clap::Args)]
pub struct Args {
    pub dir: PathBuf,
    /// Seconds between reports.
    #[arg(default_value_t = 1.0)]
    pub seconds: f64,
    /// Reports to print, then stop (default: until Ctrl-C).
    #[arg(long)]
    pub count: Option<u64>,
}

/// `tessera iostat`: the served array's status taken every `seconds`,
/// and the rates between two of them printed, per volume (its clients'
/// reads and writes of data) and per member (chunks, log blocks and
/// superblocks), `count` times or until interrupted.
pub fn run(args: &Args) -> Result<()> {
    let (dir, seconds, count) = (args.dir.as_path(), args.seconds, args.count);
    if !(seconds.is_finite() && seconds > 0.0) {
        bail!("the interval must be a positive number of seconds, not {seconds}");
    }
    let take = || -> Result<(Status, Instant)> {
        let status = api::ask_for(dir, &Request::Status, status_of)?.with_context(|| {
            format!(
                "no server serves {}: iostat shows a served array's rates (start `tessera serve {}`)",
                dir.display(),
                dir.display()
            )
        })?;
        Ok((status, Instant::now()))
    };
    let mut before = take()?;
    let mut printed = 0;
    while count.is_none_or(|c| printed < c) {
        std::thread::sleep(std::time::Duration::from_secs_f64(seconds));
        let now = take()?;
        print!(
            "{}",
            iostat_report(&before.0, &now.0, now.1.duration_since(before.1).as_secs_f64())
        );
        crate::to_stdout(std::io::stdout().flush())?;
        before = now;
        printed += 1;
    }
    Ok(())
}

/// The rates between two statuses `seconds` apart, as `iostat` prints
/// them: one line per volume and per member.
fn iostat_report(before: &Status, now: &Status, seconds: f64) -> String {
    use tessera_array::device::IoTotals;
    let rate = |now: u64, before: u64| now.saturating_sub(before) as f64 / seconds;
    let line = |what: &str, now: &IoTotals, before: &IoTotals| {
        format!(
            "{what:<40} {:>10.0} {:>10.0} {:>10.1} {:>10.1}\n",
            rate(now.reads, before.reads),
            rate(now.writes, before.writes),
            rate(now.read_bytes, before.read_bytes) / 1e6,
            rate(now.write_bytes, before.write_bytes) / 1e6
        )
    };
    let mut out = format!(
        "{:<40} {:>10} {:>10} {:>10} {:>10}\n",
        format!("over {seconds:.1} s"),
        "reads/s",
        "writes/s",
        "read MB/s",
        "write MB/s"
    );
    // Each volume, then each member: (what it is, as shown, its I/O); a
    // member's state may change between the two, its place does not.
    let rows = |s: &Status| -> Vec<(String, String, IoTotals)> {
        let volumes = s.volumes.iter().map(|v| {
            let what = format!("volume {}", v.name);
            (what.clone(), what, v.io)
        });
        let members = s.members.iter().map(|m| {
            let what = format!("  member {} {}", m.index, m.name);
            (what.clone(), format!("{what} ({})", m.state.name()), m.io)
        });
        volumes.chain(members).collect()
    };
    let was: std::collections::HashMap<String, IoTotals> =
        rows(before).into_iter().map(|(what, _, io)| (what, io)).collect();
    for (what, shown, io) in rows(now) {
        out += &line(&shown, &io, &was.get(&what).copied().unwrap_or_default());
    }
    out
}
