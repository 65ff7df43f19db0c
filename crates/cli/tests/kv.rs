//! KV spaces served with Arrow Flight, tested with pyarrow's Flight client
//! (`kv_flight.py`, in the Python environment `scripts/install-test-deps.sh`
//! makes) and with `tessera kv`: inserts, bad input, finalize, queries
//! against a numpy model, a full array, and kill -9 during inserts.
use crate::common::*;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn python() -> PathBuf {
    let path = std::env::var_os("TESSERA_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-deps/venv/bin/python"));
    assert!(
        path.exists(),
        "{}: no Python with pyarrow (run scripts/install-test-deps.sh)",
        path.display()
    );
    path
}

/// `kv_flight.py ADDRESS MODE ARGS...`, to run.
fn script_command(address: &str, mode: &str, args: &[&str]) -> Command {
    let scheme = if mode == "tls" { "grpc+tls" } else { "grpc" };
    let mut command = Command::new(python());
    command
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kv_flight.py"))
        .arg(format!("{scheme}://{address}"))
        .arg(mode)
        .args(args);
    command
}

/// `kv_flight.py ADDRESS MODE ARGS...`, which must succeed: its stdout.
fn script(address: &str, mode: &str, args: &[&str]) -> String {
    let out = script_command(address, mode, args).output().unwrap();
    succeeded(&format!("kv_flight.py {mode}"), out)
}

/// A server process, killed if a test ends without stopping it.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// `tessera serve DIR --kv 127.0.0.1:0`, once it says where it serves
/// KV spaces: (the process, the address).
fn serve(dir: &Path, extra: &[&str]) -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["serve", dir.to_str().unwrap(), "--socket"])
        .arg(dir.with_extension("sock"))
        .args(["--kv", "127.0.0.1:0"])
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let address = loop {
        let line = lines
            .next()
            .expect("the server says where it serves KV spaces before it ends")
            .unwrap();
        let said = line.strip_prefix("tessera: KV spaces (Arrow Flight) at ");
        if let Some(at) = said.and_then(|s| s.strip_prefix("grpc://").or_else(|| s.strip_prefix("grpc+tls://"))) {
            break at.to_string();
        }
    };
    // The rest of its log is drained, so that it never blocks on it.
    std::thread::spawn(move || lines.for_each(drop));
    (Server(child), address)
}

