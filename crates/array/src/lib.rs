//! The array: N member devices as one checked, erasure-coded block volume.
//!
//! Bottom up, each module owning one thing (threads and locks: `docs/ENGINE.md`):
//!
//! - [`device`]: the I/O seam (files, block devices, a faulty in-memory device for tests).
//! - [`format`]: superblocks, chunk headers, stripe summaries, checkpoints, placement.
//! - [`limits`]: the engine's limits and defaults, with why.
//! - [`stripe`]: packing one stripe, sealing it, reading it back whole.
//! - [`map`]: logical blocks to extents (L2P), with versions.
//! - [`slots`]: what each stripe slot holds; allocation; pins.
//! - `members`: member health and the superblocks that record it.
//! - `io`: each member's queue of chunk writes, and syncs.
//! - `engine`: the shared state and the public [`Array`]; beside it `write`,
//!   `read`, `cache`, `repair`, `gc`, `checkpoint`, `recovery`,
//!   `maintenance` and `status`.
//!
//! [`create`] formats members; [`open`] checks them and recovers the map.

pub mod activity;
mod cache;
mod checkpoint;
pub mod device;
mod engine;
pub mod format;
mod gc;
mod heal;
mod intent;
mod io;
pub mod limits;
mod maintenance;
pub mod map;
mod members;
mod pages;
mod read;
mod rebuild;
mod recovery;
mod repair;
mod slot_set;
pub mod slots;
mod status;
pub mod stripe;
pub mod volume;
mod volumes;
mod write;

use device::Device;
use format::{FormatError, Geometry, Superblock, BLOCK_BYTES, MEMBER_COUNT_MAX, SECTOR_BYTES};
use std::sync::Arc;

pub use engine::{hex, Array, EngineOptions};
pub use heal::HealReport;
pub use intent::{LogRecovery, LogStatus};
pub use members::{Member, MemberState};
pub use rebuild::{RebuildOptions, RebuildReport, RebuildResume};
pub use recovery::Recovery;
pub use repair::ScrubReport;
pub use status::{AcceleratorStatus, MemberStatus, Status};
pub use volume::VolumeStatus;
pub use volumes::Volume;
pub use write::extent_blocks_max;

