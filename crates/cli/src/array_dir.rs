//! What the commands that work on an array directory share: DIR holds
//! `members` (one member path per line, relative to DIR or absolute; the
//! superblocks, not this list, say which member is which), the member
//! files `create --devices` made, `log-devices` if the array has any,
//! and while served, `serve.lock` and `control.sock`, through which the
//! commands reach the server (`crate::api`). Opening and locking the
//! directory, sizes as people read them, progress bars, and long work
//! run by the server or here.

use anyhow::{bail, Context, Result};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use tessera_array::device::{Device, FileDevice};
use tessera_array::{Array, EngineOptions};

use crate::api::{self, Request};

pub(crate) const MEMBERS_FILE: &str = "members";

/// The array's log devices, one path a line, if it has any.
pub(crate) const LOG_DEVICES_FILE: &str = "log-devices";

const LOCK_FILE: &str = "serve.lock";

/// Bytes at the start of a device that must be zeros for `create` to
/// take it without `--force`: where file systems, partition tables and
/// Tessera's own superblock live.
pub(crate) const CREATE_CHECKED_BYTES: u64 = 1 << 20;

/// Refuses a device that is another array's member or holds data at its
/// start, so that `create` never formats what someone is using.
pub(crate) fn refuse_if_in_use(path: &Path, device: &FileDevice) -> std::io::Result<()> {
    let refuse = |what: String| {
        std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!(
                "{} {what}: refusing to overwrite it (--force to use it anyway)",
                path.display()
            ),
        )
    };
    if let Ok(sb) = tessera_array::read_superblock(device) {
        return Err(refuse(format!(
            "is member {} of Tessera array {}",
            sb.member_index,
            tessera_array::hex(&sb.array_uuid)
        )));
    }
    let mut start = vec![0u8; device.size().min(CREATE_CHECKED_BYTES) as usize];
    device.read_at(&mut start, 0)?;
    if start.iter().any(|&b| b != 0) {
        return Err(refuse(
            "holds data in its first MiB (a file system, a partition table, another array?)".to_string(),
        ));
    }
    Ok(())
}

pub(crate) fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Opens the array in DIR; members that cannot be opened count as
/// missing, but one another process holds is an error.
pub(crate) fn open(dir: &Path) -> Result<Array> {
    open_with(dir, EngineOptions::default())
}

/// The lines of DIR/members, as written (paths relative to DIR or
/// absolute), one a member.
pub(crate) fn listed_lines(dir: &Path) -> Result<Vec<String>> {
    let list = dir.join(MEMBERS_FILE);
    let text = std::fs::read_to_string(&list)
        .with_context(|| format!("{} is not an array directory (no {})", dir.display(), list.display()))?;
    Ok(text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.trim().to_string())
        .collect())
}

/// [`open`], run with `engine` options.
pub(crate) fn open_with(dir: &Path, engine: EngineOptions) -> Result<Array> {
    let list = dir.join(MEMBERS_FILE);
    let text = std::fs::read_to_string(&list)
        .with_context(|| format!("{} is not an array directory (no {})", dir.display(), list.display()))?;
    let members = open_listed(dir, &text, "member")?;
    let mut engine = engine;
    // A log device missing here is the array's to judge (refused if
    // none is left that may hold blocks).
    if let Ok(text) = std::fs::read_to_string(dir.join(LOG_DEVICES_FILE)) {
        let found = open_listed(dir, &text, "log device")?;
        engine.log_devices = found.into_iter().filter_map(|(name, d)| Some((name, d?))).collect();
    }
    let array = tessera_array::open_with(members, engine)?;
    crate::give_back_freed_memory();
    Ok(array)
}

/// A device listed in the array's directory, `None` if it could not be
/// opened.
type Listed = (String, Option<Arc<dyn Device>>);

/// The devices `text` lists, one path a line (relative to `dir`); one
/// that cannot be opened is `None`, and said so, but one another process
/// holds is an error: opening without it would record it as failed.
fn open_listed(dir: &Path, text: &str, what: &str) -> Result<Vec<Listed>> {
    let mut found = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let path = dir.join(line.trim());
        let device = match FileDevice::open(&path) {
            Ok(d) => Some(Arc::new(d) as Arc<dyn Device>),
            Err(e) if e.kind() == std::io::ErrorKind::ResourceBusy => {
                bail!("{what} {} is {e}; stop the other user first", path.display())
            }
            Err(e) => {
                eprintln!("tessera: {what} {} is missing: {e}", path.display());
                None
            }
        };
        found.push((path.display().to_string(), device));
    }
    Ok(found)
}

