//! `tessera serve` against real NBD clients: nbdinfo, nbdcopy, qemu-img,
//! qemu-io and fio, with members failed and removed while serving, a
//! restart, and a differential run against `nbdkit memory`.
use crate::common::*;

use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

fn wait_for(path: &Path) {
    for _ in 0..200 {
        if path.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("{} never appeared", path.display());
}

/// A server process, stopped with SIGTERM when dropped.
struct Served {
    child: Child,
    socket: PathBuf,
}

impl Served {
    fn start(dir: &Path, socket: &Path) -> Served {
        Served::start_with(dir, socket, &[])
    }

    /// `tessera serve DIR --socket SOCKET` with `extra` flags.
    fn start_with(dir: &Path, socket: &Path, extra: &[&str]) -> Served {
        Served::start_logging(dir, socket, extra, Stdio::null())
    }

    /// [`Served::start_with`], its log (stderr) going to `log`.
    fn start_logging(dir: &Path, socket: &Path, extra: &[&str], log: impl Into<Stdio>) -> Served {
        let _ = std::fs::remove_file(socket);
        let child = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["serve", dir.to_str().unwrap(), "--socket", socket.to_str().unwrap()])
            .args(extra)
            .stderr(log)
            .spawn()
            .unwrap();
        Served::started(child, dir, socket)
    }

    /// A server process just spawned, once it listens.
    fn started(child: Child, dir: &Path, socket: &Path) -> Served {
        wait_for(socket);
        wait_for(&dir.join("control.sock"));
        Served {
            child,
            socket: socket.to_path_buf(),
        }
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///tessera?socket={}", self.socket.display())
    }

    fn stop(mut self) {
        self.terminate();
    }

    fn terminate(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        for _ in 0..400 {
            if let Ok(Some(status)) = self.child.try_wait() {
                assert!(status.success(), "tessera serve exited with {status}");
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        let _ = self.child.kill();
        panic!("tessera serve did not stop on SIGTERM");
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `tessera create` of a 4+2 array on `devices` 40 MiB member files in `dir`.
fn try_create(dir: &Path, devices: &str, extra: &[&str]) -> Output {
    let dir = dir.to_str().unwrap();
    let mut args = vec![
        "create",
        "--data",
        "4",
        "--parity",
        "2",
        "--dir",
        dir,
        "--devices",
        devices,
        "--device-size",
        "40M",
    ];
    args.extend_from_slice(extra);
    tessera(&args)
}

/// `tessera status DIR --json`, parsed.
fn status_json(dir: &Path) -> serde_json::Value {
    let out = tessera(&["status", dir.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn create(dir: &Path, extra: &[&str]) {
    let out = try_create(dir, "6", extra);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A new array (as `create`) in a temporary directory, served on a Unix
/// socket there: (the directory, the array's, the server).
fn create_and_serve(extra: &[&str]) -> (tempfile::TempDir, PathBuf, Served) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("array");
    create(&dir, extra);
    let server = Served::start(&dir, &tmp.path().join("nbd.sock"));
    (tmp, dir, server)
}

fn fio(uri: &str, cwd: &Path, extra: &[&str]) -> String {
    let mut args = vec![
        "--name=job",
        "--ioengine=nbd",
        "--uri",
        uri,
        "--rw=randwrite",
        "--bs=16k",
        "--size=64M",
        "--iodepth=16",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--randseed=7",
    ];
    args.extend_from_slice(extra);
    run("fio", &args, cwd)
}

#[test]
fn real_clients_read_back_what_they_wrote() {
    let (tmp, dir, server) = create_and_serve(&["--compress", "lz4"]);
    let uri = server.uri();

    let info = run("nbdinfo", &["--json", &uri], tmp.path());
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    let export = &info["exports"][0];
    assert_eq!(export["export-name"], "tessera");
    assert_eq!(export["block_size_minimum"], 1);
    assert_eq!(export["block_size_preferred"], 4096);
    assert_eq!(export["can_multi_conn"], true);
    let size = export["export-size"].as_u64().unwrap();
    assert!(size >= 64 << 20);

    // nbdcopy round trip of a random (and partly compressible) image.
    let image = tmp.path().join("image.raw");
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut bytes = vec![0u8; 24 << 20];
    rng.fill(&mut bytes[..12 << 20]);
    for (i, b) in bytes[12 << 20..20 << 20].iter_mut().enumerate() {
        *b = (i / 300) as u8;
    }
    std::fs::write(&image, &bytes).unwrap();
    run("nbdcopy", &[image.to_str().unwrap(), &uri], tmp.path());
    let back = tmp.path().join("back.raw");
    run("nbdcopy", &[&uri, back.to_str().unwrap()], tmp.path());
    let back_bytes = std::fs::read(&back).unwrap();
    assert_eq!(back_bytes.len() as u64, size);
    assert!(
        back_bytes[..bytes.len()] == bytes[..],
        "nbdcopy read back different bytes"
    );

    // qemu-img convert, then compare through the NBD export.
    run(
        "qemu-img",
        &["convert", "-n", "-f", "raw", "-O", "raw", image.to_str().unwrap(), &uri],
        tmp.path(),
    );
    let compared = run(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", image.to_str().unwrap(), &uri],
        tmp.path(),
    );
    assert!(compared.contains("identical"), "{compared}");

    // qemu-io: patterns, zeroes, discard, unaligned I/O, FUA.
    let io = run(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0xab 1M 64k",
            "-c",
            "read -P 0xab 1M 64k",
            "-c",
            "write -z 1M 32k",
            "-c",
            "read -P 0 1M 32k",
            "-c",
            "read -P 0xab 1056k 32k",
            "-c",
            "write -P 0x11 4097 1000",
            "-c",
            "read -P 0x11 4097 1000",
            "-c",
            "write -f -P 0x22 8M 4k",
            "-c",
            "discard 8M 4k",
            "-c",
            "read -P 0 8M 4k",
            &uri,
        ],
        tmp.path(),
    );
    assert!(!io.contains("Pattern verification failed"), "{io}");

    let status = status_json(&dir);
    assert!(status["compression_ratio"].as_f64().unwrap() > 1.2, "{status}");

    // fio write then verify.
    let out = fio(&uri, tmp.path(), &["--do_verify=1"]);
    assert!(out.contains("err= 0"), "{out}");
    let status = status_json(&dir);
    assert_eq!(status["unrecoverable_reads"], 0);
    server.stop();
}

#[test]
fn fio_verify_passes_with_m_members_failed_and_after_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("array");
    create(&dir, &[]);
    let socket = tmp.path().join("nbd.sock");
    let server = Served::start(&dir, &socket);
    let uri = server.uri();
    fio(&uri, tmp.path(), &["--do_verify=0", "--verify_state_save=1"]);
    // One member failed by command, another's file deleted while serving.
    let out = tessera(&["fail", dir.to_str().unwrap(), "--device", "1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::remove_file(dir.join("member-004")).unwrap();
    let out = fio(&uri, tmp.path(), &["--verify_only", "--verify_state_load=1"]);
    assert!(out.contains("err= 0") && out.contains("READ:"), "{out}");
    // A member that does not exist is refused by name.
    let out = tessera(&["fail", dir.to_str().unwrap(), "--device", "9"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no member 9"));
    server.stop();

    // Restarted with one member failed and one missing: the same data.
    let server = Served::start(&dir, &socket);
    let out = fio(&server.uri(), tmp.path(), &["--verify_only", "--verify_state_load=1"]);
    assert!(out.contains("err= 0") && out.contains("READ:"), "{out}");
    let status = status_json(&dir);
    assert_eq!(status["members_unavailable"], 2);
    assert!(status["reconstructed_reads"].as_u64().unwrap() > 0);
    assert_eq!(status["unrecoverable_reads"], 0);
    server.stop();
}

#[test]
fn the_same_operations_read_back_the_same_as_nbdkit_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("array");
    let size: u64 = 32 << 20;
    create(&dir, &["--size", "32M", "--compress", "zstd:1"]);
    let server = Served::start(&dir, &tmp.path().join("nbd.sock"));
    let reference_socket = tmp.path().join("memory.sock");
    let mut reference = Command::new("nbdkit")
        .args([
            "--foreground",
            "--unix",
            reference_socket.to_str().unwrap(),
            "memory",
            &format!("size={size}"),
        ])
        .stderr(Stdio::null())
        .spawn()
        .expect("nbdkit must be installed (scripts/install-test-deps.sh)");
    wait_for(&reference_socket);
    let reference_uri = format!("nbd+unix:///?socket={}", reference_socket.display());

    // A random sequence of writes, zeroes and discards, some unaligned.
    let seed: u64 = rand::random();
    eprintln!("differential seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut commands = Vec::new();
    for _ in 0..300 {
        let aligned = rng.gen_bool(0.8);
        let len: u64 = if aligned {
            rng.gen_range(1..64) * 4096
        } else {
            rng.gen_range(1..70_000)
        };
        let offset = if aligned {
            rng.gen_range(0..(size - len) / 4096) * 4096
        } else {
            rng.gen_range(0..size - len)
        };
        commands.push(match rng.gen_range(0..6) {
            0 => format!("write -z {offset} {len}"),
            1 => format!("discard {offset} {len}"),
            2 => format!("write -f -P {} {offset} {len}", rng.gen_range(0..256)),
            _ => format!("write -P {} {offset} {len}", rng.gen_range(0..256)),
        });
    }
    for uri in [server.uri(), reference_uri.clone()] {
        let mut args = vec!["-f".to_string(), "raw".to_string()];
        for c in &commands {
            args.push("-c".to_string());
            args.push(c.clone());
        }
        args.push(uri);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run("qemu-io", &args, tmp.path());
    }
    let ours = tmp.path().join("ours.raw");
    let theirs = tmp.path().join("theirs.raw");
    run("nbdcopy", &[&server.uri(), ours.to_str().unwrap()], tmp.path());
    run("nbdcopy", &[&reference_uri, theirs.to_str().unwrap()], tmp.path());
    let (a, b) = (std::fs::read(&ours).unwrap(), std::fs::read(&theirs).unwrap());
    assert_eq!(a.len(), b.len());
    let first = a.iter().zip(&b).position(|(x, y)| x != y);
    assert_eq!(first, None, "seed {seed}: first differing byte");
    let _ = reference.kill();
    let _ = reference.wait();
    server.stop();
}

#[test]
fn create_refuses_bad_shapes_and_open_leaves_out_foreign_members() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a");
    let out = try_create(&dir, "5", &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("K+M <= N"));
    assert!(
        !dir.join("member-000").exists(),
        "a refused create leaves no member behind"
    );
    create(&dir, &[]);
    // The same directory twice is refused, and changes nothing.
    let before = std::fs::read(dir.join("member-000")).unwrap();
    let out = try_create(&dir, "6", &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already holds an array"));
    assert!(std::fs::read(dir.join("member-000")).unwrap() == before);
    // A member of another array in this one's list: left out (and said
    // so); the array opens degraded.
    let other = tmp.path().join("b");
    create(&other, &[]);
    std::fs::copy(other.join("member-002"), dir.join("member-002")).unwrap();
    let out = tessera(&["status", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("left out: ") && text.contains("member-002 belongs to another array"),
        "{text}"
    );
    assert_eq!(status_json(&dir)["members"][2]["state"], "failed");
}

/// `--preallocate` writes every byte of the member files create makes
/// (`--devices`, or `--device` paths that did not exist), before the
/// superblocks: the array opens, and no block is left for a later
/// write to allocate; without it the files are sparse.
#[test]
fn preallocate_writes_every_byte_of_the_member_files_create_makes() {
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().unwrap();
    let allocated = |path: &Path| {
        let meta = std::fs::metadata(path).unwrap();
        (meta.blocks() * 512, meta.len())
    };
    let sparse = tmp.path().join("sparse");
    create(&sparse, &[]);
    let (blocks, len) = allocated(&sparse.join("member-000"));
    assert!(
        blocks < len / 2,
        "a member without --preallocate: {blocks} of {len} bytes allocated"
    );
    let written = tmp.path().join("written");
    create(&written, &["--preallocate"]);
    for i in 0..6 {
        let (blocks, len) = allocated(&written.join(format!("member-{i:03}")));
        assert!(
            blocks >= len,
            "member {i} with --preallocate: {blocks} of {len} bytes allocated"
        );
    }
    assert_eq!(status_json(&written)["members"].as_array().unwrap().len(), 6);
    let named = tmp.path().join("named");
    let paths: Vec<String> = (0..6)
        .map(|i| tmp.path().join(format!("d{i}")).display().to_string())
        .collect();
    let on_devices = |dir: &Path, devices: &[String], extra: &[&str]| {
        let mut args = ["create", "--data", "4", "--parity", "2", "--dir"].to_vec();
        args.push(dir.to_str().unwrap());
        for path in devices {
            args.extend(["--device", path.as_str()]);
        }
        args.extend_from_slice(extra);
        tessera(&args)
    };
    let out = on_devices(&named, &paths, &["--device-size", "40M", "--preallocate"]);
    succeeded("create --device ... --preallocate", out);
    for path in &paths {
        let (blocks, len) = allocated(Path::new(path));
        assert!(
            blocks >= len,
            "{path} with --preallocate: {blocks} of {len} bytes allocated"
        );
    }
    assert_eq!(status_json(&named)["members"].as_array().unwrap().len(), 6);
    // Members that all exist already: refused, not quietly left sparse.
    let given: Vec<String> = (0..6)
        .map(|i| tmp.path().join(format!("e{i}")).display().to_string())
        .collect();
    for path in &given {
        std::fs::File::create(path).unwrap().set_len(40 << 20).unwrap();
    }
    let refused = tmp.path().join("refused");
    let out = on_devices(&refused, &given, &["--preallocate"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("--preallocate writes the member files create makes"),
        "{stderr}"
    );
    assert!(!refused.exists(), "a refused create leaves no directory behind");
}

/// Sizes NBD clients would read as negative, a mistyped directory, a list
/// of devices none of which is a member, and output that cannot be
/// written: each is a clear error that leaves nothing behind.
#[test]
fn bad_sizes_directories_and_output_are_clear_errors_that_leave_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a");
    for size in ["4503599627374592", "9223372036854775808", "18446744073709547520"] {
        let out = try_create(&dir, "6", &["--size", size]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("at most 4503599627370496 bytes"),
            "{stderr}"
        );
        assert!(!dir.exists(), "a refused create leaves no directory behind");
    }
    // The largest size is taken (thin: far more than the members hold).
    let out = try_create(&dir, "6", &["--size", "4503599627370496"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(status_json(&dir)["logical_bytes"], 4503599627370496u64);
    // Not an array: refused before anything is made there.
    let plain = tmp.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    for command in ["serve", "status", "scrub"] {
        let out = tessera(&[command, plain.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("is not a Tessera array"),
            "{command}: {stderr}"
        );
    }
    assert_eq!(
        std::fs::read_dir(&plain).unwrap().count(),
        0,
        "files left in a directory that is not an array"
    );
    // A member list naming only devices that hold no array.
    std::fs::write(plain.join("members"), "zero-0\nzero-1\n").unwrap();
    for name in ["zero-0", "zero-1"] {
        std::fs::write(plain.join(name), vec![0u8; 4 << 20]).unwrap();
    }
    let out = tessera(&["status", plain.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("none of the 2 devices listed holds a superblock of a Tessera array"),
        "{stderr}"
    );
    // A device with nothing in its first MiB but data where the log area
    // and backup superblock go (measured from the smallest member): refused,
    // and left as it was.
    let devices: Vec<PathBuf> = (0..3).map(|i| tmp.path().join(format!("d{i}"))).collect();
    for (i, path) in devices.iter().enumerate() {
        let size = if i == 1 { 64 << 20 } else { 48 << 20 };
        let mut bytes = vec![0u8; size];
        if i == 1 {
            rand::rngs::StdRng::seed_from_u64(3).fill(&mut bytes[1 << 20..]);
        }
        std::fs::write(path, &bytes).unwrap();
    }
    let before = std::fs::read(&devices[1]).unwrap();
    let with = tmp.path().join("with-devices");
    let mut args = vec![
        "create",
        "--data",
        "2",
        "--parity",
        "1",
        "--dir",
        with.to_str().unwrap(),
    ];
    for path in &devices {
        args.extend(["--device", path.to_str().unwrap()]);
    }
    let out = tessera(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("holds data at byte"),
        "{stderr}"
    );
    assert!(
        std::fs::read(&devices[1]).unwrap() == before,
        "a refused create wrote to a device"
    );
    // Output that cannot be written: an error, not a panic.
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["status", dir.to_str().unwrap()])
        .stdout(full)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot write the output") && !stderr.contains("panicked"),
        "{stderr}"
    );
}

/// A tmpfs of `size` mounted at `at` (unmounted when dropped), or `None`
/// where this machine does not let the tests mount one.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(at).unwrap();
        let option = format!("size={size}");
        succeeds("mount", &["-t", "tmpfs", "-o", &option, "tmpfs", at.to_str().unwrap()])
            .then(|| Tmpfs(at.to_path_buf()))
    }

    fn resize(&self, size: &str) {
        let option = format!("remount,size={size}");
        assert!(succeeds("mount", &["-o", &option, self.0.to_str().unwrap()]));
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A server process killed if the test ends without stopping it.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Stops a server with SIGTERM and waits for it, whatever its exit code.
fn terminate_and_wait(mut server: Server) {
    let _ = Command::new("kill")
        .args(["-TERM", &server.0.id().to_string()])
        .status();
    for _ in 0..400 {
        if let Ok(Some(_)) = server.0.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("tessera serve did not stop on SIGTERM");
}

/// Issue 31, item 1, end to end: with members 0 and 1 failed, member 5's
/// filesystem fills up; what was written and FLUSHed before that reads
/// back on the server, after a restart with member 5 still full (the
/// intent log's replay cannot reach K members: served from memory, writes
/// refused, said so), and after the filesystem grows.
#[test]
fn flushed_writes_read_back_when_a_member_fills_past_the_parity() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(small) = Tmpfs::mount(&tmp.path().join("small"), "24M") else {
        eprintln!("skipped: this machine does not let the tests mount a tmpfs");
        return;
    };
    let dir = tmp.path().join("array");
    let mut args: Vec<String> = ["create", "--data", "4", "--parity", "2", "--dir"]
        .map(String::from)
        .to_vec();
    args.push(dir.to_str().unwrap().to_string());
    args.extend(["--device-size".to_string(), "48M".to_string()]);
    for i in 0..6 {
        let path = if i == 5 {
            small.0.join("m5")
        } else {
            tmp.path().join(format!("m{i}"))
        };
        args.extend(["--device".to_string(), path.to_str().unwrap().to_string()]);
    }
    let out = tessera(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let socket = tmp.path().join("nbd.sock");
    let serve = |log: &str| {
        let _ = std::fs::remove_file(&socket);
        let child = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["serve", dir.to_str().unwrap(), "--socket", socket.to_str().unwrap()])
            .stderr(std::fs::File::create(tmp.path().join(log)).unwrap())
            .spawn()
            .unwrap();
        let server = Server(child);
        wait_for(&socket);
        wait_for(&dir.join("control.sock"));
        server
    };
    let server = serve("serve-1.log");
    for member in ["0", "1"] {
        let out = tessera(&["fail", dir.to_str().unwrap(), "--device", member]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let uri = format!("nbd+unix:///tessera?socket={}", socket.display());
    // 516 KiB and a FLUSH at a time, each its own pattern, until a
    // FLUSH fails (member 5 is full; bounded by the export's size). Not a
    // whole number of stripes: each FLUSH leaves a stripe partly filled,
    // which goes to the intent log (a few KiB: logging is cheaper than
    // sealing it).
    let size = status_json(&dir)["logical_bytes"].as_u64().unwrap();
    let mut commands = Vec::new();
    const PIECE: u64 = 516 << 10;
    for i in 0..size / PIECE {
        commands.push(format!("write -P {} {} 516k", i % 250 + 1, i * PIECE));
        commands.push("flush".to_string());
    }
    let mut args = vec!["-f", "raw", &uri[..]];
    for c in &commands {
        args.extend(["-c", c.as_str()]);
    }
    let out = Command::new("qemu-io").args(&args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    // Acknowledged: each MiB whose write and the FLUSH after it succeeded,
    // before the first failure.
    let first_failure = text
        .lines()
        .position(|l| l.contains("failed"))
        .expect("member 5 never filled up");
    let acknowledged = text
        .lines()
        .take(first_failure)
        .filter(|l| l.starts_with("wrote "))
        .count() as u64;
    let acknowledged = acknowledged.saturating_sub(1);
    assert!(acknowledged > 8, "{text}");
    let reads: Vec<String> = (0..acknowledged)
        .map(|i| format!("read -P {} {} 516k", i % 250 + 1, i * PIECE))
        .collect();
    let reads_back = |when: &str| {
        let mut args = vec!["-f", "raw", &uri[..]];
        for c in &reads {
            args.extend(["-c", c.as_str()]);
        }
        let out = Command::new("qemu-io").args(&args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        let good = text.lines().filter(|l| l.starts_with("read ")).count() as u64;
        assert_eq!(
            good, acknowledged,
            "{when}: of {acknowledged} acknowledged writes, {good} read back:\n{text}"
        );
    };
    reads_back("on the server that saw member 5 fill up");
    terminate_and_wait(server);
    let server = serve("serve-2.log");
    reads_back("after a restart with member 5 still full");
    let log = std::fs::read_to_string(tmp.path().join("serve-2.log")).unwrap();
    assert!(log.contains("WRITES REFUSED"), "{log}");
    terminate_and_wait(server);
    small.resize("64M");
    let server = serve("serve-3.log");
    reads_back("after member 5's filesystem grew");
    terminate_and_wait(server);
}

/// A member file read and written with no lock at all: how a second host
/// reaches a shared disk.
struct Unlocked(std::fs::File, u64);

impl tessera_array::device::Device for Unlocked {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.0, buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&self.0, buf, offset)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.0.sync_data()
    }
    fn size(&self) -> u64 {
        self.1
    }
}

/// Issue 31, item 2: a served array's members reached by another name (a
/// hard link, a loop device over each file) are refused, and an opener
/// that no lock can stop (another host, here this test process reading
/// the files unlocked) is refused by the members' activity records; once
/// the server stops, the same opener goes ahead at once.
#[test]
fn members_reached_by_another_name_or_from_another_host_are_refused() {
    let (tmp, dir, server) = create_and_serve(&[]);
    let files: Vec<PathBuf> = (0..6).map(|i| dir.join(format!("member-{i:03}"))).collect();
    // Hard links: the same inode, so the same lock.
    let linked = tmp.path().join("linked");
    std::fs::create_dir(&linked).unwrap();
    for (i, file) in files.iter().enumerate() {
        std::fs::hard_link(file, linked.join(format!("link-{i}"))).unwrap();
    }
    std::fs::write(
        linked.join("members"),
        (0..6).map(|i| format!("link-{i}\n")).collect::<String>(),
    )
    .unwrap();
    let out = tessera(&["status", linked.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("in use"), "{stderr}");
    // Loop devices over the member files, where this machine has them.
    let loops: Vec<String> = files
        .iter()
        .map_while(|f| {
            let out = Command::new("losetup")
                .args(["-f", "--show", f.to_str().unwrap()])
                .output()
                .ok()?;
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        })
        .collect();
    if loops.len() == files.len() {
        let looped = tmp.path().join("looped");
        std::fs::create_dir(&looped).unwrap();
        std::fs::write(looped.join("members"), loops.join("\n") + "\n").unwrap();
        let out = tessera(&[
            "serve",
            looped.to_str().unwrap(),
            "--socket",
            tmp.path().join("b.sock").to_str().unwrap(),
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let refused = !out.status.success() && stderr.contains("backing file") && stderr.contains("in use");
        for device in &loops {
            let _ = Command::new("losetup").args(["-d", device]).status();
        }
        assert!(refused, "{stderr}");
    } else {
        for device in &loops {
            let _ = Command::new("losetup").args(["-d", device]).status();
        }
        eprintln!("loop devices skipped: losetup does not work here");
    }
    // No lock in the way: the activity records, which the server keeps
    // moving, refuse the opening after watching them.
    let unlocked = || -> Vec<(String, Option<Arc<dyn tessera_array::device::Device>>)> {
        files
            .iter()
            .map(|f| {
                let file = std::fs::OpenOptions::new().read(true).write(true).open(f).unwrap();
                let size = file.metadata().unwrap().len();
                let device: Arc<dyn tessera_array::device::Device> = Arc::new(Unlocked(file, size));
                (f.display().to_string(), Some(device))
            })
            .collect()
    };
    let started = std::time::Instant::now();
    match tessera_array::open(unlocked()) {
        Err(tessera_array::ArrayError::ActiveElsewhere { why, .. }) => {
            assert_eq!(why, tessera_array::Opener::ThisHost)
        }
        other => panic!("opened beside a live server: {:?}", other.err()),
    }
    assert!(started.elapsed() >= tessera_array::activity::ACTIVITY_WATCH);
    server.stop();
    let started = std::time::Instant::now();
    let array = tessera_array::open(unlocked()).unwrap();
    assert!(
        started.elapsed() < tessera_array::activity::ACTIVITY_WATCH,
        "{:?}",
        started.elapsed()
    );
    drop(array);
}

/// Issue 31, item 4: clients that connect and never handshake hold no
/// slot a good client needs (the oldest of them gives way), and the log
/// says so at most about once a second however many there are.
#[test]
fn silent_nbd_connections_keep_no_client_out_and_flood_no_log() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("array");
    create(&dir, &[]);
    let socket = tmp.path().join("nbd.sock");
    let log = tmp.path().join("serve.log");
    let server = Served::start_logging(
        &dir,
        &socket,
        &["--max-connections", "4"],
        std::fs::File::create(&log).unwrap(),
    );
    let uri = server.uri();
    // 200 connections that say nothing, held open.
    let silent: Vec<_> = (0..200)
        .map(|_| std::os::unix::net::UnixStream::connect(&socket).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    for round in 0..3 {
        let started = std::time::Instant::now();
        let out = run("nbdinfo", &["--size", &uri], tmp.path());
        assert!(out.trim().parse::<u64>().is_ok(), "{out}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "round {round}: nbdinfo waited {:?} behind silent connections",
            started.elapsed()
        );
    }
    drop(silent);
    server.stop();
    let text = std::fs::read_to_string(&log).unwrap();
    let lines = text
        .lines()
        .filter(|l| l.contains("closed") && l.contains("connection(s)"))
        .count();
    assert!(lines <= 8, "{lines} lines about closed connections:\n{text}");
}

/// Runs qemu-io's `commands` against `server` and kills the server with
/// SIGKILL once `kill_after` writes are answered; returns the offsets of
/// the writes qemu-io saw answered, in order.
fn qemu_io_killing(server: Served, commands: &[String], kill_after: usize) -> Vec<u64> {
    let mut args = vec!["-f".to_string(), "raw".to_string()];
    for command in commands {
        args.extend(["-c".to_string(), command.clone()]);
    }
    args.push(server.uri());
    let mut writer = Command::new("qemu-io")
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("qemu-io must be installed");
    let mut answered = Vec::new();
    let pid = server.child.id().to_string();
    let stdout = std::io::BufReader::new(writer.stdout.take().unwrap());
    for line in std::io::BufRead::lines(stdout) {
        let Ok(line) = line else { break };
        // "wrote 65536/65536 bytes at offset 1234"
        if let Some((_, offset)) = line
            .strip_prefix("wrote ")
            .and_then(|l| l.split_once(" bytes at offset "))
        {
            answered.push(offset.trim().parse().unwrap());
            if answered.len() == kill_after {
                assert!(Command::new("kill").args(["-9", &pid]).status().unwrap().success());
            }
        }
    }
    let _ = writer.wait();
    drop(server);
    answered
}

#[test]
fn kill_9_loses_no_acknowledged_fua_write() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("array");
    create(&dir, &[]);
    let socket = tmp.path().join("nbd.sock");
    let server = Served::start(&dir, &socket);
    // FUA writes of distinct patterns to distinct places, killed midway.
    let (writes, commands) = fua_writes(400, 65536, "64k");
    // Killed once 50 writes are acknowledged, whatever the speed.
    let acknowledged = qemu_io_killing(server, &commands, 50);
    eprintln!(
        "{} of {} FUA writes acknowledged before kill -9",
        acknowledged.len(),
        writes.len()
    );
    assert!(acknowledged.len() >= 50, "qemu-io stopped before the kill");
    read_back_after_restart(&dir, &socket, &writes, &acknowledged, "64k").stop();
}

/// `count` qemu-io FUA writes of `len`, `stride` bytes apart, each of its
/// own pattern: ((offset, pattern), the commands).
fn fua_writes(count: u64, stride: u64, len: &str) -> (Vec<(u64, u32)>, Vec<String>) {
    let writes: Vec<(u64, u32)> = (0..count).map(|i| (i * stride, (i % 250 + 1) as u32)).collect();
    let commands = writes
        .iter()
        .map(|(offset, pattern)| format!("write -f -P {pattern} {offset} {len}"))
        .collect();
    (writes, commands)
}

/// Restarts the server of the array in `dir` and reads back each of
/// `writes` (offset, pattern) of `len` that was `acknowledged`; returns
/// the server.
fn read_back_after_restart(
    dir: &Path,
    socket: &Path,
    writes: &[(u64, u32)],
    acknowledged: &[u64],
    len: &str,
) -> Served {
    let server = Served::start(dir, socket);
    let acknowledged = writes.iter().filter(|(o, _)| acknowledged.contains(o));
    read_patterns(&server, dir, acknowledged.copied(), len);
    server
}

/// Reads each (offset, pattern) of `reads`, `len` bytes, through qemu-io
/// from `server`: a block that does not hold its pattern fails the test
/// (qemu-io exits non-zero, which `run` refuses, naming the offset).
fn read_patterns(server: &Served, cwd: &Path, reads: impl Iterator<Item = (u64, u32)>, len: &str) {
    let mut args = vec!["-f".to_string(), "raw".to_string()];
    for (offset, pattern) in reads {
        args.extend(["-c".to_string(), format!("read -P {pattern} {offset} {len}")]);
    }
    args.push(server.uri());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run("qemu-io", &args, cwd);
}

/// Issue 25: a map many times its cache, through a real client, killed
/// five times. Each round qemu-io sends batches of eight 4 KiB writes,
/// each flushed, over a thin 64 GiB export (a block in a map page of its
/// own, new blocks and blocks of earlier rounds), under `--map-cache 16K`
/// so that pages are evicted, read back, written by checkpoints and
/// replayed all the time; the server is killed mid-round. Every block of
/// a flushed batch, of this round or an earlier one, reads back as
/// written; one written after the last flush is left out from then on.
#[test]
fn kill_9_with_the_map_far_larger_than_its_cache_loses_no_flushed_write() {
    const BATCH_WRITES: usize = 8;
    const BATCHES: usize = 64;
    const SMALL_CACHE: [&str; 2] = ["--map-cache", "16K"];
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("array");
    create(&dir, &["--size", "64G"]);
    let socket = tmp.path().join("nbd.sock");
    let mut rng = rand::rngs::StdRng::seed_from_u64(25);
    let pages = (64u64 << 30) / (2 << 20);
    // Block offset -> the pattern it holds for certain.
    let mut held: std::collections::BTreeMap<u64, u32> = std::collections::BTreeMap::new();
    for round in 0..5u32 {
        let server = Served::start_with(&dir, &socket, &SMALL_CACHE);
        let mut writes = Vec::new();
        let mut commands = Vec::new();
        for batch in 0..BATCHES {
            let pattern = (round as usize * BATCHES + batch) % 250 + 1;
            for _ in 0..BATCH_WRITES {
                // A third overwrite blocks of earlier rounds.
                let offset = match held.keys().nth(rng.gen_range(0..held.len().max(1))) {
                    Some(&old) if rng.gen_range(0..3) == 0 => old,
                    _ => rng.gen_range(0..pages) * (2 << 20) + rng.gen_range(0..512u64) * 4096,
                };
                writes.push((offset, pattern as u32));
                commands.push(format!("aio_write -P {pattern} {offset} 4k"));
            }
            commands.extend(["aio_flush", "flush"].map(String::from));
        }
        // Killed in the second half of the round, whatever the speed.
        let kill_after = BATCHES * BATCH_WRITES / 2 + rng.gen_range(0..BATCHES * BATCH_WRITES / 3);
        let answered = qemu_io_killing(server, &commands, kill_after).len();
        assert!(
            (kill_after..BATCHES * BATCH_WRITES).contains(&answered),
            "round {round}: {answered} writes answered; the kill came after {kill_after}"
        );
        // As in `kill_9_during_queued_writes...`: once a write of batch b
        // is answered, the flush of batch b-1 was.
        let flushed = (answered / BATCH_WRITES - 1) * BATCH_WRITES;
        for (i, &(offset, pattern)) in writes.iter().enumerate() {
            match i < flushed {
                true => held.insert(offset, pattern),
                false => held.remove(&offset),
            };
        }
        let server = Served::start_with(&dir, &socket, &SMALL_CACHE);
        read_patterns(&server, &dir, held.iter().map(|(&o, &p)| (o, p)), "4k");
        let status = status_json(&dir);
        let evicted = status["map_pages_evicted"].as_u64().unwrap();
        assert!(evicted > 0, "round {round}: the cache evicted nothing: {status}");
        eprintln!(
            "round {round}: {answered} writes answered before kill -9, {} blocks read back, {evicted} map pages evicted",
            held.len()
        );
        server.stop();
    }
}

/// Issue 25, item 5: volumes deleted, created, shrunk and grown again
/// through `tessera volume` while others are written through libnbd, the
/// server killed four times (`scripts/kill9-volumes.py`, which checks
/// each volume and block after each kill: an operation that returned
/// holds, one cut short left the volume before or after it, every
/// FLUSHed block reads back whole), with the map cache at 32 KiB.
#[test]
fn kill_9_while_volumes_come_and_go_loses_no_finished_operation_nor_flushed_write() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("array");
    create(&dir, &["--size", "1G"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/kill9-volumes.py");
    // Debian's python3, which has python3-libnbd (scripts/install-test-deps.sh).
    let out = Command::new("/usr/bin/python3")
        .arg(&script)
        .args([env!("CARGO_BIN_EXE_tessera"), tmp.path().to_str().unwrap(), "4", "25"])
        .args(["--map-cache", "32K"])
        .env("ROUND_S", "2")
        .output()
        .expect("python3 must be installed (scripts/install-test-deps.sh)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success() && stdout.ends_with("ok\n"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The threads did cut volumes short and come back (the counts the
    // script prints after each round).
    let last = stdout.lines().rev().nth(1).unwrap_or_default();
    assert!(last.contains("'recycle'") && last.contains("'shrink'"), "{last}");
}

/// The intent log on a log device (issue 14): small FUA writes, kill -9
/// midway; each acknowledged write reads back after restart (from the
/// log device). Without the log device the server refuses to start, by
/// name, unless told to discard it.
#[test]
fn kill_9_with_a_log_device_loses_no_fua_write_and_a_missing_one_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("array");
    let log = tmp.path().join("slog");
    create(&dir, &["--log-device", log.to_str().unwrap(), "--log-size", "4M"]);
    let status = status_json(&dir);
    assert_eq!(status["log"]["on"], "devices", "{status}");
    let socket = tmp.path().join("nbd.sock");
    let server = Served::start(&dir, &socket);
    let (writes, commands) = fua_writes(300, 20480, "4k");
    let acknowledged = qemu_io_killing(server, &commands, 40);
    assert!(acknowledged.len() >= 40, "qemu-io stopped before the kill");
    let server = read_back_after_restart(&dir, &socket, &writes, &acknowledged, "4k");
    let status = status_json(&dir);
    assert!(
        status["recovery"]["log"]["records_replayed"].as_u64().unwrap() > 0,
        "the restart replayed the log device: {status}"
    );
    server.stop();
    // The log device gone: refused, naming it; then discarded on request.
    std::fs::rename(&log, tmp.path().join("slog.away")).unwrap();
    let out = tessera(&["serve", dir.to_str().unwrap(), "--socket", socket.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("no log device"), "{stderr}");
    assert!(stderr.contains("slog"), "{stderr}");
    let server = Served::start_with(&dir, &socket, &["--discard-missing-log"]);
    let status = status_json(&dir);
    assert_eq!(status["log"]["devices"][0]["state"], "missing", "{status}");
    server.stop();
}

#[test]
fn kill_9_during_queued_writes_keeps_every_flushed_batch_and_tears_no_block() {
    // Batches of eight 1 MiB writes in flight at once (qemu-io's aio),
    // each batch then flushed, cycling over four 8 MiB regions: 48 batches
    // are 384 MiB through an array of about 150 MiB, so the log wraps and
    // garbage collection runs. The server is killed mid-batch.
    const BATCH_WRITES: usize = 8;
    const REGIONS: usize = 4;
    const BATCHES: usize = 48;
    const KILL_AFTER_WRITES: usize = 30 * BATCH_WRITES + 3;
    let region_bytes = (BATCH_WRITES << 20) as u64;
    let pattern = |batch: usize| (batch % 250 + 1) as u8;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("array");
    create(&dir, &[]);
    let socket = tmp.path().join("nbd.sock");
    let server = Served::start(&dir, &socket);
    let mut commands = Vec::new();
    for batch in 0..BATCHES {
        let base = (batch % REGIONS) as u64 * region_bytes;
        for i in 0..BATCH_WRITES as u64 {
            commands.push(format!("aio_write -P {} {} 1M", pattern(batch), base + (i << 20)));
        }
        // Every write of the batch answered, then an NBD FLUSH.
        commands.extend(["aio_flush", "flush"].map(String::from));
    }
    // qemu-io runs its commands in order, and `aio_flush` waits for every
    // write before it: once a write of batch b is answered, the flush of
    // batch b-1 was acknowledged.
    let answered = qemu_io_killing(server, &commands, KILL_AFTER_WRITES).len();
    eprintln!(
        "{answered} of {} queued writes answered before kill -9",
        BATCHES * BATCH_WRITES
    );
    assert!(
        (KILL_AFTER_WRITES..BATCHES * BATCH_WRITES).contains(&answered),
        "the kill came mid-run"
    );
    let flushed_through = answered / BATCH_WRITES - 1;
    let server = Served::start(&dir, &socket);
    let image = tmp.path().join("after.img");
    let out = run("nbdcopy", &[&server.uri(), image.to_str().unwrap()], tmp.path());
    assert!(out.is_empty(), "{out}");
    server.stop();
    let after = std::fs::read(&image).unwrap();
    let (written, rest) = after.split_at(REGIONS * region_bytes as usize);
    assert!(rest.iter().all(|&b| b == 0), "beyond the regions nothing was written");
    for (block, bytes) in written.chunks(4096).enumerate() {
        let region = block * 4096 / region_bytes as usize;
        // The newest flushed batch over this region, or any batch after it.
        let flushed = (0..=flushed_through).rev().find(|b| b % REGIONS == region);
        let allowed: Vec<u8> = std::iter::once(flushed.map_or(0, pattern))
            .chain(
                (flushed_through + 1..BATCHES)
                    .filter(|b| b % REGIONS == region)
                    .map(pattern),
            )
            .collect();
        assert!(
            bytes.iter().all(|&b| b == bytes[0]) && allowed.contains(&bytes[0]),
            "block {block} (region {region}) holds {:?}: torn, or neither batch {flushed:?} (the last flushed) nor a later one",
            &bytes[..8]
        );
    }
}

/// The report's wedge: random overwrites of 4-64 KiB with an fsync every 8
/// writes over a whole default-size export, twice the export's size per
/// server run, stopped with SIGTERM and served again, with and without
/// zstd. Before the engine was rebuilt, the second run failed with ENOSPC
/// (err=28) far below capacity.
#[test]
fn fio_overwrite_churn_runs_across_restarts() {
    for compress in ["none", "zstd:1"] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("array");
        let d = dir.to_str().unwrap();
        let out = tessera(&[
            "create",
            "--data",
            "4",
            "--parity",
            "2",
            "--dir",
            d,
            "--devices",
            "6",
            "--device-size",
            "48M",
            "--compress",
            compress,
        ]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let size = status_json(&dir)["logical_bytes"].as_u64().unwrap();
        let socket = tmp.path().join("nbd.sock");
        for round in 0..2 {
            let server = Served::start(&dir, &socket);
            let io_size = format!("--io_size={}", 2 * size);
            let out = run(
                "fio",
                &[
                    "--name=churn",
                    "--ioengine=nbd",
                    "--uri",
                    &server.uri(),
                    "--rw=randwrite",
                    "--bsrange=4k-64k",
                    "--iodepth=8",
                    "--fsync=8",
                    "--buffer_compress_percentage=50",
                    "--refill_buffers",
                    &io_size,
                    "--randseed=11",
                ],
                tmp.path(),
            );
            assert!(out.contains("err= 0"), "{compress}, round {round}:\n{out}");
            server.stop();
        }
        let status = status_json(&dir);
        assert_eq!(status["unrecoverable_reads"], 0, "{compress}");
        assert!(status["mapped_bytes"].as_u64().unwrap() <= size, "{compress}");
    }
}

#[test]
fn holes_show_in_nbdinfo_map_qemu_img_map_and_a_sparse_nbdcopy() {
    let (tmp, _dir, server) = create_and_serve(&[]);
    let uri = server.uri();
    // 64 KiB at 1 MiB with 16 KiB of it zeroed again, 4 KiB at 4 MiB, and
    // 3 bytes in the middle of a block (the advertised minimum is 1 byte).
    run(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0x61 1M 64K",
            "-c",
            "write -z 1040K 16K",
            "-c",
            "write -P 0x62 4M 4K",
            "-c",
            "write -P 0x63 8195 3",
            "-c",
            "flush",
        ],
        tmp.path(),
    );
    let read = run(
        "qemu-io",
        &["-f", "raw", &uri, "-c", "read -P 0x63 8195 3", "-c", "read -P 0 8192 3"],
        tmp.path(),
    );
    assert!(!read.contains("Pattern verification failed"), "{read}");

    // nbdinfo --map: (offset, length, type) runs, type 0 data, 3 hole+zero.
    let map = run("nbdinfo", &["--map", "--json", &uri], tmp.path());
    let map: serde_json::Value = serde_json::from_str(&map).unwrap();
    let runs: Vec<(u64, u64, u64)> = map
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["offset"].as_u64().unwrap(),
                r["length"].as_u64().unwrap(),
                r["type"].as_u64().unwrap(),
            )
        })
        .collect();
    let data: Vec<(u64, u64)> = runs.iter().filter(|r| r.2 == 0).map(|r| (r.0, r.1)).collect();
    let k = 1024;
    assert_eq!(
        data,
        vec![
            (8 * k, 4 * k),
            (1024 * k, 16 * k),
            (1056 * k, 32 * k),
            (4096 * k, 4 * k)
        ],
        "{runs:?}"
    );
    assert!(runs.iter().all(|r| r.2 == 0 || r.2 == 3), "{runs:?}");
    let size = runs.last().map(|r| r.0 + r.1).unwrap();

    // qemu-img map sees the same data ranges.
    let qmap = run("qemu-img", &["map", "--output=json", "-f", "raw", &uri], tmp.path());
    let qmap: serde_json::Value = serde_json::from_str(&qmap).unwrap();
    let qdata: Vec<(u64, u64)> = qmap
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["data"] == true)
        .map(|r| (r["start"].as_u64().unwrap(), r["length"].as_u64().unwrap()))
        .collect();
    assert_eq!(qdata, data);

    // nbdcopy to a file writes the data and leaves the holes sparse.
    let out = tmp.path().join("copy.raw");
    run("nbdcopy", &[&uri, out.to_str().unwrap()], tmp.path());
    let meta = std::fs::metadata(&out).unwrap();
    assert_eq!(meta.len(), size);
    use std::os::unix::fs::MetadataExt;
    assert!(
        meta.blocks() * 512 < 1 << 20,
        "{} bytes allocated for 56 KiB of data",
        meta.blocks() * 512
    );
    let copy = std::fs::read(&out).unwrap();
    assert!(copy[1 << 20..(1 << 20) + 16 * 1024].iter().all(|&b| b == 0x61));
    assert!(copy[(1 << 20) + 16 * 1024..(1 << 20) + 32 * 1024]
        .iter()
        .all(|&b| b == 0));
    assert_eq!(&copy[8195..8198], b"ccc");
    server.stop();
}

#[test]
fn slow_or_silent_control_clients_block_no_one_and_status_survives_a_closed_pipe() {
    let (tmp, dir, server) = create_and_serve(&[]);
    // Both sockets are the owner's only.
    use std::os::unix::fs::PermissionsExt;
    for socket in [dir.join("control.sock"), tmp.path().join("nbd.sock")] {
        let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", socket.display());
    }
    // Two clients that connect and say nothing.
    let silent: Vec<_> = (0..2)
        .map(|_| std::os::unix::net::UnixStream::connect(dir.join("control.sock")).unwrap())
        .collect();
    let started = std::time::Instant::now();
    let status = status_json(&dir);
    assert_eq!(status["data"], 4);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "status waited {:?} behind silent control clients",
        started.elapsed()
    );
    drop(silent);
    // Eight clients that trickle a byte every 300 ms and never end their
    // line, and eight silent ones: each takes a control slot, yet `status`
    // and `fail` answer at once, again and again (a client that has not
    // sent its request gives way to a newcomer), and a trickling client is
    // cut off when its request is not whole within 5 s of connecting.
    let socket = dir.join("control.sock");
    let stop_trickling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tricklers: Vec<_> = (0..8)
        .map(|_| {
            let (socket, stop) = (socket.clone(), stop_trickling.clone());
            std::thread::spawn(move || {
                use std::io::Write;
                let mut stream = std::os::unix::net::UnixStream::connect(&socket).unwrap();
                let connected = std::time::Instant::now();
                // Bounded: 40 bytes at most.
                for _ in 0..40 {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) || stream.write_all(b"s").is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(300));
                }
                connected.elapsed()
            })
        })
        .collect();
    let silent: Vec<_> = (0..8)
        .map(|_| std::os::unix::net::UnixStream::connect(&socket).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    for round in 0..3 {
        let started = std::time::Instant::now();
        assert_eq!(status_json(&dir)["data"], 4);
        let out = tessera(&["fail", dir.to_str().unwrap(), "--device", "9"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && !stderr.contains("busy"), "{stderr}");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "round {round}: status and fail took {:?} behind slow control clients",
            started.elapsed()
        );
    }
    let lasted: Vec<Duration> = tricklers.into_iter().map(|t| t.join().unwrap()).collect();
    stop_trickling.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(
        lasted.iter().all(|d| *d < Duration::from_secs(7)),
        "a trickling control client was served past its deadline: {lasted:?}"
    );
    drop(silent);
    // `status | true`: the reader is gone before anything is written; no
    // panic, no error.
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "'{}' status '{}' | true",
            env!("CARGO_BIN_EXE_tessera"),
            dir.display()
        ))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
        "{stderr}"
    );
    server.stop();
}

/// Whether `program args` succeeds (its output is dropped).
fn succeeds(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("{program} must be installed (scripts/install-test-deps.sh): {e}"))
        .success()
}

/// Writes `len` random bytes through `uri` with nbdcopy, reads them back
/// with nbdcopy, and compares.
fn copy_in_and_out(uri: &str, cwd: &Path, len: usize, seed: u64) {
    let mut data = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill(&mut data[..]);
    write_export(uri, cwd, &data);
    assert!(
        read_export(uri, cwd)[..len] == data[..],
        "nbdcopy through {uri} read back other bytes"
    );
}

/// Writes `data` at the start of the export at `uri` with nbdcopy.
fn write_export(uri: &str, cwd: &Path, data: &[u8]) {
    let input = cwd.join("in.bin");
    std::fs::write(&input, data).unwrap();
    run("nbdcopy", &[input.to_str().unwrap(), uri], cwd);
}

/// The whole export at `uri`, read with nbdcopy.
fn read_export(uri: &str, cwd: &Path) -> Vec<u8> {
    let output = cwd.join("out.bin");
    let _ = std::fs::remove_file(&output);
    run("nbdcopy", &[uri, output.to_str().unwrap()], cwd);
    std::fs::read(&output).unwrap()
}

/// The whole export at `uri` reads back as `data`.
fn reads_back(uri: &str, cwd: &Path, data: &[u8]) {
    assert!(read_export(uri, cwd) == data, "the export reads back other bytes");
}

/// nbdinfo says TLS, nbdcopy copies in and out, and qemu-img (with TLS
/// credentials `object`, id tls0, and `image_options` more) opens the
/// export, all through `uri` on `socket`.
fn tls_clients_are_served(uri: &str, socket: &Path, object: &str, image_options: &str, cwd: &Path, seed: u64) {
    let info = run("nbdinfo", &[uri], cwd);
    assert!(info.contains("with TLS"), "{info}");
    copy_in_and_out(uri, cwd, 4 << 20, seed);
    let image = format!(
        "driver=nbd,server.type=unix,server.path={},export=tessera,tls-creds=tls0{image_options}",
        socket.display()
    );
    let qemu = run("qemu-img", &["info", "--object", object, "--image-opts", &image], cwd);
    assert!(qemu.contains("virtual size"), "{qemu}");
}

#[test]
fn tls_with_certificates_serves_nbdinfo_nbdcopy_and_qemu_img_and_refuses_plaintext() {
    let tmp = tempfile::tempdir().unwrap();
    let (pki, client) = make_certificates(tmp.path());
    let dir = tmp.path().join("array");
    create(&dir, &[]);
    let socket = tmp.path().join("nbd.sock");
    let server = Served::start_with(&dir, &socket, &["--tls-certificates", pki.to_str().unwrap()]);
    let uri = format!(
        "nbds+unix:///tessera?socket={}&tls-certificates={}",
        socket.display(),
        client.display()
    );
    let object = format!("tls-creds-x509,id=tls0,endpoint=client,dir={}", client.display());
    tls_clients_are_served(&uri, &socket, &object, ",tls-hostname=localhost", tmp.path(), 1);
    // TLS is required: a plaintext client is refused.
    assert!(!succeeds("nbdinfo", &[&server.uri()]), "a plaintext client was served");
    server.stop();

    // With --tls-verify-peer, only a client with a certificate the CA
    // signed is served.
    let server = Served::start_with(
        &dir,
        &socket,
        &["--tls-certificates", pki.to_str().unwrap(), "--tls-verify-peer"],
    );
    let anonymous = tmp.path().join("anonymous");
    std::fs::create_dir_all(&anonymous).unwrap();
    std::fs::copy(client.join("ca-cert.pem"), anonymous.join("ca-cert.pem")).unwrap();
    let without = format!(
        "nbds+unix:///tessera?socket={}&tls-certificates={}",
        socket.display(),
        anonymous.display()
    );
    assert!(
        !succeeds("nbdinfo", &["--size", &without]),
        "a client without a certificate was served"
    );
    let size = run("nbdinfo", &["--size", &uri], tmp.path());
    assert!(size.trim().parse::<u64>().unwrap() > 0);
    server.stop();
}

#[test]
fn tls_with_pre_shared_keys_serves_nbdinfo_nbdcopy_and_qemu_img_and_refuses_wrong_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("array");
    create(&dir, &[]);
    let keys = tmp.path().join("psk");
    std::fs::create_dir_all(&keys).unwrap();
    // qemu's tls-creds-psk reads DIR/keys.psk; psktool writes this format.
    let file = keys.join("keys.psk");
    std::fs::write(
        &file,
        "alice:8c0ad51b2e1f4d9a6b7c3e5f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3\n",
    )
    .unwrap();
    let wrong = tmp.path().join("wrong.psk");
    std::fs::write(
        &wrong,
        "alice:0000000000000000000000000000000000000000000000000000000000000001\n",
    )
    .unwrap();
    let stranger = tmp.path().join("stranger.psk");
    std::fs::write(
        &stranger,
        "bob:8c0ad51b2e1f4d9a6b7c3e5f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3\n",
    )
    .unwrap();
    let socket = tmp.path().join("nbd.sock");
    let server = Served::start_with(&dir, &socket, &["--tls-psk", file.to_str().unwrap()]);
    let uri_for = |user: &str, keys: &Path| {
        format!(
            "nbds+unix://{user}@/tessera?socket={}&tls-psk-file={}",
            socket.display(),
            keys.display()
        )
    };
    let uri = uri_for("alice", &file);
    let object = format!(
        "tls-creds-psk,id=tls0,endpoint=client,dir={},username=alice",
        keys.display()
    );
    tls_clients_are_served(&uri, &socket, &object, "", tmp.path(), 2);
    assert!(
        !succeeds("nbdinfo", &["--size", &uri_for("alice", &wrong)]),
        "a wrong key was let in"
    );
    assert!(
        !succeeds("nbdinfo", &["--size", &uri_for("bob", &stranger)]),
        "an unknown identity was let in"
    );
    assert!(
        !succeeds("nbdinfo", &["--size", &server.uri()]),
        "a plaintext client was served"
    );
    server.stop();
    // --tls on: TLS offered, plaintext allowed.
    // Its socket opened to the group, as told (the control socket is not).
    let tls_on = [
        "--tls-psk",
        file.to_str().unwrap(),
        "--tls",
        "on",
        "--socket-mode",
        "660",
    ];
    let server = Served::start_with(&dir, &socket, &tls_on);
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode(&socket), mode(&dir.join("control.sock"))), (0o660, 0o600));
    assert!(succeeds("nbdinfo", &["--size", &server.uri()]));
    assert!(succeeds("nbdinfo", &["--size", &uri]));
    server.stop();
    // Bad flags are refused before anything is served.
    let refused = tessera(&["serve", dir.to_str().unwrap(), "--tls", "require"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--tls-certificates DIR or --tls-psk FILE"));
}

#[test]
fn socket_activation_serves_on_the_socket_systemd_passes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("array");
    create(&dir, &[]);
    let socket = tmp.path().join("activated.sock");
    // What systemd does: bind and listen, pass the socket as fd 3 with
    // LISTEN_PID naming the server and LISTEN_FDS=1, then exec it.
    let script = r#"
import os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen(16)
if s.fileno() != 3:
    os.dup2(s.fileno(), 3)
os.set_inheritable(3, True)
os.environ["LISTEN_PID"] = str(os.getpid())
os.environ["LISTEN_FDS"] = "1"
os.execv(sys.argv[2], [sys.argv[2], "serve", sys.argv[3]])
"#;
    let child = Command::new("python3")
        .args([
            "-c",
            script,
            socket.to_str().unwrap(),
            env!("CARGO_BIN_EXE_tessera"),
            dir.to_str().unwrap(),
        ])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = Served::started(child, &dir, &socket);
    copy_in_and_out(&server.uri(), tmp.path(), 1 << 20, 3);
    server.stop();
}

/// Opens a connection to `socket` and negotiates with NBD_OPT_GO, as a
/// client about to send requests does.
fn connect_and_go(socket: &Path) -> std::os::unix::net::UnixStream {
    use std::io::{Read, Write};
    use tessera_nbd::wire::{self, ClientOption};
    let mut c = std::os::unix::net::UnixStream::connect(socket).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut greeting = [0u8; 18];
    c.read_exact(&mut greeting).unwrap();
    let go = ClientOption::Info {
        go: true,
        name: b"tessera".to_vec(),
        items: Vec::new(),
    };
    c.write_all(&wire::CLIENT_FLAG_FIXED_NEWSTYLE.to_be_bytes()).unwrap();
    c.write_all(&go.encode()).unwrap();
    for _ in 0..8 {
        let mut header = [0u8; 20];
        c.read_exact(&mut header).unwrap();
        let kind = u32::from_be_bytes(header[12..16].try_into().unwrap());
        let mut data = vec![0u8; u32::from_be_bytes(header[16..20].try_into().unwrap()) as usize];
        c.read_exact(&mut data).unwrap();
        if kind == wire::REP_ACK {
            return c;
        }
        assert_eq!(kind, wire::REP_INFO);
    }
    panic!("NBD_OPT_GO was not acknowledged");
}

/// The server process's thread count.
/// The names of a process's threads, counted by name.
fn thread_names(pid: u32) -> std::collections::BTreeMap<String, usize> {
    let mut names = std::collections::BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        *names.entry(name.trim().to_string()).or_insert(0) += 1;
    }
    names
}

fn threads_of(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("Threads:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn many_idle_connections_hold_bounded_threads_and_are_closed_when_idle() {
    use std::io::Read;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("array");
    create(&dir, &[]);
    let socket = tmp.path().join("nbd.sock");
    let server = Served::start_with(
        &dir,
        &socket,
        &["--max-connections", "300", "--workers", "16", "--idle-timeout", "3"],
    );
    let pid = server.child.id();
    // The socket appears before the server starts its workers: count
    // once all 16 are up (a count taken earlier made the check below
    // fail on a loaded machine, 57 threads "left" of a smaller "before").
    let started = (0..200).any(|_| {
        let workers = thread_names(pid)
            .iter()
            .filter(|(name, _)| name.starts_with("nbd-worker"))
            .map(|(_, count)| count)
            .sum::<usize>();
        workers == 16 || {
            std::thread::sleep(Duration::from_millis(25));
            false
        }
    });
    assert!(started, "the 16 workers never started: {:?}", thread_names(pid));
    let before = threads_of(pid);
    let names_before = thread_names(pid);
    let idle: Vec<_> = (0..200).map(|_| connect_and_go(&socket)).collect();
    let with_idle = threads_of(pid);
    // Two threads a connection (its reader and its writer); the 16
    // workers are shared. Threads per connection as before (a reader and
    // 16 workers each) would be 3,400.
    assert!(
        with_idle <= before + 2 * idle.len() + 4,
        "{before} threads before, {with_idle} with {} idle connections",
        idle.len()
    );
    // A well-behaved client is served meanwhile.
    copy_in_and_out(&server.uri(), tmp.path(), 1 << 20, 4);
    // After the idle timeout every idle connection has been closed.
    for mut c in idle {
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
    }
    let settled = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        threads_of(pid) <= before
    });
    assert!(
        settled,
        "{} threads left after the idle connections closed, {before} before: {:?} now, {names_before:?} before",
        threads_of(pid),
        thread_names(pid)
    );
    server.stop();
}

/// Unmounts a FUSE mount point, waiting (bounded) while its file system
/// is still busy being let go of.
fn unmount(path: &Path) {
    let unmounted = (0..100).any(|_| {
        succeeds("umount", &[path.to_str().unwrap()]) || {
            std::thread::sleep(Duration::from_millis(100));
            false
        }
    });
    assert!(unmounted, "{} stayed mounted", path.display());
}

/// Copies the whole export out and checks the ext4 file system on it with
/// `e2fsck -fn`; returns what `debugfs` reads of `file` in it.
fn check_ext4(uri: &str, cwd: &Path, file: &str) -> String {
    let image = cwd.join("copy.img");
    let _ = std::fs::remove_file(&image);
    run("nbdcopy", &[uri, image.to_str().unwrap()], cwd);
    run("e2fsck", &["-fn", image.to_str().unwrap()], cwd);
    let request = format!("cat {file}");
    run("debugfs", &["-R", &request, image.to_str().unwrap()], cwd)
}

#[test]
fn ext4_through_nbdfuse_survives_a_restart_with_m_members_gone() {
    if !Path::new("/dev/fuse").exists() {
        // FUSE is part of the test machines' setup; say so loudly where it is not.
        eprintln!("SKIPPED: no /dev/fuse on this machine, so nbdfuse cannot mount");
        return;
    }
    let (tmp, dir, server) = create_and_serve(&[]);
    let (cwd, socket) = (tmp.path(), tmp.path().join("nbd.sock"));
    let (disk_dir, fs) = (cwd.join("disk"), cwd.join("fs"));
    std::fs::create_dir_all(&disk_dir).unwrap();
    std::fs::create_dir_all(&fs).unwrap();
    let disk = disk_dir.join("nbd");
    let mut nbdfuse = Command::new("nbdfuse")
        .args([disk.to_str().unwrap(), &server.uri()])
        .spawn()
        .expect("nbdfuse must be installed (scripts/install-test-deps.sh)");
    wait_for(&disk);
    run("mkfs.ext4", &["-F", "-q", disk.to_str().unwrap()], cwd);
    // A read-write session through fuse2fs, whose superblock updates are
    // the few-byte writes that needed a minimum block size of 1.
    run(
        "fuse2fs",
        &[disk.to_str().unwrap(), fs.to_str().unwrap(), "-o", "fakeroot"],
        cwd,
    );
    let numbers: String = (0..20_000).map(|i| format!("{i}\n")).collect();
    std::fs::write(fs.join("a"), "hello\n").unwrap();
    std::fs::write(fs.join("b"), &numbers).unwrap();
    std::fs::rename(fs.join("a"), fs.join("c")).unwrap();
    let mut append = std::fs::OpenOptions::new().append(true).open(fs.join("c")).unwrap();
    std::io::Write::write_all(&mut append, b"more\n").unwrap();
    drop(append);
    std::fs::OpenOptions::new()
        .write(true)
        .open(fs.join("b"))
        .unwrap()
        .set_len(1000)
        .unwrap();
    std::fs::create_dir(fs.join("d")).unwrap();
    std::fs::copy(fs.join("c"), fs.join("d/e")).unwrap();
    std::fs::remove_file(fs.join("c")).unwrap();
    unmount(&fs);
    unmount(&disk_dir);
    let exited = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        matches!(nbdfuse.try_wait(), Ok(Some(_)))
    });
    if !exited {
        let _ = nbdfuse.kill();
    }
    let _ = nbdfuse.wait();
    assert_eq!(check_ext4(&server.uri(), cwd, "/d/e"), "hello\nmore\n");
    server.stop();
    // M = 2 members gone: the file system is whole and clean.
    for member in ["member-001", "member-004"] {
        std::fs::remove_file(dir.join(member)).unwrap();
    }
    let server = Served::start(&dir, &socket);
    assert_eq!(check_ext4(&server.uri(), cwd, "/d/e"), "hello\nmore\n");
    server.stop();
}

#[test]
fn a_member_cannot_be_shared_or_reformatted_by_another_array() {
    // Reported: a second directory listing the first array's members
    // served alongside it (and its flushed writes became EIO); `create
    // --device` reformatted another array's member, or any file.
    let tmp = tempfile::tempdir().unwrap();
    let (cwd, dir) = (tmp.path(), tmp.path().join("first"));
    create(&dir, &[]);
    let server = Served::start(&dir, &cwd.join("first.sock"));
    let twin = cwd.join("twin");
    std::fs::create_dir_all(&twin).unwrap();
    let members: String = (0..6)
        .map(|i| format!("{}\n", dir.join(format!("member-{i:03}")).display()))
        .collect();
    std::fs::write(twin.join("members"), members).unwrap();
    // Bounded: before the fix the second server ran on.
    let mut twin_server = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "serve",
            twin.to_str().unwrap(),
            "--socket",
            cwd.join("twin.sock").to_str().unwrap(),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let exited = (0..200).find_map(|_| {
        std::thread::sleep(Duration::from_millis(25));
        twin_server.try_wait().unwrap()
    });
    if exited.is_none() {
        let _ = twin_server.kill();
        let _ = twin_server.wait();
    }
    assert!(
        exited.is_some_and(|status| !status.success()),
        "a second array served the first one's members"
    );
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut twin_server.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(stderr.contains("member-000 is in use"), "{stderr}");
    // The first is untouched and still served.
    copy_in_and_out(&server.uri(), cwd, 1 << 20, 5);
    server.stop();

    // `create --device` over a member of that array, or over data.
    let member = dir.join("member-003");
    let before = std::fs::read(&member).unwrap();
    let with_devices = |paths: &[PathBuf], force: bool| {
        let target = cwd.join(format!("new-{}", paths.len() + force as usize));
        let mut args = vec![
            "create",
            "--data",
            "1",
            "--parity",
            "1",
            "--dir",
            target.to_str().unwrap(),
        ];
        for path in paths {
            args.extend_from_slice(&["--device", path.to_str().unwrap()]);
        }
        if force {
            args.push("--force");
        }
        tessera(&args)
    };
    let blank = cwd.join("blank.img");
    std::fs::write(&blank, vec![0u8; 40 << 20]).unwrap();
    let out = with_devices(&[member.clone(), blank.clone()], false);
    assert!(!out.status.success(), "create reformatted another array's member");
    assert!(String::from_utf8_lossy(&out.stderr).contains("is member 3 of Tessera array"));
    assert!(std::fs::read(&member).unwrap() == before, "the member was changed");
    let data = cwd.join("data.img");
    let mut bytes = vec![0u8; 40 << 20];
    bytes[1024..1030].copy_from_slice(b"ext4!!");
    std::fs::write(&data, &bytes).unwrap();
    let out = with_devices(&[data.clone(), blank.clone()], false);
    assert!(!out.status.success(), "create formatted a file holding data");
    assert!(String::from_utf8_lossy(&out.stderr).contains("holds data in its first MiB"));
    // Told to, it does.
    let out = with_devices(&[data, blank], true);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Random bytes, as many as the export at `uri` holds, from `seed`.
fn export_sized_data(uri: &str, cwd: &Path, seed: u64) -> Vec<u8> {
    let size: usize = run("nbdinfo", &["--size", uri], cwd).trim().parse().unwrap();
    let mut data = vec![0u8; size];
    rand::rngs::StdRng::seed_from_u64(seed).fill(&mut data[..]);
    data
}

/// Flips bytes at `count` random offsets past the superblock of each of
/// `members`' files in `dir` (chunks of data and parity alike).
fn corrupt_members(dir: &Path, members: &[usize], count: usize, seed: u64) {
    use std::os::unix::fs::FileExt;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for &member in members {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join(format!("member-{member:03}")))
            .unwrap();
        let len = file.metadata().unwrap().len();
        for _ in 0..count {
            let at = rng.gen_range(1 << 20..len - (1 << 20));
            let mut byte = [0u8; 1];
            file.read_exact_at(&mut byte, at).unwrap();
            byte[0] ^= 0x5a;
            file.write_all_at(&byte, at).unwrap();
        }
        file.sync_all().unwrap();
    }
}

/// `tessera scrub DIR --json --rate 0`, parsed.
fn scrub_json(dir: &Path) -> serde_json::Value {
    let out = tessera(&["scrub", dir.to_str().unwrap(), "--json", "--rate", "0"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn scrub_repairs_corruption_on_m_members_offline_and_while_served() {
    let (tmp, dir, server) = create_and_serve(&[]);
    let (cwd, socket) = (tmp.path(), tmp.path().join("nbd.sock"));
    let data = export_sized_data(&server.uri(), cwd, 6);
    write_export(&server.uri(), cwd, &data);
    let read_back = |server: &Served| reads_back(&server.uri(), cwd, &data);
    server.stop();
    // Stopped: M = 2 members corrupted, found and repaired; a second scrub
    // finds nothing.
    corrupt_members(&dir, &[0, 3], 20, 7);
    let first = scrub_json(&dir);
    assert!(first["chunks_bad"].as_u64().unwrap() > 0, "{first}");
    assert_eq!(first["chunks_repaired"], first["chunks_bad"], "{first}");
    assert_eq!(first["stripes_unrecoverable"], 0, "{first}");
    assert_eq!(first["parity_mismatches"], 0, "{first}");
    assert_eq!(first["stripes_checked"], first["stripes_total"], "{first}");
    assert_eq!(scrub_json(&dir)["chunks_bad"], 0);
    // Served: the same through the control socket, with clients on.
    let server = Served::start(&dir, &socket);
    read_back(&server);
    corrupt_members(&dir, &[1, 5], 20, 8);
    let served = scrub_json(&dir);
    assert!(served["chunks_bad"].as_u64().unwrap() > 0, "{served}");
    assert_eq!(served["chunks_repaired"], served["chunks_bad"], "{served}");
    assert_eq!(scrub_json(&dir)["chunks_bad"], 0);
    read_back(&server);
    // The repairs are counted in status, per member where they were.
    let status = status_json(&dir);
    assert!(status["chunks_repaired"].as_u64().unwrap() >= served["chunks_repaired"].as_u64().unwrap());
    let repaired_on = |i: usize| status["members"][i]["chunks_repaired"].as_u64().unwrap();
    assert!(
        repaired_on(1) + repaired_on(5) > 0 && repaired_on(0) + repaired_on(2) == 0,
        "{status}"
    );
    server.stop();
}

/// The body of `GET /metrics` from `address`.
fn scrape(address: &str) -> String {
    let cwd = std::env::temp_dir();
    let (code, text) = curl(&format!("http://{address}/metrics"), &[], &cwd);
    assert_eq!(code, 200, "{text}");
    text
}

/// A loopback address whose port was free a moment ago.
fn free_address() -> String {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string()
}

/// The value of the metric line that starts with `series`.
fn metric(text: &str, series: &str) -> f64 {
    let line = text
        .lines()
        .find(|l| l.starts_with(series))
        .unwrap_or_else(|| panic!("no {series} in\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn prometheus_metrics_count_requests_and_show_member_states() {
    let tmp = tempfile::tempdir().unwrap();
    let (cwd, dir) = (tmp.path(), tmp.path().join("array"));
    create(&dir, &[]);
    let address = free_address();
    let server = Served::start_with(&dir, &cwd.join("nbd.sock"), &["--metrics", &address]);
    copy_in_and_out(&server.uri(), cwd, 1 << 20, 9);
    let out = tessera(&["fail", dir.to_str().unwrap(), "--device", "2"]);
    assert!(out.status.success());
    let text = scrape(&address);
    assert!(text.ends_with("# EOF\n"), "not OpenMetrics text:\n{text}");
    assert_eq!(
        metric(&text, "tessera_client_bytes_total{op=\"write\"}"),
        (1 << 20) as f64
    );
    assert!(metric(&text, "tessera_client_bytes_total{op=\"read\"}") >= (1 << 20) as f64);
    assert!(metric(&text, "tessera_client_latency_seconds_count{op=\"write\"}") >= 1.0);
    let state = |member: usize, state: &str| {
        text.lines().any(|l| {
            l.starts_with(&format!("tessera_member_state{{member=\"{member}\","))
                && l.contains(&format!("state=\"{state}\""))
                && l.ends_with(" 1")
        })
    };
    assert!(state(2, "failed") && state(0, "healthy"), "{text}");
    assert!(metric(&text, "tessera_write_amplification") > 1.0);
    // What clients wrote, and more than that written to the members.
    let written = |kind: &str| metric(&text, &format!("tessera_bytes_written{{kind=\"{kind}\"}}"));
    assert_eq!(written("client"), (1 << 20) as f64, "{text}");
    assert!(written("members") > written("client"), "{text}");
    // Reported, whatever they are yet (`metric` fails on a missing one).
    for kind in ["checkpoint", "gc_relocated"] {
        written(kind);
    }
    for kind in ["written", "root_only", "forced", "dropped"] {
        metric(&text, &format!("tessera_checkpoints{{kind=\"{kind}\"}}"));
    }
    // The map holds the 1 MiB written: 16 extents of at most 64 KiB, at
    // least 40 bytes each.
    let map = |kind: &str| metric(&text, &format!("tessera_map{{kind=\"{kind}\"}}"));
    assert!(map("mappings") >= 16.0, "{text}");
    assert!(map("bytes") >= 40.0 * map("mappings"), "{text}");
    map("page_reads");
    // The slot table: one page of 4,096 packed slots at least.
    assert!(map("slot_table_bytes") >= (4096 * 16) as f64, "{text}");
    assert_eq!(
        metric(&text, "tessera_stripes{kind=\"degraded\"}") as u64,
        metric(&text, "tessera_stripes{kind=\"used\"}") as u64
    );
    dashboard_names_only_what_is_served(&text);
    // The API gives the same text.
    let through_api = control(&dir, "metrics");
    let through_api = through_api.as_str().unwrap();
    assert!(
        metric(through_api, "tessera_client_bytes_total{op=\"write\"}") == (1 << 20) as f64,
        "{through_api}"
    );
    server.stop();
}

/// Every series the Grafana dashboard in `examples/` queries is one the
/// server exports: each metric it names has a `# TYPE` line in `text` (a
/// counter's `_total`, a histogram's `_bucket`, `_sum` and `_count` taken
/// back to the family), and each `kind="..."` it selects has a sample,
/// but for the scrub's and rebuild's, absent while none runs.
fn dashboard_names_only_what_is_served(text: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/grafana/tessera-dashboard.json");
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter())
        .map(|t| t["expr"].as_str().unwrap().to_string())
        .collect();
    assert!(exprs.len() >= 10, "{} queries", exprs.len());
    let mut checked = 0;
    for expr in &exprs {
        let mut rest = expr.as_str();
        while let Some(at) = rest.find("tessera_") {
            let name: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[at + name.len()..];
            let family = ["_total", "_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(&name);
            // The scrub's and the rebuild's are served only while one
            // runs: those are looked for where the server registers them.
            let idle = ["tessera_scrub_stripes", "tessera_rebuild"].contains(&family);
            let registered = |family: &str| {
                let source =
                    std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/metrics.rs"))
                        .unwrap();
                source.contains(&format!("\"{}\",", family.trim_start_matches("tessera_")))
            };
            assert!(
                text.contains(&format!("# TYPE {family} ")) || (idle && registered(family)),
                "the dashboard's {name} ({expr}) is not served:\n{text}"
            );
            let kind = rest
                .strip_prefix('{')
                .and_then(|m| m.split('}').next())
                .and_then(|m| m.split("kind=\"").nth(1))
                .and_then(|k| k.split('"').next());
            if let Some(kind) = kind.filter(|_| !idle) {
                let served = text
                    .lines()
                    .any(|l| l.starts_with(&format!("{name}{{")) && l.contains(&format!("kind=\"{kind}\"")));
                assert!(
                    served,
                    "the dashboard's {name}{{kind=\"{kind}\"}} is not served:\n{text}"
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 20, "{checked} series checked");
}

#[test]
fn replace_rebuilds_a_member_that_came_back_or_onto_a_new_device() {
    let (tmp, dir, server) = create_and_serve(&[]);
    let (cwd, socket) = (tmp.path(), tmp.path().join("nbd.sock"));
    let data = export_sized_data(&server.uri(), cwd, 10);
    write_export(&server.uri(), cwd, &data[..data.len() / 2]);
    // Member 2 fails while served; half the export is written after.
    assert!(tessera(&["fail", dir.to_str().unwrap(), "--device", "2"])
        .status
        .success());
    write_export(&server.uri(), cwd, &data);
    // Member 2 resynced by the server, on its own device, while served.
    let out = tessera(&["replace", dir.to_str().unwrap(), "--device", "2"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains("member 2 rebuilt") && text.contains("healthy again"),
        "{text}"
    );
    assert_eq!(status_json(&dir)["members"][2]["state"], "healthy");
    server.stop();
    // Member 2 failed again: rebuilt offline below.
    assert!(tessera(&["fail", dir.to_str().unwrap(), "--device", "2"])
        .status
        .success());
    // Member 4's file is lost as well.
    std::fs::remove_file(dir.join("member-004")).unwrap();
    let replace = |args: &[&str]| {
        let mut all = vec!["replace", dir.to_str().unwrap()];
        all.extend_from_slice(args);
        let out = tessera(&all);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    // Its own device for member 2; a new file for member 4.
    replace(&["--device", "2"]);
    let new = cwd.join("new-member-4.img");
    replace(&["--device", "4", "--with", new.to_str().unwrap()]);
    let status = status_json(&dir);
    let states: Vec<&str> = (0..6)
        .map(|i| status["members"][i]["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["healthy"; 6], "{status}");
    assert!(status["members"][4]["name"]
        .as_str()
        .unwrap()
        .ends_with("new-member-4.img"));
    // The rebuilt members carry the data: with two others failed, every
    // byte still reads back.
    let server = Served::start(&dir, &socket);
    for member in ["0", "1"] {
        assert!(tessera(&["fail", dir.to_str().unwrap(), "--device", member])
            .status
            .success());
    }
    reads_back(&server.uri(), cwd, &data);
    server.stop();
    // A healthy member has nothing to rebuild, and no device is made for it.
    let unused = cwd.join("unused.img");
    let out = tessera(&[
        "replace",
        dir.to_str().unwrap(),
        "--device",
        "3",
        "--with",
        unused.to_str().unwrap(),
    ]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("is healthy"));
    assert!(!unused.exists(), "a refused replace left a device file behind");
}

#[test]
fn a_member_that_was_away_is_resynced_rewriting_only_what_it_missed() {
    let (tmp, dir, server) = create_and_serve(&[]);
    let (cwd, socket) = (tmp.path(), tmp.path().join("nbd.sock"));
    let uri = server.uri();
    let mut data = export_sized_data(&uri, cwd, 11);
    write_export(&uri, cwd, &data);
    server.stop();
    // Member 2 is away while 1 MiB is rewritten, then comes back.
    let (member, away) = (dir.join("member-002"), cwd.join("member-002.away"));
    std::fs::rename(&member, &away).unwrap();
    let server = Served::start(&dir, &socket);
    rand::rngs::StdRng::seed_from_u64(12).fill(&mut data[..1 << 20]);
    write_export(&uri, cwd, &data[..1 << 20]);
    server.stop();
    std::fs::rename(&away, &member).unwrap();
    assert_eq!(
        status_json(&dir)["members"][2]["state"],
        "stale",
        "a member that was away is not trusted"
    );
    let out = tessera(&["replace", dir.to_str().unwrap(), "--device", "2"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // "member 2 rebuilt: W chunks (...) of S stripes written, H stripes held
    // already (...), C chunks checked current and kept, ..."
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let number_before = |word: &str| -> u64 {
        let at = text.find(word).unwrap_or_else(|| panic!("no '{word}' in {text}"));
        text[..at].split_whitespace().last().unwrap().parse().unwrap()
    };
    let (written, held, checked) = (
        number_before("chunks ("),
        number_before("stripes held"),
        number_before("chunks checked"),
    );
    // It left at a clean stop (a checkpoint): what it holds from before is
    // taken on its superblock's word, and only the stripes written since
    // are looked at.
    assert!(written > 0 && written * 10 < held && checked <= written, "{text}");
    // Two others failed: every byte, old and new, reads back.
    let server = Served::start(&dir, &socket);
    for other in ["0", "1"] {
        assert!(tessera(&["fail", dir.to_str().unwrap(), "--device", other])
            .status
            .success());
    }
    reads_back(&uri, cwd, &data);
    server.stop();
}

/// Polls `tessera status` until member `index` is `state` (60 s at most).
fn wait_for_state(dir: &Path, index: usize, state: &str) -> serde_json::Value {
    let mut status = serde_json::Value::Null;
    for _ in 0..600 {
        status = status_json(dir);
        if status["members"][index]["state"] == state {
            return status;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("member {index} never became {state}: {status}");
}

/// How the server's last rebuild ended, once it has said (within 60 s).
fn last_rebuild(dir: &Path) -> serde_json::Value {
    let mut last = serde_json::Value::Null;
    for _ in 0..1200 {
        last = control(dir, "rebuild")["last"].clone();
        if !last.is_null() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    last
}

#[test]
fn serve_resyncs_a_stale_member_by_itself_and_leaves_one_failed_by_hand_to_online() {
    let (tmp, dir, server) = create_and_serve(&[]);
    let (cwd, socket) = (tmp.path(), tmp.path().join("nbd.sock"));
    let uri = server.uri();
    let mut data = export_sized_data(&uri, cwd, 21);
    write_export(&uri, cwd, &data);
    // Member 4 failed by hand; member 2 away while 1 MiB is rewritten.
    assert!(tessera(&["fail", dir.to_str().unwrap(), "--device", "4"])
        .status
        .success());
    server.stop();
    let (member, away) = (dir.join("member-002"), cwd.join("member-002.away"));
    std::fs::rename(&member, &away).unwrap();
    let server = Served::start(&dir, &socket);
    rand::rngs::StdRng::seed_from_u64(22).fill(&mut data[2 << 20..3 << 20]);
    write_export(&uri, cwd, &data[..3 << 20]);
    server.stop();
    std::fs::rename(&away, &member).unwrap();
    // Told not to, the server leaves it stale.
    let server = Served::start_with(&dir, &socket, &["--no-auto-resync"]);
    let status = status_json(&dir);
    assert_eq!(status["members"][2]["state"], "stale", "{status}");
    server.stop();
    // By default it resyncs it, taking what it held on its superblock's
    // word; member 4, failed by hand, stays out.
    let server = Served::start(&dir, &socket);
    let status = wait_for_state(&dir, 2, "healthy");
    assert_eq!(status["members"][4]["state"], "failed", "{status}");
    // The member is healthy before the rebuild's thread has said how it
    // ended (a run of the whole suite once asked in between).
    let last = last_rebuild(&dir);
    let report = &last["report"];
    assert!(
        last["done"] == true
            && report["stripes_trusted"].as_u64().unwrap() * 10 > report["stripes_total"].as_u64().unwrap() * 9,
        "{last}"
    );
    // `online` brings member 4 back, on the served array.
    let out = tessera(&["online", dir.to_str().unwrap(), "--device", "4"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(status_json(&dir)["members"][4]["state"], "healthy");
    for other in ["0", "1"] {
        assert!(tessera(&["fail", dir.to_str().unwrap(), "--device", other])
            .status
            .success());
    }
    reads_back(&uri, cwd, &data);
    server.stop();
}

#[test]
fn a_served_array_with_spare_members_heals_by_itself_and_heal_refuses_one_without() {
    let tmp = tempfile::tempdir().unwrap();
    let (cwd, socket, dir) = (tmp.path(), tmp.path().join("nbd.sock"), tmp.path().join("array"));
    // 4+2 on eight members: stripes on members 0-5 have nothing on 6 and 7.
    let out = try_create(&dir, "8", &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let server = Served::start(&dir, &socket);
    let uri = server.uri();
    let data = export_sized_data(&uri, cwd, 31);
    write_export(&uri, cwd, &data[..8 << 20]);
    for member in ["6", "7"] {
        assert!(tessera(&["fail", dir.to_str().unwrap(), "--device", member])
            .status
            .success());
    }
    // The server heals in the background: the data stripes leave 6 and 7
    // (a checkpoint stripe may stay).
    let mut status = serde_json::Value::Null;
    for _ in 0..600 {
        status = status_json(&dir);
        if status["stripes_degraded"].as_u64().unwrap() <= 2 && status["heal"].is_null() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(status["stripes_degraded"].as_u64().unwrap() <= 2, "{status}");
    // Asked again, through the server, there is nothing left to move.
    let out = tessera(&["heal", dir.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["stripes_degraded"], 0, "{report}");
    assert!(
        read_export(&uri, cwd)[..8 << 20] == data[..8 << 20],
        "healed data reads back other bytes"
    );
    server.stop();
    // Six members, stripes of six: nowhere to heal to, and said so.
    let (_tmp, other, server) = create_and_serve(&[]);
    assert!(tessera(&["fail", other.to_str().unwrap(), "--device", "1"])
        .status
        .success());
    let out = tessera(&["heal", other.to_str().unwrap()]);
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("more members than a stripe is wide"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    server.stop();
}

#[test]
fn a_replace_killed_half_way_goes_on_where_it_stopped() {
    let (tmp, dir, server) = create_and_serve(&[]);
    let (cwd, socket) = (tmp.path(), tmp.path().join("nbd.sock"));
    let data = export_sized_data(&server.uri(), cwd, 13);
    write_export(&server.uri(), cwd, &data);
    server.stop();
    std::fs::remove_file(dir.join("member-001")).unwrap();
    let new = cwd.join("new-member-1.img");
    let args = [
        "replace",
        dir.to_str().unwrap(),
        "--device",
        "1",
        "--with",
        new.to_str().unwrap(),
    ];
    // Slowed to about 2 s, killed once it saved where it was.
    let mut slow = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .args(["--rate", "16M"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    saved_rebuild(&dir);
    assert!(
        matches!(slow.try_wait(), Ok(None)),
        "the replace ended before it was killed"
    );
    slow.kill().unwrap();
    slow.wait().unwrap();
    assert_eq!(
        status_json(&dir)["members"][1]["state"],
        "failed",
        "a half-done replace is not trusted"
    );
    let out = tessera(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let at = text
        .find(" stripes done before a restart")
        .unwrap_or_else(|| panic!("{text}"));
    let resumed: u64 = text[..at].split_whitespace().last().unwrap().parse().unwrap();
    assert!(resumed > 0, "the second run started over: {text}");
    assert!(!dir.join("rebuild.json").exists());
    let server = Served::start(&dir, &socket);
    for other in ["0", "2"] {
        assert!(tessera(&["fail", dir.to_str().unwrap(), "--device", other])
            .status
            .success());
    }
    reads_back(&server.uri(), cwd, &data);
    server.stop();
}

/// DIR/rebuild.json once it records where the rebuild is (within 20 s).
fn saved_rebuild(dir: &Path) -> serde_json::Value {
    for _ in 0..400 {
        if let Ok(text) = std::fs::read_to_string(dir.join("rebuild.json")) {
            let job: serde_json::Value = serde_json::from_str(&text).unwrap();
            if !job["resume"].is_null() {
                return job;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no rebuild saved where it was in 20 s");
}

/// Sends the API request `name` (one with no body: "status",
/// "rebuild") to the control socket of the array in `dir`, as a client
/// of the API would; its answer.
fn control(dir: &Path, name: &str) -> serde_json::Value {
    use std::io::{BufRead, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(dir.join("control.sock")).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let request = serde_json::json!({"version": 1, "request": name});
    stream.write_all(format!("{request}\n").as_bytes()).unwrap();
    let mut last = String::new();
    for line in std::io::BufReader::new(stream).lines() {
        last = line.unwrap();
    }
    let reply: serde_json::Value = serde_json::from_str(&last).unwrap();
    assert_eq!(reply["version"], 1, "{reply}");
    reply["answer"][name].clone()
}

/// fio on `uri` as job `name`: 16 KiB random writes over `size` bytes
/// from `offset`, crc32c verify headers, and `extra`.
fn fio_job(uri: &str, cwd: &Path, name: &str, offset: &str, size: &str, extra: &[&str]) -> String {
    let (name, offset, size) = (
        format!("--name={name}"),
        format!("--offset={offset}"),
        format!("--size={size}"),
    );
    let mut args = vec![
        name.as_str(),
        "--ioengine=nbd",
        "--uri",
        uri,
        "--rw=randwrite",
        "--bs=16k",
        offset.as_str(),
        size.as_str(),
        "--iodepth=16",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--randseed=9",
    ];
    args.extend_from_slice(extra);
    run("fio", &args, cwd)
}

#[test]
fn a_served_array_rebuilds_a_member_while_fio_verifies_and_a_kill_9_resumes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (cwd, socket, dir) = (tmp.path(), tmp.path().join("nbd.sock"), tmp.path().join("array"));
    create(&dir, &[]);
    let address = free_address();
    let mut server = Served::start_with(&dir, &socket, &["--metrics", &address]);
    let uri = server.uri();
    let d = dir.to_str().unwrap();
    // Each writing job ends with a FLUSH: what kill -9 may not lose.
    fio_job(
        &uri,
        cwd,
        "before",
        "0",
        "64M",
        &["--do_verify=0", "--verify_state_save=1", "--end_fsync=1"],
    );
    assert!(tessera(&["fail", d, "--device", "2"]).status.success());
    let new = cwd.join("new-member-2.img");
    // Slow while clients write, so that the kill below finds it half-way.
    let out = tessera(&[
        "replace",
        d,
        "--device",
        "2",
        "--with",
        new.to_str().unwrap(),
        "--busy-rate",
        "1M",
        "--rate",
        "4M",
        "--detach",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // fio writes and verifies another region during the rebuild.
    let during = fio_job(
        &uri,
        cwd,
        "during",
        "64M",
        "16M",
        &["--verify_state_save=1", "--end_fsync=1"],
    );
    assert!(during.contains("err= 0"), "{during}");
    let status = status_json(&dir);
    assert_eq!(status["members"][2]["state"], "rebuilding", "{status}");
    let done_before = status["rebuild"]["stripes_done"].as_u64().unwrap();
    assert!(done_before > 0 && done_before < status["rebuild"]["stripes_total"].as_u64().unwrap());
    // The metrics say the same.
    let text = scrape(&address);
    let rebuild = |kind: &str| metric(&text, &format!("tessera_rebuild{{member=\"2\",kind=\"{kind}\"}}"));
    assert!(
        rebuild("stripes_done") > 0.0 && rebuild("stripes_done") < rebuild("stripes_total"),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.starts_with("tessera_member_state{member=\"2\",")
            && l.contains("state=\"rebuilding\"")
            && l.ends_with(" 1")),
        "{text}"
    );
    // kill -9 half-way, once the job file says where it was.
    let job = saved_rebuild(&dir);
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    assert!(job["resume"]["next_slot"].as_u64().unwrap() > 0, "{job}");
    assert_eq!(
        status_json(&dir)["members"][2]["state"],
        "failed",
        "not trusted half-rebuilt"
    );
    // Served again: it goes on by itself, and ends.
    let server = Served::start(&dir, &socket);
    let last = last_rebuild(&dir);
    assert_eq!(last["done"], true, "{last}");
    assert!(
        last["report"]["stripes_resumed"].as_u64().unwrap() > 0,
        "it started over: {last}"
    );
    assert!(!dir.join("rebuild.json").exists());
    let status = status_json(&dir);
    assert_eq!(status["members"][2]["state"], "healthy", "{status}");
    assert!(status["members"][2]["name"]
        .as_str()
        .unwrap()
        .ends_with("new-member-2.img"));
    // Two others failed: both regions verify, from the rebuilt member.
    assert!(tessera(&["fail", d, "--device", "0"]).status.success());
    assert!(tessera(&["fail", d, "--device", "1"]).status.success());
    for (name, offset, size) in [("before", "0", "64M"), ("during", "64M", "16M")] {
        let out = fio_job(
            &server.uri(),
            cwd,
            name,
            offset,
            size,
            &["--verify_only", "--verify_state_load=1"],
        );
        assert!(out.contains("err= 0") && out.contains("READ:"), "{out}");
    }
    server.stop();
    // A job file left by a stop between the member's readmission and the
    // file's removal: the next start sees member 2 healthy and drops it,
    // so another member can be replaced.
    std::fs::write(dir.join("rebuild.json"), job.to_string()).unwrap();
    let server = Served::start(&dir, &socket);
    let out = tessera(&["replace", d, "--device", "0", "--detach"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    server.stop();
}

/// `tessera volume ... --json` against DIR: the volumes after it, by name
/// with their size.
fn volumes(dir: &Path, args: &[&str]) -> Vec<(String, u64)> {
    let mut all = vec!["volume"];
    all.extend_from_slice(&args[..1]);
    all.push(dir.to_str().unwrap());
    all.extend_from_slice(&args[1..]);
    all.push("--json");
    let out = tessera(&all);
    assert!(
        out.status.success(),
        "volume {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    listed
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["name"].as_str().unwrap().to_string(), v["bytes"].as_u64().unwrap()))
        .collect()
}

#[test]
fn volumes_are_exports_by_name_made_and_deleted_while_another_is_served() {
    let (tmp, dir, server) = create_and_serve(&[]);
    let cwd = tmp.path();
    let socket = server.socket.display().to_string();
    let uri = |name: &str| format!("nbd+unix:///{name}?socket={socket}");
    volumes(&dir, &["create", "vol1", "--size", "16M"]);
    let listed = volumes(&dir, &["create", "vol2", "--size", "8M"]);
    assert_eq!(
        listed[1..],
        [("vol1".to_string(), 16 << 20), ("vol2".to_string(), 8 << 20)]
    );
    let list = run("nbdinfo", &["--list", &uri("")], cwd);
    for name in ["tessera", "vol1", "vol2"] {
        assert!(
            list.contains(&format!("export=\"{name}\"")) || list.contains(name),
            "{list}"
        );
    }
    let info = run("qemu-img", &["info", "--output=json", &uri("vol2")], cwd);
    assert!(info.contains("\"virtual-size\": 8388608"), "{info}");
    let mut one = vec![0u8; 16 << 20];
    rand::rngs::StdRng::seed_from_u64(31).fill(&mut one[..]);
    write_export(&uri("vol1"), cwd, &one);
    copy_in_and_out(&uri("vol2"), cwd, 8 << 20, 32);
    reads_back(&uri("vol1"), cwd, &one);
    // fio checks what it writes to vol3 while vol2 is deleted and vol4
    // made and deleted beside it.
    volumes(&dir, &["create", "vol3", "--size", "32M"]);
    let churn = {
        let (dir, cwd) = (dir.clone(), cwd.to_path_buf());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            volumes(&dir, &["delete", "vol2"]);
            for _ in 0..3 {
                volumes(&dir, &["create", "vol4", "--size", "4M"]);
                let mut bytes = vec![0u8; 4 << 20];
                rand::rngs::StdRng::seed_from_u64(33).fill(&mut bytes[..]);
                write_export(
                    &format!("nbd+unix:///vol4?socket={}", cwd.join("nbd.sock").display()),
                    &cwd,
                    &bytes,
                );
                volumes(&dir, &["delete", "vol4"]);
            }
        })
    };
    fio(&uri("vol3"), cwd, &["--size=32M", "--bs=4k-64k"]);
    churn.join().unwrap();
    let names: Vec<String> = volumes(&dir, &["list"]).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["tessera", "vol1", "vol3"]);
    let gone = Command::new("nbdinfo")
        .arg(uri("vol2"))
        .current_dir(cwd)
        .output()
        .unwrap();
    assert!(!gone.status.success(), "a deleted volume is no export");
    // Shrink and grow: the cut part reads as zeros.
    volumes(&dir, &["resize", "vol1", "--size", "4M"]);
    volumes(&dir, &["resize", "vol1", "--size", "16M"]);
    let mut expected = one.clone();
    expected[4 << 20..].fill(0);
    reads_back(&uri("vol1"), cwd, &expected);
    server.stop();
    // Offline, then served again: all still there.
    assert_eq!(volumes(&dir, &["list"]).len(), 3);
    let server = Served::start(&dir, &cwd.join("nbd.sock"));
    reads_back(&uri("vol1"), cwd, &expected);
    fio(&uri("vol3"), cwd, &["--size=32M", "--bs=4k-64k", "--verify_only"]);
    let bad = tessera(&["volume", "create", dir.to_str().unwrap(), "no good", "--size", "1M"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("cannot be a volume's name"));
    server.stop();
}

/// `tessera iostat` reports the rates of a served array per volume and per
/// member: a write of 8 MiB during its interval shows at the volume and
/// on the members (more there: parity); on a stopped array it says a
/// server is needed.
#[test]
fn iostat_shows_the_writes_of_its_interval_per_volume_and_member() {
    let (tmp, dir, server) = create_and_serve(&[]);
    let cwd = tmp.path();
    let iostat = {
        let dir = dir.clone();
        std::thread::spawn(move || tessera(&["iostat", dir.to_str().unwrap(), "4", "--count", "1"]))
    };
    std::thread::sleep(Duration::from_millis(500));
    let mut data = vec![0u8; 8 << 20];
    rand::rngs::StdRng::seed_from_u64(21).fill(&mut data[..]);
    write_export(&server.uri(), cwd, &data);
    let out = iostat.join().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let columns = |prefix: &str| -> Vec<f64> {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} line in\n{text}"));
        line.split_whitespace()
            .rev()
            .take(4)
            .map(|v| v.parse().unwrap())
            .collect()
    };
    // Columns from the right: write MB/s, read MB/s, writes/s, reads/s.
    let volume = columns("volume tessera");
    let written = volume[0] * 4.0;
    assert!((7.0..=9.0).contains(&written), "{written} MB written in\n{text}");
    let members: f64 = (0..6).map(|i| columns(&format!("member {i} "))[0]).sum();
    assert!(members * 4.0 > written * 1.2, "members wrote {members} MB/s in\n{text}");
    server.stop();
    let out = tessera(&["iostat", dir.to_str().unwrap(), "1", "--count", "1"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no server serves"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `tessera events` tells a served array's history: its opening, a member
/// failed by hand, a scrub; as JSON and as lines; and, once stopped, the
/// same read from the directory.
#[test]
fn events_tell_what_happened_since_the_array_was_opened() {
    let (tmp, dir, server) = create_and_serve(&[]);
    copy_in_and_out(&server.uri(), tmp.path(), 1 << 20, 5);
    let d = dir.to_str().unwrap();
    assert!(tessera(&["fail", d, "--device", "2"]).status.success());
    let scrub = tessera(&["scrub", d]);
    assert!(scrub.status.success(), "{}", String::from_utf8_lossy(&scrub.stderr));
    let out = tessera(&["events", d, "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let events: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let kinds: Vec<&str> = events.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["opened", "member_failed", "scrub_ended"], "{events:?}");
    assert_eq!(events[1]["member"], 2);
    assert_eq!(events[1]["by_hand"], true);
    assert!(events[2]["stripes_checked"].as_u64().unwrap() > 0, "{events:?}");
    let times: Vec<u64> = events.iter().map(|e| e["unix_ms"].as_u64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    let text = String::from_utf8(tessera(&["events", d]).stdout).unwrap();
    assert!(text.contains("member 2 (") && text.contains("failed by hand"), "{text}");
    assert!(text.contains("scrub done:"), "{text}");
    server.stop();
    // Stopped, the array's history is read from its directory, the clean
    // stop last.
    assert_eq!(event_kinds(&dir), ["opened", "member_failed", "scrub_ended", "closed"]);
}

/// `curl` of `url` with `args` more: (HTTP status, body).
fn curl(url: &str, args: &[&str], cwd: &Path) -> (u16, String) {
    let mut all = vec!["-s", "-S", "--max-time", "60", "-w", "\n%{http_code}"];
    all.extend_from_slice(args);
    all.push(url);
    let out = run("curl", &all, cwd);
    let (body, code) = out.rsplit_once('\n').unwrap();
    (code.parse().unwrap(), body.to_string())
}

/// An API request POSTed to the HTTP server at `base` with `token` (or
/// none): (HTTP status, the reply).
fn post(
    base: &str,
    request: &serde_json::Value,
    token: Option<&str>,
    extra: &[&str],
    cwd: &Path,
) -> (u16, serde_json::Value) {
    let body = serde_json::json!({"version": 1, "request": request}).to_string();
    let authorization = token.map(|t| format!("Authorization: Bearer {t}"));
    let mut args = vec![
        "-X",
        "POST",
        "-H",
        "Content-Type: application/json",
        "--data-binary",
        &body,
    ];
    if let Some(header) = &authorization {
        args.extend_from_slice(&["-H", header]);
    }
    args.extend_from_slice(extra);
    let (code, text) = curl(&format!("{base}api/v1"), &args, cwd);
    (
        code,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")),
    )
}

/// The dashboard at `url` as headless Chromium renders it once its
/// script has polled the API a few times: the DOM, and a screenshot kept
/// as `name`.png in the tests' artifacts (target/tmp).
fn browse(url: &str, name: &str, extra: &[&str], cwd: &Path) -> String {
    let common = [
        "--no-sandbox",
        "--disable-gpu",
        // Containers often give /dev/shm a few MiB only.
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--virtual-time-budget=6000",
    ];
    let mut args: Vec<&str> = common.to_vec();
    args.extend_from_slice(extra);
    let screenshot = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.png"));
    let _ = std::fs::remove_file(&screenshot);
    let shot = format!("--screenshot={}", screenshot.display());
    let mut shooting = args.clone();
    shooting.extend_from_slice(&["--window-size=1400,1100", &shot, url]);
    run("chromium-headless-shell", &shooting, cwd);
    let png = std::fs::read(&screenshot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "a screenshot of the page"
    );
    args.extend_from_slice(&["--dump-dom", url]);
    run("chromium-headless-shell", &args, cwd)
}

/// The text of the element with id `id` in `dom`, tags dropped.
fn text_of(dom: &str, id: &str) -> String {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} in the page:\n{dom}"));
    let open = dom[..at].rfind('<').unwrap();
    let tag: String = dom[open + 1..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric())
        .collect();
    let end = at + dom[at..].find(&format!("</{tag}>")).unwrap();
    let mut text = String::new();
    let mut in_tag = false;
    for c in dom[at..end].chars().skip_while(|&c| c != '>').skip(1) {
        match c {
            '<' => in_tag = true,
            '>' => {
                in_tag = false;
                text.push(' ');
            }
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The dashboard in a real browser (headless Chromium) shows a failed
/// member being rebuilt, the rebuild's progress and the history; it
/// agrees with `status`, `iostat` and `volume list` on the same array;
/// the HTTP API refuses changes without the token, and bad requests, by
/// kind, changing nothing.
#[test]
fn the_dashboard_shows_a_rebuild_under_way_and_agrees_with_status_and_iostat() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let dir = cwd.join("array");
    create(&dir, &[]);
    let address = free_address();
    let base = format!("http://{address}/");
    let token = "dashboard-test-token-0123456789";
    std::fs::write(cwd.join("token"), format!("{token}\n")).unwrap();
    let socket = cwd.join("nbd.sock");
    let server = Served::start_with(
        &dir,
        &socket,
        &[
            "--http",
            &address,
            "--http-token-file",
            cwd.join("token").to_str().unwrap(),
        ],
    );
    let d = dir.to_str().unwrap();
    // Member 2 fails, 24 MiB are written without it, and its resync is
    // slowed to 128 KiB/s (about 48 s) so that it is under way while we
    // look, however slow the machine.
    let out = tessera(&["fail", d, "--device", "2"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut data = vec![0u8; 24 << 20];
    rand::rngs::StdRng::seed_from_u64(27).fill(&mut data[..]);
    write_export(&server.uri(), cwd, &data);
    let out = tessera(&[
        "online",
        d,
        "--device",
        "2",
        "--rate",
        "128K",
        "--busy-rate",
        "128K",
        "--detach",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status = wait_for_state(&dir, 2, "rebuilding");
    assert!(!status["rebuild"].is_null(), "{status}");

    let dom = browse(&base, "dashboard-rebuilding", &[], cwd);
    let health = text_of(&dom, "health");
    assert!(health.starts_with("DEGRADED: 1 member out"), "{health}");
    assert!(dom.contains(r#"data-state="rebuilding" id="member-2""#), "{dom}");
    let jobs = text_of(&dom, "jobs");
    assert!(
        jobs.starts_with("Rebuild of member 2: ") && jobs.contains("stripes ("),
        "{jobs}"
    );
    let events = text_of(&dom, "events");
    assert!(
        events.contains("member 2 (")
            && events.contains("failed by hand")
            && events.contains("rebuild of member 2 onto"),
        "{events}"
    );

    // The CLI (control socket), the HTTP API and the page agree.
    let cli = status_json(&dir);
    let (code, http) = curl(&format!("{base}api/v1/status"), &[], cwd);
    assert_eq!(code, 200, "{http}");
    let http: serde_json::Value = serde_json::from_str(&http).unwrap();
    let http = &http["answer"]["status"];
    let iostat = tessera(&["iostat", d, "0.5", "--count", "1"]);
    assert!(iostat.status.success(), "{}", String::from_utf8_lossy(&iostat.stderr));
    let iostat = String::from_utf8_lossy(&iostat.stdout).into_owned();
    for (i, member) in cli["members"].as_array().unwrap().iter().enumerate() {
        let (name, state) = (member["name"].as_str().unwrap(), member["state"].as_str().unwrap());
        assert_eq!(http["members"][i]["name"], name);
        assert_eq!(http["members"][i]["state"], state);
        let row = text_of(&dom, &format!("member-{i}"));
        assert!(row.starts_with(&format!("{i} {name} {state} ")), "{row}");
        assert!(iostat.contains(&format!("member {i} {name} ({state})")), "{iostat}");
    }
    for field in [
        "array_uuid",
        "data",
        "parity",
        "usable_bytes",
        "mapped_bytes",
        "volumes",
    ] {
        assert_eq!(cli[field], http[field], "{field}");
    }
    assert!(text_of(&dom, "uuid") == cli["array_uuid"].as_str().unwrap());
    let listed = tessera(&["volume", "list", d]);
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    let line = listed.lines().find(|l| l.starts_with("tessera ")).unwrap();
    assert_eq!(
        text_of(&dom, "volume-tessera").split(' ').collect::<Vec<_>>(),
        line.split_whitespace().collect::<Vec<_>>(),
        "the page's volume row and `volume list`"
    );
    assert!(iostat.contains("volume tessera"), "{iostat}");

    // Changes need the token; refused ones change nothing.
    let fail3 = serde_json::json!({"fail": {"member": 3}});
    for (presented, kind) in [
        (None, "unauthorized"),
        (Some("wrong-token-wrong-token"), "unauthorized"),
    ] {
        let (code, reply) = post(&base, &fail3, presented, &[], cwd);
        assert_eq!((code, reply["error"]["kind"].as_str()), (401, Some(kind)), "{reply}");
    }
    let (code, reply) = post(
        &base,
        &serde_json::json!({"volume": {"create": {"name": "web", "bytes": 1 << 20}}}),
        Some(token),
        &[],
        cwd,
    );
    assert_eq!(code, 200, "{reply}");
    assert!(
        reply["answer"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "web"),
        "{reply}"
    );
    // Bad requests, by kind.
    let (code, reply) = curl(&format!("{base}api/v1/nothing"), &[], cwd);
    assert_eq!(code, 404, "{reply}");
    let (code, reply) = curl(&format!("{base}api/v1/metrics"), &[], cwd);
    assert!(code == 500 && reply.contains("metrics are off"), "{reply}");
    // Served without --kv: no KV spaces, and the dashboard hides them.
    let (code, reply) = curl(&format!("{base}api/v1/kv_spaces"), &[], cwd);
    assert!(
        code == 200 && reply.contains(r#""kv_spaces":{"served":false,"spaces":[]}"#),
        "{reply}"
    );
    let bodies: [(&str, u16, &str); 4] = [
        (r#"{"version":1,"request":"status","extra":1}"#, 400, "bad_request"),
        (r#"{"version":9,"request":"status"}"#, 400, "unsupported_version"),
        (
            r#"{"version":1,"request":{"fail":{"member":"three"}}}"#,
            400,
            "bad_request",
        ),
        ("not json", 400, "bad_request"),
    ];
    for (body, status, kind) in bodies {
        let (code, text) = curl(&format!("{base}api/v1"), &["-X", "POST", "--data-binary", body], cwd);
        let reply: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            (code, reply["error"]["kind"].as_str()),
            (status, Some(kind)),
            "{body}: {reply}"
        );
    }
    let big = cwd.join("big.json");
    std::fs::write(
        &big,
        format!(
            r#"{{"version":1,"request":{{"volume":{{"delete":{{"name":"{}"}}}}}}}}"#,
            "w".repeat(70_000)
        ),
    )
    .unwrap();
    let at_big = format!("@{}", big.display());
    let (code, text) = curl(
        &format!("{base}api/v1"),
        &[
            "-X",
            "POST",
            "-H",
            &format!("Authorization: Bearer {token}"),
            "--data-binary",
            &at_big,
        ],
        cwd,
    );
    assert_eq!(code, 413, "{text}");
    let after = status_json(&dir);
    assert_eq!(
        after["members"][3]["state"], "healthy",
        "a refused request changed nothing"
    );
    let names: Vec<&str> = after["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["tessera", "web"]);

    // Jobs stop when asked: the rebuild (with the CLI), then a scrub
    // (over HTTP, with the token) while its client waits for it.
    let out = tessera(&["stop", d, "rebuild"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let last = last_rebuild(&dir);
    assert!(
        last["done"] == false && last["message"].as_str().unwrap().contains("stopped at"),
        "{last}"
    );
    let out = tessera(&["stop", d, "rebuild"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no rebuild is running"),
        "{out:?}"
    );
    let scrub = {
        let d = d.to_string();
        std::thread::spawn(move || tessera(&["scrub", &d, "--rate", "64K", "--json"]))
    };
    // Running, with the time it has taken (the page's time left).
    let timed = (0..400).any(|_| {
        let running = status_json(&dir)["scrub"]["milliseconds"]
            .as_u64()
            .is_some_and(|ms| ms > 0);
        if !running {
            std::thread::sleep(Duration::from_millis(25));
        }
        running
    });
    assert!(timed, "a running scrub's report says how long it has run");
    let stop = serde_json::json!({"stop": {"job": "scrub"}});
    let (code, reply) = post(&base, &stop, None, &[], cwd);
    assert_eq!(code, 401, "{reply}");
    let (code, reply) = post(&base, &stop, Some(token), &[], cwd);
    assert_eq!((code, &reply["answer"]), (200, &serde_json::json!("done")), "{reply}");
    let out = scrub.join().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["stopped"], true, "{report}");
    server.stop();
}

/// Over HTTPS with a token: the page renders in the browser, changes need
/// the token, plain HTTP gets nowhere; and an address other than loopback
/// without TLS is refused before anything is served.
#[test]
fn the_dashboard_over_tls_with_a_token() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let dir = cwd.join("array");
    create(&dir, &[]);
    let d = dir.to_str().unwrap();
    let socket = cwd.join("nbd.sock");
    let out = tessera(&["serve", d, "--socket", socket.to_str().unwrap(), "--http", "0.0.0.0:0"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("needs TLS"), "{stderr}");
    let (pki, _) = make_certificates(cwd);
    let token = "tls-dashboard-token-abcdefghij";
    std::fs::write(cwd.join("token"), token).unwrap();
    let address = free_address();
    let (cert, key) = (pki.join("server-cert.pem"), pki.join("server-key.pem"));
    let server = Served::start_with(
        &dir,
        &socket,
        &[
            "--http",
            &address,
            "--http-tls-cert",
            cert.to_str().unwrap(),
            "--http-tls-key",
            key.to_str().unwrap(),
            "--http-token-file",
            cwd.join("token").to_str().unwrap(),
        ],
    );
    let base = format!("https://{address}/");
    let dom = browse(&base, "dashboard-tls", &["--ignore-certificate-errors"], cwd);
    assert_eq!(text_of(&dom, "health"), "HEALTHY");
    let ca = pki.join("ca-cert.pem");
    let tls = ["--cacert", ca.to_str().unwrap()];
    let scrub = serde_json::json!({"scrub": {"rate": 0}});
    let (code, reply) = post(&base, &scrub, None, &tls, cwd);
    assert_eq!(
        (code, reply["error"]["kind"].as_str()),
        (401, Some("unauthorized")),
        "{reply}"
    );
    let (code, reply) = post(&base, &scrub, Some(token), &tls, cwd);
    assert_eq!(code, 200, "{reply}");
    assert!(
        reply["answer"]["scrub"]["stripes_checked"].as_u64().is_some(),
        "{reply}"
    );
    let plain = Command::new("curl")
        .args(["-s", "--max-time", "10", &format!("http://{address}/api/v1/status")])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&plain.stdout).contains("\"answer\""),
        "plain HTTP is not answered on the TLS port"
    );
    server.stop();
}

/// The kinds of `tessera events DIR --json`, oldest first.
fn event_kinds(dir: &Path) -> Vec<String> {
    let out = tessera(&["events", dir.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let events: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let times: Vec<u64> = events.iter().map(|e| e["unix_ms"].as_u64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "oldest first: {times:?}");
    events.iter().map(|e| e["kind"].as_str().unwrap().to_string()).collect()
}

/// The history outlives the server: what one run recorded (a member
/// failed by hand, the clean stop) reads back with no server running, an
/// offline scrub adds its end, and the next run answers all of it with
/// its own opening.
#[test]
fn the_history_outlives_the_server_and_offline_commands_add_to_it() {
    let (tmp, dir, server) = create_and_serve(&[]);
    let d = dir.to_str().unwrap();
    let out = tessera(&["fail", d, "--device", "1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    server.stop();
    assert_eq!(event_kinds(&dir), ["opened", "member_failed", "closed"]);
    let out = tessera(&["scrub", d, "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        event_kinds(&dir),
        ["opened", "member_failed", "closed", "opened", "scrub_ended", "closed"]
    );
    let server = Served::start(&dir, &tmp.path().join("nbd.sock"));
    let served: Vec<String> = control(&dir, "events")
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        served,
        [
            "opened",
            "member_failed",
            "closed",
            "opened",
            "scrub_ended",
            "closed",
            "opened"
        ]
    );
    server.stop();
}
