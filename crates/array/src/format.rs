//! The on-disk format: superblocks, chunk headers and stripe summaries.
//!
//! # Layout of a member
//!
//! ```text
//! offset 0          superblock (4 KiB)
//! offset 1 MiB      row 0: chunk header (4 KiB) | chunk payload (C bytes)
//!                   row 1: chunk header         | chunk payload
//!                   ...
//! size - 4 KiB - L  intent log area (L bytes; 0 on arrays without one)
//! size - 4 KiB      backup superblock (4 KiB)
//! ```
//!
//! A stripe has K data and M parity chunks of C bytes. Stripe slot s puts
//! its chunk j at position p = s (K+M) + j of the array's chunk grid, which
//! is member p mod N, row p div N: consecutive slots rotate over all N
//! members (as in dRAID), so parity and rebuild load spread evenly, and the
//! K+M chunks of a slot are on K+M distinct members because K+M <= N.
//!
//! ```text
//!   N = 5, K+M = 3          member 0   1   2   3   4
//!                  row 0:        s0  s0  s0  s1  s1
//!                  row 1:        s1  s2  s2  s2  s3 ...
//! ```
//!
//! The K data payloads, read in order, are the stripe's data area of K C
//! bytes: extents packed from the front at byte granularity, the summary
//! (the list of extents and zero ranges) at the back.
//!
//! Every structure begins with a magic and a version and ends with a
//! CRC32C of the bytes before it; integers are little-endian. Offsets are
//! the constants below, asserted at compile time, and tests hold golden
//! bytes.

use crate::limits::EXTENT_BLOCKS_MAX;
use tessera_checksum::{Algorithm, Digest};
use tessera_compress::Codec;

/// The volume table (written beside the superblocks) and the map's key
/// space, volume by volume.
pub mod volume;

/// Bytes of a superblock, and of a chunk header: one 4 KiB sector each
/// (the unit the device layer reads and aligns to).
pub use crate::device::SECTOR_BYTES;
/// Where row 0 starts on every member: room for the superblock, aligned.
pub const DATA_START: u64 = 1 << 20;
/// Logical block size of the exported volume.
pub const BLOCK_BYTES: usize = 4096;
/// Members in an array at most: the failed-member bitmap has this many bits.
pub const MEMBER_COUNT_MAX: usize = 256;
/// The largest exported size of a volume: 2^40 blocks (4 PiB), as volume
/// `v`'s block `b` is map key `v << 40 | b` (`crate::volume`). (NBD
/// clients take sizes as signed 64-bit numbers: well within.)
pub const LOGICAL_BYTES_MAX: u64 = crate::volume::VOLUME_BYTES_MAX;
/// Chunk payload size limits: a multiple of a sector, at most 16 MiB so a
/// stripe's data area offsets fit in 32 bits for K <= 255.
pub const CHUNK_BYTES_MIN: usize = 4096;
pub const CHUNK_BYTES_MAX: usize = 16 << 20;
/// Bytes of a digest field: room for the widest algorithm (SHA3-512).
pub const DIGEST_FIELD_BYTES: usize = 64;
const _: () = assert!(CHUNK_BYTES_MAX as u64 * 255 <= u32::MAX as u64);
const _: () = assert!(DATA_START as usize >= SECTOR_BYTES);

pub const SUPERBLOCK_MAGIC: [u8; 8] = *b"TSRSUPER";
pub const CHUNK_MAGIC: [u8; 8] = *b"TSRCHUNK";
pub const CHECKPOINT_MAGIC: [u8; 8] = *b"TSRCHKPT";
/// Version 16: a directory page of which a few entries changed may be
/// written as a delta over its image. Version 15: likewise a slot page.
/// Version 14 packed slot pages. Version 13: recovery may leave a stripe
/// torn on fewer than K chunks in a free slot (it reads M+1 headers of a
/// window slot first), and drops such a stripe at any sequence. Version 12:
/// a checkpoint's root ends where its last stripe's room ends, so that it
/// fills the tail of the stripe its page images end in (version 11 began it
/// in a stripe of its own). Version 11 added map page deltas (a directory
/// entry may name a delta beside a page's image). Version 10: the root
/// carries the live bytes of every slot as of its slot pages, and each slot
/// page's entry how many slots it lists sealed with live data, so that
/// opening after a clean stop need not read the slot pages before it
/// serves. Version 9 paged the slot table's durable form. Version 8: the
/// root names pages of a map directory, each naming where 512 map pages'
/// images are, instead of every map page (the root and the memory naming
/// images grew with every 2 MiB of keys written), and each map stripe's
/// live bytes. Version 7 packed map entries column by column. Version 6:
/// the root carries the slot table's counts as of its pages, so that
/// opening need not read the pages (version 5 added them up from every page
/// at opening). Version 5: the map's checkpoint is a root naming page
/// images in map stripes, written as pages change (versions 2 to 4 wrote
/// the whole map each time; the superblocks of version 3 and 4 named a
/// volume table and a checkpoint directory, which version 5 has as fields).
/// Version 2 added the version of the write to every record, a CRC32C per 4
/// KiB block to raw extents. Arrays of any other version are refused by it.
pub const FORMAT_VERSION: u32 = 16;
/// The CRC32C of a sector covers its first 4092 bytes and sits in the last 4.
const CRC_OFFSET: usize = SECTOR_BYTES - 4;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    #[error("not a Tessera {what}: bad magic")]
    Magic { what: &'static str },
    #[error("{what} has format version {version}; this build reads version {FORMAT_VERSION} only (there is no in-place upgrade: copy the volumes out with an older build, e.g. `nbdcopy`, and into a new array)")]
    Version { what: &'static str, version: u32 },
    #[error("{what} is corrupt: checksum mismatch")]
    Crc { what: &'static str },
    #[error("{what} is corrupt: {field} = {value} is invalid")]
    Field {
        what: &'static str,
        field: &'static str,
        value: u64,
    },
}

fn put(sector: &mut [u8], offset: usize, bytes: &[u8]) {
    sector[offset..offset + bytes.len()].copy_from_slice(bytes);
}
fn get_u16(b: &[u8], offset: usize) -> u16 {
    u16::from_le_bytes(b[offset..offset + 2].try_into().expect("two bytes"))
}
fn get_u32(b: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes(b[offset..offset + 4].try_into().expect("four bytes"))
}
fn get_u64(b: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(b[offset..offset + 8].try_into().expect("eight bytes"))
}

/// Puts a sector's CRC32C (of all before it) in its last four bytes.
pub fn seal_sector(sector: &mut [u8]) {
    let crc = tessera_checksum::crc32c(&sector[..CRC_OFFSET]);
    put(sector, CRC_OFFSET, &crc.to_le_bytes());
}

fn check_sector(sector: &[u8], magic: &[u8; 8], what: &'static str) -> Result<(), FormatError> {
    assert_eq!(sector.len(), SECTOR_BYTES);
    if &sector[..8] != magic {
        return Err(FormatError::Magic { what });
    }
    if tessera_checksum::crc32c(&sector[..CRC_OFFSET]) != get_u32(sector, CRC_OFFSET) {
        return Err(FormatError::Crc { what });
    }
    let version = get_u32(sector, 8);
    if version != FORMAT_VERSION {
        return Err(FormatError::Version { what, version });
    }
    Ok(())
}

/// Whether `blocks` map keys from `lba` are a run of one volume's blocks
/// (`crate::volume`): what every record, mapping and log record covers.
pub(crate) fn within_one_volume(lba: u64, blocks: u32) -> bool {
    use crate::volume::{volume_of, VOLUME_BLOCKS_SHIFT, VOLUME_COUNT_MAX};
    let keys = (VOLUME_COUNT_MAX as u64) << VOLUME_BLOCKS_SHIFT;
    blocks > 0
        && lba
            .checked_add(u64::from(blocks))
            .is_some_and(|end| end <= keys && volume_of(lba) == volume_of(end - 1))
}

/// The checksum algorithm's code on disk.
pub fn algorithm_code(algorithm: Algorithm) -> u8 {
    match algorithm {
        Algorithm::Crc32c => 1,
        Algorithm::Xxh3 => 2,
        Algorithm::Blake3 => 3,
        Algorithm::Sha256 => 4,
        Algorithm::Sha3_512 => 5,
    }
}

pub fn algorithm_from_code(code: u8) -> Option<Algorithm> {
    Algorithm::ALL.into_iter().find(|&a| algorithm_code(a) == code)
}

/// A codec's code on disk (0 is "stored raw") and its level (0 where none).
pub fn codec_code(codec: Option<Codec>) -> (u8, i32) {
    match codec {
        None => (0, 0),
        Some(Codec::Lz4) => (1, 0),
        Some(Codec::Zstd { level }) => (2, level),
        Some(Codec::Deflate { level }) => (3, level as i32),
        Some(Codec::Gzip { level }) => (4, level as i32),
        Some(Codec::Zlib { level }) => (5, level as i32),
        Some(Codec::Snappy) => (6, 0),
    }
}

/// The codec for a code; `None` for an unknown code or a bad level. The
/// level only matters for compressing, so any level decompresses.
pub fn codec_from_code(code: u8, level: i32) -> Option<Option<Codec>> {
    let level_u = u32::try_from(level).ok()?;
    Some(match code {
        0 => None,
        1 => Some(Codec::Lz4),
        2 => Some(Codec::Zstd { level }),
        3 => Some(Codec::Deflate { level: level_u }),
        4 => Some(Codec::Gzip { level: level_u }),
        5 => Some(Codec::Zlib { level: level_u }),
        6 => Some(Codec::Snappy),
        _ => return None,
    })
}

/// The array's shape and settings, the same on every member.
#[derive(Clone, Debug, PartialEq)]
pub struct Geometry {
    pub data: usize,
    pub parity: usize,
    pub members: usize,
    pub chunk_bytes: usize,
    /// Rows of chunks on each member.
    pub rows: u64,
    pub member_bytes: u64,
    pub logical_bytes: u64,
    pub checksum: Algorithm,
    /// `None`: compression off.
    pub compression: Option<Codec>,
    /// Bytes of the intent log's area on each member, just before the
    /// backup superblock (0: none there).
    pub log_bytes: u64,
    /// Dedicated log devices, each a copy of the log (0: the log, if any,
    /// is on the members; at most LOG_DEVICES_MAX).
    pub log_devices: usize,
    /// Bytes of the log area on each log device, after its header.
    pub log_device_bytes: u64,
}

impl Geometry {
    pub fn width(&self) -> usize {
        self.data + self.parity
    }
    /// Stripe slots in the array.
    pub fn slot_count(&self) -> u64 {
        self.rows * self.members as u64 / self.width() as u64
    }
    /// Bytes of a stripe's data area.
    pub fn data_area_bytes(&self) -> usize {
        self.data * self.chunk_bytes
    }
    /// (member, row) of chunk `index` of stripe `slot`.
    pub fn place(&self, slot: u64, index: usize) -> (usize, u64) {
        debug_assert!(slot < self.slot_count() && index < self.width());
        let position = slot * self.width() as u64 + index as u64;
        (
            (position % self.members as u64) as usize,
            position / self.members as u64,
        )
    }
    /// Byte offset of a row's chunk header on a member; its payload follows.
    pub fn row_offset(&self, row: u64) -> u64 {
        DATA_START + row * (SECTOR_BYTES + self.chunk_bytes) as u64
    }
    /// Rows that fit on a member of `member_bytes`, after the superblock and
    /// before a log area of `log_bytes` and the backup superblock.
    pub fn rows_for(member_bytes: u64, chunk_bytes: usize, log_bytes: u64) -> u64 {
        member_bytes.saturating_sub(DATA_START + SECTOR_BYTES as u64 + log_bytes) / (SECTOR_BYTES + chunk_bytes) as u64
    }
    pub fn backup_superblock_offset(&self) -> u64 {
        self.member_bytes - SECTOR_BYTES as u64
    }
    /// Where the intent log's area starts on every member.
    pub fn log_offset(&self) -> u64 {
        self.backup_superblock_offset() - self.log_bytes
    }
    /// The byte ranges of each member that creating the array (and first
    /// opening it) writes: the superblock and activity record before row
    /// 0, and the intent log's area and the backup superblock at the end.
    /// Nothing else is written until stripes are.
    pub fn written_at_create(&self) -> [std::ops::Range<u64>; 2] {
        [0..DATA_START, self.log_offset()..self.member_bytes]
    }
    /// Whether the array has an intent log, on its members or on log
    /// devices.
    pub fn has_log(&self) -> bool {
        self.log_bytes > 0 || self.log_devices > 0
    }
}

/// One member's superblock.
///
/// ```text
///   0  magic "TSRSUPER"        8  version u32        12 log area in 4 KiB sectors u32
///  16  array uuid [16]        32  member uuid [16]
///  48  member index u32       52  members N u32      56 K u32   60 M u32
///  64  chunk bytes u32        68  checksum u8        69 codec u8
///  70  log devices u8         71  failed log devices bitmap u8
///  72  codec level i32        76  log device area in 4 KiB sectors u32
///  80  rows u64               88  logical bytes u64  96 member bytes u64
/// 104  generation u64        112  failed members bitmap [32]
/// 144  created (Unix seconds) u64
/// 152  checkpoint sequence u64
/// 160  checkpoint bytes u64  168 first checkpoint stripe's sequence u64
/// 176  checkpoint stripes u32 (0: no checkpoint; recovery scans every slot)
/// 180  volume table CRC32C u32 (0: only the default volume)
/// 184  checkpoint digest [64] (the array's checksum algorithm)
/// 248  checkpoint stripes' slots u64 each, at most CHECKPOINT_SLOTS_MAX
/// 4088 1 if those are the checkpoint's directory's stripes u32
/// 4092 CRC32C of bytes 0..4092
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Superblock {
    pub array_uuid: [u8; 16],
    pub member_uuid: [u8; 16],
    pub member_index: usize,
    pub geometry: Geometry,
    /// Bumped each time the superblocks are rewritten; the highest wins.
    pub generation: u64,
    /// Members marked failed (pulled) as of this generation.
    pub failed: [u8; MEMBER_COUNT_MAX / 8],
    /// Log devices marked failed: bit i is log device i.
    pub log_failed: u8,
    pub created_unix_seconds: u64,
    /// Where the newest map checkpoint is, if there is one.
    pub checkpoint: Option<CheckpointRef>,
    /// The CRC of the volume table written with this superblock (0: none,
    /// the array has only its default volume, of `geometry.logical_bytes`).
    pub volume_table_crc: u32,
    /// That table, once read (in memory only; `crate::volume`).
    pub volume_table: Option<std::sync::Arc<crate::volume::VolumeTable>>,
}

/// Slots the superblock lists: as many as it has room for. A checkpoint
/// of more stripes lists its directory's instead.
pub const CHECKPOINT_SLOTS_MAX: usize = (CRC_OFFSET - 248) / 8;
/// After the listed slots: 1 if they are a checkpoint directory's.
const CHECKPOINT_DIRECTORY_FLAG_OFFSET: usize = 248 + 8 * CHECKPOINT_SLOTS_MAX;
const _: () = assert!(CHECKPOINT_DIRECTORY_FLAG_OFFSET + 4 <= CRC_OFFSET);

/// The superblock's pointer to a checkpoint: `slots` hold `bytes` of it,
/// in order, in consecutive stripes from sequence `first_stripe_sequence`,
/// ending where the last one's room ends (`meta_stripe_bytes` each: the
/// data area less the summary at its end): the root's first stripe may
/// begin with the last page images of the checkpoint that wrote it
/// ([`CheckpointRef::root_offset`]).
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointRef {
    /// Every stripe up to this sequence is in the checkpoint's map.
    pub sequence: u64,
    pub bytes: u64,
    pub first_stripe_sequence: u64,
    pub digest: Digest,
    /// The stripes the superblock lists: the checkpoint's own, or, with
    /// `directory`, its directory's, which follow the checkpoint's
    /// stripes in sequence and list their slots
    /// ([`encode_checkpoint_directory`]).
    pub slots: Vec<u64>,
    pub directory: bool,
}

impl CheckpointRef {
    /// Stripes of the checkpoint itself, `per_stripe` bytes each.
    pub fn body_stripes(&self, per_stripe: usize) -> usize {
        (self.bytes as usize).div_ceil(per_stripe)
    }

    /// Where the checkpoint begins in its first stripe's data area: it
    /// ends where its last stripe's room does, so that it fills the tail
    /// of the stripe its page images end in.
    pub fn root_offset(&self, per_stripe: usize) -> usize {
        self.body_stripes(per_stripe) * per_stripe - self.bytes as usize
    }

    /// Every stripe it spans: its own and its directory's.
    pub fn stripe_count(&self, per_stripe: usize) -> usize {
        if self.directory {
            self.body_stripes(per_stripe) + self.slots.len()
        } else {
            self.slots.len()
        }
    }
}

pub const CHECKPOINT_DIRECTORY_MAGIC: [u8; 8] = *b"TSRCKDIR";

/// Bytes of the directory of a checkpoint of `stripes` stripes.
pub fn checkpoint_directory_bytes(algorithm: Algorithm, stripes: usize) -> usize {
    16 + 8 * stripes + algorithm.digest_bytes()
}

/// A checkpoint directory: where each of a checkpoint's stripes is, for
/// checkpoints of more stripes than the superblock can list. Written
/// after them, in the data areas of its own Meta stripes:
///
/// ```text
///   0  magic "TSRCKDIR"   8 stripes S u64
///  16  S slots u64, in the checkpoint's order
///  16 + 8S  digest of bytes 0..16+8S (the array's checksum algorithm)
/// ```
///
/// With 64 KiB chunks and 8 data chunks (a 512 KiB data area) one
/// directory stripe lists 65,534 stripes (32 GiB of checkpoint), and the
/// superblock lists 480 directory stripes.
pub fn encode_checkpoint_directory(algorithm: Algorithm, slots: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(checkpoint_directory_bytes(algorithm, slots.len()));
    out.extend_from_slice(&CHECKPOINT_DIRECTORY_MAGIC);
    out.extend_from_slice(&(slots.len() as u64).to_le_bytes());
    for slot in slots {
        out.extend_from_slice(&slot.to_le_bytes());
    }
    let digest = algorithm.digest(&out);
    out.extend_from_slice(digest.as_bytes());
    out
}

/// The slots a checkpoint directory lists, which must be `stripes` slots
/// of `geometry`'s.
pub fn decode_checkpoint_directory(bytes: &[u8], geometry: &Geometry, stripes: usize) -> Result<Vec<u64>, FormatError> {
    const WHAT: &str = "checkpoint directory";
    let algorithm = geometry.checksum;
    if bytes.len() != checkpoint_directory_bytes(algorithm, stripes) || bytes[..8] != CHECKPOINT_DIRECTORY_MAGIC {
        return Err(FormatError::Magic { what: WHAT });
    }
    let end = bytes.len() - algorithm.digest_bytes();
    if algorithm.digest(&bytes[..end]).as_bytes() != &bytes[end..] {
        return Err(FormatError::Crc { what: WHAT });
    }
    let field = |field, value: u64| FormatError::Field {
        what: WHAT,
        field,
        value,
    };
    if get_u64(bytes, 8) != stripes as u64 {
        return Err(field("stripes", get_u64(bytes, 8)));
    }
    let slots: Vec<u64> = (0..stripes).map(|i| get_u64(bytes, 16 + 8 * i)).collect();
    match slots.iter().find(|&&slot| slot >= geometry.slot_count()) {
        Some(&bad) => Err(field("slot", bad)),
        None => Ok(slots),
    }
}

impl Superblock {
    pub fn is_failed(&self, member: usize) -> bool {
        self.failed[member / 8] & (1 << (member % 8)) != 0
    }
    pub fn set_failed(&mut self, member: usize) {
        self.failed[member / 8] |= 1 << (member % 8);
    }
    pub fn clear_failed(&mut self, member: usize) {
        self.failed[member / 8] &= !(1 << (member % 8));
    }

    pub fn encode(&self) -> Vec<u8> {
        let g = &self.geometry;
        let mut s = vec![0u8; SECTOR_BYTES];
        put(&mut s, 0, &SUPERBLOCK_MAGIC);
        if let Some(table) = &self.volume_table {
            assert_eq!(
                table.crc(),
                self.volume_table_crc,
                "a superblock names its own volume table"
            );
        }
        put(&mut s, 8, &FORMAT_VERSION.to_le_bytes());
        put(&mut s, 180, &self.volume_table_crc.to_le_bytes());
        put(&mut s, 12, &((g.log_bytes / SECTOR_BYTES as u64) as u32).to_le_bytes());
        put(&mut s, 16, &self.array_uuid);
        put(&mut s, 32, &self.member_uuid);
        put(&mut s, 48, &(self.member_index as u32).to_le_bytes());
        put(&mut s, 52, &(g.members as u32).to_le_bytes());
        put(&mut s, 56, &(g.data as u32).to_le_bytes());
        put(&mut s, 60, &(g.parity as u32).to_le_bytes());
        put(&mut s, 64, &(g.chunk_bytes as u32).to_le_bytes());
        s[68] = algorithm_code(g.checksum);
        let (codec, level) = codec_code(g.compression);
        s[69] = codec;
        s[70] = g.log_devices as u8;
        s[71] = self.log_failed;
        put(&mut s, 72, &level.to_le_bytes());
        put(
            &mut s,
            76,
            &((g.log_device_bytes / SECTOR_BYTES as u64) as u32).to_le_bytes(),
        );
        put(&mut s, 80, &g.rows.to_le_bytes());
        put(&mut s, 88, &g.logical_bytes.to_le_bytes());
        put(&mut s, 96, &g.member_bytes.to_le_bytes());
        put(&mut s, 104, &self.generation.to_le_bytes());
        put(&mut s, 112, &self.failed);
        put(&mut s, 144, &self.created_unix_seconds.to_le_bytes());
        if let Some(c) = &self.checkpoint {
            assert!(!c.slots.is_empty() && c.slots.len() <= CHECKPOINT_SLOTS_MAX);
            put(&mut s, 152, &c.sequence.to_le_bytes());
            put(&mut s, 160, &c.bytes.to_le_bytes());
            put(&mut s, 168, &c.first_stripe_sequence.to_le_bytes());
            put(&mut s, 176, &(c.slots.len() as u32).to_le_bytes());
            put_digest(&mut s, 184, &c.digest);
            for (i, slot) in c.slots.iter().enumerate() {
                put(&mut s, 248 + 8 * i, &slot.to_le_bytes());
            }
            put(
                &mut s,
                CHECKPOINT_DIRECTORY_FLAG_OFFSET,
                &u32::from(c.directory).to_le_bytes(),
            );
        }
        seal_sector(&mut s);
        s
    }

    pub fn decode(s: &[u8]) -> Result<Superblock, FormatError> {
        const WHAT: &str = "superblock";
        check_sector(s, &SUPERBLOCK_MAGIC, WHAT)?;
        let field = |field, value: u64| FormatError::Field {
            what: WHAT,
            field,
            value,
        };
        let members = get_u32(s, 52) as usize;
        let data = get_u32(s, 56) as usize;
        let parity = get_u32(s, 60) as usize;
        let chunk_bytes = get_u32(s, 64) as usize;
        if members == 0 || members > MEMBER_COUNT_MAX {
            return Err(field("members", members as u64));
        }
        if data == 0 || data + parity > members || data + parity > 256 {
            return Err(field("data", data as u64));
        }
        if !(CHUNK_BYTES_MIN..=CHUNK_BYTES_MAX).contains(&chunk_bytes) || !chunk_bytes.is_multiple_of(SECTOR_BYTES) {
            return Err(field("chunk_bytes", chunk_bytes as u64));
        }
        let member_index = get_u32(s, 48) as usize;
        if member_index >= members {
            return Err(field("member_index", member_index as u64));
        }
        let checksum = algorithm_from_code(s[68]).ok_or(field("checksum", u64::from(s[68])))?;
        let compression = codec_from_code(s[69], i32::from_le_bytes(s[72..76].try_into().expect("four bytes")))
            .ok_or(field("codec", u64::from(s[69])))?;
        let member_bytes = get_u64(s, 96);
        // Arrays made before the log wrote zero here: they have none.
        let log_bytes = u64::from(get_u32(s, 12)) * SECTOR_BYTES as u64;
        if log_bytes + DATA_START + SECTOR_BYTES as u64 > member_bytes {
            return Err(field("log_sectors", log_bytes / SECTOR_BYTES as u64));
        }
        // Arrays made before log devices wrote zeros here: they have none.
        let log_devices = usize::from(s[70]);
        let log_device_bytes = u64::from(get_u32(s, 76)) * SECTOR_BYTES as u64;
        if log_devices > LOG_DEVICES_MAX
            || (log_devices > 0) != (log_device_bytes > 0)
            || (log_devices > 0 && log_bytes > 0)
        {
            return Err(field("log_devices", log_devices as u64));
        }
        if s[71] >> log_devices != 0 {
            return Err(field("failed_log_devices", u64::from(s[71])));
        }
        let rows = get_u64(s, 80);
        if rows == 0 || rows > Geometry::rows_for(member_bytes, chunk_bytes, log_bytes) {
            return Err(field("rows", rows));
        }
        let logical_bytes = get_u64(s, 88);
        if logical_bytes == 0 || !logical_bytes.is_multiple_of(BLOCK_BYTES as u64) || logical_bytes > LOGICAL_BYTES_MAX
        {
            return Err(field("logical_bytes", logical_bytes));
        }
        let geometry = Geometry {
            data,
            parity,
            members,
            chunk_bytes,
            rows,
            member_bytes,
            logical_bytes,
            checksum,
            compression,
            log_bytes,
            log_devices,
            log_device_bytes,
        };
        let checkpoint = match get_u32(s, 176) as usize {
            0 => None,
            count => {
                if count > CHECKPOINT_SLOTS_MAX {
                    return Err(field("checkpoint_stripes", count as u64));
                }
                let slots: Vec<u64> = (0..count).map(|i| get_u64(s, 248 + 8 * i)).collect();
                if let Some(&bad) = slots.iter().find(|&&slot| slot >= geometry.slot_count()) {
                    return Err(field("checkpoint_slot", bad));
                }
                let directory = match get_u32(s, CHECKPOINT_DIRECTORY_FLAG_OFFSET) {
                    0 => false,
                    1 => true,
                    flag => return Err(field("checkpoint_directory", u64::from(flag))),
                };
                let bytes = get_u64(s, 160);
                let listed_bytes = count as u64 * geometry.data_area_bytes() as u64;
                if (!directory && bytes > listed_bytes) || bytes == 0 {
                    return Err(field("checkpoint_bytes", bytes));
                }
                Some(CheckpointRef {
                    sequence: get_u64(s, 152),
                    bytes,
                    first_stripe_sequence: get_u64(s, 168),
                    digest: Digest::from_bytes(&s[184..184 + checksum.digest_bytes()]),
                    slots,
                    directory,
                })
            }
        };
        let volume_table_crc = get_u32(s, 180);
        Ok(Superblock {
            array_uuid: s[16..32].try_into().expect("16 bytes"),
            member_uuid: s[32..48].try_into().expect("16 bytes"),
            member_index,
            geometry,
            generation: get_u64(s, 104),
            failed: s[112..144].try_into().expect("32 bytes"),
            log_failed: s[71],
            created_unix_seconds: get_u64(s, 144),
            checkpoint,
            volume_table_crc,
            volume_table: None,
        })
    }
}

/// Which open stripe a stripe was written from (DESIGN.md: streams).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stream {
    User = 0,
    Gc = 1,
    /// Map checkpoints: no records, the data area holds checkpoint bytes.
    Meta = 2,
}

/// The header before each chunk's payload.
///
/// ```text
///   0  magic "TSRCHUNK"   8 version u32   12 chunk index u16   14 stream u8  15 reserved u8
///  16  array uuid [16]
///  32  sequence u64       40 slot u64     48 synced-through sequence u64
///  56  summary bytes u32  60 data bytes u32 (packed extent bytes)
///  64  leaf digest [64]: this payload's Merkle leaf, H(0x00 | index | payload)
/// 128  Merkle root [64] of the K+M leaves
/// 192  summary digest [64]
/// 256  opening u64: a random number of the opening that wrote it (0 in
///      headers written before 2026-11-30: none)
/// 4092 CRC32C of bytes 0..4092
/// ```
///
/// `synced_through`: every stripe with a sequence number up to it was on
/// stable storage before this one was written. Recovery trusts those and
/// checks every chunk of the newer ones, which a crash may have torn.
/// `opening` says whose stripes those are: sequences after a crash go on
/// from the newest one the opening found, so a stripe torn on chunks it
/// did not read may share its sequence with a stripe written since, and
/// "synced through" vouches only for stripes of the opening that wrote it.
#[derive(Clone, Debug, PartialEq)]
pub struct ChunkHeader {
    pub index: usize,
    pub stream: Stream,
    pub array_uuid: [u8; 16],
    pub sequence: u64,
    pub slot: u64,
    pub synced_through: u64,
    pub summary_bytes: u32,
    pub data_bytes: u32,
    pub leaf: Digest,
    pub root: Digest,
    pub summary_digest: Digest,
    pub opening: u64,
}

fn put_digest(s: &mut [u8], offset: usize, digest: &Digest) {
    let bytes = digest.as_bytes();
    assert!(bytes.len() <= DIGEST_FIELD_BYTES);
    put(s, offset, bytes);
}

impl ChunkHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut s = vec![0u8; SECTOR_BYTES];
        put(&mut s, 0, &CHUNK_MAGIC);
        put(&mut s, 8, &FORMAT_VERSION.to_le_bytes());
        put(&mut s, 12, &(self.index as u16).to_le_bytes());
        s[14] = self.stream as u8;
        put(&mut s, 16, &self.array_uuid);
        put(&mut s, 32, &self.sequence.to_le_bytes());
        put(&mut s, 40, &self.slot.to_le_bytes());
        put(&mut s, 48, &self.synced_through.to_le_bytes());
        put(&mut s, 56, &self.summary_bytes.to_le_bytes());
        put(&mut s, 60, &self.data_bytes.to_le_bytes());
        put_digest(&mut s, 64, &self.leaf);
        put_digest(&mut s, 128, &self.root);
        put_digest(&mut s, 192, &self.summary_digest);
        put(&mut s, 256, &self.opening.to_le_bytes());
        seal_sector(&mut s);
        s
    }

    /// Decodes a header written with `algorithm`'s digests.
    pub fn decode(s: &[u8], algorithm: Algorithm) -> Result<ChunkHeader, FormatError> {
        const WHAT: &str = "chunk header";
        check_sector(s, &CHUNK_MAGIC, WHAT)?;
        let stream = match s[14] {
            0 => Stream::User,
            1 => Stream::Gc,
            2 => Stream::Meta,
            other => {
                return Err(FormatError::Field {
                    what: WHAT,
                    field: "stream",
                    value: u64::from(other),
                })
            }
        };
        let digest = |offset: usize| Digest::from_bytes(&s[offset..offset + algorithm.digest_bytes()]);
        Ok(ChunkHeader {
            index: usize::from(get_u16(s, 12)),
            stream,
            array_uuid: s[16..32].try_into().expect("16 bytes"),
            sequence: get_u64(s, 32),
            slot: get_u64(s, 40),
            synced_through: get_u64(s, 48),
            summary_bytes: get_u32(s, 56),
            data_bytes: get_u32(s, 60),
            leaf: digest(64),
            root: digest(128),
            summary_digest: digest(192),
            opening: get_u64(s, 256),
        })
    }
}

