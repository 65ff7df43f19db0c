//! Member devices: the one I/O seam.
//!
//! Every byte the array reads or writes goes through [`Device`], so tests
//! put [`MemoryDevice`] (with injected read errors, bit flips, lost writes
//! and crashes) under the real array, and production uses [`FileDevice`]
//! for files and block devices alike.

use std::alloc::{alloc_zeroed, dealloc, handle_alloc_error, Layout};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Bytes of a sector: the unit of a direct read or write and of its
/// buffer's alignment, and the size of a superblock and a chunk header.
pub const SECTOR_BYTES: usize = 4096;

/// Alignment of the memory this crate hands to direct I/O.
pub const IO_ALIGN: usize = 4096;
/// Offsets and lengths of direct I/O are multiples of this: the logical
/// sector of most devices, which intent log blocks are cut to. A device
/// of 4 KiB logical sectors refuses such I/O (EINVAL), and it goes
/// through the page cache instead.
pub const DIRECT_LENGTH_ALIGN: usize = 512;

/// A zeroed byte buffer aligned to [`IO_ALIGN`], so its aligned slices can
/// go to a member with direct I/O, without a bounce copy. Stripe data
/// areas, parity and headers live in these.
///
/// A buffer made with [`AlignedBuf::zeroed_in`] comes from the memory an
/// accelerator lends (page-locked on a GPU, which then copies it without
/// packing it first), or from plain memory when it has none left; it is
/// given back to where it came from, and [`AlignedBuf::resize`] asks the
/// same memory again.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// The memory to ask on a resize.
    memory: Option<Arc<dyn tessera_accel::HostMemory>>,
    /// Whether `ptr` came from `memory` (else from the global allocator).
    lent: bool,
}

// SAFETY: an AlignedBuf owns its allocation, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub fn zeroed(len: usize) -> AlignedBuf {
        AlignedBuf::zeroed_in(None, len)
    }

    /// A zeroed buffer from `memory` when it lends one, else from plain memory.
    pub fn zeroed_in(memory: Option<&Arc<dyn tessera_accel::HostMemory>>, len: usize) -> AlignedBuf {
        const _: () = assert!(tessera_accel::HOST_MEMORY_ALIGN.is_multiple_of(IO_ALIGN));
        let memory = memory.cloned();
        if len == 0 {
            return AlignedBuf {
                ptr: NonNull::dangling(),
                len,
                memory,
                lent: false,
            };
        }
        if let Some(ptr) = memory.as_ref().and_then(|m| m.alloc(len)) {
            return AlignedBuf {
                ptr,
                len,
                memory,
                lent: true,
            };
        }
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| handle_alloc_error(layout));
        AlignedBuf {
            ptr,
            len,
            memory,
            lent: false,
        }
    }

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len, IO_ALIGN).expect("buffer sizes are far below isize::MAX")
    }

    /// Makes the buffer `len` bytes long; its contents are then unspecified
    /// (zeros if it was reallocated).
    pub fn resize(&mut self, len: usize) {
        if self.len != len {
            *self = AlignedBuf::zeroed_in(self.memory.as_ref(), len);
        }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        match &self.memory {
            // SAFETY: lent by this memory for `len` bytes, given back once.
            Some(memory) if self.lent => unsafe { memory.free(self.ptr, self.len) },
            // SAFETY: allocated in `zeroed_in` with this layout.
            _ if self.len > 0 => unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.len)) },
            _ => {}
        }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` initialized bytes (zeroed at allocation) at `ptr`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Default for AlignedBuf {
    fn default() -> AlignedBuf {
        AlignedBuf::zeroed(0)
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> AlignedBuf {
        let mut copy = AlignedBuf::zeroed(self.len);
        copy.copy_from_slice(self);
        copy
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

/// Pieces one `preadv` or `pwritev` takes at most (Linux's `IOV_MAX`).
const IOVECS_MAX: usize = 1024;

/// What is left of the pieces of `iov`, laid end to end from `offset`,
/// once the first `done` bytes are moved: (piece, bytes of it already
/// moved, device offset of the rest), for each piece not finished.
/// Nothing is allocated when everything was moved, as it usually is.
fn remaining(iov: &[libc::iovec], offset: u64, done: usize) -> impl Iterator<Item = (usize, usize, u64)> + '_ {
    let starts = iov.iter().scan(0usize, |at, v| {
        let start = *at;
        *at += v.iov_len;
        Some(start)
    });
    iov.iter()
        .zip(starts)
        .enumerate()
        .filter_map(move |(piece, (v, start))| {
            let skip = done.saturating_sub(start).min(v.iov_len);
            (skip < v.iov_len).then(|| (piece, skip, offset + (start + skip) as u64))
        })
}

/// `preadv` or `pwritev`.
type VectoredCall = unsafe extern "C" fn(libc::c_int, *const libc::iovec, libc::c_int, libc::off_t) -> libc::ssize_t;

/// A member device: positioned reads and writes, and a barrier.
pub trait Device: Send + Sync {
    /// Fills `buf` from `offset`, or fails.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Fills `pieces` one after another from `offset` (a chunk's header
    /// and payload), as one I/O where the device can.
    fn read_vectored_at(&self, pieces: &mut [&mut [u8]], offset: u64) -> io::Result<()> {
        let mut at = offset;
        for piece in pieces {
            self.read_at(piece, at)?;
            at += piece.len() as u64;
        }
        Ok(())
    }
    /// Writes all of `buf` at `offset`, or fails.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Writes `pieces` one after another from `offset` (a chunk's header
    /// and payload, or a run of adjacent chunks), as one I/O where the
    /// device can.
    fn write_vectored_at(&self, pieces: &[&[u8]], offset: u64) -> io::Result<()> {
        let mut at = offset;
        for piece in pieces {
            self.write_at(piece, at)?;
            at += piece.len() as u64;
        }
        Ok(())
    }
    /// Returns once every completed write is on stable storage.
    fn sync(&self) -> io::Result<()>;
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Reads the sector ([`SECTOR_BYTES`])
    /// at each of `offsets`, and hands each to `each` with its index in
    /// `offsets`, every one once, in any order. Where the device can,
    /// many are in flight at once (a file: `io_uring`); by default one
    /// after another, with [`Device::read_at`].
    fn read_sectors(&self, offsets: &[u64], each: &mut dyn FnMut(usize, io::Result<&[u8]>)) {
        read_sectors_one_by_one(self, offsets, each);
    }
}

/// [`Device::read_sectors`] a sector at a time, with `read_at`.
fn read_sectors_one_by_one<D: Device + ?Sized>(
    device: &D,
    offsets: &[u64],
    each: &mut dyn FnMut(usize, io::Result<&[u8]>),
) {
    let mut sector = AlignedBuf::zeroed(SECTOR_BYTES);
    for (i, &offset) in offsets.iter().enumerate() {
        match device.read_at(&mut sector, offset) {
            Ok(()) => each(i, Ok(&sector)),
            Err(error) => each(i, Err(error)),
        }
    }
}

/// Bytes of zeros [`write_zeros`] writes with one call at most.
const ZEROS_PIECE_BYTES: u64 = 8 << 20;

/// Writes zeros over `range` of `device`, a piece at a time, telling
/// `written` each piece's length; stops early (still `Ok`) where
/// `written` returns false. On a file this allocates every block of the
/// range, so that later writes there allocate none: a sparse file's first
/// write to a block makes the sync after it commit the file system's
/// journal too.
pub fn write_zeros(
    device: &dyn Device,
    range: std::ops::Range<u64>,
    written: &mut dyn FnMut(u64) -> bool,
) -> io::Result<()> {
    let zeros = AlignedBuf::zeroed((range.end - range.start).min(ZEROS_PIECE_BYTES) as usize);
    let mut at = range.start;
    while at < range.end {
        let len = (range.end - at).min(ZEROS_PIECE_BYTES);
        device.write_at(&zeros[..len as usize], at)?;
        at += len;
        if !written(len) {
            break;
        }
    }
    Ok(())
}

/// I/O done on one member (or volume), counted as it completes:
/// operations and bytes, reads and writes (`tessera iostat` shows their
/// rates).
#[derive(Debug, Default)]
pub struct IoCounts {
    reads: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
}

/// [`IoCounts`] read at one instant, for `status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IoTotals {
    pub reads: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub write_bytes: u64,
}

