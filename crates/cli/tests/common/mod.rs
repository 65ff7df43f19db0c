//! Helpers shared by the CLI's integration tests (each uses some).
#![allow(dead_code)]

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
