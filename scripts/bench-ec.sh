#!/usr/bin/env bash
# The erasure-coding figures of docs/PERFORMANCE.md: Tessera against the
# system's ISA-L, in the same run, on the shapes the project is judged by.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
t=target/release/tessera
run() { echo "\$ tessera $*"; $t "$@"; echo; }
run bench ec --data 10 --parity 4 --shard-bytes 64K --working-set 896K
run bench ec --data 92 --parity 8 --shard-bytes 1M
run bench ec --data 200 --parity 16 --shard-bytes 1M
run bench ec --data 10 --parity 4 --shard-bytes 1M --working-set 256M --threads 1
run bench ec --data 10 --parity 4 --shard-bytes 1M --working-set 256M --threads 2
run bench ec --data 92 --parity 8 --shard-bytes 1M --threads 2