impl IoCounts {
    /// Counts one read (`write` false) or write of `bytes` that succeeded.
    pub fn add(&self, write: bool, bytes: usize) {
        let (ops, total) = match write {
            false => (&self.reads, &self.read_bytes),
            true => (&self.writes, &self.write_bytes),
        };
        ops.fetch_add(1, Ordering::Relaxed);
        total.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub fn totals(&self) -> IoTotals {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        IoTotals {
            reads: load(&self.reads),
            read_bytes: load(&self.read_bytes),
            writes: load(&self.writes),
            write_bytes: load(&self.write_bytes),
        }
    }
}

/// A member's device with its I/O counted into its member's
/// [`IoCounts`] (which outlive a device replaced by a rebuild).
pub struct Counted {
    inner: Arc<dyn Device>,
    counts: Arc<IoCounts>,
}

impl Counted {
    pub fn wrap(inner: Arc<dyn Device>, counts: Arc<IoCounts>) -> Arc<dyn Device> {
        Arc::new(Counted { inner, counts })
    }
}

impl Device for Counted {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)?;
        self.counts.add(false, buf.len());
        Ok(())
    }

    fn read_vectored_at(&self, pieces: &mut [&mut [u8]], offset: u64) -> io::Result<()> {
        let bytes = pieces.iter().map(|p| p.len()).sum();
        self.inner.read_vectored_at(pieces, offset)?;
        self.counts.add(false, bytes);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_at(buf, offset)?;
        self.counts.add(true, buf.len());
        Ok(())
    }

    fn write_vectored_at(&self, pieces: &[&[u8]], offset: u64) -> io::Result<()> {
        let bytes = pieces.iter().map(|p| p.len()).sum();
        self.inner.write_vectored_at(pieces, offset)?;
        self.counts.add(true, bytes);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn read_sectors(&self, offsets: &[u64], each: &mut dyn FnMut(usize, io::Result<&[u8]>)) {
        self.inner.read_sectors(offsets, &mut |i, result| {
            if let Ok(bytes) = &result {
                self.counts.add(false, bytes.len());
            }
            each(i, result)
        });
    }
}

