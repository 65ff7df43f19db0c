//! An NBD server for any [`Export`]: fixed newstyle negotiation
//! (NBD_OPT_GO, INFO, LIST, ABORT, EXPORT_NAME, STRUCTURED_REPLY,
//! LIST_META_CONTEXT and SET_META_CONTEXT with `base:allocation`), block
//! size information, and READ, WRITE, FLUSH, TRIM, WRITE_ZEROES (with
//! FAST_ZERO), BLOCK_STATUS and DISC with FUA, over TCP or Unix sockets,
//! several connections at once.
//!
//! Protocol: NetworkBlockDevice/nbd `doc/proto.md`. Every integer on the
//! wire is big-endian. A request that is malformed or out of range gets
//! the protocol's error and changes nothing; a request whose framing
//! cannot be trusted (bad magic, a write payload over the limit) ends the
//! connection, as the protocol allows.

use std::io::{self, BufRead, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, Sender};
use std::sync::{Arc, Mutex};

/// A client connection: a byte stream that can be split into a reading
/// and a writing half.
pub trait Connection: Read + Write + Send + Sized {
    fn try_clone(&self) -> io::Result<Self>;
    /// How long a read may wait (`None`: for ever).
    fn set_read_timeout(&self, timeout: Option<std::time::Duration>) -> io::Result<()>;
    /// How long a write may wait for the peer (`None`: for ever).
    fn set_write_timeout(&self, timeout: Option<std::time::Duration>) -> io::Result<()>;
}

impl Connection for std::os::unix::net::UnixStream {
    fn try_clone(&self) -> io::Result<Self> {
        std::os::unix::net::UnixStream::try_clone(self)
    }
    fn set_read_timeout(&self, timeout: Option<std::time::Duration>) -> io::Result<()> {
        std::os::unix::net::UnixStream::set_read_timeout(self, timeout)
    }
    fn set_write_timeout(&self, timeout: Option<std::time::Duration>) -> io::Result<()> {
        std::os::unix::net::UnixStream::set_write_timeout(self, timeout)
    }
}

impl Connection for std::net::TcpStream {
    fn try_clone(&self) -> io::Result<Self> {
        std::net::TcpStream::try_clone(self)
    }
    fn set_read_timeout(&self, timeout: Option<std::time::Duration>) -> io::Result<()> {
        std::net::TcpStream::set_read_timeout(self, timeout)
    }
    fn set_write_timeout(&self, timeout: Option<std::time::Duration>) -> io::Result<()> {
        std::net::TcpStream::set_write_timeout(self, timeout)
    }
}

/// How often a connection waiting for its next request looks whether the
/// server is stopping.
const STOP_POLL: std::time::Duration = std::time::Duration::from_millis(100);
/// How long a client may take over each read of the handshake.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// How long a stopping server waits for its connections to answer what
/// they have in flight.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Requests of one connection served at once: a client's queue depth is
/// worked on in parallel (reads wait on different members, a write's
/// payload arrives while the one before is stored). Replies go out as
/// each finishes, as the protocol allows. 16 covers the queue depths
/// clients use (qemu and fio default to 1-16); an export that reads with
/// direct I/O needs that many requests in flight to keep its disks busy.
pub const WORKERS_PER_CONNECTION: usize = 16;

/// A buffer a worker keeps for the next request only up to this size, so
/// a client's rare 32 MiB requests do not pin 32 MiB per worker.
const BUFFER_BYTES_KEPT_MAX: usize = 4 << 20;

/// Read replies are read into a page-aligned buffer, so an export that
/// uses direct I/O reads straight into it.
const READ_BUFFER_ALIGN: usize = 4096;

/// A worker's buffer for read replies, reused from request to request.
#[derive(Default)]
struct ReadBuffer {
    bytes: Vec<u8>,
}

impl ReadBuffer {
    /// `len` bytes starting at a page boundary.
    fn get(&mut self, len: usize) -> &mut [u8] {
        if self.bytes.len() < len + READ_BUFFER_ALIGN {
            // Fresh (zeroed by the allocator), not grown: nothing to copy.
            self.bytes = vec![0; len + READ_BUFFER_ALIGN];
        }
        let pad = self.bytes.as_ptr().align_offset(READ_BUFFER_ALIGN);
        &mut self.bytes[pad..pad + len]
    }

    /// Lets go of a buffer grown past what is worth keeping.
    fn trim(&mut self) {
        if self.bytes.len() > BUFFER_BYTES_KEPT_MAX {
            self.bytes = Vec::new();
        }
    }
}

/// A request handed to a connection's workers.
struct Request {
    kind: u16,
    cookie: u64,
    offset: u64,
    len: u32,
    fua: bool,
    /// BLOCK_STATUS with NBD_CMD_FLAG_REQ_ONE: one descriptor only.
    req_one: bool,
    /// Flags or range already found wrong: the reply is this error.
    invalid: Option<u32>,
    payload: Vec<u8>,
    /// Bytes taken from the connection's and the server's budgets for
    /// this request, given back once it is answered.
    held: usize,
}

/// Errno values the protocol defines.
pub mod errno {
    pub const EPERM: u32 = 1;
    pub const EIO: u32 = 5;
    pub const ENOMEM: u32 = 12;
    pub const EINVAL: u32 = 22;
    pub const ENOSPC: u32 = 28;
    pub const EOVERFLOW: u32 = 75;
    pub const ENOTSUP: u32 = 95;
    pub const ESHUTDOWN: u32 = 108;
}

/// `base:allocation` flags: not allocated (a write there may need space).
pub const STATE_HOLE: u32 = 1;
/// `base:allocation` flags: reads as zeros.
pub const STATE_ZERO: u32 = 2;

/// Why an export could not carry out a request: the protocol's errno, and
/// what went wrong in words for clients that take structured replies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub errno: u32,
    pub message: Option<String>,
}

impl From<u32> for Failure {
    fn from(errno: u32) -> Failure {
        Failure { errno, message: None }
    }
}

/// What the server exports: a byte range with these operations. Offsets
/// and lengths are checked against `size` before any call.
pub trait Export: Send + Sync {
    fn size(&self) -> u64;
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), Failure>;
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), Failure>;
    fn flush(&self) -> Result<(), Failure>;
    fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), Failure>;
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), Failure>;
    /// How [offset, offset+len) is stored, as consecutive runs from
    /// `offset` (bytes, [`STATE_HOLE`] | [`STATE_ZERO`] flags) that cover
    /// at least its first byte. By default: all allocated, contents
    /// unknown, which the protocol always allows.
    fn block_status(&self, _offset: u64, len: u64) -> Result<Vec<(u64, u32)>, Failure> {
        Ok(vec![(len, 0)])
    }
}

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

const FLAG_FIXED_NEWSTYLE: u16 = 1;
const FLAG_NO_ZEROES: u16 = 2;
const CLIENT_FLAG_FIXED_NEWSTYLE: u32 = 1;
const CLIENT_FLAG_NO_ZEROES: u32 = 2;

const OPT_EXPORT_NAME: u32 = 1;
const OPT_ABORT: u32 = 2;
const OPT_LIST: u32 = 3;
const OPT_INFO: u32 = 6;
const OPT_GO: u32 = 7;
const OPT_STRUCTURED_REPLY: u32 = 8;
const OPT_LIST_META_CONTEXT: u32 = 9;
const OPT_SET_META_CONTEXT: u32 = 10;

const REP_ACK: u32 = 1;
const REP_SERVER: u32 = 2;
const REP_INFO: u32 = 3;
const REP_META_CONTEXT: u32 = 4;
const REP_ERR_UNSUP: u32 = 0x8000_0001;
const REP_ERR_INVALID: u32 = 0x8000_0003;
const REP_ERR_UNKNOWN: u32 = 0x8000_0006;
const REP_ERR_TOO_BIG: u32 = 0x8000_0009;

const INFO_EXPORT: u16 = 0;
const INFO_NAME: u16 = 1;
const INFO_DESCRIPTION: u16 = 2;
const INFO_BLOCK_SIZE: u16 = 3;

