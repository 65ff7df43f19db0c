#!/usr/bin/env bash
# Runs every test of Tessera: formatting, lints (warnings are errors), and
# the unit and integration tests, against the real peers (ISA-L, ...) that
# scripts/install-test-deps.sh installs when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-test-deps.sh
# The GPU backend's kernels are compiled by NVRTC in the tests (a GPU is not
# needed for that); its absence is then a failure, not a skip.
export LD_LIBRARY_PATH="$PWD/target/test-deps/nvrtc/nvidia/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TESSERA_REQUIRE_NVRTC=1
export TESSERA_PYTHON="$PWD/target/test-deps/venv/bin/python"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --release -- -D warnings
cargo test --workspace --release
# The simulation again with every seal and hash going through the batching
# that sits in front of a GPU (on the CPU backend here), one batch at a time.
# (`--workspace`, not `-p tessera-array`: the dependencies' features are
# then the ones built above, and nothing is built again. The array's
# integration tests are one binary, `array`; `simulation::` picks the
# simulation's.)
TESSERA_ACCEL_BATCH=1 cargo test --workspace --release --test array simulation::
# The erasure code's kernels for aarch64 (NEON), checked byte for byte
# against the reference under qemu-aarch64 (the crate's own tests; ISA-L's
# comparisons need the x86 library and run above).
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
cargo clippy -p tessera-ec --lib --release --target aarch64-unknown-linux-gnu -- -D warnings
cargo test -p tessera-ec --lib --release --target aarch64-unknown-linux-gnu
