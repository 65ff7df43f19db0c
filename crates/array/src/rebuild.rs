//! Rebuilding a member that is out (failed or missing) onto a device: the
//! same one come back, or a new one in its place, while clients go on.
//!
//! The log-structured layout makes this simple. When the rebuild starts,
//! the member is put in the `Rebuilding` state on the device: every stripe
//! sealed from then on (sequence `start` and up) is written to it in
//! full, like to any member, and synced with the others. Only the stripes
//! sealed before `start` lack their chunk there, and no stripe is ever
//! rewritten in place, so that list only shrinks: the rebuild takes each
//! in turn (in slot order), rebuilds it from K good chunks checked
//! against its Merkle root, and writes the chunk the member holds. Then
//! the superblocks say the member is healthy and it is read again. Until
//! then it is read from nowhere: reads of its chunks reconstruct them.
//!
//! A device that comes back holds most of its chunks already: with
//! `keep_current`, a chunk on it whose header names this stripe (array,
//! slot, sequence, index) and whose payload matches the leaf in that
//! header is kept, and only the others are rebuilt (a resync). The log
//! writes every stripe afresh under a new sequence, so what was written
//! while the member was away is exactly what fails this check; a torn or
//! rotten chunk fails it too. Reading one member's chunks costs about 1/K
//! of a rebuild's reads and writes nothing.
//!
//! Most of them need not even be read. A member's superblock is written
//! to it only while it is healthy, and names a map checkpoint only once
//! every stripe up to that checkpoint's sequence is synced to it. A device
//! whose superblock is this member's therefore holds every stripe still
//! live up to that sequence (none is rewritten in place): those are
//! trusted, and only the stripes sealed after it are checked. A rebuild
//! that does not trust a device erases any superblock it has before
//! writing to it, so a device written half-way as another member can
//! never pass for its old self. A member failed by hand first gets a
//! checkpoint ([`Array::fail_member`]), so when it returns only what was
//! written while it was away is looked at.
//!
//! # Guarantees
//!
//! - Clients read and write throughout. Each stripe is pinned while it is
//!   rebuilt (its slot is not reused meanwhile) and skipped if it was
//!   collected before; no lock is held across the I/O.
//! - Until the last step nothing on disk says the member is back: a
//!   rebuild stopped, killed or failed half-way leaves it failed.
//! - Resumable: every `SAVE_INTERVAL`, and when `progress` stops it, the
//!   device is synced and `save` is given a [`RebuildResume`] (the start
//!   sequence and the next slot); a
//!   rebuild given it back skips the stripes before that slot that are
//!   still the ones it saw (rebuilt and synced), and checks the rest with
//!   `keep_current`, so it goes on where the last one stopped.
//! - A write error on the device, or the member failed by hand, stops the
//!   rebuild with [`ArrayError::RebuildStopped`]; the member is failed,
//!   the array goes on degraded. More members may fail during it, up to M
//!   in all with this one: stripes are rebuilt from whatever K remain.
//! - While clients do I/O the rebuild keeps to `busy_rate`, otherwise to
//!   `rate` (each `None`: as fast as the members go).
//! - Its memory does not grow with the array: the stripes are counted
//!   first, then listed and rebuilt a chunk of slots at a time
//!   (`Catalog::slot_chunks`), the index's lock held for one chunk's list.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::device::{AlignedBuf, Device};
use crate::engine::Array;
use crate::engine::Shared;
use crate::error::ArrayError;
use crate::events::What;
use crate::format::ChunkHeader;
use crate::format::SECTOR_BYTES;
use crate::members::MemberState;
use crate::repair::{on_members, Throttle};
use crate::slots::{Pinned, SlotState};
use crate::stripe::Which;

/// Stripes a rebuild works on at once.
const REBUILD_BATCH: usize = 8;
/// How often a rebuild syncs its device and saves where it is.
const SAVE_INTERVAL: Duration = Duration::from_secs(1);

