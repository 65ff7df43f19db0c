//! `tessera scrub`: every stripe checked and repaired, served or not.

use anyhow::{bail, Result};
use std::path::PathBuf;

use crate::api::Request;
use crate::array_dir::{human, served_or_here, Progress};

/// `tessera scrub`'s flags.
#[derive(clap::Args)]
pub struct Args {
    pub dir: PathBuf,
    /// Bytes a second to read from the members at most (0: no limit).
    #[arg(long, value_parser = crate::size::parse, default_value = "256M")]
    pub rate: u64,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// `tessera scrub`: through the server if one runs, else on the array
/// opened here; progress on stderr, the summary at the end.
pub fn run(args: &Args) -> Result<()> {
    let (dir, rate, json) = (args.dir.as_path(), args.rate, args.json);
    let mut progress = Progress::new("scrub");
    let report = served_or_here(
        dir,
        &Request::Scrub { rate },
        &mut progress,
        Progress::scrub,
        |array, shown| array.scrub_with((rate > 0).then_some(rate), shown),
    )?;
    progress.finish();
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "scrub {}: {} stripes checked, {} read; {} bad chunks found, {} repaired; {} stripes with wrong parity; {} unrecoverable",
            if report.stopped { "stopped" } else { "done" },
            report.stripes_checked,
            human(report.bytes_read),
            report.chunks_bad,
            report.chunks_repaired,
            report.parity_mismatches,
            report.stripes_unrecoverable
        );
    }
    if report.stripes_unrecoverable > 0 || report.parity_mismatches > 0 {
        bail!("the scrub found damage it could not repair");
    }
    Ok(())
}
