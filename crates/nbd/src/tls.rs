//! TLS for NBD_OPT_STARTTLS, with OpenSSL: X.509 certificates laid out as
//! qemu-nbd and nbdkit expect (`DIR/server-cert.pem`, `server-key.pem`,
//! and `ca-cert.pem` to check client certificates with), or pre-shared
//! keys in psktool's format (`identity:hexkey` lines).
//!
//! After the handshake a thread of the connection's own (the pump) moves
//! bytes between the client's socket and one end of a Unix socket pair;
//! the rest of the server reads and writes the other end, as it would a
//! plaintext client, with the same threads, budgets and timeouts. The
//! pump holds the TLS session alone, so no lock is shared between a
//! reading and a writing thread.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use openssl::ssl::{ErrorCode, HandshakeError, SslAcceptor, SslFiletype, SslMethod, SslStream, SslVerifyMode};

use crate::server::{Connection, HANDSHAKE_TIMEOUT, REPLY_TIMEOUT};

/// Why TLS could not be set up from what the user gave.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("{what} ({path}): {source}")]
    OpenSsl {
        what: &'static str,
        path: PathBuf,
        source: openssl::error::ErrorStack,
    },
    #[error("{path}, line {line}: {why} (psktool's format: one `identity:hexkey` per line)")]
    PskFile {
        path: PathBuf,
        line: usize,
        why: &'static str,
    },
    #[error("{0} holds no keys")]
    NoKeys(PathBuf),
}

/// How a server offers TLS.
pub struct Tls {
    acceptor: SslAcceptor,
    required: bool,
}

/// Bytes the pump moves in one step each way.
const PUMP_BUFFER_BYTES: usize = 256 << 10;
/// The longest a pre-shared key may be (psktool makes 32 bytes).
const PSK_BYTES_MAX: usize = 256;

impl Tls {
    /// X.509: the server's certificate and key from `dir`; with
    /// `verify_peer`, clients must present a certificate signed by
    /// `dir/ca-cert.pem`.
    pub fn x509(dir: &Path, verify_peer: bool, required: bool) -> Result<Tls, TlsError> {
        let openssl = |what, path: &Path| {
            let path = path.to_path_buf();
            move |source| TlsError::OpenSsl { what, path, source }
        };
        let (cert, key, ca) = (
            dir.join("server-cert.pem"),
            dir.join("server-key.pem"),
            dir.join("ca-cert.pem"),
        );
        for path in [&cert, &key] {
            std::fs::metadata(path).map_err(|source| TlsError::Read {
                path: path.clone(),
                source,
            })?;
        }
        let mut builder =
            SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server()).map_err(openssl("setting up TLS", dir))?;
        builder
            .set_certificate_chain_file(&cert)
            .map_err(openssl("loading the server certificate", &cert))?;
        builder
            .set_private_key_file(&key, SslFiletype::PEM)
            .map_err(openssl("loading the server key", &key))?;
        builder
            .check_private_key()
            .map_err(openssl("the key does not match the certificate", &key))?;
        if verify_peer {
            builder
                .set_ca_file(&ca)
                .map_err(openssl("loading the CA certificate to check clients with", &ca))?;
            builder.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
        }
        Ok(Tls {
            acceptor: builder.build(),
            required,
        })
    }

    /// Pre-shared keys from `file` (psktool's format).
    pub fn psk(file: &Path, required: bool) -> Result<Tls, TlsError> {
        let keys = Arc::new(read_psk_file(file)?);
        let openssl = |what| {
            move |source| TlsError::OpenSsl {
                what,
                path: file.to_path_buf(),
                source,
            }
        };
        let mut builder =
            SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server()).map_err(openssl("setting up TLS"))?;
        // TLS 1.2 needs PSK cipher suites; TLS 1.3 uses its own suites
        // with the key from the same callback. Forward secrecy either way.
        builder
            .set_cipher_list("kECDHEPSK:kDHEPSK:!SHA1:!CAMELLIA:!ARIA:!CCM8")
            .map_err(openssl("choosing PSK cipher suites"))?;
        builder.set_psk_server_callback(move |_ssl, identity, out| {
            // An unknown identity gives no key, and the handshake fails
            // (as does a key longer than OpenSSL takes, 512 bytes since
            // 1.1.1, which the file's own limit already keeps out).
            let key = identity
                .and_then(|id| keys.get(id))
                .filter(|key| key.len() <= out.len());
            Ok(key.map_or(0, |key| {
                out[..key.len()].copy_from_slice(key);
                key.len()
            }))
        });
        Ok(Tls {
            acceptor: builder.build(),
            required,
        })
    }

    /// Whether clients must use TLS (`--tls require`) or may (`on`).
    pub fn required(&self) -> bool {
        self.required
    }

    /// The TLS handshake on `stream`, then a pump thread: returns the
    /// plaintext end to serve the client through, and the pump, which
    /// ends once both sides are done.
    pub(crate) fn accept<S: Connection>(&self, stream: S) -> io::Result<(UnixStream, JoinHandle<io::Result<()>>)> {
        stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        stream.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
        let tls = self.acceptor.accept(stream).map_err(|e| {
            let why = match e {
                HandshakeError::SetupFailure(e) => e.to_string(),
                HandshakeError::Failure(m) | HandshakeError::WouldBlock(m) => m.error().to_string(),
            };
            io::Error::new(io::ErrorKind::PermissionDenied, format!("TLS handshake failed: {why}"))
        })?;
        let (plain, inner) = UnixStream::pair()?;
        let pump = std::thread::Builder::new()
            .name("nbd-tls".to_string())
            .spawn(move || pump(tls, inner))?;
        Ok((plain, pump))
    }
}

