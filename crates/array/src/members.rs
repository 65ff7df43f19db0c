//! Membership: the member devices, their health, and the superblocks that
//! record it.
//!
//! # Guarantees
//!
//! - A member's state is read without a lock (every I/O path asks), and
//!   changes only under the superblock lock, which is held while the new
//!   superblocks are written. That lock is never taken by a read or write
//!   of client data, only by membership changes and checkpoints.
//! - A member whose write, sync or superblock write fails is failed and
//!   recorded in the others' superblocks, as long as the parity covers it.
//!   When it would not (more than M unavailable), the array is marked
//!   lost for writing, for good: every later write and FLUSH fails with
//!   the reason, so no FLUSH ever reports success over data that is not
//!   durable. Reads go on where K good chunks remain. Reopening the array
//!   (once the members are back) is the way out.

use crate::device::{Counted, Device, IoCounts, IoTotals};
use crate::error::{ArrayError, Lost, Rejected};
use crate::events::{Events, What};
use crate::format::{FormatError, Superblock, SECTOR_BYTES};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")] // as `name` spells it
pub enum MemberState {
    Healthy,
    /// Marked failed (by `tessera fail` or after an I/O error).
    Failed,
    /// Absent when the array was opened.
    Missing,
    /// Present when the array was opened, but recorded failed: it holds
    /// the array as it was when it left (failed by hand or for errors,
    /// or away while the array went on). Neither read nor written until
    /// a resync brings it up to date.
    Stale,
    /// Out, being rebuilt onto a device: every stripe sealed from now on
    /// is written to it, and the stripes sealed before are rebuilt onto
    /// it; it is read only once all are (the superblocks record it failed
    /// until then).
    Rebuilding,
    /// Healthy in the superblocks, but its writes failed when failing it
    /// would have left fewer than K members: the reason the array refuses
    /// writes. Shown by `status`; never stored.
    Failing,
}

impl MemberState {
    /// The state as `status` spells it.
    pub fn name(self) -> &'static str {
        match self {
            MemberState::Healthy => "healthy",
            MemberState::Failed => "failed",
            MemberState::Missing => "missing",
            MemberState::Rebuilding => "rebuilding",
            MemberState::Stale => "stale",
            MemberState::Failing => "failing",
        }
    }

    fn code(self) -> u8 {
        match self {
            MemberState::Healthy => 0,
            MemberState::Failed => 1,
            MemberState::Missing => 2,
            MemberState::Rebuilding => 3,
            MemberState::Stale => 4,
            MemberState::Failing => unreachable!("failing is shown, never stored"),
        }
    }

    fn from_code(code: u8) -> MemberState {
        match code {
            0 => MemberState::Healthy,
            1 => MemberState::Failed,
            3 => MemberState::Rebuilding,
            4 => MemberState::Stale,
            _ => MemberState::Missing,
        }
    }
}

/// A member as opened: its name (for messages), identity and device.
pub struct Member {
    pub name: String,
    pub uuid: [u8; 16],
    pub device: Option<Arc<dyn Device>>,
    pub state: MemberState,
}

struct Entry {
    name: Mutex<String>,
    /// Its identity and device: both change when it is rebuilt onto a
    /// new device.
    uuid: Mutex<[u8; 16]>,
    device: RwLock<Option<Arc<dyn Device>>>,
    state: AtomicU8,
    errors: ErrorCounts,
    /// Its I/O since the array was opened (its device counts into it).
    io: Arc<IoCounts>,
}

/// What went wrong on one member since the array was opened.
#[derive(Default)]
struct ErrorCounts {
    read: AtomicU64,
    write: AtomicU64,
    checksum: AtomicU64,
    repaired: AtomicU64,
}

/// One member's error counters, for `status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct MemberErrors {
    /// Reads that failed (EIO, or the device gone).
    pub read_errors: u64,
    /// Writes or syncs that failed (the first fails the member).
    pub write_errors: u64,
    /// Chunks read back that did not match their checksum or their stripe.
    pub checksum_errors: u64,
    /// Chunks rewritten on it from their stripe.
    pub chunks_repaired: u64,
}