/// What a rebuild did (so far, while it runs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RebuildReport {
    /// The member being rebuilt.
    pub member: usize,
    /// Stripes sealed before it began (its 100%), and those dealt with.
    pub stripes_total: u64,
    pub stripes_done: u64,
    /// Of those done, stripes a resumed rebuild found already rebuilt.
    pub stripes_resumed: u64,
    /// Chunks written to the device (stripes with no chunk on this member
    /// have none).
    pub chunks_written: u64,
    pub bytes_written: u64,
    /// Chunks already current on the device, kept (resync).
    pub chunks_current: u64,
    /// Of those done, stripes the device held already by its own
    /// superblock's word, neither read nor written (resync).
    #[serde(default)]
    pub stripes_trusted: u64,
    /// Since it began.
    pub milliseconds: u64,
}

/// Where a rebuild stood when it last synced its device: what a later
/// one needs to go on from there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RebuildResume {
    pub member: usize,
    /// Stripes sealed from this sequence on were written to the device
    /// as they were sealed.
    pub start_sequence: u64,
    /// Every stripe below this slot sealed before `start_sequence` is
    /// rebuilt on the device, and synced.
    pub next_slot: u64,
}

/// How a rebuild runs.
#[derive(Clone, Debug, Default)]
pub struct RebuildOptions {
    /// The device's name from now on, in `status` and messages (`None`:
    /// the member's, for its own device come back).
    pub name: Option<String>,
    /// Keep chunks the device already holds for the current stripes.
    pub keep_current: bool,
    /// Bytes a second written at most while clients are idle (`None`:
    /// no limit).
    pub rate: Option<u64>,
    /// Bytes a second written at most while clients do I/O (`None`: as
    /// `rate`).
    pub busy_rate: Option<u64>,
    /// Where an earlier rebuild of this member onto this device stopped.
    pub resume: Option<RebuildResume>,
}

impl Array {
    /// The device member `index` has now, healthy or not (`None` if it
    /// was missing).
    pub fn member_device(&self, index: usize) -> Option<Arc<dyn Device>> {
        self.shared.stripes.members.device(index)
    }

    /// Whether member `index` can be rebuilt: it exists and is out (a
    /// healthy member has nothing to rebuild; one is rebuilt at a time).
    pub fn check_rebuildable(&self, index: usize) -> Result<(), ArrayError> {
        let members = &self.shared.stripes.members;
        if index >= members.count() {
            return Err(ArrayError::NoSuchMember {
                index,
                members: members.count(),
            });
        }
        match members.state(index) {
            MemberState::Healthy | MemberState::Failing => Err(ArrayError::MemberHealthy { index }),
            MemberState::Rebuilding => Err(ArrayError::RebuildRunning { index }),
            MemberState::Failed | MemberState::Missing | MemberState::Stale => Ok(()),
        }
    }

    /// The rebuild running now, its report so far (`None`: none runs).
    pub fn rebuild_progress(&self) -> Option<RebuildReport> {
        self.shared.jobs.rebuild.get()
    }

    /// Member `index`'s state now.
    pub fn member_state(&self, index: usize) -> MemberState {
        self.shared.stripes.members.state(index)
    }

