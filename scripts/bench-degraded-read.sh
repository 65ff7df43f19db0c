#!/usr/bin/env bash
# How many bytes a degraded array reads from its members per byte a client
# reads: 8+2 on ten 1 GiB member files, 1 GiB written by fio, then
# `nbdcopy --connections=4 --requests=64 URI null:` twice healthy and three
# times with two members failed, the page cache dropped before each (needs
# root). Prints MB/s and GiB read by the server (from /proc/PID/io) per pass.
#
#   scripts/bench-degraded-read.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p tessera
tessera=$PWD/target/release/tessera
work=$(mktemp -d "${TMPDIR:-/var/tmp}/tessera-bench.XXXXXX")
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
"$tessera" create --data 8 --parity 2 --dir "$work/array" --devices 10 --device-size 1G --size 1G >/dev/null
"$tessera" serve "$work/array" --socket "$work/nbd.sock" 2>/dev/null & pid=$!
for _ in $(seq 100); do [ -S "$work/nbd.sock" ] && break; sleep 0.05; done
uri="nbd+unix:///?socket=$work/nbd.sock"
fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=16 --size=1G >/dev/null 2>&1
read_bytes() { awk '/^read_bytes/ {print $2}' "/proc/$pid/io"; }
pass() {
  sync; echo 3 >/proc/sys/vm/drop_caches
  local before start
  before=$(read_bytes); start=$(date +%s.%N)
  nbdcopy --connections=4 --requests=64 "$uri" null:
  python3 -c "print(f'{2**30 / ($(date +%s.%N) - $start) / 1e6:.0f} MB/s, {($(read_bytes) - $before) / 2**30:.2f} GiB read', end='; ')"
}
echo -n "healthy: "; pass; pass; echo
"$tessera" fail "$work/array" --device 0 >/dev/null
"$tessera" fail "$work/array" --device 1 >/dev/null
echo -n "2 of 10 failed: "; pass; pass; pass; echo
"$tessera" status "$work/array" | grep -E "^errors"
