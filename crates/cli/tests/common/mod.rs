//! Helpers shared by the CLI's integration tests (each uses some).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `tessera ARGS...`, run to its end.
pub fn tessera(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .output()
        .expect("the tessera binary runs")
}

/// The standard output of a command that must have succeeded; both
/// outputs are shown if it did not.
pub fn succeeded(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `program ARGS...` run in `cwd`, which must succeed: its stdout.
pub fn run(program: &str, args: &[&str], cwd: &Path) -> String {
    let out = Command::new(program)
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap_or_else(|e| panic!("{program} must be installed (scripts/install-test-deps.sh): {e}"));
    succeeded(&format!("{program} {args:?}"), out)
}

/// Certificates laid out as qemu-nbd, nbdkit and libnbd expect: in
/// `dir/pki` the server's (for localhost) and the CA's; in `dir/client`
/// the CA's, and a client certificate signed by it.
pub fn make_certificates(dir: &Path) -> (PathBuf, PathBuf) {
    let (pki, client) = (dir.join("pki"), dir.join("client"));
    std::fs::create_dir_all(&pki).unwrap();
    std::fs::create_dir_all(&client).unwrap();
    let p = |name: &str| pki.join(name).to_str().unwrap().to_string();
    let c = |name: &str| client.join(name).to_str().unwrap().to_string();
    let key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    let mut ca = vec!["req", "-x509", "-days", "2", "-subj", "/CN=Tessera test CA"];
    ca.extend_from_slice(&key);
    let (ca_key, ca_cert) = (p("ca-key.pem"), p("ca-cert.pem"));
    ca.extend_from_slice(&["-keyout", &ca_key, "-out", &ca_cert]);
    run("openssl", &ca, dir);
    for (who, key_out, cert_out, usage) in [
        ("localhost", p("server-key.pem"), p("server-cert.pem"), "serverAuth"),
        (
            "tessera-client",
            c("client-key.pem"),
            c("client-cert.pem"),
            "clientAuth",
        ),
    ] {
        let csr = dir.join("request.csr").to_str().unwrap().to_string();
        let subject = format!("/CN={who}");
        let mut request = vec!["req", "-subj", &subject, "-keyout", &key_out, "-out", &csr];
        request.extend_from_slice(&key);
        run("openssl", &request, dir);
        let extensions = dir.join("extensions.cnf");
        std::fs::write(
            &extensions,
            format!("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage={usage}\n"),
        )
        .unwrap();
        run(
            "openssl",
            &[
                "x509",
                "-req",
                "-days",
                "2",
                "-in",
                &csr,
                "-CA",
                &ca_cert,
                "-CAkey",
                &ca_key,
                "-CAcreateserial",
                "-out",
                &cert_out,
                "-extfile",
                extensions.to_str().unwrap(),
            ],
            dir,
        );
    }
    std::fs::copy(&ca_cert, client.join("ca-cert.pem")).unwrap();
    (pki, client)
}
