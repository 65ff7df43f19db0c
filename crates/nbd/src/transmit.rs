//! The transmission phase of one connection.
//!
//! The connection's thread reads requests (and write payloads), checks
//! them ([`RequestHeader::check`]) and hands each to the server's worker
//! pool; a worker carries it out and passes the reply to the connection's
//! writer thread, which sends replies in the order they finish, as the
//! protocol allows, several to a system call when they queue up.
//!
//! What a connection may hold is bounded before it is read: a request's
//! bytes (a read's reply, a write's payload) are taken from the
//! connection's and the server's budgets, and a slot from its
//! [`REQUESTS_IN_FLIGHT_MAX`], before the request is read on; the writer
//! gives them back once the reply is sent. A client that does not take
//! its replies therefore stops being read from, and after
//! `REPLY_TIMEOUT` without taking any byte it is dropped.

use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::export::{Export, Failure};
use crate::negotiate::Session;
use crate::server::{invalid_data, Connection, Server, REQUESTS_IN_FLIGHT_MAX};
use crate::wire::{self, errno, Command, RequestHeader};

/// How often a connection waiting for its next request looks whether the
/// server is stopping.
const STOP_POLL: Duration = Duration::from_millis(100);

/// A buffer is kept for the next request only up to this size, so a
/// client's rare 32 MiB requests do not pin 32 MiB each.
const BUFFER_BYTES_KEPT_MAX: usize = 4 << 20;
/// Spare buffers a connection keeps, of each kind: as many as it may
/// have requests in flight, so a client that keeps that many going (as
/// `nbdcopy --requests=64` does) is not given a new, zeroed buffer for
/// most of them. With 16, about 1.7% of the server's CPU samples during a
/// sequential write were that zeroing (PERFORMANCE.md, "CRC32C of 4 KiB
/// blocks"). `SPARE_BYTES_MAX` still bounds them all.
const BUFFERS_KEPT_COUNT: usize = REQUESTS_IN_FLIGHT_MAX;
/// Bytes of spare buffers all connections together keep: with many
/// connections each keeping its own, idle memory would grow with them.
pub(crate) const SPARE_BYTES_MAX: usize = 256 << 20;

/// Read replies are read into a page-aligned buffer, so an export that
/// uses direct I/O reads straight into it.
const READ_BUFFER_ALIGN: usize = 4096;

/// Replies the writer gathers before it sends them (or sooner, when no
/// more are waiting).
const WRITER_BUFFER_BYTES: usize = 64 << 10;

/// Bytes (or slots) that may be held, and a wait for them.
pub(crate) struct Budget {
    left: Mutex<usize>,
    freed: Condvar,
}

impl Budget {
    pub fn new(amount: usize) -> Budget {
        Budget {
            left: Mutex::new(amount),
            freed: Condvar::new(),
        }
    }

    fn take(&self, amount: usize) {
        let mut left = self.left.lock().unwrap_or_else(|p| p.into_inner());
        while *left < amount {
            left = self.freed.wait(left).unwrap_or_else(|p| p.into_inner());
        }
        *left -= amount;
    }

    fn give(&self, amount: usize) {
        if amount > 0 {
            *self.left.lock().unwrap_or_else(|p| p.into_inner()) += amount;
            self.freed.notify_all();
        }
    }