const TFLAG_HAS_FLAGS: u16 = 1;
const TFLAG_SEND_FLUSH: u16 = 4;
const TFLAG_SEND_FUA: u16 = 8;
const TFLAG_SEND_TRIM: u16 = 32;
const TFLAG_SEND_WRITE_ZEROES: u16 = 64;
const TFLAG_SEND_DF: u16 = 128;
const TFLAG_CAN_MULTI_CONN: u16 = 256;
const TFLAG_SEND_FAST_ZERO: u16 = 2048;

const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_FLUSH: u16 = 3;
const CMD_TRIM: u16 = 4;
const CMD_WRITE_ZEROES: u16 = 6;
const CMD_BLOCK_STATUS: u16 = 7;
const CMD_FLAG_FUA: u16 = 1;
const CMD_FLAG_NO_HOLE: u16 = 2;
const CMD_FLAG_DF: u16 = 4;
const CMD_FLAG_REQ_ONE: u16 = 8;
const CMD_FLAG_FAST_ZERO: u16 = 16;
const CMD_FLAGS_KNOWN: u16 = CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_DF | CMD_FLAG_REQ_ONE | CMD_FLAG_FAST_ZERO;

const REPLY_FLAG_DONE: u16 = 1;
const REPLY_TYPE_OFFSET_DATA: u16 = 1;
const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
const REPLY_TYPE_ERROR: u16 = 0x8001;

/// Block sizes advertised: any request down to one byte works (the array
/// merges partial blocks, as nbdkit's file plugin does; libnbd holds
/// clients to the minimum, so fuse2fs's few-byte superblock writes through
/// nbdfuse need it), 4 KiB is its block, 32 MiB the largest request.
pub const BLOCK_SIZE_MIN: u32 = 1;
pub const BLOCK_SIZE_PREFERRED: u32 = 4096;
pub const REQUEST_BYTES_MAX: u32 = 32 << 20;
/// Option payloads longer than this end the negotiation.
const OPTION_BYTES_MAX: u32 = 64 << 10;

/// One export under one name.
pub struct Server<E: Export> {
    export: Arc<E>,
    name: String,
    description: String,
    limits: Limits,
    /// Request bytes held by all connections (read replies being
    /// produced or sent, write payloads received and not yet stored).
    held: Budget,
}

/// What one server may hold at once, so that clients cannot make it use
/// memory or threads without bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; more are closed at accept (each takes
    /// a reader and 16 worker threads).
    pub max_connections: usize,
    /// Request bytes one connection may hold: at least one request of the
    /// largest size. A client that pipelines large reads and does not
    /// take the replies stops being read from here.
    pub connection_bytes: usize,
    /// Request bytes all connections together may hold.
    pub total_bytes: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 64,
            connection_bytes: 2 * REQUEST_BYTES_MAX as usize,
            total_bytes: 1 << 30,
        }
    }
}

/// Bytes that may be held, and a wait for them.
struct Budget {
    left: Mutex<usize>,
    freed: std::sync::Condvar,
}

impl Budget {
    fn new(bytes: usize) -> Budget {
        Budget {
            left: Mutex::new(bytes),
            freed: std::sync::Condvar::new(),
        }
    }

    fn take(&self, bytes: usize) {
        let mut left = self.left.lock().unwrap_or_else(|p| p.into_inner());
        while *left < bytes {
            left = self.freed.wait(left).unwrap_or_else(|p| p.into_inner());
        }
        *left -= bytes;
    }

    fn give(&self, bytes: usize) {
        if bytes > 0 {
            *self.left.lock().unwrap_or_else(|p| p.into_inner()) += bytes;
            self.freed.notify_all();
        }
    }
}

/// Where a connection's reading thread puts requests: the workers'
/// queue, spare write buffers, and the connection's byte budget.
struct Intake<'a> {
    requests: &'a std::sync::mpsc::SyncSender<Request>,
    spare: &'a Receiver<Vec<u8>>,
    budget: &'a Budget,
}

/// How long a reply may wait for the client to take any of it before the
/// connection is dropped (and what it held let go).
const REPLY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}
fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

fn protocol_error(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.to_string())
}

/// How negotiation ended.
enum Negotiated {
    Transmission(Session),
    Closed,
}

/// What a connection negotiated for its transmission phase.
#[derive(Clone, Copy, Default)]
struct Session {
    structured: bool,
    /// `base:allocation` selected: BLOCK_STATUS is allowed.
    allocation: bool,
}

/// The one metadata context offered, and the id it is selected under.
const BASE_ALLOCATION: &str = "base:allocation";
const BASE_ALLOCATION_ID: u32 = 1;

impl<E: Export> Server<E> {
    /// A server of `export` under `name`. The limits must let one request
    /// of the largest size through.
    pub fn new(export: Arc<E>, name: String, description: String, limits: Limits) -> Server<E> {
        let largest = REQUEST_BYTES_MAX as usize;
        let limits = Limits {
            max_connections: limits.max_connections.max(1),
            connection_bytes: limits.connection_bytes.max(largest),
            total_bytes: limits.total_bytes.max(largest),
        };
        Server {
            export,
            name,
            description,
            limits,
            held: Budget::new(limits.total_bytes),
        }
    }

    /// Gives a request's bytes back to the server's and its connection's
    /// budgets.
    fn release(&self, connection: &Budget, held: usize) {
        self.held.give(held);
        connection.give(held);
    }

    fn transmission_flags(&self, structured: bool) -> u16 {
        let mut flags = TFLAG_HAS_FLAGS
            | TFLAG_SEND_FLUSH
            | TFLAG_SEND_FUA
            | TFLAG_SEND_TRIM
            | TFLAG_SEND_WRITE_ZEROES
            | TFLAG_SEND_FAST_ZERO
            | TFLAG_CAN_MULTI_CONN;
        if structured {
            flags |= TFLAG_SEND_DF;
        }
        flags
    }

    fn name_matches(&self, name: &[u8]) -> bool {
        name.is_empty() || name == self.name.as_bytes()
    }

    /// Serves one client until it disconnects or `stop` is set.
    pub fn serve<S: Connection>(&self, stream: S, stop: &AtomicBool) -> io::Result<()> {
        stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        stream.set_write_timeout(Some(REPLY_TIMEOUT))?;
        let mut stream = io::BufReader::new(stream);
        let session = match self.negotiate(&mut stream)? {
            Negotiated::Transmission(session) => session,
            Negotiated::Closed => return Ok(()),
        };
        self.transmit(&mut stream, session, stop)
    }

