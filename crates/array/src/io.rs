//! Member I/O: each member's queue of chunk writes, the threads that write
//! them, and syncs.
//!
//! # Guarantees
//!
//! - Every chunk handed to [`MemberIo::submit`] is written once, and its
//!   stripe learns the outcome; a stripe is reported written (through
//!   [`StripeDone`]) exactly once, after all its chunks, with the members
//!   whose writes failed.
//! - Chunks that lie end to end on a member (consecutive stripes' chunks
//!   do) and wait in its queue together go out with one `pwritev`, so a
//!   busy member gets few large writes, whatever order the stripes were
//!   handed over in (the queue is kept by row). A member's second thread writes
//!   only when a whole run waits, so runs grow instead of splitting.
//! - A sync is served before queued writes (it covers writes already
//!   completed, not those queued), so a FLUSH waits for one write per
//!   member at most, not for the backlog.
//! - No engine lock is held here: the threads own their queues' locks only
//!   while taking work.

use crate::device::{AlignedBuf, Device};
use crate::format::{Geometry, SECTOR_BYTES};
use crate::limits::{MEMBER_IO_THREADS, WRITE_RUN_BYTES_MAX};
use crate::stripe::Built;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// Told when a stripe's chunk writes are all done.
pub trait StripeDone: Send + Sync {
    fn stripe_written(&self, stripe: &StripeWrite, failed: Vec<(usize, std::io::Error)>);
    /// Takes back a written stripe's buffers, for the next ones.
    fn recycle(&self, area: Arc<AlignedBuf>, built: Built);
}

/// A sealed stripe being written: its data area, headers and parity, held
/// until its last chunk is written.
pub struct StripeWrite {
    pub slot: u64,
    pub sequence: u64,
    pub area: Arc<AlignedBuf>,
    pub built: Built,
    /// Bytes this stripe counts against the writes in flight.
    pub bytes: usize,
    pending: AtomicUsize,
    failed: Mutex<Vec<(usize, std::io::Error)>>,
    done: Arc<dyn StripeDone>,
}

impl StripeWrite {
    pub fn new(
        slot: u64,
        sequence: u64,
        area: Arc<AlignedBuf>,
        built: Built,
        bytes: usize,
        done: Arc<dyn StripeDone>,
    ) -> StripeWrite {
        StripeWrite {
            slot,
            sequence,
            area,
            built,
            bytes,
            pending: AtomicUsize::new(0),
            failed: Mutex::new(Vec::new()),
            done,
        }
    }

    /// Chunk j's header and payload.
    fn chunk(&self, geometry: &Geometry, j: usize) -> (&[u8], &[u8]) {
        self.built.chunk(geometry, &self.area, j)
    }

    /// One chunk is done; the last reports the stripe.
    fn chunk_done(&self, member: usize, result: std::io::Result<()>) {
        if let Err(error) = result {
            self.failed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((member, error));
        }
        if self.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            let failed = std::mem::take(&mut *self.failed.lock().unwrap_or_else(|p| p.into_inner()));
            self.done.stripe_written(self, failed);
        }
    }
}

impl Drop for StripeWrite {
    fn drop(&mut self) {
        let area = std::mem::take(&mut self.area);
        self.done.recycle(area, std::mem::take(&mut self.built));
    }
}

struct ChunkWrite {
    row: u64,
    index: usize,
    stripe: Arc<StripeWrite>,
}

/// Members whose syncs are outstanding, and the errors so far.
struct SyncWait {
    state: Mutex<(usize, Vec<(usize, std::io::Error)>)>,
    done: Condvar,
}

