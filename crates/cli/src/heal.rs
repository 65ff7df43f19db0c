//! `tessera heal`, and the server's background heal: stripes with a chunk
//! on a member that is out are relocated onto healthy members, when the
//! array has more members than a stripe is wide (see the array crate's
//! `heal` module).

use anyhow::{bail, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tessera_array::{Array, HealReport, MemberState};

use crate::array_dir::{human, served_or_here, Progress};

/// How often the server's healer looks at the members.
const LOOK_INTERVAL: Duration = Duration::from_secs(1);

fn summary(report: &HealReport) -> String {
    format!(
        "heal {}: {} of {} degraded stripes moved onto healthy members ({} copied) in {:.2} s; {} stripes still short of full redundancy",
        if report.stopped { "stopped" } else { "done" },
        report.stripes_healed,
        report.stripes_total,
        human(report.bytes_relocated),
        report.milliseconds as f64 / 1000.0,
        report.stripes_degraded
    )
}

/// `tessera heal`'s flags.
#[derive(clap::Args)]
pub struct Args {
    pub dir: std::path::PathBuf,
    /// Bytes a second to copy at most (0: no limit).
    #[arg(long, value_parser = crate::size::parse, default_value = "0")]
    pub rate: u64,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// `tessera heal`: through the server if one runs, else on the array
/// opened here; progress on stderr, the summary at the end.
pub fn run(args: &Args) -> Result<()> {
    let (dir, rate, json) = (args.dir.as_path(), args.rate, args.json);
    let mut progress = Progress::new("heal");
    let report = served_or_here(
        dir,
        &crate::api::Request::Heal { rate },
        &mut progress,
        Progress::heal,
        |array, shown| array.heal_with((rate > 0).then_some(rate), shown),
    )?;
    progress.finish();
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("{}", summary(&report));
    }
    if report.stripes_degraded > 0 && !report.stopped && report.stripes_healed == 0 && report.stripes_total > 0 {
        bail!("no room on healthy members: replace the member that is out");
    }
    Ok(())
}

/// The members that are out, when they can be healed around: what the
/// healer last healed for is not healed for again.
fn out_members(array: &Array) -> Vec<usize> {
    (0..array.geometry().members)
        .filter(|&i| array.member_state(i) != MemberState::Healthy)
        .collect()
}

/// The server's healer: once a second, if members are out (none being
/// rebuilt or resynced, which would restore them anyway) and data
/// stripes have a chunk on them, heals at `rate`, once for each set of
/// members out (again if it gave way to a rebuild). Stops with `stop`,
/// gives way to a rebuild that starts, and stops when `stop_heal` is set
/// (an operator's `stop` request), not to heal for the same members again.
pub fn spawn_healer(
    array: Arc<Array>,
    stop: Arc<AtomicBool>,
    stop_heal: Arc<AtomicBool>,
    rate: u64,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("tessera-heal".to_string())
        .spawn(move || {
            let g = array.geometry();
            if g.members <= g.width() {
                return;
            }
            let mut healed_for: Vec<usize> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(LOOK_INTERVAL);
                let out = out_members(&array);
                let busy = array.rebuild_progress().is_some()
                    || out.iter().any(|&i| array.member_state(i) == MemberState::Rebuilding);
                if out.is_empty() || out == healed_for || busy {
                    continue;
                }
                let degraded = array.status().map(|s| s.stripes_degraded).unwrap_or(0);
                if degraded == 0 {
                    continue;
                }
                eprintln!(
                    "tessera: {degraded} stripes are short of full redundancy: healing them onto healthy members"
                );
                // A stop asked of a heal that runs now must hold.
                if array.heal_progress().is_none() {
                    stop_heal.store(false, Ordering::Relaxed);
                }
                let result = array.heal_with(Some(rate), |_| {
                    !stop.load(Ordering::Relaxed)
                        && !stop_heal.load(Ordering::Relaxed)
                        && array.rebuild_progress().is_none()
                });
                // A heal that gave way to a rebuild goes on if that one
                // fails (the same members are out after it).
                match result {
                    Ok(report) => {
                        eprintln!("tessera: {}", summary(&report));
                        if !report.stopped || stop_heal.load(Ordering::Relaxed) {
                            healed_for = out;
                        }
                    }
                    Err(e) => {
                        eprintln!("tessera: heal failed: {e}");
                        healed_for = out;
                    }
                }
            }
        })
}