#[derive(Debug, thiserror::Error)]
pub enum ArrayError {
    #[error("{0}")]
    Codec(tessera_ec::EcError),
    #[error("accelerator: {0}")]
    Accel(tessera_accel::AccelError),
    #[error("compression failed: {0}")]
    Compress(tessera_compress::CompressError),
    #[error("I/O error on member {member} ({name}): {source}")]
    Io {
        member: usize,
        name: String,
        source: std::io::Error,
    },
    #[error("the engine could not start its {what}: {source}; the system is short of threads or memory")]
    ThreadStart { what: &'static str, source: std::io::Error },
    #[error("bad geometry: {0}")]
    Geometry(#[from] GeometryError),
    #[error("log device {name}: {why}")]
    LogDevice { name: String, why: String },
    #[error("no log device of the array can be read ({why}): the last FLUSHed writes may be only there. Bring one back, or open with the missing log discarded (serve --discard-missing-log) to go on without them")]
    LogDevicesMissing { why: String },
    #[error("{name} is not a member of a Tessera array: {source}")]
    NotAMember { name: String, source: FormatError },
    #[error("{name} belongs to another array ({found}), not {expected}")]
    ForeignMember {
        name: String,
        found: String,
        expected: String,
    },
    #[error("{first} and {second} both claim to be member {index}")]
    DuplicateMember {
        index: usize,
        first: String,
        second: String,
    },
    #[error("{name} disagrees with the other members about the array's geometry")]
    WrongMember { name: String },
    #[error("{unavailable} members are missing or failed, more than the {parity} parity can cover: the array cannot be opened{why}")]
    TooManyUnavailable {
        unavailable: usize,
        parity: usize,
        /// The devices left out, and why ("; ..." each).
        why: String,
    },
    #[error(
        "none of the {listed} devices listed holds a superblock of a Tessera array: the array cannot be opened{why}"
    )]
    NoMemberFound {
        listed: usize,
        /// The devices left out, and why ("; ..." each).
        why: String,
    },
    #[error("{name} is in use: the array is open elsewhere (process {pid}: {why}); stop it first, or, if it is truly gone (a host that died), open with --force")]
    ActiveElsewhere { name: String, pid: u32, why: String },
    #[error("a scrub is already running on this array")]
    ScrubRunning,
    #[error("a heal is already running on this array")]
    HealRunning,
    #[error("heal needs more members than a stripe is wide: {members} members, stripes of {width}; replace the member instead")]
    NoRoomToHeal { members: usize, width: usize },
    #[error("member {index} is healthy: there is nothing to rebuild (fail it first to replace its device)")]
    MemberHealthy { index: usize },
    #[error("the device for member {index} holds {size} bytes; members need {need}")]
    DeviceTooSmall { index: usize, size: u64, need: u64 },
    #[error("member {index} is being rebuilt already")]
    RebuildRunning { index: usize },
    #[error("the rebuild of member {index} stopped: its device failed, or it was failed by hand; it stays failed")]
    RebuildStopped { index: usize },
    #[error(
        "the devices are split evenly between arrays {first} and {second} ({count} each): list one array's members"
    )]
    SplitMembers {
        first: String,
        second: String,
        count: usize,
    },
    #[error("failing another member would leave {failed} failed with only {parity} parity: refused")]
    TooManyFailed { failed: usize, parity: usize },
    #[error("writes are refused: {why}; reads go on where they can. Restart the array once the members are back")]
    WritesRefused { why: String },
    #[error("there is no member {index}: the array has {members}")]
    NoSuchMember { index: usize, members: usize },
    #[error("{offset}+{len} is outside the volume of {size} bytes")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("the array is full: live data fills it; trim or overwrite data, or create a larger array")]
    NoSpace,
    #[error("stripe in slot {slot} cannot be read: fewer than K good chunks or a bad checksum")]
    Unreadable { slot: u64 },
    #[error("stripe in slot {slot} has {good} good chunks, fewer than the {need} needed")]
    TooFewChunks { slot: u64, good: usize, need: usize },
    #[error("the map checkpoint cannot be used: {why}")]
    CheckpointUnreadable { why: String },
    #[error("map page {page} cannot be used: {source}; its map stripes could not give back a good image (more members lost or damaged than the parity covers)")]
    MapPage {
        page: u64,
        source: crate::format::FormatError,
    },
    #[error("no member holds the volume table the superblocks name (CRC {crc:08x}): the volumes cannot be opened; bring back the members that were set aside")]
    VolumeTableUnreadable { crc: u32 },
    #[error("there is no volume {name:?}")]
    NoSuchVolume { name: String },
    #[error("a volume named {name:?} exists already")]
    VolumeExists { name: String },
    #[error(
        "{name:?} cannot be a volume's name: 1 to 64 letters, digits and '-', '_', '.', ':', not starting with '.'"
    )]
    BadVolumeName { name: String },
    #[error("a volume of {bytes} bytes is refused: a volume is 4 KiB to 4 PiB, in whole 4 KiB blocks")]
    BadVolumeSize { bytes: u64 },
    #[error("the array has {count} volumes, the most it can hold")]
    TooManyVolumes { count: usize },
    #[error("the default volume ({name:?}) cannot be deleted")]
    DefaultVolume { name: String },
    #[error("volume {name:?} was deleted")]
    VolumeGone { name: String },
}