/// What one summary entry records. `version` orders writes to the same
/// blocks: every write takes the next version when it is mapped, and a
/// copy garbage collection makes keeps the version of what it copied, so
/// recovery keeps, block by block, the record with the highest version,
/// whatever order the stripes holding them were written in.
#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    /// The extent's blocks, from `lba`; the extent is in the stripe the
    /// summary belongs to (its `slot` is that stripe's, not stored).
    Data { lba: u64, version: u64, extent: Extent },
    /// `blocks` logical blocks from `lba` read as zeros (TRIM, WRITE_ZEROES).
    Zero { lba: u64, blocks: u32, version: u64 },
}

impl Record {
    /// Its first block's map key.
    pub fn lba(&self) -> u64 {
        match self {
            Record::Data { lba, .. } | Record::Zero { lba, .. } => *lba,
        }
    }

    pub fn version(&self) -> u64 {
        match self {
            Record::Data { version, .. } | Record::Zero { version, .. } => *version,
        }
    }

    /// The map keys it covers: [first, end).
    pub fn keys(&self) -> (u64, u64) {
        match self {
            Record::Data { lba, extent, .. } => (*lba, lba + u64::from(extent.blocks)),
            Record::Zero { lba, blocks, .. } => (*lba, lba + u64::from(*blocks)),
        }
    }

    pub fn set_version(&mut self, to: u64) {
        match self {
            Record::Data { version, .. } | Record::Zero { version, .. } => *version = to,
        }
    }
}

/// A stripe's summary: its records in write order.
///
/// ```text
///   0 record count u32   4 reserved u32
///   8 entries, each:
///      0 kind u8 (1 data, 2 zero) | codec u8 | reserved u16 | blocks u32
///      8 lba u64 | 16 version u64
///     24 offset u32 | 28 stored bytes u32          (data only)
///     32 digest [D] of the stored bytes            (data only)
///     32+D CRC32C u32 of each 4 KiB block          (raw data only)
/// ```
///
/// A zero entry is 24 bytes, a compressed extent's 32 + D, a raw extent's
/// 32 + D + 4 per block. Its length and digest are in every chunk header
/// of the stripe.
pub const SUMMARY_HEADER_BYTES: usize = 8;
const ZERO_ENTRY_BYTES: usize = 24;
const DATA_ENTRY_BYTES: usize = 32;

/// Bytes a record takes in a summary.
pub fn record_bytes(algorithm: Algorithm, record: &Record) -> usize {
    match record {
        Record::Zero { .. } => ZERO_ENTRY_BYTES,
        Record::Data { extent, .. } => data_record_bytes(algorithm, extent.block_crcs.len()),
    }
}

/// Bytes a data record with `crcs` block CRCs takes in a summary.
pub fn data_record_bytes(algorithm: Algorithm, crcs: usize) -> usize {
    DATA_ENTRY_BYTES + algorithm.digest_bytes() + 4 * crcs
}

/// Bytes a zero record takes in a summary.
pub fn zero_record_bytes() -> usize {
    ZERO_ENTRY_BYTES
}

pub fn summary_bytes(algorithm: Algorithm, records: &[Record]) -> usize {
    SUMMARY_HEADER_BYTES + records.iter().map(|r| record_bytes(algorithm, r)).sum::<usize>()
}

pub fn encode_summary(algorithm: Algorithm, records: &[Record]) -> Vec<u8> {
    let mut out = Vec::with_capacity(summary_bytes(algorithm, records));
    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    for record in records {
        match record {
            Record::Data {
                lba,
                version,
                extent: x,
            } => {
                let (codec, _) = codec_code(x.codec);
                out.extend_from_slice(&[1, codec, 0, 0]);
                out.extend_from_slice(&x.blocks.to_le_bytes());
                out.extend_from_slice(&lba.to_le_bytes());
                out.extend_from_slice(&version.to_le_bytes());
                out.extend_from_slice(&x.offset.to_le_bytes());
                out.extend_from_slice(&x.stored_bytes.to_le_bytes());
                out.extend_from_slice(x.digest.as_bytes());
                for crc in &x.block_crcs {
                    out.extend_from_slice(&crc.to_le_bytes());
                }
            }
            Record::Zero { lba, blocks, version } => {
                out.extend_from_slice(&[2, 0, 0, 0]);
                out.extend_from_slice(&blocks.to_le_bytes());
                out.extend_from_slice(&lba.to_le_bytes());
                out.extend_from_slice(&version.to_le_bytes());
            }
        }
    }
    debug_assert_eq!(out.len(), summary_bytes(algorithm, records));
    out
}

/// Decodes the summary of the stripe in `slot`, whose digest already
/// matched; fields are still checked against the geometry, so a bug cannot
/// map blocks off the end.
pub fn decode_summary(bytes: &[u8], geometry: &Geometry, slot: u64) -> Result<Vec<Record>, FormatError> {
    const WHAT: &str = "stripe summary";
    let field = |field, value: u64| FormatError::Field {
        what: WHAT,
        field,
        value,
    };
    if bytes.len() < SUMMARY_HEADER_BYTES {
        return Err(field("length", bytes.len() as u64));
    }
    let count = get_u32(bytes, 0) as usize;
    let algorithm = geometry.checksum;
    let digest_bytes = algorithm.digest_bytes();
    let data_area = geometry.data_area_bytes() as u64;
    // Every entry takes at least a zero entry's bytes: a count that could
    // not fit is refused before anything is allocated for it.
    if count > (bytes.len() - SUMMARY_HEADER_BYTES) / ZERO_ENTRY_BYTES {
        return Err(field("count", count as u64));
    }
    let mut records = Vec::with_capacity(count);
    let mut at = SUMMARY_HEADER_BYTES;
    for _ in 0..count {
        let e = bytes
            .get(at..at + ZERO_ENTRY_BYTES)
            .ok_or(field("length", bytes.len() as u64))?;
        let blocks = get_u32(e, 4);
        let lba = get_u64(e, 8);
        let version = get_u64(e, 16);
        if !within_one_volume(lba, blocks) {
            return Err(field("lba", lba));
        }
        match e[0] {
            1 => {
                let codec = codec_from_code(e[1], 0).ok_or(field("codec", u64::from(e[1])))?;
                if blocks as usize > EXTENT_BLOCKS_MAX {
                    return Err(field("blocks", u64::from(blocks)));
                }
                let crcs = if codec.is_none() { blocks as usize } else { 0 };
                let len = data_record_bytes(algorithm, crcs);
                let e = bytes.get(at..at + len).ok_or(field("length", bytes.len() as u64))?;
                let offset = get_u32(e, 24);
                let stored_bytes = get_u32(e, 28);
                if u64::from(offset) + u64::from(stored_bytes) > data_area {
                    return Err(field("offset", u64::from(offset)));
                }
                if codec.is_none() && stored_bytes as usize != blocks as usize * BLOCK_BYTES {
                    return Err(field("stored_bytes", u64::from(stored_bytes)));
                }
                let crc_at = DATA_ENTRY_BYTES + digest_bytes;
                records.push(Record::Data {
                    lba,
                    version,
                    extent: Extent {
                        slot,
                        offset,
                        stored_bytes,
                        blocks,
                        codec,
                        digest: Digest::from_bytes(&e[DATA_ENTRY_BYTES..crc_at]),
                        block_crcs: (0..crcs).map(|i| get_u32(e, crc_at + 4 * i)).collect(),
                    },
                });
                at += len;
            }
            2 => {
                records.push(Record::Zero { lba, blocks, version });
                at += ZERO_ENTRY_BYTES;
            }
            kind => return Err(field("kind", u64::from(kind))),
        }
    }
    if at != bytes.len() {
        return Err(field("length", bytes.len() as u64));
    }
    Ok(records)
}

/// A run of logical blocks stored in a stripe's data area: `blocks`
/// blocks as `stored_bytes` bytes at `offset` (compressed with `codec`, or
/// raw), with the stored bytes' `digest` in the array's algorithm. A raw
/// extent also has the CRC32C of each of its 4 KiB blocks, so that a read
/// of part of it reads and checks only the blocks it wants; it starts at a
/// 4 KiB boundary of the data area, so those reads can be direct.
#[derive(Clone, Debug, PartialEq)]
pub struct Extent {
    pub slot: u64,
    pub offset: u32,
    pub stored_bytes: u32,
    pub blocks: u32,
    pub codec: Option<Codec>,
    pub digest: Digest,
    /// One per block for a raw extent; empty for a compressed one.
    pub block_crcs: BlockCrcs,
}

/// The CRC32C of each block of a raw extent, held inline: an extent has
/// at most `EXTENT_BLOCKS_MAX` blocks (every decoder refuses more), and a
/// read builds one from the map for each piece it reads.
pub type BlockCrcs = arrayvec::ArrayVec<u32, EXTENT_BLOCKS_MAX>;

/// A piece of a map page's image: `bytes` bytes from `offset` in the
/// data area of the map stripe in slot `slot`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImagePiece {
    pub slot: u64,
    pub offset: u32,
    pub bytes: u32,
}

/// Where a map page's image is: its length, digest and pieces (one,
/// unless it runs past the end of a stripe's data area); and, for a map
/// page, the delta written over it since (FORMAT.md, "Map page deltas"):
/// the page is its image with the delta's keys as the delta has them.
#[derive(Clone, Debug, PartialEq)]
pub struct PageImage {
    pub bytes: u32,
    pub digest: Digest,
    pub pieces: Vec<ImagePiece>,
    pub delta: Option<std::sync::Arc<PageImage>>,
}