#[derive(Default)]
struct Queue {
    /// By row: a row is queued once at a time (a slot is rewritten only
    /// after its last stripe was written and synced).
    writes: BTreeMap<u64, ChunkWrite>,
    /// Where the last run ended: runs are taken upwards from here, and
    /// wrap (C-SCAN), so no row waits for ever; but a row past a stream
    /// of chunks arriving just above the cursor (a sequential fill) waits
    /// until the stream stops: a checkpoint's own stripes, beyond the
    /// slots the fill writes, waited for the whole of a fill
    /// (PERFORMANCE.md, "Writers into the next window's slots while a
    /// checkpoint is written", which also has three fairer sweeps tried).
    cursor: u64,
    syncs: VecDeque<Arc<SyncWait>>,
    /// Threads of this member writing now.
    writing: usize,
    closed: bool,
}

struct MemberQueue {
    member: usize,
    /// `None` for a member missing at open, until one is rebuilt onto a
    /// device ([`MemberIo::attach`]).
    device: std::sync::RwLock<Option<Arc<dyn Device>>>,
    queue: Mutex<Queue>,
    ready: Condvar,
}

impl MemberQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn device(&self) -> std::io::Result<Arc<dyn Device>> {
        self.device
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "the member has no device"))
    }
}

enum Work {
    Sync(Arc<SyncWait>),
    Write(Vec<ChunkWrite>),
}

pub struct MemberIo {
    geometry: Geometry,
    queues: Vec<Arc<MemberQueue>>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl MemberIo {
    /// Starts the I/O threads of every member (those without a device
    /// wait for one).
    pub fn start(
        geometry: &Geometry,
        devices: Vec<Option<Arc<dyn Device>>>,
        bytes_written: Arc<AtomicU64>,
    ) -> std::io::Result<MemberIo> {
        let mut threads = Vec::new();
        let mut queues = Vec::new();
        for (member, device) in devices.into_iter().enumerate() {
            let queue = Arc::new(MemberQueue {
                member,
                device: std::sync::RwLock::new(device),
                queue: Mutex::new(Queue::default()),
                ready: Condvar::new(),
            });
            for t in 0..MEMBER_IO_THREADS {
                let (queue, geometry, bytes) = (queue.clone(), geometry.clone(), bytes_written.clone());
                threads.push(
                    std::thread::Builder::new()
                        .name(format!("tessera-m{member}-{t}"))
                        .spawn(move || serve(&queue, &geometry, &bytes))?,
                );
            }
            queues.push(queue);
        }
        Ok(MemberIo {
            geometry: geometry.clone(),
            queues,
            threads: Mutex::new(threads),
        })
    }

    /// Member `member`'s chunks go to `device` from now on (a rebuild).
    pub fn attach(&self, member: usize, device: Arc<dyn Device>) {
        *self.queues[member].device.write().unwrap_or_else(|p| p.into_inner()) = Some(device);
    }

    /// Queues the chunks of `stripe` for the members `writable` says are
    /// writable; a stripe with none writable is reported done at once.
    pub fn submit(&self, stripe: Arc<StripeWrite>, writable: impl Fn(usize) -> bool) {
        let g = &self.geometry;
        let chunks: Vec<(usize, u64, usize)> = (0..g.width())
            .map(|j| {
                let (member, row) = g.place(stripe.slot, j);
                (member, row, j)
            })
            .filter(|&(member, _, _)| writable(member))
            .collect();
        // One count for this call, let go at the end, so the stripe cannot
        // be reported done while its chunks are still being queued.
        stripe.pending.store(chunks.len() + 1, Ordering::Release);
        for (member, row, index) in chunks {
            let queue = &self.queues[member];
            let mut q = queue.lock();
            let previous = q.writes.insert(
                row,
                ChunkWrite {
                    row,
                    index,
                    stripe: stripe.clone(),
                },
            );
            assert!(previous.is_none(), "member {member} row {row} queued twice");
            drop(q);
            queue.ready.notify_one();
        }
        stripe.chunk_done(usize::MAX, Ok(()));
    }

    /// Syncs `members` in parallel; returns those whose sync failed.
    pub fn sync(&self, members: &[usize]) -> Vec<(usize, std::io::Error)> {
        let queues: Vec<&Arc<MemberQueue>> = members.iter().map(|&m| &self.queues[m]).collect();
        let wait = Arc::new(SyncWait {
            state: Mutex::new((queues.len(), Vec::new())),
            done: Condvar::new(),
        });
        for queue in &queues {
            queue.lock().syncs.push_back(wait.clone());
            queue.ready.notify_one();
        }
        let mut state = wait.state.lock().unwrap_or_else(|p| p.into_inner());
        while state.0 > 0 {
            state = wait.done.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        std::mem::take(&mut state.1)
    }

    /// Lets the threads finish what is queued, then stops them.
    pub fn stop(&self) {
        for queue in &self.queues {
            queue.lock().closed = true;
            queue.ready.notify_all();
        }
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for thread in threads {
            let _ = thread.join();
        }
    }
}

/// Counts a thread as writing until dropped; then wakes a sibling that
/// may have been waiting for a whole run.
struct Writing<'a>(&'a MemberQueue);

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.0.lock().writing -= 1;
        self.0.ready.notify_one();
    }
}

