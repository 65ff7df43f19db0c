//! The intent log: FLUSH after a small write, without sealing a short
//! stripe (the format and its theory: `format::encode_log_block`).
//!
//! # Guarantees
//!
//! - A FLUSH returns only once every record written before it is durable:
//!   in a sealed and synced stripe, or in a log block written and synced
//!   on M+1 members, so it survives any M failures as a stripe does.
//! - For each open user stripe, a FLUSH logs what it took since the last
//!   one, or seals it short where that writes fewer bytes (a stripe
//!   nearly full wastes little) or the log has no room: whichever costs
//!   less, never a lost write.
//! - One log write at a time; FLUSHes that arrive during one wait and are
//!   covered by the next, one block for all of them (group commit).
//! - A log block's space is reused only once every stripe its records
//!   went to is sealed and synced.
//! - A failed log write (a member's write or sync) fails that member, as
//!   a failed chunk write does, and the FLUSH falls back to sealing the
//!   open stripes short: the log never loses or refuses a write.
//! - At open, the blocks from the newest block's tail on are replayed
//!   into stripes, in order, each record with its write's version, so a
//!   record older than what the stripes hold changes nothing, and a
//!   replay that a crash interrupts can run again. Torn blocks fail their
//!   CRC or digests and are ignored: they were never acknowledged.
//!
//! The writer's state (rings, live blocks) is owned by whoever holds the
//! commit role, one thread at a time; no lock is held across its I/O.

use crate::counters::Counters;
use crate::device::{AlignedBuf, Device};
use crate::error::ArrayError;
use crate::error::{LeftOut, Rejected};
use crate::format::{self, LogDeviceHeader, LogRecord, Record, Superblock, LOG_DEVICE_AREA_START, SECTOR_BYTES};
use crate::lanes::{Lanes, Origin, Piece, Stored};
use crate::members::MemberState;
use crate::slots::SlotState;
use crate::stripes::Stripes;
use serde::Serialize;
use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// A record taken from an open stripe, with a copy of its stored bytes.
pub(crate) type Taken = (LogRecord, Vec<u8>);

/// The log of an array that has one (`Geometry::has_log`), a layer over
/// the lanes: it takes what the open user stripes hold, or seals them.
pub(crate) struct IntentLog {
    stripes: Arc<Stripes>,
    lanes: Arc<Lanes>,
    commits: Mutex<Commits>,
    changed: Condvar,
    /// Taken only by the thread in the commit role (and at open).
    writer: Mutex<Writer>,
    /// Bytes of live blocks, all copies, for `status`.
    live_bytes: AtomicU64,
    /// Dedicated log devices, by index; empty: the log is on the members.
    devices: Vec<LogDevice>,
}

/// A dedicated log device of the array.
pub(crate) struct LogDevice {
    pub name: String,
    /// `None`: missing at open.
    pub device: Option<Arc<dyn Device>>,
    /// Failed (a write or sync failed, or marked so in the superblocks):
    /// never written or read again.
    pub failed: AtomicBool,
}

impl LogDevice {
    fn usable(&self) -> Option<&Arc<dyn Device>> {
        self.device.as_ref().filter(|_| !self.failed.load(Ordering::Acquire))
    }
}

/// Group commit: commits are numbered as they start.
#[derive(Default)]
struct Commits {
    started: u64,
    done: u64,
    writing: bool,
}

struct Writer {
    next_sequence: u64,
    /// Each member's area, or each log device's, as a ring of the blocks
    /// written there.
    rings: Vec<Ring>,
    /// Blocks not yet dead, oldest first.
    live: VecDeque<LiveBlock>,
    /// Where the search for the next block's members starts (rotates).
    next_member: usize,
    buffer: AlignedBuf,
    /// Whether an opening would replay nothing: no block written since
    /// the newest one whose tail is itself (`IntentLog::retire`).
    retired: bool,
}

#[derive(Default)]
struct Ring {
    /// Where the next block goes, if it fits before the area's end.
    head: u64,
    /// (sequence, offset) of the live blocks here, oldest first.
    blocks: VecDeque<(u64, u64)>,
}

