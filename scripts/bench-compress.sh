#!/usr/bin/env bash
# Inline compression's cost to writers: the same fio sequential write (1 MiB,
# queue depth 16, over NBD) to two arrays of the same layout on the same
# disk, one without compression and one with CODEC, in alternating rounds,
# with data fio makes about 2:1 compressible and with incompressible data.
#
#   scripts/bench-compress.sh [CODEC] [SIZE] [ROUNDS]
#
# Defaults: zstd:1, 1G per run, 3 rounds (medians). 8+2 on ten 1 GiB
# member files each, 64 KiB chunks, direct I/O.
set -euo pipefail
cd "$(dirname "$0")/.."
codec=${1:-zstd:1}; size=${2:-1G}; rounds=${3:-3}
cargo build --release -q -p tessera
tessera=$PWD/target/release/tessera
work=$(mktemp -d "${TMPDIR:-/var/tmp}/tessera-bench.XXXXXX")
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

declare -A pid
for name in plain packed; do
  compress=none; [ "$name" = packed ] && compress=$codec
  "$tessera" create --data 8 --parity 2 --dir "$work/$name" --devices 10 --device-size 1G \
    --size "$size" --compress "$compress" >/dev/null
  "$tessera" serve "$work/$name" --socket "$work/$name.sock" 2>"$work/$name.log" & pids+=($!)
  pid[$name]=$!
done
for name in plain packed; do
  for _ in $(seq 100); do [ -S "$work/$name.sock" ] && break; sleep 0.05; done
done

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# MB/s of one fio write (and the server's busy cores appended to
# $work/cores.NAME.KIND); KIND is "half" (about 2:1) or "random".
measure() { # name kind
  local extra=() before start
  [ "$2" = half ] && extra=(--buffer_compress_percentage=50 --buffer_compress_chunk=4k --refill_buffers)
  sync
  before=$(cpu_ticks "${pid[$1]}"); start=$(date +%s.%N)
  fio --name=bench --ioengine=nbd --uri="nbd+unix:///?socket=$work/$1.sock" --rw=write --bs=1M \
      --iodepth=16 --size="$size" "${extra[@]}" --output-format=json 2>/dev/null >"$work/fio.json"
  python3 -c "print(f'{($(cpu_ticks "${pid[$1]}") - $before) / $(getconf CLK_TCK) / ($(date +%s.%N) - $start):.2f}', end=' ')" \
    >>"$work/cores.$1.$2"
  python3 -c 'import json,sys; t=open(sys.argv[1]).read(); j=json.loads(t[t.index("{"):])["jobs"][0]; print(round(j["write"]["bw_bytes"]/1e6,1))' "$work/fio.json"
}
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

declare -A runs
for round in $(seq "$rounds"); do
  for kind in half random; do
    for name in plain packed; do runs[$name.$kind]+="$(measure "$name" "$kind") "; done
  done
done

echo "fio, 1 MiB sequential writes, QD16, $size per run, median of $rounds; 8+2 on 10 file members, none vs $codec"
printf "%-28s %10s %10s %8s\n" "" "none" "$codec" "ratio"
for kind in half random; do
  p=$(echo "${runs[plain.$kind]}" | median); c=$(echo "${runs[packed.$kind]}" | median)
  label="write MB/s, 2:1 data"; [ "$kind" = random ] && label="write MB/s, random data"
  printf "%-28s %10s %10s %8s\n" "$label" "$p" "$c" "$(python3 -c "print(f'{$c/$p:.2f}')")"
done
for key in plain.half packed.half plain.random packed.random; do
  echo "runs $key: ${runs[$key]} (server cores busy: $(cat "$work/cores.$key"))"
done
for name in plain packed; do
  "$tessera" status "$work/$name" 2>/dev/null | grep -iE "stored|compress|physical" | sed "s/^/$name: /" || true
done
