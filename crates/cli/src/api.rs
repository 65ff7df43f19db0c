//! The control API of a served array: one typed request and one typed
//! answer for every operation, spoken as JSON over the control socket
//! (`DIR/control.sock`, one line each way, progress lines first for long
//! work) and, with `serve --http`, over HTTP (`serve::http`). The types
//! are the array crate's reports; the CLI is a client of this API for a
//! served array and reads back the same types it prints, never JSON by
//! key.
//!
//! A request line is an [`Envelope`]: `{"version":1,"request":"status"}`,
//! `{"version":1,"request":{"scrub":{"rate":0}}}`. Every line the server
//! sends back is a [`Reply`]: `{"version":1,"progress":{...}}` (long work,
//! once a second), then `{"version":1,"answer":{...}}` or
//! `{"version":1,"error":{"kind":"...","message":"..."}}`. Unknown fields,
//! a version other than [`API_VERSION`] and requests past
//! [`REQUEST_BYTES_MAX`] are refused with a typed error and change nothing.

use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::path::PathBuf;
use tessera_array::events::Event;
use tessera_array::{Array, HealReport, RebuildReport, ScrubReport, Status, VolumeStatus};

/// The version of the API this build speaks (requests name it, replies
/// carry it); a change that breaks a client's parsing raises it.
pub const API_VERSION: u32 = 1;
/// The longest request accepted, on either transport.
pub const REQUEST_BYTES_MAX: usize = 64 << 10;
/// The file in the array's directory the server's control socket is.
pub const CONTROL_SOCKET: &str = "control.sock";

/// A request as sent: the API version the client speaks, and what it asks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    pub version: u32,
    pub request: Request,
}

/// What a client may ask of a served array.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// The array's report (`tessera status`).
    Status,
    /// The history since the server started (`tessera events`).
    Events,
    /// The rebuild running, and how the last one ended.
    Rebuild,
    /// The volumes, with what each maps and stores.
    Volumes,
    /// How long client requests took, by operation, since the server started.
    Latency,
    /// The Prometheus metrics (OpenMetrics text), where `serve --metrics` is on.
    Metrics,
    /// The KV spaces, where `serve --kv` serves them: each one's phase,
    /// records and deferred work's progress.
    KvSpaces,
    /// Marks member `member` failed; the array goes on degraded.
    Fail { member: usize },
    /// Checks every stripe, repairing what it can; `rate` bytes a second
    /// at most (0: unlimited).
    Scrub { rate: u64 },
    /// Moves stripes short of a member onto healthy members.
    Heal { rate: u64 },
    /// Starts a rebuild of a member, onto its own device or a new one.
    Replace(ReplaceRequest),
    /// Creates, resizes or deletes a volume.
    Volume(VolumeChange),
    /// Stops a running scrub, heal or rebuild (a rebuild stopped so goes
    /// on at the next start of the server, or when asked for again).
    Stop { job: Job },
}

/// The long work a `stop` request names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Job {
    Scrub,
    Heal,
    Rebuild,
}

/// A rebuild to start: `tessera replace`'s flags, and the API's `replace`
/// request (where `with` is an absolute path).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct ReplaceRequest {
    #[arg(long = "device", value_name = "INDEX")]
    pub member: usize,
    /// The new device or file (created at the members' size if it does
    /// not exist); default: the member's own, if it is there.
    #[arg(long)]
    pub with: Option<PathBuf>,
    /// Bytes a second to write at most while clients are idle (0: no limit).
    #[arg(long, value_parser = crate::size::parse, default_value = "0")]
    pub rate: u64,
    /// Bytes a second to write at most while clients do I/O (0: as --rate).
    #[arg(long, value_parser = crate::size::parse, default_value = "32M")]
    pub busy_rate: u64,
    /// Use a --with device even if it holds data or another array's superblock.
    #[arg(long)]
    pub force: bool,
}

/// How a rebuild run by the server ended.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Outcome {
    pub member: usize,
    /// The member is healthy again.
    pub done: bool,
    pub message: String,
    pub report: RebuildReport,
}

/// What a `rebuild` request answers.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RebuildState {
    pub running: Option<RebuildReport>,
    pub last: Option<Outcome>,
}