impl Ring {
    /// Where a block of `len` bytes fits in an area of `area` bytes.
    fn place(&self, len: u64, area: u64) -> Option<u64> {
        let Some(&(_, tail)) = self.blocks.front() else {
            return if self.head + len <= area {
                Some(self.head)
            } else {
                (len <= area).then_some(0)
            };
        };
        if tail < self.head {
            // Live from tail to head: free after head, and before tail.
            if self.head + len <= area {
                Some(self.head)
            } else {
                (len <= tail).then_some(0)
            }
        } else {
            // Wrapped: free from head up to tail.
            (self.head + len <= tail).then_some(self.head)
        }
    }
}

/// A block written to M+1 members (or every log device) and still needed.
struct LiveBlock {
    sequence: u64,
    bytes: u64,
    copies: u64,
    /// The stripes its records went to (their sequence once sealed).
    stripes: Vec<Arc<AtomicU64>>,
}

impl LiveBlock {
    /// Sealed stripes' newest sequence, once all are sealed.
    fn sealed_through(&self) -> Option<u64> {
        self.stripes
            .iter()
            .try_fold(0, |max, s| match s.load(Ordering::Acquire) {
                0 => None,
                sequence => Some(max.max(sequence)),
            })
    }
}

/// What the log holds and has done, for `status`.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct LogStatus {
    /// Where the log is.
    pub on: LogPlace,
    /// The log devices, if any, with their state.
    pub devices: Vec<LogDeviceStatus>,
    /// Bytes of each member's or log device's log area.
    pub area_bytes: u64,
    /// Bytes of live blocks, all copies.
    pub live_bytes: u64,
    pub blocks_written: u64,
    /// Bytes written to the log (all copies); on the members, also
    /// counted in `member_bytes_written`.
    pub bytes_written: u64,
    /// FLUSHes that logged records (the rest sealed stripes or found
    /// nothing to do).
    pub flushes_logged: u64,
    /// Open stripes sealed short by FLUSH: logging them would have
    /// written more, or the log had no room.
    pub stripes_sealed_instead: u64,
    /// Log writes that failed (a member's or log device's write or sync):
    /// those FLUSHes sealed short stripes instead.
    pub write_failures: u64,
}

/// Where the intent log is (`status`'s `log.on`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogPlace {
    /// On the members: M+1 copies of each block.
    #[default]
    Members,
    /// On the log devices: a copy on each.
    Devices,
}

/// A log device in `status`.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct LogDeviceStatus {
    pub name: String,
    /// `Healthy`, `Failed` or `Missing`.
    pub state: crate::members::MemberState,
}

/// What opening found in the log.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct LogRecovery {
    /// Valid blocks found, all copies.
    pub blocks_found: u64,
    /// Blocks from the newest one's tail on, replayed.
    pub blocks_replayed: u64,
    pub records_replayed: u64,
    /// Records of those blocks already mapped at their version or newer
    /// (the stripe they went to was sealed after all): not written again.
    #[serde(default)]
    pub records_already_mapped: u64,
    /// Why the replayed records could not be written to the members (the
    /// array then refuses writes and serves them from memory).
    pub replay_failed: Option<String>,
}

impl IntentLog {
    /// The log of the array of `stripes`, on `devices` if there are any.
    pub fn new(stripes: Arc<Stripes>, lanes: Arc<Lanes>, devices: Vec<LogDevice>) -> IntentLog {
        let rings = if devices.is_empty() {
            stripes.geometry.members
        } else {
            devices.len()
        };
        IntentLog {
            stripes,
            lanes,
            commits: Mutex::new(Commits::default()),
            changed: Condvar::new(),
            writer: Mutex::new(Writer {
                next_sequence: 1,
                rings: (0..rings).map(|_| Ring::default()).collect(),
                live: VecDeque::new(),
                next_member: 0,
                buffer: AlignedBuf::default(),
                retired: true,
            }),
            live_bytes: AtomicU64::new(0),
            devices,
        }
    }

