//! `tessera serve`: the daemon. It opens the array, serves its volumes
//! over NBD (`exports`), answers the control API on the control socket
//! (`control`) and, with `--http`, over HTTP with the dashboard (`http`),
//! serves Prometheus metrics with `--metrics`, and runs the rebuilder and
//! the healer; on SIGINT or SIGTERM it stops them and closes the array
//! cleanly.

mod control;
mod exports;
pub mod http;

use anyhow::{bail, Context, Result};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tessera_array::EngineOptions;

use crate::api::{Served, CONTROL_SOCKET};
use crate::array_cmd::{human, lock, open_with};
use crate::metrics::Metrics;
use crate::replace::Rebuilder;

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
    /// Where to serve the API and the dashboard over HTTP (`serve --http`).
    pub http: Option<http::Options>,
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
    let ready: Arc<std::sync::OnceLock<Served>> = Arc::default();
    let since = Instant::now();
    {
        let (ready, stop) = (ready.clone(), stop.clone());
        std::thread::Builder::new()
            .name("control".to_string())
            .spawn(move || control::control_loop(control, ready, since, stop))?;
    }
    // So does HTTP: the dashboard shows the array opening.
    if let Some(options) = s.http.take() {
        let bound = http::serve(options, ready.clone(), since)?;
        eprintln!("tessera: dashboard and API at {bound}");
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
    let latency = Arc::new(crate::api::LatencyCounters::default());
    let _ = ready.set(Served {
        array: array.clone(),
        rebuilder: rebuilder.clone(),
        latency: latency.clone(),
    });
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
    let volumes = exports::Volumes {
        array: array.clone(),
        metrics,
        latency,
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

/// Sets the mode of a socket this server created: its owner only unless
/// told otherwise (NBD clients get the whole array, the control socket
/// can fail members).
fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {} to {mode:o}", path.display()))
}

/// Removes a file when dropped (the control socket, however `serve` ends).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