impl PageImage {
    /// An image with no delta over it.
    pub fn whole(bytes: u32, digest: Digest, pieces: Vec<ImagePiece>) -> PageImage {
        PageImage {
            bytes,
            digest,
            pieces,
            delta: None,
        }
    }

    /// Its pieces and its delta's: every byte of map stripe it keeps.
    pub fn all_pieces(&self) -> impl Iterator<Item = &ImagePiece> + '_ {
        self.pieces
            .iter()
            .chain(self.delta.iter().flat_map(|delta| delta.pieces.iter()))
    }

    /// Its stored bytes and its delta's.
    pub fn stored_bytes(&self) -> u64 {
        u64::from(self.bytes) + self.delta.as_ref().map_or(0, |delta| u64::from(delta.bytes))
    }
}

/// Where a slot page's image is, and how many of its slots it lists as
/// sealed with live data: opening after a clean stop counts the free
/// slots of the pages it has not read yet from these.
#[derive(Clone, Debug, PartialEq)]
pub struct SlotPageImage {
    /// Its image, and the delta over it if one was written since
    /// (`encode_slot_delta_image`).
    pub image: std::sync::Arc<PageImage>,
    pub kept: u32,
    /// Stored bytes of the deltas written over the image since it was,
    /// the one named included (0 without one): a page whose next delta
    /// would bring this past its whole image is written whole again.
    pub deltas: u32,
}

impl SlotPageImage {
    /// What a page lists that `entries` are: sealed slots the map points
    /// into are kept by opening; the others (emptied, or open ones only
    /// counted) it frees.
    pub fn kept_of(entries: &[SlotEntry]) -> u32 {
        entries.iter().filter(|e| e.sequence != 0 && e.pieces > 0).count() as u32
    }
}

/// A map stripe: its sequence, and the bytes of the images in it that the
/// directory (or the root, for directory pages) still names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapStripe {
    pub sequence: u64,
    pub live: u64,
}

/// The map's durable pages, as the root names them: the map stripes that
/// hold images, where each directory page's image is (a directory
/// page says where the images of `MAP_DIRECTORY_PAGES` map pages are:
/// `encode_directory_image`), with what the directory names in all, and
/// where each page of the slot table's durable form is
/// (`encode_slot_page_image`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MapImages {
    pub stripes: std::collections::BTreeMap<u64, MapStripe>,
    /// Shared with the map, which keeps an evicted directory page as its
    /// image (with the delta over it, if one was written since:
    /// `encode_directory_delta_image`).
    pub dirs: std::collections::BTreeMap<u64, std::sync::Arc<PageImage>>,
    /// Of the directory pages with a delta, the stored bytes of the deltas
    /// written over their images since they were, the one named included:
    /// a page whose next delta would bring this past its whole image is
    /// written whole again.
    pub dir_deltas: std::collections::BTreeMap<u64, u32>,
    /// Slot pages (`SLOT_TABLE_PAGE_SLOTS` slots each) that list a slot.
    pub slot_pages: std::collections::BTreeMap<u64, SlotPageImage>,
    /// Live bytes times LIVE_SCALE that the slot pages list in all.
    pub slot_live: u128,
    /// Map pages the directory names an image of, and those images' stored bytes.
    pub pages: u64,
    pub page_bytes: u64,
}

/// A slot as the slot table's durable form lists it: a sealed stripe's
/// sequence, and the counts as of the checkpoint's pages (live bytes
/// times LIVE_SCALE, map pieces pointing into it), what the pages'
/// mappings add up to. Opening takes them as they are (and replay changes
/// them as it changes the pages), instead of reading every page to add
/// them up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotEntry {
    pub slot: u64,
    pub sequence: u64,
    pub live: u64,
    pub pieces: u32,
}
const COUNTS_VOLUME_BYTES: usize = 24;

/// A page of the slot table's durable form: every stripe sealed (or
/// draining) in `SLOT_TABLE_PAGE_SLOTS` slots when the checkpoint's pages
/// were taken, and every slot then open that the map's pages point into
/// (its counts, sequence 0: the root lists its stripe as sealed since).
///
/// ```text
///   0 magic "TSRSLOTP"   8 slot page number u64 (its first slot / SLOT_TABLE_PAGE_SLOTS)
///  16 entries u32       20 reserved u32
///  24 columns, one per field in this order: base u64 | width u8 (bits)
///     map pieces | sequence | live bytes x LIVE_SCALE
///  51 the slots listed, a bit each [128]: slot first + k is bit k % 8 of byte k / 8
/// 179 entries, in slot order, back to back from the first byte's lowest bit:
///     each field as (value - base) in its width; zero bits to the byte's end
/// ```
///
/// Stored after a stored image header with codec 0 (the image as it is).
/// Packed, a page of 1,024 slots of 8+2 with 64 KiB chunks takes about
/// 8-9 bytes a slot where version 13's fixed entries took 24: under
/// random overwrites every page of a large array changes between
/// checkpoints (docs/PERFORMANCE.md, "Slot pages packed").
pub const SLOT_PAGE_MAGIC: [u8; 8] = *b"TSRSLOTP";
/// A delta over a slot page's image: its header, columns and slots
/// listed as a page's, then the slots changed since the image was
/// written, a bit each (those listed among them), then the entries.
///
/// ```text
///   0 magic "TSRSLOTD"   8 slot page number u64   16 entries u32   20 reserved u32
///  24 columns, as a page's   51 the slots listed [128]   179 the slots changed [128]
/// 307 entries, as a page's
/// ```
///
/// The page is its image with each slot changed as the delta lists it
/// (a slot changed and not listed is not listed). A delta holds every
/// slot changed since the image, not since the last delta: a page is its
/// image and one delta at most.
pub const SLOT_DELTA_MAGIC: [u8; 8] = *b"TSRSLOTD";
const SLOT_PAGE_COLUMNS: usize = 3;
const SLOT_PAGE_COLUMNS_AT: usize = 24;
const SLOT_PAGE_LISTED_AT: usize = SLOT_PAGE_COLUMNS_AT + 9 * SLOT_PAGE_COLUMNS;
const SLOT_BITMAP_BYTES: usize = crate::limits::SLOT_TABLE_PAGE_SLOTS as usize / 8;
const SLOT_PAGE_HEADER_BYTES: usize = SLOT_PAGE_LISTED_AT + SLOT_BITMAP_BYTES;
/// A packed entry's bits at most: map pieces u32, sequence u64, live u64.
const SLOT_PAGE_ENTRY_BITS_MAX: usize = 32 + 64 + 64;
const SLOT_PAGE_FIELD_BITS: [u8; SLOT_PAGE_COLUMNS] = [32, 64, 64];

/// Stored bytes a slot page of `entries` entries takes at most (each
/// field as wide as its type): what a checkpoint reserves, and what a
/// root may name.
pub fn slot_page_image_bytes_max(entries: usize) -> usize {
    STORED_IMAGE_HEADER_BYTES + SLOT_PAGE_HEADER_BYTES + (entries * SLOT_PAGE_ENTRY_BITS_MAX).div_ceil(8)
}

/// Stored bytes a delta over a slot page of `entries` entries takes at most.
pub fn slot_delta_image_bytes_max(entries: usize) -> usize {
    slot_page_image_bytes_max(entries) + SLOT_BITMAP_BYTES
}

/// An entry's fields, in the columns' order.
fn slot_page_fields(e: &SlotEntry) -> [u64; SLOT_PAGE_COLUMNS] {
    [u64::from(e.pieces), e.sequence, e.live]
}

/// Slot page `page`'s stored image; `entries` are in slot order, in the
/// page. Each field from its smallest value, as wide as its values span.
pub fn encode_slot_page_image(page: u64, entries: &[SlotEntry]) -> Vec<u8> {
    encode_slot_entries(SLOT_PAGE_MAGIC, page, entries, None)
}

/// The delta over slot page `page`'s image: the slots that changed since
/// the image was written (`changed`, in order, in the page) and the
/// entries of those the page lists now (`entries`, among them).
pub fn encode_slot_delta_image(page: u64, changed: &[u64], entries: &[SlotEntry]) -> Vec<u8> {
    let first = page * crate::limits::SLOT_TABLE_PAGE_SLOTS;
    debug_assert!(!changed.is_empty() && changed.windows(2).all(|w| w[0] < w[1]));
    debug_assert!(entries.iter().all(|e| changed.binary_search(&e.slot).is_ok()));
    encode_slot_entries(
        SLOT_DELTA_MAGIC,
        page,
        entries,
        Some(&slot_bitmap(first, changed.iter().copied())),
    )
}

/// The slots of a page of slot `first` on, a bit each.
fn slot_bitmap(first: u64, slots: impl Iterator<Item = u64>) -> [u8; SLOT_BITMAP_BYTES] {
    let mut bitmap = [0u8; SLOT_BITMAP_BYTES];
    for slot in slots {
        let k = (slot - first) as usize;
        bitmap[k / 8] |= 1 << (k % 8);
    }
    bitmap
}

/// The slots a bitmap of a page of slot `first` on holds, in order.
fn bitmap_slots(first: u64, bitmap: &[u8]) -> impl Iterator<Item = u64> + '_ {
    (0..bitmap.len() * 8)
        .filter(move |k| bitmap[k / 8] >> (k % 8) & 1 == 1)
        .map(move |k| first + k as u64)
}

/// A slot page's or a delta's stored image: its header, its columns, the
/// slots it lists, for a delta the slots changed, then the entries.
fn encode_slot_entries(
    magic: [u8; 8],
    page: u64,
    entries: &[SlotEntry],
    changed: Option<&[u8; SLOT_BITMAP_BYTES]>,
) -> Vec<u8> {
    let first = page * crate::limits::SLOT_TABLE_PAGE_SLOTS;
    // The bitmap says which slots, the entries' order which is which.
    debug_assert!(
        entries.windows(2).all(|w| w[0].slot < w[1].slot),
        "slots in order, once each"
    );
    debug_assert!(entries
        .iter()
        .all(|e| e.slot / crate::limits::SLOT_TABLE_PAGE_SLOTS == page));
    let columns = slot_page_columns(entries);
    let header = SLOT_PAGE_HEADER_BYTES + changed.map_or(0, |c| c.len());
    let bytes = STORED_IMAGE_HEADER_BYTES + header + slot_entries_bytes(entries.len(), &columns);
    let mut out = begin_raw_image(bytes, magic, page, entries.len());
    for (base, width) in columns {
        out.extend_from_slice(&base.to_le_bytes());
        out.push(width);
    }
    out.extend_from_slice(&slot_bitmap(first, entries.iter().map(|e| e.slot)));
    if let Some(changed) = changed {
        out.extend_from_slice(changed);
    }
    let mut bits = BitWriter::new(out);
    for e in entries {
        for ((base, width), value) in columns.iter().zip(slot_page_fields(e)) {
            bits.put(value - base, *width);
        }
    }
    let out = bits.finish();
    debug_assert_eq!(out.len(), bytes);
    out
}

/// Each field's base and width over `entries`: from its smallest value,
/// in the bits the values span.
fn slot_page_columns(entries: &[SlotEntry]) -> [(u64, u8); SLOT_PAGE_COLUMNS] {
    let mut columns = [(u64::MAX, 0u64); SLOT_PAGE_COLUMNS];
    for e in entries {
        for (column, value) in columns.iter_mut().zip(slot_page_fields(e)) {
            *column = (column.0.min(value), column.1.max(value));
        }
    }
    columns.map(|(low, high)| match entries.is_empty() {
        true => (0, 0),
        false => (low, (64 - (high - low).leading_zeros()) as u8),
    })
}

/// Bytes `count` entries take packed in `columns`.
fn slot_entries_bytes(count: usize, columns: &[(u64, u8); SLOT_PAGE_COLUMNS]) -> usize {
    let stride: usize = columns.iter().map(|&(_, width)| usize::from(width)).sum();
    (count * stride).div_ceil(8)
}

/// Stored bytes of slot page image of `entries` (`encode_slot_page_image`),
/// without encoding it.
pub fn slot_page_image_bytes(entries: &[SlotEntry]) -> usize {
    STORED_IMAGE_HEADER_BYTES + SLOT_PAGE_HEADER_BYTES + slot_entries_bytes(entries.len(), &slot_page_columns(entries))
}

/// Values of up to 64 bits appended to bytes, each from the lowest bit
/// of the next free bit on.
struct BitWriter {
    out: Vec<u8>,
    pending: u128,
    bits: u32,
}

impl BitWriter {
    fn new(out: Vec<u8>) -> BitWriter {
        BitWriter {
            out,
            pending: 0,
            bits: 0,
        }
    }

    /// `value` (which fits `width` bits) in the next `width` bits.
    fn put(&mut self, value: u64, width: u8) {
        debug_assert!(width == 64 || value >> width == 0);
        self.pending |= u128::from(value) << self.bits;
        self.bits += u32::from(width);
        // Eight bytes at a time (fewer than 64 bits wait, and a value
        // of up to 64 more still fits).
        if self.bits >= 64 {
            self.out.extend_from_slice(&(self.pending as u64).to_le_bytes());
            self.pending >>= 64;
            self.bits -= 64;
        }
    }

    /// The bytes, the last one's unused bits zero.
    fn finish(mut self) -> Vec<u8> {
        let bytes = self.bits.div_ceil(8) as usize;
        self.out.extend_from_slice(&self.pending.to_le_bytes()[..bytes]);
        self.out
    }
}

/// Bit `at` on of `bytes`, `width` (at most 64) of them, as `BitWriter`
/// wrote them; the caller has checked that they lie in `bytes`.
fn get_bits(bytes: &[u8], at: usize, width: u8) -> u64 {
    if width == 0 {
        return 0;
    }
    let (first, shift) = (at / 8, at % 8);
    let last = (at + usize::from(width)).div_ceil(8);
    let mut row = 0u128;
    for (i, &b) in bytes[first..last].iter().enumerate() {
        row |= u128::from(b) << (8 * i);
    }
    let value = (row >> shift) as u64;
    match width {
        64 => value,
        width => value & ((1u64 << width) - 1),
    }
}

/// The image a raw stored image (codec 0) holds, of at least
/// `header_bytes` starting with `magic`.
fn raw_image<'a>(
    stored: &'a [u8],
    magic: [u8; 8],
    header_bytes: usize,
    what: &'static str,
) -> Result<&'a [u8], FormatError> {
    if stored.len() < STORED_IMAGE_HEADER_BYTES + header_bytes
        || stored[4..8] != [0; 4]
        || get_u32(stored, 0) as usize != stored.len() - STORED_IMAGE_HEADER_BYTES
    {
        return Err(FormatError::Field {
            what,
            field: "length",
            value: stored.len() as u64,
        });
    }
    let bytes = &stored[STORED_IMAGE_HEADER_BYTES..];
    if bytes[..8] != magic {
        return Err(FormatError::Magic { what });
    }
    Ok(bytes)
}