    fn writer(&self) -> std::sync::MutexGuard<'_, Writer> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the log is on dedicated log devices.
    pub fn on_devices(&self) -> bool {
        !self.devices.is_empty()
    }

    pub fn live_bytes(&self) -> u64 {
        self.live_bytes.load(Ordering::Relaxed)
    }

    /// Copies of each block: M+1 on the members, one on each usable log
    /// device (0 if none is left).
    fn copies(&self) -> usize {
        if self.devices.is_empty() {
            self.stripes.geometry.parity + 1
        } else {
            self.devices.iter().filter(|d| d.usable().is_some()).count()
        }
    }

    /// Where block copies go: member or log device `target`, if it can be
    /// written.
    fn target(&self, target: usize) -> Option<Arc<dyn Device>> {
        if self.devices.is_empty() {
            self.stripes.members.readable(target)
        } else {
            self.devices[target].usable().cloned()
        }
    }

    /// (start, bytes) of the log area on each target.
    fn area(&self) -> (u64, u64) {
        let g = &self.stripes.geometry;
        if self.devices.is_empty() {
            (g.log_offset(), g.log_bytes)
        } else {
            (LOG_DEVICE_AREA_START, g.log_device_bytes)
        }
    }

    /// The targets for a block of `len` bytes (M+1 writable members, from
    /// the rotating start, or every usable log device) and where it goes
    /// on each; `None` if there are not enough with room.
    fn placement(&self, w: &Writer, len: u64) -> Option<Vec<(usize, u64)>> {
        let n = w.rings.len();
        let copies = self.copies();
        let (_, area) = self.area();
        let targets: Vec<(usize, u64)> = (0..n)
            .map(|i| (w.next_member + i) % n)
            .filter(|&t| self.target(t).is_some())
            .filter_map(|t| w.rings[t].place(len, area).map(|offset| (t, offset)))
            .take(copies)
            .collect();
        (copies > 0 && targets.len() == copies).then_some(targets)
    }

    /// Writes and syncs `block` on each target at once; returns the
    /// targets that failed.
    fn write_copies(&self, block: &[u8], targets: &[(usize, u64)]) -> Vec<(usize, std::io::Error)> {
        let (start, _) = self.area();
        let failures = Mutex::new(Vec::new());
        self.stripes.io_pool.scope(|scope| {
            for &(target, offset) in targets {
                let failures = &failures;
                scope.spawn(move |_| {
                    let result = match self.target(target) {
                        Some(device) => device.write_at(block, start + offset).and_then(|()| device.sync()),
                        None => Err(std::io::Error::other("it failed")),
                    };
                    if let Err(error) = result {
                        failures.lock().unwrap_or_else(|p| p.into_inner()).push((target, error));
                    }
                });
            }
        });
        failures.into_inner().unwrap_or_else(|p| p.into_inner())
    }

    /// A write, sync or read of the log on `target` failed. A member is
    /// failed as for a chunk write (more failures than the parity covers
    /// stop writes; the caller's check reports it); a log device is never
    /// used again, and the superblocks say so (best effort: if they cannot
    /// be written, the members that failed say why).
    fn fail_target(&self, target: usize, error: &std::io::Error) {
        let members = &self.stripes.members;
        if self.devices.is_empty() {
            let _ = members.failed_io(target, error);
        } else if !self.devices[target].failed.swap(true, Ordering::AcqRel) {
            let _ = members.record_log_failed(target);
        }
    }