    fn negotiate<S: Read + Write>(&self, stream: &mut io::BufReader<S>) -> io::Result<Negotiated> {
        let mut hello = Vec::with_capacity(18);
        hello.extend_from_slice(&NBDMAGIC.to_be_bytes());
        hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
        hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        stream.get_mut().write_all(&hello)?;
        let client_flags = read_u32(stream)?;
        if client_flags & CLIENT_FLAG_FIXED_NEWSTYLE == 0 {
            return Err(protocol_error("client does not speak fixed newstyle"));
        }
        if client_flags & !(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES) != 0 {
            return Err(protocol_error("client sent unknown flags"));
        }
        let no_zeroes = client_flags & CLIENT_FLAG_NO_ZEROES != 0;
        let mut session = Session::default();
        // Each option is answered; a client may send many, but not forever.
        for _ in 0..4096 {
            if read_u64(stream)? != IHAVEOPT {
                return Err(protocol_error("bad option magic"));
            }
            let option = read_u32(stream)?;
            let len = read_u32(stream)?;
            if len > OPTION_BYTES_MAX {
                // The data cannot be skipped safely without reading it all.
                let mut sink = io::sink();
                io::copy(&mut stream.by_ref().take(u64::from(len)), &mut sink)?;
                self.option_reply(stream, option, REP_ERR_TOO_BIG, b"option data too long")?;
                continue;
            }
            let mut data = vec![0u8; len as usize];
            stream.read_exact(&mut data)?;
            match option {
                OPT_EXPORT_NAME => {
                    if !self.name_matches(&data) {
                        return Ok(Negotiated::Closed);
                    }
                    let mut reply = Vec::with_capacity(10 + 124);
                    reply.extend_from_slice(&self.export.size().to_be_bytes());
                    reply.extend_from_slice(&self.transmission_flags(session.structured).to_be_bytes());
                    if !no_zeroes {
                        reply.extend_from_slice(&[0u8; 124]);
                    }
                    stream.get_mut().write_all(&reply)?;
                    return Ok(Negotiated::Transmission(session));
                }
                OPT_ABORT => {
                    self.option_reply(stream, option, REP_ACK, &[])?;
                    return Ok(Negotiated::Closed);
                }
                OPT_LIST => {
                    if !data.is_empty() {
                        self.option_reply(stream, option, REP_ERR_INVALID, b"NBD_OPT_LIST takes no data")?;
                        continue;
                    }
                    let mut entry = (self.name.len() as u32).to_be_bytes().to_vec();
                    entry.extend_from_slice(self.name.as_bytes());
                    self.option_reply(stream, option, REP_SERVER, &entry)?;
                    self.option_reply(stream, option, REP_ACK, &[])?;
                }
                OPT_INFO | OPT_GO => {
                    if self.info(stream, option, &data, session.structured)? && option == OPT_GO {
                        return Ok(Negotiated::Transmission(session));
                    }
                }
                OPT_STRUCTURED_REPLY => {
                    if !data.is_empty() {
                        self.option_reply(stream, option, REP_ERR_INVALID, b"takes no data")?;
                    } else {
                        session.structured = true;
                        self.option_reply(stream, option, REP_ACK, &[])?;
                    }
                }
                OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                    if option == OPT_SET_META_CONTEXT {
                        // Each SET replaces the selection, failed or not.
                        session.allocation = false;
                    }
                    if !session.structured {
                        self.option_reply(stream, option, REP_ERR_INVALID, b"negotiate structured replies first")?;
                        continue;
                    }
                    match parse_meta_context(&data) {
                        None => {
                            self.option_reply(stream, option, REP_ERR_INVALID, b"malformed metadata context request")?
                        }
                        Some((name, _)) if !self.name_matches(&name) => {
                            self.option_reply(stream, option, REP_ERR_UNKNOWN, b"no such export: try 'tessera'")?
                        }
                        Some((_, queries)) => {
                            // LIST with no query lists everything; "base:"
                            // lists the namespace; SET takes exact names.
                            let listing = option == OPT_LIST_META_CONTEXT;
                            let offered = (listing && queries.is_empty())
                                || queries
                                    .iter()
                                    .any(|q| q == BASE_ALLOCATION.as_bytes() || (listing && q == b"base:"));
                            if offered {
                                let mut reply = if listing { 0 } else { BASE_ALLOCATION_ID }.to_be_bytes().to_vec();
                                reply.extend_from_slice(BASE_ALLOCATION.as_bytes());
                                self.option_reply(stream, option, REP_META_CONTEXT, &reply)?;
                                session.allocation = !listing;
                            }
                            self.option_reply(stream, option, REP_ACK, &[])?;
                        }
                    }
                }
                _ => self.option_reply(stream, option, REP_ERR_UNSUP, b"option not supported")?,
            }
        }
        Err(protocol_error("too many options"))
    }

    fn option_reply<S: Write>(
        &self,
        stream: &mut io::BufReader<S>,
        option: u32,
        kind: u32,
        data: &[u8],
    ) -> io::Result<()> {
        let mut reply = Vec::with_capacity(20 + data.len());
        reply.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
        reply.extend_from_slice(&option.to_be_bytes());
        reply.extend_from_slice(&kind.to_be_bytes());
        reply.extend_from_slice(&(data.len() as u32).to_be_bytes());
        reply.extend_from_slice(data);
        stream.get_mut().write_all(&reply)
    }

    /// NBD_OPT_INFO and NBD_OPT_GO; returns whether the export was granted.
    fn info<S: Read + Write>(
        &self,
        stream: &mut io::BufReader<S>,
        option: u32,
        data: &[u8],
        structured: bool,
    ) -> io::Result<bool> {
        let parsed = (|| {
            let name_len = u32::from_be_bytes(data.get(0..4)?.try_into().ok()?) as usize;
            let name = data.get(4..4 + name_len)?;
            let rest = data.get(4 + name_len..)?;
            let count = u16::from_be_bytes(rest.get(0..2)?.try_into().ok()?) as usize;
            let requests = rest.get(2..)?;
            if requests.len() != count * 2 {
                return None;
            }
            let requests: Vec<u16> = requests.chunks(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect();
            Some((name.to_vec(), requests))
        })();
        let Some((name, requests)) = parsed else {
            self.option_reply(stream, option, REP_ERR_INVALID, b"malformed NBD_OPT_INFO/GO")?;
            return Ok(false);
        };
        if !self.name_matches(&name) {
            self.option_reply(stream, option, REP_ERR_UNKNOWN, b"no such export: try 'tessera'")?;
            return Ok(false);
        }
        let mut export = INFO_EXPORT.to_be_bytes().to_vec();
        export.extend_from_slice(&self.export.size().to_be_bytes());
        export.extend_from_slice(&self.transmission_flags(structured).to_be_bytes());
        self.option_reply(stream, option, REP_INFO, &export)?;
        if requests.contains(&INFO_NAME) {
            let mut info = INFO_NAME.to_be_bytes().to_vec();
            info.extend_from_slice(self.name.as_bytes());
            self.option_reply(stream, option, REP_INFO, &info)?;
        }
        if requests.contains(&INFO_DESCRIPTION) {
            let mut info = INFO_DESCRIPTION.to_be_bytes().to_vec();
            info.extend_from_slice(self.description.as_bytes());
            self.option_reply(stream, option, REP_INFO, &info)?;
        }
        let mut sizes = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
        for size in [BLOCK_SIZE_MIN, BLOCK_SIZE_PREFERRED, REQUEST_BYTES_MAX] {
            sizes.extend_from_slice(&size.to_be_bytes());
        }
        self.option_reply(stream, option, REP_INFO, &sizes)?;
        self.option_reply(stream, option, REP_ACK, &[])?;
        Ok(true)
    }

    /// The transmission phase: this thread reads requests (and write
    /// payloads) and hands them to the connection's workers, which carry
    /// them out and send the replies.
    fn transmit<S: Connection>(
        &self,
        stream: &mut io::BufReader<S>,
        session: Session,
        stop: &AtomicBool,
    ) -> io::Result<()> {
        let structured = session.structured;
        let size = self.export.size();
        let out = Mutex::new(stream.get_ref().try_clone()?);
        let (requests, queue) = sync_channel::<Request>(WORKERS_PER_CONNECTION);
        let queue = Mutex::new(queue);
        let (give_back, spare) = std::sync::mpsc::channel::<Vec<u8>>();
        let budget = Budget::new(self.limits.connection_bytes);
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..WORKERS_PER_CONNECTION)
                .map(|_| {
                    let give_back = give_back.clone();
                    let (queue, out, budget) = (&queue, &out, &budget);
                    scope.spawn(move || self.work(queue, out, structured, &give_back, budget))
                })
                .collect();
            let intake = Intake {
                requests: &requests,
                spare: &spare,
                budget: &budget,
            };
            let read = self.read_requests(stream, size, session, stop, &intake);
            // The workers finish what was queued, then see the queue close.
            drop(requests);
            let worked = workers
                .into_iter()
                .map(|w| w.join().unwrap_or_else(|_| Err(protocol_error("a worker panicked"))))
                .collect::<io::Result<Vec<()>>>();
            read.and(worked.map(|_| ()))
        })
    }

    /// Reads requests until DISC, end of stream, `stop` or a framing error.
    fn read_requests<S: Connection>(
        &self,
        stream: &mut io::BufReader<S>,
        size: u64,
        session: Session,
        stop: &AtomicBool,
        intake: &Intake<'_>,
    ) -> io::Result<()> {
        let Intake {
            requests,
            spare,
            budget,
        } = *intake;
        loop {
            // Between requests, wait in short steps, so that a stopping
            // server notices; once a request has begun, read it whole.
            if stream.buffer().is_empty() {
                stream.get_ref().set_read_timeout(Some(STOP_POLL))?;
                let waited = loop {
                    if stop.load(Ordering::Relaxed) {
                        return Ok(());
                    }
                    match stream.fill_buf() {
                        Ok(bytes) => break bytes.is_empty(),
                        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                };
                stream.get_ref().set_read_timeout(None)?;
                if waited {
                    return Ok(()); // the client closed the connection
                }
            }
            // Requests already received are carried out even when
            // stopping: the client sent them before it could know.
            let mut header = [0u8; 28];
            match stream.read_exact(&mut header) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            }
            let magic = u32::from_be_bytes(header[0..4].try_into().expect("4 bytes"));
            if magic != REQUEST_MAGIC {
                return Err(protocol_error("bad request magic"));
            }
            let flags = u16::from_be_bytes([header[4], header[5]]);
            let kind = u16::from_be_bytes([header[6], header[7]]);
            let cookie = u64::from_be_bytes(header[8..16].try_into().expect("8 bytes"));
            let offset = u64::from_be_bytes(header[16..24].try_into().expect("8 bytes"));
            let len = u32::from_be_bytes(header[24..28].try_into().expect("4 bytes"));
            let mut payload = Vec::new();
            // The bytes this request will hold (a read's reply, a write's
            // payload) are taken before it is read on: a client that does
            // not take its replies is not read from, not buffered for.
            let held = match kind {
                CMD_READ | CMD_WRITE if len <= REQUEST_BYTES_MAX => len as usize,
                _ => 0,
            };
            budget.take(held);
            self.held.take(held);
            // Given back here when the request never reaches a worker.
            let release = |held| self.release(budget, held);
            if kind == CMD_WRITE {
                // A buffer a worker is done with: resizing it to the usual
                // request size costs nothing.
                payload = spare.try_recv().unwrap_or_default();
                if len > REQUEST_BYTES_MAX {
                    return Err(protocol_error("write payload over the maximum request size"));
                }
                payload.resize(len as usize, 0);
                if let Err(e) = stream.read_exact(&mut payload) {
                    release(held);
                    return Err(e);
                }
            }
            if kind == CMD_DISC {
                release(held);
                return Ok(());
            }
            let in_range = offset.checked_add(u64::from(len)).is_some_and(|end| end <= size);
            // Flags that only one command takes.
            let misplaced = (flags & CMD_FLAG_REQ_ONE != 0 && kind != CMD_BLOCK_STATUS)
                || (flags & CMD_FLAG_FAST_ZERO != 0 && kind != CMD_WRITE_ZEROES);
            let invalid = match kind {
                _ if flags & !CMD_FLAGS_KNOWN != 0 || misplaced => Some(errno::EINVAL),
                CMD_FLUSH if offset != 0 || len != 0 => Some(errno::EINVAL),
                CMD_FLUSH => None,
                CMD_READ if len > REQUEST_BYTES_MAX => Some(errno::EINVAL),
                // Past the end: no space for a write, a bad range otherwise.
                CMD_WRITE | CMD_WRITE_ZEROES if !in_range => Some(errno::ENOSPC),
                CMD_BLOCK_STATUS if !session.allocation => Some(errno::EINVAL),
                CMD_READ | CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES | CMD_BLOCK_STATUS => {
                    (!in_range).then_some(errno::EINVAL)
                }
                _ => Some(errno::EINVAL),
            };
            let request = Request {
                kind,
                cookie,
                offset,
                len,
                fua: flags & CMD_FLAG_FUA != 0,
                req_one: flags & CMD_FLAG_REQ_ONE != 0,
                invalid,
                payload,
                held,
            };
            if let Err(unsent) = requests.send(request) {
                release(unsent.0.held);
                // Every worker has stopped: a reply could not be sent.
                return Ok(());
            }
        }
    }

    /// A worker: carries out requests and sends their replies until the
    /// queue closes. Once the client cannot be written to, it only drains
    /// the queue (so the reading thread never blocks on it) and returns
    /// the error at the end.
    fn work<S: Connection>(
        &self,
        queue: &Mutex<Receiver<Request>>,
        out: &Mutex<S>,
        structured: bool,
        spare: &Sender<Vec<u8>>,
        budget: &Budget,
    ) -> io::Result<()> {
        let mut buffer = ReadBuffer::default();
        let mut failed = Ok(());
        loop {
            let request = {
                let queue = queue.lock().map_err(|_| protocol_error("a worker panicked"))?;
                match queue.recv() {
                    Ok(r) => r,
                    Err(_) => return failed,
                }
            };
            if failed.is_ok() {
                failed = self.carry_out(&request, &mut buffer, out, structured);
            }
            self.release(budget, request.held);
            buffer.trim();
            // The write buffer goes back to the reading thread for reuse.
            if request.payload.capacity() > 0 && request.payload.capacity() <= BUFFER_BYTES_KEPT_MAX {
                let _ = spare.send(request.payload);
            }
        }
    }

    /// Carries out one request and sends its reply.
    fn carry_out<S: Connection>(
        &self,
        request: &Request,
        buffer: &mut ReadBuffer,
        out: &Mutex<S>,
        structured: bool,
    ) -> io::Result<()> {
        let &Request {
            kind,
            cookie,
            offset,
            len,
            fua,
            req_one,
            invalid,
            ref payload,
            held: _,
        } = request;
        let lock = || out.lock().map_err(|_| protocol_error("a worker panicked"));
        if let Some(error) = invalid {
            return self.reply(&mut *lock()?, structured, cookie, Err(error.into()));
        }
        if kind == CMD_BLOCK_STATUS {
            return match self.export.block_status(offset, u64::from(len)) {
                Ok(runs) => {
                    let chunk = block_status_chunk(cookie, &runs, len, req_one);
                    lock()?.write_all(&chunk)
                }
                Err(error) => self.reply(&mut *lock()?, structured, cookie, Err(error)),
            };
        }
        let mut data: &mut [u8] = &mut [];
        let result = match kind {
            CMD_READ => {
                data = buffer.get(len as usize);
                self.export.read(offset, data)
            }
            CMD_WRITE => self.export.write(offset, payload, fua),
            CMD_FLUSH => self.export.flush(),
            CMD_TRIM => self.export.trim(offset, u64::from(len), fua),
            CMD_WRITE_ZEROES => self.export.write_zeroes(offset, u64::from(len), fua),
            _ => Err(errno::EINVAL.into()),
        };
        let mut out = lock()?;
        match result {
            Ok(()) if kind == CMD_READ && structured => {
                let mut chunk = structured_header(REPLY_TYPE_OFFSET_DATA, cookie, 8 + len);
                chunk.extend_from_slice(&offset.to_be_bytes());
                out.write_all(&chunk)?;
                out.write_all(data)
            }
            Ok(()) if kind == CMD_READ => {
                out.write_all(&simple_reply(cookie, 0))?;
                out.write_all(data)
            }
            result => self.reply(&mut *out, structured, cookie, result),
        }
    }

    /// A reply without data: simple, or a structured error chunk.
    fn reply(
        &self,
        out: &mut impl Write,
        structured: bool,
        cookie: u64,
        result: Result<(), Failure>,
    ) -> io::Result<()> {
        match result {
            Err(failure) if structured => {
                let message = failure.message.as_deref().unwrap_or(match failure.errno {
                    errno::ENOSPC => "no space: past the end of the export, or the array is full",
                    errno::EINVAL => "request out of range or malformed",
                    _ => "I/O error in the array",
                });
                let message = truncated(message, ERROR_MESSAGE_BYTES_MAX).as_bytes();
                let mut chunk = structured_header(REPLY_TYPE_ERROR, cookie, 6 + message.len() as u32);
                chunk.extend_from_slice(&failure.errno.to_be_bytes());
                chunk.extend_from_slice(&(message.len() as u16).to_be_bytes());
                chunk.extend_from_slice(message);
                out.write_all(&chunk)
            }
            Err(failure) => out.write_all(&simple_reply(cookie, failure.errno)),
            Ok(()) => out.write_all(&simple_reply(cookie, 0)),
        }
    }
}

