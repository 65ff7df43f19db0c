#!/usr/bin/env bash
# The server's RSS against the map, for N random 4 KiB blocks written
# once (lz4, a repeated pattern: every block its own extent and mapping):
# dense over the first N x 4 KiB of the export (the default), or spread
# over all of it (SPREAD=1: fio --number_ios=N over the whole export, so
# pages hold few blocks each). Prints RSS empty, after writing, right
# after reopening (no page read yet: the places of every page's image),
# and after reading the same blocks back (each with the most it was since
# the server started), with the map's own count.
#
#   scripts/bench-map-rss.sh N                        (8+2, 64 GiB export)
#   SPREAD=1 SIZE=1T scripts/bench-map-rss.sh 1048576
#   TESSERA=/path/to/other/tessera scripts/bench-map-rss.sh N
#   MIMALLOC_ARENA_EAGER_COMMIT=1 scripts/bench-map-rss.sh N   (allocator options reach the server)
#   MIMALLOC_PURGE_DELAY=10 scripts/bench-map-rss.sh N         (mimalloc's default purge delay, not the server's 1 ms)
#   MAP_CACHE=32M scripts/bench-map-rss.sh N          (serve --map-cache)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 1 ] || { echo "usage: $0 BLOCKS" >&2; exit 2; }
n=$1
size=${SIZE:-64G}
source scripts/bench-lib.sh
"$TESSERA" create --data 8 --parity 2 --dir "$work/array" --devices 10 --device-size 2G --compress lz4 \
  --size "$size" >/dev/null
uri="nbd+unix:///tessera?socket=$work/s.sock"
if [ -n "${SPREAD:-}" ]; then
  span=(--size="$size" --number_ios="$n")
else
  span=(--size=$(( n * 4096 )))
fi
echo "$n random 4 KiB blocks over $([ -n "${SPREAD:-}" ] && echo "all $size" || echo "the first $(( n * 4096 / 1048576 )) MiB") of $size; $(nproc) x $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)"
flags=()
[ -n "${MAP_CACHE:-}" ] && flags=(--map-cache "$MAP_CACHE")
serve "${flags[@]}"
echo "empty: $(rss_mb) MB"
fio --name=w --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=32 "${span[@]}" --randseed=5 \
    --buffer_pattern=0x5a >/dev/null 2>&1
echo "after writing: $(rss_mb) MB, at most $(peak_mb) MB"
stop_server
serve "${flags[@]}"
echo "reopened: $(rss_mb) MB"
fio --name=r --ioengine=nbd --uri="$uri" --rw=randread --bs=4k --iodepth=32 "${span[@]}" --randseed=5 \
    --output-format=json >"$work/fio.json" 2>/dev/null
echo "after reading: $(rss_mb) MB (at most $(peak_mb) MB), $(json_expr "round(j['jobs'][0]['read']['iops'])" <"$work/fio.json") IOPS"
"$TESSERA" status "$work/array" | grep -E "^map cache" | cut -c1-160
