//! `tessera volume create|list|resize|delete DIR ...`: the thin volumes of
//! an array, each served as its own NBD export by name. Asked of the
//! server that serves DIR if one does (its control socket), else done on
//! the array opened here.

use anyhow::Result;
use std::path::Path;
use tessera_array::{Array, VolumeStatus};

use crate::array_cmd::{ask_server, human, lock, open};

/// What to do to the volumes (also the control socket's request).
#[derive(Clone, Debug)]
pub enum Request {
    List,
    Create { name: String, bytes: u64 },
    Resize { name: String, bytes: u64 },
    Delete { name: String },
}

impl Request {
    /// The control socket's line for it (names hold no spaces).
    pub fn line(&self) -> String {
        match self {
            Request::List => "volume list".to_string(),
            Request::Create { name, bytes } => format!("volume create {name} {bytes}"),
            Request::Resize { name, bytes } => format!("volume resize {name} {bytes}"),
            Request::Delete { name } => format!("volume delete {name}"),
        }
    }

    /// Parses the words after `volume` on the control socket.
    pub fn parse(words: &[&str]) -> Result<Request, String> {
        let bytes = |text: &str| {
            text.parse::<u64>()
                .map_err(|_| format!("'{text}' is not a size in bytes"))
        };
        Ok(match words {
            ["list"] => Request::List,
            ["create", name, size] => Request::Create {
                name: name.to_string(),
                bytes: bytes(size)?,
            },
            ["resize", name, size] => Request::Resize {
                name: name.to_string(),
                bytes: bytes(size)?,
            },
            ["delete", name] => Request::Delete { name: name.to_string() },
            _ => {
                return Err(
                    "use 'volume list', 'volume create NAME BYTES', 'volume resize NAME BYTES' or 'volume delete NAME'"
                        .to_string(),
                )
            }
        })
    }

    /// Carries it out on `array`: the volumes after it, as JSON.
    pub fn run(&self, array: &Array) -> Result<String, tessera_array::ArrayError> {
        match self {
            Request::List => {}
            Request::Create { name, bytes } => {
                array.create_volume(name, *bytes)?;
            }
            Request::Resize { name, bytes } => array.resize_volume(name, *bytes)?,
            Request::Delete { name } => array.delete_volume(name)?,
        }
        Ok(serde_json::to_string(&array.volumes()).expect("volumes serialize"))
    }
}

pub fn volume(dir: &Path, request: &Request, json: bool) -> Result<()> {
    // Checked here too: a name with spaces would not reach the server whole.
    if let Request::Create { name, .. } = request {
        if !tessera_array::volume::valid_name(name) {
            return Err(tessera_array::ArrayError::BadVolumeName { name: name.clone() }.into());
        }
    }
    let text = match ask_server(dir, &request.line())? {
        Some(text) => text,
        None => {
            let _lock = lock(dir)?;
            let array = open(dir)?;
            let text = request.run(&array)?;
            array.close()?;
            text
        }
    };
    if json {
        println!("{text}");
        return Ok(());
    }
    let volumes: Vec<VolumeStatus> = serde_json::from_str(&text)?;
    match request {
        Request::Create { name, .. } => eprintln!("tessera: created volume {name}"),
        Request::Resize { name, bytes } => eprintln!("tessera: volume {name} is now {}", human(*bytes)),
        Request::Delete { name } => {
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
