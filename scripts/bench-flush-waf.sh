#!/usr/bin/env bash
# What sealing short stripes on FLUSH costs: write amplification (bytes
# written to members / bytes written by the client) for 4 KiB random
# writes with a FLUSH every N writes, from `tessera status`.
#
#   scripts/bench-flush-waf.sh [K M N] [SIZE]
set -euo pipefail
cd "$(dirname "$0")/.."
k=${1:-8}; m=${2:-2}; n=${3:-10}; size=${4:-32M}
cargo build --release -q -p tessera
tessera=$PWD/target/release/tessera
work=$(mktemp -d "${TMPDIR:-/var/tmp}/tessera-waf.XXXXXX")
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

echo "4 KiB random writes, $size per run, Tessera $k+$m on $n members, 64 KiB chunks"
echo "(full-stripe floor: (K+M)/K * (64K+4K)/64K = $(python3 -c "print(round(($k+$m)/$k*68/64,3))"))"
printf "%-22s %8s %14s\n" "FLUSH every" "WAF" "short stripes"
for every in 1 8 64 512 never; do
  rm -rf "$work/array"
  "$tessera" create --data "$k" --parity "$m" --dir "$work/array" --devices "$n" --device-size 256M >/dev/null
  "$tessera" serve "$work/array" --socket "$work/s.sock" 2>/dev/null & pid=$!
  for _ in $(seq 100); do [ -S "$work/s.sock" ] && break; sleep 0.05; done
  sync_opt=()
  [ "$every" != never ] && sync_opt=(--fsync="$every")
  fio --name=waf --ioengine=nbd --uri="nbd+unix:///tessera?socket=$work/s.sock" --rw=randwrite --bs=4k \
      --iodepth=1 --size="$size" --randseed=1 "${sync_opt[@]}" >/dev/null 2>&1
  "$tessera" status "$work/array" --json |
    python3 -c "import json,sys; s=json.load(sys.stdin); print(f'{\"$every\":<22} {s[\"write_amplification\"]:8.2f} {s[\"short_stripes_sealed\"]:14}')"
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
done
