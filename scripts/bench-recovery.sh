#!/usr/bin/env bash
# How long opening an array takes (recovery), after a clean stop and after
# kill -9, on a file-backed array with data written through NBD.
#
#   scripts/bench-recovery.sh [K M N] [DEVICE_SIZE] [WRITTEN]
#
# Defaults: 8+2 on 10 members of 1G, 4G written with fio (1 MiB sequential).
# Times `tessera status DIR` (open, recover, report), page cache warm and,
# where this user may drop it, cold. TESSERA_OLD=path/to/tessera also times
# another build on the same array (e.g. one without checkpoints).
set -euo pipefail
cd "$(dirname "$0")/.."
k=${1:-8}; m=${2:-2}; n=${3:-10}; device_size=${4:-1G}; written=${5:-4G}
cargo build --release -q -p tessera
tessera=$PWD/target/release/tessera
work=$(mktemp -d "${TMPDIR:-/var/tmp}/tessera-recovery.XXXXXX")
server=
cleanup() { [ -n "$server" ] && kill -9 "$server" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

serve() {
  rm -f "$work/s.sock"
  "$tessera" serve "$work/array" --socket "$work/s.sock" >/dev/null 2>>"$work/serve.log" &
  server=$!
  for _ in $(seq 200); do [ -S "$work/s.sock" ] && return; sleep 0.05; done
  echo "server did not start" >&2; cat "$work/serve.log" >&2; exit 1
}
cold() { sync; if echo 3 2>/dev/null >/proc/sys/vm/drop_caches; then echo cold; else echo warm; fi; }
timed() { # label binary
  local cache=$3 start end
  start=$(date +%s.%N); "$2" status "$work/array" --json >"$work/status.json"; end=$(date +%s.%N)
  python3 - "$1" "$cache" "$start" "$end" "$work/status.json" <<'PY'
import json, sys
label, cache, start, end, path = sys.argv[1:]
r = json.load(open(path)).get("recovery")
line = f"{label:<34} {cache:<5} {float(end) - float(start):7.2f} s"
if r:
    checkpoint = r.get('checkpoint_sequence')
    line += (f"   checkpoint {'none' if checkpoint is None else checkpoint:>6}, {r['slots_scanned']:>6} slots scanned, "
             f"{r['stripes_replayed']:>5} stripes replayed, recovery {r['milliseconds']} ms")
    if r.get('checkpoint_error'):
        line += f" ({r['checkpoint_error']})"
print(line)
PY
}

"$tessera" create --data "$k" --parity "$m" --dir "$work/array" --devices "$n" --device-size "$device_size" >/dev/null
serve
fio --name=fill --ioengine=nbd --uri="nbd+unix:///tessera?socket=$work/s.sock" --rw=write --bs=1M \
    --iodepth=16 --size="$written" >/dev/null 2>&1
slots=$(python3 -c "import json,sys; print(json.loads(sys.argv[1])['stripes_total'])" "$("$tessera" status "$work/array" --json)")
echo "Tessera $k+$m on $n members of $device_size ($slots slots), $written written; time of \`tessera status\`:"
kill -9 "$server"; wait "$server" 2>/dev/null || true; server=
timed "after kill -9" "$tessera" "$(cold)"
timed "again (warm)" "$tessera" warm
serve; kill -TERM "$server"; wait "$server" 2>/dev/null || true; server=
timed "after a clean stop" "$tessera" "$(cold)"
timed "again (warm)" "$tessera" warm
if [ -n "${TESSERA_OLD:-}" ]; then
  timed "$(basename "$(dirname "$TESSERA_OLD")")/tessera (other build)" "$TESSERA_OLD" "$(cold)" || true
  timed "  again (warm)" "$TESSERA_OLD" warm || true
fi
