//! `tessera volume create|list|resize|delete DIR ...`: the thin volumes of
//! an array, each served as its own NBD export by name. Asked of the
//! server that serves DIR if one does (its control socket), else done on
//! the array opened here.

use anyhow::Result;
use std::path::{Path, PathBuf};
use tessera_array::VolumeStatus;

use crate::api::{self, Answer, VolumeChange};
use crate::array_dir::{human, lock, open};

/// A volume and a size for it (`volume create`, `volume resize`).
#[derive(clap::Args)]
pub struct VolumeSize {
    pub dir: PathBuf,
    pub name: String,
    #[arg(long, value_parser = crate::size::parse)]
    pub size: u64,
    #[arg(long)]
    pub json: bool,
}

/// `tessera volume ...`.
#[derive(clap::Subcommand)]
pub enum Action {
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

/// Runs `tessera volume ACTION`.
pub fn run(action: Action) -> Result<()> {
    let (dir, request, json) = match action {
        Action::Create(v) => (
            v.dir,
            Request::Change(VolumeChange::Create {
                name: v.name,
                bytes: v.size,
            }),
            v.json,
        ),
        Action::List { dir, json } => (dir, Request::List, json),
        Action::Resize(v) => (
            v.dir,
            Request::Change(VolumeChange::Resize {
                name: v.name,
                bytes: v.size,
            }),
            v.json,
        ),
        Action::Delete { dir, name, json } => (dir, Request::Change(VolumeChange::Delete { name }), json),
    };
    volume(&dir, &request, json)
}

/// What to do to the volumes: list them, or a change (the API's).
#[derive(Clone, Debug)]
pub enum Request {
    List,
    Change(VolumeChange),
}

impl Request {
    /// The API's request for it.
    fn api(&self) -> api::Request {
        match self {
            Request::List => api::Request::Volumes,
            Request::Change(change) => api::Request::Volume(change.clone()),
        }
    }
}

fn volume(dir: &Path, request: &Request, json: bool) -> Result<()> {
    let take = |answer| match answer {
        Answer::Volumes(volumes) => Some(volumes),
        _ => None,
    };
    let volumes: Vec<VolumeStatus> = match api::ask_for(dir, &request.api(), take)? {
        Some(volumes) => volumes,
        None => {
            let _lock = lock(dir)?;
            let array = open(dir)?;
            if let Request::Change(change) = request {
                change.apply(&array)?;
            }
            let volumes = array.volumes();
            match request {
                Request::Change(_) => crate::history::close_and_save(dir, &array)?,
                Request::List => array.close()?,
            }
            volumes
        }
    };
    if json {
        println!("{}", serde_json::to_string(&volumes)?);
        return Ok(());
    }
    match request {
        Request::Change(VolumeChange::Create { name, .. }) => eprintln!("tessera: created volume {name}"),
        Request::Change(VolumeChange::Resize { name, bytes }) => {
            eprintln!("tessera: volume {name} is now {}", human(*bytes))
        }
        Request::Change(VolumeChange::Delete { name }) => {
            eprintln!("tessera: deleted volume {name}; garbage collection frees its space")
        }
        Request::List => {}
    }
    println!("{:<24} {:>12} {:>12} {:>12}", "NAME", "SIZE", "MAPPED", "STORED");
    for v in volumes {
        println!(
            "{:<24} {:>12} {:>12} {:>12}",
            v.name,
            human(v.bytes),
            human(v.mapped_bytes),
            human(v.stored_bytes)
        );
    }
    Ok(())
}