/// A file or block device.
///
/// Aligned I/O (whole chunks and headers in [`AlignedBuf`]s, the NBD
/// server's page-aligned read buffers) uses a second descriptor opened
/// with `O_DIRECT` where the filesystem allows (not tmpfs): it skips the
/// page cache, which saves a copy of every byte and keeps no second copy
/// of what the client's own cache holds. Unaligned I/O (superblocks'
/// neighbours, odd NBD requests) goes through the page cache; Linux keeps
/// the two coherent (a direct write drops the cached pages it covers, a
/// direct read writes back dirty ones first). Writes are durable only
/// after [`Device::sync`] (`fdatasync`).
pub struct FileDevice {
    file: File,
    direct: Option<File>,
    size: u64,
    /// For a loop device, its backing file, locked as the device is: the
    /// same bytes reached by the file's own name are refused too.
    _backing: Option<File>,
}

/// Takes the member for this process alone (an exclusive `flock`, held
/// while the device is open): a second array, a second server, or the
/// same member listed twice is refused, not served alongside.
fn lock_exclusively(file: &File) -> io::Result<()> {
    file.try_lock().map_err(|e| match e {
        std::fs::TryLockError::WouldBlock => io::Error::new(
            io::ErrorKind::ResourceBusy,
            "in use: another process or array holds it (an exclusive lock)",
        ),
        std::fs::TryLockError::Error(e) => e,
    })
}

/// The backing file of loop device `device` (major 7), opened, and its
/// name; `None` for any other block device, or a loop device with none
/// attached.
fn loop_backing_file(device: &File) -> io::Result<Option<(File, String)>> {
    use std::os::unix::fs::MetadataExt;
    const LOOP_MAJOR: u64 = 7;
    let rdev = device.metadata()?.rdev();
    let (major, minor) = (libc::major(rdev) as u64, libc::minor(rdev) as u64);
    if major != LOOP_MAJOR {
        return Ok(None);
    }
    let name = format!("/sys/dev/block/{major}:{minor}/loop/backing_file");
    let Ok(backing) = std::fs::read_to_string(&name) else {
        return Ok(None);
    };
    // A file deleted since it was attached cannot be reached otherwise.
    let backing = backing.trim_end_matches('\n');
    match OpenOptions::new().read(true).open(backing) {
        Ok(file) => Ok(Some((file, backing.to_string()))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

impl FileDevice {
    /// Creates a sparse file of `size` bytes; refuses to overwrite one.
    pub fn create(path: &Path, size: u64) -> io::Result<FileDevice> {
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(path)?;
        lock_exclusively(&file)?;
        file.set_len(size)?;
        Ok(FileDevice {
            file,
            direct: Self::open_direct(path),
            size,
            _backing: None,
        })
    }

    /// Opens an existing file or block device for reading and writing.
    /// A block device is opened with `O_EXCL`, as mdadm and ZFS do: the
    /// kernel then refuses it while it is mounted or another holder has
    /// it (or a partition of it, or the disk a partition is on); a loop
    /// device's backing file is locked too.
    pub fn open(path: &Path) -> io::Result<FileDevice> {
        use std::io::{Seek, SeekFrom};
        use std::os::unix::fs::FileTypeExt;
        let block = std::fs::metadata(path)?.file_type().is_block_device();
        let mut options = OpenOptions::new();
        options.read(true).write(true);
        if block {
            options.custom_flags(libc::O_EXCL);
        }
        let mut file = options.open(path).map_err(|e| {
            if e.raw_os_error() == Some(libc::EBUSY) {
                io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    "in use: mounted, or held by another process (md, LVM, another array)",
                )
            } else {
                e
            }
        })?;
        lock_exclusively(&file)?;
        let backing = if block { loop_backing_file(&file)? } else { None };
        if let Some((backing, name)) = &backing {
            lock_exclusively(backing).map_err(|e| match e.kind() {
                io::ErrorKind::ResourceBusy => io::Error::new(
                    e.kind(),
                    format!("in use: its backing file {name} is held by another process or array (an exclusive lock)"),
                ),
                _ => e,
            })?;
        }
        // Seeking to the end sizes block devices too, where metadata says 0.
        let size = file.seek(SeekFrom::End(0))?;
        Ok(FileDevice {
            file,
            direct: Self::open_direct(path),
            size,
            _backing: backing.map(|(file, _)| file),
        })
    }

    /// The `O_DIRECT` descriptor, unless the filesystem refuses it or
    /// `TESSERA_NO_DIRECT_IO` is set (to compare).
    fn open_direct(path: &Path) -> Option<File> {
        if std::env::var_os("TESSERA_NO_DIRECT_IO").is_some() {
            return None;
        }
        OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .ok()
    }

    /// Whether aligned reads and writes bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// One `call` (`preadv` or `pwritev`) of all of `iov` on the direct
    /// descriptor, where `iov` and `offset` meet its alignment (address,
    /// address a multiple of [`IO_ALIGN`], length and offset of
    /// [`DIRECT_LENGTH_ALIGN`]); returns
    /// the bytes it moved: 0 where it was not tried, or the filesystem
    /// refused direct I/O there (EINVAL), so the caller does the rest
    /// through the page cache.
    fn direct_vectored(&self, iov: &[libc::iovec], offset: u64, call: VectoredCall) -> io::Result<usize> {
        use std::os::fd::AsRawFd;
        let aligned =
            |address: usize, len: usize| address.is_multiple_of(IO_ALIGN) && len.is_multiple_of(DIRECT_LENGTH_ALIGN);
        let Some(direct) = &self.direct else { return Ok(0) };
        let Ok(offset) = libc::off_t::try_from(offset) else {
            return Ok(0);
        };
        if iov.len() > IOVECS_MAX
            || !(offset as u64).is_multiple_of(DIRECT_LENGTH_ALIGN as u64)
            || !iov.iter().all(|v| aligned(v.iov_base as usize, v.iov_len))
        {
            return Ok(0);
        }
        // SAFETY: the caller built `iov` from slices it holds (exclusively,
        // for a read) for the whole call.
        let moved = unsafe { call(direct.as_raw_fd(), iov.as_ptr(), iov.len() as libc::c_int, offset) };
        match usize::try_from(moved) {
            Ok(moved) => Ok(moved),
            Err(_) => match io::Error::last_os_error() {
                error if error.raw_os_error() == Some(libc::EINVAL) => Ok(0),
                error => Err(error),
            },
        }
    }
}

impl Device for FileDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_vectored_at(&mut [buf], offset)
    }
    fn read_vectored_at(&self, pieces: &mut [&mut [u8]], offset: u64) -> io::Result<()> {
        let iov: Vec<libc::iovec> = pieces
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            })
            .collect();
        let done = self.direct_vectored(&iov, offset, libc::preadv)?;
        // What the direct read left (unaligned, refused, or short at the
        // end of the device) through the page cache, piece by piece: a
        // short read there is an error.
        for (piece, skip, at) in remaining(&iov, offset, done) {
            self.file.read_exact_at(&mut pieces[piece][skip..], at)?;
        }
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_vectored_at(&[buf], offset)
    }
    fn write_vectored_at(&self, pieces: &[&[u8]], offset: u64) -> io::Result<()> {
        let iov: Vec<libc::iovec> = pieces
            .iter()
            .map(|b| libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            })
            .collect();
        let done = self.direct_vectored(&iov, offset, libc::pwritev)?;
        // What the direct write left (unaligned, refused, or short)
        // through the page cache, piece by piece.
        for (piece, skip, at) in remaining(&iov, offset, done) {
            self.file.write_all_at(&pieces[piece][skip..], at)?;
        }
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn read_sectors(&self, offsets: &[u64], each: &mut dyn FnMut(usize, io::Result<&[u8]>)) {
        if let Err(done) = self.read_sectors_in_ring(offsets, each) {
            // No ring (refused, or `TESSERA_NO_IO_URING`): the rest one
            // by one.
            let rest: Vec<usize> = (0..offsets.len()).filter(|&i| !done[i]).collect();
            let at: Vec<u64> = rest.iter().map(|&i| offsets[i]).collect();
            read_sectors_one_by_one(self, &at, &mut |j, result| each(rest[j], result));
        }
    }
}

