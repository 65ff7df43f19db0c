//! `tessera create | serve | status | fail`: an array in a directory.
//!
//! DIR holds `members` (one member path per line, relative to DIR or
//! absolute; the superblocks, not this list, say which member is which),
//! the member files `create --devices` made, and while served, `serve.lock`
//! and `control.sock`, through which `status` and `fail` reach the server.

use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tessera_array::device::{Device, FileDevice};
use tessera_array::{Array, ArrayError, CreateOptions, EngineOptions, Status};
use tessera_nbd::Failure;

use crate::metrics::{Metrics, Op};
use crate::replace::Rebuilder;

pub(crate) const MEMBERS_FILE: &str = "members";
/// The array's log devices, one path a line, if it has any.
const LOG_DEVICES_FILE: &str = "log-devices";
const LOCK_FILE: &str = "serve.lock";
const CONTROL_SOCKET: &str = "control.sock";

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
fn open_with(dir: &Path, engine: EngineOptions) -> Result<Array> {
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

/// An export: one volume of the array, with errors logged and mapped to
/// NBD errnos, and each request counted and timed when metrics are on.
struct ArrayExport {
    volume: tessera_array::Volume,
    metrics: Option<Arc<Metrics>>,
}

/// The exports: the array's volumes by name, the default one first (and
/// for the empty name), as they are when a client asks.
struct Volumes {
    array: Arc<Array>,
    metrics: Option<Arc<Metrics>>,
    dir: String,
}

impl tessera_nbd::Catalog<ArrayExport> for Volumes {
    fn list(&self) -> Vec<(String, String)> {
        self.array
            .volumes()
            .into_iter()
            .map(|v| {
                let description = format!("Tessera array {}, volume {}", self.dir, v.name);
                (v.name, description)
            })
            .collect()
    }

    fn open(&self, name: &str) -> Option<Arc<ArrayExport>> {
        let name = if name.is_empty() {
            tessera_array::volume::DEFAULT_VOLUME_NAME
        } else {
            name
        };
        let volume = self.array.volume(name).ok()?;
        Some(Arc::new(ArrayExport {
            volume,
            metrics: self.metrics.clone(),
        }))
    }
}

impl ArrayExport {
    /// Runs a request of `bytes` (`op`): timed and counted when metrics
    /// are on, its error logged and mapped to the NBD errno.
    fn run<T>(&self, op: Op, bytes: u64, request: impl FnOnce() -> Result<T, ArrayError>) -> Result<T, Failure> {
        let result = match &self.metrics {
            Some(metrics) => {
                let started = Instant::now();
                let result = request();
                metrics.record(op, bytes, started, result.is_ok());
                result
            }
            None => request(),
        };
        result.map_err(|e| {
            eprintln!("tessera: {} failed: {e}", op.name().replace('_', " "));
            Failure {
                errno: nbd_errno(&e),
                message: Some(e.to_string()),
            }
        })
    }
}

/// The errno an NBD client sees for an error of the array: EINVAL for a
/// range outside the volume, ENOSPC for a full array, ENODEV for a volume
/// deleted under it (as a pulled device), EIO for the rest.
fn nbd_errno(error: &tessera_array::ArrayError) -> u32 {
    use tessera_array::ArrayError;
    match error {
        ArrayError::OutOfRange { .. } => 22,
        ArrayError::NoSpace => 28,
        ArrayError::VolumeGone { .. } => 19,
        _ => 5,
    }
}

impl tessera_nbd::Export for ArrayExport {
    fn size(&self) -> u64 {
        self.volume.size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), Failure> {
        self.run(Op::Read, buf.len() as u64, || self.volume.read(offset, buf))
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), Failure> {
        self.run(Op::Write, data.len() as u64, || self.volume.write(offset, data, fua))
    }
    fn flush(&self) -> Result<(), Failure> {
        self.run(Op::Flush, 0, || self.volume.flush())
    }
    fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), Failure> {
        self.run(Op::Trim, len, || self.volume.write_zeroes(offset, len, fua))
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), Failure> {
        self.run(Op::WriteZeroes, len, || self.volume.write_zeroes(offset, len, fua))
    }
    fn cache(&self, offset: u64, len: u64) -> Result<(), Failure> {
        self.run(Op::Cache, len, || self.volume.prefetch(offset, len))
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<(u64, u32)>, Failure> {
        let runs = self.run(Op::BlockStatus, len, || self.volume.allocation(offset, len))?;
        let hole = tessera_nbd::STATE_HOLE | tessera_nbd::STATE_ZERO;
        Ok(runs
            .into_iter()
            .map(|(bytes, stored)| (bytes, if stored { 0 } else { hole }))
            .collect())
    }
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

pub struct Serve {
    pub dir: PathBuf,
    pub listen: Option<String>,
    pub socket: Option<PathBuf>,
    /// Mode of the `--socket` file (0600 by default: clients get the
    /// whole array).
    pub socket_mode: u32,
    pub accel: tessera_accel::Kind,
    pub reconstruct_cache_bytes: usize,
    /// Bytes of map pages kept in memory (`serve --map-cache`).
    pub map_cache_bytes: usize,
    pub member_errors_max: u64,
    /// Where to serve Prometheus metrics (`serve --metrics`).
    pub metrics: Option<String>,
    /// Open even if no log device can be read (`serve --discard-missing-log`).
    pub discard_missing_log: bool,
    /// Open even if the array looks open elsewhere (`serve --force`).
    pub ignore_activity: bool,
    /// GC copies in stripes of their own (off: `serve --no-gc-stream`).
    pub gc_stream: bool,
    /// Stale members resynced at start (off: `serve --no-auto-resync`).
    pub auto_resync: bool,
    /// Degraded stripes healed onto healthy members in the background
    /// (off: `serve --no-auto-heal`).
    pub auto_heal: bool,
    pub limits: tessera_nbd::Limits,
    pub tls: Option<tessera_nbd::Tls>,
}

/// Where to listen: a socket systemd passed (socket activation), else
/// `--socket`, else `--listen` (default 127.0.0.1:10809).
fn listener(
    passed: Option<tessera_nbd::Listener>,
    listen: Option<&str>,
    socket: Option<(&Path, u32)>,
    tls: bool,
) -> Result<tessera_nbd::Listener> {
    if let Some(passed) = passed {
        if listen.is_some() || socket.is_some() {
            bail!("systemd passed a listening socket (LISTEN_FDS): drop --listen and --socket");
        }
        return Ok(passed);
    }
    if let Some((path, mode)) = socket {
        let _ = std::fs::remove_file(path);
        let l = UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
        set_mode(path, mode)?;
        return Ok(tessera_nbd::Listener::Unix(l));
    }
    let address = listen.unwrap_or("127.0.0.1:10809");
    let l = std::net::TcpListener::bind(address).with_context(|| format!("listening on {address}"))?;
    let local = l.local_addr()?;
    if !local.ip().is_loopback() && !tls {
        eprintln!(
            "tessera: warning: listening on {local} without TLS: anyone who can reach it can read and \
             write the whole array; bind to 127.0.0.1, use a Unix socket or --tls-certificates/--tls-psk \
             unless the network is trusted"
        );
    }
    Ok(tessera_nbd::Listener::Tcp(l))
}

pub fn serve(mut s: Serve) -> Result<()> {
    // Taken first, before anything opened could be given its descriptor.
    let passed = tessera_nbd::Listener::from_systemd().context("taking the socket systemd passed")?;
    let (dir, listen, socket) = (s.dir.as_path(), s.listen.as_deref(), s.socket.as_deref());
    let _lock = lock(dir)?;
    let engine = EngineOptions {
        accel: Some(tessera_accel::select(s.accel)?),
        reconstruct_cache_bytes: s.reconstruct_cache_bytes,
        map_cache_bytes: s.map_cache_bytes,
        member_errors_max: s.member_errors_max,
        discard_missing_log: s.discard_missing_log,
        ignore_activity: s.ignore_activity,
        gc_stream: s.gc_stream,
        ..EngineOptions::default()
    };
    let stop = Arc::new(AtomicBool::new(false));
    // The control socket answers from the start: while the array opens,
    // that it is opening and for how long (not "in use by another
    // process").
    let control_path = dir.join(CONTROL_SOCKET);
    let _ = std::fs::remove_file(&control_path);
    let control = UnixListener::bind(&control_path).with_context(|| format!("binding {}", control_path.display()))?;
    let _control_file = RemoveOnDrop(control_path.clone());
    set_mode(&control_path, 0o600)?;
    let ready: Arc<std::sync::OnceLock<Ready>> = Arc::default();
    {
        let (ready, stop, since) = (ready.clone(), stop.clone(), Instant::now());
        std::thread::spawn(move || control_loop(control, ready, since, stop));
    }
    let array = Arc::new(open_with(dir, engine)?);
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stop.clone())?;
    }
    // A rebuild a shutdown or crash stopped goes on now; else stale
    // members are resynced.
    let rebuilder = Arc::new(Rebuilder::new(dir, array.clone(), stop.clone(), s.auto_resync));
    if let Err(e) = rebuilder.resume() {
        eprintln!("tessera: the unfinished rebuild cannot go on: {e:#}");
    }
    // Stripes left short by a member that is out are healed onto the
    // others, where there are more members than a stripe is wide.
    let healer = s
        .auto_heal
        .then(|| crate::heal::spawn_healer(array.clone(), stop.clone(), crate::replace::DEFAULT_BUSY_RATE))
        .transpose()?;
    let _ = ready.set((array.clone(), rebuilder.clone()));
    let listener = listener(passed, listen, socket.map(|p| (p, s.socket_mode)), s.tls.is_some())?;
    let url = listener.uri("tessera", s.tls.is_some())?;
    let status = array.status()?;
    for rejected in &status.devices_rejected {
        eprintln!("tessera: warning: left out of the array: {}", rejected.why);
    }
    let r = &status.recovery;
    eprintln!(
        "tessera: opened in {} ms: {}, {} slots scanned, {} stripes replayed, {} torn stripes dropped",
        r.milliseconds,
        r.checkpoint_sequence
            .map_or("no checkpoint".to_string(), |c| format!("checkpoint at sequence {c}")),
        r.slots_scanned,
        r.stripes_replayed,
        r.torn_stripes_dropped
    );
    if let Some(error) = &r.checkpoint_error {
        eprintln!("tessera: the checkpoint could not be used ({error}); every slot was scanned instead");
    }
    if let Some(why) = r.log.as_ref().and_then(|log| log.replay_failed.as_ref()) {
        eprintln!("tessera: warning: the intent log's records could not be written to the members ({why}); they are served from memory and replayed again at the next start");
    }
    if let Some(why) = &status.writes_refused {
        eprintln!("tessera: warning: WRITES REFUSED: {why}; reads go on; bring members back, then restart");
    }
    eprintln!(
        "tessera: serving {} ({}+{}, {} exported, {} of {} members available, accelerator {}) at {url}",
        dir.display(),
        status.data,
        status.parity,
        human(status.logical_bytes),
        status.members.len() - status.members_unavailable,
        status.members.len(),
        match status.accelerator.detail.as_str() {
            "" => status.accelerator.name.clone(),
            detail => format!("{}: {detail}", status.accelerator.name),
        }
    );
    eprintln!("tessera: connect with e.g. `nbdinfo {url}` or `qemu-img info {url}`; stop with Ctrl-C");
    let metrics = match &s.metrics {
        Some(address) => {
            let metrics = Arc::new(Metrics::new());
            let bound = crate::metrics::serve(address, metrics.clone(), array.clone())?;
            eprintln!("tessera: metrics at http://{bound}/metrics");
            Some(metrics)
        }
        None => None,
    };
    let volumes = Volumes {
        array: array.clone(),
        metrics,
        dir: dir.display().to_string(),
    };
    let mut server = tessera_nbd::Server::with_catalog(Arc::new(volumes), s.limits);
    if let Some(tls) = s.tls.take() {
        server = server.with_tls(tls);
    }
    let server = Arc::new(server);
    let result = tessera_nbd::run(server, listener, stop.clone());
    // The rebuild stops at its next stripe (it goes on at the next start).
    stop.store(true, Ordering::Relaxed);
    rebuilder.join();
    if let Some(healer) = healer {
        let _ = healer.join();
    }
    eprintln!("tessera: shutting down: flushing and writing a map checkpoint");
    array.close()?;
    if let Some(path) = socket {
        let _ = std::fs::remove_file(path);
    }
    result?;
    eprintln!("tessera: stopped cleanly");
    Ok(())
}

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

