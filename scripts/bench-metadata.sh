#!/usr/bin/env bash
# What the map costs as it grows (issue 25's targets): the server's RAM,
# opening time after a clean stop and after kill -9, and the checkpoints
# written, against the number of randomly written 4 KiB blocks.
#
#   scripts/bench-metadata.sh [BLOCKS ...]          (default: 1M 2M 4M)
#   DATA=random scripts/bench-metadata.sh 1M        (incompressible data)
#   TESSERA=/path/to/old/tessera scripts/bench-metadata.sh 4M   (another build)
#   MAP_CACHE=8M scripts/bench-metadata.sh 1M       (`serve --map-cache 8M`)
#   SIZE=1T scripts/bench-metadata.sh 4M            (a thin export of 1 TiB)
#   SPREAD=1 SIZE=1T scripts/bench-metadata.sh 1M   (the blocks anywhere in the export:
#                                                    fio --number_ios, a map page or two each)
#
# For each count N: a new 8+2 array on 10 sparse member files, exported
# thin at 64 GiB (SIZE); fio writes N distinct 4 KiB blocks at random (each once,
# QD32) over the first N x 4 KiB (their IOPS printed); then the server's RSS; a clean stop;
# `tessera status` times the opening; a new server's RSS right after
# opening (no I/O yet), less that of the same array empty, per block (and
# what the map says it holds, per block: `map_bytes` in status); the
# server's RSS after reading every block back at random (QD32, the map
# cache filled: bounded by `--map-cache`, MAP_CACHE), and that less the
# RSS of the same array empty, per block ("read B/bl"), and the IOPS of
# that read and of a second pass like it ("read IOPS 1/2": the first
# reads every page in; with MAP_CACHE below the map, both do); a few FLUSHed
# writes and kill -9; the opening time again.
#
# By default the blocks hold a repeated byte pattern and the array
# compresses with lz4, so that 4 M blocks (16 GiB written) take ~0.5 GiB
# of the disk: every 4 KiB write is still its own extent and mapping, as
# with random data (a compressed extent carries no per-block CRCs, so its
# mapping costs a few bytes less: `DATA=random` measures that case, with
# member files large enough for it).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- 1M 2M 4M
data=${DATA:-pattern}
size=${SIZE:-64G}
# TESSERA=path/to/tessera measures another build (an older one, to compare).
export SOCKET_WAIT_S=60
source scripts/bench-lib.sh
tessera=$TESSERA

count() { numfmt --from=iec "$1"; }
# Seconds `tessera status` takes (opening the array, then closing it), and
# the recovery it reports, with the milliseconds opening took.
opening() {
  local start end
  start=$(date +%s.%N); "$tessera" status "$work/array" --json >"$work/status.json"; end=$(date +%s.%N)
  python3 - "$start" "$end" "$work/status.json" <<'PY'
import json, sys
start, end, path = sys.argv[1:]
r = json.load(open(path))["recovery"]
print(f"{float(end) - float(start):.2f} s ({r['milliseconds']} ms opening, {r['stripes_replayed']} stripes replayed, {r['slots_scanned']} slots scanned)")
PY
}
# A status field (0 where a build does not report it).
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], 0))" "$work/status.json" "$1"; }
fio_pattern() {
  if [ "$data" = random ]; then echo "--refill_buffers"; else echo "--buffer_pattern=0x5a"; fi
}

cpu=$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)
echo "8+2 on 10 sparse member files, exported $size, $data data$([ "$data" = pattern ] && echo ', lz4'); $(nproc) x $cpu"
cache_args=()
[ -z "${MAP_CACHE:-}" ] || { cache_args=(--map-cache "$MAP_CACHE"); echo "serve --map-cache $MAP_CACHE"; }
printf '%-9s %11s %8s %8s %10s %8s %9s %8s %10s %14s %9s %8s %8s %-70s %s\n' blocks "write IOPS" "RSS MB" "peak MB" "opened MB" "B/block" "map B/bl" "read MB" "read B/bl" "read IOPS 1/2" checkpts "ckpt MB" "root KB" "open after a clean stop" "open after kill -9"
for n in "$@"; do
  blocks=$(count "$n")
  rm -rf "$work/array"
  if [ "$data" = random ]; then
    device_size=$(( blocks * 4096 * 2 / 8 / 1048576 + 256 ))M
    compress=none
  else
    device_size=2G
    compress=lz4
  fi
  "$tessera" create --data 8 --parity 2 --dir "$work/array" --devices 10 --device-size "$device_size" \
    --compress "$compress" --size "$size" >/dev/null
  serve "${cache_args[@]}"
  empty=$(rss_mb)
  uri="nbd+unix:///tessera?socket=$work/s.sock"
  if [ -n "${SPREAD:-}" ]; then
    span=(--size="$size" --number_ios="$blocks" --randseed=5)
  else
    span=(--size=$(( blocks * 4096 )))
  fi
  fio --name=random --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=32 \
      "${span[@]}" $(fio_pattern) --output-format=json >"$work/fio.log" 2>&1 || { cat "$work/fio.log" >&2; exit 1; }
  write_iops=$(json_expr "round(j['jobs'][0]['write']['iops'])" <"$work/fio.log")
  rss=$(rss_mb); hwm=$(peak_mb)
  "$tessera" status "$work/array" --json >"$work/status.json"
  checkpoints=$(field checkpoints_written)
  checkpoint_mb=$(( $(field checkpoint_bytes_written) / 1048576 ))
  mapped=$(( $(field mapped_bytes) / 4096 ))
  map_per_block=$(( $(field map_bytes) / blocks ))
  [ "$mapped" -eq "$blocks" ] || echo "warning: $mapped blocks mapped, not $blocks" >&2
  stop_server
  # The root's bytes, as member 0's superblock names it.
  root_kb=$(( $(od -An -t u8 -j 160 -N 8 "$work/array/member-000") / 1024 ))
  clean=$(opening)
  serve "${cache_args[@]}"
  opened=$(rss_mb)
  read_iops=""
  for pass in 1 2; do
    fio --name=read --ioengine=nbd --uri="$uri" --rw=randread --bs=4k --iodepth=32 \
        "${span[@]}" --output-format=json >"$work/fio.log" 2>&1 || { cat "$work/fio.log" >&2; exit 1; }
    read_iops="$read_iops${read_iops:+/}$(json_expr "round(j['jobs'][0]['read']['iops'])" <"$work/fio.log")"
  done
  read_rss=$(rss_mb)
  fio --name=few --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=8 --size="${span[0]#--size=}" \
      --number_ios=2000 --fsync=64 $(fio_pattern) >/dev/null 2>&1
  kill_server
  killed=$(opening)
  printf '%-9s %11s %8d %8d %10d %8d %9s %8d %10d %14s %9s %8s %8s %-70s %s\n' "$n" "$write_iops" "$rss" "$hwm" "$opened" \
    $(( (opened - empty) * 1048576 / blocks )) "$map_per_block" "$read_rss" $(( (read_rss - empty) * 1048576 / blocks )) "$read_iops" \
    "$checkpoints" "$checkpoint_mb" "$root_kb" "$clean" "$killed"
done
