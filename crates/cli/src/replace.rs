//! `tessera replace`: a member rebuilt onto its own device or a new one,
//! on a served array (in the server, while clients go on) or on one that
//! is not.
//!
//! A rebuild under way is recorded in `DIR/rebuild.json`: the member, the
//! device (its absolute path), and where the rebuild last synced it. It
//! is written before the first chunk and after each sync, so a rebuild
//! stopped by a shutdown, a crash or kill -9 goes on from there the next
//! time the array is served (or `replace` is run); it is removed when the
//! member is healthy again, or when the rebuild fails.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tessera_array::device::{Device, FileDevice};
use tessera_array::{Array, MemberState, RebuildOptions, RebuildReport, RebuildResume};

use crate::api::{self, Answer};
pub use crate::api::{Outcome, RebuildState, ReplaceRequest as Request};
use crate::array_dir::{human, listed_lines, lock, open, refuse_if_in_use, Progress, MEMBERS_FILE};

/// The rebuild under way, if any.
pub const REBUILD_FILE: &str = "rebuild.json";

/// What `DIR/rebuild.json` holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Job {
    pub member: usize,
    /// The device's absolute path.
    pub device: String,
    /// The member's own device (listed in `members`), come back.
    pub own: bool,
    /// The device held data before (its current chunks are kept).
    pub keep_current: bool,
    pub rate: u64,
    pub busy_rate: u64,
    /// Where the rebuild last synced the device.
    pub resume: Option<RebuildResume>,
}

/// `tessera replace`'s flags.
#[derive(clap::Args)]
pub struct Replace {
    pub dir: PathBuf,
    #[command(flatten)]
    pub request: Request,
    /// On a served array, return once the rebuild has started.
    #[arg(long)]
    pub detach: bool,
}

/// `tessera online`'s flags: a replace onto the member's own device.
#[derive(clap::Args)]
pub struct Online {
    pub dir: PathBuf,
    #[arg(long = "device", value_name = "INDEX")]
    pub member: usize,
    /// Bytes a second to write at most while clients are idle (0: no limit).
    #[arg(long, value_parser = crate::size::parse, default_value = "0")]
    pub rate: u64,
    /// Bytes a second to write at most while clients do I/O (0: as --rate).
    #[arg(long, value_parser = crate::size::parse, default_value = "32M")]
    pub busy_rate: u64,
    /// On a served array, return once the resync has started.
    #[arg(long)]
    pub detach: bool,
}

impl Online {
    pub fn request(&self) -> Request {
        Request {
            member: self.member,
            with: None,
            rate: self.rate,
            busy_rate: self.busy_rate,
            force: false,
        }
    }
}