/// Why `create` refuses a geometry (the shape, the members' size, the
/// sizes asked for), with what to change.
#[derive(Debug, thiserror::Error)]
pub enum GeometryError {
    #[error("K={data}, M={parity}: need K >= 1 and K+M <= 256")]
    Shape { data: usize, parity: usize },
    #[error("{members} members for K+M={width}: need K+M <= N <= {MEMBER_COUNT_MAX}")]
    MemberCount { members: usize, width: usize },
    #[error(
        "chunk size {bytes}: use a multiple of 4 KiB from {} to {}",
        format::CHUNK_BYTES_MIN,
        format::CHUNK_BYTES_MAX
    )]
    ChunkSize { bytes: usize },
    #[error("a log of {log_bytes} bytes does not fit members of {member_bytes} bytes")]
    LogTooLarge { log_bytes: u64, member_bytes: u64 },
    #[error(
        "members of {member_bytes} bytes hold {slots} stripes of {chunk_bytes}-byte chunks; need at least {SLOTS_MIN}: use larger members or smaller chunks"
    )]
    TooFewStripes {
        member_bytes: u64,
        slots: u64,
        chunk_bytes: usize,
    },
    #[error("a stripe's data area of {data_area_bytes} bytes holds no 4 KiB block and its summary: use larger chunks")]
    NoRoomForABlock { data_area_bytes: usize },
    #[error("logical size {bytes}: use a positive multiple of 4 KiB")]
    LogicalSize { bytes: u64 },
    #[error(
        "logical size {bytes}: at most {} bytes (4 PiB, the largest volume: a volume is 2^40 blocks)",
        format::LOGICAL_BYTES_MAX
    )]
    LogicalTooLarge { bytes: u64 },
}

/// Settings for a new array.
#[derive(Clone, Debug)]
pub struct CreateOptions {
    pub data: usize,
    pub parity: usize,
    pub chunk_bytes: usize,
    pub checksum: tessera_checksum::Algorithm,
    pub compression: Option<tessera_compress::Codec>,
    /// Exported size; default: 80% of the usable capacity less the
    /// engine's reserves, which leaves garbage collection room to work.
    pub logical_bytes: Option<u64>,
    /// Bytes of each member kept for the intent log (rounded up to 4 KiB;
    /// 0: none, FLUSH seals short stripes); default:
    /// `limits::log_bytes_default`.
    pub log_bytes: Option<u64>,
}

/// Stripe slots an array needs at least: the reserves (GC, open stripes,
/// a checkpoint) and a window.
const SLOTS_MIN: u64 = 16;

/// The exported size by default: a fraction of the usable space after the
/// slots the engine keeps for itself.
fn default_logical_bytes(geometry: &Geometry) -> u64 {
    use limits::{DEFAULT_LOGICAL_FRACTION, GC_RESERVE_SLOTS};
    let reserved = (GC_RESERVE_SLOTS + limits::open_stripe_count(geometry.slot_count()) + 3) as u64;
    let usable = geometry.slot_count().saturating_sub(reserved) * write::stripe_fill_bytes(geometry, None);
    let block = BLOCK_BYTES as u64;
    ((usable as f64 * DEFAULT_LOGICAL_FRACTION) as u64 / block) * block
}

/// Formats `devices` (named for messages) as a new array and opens it.
pub fn create(devices: Vec<(String, Arc<dyn Device>)>, options: &CreateOptions) -> Result<Array, ArrayError> {
    create_with(devices, options, EngineOptions::default())
}

