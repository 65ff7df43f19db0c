//! Activity records: which process has the array open, as any opener can
//! see it, on any host and by any name for the members (a lock on a path
//! does not see a loop device over it, a second host on a shared disk, or
//! a device-mapper node), as ZFS's multihost protection does.
//!
//! # Guarantees
//!
//! - While an array is open, each member it can write holds at
//!   [`ACTIVITY_OFFSET`] a record naming the opening (a random id, the
//!   host's boot id, the process id) and a sequence that a thread advances
//!   every [`ACTIVITY_INTERVAL`]; closing the array marks it closed.
//! - Opening reads those records before it writes anything. A record of
//!   this array that is not closed and is not provably stale (this host,
//!   and its process gone, or this process and the opening dropped) is
//!   watched for [`ACTIVITY_WATCH`]: if its sequence moves, the opening is
//!   refused (`ArrayError::ActiveElsewhere`), unless the caller forces it.
//!   A stale one costs nothing; one left by a crash on another host costs
//!   the watch.
//! - The same records are the fence a failover between hosts needs: the
//!   host that takes over watches the old one's sequence stop first.
//! - A clean stop ([`Heartbeat::close_clean`]) marks them clean as of its
//!   checkpoint, synced, once nothing can be written after it. Opening
//!   trusts that mark ([`clean_at`]) only if every member it reads says so,
//!   for the checkpoint the superblocks name, and then reads no stripe
//!   header; its first record, which says the array is open, is synced
//!   before anything else is written, so a mark never outlives the
//!   opening that follows it.
//!
//! # Format (one 4 KiB sector at 64 KiB into each member, before row 0)
//!
//! | offset | field |
//! |---|---|
//! | 0 | magic `TSRALIVE` |
//! | 8 | version (1), u32 |
//! | 12 | flags, u32: bit 0 closed, bit 1 clean, bit 2 read the slot pages |
//! | 16 | array UUID, 16 bytes |
//! | 32 | opening id, u64 (random) |
//! | 40 | sequence, u64 |
//! | 48 | process id, u32 |
//! | 52 | zero, u32 |
//! | 56 | boot id of the host, 16 bytes |
//! | 72 | Unix time of the write, ms, u64 |
//! | 80 | clean stop: the checkpoint sequence it left, u64 (flag bit 1) |
//! | 88 | CRC32C of bytes 0..88, u32 |
//!
//! Version 1 records (before the clean mark) had their CRC at 80; they are
//! read as not clean.
//!
//! Bit 2 says that what an opening left for later failed: a slot table
//! page could not be read (`slot_loader`), or a map page the replay
//! mapped after opening pointed into a replayed slot where the replay
//! wrote nothing (`replay.rs`). The next opening reads every slot page
//! and maps the replay before it serves ([`pages_suspect`]), and scans
//! every slot if a page still fails or the map is still found stale.
//! It is set while that is so, synced by the beat that first carries it;
//! an opening carries the mark it found until its recovery is done.
//! Binaries that predate the bit ignore it (they read every page after a
//! crash anyway).
//!
//! Written with the member's direct I/O where it has it, without a sync:
//! another process on the host sees it through the page cache, another
//! host through the device.

use crate::device::{AlignedBuf, Device};
use crate::error::{ArrayError, Opener};
use crate::format::SECTOR_BYTES;
use std::collections::HashSet;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Where the record sits on every member: in the unused space between the
/// superblock and row 0.
pub const ACTIVITY_OFFSET: u64 = 64 << 10;
const _: () = assert!(ACTIVITY_OFFSET >= SECTOR_BYTES as u64);
const _: () = assert!(ACTIVITY_OFFSET + SECTOR_BYTES as u64 <= crate::format::DATA_START);
/// How often an open array advances its records.
pub const ACTIVITY_INTERVAL: Duration = Duration::from_millis(500);
/// How long an opener watches a record that may be live: four intervals,
/// so a writer a little late still shows.
pub const ACTIVITY_WATCH: Duration = Duration::from_millis(2000);
const MAGIC: [u8; 8] = *b"TSRALIVE";
const VERSION: u32 = 2;
const FLAG_CLOSED: u32 = 1;
const FLAG_CLEAN: u32 = 2;
const FLAG_READ_PAGES: u32 = 4;
const CRC_OFFSET: usize = 88;
const CRC_OFFSET_V1: usize = 80;

