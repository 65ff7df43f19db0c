//! `tessera create | status | iostat | events | scrub | fail`: an array
//! in a directory.
//!
//! DIR holds `members` (one member path per line, relative to DIR or
//! absolute; the superblocks, not this list, say which member is which),
//! the member files `create --devices` made, and while served, `serve.lock`
//! and `control.sock`, through which these commands reach the server
//! (`crate::api`).

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use tessera_array::device::{Device, FileDevice};
use tessera_array::{Array, CreateOptions, EngineOptions, Status};

use crate::api::{self, Answer, Request};

pub(crate) const MEMBERS_FILE: &str = "members";
/// The array's log devices, one path a line, if it has any.
const LOG_DEVICES_FILE: &str = "log-devices";
const LOCK_FILE: &str = "serve.lock";

pub struct Create {
    pub data: usize,
    pub parity: usize,
    pub dir: PathBuf,
    pub devices: Option<usize>,
    pub device_size: Option<u64>,
    pub device_paths: Vec<PathBuf>,
    pub chunk_bytes: usize,
    pub checksum: tessera_checksum::Algorithm,
    pub compression: Option<tessera_compress::Codec>,
    pub logical_bytes: Option<u64>,
    pub log_bytes: Option<u64>,
    pub log_device_paths: Vec<PathBuf>,
    /// Overwrite existing devices whatever they hold.
    pub force: bool,
}

pub fn create(c: &Create) -> Result<()> {
    let dir_made = !c.dir.exists();
    let result = create_in_dir(c);
    if result.is_err() && dir_made {
        // A refused create leaves no empty directory behind (remove_dir
        // takes only an empty one).
        let _ = std::fs::remove_dir(&c.dir);
    }
    result
}

fn create_in_dir(c: &Create) -> Result<()> {
    std::fs::create_dir_all(&c.dir).with_context(|| format!("creating {}", c.dir.display()))?;
    let list = c.dir.join(MEMBERS_FILE);
    if list.exists() {
        bail!(
            "{} already holds an array ({} exists); choose another directory",
            c.dir.display(),
            list.display()
        );
    }
    let count = c.devices.unwrap_or(c.device_paths.len());
    if c.data == 0 || c.data + c.parity > count {
        bail!(
            "{count} members for {}+{}: need K >= 1 and K+M <= N (one chunk of a stripe per member)",
            c.data,
            c.parity
        );
    }
    let mut members: Vec<(String, Arc<dyn Device>)> = Vec::new();
    let mut lines = Vec::new();
    let mut made: Vec<PathBuf> = Vec::new();
    let mut log_devices = Vec::new();
    let result = create_members(c, &mut members, &mut lines, &mut made).and_then(|()| {
        for path in &c.log_device_paths {
            // A missing file is made at the log area's size plus its header.
            let size = c
                .log_bytes
                .map(|b| b.next_multiple_of(4096) + tessera_array::format::LOG_DEVICE_AREA_START);
            if !path.exists() && size.is_none() {
                bail!(
                    "log device {} does not exist (give --log-size to create it as a file)",
                    path.display()
                );
            }
            log_devices.push(take_device(path, size, c.force, &mut made, "log device")?);
        }
        let options = CreateOptions {
            data: c.data,
            parity: c.parity,
            chunk_bytes: c.chunk_bytes,
            checksum: c.checksum,
            compression: c.compression,
            logical_bytes: c.logical_bytes,
            log_bytes: c.log_bytes,
        };
        if !c.force {
            let geometry = tessera_array::plan(&members, &options, &log_devices)?;
            refuse_written_regions(&members, &made, &geometry)?;
        }
        let engine = EngineOptions {
            log_devices: log_devices.clone(),
            ..EngineOptions::default()
        };
        Ok(tessera_array::create_with(
            std::mem::take(&mut members),
            &options,
            engine,
        )?)
    });
    let array = match result {
        Ok(array) => array,
        Err(error) => {
            // Leave nothing behind from a create that failed.
            for path in made {
                let _ = std::fs::remove_file(path);
            }
            return Err(error);
        }
    };
    if !log_devices.is_empty() {
        let names: Vec<&str> = log_devices.iter().map(|(name, _)| name.as_str()).collect();
        std::fs::write(c.dir.join(LOG_DEVICES_FILE), names.join("\n") + "\n")?;
    }
    std::fs::write(&list, lines.join("\n") + "\n")?;
    let s = array.status()?;
    array.close()?;
    println!(
        "created {}+{} on {} members in {}: {} stripes of {} KiB chunks, {} usable, exported as {} (checksum {}, compression {})",
        s.data,
        s.parity,
        s.members.len(),
        c.dir.display(),
        s.stripes_total,
        s.chunk_bytes >> 10,
        human(s.usable_bytes),
        human(s.logical_bytes),
        s.checksum,
        s.compression
    );
    Ok(())
}

