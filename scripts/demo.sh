#!/usr/bin/env bash
# Tessera's main job, for now: erasure-code a file into 10 data + 4 parity
# shards, lose 4 of them, rebuild them, and check the file comes back
# byte for byte; then measure the codec against ISA-L.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-test-deps.sh
cargo build --release --quiet
tessera=target/release/tessera
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

head -c $((40 << 20)) /dev/urandom > "$work/file"
echo "split a 40 MiB file into 10 data shards"
split -n 10 -d -a 1 "$work/file" "$work/shards."
mkdir "$work/shards"
for i in $(seq 0 9); do mv "$work/shards.$i" "$work/shards/$i"; done

$tessera ec encode --data 10 --parity 4 "$work/shards"
echo "lose shards 0, 3, 9 and 12"
rm "$work/shards/0" "$work/shards/3" "$work/shards/9" "$work/shards/12"
$tessera ec decode --data 10 --parity 4 "$work/shards"
cat $(for i in $(seq 0 9); do echo "$work/shards/$i"; done) | cmp - "$work/file"
echo "the file came back byte for byte"
echo
$tessera bench ec --data 10 --parity 4 --shard-bytes 64K --working-set 896K