/// A raw stored image of `bytes` (codec 0) begun: its stored header,
/// then `magic`, the page's `number`, its `entries` and a reserved word.
fn begin_raw_image(bytes: usize, magic: [u8; 8], number: u64, entries: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes);
    out.extend_from_slice(&((bytes - STORED_IMAGE_HEADER_BYTES) as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&magic);
    out.extend_from_slice(&number.to_le_bytes());
    out.extend_from_slice(&(entries as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out
}

/// The slot page a stored image holds (its digest already matched),
/// every field checked: its columns within their types, its slots in
/// the page and the array, as many listed as it has entries, the bytes
/// exactly what they pack into, each entry with a sequence or pieces, and
/// live bytes only where pieces point.
pub fn decode_slot_page_image(stored: &[u8], geometry: &Geometry) -> Result<(u64, Vec<SlotEntry>), FormatError> {
    let (page, entries, _) = decode_slot_entries(stored, geometry, false)?;
    Ok((page, entries))
}

/// A delta over a slot page's image (`encode_slot_delta_image`), checked
/// as a page is, and its slots changed: at least one, each in the page
/// and the array, every slot it lists among them.
pub fn decode_slot_delta_image(stored: &[u8], geometry: &Geometry) -> Result<SlotDelta, FormatError> {
    let (page, entries, changed) = decode_slot_entries(stored, geometry, true)?;
    Ok(SlotDelta {
        page,
        changed: changed.expect("a delta's slots changed"),
        entries,
    })
}

/// A delta over a slot page's image: the slots changed since the image
/// was written, in order, and the entries of those listed now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotDelta {
    pub page: u64,
    pub changed: Vec<u64>,
    pub entries: Vec<SlotEntry>,
}

impl SlotDelta {
    /// The page the delta leaves of `base` (its image's entries): those
    /// of slots not changed, and the delta's, in slot order.
    pub fn over(&self, base: &[SlotEntry]) -> Vec<SlotEntry> {
        let mut page: Vec<SlotEntry> = base
            .iter()
            .filter(|e| self.changed.binary_search(&e.slot).is_err())
            .copied()
            .chain(self.entries.iter().copied())
            .collect();
        page.sort_unstable_by_key(|e| e.slot);
        page
    }
}

/// A page's number, its entries, and a delta's slots changed.
type SlotEntriesRead = (u64, Vec<SlotEntry>, Option<Vec<u64>>);

/// A slot page's or a delta's entries (and a delta's slots changed).
fn decode_slot_entries(stored: &[u8], geometry: &Geometry, delta: bool) -> Result<SlotEntriesRead, FormatError> {
    let what = match delta {
        true => "slot table page delta",
        false => "slot table page",
    };
    let field = |field, value: u64| FormatError::Field { what, field, value };
    let length = || field("length", stored.len() as u64);
    let (magic, header) = match delta {
        true => (SLOT_DELTA_MAGIC, SLOT_PAGE_HEADER_BYTES + SLOT_BITMAP_BYTES),
        false => (SLOT_PAGE_MAGIC, SLOT_PAGE_HEADER_BYTES),
    };
    let bytes = raw_image(stored, magic, header, what)?;
    let per_page = crate::limits::SLOT_TABLE_PAGE_SLOTS;
    let page = get_u64(bytes, 8);
    let slots = geometry.slot_count();
    if page >= slots.div_ceil(per_page) {
        return Err(field("slot_page", page));
    }
    let first = page * per_page;
    let end = slots.min(first + per_page);
    let count = get_u32(bytes, 16) as u64;
    if (count == 0 && !delta) || count > per_page || get_u32(bytes, 20) != 0 {
        return Err(field("entries", count));
    }
    let mut columns = [(0u64, 0u8); SLOT_PAGE_COLUMNS];
    for (k, column) in columns.iter_mut().enumerate() {
        let at = SLOT_PAGE_COLUMNS_AT + 9 * k;
        *column = (get_u64(bytes, at), bytes[at + 8]);
        if column.1 > SLOT_PAGE_FIELD_BITS[k] {
            return Err(field("column_width", u64::from(column.1)));
        }
    }
    let stride: usize = columns.iter().map(|&(_, width)| usize::from(width)).sum();
    let packed = &bytes[header..];
    let packed_bits = count as usize * stride;
    if packed.len() != packed_bits.div_ceil(8)
        || (!packed_bits.is_multiple_of(8) && packed[packed.len() - 1] >> (packed_bits % 8) != 0)
    {
        return Err(length());
    }
    let listed = &bytes[SLOT_PAGE_LISTED_AT..SLOT_PAGE_HEADER_BYTES];
    let listed_count: u32 = listed.iter().map(|b| b.count_ones()).sum();
    if u64::from(listed_count) != count {
        return Err(field("slots_listed", u64::from(listed_count)));
    }
    let changed = match delta {
        true => {
            let bitmap = &bytes[SLOT_PAGE_HEADER_BYTES..header];
            let changed: Vec<u64> = bitmap_slots(first, bitmap).collect();
            if changed.is_empty() || changed.last().is_some_and(|&slot| slot >= end) {
                return Err(field("slots_changed", changed.len() as u64));
            }
            // Every slot listed changed.
            if let Some(byte) = listed.iter().zip(bitmap).position(|(l, c)| l & !c != 0) {
                return Err(field("slot_unchanged", first + 8 * byte as u64));
            }
            Some(changed)
        }
        false => None,
    };
    let mut entries: Vec<SlotEntry> = Vec::with_capacity(count as usize);
    let mut at = 0;
    for slot in bitmap_slots(first, listed) {
        if slot >= end {
            return Err(field("slot", slot));
        }
        let mut values = [0u64; SLOT_PAGE_COLUMNS];
        for ((value, &(base, width)), (name, bits)) in values
            .iter_mut()
            .zip(&columns)
            .zip(["pieces", "sequence", "live"].into_iter().zip(SLOT_PAGE_FIELD_BITS))
        {
            let offset = get_bits(packed, at, width);
            at += usize::from(width);
            *value = base
                .checked_add(offset)
                .filter(|&v| bits == 64 || v >> bits == 0)
                .ok_or_else(|| field(name, base))?;
        }
        let [pieces, sequence, live] = values;
        let entry = SlotEntry {
            slot,
            pieces: pieces as u32,
            sequence,
            live,
        };
        if entry.sequence == 0 && entry.pieces == 0 {
            return Err(field("sequence", 0));
        }
        if entry.pieces == 0 && entry.live != 0 {
            return Err(field("live", entry.live));
        }
        entries.push(entry);
    }
    Ok((page, entries, changed))
}

impl MapImages {
    /// Bytes of images each map stripe holds that are still named.
    pub fn live_bytes(&self) -> std::collections::BTreeMap<u64, u64> {
        self.stripes.iter().map(|(&slot, s)| (slot, s.live)).collect()
    }

    /// Pieces of the directory pages' and slot pages' images (and of
    /// the slot pages' deltas).
    pub fn piece_count(&self) -> usize {
        self.dirs
            .values()
            .chain(self.slot_pages.values().map(|p| &p.image))
            .map(|p| p.all_pieces().count())
            .sum()
    }

    /// Directory pages and slot pages with a delta over their image.
    pub fn delta_count(&self) -> usize {
        let dirs = self.dirs.values().filter(|i| i.delta.is_some()).count();
        dirs + self.slot_pages.values().filter(|p| p.image.delta.is_some()).count()
    }
}

const CHECKPOINT_HEADER_BYTES: usize = 112;
/// A directory page's or slot page's entry in a checkpoint, before its
/// digest and pieces.
const CHECKPOINT_PAGE_BYTES: usize = 20;
const CHECKPOINT_PIECE_BYTES: usize = 12;
/// A directory page's or slot page's delta in a checkpoint, before its digest and pieces.
const CHECKPOINT_DELTA_BYTES: usize = 12;
/// `pieces` u32 in a directory page's or slot page's entry: a delta follows the image's pieces.
const CHECKPOINT_DELTA_FOLLOWS: u32 = 1 << 31;
const CHECKPOINT_MAP_STRIPE_BYTES: usize = 24;

/// A directory page's image: where the images of its map pages are.
///
/// ```text
///   0 magic "TSRMAPDR"   8 directory page number u64 (its first map page / MAP_DIRECTORY_PAGES)
///  16 entries u32       20 reserved u32
///  24 entries, in page order: page u64 | stored image bytes u32 | pieces u32 | digest [D]
///     | per piece: map stripe slot u64 | offset in its data area u32 | bytes u32
///     | if bit 31 of pieces is set, the delta over the image: stored bytes u32
///       | pieces u32 | digest [D] | its pieces, as above
/// ```
///
/// Stored raw (the stored header's codec 0): its size is known before the
/// slots its pieces name are, and digests do not compress.
pub const DIRECTORY_MAGIC: [u8; 8] = *b"TSRMAPDR";
const DIRECTORY_HEADER_BYTES: usize = 24;
const DIRECTORY_ENTRY_BYTES: usize = 16;
const DIRECTORY_PIECE_BYTES: usize = 16;

/// `pieces` u32 in a directory page's entry: a delta follows the image's pieces.
const DIRECTORY_DELTA_FOLLOWS: u32 = 1 << 31;
/// A delta's place in a directory page's entry, before its digest and pieces.
const DIRECTORY_DELTA_BYTES: usize = 8;

/// Stored bytes of a directory page of `pages` entries with `pieces`
/// pieces in all (and no delta: `directory_entry_bytes` sizes those).
pub fn directory_image_bytes(algorithm: Algorithm, pages: usize, pieces: usize) -> usize {
    STORED_IMAGE_HEADER_BYTES
        + DIRECTORY_HEADER_BYTES
        + (DIRECTORY_ENTRY_BYTES + algorithm.digest_bytes()) * pages
        + DIRECTORY_PIECE_BYTES * pieces
}

/// Bytes a directory page's entry for `image` takes (its delta's too).
pub fn directory_entry_bytes(algorithm: Algorithm, image: &PageImage) -> usize {
    let delta = image.delta.as_ref().map_or(0, |delta| {
        DIRECTORY_DELTA_BYTES + algorithm.digest_bytes() + DIRECTORY_PIECE_BYTES * delta.pieces.len()
    });
    DIRECTORY_ENTRY_BYTES + algorithm.digest_bytes() + DIRECTORY_PIECE_BYTES * image.pieces.len() + delta
}

/// Bytes `deltas` deltas in `pieces` pieces add to directory pages' entries.
pub fn directory_deltas_bytes(algorithm: Algorithm, deltas: usize, pieces: usize) -> usize {
    (DIRECTORY_DELTA_BYTES + algorithm.digest_bytes()) * deltas + DIRECTORY_PIECE_BYTES * pieces
}

/// Stored bytes of a directory page of `entries` entries taking `bytes`
/// (`directory_entry_bytes`) in all.
pub fn directory_image_bytes_of(entries_bytes: usize) -> usize {
    STORED_IMAGE_HEADER_BYTES + DIRECTORY_HEADER_BYTES + entries_bytes
}

/// Directory page `dir`'s stored image (the stored header, then the image).
pub fn encode_directory_image(
    algorithm: Algorithm,
    dir: u64,
    pages: &std::collections::BTreeMap<u64, std::sync::Arc<PageImage>>,
) -> Vec<u8> {
    let entries: usize = pages.values().map(|i| directory_entry_bytes(algorithm, i)).sum();
    let bytes = directory_image_bytes_of(entries);
    let mut out = begin_raw_image(bytes, DIRECTORY_MAGIC, dir, pages.len());
    for (&page, image) in pages {
        debug_assert_eq!(page / crate::limits::MAP_DIRECTORY_PAGES, dir);
        encode_directory_entry(&mut out, page, image);
    }
    debug_assert_eq!(out.len(), bytes);
    out
}

/// Appends a directory page's entry for map page `page`.
pub fn encode_directory_entry(out: &mut Vec<u8>, page: u64, image: &PageImage) {
    out.extend_from_slice(&page.to_le_bytes());
    let follows = if image.delta.is_some() {
        DIRECTORY_DELTA_FOLLOWS
    } else {
        0
    };
    encode_image_place(out, image, follows);
    if let Some(delta) = &image.delta {
        debug_assert!(delta.delta.is_none(), "a delta over a delta");
        encode_image_place(out, delta, 0);
    }
}

/// An image's stored bytes u32 | pieces u32 (with `flags`) | digest | pieces.
fn encode_image_place(out: &mut Vec<u8>, image: &PageImage, flags: u32) {
    out.extend_from_slice(&image.bytes.to_le_bytes());
    out.extend_from_slice(&(image.pieces.len() as u32 | flags).to_le_bytes());
    out.extend_from_slice(image.digest.as_bytes());
    for piece in &image.pieces {
        out.extend_from_slice(&piece.slot.to_le_bytes());
        out.extend_from_slice(&piece.offset.to_le_bytes());
        out.extend_from_slice(&piece.bytes.to_le_bytes());
    }
}

/// Where a directory page's entry that starts at `entry` ends, and where
/// its image's place (`encode_image_place`) and its delta's start, as
/// `encode_directory_entry` wrote them (for an entry already checked).
pub fn directory_entry_parts(bytes: &[u8], entry: usize, digest_bytes: usize) -> (usize, usize, Option<usize>) {
    let place_end = |at: usize| {
        let pieces = get_u32(bytes, at + 4) & !DIRECTORY_DELTA_FOLLOWS;
        at + 8 + digest_bytes + DIRECTORY_PIECE_BYTES * pieces as usize
    };
    let image = entry + 8;
    let end = place_end(image);
    match get_u32(bytes, image + 4) & DIRECTORY_DELTA_FOLLOWS != 0 {
        true => (place_end(end), image, Some(end)),
        false => (end, image, None),
    }
}

/// The image whose place (`encode_image_place`) starts at `at`, without its delta.
pub fn decode_image_place(bytes: &[u8], at: usize, digest_bytes: usize) -> PageImage {
    let pieces = get_u32(bytes, at + 4) & !DIRECTORY_DELTA_FOLLOWS;
    let first = at + 8 + digest_bytes;
    let pieces = (0..pieces as usize)
        .map(|i| {
            let o = first + DIRECTORY_PIECE_BYTES * i;
            ImagePiece {
                slot: get_u64(bytes, o),
                offset: get_u32(bytes, o + 8),
                bytes: get_u32(bytes, o + 12),
            }
        })
        .collect();
    PageImage::whole(
        get_u32(bytes, at),
        Digest::from_bytes(&bytes[at + 8..at + 8 + digest_bytes]),
        pieces,
    )
}

/// The directory page a stored image holds (its digest already matched),
/// every field checked: its pages in order and its own, each image's
/// size within what a page makes, its pieces inside a stripe's data area
/// and adding up to it. Whether the pieces' slots are map stripes is
/// the caller's to check.
pub fn decode_directory_image(
    stored: &[u8],
    geometry: &Geometry,
) -> Result<(u64, std::collections::BTreeMap<u64, std::sync::Arc<PageImage>>), FormatError> {
    let (dir, pages, _) = decode_directory_entries(stored, geometry, false)?;
    Ok((dir, pages))
}

/// A directory page's delta over its image (FORMAT.md, "Directory page
/// deltas"): the pages whose entries changed since the image, and the
/// entries of those it names now (a page changed and not named lost its
/// image: it was emptied).
///
/// ```text
///   0 magic "TSRMAPDD"   8 directory page number u64
///  16 entries u32       20 reserved u32
///  24 the pages changed since the image, a bit each [64]: page
///     first + k is bit k % 8 of byte k / 8
///  88 entries of the pages changed that it names now, in page order,
///     as an image's
/// ```
///
/// Stored raw, as an image is. Under random writes over a large array
/// every directory page changes between checkpoints of pages, in a few of
/// its 512 entries each.
pub const DIRECTORY_DELTA_MAGIC: [u8; 8] = *b"TSRMAPDD";
const DIRECTORY_CHANGED_BYTES: usize = crate::limits::MAP_DIRECTORY_PAGES as usize / 8;

/// A directory page's delta, decoded (`decode_directory_delta_image`).
#[derive(Clone, Debug, PartialEq)]
pub struct DirectoryDelta {
    pub dir: u64,
    /// The pages changed since the image, in order.
    pub changed: std::collections::BTreeSet<u64>,
    pub entries: std::collections::BTreeMap<u64, std::sync::Arc<PageImage>>,
}

impl DirectoryDelta {
    /// The page's entries: `base`'s (its image's) with the changed ones
    /// as the delta has them.
    pub fn over(
        &self,
        mut base: std::collections::BTreeMap<u64, std::sync::Arc<PageImage>>,
    ) -> std::collections::BTreeMap<u64, std::sync::Arc<PageImage>> {
        for page in &self.changed {
            base.remove(page);
        }
        base.extend(self.entries.iter().map(|(&page, image)| (page, image.clone())));
        base
    }
}

/// Stored bytes of a directory page's delta whose entries take
/// `entries_bytes` (`directory_entry_bytes`) in all.
pub fn directory_delta_bytes_of(entries_bytes: usize) -> usize {
    directory_image_bytes_of(entries_bytes) + DIRECTORY_CHANGED_BYTES
}

/// Directory page `dir`'s stored delta: `changed` (at least one page of
/// it), with the entries of `pages` among them.
pub fn encode_directory_delta_image(
    algorithm: Algorithm,
    dir: u64,
    changed: &std::collections::BTreeSet<u64>,
    pages: &std::collections::BTreeMap<u64, std::sync::Arc<PageImage>>,
) -> Vec<u8> {
    debug_assert!(!changed.is_empty(), "a delta changes a page");
    let named: Vec<(u64, &std::sync::Arc<PageImage>)> = changed
        .iter()
        .filter_map(|page| pages.get(page).map(|image| (*page, image)))
        .collect();
    let entries: usize = named.iter().map(|(_, i)| directory_entry_bytes(algorithm, i)).sum();
    let bytes = directory_delta_bytes_of(entries);
    let mut out = begin_raw_image(bytes, DIRECTORY_DELTA_MAGIC, dir, named.len());
    let first = dir * crate::limits::MAP_DIRECTORY_PAGES;
    let mut bitmap = [0u8; DIRECTORY_CHANGED_BYTES];
    for &page in changed {
        debug_assert_eq!(page / crate::limits::MAP_DIRECTORY_PAGES, dir);
        let k = (page - first) as usize;
        bitmap[k / 8] |= 1 << (k % 8);
    }
    out.extend_from_slice(&bitmap);
    for (page, image) in named {
        encode_directory_entry(&mut out, page, image);
    }
    debug_assert_eq!(out.len(), bytes);
    out
}

/// A directory page's delta (`encode_directory_delta_image`), checked as
/// an image is, and its pages changed: at least one, every page it names
/// among them.
pub fn decode_directory_delta_image(stored: &[u8], geometry: &Geometry) -> Result<DirectoryDelta, FormatError> {
    let (dir, entries, changed) = decode_directory_entries(stored, geometry, true)?;
    Ok(DirectoryDelta {
        dir,
        changed: changed.expect("a delta's pages changed"),
        entries,
    })
}

/// A directory page's number, its entries, and for a delta its pages changed.
type DirectoryRead = (
    u64,
    std::collections::BTreeMap<u64, std::sync::Arc<PageImage>>,
    Option<std::collections::BTreeSet<u64>>,
);

/// A directory page's image, or with `delta` its delta, decoded and
/// checked (`DirectoryRead`).
fn decode_directory_entries(stored: &[u8], geometry: &Geometry, delta: bool) -> Result<DirectoryRead, FormatError> {
    const WHAT: &str = "map directory page";
    let field = |field, value: u64| FormatError::Field {
        what: WHAT,
        field,
        value,
    };
    let length = || field("length", stored.len() as u64);
    let (magic, header) = match delta {
        false => (DIRECTORY_MAGIC, DIRECTORY_HEADER_BYTES),
        true => (DIRECTORY_DELTA_MAGIC, DIRECTORY_HEADER_BYTES + DIRECTORY_CHANGED_BYTES),
    };
    let bytes = raw_image(stored, magic, header, WHAT)?;
    let dir = get_u64(bytes, 8);
    let per_dir = crate::limits::MAP_DIRECTORY_PAGES;
    let first = dir.checked_mul(per_dir).ok_or(field("directory_page", dir))?;
    let first_key = first.saturating_mul(crate::limits::MAP_PAGE_BLOCKS);
    if !within_one_volume(first_key, (per_dir * crate::limits::MAP_PAGE_BLOCKS) as u32) {
        return Err(field("directory_page", dir));
    }
    let changed = delta.then(|| {
        let bitmap = &bytes[DIRECTORY_HEADER_BYTES..header];
        (0..per_dir)
            .filter(|&k| bitmap[k as usize / 8] & (1 << (k % 8)) != 0)
            .map(|k| first + k)
            .collect::<std::collections::BTreeSet<u64>>()
    });
    if changed.as_ref().is_some_and(|changed| changed.is_empty()) {
        return Err(field("changed", 0));
    }
    let entries = get_u32(bytes, 16) as u64;
    let entries_min = match delta {
        true => 0,
        false => 1,
    };
    let entries_max = changed.as_ref().map_or(per_dir, |c| c.len() as u64);
    if entries < entries_min || entries > entries_max || get_u32(bytes, 20) != 0 {
        return Err(field("entries", entries));
    }
    let algorithm = geometry.checksum;
    let per_stripe = meta_stripe_bytes(geometry) as u64;
    let slots = geometry.slot_count();
    let mut at = header;
    let mut next = |n: usize| -> Result<&[u8], FormatError> {
        let piece = bytes.get(at..at + n).ok_or_else(length)?;
        at += n;
        Ok(piece)
    };
    let mut pages = std::collections::BTreeMap::new();
    for _ in 0..entries {
        let page = get_u64(next(8)?, 0);
        let in_order = pages.last_key_value().is_none_or(|(&last, _)| last < page);
        let listed = changed.as_ref().is_none_or(|changed| changed.contains(&page));
        if page / per_dir != dir || !in_order || !listed {
            return Err(field("page", page));
        }
        let mut place = |bytes_max: usize| -> Result<(PageImage, bool), FormatError> {
            let e = next(DIRECTORY_DELTA_BYTES + algorithm.digest_bytes())?;
            let (image_bytes, piece_count) = (get_u32(e, 0), get_u32(e, 4));
            let image = image_location(
                image_bytes,
                (piece_count & !DIRECTORY_DELTA_FOLLOWS) as usize,
                Digest::from_bytes(&e[DIRECTORY_DELTA_BYTES..]),
                bytes_max,
                |_| {
                    let p = next(DIRECTORY_PIECE_BYTES)?;
                    let slot = get_u64(p, 0);
                    if slot >= slots {
                        return Err(field("piece_slot", slot));
                    }
                    Ok((slot, get_u32(p, 8), get_u32(p, 12)))
                },
                per_stripe,
                WHAT,
            )?;
            Ok((image, piece_count & DIRECTORY_DELTA_FOLLOWS != 0))
        };
        let (mut image, follows) = place(STORED_IMAGE_BYTES_MAX)?;
        if follows {
            let (delta, more) = place(STORED_DELTA_BYTES_MAX)?;
            if more {
                return Err(field("delta", page));
            }
            image.delta = Some(std::sync::Arc::new(delta));
        }
        pages.insert(page, std::sync::Arc::new(image));
    }
    if at != bytes.len() {
        return Err(length());
    }
    Ok((dir, pages, changed))
}

/// An image's place read from a root or a directory page: `bytes` stored
/// bytes (more than a stored header, at most `bytes_max`) in
/// `piece_count` pieces that `piece` reads, each inside a stripe's data
/// area of `per_stripe` bytes, adding up to `bytes`.
fn image_location(
    bytes: u32,
    piece_count: usize,
    digest: Digest,
    bytes_max: usize,
    mut piece: impl FnMut(usize) -> Result<(u64, u32, u32), FormatError>,
    per_stripe: u64,
    what: &'static str,
) -> Result<PageImage, FormatError> {
    let field = |field, value: u64| FormatError::Field { what, field, value };
    if (bytes as usize) <= STORED_IMAGE_HEADER_BYTES || bytes as usize > bytes_max {
        return Err(field("image_bytes", u64::from(bytes)));
    }
    if piece_count == 0 || piece_count > bytes as usize {
        return Err(field("pieces", piece_count as u64));
    }
    let mut pieces = Vec::with_capacity(piece_count);
    let mut total = 0u64;
    for i in 0..piece_count {
        let (slot, offset, piece_bytes) = piece(i)?;
        if piece_bytes == 0 || u64::from(offset) + u64::from(piece_bytes) > per_stripe {
            return Err(field("piece_offset", u64::from(offset)));
        }
        total += u64::from(piece_bytes);
        pieces.push(ImagePiece {
            slot,
            offset,
            bytes: piece_bytes,
        });
    }
    if total != u64::from(bytes) {
        return Err(field("image_bytes", u64::from(bytes)));
    }
    Ok(PageImage::whole(bytes, digest, pieces))
}

/// The most stored bytes a directory page's delta takes: every page of it
/// changed and named.
pub fn directory_delta_bytes_max(geometry: &Geometry) -> usize {
    directory_image_bytes_max(geometry) + DIRECTORY_CHANGED_BYTES
}

/// The most stored bytes a directory page's image takes: every page of it
/// named, each image in as many pieces as it can be cut into.
pub fn directory_image_bytes_max(geometry: &Geometry) -> usize {
    let per_stripe = meta_stripe_bytes(geometry);
    let pieces = STORED_IMAGE_BYTES_MAX.div_ceil(per_stripe) + 1;
    let delta_pieces = STORED_DELTA_BYTES_MAX.div_ceil(per_stripe) + 1;
    let pages = crate::limits::MAP_DIRECTORY_PAGES as usize;
    directory_image_bytes(geometry.checksum, pages, pages * (pieces + delta_pieces))
        + pages * (DIRECTORY_DELTA_BYTES + geometry.checksum.digest_bytes())
}

/// A map page's image (`crate::map` encodes and checks them): its header
/// (page number u64 | entries u32 | words u32), its column table (a base
/// u64, a shift u8 and a width u8 for each of an entry's 13 fields), the
/// most bytes a packed entry takes (every field as wide as its type: 38),
/// and the most 32-bit words an entry may refer to (the longest digest, a
/// CRC for each block of the longest record).
pub const PAGE_IMAGE_HEADER_BYTES: usize = 16;
pub const PAGE_IMAGE_COLUMNS_BYTES: usize = 130;
pub const PAGE_IMAGE_ENTRY_BYTES: usize = 40;
pub const PAGE_IMAGE_WORDS_PER_ENTRY_MAX: usize = DIGEST_FIELD_BYTES / 4 + EXTENT_BLOCKS_MAX;
/// The most bytes a page image takes: every key its own entry, each with
/// the most words.
pub const PAGE_IMAGE_BYTES_MAX: usize = PAGE_IMAGE_HEADER_BYTES
    + PAGE_IMAGE_COLUMNS_BYTES
    + crate::limits::MAP_PAGE_BLOCKS as usize * (PAGE_IMAGE_ENTRY_BYTES + 4 * PAGE_IMAGE_WORDS_PER_ENTRY_MAX);

/// Bytes before a stored page image's compressed bytes.
pub const STORED_IMAGE_HEADER_BYTES: usize = 8;
/// The most bytes a stored page image takes: it is kept raw where
/// compressing would not make it smaller.
pub const STORED_IMAGE_BYTES_MAX: usize = PAGE_IMAGE_BYTES_MAX + STORED_IMAGE_HEADER_BYTES;
/// A map page delta's image before the page image of its entries: page
/// number u64 | the keys it holds, a bit each [64] | the keys the deltas
/// since the base held u32 | reserved u32.
pub const DELTA_HEADER_BYTES: usize = 80;
/// The most bytes a delta's image takes, and stored.
pub const DELTA_IMAGE_BYTES_MAX: usize = DELTA_HEADER_BYTES + PAGE_IMAGE_BYTES_MAX;
pub const STORED_DELTA_BYTES_MAX: usize = DELTA_IMAGE_BYTES_MAX + STORED_IMAGE_HEADER_BYTES;
/// How page images are compressed: zstd at level 1 (packed entries gain
/// little, a page's words and sparse pages' shared fields more:
/// `map::tests::a_random_block_costs_11_bytes_of_image_and_stored`).
const IMAGE_CODEC: Codec = Codec::Zstd { level: 1 };

/// A page image as a checkpoint stores it: its raw length u32, its codec
/// u8 (0 raw, or zstd's code), 3 reserved bytes, then its bytes,
/// compressed where that makes them smaller.
pub fn store_page_image(image: &[u8]) -> Vec<u8> {
    let compressed = IMAGE_CODEC.compress(image).ok().filter(|c| c.len() < image.len());
    let (code, bytes) = match &compressed {
        Some(c) => (codec_code(Some(IMAGE_CODEC)).0, &c[..]),
        None => (0, image),
    };
    let mut out = Vec::with_capacity(STORED_IMAGE_HEADER_BYTES + bytes.len());
    out.extend_from_slice(&(image.len() as u32).to_le_bytes());
    out.extend_from_slice(&[code, 0, 0, 0]);
    out.extend_from_slice(bytes);
    out
}

/// The page image a stored one holds (its digest already matched).
pub fn load_page_image(stored: &[u8]) -> Result<Vec<u8>, FormatError> {
    load_stored(stored, PAGE_IMAGE_BYTES_MAX, "stored map page")
}

/// The delta image a stored one holds (its digest already matched).
pub fn load_delta_image(stored: &[u8]) -> Result<Vec<u8>, FormatError> {
    load_stored(stored, DELTA_IMAGE_BYTES_MAX, "stored map page delta")
}

/// The image a stored one holds (`store_page_image`), at most `raw_max` bytes.
fn load_stored(stored: &[u8], raw_max: usize, what: &'static str) -> Result<Vec<u8>, FormatError> {
    let field = |field, value: u64| FormatError::Field { what, field, value };
    if stored.len() < STORED_IMAGE_HEADER_BYTES || stored[5..8] != [0, 0, 0] {
        return Err(field("length", stored.len() as u64));
    }
    let raw = get_u32(stored, 0) as usize;
    if raw > raw_max {
        return Err(field("raw_bytes", raw as u64));
    }
    let bytes = &stored[STORED_IMAGE_HEADER_BYTES..];
    match stored[4] {
        0 if bytes.len() == raw => Ok(bytes.to_vec()),
        code if code != 0 && code == codec_code(Some(IMAGE_CODEC)).0 => IMAGE_CODEC
            .decompress(bytes, raw)
            .map_err(|_| field("compressed", bytes.len() as u64)),
        code => Err(field("codec", u64::from(code))),
    }
}

/// Bytes of checkpoint (or directory, or map pages) a Meta stripe holds:
/// its data area less an empty summary.
pub fn meta_stripe_bytes(geometry: &Geometry) -> usize {
    geometry.data_area_bytes() - summary_bytes(geometry.checksum, &[])
}

/// Encoded size of a checkpoint with these counts (`pieces`: of all its
/// directory pages' images together).
pub fn checkpoint_bytes(algorithm: Algorithm, shape: RootShape) -> usize {
    let RootShape {
        stripes,
        window,
        map_stripes,
        named,
        deltas,
        pieces,
        volumes,
    } = shape;
    CHECKPOINT_HEADER_BYTES
        + COUNTS_VOLUME_BYTES * volumes
        + 16 * stripes
        + 8 * window
        + CHECKPOINT_MAP_STRIPE_BYTES * map_stripes
        + (CHECKPOINT_PAGE_BYTES + algorithm.digest_bytes()) * named
        + (CHECKPOINT_DELTA_BYTES + algorithm.digest_bytes()) * deltas
        + CHECKPOINT_PIECE_BYTES * pieces
}

/// What a root holds, by count (`checkpoint_bytes`): stripes sealed
/// since the slot pages, window slots, map stripes, directory and slot
/// pages named, slot pages with a delta, their images' (and deltas')
/// pieces, and volumes.
#[derive(Clone, Copy, Debug, Default)]
pub struct RootShape {
    pub stripes: usize,
    pub window: usize,
    pub map_stripes: usize,
    pub named: usize,
    pub deltas: usize,
    pub pieces: usize,
    pub volumes: usize,
}

/// A checkpoint: the root of the map as of stripe `sequence`. It names
/// the pages of the slot table's durable form (every live stripe and its
/// sequence, with what the map's pages count in it), the stripes sealed
/// since those were taken, the window (the slots the array may write
/// before the next checkpoint: free ones, and live ones garbage
/// collection is likely to empty first, so recovery reads only their
/// headers to roll forward), the map stripes, and where each page of the
/// map's directory is; a directory page says where the images of 512 map
/// pages are. The images are in map stripes (Meta stripes of their own,
/// each holding many), written when their page changed: a page left
/// alone keeps the image an earlier checkpoint wrote, and a directory
/// page none of whose pages moved keeps its own; so does a slot page
/// none of whose slots changed.
///
/// The map may be "fuzzy": its pages copied one by one while writes
/// went on. Every write in it that is newer than `sequence` is also in a
/// stripe newer than `sequence`, in the window, and recovery keeps the
/// newest version of each block, so replaying those stripes over it
/// gives the right map.
///
/// ```text
///   0 magic "TSRCHKPT"   8 version u32   12 reserved u32
///  16 sequence u64      24 next write version u64
///  32 stripes sealed since the slot pages u64   40 window slots u64
///  48 map stripes u64   56 directory pages u64   64 slot pages u64
///  72 counted volumes u64
///  80 map pages named u64   88 their images' stored bytes u64
///  96 live bytes x LIVE_SCALE the slot pages list u128
/// 112 counted volumes: data blocks u64 | stored bytes x LIVE_SCALE u128
///     stripes sealed since: slot u64 | sequence u64
///     window: slot u64
///     map stripes: slot u64 | sequence u64 | bytes of named images in it u64
///     directory pages: number u64 | image bytes u32 | pieces u32 | 0 u32
///            | digest [D] of the image
///            | per piece: map stripe number u32 | offset u32 | bytes u32
///            | if bit 31 of pieces is set, the delta over the image
///              (`encode_directory_delta_image`): bytes u32 | pieces u32
///              | the deltas' bytes since the image u32 | digest [D]
///              | its pieces, as above
///     slot pages: as directory pages, with the slots the page lists as
///            sealed with live data in place of the 0
///            (`encode_slot_delta_image` for a delta)
/// ```
///
/// Its length and digest are in the superblock, which points to it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Checkpoint {
    pub sequence: u64,
    pub next_version: u64,
    /// Stripes sealed since the slot pages were taken (a root alone names
    /// older ones), newer than what the pages list for their slots.
    pub resealed: Vec<(u64, u64)>,
    pub window: Vec<u64>,
    pub images: MapImages,
    /// By volume id, as of `sequence`: mapped data blocks, stored bytes
    /// times LIVE_SCALE.
    pub volumes: Vec<(u64, u128)>,
}