    /// What is left now.
    fn left(&self) -> usize {
        *self.left.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A buffer for read replies, reused from request to request.
#[derive(Default)]
struct ReadBuffer {
    bytes: Vec<u8>,
    /// Where the page-aligned part starts, and how long the data is.
    start: usize,
    len: usize,
}

impl ReadBuffer {
    /// `len` bytes starting at a page boundary.
    fn get(&mut self, len: usize) -> &mut [u8] {
        if self.bytes.len() < len + READ_BUFFER_ALIGN {
            // Fresh (zeroed by the allocator), not grown: nothing to copy.
            self.bytes = vec![0; len + READ_BUFFER_ALIGN];
        }
        self.start = self.bytes.as_ptr().align_offset(READ_BUFFER_ALIGN);
        self.len = len;
        &mut self.bytes[self.start..self.start + len]
    }

    /// What the last [`ReadBuffer::get`] handed out.
    fn data(&self) -> &[u8] {
        &self.bytes[self.start..self.start + self.len]
    }
}

/// What one connection's threads and its jobs share.
struct Link {
    /// Request bytes this connection may still take.
    bytes: Budget,
    /// Requests it may still have in flight.
    slots: Budget,
    /// The server's budget, shared by all connections.
    server: Arc<Budget>,
    spare_payloads: Spares<Vec<u8>>,
    spare_reads: Spares<ReadBuffer>,
}

/// Buffers a connection keeps for its next requests, so that they need
/// not be allocated (and zeroed) afresh; counted against the server's
/// [`SPARE_BYTES_MAX`] while kept.
struct Spares<T> {
    kept: Mutex<Vec<(T, usize)>>,
    /// Bytes kept by all connections.
    server: Arc<AtomicUsize>,
}

impl<T: Default> Spares<T> {
    fn new(server: Arc<AtomicUsize>) -> Spares<T> {
        Spares {
            kept: Mutex::new(Vec::new()),
            server,
        }
    }

    /// Keeps `buffer` of `capacity` bytes, if it is not too large and
    /// neither this connection nor the server keeps enough already.
    fn keep(&self, buffer: T, capacity: usize) {
        if capacity == 0 || capacity > BUFFER_BYTES_KEPT_MAX {
            return;
        }
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        let room = kept.len() < BUFFERS_KEPT_COUNT
            && self
                .server
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |bytes| {
                    (bytes + capacity <= SPARE_BYTES_MAX).then_some(bytes + capacity)
                })
                .is_ok();
        if room {
            kept.push((buffer, capacity));
        }
    }

    /// A kept buffer, or a new empty one.
    fn take(&self) -> T {
        let popped = self.kept.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match popped {
            Some((buffer, capacity)) => {
                self.server.fetch_sub(capacity, Ordering::AcqRel);
                buffer
            }
            None => T::default(),
        }
    }
}

impl<T> Drop for Spares<T> {
    fn drop(&mut self) {
        let kept = self.kept.get_mut().unwrap_or_else(|p| p.into_inner());
        let bytes: usize = kept.iter().map(|(_, capacity)| capacity).sum();
        self.server.fetch_sub(bytes, Ordering::AcqRel);
    }
}

impl Link {
    /// Gives a request's holdings back.
    fn release(&self, held: usize) {
        self.server.give(held);
        self.bytes.give(held);
        self.slots.give(1);
    }
}

/// A reply for the writer: its header (or whole body), the read data that
/// follows, and what its request held.
struct Outgoing {
    head: Vec<u8>,
    data: Option<ReadBuffer>,
    held: usize,
}

impl<E: Export> Server<E> {
    /// Serves requests until DISC, end of stream, `stop`, an idle timeout
    /// or a framing error; returns once every request received has been
    /// answered (or the client could no longer be written to).
    pub(crate) fn transmit<S: Connection>(
        &self,
        stream: &mut BufReader<S>,
        session: Session,
        export: &Arc<E>,
        stop: &AtomicBool,
    ) -> io::Result<()> {
        let link = Arc::new(Link {
            bytes: Budget::new(self.limits.connection_bytes),
            slots: Budget::new(REQUESTS_IN_FLIGHT_MAX),
            server: self.held.clone(),
            spare_payloads: Spares::new(self.spare_bytes.clone()),
            spare_reads: Spares::new(self.spare_bytes.clone()),
        });
        let out = stream.get_ref().try_clone()?;
        let (replies, outbox) = channel::<Outgoing>();
        std::thread::scope(|scope| {
            let writer = std::thread::Builder::new()
                .name("nbd-writer".to_string())
                .spawn_scoped(scope, || write_replies(out, outbox, &link))?;
            let read = self.read_requests(stream, session, export, stop, &link, &replies);
            // The writer ends once this and every job's sender are gone:
            // after the last reply.
            drop(replies);
            let written = writer
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("the NBD writer thread panicked")));
            read.and(written)
        })
    }

    fn read_requests<S: Connection>(
        &self,
        stream: &mut BufReader<S>,
        session: Session,
        export: &Arc<E>,
        stop: &AtomicBool,
        link: &Arc<Link>,
        replies: &Sender<Outgoing>,
    ) -> io::Result<()> {
        let size = export.size();
        let mut idle_since = Instant::now();
        // Reads wait in short steps, so that a stopping server notices
        // between requests; once a request has begun it is read whole
        // (`read_whole` waits on). Set once: not two system calls a request.
        stream.get_ref().set_read_timeout(Some(STOP_POLL))?;
        loop {
            if stream.buffer().is_empty() {
                let ended = loop {
                    if stop.load(Ordering::Relaxed) {
                        return Ok(());
                    }
                    if link.slots.left() < REQUESTS_IN_FLIGHT_MAX {
                        idle_since = Instant::now();
                    } else if self.limits.idle_timeout.is_some_and(|t| idle_since.elapsed() >= t) {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "idle for longer than --idle-timeout",
                        ));
                    }
                    match stream.fill_buf() {
                        Ok(bytes) => break bytes.is_empty(),
                        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                };
                if ended {
                    return Ok(()); // the client closed the connection
                }
            }
            // Requests already received are carried out even when
            // stopping: the client sent them before it could know.
            let mut header = [0u8; RequestHeader::BYTES];
            match read_whole(stream, &mut header) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            }
            idle_since = Instant::now();
            let header = RequestHeader::parse(&header).map_err(invalid_data)?;
            // The bytes this request will hold are taken before it is read
            // on: a client that does not take its replies is not read
            // from, not buffered for.
            let command = header.check(size, session.allocation);
            let held = match command {
                Ok(Command::Read { len, .. }) => len as usize,
                _ => header.payload_bytes(),
            };
            link.slots.take(1);
            link.bytes.take(held);
            link.server.take(held);
            let mut payload = Vec::new();
            if header.payload_bytes() > 0 {
                // A buffer a job is done with: resizing it to the usual
                // request size costs nothing.
                payload = link.spare_payloads.take();
                payload.resize(header.payload_bytes(), 0);
                if let Err(e) = read_whole(stream, &mut payload) {
                    link.release(held);
                    return Err(e);
                }
            }
            if command == Ok(Command::Disc) {
                link.release(held);
                return Ok(());
            }
            let job = Job {
                export: export.clone(),
                link: link.clone(),
                replies: replies.clone(),
                cookie: header.cookie,
                structured: session.structured,
                command,
                payload,
                held,
            };
            self.pool.submit(move || job.run());
        }
    }
}