/// A change to the array's volumes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum VolumeChange {
    Create { name: String, bytes: u64 },
    Resize { name: String, bytes: u64 },
    Delete { name: String },
}

impl Job {
    pub fn name(self) -> &'static str {
        match self {
            Job::Scrub => "scrub",
            Job::Heal => "heal",
            Job::Rebuild => "rebuild",
        }
    }
}

impl Request {
    /// Whether it changes the array (or its members): over HTTP, only a
    /// client with the token may.
    pub fn changes_array(&self) -> bool {
        !matches!(
            self,
            Request::Status
                | Request::Events
                | Request::Rebuild
                | Request::Volumes
                | Request::Latency
                | Request::Metrics
                | Request::KvSpaces
        )
    }

    /// The request with no body, by the name an HTTP GET uses
    /// (`/api/v1/status`); `None` for one that has a body or changes the array.
    pub fn by_name(name: &str) -> Option<Request> {
        Some(match name {
            "status" => Request::Status,
            "events" => Request::Events,
            "rebuild" => Request::Rebuild,
            "volumes" => Request::Volumes,
            "latency" => Request::Latency,
            "metrics" => Request::Metrics,
            "kv_spaces" => Request::KvSpaces,
            _ => return None,
        })
    }
}

/// What the server answers a request.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    Status(Box<Status>),
    Events(Vec<Event>),
    Rebuild(RebuildState),
    Volumes(Vec<VolumeStatus>),
    Latency(Latency),
    /// OpenMetrics text, as a scrape of `serve --metrics` gets it.
    Metrics(String),
    KvSpaces(KvSpaces),
    Scrub(ScrubReport),
    Heal(HealReport),
    /// Done, with nothing to report (a member failed, a rebuild started).
    Done,
}

/// The KV spaces a server serves (`served`: whether it was started with
/// `--kv`; none are open otherwise).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct KvSpaces {
    pub served: bool,
    pub spaces: Vec<tessera_kv::SpaceStatus>,
    /// The batch cache the spaces share (none where none are served).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<tessera_kv::CacheStatus>,
}

/// Long work's report so far.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Progress {
    Scrub(ScrubReport),
    Heal(HealReport),
}

/// One line the server sends: progress, then an answer or an error.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reply {
    pub version: u32,
    #[serde(flatten)]
    pub body: ReplyBody,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplyBody {
    Progress(Progress),
    Answer(Answer),
    Error(ApiError),
}

impl Reply {
    pub fn new(body: ReplyBody) -> Reply {
        Reply {
            version: API_VERSION,
            body,
        }
    }

    pub fn line(&self) -> String {
        let mut text = serde_json::to_string(self).expect("replies serialize");
        text.push('\n');
        text
    }
}