impl Checkpoint {
    pub fn encoded_bytes(&self, algorithm: Algorithm) -> usize {
        checkpoint_bytes(
            algorithm,
            RootShape {
                stripes: self.resealed.len(),
                window: self.window.len(),
                map_stripes: self.images.stripes.len(),
                named: self.images.dirs.len() + self.images.slot_pages.len(),
                deltas: self.images.delta_count(),
                pieces: self.images.piece_count(),
                volumes: self.volumes.len(),
            },
        )
    }

    pub fn encode(&self, algorithm: Algorithm) -> Vec<u8> {
        let bytes = self.encoded_bytes(algorithm);
        let mut out = Vec::with_capacity(bytes);
        out.extend_from_slice(&CHECKPOINT_MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        let images = &self.images;
        for n in [
            self.sequence,
            self.next_version,
            self.resealed.len() as u64,
            self.window.len() as u64,
            images.stripes.len() as u64,
            images.dirs.len() as u64,
            images.slot_pages.len() as u64,
            self.volumes.len() as u64,
            images.pages,
            images.page_bytes,
        ] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        out.extend_from_slice(&images.slot_live.to_le_bytes());
        for &(blocks, stored) in &self.volumes {
            out.extend_from_slice(&blocks.to_le_bytes());
            out.extend_from_slice(&stored.to_le_bytes());
        }
        for (slot, sequence) in &self.resealed {
            out.extend_from_slice(&slot.to_le_bytes());
            out.extend_from_slice(&sequence.to_le_bytes());
        }
        for slot in &self.window {
            out.extend_from_slice(&slot.to_le_bytes());
        }
        for (slot, stripe) in &images.stripes {
            out.extend_from_slice(&slot.to_le_bytes());
            out.extend_from_slice(&stripe.sequence.to_le_bytes());
            out.extend_from_slice(&stripe.live.to_le_bytes());
        }
        let number: std::collections::HashMap<u64, u32> = images
            .stripes
            .keys()
            .enumerate()
            .map(|(i, &slot)| (slot, i as u32))
            .collect();
        let pieces = |out: &mut Vec<u8>, image: &PageImage| {
            for piece in &image.pieces {
                out.extend_from_slice(&number[&piece.slot].to_le_bytes());
                out.extend_from_slice(&piece.offset.to_le_bytes());
                out.extend_from_slice(&piece.bytes.to_le_bytes());
            }
        };
        let dirs = images
            .dirs
            .iter()
            .map(|(dir, image)| (dir, image, 0, images.dir_deltas.get(dir).copied().unwrap_or(0)));
        let slot_pages = images
            .slot_pages
            .iter()
            .map(|(page, p)| (page, &p.image, p.kept, p.deltas));
        for (page, image, kept, deltas) in dirs.chain(slot_pages) {
            let follows = match image.delta {
                Some(_) => CHECKPOINT_DELTA_FOLLOWS,
                None => 0,
            };
            out.extend_from_slice(&page.to_le_bytes());
            out.extend_from_slice(&image.bytes.to_le_bytes());
            out.extend_from_slice(&(image.pieces.len() as u32 | follows).to_le_bytes());
            out.extend_from_slice(&kept.to_le_bytes());
            out.extend_from_slice(image.digest.as_bytes());
            pieces(&mut out, image);
            if let Some(delta) = &image.delta {
                out.extend_from_slice(&delta.bytes.to_le_bytes());
                out.extend_from_slice(&(delta.pieces.len() as u32).to_le_bytes());
                out.extend_from_slice(&deltas.to_le_bytes());
                out.extend_from_slice(delta.digest.as_bytes());
                pieces(&mut out, delta);
            }
        }
        debug_assert_eq!(out.len(), bytes);
        out
    }

    /// Checks every field of a checkpoint whose digest already matched
    /// against the geometry and the checkpoint's own tables.
    pub fn decode(bytes: &[u8], geometry: &Geometry) -> Result<Checkpoint, FormatError> {
        const WHAT: &str = "checkpoint";
        let field = |field, value: u64| FormatError::Field {
            what: WHAT,
            field,
            value,
        };
        if bytes.len() < CHECKPOINT_HEADER_BYTES {
            return Err(field("length", bytes.len() as u64));
        }
        if bytes[..8] != CHECKPOINT_MAGIC {
            return Err(FormatError::Magic { what: WHAT });
        }
        let version = get_u32(bytes, 8);
        if version != FORMAT_VERSION {
            return Err(FormatError::Version { what: WHAT, version });
        }
        let algorithm = geometry.checksum;
        let count = |offset: usize| usize::try_from(get_u64(bytes, offset)).unwrap_or(usize::MAX);
        let (stripes, window, map_stripes, dirs) = (count(32), count(40), count(48), count(56));
        let (slot_pages, volumes) = (count(64), count(72));
        let slots = geometry.slot_count();
        let per_slot_page = crate::limits::SLOT_TABLE_PAGE_SLOTS;
        // Every entry takes bytes: counts past the length are refused
        // before they are multiplied.
        let too_many = [stripes, window, map_stripes].iter().any(|&n| n as u64 > slots)
            || slot_pages as u64 > slots.div_ceil(per_slot_page)
            || dirs > bytes.len()
            || volumes > crate::volume::VOLUME_COUNT_MAX;
        if too_many
            || checkpoint_bytes(
                algorithm,
                RootShape {
                    stripes,
                    window,
                    map_stripes,
                    named: dirs + slot_pages,
                    volumes,
                    ..RootShape::default()
                },
            ) > bytes.len()
        {
            return Err(field("length", bytes.len() as u64));
        }
        let at = std::cell::Cell::new(CHECKPOINT_HEADER_BYTES);
        let next = |n: usize| -> Result<&[u8], FormatError> {
            let from = at.get();
            let piece = bytes.get(from..from + n).ok_or(field("length", bytes.len() as u64))?;
            at.set(from + n);
            Ok(piece)
        };
        let mut checkpoint = Checkpoint {
            sequence: get_u64(bytes, 16),
            next_version: get_u64(bytes, 24),
            resealed: Vec::with_capacity(stripes),
            window: Vec::with_capacity(window),
            images: MapImages {
                pages: get_u64(bytes, 80),
                page_bytes: get_u64(bytes, 88),
                slot_live: u128::from(get_u64(bytes, 96)) | (u128::from(get_u64(bytes, 104)) << 64),
                ..MapImages::default()
            },
            volumes: Vec::with_capacity(volumes),
        };
        for _ in 0..volumes {
            let e = next(COUNTS_VOLUME_BYTES)?;
            let stored = u128::from(get_u64(e, 8)) | (u128::from(get_u64(e, 16)) << 64);
            checkpoint.volumes.push((get_u64(e, 0), stored));
        }
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..stripes {
            let e = next(16)?;
            let slot = get_u64(e, 0);
            let sequence = get_u64(e, 8);
            if slot >= slots || !seen.insert(slot) || sequence == 0 {
                return Err(field("stripe_slot", slot));
            }
            checkpoint.resealed.push((slot, sequence));
        }
        let mut in_window = std::collections::BTreeSet::new();
        for _ in 0..window {
            let slot = get_u64(next(8)?, 0);
            if slot >= slots || !in_window.insert(slot) {
                return Err(field("window_slot", slot));
            }
            checkpoint.window.push(slot);
        }
        let per_stripe = meta_stripe_bytes(geometry) as u64;
        let mut numbered = Vec::with_capacity(map_stripes);
        for _ in 0..map_stripes {
            let e = next(CHECKPOINT_MAP_STRIPE_BYTES)?;
            let (slot, live) = (get_u64(e, 0), get_u64(e, 16));
            if slot >= slots || !seen.insert(slot) || numbered.last().is_some_and(|&last| last >= slot) {
                return Err(field("map_stripe_slot", slot));
            }
            if live > per_stripe {
                return Err(field("map_stripe_live", live));
            }
            numbered.push(slot);
            let sequence = get_u64(e, 8);
            checkpoint.images.stripes.insert(slot, MapStripe { sequence, live });
        }
        let digest_bytes = algorithm.digest_bytes();
        // A directory page's or slot page's entry: its number and where
        // its image is, within `bytes_max`, and where its delta is, if it
        // has one, within `delta_max`, with the bytes its deltas took.
        let named = |bytes_max: usize, delta_max: usize| -> Result<(u64, PageImage, u32, u32), FormatError> {
            let e = next(CHECKPOINT_PAGE_BYTES + digest_bytes)?;
            let (number, image_bytes, piece_count) = (get_u64(e, 0), get_u32(e, 8), get_u32(e, 12));
            let kept = get_u32(e, 16);
            let digest = Digest::from_bytes(&e[CHECKPOINT_PAGE_BYTES..]);
            let follows = piece_count & CHECKPOINT_DELTA_FOLLOWS != 0;
            let piece_count = piece_count & !CHECKPOINT_DELTA_FOLLOWS;
            let place = |bytes: u32, count: u32, digest: Digest, max: usize| {
                image_location(
                    bytes,
                    count as usize,
                    digest,
                    max,
                    |_| {
                        let p = next(CHECKPOINT_PIECE_BYTES)?;
                        let number = get_u32(p, 0);
                        let slot = *numbered
                            .get(number as usize)
                            .ok_or(field("map_stripe", u64::from(number)))?;
                        Ok((slot, get_u32(p, 4), get_u32(p, 8)))
                    },
                    per_stripe,
                    WHAT,
                )
            };
            let mut image = place(image_bytes, piece_count, digest, bytes_max)?;
            let mut deltas = 0;
            if follows {
                let d = next(CHECKPOINT_DELTA_BYTES + digest_bytes)?;
                let (delta_bytes, delta_pieces) = (get_u32(d, 0), get_u32(d, 4));
                deltas = get_u32(d, 8);
                let digest = Digest::from_bytes(&d[CHECKPOINT_DELTA_BYTES..]);
                let delta = place(delta_bytes, delta_pieces, digest, delta_max)?;
                // The deltas since the image took no more than the page
                // would whole, this one's bytes at least.
                if deltas < delta_bytes || deltas as usize > bytes_max {
                    return Err(field("deltas", u64::from(deltas)));
                }
                image.delta = Some(std::sync::Arc::new(delta));
            }
            Ok((number, image, kept, deltas))
        };
        let dir_bytes_max = directory_image_bytes_max(geometry);
        let per_dir_keys = crate::limits::MAP_DIRECTORY_PAGES * crate::limits::MAP_PAGE_BLOCKS;
        let dir_delta_max = directory_delta_bytes_max(geometry);
        for _ in 0..dirs {
            let (dir, image, zero, deltas) = named(dir_bytes_max, dir_delta_max)?;
            if zero != 0 {
                return Err(field("directory_page_reserved", u64::from(zero)));
            }
            let first_key = dir.saturating_mul(per_dir_keys);
            let in_order = checkpoint
                .images
                .dirs
                .last_key_value()
                .is_none_or(|(&last, _)| last < dir);
            if !in_order || !within_one_volume(first_key, per_dir_keys as u32) {
                return Err(field("directory_page", dir));
            }
            if deltas > 0 {
                checkpoint.images.dir_deltas.insert(dir, deltas);
            }
            checkpoint.images.dirs.insert(dir, std::sync::Arc::new(image));
        }
        let slot_page_bytes_max = slot_page_image_bytes_max(per_slot_page as usize);
        for _ in 0..slot_pages {
            let (page, image, kept, deltas) =
                named(slot_page_bytes_max, slot_delta_image_bytes_max(per_slot_page as usize))?;
            let in_order = checkpoint
                .images
                .slot_pages
                .last_key_value()
                .is_none_or(|(&last, _)| last < page);
            if !in_order || page >= slots.div_ceil(per_slot_page) {
                return Err(field("slot_page", page));
            }
            if u64::from(kept) > per_slot_page.min(slots - page * per_slot_page) {
                return Err(field("slot_page_kept", u64::from(kept)));
            }
            let image = std::sync::Arc::new(image);
            checkpoint
                .images
                .slot_pages
                .insert(page, SlotPageImage { image, kept, deltas });
        }
        if at.get() != bytes.len() {
            return Err(field("length", bytes.len() as u64));
        }
        Ok(checkpoint)
    }
}

/// An intent log block: what FLUSH made durable without sealing a stripe.
///
/// A FLUSH that finds an open stripe partly filled writes the records
/// it took since the last FLUSH, with their stored bytes, as one block to
/// M+1 members' log areas (so the block survives any M failures, as the
/// stripes do), instead of sealing the stripe short. The records stay in
/// the open stripe, which is sealed when full; a block is dead once every
/// stripe its records went to is sealed and synced, and its space is
/// reused. Each member's area is a ring: blocks are appended after the
/// last one written there and wrap to the area's start.
///
/// ```text
///   0  magic "TSRLOGBK"   8 version u32        12 record count u32
///  16  array uuid [16]
///  32  sequence u64       40 tail sequence u64 (the oldest block still needed)
///  48  block bytes u32    52 reserved u32
///  56  CRC32C u32 of the whole block, this field taken as zero   60 reserved u32
///  64  records, 96 bytes each:
///       0 lba u64   8 version u64   16 blocks u32   20 stored bytes u32
///      24 kind u8 (1 data, 2 zero) | codec u8 | reserved u16 | reserved u32
///      32 digest [64] of the stored bytes (the array's algorithm; data only)
///   then the stored bytes of the data records, in order, back to back;
///   zeros up to a multiple of LOG_ALIGN
/// ```
///
/// Recovery reads every healthy member's area, keeps the blocks whose CRC
/// and digests hold (a torn block fails them and is ignored), and replays,
/// in sequence order, the blocks from the newest block's tail on; records
/// carry their write's version, so a record older than what the stripes
/// hold changes nothing.
pub const LOG_MAGIC: [u8; 8] = *b"TSRLOGBK";
/// Log blocks are written in multiples of this: the smallest direct write
/// most devices take (512-byte logical sectors), so a FLUSH after one
/// 4 KiB write writes 4.5 KiB to each log copy, not 8.
pub const LOG_ALIGN: usize = 512;
pub const LOG_HEADER_BYTES: usize = 64;
pub const LOG_RECORD_BYTES: usize = 32 + DIGEST_FIELD_BYTES;
const LOG_CRC_OFFSET: usize = 56;
/// Where a log block's header gives its length in bytes.
pub const LOG_BYTES_OFFSET: usize = 48;
const _: () = assert!(SECTOR_BYTES.is_multiple_of(LOG_ALIGN) && LOG_HEADER_BYTES + LOG_RECORD_BYTES <= LOG_ALIGN);

/// Dedicated log devices an array may have, each a full copy of the log.
pub const LOG_DEVICES_MAX: usize = 4;
pub const LOG_DEVICE_MAGIC: [u8; 8] = *b"TSRLOGDV";
/// A log device's area starts after its header sector.
pub const LOG_DEVICE_AREA_START: u64 = SECTOR_BYTES as u64;

/// The header of a dedicated log device, its first 4 KiB; its area of
/// log blocks follows.
///
/// ```text
///   0  magic "TSRLOGDV"   8  version u32
///  16  array uuid [16]   32  this log device's uuid [16]
///  48  index u32         52  log devices u32   56  area bytes u64
/// 4092 CRC32C of bytes 0..4092
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct LogDeviceHeader {
    pub array_uuid: [u8; 16],
    pub uuid: [u8; 16],
    pub index: usize,
    pub count: usize,
    pub area_bytes: u64,
}

impl LogDeviceHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut s = vec![0u8; SECTOR_BYTES];
        put(&mut s, 0, &LOG_DEVICE_MAGIC);
        put(&mut s, 8, &FORMAT_VERSION.to_le_bytes());
        put(&mut s, 16, &self.array_uuid);
        put(&mut s, 32, &self.uuid);
        put(&mut s, 48, &(self.index as u32).to_le_bytes());
        put(&mut s, 52, &(self.count as u32).to_le_bytes());
        put(&mut s, 56, &self.area_bytes.to_le_bytes());
        seal_sector(&mut s);
        s
    }

    pub fn decode(s: &[u8]) -> Result<LogDeviceHeader, FormatError> {
        const WHAT: &str = "log device header";
        check_sector(s, &LOG_DEVICE_MAGIC, WHAT)?;
        let field = |field, value: u64| FormatError::Field {
            what: WHAT,
            field,
            value,
        };
        let count = get_u32(s, 52) as usize;
        if count == 0 || count > LOG_DEVICES_MAX {
            return Err(field("count", count as u64));
        }
        let index = get_u32(s, 48) as usize;
        if index >= count {
            return Err(field("index", index as u64));
        }
        let area_bytes = get_u64(s, 56);
        if area_bytes == 0 || !area_bytes.is_multiple_of(SECTOR_BYTES as u64) {
            return Err(field("area_bytes", area_bytes));
        }
        Ok(LogDeviceHeader {
            array_uuid: s[16..32].try_into().expect("16 bytes"),
            uuid: s[32..48].try_into().expect("16 bytes"),
            index,
            count,
            area_bytes,
        })
    }
}

