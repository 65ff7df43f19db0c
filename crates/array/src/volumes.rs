//! Volumes of an open array: creating, resizing, deleting and listing
//! them, and the [`Volume`] handle clients read and write one through.
//! The table's format and the key space are `crate::volume`.
//!
//! # Guarantees
//!
//! - A volume operation returns once the new table is on the members
//!   (with the superblocks that name it); a crash before leaves the old.
//! - Deleting a volume frees its space through garbage collection: its
//!   mappings leave the map at once (the slots' live counts fall), its
//!   records stay in their stripes until those are collected, and are
//!   never mapped again (their volume is gone, or older than a new one
//!   with its id). Other volumes are not touched.
//! - Every request through a [`Volume`] is checked against its size as
//!   it is now, under its gate: none runs while the volume is resized or
//!   deleted, and none reaches a volume deleted.

use crate::engine::{Array, Shared};
use crate::error::ArrayError;
use crate::format::BLOCK_BYTES;
use crate::index::Floors;
use crate::volume::{self, VolumeEntry, VolumeTable, VOLUME_BYTES_MAX, VOLUME_COUNT_MAX};
use std::collections::HashMap;
use std::sync::RwLock;
use std::sync::{Arc, Mutex, MutexGuard};

/// The volumes' gates, by id, and the lock that lets one volume operation
/// (create, resize, delete; a clean stop) run at a time, held across its
/// superblock writes. Taken in that order: the operation's lock, then the
/// gates' map (a leaf, held only to look up, add or remove a gate), then
/// a gate's own lock.
pub(crate) struct Gates {
    operation: Mutex<()>,
    by_id: Mutex<HashMap<u32, Arc<Gate>>>,
}

impl Gates {
    /// A gate for every volume of `table`.
    pub fn of(table: &VolumeTable) -> Gates {
        Gates {
            operation: Mutex::new(()),
            by_id: Mutex::new(table.entries.iter().map(|e| (e.id, Gate::new(e.id, e.bytes))).collect()),
        }
    }

    /// The one volume operation allowed at a time.
    pub fn operation(&self) -> MutexGuard<'_, ()> {
        self.operation.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn by_id(&self) -> MutexGuard<'_, HashMap<u32, Arc<Gate>>> {
        self.by_id.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, id: u32) -> Option<Arc<Gate>> {
        self.by_id().get(&id).cloned()
    }

    fn add(&self, id: u32, bytes: u64) {
        self.by_id().insert(id, Gate::new(id, bytes));
    }

    fn remove(&self, id: u32) {
        self.by_id().remove(&id);
    }

    /// Every gate, by id.
    pub fn all(&self) -> Vec<Arc<Gate>> {
        let mut gates: Vec<Arc<Gate>> = self.by_id().values().cloned().collect();
        gates.sort_by_key(|g| g.id);
        gates
    }
}

/// One volume of an open array: its requests, at offsets within it.
#[derive(Clone)]
pub struct Volume {
    shared: Arc<Shared>,
    gate: Arc<Gate>,
    name: String,
    /// Its requests count as clients' (background work yields to them).
    client: bool,
}

impl Volume {
    /// The same volume, for background work: its requests are not counted
    /// as clients', so that work pacing itself behind clients does not
    /// take its own requests for theirs.
    pub fn background(&self) -> Volume {
        Volume {
            client: false,
            ..self.clone()
        }
    }

    fn client_request(&self) {
        if self.client {
            self.shared.client_request();
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its size now (0 once deleted).
    pub fn size(&self) -> u64 {
        self.gate.size.read().unwrap_or_else(|p| p.into_inner()).unwrap_or(0)
    }

    /// Runs `op` at the key-space byte offset of `offset`, once
    /// [offset, offset+len) is checked against the volume's size, holding
    /// its gate shared.
    fn within<T>(&self, offset: u64, len: u64, op: impl FnOnce(u64) -> Result<T, ArrayError>) -> Result<T, ArrayError> {
        let size = self.gate.size.read().unwrap_or_else(|p| p.into_inner());
        let Some(size) = *size else {
            return Err(ArrayError::VolumeGone {
                name: self.name.clone(),
            });
        };
        match offset.checked_add(len) {
            Some(end) if end <= size => {}
            _ => return Err(ArrayError::OutOfRange { offset, len, size }),
        }
        let base = volume::key(self.gate.id, 0) * BLOCK_BYTES as u64;
        op(base + offset)
    }

    /// Reads `buf.len()` bytes at byte `offset` of the volume.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ArrayError> {
        self.client_request();
        self.within(offset, buf.len() as u64, |at| self.shared.read(at, buf))?;
        self.gate.io.add(false, buf.len());
        Ok(())
    }

    /// Writes `data` at byte `offset`; with `fua`, returns once it is durable.
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ArrayError> {
        self.client_request();
        self.within(offset, data.len() as u64, |at| self.shared.write(at, data, fua))?;
        self.gate.io.add(true, data.len());
        Ok(())
    }

    /// Makes `len` bytes at `offset` read as zeros and frees their space
    /// (TRIM and WRITE_ZEROES alike: discarded blocks read as zeros).
    pub fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), ArrayError> {
        self.client_request();
        self.within(offset, len, |at| self.shared.write_zeroes(at, len, fua))
    }

