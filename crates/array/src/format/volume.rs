//! Volumes: one array, many thin block devices (like zvols), each served
//! as its own NBD export by name. This module is their on-disk part (the
//! volume table and the map's key space); creating, resizing and
//! deleting them, their gates and which records are mapped are
//! `volumes.rs`'s.
//!
//! # Guarantees
//!
//! - The map is keyed by (volume, block): block `b` of volume `v` is map
//!   key `v << VOLUME_BLOCKS_SHIFT | b`, so every structure below the map
//!   (records, checkpoints, the intent log) is unchanged, and an array
//!   made before volumes is volume 0, the default, whole.
//! - The volume table is written beside the superblocks, on every healthy
//!   member, before them: a superblock names its table by CRC (offset
//!   180), and a table copy is read only if it matches, so a torn table
//!   write is never taken and an acknowledged one is never lost. Each
//!   member keeps two copies, written alternately (by the superblocks'
//!   generation), so the copy the current superblock names is never the
//!   one being overwritten.
//! - A volume created gets the next write version as its `created`
//!   version: records of an earlier volume with the same id (deleted,
//!   its records still in stripes and in the log) are older, and are
//!   never mapped again (`Index::volumes`, checked by recovery and by the
//!   log's replay).
//! - Client requests hold their volume's gate shared; deleting or
//!   shrinking a volume takes it exclusively, so no request of it is in
//!   flight while it goes, and requests after get `VolumeGone` or the new
//!   size. Shrinking writes zero records over the cut part first, so
//!   growing the volume again finds zeros there, after a crash too.
//!
//! # Layout (each copy; offsets 256 KiB and 512 KiB of every member)
//!
//! ```text
//!   0  magic "TSRVOLMS"     8  version u32 = 1     12 count u32
//!  16  array uuid [16]     32  content CRC32C u32 (of count and entries)
//!  36  reserved [28]
//!  64  entries, 96 bytes each, by id:
//!        0 id u32 | 4 reserved u32 | 8 bytes u64 | 16 created version u64
//!       24 name bytes u16 | 26 reserved [6] | 32 name [64], UTF-8, zero-padded
//!  then zeros to a multiple of 4 KiB
//! ```
//!
//! Worked example: an array with the default volume (`tessera`, 1 GiB)
//! and `scratch` (id 1, 64 MiB, created at version 812) has a table of
//! count 2, 64 + 2 x 96 = 256 bytes, written as one 4 KiB sector to
//! offset 256 KiB (or 512 KiB) of every healthy member, then synced;
//! then the superblocks, with its CRC at offset 180. Block 5
//! of `scratch` is map key 2^40 + 5, and an LBA of 2^40 + 5 in a stripe's
//! summary or a log record.

use crate::format::{FormatError, BLOCK_BYTES, DATA_START, SECTOR_BYTES};

/// Block `b` of volume `v` is map key `v << VOLUME_BLOCKS_SHIFT | b`.
pub const VOLUME_BLOCKS_SHIFT: u32 = 40;
/// The largest volume: 2^40 blocks of 4 KiB, 4 PiB.
pub const VOLUME_BYTES_MAX: u64 = (1u64 << VOLUME_BLOCKS_SHIFT) * BLOCK_BYTES as u64;
/// Volume ids are below this: keys stay below 2^51, so a key's byte
/// address (key x 4 KiB) fits the engine's u64 offsets.
pub const VOLUME_COUNT_MAX: usize = 2048;
const _: () = assert!(((VOLUME_COUNT_MAX as u128) << VOLUME_BLOCKS_SHIFT) * (BLOCK_BYTES as u128) <= 1u128 << 63);
/// A volume's name is 1 to this many bytes of UTF-8.
pub const VOLUME_NAME_BYTES_MAX: usize = 64;
/// The volume every array has, the one an array made before volumes is.
pub const DEFAULT_VOLUME_NAME: &str = "tessera";

pub const VOLUME_TABLE_MAGIC: [u8; 8] = *b"TSRVOLMS";
const VOLUME_TABLE_VERSION: u32 = 1;
const HEADER_BYTES: usize = 64;
const ENTRY_BYTES: usize = 96;
/// A table copy's bytes at most, rounded to sectors.
const TABLE_BYTES_MAX: usize = (HEADER_BYTES + VOLUME_COUNT_MAX * ENTRY_BYTES).div_ceil(SECTOR_BYTES) * SECTOR_BYTES;
/// Where a member keeps its two copies: in the space before row 0 that
/// nothing else uses (the activity record is at 64 KiB).
pub const VOLUME_TABLE_OFFSETS: [u64; 2] = [256 << 10, 512 << 10];
const _: () = assert!(VOLUME_TABLE_OFFSETS[0] + TABLE_BYTES_MAX as u64 <= VOLUME_TABLE_OFFSETS[1]);
const _: () = assert!(VOLUME_TABLE_OFFSETS[1] + TABLE_BYTES_MAX as u64 <= DATA_START);

