//! `serve --http ADDR`: the control API over HTTP, and the dashboard.
//!
//! - `GET /`: the dashboard (one static page, embedded in the binary; it
//!   reads the API below every second and needs nothing from the internet).
//! - `GET /api/v1/status`, `/events`, `/rebuild`, `/volumes`, `/latency`, `/metrics`:
//!   the requests that change nothing, each answered as a [`Reply`].
//! - `POST /api/v1`: any request, its body an [`Envelope`](crate::api::Envelope)
//!   as on the control socket; long work answers when it ends (its
//!   progress shows in `status` meanwhile).
//!
//! Requests that change the array need the token (`Authorization: Bearer
//! TOKEN`, from `--http-token-file`): without one set, HTTP is read-only.
//! Loopback by default; any other address needs TLS (`--http-tls-cert`
//! and `--http-tls-key`, PEM) and a token, or `serve` refuses to start.

use anyhow::{bail, Context, Result};
use std::io::Read;
use std::net::ToSocketAddrs;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use super::dispatch::{self, Served};
use crate::api::{self, ApiError, ErrorKind, Reply, ReplyBody, Request};

/// How HTTP is served (`serve --http`).
pub struct Options {
    pub address: String,
    /// A PEM certificate chain and its PEM private key: HTTPS.
    pub tls: Option<(Vec<u8>, Vec<u8>)>,
    /// What a client must present to change the array.
    pub token: Option<String>,
}

impl Options {
    /// From the flags: the token read from `token_file` (its first line),
    /// the certificate and key read from their files.
    pub fn from_flags(
        address: String,
        certificate: Option<&std::path::Path>,
        key: Option<&std::path::Path>,
        token_file: Option<&std::path::Path>,
    ) -> Result<Options> {
        let read = |path: &std::path::Path, what: &str| {
            std::fs::read(path).with_context(|| format!("reading the HTTP {what} {}", path.display()))
        };
        let tls = match (certificate, key) {
            (Some(c), Some(k)) => Some((read(c, "certificate")?, read(k, "private key")?)),
            (None, None) => None,
            _ => bail!("--http-tls-cert and --http-tls-key go together"),
        };
        let token = token_file.map(|path| read_token(path, "HTTP")).transpose()?;
        Ok(Options { address, tls, token })
    }
}

/// The token in `path` (its first line), for the `what` server.
pub fn read_token(path: &std::path::Path, what: &str) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading the {what} token file {}", path.display()))?;
    let text = String::from_utf8(bytes).with_context(|| format!("{} is not text", path.display()))?;
    let token = text.lines().next().unwrap_or("").trim().to_string();
    if token.len() < TOKEN_CHARS_MIN || !token.bytes().all(|b| b.is_ascii_graphic()) {
        bail!(
            "the token in {} must be at least {TOKEN_CHARS_MIN} printable characters with no spaces",
            path.display()
        );
    }
    Ok(token)
}

/// The shortest token accepted: guessing one must not be practical.
const TOKEN_CHARS_MIN: usize = 16;
/// Requests served at once (a scrub asked over HTTP holds one until it ends).
const WORKERS: usize = 8;
/// The dashboard: one page, its script and style inline.
const DASHBOARD: &str = include_str!("dashboard.html");

/// Starts serving on `options.address` from threads of their own, for as
/// long as the process runs; until `ready` is set, the API answers that
/// the array is opening. Returns the URL it serves at.
pub fn serve(options: Options, ready: Arc<OnceLock<Served>>, since: Instant) -> Result<String> {
    let address = options
        .address
        .to_socket_addrs()
        .with_context(|| format!("--http {}: not an address to listen on", options.address))?
        .next()
        .with_context(|| format!("--http {}: no address", options.address))?;
    if !address.ip().is_loopback() && (options.tls.is_none() || options.token.is_none()) {
        bail!(
            "--http {address} is reachable from other hosts: serving the API there needs TLS \
             (--http-tls-cert, --http-tls-key) and a token (--http-token-file); or listen on 127.0.0.1"
        );
    }
    let (server, scheme) = match &options.tls {
        Some((certificate, private_key)) => (
            tiny_http::Server::https(
                address,
                tiny_http::SslConfig {
                    certificate: certificate.clone(),
                    private_key: private_key.clone(),
                },
            ),
            "https",
        ),
        None => (tiny_http::Server::http(address), "http"),
    };
    let server = Arc::new(server.map_err(|e| anyhow::anyhow!("serving HTTP on {address}: {e}"))?);
    let bound = server
        .server_addr()
        .to_ip()
        .map_or_else(|| address.to_string(), |a| a.to_string());
    let token = Arc::new(options.token);
    for worker in 0..WORKERS {
        let (server, ready, token) = (server.clone(), ready.clone(), token.clone());
        std::thread::Builder::new()
            .name(format!("http-{worker}"))
            .spawn(move || {
                while let Ok(request) = server.recv() {
                    respond(request, &ready, since, token.as_deref());
                }
            })?;
    }
    Ok(format!("{scheme}://{bound}/"))
}

