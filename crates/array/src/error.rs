//! The engine's errors: what went wrong, typed, with what to do about it.

use crate::format::{self, FormatError, MEMBER_COUNT_MAX};
use crate::limits::SLOTS_MIN;
use crate::slot_set::SlotState;
use std::sync::Arc;

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
    #[error("log device {name} could not be written: {source}")]
    LogDeviceWrite { name: String, source: std::io::Error },
    #[error("no log device of the array can be read ({why}): the last FLUSHed writes may be only there. Bring one back, or open with the missing log discarded (serve --discard-missing-log) to go on without them")]
    LogDevicesMissing { why: LogsMissing },
    #[error("{name} is not a member of a Tessera array: {source}")]
    NotAMember { name: String, source: FormatError },
    #[error("{name} belongs to another array ({found}), not {expected}")]
    ForeignMember {
        name: String,
        found: ArrayId,
        expected: ArrayId,
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
        /// The devices left out, and why.
        why: Rejections,
    },
    #[error(
        "none of the {listed} devices listed holds a superblock of a Tessera array: the array cannot be opened{why}"
    )]
    NoMemberFound {
        listed: usize,
        /// The devices left out, and why.
        why: Rejections,
    },
    #[error("{name} is in use: the array is open elsewhere (process {pid}: {why}); stop it first, or, if it is truly gone (a host that died), open with --force")]
    ActiveElsewhere { name: String, pid: u32, why: Opener },
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
        first: ArrayId,
        second: ArrayId,
        count: usize,
    },
    #[error("failing another member would leave {failed} failed with only {parity} parity: refused")]
    TooManyFailed { failed: usize, parity: usize },
    #[error("writes are refused: {why}; reads go on where they can. Restart the array once the members are back")]
    WritesRefused { why: Lost },
    #[error("the array was closed: it takes no more writes; open it again")]
    Closed,
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
    CheckpointUnreadable { why: CheckpointFault },
    #[error("map page {page} cannot be used: {source}; its map stripes could not give back a good image (more members lost or damaged than the parity covers)")]
    MapPage {
        page: u64,
        source: crate::format::FormatError,
    },
    #[error("map directory page {dir} (map pages {} to {}) cannot be used: {source}; its map stripes could not give back a good image (more members lost or damaged than the parity covers)", dir * crate::limits::MAP_DIRECTORY_PAGES, (dir + 1) * crate::limits::MAP_DIRECTORY_PAGES - 1)]
    MapDirectoryPage {
        dir: u64,
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

/// An array's UUID, shown in hexadecimal (in errors that name arrays).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArrayId(pub [u8; 16]);

impl std::fmt::Display for ArrayId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// Who has an array open elsewhere, as its activity records show
/// (`ArrayError::ActiveElsewhere`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Opener {
    #[error("this process has it open")]
    ThisProcess,
    #[error("a process on this host writes its activity record")]
    ThisHost,
    #[error("a process on another host writes its activity record")]
    AnotherHost,
}

/// Why an array stopped taking writes, for good until it is opened again:
/// a member failed, or a superblock could not be written, past the parity.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Lost {
    #[error("member {member} ({name}) failed ({error}) with {already} already unavailable: {} is more than the {parity} parity covers", already + 1)]
    MemberFailed {
        member: usize,
        name: String,
        error: Arc<std::io::Error>,
        already: usize,
        parity: usize,
    },
    #[error("the superblock of member {member} ({name}) could not be written ({error}) and no more members may fail")]
    SuperblockUnwritten {
        member: usize,
        name: String,
        error: Arc<std::io::Error>,
    },
}

impl Lost {
    /// What the history keeps of it (`events::Refused`).
    pub fn reason(&self) -> crate::events::Refused {
        use crate::events::Refused;
        match self {
            Lost::MemberFailed {
                member,
                name,
                already,
                parity,
                ..
            } => Refused::MemberFailed {
                member: *member,
                name: name.clone(),
                already: *already,
                parity: *parity,
            },
            Lost::SuperblockUnwritten { member, name, .. } => Refused::SuperblockUnwritten {
                member: *member,
                name: name.clone(),
            },
        }
    }
}

/// Why no log device can be used at open.
#[derive(Debug, thiserror::Error)]
pub enum LogsMissing {
    #[error("{} could not be read", names.join(", "))]
    Unreadable { names: Vec<String> },
    #[error("{} missing{rejected}", names.join(", "))]
    NotFound { names: Vec<String>, rejected: Rejections },
}