/// How `child` exited, if it did within about 10 s (killed otherwise).
fn exited_within_10s(child: &mut Child) -> Option<std::process::ExitStatus> {
    for _ in 0..400 {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let _ = child.kill();
    None
}

fn stop(mut server: Server) {
    let child = &mut server.0;
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    match exited_within_10s(child) {
        Some(status) => assert!(status.success(), "tessera serve exited with {status}"),
        None => panic!("tessera serve did not stop on SIGTERM"),
    }
}

fn create(dir: &Path, device_size: &str) {
    let out = tessera(&[
        "create",
        "--data",
        "4",
        "--parity",
        "2",
        "--dir",
        dir.to_str().unwrap(),
        "--devices",
        "6",
        "--device-size",
        device_size,
    ]);
    succeeded("create", out);
}

#[test]
fn pyarrow_flight_inserts_and_queries_and_bad_input_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("array");
    create(&dir, "64M");
    // 1 MiB of sort memory: 300,000 records make many runs and a merge.
    let metrics = {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        free.local_addr().unwrap().to_string()
    };
    let (server, at) = serve(&dir, &["--kv-sort-memory", "1M", "--metrics", &metrics]);
    let said: serde_json::Value = serde_json::from_str(script(&at, "main", &[]).trim()).unwrap();
    // `tessera kv` agrees with pyarrow and numpy.
    let threshold = said["threshold"].as_f64().unwrap();
    let count = |at: &str, conditions: &str| -> u64 {
        let out = tessera(&["kv", "--at", at, "query", "p", "--where", conditions, "--count"]);
        succeeded("tessera kv query", out).trim().parse().unwrap()
    };
    let counts = &said["counts"];
    let wanted = |query: &str| counts[query].as_u64().unwrap();
    assert_eq!(
        count(&at, &format!("energy>{threshold}")),
        wanted(&format!(r#"{{"where": {{"field": "energy", "gt": {threshold}}}}}"#))
    );
    assert_eq!(
        count(&at, "id>=1000,id<1100"),
        wanted(r#"{"keys": {"ge": 1000, "lt": 1100}}"#)
    );
    let csv = succeeded(
        "kv query --get",
        tessera(&["kv", "--at", &at, "query", "p", "--get", "7"]),
    );
    assert!(csv.starts_with("id,x,y,z,ux,uy,uz,energy\n7,"), "{csv}");
    let listed = succeeded("kv status", tessera(&["kv", "--at", &at, "status"]));
    assert!(
        listed.contains("p ") && listed.contains("ready") && listed.contains("300000"),
        "{listed}"
    );
    // The operator's view lists the space too: `tessera status`, from the
    // server (the `kv_spaces` request the dashboard also polls).
    let status = succeeded("status", tessera(&["status", dir.to_str().unwrap()]));
    assert!(
        status.contains("KV spaces: 1")
            && status.contains("  p: ready, 300000 records inserted, 300000 sorted")
            && status.contains("KV batch cache: "),
        "{status}"
    );
    // And the metrics: the queries above asked some ranges twice, so the
    // batch cache has answered.
    let out = Command::new("curl")
        .args(["-s", "-S", "--max-time", "60", &format!("http://{metrics}/metrics")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let gauge = |series: &str| -> u64 {
        let line = text.lines().find(|l| l.starts_with(series));
        let line = line.unwrap_or_else(|| panic!("no {series} in\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(gauge(r#"tessera_kv_cache{kind="capacity"}"#), 256 << 20);
    assert!(gauge(r#"tessera_kv_cache{kind="hits"}"#) > 0, "{text}");
    assert!(gauge(r#"tessera_kv_cache{kind="bytes"}"#) > 0, "{text}");
    // A space's volume is no NBD export and no volume to change by hand.
    let out = tessera(&["volume", "delete", dir.to_str().unwrap(), "kv.p"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("hold KV spaces"));
    // The array full: the insert that does not fit is refused, and the
    // space still answers; dropped, its records are gone.
    script(&at, "fill", &[]);
    stop(server);
    // After a clean stop, the same answers, from the tables.
    let (server, at) = serve(&dir, &[]);
    assert_eq!(count(&at, "id>=1000,id<1100"), 100);
    stop(server);
}

#[test]
fn kill_9_during_inserts_loses_no_acknowledged_batch_and_keeps_no_half_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("array");
    create(&dir, "256M");
    for kill_after in [3u64, 9] {
        let (mut server, at) = serve(&dir, &[]);
        if kill_after == 9 {
            // The space exists from the first round: inserts go on in it.
            succeeded("kv drop", tessera(&["kv", "--at", &at, "drop", "k"]));
        }
        let mut inserter = script_command(&at, "kill-insert", &[])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut acked = 0;
        for line in BufReader::new(inserter.stdout.take().unwrap()).lines() {
            let line = line.unwrap();
            acked = line.strip_prefix("acked ").unwrap().parse::<u64>().unwrap() + 1;
            if acked == kill_after {
                server.0.kill().unwrap();
                server.0.wait().unwrap();
            }
            if acked >= kill_after {
                break;
            }
        }
        assert_eq!(acked, kill_after, "the inserts stopped early");
        let _ = inserter.wait();
        let (server, at) = serve(&dir, &[]);
        let back: serde_json::Value =
            serde_json::from_str(script(&at, "kill-check", &[&acked.to_string()]).trim()).unwrap();
        assert!(back["batches"].as_u64().unwrap() >= acked);
        stop(server);
    }
}

/// A batch as large as a gRPC message may be: more than 256 MiB once
/// framed on the volume, and still one insert (`1b47fe7` refused it as an
/// insert too large).
#[test]
fn a_batch_as_large_as_a_message_is_inserted() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("array");
    create(&dir, "200M");
    let (server, at) = serve(&dir, &[]);
    let said: serde_json::Value = serde_json::from_str(script(&at, "largest", &[]).trim()).unwrap();
    assert!(said["rows"].as_u64().unwrap() > 7_000_000, "{said}");
    stop(server);
}

#[test]
fn a_kv_address_in_use_is_refused_before_the_array_opens() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("array");
    create(&dir, "40M");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["serve", dir.to_str().unwrap(), "--socket"])
        .arg(dir.with_extension("sock"))
        .args(["--kv", &address])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("listening for KV spaces"),
        "{said}"
    );
    assert!(!said.contains("opened in"), "the array was opened first: {said}");
    // Never opened, so its last stop (create's) is still a clean one.
    let out = tessera(&["status", dir.to_str().unwrap(), "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["recovery"]["clean_stop"], true, "{status}");
}

#[test]
fn a_token_guards_the_kv_spaces_and_one_is_required_beyond_loopback() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("array");
    create(&dir, "40M");
    let token = tmp.path().join("kv-token");
    std::fs::write(&token, "s3cret-kv-token-0123\n").unwrap();
    let wrong = tmp.path().join("wrong-token");
    std::fs::write(&wrong, "s3cret-kv-token-0124\n").unwrap();
    // Beyond loopback with no token: refused before anything is opened
    // or bound (waited for at most 10 s, killed if it serves instead).
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["serve", dir.to_str().unwrap(), "--socket"])
        .arg(dir.with_extension("sock"))
        .args(["--kv", "0.0.0.0:0"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let exited = exited_within_10s(&mut child);
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        exited.is_some_and(|s| !s.success()) && said.contains("needs --kv-token-file"),
        "{said}"
    );
    // With a token: a client without it, or with another, is refused;
    // with it, served.
    let (server, at) = serve(&dir, &["--kv-token-file", token.to_str().unwrap()]);
    for extra in [&[][..], &["--token-file", wrong.to_str().unwrap()][..]] {
        let out = tessera(&[&["kv", "--at", &at][..], extra, &["status"][..]].concat());
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && said.contains("wants a token"), "{said}");
    }
    let listed = succeeded(
        "kv status with the token",
        tessera(&["kv", "--at", &at, "--token-file", token.to_str().unwrap(), "status"]),
    );
    assert!(!listed.contains("wants a token"), "{listed}");
    stop(server);
}

/// With --kv-tls-cert, KV spaces are served over TLS only: pyarrow
/// (`grpc+tls://`) and `tessera kv --tls-ca` are served, with the token
/// still asked for; a plain client, or one that does not trust the
/// server's certificate, is not.
#[test]
fn kv_spaces_are_served_over_tls_to_pyarrow_and_tessera_kv() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("array");
    create(&dir, "40M");
    let (pki, _) = make_certificates(tmp.path());
    let path = |name: &str| pki.join(name).to_str().unwrap().to_string();
    let (ca, certificate, key) = (path("ca-cert.pem"), path("server-cert.pem"), path("server-key.pem"));
    let other_key = path("ca-key.pem");
    let token = tmp.path().join("kv-token");
    std::fs::write(&token, "s3cret-kv-token-0123\n").unwrap();
    let token = token.to_str().unwrap();
    // A key that does not go with the certificate: refused before the
    // array is opened.
    let out = tessera(&[
        "serve",
        dir.to_str().unwrap(),
        "--socket",
        dir.with_extension("sock").to_str().unwrap(),
        "--kv",
        "127.0.0.1:0",
        "--kv-tls-cert",
        &certificate,
        "--kv-tls-key",
        &other_key,
    ]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("--kv-tls-key"), "{said}");
    assert!(!said.contains("opened in"), "{said}");

    let tls = [
        "--kv-tls-cert",
        &certificate,
        "--kv-tls-key",
        &key,
        "--kv-token-file",
        token,
    ];
    let (server, at) = serve(&dir, &tls);
    let found = script(&at, "tls", &[&ca, token]);
    assert!(found.contains("\"rows\": 5000"), "{found}");
    let kv = |extra: &[&str]| tessera(&[&["kv", "--at", &at, "--token-file", token][..], extra].concat());
    let counted = succeeded(
        "kv query over TLS",
        kv(&["--tls-ca", &ca, "query", "secure", "--where", "id>=0", "--count"]),
    );
    assert_eq!(counted.trim(), "5000");
    // Its records through a reader that stops after one line: no error
    // (SIGPIPE stays ignored, so the CSV writer meets a broken pipe).
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "'{}' kv --at {at} --token-file '{token}' --tls-ca '{ca}' query secure --where 'id>=0' | head -1",
            env!("CARGO_BIN_EXE_tessera")
        ))
        .output()
        .unwrap();
    let (first, said) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(first.starts_with("id,") && said.is_empty(), "{first}\n{said}");
    // A plain client is told what to give.
    let out = kv(&["status"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("wants --tls-ca"), "{said}");
    // A CA that did not sign the server's certificate.
    let out = kv(&["--tls-ca", &certificate, "status"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("invalid peer certificate"),
        "{said}"
    );
    // Nor does a name the certificate does not carry.
    let out = kv(&["--tls-ca", &ca, "--tls-server-name", "other.example", "status"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("other.example"), "{said}");
    stop(server);
}
