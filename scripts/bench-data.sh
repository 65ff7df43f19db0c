#!/usr/bin/env bash
# The checksum and compression figures of docs/PERFORMANCE.md, each against
# its reference tool in the same run. Random input for "random" rows.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
t=target/release/tessera
random=$(mktemp)
trap 'rm -f "$random"' EXIT
head -c $((64 << 20)) /dev/urandom > "$random"
echo "\$ tessera bench hash"; $t bench hash; echo
for codec in lz4 zstd:1 zstd:3 deflate:6 snappy; do
  echo "\$ tessera bench compress --codec $codec"; $t bench compress --codec "$codec"; echo
  echo "\$ tessera bench compress --codec $codec --input RANDOM_64MiB"; $t bench compress --codec "$codec" --input "$random"; echo
done