/// One volume, as the table records it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct VolumeEntry {
    pub id: u32,
    pub name: String,
    /// Its size in bytes, a multiple of 4 KiB.
    pub bytes: u64,
    /// The write version when it was created: records of its id older
    /// than this belong to a volume deleted before it.
    pub created_version: u64,
}

/// Every volume of an array, by id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeTable {
    pub entries: Vec<VolumeEntry>,
}

impl VolumeTable {
    /// The table of an array that never had more than its default volume.
    pub fn default_for(logical_bytes: u64) -> VolumeTable {
        VolumeTable {
            entries: vec![VolumeEntry {
                id: 0,
                name: DEFAULT_VOLUME_NAME.to_string(),
                bytes: logical_bytes,
                created_version: 0,
            }],
        }
    }

    pub fn find(&self, name: &str) -> Option<&VolumeEntry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// The lowest id no volume has.
    pub fn free_id(&self) -> Option<u32> {
        (0..VOLUME_COUNT_MAX as u32).find(|id| self.entries.iter().all(|e| e.id != *id))
    }

    fn content(&self) -> Vec<u8> {
        let mut out = (self.entries.len() as u32).to_le_bytes().to_vec();
        for e in &self.entries {
            let mut entry = [0u8; ENTRY_BYTES];
            entry[0..4].copy_from_slice(&e.id.to_le_bytes());
            entry[8..16].copy_from_slice(&e.bytes.to_le_bytes());
            entry[16..24].copy_from_slice(&e.created_version.to_le_bytes());
            entry[24..26].copy_from_slice(&(e.name.len() as u16).to_le_bytes());
            entry[32..32 + e.name.len()].copy_from_slice(e.name.as_bytes());
            out.extend_from_slice(&entry);
        }
        out
    }

    /// What a superblock names this table by (never 0, which means "only
    /// the default volume, no table written").
    pub fn crc(&self) -> u32 {
        tessera_checksum::crc32c(&self.content()).max(1)
    }

    /// The bytes of one copy, whole sectors.
    pub fn encode(&self, array_uuid: &[u8; 16]) -> Vec<u8> {
        assert!(self.entries.len() <= VOLUME_COUNT_MAX);
        let content = self.content();
        let mut out = vec![0u8; (HEADER_BYTES + content.len() - 4).div_ceil(SECTOR_BYTES) * SECTOR_BYTES];
        out[0..8].copy_from_slice(&VOLUME_TABLE_MAGIC);
        out[8..12].copy_from_slice(&VOLUME_TABLE_VERSION.to_le_bytes());
        out[12..16].copy_from_slice(&content[0..4]);
        out[16..32].copy_from_slice(array_uuid);
        out[32..36].copy_from_slice(&self.crc().to_le_bytes());
        out[HEADER_BYTES..HEADER_BYTES + content.len() - 4].copy_from_slice(&content[4..]);
        out
    }