/// Sector reads a ring keeps in flight at once.
const RING_DEPTH: usize = 64;

impl FileDevice {
    /// [`Device::read_sectors`] through an `io_uring` of its own,
    /// [`RING_DEPTH`] reads in flight; a read the ring did not finish
    /// whole (direct I/O refused there, a short read at the end, an
    /// interrupted one) is done again with `read_at`, so what `each` gets
    /// is what `read_at` would give. Fails, with which reads were handed
    /// to `each`, where no ring can be had (the kernel or a sandbox
    /// refuses it, or `TESSERA_NO_IO_URING` is set) or one stops working:
    /// the caller does the rest another way.
    fn read_sectors_in_ring(
        &self,
        offsets: &[u64],
        each: &mut dyn FnMut(usize, io::Result<&[u8]>),
    ) -> Result<(), Vec<bool>> {
        use io_uring::{opcode, types, IoUring};
        use std::os::fd::AsRawFd;
        const SECTOR: usize = SECTOR_BYTES;
        let mut done = vec![false; offsets.len()];
        if offsets.is_empty() {
            return Ok(());
        }
        let depth = offsets.len().min(RING_DEPTH);
        let ring = match std::env::var_os("TESSERA_NO_IO_URING") {
            Some(_) => None,
            None => IoUring::new(depth.next_power_of_two() as u32).ok(),
        };
        let Some(ring) = ring else { return Err(done) };
        let fd = types::Fd(self.direct.as_ref().unwrap_or(&self.file).as_raw_fd());
        let mut ring = Ring {
            ring,
            buffers: (0..depth).map(|_| AlignedBuf::zeroed(SECTOR)).collect(),
            in_flight: 0,
        };
        // Which offset each buffer reads, and the buffers free.
        let mut reading: Vec<Option<usize>> = vec![None; depth];
        let mut idle: Vec<usize> = (0..depth).collect();
        let (mut next, mut finished) = (0, Vec::with_capacity(depth));
        while next < offsets.len() || ring.in_flight > 0 {
            while let (Some(&b), true) = (idle.last(), next < offsets.len()) {
                let read = opcode::Read::new(fd, ring.buffers[b].as_mut_ptr(), SECTOR as u32)
                    .offset(offsets[next])
                    .build()
                    .user_data(b as u64);
                // SAFETY: the buffer and the descriptor outlive the read:
                // `Ring` waits for every read in flight before it lets its
                // buffers go (or never lets them go), and the descriptor
                // is `self`'s.
                if unsafe { ring.ring.submission().push(&read) }.is_err() {
                    break;
                }
                idle.pop();
                reading[b] = Some(next);
                next += 1;
                ring.in_flight += 1;
            }
            if !ring.wait() {
                return Err(done);
            }
            finished.extend(ring.ring.completion().map(|c| (c.user_data() as usize, c.result())));
            for (b, result) in finished.drain(..) {
                let i = reading[b].take().expect("a completion for a read in flight");
                ring.in_flight -= 1;
                idle.push(b);
                done[i] = true;
                let buffer = &mut ring.buffers[b];
                if result == SECTOR as i32 {
                    each(i, Ok(buffer));
                } else if result < 0 && ![libc::EINVAL, libc::EINTR, libc::EAGAIN].contains(&-result) {
                    each(i, Err(io::Error::from_raw_os_error(-result)));
                } else {
                    match self.read_at(buffer, offsets[i]) {
                        Ok(()) => each(i, Ok(buffer)),
                        Err(error) => each(i, Err(error)),
                    }
                }
            }
        }
        Ok(())
    }
}