pub struct Members {
    entries: Vec<Entry>,
    parity: usize,
    /// The array's superblock as last written; its lock is held across
    /// superblock writes.
    superblock: Mutex<Superblock>,
    /// Why the array refuses writes, once more than M members are gone.
    lost: OnceLock<Lost>,
    /// Closed (`Array::close`): writes are refused, reads go on.
    closed: AtomicBool,
    /// Where member failures and refused writes are told.
    events: Arc<Events>,
    /// Devices given at open that are not members of this array.
    rejected: Vec<Rejected>,
    /// Read and checksum errors after which a member is failed (0: never).
    errors_max: u64,
}

fn io_error(member: usize, name: &str, source: std::io::Error) -> ArrayError {
    ArrayError::Io {
        member,
        name: name.to_string(),
        source,
    }
}

/// Writes `template` (with each member's index and uuid) to the primary
/// and backup superblock of every member in `targets`, in parallel; each
/// is synced before the backup is written. The volume table it names, if
/// any, is written (to the copy its generation goes with) and synced
/// first. Returns the members that failed.
pub(crate) fn write_superblocks(
    template: &Superblock,
    targets: &[(usize, [u8; 16], Arc<dyn Device>)],
) -> Vec<(usize, std::io::Error)> {
    let table = template.volume_table.as_ref().map(|t| {
        (
            t.encode(&template.array_uuid),
            crate::volume::VolumeTable::offset_for(template.generation),
        )
    });
    let write = |index: usize, uuid: [u8; 16], device: &Arc<dyn Device>| -> std::io::Result<()> {
        let mut sb = template.clone();
        sb.member_index = index;
        sb.member_uuid = uuid;
        let bytes = sb.encode();
        if let Some((table, offset)) = &table {
            device.write_at(table, *offset)?;
            device.sync()?;
        }
        device.write_at(&bytes, 0)?;
        device.sync()?;
        device.write_at(&bytes, template.geometry.backup_superblock_offset())?;
        device.sync()
    };
    std::thread::scope(|scope| {
        let handles: Vec<_> = targets
            .iter()
            .map(|(index, uuid, device)| (*index, scope.spawn(move || write(*index, *uuid, device))))
            .collect();
        handles
            .into_iter()
            .filter_map(|(index, handle)| {
                let result = handle
                    .join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("superblock write panicked")));
                result.err().map(|e| (index, e))
            })
            .collect()
    })
}

impl Members {
    pub fn new(
        members: Vec<Member>,
        superblock: Superblock,
        rejected: Vec<Rejected>,
        errors_max: u64,
        events: Arc<Events>,
    ) -> Members {
        Members {
            events,
            rejected,
            errors_max,
            parity: superblock.geometry.parity,
            entries: members
                .into_iter()
                .map(|m| {
                    let io = Arc::new(IoCounts::default());
                    Entry {
                        name: Mutex::new(m.name),
                        uuid: Mutex::new(m.uuid),
                        device: RwLock::new(m.device.map(|d| Counted::wrap(d, io.clone()))),
                        state: AtomicU8::new(m.state.code()),
                        errors: ErrorCounts::default(),
                        io,
                    }
                })
                .collect(),
            superblock: Mutex::new(superblock),
            lost: OnceLock::new(),
            closed: AtomicBool::new(false),
        }
    }

    /// Reads from member `index` with `read`; false if it is not readable
    /// or the read fails, which is counted against it.
    pub fn read(&self, index: usize, read: impl FnOnce(&dyn Device) -> std::io::Result<()>) -> bool {
        let Some(device) = self.readable(index) else {
            return false;
        };
        let ok = read(device.as_ref()).is_ok();
        if !ok {
            self.count_error(index, &self.entries[index].errors.read);
        }
        ok
    }

    /// A chunk read from member `index` was bad.
    pub fn checksum_error(&self, index: usize) {
        self.count_error(index, &self.entries[index].errors.checksum);
    }