/// Why a map checkpoint cannot be used: recovery then reads every
/// stripe's summary instead, and says why in `status`.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointFault {
    #[error("{0}")]
    Format(#[from] FormatError),
    #[error("its digest does not match")]
    Digest,
    #[error("{total} bytes cannot fill {stripes} stripes")]
    Length { total: usize, stripes: usize },
    #[error("its stripe in slot {slot} cannot be rebuilt: {source}")]
    Stripe { slot: u64, source: Box<ArrayError> },
    #[error("it says sequence {found}, the superblock {expected}")]
    Sequence { found: u64, expected: u64 },
    #[error("a slot holds two of its stripes")]
    OwnSlotTwice,
    #[error("slot {slot} is listed twice (live, window, map stripe or the checkpoint's own)")]
    ListedTwice { slot: u64 },
    #[error("it counts live data in slot {slot}, which is {state:?}")]
    CountsUnsealed { slot: u64, state: SlotState },
    #[error(
        "its slot table page {page} lists {kept} slots sealed with live data, which does not add up with the root"
    )]
    KeptTooMany { page: u64, kept: u32 },
    #[error("its slot pages list {listed} live units in all, the root {root}")]
    LiveTotal { listed: u128, root: u128 },
    #[error("the map took more from slot {slot} than its slot table page lists")]
    CountsUnderrun { slot: u64 },
    #[error("its slot table page {page} cannot be read: {source}")]
    SlotPage { page: u64, source: Box<ArrayError> },
    #[error("it maps block {lba} into slot {slot}, which holds a newer stripe")]
    Stale { lba: u64, slot: u64 },
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
    #[error("{count} log devices: at most {}", format::LOG_DEVICES_MAX)]
    TooManyLogDevices { count: usize },
    #[error("log device {name}: a log area of {area} bytes does not fit it ({room} bytes after its header), or is under {} bytes", crate::limits::LOG_BYTES_MIN)]
    LogDeviceArea { name: String, area: u64, room: u64 },
    #[error("logical size {bytes}: use a positive multiple of 4 KiB")]
    LogicalSize { bytes: u64 },
    #[error(
        "logical size {bytes}: at most {} bytes (4 PiB, the largest volume: a volume is 2^40 blocks)",
        format::LOGICAL_BYTES_MAX
    )]
    LogicalTooLarge { bytes: u64 },
}

/// A device given to `open` that is not used (not a member, another
/// array's, the wrong shape, too short): which, why (typed, for programs),
/// and what it said (for people).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Rejected {
    pub name: String,
    pub reason: LeftOut,
    /// The reason in words, with what was read from the device.
    pub why: String,
}

/// Why a device was left out, typed: `status --json`'s
/// `devices_rejected[].reason`, tagged by `kind`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LeftOut {
    /// No superblock of a Tessera array could be read from it.
    NotAMember,
    /// Its header is not one of the array's log devices' (unreadable, or
    /// at odds with the members about the log devices).
    NotALogDevice,
    /// A member or log device of another array (its UUID in hex).
    OtherArray { array: String },
    /// This array's, but of another shape than its newest superblock
    /// says (a member's geometry, or a log device's count or size).
    OtherShape,
    /// Shorter than what it must hold (the members' size, or its log
    /// area): truncated?
    TooShort { bytes: u64, needed: u64 },
    /// Claims a log device's place that another device given holds.
    SameAs { other: String },
}

/// The devices left out, in an error: each reason after "; ".
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rejections(pub Vec<Rejected>);

impl std::fmt::Display for Rejections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.iter().try_for_each(|r| write!(f, "; {}", r.why))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An array named in an error reads as its UUID in hexadecimal, as
    /// `tessera status` shows it.
    #[test]
    fn an_array_id_shows_as_its_uuid_in_hexadecimal() {
        let mut uuid = [0u8; 16];
        uuid[0] = 0xab;
        uuid[15] = 0x01;
        assert_eq!(ArrayId(uuid).to_string(), format!("ab{}01", "00".repeat(14)));
        let error = ArrayError::ForeignMember {
            name: "m3".into(),
            found: ArrayId(uuid),
            expected: ArrayId([0xff; 16]),
        };
        assert_eq!(
            error.to_string(),
            format!(
                "m3 belongs to another array (ab{}01), not {}",
                "00".repeat(14),
                "ff".repeat(16)
            )
        );
    }
}