fn create_members(
    c: &Create,
    members: &mut Vec<(String, Arc<dyn Device>)>,
    lines: &mut Vec<String>,
    made: &mut Vec<PathBuf>,
) -> Result<()> {
    match (c.devices, c.device_paths.is_empty()) {
        (Some(count), true) => {
            let size = c.device_size.context("--devices needs --device-size")?;
            for i in 0..count {
                let name = format!("member-{i:03}");
                let path = c.dir.join(&name);
                let device = FileDevice::create(&path, size).with_context(|| format!("creating {}", path.display()))?;
                made.push(path.clone());
                members.push((path.display().to_string(), Arc::new(device)));
                lines.push(name);
            }
        }
        (None, false) => {
            for path in &c.device_paths {
                let (name, device) = take_device(path, c.device_size, c.force, made, "member")?;
                lines.push(name.clone());
                members.push((name, device));
            }
        }
        _ => bail!("give either --devices N --device-size SIZE, or --device PATH for each member"),
    }
    Ok(())
}

/// A `--device` or `--log-device` for `create`: a file made at `size` if
/// it does not exist (and noted in `made`), or an existing file or block
/// device that holds nothing (unless `force`); named by its absolute path.
fn take_device(
    path: &Path,
    size: Option<u64>,
    force: bool,
    made: &mut Vec<PathBuf>,
    what: &str,
) -> Result<(String, Arc<dyn Device>)> {
    let device = match (path.exists(), size) {
        (false, Some(size)) => {
            made.push(path.to_path_buf());
            FileDevice::create(path, size)
        }
        _ => FileDevice::open(path).and_then(|device| {
            if !force {
                refuse_if_in_use(path, &device)?;
            }
            Ok(device)
        }),
    }
    .with_context(|| format!("opening {what} {}", path.display()))?;
    let absolute = std::fs::canonicalize(path)?;
    Ok((absolute.display().to_string(), Arc::new(device)))
}

/// Bytes at the start of a device that must be zeros for `create` to
/// take it without `--force`: where file systems, partition tables and
/// Tessera's own superblock live.
const CREATE_CHECKED_BYTES: u64 = 1 << 20;

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

