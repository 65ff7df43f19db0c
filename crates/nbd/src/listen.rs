//! The listener: accepts clients (TCP, a Unix socket, or a socket systemd
//! passed in), serves each on its own thread up to the connection limit,
//! and on stop drains: no new clients, every request received answered,
//! before `run` returns.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::export::Export;
use crate::server::Server;

/// How long a stopping server waits for its connections to answer what
/// they have in flight.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the accepting thread sleeps when no client is waiting.
const ACCEPT_POLL: Duration = Duration::from_millis(20);

/// A listening socket: TCP or Unix.
pub enum Listener {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener),
}

/// The first file descriptor systemd passes (`SD_LISTEN_FDS_START`).
const LISTEN_FDS_START: i32 = 3;

impl Listener {
    /// The listening socket systemd passed by socket activation
    /// (`LISTEN_PID` is this process, `LISTEN_FDS` at least 1), or `None`
    /// if there is none. The variables are removed so that no child
    /// process takes them for its own.
    pub fn from_systemd() -> io::Result<Option<Listener>> {
        let for_us = std::env::var("LISTEN_PID").ok().and_then(|p| p.parse::<u32>().ok()) == Some(std::process::id());
        let count = std::env::var("LISTEN_FDS").ok().and_then(|n| n.parse::<u32>().ok());
        if !for_us || count.unwrap_or(0) == 0 {
            return Ok(None);
        }
        if count != Some(1) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "systemd passed more than one socket (LISTEN_FDS); Tessera serves one",
            ));
        }
        // SAFETY: with LISTEN_PID naming this process, fd 3 is the socket
        // systemd passed to it, and nothing else in it owns the fd.
        let fd = unsafe { OwnedFd::from_raw_fd(LISTEN_FDS_START) };
        // Called before the server starts its threads, so nothing reads
        // the environment meanwhile.
        for name in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
            std::env::remove_var(name);
        }
        let mut address: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: `address` and `len` are a valid buffer and its size.
        let got = unsafe {
            libc::getsockname(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                (&mut address as *mut libc::sockaddr_storage).cast(),
                &mut len,
            )
        };
        if got != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("the socket systemd passed (fd 3): {e}"),
            ));
        }
        match i32::from(address.ss_family) {
            libc::AF_UNIX => Ok(Some(Listener::Unix(fd.into()))),
            libc::AF_INET | libc::AF_INET6 => Ok(Some(Listener::Tcp(fd.into()))),
            family => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the socket systemd passed (fd 3) is of address family {family}, not TCP or Unix"),
            )),
        }
    }

    /// Where clients reach it, as an NBD URI for export `name`.
    pub fn uri(&self, name: &str, tls: bool) -> io::Result<String> {
        let s = if tls { "s" } else { "" };
        Ok(match self {
            Listener::Tcp(l) => format!("nbd{s}://{}/{name}", l.local_addr()?),
            Listener::Unix(l) => {
                let address = l.local_addr()?;
                let path = address
                    .as_pathname()
                    .map_or("(unnamed)".into(), |p| p.display().to_string());
                format!("nbd{s}+unix:///{name}?socket={path}")
            }
        })
    }
}

/// A connection being served: its thread, whether it has finished its
/// handshake, and how to close it.
struct Served {
    thread: std::thread::JoinHandle<()>,
    negotiated: Arc<AtomicBool>,
    close: Box<dyn Fn() + Send>,
}

/// At most one line a second about connections closed to keep within
/// the limits, with how many there were: a flood of them must not grow
/// the log without bound.
struct RefusalLog {
    last: Option<Instant>,
    unreported: u64,
}

impl RefusalLog {
    const EVERY: Duration = Duration::from_secs(1);

    fn refused(&mut self, why: &str) {
        self.unreported += 1;
        if self.last.is_none_or(|t| t.elapsed() >= Self::EVERY) {
            eprintln!(
                "tessera: closed {} connection(s) since the last such line: {why}",
                self.unreported
            );
            self.unreported = 0;
            self.last = Some(Instant::now());
        }
    }
}