/// Fills `buf` from `stream`, waiting through the read timeout's steps
/// (`read_exact` would give up at the first, with part of the request
/// consumed); the end of the stream is `UnexpectedEof`.
fn read_whole(stream: &mut impl Read, mut buf: &mut [u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match stream.read(buf) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => buf = &mut buf[n..],
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One request, carried out by a pool worker.
struct Job<E: Export> {
    export: Arc<E>,
    link: Arc<Link>,
    replies: Sender<Outgoing>,
    cookie: u64,
    structured: bool,
    /// What to do, or the error already found.
    command: Result<Command, u32>,
    payload: Vec<u8>,
    held: usize,
}

impl<E: Export> Job<E> {
    fn run(self) {
        let mut buffer = None;
        // A panic in the export is a bug there; the client is told EIO
        // and the connection goes on, its holdings given back.
        let head = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.carry_out(&mut buffer)))
            .unwrap_or_else(|_| {
                eprintln!("tessera: BUG: the export panicked carrying out a request");
                buffer = None;
                let failure = Failure {
                    errno: errno::EIO,
                    message: Some("internal error in the server (a bug: see its log)".to_string()),
                };
                wire::reply(self.structured, self.cookie, Some(&failure))
            });
        let outgoing = Outgoing {
            head,
            data: buffer,
            held: self.held,
        };
        if let Err(unsent) = self.replies.send(outgoing) {
            // The writer has gone: nobody will send it.
            self.link.release(unsent.0.held);
        }
        let capacity = self.payload.capacity();
        self.link.spare_payloads.keep(self.payload, capacity);
    }

    /// Does what the request asks; returns the reply's header (its whole
    /// body but for a read's data, which is left in `buffer`).
    fn carry_out(&self, buffer: &mut Option<ReadBuffer>) -> Vec<u8> {
        let (export, structured, cookie) = (&*self.export, self.structured, self.cookie);
        let command = match self.command {
            Ok(command) => command,
            Err(error) => return wire::reply(structured, cookie, Some(&error.into())),
        };
        let result = match command {
            Command::Read { offset, len } => {
                let mut read = self.link.spare_reads.take();
                match export.read(offset, read.get(len as usize)) {
                    Ok(()) => {
                        *buffer = Some(read);
                        return if structured {
                            wire::read_chunk_header(cookie, offset, len)
                        } else {
                            wire::simple_reply(cookie, 0).to_vec()
                        };
                    }
                    Err(failure) => Err(failure),
                }
            }
            Command::BlockStatus { offset, len, req_one } => match export.block_status(offset, u64::from(len)) {
                Ok(runs) => {
                    let descriptors = wire::block_status_descriptors(&runs, len, req_one);
                    return wire::block_status_chunk(cookie, &descriptors);
                }
                Err(failure) => Err(failure),
            },
            Command::Write { offset, fua } => export.write(offset, &self.payload, fua),
            Command::Flush => export.flush(),
            Command::Trim { offset, len, fua } => export.trim(offset, u64::from(len), fua),
            Command::Cache { offset, len } => export.cache(offset, u64::from(len)),
            Command::WriteZeroes { offset, len, fua } => export.write_zeroes(offset, u64::from(len), fua),
            Command::Disc => unreachable!("DISC is handled by the reading thread"),
        };
        wire::reply(structured, cookie, result.err().as_ref())
    }
}