/// One record of a log block; a data record's stored bytes are beside it.
#[derive(Clone, Debug, PartialEq)]
pub struct LogRecord {
    pub lba: u64,
    pub version: u64,
    pub blocks: u32,
    /// `None`: zeros (no bytes stored). `Some(codec)`: data, compressed
    /// with `codec` or raw (`None`), with the digest of its stored bytes.
    pub data: Option<(Option<Codec>, Digest)>,
}

/// A log block's header fields.
#[derive(Clone, Debug, PartialEq)]
pub struct LogBlockHeader {
    pub array_uuid: [u8; 16],
    pub sequence: u64,
    pub tail: u64,
    /// Bytes of the whole block, a multiple of LOG_ALIGN.
    pub bytes: usize,
}

/// Bytes of a log block holding records with `stored` bytes of data in all.
pub fn log_block_bytes(records: usize, stored: usize) -> usize {
    (LOG_HEADER_BYTES + records * LOG_RECORD_BYTES + stored).next_multiple_of(LOG_ALIGN)
}

/// Encodes a log block into `out` (resized to its length): records with
/// their stored bytes (empty for zeros).
pub fn encode_log_block(
    array_uuid: [u8; 16],
    sequence: u64,
    tail: u64,
    records: &[(LogRecord, impl AsRef<[u8]>)],
    out: &mut crate::device::AlignedBuf,
) {
    let stored: usize = records.iter().map(|(_, b)| b.as_ref().len()).sum();
    let bytes = log_block_bytes(records.len(), stored);
    assert!(u32::try_from(bytes).is_ok(), "a log block fits 32-bit lengths");
    out.resize(bytes);
    let b = &mut out[..];
    b.fill(0);
    put(b, 0, &LOG_MAGIC);
    put(b, 8, &FORMAT_VERSION.to_le_bytes());
    put(b, 12, &(records.len() as u32).to_le_bytes());
    put(b, 16, &array_uuid);
    put(b, 32, &sequence.to_le_bytes());
    put(b, 40, &tail.to_le_bytes());
    put(b, LOG_BYTES_OFFSET, &(bytes as u32).to_le_bytes());
    let mut data_at = LOG_HEADER_BYTES + records.len() * LOG_RECORD_BYTES;
    for (i, (record, data)) in records.iter().enumerate() {
        let data = data.as_ref();
        let at = LOG_HEADER_BYTES + i * LOG_RECORD_BYTES;
        put(b, at, &record.lba.to_le_bytes());
        put(b, at + 8, &record.version.to_le_bytes());
        put(b, at + 16, &record.blocks.to_le_bytes());
        put(b, at + 20, &(data.len() as u32).to_le_bytes());
        match &record.data {
            None => {
                assert!(data.is_empty(), "zero records store no bytes");
                b[at + 24] = 2;
            }
            Some((codec, digest)) => {
                b[at + 24] = 1;
                b[at + 25] = codec_code(*codec).0;
                put_digest(b, at + 32, digest);
            }
        }
        put(b, data_at, data);
        data_at += data.len();
    }
    seal_log_block(b);
}

/// Puts a log block's CRC32C in its header: of the whole block, the CRC
/// field taken as zero (`decode_log_block` checks it so).
pub fn seal_log_block(block: &mut [u8]) {
    put(block, LOG_CRC_OFFSET, &[0; 4]);
    let crc = tessera_checksum::crc32c(block);
    put(block, LOG_CRC_OFFSET, &crc.to_le_bytes());
}

/// A decoded log record and where its stored bytes are in the block.
pub type LogRecordAt = (LogRecord, std::ops::Range<usize>);

/// Decodes the log block at the start of `bytes` (which may run on past
/// it): its header, and each record with the range of `bytes` holding its
/// stored bytes. Checks the CRC, that every field lies inside `geometry`,
/// and every data record's digest.
pub fn decode_log_block(bytes: &[u8], geometry: &Geometry) -> Result<(LogBlockHeader, Vec<LogRecordAt>), FormatError> {
    const WHAT: &str = "log block";
    let field = |field, value: u64| FormatError::Field {
        what: WHAT,
        field,
        value,
    };
    if bytes.len() < LOG_ALIGN || bytes[..8] != LOG_MAGIC {
        return Err(FormatError::Magic { what: WHAT });
    }
    let len = get_u32(bytes, LOG_BYTES_OFFSET) as usize;
    if len < LOG_ALIGN || !len.is_multiple_of(LOG_ALIGN) || len > bytes.len() {
        return Err(field("bytes", len as u64));
    }
    let block = &bytes[..len];
    let crc = tessera_checksum::crc32c_parts(&[&block[..LOG_CRC_OFFSET], &[0; 4], &block[LOG_CRC_OFFSET + 4..]]);
    if crc != get_u32(block, LOG_CRC_OFFSET) {
        return Err(FormatError::Crc { what: WHAT });
    }
    let version = get_u32(block, 8);
    if version != FORMAT_VERSION {
        return Err(FormatError::Version { what: WHAT, version });
    }
    let count = get_u32(block, 12) as usize;
    if count > (len - LOG_HEADER_BYTES) / LOG_RECORD_BYTES {
        return Err(field("count", count as u64));
    }
    let algorithm = geometry.checksum;
    let mut records = Vec::with_capacity(count);
    let mut data_at = LOG_HEADER_BYTES + count * LOG_RECORD_BYTES;
    for i in 0..count {
        let e = &block[LOG_HEADER_BYTES + i * LOG_RECORD_BYTES..][..LOG_RECORD_BYTES];
        let (lba, version, blocks, stored) = (get_u64(e, 0), get_u64(e, 8), get_u32(e, 16), get_u32(e, 20) as usize);
        if !within_one_volume(lba, blocks) {
            return Err(field("lba", lba));
        }
        if data_at + stored > len {
            return Err(field("stored_bytes", stored as u64));
        }
        let range = data_at..data_at + stored;
        data_at += stored;
        let data = match e[24] {
            2 if stored == 0 => None,
            1 => {
                let codec = codec_from_code(e[25], 0).ok_or(field("codec", u64::from(e[25])))?;
                if blocks as usize > EXTENT_BLOCKS_MAX {
                    return Err(field("blocks", u64::from(blocks)));
                }
                let wrong_size = match codec {
                    None => stored != blocks as usize * BLOCK_BYTES,
                    Some(_) => stored == 0 || stored > blocks as usize * BLOCK_BYTES,
                };
                if wrong_size {
                    return Err(field("stored_bytes", stored as u64));
                }
                let digest = Digest::from_bytes(&e[32..32 + algorithm.digest_bytes()]);
                if algorithm.digest(&block[range.clone()]) != digest {
                    return Err(FormatError::Crc { what: "log record" });
                }
                Some((codec, digest))
            }
            kind => return Err(field("kind", u64::from(kind))),
        };
        records.push((
            LogRecord {
                lba,
                version,
                blocks,
                data,
            },
            range,
        ));
    }
    let mut array_uuid = [0u8; 16];
    array_uuid.copy_from_slice(&block[16..32]);
    Ok((
        LogBlockHeader {
            array_uuid,
            sequence: get_u64(block, 32),
            tail: get_u64(block, 40),
            bytes: len,
        },
        records,
    ))
}

/// Live bytes a stripe could hold at most: its data area less the
/// summary's header (what garbage collection measures victims by, and a
/// checkpoint map stripes).
pub fn stripe_live_max(g: &Geometry) -> u64 {
    (g.data_area_bytes() - SUMMARY_HEADER_BYTES) as u64
}

