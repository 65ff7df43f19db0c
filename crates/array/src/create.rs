//! Formatting members as a new array: the geometry's checks, the
//! superblocks, zeroed log areas, then the array opened.

use crate::device::Device;
use crate::engine::Array;
use crate::error::{ArrayError, GeometryError};
use crate::format::{self, Geometry, Superblock, BLOCK_BYTES, MEMBER_COUNT_MAX, SECTOR_BYTES};
use crate::members::{Member, MemberState};
use crate::options::EngineOptions;
use crate::recovery::Start;
use crate::write::extent_blocks_max;
use crate::{intent, limits, members, write};
use std::sync::Arc;

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
    /// `log_bytes_default`.
    pub log_bytes: Option<u64>,
}

impl CreateOptions {
    /// K+M of 64 KiB chunks, CRC32C, no compression, the default export
    /// and log sizes: what `tessera create` makes unless told otherwise.
    pub fn new(data: usize, parity: usize) -> CreateOptions {
        CreateOptions {
            data,
            parity,
            chunk_bytes: 64 << 10,
            checksum: tessera_checksum::Algorithm::Crc32c,
            compression: None,
            logical_bytes: None,
            log_bytes: None,
        }
    }
}

/// Client data the array's stripes can hold, uncompressed: each one's
/// data area less its summary (what the blocks' records take), the slots
/// the engine keeps for itself (GC's reserve, the open stripes, a
/// checkpoint's) left out. Where a stripe's data area is small (4 KiB
/// chunks, two data chunks), the summary leaves room for fewer blocks
/// than the area would hold, and this is well under the data area.
pub(crate) fn usable_bytes(geometry: &Geometry) -> u64 {
    let reserved = (limits::GC_RESERVE_SLOTS + limits::open_stripe_count(geometry.slot_count()) + 3) as u64;
    geometry.slot_count().saturating_sub(reserved) * write::stripe_fill_bytes(geometry, None)
}

/// The exported size by default: a fraction of the usable space.
fn default_logical_bytes(geometry: &Geometry) -> u64 {
    let block = BLOCK_BYTES as u64;
    ((usable_bytes(geometry) as f64 * limits::DEFAULT_LOGICAL_FRACTION) as u64 / block) * block
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
        geometry.log_bytes = asked.unwrap_or_else(|| log_bytes_default(&geometry));
    } else {
        // The log is on the log devices, all of it: none on the members.
        let (name, smallest) = log_devices.iter().min_by_key(|(_, d)| d.size()).expect("not empty");
        let name = name.clone();
        let room =
            smallest.size().saturating_sub(format::LOG_DEVICE_AREA_START) / SECTOR_BYTES as u64 * SECTOR_BYTES as u64;
        let area = asked.unwrap_or(room.min(limits::LOG_DEVICE_BYTES_DEFAULT_MAX));
        if log_devices.len() > format::LOG_DEVICES_MAX {
            return Err(GeometryError::TooManyLogDevices {
                count: log_devices.len(),
            }
            .into());
        }
        if area < limits::LOG_BYTES_MIN || area > room || area / SECTOR_BYTES as u64 > u64::from(u32::MAX) {
            return Err(GeometryError::LogDeviceArea { name, area, room }.into());
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
    if geometry.slot_count() < limits::SLOTS_MIN {
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
    Array::assemble(superblock, members, engine, Vec::new(), log_devices, Start::Fresh)
}

/// The intent log's area on each member, by default: room for every user
/// lane's open stripe to be logged whole twice over (a lane's next stripe
/// fills while its last waits for a sync), in M+1 copies spread over the
/// N members, with a sixth more for the log's own headers; at least
/// `limits::LOG_BYTES_MIN` and at most a sixteenth of a member (a log
/// that fills makes FLUSH seal short stripes, as it did before there was
/// one).
fn log_bytes_default(geometry: &Geometry) -> u64 {
    let slots = Geometry::rows_for(geometry.member_bytes, geometry.chunk_bytes, 0) * geometry.members as u64
        / geometry.width() as u64;
    let copies = (geometry.parity + 1) as u64;
    let want = 2 * limits::user_lanes(slots) as u64 * geometry.data_area_bytes() as u64 * copies * 7
        / 6
        / geometry.members as u64;
    let sector = SECTOR_BYTES as u64;
    want.clamp(
        limits::LOG_BYTES_MIN,
        (geometry.member_bytes / 16).max(limits::LOG_BYTES_MIN),
    )
    .next_multiple_of(sector)
}
