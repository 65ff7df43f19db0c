//! `tessera create`: an array of N members, in a directory (member
//! files it makes, or devices given), refusing devices that hold data.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tessera_array::device::{write_zeros, Device, FileDevice};
use tessera_array::{CreateOptions, EngineOptions};

use crate::array_dir::{human, refuse_if_in_use, Progress, LOG_DEVICES_FILE, MEMBERS_FILE};

/// `tessera create`'s flags.
#[derive(clap::Args)]
pub struct Create {
    /// Data chunks per stripe (K).
    #[arg(long)]
    pub data: usize,
    /// Parity chunks per stripe (M): the members that may fail.
    #[arg(long)]
    pub parity: usize,
    /// Directory for the array (its member list, and member files with --devices).
    #[arg(long)]
    pub dir: PathBuf,
    /// Make this many member files in DIR.
    #[arg(long, conflicts_with = "device_paths")]
    pub devices: Option<usize>,
    /// Size of each member file (suffixes K, M, G, T).
    #[arg(long, value_parser = crate::size::parse)]
    pub device_size: Option<u64>,
    /// An explicit member (file or block device); repeat for each.
    #[arg(long = "device", value_name = "PATH")]
    pub device_paths: Vec<PathBuf>,
    /// Bytes per chunk (a multiple of 4K).
    #[arg(long = "chunk-size", value_name = "SIZE", value_parser = crate::size::parse_usize, default_value = "64K")]
    pub chunk_bytes: usize,
    /// Checksum for every extent and chunk: crc32c, xxh3, blake3, sha256, sha3-512.
    #[arg(long, default_value = "crc32c")]
    pub checksum: tessera_checksum::Algorithm,
    /// Compress extents: lz4, zstd[:LEVEL], deflate[:LEVEL], snappy, or none.
    #[arg(long = "compress", value_name = "CODEC", value_parser = compression, default_value = "none")]
    pub compression: Compression,
    /// Exported size (may exceed the raw space: thin provisioning); default 80% of usable.
    #[arg(long = "size", value_name = "SIZE", value_parser = crate::size::parse)]
    pub logical_bytes: Option<u64>,
    /// Space for the intent log, which makes FLUSH after a small write
    /// cheap: on each member (0: none; FLUSH then seals a short
    /// stripe), or on each --log-device. Default: on the members, room
    /// for the open stripes, 1 MiB to 1/16 of a member; on log
    /// devices, all of the smallest, up to 256 MiB.
    #[arg(long = "log-size", value_name = "SIZE", value_parser = crate::size::parse)]
    pub log_bytes: Option<u64>,
    /// A dedicated log device (file or block device, e.g. a fast SSD
    /// in front of slow members) holding the whole intent log instead
    /// of the members; give it twice (up to 4) for a mirror. One alone
    /// is a single point of failure for the last FLUSHed writes if it
    /// dies together with a crash.
    #[arg(long = "log-device", value_name = "PATH")]
    pub log_device_paths: Vec<PathBuf>,
    /// Overwrite --device members that hold data or another array's superblock.
    #[arg(long)]
    pub force: bool,
    /// Write zeros over every byte of the member files this create
    /// makes, so that no later write allocates a block: on a sparse
    /// file each sync after writes to new blocks commits the file
    /// system's journal too (a durable 16 MiB KV insert's flush took
    /// 84-126 ms on sparse members, 62-70 ms on written ones). Takes
    /// the members' full size on disk, and the time to write it.
    #[arg(long)]
    pub preallocate: bool,
}

/// A codec for extents, or none (`--compress`).
#[derive(Clone, Copy, Debug)]
pub struct Compression(pub Option<tessera_compress::Codec>);

/// `none`, or a codec name with its level (`zstd:3`).
pub fn compression(name: &str) -> Result<Compression, String> {
    Ok(Compression(match name {
        "none" => None,
        name => Some(name.parse().map_err(|e| format!("{e}"))?),
    }))
}

pub fn create(c: &Create) -> Result<()> {
    let dir_made = !c.dir.exists();
    let result = create_in_dir(c);
    if result.is_err() && dir_made {
        // A refused create leaves no empty directory behind (remove_dir
        // takes only an empty one).
        let _ = std::fs::remove_dir(&c.dir);
    }
    result
}