fn read_psk_file(path: &Path) -> Result<HashMap<Vec<u8>, Vec<u8>>, TlsError> {
    let text = std::fs::read_to_string(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut keys = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let bad = |why| TlsError::PskFile {
            path: path.to_path_buf(),
            line: i + 1,
            why,
        };
        if line.trim().is_empty() {
            continue;
        }
        let (identity, hex) = line.split_once(':').ok_or_else(|| bad("no ':'"))?;
        let hex = hex.trim();
        if identity.is_empty() {
            return Err(bad("empty identity"));
        }
        if hex.is_empty() || hex.len() % 2 != 0 || hex.len() / 2 > PSK_BYTES_MAX {
            return Err(bad("the key is not an even number of hex digits, 2 to 512"));
        }
        let key = (0..hex.len())
            .step_by(2)
            .map(|at| u8::from_str_radix(&hex[at..at + 2], 16))
            .collect::<Result<Vec<u8>, _>>()
            .map_err(|_| bad("the key is not hexadecimal"))?;
        keys.insert(identity.as_bytes().to_vec(), key);
    }
    if keys.is_empty() {
        return Err(TlsError::NoKeys(path.to_path_buf()));
    }
    Ok(keys)
}

/// Bytes on their way through the pump in one direction: `bytes[sent..len]`.
struct Pending {
    bytes: Vec<u8>,
    len: usize,
    sent: usize,
}

impl Pending {
    fn new() -> Pending {
        Pending {
            bytes: vec![0; PUMP_BUFFER_BYTES],
            len: 0,
            sent: 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.sent == self.len
    }

    fn filled(&mut self, len: usize) {
        (self.len, self.sent) = (len, 0);
    }

    fn waiting(&self) -> &[u8] {
        &self.bytes[self.sent..self.len]
    }
}

/// Moves bytes between the TLS session and the plaintext end until the
/// server's side closes it (after flushing what it sent) or either
/// peer's side fails. Both sockets are non-blocking; the pump sleeps in
/// poll(2) only when neither direction can move.
fn pump<S: Connection>(mut tls: SslStream<S>, mut plain: UnixStream) -> io::Result<()> {
    tls.get_ref().set_nonblocking(true)?;
    plain.set_nonblocking(true)?;
    // Client -> server: decrypted, waiting for the plaintext end.
    let mut inbound = Pending::new();
    // Server -> client: read from the plaintext end, to be encrypted.
    let mut outbound = Pending::new();
    let mut client_done = false;
    let mut last_progress = Instant::now();
    loop {
        let mut progress = false;
        let mut tls_wants_write = false;
        // Server -> client.
        if outbound.is_empty() {
            match plain.read(&mut outbound.bytes) {
                Ok(0) => break, // the server is done with this client
                Ok(n) => {
                    outbound.filled(n);
                    progress = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => progress = true,
                Err(e) => return Err(e),
            }
        }
        if !outbound.is_empty() {
            match tls.ssl_write(outbound.waiting()) {
                Ok(n) => {
                    outbound.sent += n;
                    progress = true;
                }
                Err(e) if e.code() == ErrorCode::WANT_WRITE => tls_wants_write = true,
                Err(e) if e.code() == ErrorCode::WANT_READ => {}
                Err(e) => return Err(tls_error(e)),
            }
        }
        // Client -> server.
        if inbound.is_empty() && !client_done {
            match tls.ssl_read(&mut inbound.bytes) {
                Ok(0) => client_done = true,
                Ok(n) => inbound.filled(n),
                Err(e) if e.code() == ErrorCode::ZERO_RETURN => client_done = true,
                Err(e) if e.code() == ErrorCode::WANT_READ => {}
                Err(e) if e.code() == ErrorCode::WANT_WRITE => tls_wants_write = true,
                // A client that closes its socket without a TLS close
                // is done as well; the server sees the end of its stream.
                Err(e) if e.code() == ErrorCode::SYSCALL && e.io_error().is_none() => client_done = true,
                Err(e) => return Err(tls_error(e)),
            }
            progress |= client_done || !inbound.is_empty();
        }
        if !inbound.is_empty() {
            match plain.write(inbound.waiting()) {
                Ok(n) => {
                    inbound.sent += n;
                    progress = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        } else if client_done {
            // Everything the client sent has been passed on: the server
            // reads the end of its stream, answers what it had, closes.
            let _ = plain.shutdown(std::net::Shutdown::Write);
        }
        if progress {
            last_progress = Instant::now();
            continue;
        }
        if !outbound.is_empty() && last_progress.elapsed() > REPLY_TIMEOUT {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the client took no reply data"));
        }
        let mut fds = [
            libc::pollfd {
                fd: tls.get_ref().as_raw_fd(),
                events: if client_done { 0 } else { libc::POLLIN } | if tls_wants_write { libc::POLLOUT } else { 0 },
                revents: 0,
            },
            libc::pollfd {
                fd: plain.as_raw_fd(),
                events: if outbound.is_empty() { libc::POLLIN } else { 0 }
                    | if inbound.is_empty() { 0 } else { libc::POLLOUT },
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two pollfd for the call's length.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, POLL_MS) };
        if ready < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
    // Everything the server sent was passed on; tell the client, as well
    // as a non-blocking socket allows (it may already have gone).
    let _ = tls.shutdown();
    Ok(())
}

/// How long the pump sleeps at most, so it notices a timeout.
const POLL_MS: libc::c_int = Duration::from_secs(1).as_millis() as libc::c_int;

fn tls_error(e: openssl::ssl::Error) -> io::Error {
    match e.into_io_error() {
        Ok(io) => io,
        Err(e) => io::Error::other(format!("TLS: {e}")),
    }
}