/// An error the API answers, by kind (what a client may act on) with a
/// message for people.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// Not a request of this API (not JSON, unknown fields, wrong types).
    BadRequest,
    /// The request names another version of the API.
    UnsupportedVersion,
    /// Longer than `REQUEST_BYTES_MAX`.
    TooLarge,
    /// The server is still opening the array.
    Opening,
    /// The server is busy with other control clients.
    Busy,
    /// Over HTTP: the request changes the array and has no token, or a wrong one.
    Unauthorized,
    /// Over HTTP: the request changes the array and the server has no token set.
    ReadOnly,
    /// No such path on the HTTP server.
    NotFound,
    /// The array refused or failed the request.
    Array,
    /// The server could not carry it out (a rebuild that cannot start).
    Failed,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> ApiError {
        ApiError {
            kind,
            message: message.into(),
        }
    }

    /// The HTTP status a reply with this error is sent with.
    pub fn http_status(&self) -> u16 {
        match self.kind {
            ErrorKind::BadRequest | ErrorKind::UnsupportedVersion => 400,
            ErrorKind::Unauthorized => 401,
            ErrorKind::ReadOnly => 403,
            ErrorKind::NotFound => 404,
            ErrorKind::TooLarge => 413,
            ErrorKind::Opening | ErrorKind::Busy => 503,
            ErrorKind::Array | ErrorKind::Failed => 500,
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ApiError {}

impl From<tessera_array::ArrayError> for ApiError {
    fn from(error: tessera_array::ArrayError) -> ApiError {
        ApiError::new(ErrorKind::Array, error.to_string())
    }
}

/// Parses a request as sent (a line's bytes, or an HTTP body).
pub fn parse(bytes: &[u8]) -> Result<Request, ApiError> {
    if bytes.len() > REQUEST_BYTES_MAX {
        return Err(ApiError::new(
            ErrorKind::TooLarge,
            format!("a request may be {REQUEST_BYTES_MAX} bytes at most"),
        ));
    }
    // The version first, so that a newer client's request is refused for
    // its version, not for a field this build does not know.
    #[derive(Deserialize)]
    struct Versioned {
        version: u32,
    }
    let bad = |e: serde_json::Error| ApiError::new(ErrorKind::BadRequest, format!("not a request of this API: {e}"));
    let versioned: Versioned = serde_json::from_slice(bytes).map_err(bad)?;
    if versioned.version != API_VERSION {
        return Err(ApiError::new(
            ErrorKind::UnsupportedVersion,
            format!(
                "the request is of API version {}; this server speaks version {API_VERSION}",
                versioned.version
            ),
        ));
    }
    let envelope: Envelope = serde_json::from_slice(bytes).map_err(bad)?;
    Ok(envelope.request)
}

/// How often long work reports its progress.
pub const PROGRESS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

impl VolumeChange {
    /// Makes the change; a volume of a KV space (`kv.NAME`) is refused:
    /// spaces are created and dropped with `tessera kv`.
    pub fn apply(&self, array: &Array) -> Result<(), ApiError> {
        let (VolumeChange::Create { name, .. } | VolumeChange::Resize { name, .. } | VolumeChange::Delete { name }) =
            self;
        if name.starts_with(tessera_kv::store::VOLUME_PREFIX) {
            return Err(ApiError::new(
                ErrorKind::BadRequest,
                format!(
                    "{name:?}: volumes named {}NAME hold KV spaces; use `tessera kv create` and `tessera kv drop`",
                    tessera_kv::store::VOLUME_PREFIX
                ),
            ));
        }
        Ok(match self {
            VolumeChange::Create { name, bytes } => array.create_volume(name, *bytes).map(|_| ()),
            VolumeChange::Resize { name, bytes } => array.resize_volume(name, *bytes),
            VolumeChange::Delete { name } => array.delete_volume(name),
        }?)
    }
}

/// Client requests' count and time by operation, since the server started.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub read: OpTotals,
    pub write: OpTotals,
    pub flush: OpTotals,
    /// Trims and zeroes.
    pub zero: OpTotals,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OpTotals {
    pub requests: u64,
    /// The time they took, summed.
    pub microseconds: u64,
}

/// Long work's report, as progress and as the answer at its end.
pub trait LongWork: Sized {
    fn from_progress(progress: Progress) -> Option<Self>;
    fn from_answer(answer: Answer) -> Option<Self>;
}

impl LongWork for ScrubReport {
    fn from_progress(progress: Progress) -> Option<Self> {
        match progress {
            Progress::Scrub(report) => Some(report),
            _ => None,
        }
    }
    fn from_answer(answer: Answer) -> Option<Self> {
        match answer {
            Answer::Scrub(report) => Some(report),
            _ => None,
        }
    }
}

impl LongWork for HealReport {
    fn from_progress(progress: Progress) -> Option<Self> {
        match progress {
            Progress::Heal(report) => Some(report),
            _ => None,
        }
    }
    fn from_answer(answer: Answer) -> Option<Self> {
        match answer {
            Answer::Heal(report) => Some(report),
            _ => None,
        }
    }
}

/// Asks the server serving `dir` for `request`, handing each progress
/// report to `on_progress`; `None` if no server serves it. An error the
/// server answers is returned as [`ApiError`] (inside the `anyhow` error).
pub fn ask(dir: &Path, request: &Request, mut on_progress: impl FnMut(Progress)) -> anyhow::Result<Option<Answer>> {
    use anyhow::Context;
    let Ok(mut stream) = UnixStream::connect(dir.join(CONTROL_SOCKET)) else {
        return Ok(None);
    };
    // A status of a huge array takes a while; a server that says nothing
    // for this long is stuck, and saying so beats hanging.
    stream.set_read_timeout(Some(std::time::Duration::from_secs(60)))?;
    let envelope = Envelope {
        version: API_VERSION,
        request: request.clone(),
    };
    let mut line = serde_json::to_string(&envelope)?;
    line.push('\n');
    stream.write_all(line.as_bytes())?;
    let mut reader = BufReader::new(&stream);
    // Bounded by the server: long work ends, or its client times out.
    loop {
        line.clear();
        let n = reader
            .read_line(&mut line)
            .with_context(|| format!("the server serving {} did not answer", dir.display()))?;
        if n == 0 {
            anyhow::bail!(
                "the server serving {} closed the connection without answering",
                dir.display()
            );
        }
        let reply: Reply = serde_json::from_str(&line).with_context(|| {
            format!(
                "the server serving {} answered what this build cannot read",
                dir.display()
            )
        })?;
        match reply.body {
            ReplyBody::Progress(p) => on_progress(p),
            ReplyBody::Answer(answer) => return Ok(Some(answer)),
            ReplyBody::Error(error) => return Err(error.into()),
        }
    }
}

/// [`ask`] for a request with no progress, its answer taken apart by
/// `expect` (the kind of answer the request has).
pub fn ask_for<T>(dir: &Path, request: &Request, expect: fn(Answer) -> Option<T>) -> anyhow::Result<Option<T>> {
    match ask(dir, request, |_| {})? {
        Some(answer) => match expect(answer) {
            Some(value) => Ok(Some(value)),
            None => anyhow::bail!("the server answered {request:?} with another kind of answer"),
        },
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_request() -> Vec<Request> {
        vec![
            Request::Status,
            Request::Events,
            Request::Rebuild,
            Request::Volumes,
            Request::Latency,
            Request::Metrics,
            Request::KvSpaces,
            Request::Fail { member: 3 },
            Request::Scrub { rate: 1 << 20 },
            Request::Heal { rate: 0 },
            Request::Replace(ReplaceRequest {
                member: 1,
                with: Some("/dev/sdz".into()),
                rate: 5,
                busy_rate: 6,
                force: true,
            }),
            Request::Volume(VolumeChange::Create {
                name: "vm1".into(),
                bytes: 1 << 30,
            }),
            Request::Volume(VolumeChange::Resize {
                name: "vm1".into(),
                bytes: 2 << 30,
            }),
            Request::Volume(VolumeChange::Delete { name: "vm1".into() }),
            Request::Stop { job: Job::Scrub },
            Request::Stop { job: Job::Heal },
            Request::Stop { job: Job::Rebuild },
        ]
    }

    #[test]
    fn every_request_round_trips() {
        for request in every_request() {
            let envelope = Envelope {
                version: API_VERSION,
                request: request.clone(),
            };
            let text = serde_json::to_string(&envelope).unwrap();
            assert_eq!(parse(text.as_bytes()).unwrap(), request, "{text}");
        }
        // The documented shapes.
        assert_eq!(parse(br#"{"version":1,"request":"status"}"#).unwrap(), Request::Status);
        assert_eq!(
            parse(br#"{"version":1,"request":{"scrub":{"rate":0}}}"#).unwrap(),
            Request::Scrub { rate: 0 }
        );
    }

    #[test]
    fn every_answer_and_reply_round_trips() {
        let answers = vec![
            Answer::Events(Vec::new()),
            Answer::Rebuild(RebuildState::default()),
            Answer::Volumes(Vec::new()),
            Answer::Latency(Latency {
                read: OpTotals {
                    requests: 3,
                    microseconds: 90,
                },
                ..Latency::default()
            }),
            Answer::Scrub(ScrubReport::default()),
            Answer::Heal(HealReport::default()),
            Answer::KvSpaces(KvSpaces {
                served: true,
                spaces: vec![tessera_kv::SpaceStatus {
                    name: "run1".into(),
                    schema: serde_json::from_str(
                        r#"{"key": "id", "fields": [{"name": "energy", "type": "f32"}], "indexes": ["energy"], "duplicates": "keep_all"}"#,
                    )
                    .unwrap(),
                    phase: tessera_kv::Phase::Indexing("energy".into()),
                    inserted: 5,
                    sorted: Some(5),
                    indexes_built: Vec::new(),
                    log_bytes: 0,
                    progress: Some(tessera_kv::Progress {
                        step: "index energy".into(),
                        done: 1,
                        total: 5,
                    }),
                }],
                cache: Some(tessera_kv::CacheStatus {
                    capacity: 1 << 20,
                    bytes: 4096,
                    batches: 1,
                    hits: 2,
                    misses: 1,
                }),
            }),
            Answer::Done,
        ];
        for answer in answers {
            for body in [
                ReplyBody::Answer(answer.clone()),
                ReplyBody::Error(ApiError::new(ErrorKind::Busy, "busy")),
                ReplyBody::Progress(Progress::Scrub(ScrubReport::default())),
            ] {
                let line = Reply::new(body).line();
                let back: Reply = serde_json::from_str(&line).unwrap();
                assert_eq!(back.line(), line);
            }
        }
    }

    #[test]
    fn bad_requests_are_refused_by_kind() {
        let kind = |bytes: &[u8]| parse(bytes).unwrap_err().kind;
        let cases: &[(&[u8], ErrorKind)] = &[
            (b"status", ErrorKind::BadRequest),
            (b"", ErrorKind::BadRequest),
            (br#"{"request":"status"}"#, ErrorKind::BadRequest),
            (br#"{"version":2,"request":"status"}"#, ErrorKind::UnsupportedVersion),
            (br#"{"version":2,"request":"teleport"}"#, ErrorKind::UnsupportedVersion),
            (br#"{"version":"1","request":"status"}"#, ErrorKind::BadRequest),
            (br#"{"version":1,"request":"status","extra":1}"#, ErrorKind::BadRequest),
            (br#"{"version":1,"request":"teleport"}"#, ErrorKind::BadRequest),
            (br#"{"version":1,"request":{"fail":{"member":"two"}}}"#, ErrorKind::BadRequest),
            (br#"{"version":1,"request":{"fail":{"member":-1}}}"#, ErrorKind::BadRequest),
            (br#"{"version":1,"request":{"fail":{"member":1,"now":true}}}"#, ErrorKind::BadRequest),
            (br#"{"version":1,"request":{"scrub":{}}}"#, ErrorKind::BadRequest),
            (br#"{"version":1,"request":{"volume":{"create":{"name":"a"}}}}"#, ErrorKind::BadRequest),
            (
                br#"{"version":1,"request":{"replace":{"member":1,"with":null,"rate":1,"busy_rate":1,"force":false,"x":1}}}"#,
                ErrorKind::BadRequest,
            ),
        ];
        for (bytes, expected) in cases {
            assert_eq!(kind(bytes), *expected, "{}", String::from_utf8_lossy(bytes));
        }
        let long = format!(
            r#"{{"version":1,"request":{{"volume":{{"delete":{{"name":"{}"}}}}}}}}"#,
            "a".repeat(REQUEST_BYTES_MAX)
        );
        assert_eq!(kind(long.as_bytes()), ErrorKind::TooLarge);
    }

    /// Random bytes and random edits of valid requests never panic the
    /// parser, and whatever it accepts is a request that serializes back
    /// to something it accepts as the same request.
    #[test]
    fn the_parser_takes_any_bytes_without_panicking() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(27);
        let valid: Vec<String> = every_request()
            .into_iter()
            .map(|request| {
                serde_json::to_string(&Envelope {
                    version: API_VERSION,
                    request,
                })
                .unwrap()
            })
            .collect();
        let mut accepted = 0;
        for round in 0..20_000 {
            let mut bytes = valid[round % valid.len()].clone().into_bytes();
            match round % 3 {
                0 => {
                    let at = rng.gen_range(0..bytes.len());
                    bytes[at] = rng.gen();
                }
                1 => {
                    let at = rng.gen_range(0..bytes.len());
                    bytes.truncate(at);
                }
                _ => bytes = (0..rng.gen_range(0..64)).map(|_| rng.gen()).collect(),
            }
            if let Ok(request) = parse(&bytes) {
                accepted += 1;
                let again = serde_json::to_string(&Envelope {
                    version: API_VERSION,
                    request: request.clone(),
                })
                .unwrap();
                assert_eq!(parse(again.as_bytes()).unwrap(), request);
            }
        }
        assert!(accepted > 0, "some edits (a digit of a number) stay valid");
    }
}