/// Sets the mode of a socket this server created: its owner only unless
/// told otherwise (NBD clients get the whole array, the control socket
/// can fail members).
fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {} to {mode:o}", path.display()))
}

/// Control clients connected and not yet done sending their request: the
/// ones a newcomer may close to make room, oldest first.
#[derive(Default)]
struct Readers {
    next_id: u64,
    waiting: std::collections::VecDeque<(u64, UnixStream)>,
}

/// The served array and its rebuilder, once the array is open.
type Ready = (Arc<Array>, Arc<Rebuilder>);

/// Removes a file when dropped (the control socket, however `serve` ends).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Answers requests on the control socket (see [`control_client`]), each
/// client on its own thread, its request due within [`CONTROL_TIMEOUT`];
/// until `ready` is set, with how long the array has been opening.
fn control_loop(listener: UnixListener, ready: Arc<std::sync::OnceLock<Ready>>, since: Instant, stop: Arc<AtomicBool>) {
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
                    let _ = (&stream).write_all(b"error: the server is busy with other control clients; try again\n");
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
            match (request, ready.get()) {
                (Some(line), Some((array, rebuilder))) => control_client(&stream, &line, array, rebuilder),
                (Some(_), None) => {
                    let answer = format!(
                        "error: the server is still opening the array ({:.0} s so far); ask again once it serves\n",
                        since.elapsed().as_secs_f64()
                    );
                    let _ = (&stream).write_all(answer.as_bytes());
                }
                (None, _) => {}
            }
            busy.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// One request line, whole by `deadline` (a client that trickles bytes
/// gets no more time than a silent one); `None` if it is not.
fn read_request(stream: &UnixStream, deadline: Instant) -> Option<String> {
    let mut line = Vec::new();
    let mut buffer = [0u8; 1024];
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
            line.truncate(end + 1);
            return String::from_utf8(line).ok();
        }
        if line.len() as u64 > CONTROL_REQUEST_BYTES_MAX {
            return None;
        }
    }
}

