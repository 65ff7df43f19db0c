//! `tessera events`: what happened to the array, oldest first, one line
//! each (UTC), or as one JSON array: asked of its server, which keeps
//! the history in the directory (`crate::history`) and adds what is not
//! there yet, or read from the directory when none serves it.

use anyhow::Result;
use std::path::PathBuf;

use crate::api::{self, Answer, Request};

/// `tessera events`'s flags.
#[derive(clap::Args)]
pub struct Args {
    pub dir: PathBuf,
    /// Print one JSON array.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &Args) -> Result<()> {
    let (dir, json) = (args.dir.as_path(), args.json);
    let take = |answer| match answer {
        Answer::Events(events) => Some(events),
        _ => None,
    };
    let events = match api::ask_for(dir, &Request::Events, take)? {
        Some(events) => events,
        None => {
            crate::array_dir::listed_lines(dir)?;
            crate::history::read(dir)?
        }
    };
    if json {
        println!("{}", serde_json::to_string(&events)?);
        return Ok(());
    }
    for event in &events {
        println!("{}  {}", utc(event.unix_ms), event.what);
    }
    Ok(())
}

/// The time of Unix milliseconds, RFC 3339 in UTC.
fn utc(unix_ms: u64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(unix_ms);
    humantime::format_rfc3339_millis(at).to_string()
}