/// One member's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub array_uuid: [u8; 16],
    pub opening: u64,
    pub sequence: u64,
    pub pid: u32,
    pub boot_id: [u8; 16],
    pub unix_ms: u64,
    pub closed: bool,
    /// Left by a clean stop: the sequence of the checkpoint it wrote last,
    /// with nothing written after it.
    pub clean_at: Option<u64>,
    /// The next opening is to read every slot table page at once.
    pub read_pages: bool,
}

impl Record {
    pub fn encode(&self) -> AlignedBuf {
        let mut s = AlignedBuf::zeroed(SECTOR_BYTES);
        s[0..8].copy_from_slice(&MAGIC);
        s[8..12].copy_from_slice(&VERSION.to_le_bytes());
        let flags = if self.closed { FLAG_CLOSED } else { 0 }
            | if self.clean_at.is_some() { FLAG_CLEAN } else { 0 }
            | if self.read_pages { FLAG_READ_PAGES } else { 0 };
        s[12..16].copy_from_slice(&flags.to_le_bytes());
        s[16..32].copy_from_slice(&self.array_uuid);
        s[32..40].copy_from_slice(&self.opening.to_le_bytes());
        s[40..48].copy_from_slice(&self.sequence.to_le_bytes());
        s[48..52].copy_from_slice(&self.pid.to_le_bytes());
        s[56..72].copy_from_slice(&self.boot_id);
        s[72..80].copy_from_slice(&self.unix_ms.to_le_bytes());
        s[80..88].copy_from_slice(&self.clean_at.unwrap_or(0).to_le_bytes());
        let crc = tessera_checksum::crc32c(&s[..CRC_OFFSET]);
        s[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
        s
    }

    /// The record in `sector`, if there is a valid one.
    pub fn decode(s: &[u8]) -> Option<Record> {
        let u32_at = |at: usize| u32::from_le_bytes(s[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_le_bytes(s[at..at + 8].try_into().expect("8 bytes"));
        if s.len() < CRC_OFFSET + 4 || s[0..8] != MAGIC {
            return None;
        }
        let crc_at = match u32_at(8) {
            1 => CRC_OFFSET_V1,
            VERSION => CRC_OFFSET,
            _ => return None,
        };
        if tessera_checksum::crc32c(&s[..crc_at]) != u32_at(crc_at) {
            return None;
        }
        let flags = u32_at(12);
        Some(Record {
            array_uuid: s[16..32].try_into().expect("16 bytes"),
            opening: u64_at(32),
            sequence: u64_at(40),
            pid: u32_at(48),
            boot_id: s[56..72].try_into().expect("16 bytes"),
            unix_ms: u64_at(72),
            closed: flags & FLAG_CLOSED != 0,
            clean_at: (crc_at == CRC_OFFSET && flags & FLAG_CLEAN != 0).then(|| u64_at(80)),
            read_pages: flags & FLAG_READ_PAGES != 0,
        })
    }
}

/// Reads member `device`'s record.
pub fn read(device: &dyn Device) -> Option<Record> {
    let mut sector = AlignedBuf::zeroed(SECTOR_BYTES);
    device.read_at(&mut sector, ACTIVITY_OFFSET).ok()?;
    Record::decode(&sector)
}

/// Writes `record` to member `device`.
pub fn write(device: &dyn Device, record: &Record) -> std::io::Result<()> {
    device.write_at(&record.encode(), ACTIVITY_OFFSET)
}

/// This host's boot id (`/proc/sys/kernel/random/boot_id`): a process id
/// means something only on the same boot of the same host.
fn boot_id() -> [u8; 16] {
    static BOOT: std::sync::OnceLock<[u8; 16]> = std::sync::OnceLock::new();
    *BOOT.get_or_init(|| {
        let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let hex: String = text.chars().filter(char::is_ascii_hexdigit).collect();
        let mut id = [0u8; 16];
        if hex.len() == 32 {
            for (i, b) in id.iter_mut().enumerate() {
                *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap_or(0);
            }
        } else {
            // Unknown: never equal to another host's, so never "stale".
            id = rand::random();
        }
        id
    })
}

/// The openings alive in this process (its arrays not yet dropped).
fn live_openings() -> &'static Mutex<HashSet<u64>> {
    static LIVE: std::sync::OnceLock<Mutex<HashSet<u64>>> = std::sync::OnceLock::new();
    LIVE.get_or_init(Default::default)
}

/// Whether process `pid` of this host exists.
fn process_exists(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let result = unsafe { libc::kill(pid as libc::pid_t, 0) };
    result == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Whether `record` is certainly not of a live opening.
fn stale(record: &Record) -> bool {
    if record.closed {
        return true;
    }
    if record.boot_id != boot_id() {
        return false;
    }
    if record.pid == std::process::id() {
        return !live_openings()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&record.opening);
    }
    !process_exists(record.pid)
}

/// The checkpoint a clean stop left, if every one of `members` holds a
/// record of array `array_uuid` saying so, all for the same checkpoint:
/// then no stripe was written after it. A member without a record, or
/// with an older one (it was away), says nothing is known.
pub fn clean_at(members: &[Arc<dyn Device>], array_uuid: [u8; 16]) -> Option<u64> {
    let mut at = None;
    for device in members {
        let record = read(device.as_ref()).filter(|r| r.array_uuid == array_uuid && r.closed)?;
        let sequence = record.clean_at?;
        if at.is_some_and(|a| a != sequence) {
            return None;
        }
        at = Some(sequence);
    }
    at
}

/// Whether a record of array `array_uuid` on any of `members` says that
/// what an opening left for later failed (bit 2): then opening reads
/// every slot page and maps the replay before it serves.
pub fn pages_suspect(members: &[Arc<dyn Device>], array_uuid: [u8; 16]) -> bool {
    members
        .iter()
        .filter_map(|device| read(device.as_ref()))
        .any(|r| r.array_uuid == array_uuid && r.read_pages)
}

/// Refuses to go on if another opening of array `array_uuid` is alive on
/// any of `members` (name, device): a record that is fresh on this host,
/// or one whose sequence moves while it is watched for `watch`.
pub fn check_idle(
    members: &[(String, Arc<dyn Device>)],
    array_uuid: [u8; 16],
    watch: Duration,
) -> Result<(), ArrayError> {
    let live = |name: &str, record: &Record, why: Opener| ArrayError::ActiveElsewhere {
        name: name.to_string(),
        pid: record.pid,
        why,
    };
    let seen: Vec<(&String, &Arc<dyn Device>, Record)> = members
        .iter()
        .filter_map(|(name, device)| read(device.as_ref()).map(|r| (name, device, r)))
        .filter(|(_, _, r)| r.array_uuid == array_uuid && !stale(r))
        .collect();
    if seen.is_empty() {
        return Ok(());
    }
    // This host, the process alive: a live opening unless it is another
    // process that took the id (then the watch shows it still).
    let local = seen
        .iter()
        .find(|(_, _, r)| r.boot_id == boot_id() && r.pid == std::process::id());
    if let Some((name, _, record)) = local {
        return Err(live(name, record, Opener::ThisProcess));
    }
    std::thread::sleep(watch);
    for (name, device, before) in &seen {
        if let Some(now) = read(device.as_ref()) {
            let moved = now.opening != before.opening || now.sequence != before.sequence;
            if moved && !now.closed {
                let why = if now.boot_id == boot_id() {
                    Opener::ThisHost
                } else {
                    Opener::AnotherHost
                };
                return Err(live(name, &now, why));
            }
        }
    }
    Ok(())
}

/// The thread that keeps an open array's records moving, and marks them
/// closed when the array is dropped.
pub struct Heartbeat {
    beats: Arc<Beats>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the heartbeat thread and its handle share. The record is copied
/// out under the lock and written with none held: a beat that overtakes
/// [`Heartbeat::close_clean`] only clears the clean mark, which is safe.
struct Beats {
    /// Stopped, and the record as it is to be written next.
    state: Mutex<(bool, Record)>,
    wake: Condvar,
    /// The members the array may write now.
    devices: Box<dyn Fn() -> Vec<Arc<dyn Device>> + Send + Sync>,
    /// Whether the next opening is to read every slot table page.
    read_pages: Box<dyn Fn() -> bool + Send + Sync>,
}

impl Beats {
    /// Advances the record (closed, or marked clean, as `change` says) and
    /// writes it to every member; with `sync`, durably, as it is when it
    /// first carries the mark to read every slot page.
    fn beat(&self, change: impl FnOnce(&mut Record), sync: bool) {
        let read_pages = (self.read_pages)();
        let (record, sync) = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let record = &mut state.1;
            let sync = sync || (read_pages && !record.read_pages);
            record.read_pages = read_pages;
            change(record);
            record.sequence += 1;
            record.unix_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            (record.clone(), sync)
        };
        for device in (self.devices)() {
            // A member that fails this write fails its next data write
            // too, and is failed then.
            let _ = write(device.as_ref(), &record).and_then(|()| if sync { device.sync() } else { Ok(()) });
        }
    }
}

impl Heartbeat {
    /// Starts advancing the records of array `array_uuid` on the members
    /// `devices` returns (those it may write now) every interval, each
    /// with the mark to read every slot page where `read_pages` says so.
    /// The first record, which clears a clean stop's mark, is synced
    /// before this returns, so before the array writes anything.
    pub fn start(
        array_uuid: [u8; 16],
        devices: impl Fn() -> Vec<Arc<dyn Device>> + Send + Sync + 'static,
        read_pages: impl Fn() -> bool + Send + Sync + 'static,
    ) -> std::io::Result<Heartbeat> {
        let opening: u64 = rand::random();
        live_openings()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(opening);
        let record = Record {
            array_uuid,
            opening,
            sequence: 0,
            pid: std::process::id(),
            boot_id: boot_id(),
            unix_ms: 0,
            closed: false,
            clean_at: None,
            read_pages: false,
        };
        let beats = Arc::new(Beats {
            state: Mutex::new((false, record)),
            wake: Condvar::new(),
            devices: Box::new(devices),
            read_pages: Box::new(read_pages),
        });
        beats.beat(|_| {}, true);
        let shared = beats.clone();
        let thread = std::thread::Builder::new()
            .name("tessera-activity".to_string())
            .spawn(move || {
                let mut guard = shared.state.lock().unwrap_or_else(|p| p.into_inner());
                while !guard.0 {
                    guard = shared
                        .wake
                        .wait_timeout(guard, ACTIVITY_INTERVAL)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                    if guard.0 {
                        break;
                    }
                    drop(guard);
                    shared.beat(|_| {}, false);
                    guard = shared.state.lock().unwrap_or_else(|p| p.into_inner());
                }
                drop(guard);
                shared.beat(|r| r.closed = true, false);
                live_openings()
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&opening);
            })?;
        Ok(Heartbeat {
            beats,
            thread: Some(thread),
        })
    }

    /// A clean stop: marks the records closed and clean as of checkpoint
    /// `sequence`, synced. The caller has made sure that nothing was
    /// written after that checkpoint and that nothing will be.
    pub fn close_clean(&self, sequence: u64) {
        self.beats.beat(
            |r| {
                r.closed = true;
                r.clean_at = Some(sequence);
            },
            true,
        );
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.beats.state.lock().unwrap_or_else(|p| p.into_inner()).0 = true;
        self.beats.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_a_flipped_bit_is_refused() {
        let record = Record {
            array_uuid: [7; 16],
            opening: 42,
            sequence: 9,
            pid: 1234,
            boot_id: [3; 16],
            unix_ms: 1_700_000_000_000,
            closed: true,
            clean_at: Some(77),
            read_pages: true,
        };
        let mut bytes = record.encode();
        assert_eq!(Record::decode(&bytes), Some(record));
        bytes[41] ^= 1;
        assert_eq!(Record::decode(&bytes), None);
    }
}