/// An `io_uring` and the buffers its reads fill. Dropped (at the end, on
/// an error, or while a panic unwinds), it waits for the reads still in
/// flight before their buffers go; if it cannot, it leaks them rather
/// than let the kernel write into freed memory.
struct Ring {
    ring: io_uring::IoUring,
    buffers: Vec<AlignedBuf>,
    in_flight: usize,
}

impl Ring {
    /// Submits what is queued and waits for a completion; false if the
    /// ring failed.
    fn wait(&mut self) -> bool {
        match self.ring.submit_and_wait(1) {
            Ok(_) => true,
            Err(e) => matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY | libc::EAGAIN)),
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        for _ in 0..1_000 {
            if self.in_flight == 0 {
                return;
            }
            if !self.wait() {
                break;
            }
            self.in_flight -= self.ring.completion().count();
        }
        if self.in_flight > 0 {
            std::mem::forget(std::mem::take(&mut self.buffers));
        }
    }
}

/// Memory as a member, for benchmarks of the engine itself: a write lands
/// at once, a sync does nothing, nothing is ever lost. (Tests use
/// [`MemoryDevice`], which models a volatile cache and faults.)
pub struct RamDevice {
    bytes: std::sync::RwLock<Vec<u8>>,
    size: u64,
}

impl RamDevice {
    /// A device of `size` zeros, every page touched now (so a benchmark
    /// does not time the kernel handing out fresh pages).
    pub fn new(size: u64) -> RamDevice {
        let mut bytes = vec![1u8; usize::try_from(size).expect("a RAM device fits in memory")];
        bytes.fill(0);
        RamDevice {
            bytes: std::sync::RwLock::new(bytes),
            size,
        }
    }

    fn range(&self, offset: u64, len: usize) -> io::Result<std::ops::Range<usize>> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.size => Ok(offset as usize..end as usize),
            _ => Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
        }
    }
}

impl Device for RamDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let range = self.range(offset, buf.len())?;
        buf.copy_from_slice(&self.bytes.read().unwrap_or_else(|p| p.into_inner())[range]);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let range = self.range(offset, buf.len())?;
        self.bytes.write().unwrap_or_else(|p| p.into_inner())[range].copy_from_slice(buf);
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
    fn size(&self) -> u64 {
        self.size
    }
}

/// Faults a [`MemoryDevice`] injects: always (the flags), or at random,
/// per I/O, from a seed (`random`).
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// Every read fails with EIO.
    pub fail_reads: bool,
    /// Every write fails with EIO.
    pub fail_writes: bool,
    /// Writes report success but are dropped.
    pub lose_writes: bool,
    /// Writes that touch this byte range fail with ENOSPC, as they do in
    /// a sparse file on a full filesystem where it has no blocks yet
    /// (superblocks and the log area, written at create, still take
    /// writes; new stripes do not).
    pub full: Option<std::ops::Range<u64>>,
    pub random: Option<RandomFaults>,
    /// The process died (kill -9) when this was set: from then on writes
    /// and syncs report success and change nothing, so the device holds
    /// what was written up to that instant, synced or not (see
    /// [`MemoryDevice::crash`] for what power loss takes besides). Shared
    /// by all the members of an array, so one store stops them all.
    pub dead: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

impl Faults {
    /// Whether the process that writes to the device has died.
    fn is_dead(&self) -> bool {
        self.dead
            .as_ref()
            .is_some_and(|d| d.load(std::sync::atomic::Ordering::SeqCst))
    }
}

/// Faults that strike single I/Os at random, each with its probability,
/// drawn from `seed` so that a failing run can be repeated.
#[derive(Clone, Debug, Default)]
pub struct RandomFaults {
    pub seed: u64,
    /// A read fails with EIO.
    pub read_error: f64,
    /// A read returns one bit flipped (the stored bytes are intact).
    pub read_bit_flip: f64,
    /// A write reports success but is dropped.
    pub lost_write: f64,
    /// A write reports success but only a prefix of whole 4 KiB sectors
    /// reaches the device.
    pub torn_write: f64,
    /// A write reports success but lands at another 4 KiB-aligned offset
    /// at or after `misdirect_from` (what it should have replaced is left
    /// stale, what it lands on is overwritten).
    pub misdirected_write: f64,
    pub misdirect_from: u64,
    /// Each I/O sleeps up to this long, so that threads interleave
    /// differently from run to run of the same seed.
    pub latency_max_us: u64,
}