/// Bytes as lowercase hexadecimal (UUIDs in messages).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry() -> Geometry {
        Geometry {
            data: 4,
            parity: 2,
            members: 7,
            chunk_bytes: 65536,
            rows: 100,
            member_bytes: 64 << 20,
            logical_bytes: 16 << 20,
            checksum: Algorithm::Blake3,
            compression: Some(Codec::Zstd { level: 3 }),
            log_bytes: 1 << 20,
            log_devices: 0,
            log_device_bytes: 0,
        }
    }

    /// Log devices in the superblock: their count, area and failed bits
    /// round-trip at their offsets; impossible combinations are refused.
    #[test]
    fn superblock_log_device_fields_round_trip_and_are_checked() {
        let mut g = geometry();
        (g.log_bytes, g.log_devices, g.log_device_bytes) = (0, 2, 4 << 20);
        let sb = Superblock {
            array_uuid: [0xA1; 16],
            member_uuid: [0xB2; 16],
            member_index: 3,
            geometry: g,
            generation: 9,
            failed: [0; 32],
            log_failed: 0b10,
            created_unix_seconds: 1_700_000_000,
            checkpoint: None,
            volume_table_crc: 0,
            volume_table: None,
        };
        let bytes = sb.encode();
        assert_eq!(Superblock::decode(&bytes).unwrap(), sb);
        assert_eq!((bytes[70], bytes[71]), (2, 0b10));
        assert_eq!(&bytes[76..80], &1024u32.to_le_bytes());
        let refused = |offset: usize, value: &[u8]| {
            let mut bad = bytes.clone();
            bad[offset..offset + value.len()].copy_from_slice(value);
            seal_sector(&mut bad);
            assert!(
                matches!(Superblock::decode(&bad), Err(FormatError::Field { .. })),
                "{offset} = {value:?}"
            );
        };
        refused(70, &[LOG_DEVICES_MAX as u8 + 1]);
        refused(71, &[0b100]);
        refused(76, &0u32.to_le_bytes());
        refused(12, &1u32.to_le_bytes());
    }

    #[test]
    fn log_device_header_round_trips_and_refuses_damage() {
        let header = LogDeviceHeader {
            array_uuid: [7; 16],
            uuid: [8; 16],
            index: 1,
            count: 2,
            area_bytes: 64 << 20,
        };
        let bytes = header.encode();
        assert_eq!(&bytes[..8], b"TSRLOGDV");
        assert_eq!(LogDeviceHeader::decode(&bytes).unwrap(), header);
        for bit in (0..CRC_OFFSET * 8).step_by(97) {
            let mut bad = bytes.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(LogDeviceHeader::decode(&bad).is_err(), "bit {bit}");
        }
        for (offset, value) in [(48, 2u32), (52, 0), (52, LOG_DEVICES_MAX as u32 + 1)] {
            let mut bad = bytes.clone();
            bad[offset..offset + 4].copy_from_slice(&value.to_le_bytes());
            seal_sector(&mut bad);
            assert!(LogDeviceHeader::decode(&bad).is_err(), "{offset} = {value}");
        }
    }

    #[test]
    fn superblock_round_trips_and_has_golden_bytes() {
        let mut sb = Superblock {
            array_uuid: [0xA1; 16],
            member_uuid: [0xB2; 16],
            ..member_superblock(None)
        };
        sb.set_failed(5);
        assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
        sb.checkpoint = Some(CheckpointRef {
            sequence: 77,
            bytes: 70_000,
            first_stripe_sequence: 78,
            digest: Algorithm::Blake3.digest(b"checkpoint"),
            slots: vec![3, 1],
            directory: false,
        });
        let bytes = sb.encode();
        assert_eq!(Superblock::decode(&bytes).unwrap(), sb);
        assert_eq!(&bytes[152..160], &77u64.to_le_bytes());
        assert_eq!(&bytes[176..180], &2u32.to_le_bytes());
        assert_eq!(&bytes[248..264], &[3, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
        // A checkpoint slot off the array, or more bytes than its stripes hold, is refused.
        for (offset, value) in [(248, 1000u64), (160, 2 * 4 * 65536 + 1)] {
            let mut bad = sb.clone().encode();
            bad[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
            seal_sector(&mut bad);
            assert!(
                matches!(Superblock::decode(&bad), Err(FormatError::Field { .. })),
                "{offset}"
            );
        }
        assert!(sb.is_failed(5) && !sb.is_failed(3));
        // Golden: magic, version, index, members, K, M, chunk, codes, rows, failed bit 5.
        assert_eq!(&bytes[0..12], b"TSRSUPER\x10\x00\x00\x00");
        assert_eq!(
            &bytes[48..68],
            &[3, 0, 0, 0, 7, 0, 0, 0, 4, 0, 0, 0, 2, 0, 0, 0, 0, 0, 1, 0]
        );
        assert_eq!(&bytes[68..76], &[3, 2, 0, 0, 3, 0, 0, 0]);
        assert_eq!(&bytes[80..88], &100u64.to_le_bytes());
        assert_eq!(bytes[112], 0b0010_0000);
        // Any flipped bit is caught.
        for bit in [0usize, 100, 8 * 4000, 8 * 4095 + 7] {
            let mut bad = bytes.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(Superblock::decode(&bad).is_err(), "bit {bit}");
        }
    }

    #[test]
    fn log_block_round_trips_and_catches_any_flipped_bit() {
        let g = geometry();
        let a = g.checksum;
        let raw = vec![0x5a; BLOCK_BYTES];
        let packed = vec![7u8; 900];
        let records = [
            (
                LogRecord {
                    lba: 12,
                    version: 40,
                    blocks: 1,
                    data: Some((None, a.digest(&raw))),
                },
                &raw[..],
            ),
            (
                LogRecord {
                    lba: 100,
                    version: 41,
                    blocks: 3,
                    data: None,
                },
                &[][..],
            ),
            (
                LogRecord {
                    lba: 200,
                    version: 42,
                    blocks: 2,
                    data: Some((Some(Codec::Lz4), a.digest(&packed))),
                },
                &packed[..],
            ),
        ];
        let mut block = crate::device::AlignedBuf::default();
        encode_log_block([9; 16], 5, 3, &records, &mut block);
        // 64 + 3 x 96 + 4096 + 900 bytes, in 512-byte sectors.
        assert_eq!(block.len(), 5632);
        assert_eq!(&block[..12], b"TSRLOGBK\x10\x00\x00\x00");
        let mut longer = block.to_vec();
        longer.extend_from_slice(&[0xff; 1024]);
        let (header, decoded) = decode_log_block(&longer, &g).unwrap();
        assert_eq!(
            header,
            LogBlockHeader {
                array_uuid: [9; 16],
                sequence: 5,
                tail: 3,
                bytes: 5632
            }
        );
        for ((record, bytes), (got, range)) in records.iter().zip(&decoded) {
            assert_eq!(record, got);
            assert_eq!(*bytes, &block[range.clone()]);
        }
        for bit in [0usize, 8 * 60, 8 * 200, 8 * 5000, 8 * 5631 + 7] {
            let mut bad = block.to_vec();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(decode_log_block(&bad, &g).is_err(), "bit {bit}");
        }
        // Torn: any prefix of whole sectors short of the block.
        for sectors in 1..block.len() / LOG_ALIGN {
            let mut torn = block[..sectors * LOG_ALIGN].to_vec();
            torn.resize(block.len(), 0);
            assert!(decode_log_block(&torn, &g).is_err(), "{sectors} sectors");
        }
    }

    #[test]
    fn placement_rotates_over_distinct_members() {
        let g = geometry();
        assert_eq!(g.slot_count(), 100 * 7 / 6);
        for slot in 0..g.slot_count() {
            let mut members: Vec<usize> = (0..g.width()).map(|j| g.place(slot, j).0).collect();
            members.sort();
            members.dedup();
            assert_eq!(members.len(), g.width(), "slot {slot}");
        }
        assert_eq!(g.place(0, 0), (0, 0));
        assert_eq!(g.place(1, 0), (6, 0));
        assert_eq!(g.place(1, 1), (0, 1));
        // The last slot's chunks stay on rows that exist.
        assert!(g.place(g.slot_count() - 1, g.width() - 1).1 < g.rows);
    }

    /// A summary's records for a stripe in slot 11 (Blake3 digests): a
    /// compressed extent, a raw one with its block CRCs, a zero range.
    fn records() -> Vec<Record> {
        vec![
            Record::Data {
                lba: 10,
                version: 7,
                extent: Extent {
                    slot: 11,
                    offset: 0,
                    stored_bytes: 777,
                    blocks: 16,
                    codec: Some(Codec::Lz4),
                    digest: Algorithm::Blake3.digest(b"x"),
                    block_crcs: BlockCrcs::new(),
                },
            },
            Record::Data {
                lba: 40,
                version: 9,
                extent: Extent {
                    slot: 11,
                    offset: 4096,
                    stored_bytes: 2 * 4096,
                    blocks: 2,
                    codec: None,
                    digest: Algorithm::Blake3.digest(b"y"),
                    block_crcs: [0xdead_beef, 0x0123_4567].into_iter().collect(),
                },
            },
            Record::Zero {
                lba: 0,
                blocks: 3,
                version: 8,
            },
        ]
    }

    #[test]
    fn chunk_header_and_summary_round_trip() {
        let a = Algorithm::Blake3;
        let h = ChunkHeader {
            index: 5,
            stream: Stream::Gc,
            array_uuid: [7; 16],
            sequence: 42,
            slot: 11,
            synced_through: 40,
            summary_bytes: 100,
            data_bytes: 5000,
            leaf: a.digest(b"leaf"),
            root: a.digest(b"root"),
            summary_digest: a.digest(b"summary"),
            opening: 0x5eed_1234_abcd_0001,
        };
        assert_eq!(ChunkHeader::decode(&h.encode(), a).unwrap(), h);
        let records = records();
        let bytes = encode_summary(a, &records);
        assert_eq!(bytes.len(), 8 + (32 + 32) + (32 + 32 + 8) + 24);
        assert_eq!(bytes.len(), summary_bytes(a, &records));
        assert_eq!(decode_summary(&bytes, &geometry(), 11).unwrap(), records);
        // Golden: count, then the raw entry's kind, blocks, lba, version and CRCs.
        assert_eq!(&bytes[0..4], &3u32.to_le_bytes());
        let raw = 8 + 64;
        assert_eq!(&bytes[raw..raw + 8], &[1, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(
            &bytes[raw + 8..raw + 24],
            &[40, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            &bytes[raw + 64..raw + 72],
            &[0xef, 0xbe, 0xad, 0xde, 0x67, 0x45, 0x23, 0x01]
        );
        // A record past the end of the volume is refused, and so is a raw
        // extent whose stored bytes are not its blocks.
        let far = encode_summary(
            a,
            &[Record::Zero {
                lba: (1 << crate::volume::VOLUME_BLOCKS_SHIFT) - 1,
                blocks: 2,
                version: 1,
            }],
        );
        assert!(
            decode_summary(&far, &geometry(), 11).is_err(),
            "a record across two volumes"
        );
        let mut odd = records.clone();
        if let Record::Data { extent, .. } = &mut odd[1] {
            extent.stored_bytes = 100;
        }
        assert!(decode_summary(&encode_summary(a, &odd), &geometry(), 11).is_err());
        // An extent longer than any write makes (the map holds at most 16).
        let mut long = records.clone();
        if let Record::Data { extent, .. } = &mut long[0] {
            extent.blocks = EXTENT_BLOCKS_MAX as u32 + 1;
        }
        assert!(decode_summary(&encode_summary(a, &long), &geometry(), 11).is_err());
        assert!(decode_summary(&bytes[..bytes.len() - 1], &geometry(), 11).is_err());
    }

    fn slot_entry(slot: u64, sequence: u64, live: u64, pieces: u32) -> SlotEntry {
        SlotEntry {
            slot,
            sequence,
            live,
            pieces,
        }
    }

    fn checkpoint() -> Checkpoint {
        let a = Algorithm::Blake3;
        let piece = |slot, offset, bytes| ImagePiece { slot, offset, bytes };
        let mut images = MapImages::default();
        images.stripes.insert(
            20,
            MapStripe {
                sequence: 101,
                live: 5100,
            },
        );
        images.stripes.insert(
            30,
            MapStripe {
                sequence: 102,
                live: 200,
            },
        );
        images.pages = 1100;
        images.page_bytes = 6 << 20;
        images.dirs.insert(
            3,
            std::sync::Arc::new(PageImage {
                bytes: 5000,
                digest: a.digest(b"page 3"),
                pieces: vec![piece(20, 0, 5000)],
                delta: None,
            }),
        );
        images.dirs.insert(
            9,
            std::sync::Arc::new(PageImage {
                bytes: 300,
                digest: a.digest(b"page 9"),
                pieces: vec![piece(20, 262_000, 100), piece(30, 0, 200)],
                delta: None,
            }),
        );
        images.slot_pages.insert(
            0,
            SlotPageImage {
                image: std::sync::Arc::new(PageImage {
                    bytes: slot_page_image_bytes_max(2) as u32,
                    digest: a.digest(b"slot page 0"),
                    pieces: vec![piece(30, 200, slot_page_image_bytes_max(2) as u32)],
                    delta: Some(std::sync::Arc::new(PageImage::whole(
                        400,
                        a.digest(b"slot page 0's delta"),
                        vec![piece(20, 5000, 400)],
                    ))),
                }),
                kept: 1,
                deltas: 700,
            },
        );
        images.slot_live = (1 << 80) + 5;
        Checkpoint {
            sequence: 99,
            next_version: 1234,
            resealed: vec![(4, 90), (7, 98)],
            window: vec![1, 2, 3],
            images,
            volumes: vec![(13, 1 << 70)],
        }
    }

    /// Some bytes changed to random values, at most `changes` of them.
    fn mangle(bytes: &[u8], changes: usize, rng: &mut impl rand::Rng) -> Vec<u8> {
        let mut out = bytes.to_vec();
        for _ in 0..rng.gen_range(1..=changes) {
            let at = rng.gen_range(0..out.len());
            out[at] = rng.gen();
        }
        out
    }

    /// Decodes `bytes` with `decode`, failing the test (with its seed) if
    /// the decoder panics rather than returning.
    fn decoded<T>(what: &str, seed: u64, bytes: &[u8], decode: impl Fn(&[u8]) -> T) -> T {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decode(bytes)))
            .unwrap_or_else(|_| panic!("{what} decoder panicked: seed {seed}, bytes {bytes:02x?}"))
    }

    /// Every decoder meets mangled input: changed fields (re-sealed, so the
    /// field checks are reached rather than only the CRC), random sectors
    /// behind a valid magic, cut lengths. Each returns a typed error or a
    /// value whose fields lie inside the geometry; none panics. Seeded, so
    /// a failure names the input that caused it.
    #[test]
    fn decoders_refuse_mangled_input_without_panicking() {
        use rand::{Rng, SeedableRng};
        let (g, a) = (geometry(), Algorithm::Blake3);
        let superblock = member_superblock(Some(CheckpointRef {
            sequence: 77,
            bytes: 70_000,
            first_stripe_sequence: 78,
            digest: a.digest(b"checkpoint"),
            slots: vec![3, 1],
            directory: false,
        }))
        .encode();
        let summary = encode_summary(a, &records());
        let checkpoint = checkpoint().encode(a);
        let slot_delta = encode_slot_delta_image(
            0,
            &[3, 4, 9],
            &[SlotEntry {
                slot: 4,
                sequence: 93,
                live: 1 << 30,
                pieces: 7,
            }],
        );
        let slot_page = encode_slot_page_image(
            0,
            &[
                SlotEntry {
                    slot: 4,
                    sequence: 90,
                    live: 77,
                    pieces: 2,
                },
                SlotEntry {
                    slot: 9,
                    sequence: 91,
                    live: 0,
                    pieces: 0,
                },
            ],
        );
        for seed in 0..2000u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut sector = if seed % 4 == 0 {
                let mut random = vec![0u8; SECTOR_BYTES];
                rng.fill(&mut random[..]);
                random[..8].copy_from_slice(&SUPERBLOCK_MAGIC);
                random[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
                random
            } else {
                mangle(&superblock, 6, &mut rng)
            };
            seal_sector(&mut sector);
            if let Ok(sb) = decoded("superblock", seed, &sector, Superblock::decode) {
                let sg = &sb.geometry;
                assert!(sb.member_index < sg.members && sg.data >= 1 && sg.data + sg.parity <= sg.members);
                assert!(
                    sg.rows <= Geometry::rows_for(sg.member_bytes, sg.chunk_bytes, sg.log_bytes),
                    "seed {seed}"
                );
            }
            let mut sector = mangle(&superblock, 6, &mut rng);
            sector[..8].copy_from_slice(&CHUNK_MAGIC);
            seal_sector(&mut sector);
            let _ = decoded("chunk header", seed, &sector, |s| ChunkHeader::decode(s, a));
            let mut bytes = mangle(&summary, 4, &mut rng);
            if seed % 4 == 1 {
                bytes.truncate(rng.gen_range(0..bytes.len()));
            }
            if let Ok(records) = decoded("summary", seed, &bytes, |b| decode_summary(b, &g, 11)) {
                for record in records {
                    let (lba, blocks) = match record {
                        Record::Data { lba, extent, .. } => {
                            let end = u64::from(extent.offset) + u64::from(extent.stored_bytes);
                            assert!(end <= g.data_area_bytes() as u64, "seed {seed}");
                            let crcs = if extent.codec.is_none() {
                                extent.blocks as usize
                            } else {
                                0
                            };
                            assert_eq!(extent.block_crcs.len(), crcs, "seed {seed}");
                            (lba, extent.blocks)
                        }
                        Record::Zero { lba, blocks, .. } => (lba, blocks),
                    };
                    assert!(within_one_volume(lba, blocks), "seed {seed}");
                }
            }
            let bytes = mangle(&slot_page, 4, &mut rng);
            if let Ok((page, entries)) = decoded("slot page", seed, &bytes, |b| decode_slot_page_image(b, &g)) {
                let per_page = crate::limits::SLOT_TABLE_PAGE_SLOTS;
                assert!(
                    entries
                        .iter()
                        .all(|e| e.slot / per_page == page && e.slot < g.slot_count()),
                    "seed {seed}"
                );
            }
            let bytes = mangle(&slot_delta, 4, &mut rng);
            if let Ok(delta) = decoded("slot delta", seed, &bytes, |b| decode_slot_delta_image(b, &g)) {
                let per_page = crate::limits::SLOT_TABLE_PAGE_SLOTS;
                let in_page = |slot: u64| slot / per_page == delta.page && slot < g.slot_count();
                assert!(
                    !delta.changed.is_empty() && delta.changed.iter().all(|&s| in_page(s)),
                    "seed {seed}"
                );
                assert!(
                    delta
                        .entries
                        .iter()
                        .all(|e| delta.changed.binary_search(&e.slot).is_ok()),
                    "seed {seed}"
                );
            }
            let bytes = mangle(&checkpoint, 4, &mut rng);
            if let Ok(c) = decoded("checkpoint", seed, &bytes, |b| Checkpoint::decode(b, &g)) {
                let pieces = c
                    .images
                    .dirs
                    .values()
                    .chain(c.images.slot_pages.values().map(|p| &p.image))
                    .flat_map(|p| &p.pieces);
                assert!(
                    pieces.clone().all(|p| c.images.stripes.contains_key(&p.slot)),
                    "seed {seed}"
                );
                let per_stripe = meta_stripe_bytes(&g) as u64;
                assert!(pieces
                    .clone()
                    .all(|p| u64::from(p.offset) + u64::from(p.bytes) <= per_stripe));
            }
        }
    }

    /// Member 3's superblock of `geometry()`'s array, naming `checkpoint`.
    fn member_superblock(checkpoint: Option<CheckpointRef>) -> Superblock {
        Superblock {
            array_uuid: [1; 16],
            member_uuid: [2; 16],
            member_index: 3,
            geometry: geometry(),
            generation: 9,
            failed: [0; 32],
            log_failed: 0,
            created_unix_seconds: 1_700_000_000,
            checkpoint,
            volume_table_crc: 0,
            volume_table: None,
        }
    }

    /// A checkpoint of more stripes than the superblock lists: the
    /// superblock names its directory (the flag at 4088), and the
    /// directory lists the stripes, checked by its digest.
    #[test]
    fn checkpoint_directories_round_trip_and_refuse_what_does_not_add_up() {
        let g = geometry();
        let sb = member_superblock(Some(CheckpointRef {
            sequence: 77,
            bytes: 900 * 65536,
            first_stripe_sequence: 78,
            digest: g.checksum.digest(b"checkpoint"),
            slots: vec![5],
            directory: true,
        }));
        let bytes = sb.encode();
        assert_eq!(&bytes[0..12], b"TSRSUPER\x10\x00\x00\x00");
        assert_eq!(&bytes[4088..4092], &1u32.to_le_bytes());
        assert_eq!(Superblock::decode(&bytes).unwrap(), sb);
        let c = sb.checkpoint.as_ref().unwrap();
        assert_eq!(c.body_stripes(65536), 900);
        assert_eq!(c.stripe_count(65536), 901);
        // A flag other than 0 or 1 is refused.
        let mut bad = bytes.clone();
        bad[4088] = 2;
        seal_sector(&mut bad);
        assert!(matches!(Superblock::decode(&bad), Err(FormatError::Field { .. })));
        // Superblocks of earlier versions are refused by their version.
        for old in 2u32..=15 {
            let mut bad = bytes.clone();
            bad[8..12].copy_from_slice(&old.to_le_bytes());
            seal_sector(&mut bad);
            let error = Superblock::decode(&bad).unwrap_err();
            assert_eq!(
                error,
                FormatError::Version {
                    what: "superblock",
                    version: old
                }
            );
            assert!(error
                .to_string()
                .contains(&format!("version {old}; this build reads version 16")));
        }

        let slots: Vec<u64> = (0..900).map(|i| (i * 7) % g.slot_count()).collect();
        let directory = encode_checkpoint_directory(g.checksum, &slots);
        assert_eq!(directory.len(), checkpoint_directory_bytes(g.checksum, 900));
        assert_eq!(&directory[..16], b"TSRCKDIR\x84\x03\x00\x00\x00\x00\x00\x00");
        assert_eq!(decode_checkpoint_directory(&directory, &g, 900).unwrap(), slots);
        // Another count, a flipped byte, a slot off the array: refused.
        assert!(decode_checkpoint_directory(&directory, &g, 899).is_err());
        let mut flipped = directory.clone();
        flipped[100] ^= 1;
        assert_eq!(
            decode_checkpoint_directory(&flipped, &g, 900),
            Err(FormatError::Crc {
                what: "checkpoint directory"
            })
        );
        let off = encode_checkpoint_directory(g.checksum, &[g.slot_count()]);
        assert!(matches!(
            decode_checkpoint_directory(&off, &g, 1),
            Err(FormatError::Field { field: "slot", .. })
        ));
    }

    /// A stored page image gives back its image, compressed or raw; a
    /// wrong length, codec or compressed byte is refused, never a panic.
    /// A directory page whose entries have deltas over their images
    /// round-trips; a delta over a delta, a delta past the largest a
    /// page's makes, or one in a slot past the array's is refused.
    #[test]
    fn directory_pages_with_deltas_round_trip_and_refuse_bad_ones() {
        let g = geometry();
        let a = g.checksum;
        let piece = |slot: u64, offset: u32, bytes: u32| ImagePiece { slot, offset, bytes };
        let mut pages = std::collections::BTreeMap::new();
        for (k, delta) in [(3u64, false), (4, true), (9, true)] {
            let delta = delta.then(|| {
                std::sync::Arc::new(PageImage::whole(
                    500,
                    a.digest(&[k as u8, 1]),
                    vec![piece(20, 100, 200), piece(21, 0, 300)],
                ))
            });
            let image = PageImage {
                delta,
                ..PageImage::whole(1000, a.digest(&[k as u8]), vec![piece(30 + k, 0, 1000)])
            };
            pages.insert(512 + k, std::sync::Arc::new(image));
        }
        let stored = encode_directory_image(a, 1, &pages);
        let entries: usize = pages.values().map(|i| directory_entry_bytes(a, i)).sum();
        assert_eq!(stored.len(), directory_image_bytes_of(entries));
        assert_eq!(decode_directory_image(&stored, &g).unwrap(), (1, pages.clone()));
        // Page 516's entry starts after page 515's (no delta): 8 + 8 + D + 16.
        let at = STORED_IMAGE_HEADER_BYTES + DIRECTORY_HEADER_BYTES + 8 + 8 + a.digest_bytes() + 16;
        let delta_at = at + 8 + 8 + a.digest_bytes() + 16;
        let mangled = |at: usize, value: u32| {
            let mut bad = stored.clone();
            bad[at..at + 4].copy_from_slice(&value.to_le_bytes());
            decode_directory_image(&bad, &g)
        };
        // Its delta says another follows.
        assert!(mangled(delta_at + 4, 2 | DIRECTORY_DELTA_FOLLOWS).is_err());
        // Larger than a delta can be (its pieces then do not add up either).
        assert!(mangled(delta_at, STORED_DELTA_BYTES_MAX as u32 + 1).is_err());
        // A piece of it past the array's slots.
        let piece_at = delta_at + 8 + a.digest_bytes();
        let mut bad = stored.clone();
        bad[piece_at..piece_at + 8].copy_from_slice(&g.slot_count().to_le_bytes());
        assert!(matches!(
            decode_directory_image(&bad, &g),
            Err(FormatError::Field {
                field: "piece_slot",
                ..
            })
        ));
        // Page 516's delta flag cleared: its delta's bytes are read as the
        // next entry, which does not add up.
        assert!(mangled(at + 4, 1).is_err());
    }

    /// A directory page's delta lists the pages changed since its image
    /// (one emptied: listed, not named) and the entries of those named
    /// now; laid over the image it gives the page as it is. It refuses
    /// no page changed, an entry of a page not listed, more entries than
    /// pages listed, another page's number, an image's magic, and a byte
    /// too many or too few.
    #[test]
    fn directory_deltas_round_trip_and_refuse_what_does_not_add_up() {
        use std::collections::{BTreeMap, BTreeSet};
        use std::sync::Arc;
        let g = geometry();
        let a = g.checksum;
        let image = |k: u64, slot: u64| {
            Arc::new(PageImage::whole(
                1000,
                a.digest(&[k as u8, slot as u8]),
                vec![ImagePiece {
                    slot,
                    offset: 0,
                    bytes: 1000,
                }],
            ))
        };
        let base: BTreeMap<u64, Arc<PageImage>> = [3u64, 4, 9, 511].iter().map(|&k| (512 + k, image(k, 30))).collect();
        // Page 515 rewritten, 516 emptied, 600 written for the first time.
        let mut now = base.clone();
        now.insert(515, image(3, 31));
        now.remove(&516);
        now.insert(600, image(88, 32));
        let changed: BTreeSet<u64> = [515, 516, 600].into();
        let stored = encode_directory_delta_image(a, 1, &changed, &now);
        let listed = directory_entry_bytes(a, &now[&515]) + directory_entry_bytes(a, &now[&600]);
        assert_eq!(stored.len(), directory_delta_bytes_of(listed));
        let delta = decode_directory_delta_image(&stored, &g).unwrap();
        assert_eq!(delta.dir, 1);
        assert_eq!(delta.changed, changed);
        assert_eq!(delta.entries.keys().copied().collect::<Vec<_>>(), [515, 600]);
        assert_eq!(delta.over(base.clone()), now);
        // Not an image, nor an image a delta.
        assert!(matches!(
            decode_directory_image(&stored, &g),
            Err(FormatError::Magic { .. })
        ));
        let whole = encode_directory_image(a, 1, &now);
        assert!(matches!(
            decode_directory_delta_image(&whole, &g),
            Err(FormatError::Magic { .. })
        ));
        let bitmap = STORED_IMAGE_HEADER_BYTES + DIRECTORY_HEADER_BYTES;
        let refused = |bad: Vec<u8>| decode_directory_delta_image(&bad, &g).unwrap_err();
        // No page changed.
        let mut bad = stored.clone();
        bad[bitmap..bitmap + DIRECTORY_CHANGED_BYTES].fill(0);
        assert_eq!(
            refused(bad),
            FormatError::Field {
                what: "map directory page",
                field: "changed",
                value: 0
            }
        );
        // Page 600 (bit 88) not listed: its entry is refused, and with
        // page 516 not listed either, two entries for one page listed.
        let mut bad = stored.clone();
        bad[bitmap + 11] &= !1;
        assert!(matches!(refused(bad), FormatError::Field { field: "page", .. }));
        let mut bad = stored.clone();
        bad[bitmap..bitmap + DIRECTORY_CHANGED_BYTES].fill(0);
        bad[bitmap] = 1 << 3;
        assert!(matches!(refused(bad), FormatError::Field { field: "entries", .. }));
        // Another directory page's number: its entries are not its pages.
        let mut bad = stored.clone();
        bad[STORED_IMAGE_HEADER_BYTES + 8..STORED_IMAGE_HEADER_BYTES + 16].copy_from_slice(&2u64.to_le_bytes());
        assert!(matches!(refused(bad), FormatError::Field { field: "page", .. }));
        // A byte too many, and one too few (the stored length says so).
        for cut in [stored.len() + 1, stored.len() - 1] {
            let mut bad = stored.clone();
            bad.resize(cut, 0);
            let body = (cut - STORED_IMAGE_HEADER_BYTES) as u32;
            bad[0..4].copy_from_slice(&body.to_le_bytes());
            assert!(matches!(refused(bad), FormatError::Field { field: "length", .. }));
        }
        // Every page of it emptied: a delta of no entry.
        let all: BTreeSet<u64> = base.keys().copied().collect();
        let emptied = encode_directory_delta_image(a, 1, &all, &BTreeMap::new());
        let delta = decode_directory_delta_image(&emptied, &g).unwrap();
        assert!(delta.entries.is_empty() && delta.over(base).is_empty());
    }

    #[test]
    fn stored_page_images_round_trip_and_refuse_damage() {
        let image: Vec<u8> = (0..20_000u32).flat_map(|i| (i % 97).to_le_bytes()).collect();
        let stored = store_page_image(&image);
        assert!(stored.len() < image.len() / 4, "compressed: {}", stored.len());
        assert_eq!(stored[4], 2, "zstd");
        assert_eq!(load_page_image(&stored).unwrap(), image);
        let mut noise = vec![0u8; 3000];
        rand::Rng::fill(
            &mut <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(5),
            &mut noise[..],
        );
        let raw = store_page_image(&noise);
        assert_eq!((raw[4], raw.len()), (0, noise.len() + 8), "kept raw");
        assert_eq!(load_page_image(&raw).unwrap(), noise);
        let mut bad = stored.clone();
        bad[0..4].copy_from_slice(&(PAGE_IMAGE_BYTES_MAX as u32 + 1).to_le_bytes());
        assert!(load_page_image(&bad).is_err(), "too long to be a page");
        let mut bad = stored.clone();
        bad[4] = 9;
        assert!(load_page_image(&bad).is_err(), "unknown codec");
        let mut bad = raw.clone();
        bad.pop();
        assert!(load_page_image(&bad).is_err(), "raw of the wrong length");
        for at in [8, 20, stored.len() / 2, stored.len() - 1] {
            let mut bad = stored.clone();
            bad[at] ^= 0x41;
            if let Ok(back) = load_page_image(&bad) {
                assert_eq!(back.len(), image.len());
            }
        }
        assert!(load_page_image(&stored[..5]).is_err());
    }

    #[test]
    fn checkpoint_round_trips_and_refuses_what_does_not_add_up() {
        let (a, g) = (Algorithm::Blake3, geometry());
        let c = checkpoint();
        let bytes = c.encode(a);
        let shape = RootShape {
            stripes: 2,
            window: 3,
            map_stripes: 2,
            named: 3,
            deltas: 1,
            pieces: 5,
            volumes: 1,
        };
        assert_eq!(bytes.len(), checkpoint_bytes(a, shape));
        assert_eq!(&bytes[..12], b"TSRCHKPT\x10\x00\x00\x00");
        assert_eq!(&bytes[24..32], &1234u64.to_le_bytes());
        assert_eq!(&bytes[48..64], &[2, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&bytes[64..80], &[1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
        // What the directory names: 1,100 pages, 6 MiB of images.
        assert_eq!(&bytes[80..96], &[76, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0x60, 0, 0, 0, 0, 0]);
        // What the slot pages list live.
        assert_eq!(&bytes[96..112], &((1u128 << 80) + 5).to_le_bytes());
        // The volumes' counts first: volume 0's stored bytes.
        assert_eq!(&bytes[120..136], &(1u128 << 70).to_le_bytes());
        // Then the stripes sealed since the slot pages: slot 7's sequence.
        assert_eq!(&bytes[160..168], &98u64.to_le_bytes());
        // Map stripes after the window, each with its live bytes; the slot
        // page (last) in map stripe 1, at 200, then its delta (a piece
        // flagged), 400 bytes of 700 the deltas took, in map stripe 0 at
        // 5000.
        let map_stripes = 112 + 24 + 32 + 24;
        assert_eq!(&bytes[map_stripes..map_stripes + 8], &20u64.to_le_bytes());
        let delta = bytes.len() - 12 - 32 - 12;
        assert_eq!(&bytes[delta - 12..delta - 4], &[1, 0, 0, 0, 200, 0, 0, 0]);
        assert_eq!(&bytes[delta..delta + 12], &[0x90, 1, 0, 0, 1, 0, 0, 0, 0xbc, 2, 0, 0]);
        let slot_page = delta - 12 - 32 - 20;
        assert_eq!(&bytes[slot_page + 12..slot_page + 16], &(1u32 | 1 << 31).to_le_bytes());
        assert_eq!(
            &bytes[bytes.len() - 12..],
            &[0, 0, 0, 0, 0x88, 0x13, 0, 0, 0x90, 1, 0, 0]
        );
        assert_eq!(Checkpoint::decode(&bytes, &g).unwrap(), c);
        let refused = |c: Checkpoint| Checkpoint::decode(&c.encode(a), &g).is_err();
        let mut bad = checkpoint();
        bad.window.push(2);
        assert!(refused(bad), "a window slot twice");
        let mut bad = checkpoint();
        bad.window.push(1 << 40);
        assert!(refused(bad), "a window slot off the array");
        let mut bad = checkpoint();
        bad.images.stripes.insert(7, MapStripe { sequence: 5, live: 0 });
        assert!(refused(bad), "a map stripe that is also a live stripe");
        let mut bad = checkpoint();
        bad.resealed[0].1 = 0;
        assert!(refused(bad), "a stripe sealed with no sequence");
        let mut bad = checkpoint();
        bad.resealed.push((4, 91));
        assert!(refused(bad), "a slot sealed twice");
        let mut bad = checkpoint();
        let page = bad.images.slot_pages.remove(&0).unwrap();
        bad.images.slot_pages.insert(1, page);
        assert!(refused(bad), "a slot page past the array's slots");
        let mut bad = checkpoint();
        let page = std::sync::Arc::make_mut(&mut bad.images.slot_pages.get_mut(&0).unwrap().image);
        page.bytes = slot_page_image_bytes_max(1025) as u32;
        page.pieces[0].bytes = page.bytes;
        assert!(refused(bad), "an image longer than any slot page makes");
        let mut bad = checkpoint();
        bad.images.slot_pages.get_mut(&0).unwrap().kept = 1025;
        assert!(refused(bad), "more slots kept than a page has");
        let mut bad = checkpoint();
        bad.images.slot_pages.get_mut(&0).unwrap().deltas = 399;
        assert!(refused(bad), "deltas that took less than the one named");
        let mut bad = checkpoint();
        bad.images.slot_pages.get_mut(&0).unwrap().deltas = slot_page_image_bytes_max(1024) as u32 + 1;
        assert!(refused(bad), "deltas that took more than the page whole");
        let mut bad = checkpoint();
        let delta = std::sync::Arc::make_mut(&mut bad.images.slot_pages.get_mut(&0).unwrap().image);
        std::sync::Arc::make_mut(delta.delta.as_mut().unwrap()).bytes = slot_delta_image_bytes_max(1024) as u32 + 1;
        std::sync::Arc::make_mut(delta.delta.as_mut().unwrap()).pieces[0].bytes =
            slot_delta_image_bytes_max(1024) as u32 + 1;
        assert!(refused(bad), "a delta longer than any makes");
        // Directory page 3's entry, the first after the map stripes: its
        // pieces flagged as followed by a delta that is not there.
        let mut bad = bytes.clone();
        let pieces = map_stripes + 2 * 24 + 12;
        assert_eq!(&bad[pieces - 12..pieces - 4], &3u64.to_le_bytes());
        bad[pieces + 3] |= 0x80;
        assert!(
            Checkpoint::decode(&bad, &g).is_err(),
            "a directory page's delta missing"
        );
        // A directory page with a delta (format 16) round-trips with the
        // bytes its deltas took, which must be at least the delta's and at
        // most the most a directory page takes whole.
        let with_dir_delta = |deltas: u32| {
            let mut c = checkpoint();
            let dir = std::sync::Arc::make_mut(c.images.dirs.get_mut(&9).unwrap());
            dir.delta = Some(std::sync::Arc::new(PageImage::whole(
                100,
                a.digest(b"directory page 9's delta"),
                vec![ImagePiece {
                    slot: 30,
                    offset: 5000,
                    bytes: 100,
                }],
            )));
            c.images.dir_deltas.insert(9, deltas);
            c
        };
        let c = with_dir_delta(250);
        let bytes = c.encode(a);
        let shape = RootShape {
            deltas: 2,
            pieces: 6,
            ..shape
        };
        assert_eq!(bytes.len(), checkpoint_bytes(a, shape));
        assert_eq!(Checkpoint::decode(&bytes, &g).unwrap(), c);
        assert!(
            refused(with_dir_delta(99)),
            "directory deltas that took less than the one named"
        );
        let most = directory_image_bytes_max(&g) as u32;
        assert!(!refused(with_dir_delta(most)));
        assert!(
            refused(with_dir_delta(most + 1)),
            "directory deltas that took more than a page whole"
        );
        let mut bad = checkpoint();
        bad.volumes = vec![(0, 0); crate::volume::VOLUME_COUNT_MAX + 1];
        assert!(refused(bad), "more volumes than there may be");
        let mut bad = checkpoint();
        std::sync::Arc::make_mut(bad.images.dirs.get_mut(&9).unwrap()).bytes = 301;
        assert!(refused(bad), "pieces that do not add up to the image");
        let mut bad = checkpoint();
        std::sync::Arc::make_mut(bad.images.dirs.get_mut(&9).unwrap()).pieces[0].offset =
            meta_stripe_bytes(&g) as u32 - 99;
        assert!(refused(bad), "a piece past the end of its stripe");
        let mut bad = checkpoint();
        let page = std::sync::Arc::make_mut(bad.images.dirs.get_mut(&3).unwrap());
        page.bytes = directory_image_bytes_max(&g) as u32 + 1;
        page.pieces[0].bytes = directory_image_bytes_max(&g) as u32 + 1;
        assert!(refused(bad), "an image longer than any directory page makes");
        let mut bad = checkpoint();
        let page = bad.images.dirs.remove(&3).unwrap();
        bad.images.dirs.insert(u64::MAX / 2, page);
        assert!(refused(bad), "a directory page off the volumes");
        let mut bad = checkpoint();
        bad.images.stripes.get_mut(&30).unwrap().live = meta_stripe_bytes(&g) as u64 + 1;
        assert!(refused(bad), "a map stripe holding more than it can");
        assert!(Checkpoint::decode(&bytes[..bytes.len() - 1], &g).is_err(), "truncated");
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Checkpoint::decode(&longer, &g).is_err(), "trailing bytes");
    }

    /// A slot table page: its slots as a bitmap, its fields packed from
    /// their smallest value in as many bits as they span, each entry
    /// checked (in the page and the array, a sequence, no live bytes
    /// without pieces), and a page that says otherwise than it holds
    /// refused.
    #[test]
    fn slot_pages_round_trip_and_refuse_what_does_not_add_up() {
        let (g, entry) = (geometry(), slot_entry);
        let entries = vec![entry(4, 90, 77 << 20, 12), entry(7, 98, 0, 0), entry(100, 5, 1, 1)];
        let stored = encode_slot_page_image(0, &entries);
        assert_eq!(&stored[8..16], b"TSRSLOTP");
        // Pieces 0-12 in 4 bits, sequences 5-98 in 7, live 0-77 MiB in
        // 27: 38 bits an entry, 15 bytes for three.
        assert_eq!(stored.len(), STORED_IMAGE_HEADER_BYTES + SLOT_PAGE_HEADER_BYTES + 15);
        assert_eq!(
            &stored[8 + 24 + 9..8 + 24 + 18],
            &[5, 0, 0, 0, 0, 0, 0, 0, 7],
            "sequence's column"
        );
        // Slots 4, 7 and 100 listed.
        let listed = &stored[8 + SLOT_PAGE_LISTED_AT..8 + SLOT_PAGE_HEADER_BYTES];
        assert_eq!((listed[0], listed[12]), (0b1001_0000, 0b0001_0000));
        assert!(stored.len() <= slot_page_image_bytes_max(3));
        assert_eq!(decode_slot_page_image(&stored, &g).unwrap(), (0, entries.clone()));
        let refused = |entries: &[SlotEntry]| decode_slot_page_image(&encode_slot_page_image(0, entries), &g).is_err();
        assert!(refused(&[]), "a page listing nothing");
        assert!(refused(&[entry(4, 0, 0, 0)]), "no sequence, nothing counted");
        assert!(!refused(&[entry(4, 0, 10, 1)]), "open when taken: counted, no sequence");
        assert!(refused(&[entry(4, 9, 10, 0)]), "live bytes with no pieces");
        assert!(refused(&[entry(g.slot_count(), 9, 0, 0)]), "a slot past the array's");
        let damaged = |at: usize, value: u8| {
            let mut bad = stored.clone();
            bad[at] = value;
            decode_slot_page_image(&bad, &g).is_err()
        };
        assert!(damaged(16, 1), "a page past the array's slots");
        assert!(damaged(8 + 16, 2), "fewer entries than slots listed");
        assert!(
            damaged(8 + SLOT_PAGE_LISTED_AT, 0b1011_0000),
            "more slots listed than entries"
        );
        assert!(damaged(8 + 24 + 8, 33), "pieces wider than their type");
        assert!(damaged(8 + 24 + 26, 65), "live bytes wider than their type");
        assert!(
            damaged(stored.len() - 1, stored[stored.len() - 1] | 0x80),
            "bits past the last entry"
        );
        let mut overflow = stored.clone();
        overflow[8 + 24..8 + 32].copy_from_slice(&u64::from(u32::MAX).to_le_bytes());
        assert!(decode_slot_page_image(&overflow, &g).is_err(), "pieces past u32");
        let mut overflow = stored.clone();
        overflow[8 + 24 + 18..8 + 24 + 26].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode_slot_page_image(&overflow, &g).is_err(), "live bytes past u64");
        assert!(
            decode_slot_page_image(&stored[..stored.len() - 1], &g).is_err(),
            "truncated"
        );
        let mut longer = stored.clone();
        longer.push(0);
        let image_bytes = (longer.len() - STORED_IMAGE_HEADER_BYTES) as u32;
        longer[..4].copy_from_slice(&image_bytes.to_le_bytes());
        assert!(decode_slot_page_image(&longer, &g).is_err(), "a byte past the entries");
    }

    /// A delta over a slot page: the slots changed since the page's
    /// image, those listed now among them; the page it leaves is the
    /// image with those slots as the delta has them. One that lists a
    /// slot it does not say changed, changes none, or names a slot past
    /// the array is refused.
    #[test]
    fn slot_deltas_round_trip_and_leave_the_page_they_say() {
        let (g, entry) = (geometry(), slot_entry);
        let base = vec![entry(4, 90, 77 << 20, 12), entry(7, 98, 0, 0), entry(100, 5, 1, 1)];
        // Slot 4 emptied and freed, 7 counted anew, 50 sealed since.
        let changed = vec![4, 7, 50];
        let listed = vec![entry(7, 98, 300, 2), entry(50, 120, 4096, 1)];
        let stored = encode_slot_delta_image(0, &changed, &listed);
        assert_eq!(&stored[8..16], b"TSRSLOTD");
        assert!(stored.len() <= slot_delta_image_bytes_max(2));
        let delta = decode_slot_delta_image(&stored, &g).unwrap();
        assert_eq!((delta.page, &delta.changed, &delta.entries), (0, &changed, &listed));
        assert_eq!(
            delta.over(&base),
            vec![entry(7, 98, 300, 2), entry(50, 120, 4096, 1), entry(100, 5, 1, 1)]
        );
        // Changing slots alone (each now listed by no page).
        let none = decode_slot_delta_image(&encode_slot_delta_image(0, &[4, 100], &[]), &g).unwrap();
        assert_eq!(none.over(&base), vec![entry(7, 98, 0, 0)]);
        // A page's image is not a delta, nor a delta a page.
        assert!(decode_slot_page_image(&stored, &g).is_err());
        assert!(decode_slot_delta_image(&encode_slot_page_image(0, &base), &g).is_err());
        let damaged = |at: usize, value: u8| {
            let mut bad = stored.clone();
            bad[at] = value;
            decode_slot_delta_image(&bad, &g).is_err()
        };
        let changed_at = 8 + SLOT_PAGE_HEADER_BYTES;
        // Slot 7 listed, not changed (slots 4 and 50 still are).
        assert!(damaged(changed_at, 0b0001_0000), "a slot listed and not changed");
        let mut none_changed = stored.clone();
        none_changed[changed_at..changed_at + SLOT_BITMAP_BYTES].fill(0);
        assert!(decode_slot_delta_image(&none_changed, &g).is_err(), "no slot changed");
        let past = (g.slot_count() % 1024) as usize;
        assert!(past > 0 && past < 1024);
        assert!(
            damaged(changed_at + past / 8, stored[changed_at + past / 8] | 1 << (past % 8)),
            "a slot changed past the array's"
        );
        assert!(damaged(16, 1), "a delta past the array's pages");
        assert!(
            decode_slot_delta_image(&stored[..stored.len() - 1], &g).is_err(),
            "truncated"
        );
    }

    /// Pages of every shape read back as they were written, within the
    /// most a page of their entries may take; a full page of 8+2 stripes
    /// of 64 KiB chunks randomly overwritten packs in under 10 bytes a
    /// slot (24 in version 13).
    #[test]
    fn slot_pages_of_any_values_round_trip_packed() {
        use rand::{Rng, SeedableRng};
        let g = Geometry {
            rows: 1 << 20,
            member_bytes: 1 << 40,
            ..geometry()
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for round in 0..200 {
            let page = rng.gen_range(0..g.slot_count() / 1024);
            let wide = round % 4 == 0;
            let mut entries = Vec::new();
            for k in 0..1024u64 {
                if rng.gen_bool(if round % 3 == 0 { 0.02 } else { 0.9 }) {
                    let pieces = if wide { rng.gen() } else { rng.gen_range(0..128) };
                    entries.push(SlotEntry {
                        slot: page * 1024 + k,
                        pieces,
                        sequence: if wide {
                            rng.gen_range(1..=u64::MAX)
                        } else {
                            rng.gen_range(1..1 << 24)
                        },
                        live: match pieces {
                            0 => 0,
                            _ if wide => rng.gen(),
                            _ => rng.gen_range(1..(512u64 << 10) * crate::limits::LIVE_SCALE),
                        },
                    });
                }
            }
            if entries.is_empty() {
                continue;
            }
            let stored = encode_slot_page_image(page, &entries);
            assert_eq!(slot_page_image_bytes(&entries), stored.len(), "sized as encoded");
            assert!(
                stored.len() <= slot_page_image_bytes_max(entries.len()),
                "round {round}"
            );
            assert_eq!(
                decode_slot_page_image(&stored, &g).unwrap(),
                (page, entries.clone()),
                "round {round}"
            );
            if !wide && entries.len() > 512 {
                let per_slot =
                    (stored.len() - STORED_IMAGE_HEADER_BYTES - SLOT_PAGE_HEADER_BYTES) as f64 / entries.len() as f64;
                assert!(per_slot < 10.0, "round {round}: {per_slot:.1} bytes a slot");
            }
        }
    }
}
