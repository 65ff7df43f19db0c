//! `tessera stop DIR JOB`: a running scrub, heal or rebuild of a served
//! array stopped (the API's `stop`).

use anyhow::{Context, Result};
use std::path::PathBuf;

use crate::api::{self, Job, Request};

/// `tessera stop`'s flags.
#[derive(clap::Args)]
pub struct Args {
    pub dir: PathBuf,
    /// What to stop: scrub, heal or rebuild.
    pub job: Job,
}

pub fn run(args: &Args) -> Result<()> {
    let dir = args.dir.as_path();
    api::ask(dir, &Request::Stop { job: args.job }, |_| {})?.with_context(|| {
        format!(
            "no server serves {}: a scrub, heal or rebuild run by a command stops with Ctrl-C",
            dir.display()
        )
    })?;
    println!("the {} stops at its next step", args.job.name());
    Ok(())
}
