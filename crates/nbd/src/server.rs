//! One export under one name, and the life of a connection to it:
//! greeting, option negotiation (with NBD_OPT_STARTTLS, after which it
//! goes on over TLS), then the transmission phase.
//!
//! Threads (see also `transmit` and `pool`): a connection is served by
//! its own thread, which reads requests, and a writer thread, which sends
//! replies; the requests themselves are carried out by the server's
//! worker pool, shared by all connections. A TLS connection has one more
//! thread, which moves bytes between the client's socket and a socket
//! pair the other two use (`tls`). So a connection costs two or three
//! threads however deep its queue, and `Limits::max_connections` bounds
//! them all.

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use crate::export::{Catalog, Export, Single};
use crate::negotiate::Negotiated;
use crate::pool::Pool;
use crate::tls::Tls;
use crate::transmit::Budget;
use crate::wire::{self, REQUEST_BYTES_MAX};

/// A client connection: a byte stream that can be split into a reading
/// and a writing half.
pub trait Connection: Read + Write + AsRawFd + Send + Sized + 'static {
    fn try_clone(&self) -> io::Result<Self>;
    /// How long a read may wait (`None`: for ever).
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
    /// How long a write may wait for the peer (`None`: for ever).
    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()>;
    /// Ends both directions, so that a thread blocked on either returns.
    fn shutdown(&self) -> io::Result<()>;
}

macro_rules! connection {
    ($stream:ty) => {
        impl Connection for $stream {
            fn try_clone(&self) -> io::Result<Self> {
                <$stream>::try_clone(self)
            }
            fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
                <$stream>::set_read_timeout(self, timeout)
            }
            fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
                <$stream>::set_write_timeout(self, timeout)
            }
            fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
                <$stream>::set_nonblocking(self, nonblocking)
            }
            fn shutdown(&self) -> io::Result<()> {
                <$stream>::shutdown(self, std::net::Shutdown::Both)
            }
        }
    };
}
connection!(std::os::unix::net::UnixStream);
connection!(std::net::TcpStream);

/// How long a client may take over each read of the handshake.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a reply may wait for the client to take any of it before the
/// connection is dropped (and what it held let go).
pub(crate) const REPLY_TIMEOUT: Duration = Duration::from_secs(60);

/// What one server may hold at once, so that clients cannot make it use
/// memory or threads without bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; more are closed at accept. Each costs
    /// two threads (three with TLS).
    pub max_connections: usize,
    /// Request bytes one connection may hold: at least one request of the
    /// largest size. A client that pipelines large reads and does not
    /// take the replies stops being read from here.
    pub connection_bytes: usize,
    /// Request bytes all connections together may hold.
    pub total_bytes: usize,
    /// Threads that carry out requests, shared by all connections: the
    /// most requests worked on at once.
    pub workers: usize,
    /// A connection with nothing in flight that sends no request for this
    /// long is closed (`None`: never).
    pub idle_timeout: Option<Duration>,
}

/// Requests one connection may have in flight (received, not yet
/// answered); more wait in the socket. nbdcopy queues 64 by default.
pub const REQUESTS_IN_FLIGHT_MAX: usize = 64;

impl Default for Limits {
    fn default() -> Limits {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Limits {
            max_connections: 64,
            connection_bytes: 2 * REQUEST_BYTES_MAX as usize,
            total_bytes: 1 << 30,
            // Requests mostly wait on member I/O, not on a core: more
            // workers than cores keep the members busy. 16 was what one
            // connection had to itself before the pool, and is what
            // clients' queue depths (qemu, fio: 1-16) need.
            workers: (4 * cores).max(16),
            idle_timeout: None,
        }
    }
}

/// The exports of a [`Catalog`], each under its name.
pub struct Server<E: Export> {
    pub(crate) catalog: Arc<dyn Catalog<E>>,
    pub(crate) limits: Limits,
    /// Request bytes held by all connections (read replies being
    /// produced or sent, write payloads received and not yet stored).
    pub(crate) held: Arc<Budget>,
    /// Bytes of spare buffers kept by all connections (at most
    /// `transmit::SPARE_BYTES_MAX`).
    pub(crate) spare_bytes: Arc<std::sync::atomic::AtomicUsize>,
    pub(crate) pool: Pool,
    pub(crate) tls: Option<Tls>,
}

impl<E: Export> Server<E> {
    /// A server of `export` under `name` alone, without TLS.
    pub fn new(export: Arc<E>, name: String, description: String, limits: Limits) -> Server<E> {
        let single = Single {
            export,
            name,
            description,
        };
        Server::with_catalog(Arc::new(single), limits)
    }