/// Accepts clients until `stop` is set, serving each on its own thread.
/// At the limit, a newcomer takes the place of the connection that has
/// waited longest without finishing its handshake (clients that connect
/// and say nothing cannot keep others out); only when every connection is
/// past its handshake is the newcomer closed at once. Then stops
/// accepting and waits (up to 30 s) for every connection to carry out
/// and answer the requests it has received, so that what the caller does
/// next (a final FLUSH and checkpoint) comes after them.
pub fn run<E: Export>(server: Arc<Server<E>>, listener: Listener, stop: Arc<AtomicBool>) -> io::Result<()> {
    match &listener {
        Listener::Tcp(l) => l.set_nonblocking(true)?,
        Listener::Unix(l) => l.set_nonblocking(true)?,
    }
    let mut connections: Vec<Served> = Vec::new();
    let mut refusals = RefusalLog {
        last: None,
        unreported: 0,
    };
    let mut result = Ok(());
    while !stop.load(Ordering::Relaxed) {
        let negotiated = Arc::new(AtomicBool::new(false));
        type Accepted = (Box<dyn FnOnce() + Send>, Box<dyn Fn() + Send>);
        let accepted: io::Result<Accepted> = match &listener {
            Listener::Tcp(l) => l.accept().and_then(|(s, peer)| {
                s.set_nonblocking(false)?;
                s.set_nodelay(true)?;
                // Shut down when the connection ends too: the copy kept
                // to close it would otherwise keep the client waiting.
                let (closer, ender) = (s.try_clone()?, s.try_clone()?);
                let (server, stop, noted) = (server.clone(), stop.clone(), negotiated.clone());
                Ok((
                    Box::new(move || {
                        log_end(&peer.to_string(), server.serve_noting(s, &stop, &noted));
                        let _ = ender.shutdown(std::net::Shutdown::Both);
                    }) as Box<dyn FnOnce() + Send>,
                    Box::new(move || drop(closer.shutdown(std::net::Shutdown::Both))) as Box<dyn Fn() + Send>,
                ))
            }),
            Listener::Unix(l) => l.accept().and_then(|(s, _)| {
                s.set_nonblocking(false)?;
                let (closer, ender) = (s.try_clone()?, s.try_clone()?);
                let (server, stop, noted) = (server.clone(), stop.clone(), negotiated.clone());
                Ok((
                    Box::new(move || {
                        log_end("unix client", server.serve_noting(s, &stop, &noted));
                        let _ = ender.shutdown(std::net::Shutdown::Both);
                    }) as Box<dyn FnOnce() + Send>,
                    Box::new(move || drop(closer.shutdown(std::net::Shutdown::Both))) as Box<dyn Fn() + Send>,
                ))
            }),
        };
        match accepted {
            Ok((handler, close)) => {
                connections.retain(|c| !c.thread.is_finished());
                if connections.len() >= server.limits().max_connections {
                    // The oldest still in its handshake makes room; its
                    // thread ends as its next read fails. Closed ones are
                    // dropped from the list, so at most twice the limit
                    // run for the moment that takes.
                    match connections.iter().position(|c| !c.negotiated.load(Ordering::Acquire)) {
                        Some(oldest) => {
                            let evicted = connections.remove(oldest);
                            (evicted.close)();
                            refusals.refused(
                                "the oldest still in its handshake, to make room for a newcomer (--max-connections)",
                            );
                        }
                        None => {
                            // Dropping the handler closes the connection.
                            refusals.refused("newcomers, all --max-connections being past their handshake");
                            continue;
                        }
                    }
                }
                match std::thread::Builder::new()
                    .name("nbd-connection".to_string())
                    .spawn(handler)
                {
                    Ok(thread) => connections.push(Served {
                        thread,
                        negotiated,
                        close,
                    }),
                    Err(e) => refusals.refused(&format!("no thread for it: {e}")),
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {
                std::thread::sleep(ACCEPT_POLL);
            }
            Err(e) => {
                result = Err(e);
                stop.store(true, Ordering::Relaxed);
            }
        }
    }
    drop(listener);
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    while connections.iter().any(|c| !c.thread.is_finished()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let left = connections.iter().filter(|c| !c.thread.is_finished()).count();
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