/// Refuses existing members that hold data anywhere `create` writes (the
/// regions of [`tessera_array::format::Geometry::written_at_create`]: the
/// first MiB, and the log area and backup superblock at the end, measured
/// from the smallest member), as `wipefs` looks for signatures at both
/// ends: the first MiB alone let a device with data further on be
/// formatted. Files this create made hold nothing and are not read.
fn refuse_written_regions(
    members: &[(String, Arc<dyn Device>)],
    made: &[PathBuf],
    geometry: &tessera_array::format::Geometry,
) -> Result<()> {
    let made: Vec<PathBuf> = made
        .iter()
        .flat_map(|p| [p.clone(), std::fs::canonicalize(p).unwrap_or_default()])
        .collect();
    let mut buffer = vec![0u8; 1 << 20];
    for (name, device) in members {
        if made.iter().any(|p| p.as_os_str() == name.as_str()) {
            continue;
        }
        for region in geometry.written_at_create() {
            let mut at = region.start;
            while at < region.end {
                let len = (region.end - at).min(buffer.len() as u64) as usize;
                device.read_at(&mut buffer[..len], at)?;
                if buffer[..len].iter().any(|&b| b != 0) {
                    bail!(
                        "{name} holds data at byte {at}, where the array's superblocks or log go: refusing to overwrite it (--force to use it anyway)"
                    );
                }
                at += len as u64;
            }
        }
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

pub fn status(dir: &Path, json: bool) -> Result<()> {
    let status: Status = match api::ask_for(dir, &Request::Status, status_of)? {
        Some(status) => status,
        None => {
            let _lock = lock(dir)?;
            let array = open(dir)?;
            let status = array.status()?;
            // Closed cleanly, so that the next opening reads no stripe
            // header either; an array that refuses writes cannot be, and
            // its status is still worth showing.
            if let Err(error) = array.close() {
                eprintln!("tessera: not closed cleanly: {error}");
            }
            status
        }
    };
    if json {
        println!("{}", serde_json::to_string(&status)?);
        return Ok(());
    }
    print_status(&status);
    Ok(())
}

/// `tessera iostat`: the served array's status taken every `seconds`,
/// and the rates between two of them printed, per volume (its clients'
/// reads and writes of data) and per member (chunks, log blocks and
/// superblocks), `count` times or until interrupted.
pub fn iostat(dir: &Path, seconds: f64, count: Option<u64>) -> Result<()> {
    if !(seconds.is_finite() && seconds > 0.0) {
        bail!("the interval must be a positive number of seconds, not {seconds}");
    }
    let take = || -> Result<(Status, Instant)> {
        let status = api::ask_for(dir, &Request::Status, status_of)?.with_context(|| {
            format!(
                "no server serves {}: iostat shows a served array's rates (start `tessera serve {}`)",
                dir.display(),
                dir.display()
            )
        })?;
        Ok((status, Instant::now()))
    };
    let mut before = take()?;
    let mut printed = 0;
    while count.is_none_or(|c| printed < c) {
        std::thread::sleep(std::time::Duration::from_secs_f64(seconds));
        let now = take()?;
        print!(
            "{}",
            iostat_report(&before.0, &now.0, now.1.duration_since(before.1).as_secs_f64())
        );
        std::io::stdout().flush()?;
        before = now;
        printed += 1;
    }
    Ok(())
}

/// The rates between two statuses `seconds` apart, as `iostat` prints
/// them: one line per volume and per member.
fn iostat_report(before: &Status, now: &Status, seconds: f64) -> String {
    use tessera_array::device::IoTotals;
    let rate = |now: u64, before: u64| now.saturating_sub(before) as f64 / seconds;
    let line = |what: &str, now: &IoTotals, before: &IoTotals| {
        format!(
            "{what:<40} {:>10.0} {:>10.0} {:>10.1} {:>10.1}\n",
            rate(now.reads, before.reads),
            rate(now.writes, before.writes),
            rate(now.read_bytes, before.read_bytes) / 1e6,
            rate(now.write_bytes, before.write_bytes) / 1e6
        )
    };
    let mut out = format!(
        "{:<40} {:>10} {:>10} {:>10} {:>10}\n",
        format!("over {seconds:.1} s"),
        "reads/s",
        "writes/s",
        "read MB/s",
        "write MB/s"
    );
    // Each volume, then each member: (what it is, as shown, its I/O); a
    // member's state may change between the two, its place does not.
    let rows = |s: &Status| -> Vec<(String, String, IoTotals)> {
        let volumes = s.volumes.iter().map(|v| {
            let what = format!("volume {}", v.name);
            (what.clone(), what, v.io)
        });
        let members = s.members.iter().map(|m| {
            let what = format!("  member {} {}", m.index, m.name);
            (what.clone(), format!("{what} ({})", m.state.name()), m.io)
        });
        volumes.chain(members).collect()
    };
    let was: std::collections::HashMap<String, IoTotals> =
        rows(before).into_iter().map(|(what, _, io)| (what, io)).collect();
    for (what, shown, io) in rows(now) {
        out += &line(&shown, &io, &was.get(&what).copied().unwrap_or_default());
    }
    out
}

/// `tessera events`: what happened to the served array since it was
/// opened, oldest first, one line each (UTC), or as one JSON array.
pub fn events(dir: &Path, json: bool) -> Result<()> {
    let take = |answer| match answer {
        Answer::Events(events) => Some(events),
        _ => None,
    };
    let events = api::ask_for(dir, &Request::Events, take)?.with_context(|| {
        format!(
            "no server serves {}: the history is the server's, since it opened the array",
            dir.display()
        )
    })?;
    if json {
        println!("{}", serde_json::to_string(&events)?);
        return Ok(());
    }
    for event in &events {
        println!("{}  {}", utc(event.unix_ms), event.what);
    }
    Ok(())
}

/// The time of Unix milliseconds, RFC 3339 in UTC.
fn utc(unix_ms: u64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(unix_ms);
    humantime::format_rfc3339_millis(at).to_string()
}

/// `tessera status` for people: the typed report, field by field.
fn print_status(s: &Status) {
    println!(
        "array {}: {}+{}, {} KiB chunks, checksum {}, compression {}",
        s.array_uuid,
        s.data,
        s.parity,
        s.chunk_bytes >> 10,
        s.checksum,
        s.compression
    );
    for m in &s.members {
        let e = &m.errors;
        let errors = [
            ("read errors", e.read_errors),
            ("write errors", e.write_errors),
            ("checksum errors", e.checksum_errors),
            ("chunks repaired", e.chunks_repaired),
        ]
        .iter()
        .filter(|(_, count)| *count > 0)
        .map(|(what, count)| format!("{what} {count}"))
        .collect::<Vec<_>>();
        println!(
            "  member {:>3}  {:<8} {}{}",
            m.index,
            m.state.name(),
            m.name,
            if errors.is_empty() {
                String::new()
            } else {
                format!("  ({})", errors.join(", "))
            }
        );
    }
    for rejected in &s.devices_rejected {
        println!("  left out: {}", rejected.why);
    }
    if let Some(why) = &s.writes_refused {
        println!("WRITES REFUSED: {why}");
    }
    let percent = |done: u64, total: u64| 100.0 * done as f64 / total.max(1) as f64;
    if let Some(r) = &s.rebuild {
        println!(
            "rebuilding member {}: {} of {} stripes ({:.0}%), {} chunks written, {} kept",
            r.member,
            r.stripes_done,
            r.stripes_total,
            percent(r.stripes_done, r.stripes_total),
            r.chunks_written,
            r.chunks_current
        );
    }
    if let Some(h) = &s.heal {
        println!(
            "healing: {} of {} degraded stripes ({:.0}%), {} moved to healthy members ({})",
            h.stripes_done,
            h.stripes_total,
            percent(h.stripes_done, h.stripes_total),
            h.stripes_healed,
            human(h.bytes_relocated)
        );
    }
    if let Some(scrub) = &s.scrub {
        println!(
            "scrub running: {} of {} stripes checked, {} bad chunks found, {} repaired",
            scrub.stripes_checked, scrub.stripes_total, scrub.chunks_bad, scrub.chunks_repaired
        );
    }
    let accel = &s.accelerator;
    println!(
        "accelerator {}{}: {} stripes sealed, {} rebuilt, {} on the device",
        accel.name,
        if accel.detail.is_empty() {
            String::new()
        } else {
            format!(" ({})", accel.detail)
        },
        accel.stripes_sealed,
        accel.stripes_reconstructed,
        human(accel.bytes_on_device)
    );
    println!(
        "stripes: {} used of {} ({} free), {} degraded",
        s.stripes_used, s.stripes_total, s.stripes_free, s.stripes_degraded
    );
    println!(
        "capacity: raw {}, usable {}, logical {}; mapped {} stored as {} (compression ratio {:.2})",
        human(s.raw_bytes),
        human(s.usable_bytes),
        human(s.logical_bytes),
        human(s.mapped_bytes),
        human(s.stored_bytes),
        s.compression_ratio
    );
    println!(
        "since start: {} written by clients, {} to members (write amplification {:.2}); {} stripes sealed, {} short (FLUSH); {} FLUSHes, {} syncs",
        human(s.user_bytes_written),
        human(s.member_bytes_written),
        s.write_amplification,
        s.stripes_sealed,
        s.short_stripes_sealed,
        s.flushes,
        s.syncs
    );
    match &s.log {
        Some(log) => {
            let devices: Vec<String> = log
                .devices
                .iter()
                .map(|d| format!("{} ({})", d.name, d.state))
                .collect();
            let where_log = if devices.is_empty() {
                "on each member".to_string()
            } else {
                format!("on each log device: {}", devices.join(", "))
            };
            println!(
                "intent log: {} {}, {} live; {} FLUSHes logged in {} blocks ({} written, write amplification {:.2} of the {:.2}); {} stripes sealed instead, {} failed log writes",
                human(log.area_bytes),
                where_log,
                human(log.live_bytes),
                log.flushes_logged,
                log.blocks_written,
                human(log.bytes_written),
                s.write_amplification_log,
                s.write_amplification,
                log.stripes_sealed_instead,
                log.write_failures
            );
        }
        None => println!("intent log: none (FLUSH seals short stripes)"),
    }
    println!(
        "garbage collection: {} rounds, {} stripes emptied, {} relocated; writers waited {} ms for members, {} ms for a free slot",
        s.gc_rounds,
        s.gc_stripes_collected,
        human(s.gc_bytes_relocated),
        s.writers_waited_for_members_ms,
        s.writers_waited_for_slot_ms
    );
    println!(
        "errors: {} bad chunks found, {} repaired; {} reads reconstructed (from {} stripes rebuilt), {} unrecoverable",
        s.checksum_errors, s.chunks_repaired, s.reconstructed_reads, s.stripes_reconstructed, s.unrecoverable_reads
    );
    println!(
        "map cache: {} of {} used by {} pages in memory, {} pages ({}) only on the members; {} lookups found their pages, {} pages read in, {} evicted",
        human(s.map_bytes),
        human(s.map_cache_bytes),
        s.map_pages,
        s.map_pages_on_members,
        human(s.map_bytes_on_members),
        s.map_page_hits,
        s.map_page_misses,
        s.map_pages_evicted
    );
    let sequence = |value: Option<u64>| value.map_or("none".to_string(), |s| s.to_string());
    let r = &s.recovery;
    println!(
        "metadata: map of {} mappings in {} pages in memory ({} changed since the checkpoint), {} of memory; checkpoint at sequence {}, its page images in {} map stripes ({} written since start, {} of them a root alone, {} forced for room, {} dropped, {} of checkpoint stripes written); opening took {} ms from checkpoint {}{}, {} slots scanned, {} stripes replayed, {} torn stripes dropped, {} chunks repaired",
        s.map_mappings,
        s.map_pages,
        s.map_dirty_pages,
        human(s.map_bytes),
        sequence(s.checkpoint_sequence),
        s.map_stripes,
        s.checkpoints_written,
        s.checkpoints_root_only,
        s.checkpoints_forced,
        s.checkpoints_dropped,
        human(s.checkpoint_bytes_written),
        r.milliseconds,
        sequence(r.checkpoint_sequence),
        if r.clean_stop { " (after a clean stop)" } else { "" },
        r.slots_scanned,
        r.stripes_replayed,
        r.torn_stripes_dropped,
        r.chunks_repaired
    );
    if let Some(error) = &r.checkpoint_error {
        println!("  the checkpoint could not be used ({error}); every slot was scanned instead");
    }
}

/// How long work over every stripe (`scrub`, `replace`) shows its
/// progress: a bar (stripes, rate, percent, ETA) on a terminal, a plain
/// line a second otherwise (logs, CI).
pub(crate) struct Progress {
    label: &'static str,
    bar: Option<indicatif::ProgressBar>,
    last: std::time::Instant,
}

impl Progress {
    pub(crate) fn new(label: &'static str) -> Progress {
        use std::io::IsTerminal;
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(0);
            let template = format!(
                "{label} {{bar:40}} {{percent:>3}}% {{pos}}/{{len}} stripes, {{per_sec}}, ETA {{eta}}; {{msg}}"
            );
            bar.set_style(indicatif::ProgressStyle::with_template(&template).expect("a valid template"));
            bar
        });
        Progress {
            label,
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
            "{}: {done}/{total} stripes ({:.0}%), {message}",
            self.label,
            100.0 * done as f64 / total.max(1) as f64
        );
    }

    /// A scrub's report so far.
    fn scrub(&mut self, report: &tessera_array::ScrubReport) {
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

/// The status in an answer.
fn status_of(answer: Answer) -> Option<Status> {
    match answer {
        Answer::Status(status) => Some(*status),
        _ => None,
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
            array.close()?;
            Ok(report)
        }
    }
}

/// `tessera scrub`: through the server if one runs, else on the array
/// opened here; progress on stderr, the summary at the end.
pub fn scrub(dir: &Path, rate: u64, json: bool) -> Result<()> {
    let mut progress = Progress::new("scrub");
    let report = served_or_here(
        dir,
        &Request::Scrub { rate },
        &mut progress,
        Progress::scrub,
        |array, shown| array.scrub_with((rate > 0).then_some(rate), shown),
    )?;
    progress.finish();
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "scrub done: {} stripes checked, {} read; {} bad chunks found, {} repaired; {} stripes with wrong parity; {} unrecoverable",
            report.stripes_checked,
            human(report.bytes_read),
            report.chunks_bad,
            report.chunks_repaired,
            report.parity_mismatches,
            report.stripes_unrecoverable
        );
    }
    if report.stripes_unrecoverable > 0 || report.parity_mismatches > 0 {
        bail!("the scrub found damage it could not repair");
    }
    Ok(())
}

pub fn fail(dir: &Path, index: usize) -> Result<()> {
    if api::ask(dir, &Request::Fail { member: index }, |_| {})?.is_some() {
        println!("member {index} marked failed; the served array goes on degraded");
        return Ok(());
    }
    let _lock = lock(dir)?;
    open(dir)?.fail_member(index)?;
    println!("member {index} marked failed");
    Ok(())
}