/// The protocol's limit on a string, error messages included.
const ERROR_MESSAGE_BYTES_MAX: usize = 4096;

/// `text` cut to at most `max` bytes, at a character boundary.
fn truncated(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The reply to BLOCK_STATUS: one chunk for `base:allocation`, its runs
/// clipped to the request's `len` (the protocol's limits: each nonzero,
/// at most 2^20 of them, one with REQ_ONE), equal neighbours merged.
fn block_status_chunk(cookie: u64, runs: &[(u64, u32)], len: u32, req_one: bool) -> Vec<u8> {
    const DESCRIPTORS_MAX: usize = 1 << 20;
    let mut descriptors: Vec<(u32, u32)> = Vec::new();
    let mut covered = 0u64;
    for &(bytes, flags) in runs {
        let bytes = bytes.min(u64::from(len) - covered);
        if bytes == 0 {
            continue;
        }
        covered += bytes;
        match descriptors.last_mut() {
            Some(last) if last.1 == flags => last.0 += bytes as u32,
            _ => descriptors.push((bytes as u32, flags)),
        }
        if covered == u64::from(len) {
            break;
        }
    }
    if descriptors.is_empty() {
        // An export that reported nothing: allocated, contents unknown.
        descriptors.push((len.max(1), 0));
    }
    descriptors.truncate(if req_one { 1 } else { DESCRIPTORS_MAX });
    let mut chunk = structured_header(REPLY_TYPE_BLOCK_STATUS, cookie, 4 + 8 * descriptors.len() as u32);
    chunk.extend_from_slice(&BASE_ALLOCATION_ID.to_be_bytes());
    for (bytes, flags) in descriptors {
        chunk.extend_from_slice(&bytes.to_be_bytes());
        chunk.extend_from_slice(&flags.to_be_bytes());
    }
    chunk
}

/// A LIST or SET_META_CONTEXT request: the export name and the queries;
/// `None` if the lengths do not add up.
fn parse_meta_context(data: &[u8]) -> Option<(Vec<u8>, Vec<Vec<u8>>)> {
    let take_u32 = |at: usize| Some(u32::from_be_bytes(data.get(at..at + 4)?.try_into().ok()?) as usize);
    let name_len = take_u32(0)?;
    let name = data.get(4..4usize.checked_add(name_len)?)?.to_vec();
    let mut at = 4 + name_len;
    let count = take_u32(at)?;
    at += 4;
    let mut queries = Vec::new();
    for _ in 0..count {
        let len = take_u32(at)?;
        queries.push(data.get(at + 4..(at + 4).checked_add(len)?)?.to_vec());
        at += 4 + len;
    }
    (at == data.len()).then_some((name, queries))
}

/// The header of a structured reply chunk, the last of its reply.
fn structured_header(kind: u16, cookie: u64, length: u32) -> Vec<u8> {
    let mut chunk = Vec::with_capacity(20 + 8);
    chunk.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    chunk.extend_from_slice(&REPLY_FLAG_DONE.to_be_bytes());
    chunk.extend_from_slice(&kind.to_be_bytes());
    chunk.extend_from_slice(&cookie.to_be_bytes());
    chunk.extend_from_slice(&length.to_be_bytes());
    chunk
}

fn simple_reply(cookie: u64, error: u32) -> Vec<u8> {
    let mut reply = Vec::with_capacity(16);
    reply.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    reply.extend_from_slice(&error.to_be_bytes());
    reply.extend_from_slice(&cookie.to_be_bytes());
    reply
}

/// A listening socket: TCP or Unix.
pub enum Listener {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener),
}