    /// Rebuilds member `index` (failed or missing) onto `device` while the
    /// array serves, then records it healthy and reads it again; see the
    /// module's guarantees. Calls `progress` after each stripe (false
    /// stops the rebuild, leaving the member failed and `Ok` with the
    /// report so far), and `save` each time the device is synced (an
    /// error there stops the rebuild).
    pub fn rebuild_member(
        &self,
        index: usize,
        device: Arc<dyn Device>,
        options: &RebuildOptions,
        mut progress: impl FnMut(&RebuildReport) -> bool,
        mut save: impl FnMut(&RebuildResume) -> std::io::Result<()>,
    ) -> Result<RebuildReport, ArrayError> {
        let shared = &self.shared;
        let g = &shared.stripes.geometry;
        self.check_rebuildable(index)?;
        // It walks every slot.
        shared.deferred.finish()?;
        if device.size() < g.member_bytes {
            return Err(ArrayError::DeviceTooSmall {
                index,
                size: device.size(),
                need: g.member_bytes,
            });
        }
        let resume = options.resume.filter(|r| r.member == index);
        // One rebuild at a time: its report is the one `status` shows.
        let mut report = RebuildReport {
            member: index,
            ..RebuildReport::default()
        };
        let _running = shared
            .jobs
            .rebuild
            .begin(report)
            .map_err(|other| ArrayError::RebuildRunning { index: other.member })?;
        let found = crate::members::read_superblock(device.as_ref()).ok();
        let trusted = found
            .as_ref()
            .filter(|_| options.keep_current || resume.is_some())
            .and_then(|sb| trusted_through(shared, index, sb));
        if trusted.is_none() && found.is_some() {
            // What it claims to be no longer holds once this member's
            // chunks are written over it: a later resync must not trust it.
            forget_superblocks(device.as_ref(), g).map_err(|source| device_error(index, source))?;
        }
        // From here on every stripe sealed is written to the device too.
        shared
            .stripes
            .members
            .begin_rebuild(index, options.name.clone(), device.clone(), |device| {
                shared.stripes.io.attach(index, device.clone())
            })?;
        shared.events.record(What::RebuildStarted {
            member: index,
            name: shared.stripes.members.name(index),
        });
        let ended = |report: &RebuildReport, error: Option<&ArrayError>| {
            shared.events.record(What::RebuildEnded {
                member: index,
                stripes_done: report.stripes_done,
                stripes_total: report.stripes_total,
                error: error.map(ToString::to_string),
            })
        };
        let start_sequence = shared.lanes.tracker.last_sequence() + 1;
        // Those sealed before, once written, are the work.
        shared.lanes.tracker.wait_written(start_sequence - 1);
        // Counted first, then listed and rebuilt a chunk of slots at a
        // time: a list of every stripe would cost 16 bytes each (3 GB at
        // 100 TiB of 8+2). A stripe freed before its chunk is listed needs
        // no rebuild, and leaves the total.
        let is_trusted = |sequence: u64| trusted.is_some_and(|through| sequence <= through);
        let (mut held, mut work) = (0, 0);
        shared.catalog.walk_slots(0..g.slot_count(), |index, slot, s| {
            if on_members(index, slot, s) && s.sequence < start_sequence {
                match is_trusted(s.sequence) {
                    true => held += 1,
                    false => work += 1,
                }
            }
        });
        report.stripes_trusted = held;
        report.stripes_done = held;
        report.stripes_total = held + work;
        shared.jobs.rebuild.set(report);
        let run = Run {
            index,
            device: &device,
            options,
            resume,
            start_sequence,
        };
        let mut pace = Pace::new(options);
        let mut rebuilt = Ok(true);
        for range in shared.catalog.slot_chunks() {
            let stripes = shared.catalog.slots_where(range, |index, slot, s| {
                on_members(index, slot, s) && s.sequence < start_sequence && !is_trusted(s.sequence)
            });
            rebuilt = shared.rebuild_stripes(&run, &stripes, &mut report, &mut progress, &mut save, &mut pace);
            if !matches!(rebuilt, Ok(true)) {
                break;
            }
        }
        if matches!(rebuilt, Ok(true)) {
            report.stripes_total = report.stripes_done;
        }
        match rebuilt {
            Ok(true) => {}
            Ok(false) => {
                // Stopped by the caller: failed again, as it began.
                let _ = shared.stripes.members.fail(index);
                ended(&report, None);
                return Ok(report);
            }
            Err(error) => {
                let _ = shared.stripes.members.fail(index);
                ended(&report, Some(&error));
                return Err(error);
            }
        }
        // Log blocks a returning device holds from before it left are
        // stale (what the log held was replayed into stripes at open):
        // none may be read as this member's when it counts again. It took
        // no log blocks while being rebuilt.
        let finish = crate::intent::clear_log_area(&*device, g)
            .and_then(|()| device.sync())
            .map_err(|source| device_error(index, source))
            .and_then(|()| shared.stripes.members.end_rebuild(index, rand::random()));
        if let Err(error) = finish {
            let _ = shared.stripes.members.fail(index);
            ended(&report, Some(&error));
            return Err(error);
        }
        ended(&report, None);
        Ok(report)
    }
}

/// A rebuild's pace over its chunks of slots: its throttle, when it
/// began, and when it last saved where it was.
struct Pace {
    throttle: Throttle,
    started: Instant,
    saved: Instant,
}

impl Pace {
    fn new(options: &RebuildOptions) -> Pace {
        Pace {
            throttle: Throttle::new(options.rate, options.busy_rate.or(options.rate)),
            started: Instant::now(),
            saved: Instant::now(),
        }
    }
}