    /// FLUSH's first step on an array with a log: once this returns, every
    /// record written before it is in the log or in a sealed stripe (the
    /// caller then syncs the sealed ones).
    pub(crate) fn commit(&self) -> Result<(), ArrayError> {
        let mut c = self.commits.lock().unwrap_or_else(|p| p.into_inner());
        // The first commit to start after now covers this FLUSH.
        let mine = c.started + 1;
        // Each pass returns, or waits for a commit, or runs one; commits
        // end, so this does.
        loop {
            if c.done >= mine {
                return Ok(());
            }
            if c.writing {
                c = self.changed.wait(c).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            c.writing = true;
            c.started += 1;
            let number = c.started;
            drop(c);
            let result = self.log_commit();
            c = self.commits.lock().unwrap_or_else(|p| p.into_inner());
            c.writing = false;
            // A failed commit covers no one: the FLUSHes waiting for it
            // run the next one themselves.
            if result.is_ok() {
                c.done = number;
            }
            self.changed.notify_all();
            result?;
        }
    }

    /// One commit: takes what the open user stripes hold beyond what is
    /// logged, seals the stripes where that is cheaper, writes the rest as
    /// one block to M+1 members and syncs them. On a failed write, seals
    /// every open user stripe instead.
    fn log_commit(&self) -> Result<(), ArrayError> {
        let mut w = self.writer();
        self.reclaim(&mut w);
        // What waits, to make room first if it does not fit: syncing
        // stripes sealed since kills the blocks they hold.
        let (count, stored) = self.unlogged();
        if count == 0 {
            return Ok(());
        }
        if self
            .placement(&w, format::log_block_bytes(count, stored) as u64)
            .is_none()
        {
            let sealed = w.live.iter().filter_map(LiveBlock::sealed_through).max();
            if let Some(sequence) = sealed {
                self.lanes.sync_through(sequence)?;
                self.reclaim(&mut w);
            }
        }
        let (taken, stripes) = self.take_unlogged(&w)?;
        if taken.is_empty() {
            return Ok(());
        }
        let sequence = w.next_sequence;
        w.next_sequence += 1;
        let tail = w.live.front().map_or(sequence, |b| b.sequence);
        format::encode_log_block(self.stripes.array_uuid, sequence, tail, &taken, &mut w.buffer);
        let len = w.buffer.len() as u64;
        let targets = self.placement(&w, len).expect("take_unlogged logs only what fits");
        if !self.write_block(&mut w, &targets) {
            drop(w);
            let sealed = self.lanes.seal_user_lanes()?;
            Counters::add(&self.stripes.counters.log_stripes_sealed_instead, sealed as u64);
            return Ok(());
        }
        for &(member, offset) in &targets {
            let ring = &mut w.rings[member];
            ring.blocks.push_back((sequence, offset));
            ring.head = offset + len;
        }
        w.next_member = (w.next_member + 1) % w.rings.len();
        w.retired = false;
        w.live.push_back(LiveBlock {
            sequence,
            bytes: len,
            copies: targets.len() as u64,
            stripes,
        });
        self.live_bytes.fetch_add(len * targets.len() as u64, Ordering::Relaxed);
        Counters::add(&self.stripes.counters.log_blocks_written, 1);
        Counters::add(&self.stripes.counters.flushes_logged, 1);
        Ok(())
    }

    /// Once every record logged so far is in a sealed and synced stripe
    /// (a clean stop, the end of a replay), writes a block with no records
    /// whose tail is itself, so that the next opening, which replays from
    /// the newest block's tail, replays nothing and reads no map page for
    /// it. Does nothing if a block is still needed or nothing was logged
    /// since the last one; refused while writes are. A failed write
    /// leaves the blocks to be replayed again (they are mapped already,
    /// so nothing is written twice).
    pub(crate) fn retire(&self) -> Result<(), ArrayError> {
        // Synced stripes are on K members only while writes are not
        // refused: once members are lost past the parity, the log is the
        // only whole copy of what it holds, and is kept.
        self.stripes.members.check_writable()?;
        let mut w = self.writer();
        self.reclaim(&mut w);
        if w.retired || !w.live.is_empty() {
            return Ok(());
        }
        let sequence = w.next_sequence;
        format::encode_log_block(
            self.stripes.array_uuid,
            sequence,
            sequence,
            &[] as &[Taken],
            &mut w.buffer,
        );
        let len = w.buffer.len() as u64;
        let Some(targets) = self.placement(&w, len) else {
            return Ok(());
        };
        w.next_sequence += 1;
        if !self.write_block(&mut w, &targets) {
            return Ok(());
        }
        // Dead from the start: placed after the newest block, never
        // counted live.
        for &(target, offset) in &targets {
            w.rings[target].head = offset + len;
        }
        w.retired = true;
        Ok(())
    }

    /// Writes the block encoded in `w.buffer` to `targets` and counts it;
    /// a target whose write or sync fails is failed. Whether every copy
    /// was written.
    fn write_block(&self, w: &mut Writer, targets: &[(usize, u64)]) -> bool {
        let failures = self.write_copies(&w.buffer, targets);
        let written = w.buffer.len() as u64 * (targets.len() - failures.len()) as u64;
        if self.devices.is_empty() {
            Counters::add(&self.stripes.counters.member_bytes_written, written);
        }
        Counters::add(&self.stripes.counters.log_bytes_written, written);
        if failures.is_empty() {
            return true;
        }
        Counters::add(&self.stripes.counters.log_write_failures, 1);
        for (target, error) in &failures {
            self.fail_target(*target, error);
        }
        false
    }

    /// Drops the blocks at the front whose stripes are all sealed and
    /// synced: nothing needs them any more.
    fn reclaim(&self, w: &mut Writer) {
        // Found by recovery too: a stripe taken early is not, until the
        // checkpoint being written is durable.
        let synced = self.lanes.tracker.lock().recoverable_through();
        while let Some(front) = w.live.front() {
            if front.sealed_through().is_none_or(|sequence| sequence > synced) {
                break;
            }
            let dead = w.live.pop_front().expect("front exists");
            self.live_bytes.fetch_sub(dead.bytes * dead.copies, Ordering::Relaxed);
            for ring in &mut w.rings {
                while ring.blocks.front().is_some_and(|&(s, _)| s <= dead.sequence) {
                    ring.blocks.pop_front();
                }
            }
        }
    }

    /// Records and stored bytes the open user stripes hold unlogged.
    fn unlogged(&self) -> (usize, usize) {
        let (mut count, mut stored) = (0, 0);
        for lane in self.lanes.user_lanes() {
            if let Some(open) = self.lanes.open_lane(lane).as_ref() {
                count += open.records.len() - open.logged;
                stored += open.records[open.logged..].iter().map(stored_bytes).sum::<usize>();
            }
        }
        (count, stored)
    }

    /// Takes each open user stripe's unlogged records (copying their
    /// bytes), or seals the stripe short where that writes fewer bytes
    /// than logging them or they do not fit; returns what was taken and
    /// the stripes it belongs to.
    fn take_unlogged(&self, w: &Writer) -> Result<(Vec<Taken>, Vec<Arc<AtomicU64>>), ArrayError> {
        let g = &self.stripes.geometry;
        let copies = self.copies();
        let (mut taken, mut stripes, mut sealed) = (Vec::new(), Vec::new(), Vec::new());
        let mut stored_total = 0;
        for lane in self.lanes.user_lanes() {
            let mut guard = self.lanes.open_lane(lane);
            let Some(open) = guard.as_mut() else { continue };
            let new = &open.records[open.logged..];
            if new.is_empty() {
                continue;
            }
            let stored: usize = new.iter().map(stored_bytes).sum();
            let log_cost = copies * (new.len() * format::LOG_RECORD_BYTES + stored);
            // Sealing now writes the unused rest of the data area, and
            // its parity, for nothing.
            let seal_waste = open.unused_bytes() * g.width() / g.data;
            let len = format::log_block_bytes(taken.len() + new.len(), stored_total + stored);
            if seal_waste <= log_cost || self.placement(w, len as u64).is_none() {
                let open = guard.take().expect("checked above");
                sealed.extend(self.lanes.seal_open(open, SlotState::Sealed));
                drop(guard);
                continue;
            }
            debug_assert_eq!(open.mapped, open.records.len(), "records are mapped under this lock");
            for record in new {
                taken.push(match record {
                    Record::Data { lba, version, extent } => {
                        let at = extent.offset as usize;
                        let bytes = open.data[at..at + extent.stored_bytes as usize].to_vec();
                        let record = LogRecord {
                            lba: *lba,
                            version: *version,
                            blocks: extent.blocks,
                            data: Some((extent.codec, extent.digest)),
                        };
                        (record, bytes)
                    }
                    Record::Zero { lba, blocks, version } => {
                        let record = LogRecord {
                            lba: *lba,
                            version: *version,
                            blocks: *blocks,
                            data: None,
                        };
                        (record, Vec::new())
                    }
                });
            }
            stored_total += stored;
            open.logged = open.records.len();
            stripes.push(open.sealed_as.clone());
        }
        Counters::add(&self.stripes.counters.short_stripes_sealed, sealed.len() as u64);
        Counters::add(&self.stripes.counters.log_stripes_sealed_instead, sealed.len() as u64);
        self.lanes.submit(sealed)?;
        Ok((taken, stripes))
    }

    /// At open, after the stripes are recovered: reads the log area of
    /// every healthy member (or usable log device) and returns the blocks
    /// to replay, from the newest one's tail on, each its records (and
    /// what was found); new blocks go after the newest. The caller
    /// replays them into stripes, sealed and synced, then retires them
    /// (`recovery`).
    pub(crate) fn read_for_replay(&self, discard_missing: bool) -> Result<(LogRecovery, Vec<Vec<Taken>>), ArrayError> {
        let g = &self.stripes.geometry;
        let (start, area) = self.area();
        let area = area as usize;
        let mut found = LogRecovery::default();
        let mut blocks: BTreeMap<u64, (u64, Vec<Taken>)> = BTreeMap::new();
        let mut w = self.writer();
        let mut buffer = AlignedBuf::zeroed(area);
        // Log devices that cannot be read are failed only if another was:
        // with none read, the open is refused and nothing recorded.
        let usable = self.devices.iter().filter(|d| d.usable().is_some()).count();
        let mut unreadable = Vec::new();
        for target in 0..w.rings.len() {
            let read = if self.devices.is_empty() {
                self.stripes.members.read(target, |d| d.read_at(&mut buffer, start))
            } else {
                let Some(device) = self.devices[target].usable() else {
                    continue;
                };
                match device.read_at(&mut buffer, start) {
                    Ok(()) => true,
                    Err(error) => {
                        unreadable.push((target, error));
                        false
                    }
                }
            };
            if !read {
                continue;
            }
            let mut at = 0;
            let mut newest = None;
            // Each pass moves on by at least LOG_ALIGN.
            while at + format::LOG_ALIGN <= area {
                let decoded = format::decode_log_block(&buffer[at..], g)
                    .ok()
                    .filter(|(header, _)| header.array_uuid == self.stripes.array_uuid);
                let Some((header, records)) = decoded else {
                    at += format::LOG_ALIGN;
                    continue;
                };
                found.blocks_found += 1;
                if newest.is_none_or(|(sequence, _)| header.sequence > sequence) {
                    newest = Some((header.sequence, (at + header.bytes) as u64));
                }
                blocks.entry(header.sequence).or_insert_with(|| {
                    let records = records
                        .into_iter()
                        .map(|(record, range)| (record, buffer[at..][range].to_vec()))
                        .collect();
                    (header.tail, records)
                });
                at += header.bytes;
            }
            // New blocks go after the newest here, so none of what a
            // replay interrupted by a crash needs is overwritten first.
            if let Some((_, end)) = newest {
                w.rings[target].head = end;
            }
        }
        if usable > 0 && unreadable.len() == usable && !discard_missing {
            return Err(ArrayError::LogDevicesMissing {
                why: crate::error::LogsMissing::Unreadable {
                    names: unreadable
                        .iter()
                        .map(|&(target, _)| self.devices[target].name.clone())
                        .collect(),
                },
            });
        }
        for (target, error) in unreadable {
            self.fail_target(target, &error);
        }
        let Some((&newest, &(tail, _))) = blocks.iter().next_back() else {
            return Ok((found, Vec::new()));
        };
        w.next_sequence = newest + 1;
        w.retired = blocks.range(tail..).all(|(_, (_, records))| records.is_empty());
        Ok((
            found,
            blocks
                .split_off(&tail)
                .into_values()
                .map(|(_, records)| records)
                .collect(),
        ))
    }

    /// The log's part of `status`.
    pub(crate) fn status(&self) -> LogStatus {
        let c = &self.stripes.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let state = |d: &LogDevice| match (&d.device, d.failed.load(Ordering::Relaxed)) {
            (None, _) => MemberState::Missing,
            (Some(_), true) => MemberState::Failed,
            (Some(_), false) => MemberState::Healthy,
        };
        LogStatus {
            on: match self.devices.is_empty() {
                true => LogPlace::Members,
                false => LogPlace::Devices,
            },
            devices: self
                .devices
                .iter()
                .map(|d| LogDeviceStatus {
                    name: d.name.clone(),
                    state: state(d),
                })
                .collect(),
            area_bytes: self.area().1,
            live_bytes: self.live_bytes(),
            blocks_written: load(&c.log_blocks_written),
            bytes_written: load(&c.log_bytes_written),
            flushes_logged: load(&c.flushes_logged),
            stripes_sealed_instead: load(&c.log_stripes_sealed_instead),
            write_failures: load(&c.log_write_failures),
        }
    }
}

/// Writes zeros over a member's log area: at create, so log writes
/// overwrite allocated blocks (see `device::write_zeros`) and a reused
/// device's old blocks are gone; and on a rebuilt device, whose blocks
/// from before it left must never be read as current.
pub(crate) fn clear_log_area(device: &dyn Device, g: &format::Geometry) -> std::io::Result<()> {
    let start = g.log_offset();
    crate::device::write_zeros(device, start..start + g.log_bytes, &mut |_| true)
}

/// At create: writes the header of each log device, in order, for an
/// area of `area_bytes`; returns them as the array's.
pub(crate) fn format_log_devices(
    given: &[(String, Arc<dyn Device>)],
    array_uuid: [u8; 16],
    area_bytes: u64,
) -> Result<Vec<LogDevice>, ArrayError> {
    let mut devices = Vec::new();
    for (index, (name, device)) in given.iter().enumerate() {
        let header = LogDeviceHeader {
            array_uuid,
            uuid: rand::random(),
            index,
            count: given.len(),
            area_bytes,
        };
        device
            .write_at(&header.encode(), 0)
            .and_then(|()| device.sync())
            .map_err(|source| ArrayError::LogDeviceWrite {
                name: name.clone(),
                source,
            })?;
        devices.push(LogDevice {
            name: name.clone(),
            device: Some(device.clone()),
            failed: AtomicBool::new(false),
        });
    }
    Ok(devices)
}

/// At open: the array's log devices, by index, from `given` (any order);
/// a device whose header is not one of the array's is left out and
/// reported. Those marked failed are never used; one missing is failed
/// too (the caller records it) if another can be used. With none usable
/// where some may hold blocks, the open is refused unless `discard`.
pub(crate) fn find_log_devices(
    superblock: &Superblock,
    given: &[(String, Arc<dyn Device>)],
    discard: bool,
    rejected: &mut Vec<Rejected>,
) -> Result<Vec<LogDevice>, ArrayError> {
    let g = &superblock.geometry;
    let mut devices: Vec<LogDevice> = (0..g.log_devices)
        .map(|i| LogDevice {
            name: format!("log device {i}"),
            device: None,
            failed: AtomicBool::new(superblock.log_failed & (1 << i) != 0),
        })
        .collect();
    for (name, device) in given {
        let mut sector = AlignedBuf::zeroed(SECTOR_BYTES);
        let header = device
            .read_at(&mut sector, 0)
            .map_err(|e| (LeftOut::NotALogDevice, e.to_string()))
            .and_then(|()| LogDeviceHeader::decode(&sector).map_err(|e| (LeftOut::NotALogDevice, e.to_string())))
            .and_then(|h| {
                let needed = LOG_DEVICE_AREA_START + h.area_bytes;
                if h.array_uuid != superblock.array_uuid {
                    let array = format::hex(&h.array_uuid);
                    Err((
                        LeftOut::OtherArray { array: array.clone() },
                        format!("belongs to array {array}"),
                    ))
                } else if h.count != g.log_devices || h.area_bytes != g.log_device_bytes {
                    let why = "disagrees with the members about the log devices".to_string();
                    Err((LeftOut::OtherShape, why))
                } else if device.size() < needed {
                    let bytes = device.size();
                    let why = format!("is {bytes} bytes, shorter than its log area: truncated?");
                    Err((LeftOut::TooShort { bytes, needed }, why))
                } else if devices[h.index].device.is_some() {
                    let other = devices[h.index].name.clone();
                    let why = format!("claims to be log device {} as {other} does", h.index);
                    Err((LeftOut::SameAs { other }, why))
                } else {
                    Ok(h)
                }
            });
        match header {
            Ok(h) => {
                devices[h.index].name = name.clone();
                devices[h.index].device = Some(device.clone());
            }
            Err((reason, why)) => {
                let words = format!("{name} is not one of the array's log devices: {why}");
                rejected.push(Rejected {
                    name: name.clone(),
                    reason,
                    why: words,
                });
            }
        }
    }
    let expected: Vec<&LogDevice> = devices.iter().filter(|d| !d.failed.load(Ordering::Relaxed)).collect();
    if !expected.is_empty() && expected.iter().all(|d| d.device.is_none()) && !discard {
        let names: Vec<&str> = expected.iter().map(|d| d.name.as_str()).collect();
        return Err(ArrayError::LogDevicesMissing {
            why: crate::error::LogsMissing::NotFound {
                names: names.iter().map(|n| n.to_string()).collect(),
                rejected: crate::error::Rejections(rejected.clone()),
            },
        });
    }
    for d in &devices {
        if d.device.is_none() {
            d.failed.store(true, Ordering::Release);
        }
    }
    Ok(devices)
}

/// Stored bytes a record's data takes.
fn stored_bytes(record: &Record) -> usize {
    match record {
        Record::Data { extent, .. } => extent.stored_bytes as usize,
        Record::Zero { .. } => 0,
    }
}

/// A log record as a piece to pack again, with its version.
pub(crate) fn replayed_piece<'a>(record: &LogRecord, bytes: &'a [u8]) -> Piece<'a> {
    let stored = match &record.data {
        None => Stored::Zero,
        Some((None, digest)) => Stored::Raw {
            bytes: Cow::Borrowed(bytes),
            crcs: crate::lanes::block_crcs(bytes),
            digest: *digest,
        },
        Some((Some(codec), digest)) => Stored::Compressed {
            codec: *codec,
            bytes: bytes.to_vec(),
            digest: *digest,
        },
    };
    Piece {
        lba: record.lba,
        blocks: record.blocks,
        stored,
        origin: Origin::Replays(record.version),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring whose live blocks start at `offsets`, oldest first.
    fn ring(head: u64, offsets: &[u64]) -> Ring {
        Ring {
            head,
            blocks: offsets.iter().enumerate().map(|(i, &o)| (i as u64, o)).collect(),
        }
    }

    #[test]
    fn a_ring_places_blocks_only_in_free_space() {
        // Empty: at the head, or from the start when the end is too near.
        assert_eq!(ring(0, &[]).place(100, 1000), Some(0));
        assert_eq!(ring(950, &[]).place(100, 1000), Some(0));
        assert_eq!(ring(0, &[]).place(1001, 1000), None);
        // Live 200..600: after it, or before it once the end is too near.
        let r = ring(600, &[200]);
        assert_eq!(r.place(400, 1000), Some(600));
        assert_eq!(r.place(401, 1000), None);
        assert_eq!(r.place(200, 1000), Some(600));
        let near_end = ring(900, &[200]);
        assert_eq!(near_end.place(200, 1000), Some(0));
        assert_eq!(near_end.place(201, 1000), None);
        // Wrapped: live 700..1000 and 0..300; free only 300..700.
        let wrapped = ring(300, &[700, 0]);
        assert_eq!(wrapped.place(400, 1000), Some(300));
        assert_eq!(wrapped.place(401, 1000), None);
    }
}
