//! `tessera serve`: the daemon. It opens the array, serves its volumes
//! over NBD (`exports`), answers the control API on the control socket
//! (`control`) and, with `--http`, over HTTP with the dashboard (`http`),
//! serves Prometheus metrics with `--metrics`, and runs the rebuilder and
//! the healer; on SIGINT or SIGTERM it stops them and closes the array
//! cleanly.

mod control;
mod dispatch;
mod exports;
pub mod http;

use anyhow::{bail, Context, Result};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tessera_array::EngineOptions;

use crate::api::CONTROL_SOCKET;
use crate::array_dir::{human, lock, open_with};
use crate::metrics::Metrics;
use crate::replace::Rebuilder;
use dispatch::Served;

/// `tessera serve`'s flags.
#[derive(clap::Args)]
pub struct Serve {
    pub dir: PathBuf,
    /// TCP address to listen on (default 127.0.0.1:10809).
    #[arg(long, conflicts_with = "socket")]
    pub listen: Option<String>,
    /// Unix socket to listen on instead of TCP.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Mode of the --socket file, in octal (0660 lets its group in).
    #[arg(long, default_value = "600", value_parser = parse_mode, requires = "socket")]
    pub socket_mode: u32,
    /// Backend for parity, rebuilds and hashes: auto, cpu or cuda.
    #[arg(long, default_value = "auto")]
    pub accel: tessera_accel::Kind,
    /// Bytes of rebuilt stripes kept for degraded reads (at least 64 stripes).
    #[arg(long = "reconstruct-cache", value_name = "SIZE", value_parser = crate::size::parse_usize, default_value = "256M")]
    pub reconstruct_cache_bytes: usize,
    /// Bytes of map pages kept in memory; the rest stay on the
    /// members and are read when needed. Pages changed since the last
    /// checkpoint stay too, until it writes them.
    #[arg(long = "map-cache", value_name = "SIZE", value_parser = crate::size::parse_usize, default_value = "512M")]
    pub map_cache_bytes: usize,
    /// NBD connections served at once; more are closed at once.
    #[arg(long, default_value_t = 64)]
    pub max_connections: usize,
    /// Request bytes (read replies, write payloads) all connections
    /// together may hold; one connection holds at most 64M.
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_usize, default_value = "1G")]
    pub max_bytes_in_flight: usize,
    /// Threads carrying out requests, shared by all connections
    /// (default: 4 per core, at least 16).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Close a connection that has sent nothing for this many seconds
    /// with nothing in flight (0: never; guests and the kernel client
    /// may stay idle for hours).
    #[arg(long, default_value_t = 0)]
    pub idle_timeout: u64,
    /// TLS: off, on (clients choose) or require. Default: require
    /// when --tls-certificates or --tls-psk is given, else off.
    #[arg(long)]
    pub tls: Option<TlsMode>,
    /// Directory with server-cert.pem, server-key.pem (and ca-cert.pem
    /// for --tls-verify-peer), as qemu-nbd and nbdkit lay it out.
    #[arg(long, conflicts_with = "tls_psk")]
    pub tls_certificates: Option<PathBuf>,
    /// Pre-shared keys file in psktool's format (`identity:hexkey` lines).
    #[arg(long)]
    pub tls_psk: Option<PathBuf>,
    /// Require a client certificate signed by ca-cert.pem.
    #[arg(long, requires = "tls_certificates")]
    pub tls_verify_peer: bool,
    /// Fail a member once it has shown this many read and checksum
    /// errors since the server started, if the parity covers it (0: never).
    #[arg(long, default_value_t = tessera_array::limits::MEMBER_ERRORS_MAX_DEFAULT)]
    pub member_errors_max: u64,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9810).
    #[arg(long)]
    pub metrics: Option<String>,
    /// Serve the dashboard and the control API over HTTP at ADDR (e.g.
    /// 127.0.0.1:9811). Read-only unless --http-token-file is given;
    /// an address other than loopback needs TLS and a token.
    #[arg(long)]
    pub http: Option<String>,
    /// PEM certificate (chain) for HTTPS on --http.
    #[arg(long, requires = "http", requires = "http_tls_key")]
    pub http_tls_cert: Option<PathBuf>,
    /// PEM private key of --http-tls-cert.
    #[arg(long, requires = "http_tls_cert")]
    pub http_tls_key: Option<PathBuf>,
    /// File whose first line is the token an HTTP client sends
    /// (`Authorization: Bearer TOKEN`) to change the array (fail,
    /// scrub, heal, replace, volumes); 16 characters at least.
    #[arg(long, requires = "http")]
    pub http_token_file: Option<PathBuf>,
    /// Serve the array's KV spaces with Arrow Flight (gRPC) at ADDR
    /// (e.g. 127.0.0.1:9812): `tessera kv` and `pyarrow.flight` clients.
    /// An address other than loopback needs --kv-token-file.
    #[arg(long, value_name = "ADDR")]
    pub kv: Option<std::net::SocketAddr>,
    /// File whose first line is the token every KV client must send
    /// (`authorization: Bearer TOKEN`; `tessera kv --token-file`). It
    /// travels in clear text unless --kv-tls-cert is given.
    #[arg(long, value_name = "FILE", requires = "kv")]
    pub kv_token_file: Option<PathBuf>,
    /// PEM certificate (chain) for serving KV spaces over TLS only
    /// (`grpc+tls://`; `tessera kv --tls-ca`).
    #[arg(long, value_name = "FILE", requires = "kv", requires = "kv_tls_key")]
    pub kv_tls_cert: Option<PathBuf>,
    /// PEM private key of --kv-tls-cert.
    #[arg(long, value_name = "FILE", requires = "kv_tls_cert")]
    pub kv_tls_key: Option<PathBuf>,
    /// Bytes of records a KV space's sort holds in memory at once.
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_usize, default_value = "256M")]
    pub kv_sort_memory: usize,
    /// Bytes a second a KV space's sort writes at most while clients make
    /// requests (0: it never yields to them).
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_usize, default_value = "64M")]
    pub kv_sort_busy_rate: usize,
    /// Bytes of KV table batches kept in memory for the queries that read
    /// them again, all spaces together (0: none kept).
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_usize, default_value = "256M")]
    pub kv_cache: usize,
    /// Open even if no log device of the array can be read, giving up
    /// the FLUSHed writes that only they held (without it, refused).
    #[arg(long)]
    pub discard_missing_log: bool,
    /// Open even if the members' activity records show the array open
    /// elsewhere (another host that died with it open: only once that
    /// host is known to be down; two writers corrupt the array)
    #[arg(long = "force")]
    pub ignore_activity: bool,
    /// Put garbage collection's copies into the client stripes open at
    /// the time (GC's own stripes only where none is) instead of
    /// stripes of their own: for measuring what the separation saves
    /// (scripts/bench-waf.sh).
    #[arg(long)]
    pub no_gc_stream: bool,
    /// Leave stale members (present but out of date: away while the
    /// array went on, or failed for errors) out instead of resyncing
    /// them at start; `tessera online` resyncs one when asked.
    #[arg(long)]
    pub no_auto_resync: bool,
    /// Leave stripes with a chunk on a member that is out where they
    /// are, instead of healing them onto the healthy members in the
    /// background (arrays with more members than a stripe is wide).
    #[arg(long)]
    pub no_auto_heal: bool,
}