/// One stripe of a batch: what it did, or the error that stops the rebuild.
struct Job {
    slot: u64,
    sequence: u64,
    resumed: bool,
    done: RebuildReport,
    result: Result<(), ArrayError>,
}

/// One rebuild: the member, its device, and what it was asked.
struct Run<'a> {
    index: usize,
    device: &'a Arc<dyn Device>,
    options: &'a RebuildOptions,
    resume: Option<RebuildResume>,
    /// Stripes from this sequence on are written to the device as sealed.
    start_sequence: u64,
}

impl Shared {
    /// The rebuild's loop over `stripes` (slot, sequence, in slot order:
    /// a chunk of the slots); true once all are done, false if `progress`
    /// stopped it.
    fn rebuild_stripes(
        &self,
        run: &Run,
        stripes: &[(u64, u64)],
        report: &mut RebuildReport,
        progress: &mut impl FnMut(&RebuildReport) -> bool,
        save: &mut impl FnMut(&RebuildResume) -> std::io::Result<()>,
        pace: &mut Pace,
    ) -> Result<bool, ArrayError> {
        let Run {
            index,
            device,
            resume,
            start_sequence,
            ..
        } = *run;
        let io_error = |source| device_error(index, source);
        let Pace {
            throttle,
            started,
            saved,
        } = pace;
        for batch in stripes.chunks(REBUILD_BATCH) {
            if self.stripes.members.state(index) != MemberState::Rebuilding {
                return Err(ArrayError::RebuildStopped { index });
            }
            // Rebuilt and synced by the run that saved `resume`.
            let mut jobs: Vec<Job> = batch
                .iter()
                .map(|&(slot, sequence)| Job {
                    slot,
                    sequence,
                    resumed: resume.is_some_and(|r| slot < r.next_slot && sequence < r.start_sequence),
                    done: RebuildReport::default(),
                    result: Ok(()),
                })
                .collect();
            // The stripes of a batch at once: each waits on K reads and a
            // write, which one at a time would leave the members idle.
            // (On the rayon pool: each stripe fans out its chunk reads on
            // the read threads, which must not wait on their own.)
            self.stripes.io_pool.scope(|scope| {
                for job in jobs.iter_mut() {
                    scope.spawn(move |_| {
                        if !job.resumed {
                            job.result = self.rebuild_chunks(run, job.slot, job.sequence, &mut job.done);
                        }
                    });
                }
            });
            for job in jobs {
                job.result?;
                report.stripes_resumed += u64::from(job.resumed);
                report.chunks_written += job.done.chunks_written;
                report.bytes_written += job.done.bytes_written;
                report.chunks_current += job.done.chunks_current;
                report.stripes_done += 1;
                report.milliseconds = started.elapsed().as_millis() as u64;
                self.jobs.rebuild.set(*report);
                throttle.step(job.done.bytes_written, &self.stripes.counters);
                let go_on = progress(report);
                // Saved now and then, and where a stop leaves it.
                if saved.elapsed() >= SAVE_INTERVAL || !go_on {
                    *saved = Instant::now();
                    device.sync().map_err(io_error)?;
                    let at = RebuildResume {
                        member: index,
                        // Stripes sealed since an earlier run's start,
                        // below this slot, were checked by this one.
                        start_sequence,
                        next_slot: job.slot + 1,
                    };
                    save(&at).map_err(io_error)?;
                }
                if !go_on {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Writes to the run's device the chunks its member holds of the
    /// stripe `sequence` in `slot`, if it is still there (rebuilt from the
    /// other members; those the device holds already are kept when asked,
    /// and on a resumed run).
    fn rebuild_chunks(
        &self,
        run: &Run,
        slot: u64,
        sequence: u64,
        report: &mut RebuildReport,
    ) -> Result<(), ArrayError> {
        let (index, device) = (run.index, run.device);
        let keep_current = run.options.keep_current || run.resume.is_some();
        let g = &self.stripes.geometry;
        let mut pinned = Pinned::new(&self.catalog.pins);
        {
            let index = self.catalog.index();
            let s = index.slots.get(slot);
            // Collected since (its new stripe, if any, went to the device
            // as it was sealed).
            if !matches!(s.state, SlotState::Sealed | SlotState::Checkpoint) || s.sequence != sequence {
                return Ok(());
            }
            pinned.add(slot);
        }
        let which = Which {
            slot,
            sequence,
            array_uuid: self.stripes.array_uuid,
        };
        // Aligned, for direct I/O: a header to write, and (to check what
        // the device holds) a chunk to read.
        let mut header = AlignedBuf::zeroed(SECTOR_BYTES);
        let mut chunk = keep_current.then(|| AlignedBuf::zeroed(g.chunk_bytes));
        let stale: Vec<usize> = (0..g.width())
            .filter(|&j| g.place(slot, j).0 == index)
            .filter(|&j| {
                let current = chunk
                    .as_mut()
                    .is_some_and(|chunk| current_chunk(self, device.as_ref(), which, j, &mut header, chunk));
                report.chunks_current += u64::from(current);
                !current
            })
            .collect();
        if stale.is_empty() {
            return Ok(());
        }
        let rebuilt = self.stripes.rebuild_stripe(slot, sequence, false)?;
        for j in stale {
            let (bytes, payload) = rebuilt.chunk(g, j);
            header.copy_from_slice(&bytes);
            device
                .write_vectored_at(&[&*header, payload], g.row_offset(g.place(slot, j).1))
                .map_err(|source| device_error(index, source))?;
            report.chunks_written += 1;
            report.bytes_written += (SECTOR_BYTES + payload.len()) as u64;
        }
        // Bad chunks found on other members on the way are fixed too.
        self.stripes.repair(slot, &rebuilt);
        self.stripes.recycle_area(Arc::new(rebuilt.area));
        Ok(())
    }
}

/// An I/O error on the device member `index` is being rebuilt onto.
fn device_error(index: usize, source: std::io::Error) -> ArrayError {
    ArrayError::Io {
        member: index,
        name: format!("the device rebuilding member {index}"),
        source,
    }
}

/// The sequence through which a device whose superblock is `sb` holds,
/// as member `index`, the chunk of every stripe still live: the
/// checkpoint that superblock names. That superblock was written to it, while it was healthy, only
/// once every stripe up to the checkpoint was synced to it; no stripe is
/// rewritten in place, so those still in the map are as it holds them.
/// `None` if the superblock is not this member's (a rebuild erases the
/// superblock of any other device it writes to, so a device rebuilt half
/// way as another member cannot claim to be this one).
fn trusted_through(shared: &Shared, index: usize, sb: &crate::format::Superblock) -> Option<u64> {
    // (Its own failed bit may be set: a member failed by hand is told so,
    // with the checkpoint it had.)
    let ours = sb.array_uuid == shared.stripes.array_uuid
        && sb.member_index == index
        && sb.geometry == shared.stripes.geometry;
    ours.then_some(sb.checkpoint.as_ref()?.sequence)
}

/// Zeroes `device`'s superblocks (both copies, and the last sector, where
/// a larger device's backup is looked for), then syncs it.
fn forget_superblocks(device: &dyn Device, g: &crate::format::Geometry) -> std::io::Result<()> {
    let zero = AlignedBuf::zeroed(SECTOR_BYTES);
    let sector = SECTOR_BYTES as u64;
    let mut offsets = vec![0, g.backup_superblock_offset()];
    if device.size() >= sector && device.size() - sector != g.backup_superblock_offset() {
        offsets.push(device.size() - sector);
    }
    for offset in offsets {
        device.write_at(&zero, offset)?;
    }
    device.sync()
}

/// Whether `device` holds chunk `j` of stripe `which` as sealed: its
/// header decodes and names that stripe and index, and its payload
/// matches the header's leaf. `header` and `chunk` are scratch space.
fn current_chunk(
    shared: &Shared,
    device: &dyn Device,
    which: Which,
    j: usize,
    header: &mut AlignedBuf,
    chunk: &mut AlignedBuf,
) -> bool {
    let g = &shared.stripes.geometry;
    let offset = g.row_offset(g.place(which.slot, j).1);
    if device
        .read_vectored_at(&mut [&mut **header, &mut **chunk], offset)
        .is_err()
    {
        return false;
    }
    ChunkHeader::decode(header, g.checksum).is_ok_and(|h| {
        h.slot == which.slot
            && h.sequence == which.sequence
            && h.index == j
            && h.array_uuid == which.array_uuid
            && h.leaf == tessera_checksum::merkle::leaf(g.checksum, j, chunk)
    })
}