/// What a write with random faults does.
enum Fate {
    Whole,
    Lost,
    Torn(usize),
    Elsewhere(u64),
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
    rng: rand::rngs::StdRng,
    /// Bytes read so far (what a test can hold the read path to).
    bytes_read: u64,
}

impl MemoryDevice {
    pub fn new(size: u64) -> MemoryDevice {
        MemoryDevice {
            state: Mutex::new(MemoryState {
                durable: vec![0; usize::try_from(size).expect("a test device fits in memory")],
                pending: Vec::new(),
                faults: Faults::default(),
                rng: rand::SeedableRng::seed_from_u64(0),
                bytes_read: 0,
            }),
            size,
        }
    }

    /// Bytes read from this device so far, failed reads included.
    pub fn bytes_read(&self) -> u64 {
        self.state().bytes_read
    }

    fn state(&self) -> std::sync::MutexGuard<'_, MemoryState> {
        self.state.lock().expect("no test thread panicked holding a device")
    }

    pub fn set_faults(&self, faults: Faults) {
        let mut state = self.state();
        if let Some(random) = &faults.random {
            state.rng = rand::SeedableRng::seed_from_u64(random.seed);
        }
        state.faults = faults;
    }

    /// Sleeps a random while, if the faults ask for latency.
    fn delay(&self) {
        let pause = {
            let mut state = self.state();
            match state.faults.random.as_ref().map(|r| r.latency_max_us) {
                Some(max) if max > 0 => rand::Rng::gen_range(&mut state.rng, 0..=max),
                _ => 0,
            }
        };
        if pause > 0 {
            std::thread::sleep(std::time::Duration::from_micros(pause));
        }
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
        self.crash_with(|index, len| if index < keep { len } else { 0 });
    }

    /// Power loss as a disk's volatile cache may leave it: of each write
    /// since the last sync (given its index, in order, and its length),
    /// `kept` says how many leading bytes reached the media: all, none, or
    /// part of it (a torn write). Writes are applied in order, so a later
    /// kept write covers an earlier one.
    pub fn crash_with(&self, mut kept: impl FnMut(usize, usize) -> usize) {
        let mut state = self.state();
        let pending = std::mem::take(&mut state.pending);
        for (index, (offset, bytes)) in pending.into_iter().enumerate() {
            let n = kept(index, bytes.len()).min(bytes.len());
            state.durable[offset as usize..offset as usize + n].copy_from_slice(&bytes[..n]);
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

fn chance(rng: &mut rand::rngs::StdRng, probability: f64) -> bool {
    probability > 0.0 && rand::Rng::gen_bool(rng, probability.min(1.0))
}

impl MemoryState {
    /// Whether this read fails, at random.
    fn read_fails(&mut self) -> bool {
        let p = self.faults.random.as_ref().map_or(0.0, |r| r.read_error);
        chance(&mut self.rng, p)
    }

    /// What becomes of a write of `len` bytes on a device of `size`.
    fn write_fate(&mut self, len: usize, size: u64) -> Fate {
        let Some(r) = self.faults.random.clone() else {
            return Fate::Whole;
        };
        if chance(&mut self.rng, r.lost_write) {
            return Fate::Lost;
        }
        if chance(&mut self.rng, r.torn_write) && len > SECTOR {
            return Fate::Torn(rand::Rng::gen_range(&mut self.rng, 0..len / SECTOR) * SECTOR);
        }
        let room = size.saturating_sub(len as u64 + SECTOR as u64);
        if chance(&mut self.rng, r.misdirected_write) && room > r.misdirect_from {
            let to = rand::Rng::gen_range(&mut self.rng, r.misdirect_from..room);
            return Fate::Elsewhere(to / SECTOR as u64 * SECTOR as u64);
        }
        Fate::Whole
    }
}

/// The granularity of torn and misdirected writes.
const SECTOR: usize = 4096;

impl Device for MemoryDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.delay();
        let mut state = self.state();
        state.bytes_read += buf.len() as u64;
        if state.faults.fail_reads || state.read_fails() {
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
        let flip = state.faults.random.as_ref().map_or(0.0, |r| r.read_bit_flip);
        if !buf.is_empty() && chance(&mut state.rng, flip) {
            let at = rand::Rng::gen_range(&mut state.rng, 0..buf.len());
            buf[at] ^= 1 << rand::Rng::gen_range(&mut state.rng, 0..8);
        }
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.delay();
        let mut state = self.state();
        if state.faults.is_dead() {
            return Ok(());
        }
        if state.faults.fail_writes {
            return Err(eio());
        }
        if offset.checked_add(buf.len() as u64).is_none_or(|e| e > self.size) {
            return Err(io::Error::from_raw_os_error(28));
        }
        let end = offset + buf.len() as u64;
        if state
            .faults
            .full
            .as_ref()
            .is_some_and(|r| offset < r.end && r.start < end)
        {
            return Err(io::Error::from_raw_os_error(28));
        }
        if state.faults.lose_writes {
            return Ok(());
        }
        match state.write_fate(buf.len(), self.size) {
            Fate::Whole => state.pending.push((offset, buf.to_vec())),
            Fate::Lost => {}
            Fate::Torn(keep) => state.pending.push((offset, buf[..keep].to_vec())),
            Fate::Elsewhere(to) => state.pending.push((to, buf.to_vec())),
        }
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        self.delay();
        let mut state = self.state();
        if state.faults.is_dead() {
            return Ok(());
        }
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

    /// `write_zeros` covers its range exactly, in pieces of at most
    /// `ZEROS_PIECE_BYTES` that it reports, and stops after the piece
    /// its caller said no to.
    #[test]
    fn write_zeros_covers_its_range_in_pieces_and_stops_when_told() {
        let size = 3 * ZEROS_PIECE_BYTES + 4096;
        let d = MemoryDevice::new(size);
        d.write_at(&vec![7; size as usize], 0).unwrap();
        let range = 4096..size - 4096;
        let mut pieces = Vec::new();
        write_zeros(&d, range.clone(), &mut |len| {
            pieces.push(len);
            true
        })
        .unwrap();
        assert_eq!(pieces, [ZEROS_PIECE_BYTES, ZEROS_PIECE_BYTES, ZEROS_PIECE_BYTES - 4096]);
        let mut all = vec![0; size as usize];
        d.read_at(&mut all, 0).unwrap();
        let (start, end) = (range.start as usize, range.end as usize);
        assert!(all[..start].iter().chain(&all[end..]).all(|&b| b == 7));
        assert!(all[start..end].iter().all(|&b| b == 0));
        d.write_at(&vec![7; size as usize], 0).unwrap();
        let mut calls = 0;
        write_zeros(&d, 0..size, &mut |_| {
            calls += 1;
            false
        })
        .unwrap();
        d.read_at(&mut all, 0).unwrap();
        assert_eq!(calls, 1);
        let piece = ZEROS_PIECE_BYTES as usize;
        assert!(all[..piece].iter().all(|&b| b == 0) && all[piece..].iter().all(|&b| b == 7));
    }

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

    /// Each random fault happens about as often as asked, does what it
    /// says, and the same seed makes the same faults.
    #[test]
    fn random_faults_strike_as_asked_and_repeat_by_seed() {
        let run = |random: RandomFaults| {
            let d = MemoryDevice::new(1 << 20);
            d.set_faults(Faults {
                random: Some(random),
                ..Faults::default()
            });
            let mut outcomes = Vec::new();
            for i in 0..400u64 {
                let offset = (i % 64) * 8192;
                let data = vec![(i % 251) as u8 + 1; 8192];
                d.write_at(&data, offset).unwrap();
                let mut back = vec![0u8; 8192];
                let read = d.read_at(&mut back, offset);
                outcomes.push(match read {
                    Err(_) => 'e',
                    Ok(()) if back == data => '=',
                    Ok(()) if back.iter().zip(&data).filter(|(a, b)| a != b).count() == 1 => 'f',
                    Ok(()) if back[..4096] == data[..4096] && back[4096..] != data[4096..] => 't',
                    Ok(()) => 'x',
                });
            }
            outcomes.into_iter().collect::<String>()
        };
        let count = |s: &str, c: char| s.chars().filter(|&x| x == c).count();
        let errors = run(RandomFaults {
            seed: 1,
            read_error: 0.25,
            ..RandomFaults::default()
        });
        assert!((60..140).contains(&count(&errors, 'e')), "{errors}");
        let flips = run(RandomFaults {
            seed: 2,
            read_bit_flip: 0.25,
            ..RandomFaults::default()
        });
        assert!((60..140).contains(&count(&flips, 'f')), "{flips}");
        let torn = run(RandomFaults {
            seed: 3,
            torn_write: 1.0,
            ..RandomFaults::default()
        });
        assert!(count(&torn, '=') < 400, "torn writes leave old bytes behind: {torn}");
        let lost = run(RandomFaults {
            seed: 4,
            lost_write: 0.5,
            misdirected_write: 0.2,
            ..RandomFaults::default()
        });
        assert!(count(&lost, 'x') + count(&lost, 't') > 100, "{lost}");
        let again = run(RandomFaults {
            seed: 4,
            lost_write: 0.5,
            misdirected_write: 0.2,
            ..RandomFaults::default()
        });
        assert_eq!(lost, again, "the same seed, the same faults");
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
        // Held by one opener at a time.
        let busy = FileDevice::open(&path).map(|_| ()).unwrap_err();
        assert_eq!(busy.kind(), io::ErrorKind::ResourceBusy);
        drop(d);
        let d = FileDevice::open(&path).unwrap();
        assert_eq!(d.size(), 1 << 20);
        let mut buf = [0; 5];
        d.read_at(&mut buf, 4096).unwrap();
        assert_eq!(&buf, b"hello");
        // An aligned write (direct where the filesystem allows) and a
        // buffered one over it read back coherently.
        let mut chunk = AlignedBuf::zeroed(8192);
        chunk.fill(7);
        d.write_at(&chunk, 8192).unwrap();
        d.write_at(b"xy", 8193).unwrap();
        d.write_at(&chunk[..4096], 12288).unwrap();
        let mut header = AlignedBuf::zeroed(4096);
        header.fill(9);
        d.write_vectored_at(&[&header, &chunk, &header], 16384).unwrap();
        let mut run = vec![0u8; 4096 + 8192 + 4096];
        d.read_at(&mut run, 16384).unwrap();
        assert!(run[..4096].iter().all(|&b| b == 9) && run[4096..12288].iter().all(|&b| b == 7));
        assert!(run[12288..].iter().all(|&b| b == 9));
        // Read back as pieces: aligned ones (direct where allowed), and
        // unaligned ones (through the page cache).
        let (mut head, mut body) = (AlignedBuf::zeroed(4096), AlignedBuf::zeroed(8192));
        d.read_vectored_at(&mut [&mut head, &mut body], 16384).unwrap();
        assert!(head.iter().all(|&b| b == 9) && body.iter().all(|&b| b == 7));
        let (mut odd, mut rest) = ([0u8; 3], vec![0u8; 8189]);
        d.read_vectored_at(&mut [&mut odd, &mut rest], 20480).unwrap();
        assert!(odd.iter().chain(&rest).all(|&b| b == 7));
        assert!(d
            .read_vectored_at(&mut [&mut head, &mut body], (1 << 20) - 8192)
            .is_err());
        // An unaligned piece among them goes through the page cache.
        d.write_vectored_at(&[&header, b"abc"], 32768).unwrap();
        let mut back = vec![0u8; 4099];
        d.read_at(&mut back, 32768).unwrap();
        assert!(back[..4096].iter().all(|&b| b == 9) && &back[4096..] == b"abc");
        let mut back = vec![0u8; 8192];
        d.read_at(&mut back, 8192).unwrap();
        let mut want = vec![7u8; 8192];
        want[1..3].copy_from_slice(b"xy");
        assert_eq!(back, want);
        eprintln!("direct I/O on {}: {}", dir.path().display(), d.is_direct());
    }

    /// Sectors read many at a time (through an io_uring where the kernel
    /// gives one) are what `read_at` reads, each handed over once: more
    /// than a ring holds at once, repeated offsets, an unaligned one
    /// (direct I/O refuses it: read again through the page cache), one
    /// cut short by the end of the device and one past it (errors).
    #[test]
    fn sectors_read_many_at_a_time_are_what_read_at_reads() {
        use rand::{Rng, SeedableRng};
        let dir = tempfile::tempdir().unwrap();
        let sectors = 300u64;
        let d = FileDevice::create(&dir.path().join("m"), sectors * 4096 + 100).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut sector = AlignedBuf::zeroed(4096);
        for k in 0..sectors {
            rng.fill(&mut sector[..]);
            d.write_at(&sector, k * 4096).unwrap();
        }
        d.sync().unwrap();
        let mut offsets: Vec<u64> = (0..200).map(|_| rng.gen_range(0..sectors) * 4096).collect();
        offsets.extend([5 * 4096 + 100, sectors * 4096, (sectors + 3) * 4096, offsets[7]]);
        let counts = Arc::new(IoCounts::default());
        let counted = Counted::wrap(Arc::new(d), counts.clone());
        let mut got: Vec<Option<Result<Vec<u8>, io::ErrorKind>>> = vec![None; offsets.len()];
        counted.read_sectors(&offsets, &mut |i, result| {
            assert!(got[i].is_none(), "read {i} handed over twice");
            got[i] = Some(result.map(|b| b.to_vec()).map_err(|e| e.kind()));
        });
        for (i, &offset) in offsets.iter().enumerate() {
            let mut want = AlignedBuf::zeroed(4096);
            let want = counted
                .read_at(&mut want, offset)
                .map(|()| want.to_vec())
                .map_err(|e| e.kind());
            assert_eq!(got[i].as_ref(), Some(&want), "the sector at {offset}");
        }
        assert_eq!(got.iter().filter(|g| matches!(g, Some(Err(_)))).count(), 2);
        let read = offsets.len() as u64 - 2;
        let totals = counts.totals();
        assert_eq!(
            (totals.reads, totals.read_bytes),
            (2 * read, 2 * read * 4096),
            "counted as read_at counts"
        );
    }

    #[test]
    fn what_a_short_vectored_transfer_leaves() {
        let bytes = [0u8; 10];
        let iov: Vec<libc::iovec> = [3usize, 4, 2]
            .iter()
            .map(|&len| libc::iovec {
                iov_base: bytes.as_ptr() as *mut libc::c_void,
                iov_len: len,
            })
            .collect();
        let left = |done| remaining(&iov, 100, done).collect::<Vec<_>>();
        assert_eq!(left(0), [(0, 0, 100), (1, 0, 103), (2, 0, 107)]);
        assert_eq!(left(5), [(1, 2, 105), (2, 0, 107)]);
        assert_eq!(left(7), [(2, 0, 107)]);
        assert_eq!(left(8), [(2, 1, 108)]);
        assert!(left(9).is_empty());
    }

    #[test]
    fn aligned_buffers_are_aligned_and_zeroed() {
        for len in [0, 1, 4096, 3 << 20] {
            let mut b = AlignedBuf::zeroed(len);
            assert!((b.as_ptr() as usize).is_multiple_of(IO_ALIGN) || len == 0);
            assert!(b.iter().all(|&x| x == 0));
            b.fill(1);
            let c = b.clone();
            assert_eq!(&c[..], &b[..]);
            b.resize(len + 4096);
            assert_eq!(b.len(), len + 4096);
        }
    }
}