    /// FLUSH: returns once every write that returned before it is durable
    /// (the whole array's: one sync covers every volume).
    pub fn flush(&self) -> Result<(), ArrayError> {
        self.client_request();
        self.within(0, 0, |_| self.shared.flush())
    }

    /// Makes the next reads of [offset, offset+len) cheap: degraded
    /// stripes there are rebuilt into the reconstruction cache now.
    pub fn prefetch(&self, offset: u64, len: u64) -> Result<(), ArrayError> {
        self.within(offset, len, |at| self.shared.prefetch(at, len))
    }

    /// Which of bytes [offset, offset+len) are stored: consecutive runs
    /// from `offset` covering the range, `(bytes, true)` where blocks map
    /// to data, `(bytes, false)` where they read as zeros and hold no
    /// space (never written, trimmed, or zeroed). What NBD's
    /// `base:allocation` reports.
    pub fn allocation(&self, offset: u64, len: u64) -> Result<Vec<(u64, bool)>, ArrayError> {
        self.within(offset, len, |at| self.shared.reader().allocation(at, len))
    }
}

impl Shared {
    /// Every volume, by id, with what it maps and stores.
    pub(crate) fn volume_statuses(&self) -> Vec<VolumeStatus> {
        let table = self.stripes.members.volume_table();
        let io: HashMap<u32, crate::device::IoTotals> = self
            .volumes
            .all()
            .iter()
            .map(|gate| (gate.id, gate.io.totals()))
            .collect();
        let index = self.catalog.index();
        table
            .entries
            .iter()
            .map(|e| {
                let (blocks, stored_bytes) = index.slots.volume_usage(e.id);
                VolumeStatus {
                    id: e.id,
                    name: e.name.clone(),
                    bytes: e.bytes,
                    mapped_bytes: blocks * BLOCK_BYTES as u64,
                    stored_bytes,
                    io: io.get(&e.id).copied().unwrap_or_default(),
                }
            })
            .collect()
    }

    /// Where volume `name` is in `table`, and its gate.
    fn find(&self, table: &VolumeTable, name: &str) -> Result<(usize, Arc<Gate>), ArrayError> {
        let no_such = || ArrayError::NoSuchVolume { name: name.to_string() };
        let at = table.entries.iter().position(|e| e.name == name).ok_or_else(no_such)?;
        let gate = self.volumes.get(table.entries[at].id).ok_or_else(no_such)?;
        Ok((at, gate))
    }
}

/// The volume called `name` of the array `shared` is.
pub(crate) fn open_volume(shared: &Arc<Shared>, name: &str) -> Result<Volume, ArrayError> {
    let (_, gate) = shared.find(&shared.stripes.members.volume_table(), name)?;
    Ok(Volume {
        shared: shared.clone(),
        gate,
        name: name.to_string(),
        client: true,
    })
}

fn check_size(bytes: u64) -> Result<(), ArrayError> {
    if bytes == 0 || bytes > VOLUME_BYTES_MAX || !bytes.is_multiple_of(BLOCK_BYTES as u64) {
        return Err(ArrayError::BadVolumeSize { bytes });
    }
    Ok(())
}

impl Array {
    /// The volume called `name`.
    pub fn volume(&self, name: &str) -> Result<Volume, ArrayError> {
        open_volume(&self.shared, name)
    }

    /// Every volume, by id, with what it maps and stores.
    pub fn volumes(&self) -> Vec<VolumeStatus> {
        self.shared.volume_statuses()
    }

    /// Creates a thin volume of `bytes` (a multiple of 4 KiB, at most 4
    /// PiB); it reads as zeros and takes no space until written.
    pub fn create_volume(&self, name: &str, bytes: u64) -> Result<Volume, ArrayError> {
        let shared = &self.shared;
        if !volume::valid_name(name) {
            return Err(ArrayError::BadVolumeName { name: name.to_string() });
        }
        check_size(bytes)?;
        let _one = shared.volumes.operation();
        let mut table = (*shared.stripes.members.volume_table()).clone();
        if table.find(name).is_some() {
            return Err(ArrayError::VolumeExists { name: name.to_string() });
        }
        let id = table.free_id().ok_or(ArrayError::TooManyVolumes {
            count: VOLUME_COUNT_MAX,
        })?;
        // Newer than every record its id may have from a deleted volume.
        let created_version = {
            let mut index = shared.catalog.index_mut();
            index.next_version += 1;
            index.next_version - 1
        };
        table.entries.push(VolumeEntry {
            id,
            name: name.to_string(),
            bytes,
            created_version,
        });
        table.entries.sort_by_key(|e| e.id);
        let floors = Floors::of(&table);
        shared.stripes.members.publish_table(table)?;
        shared.catalog.index_mut().volumes = floors;
        shared.volumes.add(id, bytes);
        self.volume(name)
    }