/// The geometry `create` would give an array of these members and log
/// devices (checked as `create` checks it), without writing anything: what
/// a caller needs to know where `create` will write
/// ([`Geometry::written_at_create`]).
pub fn plan(
    devices: &[(String, Arc<dyn Device>)],
    options: &CreateOptions,
    log_devices: &[(String, Arc<dyn Device>)],
) -> Result<Geometry, ArrayError> {
    let (k, m, n) = (options.data, options.parity, devices.len());
    let bad = |why: GeometryError| Err(ArrayError::Geometry(why));
    if k == 0 || k + m > 256 {
        return bad(GeometryError::Shape { data: k, parity: m });
    }
    if n < k + m || n > MEMBER_COUNT_MAX {
        return bad(GeometryError::MemberCount {
            members: n,
            width: k + m,
        });
    }
    let c = options.chunk_bytes;
    if !(format::CHUNK_BYTES_MIN..=format::CHUNK_BYTES_MAX).contains(&c) || !c.is_multiple_of(SECTOR_BYTES) {
        return bad(GeometryError::ChunkSize { bytes: c });
    }
    let member_bytes = devices.iter().map(|(_, d)| d.size()).min().unwrap_or(0);
    let mut geometry = Geometry {
        data: k,
        parity: m,
        members: n,
        chunk_bytes: c,
        rows: 0,
        member_bytes,
        logical_bytes: 0,
        checksum: options.checksum,
        compression: options.compression,
        log_bytes: 0,
        log_devices: 0,
        log_device_bytes: 0,
    };
    let asked = options
        .log_bytes
        .map(|bytes| bytes.next_multiple_of(SECTOR_BYTES as u64));
    if log_devices.is_empty() {
        geometry.log_bytes = asked.unwrap_or_else(|| limits::log_bytes_default(&geometry));
    } else {
        // The log is on the log devices, all of it: none on the members.
        let (name, smallest) = log_devices.iter().min_by_key(|(_, d)| d.size()).expect("not empty");
        let name = name.clone();
        let room =
            smallest.size().saturating_sub(format::LOG_DEVICE_AREA_START) / SECTOR_BYTES as u64 * SECTOR_BYTES as u64;
        let area = asked.unwrap_or(room.min(limits::LOG_DEVICE_BYTES_DEFAULT_MAX));
        if log_devices.len() > format::LOG_DEVICES_MAX {
            return Err(ArrayError::LogDevice {
                name,
                why: format!("{} log devices: at most {}", log_devices.len(), format::LOG_DEVICES_MAX),
            });
        }
        if area < limits::LOG_BYTES_MIN || area > room || area / SECTOR_BYTES as u64 > u64::from(u32::MAX) {
            return Err(ArrayError::LogDevice {
                name,
                why: format!(
                    "a log area of {area} bytes does not fit it ({room} bytes after its header), or is under {} bytes",
                    limits::LOG_BYTES_MIN
                ),
            });
        }
        geometry.log_devices = log_devices.len();
        geometry.log_device_bytes = area;
    }
    if geometry.log_bytes / SECTOR_BYTES as u64 > u64::from(u32::MAX)
        || geometry.log_bytes + format::DATA_START + SECTOR_BYTES as u64 > member_bytes
    {
        return bad(GeometryError::LogTooLarge {
            log_bytes: geometry.log_bytes,
            member_bytes,
        });
    }
    geometry.rows = Geometry::rows_for(member_bytes, c, geometry.log_bytes);
    if geometry.slot_count() < SLOTS_MIN {
        return bad(GeometryError::TooFewStripes {
            member_bytes,
            slots: geometry.slot_count(),
            chunk_bytes: c,
        });
    }
    if extent_blocks_max(&geometry) == 0 {
        return bad(GeometryError::NoRoomForABlock {
            data_area_bytes: geometry.data_area_bytes(),
        });
    }
    geometry.logical_bytes = match options.logical_bytes {
        Some(bytes) if bytes == 0 || bytes % BLOCK_BYTES as u64 != 0 => {
            return bad(GeometryError::LogicalSize { bytes })
        }
        Some(bytes) if bytes > format::LOGICAL_BYTES_MAX => return bad(GeometryError::LogicalTooLarge { bytes }),
        Some(bytes) => bytes,
        None => default_logical_bytes(&geometry),
    };
    Ok(geometry)
}