fn create_in_dir(c: &Create) -> Result<()> {
    std::fs::create_dir_all(&c.dir).with_context(|| format!("creating {}", c.dir.display()))?;
    let list = c.dir.join(MEMBERS_FILE);
    if list.exists() {
        bail!(
            "{} already holds an array ({} exists); choose another directory",
            c.dir.display(),
            list.display()
        );
    }
    let count = c.devices.unwrap_or(c.device_paths.len());
    if c.data == 0 || c.data + c.parity > count {
        bail!(
            "{count} members for {}+{}: need K >= 1 and K+M <= N (one chunk of a stripe per member)",
            c.data,
            c.parity
        );
    }
    let mut members: Vec<(String, Arc<dyn Device>)> = Vec::new();
    let mut lines = Vec::new();
    let mut made: Vec<PathBuf> = Vec::new();
    let mut log_devices = Vec::new();
    let result = create_members(c, &mut members, &mut lines, &mut made).and_then(|()| {
        if c.preallocate {
            preallocate(&members, &made)?;
        }
        for path in &c.log_device_paths {
            // A missing file is made at the log area's size plus its header.
            let size = c
                .log_bytes
                .map(|b| b.next_multiple_of(4096) + tessera_array::format::LOG_DEVICE_AREA_START);
            if !path.exists() && size.is_none() {
                bail!(
                    "log device {} does not exist (give --log-size to create it as a file)",
                    path.display()
                );
            }
            log_devices.push(take_device(path, size, c.force, &mut made, "log device")?);
        }
        let options = CreateOptions {
            data: c.data,
            parity: c.parity,
            chunk_bytes: c.chunk_bytes,
            checksum: c.checksum,
            compression: c.compression.0,
            logical_bytes: c.logical_bytes,
            log_bytes: c.log_bytes,
        };
        if !c.force {
            let geometry = tessera_array::plan(&members, &options, &log_devices)?;
            refuse_written_regions(&members, &made, &geometry)?;
        }
        let engine = EngineOptions {
            log_devices: log_devices.clone(),
            ..EngineOptions::default()
        };
        Ok(tessera_array::create_with(
            std::mem::take(&mut members),
            &options,
            engine,
        )?)
    });
    let array = match result {
        Ok(array) => array,
        Err(error) => {
            // Leave nothing behind from a create that failed.
            for path in made {
                let _ = std::fs::remove_file(path);
            }
            return Err(error);
        }
    };
    if !log_devices.is_empty() {
        let names: Vec<&str> = log_devices.iter().map(|(name, _)| name.as_str()).collect();
        std::fs::write(c.dir.join(LOG_DEVICES_FILE), names.join("\n") + "\n")?;
    }
    std::fs::write(&list, lines.join("\n") + "\n")?;
    let s = array.status()?;
    array.close()?;
    println!(
        "created {}+{} on {} members in {}: {} stripes of {} KiB chunks, {} usable, exported as {} (checksum {}, compression {})",
        s.data,
        s.parity,
        s.members.len(),
        c.dir.display(),
        s.stripes_total,
        s.chunk_bytes >> 10,
        human(s.usable_bytes),
        human(s.logical_bytes),
        s.checksum,
        s.compression
    );
    // A stripe's summary takes room from its data area, a block's worth
    // or more where the area is a few blocks: say so, since a layout
    // that leaves a quarter of its space or more unused is rarely what
    // was meant.
    let area = s.stripes_total * s.chunk_bytes as u64 * s.data as u64;
    if (s.usable_bytes as f64) < USABLE_FRACTION_LOW * area as f64 {
        println!(
            "note: each stripe's data area of {} KiB holds {:.0}% of that in blocks beside its summary; larger chunks (--chunk-size) or more data chunks use the space better",
            (s.chunk_bytes * s.data) >> 10,
            100.0 * s.usable_bytes as f64 / area as f64
        );
    }
    Ok(())
}

/// Below this fraction of the stripes' data areas usable, `create` says why.
const USABLE_FRACTION_LOW: f64 = 0.75;

fn create_members(
    c: &Create,
    members: &mut Vec<(String, Arc<dyn Device>)>,
    lines: &mut Vec<String>,
    made: &mut Vec<PathBuf>,
) -> Result<()> {
    match (c.devices, c.device_paths.is_empty()) {
        (Some(count), true) => {
            let size = c.device_size.context("--devices needs --device-size")?;
            for i in 0..count {
                let name = format!("member-{i:03}");
                let path = c.dir.join(&name);
                let device = FileDevice::create(&path, size).with_context(|| format!("creating {}", path.display()))?;
                made.push(path.clone());
                members.push((path.display().to_string(), Arc::new(device)));
                lines.push(name);
            }
        }
        (None, false) => {
            for path in &c.device_paths {
                let (name, device) = take_device(path, c.device_size, c.force, made, "member")?;
                lines.push(name.clone());
                members.push((name, device));
            }
        }
        _ => bail!("give either --devices N --device-size SIZE, or --device PATH for each member"),
    }
    Ok(())
}