    /// Changes a volume's size. Growing adds blocks that read as zeros;
    /// shrinking first zeroes the blocks cut off (so that growing again
    /// finds zeros there), waiting for the volume's requests in flight.
    pub fn resize_volume(&self, name: &str, bytes: u64) -> Result<(), ArrayError> {
        let shared = &self.shared;
        check_size(bytes)?;
        let _one = shared.volumes.operation();
        let mut table = (*shared.stripes.members.volume_table()).clone();
        let (at, gate) = shared.find(&table, name)?;
        let entry = &mut table.entries[at];
        let mut size = gate.size.write().unwrap_or_else(|p| p.into_inner());
        let old = entry.bytes;
        if bytes < old {
            let base = volume::key(entry.id, 0) * BLOCK_BYTES as u64;
            shared.write_zeroes(base + bytes, old - bytes, false)?;
            shared.flush()?;
        }
        entry.bytes = bytes;
        shared.stripes.members.publish_table(table)?;
        *size = Some(bytes);
        Ok(())
    }

    /// Deletes a volume: its requests in flight finish first, later ones
    /// get `VolumeGone`; its space is freed by garbage collection. The
    /// default volume cannot be deleted.
    pub fn delete_volume(&self, name: &str) -> Result<(), ArrayError> {
        let shared = &self.shared;
        if name == volume::DEFAULT_VOLUME_NAME {
            return Err(ArrayError::DefaultVolume { name: name.to_string() });
        }
        let _one = shared.volumes.operation();
        let mut table = (*shared.stripes.members.volume_table()).clone();
        let (at, gate) = shared.find(&table, name)?;
        let id = table.entries.remove(at).id;
        let mut size = gate.size.write().unwrap_or_else(|p| p.into_inner());
        let floors = Floors::of(&table);
        shared.stripes.members.publish_table(table)?;
        *size = None;
        drop(size);
        shared.volumes.remove(id);
        // Every page of the volume in memory, to be emptied (what they
        // point into is counted down).
        let whole = (volume::key(id, 0), volume::key(id + 1, 0));
        let _pages = shared.catalog.pin_pages(&[whole])?;
        let mut index = shared.catalog.index_mut();
        index.volumes = floors;
        let deltas = index.map.remove_from(volume::key(id, 0), volume::key(id + 1, 0));
        let emptied = index.slots.account(&deltas);
        index.drain_emptied_now(emptied);
        drop(index);
        shared.maintenance.wake();
        Ok(())
    }
}

/// A volume's gate: its size while it exists, `None` once deleted. Client
/// requests hold it shared for their length; deleting or resizing the
/// volume holds it exclusively.
#[derive(Debug)]
pub struct Gate {
    pub id: u32,
    pub size: RwLock<Option<u64>>,
    /// The volume's client reads and writes since the array was opened.
    pub io: crate::device::IoCounts,
}

impl Gate {
    pub fn new(id: u32, bytes: u64) -> Arc<Gate> {
        Arc::new(Gate {
            id,
            size: RwLock::new(Some(bytes)),
            io: Default::default(),
        })
    }
}

/// A volume's report for `status` and `tessera volume list`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VolumeStatus {
    pub id: u32,
    pub name: String,
    pub bytes: u64,
    /// Bytes of its blocks that map to data.
    pub mapped_bytes: u64,
    /// Bytes those blocks take in stripes (after compression).
    pub stored_bytes: u64,
    /// Its clients' reads and writes of data since the array was opened
    /// (not TRIM, WRITE_ZEROES or FLUSH).
    #[serde(default)]
    pub io: crate::device::IoTotals,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::key;

    #[test]
    fn floors_refuse_deleted_and_older_volumes() {
        let entry = |id, created_version| VolumeEntry {
            id,
            name: format!("v{id}"),
            bytes: 1 << 30,
            created_version,
        };
        let floors = Floors::of(&VolumeTable {
            entries: vec![entry(0, 0), entry(1, 812)],
        });
        assert!(floors.admits(key(0, 5), 1));
        assert!(floors.admits(key(1, 5), 812));
        assert!(!floors.admits(key(1, 5), 811), "a deleted volume 1's record");
        assert!(!floors.admits(key(2, 0), 9999), "no volume 2");
        assert_eq!(floors.newest(), 812);
    }
}
