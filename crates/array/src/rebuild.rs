//! Rebuilding a member that is out (failed or missing) onto a device: the
//! same one come back, or a new one in its place. Every stripe on the
//! members is rebuilt from K good chunks and checked against its Merkle
//! root, and the chunk the member holds is written to the device; then
//! the superblocks (the device's first) say the member is healthy again.
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
//! # Guarantees
//!
//! - Offline only: the array must not be written meanwhile (no clients,
//!   no background work, `EngineOptions::background` off). A write during
//!   the rebuild is found (the log's sequence moved) and the member is
//!   left failed: a stripe it missed would make it look whole when it is
//!   not.
//! - Until the last step nothing says the member is back: a rebuild
//!   stopped or killed half-way leaves it failed. Run again with
//!   `keep_current` on the same device, it keeps the chunks already
//!   written (they pass the check above) and goes on with the rest.
//! - The `Array` it ran on still holds the member as failed; reopen it.

use std::sync::Arc;

use crate::device::{AlignedBuf, Device};
use crate::engine::Array;
use crate::engine::Shared;
use crate::format::ChunkHeader;
use crate::format::SECTOR_BYTES;
use crate::members::MemberState;
use crate::repair::{stripes_on_members, Pace};
use crate::slots::Pinned;
use crate::stripe::Which;
use crate::ArrayError;

/// What a rebuild did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RebuildReport {
    /// Stripes on the members when it began (its 100%).
    pub stripes_total: u64,
    pub stripes_done: u64,
    /// Chunks written to the device (stripes with no chunk on this member
    /// have none).
    pub chunks_written: u64,
    pub bytes_written: u64,
    /// Chunks already current on the device, kept (resync).
    pub chunks_current: u64,
}

impl Array {
    /// The device member `index` was opened with, healthy or not (`None`
    /// if it was missing).
    pub fn member_device(&self, index: usize) -> Option<Arc<dyn Device>> {
        self.shared.members.device(index)
    }

    /// Whether member `index` can be rebuilt: it exists and is out (a
    /// healthy member has nothing to rebuild).
    pub fn check_rebuildable(&self, index: usize) -> Result<(), ArrayError> {
        let members = &self.shared.members;
        if index >= members.count() {
            return Err(ArrayError::NoSuchMember {
                index,
                members: members.count(),
            });
        }
        if members.state(index) == MemberState::Healthy {
            return Err(ArrayError::MemberHealthy { index });
        }
        Ok(())
    }

    /// Rebuilds member `index` (failed or missing) onto `device`, at most
    /// `rate` bytes a second written, calling `progress` after each stripe
    /// (false stops it, leaving the member failed); then records it
    /// healthy. With `keep_current`, chunks the device already holds for
    /// the current stripes are kept (a resync). See the module's
    /// guarantees: offline only, reopen after.
    pub fn rebuild_member(
        &self,
        index: usize,
        device: Arc<dyn Device>,
        keep_current: bool,
        rate: Option<u64>,
        mut progress: impl FnMut(&RebuildReport) -> bool,
    ) -> Result<RebuildReport, ArrayError> {
        let shared = &self.shared;
        let g = &shared.geometry;
        self.check_rebuildable(index)?;
        if device.size() < g.member_bytes {
            return Err(ArrayError::DeviceTooSmall {
                index,
                size: device.size(),
                need: g.member_bytes,
            });
        }
        let written_before = shared.tracker.last_sequence();
        let stripes = stripes_on_members(shared);
        let mut report = RebuildReport {
            stripes_total: stripes.len() as u64,
            ..RebuildReport::default()
        };
        let io_error = |source| ArrayError::Io {
            member: index,
            name: format!("the device rebuilding member {index}"),
            source,
        };
        let pace = Pace::new(rate);
        let mut header = AlignedBuf::zeroed(SECTOR_BYTES);
        let mut chunk = AlignedBuf::zeroed(g.chunk_bytes);
        for (slot, sequence) in stripes {
            let mut pinned = Pinned::new(&shared.pins);
            pinned.add(slot);
            let stale: Vec<usize> = (0..g.width())
                .filter(|&j| g.place(slot, j).0 == index)
                .filter(|&j| {
                    let which = Which {
                        slot,
                        sequence,
                        array_uuid: shared.array_uuid,
                    };
                    let current =
                        keep_current && current_chunk(shared, device.as_ref(), which, j, &mut header, &mut chunk);
                    report.chunks_current += u64::from(current);
                    !current
                })
                .collect();
            if !stale.is_empty() {
                let rebuilt = shared.rebuild_stripe(slot, sequence, false)?;
                for j in stale {
                    let (bytes, payload) = rebuilt.chunk(g, j);
                    header.copy_from_slice(&bytes);
                    device
                        .write_vectored_at(&[&header, payload], g.row_offset(g.place(slot, j).1))
                        .map_err(io_error)?;
                    report.chunks_written += 1;
                    report.bytes_written += (SECTOR_BYTES + payload.len()) as u64;
                }
                // Bad chunks found on other members on the way are fixed too.
                shared.repair(slot, &rebuilt);
                shared.recycle_area(Arc::new(rebuilt.area));
            }
            report.stripes_done += 1;
            pace.wait(report.bytes_written);
            if !progress(&report) {
                return Ok(report);
            }
        }
        // Log blocks a returning device holds from before it left are
        // stale (what the log held was replayed into stripes at open):
        // none may be read as this member's when it counts again.
        crate::intent::clear_log_area(&*device, g).map_err(io_error)?;
        device.sync().map_err(io_error)?;
        if shared.tracker.last_sequence() != written_before {
            return Err(ArrayError::WrittenDuringRebuild { index });
        }
        shared.members.readmit(index, rand::random(), device)?;
        Ok(report)
    }
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
    let g = &shared.geometry;
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