/// A `--device` or `--log-device` for `create`: a file made at `size` if
/// it does not exist (and noted in `made`), or an existing file or block
/// device that holds nothing (unless `force`); named by its absolute path.
fn take_device(
    path: &Path,
    size: Option<u64>,
    force: bool,
    made: &mut Vec<PathBuf>,
    what: &str,
) -> Result<(String, Arc<dyn Device>)> {
    let device = match (path.exists(), size) {
        (false, Some(size)) => {
            made.push(path.to_path_buf());
            FileDevice::create(path, size)
        }
        _ => FileDevice::open(path).and_then(|device| {
            if !force {
                refuse_if_in_use(path, &device)?;
            }
            Ok(device)
        }),
    }
    .with_context(|| format!("opening {what} {}", path.display()))?;
    let absolute = std::fs::canonicalize(path)?;
    Ok((absolute.display().to_string(), Arc::new(device)))
}

/// The files this create made (`made`), each named as given and in full:
/// the names members may have.
fn made_names(made: &[PathBuf]) -> Vec<PathBuf> {
    made.iter()
        .flat_map(|p| [p.clone(), std::fs::canonicalize(p).unwrap_or_default()])
        .collect()
}

/// `--preallocate`: zeros over every byte of the member files this create
/// made, all side by side, each synced; progress on stderr. The first
/// failure stops the others. Refused where it made none (the flag would
/// do nothing, and devices given may hold what they should not lose).
fn preallocate(members: &[(String, Arc<dyn Device>)], made: &[PathBuf]) -> Result<()> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let made = made_names(made);
    let files: Vec<&(String, Arc<dyn Device>)> = members
        .iter()
        .filter(|(name, _)| made.iter().any(|p| p.as_os_str() == name.as_str()))
        .collect();
    if files.is_empty() {
        bail!("--preallocate writes the member files create makes, and every member given exists already");
    }
    let total: u64 = files.iter().map(|(_, device)| device.size()).sum();
    let (written, failed) = (AtomicU64::new(0), AtomicBool::new(false));
    std::thread::scope(|scope| {
        let writers: Vec<_> = files
            .iter()
            .map(|(name, device)| {
                let (written, failed) = (&written, &failed);
                scope.spawn(move || -> Result<()> {
                    let mut went_on = |len| {
                        written.fetch_add(len, Ordering::Relaxed);
                        !failed.load(Ordering::Relaxed)
                    };
                    write_zeros(&**device, 0..device.size(), &mut went_on)
                        .and_then(|()| device.sync())
                        .inspect_err(|_| failed.store(true, Ordering::Relaxed))
                        .with_context(|| format!("writing zeros over {name}"))
                })
            })
            .collect();
        let mut progress = Progress::counting("writing zeros over the member files", "MiB");
        let message = format!("{} files", files.len());
        while !writers.iter().all(|w| w.is_finished()) {
            progress.update(written.load(Ordering::Relaxed) >> 20, total >> 20, message.clone());
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        progress.finish();
        writers
            .into_iter()
            .try_for_each(|w| w.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
    })
}

/// Refuses existing members that hold data anywhere `create` writes (the
/// regions of [`tessera_array::format::Geometry::written_at_create`]: the
/// first MiB, and the log area and backup superblock at the end, measured
/// from the smallest member), as `wipefs` looks for signatures at both
/// ends: the first MiB alone let a device with data further on be
/// formatted. Files this create made hold nothing and are not read.
fn refuse_written_regions(
    members: &[(String, Arc<dyn Device>)],
    made: &[PathBuf],
    geometry: &tessera_array::format::Geometry,
) -> Result<()> {
    let made = made_names(made);
    let mut buffer = vec![0u8; 1 << 20];
    for (name, device) in members {
        if made.iter().any(|p| p.as_os_str() == name.as_str()) {
            continue;
        }
        for region in geometry.written_at_create() {
            let mut at = region.start;
            while at < region.end {
                let len = (region.end - at).min(buffer.len() as u64) as usize;
                device.read_at(&mut buffer[..len], at)?;
                if buffer[..len].iter().any(|&b| b != 0) {
                    bail!(
                        "{name} holds data at byte {at}, where the array's superblocks or log go: refusing to overwrite it (--force to use it anyway)"
                    );
                }
                at += len as u64;
            }
        }
    }
    Ok(())
}