impl Serve {
    /// The NBD server's bounds.
    fn limits(&self) -> tessera_nbd::Limits {
        let defaults = tessera_nbd::Limits::default();
        tessera_nbd::Limits {
            max_connections: self.max_connections,
            total_bytes: self.max_bytes_in_flight,
            workers: self.workers.unwrap_or(defaults.workers),
            idle_timeout: (self.idle_timeout > 0).then(|| std::time::Duration::from_secs(self.idle_timeout)),
            ..defaults
        }
    }

    /// The TLS the NBD server offers; `None` for plaintext.
    fn nbd_tls(&self) -> Result<Option<tessera_nbd::Tls>> {
        let credentials = self.tls_certificates.is_some() || self.tls_psk.is_some();
        let mode = self
            .tls
            .unwrap_or(if credentials { TlsMode::Require } else { TlsMode::Off });
        let required = match mode {
            TlsMode::Off if credentials => {
                bail!("--tls off with --tls-certificates or --tls-psk: drop one or the other")
            }
            TlsMode::Off => return Ok(None),
            _ if !credentials => bail!("--tls on or require needs --tls-certificates DIR or --tls-psk FILE"),
            TlsMode::On => false,
            TlsMode::Require => true,
        };
        Ok(Some(match (&self.tls_certificates, &self.tls_psk) {
            (Some(dir), _) => tessera_nbd::Tls::x509(dir, self.tls_verify_peer, required)?,
            (None, Some(file)) => tessera_nbd::Tls::psk(file, required)?,
            (None, None) => unreachable!("credentials were checked above"),
        }))
    }

    /// How HTTP is served, if it is.
    fn http_options(&self) -> Result<Option<http::Options>> {
        self.http
            .clone()
            .map(|address| {
                http::Options::from_flags(
                    address,
                    self.http_tls_cert.as_deref(),
                    self.http_tls_key.as_deref(),
                    self.http_token_file.as_deref(),
                )
            })
            .transpose()
    }
}

/// How often the server appends the array's new events to its history.
const HISTORY_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// `--tls`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TlsMode {
    Off,
    On,
    Require,
}

