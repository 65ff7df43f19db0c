//! The server's side of the control API (`crate::api`): what a request
//! does to the served array, for the control socket (`control`) and HTTP
//! (`http`) alike, and the clients' latency the NBD exports count.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use tessera_array::Array;

use crate::api::{Answer, ApiError, ErrorKind, Job, Latency, OpTotals, Progress, Request, PROGRESS_INTERVAL};
use crate::replace::Rebuilder;

/// What the server serves requests from: the array and its rebuilder,
/// the clients' latency, and the history in the array's directory.
pub struct Served {
    pub array: std::sync::Arc<Array>,
    pub rebuilder: std::sync::Arc<Rebuilder>,
    pub latency: std::sync::Arc<LatencyCounters>,
    pub dir: std::path::PathBuf,
    /// Held while appending to the history file (not across its sync, nor any array I/O).
    pub history: std::sync::Arc<std::sync::Mutex<crate::history::History>>,
    /// Set by a `stop` request: the running scrub's or heal's next
    /// progress report ends it (the server's own healer's too). Cleared
    /// when one starts.
    pub stop_scrub: Arc<AtomicBool>,
    pub stop_heal: Arc<AtomicBool>,
    /// The Prometheus metrics, where `serve --metrics` turned them on.
    pub metrics: Option<Arc<crate::metrics::Metrics>>,
    /// The KV spaces, once opened, where `serve --kv` serves them.
    pub kv: Arc<std::sync::OnceLock<Arc<tessera_kv::Store>>>,
}

impl Served {
    /// Appends what the array recorded since the last time to the history.
    pub fn save_history(&self) -> anyhow::Result<()> {
        // The lock orders the appends; the sync waits outside it.
        let written = self
            .history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .append(&self.array)?;
        written.map_or(Ok(()), |written| written.sync())
    }
}

/// Carries out `request` on the served array; long work hands its report
/// so far to `progress` about once a second, and stops if that returns
/// false (its client went away).
pub fn answer(
    request: &Request,
    served: &Served,
    progress: &mut dyn FnMut(Progress) -> bool,
) -> Result<Answer, ApiError> {
    let array = &served.array;
    Ok(match request {
        Request::Status => Answer::Status(Box::new(array.status()?)),
        Request::Events => {
            // Saved first, so that the file holds everything to now.
            let history = served
                .save_history()
                .and_then(|()| crate::history::read(&served.dir))
                .map_err(|e| ApiError::new(ErrorKind::Failed, format!("{e:#}")))?;
            Answer::Events(history)
        }
        Request::Rebuild => Answer::Rebuild(served.rebuilder.progress()),
        Request::Volumes => Answer::Volumes(array.volumes()),
        Request::Latency => Answer::Latency(served.latency.totals()),
        Request::KvSpaces => Answer::KvSpaces(match served.kv.get() {
            Some(store) => crate::api::KvSpaces {
                served: true,
                spaces: store.list(),
                cache: Some(store.cache()),
            },
            None => crate::api::KvSpaces::default(),
        }),
        Request::Metrics => match &served.metrics {
            Some(metrics) => Answer::Metrics(metrics.scrape(array).map_err(|e| ApiError::new(ErrorKind::Array, e))?),
            None => {
                return Err(ApiError::new(
                    ErrorKind::Failed,
                    "metrics are off: serve with --metrics ADDR to count them",
                ))
            }
        },
        Request::Fail { member } => {
            array.fail_member(*member)?;
            Answer::Done
        }
        // A new scrub or heal clears the stop asked of the last one; not
        // while one runs (the array refuses the newcomer, and the stop
        // asked of the one running must hold).
        Request::Scrub { rate } => {
            if array.scrub_progress().is_none() {
                served.stop_scrub.store(false, Relaxed);
            }
            let mut paced = paced(progress, Progress::Scrub, &served.stop_scrub);
            Answer::Scrub(array.scrub_with((*rate > 0).then_some(*rate), &mut paced)?)
        }
        Request::Heal { rate } => {
            if array.heal_progress().is_none() {
                served.stop_heal.store(false, Relaxed);
            }
            let mut paced = paced(progress, Progress::Heal, &served.stop_heal);
            Answer::Heal(array.heal_with((*rate > 0).then_some(*rate), &mut paced)?)
        }
        Request::Stop { job } => {
            let running = match job {
                Job::Scrub => array.scrub_progress().is_some() && !served.stop_scrub.swap(true, Relaxed),
                Job::Heal => array.heal_progress().is_some() && !served.stop_heal.swap(true, Relaxed),
                Job::Rebuild => served.rebuilder.pause(),
            };
            if !running {
                return Err(ApiError::new(
                    ErrorKind::Failed,
                    format!("no {} is running (or it is stopping already)", job.name()),
                ));
            }
            Answer::Done
        }
        Request::Replace(request) => {
            served
                .rebuilder
                .start(request)
                .map_err(|e| ApiError::new(ErrorKind::Failed, format!("{e:#}")))?;
            Answer::Done
        }
        Request::Volume(change) => {
            change.apply(array)?;
            Answer::Volumes(array.volumes())
        }
    })
}

/// `progress`, handed a report at most once a second; the work stops
/// when it returns false or `stop` is set.
fn paced<'a, R: Clone + 'a>(
    progress: &'a mut dyn FnMut(Progress) -> bool,
    wrap: fn(R) -> Progress,
    stop: &'a std::sync::atomic::AtomicBool,
) -> impl FnMut(&R) -> bool + 'a {
    let mut last = std::time::Instant::now();
    move |report: &R| {
        if stop.load(Relaxed) {
            return false;
        }
        if last.elapsed() < PROGRESS_INTERVAL {
            return true;
        }
        last = std::time::Instant::now();
        progress(wrap(report.clone()))
    }
}

/// What [`Latency`] is counted in, by the NBD adapter (`serve`).
#[derive(Default)]
pub struct LatencyCounters {
    counts: [[std::sync::atomic::AtomicU64; 2]; 4],
}

/// The operations [`LatencyCounters`] counts.
#[derive(Clone, Copy)]
pub enum Timed {
    Read = 0,
    Write = 1,
    Flush = 2,
    Zero = 3,
}

impl LatencyCounters {
    pub fn record(&self, op: Timed, took: std::time::Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        let [requests, micros] = &self.counts[op as usize];
        requests.fetch_add(1, Relaxed);
        micros.fetch_add(took.as_micros() as u64, Relaxed);
    }

    pub fn totals(&self) -> Latency {
        use std::sync::atomic::Ordering::Relaxed;
        let get = |op: Timed| {
            let [requests, micros] = &self.counts[op as usize];
            OpTotals {
                requests: requests.load(Relaxed),
                microseconds: micros.load(Relaxed),
            }
        };
        Latency {
            read: get(Timed::Read),
            write: get(Timed::Write),
            flush: get(Timed::Flush),
            zero: get(Timed::Zero),
        }
    }
}