/// A member's I/O thread: syncs first, then runs of adjacent chunks.
fn serve(queue: &MemberQueue, geometry: &Geometry, bytes_written: &AtomicU64) {
    let chunk_bytes = SECTOR_BYTES + geometry.chunk_bytes;
    loop {
        let work = {
            let mut q = queue.lock();
            loop {
                if let Some(sync) = q.syncs.pop_front() {
                    break Work::Sync(sync);
                }
                // A second thread joins only once a whole run waits: chunks
                // that arrive one by one gather while the first writes, so
                // a busy member gets long runs, and two at a time.
                let enough = q.writes.len() * chunk_bytes >= WRITE_RUN_BYTES_MAX || q.closed;
                if !q.writes.is_empty() && (q.writing == 0 || enough) {
                    let start = q
                        .writes
                        .range(q.cursor..)
                        .next()
                        .or_else(|| q.writes.iter().next())
                        .map(|(&row, _)| row)
                        .expect("not empty");
                    q.writing += 1;
                    let mut run = vec![q.writes.remove(&start).expect("found above")];
                    while run.len() * chunk_bytes < WRITE_RUN_BYTES_MAX {
                        match q.writes.remove(&(start + run.len() as u64)) {
                            Some(next) => run.push(next),
                            None => break,
                        }
                    }
                    q.cursor = start + run.len() as u64;
                    break Work::Write(run);
                }
                if q.closed {
                    return;
                }
                q = queue.ready.wait(q).unwrap_or_else(|p| p.into_inner());
            }
        };
        match work {
            Work::Sync(wait) => {
                let result = queue.device().and_then(|d| d.sync());
                let mut state = wait.state.lock().unwrap_or_else(|p| p.into_inner());
                if let Err(error) = result {
                    state.1.push((queue.member, error));
                }
                state.0 -= 1;
                if state.0 == 0 {
                    wait.done.notify_all();
                }
            }
            Work::Write(run) => {
                let _writing = Writing(queue);
                let pieces: Vec<&[u8]> = run
                    .iter()
                    .flat_map(|w| {
                        let (header, payload) = w.stripe.chunk(geometry, w.index);
                        [header, payload]
                    })
                    .collect();
                let result = queue
                    .device()
                    .and_then(|d| d.write_vectored_at(&pieces, geometry.row_offset(run[0].row)));
                if result.is_ok() {
                    let bytes: usize = pieces.iter().map(|p| p.len()).sum();
                    bytes_written.fetch_add(bytes as u64, Ordering::Relaxed);
                }
                drop(pieces);
                for w in run {
                    let result = match &result {
                        Ok(()) => Ok(()),
                        Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
                    };
                    w.stripe.chunk_done(queue.member, result);
                }
            }
        }
    }
}