/// Longest request line a control client may send.
const CONTROL_REQUEST_BYTES_MAX: u64 = 8192;

/// One control request, one line each way: `status`, `fail I`, `scrub
/// RATE` and `heal RATE` (progress lines, then the report), `replace {json}` (starts a
/// rebuild, see `replace::Request`) and `rebuild` (how it goes).
fn control_client(stream: &UnixStream, line: &str, array: &Array, rebuilder: &Rebuilder) {
    // Answers that take long (a scrub's) have their own time to be read.
    let _ = stream.set_read_timeout(Some(CONTROL_TIMEOUT));
    if let Some(json) = line.strip_prefix("replace ") {
        let reply = serde_json::from_str::<crate::replace::Request>(json)
            .map_err(anyhow::Error::from)
            .and_then(|request| rebuilder.start(&request));
        let text = match reply {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("error: {e:#}"),
        };
        let _ = (&*stream).write_all((text + "\n").as_bytes());
        return;
    }
    let reply = match line.split_whitespace().collect::<Vec<_>>().as_slice() {
        ["rebuild"] => serde_json::to_string(&rebuilder.progress()).map_err(|e| e.to_string()),
        ["status"] => array
            .status()
            .map_err(|e| e.to_string())
            .and_then(|s| serde_json::to_string(&s).map_err(|e| e.to_string())),
        ["events"] => serde_json::to_string(&array.events()).map_err(|e| e.to_string()),
        ["fail", index] => match index.parse::<usize>() {
            Ok(i) => array
                .fail_member(i)
                .map(|()| "ok".to_string())
                .map_err(|e| e.to_string()),
            Err(_) => Err(format!("'{index}' is not a member index")),
        },
        ["scrub", rate] => match rate.parse::<u64>() {
            Ok(rate) => streamed(stream, |progress| {
                array.scrub_with((rate > 0).then_some(rate), progress)
            }),
            Err(_) => Err(format!("'{rate}' is not a rate in bytes a second")),
        },
        ["volume", words @ ..] => crate::volume_cmd::Request::parse(words)
            .and_then(|request| request.run(array).map_err(|e| e.to_string())),
        ["heal", rate] => match rate.parse::<u64>() {
            Ok(rate) => streamed(stream, |progress| array.heal_with((rate > 0).then_some(rate), progress)),
            Err(_) => Err(format!("'{rate}' is not a rate in bytes a second")),
        },
        _ => Err(
            "unknown request: use 'status', 'events', 'fail I', 'scrub RATE', 'heal RATE', 'volume ...', 'replace {json}' or 'rebuild'"
                .to_string(),
        ),
    };
    let text = match reply {
        Ok(text) => text,
        Err(e) => format!("error: {e}"),
    };
    let _ = (&*stream).write_all((text + "\n").as_bytes());
}