/// A file mode in octal, at most 0777.
fn parse_mode(text: &str) -> Result<u32, String> {
    u32::from_str_radix(text, 8)
        .ok()
        .filter(|&mode| mode <= 0o777)
        .ok_or_else(|| format!("'{text}' is not a file mode in octal (like 600 or 0660)"))
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
        return Ok(tessera_nbd::Listener::Unix(bind_unix(path, mode)?));
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

pub fn serve(s: Serve) -> Result<()> {
    // Taken first, before anything opened could be given its descriptor.
    let passed = tessera_nbd::Listener::from_systemd().context("taking the socket systemd passed")?;
    let (dir, listen, socket) = (s.dir.as_path(), s.listen.as_deref(), s.socket.as_deref());
    // Flags checked before anything is opened or bound.
    let (limits, tls, http) = (s.limits(), s.nbd_tls()?, s.http_options()?);
    let _lock = lock(dir)?;
    let engine = EngineOptions {
        accel: Some(tessera_accel::select(s.accel)?),
        reconstruct_cache_bytes: s.reconstruct_cache_bytes,
        map_cache_bytes: s.map_cache_bytes,
        member_errors_max: s.member_errors_max,
        discard_missing_log: s.discard_missing_log,
        ignore_activity: s.ignore_activity,
        gc_stream: !s.no_gc_stream,
        ..EngineOptions::default()
    };
    let stop = Arc::new(AtomicBool::new(false));
    // The control socket answers from the start: while the array opens,
    // that it is opening and for how long (not "in use by another
    // process").
    let control_path = dir.join(CONTROL_SOCKET);
    let control = bind_unix(&control_path, 0o600)?;
    let _control_file = RemoveOnDrop(control_path.clone());
    let ready: Arc<std::sync::OnceLock<Served>> = Arc::default();
    let since = Instant::now();
    {
        let (ready, stop) = (ready.clone(), stop.clone());
        std::thread::Builder::new()
            .name("control".to_string())
            .spawn(move || control::control_loop(control, ready, since, stop))?;
    }
    // So does HTTP: the dashboard shows the array opening.
    if let Some(options) = http {
        let bound = http::serve(options, ready.clone(), since)?;
        eprintln!("tessera: dashboard and API at {bound}");
    }
    // So is the KV spaces' address: one in use is said before the array
    // opens.
    let kv_token = s
        .kv_token_file
        .as_deref()
        .map(|path| http::read_token(path, "KV"))
        .transpose()?;
    if let Some(address) = s.kv {
        if !address.ip().is_loopback() && kv_token.is_none() {
            bail!(
                "serving KV spaces at {address}, beyond loopback, needs --kv-token-file: anyone who reaches it could read, write and drop them"
            );
        }
    }
    let kv_tls = match (&s.kv_tls_cert, &s.kv_tls_key) {
        (Some(certificate), Some(key)) => Some(
            tessera_kv::flight::FlightTls::from_pem_files(certificate, key)
                .map_err(|e| anyhow::anyhow!("--kv-tls-cert/--kv-tls-key: {e}"))?,
        ),
        _ => None,
    };
    let kv_listener =
        s.kv.map(|address| {
            tessera_kv::flight::FlightListener::bind(address)
                .with_context(|| format!("listening for KV spaces (--kv) on {address}"))
        })
        .transpose()?;
    let array = Arc::new(open_with(dir, engine)?);
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stop.clone())?;
    }
    // A rebuild a shutdown or crash stopped goes on now; else stale
    // members are resynced.
    let rebuilder = Arc::new(Rebuilder::new(dir, array.clone(), stop.clone(), !s.no_auto_resync));
    if let Err(e) = rebuilder.resume() {
        eprintln!("tessera: the unfinished rebuild cannot go on: {e:#}");
    }
    // Stripes left short by a member that is out are healed onto the
    // others, where there are more members than a stripe is wide.
    let stop_heal = Arc::new(AtomicBool::new(false));
    let healer = (!s.no_auto_heal)
        .then(|| {
            crate::heal::spawn_healer(
                array.clone(),
                stop.clone(),
                stop_heal.clone(),
                crate::replace::DEFAULT_BUSY_RATE,
            )
        })
        .transpose()?;
    let latency = Arc::new(dispatch::LatencyCounters::default());
    let metrics = s.metrics.is_some().then(|| Arc::new(Metrics::new()));
    let history = Arc::new(std::sync::Mutex::new(crate::history::History::new(dir)));
    // Set once the KV spaces are open (below), for the `kv_spaces` request.
    let kv_spaces: Arc<std::sync::OnceLock<Arc<tessera_kv::Store>>> = Arc::default();
    let _ = ready.set(Served {
        array: array.clone(),
        rebuilder: rebuilder.clone(),
        latency: latency.clone(),
        dir: dir.to_path_buf(),
        history: history.clone(),
        stop_scrub: Arc::default(),
        stop_heal,
        metrics: metrics.clone(),
        kv: kv_spaces.clone(),
    });
    // The history reaches the directory about once a second.
    {
        let (served, stop) = (ready.clone(), stop.clone());
        std::thread::Builder::new().name("history".to_string()).spawn(move || {
            let mut failed = false;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(HISTORY_INTERVAL);
                if let Some(served) = served.get() {
                    // Said once, not every second.
                    let saved = served.save_history();
                    if let (Err(e), false) = (&saved, failed) {
                        eprintln!("tessera: the history is not being kept: {e:#}");
                    }
                    failed = saved.is_err();
                }
            }
        })?;
    }
    let listener = listener(passed, listen, socket.map(|p| (p, s.socket_mode)), tls.is_some())?;
    let url = listener.uri("tessera", tls.is_some())?;
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
    if let (Some(address), Some(metrics)) = (&s.metrics, &metrics) {
        let bound = crate::metrics::serve(address, metrics.clone(), array.clone())?;
        eprintln!("tessera: metrics at http://{bound}/metrics");
    }
    // KV spaces: their logs recovered at opening, sorts under way go on.
    let kv = match kv_listener {
        Some(listener) => {
            let options = tessera_kv::StoreOptions {
                sort_memory: s.kv_sort_memory,
                background: true,
                busy_rate: Some(s.kv_sort_busy_rate as u64).filter(|&r| r > 0),
                cache_bytes: s.kv_cache,
            };
            let store = tessera_kv::Store::open(array.clone(), options).context("opening the KV spaces")?;
            for (name, why) in store.broken() {
                eprintln!("tessera: warning: KV space {name} is left out: {why}");
            }
            let address = listener.address;
            let scheme = if kv_tls.is_some() { "grpc+tls" } else { "grpc" };
            if !address.ip().is_loopback() && kv_tls.is_none() {
                eprintln!(
                    "tessera: warning: KV spaces served at {address} with a token but no TLS (--kv-tls-cert): the token and the records travel in clear text"
                );
            }
            let server = listener
                .serve(store.clone(), kv_token, kv_tls)
                .with_context(|| format!("serving KV spaces at {address}"))?;
            eprintln!("tessera: KV spaces (Arrow Flight) at {scheme}://{}", server.address);
            if let Some(metrics) = &metrics {
                metrics.set_kv(store.clone());
            }
            let _ = kv_spaces.set(store.clone());
            Some((store, server))
        }
        None => None,
    };
    let volumes = exports::Volumes {
        array: array.clone(),
        metrics,
        latency,
        dir: dir.display().to_string(),
    };
    let mut server = tessera_nbd::Server::with_catalog(Arc::new(volumes), limits);
    if let Some(tls) = tls {
        server = server.with_tls(tls);
    }
    let server = Arc::new(server);
    let result = tessera_nbd::run(server, listener, stop.clone());
    // The rebuild stops at its next stripe (it goes on at the next start).
    stop.store(true, Ordering::Relaxed);
    rebuilder.join();
    if let Some((store, mut server)) = kv {
        // A sort stopped here goes on at the next start.
        server.stop();
        store.stop();
    }
    if let Some(healer) = healer {
        let _ = healer.join();
    }
    eprintln!("tessera: shutting down: flushing and writing a map checkpoint");
    let closed = array.close();
    // The stop's events too (its clean stop).
    let appended = history.lock().unwrap_or_else(|p| p.into_inner()).append(&array);
    if let Err(e) = appended.and_then(|written| written.map_or(Ok(()), |w| w.sync())) {
        eprintln!("tessera: the history could not be kept: {e:#}");
    }
    closed?;
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
/// A Unix socket listening at `path` with `mode`, there only once it has
/// it: bound under a name beside it (`path` and a `~`), its mode set, then
/// renamed over `path`. Bound at `path` and then given its mode, it was
/// there for a moment with the umask's (a test that looked at once saw
/// 755 where 660 was asked for; with a umask of 0, anyone could have
/// connected).
fn bind_unix(path: &Path, mode: u32) -> Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let mut side = path.as_os_str().to_owned();
    side.push("~");
    let side = PathBuf::from(side);
    let _ = std::fs::remove_file(&side);
    let listener = UnixListener::bind(&side).with_context(|| format!("binding {}", path.display()))?;
    let placed = std::fs::set_permissions(&side, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {} to {mode:o}", path.display()))
        .and_then(|()| std::fs::rename(&side, path).with_context(|| format!("placing {}", path.display())));
    if placed.is_err() {
        let _ = std::fs::remove_file(&side);
    }
    placed.map(|()| listener)
}

/// Removes a file when dropped (the control socket, however `serve` ends).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
