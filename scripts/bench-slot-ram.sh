#!/usr/bin/env bash
# What the slot table costs in RAM: a 4+2 array of 4 KiB chunks (16 KiB
# of data a stripe, so many used slots for the bytes written) filled
# sequentially through NBD, then served again by each build in turn
# (the builds must read the same format): RSS once every slot page is
# read after opening, against the used slots. The map's pages are read
# only when needed, so what opening holds is mostly the slot table.
#
#   scripts/bench-slot-ram.sh [DEVICE_SIZE] [FILL] [ROUNDS]   (default 4G 12G 2)
#   OLD=/path/to/old/tessera TESSERA=/path/to/new/tessera scripts/bench-slot-ram.sh ...
#
# Without OLD only TESSERA (or this tree's release build) is measured.
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:-4G}
fill=${2:-12G}
rounds=${3:-2}
source scripts/bench-lib.sh
builds=("$TESSERA")
[ -n "${OLD:-}" ] && builds=("$OLD" "$TESSERA")

cpu=$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)
echo "4+2 of 4 KiB chunks on 6 sparse files of $size, $fill written sequentially; $(nproc) x $cpu"
"$TESSERA" create --data 4 --parity 2 --dir "$work/array" --devices 6 --device-size "$size" --chunk-size 4K >/dev/null
serve
fio --name=fill --ioengine=nbd --uri="nbd+unix:///tessera?socket=$work/s.sock" --rw=write --bs=1M \
  --iodepth=8 --size="$fill" >"$work/fio.log" 2>&1 || { cat "$work/fio.log" >&2; exit 1; }
echo "filled: $(grep -o 'WRITE: bw=[^(]*([^)]*), [^,]*, io=[^ ]*' "$work/fio.log")"
stop_server

# Serves with build $1 until every slot page is read; prints the used
# slots and the RSS then.
loaded() {
  TESSERA=$1 serve
  for _ in $(seq 600); do
    status=$("$1" status "$work/array" --json)
    [ "$(json_expr "j['slot_pages_unread']" <<<"$status")" = 0 ] && break
    sleep 0.1
  done
  used=$(json_expr "j['stripes_used']" <<<"$status")
  table=$(json_expr "j.get('slot_table_bytes', 0) // 1000000" <<<"$status")
  echo "$used used slots, $(rss_mb) MB RSS once every slot page is read (the slot table's own count: $table MB; 0 where a build does not report it)"
  stop_server
}

for round in $(seq "$rounds"); do
  order=("${builds[@]}")
  if [ $((round % 2)) = 0 ]; then order=($(printf '%s\n' "${builds[@]}" | tac)); fi
  for build in "${order[@]}"; do
    echo "round $round, $build: $(loaded "$build")"
  done
done