/// The writer: sends replies as they come, gathering those that wait
/// into one write, and gives back what each request held. Once the
/// client cannot be written to, it shuts the socket (so the reading
/// thread stops) and only drains, and returns the error at the end.
fn write_replies<S: Connection>(stream: S, outbox: Receiver<Outgoing>, link: &Link) -> io::Result<()> {
    let shut = stream.try_clone()?;
    let mut out = BufWriter::with_capacity(WRITER_BUFFER_BYTES, stream);
    let mut failed: io::Result<()> = Ok(());
    while let Ok(first) = outbox.recv() {
        let mut next = Some(first);
        while let Some(reply) = next {
            if failed.is_ok() {
                failed = out
                    .write_all(&reply.head)
                    .and_then(|()| reply.data.as_ref().map_or(Ok(()), |d| out.write_all(d.data())));
            }
            link.release(reply.held);
            if let Some(buffer) = reply.data {
                let capacity = buffer.bytes.len();
                link.spare_reads.keep(buffer, capacity);
            }
            next = outbox.try_recv().ok();
        }
        if failed.is_ok() {
            failed = out.flush();
        }
        if failed.is_err() {
            let _ = shut.shutdown();
        }
    }
    if failed.is_err() {
        // Nothing more can be sent; dropping the BufWriter must not try.
        let _ = out.into_parts();
    }
    failed
}