/// Accepts clients until `stop` is set, serving each on its own thread.
/// Then stops accepting and waits (up to 30 s) for every connection to
/// carry out and answer the requests it has received, so that what the
/// caller does next (a final FLUSH and checkpoint) comes after them.
pub fn run<E: Export + 'static>(server: Arc<Server<E>>, listener: Listener, stop: Arc<AtomicBool>) -> io::Result<()> {
    match &listener {
        Listener::Tcp(l) => l.set_nonblocking(true)?,
        Listener::Unix(l) => l.set_nonblocking(true)?,
    }
    let mut connections: Vec<std::thread::JoinHandle<()>> = Vec::new();
    let mut result = Ok(());
    while !stop.load(Ordering::Relaxed) {
        let accepted: io::Result<Box<dyn FnOnce() + Send>> = match &listener {
            Listener::Tcp(l) => l.accept().and_then(|(s, peer)| {
                s.set_nonblocking(false)?;
                s.set_nodelay(true)?;
                let (server, stop) = (server.clone(), stop.clone());
                Ok(Box::new(move || log_end(&peer.to_string(), server.serve(s, &stop))) as Box<dyn FnOnce() + Send>)
            }),
            Listener::Unix(l) => l.accept().and_then(|(s, _)| {
                s.set_nonblocking(false)?;
                let (server, stop) = (server.clone(), stop.clone());
                Ok(Box::new(move || log_end("unix client", server.serve(s, &stop))) as Box<dyn FnOnce() + Send>)
            }),
        };
        match accepted {
            Ok(handler) => {
                connections.retain(|c| !c.is_finished());
                if connections.len() >= server.limits.max_connections {
                    // Dropping the handler closes the connection.
                    eprintln!(
                        "tessera: refused a connection: {} are open (--max-connections)",
                        connections.len()
                    );
                    continue;
                }
                connections.push(std::thread::spawn(handler));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => {
                result = Err(e);
                stop.store(true, Ordering::Relaxed);
            }
        }
    }
    drop(listener);
    let deadline = std::time::Instant::now() + DRAIN_TIMEOUT;
    while connections.iter().any(|c| !c.is_finished()) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let left = connections.iter().filter(|c| !c.is_finished()).count();
    if left > 0 {
        eprintln!("tessera: {left} connection(s) still busy after {DRAIN_TIMEOUT:?}; stopping without them");
    }
    result
}

fn log_end(peer: &str, result: io::Result<()>) {
    match result {
        Ok(()) => eprintln!("tessera: {peer} disconnected"),
        Err(e) => eprintln!("tessera: {peer} dropped: {e}"),
    }
}

#[cfg(test)]
mod tests {
    //! The server against a hand-driven client over a socket pair: each
    //! malformed or out-of-range request gets the protocol's error and
    //! changes nothing.

    use super::*;
    use std::os::unix::net::UnixStream;
    use std::sync::Mutex;

    struct Memory(Mutex<Vec<u8>>);