    /// A server of the exports in `catalog`, without TLS. The limits are
    /// raised where they would not let one request of the largest size
    /// through.
    pub fn with_catalog(catalog: Arc<dyn Catalog<E>>, limits: Limits) -> Server<E> {
        let largest = REQUEST_BYTES_MAX as usize;
        let limits = Limits {
            max_connections: limits.max_connections.max(1),
            connection_bytes: limits.connection_bytes.max(largest),
            total_bytes: limits.total_bytes.max(largest),
            workers: limits.workers.max(1),
            idle_timeout: limits.idle_timeout,
        };
        Server {
            catalog,
            limits,
            held: Arc::new(Budget::new(limits.total_bytes)),
            spare_bytes: Arc::default(),
            pool: Pool::new(limits.workers),
            tls: None,
        }
    }

    /// The same server, offering (or requiring) TLS as `tls` says.
    pub fn with_tls(self, tls: Tls) -> Server<E> {
        Server { tls: Some(tls), ..self }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub(crate) fn transmission_flags(&self, structured: bool) -> u16 {
        let mut flags = wire::TFLAG_HAS_FLAGS
            | wire::TFLAG_SEND_FLUSH
            | wire::TFLAG_SEND_FUA
            | wire::TFLAG_SEND_TRIM
            | wire::TFLAG_SEND_WRITE_ZEROES
            | wire::TFLAG_SEND_FAST_ZERO
            | wire::TFLAG_SEND_CACHE
            | wire::TFLAG_CAN_MULTI_CONN;
        if structured {
            flags |= wire::TFLAG_SEND_DF;
        }
        flags
    }

    /// The export a client named, if there is one by that name.
    pub(crate) fn lookup(&self, name: &[u8]) -> Option<(String, Arc<E>)> {
        let name = std::str::from_utf8(name).ok()?;
        let export = self.catalog.open(name)?;
        let name = match name {
            "" => self
                .catalog
                .list()
                .into_iter()
                .next()
                .map(|(n, _)| n)
                .unwrap_or_default(),
            _ => name.to_string(),
        };
        Some((name, export))
    }

    /// Serves one client until it disconnects or `stop` is set.
    pub fn serve<S: Connection>(&self, stream: S, stop: &AtomicBool) -> io::Result<()> {
        self.serve_noting(stream, stop, &AtomicBool::new(false))
    }

    /// [`Server::serve`], setting `negotiated` once the handshake is done
    /// and transmission begins (until then the connection may be closed to
    /// make room for another; see `listen::run`).
    pub fn serve_noting<S: Connection>(&self, stream: S, stop: &AtomicBool, negotiated: &AtomicBool) -> io::Result<()> {
        stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        stream.set_write_timeout(Some(REPLY_TIMEOUT))?;
        let mut stream = io::BufReader::new(stream);
        stream.get_mut().write_all(&wire::greeting())?;
        let mut flags = [0; 4];
        stream.read_exact(&mut flags)?;
        let no_zeroes = wire::parse_client_flags(flags).map_err(invalid_data)?;
        match self.negotiate(&mut stream, no_zeroes, false)? {
            Negotiated::Transmission(session, export) => {
                negotiated.store(true, std::sync::atomic::Ordering::Release);
                self.transmit(&mut stream, session, &export, stop)
            }
            Negotiated::Closed => Ok(()),
            Negotiated::StartTls => {
                // The client waits for the handshake before sending more;
                // bytes already buffered would be plaintext smuggled in.
                if !stream.buffer().is_empty() {
                    return Err(invalid_data("data after NBD_OPT_STARTTLS before the TLS handshake"));
                }
                let tls = self
                    .tls
                    .as_ref()
                    .expect("STARTTLS is accepted only with TLS configured");
                let (plain, pump) = tls.accept(stream.into_inner())?;
                plain.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
                plain.set_write_timeout(Some(REPLY_TIMEOUT))?;
                let mut plain = io::BufReader::new(plain);
                let served = match self.negotiate(&mut plain, no_zeroes, true) {
                    Ok(Negotiated::Transmission(session, export)) => {
                        negotiated.store(true, std::sync::atomic::Ordering::Release);
                        self.transmit(&mut plain, session, &export, stop)
                    }
                    Ok(_) => Ok(()),
                    Err(e) => Err(e),
                };
                // Closing the plain end lets the pump finish and go.
                drop(plain);
                let pumped = pump
                    .join()
                    .unwrap_or_else(|_| Err(io::Error::other("the TLS thread panicked")));
                served.and(pumped)
            }
        }
    }
}

/// An error for bytes from the client that cannot be trusted.
pub(crate) fn invalid_data(why: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.to_string())
}