/// [`create`], run with `engine` options.
pub fn create_with(
    devices: Vec<(String, Arc<dyn Device>)>,
    options: &CreateOptions,
    engine: EngineOptions,
) -> Result<Array, ArrayError> {
    let geometry = plan(&devices, options, &engine.log_devices)?;
    let superblock = Superblock {
        array_uuid: rand::random(),
        member_uuid: [0; 16],
        member_index: 0,
        geometry,
        generation: 1,
        failed: [0; MEMBER_COUNT_MAX / 8],
        log_failed: 0,
        checkpoint: None,
        volume_table_crc: 0,
        volume_table: None,
        created_unix_seconds: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    let members: Vec<Member> = devices
        .into_iter()
        .map(|(name, device)| Member {
            name,
            uuid: rand::random(),
            device: Some(device),
            state: MemberState::Healthy,
        })
        .collect();
    // A stale chunk header of a reused device names another array's uuid
    // and is ignored; only the log areas and the superblocks are written.
    for (i, member) in members.iter().enumerate() {
        if let Some(device) = &member.device {
            intent::clear_log_area(&**device, &superblock.geometry).map_err(|source| ArrayError::Io {
                member: i,
                name: member.name.clone(),
                source,
            })?;
        }
    }
    let template = superblock.clone();
    let targets: Vec<(usize, [u8; 16], Arc<dyn Device>)> = members
        .iter()
        .enumerate()
        .filter_map(|(i, m)| m.device.clone().map(|d| (i, m.uuid, d)))
        .collect();
    let log_devices = intent::format_log_devices(
        &engine.log_devices,
        superblock.array_uuid,
        superblock.geometry.log_device_bytes,
    )?;
    if let Some((member, source)) = members::write_superblocks(&template, &targets).into_iter().next() {
        return Err(ArrayError::Io {
            member,
            name: members[member].name.clone(),
            source,
        });
    }
    Array::assemble(superblock, members, engine, Vec::new(), log_devices, true)
}

/// Reads a member's superblock: the primary, or the backup at the end.
/// The superblock of a member (the primary, or the backup at its end if
/// the primary does not decode).
pub fn read_superblock(device: &dyn Device) -> Result<Superblock, FormatError> {
    let mut sector = vec![0u8; SECTOR_BYTES];
    let primary = device
        .read_at(&mut sector, 0)
        .map_err(|_| FormatError::Crc { what: "superblock" })
        .and_then(|()| Superblock::decode(&sector));
    match primary {
        Ok(sb) => Ok(sb),
        Err(error) => {
            let size = device.size();
            if size < SECTOR_BYTES as u64 || device.read_at(&mut sector, size - SECTOR_BYTES as u64).is_err() {
                return Err(error);
            }
            Superblock::decode(&sector).map_err(|_| error)
        }
    }
}

/// A member found at open: its name, device and superblock.
type Found = (String, Arc<dyn Device>, Superblock);

/// Opens an array from its members, in any order; `None` is a member that
/// could not be found. The array is the one most of the devices belong
/// to; a device that is not one of its members (no superblock, another
/// array's, another geometry, too short) is left out and reported
/// ([`Array::rejected`]), counted with the missing. Opens degraded with up
/// to M unavailable, refuses more, and refuses two devices that claim the
/// same member.
pub fn open(devices: Vec<(String, Option<Arc<dyn Device>>)>) -> Result<Array, ArrayError> {
    open_with(devices, EngineOptions::default())
}

/// [`open`], run with `engine` options.
pub fn open_with(devices: Vec<(String, Option<Arc<dyn Device>>)>, engine: EngineOptions) -> Result<Array, ArrayError> {
    let mut rejected: Vec<Rejected> = Vec::new();
    let mut found: Vec<Found> = Vec::new();
    let listed = devices.len();
    for (name, device) in devices {
        let Some(device) = device else { continue };
        match read_superblock(device.as_ref()) {
            Ok(sb) => found.push((name, device, sb)),
            Err(source) => {
                let why = ArrayError::NotAMember {
                    name: name.clone(),
                    source,
                }
                .to_string();
                rejected.push(Rejected { name, why });
            }
        }
    }
    // Which array: the one most devices belong to, so that one foreign
    // device (however new its superblock) cannot pass for the array and
    // make the real members look foreign.
    let mut votes: Vec<([u8; 16], usize)> = Vec::new();
    for (_, _, sb) in &found {
        match votes.iter_mut().find(|(uuid, _)| *uuid == sb.array_uuid) {
            Some((_, count)) => *count += 1,
            None => votes.push((sb.array_uuid, 1)),
        }
    }
    votes.sort_by_key(|&(_, count)| std::cmp::Reverse(count));
    if let [(first, count), (second, tied), ..] = votes[..] {
        if count == tied {
            return Err(ArrayError::SplitMembers {
                first: engine::hex(&first),
                second: engine::hex(&second),
                count,
            });
        }
    }
    let newest = found
        .iter()
        .filter(|(_, _, sb)| votes.first().is_some_and(|(uuid, _)| sb.array_uuid == *uuid))
        .max_by_key(|(_, _, sb)| sb.generation)
        .map(|(_, _, sb)| sb.clone())
        .ok_or_else(|| ArrayError::NoMemberFound {
            listed,
            why: rejections(&rejected),
        })?;
    let geometry = &newest.geometry;
    let mut members: Vec<Option<Found>> = (0..geometry.members).map(|_| None).collect();
    for (name, device, sb) in found {
        let why = if sb.array_uuid != newest.array_uuid {
            Some(
                ArrayError::ForeignMember {
                    name: name.clone(),
                    found: engine::hex(&sb.array_uuid),
                    expected: engine::hex(&newest.array_uuid),
                }
                .to_string(),
            )
        } else if sb.geometry != *geometry {
            Some(ArrayError::WrongMember { name: name.clone() }.to_string())
        } else if device.size() < geometry.member_bytes {
            Some(format!(
                "{name} is {} bytes, shorter than the array's members ({} bytes): truncated?",
                device.size(),
                geometry.member_bytes
            ))
        } else {
            None
        };
        if let Some(why) = why {
            rejected.push(Rejected { name, why });
            continue;
        }
        let index = sb.member_index;
        if let Some((first, _, _)) = &members[index] {
            return Err(ArrayError::DuplicateMember {
                index,
                first: first.clone(),
                second: name,
            });
        }
        members[index] = Some((name, device, sb));
    }
    let members: Vec<Member> = members
        .into_iter()
        .enumerate()
        .map(|(index, slot)| match slot {
            Some((name, device, sb)) => Member {
                name,
                uuid: sb.member_uuid,
                // Recorded failed: taken out by hand (its own superblock
                // says so too), or gone and come back.
                state: match (newest.is_failed(index), sb.is_failed(index)) {
                    (false, _) => MemberState::Healthy,
                    (true, true) => MemberState::Failed,
                    (true, false) => MemberState::Stale,
                },
                device: Some(device),
            },
            None => Member {
                name: format!("member {index}"),
                uuid: [0; 16],
                device: None,
                state: if newest.is_failed(index) {
                    MemberState::Failed
                } else {
                    MemberState::Missing
                },
            },
        })
        .collect();
    let unavailable = members.iter().filter(|m| m.state != MemberState::Healthy).count();
    if unavailable > geometry.parity {
        return Err(ArrayError::TooManyUnavailable {
            unavailable,
            parity: geometry.parity,
            why: rejections(&rejected),
        });
    }
    let log_devices =
        intent::find_log_devices(&newest, &engine.log_devices, engine.discard_missing_log, &mut rejected)?;
    // Recorded failed once the array is up (a no-op for those already).
    let missing_logs: Vec<usize> = (0..log_devices.len())
        .filter(|&i| log_devices[i].device.is_none())
        .collect();
    if !engine.ignore_activity {
        let present: Vec<(String, Arc<dyn Device>)> = members
            .iter()
            .filter_map(|m| m.device.clone().map(|d| (m.name.clone(), d)))
            .collect();
        activity::check_idle(&present, newest.array_uuid, activity::ACTIVITY_WATCH)?;
    }
    let newest = volume_table(newest, &members)?;
    let array = Array::assemble(newest, members, engine, rejected, log_devices, false)?;
    array.shared.members.record_missing()?;
    for index in missing_logs {
        array.shared.members.record_log_failed(index)?;
    }
    Ok(array)
}

/// The superblock with the volume table it names, read from the first
/// member that holds a copy with its CRC.
fn volume_table(mut superblock: Superblock, members: &[Member]) -> Result<Superblock, ArrayError> {
    if superblock.volume_table_crc == 0 {
        return Ok(superblock);
    }
    let table = members
        .iter()
        .filter(|m| m.state == MemberState::Healthy)
        .filter_map(|m| m.device.as_ref())
        .find_map(|d| volume::VolumeTable::read_from(d.as_ref(), &superblock.array_uuid, superblock.volume_table_crc))
        .ok_or(ArrayError::VolumeTableUnreadable {
            crc: superblock.volume_table_crc,
        })?;
    superblock.volume_table = Some(Arc::new(table));
    Ok(superblock)
}

/// A device given to `open` that is not used: which, and why.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Rejected {
    pub name: String,
    pub why: String,
}

/// The rejections, for an error message.
fn rejections(rejected: &[Rejected]) -> String {
    rejected.iter().map(|r| format!("; {}", r.why)).collect()
}