/// Runs long work (a scrub, a heal) for a control client, sending it a
/// `progress` line (the report so far, JSON) every second; the work stops
/// if the client goes away. Returns the final report as JSON.
fn streamed<R: serde::Serialize>(
    stream: &UnixStream,
    work: impl FnOnce(&mut dyn FnMut(&R) -> bool) -> Result<R, tessera_array::ArrayError>,
) -> Result<String, String> {
    let mut last = Instant::now();
    let mut progress = |report: &R| {
        if last.elapsed() < PROGRESS_INTERVAL {
            return true;
        }
        last = Instant::now();
        let line = format!("progress {}\n", serde_json::to_string(report).unwrap_or_default());
        (&*stream).write_all(line.as_bytes()).is_ok()
    };
    let report = work(&mut progress).map_err(|e| e.to_string())?;
    serde_json::to_string(&report).map_err(|e| e.to_string())
}

/// How often long work reports its progress.
const PROGRESS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Sends one request to a running server; `None` if none is running.
pub(crate) fn ask_server(dir: &Path, request: &str) -> Result<Option<String>> {
    ask_server_with(dir, request, |_| {})
}

/// [`ask_server`], handing each progress line the server sends first to
/// `on_progress`.
fn ask_server_with(dir: &Path, request: &str, mut on_progress: impl FnMut(&str)) -> Result<Option<String>> {
    let Ok(mut stream) = UnixStream::connect(dir.join(CONTROL_SOCKET)) else {
        return Ok(None);
    };
    // A status of a huge array takes a while; a server that says nothing
    // for this long is stuck, and saying so beats hanging.
    stream.set_read_timeout(Some(std::time::Duration::from_secs(60)))?;
    stream.write_all(format!("{request}\n").as_bytes())?;
    let mut reader = BufReader::new(&stream);
    let mut line = String::new();
    // Long work sends progress lines before its answer.
    loop {
        line.clear();
        reader
            .read_line(&mut line)
            .with_context(|| format!("the server serving {} did not answer '{request}'", dir.display()))?;
        match line.strip_prefix("progress ") {
            Some(progress) => on_progress(progress.trim()),
            None => break,
        }
    }
    if let Some(error) = line.strip_prefix("error: ") {
        bail!("{}", error.trim());
    }
    Ok(Some(line.trim().to_string()))
}