pub(crate) fn lock(dir: &Path) -> Result<std::fs::File> {
    // Checked first, so that a mistyped directory is left as it was.
    if !dir.join(MEMBERS_FILE).is_file() {
        bail!(
            "{} is not a Tessera array (it has no {MEMBERS_FILE} file): give the directory `tessera create --dir` made",
            dir.display()
        );
    }
    let path = dir.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    if file.try_lock().is_err() {
        bail!(
            "{} is in use by another tessera process (it holds {})",
            dir.display(),
            path.display()
        );
    }
    Ok(file)
}

/// How long work over every stripe (`scrub`, `replace`) shows its
/// progress: a bar (stripes, rate, percent, ETA) on a terminal, a plain
/// line a second otherwise (logs, CI).
pub(crate) struct Progress {
    label: &'static str,
    unit: &'static str,
    bar: Option<indicatif::ProgressBar>,
    last: std::time::Instant,
}

impl Progress {
    pub(crate) fn new(label: &'static str) -> Progress {
        Progress::counting(label, "stripes")
    }

    /// Progress counted in `unit`s.
    pub(crate) fn counting(label: &'static str, unit: &'static str) -> Progress {
        use std::io::IsTerminal;
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(0);
            let template =
                format!("{label} {{bar:40}} {{percent:>3}}% {{pos}}/{{len}} {unit}, {{per_sec}}, ETA {{eta}}; {{msg}}");
            bar.set_style(indicatif::ProgressStyle::with_template(&template).expect("a valid template"));
            bar
        });
        Progress {
            label,
            unit,
            bar,
            last: Instant::now(),
        }
    }

    /// `done` of `total` stripes, and what else to say.
    pub(crate) fn update(&mut self, done: u64, total: u64, message: String) {
        if let Some(bar) = &self.bar {
            bar.set_length(total);
            bar.set_position(done);
            bar.set_message(message);
            return;
        }
        if self.last.elapsed() < crate::api::PROGRESS_INTERVAL {
            return;
        }
        self.last = Instant::now();
        eprintln!(
            "{}: {done}/{total} {} ({:.0}%), {message}",
            self.label,
            self.unit,
            100.0 * done as f64 / total.max(1) as f64
        );
    }

    /// A scrub's report so far.
    pub(crate) fn scrub(&mut self, report: &tessera_array::ScrubReport) {
        let message = format!(
            "{} read, {} bad chunks, {} repaired",
            human(report.bytes_read),
            report.chunks_bad,
            report.chunks_repaired
        );
        self.update(report.stripes_checked, report.stripes_total, message);
    }

    pub(crate) fn heal(&mut self, report: &tessera_array::HealReport) {
        let message = format!(
            "{} moved to healthy members, {} copied",
            report.stripes_healed,
            human(report.bytes_relocated)
        );
        self.update(report.stripes_done, report.stripes_total, message);
    }

    pub(crate) fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// Long work with a progress report (`R`): asked of the server that
/// serves `dir` with `request`, if one does, else run by `here` on the
/// array opened here; each report so far shown by `show`.
pub(crate) fn served_or_here<R: api::LongWork>(
    dir: &Path,
    request: &Request,
    progress: &mut Progress,
    show: fn(&mut Progress, &R),
    here: impl FnOnce(&Array, &mut dyn FnMut(&R) -> bool) -> Result<R, tessera_array::ArrayError>,
) -> Result<R> {
    let answer = api::ask(dir, request, |report| {
        if let Some(report) = R::from_progress(report) {
            show(progress, &report);
        }
    })?;
    match answer {
        Some(answer) => R::from_answer(answer).context("the server answered with another kind of report"),
        None => {
            let _lock = lock(dir)?;
            let array = open(dir)?;
            let report = here(&array, &mut |report| {
                show(progress, report);
                true
            })?;
            crate::history::close_and_save(dir, &array)?;
            Ok(report)
        }
    }
}