    /// A chunk was rewritten on member `index`.
    pub fn repaired(&self, index: usize) {
        self.entries[index].errors.repaired.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one error; the one that reaches the limit (read and
    /// checksum errors together) fails the member, if the parity still
    /// covers one more. A member the parity cannot spare stays in.
    fn count_error(&self, index: usize, counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
        let errors = &self.entries[index].errors;
        let total = errors.read.load(Ordering::Relaxed) + errors.checksum.load(Ordering::Relaxed);
        if self.errors_max > 0 && total == self.errors_max {
            let _ = self.fail(index);
        }
    }

    /// Member `index`'s error counters.
    pub fn errors(&self, index: usize) -> MemberErrors {
        let e = &self.entries[index].errors;
        MemberErrors {
            read_errors: e.read.load(Ordering::Relaxed),
            write_errors: e.write.load(Ordering::Relaxed),
            checksum_errors: e.checksum.load(Ordering::Relaxed),
            chunks_repaired: e.repaired.load(Ordering::Relaxed),
        }
    }

    /// Member `index`'s I/O since the array was opened.
    pub fn io(&self, index: usize) -> IoTotals {
        self.entries[index].io.totals()
    }

    /// The device member `index` was opened with, whatever its state.
    pub fn device(&self, index: usize) -> Option<Arc<dyn Device>> {
        self.entries[index]
            .device
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn uuid(&self, index: usize) -> [u8; 16] {
        *self.entries[index].uuid.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Healthy members' identities and devices: where superblocks go.
    fn superblock_targets(&self) -> Vec<(usize, [u8; 16], Arc<dyn Device>)> {
        (0..self.count())
            .filter_map(|i| self.readable(i).map(|d| (i, self.uuid(i), d)))
            .collect()
    }

    /// Starts rebuilding member `index` (failed or missing) onto
    /// `device`, named `name` from now on: it is written (see
    /// [`Members::writable`]), not read. The superblocks still record it
    /// failed. `attach` hands the device to the member's writers, after
    /// the state is checked and before it changes (under the lock, so two
    /// rebuilds of one member cannot both attach).
    pub fn begin_rebuild(
        &self,
        index: usize,
        name: Option<String>,
        device: Arc<dyn Device>,
        attach: impl FnOnce(&Arc<dyn Device>),
    ) -> Result<(), ArrayError> {
        let _sb = self.superblock();
        match self.state(index) {
            MemberState::Healthy | MemberState::Failing => return Err(ArrayError::MemberHealthy { index }),
            MemberState::Rebuilding => return Err(ArrayError::RebuildRunning { index }),
            MemberState::Failed | MemberState::Missing | MemberState::Stale => {}
        }
        let device = Counted::wrap(device, self.entries[index].io.clone());
        attach(&device);
        *self.entries[index].device.write().unwrap_or_else(|p| p.into_inner()) = Some(device);
        if let Some(name) = name {
            *self.entries[index].name.lock().unwrap_or_else(|p| p.into_inner()) = name;
        }
        self.entries[index]
            .state
            .store(MemberState::Rebuilding.code(), Ordering::Release);
        Ok(())
    }

    /// Records member `index`, rebuilt, healthy under a new `uuid`: the
    /// next generation of superblocks, without it in the failed set, goes
    /// to the healthy members and to it, then it is read like any other.
    /// Refused if the rebuild was stopped (its device failed, or it was
    /// failed by hand); a superblock that cannot be written fails it.
    pub fn end_rebuild(&self, index: usize, uuid: [u8; 16]) -> Result<(), ArrayError> {
        let mut sb = self.superblock();
        let device = match (self.state(index), self.device(index)) {
            (MemberState::Rebuilding, Some(device)) => device,
            _ => return Err(ArrayError::RebuildStopped { index }),
        };
        let mut template = sb.clone();
        template.clear_failed(index);
        template.generation = sb.generation + 1;
        let mut targets = self.superblock_targets();
        targets.push((index, uuid, device));
        if let Some((member, error)) = write_superblocks(&template, &targets).into_iter().next() {
            self.entries[index]
                .state
                .store(MemberState::Failed.code(), Ordering::Release);
            return Err(io_error(member, &self.name(member), error));
        }
        *self.entries[index].uuid.lock().unwrap_or_else(|p| p.into_inner()) = uuid;
        self.entries[index]
            .state
            .store(MemberState::Healthy.code(), Ordering::Release);
        *sb = template;
        Ok(())
    }

    /// Devices `open` was given but left out, and why.
    pub fn rejected(&self) -> &[Rejected] {
        &self.rejected
    }

    pub fn count(&self) -> usize {
        self.entries.len()
    }

    pub fn name(&self, index: usize) -> String {
        self.entries[index]
            .name
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn state(&self, index: usize) -> MemberState {
        MemberState::from_code(self.entries[index].state.load(Ordering::Acquire))
    }

    /// The device of a healthy member.
    pub fn readable(&self, index: usize) -> Option<Arc<dyn Device>> {
        match self.state(index) {
            MemberState::Healthy => self.device(index),
            _ => None,
        }
    }

    /// Whether member `index` is read (healthy): [`Members::readable`]
    /// without taking its device.
    pub fn is_readable(&self, index: usize) -> bool {
        self.state(index) == MemberState::Healthy
    }

    /// Whether stripes are written to member `index`: it is healthy, or
    /// being rebuilt.
    pub fn writable(&self, index: usize) -> bool {
        matches!(self.state(index), MemberState::Healthy | MemberState::Rebuilding)
    }

    pub fn unavailable(&self) -> usize {
        (0..self.count())
            .filter(|&i| self.state(i) != MemberState::Healthy)
            .count()
    }

    /// Why writes are refused, once they are.
    pub fn lost(&self) -> Option<&Lost> {
        self.lost.get()
    }

    /// Fails with the reason writes are refused, if they are.
    pub fn check_writable(&self) -> Result<(), ArrayError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(ArrayError::Closed);
        }
        match self.lost() {
            Some(why) => Err(ArrayError::WritesRefused { why: why.clone() }),
            None => Ok(()),
        }
    }

    /// Refuses writes from now on, for `why` (the first reason stays),
    /// and tells the history.
    fn refuse_writes(&self, why: Lost) {
        let told = What::WritesRefused {
            why: why.to_string(),
            reason: Some(why.reason()),
        };
        if self.lost.set(why).is_ok() {
            self.events.record(told);
        }
    }

    /// Refuses every write and FLUSH from now on: the array was closed.
    pub fn close_for_writes(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// The volume table as the superblocks have it now.
    pub(crate) fn volume_table(&self) -> Arc<crate::volume::VolumeTable> {
        let superblock = self.superblock();
        superblock.volume_table.clone().unwrap_or_else(|| {
            Arc::new(crate::volume::VolumeTable::default_for(
                superblock.geometry.logical_bytes,
            ))
        })
    }

    /// Writes `table` with the next generation of superblocks.
    pub(crate) fn publish_table(&self, table: crate::volume::VolumeTable) -> Result<(), ArrayError> {
        self.check_writable()?;
        let mut superblock = self.superblock();
        let mut template = superblock.clone();
        template.volume_table_crc = table.crc();
        template.volume_table = Some(Arc::new(table));
        self.publish_locked(&mut superblock, template)
    }

    /// The superblock lock; held across superblock writes.
    pub fn superblock(&self) -> MutexGuard<'_, Superblock> {
        self.superblock.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Marks member `index` failed, as if pulled, and records it in the
    /// other members' superblocks. Refused if more than M would be gone.
    pub fn fail(&self, index: usize) -> Result<(), ArrayError> {
        self.fail_with(index, false)
    }

    /// [`Members::fail`], by hand: the superblocks that record it failed
    /// are also written to it (best effort), so that at the next open it
    /// is known to have been taken out (failed) rather than to have gone
    /// away and come back (stale, resynced by itself).
    pub fn set_aside(&self, index: usize) -> Result<(), ArrayError> {
        self.fail_with(index, true)
    }

    fn fail_with(&self, index: usize, mark_it: bool) -> Result<(), ArrayError> {
        if index >= self.count() {
            return Err(ArrayError::NoSuchMember {
                index,
                members: self.count(),
            });
        }
        let mut sb = self.superblock();
        match self.state(index) {
            MemberState::Healthy | MemberState::Failing => {}
            // Its rebuild stops; the superblocks already say failed.
            MemberState::Rebuilding => {
                self.entries[index]
                    .state
                    .store(MemberState::Failed.code(), Ordering::Release);
                return Ok(());
            }
            // Out already; taken out by hand, it is told so in its own
            // superblock, otherwise as it was: the checkpoint that names
            // is one it holds (the array's current one is not).
            MemberState::Stale if mark_it => {
                if let Some(device) = self.device(index) {
                    if let Ok(mut own) = read_superblock(device.as_ref()) {
                        own.set_failed(index);
                        let _ = write_superblocks(&own, &[(index, own.member_uuid, device)]);
                    }
                }
                self.entries[index]
                    .state
                    .store(MemberState::Failed.code(), Ordering::Release);
                return Ok(());
            }
            MemberState::Failed | MemberState::Missing | MemberState::Stale => return Ok(()),
        }
        self.mark_failed(index)?;
        let mut template = sb.clone();
        template.set_failed(index);
        self.publish_locked(&mut sb, template)?;
        self.events.record(What::MemberFailed {
            member: index,
            name: self.name(index),
            by_hand: mark_it,
        });
        if let (true, Some(device)) = (mark_it, self.device(index)) {
            // Under the lock, so the checkpoint it names is one published
            // while it was healthy (a resync trusts it; see rebuild.rs).
            let _ = write_superblocks(&sb, &[(index, self.uuid(index), device)]);
        }
        Ok(())
    }

    /// Records every member absent at open in the superblocks of the
    /// others, before anything is written: whatever is written from now
    /// on it will not hold, so if it comes back it is failed (stale), not
    /// taken for healthy. Nothing to do when none is missing.
    pub fn record_missing(&self) -> Result<(), ArrayError> {
        let mut sb = self.superblock();
        let missing: Vec<usize> = (0..self.count())
            .filter(|&i| self.state(i) == MemberState::Missing && !sb.is_failed(i))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let mut template = sb.clone();
        for &index in &missing {
            template.set_failed(index);
        }
        self.publish_locked(&mut sb, template)
    }

    /// Records log device `index` as failed in the superblocks, once.
    pub fn record_log_failed(&self, index: usize) -> Result<(), ArrayError> {
        let mut sb = self.superblock();
        if sb.log_failed & (1 << index) != 0 {
            return Ok(());
        }
        let mut template = sb.clone();
        template.log_failed |= 1 << index;
        self.publish_locked(&mut sb, template)
    }

    /// A member's write or sync failed: it is failed and recorded if the
    /// parity covers it; otherwise the array stops taking writes, for good.
    /// Returns whether writes are still taken.
    pub fn failed_io(&self, index: usize, error: &std::io::Error) -> Result<(), ArrayError> {
        self.entries[index].errors.write.fetch_add(1, Ordering::Relaxed);
        let result = self.fail(index);
        if let Err(ArrayError::TooManyFailed { failed, parity }) = &result {
            self.refuse_writes(Lost::MemberFailed {
                member: index,
                name: self.name(index),
                error: Arc::new(std::io::Error::new(error.kind(), error.to_string())),
                already: failed - 1,
                parity: *parity,
            });
            return self.check_writable();
        }
        result
    }

    /// Marks healthy member `index` failed in memory, if the parity still
    /// covers one more; the caller records it in the superblocks.
    fn mark_failed(&self, index: usize) -> Result<(), ArrayError> {
        let unavailable = self.unavailable();
        if unavailable + 1 > self.parity {
            return Err(ArrayError::TooManyFailed {
                failed: unavailable + 1,
                parity: self.parity,
            });
        }
        self.entries[index]
            .state
            .store(MemberState::Failed.code(), Ordering::Release);
        Ok(())
    }

    /// Writes `template` (with the next generation) to every healthy
    /// member's superblocks, and makes it the array's. A member whose
    /// superblock cannot be written is failed like any other, and recorded
    /// in a next generation written to the rest; more failures than the
    /// parity covers are an error, with the array's superblock unchanged.
    pub fn publish_locked(&self, current: &mut Superblock, mut template: Superblock) -> Result<(), ArrayError> {
        // Each round fails one more member or returns, and failing one
        // past the parity returns: this ends within parity + 1 rounds.
        loop {
            template.generation = current.generation.max(template.generation) + 1;
            let targets = self.superblock_targets();
            let failures = write_superblocks(&template, &targets);
            let Some((member, error)) = failures.into_iter().next() else {
                *current = template;
                return Ok(());
            };
            if let Err(e) = self.mark_failed(member) {
                self.refuse_writes(Lost::SuperblockUnwritten {
                    member,
                    name: self.name(member),
                    error: Arc::new(error),
                });
                return Err(e);
            }
            template.set_failed(member);
        }
    }

    /// Erases a chunk header sector on a healthy member (best effort: a
    /// member that cannot be written fails at the next sync).
    pub fn erase_sector(&self, member: usize, offset: u64) {
        if let Some(device) = self.readable(member) {
            let _ = device.write_at(&[0u8; SECTOR_BYTES], offset);
        }
    }
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