pub fn load_job(dir: &Path) -> Result<Option<Job>> {
    let path = dir.join(REBUILD_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some(
            serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?,
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Replaces `DIR/name` with `text`, durably (a crash leaves the old or
/// the new file, whole).
pub fn write_durably(dir: &Path, name: &str, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let temporary = dir.join(format!("{name}.new"));
    let mut file = std::fs::File::create(&temporary)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&temporary, dir.join(name))?;
    std::fs::File::open(dir)?.sync_all()
}

fn save_job(dir: &Path, job: &Job) -> std::io::Result<()> {
    write_durably(
        dir,
        REBUILD_FILE,
        &serde_json::to_string(job).map_err(std::io::Error::other)?,
    )
}

fn remove_job(dir: &Path) {
    let _ = std::fs::remove_file(dir.join(REBUILD_FILE));
}

/// An absolute path for `path`, which may not exist yet.
pub fn absolute(path: &Path) -> Result<PathBuf> {
    if path.exists() {
        return Ok(std::fs::canonicalize(path)?);
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .with_context(|| format!("{} names no file", path.display()))?;
    Ok(std::fs::canonicalize(parent)
        .with_context(|| format!("{} is not a directory", parent.display()))?
        .join(name))
}

/// The job DIR/rebuild.json records, unless its member is healthy (it
/// ended, but was stopped before the file was removed: the file goes).
fn unfinished_job(dir: &Path, array: &Array) -> Result<Option<Job>> {
    let job = load_job(dir)?;
    match job {
        Some(job)
            if job.member < array.geometry().members && array.member_state(job.member) == MemberState::Healthy =>
        {
            remove_job(dir);
            Ok(None)
        }
        job => Ok(job),
    }
}

/// The job and device for `request` on `array` (in `dir`): the unfinished
/// job for that member if there is one (its device, where it stopped),
/// else a new one: the member's own device, an existing device that
/// holds nothing (unless `force`), or a new file of the members' size.
pub fn prepare(dir: &Path, array: &Array, request: &Request) -> Result<(Job, Arc<dyn Device>)> {
    let index = request.member;
    let unfinished = unfinished_job(dir, array)?;
    array.check_rebuildable(index)?;
    let own_path = listed_lines(dir)?
        .get(index)
        .map(|line| {
            let path = dir.join(line);
            std::fs::canonicalize(&path).unwrap_or(path).display().to_string()
        })
        .unwrap_or_default();
    let own_device = || {
        array.member_device(index).with_context(|| {
            format!("member {index}'s device is missing: give the one to rebuild it onto with --with PATH")
        })
    };
    if let Some(mut job) = unfinished {
        if job.member != index {
            bail!(
                "the rebuild of member {} onto {} is unfinished: serve the array to finish it, or run replace --device {} (remove {} to give it up)",
                job.member,
                job.device,
                job.member,
                dir.join(REBUILD_FILE).display()
            );
        }
        let same = match &request.with {
            Some(with) => absolute(with)?.display().to_string() == job.device,
            None => job.own,
        };
        if same {
            let device = if job.own {
                own_device()?
            } else {
                Arc::new(FileDevice::open(Path::new(&job.device)).with_context(|| format!("opening {}", job.device))?)
                    as Arc<dyn Device>
            };
            (job.rate, job.busy_rate) = (request.rate, request.busy_rate);
            return Ok((job, device));
        }
        // Another device: the unfinished rebuild is given up.
        remove_job(dir);
    }
    let member_bytes = array.geometry().member_bytes;
    let (path, own, keep_current, device): (String, bool, bool, Arc<dyn Device>) = match &request.with {
        Some(with) => {
            let path = absolute(with)?;
            if path.display().to_string() == own_path {
                (own_path, true, true, own_device()?)
            } else if path.exists() {
                let device = FileDevice::open(&path).with_context(|| format!("opening {}", path.display()))?;
                if !request.force {
                    refuse_if_in_use(&path, &device)?;
                }
                (path.display().to_string(), false, true, Arc::new(device))
            } else {
                let device =
                    FileDevice::create(&path, member_bytes).with_context(|| format!("creating {}", path.display()))?;
                (path.display().to_string(), false, false, Arc::new(device))
            }
        }
        None => (own_path, true, true, own_device()?),
    };
    let job = Job {
        member: index,
        device: path,
        own,
        keep_current,
        rate: request.rate,
        busy_rate: request.busy_rate,
        resume: None,
    };
    Ok((job, device))
}

/// Runs `job` on `array` (in `dir`) until the member is healthy, the
/// rebuild fails, or `progress` returns false (then the job stays, to go
/// on later). Once healthy on a new device, `members` lists it. Returns
/// the report, and whether the member is healthy (false: stopped).
pub fn run(
    dir: &Path,
    array: &Array,
    mut job: Job,
    device: Arc<dyn Device>,
    progress: impl FnMut(&RebuildReport) -> bool,
) -> Result<(RebuildReport, bool)> {
    save_job(dir, &job).with_context(|| format!("writing {}", dir.join(REBUILD_FILE).display()))?;
    let options = RebuildOptions {
        name: (!job.own).then(|| job.device.clone()),
        keep_current: job.keep_current,
        rate: (job.rate > 0).then_some(job.rate),
        busy_rate: (job.busy_rate > 0).then_some(job.busy_rate),
        resume: job.resume,
    };
    let index = job.member;
    let result = array.rebuild_member(index, device, &options, progress, |resume| {
        job.resume = Some(*resume);
        save_job(dir, &job)
    });
    let report = match result {
        Ok(report) => report,
        Err(e) => {
            remove_job(dir);
            return Err(e.into());
        }
    };
    if array.member_state(index) != MemberState::Healthy {
        return Ok((report, false));
    }
    if !job.own {
        let mut lines = listed_lines(dir)?;
        lines[index] = job.device.clone();
        write_durably(dir, MEMBERS_FILE, &(lines.join("\n") + "\n"))?;
    }
    remove_job(dir);
    Ok((report, true))
}

/// One rebuild on the rebuild thread, from start to end; its outcome is
/// said and kept in `last`.
fn rebuild_one(
    dir: &Path,
    array: &Array,
    (stop, paused): (&AtomicBool, &AtomicBool),
    last: &Mutex<Option<Outcome>>,
    job: Job,
    device: Arc<dyn Device>,
) {
    let index = job.member;
    eprintln!(
        "tessera: rebuilding member {index} onto {}{}",
        job.device,
        if job.resume.is_some() {
            ", going on where it stopped"
        } else {
            ""
        }
    );
    let mut latest = RebuildReport::default();
    let result = run(dir, array, job, device, |report| {
        latest = *report;
        !stop.load(Ordering::Relaxed) && !paused.load(Ordering::Relaxed)
    });
    let outcome = match result {
        Ok((report, true)) => Outcome {
            member: index,
            done: true,
            message: summary(index, &report),
            report,
        },
        Ok((report, false)) => Outcome {
            member: index,
            done: false,
            message: format!(
                "the rebuild of member {index} stopped at {} of {} stripes; it goes on when the array is served again, or with `tessera replace`",
                report.stripes_done, report.stripes_total
            ),
            report,
        },
        Err(e) => Outcome {
            member: index,
            done: false,
            message: format!("the rebuild of member {index} failed: {e:#}"),
            report: latest,
        },
    };
    eprintln!("tessera: {}", outcome.message);
    *last.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
}

/// The server's rebuild: at most one runs, on its own thread.
pub struct Rebuilder {
    dir: PathBuf,
    array: Arc<Array>,
    stop: Arc<AtomicBool>,
    /// Set to stop the running rebuild alone (`Rebuilder::pause`); the
    /// next start clears it.
    paused: Arc<AtomicBool>,
    /// Stale members are resynced by themselves, one after the other.
    auto_resync: bool,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    last: Arc<Mutex<Option<Outcome>>>,
}

/// `--busy-rate`'s default: what a rebuild writes at most a second while
/// clients do I/O (an automatic resync keeps to it too).
pub const DEFAULT_BUSY_RATE: u64 = 32 << 20;

/// The resync of the first stale member not in `tried`, if any (one that
/// cannot be prepared is said and skipped).
fn next_stale(dir: &Path, array: &Array, tried: &mut Vec<usize>) -> Option<(Job, Arc<dyn Device>)> {
    for member in 0..array.geometry().members {
        if array.member_state(member) != MemberState::Stale || tried.contains(&member) {
            continue;
        }
        tried.push(member);
        let request = Request {
            member,
            with: None,
            rate: 0,
            busy_rate: DEFAULT_BUSY_RATE,
            force: false,
        };
        match prepare(dir, array, &request) {
            Ok(prepared) => return Some(prepared),
            Err(e) => eprintln!("tessera: member {member} is stale and cannot be resynced: {e:#}"),
        }
    }
    None
}

impl Rebuilder {
    pub fn new(dir: &Path, array: Arc<Array>, stop: Arc<AtomicBool>, auto_resync: bool) -> Rebuilder {
        Rebuilder {
            dir: dir.to_path_buf(),
            array,
            stop,
            paused: Arc::default(),
            auto_resync,
            thread: Mutex::new(None),
            last: Arc::new(Mutex::new(None)),
        }
    }

    /// Starts `request` (or the unfinished job it names) on a thread.
    pub fn start(&self, request: &Request) -> Result<()> {
        let mut thread = self.thread.lock().unwrap_or_else(|p| p.into_inner());
        if thread.as_ref().is_some_and(|t| !t.is_finished()) {
            bail!("a rebuild is running already: one member is rebuilt at a time");
        }
        let prepared = prepare(&self.dir, &self.array, request)?;
        self.spawn(&mut thread, prepared);
        Ok(())
    }

    /// Runs `first` on the rebuild thread; then, with `auto_resync`, each
    /// stale member in turn (each tried once) until none is left or the
    /// server stops.
    fn spawn(&self, thread: &mut Option<std::thread::JoinHandle<()>>, first: (Job, Arc<dyn Device>)) {
        // A follower must not take an earlier rebuild's end for this one's.
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.paused.store(false, Ordering::Relaxed);
        let (dir, array, stop, paused, last, auto_resync) = (
            self.dir.clone(),
            self.array.clone(),
            self.stop.clone(),
            self.paused.clone(),
            self.last.clone(),
            self.auto_resync,
        );
        let spawned = std::thread::Builder::new()
            .name("tessera-rebuild".to_string())
            .spawn(move || {
                let mut tried = vec![first.0.member];
                let mut next = Some(first);
                while let Some((job, device)) = next.take() {
                    rebuild_one(&dir, &array, (&stop, &paused), &last, job, device);
                    if auto_resync && !stop.load(Ordering::Relaxed) && !paused.load(Ordering::Relaxed) {
                        next = next_stale(&dir, &array, &mut tried);
                    }
                }
            });
        match spawned {
            Ok(handle) => *thread = Some(handle),
            Err(e) => eprintln!("tessera: cannot start the rebuild thread: {e}"),
        }
    }

    /// Stops the running rebuild at its next stripe, where it is saved
    /// (`DIR/rebuild.json`): it goes on at the next start of the server,
    /// or when started again. False if none runs.
    pub fn pause(&self) -> bool {
        let thread = self.thread.lock().unwrap_or_else(|p| p.into_inner());
        let running = thread.as_ref().is_some_and(|t| !t.is_finished());
        if running {
            self.paused.store(true, Ordering::Relaxed);
        }
        running
    }

    /// Goes on with the rebuild `DIR/rebuild.json` records, if any; else,
    /// with `auto_resync`, resyncs the stale members (present, but out of
    /// date), one after the other.
    pub fn resume(&self) -> Result<()> {
        match unfinished_job(&self.dir, &self.array)? {
            Some(job) => self.start(&Request {
                member: job.member,
                with: (!job.own).then(|| PathBuf::from(&job.device)),
                rate: job.rate,
                busy_rate: job.busy_rate,
                force: false,
            }),
            None if self.auto_resync => {
                let mut thread = self.thread.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(first) = next_stale(&self.dir, &self.array, &mut Vec::new()) {
                    self.spawn(&mut thread, first);
                }
                Ok(())
            }
            None => Ok(()),
        }
    }

    pub fn progress(&self) -> RebuildState {
        RebuildState {
            running: self.array.rebuild_progress(),
            last: self.last.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        }
    }

    /// Waits for the rebuild's thread (the caller set `stop`).
    pub fn join(&self) {
        if let Some(thread) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = thread.join();
        }
    }
}

fn summary(index: usize, report: &RebuildReport) -> String {
    format!(
        "member {index} rebuilt: {} chunks ({}) of {} stripes written, {} stripes held already (its superblock's checkpoint), {} chunks checked current and kept, {} stripes done before a restart, in {:.2} s ({}/s); it is healthy again",
        report.chunks_written,
        human(report.bytes_written),
        report.stripes_total,
        report.stripes_trusted,
        report.chunks_current,
        report.stripes_resumed,
        report.milliseconds as f64 / 1000.0,
        human(report.bytes_written * 1000 / report.milliseconds.max(1))
    )
}

fn show(progress: &mut Progress, report: &RebuildReport) {
    let message = format!(
        "{} chunks written ({}), {} kept",
        report.chunks_written,
        human(report.bytes_written),
        report.chunks_current
    );
    progress.update(report.stripes_done, report.stripes_total, message);
}

/// How often `replace` asks a server how its rebuild goes.
const POLL_INTERVAL: std::time::Duration = std::time::Duration::from_millis(200);

/// `tessera replace`: in the server if one serves DIR (followed until it
/// ends unless `detach`), else here.
pub fn replace(dir: &Path, request: Request, detach: bool) -> Result<()> {
    let index = request.member;
    let request = Request {
        with: request.with.as_deref().map(absolute).transpose()?,
        ..request
    };
    if api::ask(dir, &api::Request::Replace(request.clone()), |_| {})?.is_some() {
        if detach {
            println!("rebuilding member {index} in the server; `tessera status` shows how far it is");
            return Ok(());
        }
        eprintln!(
            "tessera: the server rebuilds member {index} while it serves; Ctrl-C stops watching, not the rebuild"
        );
        let mut progress = Progress::new("replace");
        // Ends when the server reports this rebuild's end, or stops.
        loop {
            std::thread::sleep(POLL_INTERVAL);
            let take = |answer| match answer {
                Answer::Rebuild(state) => Some(state),
                _ => None,
            };
            let Some(state) = api::ask_for(dir, &api::Request::Rebuild, take)? else {
                progress.finish();
                bail!("the server stopped; the rebuild goes on when the array is served again");
            };
            match (state.running, state.last) {
                (Some(report), _) if report.member == index => show(&mut progress, &report),
                (None, Some(last)) if last.member == index => {
                    progress.finish();
                    if !last.done {
                        bail!("{}", last.message);
                    }
                    println!("{}", last.message);
                    return Ok(());
                }
                _ => {}
            }
        }
    }
    let _lock = lock(dir)?;
    let array = open(dir)?;
    let (job, device) = prepare(dir, &array, &request)?;
    let mut progress = Progress::new("replace");
    let (report, _) = run(dir, &array, job, device, |report| {
        show(&mut progress, report);
        true
    })?;
    progress.finish();
    // A clean stop: the next open reads the checkpoint.
    crate::history::close_and_save(dir, &array)?;
    println!("{}", summary(index, &report));
    Ok(())
}
