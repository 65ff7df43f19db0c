//! The control socket (`DIR/control.sock`): the API's requests (see
//! `crate::api`), one JSON line each, from the owner of the directory.
//! Each client is served on its own thread, its request due within
//! [`CONTROL_TIMEOUT`] of connecting; until the array is open, every
//! request is answered that it is still opening, and for how long.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::dispatch::{self, Served};
use crate::api::{self, ApiError, ErrorKind, Reply, ReplyBody};

/// How long a control client has to send its whole request (from the
/// moment it connects), and then to take each answer; a slow or silent
/// one is dropped, and others are served meanwhile.
const CONTROL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// Control clients served at once. A client arriving when all are taken
/// makes room by closing the one that has waited longest without sending
/// its request (a slow or silent client), so a few of those cannot lock
/// the operator out; only clients whose requests run (a scrub streaming
/// its progress) make it wait, told to retry.
const CONTROL_CLIENTS_MAX: usize = 8;

/// Control clients connected and not yet done sending their request: the
/// ones a newcomer may close to make room, oldest first.
#[derive(Default)]
struct Readers {
    next_id: u64,
    waiting: std::collections::VecDeque<(u64, UnixStream)>,
}

/// Answers requests on the control socket, each client on its own
/// thread, its request due within [`CONTROL_TIMEOUT`]; until `ready` is
/// set, with how long the array has been opening.
pub(super) fn control_loop(
    listener: UnixListener,
    ready: Arc<std::sync::OnceLock<Served>>,
    since: Instant,
    stop: Arc<AtomicBool>,
) {
    let busy = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let readers = Arc::new(Mutex::new(Readers::default()));
    for stream in listener.incoming() {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let _ = stream.set_write_timeout(Some(CONTROL_TIMEOUT));
        if busy.load(Ordering::SeqCst) >= CONTROL_CLIENTS_MAX {
            // Room is made by closing the slowest reader; its thread ends
            // at once (its read fails), so at most twice the maximum run.
            let oldest = readers.lock().unwrap_or_else(|p| p.into_inner()).waiting.pop_front();
            match oldest {
                Some((_, slow)) => {
                    let _ = slow.shutdown(std::net::Shutdown::Both);
                }
                None => {
                    let busy = ApiError::new(
                        ErrorKind::Busy,
                        "the server is busy with other control clients; try again",
                    );
                    let _ = (&stream).write_all(Reply::new(ReplyBody::Error(busy)).line().as_bytes());
                    continue;
                }
            }
        }
        let id = {
            let mut r = readers.lock().unwrap_or_else(|p| p.into_inner());
            let id = r.next_id;
            r.next_id += 1;
            if let Ok(copy) = stream.try_clone() {
                r.waiting.push_back((id, copy));
            }
            id
        };
        busy.fetch_add(1, Ordering::SeqCst);
        let (ready, busy, readers) = (ready.clone(), busy.clone(), readers.clone());
        let deadline = Instant::now() + CONTROL_TIMEOUT;
        std::thread::spawn(move || {
            let request = read_request(&stream, deadline);
            readers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .waiting
                .retain(|(other, _)| *other != id);
            if let Some(request) = request {
                let parsed = request.and_then(|line| api::parse(&line));
                match (parsed, ready.get()) {
                    (Ok(request), Some(served)) => control_client(&stream, &request, served),
                    (Ok(_), None) => {
                        let opening = ApiError::new(
                            ErrorKind::Opening,
                            format!(
                                "the server is still opening the array ({:.0} s so far); ask again once it serves",
                                since.elapsed().as_secs_f64()
                            ),
                        );
                        let _ = (&stream).write_all(Reply::new(ReplyBody::Error(opening)).line().as_bytes());
                    }
                    (Err(error), _) => {
                        let _ = (&stream).write_all(Reply::new(ReplyBody::Error(error)).line().as_bytes());
                    }
                }
            }
            busy.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// One request line, whole by `deadline` (a client that trickles bytes
/// gets no more time than a silent one): `None` if it is not (nothing is
/// answered), a typed error if it runs past the longest request.
fn read_request(stream: &UnixStream, deadline: Instant) -> Option<Result<Vec<u8>, ApiError>> {
    let mut line = Vec::new();
    let mut buffer = [0u8; 4096];
    // Each pass reads at least one byte or returns.
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        if left.is_zero() {
            return None;
        }
        stream.set_read_timeout(Some(left)).ok()?;
        let n = (&*stream).read(&mut buffer).ok()?;
        if n == 0 {
            return None;
        }
        line.extend_from_slice(&buffer[..n]);
        if let Some(end) = line.iter().position(|&b| b == b'\n') {
            line.truncate(end);
            return Some(Ok(line));
        }
        if line.len() > api::REQUEST_BYTES_MAX {
            return Some(Err(ApiError::new(
                ErrorKind::TooLarge,
                format!("a request may be {} bytes at most", api::REQUEST_BYTES_MAX),
            )));
        }
    }
}

/// Serves one request: progress lines while long work runs (it stops if
/// the client goes away), then the answer or the error.
fn control_client(stream: &UnixStream, request: &api::Request, served: &Served) {
    // Answers that take long (a scrub's) have their own time to be read.
    let _ = stream.set_read_timeout(Some(CONTROL_TIMEOUT));
    let mut progress = |report| {
        (&*stream)
            .write_all(Reply::new(ReplyBody::Progress(report)).line().as_bytes())
            .is_ok()
    };
    let body = match dispatch::answer(request, served, &mut progress) {
        Ok(answer) => ReplyBody::Answer(answer),
        Err(error) => ReplyBody::Error(error),
    };
    let _ = (&*stream).write_all(Reply::new(body).line().as_bytes());
}

#[cfg(test)]
mod tests {
    use crate::api::{self, ErrorKind, Request};

    /// While the array opens, the control socket says so, and how long it
    /// has taken, instead of leaving `status` to find the directory
    /// locked by "another process"; a request it cannot parse is refused
    /// by kind meanwhile.
    #[test]
    fn the_control_socket_says_the_array_is_still_opening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(api::CONTROL_SOCKET);
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let ready = std::sync::Arc::default();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let since = std::time::Instant::now();
        std::thread::spawn(move || super::control_loop(listener, ready, since, stop));
        let error = api::ask(dir.path(), &Request::Status, |_| {}).unwrap_err();
        let error = error.downcast::<api::ApiError>().unwrap();
        assert_eq!(error.kind, ErrorKind::Opening);
        assert!(
            error.message.starts_with("the server is still opening the array ("),
            "{error}"
        );
        // The old text protocol, and a line past the longest request.
        for (line, kind) in [
            ("status\n".to_string(), ErrorKind::BadRequest),
            (
                format!("{}\n", "x".repeat(api::REQUEST_BYTES_MAX + 10)),
                ErrorKind::TooLarge,
            ),
        ] {
            use std::io::{BufRead, Write};
            let mut stream = std::os::unix::net::UnixStream::connect(&path).unwrap();
            stream.write_all(line.as_bytes()).unwrap();
            let mut answer = String::new();
            std::io::BufReader::new(&stream).read_line(&mut answer).unwrap();
            let reply: api::Reply = serde_json::from_str(&answer).unwrap();
            match reply.body {
                api::ReplyBody::Error(error) => assert_eq!(error.kind, kind, "{error}"),
                other => panic!("{other:?}"),
            }
        }
    }
}
