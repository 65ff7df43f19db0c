//! `tessera fail`: a member marked failed, as if pulled.

use anyhow::Result;
use std::path::PathBuf;

use crate::api::{self, Request};
use crate::array_dir::{lock, open};

/// `tessera fail`'s flags.
#[derive(clap::Args)]
pub struct Args {
    pub dir: PathBuf,
    #[arg(long = "device", value_name = "INDEX")]
    pub index: usize,
}

pub fn run(args: &Args) -> Result<()> {
    let (dir, index) = (args.dir.as_path(), args.index);
    if api::ask(dir, &Request::Fail { member: index }, |_| {})?.is_some() {
        println!("member {index} marked failed; the served array goes on degraded");
        return Ok(());
    }
    let _lock = lock(dir)?;
    let array = open(dir)?;
    array.fail_member(index)?;
    crate::history::close_and_save(dir, &array)?;
    println!("member {index} marked failed");
    Ok(())
}
