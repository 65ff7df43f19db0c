#!/usr/bin/env bash
# Runs every test of Tessera: formatting, lints (warnings are errors), and
# the unit and integration tests, against the real peers (ISA-L, ...) that
# scripts/install-test-deps.sh installs when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-test-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --release -- -D warnings
cargo test --workspace --release
