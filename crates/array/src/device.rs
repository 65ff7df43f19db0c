//! Member devices: the one I/O seam.
//!
//! Every byte the array reads or writes goes through [`Device`], so tests
//! put [`MemoryDevice`] (with injected read errors, bit flips, lost writes
//! and crashes) under the real array, and production uses [`FileDevice`]
//! for files and block devices alike.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;

/// A member device: positioned reads and writes, and a barrier.
pub trait Device: Send + Sync {
    /// Fills `buf` from `offset`, or fails.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`, or fails.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Returns once every completed write is on stable storage.
    fn sync(&self) -> io::Result<()>;
    /// Size in bytes.
    fn size(&self) -> u64;
}

/// A file or block device.
pub struct FileDevice {
    file: File,
    size: u64,
}

impl FileDevice {
    /// Creates a sparse file of `size` bytes; refuses to overwrite one.
    pub fn create(path: &Path, size: u64) -> io::Result<FileDevice> {
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(path)?;
        file.set_len(size)?;
        Ok(FileDevice { file, size })
    }

    /// Opens an existing file or block device for reading and writing.
    pub fn open(path: &Path) -> io::Result<FileDevice> {
        use std::io::{Seek, SeekFrom};
        let mut file = OpenOptions::new().read(true).write(true).open(path)?;
        // Seeking to the end sizes block devices too, where metadata says 0.
        let size = file.seek(SeekFrom::End(0))?;
        Ok(FileDevice { file, size })
    }
}

impl Device for FileDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn size(&self) -> u64 {
        self.size
    }
}

/// Faults a [`MemoryDevice`] injects.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// Every read fails with EIO.
    pub fail_reads: bool,
    /// Every write fails with EIO.
    pub fail_writes: bool,
    /// Writes report success but are dropped.
    pub lose_writes: bool,
}

/// An in-memory device for tests. Writes land in a volatile cache until
/// `sync`; [`MemoryDevice::crash`] throws the cache away (keeping, if asked,
/// a prefix of it: a torn write).
pub struct MemoryDevice {
    state: Mutex<MemoryState>,
    size: u64,
}

struct MemoryState {
    durable: Vec<u8>,
    /// Writes since the last sync, in order.
    pending: Vec<(u64, Vec<u8>)>,
    faults: Faults,
}

impl MemoryDevice {
    pub fn new(size: u64) -> MemoryDevice {
        MemoryDevice {
            state: Mutex::new(MemoryState {
                durable: vec![0; usize::try_from(size).expect("a test device fits in memory")],
                pending: Vec::new(),
                faults: Faults::default(),
            }),
            size,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, MemoryState> {
        self.state.lock().expect("no test thread panicked holding a device")
    }

    pub fn set_faults(&self, faults: Faults) {
        self.state().faults = faults;
    }

    /// Flips one bit of what the device holds (durable and cached).
    pub fn flip_bit(&self, offset: u64, bit: u8) {
        let mut state = self.state();
        state.durable[offset as usize] ^= 1 << bit;
        for (start, bytes) in state.pending.iter_mut() {
            if (*start..*start + bytes.len() as u64).contains(&offset) {
                bytes[(offset - *start) as usize] ^= 1 << bit;
            }
        }
    }

    /// Loses every write since the last sync except the first `keep`
    /// (in order), as power loss would.
    pub fn crash(&self, keep: usize) {
        let mut state = self.state();
        let pending = std::mem::take(&mut state.pending);
        for (offset, bytes) in pending.into_iter().take(keep) {
            state.durable[offset as usize..offset as usize + bytes.len()].copy_from_slice(&bytes);
        }
    }

    /// Writes not yet synced.
    pub fn pending_writes(&self) -> usize {
        self.state().pending.len()
    }
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(5)
}

impl Device for MemoryDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let state = self.state();
        if state.faults.fail_reads {
            return Err(eio());
        }
        let end = offset.checked_add(buf.len() as u64).filter(|&e| e <= self.size);
        let Some(end) = end else {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        };
        buf.copy_from_slice(&state.durable[offset as usize..end as usize]);
        // The cache overlays the durable bytes, oldest first.
        for (start, bytes) in &state.pending {
            let (lo, hi) = (offset.max(*start), end.min(start + bytes.len() as u64));
            if lo < hi {
                buf[(lo - offset) as usize..(hi - offset) as usize]
                    .copy_from_slice(&bytes[(lo - start) as usize..(hi - start) as usize]);
            }
        }
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut state = self.state();
        if state.faults.fail_writes {
            return Err(eio());
        }
        if offset.checked_add(buf.len() as u64).is_none_or(|e| e > self.size) {
            return Err(io::Error::from_raw_os_error(28));
        }
        if !state.faults.lose_writes {
            state.pending.push((offset, buf.to_vec()));
        }
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        let mut state = self.state();
        if state.faults.fail_writes {
            return Err(eio());
        }
        let pending = std::mem::take(&mut state.pending);
        for (offset, bytes) in pending {
            state.durable[offset as usize..offset as usize + bytes.len()].copy_from_slice(&bytes);
        }
        Ok(())
    }
    fn size(&self) -> u64 {
        self.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_device_caches_until_sync_and_crash_drops_the_rest() {
        let d = MemoryDevice::new(64);
        d.write_at(&[1; 8], 0).unwrap();
        d.write_at(&[2; 8], 4).unwrap();
        let mut buf = [0; 12];
        d.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2]);
        d.crash(1);
        d.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0]);
        d.write_at(&[3; 4], 8).unwrap();
        d.sync().unwrap();
        d.crash(0);
        d.read_at(&mut buf, 0).unwrap();
        assert_eq!(&buf[8..], &[3, 3, 3, 3]);
        assert!(d.read_at(&mut buf, 60).is_err());
    }

    #[test]
    fn file_device_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m");
        let d = FileDevice::create(&path, 1 << 20).unwrap();
        d.write_at(b"hello", 4096).unwrap();
        d.sync().unwrap();
        assert!(
            FileDevice::create(&path, 1).is_err(),
            "an existing member is not overwritten"
        );
        let d = FileDevice::open(&path).unwrap();
        assert_eq!(d.size(), 1 << 20);
        let mut buf = [0; 5];
        d.read_at(&mut buf, 4096).unwrap();
        assert_eq!(&buf, b"hello");
    }
}