    impl Export for Memory {
        fn size(&self) -> u64 {
            self.0.lock().unwrap().len() as u64
        }
        fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), Failure> {
            let data = self.0.lock().unwrap();
            buf.copy_from_slice(&data[offset as usize..offset as usize + buf.len()]);
            Ok(())
        }
        fn write(&self, offset: u64, bytes: &[u8], _fua: bool) -> Result<(), Failure> {
            self.0.lock().unwrap()[offset as usize..offset as usize + bytes.len()].copy_from_slice(bytes);
            Ok(())
        }
        fn flush(&self) -> Result<(), Failure> {
            Ok(())
        }
        fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), Failure> {
            self.write_zeroes(offset, len, fua)
        }
        fn write_zeroes(&self, offset: u64, len: u64, _fua: bool) -> Result<(), Failure> {
            self.0.lock().unwrap()[offset as usize..(offset + len) as usize].fill(0);
            Ok(())
        }
        /// Zero 4 KiB blocks are holes; one run per block, from the block
        /// that holds `offset` (the server clips and merges).
        fn block_status(&self, offset: u64, len: u64) -> Result<Vec<(u64, u32)>, Failure> {
            let data = self.0.lock().unwrap();
            let first = offset / 4096 * 4096;
            Ok((first..offset + len)
                .step_by(4096)
                .map(|at| {
                    let block = &data[at as usize..(at as usize + 4096).min(data.len())];
                    let flags = if block.iter().all(|&b| b == 0) {
                        STATE_HOLE | STATE_ZERO
                    } else {
                        0
                    };
                    let from = at.max(offset);
                    (at + 4096 - from, flags)
                })
                .collect())
        }
    }

    const SIZE: usize = 1 << 20;

    fn start() -> (UnixStream, Arc<Memory>, std::thread::JoinHandle<io::Result<()>>) {
        start_with(Arc::new(Memory(Mutex::new(vec![7u8; SIZE]))))
    }

    fn start_with<E: Export + 'static>(
        export: Arc<E>,
    ) -> (UnixStream, Arc<E>, std::thread::JoinHandle<io::Result<()>>) {
        let (client, server_end) = UnixStream::pair().unwrap();
        let server = Server::new(
            export.clone(),
            "tessera".to_string(),
            "test".to_string(),
            Limits::default(),
        );
        let handle = std::thread::spawn(move || server.serve(server_end, &AtomicBool::new(false)));
        (client, export, handle)
    }

    fn send_option(c: &mut UnixStream, option: u32, data: &[u8]) {
        let mut m = IHAVEOPT.to_be_bytes().to_vec();
        m.extend_from_slice(&option.to_be_bytes());
        m.extend_from_slice(&(data.len() as u32).to_be_bytes());
        m.extend_from_slice(data);
        c.write_all(&m).unwrap();
    }

    /// (reply type, data) of one option reply.
    fn option_reply(c: &mut UnixStream, option: u32) -> (u32, Vec<u8>) {
        assert_eq!(read_u64(c).unwrap(), OPTION_REPLY_MAGIC);
        assert_eq!(read_u32(c).unwrap(), option);
        let kind = read_u32(c).unwrap();
        let mut data = vec![0; read_u32(c).unwrap() as usize];
        c.read_exact(&mut data).unwrap();
        (kind, data)
    }

    fn go_request(name: &[u8]) -> Vec<u8> {
        let mut data = (name.len() as u32).to_be_bytes().to_vec();
        data.extend_from_slice(name);
        data.extend_from_slice(&1u16.to_be_bytes());
        data.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        data
    }

    /// A LIST or SET_META_CONTEXT request for `export` with `queries`.
    fn meta_request(export: &[u8], queries: &[&[u8]]) -> Vec<u8> {
        let mut data = (export.len() as u32).to_be_bytes().to_vec();
        data.extend_from_slice(export);
        data.extend_from_slice(&(queries.len() as u32).to_be_bytes());
        for q in queries {
            data.extend_from_slice(&(q.len() as u32).to_be_bytes());
            data.extend_from_slice(q);
        }
        data
    }

    /// Handshake, structured replies, then GO; returns the transmission flags.
    fn negotiate(c: &mut UnixStream) -> u16 {
        negotiate_with(c, |_| {})
    }

    /// [`negotiate`], with `before_go` run once structured replies are on.
    fn negotiate_with(c: &mut UnixStream, before_go: impl FnOnce(&mut UnixStream)) -> u16 {
        assert_eq!(read_u64(c).unwrap(), NBDMAGIC);
        assert_eq!(read_u64(c).unwrap(), IHAVEOPT);
        let mut flags = [0; 2];
        c.read_exact(&mut flags).unwrap();
        c.write_all(&(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES).to_be_bytes())
            .unwrap();
        // An unknown option, a malformed GO and an unknown export are refused.
        send_option(c, 99, b"");
        assert_eq!(option_reply(c, 99).0, REP_ERR_UNSUP);
        send_option(c, OPT_GO, &[0, 0, 0, 9, b'x']);
        assert_eq!(option_reply(c, OPT_GO).0, REP_ERR_INVALID);
        send_option(c, OPT_GO, &go_request(b"other"));
        assert_eq!(option_reply(c, OPT_GO).0, REP_ERR_UNKNOWN);
        send_option(c, OPT_LIST, b"");
        let (kind, data) = option_reply(c, OPT_LIST);
        assert_eq!((kind, &data[4..]), (REP_SERVER, &b"tessera"[..]));
        assert_eq!(option_reply(c, OPT_LIST).0, REP_ACK);
        send_option(c, OPT_STRUCTURED_REPLY, b"");
        assert_eq!(option_reply(c, OPT_STRUCTURED_REPLY).0, REP_ACK);
        before_go(c);
        send_option(c, OPT_GO, &go_request(b"tessera"));
        let mut transmission = 0;
        loop {
            let (kind, data) = option_reply(c, OPT_GO);
            if kind == REP_ACK {
                return transmission;
            }
            assert_eq!(kind, REP_INFO);
            match u16::from_be_bytes([data[0], data[1]]) {
                INFO_EXPORT => {
                    let size = u64::from_be_bytes(data[2..10].try_into().unwrap());
                    assert!(size == SIZE as u64 || size == ZEROS_SIZE, "size {size}");
                    transmission = u16::from_be_bytes([data[10], data[11]]);
                }
                INFO_BLOCK_SIZE => {
                    assert_eq!(u32::from_be_bytes(data[2..6].try_into().unwrap()), BLOCK_SIZE_MIN);
                    assert_eq!(
                        u32::from_be_bytes(data[6..10].try_into().unwrap()),
                        BLOCK_SIZE_PREFERRED
                    );
                }
                _ => {}
            }
        }
    }

    fn request(c: &mut UnixStream, flags: u16, kind: u16, cookie: u64, offset: u64, len: u32, payload: &[u8]) {
        let mut r = REQUEST_MAGIC.to_be_bytes().to_vec();
        r.extend_from_slice(&flags.to_be_bytes());
        r.extend_from_slice(&kind.to_be_bytes());
        r.extend_from_slice(&cookie.to_be_bytes());
        r.extend_from_slice(&offset.to_be_bytes());
        r.extend_from_slice(&len.to_be_bytes());
        r.extend_from_slice(payload);
        c.write_all(&r).unwrap();
    }

    /// (errno, message) of a structured error chunk, after its magic.
    fn error_chunk(c: &mut UnixStream, cookie: u64) -> (u32, String) {
        let mut head = [0; 4];
        c.read_exact(&mut head).unwrap();
        assert_eq!(u16::from_be_bytes([head[2], head[3]]), REPLY_TYPE_ERROR);
        assert_eq!(read_u64(c).unwrap(), cookie);
        let mut body = vec![0; read_u32(c).unwrap() as usize];
        c.read_exact(&mut body).unwrap();
        let len = u16::from_be_bytes([body[4], body[5]]) as usize;
        assert_eq!(body.len(), 6 + len);
        (
            u32::from_be_bytes(body[..4].try_into().unwrap()),
            String::from_utf8(body[6..].to_vec()).unwrap(),
        )
    }

    /// Error of a reply without data: 0, or the errno (simple or structured).
    fn reply_error(c: &mut UnixStream, cookie: u64) -> u32 {
        match read_u32(c).unwrap() {
            SIMPLE_REPLY_MAGIC => {
                let error = read_u32(c).unwrap();
                assert_eq!(read_u64(c).unwrap(), cookie);
                error
            }
            STRUCTURED_REPLY_MAGIC => error_chunk(c, cookie).0,
            magic => panic!("bad reply magic {magic:#x}"),
        }
    }

    #[test]
    fn malformed_and_out_of_range_requests_get_errors_and_change_nothing() {
        let (mut c, memory, handle) = start();
        let flags = negotiate(&mut c);
        assert_ne!(flags & TFLAG_CAN_MULTI_CONN, 0);
        assert_ne!(flags & TFLAG_SEND_FUA, 0);
        let size = SIZE as u64;
        // A write past the end (no space there, as the protocol says), an
        // overflowing offset, unknown flags, an unknown command, a flush
        // with a length.
        request(&mut c, 0, CMD_WRITE, 1, size - 4, 8, &[1; 8]);
        assert_eq!(reply_error(&mut c, 1), errno::ENOSPC);
        request(&mut c, 0, CMD_WRITE_ZEROES, 2, u64::MAX - 1, 8, &[]);
        assert_eq!(reply_error(&mut c, 2), errno::ENOSPC);
        request(&mut c, 0, CMD_TRIM, 20, size - 4, 8, &[]);
        assert_eq!(reply_error(&mut c, 20), errno::EINVAL);
        // Flags for another command; BLOCK_STATUS without a context.
        request(&mut c, CMD_FLAG_REQ_ONE, CMD_READ, 21, 0, 8, &[]);
        assert_eq!(reply_error(&mut c, 21), errno::EINVAL);
        request(&mut c, CMD_FLAG_FAST_ZERO, CMD_WRITE, 22, 0, 4, &[1; 4]);
        assert_eq!(reply_error(&mut c, 22), errno::EINVAL);
        request(&mut c, 0, CMD_BLOCK_STATUS, 23, 0, 4096, &[]);
        assert_eq!(reply_error(&mut c, 23), errno::EINVAL);
        request(&mut c, 0x80, CMD_WRITE, 3, 0, 4, &[1; 4]);
        assert_eq!(reply_error(&mut c, 3), errno::EINVAL);
        request(&mut c, 0, 42, 4, 0, 0, &[]);
        assert_eq!(reply_error(&mut c, 4), errno::EINVAL);
        request(&mut c, 0, CMD_FLUSH, 5, 0, 512, &[]);
        assert_eq!(reply_error(&mut c, 5), errno::EINVAL);
        request(&mut c, 0, CMD_READ, 6, size, 512, &[]);
        assert_eq!(reply_error(&mut c, 6), errno::EINVAL);
        assert!(memory.0.lock().unwrap().iter().all(|&b| b == 7), "nothing changed");
        // A good write and a structured read of it.
        request(&mut c, CMD_FLAG_FUA, CMD_WRITE, 7, 4096, 4, b"abcd");
        assert_eq!(reply_error(&mut c, 7), 0);
        request(&mut c, CMD_FLAG_DF, CMD_READ, 8, 4094, 8, &[]);
        assert_eq!(read_u32(&mut c).unwrap(), STRUCTURED_REPLY_MAGIC);
        let mut head = [0; 4];
        c.read_exact(&mut head).unwrap();
        assert_eq!(u16::from_be_bytes([head[0], head[1]]), REPLY_FLAG_DONE);
        assert_eq!(u16::from_be_bytes([head[2], head[3]]), REPLY_TYPE_OFFSET_DATA);
        assert_eq!(read_u64(&mut c).unwrap(), 8);
        assert_eq!(read_u32(&mut c).unwrap(), 16);
        assert_eq!(read_u64(&mut c).unwrap(), 4094);
        let mut data = [0; 8];
        c.read_exact(&mut data).unwrap();
        assert_eq!(&data, b"\x07\x07abcd\x07\x07");
        // A bad magic ends the connection.
        c.write_all(&[0u8; 28]).unwrap();
        assert!(handle.join().unwrap().is_err());
    }

    /// (context id, descriptors) of a BLOCK_STATUS reply.
    fn block_status_reply(c: &mut UnixStream, cookie: u64) -> (u32, Vec<(u32, u32)>) {
        assert_eq!(read_u32(c).unwrap(), STRUCTURED_REPLY_MAGIC);
        let mut head = [0; 4];
        c.read_exact(&mut head).unwrap();
        assert_eq!(u16::from_be_bytes([head[0], head[1]]), REPLY_FLAG_DONE);
        assert_eq!(u16::from_be_bytes([head[2], head[3]]), REPLY_TYPE_BLOCK_STATUS);
        assert_eq!(read_u64(c).unwrap(), cookie);
        let len = read_u32(c).unwrap();
        assert!(len >= 12 && (len - 4).is_multiple_of(8), "length {len}");
        let id = read_u32(c).unwrap();
        let descriptors = (0..(len - 4) / 8)
            .map(|_| (read_u32(c).unwrap(), read_u32(c).unwrap()))
            .collect();
        (id, descriptors)
    }

    #[test]
    fn base_allocation_is_negotiated_and_reported() {
        let (mut c, _memory, handle) = start();
        let flags = negotiate_with(&mut c, |c| {
            // LIST with no query lists it (id 0); SET for another export
            // is refused; SET with an unknown namespace selects nothing;
            // SET with malformed lengths is invalid; then it is selected.
            send_option(c, OPT_LIST_META_CONTEXT, &meta_request(b"tessera", &[]));
            let (kind, data) = option_reply(c, OPT_LIST_META_CONTEXT);
            assert_eq!(
                (kind, &data[..4], &data[4..]),
                (REP_META_CONTEXT, &[0u8; 4][..], &b"base:allocation"[..])
            );
            assert_eq!(option_reply(c, OPT_LIST_META_CONTEXT).0, REP_ACK);
            send_option(c, OPT_SET_META_CONTEXT, &meta_request(b"other", &[b"base:allocation"]));
            assert_eq!(option_reply(c, OPT_SET_META_CONTEXT).0, REP_ERR_UNKNOWN);
            send_option(
                c,
                OPT_SET_META_CONTEXT,
                &meta_request(b"tessera", &[b"qemu:dirty-bitmap:x"]),
            );
            assert_eq!(option_reply(c, OPT_SET_META_CONTEXT).0, REP_ACK);
            let mut bad = meta_request(b"tessera", &[b"base:allocation"]);
            bad.pop();
            send_option(c, OPT_SET_META_CONTEXT, &bad);
            assert_eq!(option_reply(c, OPT_SET_META_CONTEXT).0, REP_ERR_INVALID);
            send_option(c, OPT_SET_META_CONTEXT, &meta_request(b"", &[b"base:allocation"]));
            let (kind, data) = option_reply(c, OPT_SET_META_CONTEXT);
            assert_eq!(kind, REP_META_CONTEXT);
            assert_eq!(u32::from_be_bytes(data[..4].try_into().unwrap()), BASE_ALLOCATION_ID);
            assert_eq!(option_reply(c, OPT_SET_META_CONTEXT).0, REP_ACK);
        });
        assert_ne!(flags & TFLAG_SEND_FAST_ZERO, 0);
        // Block 1 zeroed (FAST_ZERO: zeroing is always fast here), block
        // 3 too: runs from 100 bytes into block 0 to the middle of block 4.
        request(&mut c, CMD_FLAG_FAST_ZERO, CMD_WRITE_ZEROES, 1, 4096, 4096, &[]);
        assert_eq!(reply_error(&mut c, 1), 0);
        request(&mut c, 0, CMD_WRITE_ZEROES, 2, 3 * 4096, 4096, &[]);
        assert_eq!(reply_error(&mut c, 2), 0);
        request(&mut c, 0, CMD_BLOCK_STATUS, 3, 100, 4 * 4096, &[]);
        let hole = STATE_HOLE | STATE_ZERO;
        assert_eq!(
            block_status_reply(&mut c, 3),
            (
                BASE_ALLOCATION_ID,
                vec![(4096 - 100, 0), (4096, hole), (4096, 0), (4096, hole), (100, 0)]
            )
        );
        // REQ_ONE: one descriptor, within the request.
        request(&mut c, CMD_FLAG_REQ_ONE, CMD_BLOCK_STATUS, 4, 4096, 3 * 4096, &[]);
        assert_eq!(block_status_reply(&mut c, 4), (BASE_ALLOCATION_ID, vec![(4096, hole)]));
        // Past the end: invalid.
        request(&mut c, 0, CMD_BLOCK_STATUS, 5, SIZE as u64 - 4096, 8192, &[]);
        assert_eq!(reply_error(&mut c, 5), errno::EINVAL);
        request(&mut c, 0, CMD_DISC, 6, 0, 0, &[]);
        handle.join().unwrap().unwrap();
    }

    /// An export whose writes take a while, recording when each finished.
    struct Slow {
        memory: Memory,
        done: Mutex<Vec<std::time::Instant>>,
    }

    impl Export for Slow {
        fn size(&self) -> u64 {
            self.memory.size()
        }
        fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), Failure> {
            self.memory.read(offset, buf)
        }
        fn write(&self, offset: u64, bytes: &[u8], fua: bool) -> Result<(), Failure> {
            std::thread::sleep(std::time::Duration::from_millis(300));
            self.memory.write(offset, bytes, fua)?;
            self.done.lock().unwrap().push(std::time::Instant::now());
            Ok(())
        }
        fn flush(&self) -> Result<(), Failure> {
            Ok(())
        }
        fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), Failure> {
            self.memory.trim(offset, len, fua)
        }
        fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), Failure> {
            self.memory.write_zeroes(offset, len, fua)
        }
    }

    #[test]
    fn a_stopping_server_answers_what_is_in_flight_before_run_returns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nbd.sock");
        let slow = Arc::new(Slow {
            memory: Memory(Mutex::new(vec![7u8; SIZE])),
            done: Mutex::new(Vec::new()),
        });
        let server = Arc::new(Server::new(
            slow.clone(),
            "tessera".to_string(),
            "test".to_string(),
            Limits::default(),
        ));
        let stop = Arc::new(AtomicBool::new(false));
        let listener = Listener::Unix(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let running = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                run(server, listener, stop).unwrap();
                std::time::Instant::now()
            })
        };
        let mut c = UnixStream::connect(&path).unwrap();
        negotiate(&mut c);
        // Two writes in flight, then the server is told to stop.
        request(&mut c, 0, CMD_WRITE, 1, 0, 4, b"abcd");
        request(&mut c, 0, CMD_WRITE, 2, 4096, 4, b"efgh");
        std::thread::sleep(std::time::Duration::from_millis(50));
        stop.store(true, Ordering::Relaxed);
        // Both are answered, and run returns only after both were stored.
        c.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
        let mut answered: Vec<u64> = (0..2)
            .map(|_| {
                assert_eq!(read_u32(&mut c).unwrap(), SIMPLE_REPLY_MAGIC);
                assert_eq!(read_u32(&mut c).unwrap(), 0, "the write succeeded");
                read_u64(&mut c).unwrap()
            })
            .collect();
        answered.sort_unstable();
        assert_eq!(answered, [1, 2]);
        let returned = running.join().unwrap();
        let done = slow.done.lock().unwrap().clone();
        assert_eq!(done.len(), 2, "both writes were carried out");
        assert!(
            done.iter().all(|&d| d <= returned),
            "run returned before a write in flight was done"
        );
        assert_eq!(&slow.memory.0.lock().unwrap()[4096..4100], b"efgh");
    }

    /// An export whose writes fail, saying why.
    struct Failing(Memory);

    impl Export for Failing {
        fn size(&self) -> u64 {
            self.0.size()
        }
        fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), Failure> {
            self.0.read(offset, buf)
        }
        fn write(&self, _offset: u64, _bytes: &[u8], _fua: bool) -> Result<(), Failure> {
            Err(Failure {
                errno: errno::EIO,
                message: Some("member 3 (disk-3) failed: more than M members are gone".to_string()),
            })
        }
        fn flush(&self) -> Result<(), Failure> {
            Err(errno::EIO.into())
        }
        fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), Failure> {
            self.0.trim(offset, len, fua)
        }
        fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), Failure> {
            self.0.write_zeroes(offset, len, fua)
        }
    }

    #[test]
    fn structured_errors_carry_the_exports_message() {
        let (mut c, _export, handle) = start_with(Arc::new(Failing(Memory(Mutex::new(vec![0u8; SIZE])))));
        negotiate(&mut c);
        let message = |c: &mut UnixStream, cookie: u64| -> (u32, String) {
            assert_eq!(read_u32(c).unwrap(), STRUCTURED_REPLY_MAGIC);
            error_chunk(c, cookie)
        };
        request(&mut c, 0, CMD_WRITE, 1, 0, 4, b"abcd");
        assert_eq!(
            message(&mut c, 1),
            (
                errno::EIO,
                "member 3 (disk-3) failed: more than M members are gone".to_string()
            )
        );
        // Without a message of its own: the errno's.
        request(&mut c, 0, CMD_FLUSH, 2, 0, 0, &[]);
        assert_eq!(message(&mut c, 2), (errno::EIO, "I/O error in the array".to_string()));
        request(&mut c, 0, CMD_DISC, 3, 0, 0, &[]);
        handle.join().unwrap().unwrap();
    }

    /// A large export of zeros that keeps nothing: reads fill the buffer.
    struct Zeros;

    const ZEROS_SIZE: u64 = 1 << 30;

    impl Export for Zeros {
        fn size(&self) -> u64 {
            ZEROS_SIZE
        }
        fn read(&self, _offset: u64, buf: &mut [u8]) -> Result<(), Failure> {
            buf.fill(0);
            Ok(())
        }
        fn write(&self, _offset: u64, _bytes: &[u8], _fua: bool) -> Result<(), Failure> {
            Ok(())
        }
        fn flush(&self) -> Result<(), Failure> {
            Ok(())
        }
        fn trim(&self, _offset: u64, _len: u64, _fua: bool) -> Result<(), Failure> {
            Ok(())
        }
        fn write_zeroes(&self, _offset: u64, _len: u64, _fua: bool) -> Result<(), Failure> {
            Ok(())
        }
    }

    /// A server on a Unix socket in `dir`, run until the returned flag is set.
    fn listen<E: Export + 'static>(
        dir: &std::path::Path,
        export: Arc<E>,
        limits: Limits,
    ) -> (
        std::path::PathBuf,
        Arc<AtomicBool>,
        std::thread::JoinHandle<io::Result<()>>,
    ) {
        let path = dir.join("nbd.sock");
        let server = Arc::new(Server::new(export, "tessera".to_string(), "test".to_string(), limits));
        let listener = Listener::Unix(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let handle = {
            let stop = stop.clone();
            std::thread::spawn(move || run(server, listener, stop))
        };
        (path, stop, handle)
    }

    fn resident_bytes() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    }

    #[test]
    fn pipelined_large_reads_never_collected_hold_bounded_memory() {
        let dir = tempfile::tempdir().unwrap();
        let (path, stop, handle) = listen(dir.path(), Arc::new(Zeros), Limits::default());
        let before = resident_bytes();
        // Sixteen 32 MiB reads whose replies are never taken.
        let mut greedy = UnixStream::connect(&path).unwrap();
        negotiate_with(&mut greedy, |_| {});
        for cookie in 0..16 {
            request(&mut greedy, 0, CMD_READ, cookie, cookie * (32 << 20), 32 << 20, &[]);
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
        let grown = resident_bytes().saturating_sub(before);
        // Another client is still served.
        let mut polite = UnixStream::connect(&path).unwrap();
        negotiate_with(&mut polite, |_| {});
        request(&mut polite, 0, CMD_WRITE, 1, 0, 4, b"abcd");
        assert_eq!(reply_error(&mut polite, 1), 0);
        // One connection holds at most 64 MiB of replies (two of these);
        // without a bound the server held all sixteen, 512 MiB.
        assert!(grown < 200 << 20, "the server grew by {} MiB", grown >> 20);
        drop(greedy);
        drop(polite);
        stop.store(true, Ordering::Relaxed);
        handle.join().unwrap().unwrap();
    }

    #[test]
    fn connections_beyond_the_limit_are_closed() {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits {
            max_connections: 2,
            ..Limits::default()
        };
        let (path, stop, handle) = listen(dir.path(), Arc::new(Zeros), limits);
        let greeted = |c: &mut UnixStream| {
            c.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
            read_u64(c).is_ok_and(|magic| magic == NBDMAGIC)
        };
        let mut first = UnixStream::connect(&path).unwrap();
        let mut second = UnixStream::connect(&path).unwrap();
        assert!(greeted(&mut first) && greeted(&mut second));
        let mut third = UnixStream::connect(&path).unwrap();
        assert!(!greeted(&mut third), "a third connection was served");
        drop(first);
        // Once one has gone, a new one is served.
        let served = (0..100).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            greeted(&mut UnixStream::connect(&path).unwrap())
        });
        assert!(served);
        drop(second);
        stop.store(true, Ordering::Relaxed);
        handle.join().unwrap().unwrap();
    }

    #[test]
    fn export_name_and_abort() {
        let (mut c, _memory, handle) = start();
        read_u64(&mut c).unwrap();
        read_u64(&mut c).unwrap();
        let mut flags = [0; 2];
        c.read_exact(&mut flags).unwrap();
        c.write_all(&CLIENT_FLAG_FIXED_NEWSTYLE.to_be_bytes()).unwrap();
        send_option(&mut c, OPT_EXPORT_NAME, b"");
        assert_eq!(read_u64(&mut c).unwrap(), SIZE as u64);
        let mut rest = [0; 2 + 124];
        c.read_exact(&mut rest).unwrap();
        request(&mut c, 0, CMD_DISC, 1, 0, 0, &[]);
        assert!(handle.join().unwrap().is_ok());

        let (mut c, _memory, handle) = start();
        let mut hello = [0; 18];
        c.read_exact(&mut hello).unwrap();
        c.write_all(&CLIENT_FLAG_FIXED_NEWSTYLE.to_be_bytes()).unwrap();
        send_option(&mut c, OPT_ABORT, b"");
        assert_eq!(option_reply(&mut c, OPT_ABORT).0, REP_ACK);
        assert!(handle.join().unwrap().is_ok());
    }
}