/// Answers one HTTP request.
fn respond(mut request: tiny_http::Request, ready: &OnceLock<Served>, since: Instant, token: Option<&str>) {
    let path = request.url().split('?').next().unwrap_or("").to_string();
    let method = request.method().clone();
    let response = match (&method, path.as_str()) {
        (tiny_http::Method::Get, "/" | "/index.html") => {
            tiny_http::Response::from_string(DASHBOARD).with_header(header("Content-Type", "text/html; charset=utf-8"))
        }
        (tiny_http::Method::Get, _) if path.starts_with("/api/v1/") => {
            let name = &path["/api/v1/".len()..];
            let reply = match Request::by_name(name) {
                Some(request) => carry_out(&request, ready, since),
                None => Err(ApiError::new(
                    ErrorKind::NotFound,
                    format!(
                        "no GET /api/v1/{name}: status, events, rebuild, volumes, latency or metrics; or POST /api/v1"
                    ),
                )),
            };
            json(reply)
        }
        (tiny_http::Method::Post, "/api/v1") => {
            let reply = body(&mut request)
                .and_then(|bytes| api::parse(&bytes))
                .and_then(|parsed| {
                    authorized(&parsed, &request, token)?;
                    carry_out(&parsed, ready, since)
                });
            json(reply)
        }
        _ => json(Err(ApiError::new(
            ErrorKind::NotFound,
            format!("no {method} {path}: the dashboard is at /, the API at /api/v1"),
        ))),
    };
    let _ = request.respond(response);
}

/// The request's body, refused past the longest request.
fn body(request: &mut tiny_http::Request) -> Result<Vec<u8>, ApiError> {
    let too_large = || {
        ApiError::new(
            ErrorKind::TooLarge,
            format!("a request may be {} bytes at most", api::REQUEST_BYTES_MAX),
        )
    };
    if request.body_length().is_some_and(|n| n > api::REQUEST_BYTES_MAX) {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    request
        .as_reader()
        .take(api::REQUEST_BYTES_MAX as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ApiError::new(ErrorKind::BadRequest, format!("reading the request: {e}")))?;
    if bytes.len() > api::REQUEST_BYTES_MAX {
        return Err(too_large());
    }
    Ok(bytes)
}

/// A request that changes the array needs the token.
fn authorized(parsed: &Request, request: &tiny_http::Request, token: Option<&str>) -> Result<(), ApiError> {
    if !parsed.changes_array() {
        return Ok(());
    }
    let Some(token) = token else {
        return Err(ApiError::new(
            ErrorKind::ReadOnly,
            "this server's HTTP API is read-only: serve with --http-token-file to allow changes, or use the CLI",
        ));
    };
    let presented = request
        .headers()
        .iter()
        .find(|h| h.field.equiv("Authorization"))
        .and_then(|h| h.value.as_str().strip_prefix("Bearer "));
    match presented {
        Some(presented) if tessera_kv::flight::tokens_equal(presented.as_bytes(), token.as_bytes()) => Ok(()),
        Some(_) => Err(ApiError::new(ErrorKind::Unauthorized, "wrong token")),
        None => Err(ApiError::new(
            ErrorKind::Unauthorized,
            "this request changes the array: send 'Authorization: Bearer TOKEN'",
        )),
    }
}

/// Carries out a parsed request once the array is open.
fn carry_out(request: &Request, ready: &OnceLock<Served>, since: Instant) -> Result<api::Answer, ApiError> {
    let Some(served) = ready.get() else {
        return Err(ApiError::new(
            ErrorKind::Opening,
            format!(
                "the server is still opening the array ({:.0} s so far)",
                since.elapsed().as_secs_f64()
            ),
        ));
    };
    dispatch::answer(request, served, &mut |_| true)
}

fn json(reply: Result<api::Answer, ApiError>) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    let (status, body) = match reply {
        Ok(answer) => (200, ReplyBody::Answer(answer)),
        Err(error) => (error.http_status(), ReplyBody::Error(error)),
    };
    tiny_http::Response::from_string(Reply::new(body).line())
        .with_status_code(status)
        .with_header(header("Content-Type", "application/json"))
        .with_header(header("Cache-Control", "no-store"))
}

fn header(field: &str, value: &str) -> tiny_http::Header {
    tiny_http::Header::from_bytes(field.as_bytes(), value.as_bytes()).expect("a valid header")
}

#[cfg(test)]
mod tests {
    #[test]
    fn tokens_compare_whole() {
        let same = tessera_kv::flight::tokens_equal;
        assert!(same(b"abcdefgh", b"abcdefgh"));
        assert!(!same(b"abcdefgh", b"abcdefgX"));
        assert!(!same(b"abcdefgh", b"abcdefg"));
        assert!(!same(b"", b"a"));
    }
}