pub fn status(dir: &Path, json: bool) -> Result<()> {
    let status: Status = match ask_server(dir, "status")? {
        Some(text) => serde_json::from_str(&text).context("the server's status")?,
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
        let text = ask_server(dir, "status")?.with_context(|| {
            format!(
                "no server serves {}: iostat shows a served array's rates (start `tessera serve {}`)",
                dir.display(),
                dir.display()
            )
        })?;
        Ok((
            serde_json::from_str(&text).context("the server's status")?,
            Instant::now(),
        ))
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
    let text = ask_server(dir, "events")?.with_context(|| {
        format!(
            "no server serves {}: the history is the server's, since it opened the array",
            dir.display()
        )
    })?;
    let events: Vec<tessera_array::events::Event> = serde_json::from_str(&text).context("the server's events")?;
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
        if self.last.elapsed() < PROGRESS_INTERVAL {
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

/// Long work with a progress report (`R`): asked of the server that
/// serves `dir` with `request`, if one does, else run by `here` on the
/// array opened here; each report so far shown by `show`.
pub(crate) fn served_or_here<R: serde::de::DeserializeOwned>(
    dir: &Path,
    request: &str,
    progress: &mut Progress,
    show: fn(&mut Progress, &R),
    here: impl FnOnce(&Array, &mut dyn FnMut(&R) -> bool) -> Result<R, tessera_array::ArrayError>,
) -> Result<R> {
    let answer = ask_server_with(dir, request, |line| {
        if let Ok(report) = serde_json::from_str::<R>(line) {
            show(progress, &report);
        }
    })?;
    match answer {
        Some(text) => Ok(serde_json::from_str(&text)?),
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
        &format!("scrub {rate}"),
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
    if ask_server(dir, &format!("fail {index}"))?.is_some() {
        println!("member {index} marked failed; the served array goes on degraded");
        return Ok(());
    }
    let _lock = lock(dir)?;
    open(dir)?.fail_member(index)?;
    println!("member {index} marked failed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::nbd_errno;
    use tessera_array::ArrayError;

    /// While the array opens, the control socket says so, and how long it
    /// has taken, instead of leaving `status` to find the directory
    /// locked by "another process".
    #[test]
    fn the_control_socket_says_the_array_is_still_opening() {
        use std::io::{BufRead, Write};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(super::CONTROL_SOCKET);
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let ready = std::sync::Arc::default();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let since = std::time::Instant::now();
        std::thread::spawn(move || super::control_loop(listener, ready, since, stop));
        let mut stream = std::os::unix::net::UnixStream::connect(&path).unwrap();
        stream.write_all(b"status\n").unwrap();
        let mut line = String::new();
        std::io::BufReader::new(&stream).read_line(&mut line).unwrap();
        assert!(
            line.starts_with("error: the server is still opening the array ("),
            "{line}"
        );
        let answer = super::ask_server(dir.path(), "status").unwrap_err().to_string();
        assert!(answer.contains("still opening"), "{answer}");
    }

    #[test]
    fn array_errors_reach_nbd_clients_as_their_errno() {
        let gone = ArrayError::VolumeGone { name: "v".to_string() };
        let range = ArrayError::OutOfRange {
            offset: 0,
            len: 1,
            size: 0,
        };
        assert_eq!(nbd_errno(&gone), 19);
        assert_eq!(nbd_errno(&range), 22);
        assert_eq!(nbd_errno(&ArrayError::NoSpace), 28);
        assert_eq!(nbd_errno(&ArrayError::Unreadable { slot: 3 }), 5);
    }
}