    /// Decodes a copy (`bytes` at least its whole length) of the array
    /// `array_uuid`.
    pub fn decode(bytes: &[u8], array_uuid: &[u8; 16]) -> Result<VolumeTable, FormatError> {
        const WHAT: &str = "volume table";
        let field = |field: &'static str, value: u64| FormatError::Field {
            what: WHAT,
            field,
            value,
        };
        if bytes.len() < HEADER_BYTES || bytes[0..8] != VOLUME_TABLE_MAGIC {
            return Err(FormatError::Magic { what: WHAT });
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("four bytes"));
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("eight bytes"));
        let version = u32_at(8);
        if version != VOLUME_TABLE_VERSION {
            return Err(FormatError::Version { what: WHAT, version });
        }
        let count = u32_at(12) as usize;
        if count == 0 || count > VOLUME_COUNT_MAX || bytes.len() < HEADER_BYTES + count * ENTRY_BYTES {
            return Err(field("count", count as u64));
        }
        if bytes[16..32] != array_uuid[..] {
            return Err(field("array_uuid", 0));
        }
        let mut entries: Vec<VolumeEntry> = Vec::with_capacity(count);
        for i in 0..count {
            let at = HEADER_BYTES + i * ENTRY_BYTES;
            let name_bytes = usize::from(u16::from_le_bytes([bytes[at + 24], bytes[at + 25]]));
            if name_bytes == 0 || name_bytes > VOLUME_NAME_BYTES_MAX {
                return Err(field("name_bytes", name_bytes as u64));
            }
            let name = std::str::from_utf8(&bytes[at + 32..at + 32 + name_bytes])
                .map_err(|_| field("name", i as u64))?
                .to_string();
            let entry = VolumeEntry {
                id: u32_at(at),
                name,
                bytes: u64_at(at + 8),
                created_version: u64_at(at + 16),
            };
            if entry.id as usize >= VOLUME_COUNT_MAX || entries.last().is_some_and(|last| last.id >= entry.id) {
                return Err(field("id", u64::from(entry.id)));
            }
            if entry.bytes > VOLUME_BYTES_MAX || !entry.bytes.is_multiple_of(BLOCK_BYTES as u64) {
                return Err(field("bytes", entry.bytes));
            }
            entries.push(entry);
        }
        // Over the bytes as stored (reserved ones too), which for a table
        // this build wrote are what `crc` hashes.
        let raw =
            tessera_checksum::crc32c_parts(&[&bytes[12..16], &bytes[HEADER_BYTES..HEADER_BYTES + count * ENTRY_BYTES]]);
        if raw.max(1) != u32_at(32) {
            return Err(FormatError::Crc { what: WHAT });
        }
        Ok(VolumeTable { entries })
    }

    /// The copy's offset that a superblock of `generation` goes with.
    pub fn offset_for(generation: u64) -> u64 {
        VOLUME_TABLE_OFFSETS[(generation % 2) as usize]
    }

    /// Reads the table whose CRC is `crc` from either copy on `device`.
    pub fn read_from(device: &dyn crate::device::Device, array_uuid: &[u8; 16], crc: u32) -> Option<VolumeTable> {
        VOLUME_TABLE_OFFSETS.iter().find_map(|&offset| {
            let mut bytes = vec![0u8; TABLE_BYTES_MAX];
            device.read_at(&mut bytes, offset).ok()?;
            VolumeTable::decode(&bytes, array_uuid).ok().filter(|t| t.crc() == crc)
        })
    }
}

/// A name a volume may have: 1 to 64 bytes, letters, digits and `-_.:`,
/// not starting with a dot (it is an NBD export name and a CLI word).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= VOLUME_NAME_BYTES_MAX
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
}

/// The map key of block `block` of volume `id`.
pub fn key(id: u32, block: u64) -> u64 {
    debug_assert!(block < 1 << VOLUME_BLOCKS_SHIFT);
    (u64::from(id) << VOLUME_BLOCKS_SHIFT) | block
}

/// The volume a map key belongs to.
pub fn volume_of(key: u64) -> u32 {
    (key >> VOLUME_BLOCKS_SHIFT) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> VolumeTable {
        VolumeTable {
            entries: vec![
                VolumeEntry {
                    id: 0,
                    name: "tessera".to_string(),
                    bytes: 1 << 30,
                    created_version: 0,
                },
                VolumeEntry {
                    id: 1,
                    name: "scratch".to_string(),
                    bytes: 64 << 20,
                    created_version: 812,
                },
            ],
        }
    }

    #[test]
    fn a_table_round_trips_and_its_bytes_stay_put() {
        let uuid = [7u8; 16];
        let bytes = table().encode(&uuid);
        assert_eq!(bytes.len(), SECTOR_BYTES);
        assert_eq!(VolumeTable::decode(&bytes, &uuid).unwrap(), table());
        // Golden bytes: the header and the second entry.
        assert_eq!(&bytes[0..16], b"TSRVOLMS\x01\x00\x00\x00\x02\x00\x00\x00");
        assert_eq!(u32::from_le_bytes(bytes[32..36].try_into().unwrap()), table().crc());
        let second = &bytes[HEADER_BYTES + ENTRY_BYTES..HEADER_BYTES + 2 * ENTRY_BYTES];
        assert_eq!(&second[0..4], &1u32.to_le_bytes());
        assert_eq!(&second[8..16], &(64u64 << 20).to_le_bytes());
        assert_eq!(&second[16..24], &812u64.to_le_bytes());
        assert_eq!(&second[24..26], &7u16.to_le_bytes());
        assert_eq!(&second[32..39], b"scratch");
        assert!(second[39..].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_damaged_or_foreign_table_is_refused() {
        let uuid = [7u8; 16];
        let bytes = table().encode(&uuid);
        assert!(VolumeTable::decode(&bytes, &[8u8; 16]).is_err(), "another array's");
        for at in [12, 70, HEADER_BYTES + ENTRY_BYTES + 33, 32] {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            assert!(VolumeTable::decode(&bad, &uuid).is_err(), "byte {at} flipped");
        }
        assert!(VolumeTable::decode(&[0u8; SECTOR_BYTES], &uuid).is_err());
    }

    #[test]
    fn names_are_export_names() {
        assert!(valid_name("scratch") && valid_name("vm-01.disk:a_b"));
        for bad in ["", ".hidden", "a b", "a/b", &"x".repeat(65)] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }
}
