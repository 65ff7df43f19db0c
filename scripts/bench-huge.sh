#!/usr/bin/env bash
# A huge thin array on sparse files (issue 25's "huge arrays" target):
# `create` time and RSS, opening time and RSS, then 4 KiB random writes
# spread over the whole export through NBD (fio, verified), read back
# after a clean stop and again after kill -9.
#
#   scripts/bench-huge.sh [DEVICE_SIZE] [IOS]     (default: 8T 20000)
#   TESSERA=/path/to/tessera scripts/bench-huge.sh 1T   (another build)
#   CHUNK=4K scripts/bench-huge.sh 512G 200000   (chunk size, default 64K)
#   SERVE_FLAGS="--map-cache 64M" scripts/bench-huge.sh 512G 2000000   (flags for serve)
#
# An opening's first figure is the whole `tessera status` run: opening,
# then (after kill -9) mapping every replayed record, which a server does
# while it serves, and the close's checkpoint; the opening itself (what a
# client waits for before it is served) is printed beside it.
#
# After the writes it prints what the checkpoints held by part, in
# stored bytes per client byte, and the directory pages (with their
# deltas) a checkpoint of pages wrote: writes spread thinly over a large
# export change every directory page between checkpoints, a few entries
# each, as at 100 TiB.
#
# 4+2 on six sparse member files of DEVICE_SIZE (6 x 8 TiB: 126 million
# stripe slots, a 23.8 TiB export); the files take a few hundred MiB of
# the disk for IOS writes.
set -euo pipefail
cd "$(dirname "$0")/.."
export SOCKET_WAIT_S=60
size=${1:-8T}
ios=${2:-20000}
source scripts/bench-lib.sh
tessera=$TESSERA
opening() {
  /usr/bin/time -f '%e s, %M KB' -o "$work/time" "$tessera" status "$work/array" --json >"$work/status.json"
  python3 - "$work/time" "$work/status.json" <<'PY'
import json, sys
t = open(sys.argv[1]).read().split()
r = json.load(open(sys.argv[2]))["recovery"]
print(f"{t[0]} s, {int(t[2]) // 1024} MB max RSS ({r['slots_scanned']} slots scanned, {r['stripes_replayed']} stripes replayed;"
      f" the opening itself {r['milliseconds']} ms, {r.get('pages_mapped_later', 0)} map pages of the replay mapped after it)")
PY
}
job() {
  fio --name=huge --ioengine=nbd --uri="nbd+unix:///tessera?socket=$work/s.sock" --rw=randwrite --bs=4k \
      --iodepth=16 --size="$export" --number_ios="$ios" --randseed=42 --norandommap --verify=crc32c --verify_state_save=0 "$@" \
      >"$work/fio.log" 2>&1 || { cat "$work/fio.log" >&2; exit 1; }
}

cpu=$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)
echo "4+2 on 6 sparse files of $size, $ios random 4 KiB writes over the whole export; $(nproc) x $cpu"
/usr/bin/time -f '%e s, %M KB' -o "$work/time" "$tessera" create --data 4 --parity 2 --dir "$work/array" \
  --devices 6 --device-size "$size" --chunk-size "${CHUNK:-64K}" >"$work/create.log"
read -r seconds _ kb _ <"$work/time"
echo "create: $seconds s, $((kb / 1024)) MB max RSS; $(cat "$work/create.log")"
echo "open (new array): $(opening)"
export=$(python3 -c "import json; print(json.load(open('$work/status.json'))['logical_bytes'])")
serve ${SERVE_FLAGS:-}
echo "serve, opened: $(rss_mb) MB RSS"
job --do_verify=1
echo "after $ios writes (verified): $(rss_mb) MB RSS; $(grep -o 'IOPS=[^,]*' "$work/fio.log" | head -1);" \
  "$("$tessera" status "$work/array" --json | json_expr "'the map %d MB in memory (cache %d MB), %d pages; slot table %d MB' % (j['map_bytes'] >> 20, j['map_cache_bytes'] >> 20, j['map_pages'], j['slot_table_bytes'] >> 20)")"
"$tessera" status "$work/array" --json | python3 -c "
import json, sys
s = json.load(sys.stdin); u = max(s['user_bytes_written'], 1); p = s['checkpoint_parts']
pages = max(s['checkpoints_written'] - s['checkpoints_root_only'], 1)
dirs = p.get('directory_pages', 0) + p.get('directory_page_deltas', 0)
print(f\"checkpoints: {s['checkpoints_written']} ({s['checkpoints_root_only']} roots alone), ckpt/user {s['checkpoint_bytes_written'] / u:.3f}; held per client byte: \" + ', '.join(f\"{k.replace('_', ' ')} {v / u:.4f}\" for k, v in p.items()) + f'; directory pages and their deltas {dirs / pages / 1e6:.2f} MB a checkpoint of pages')
"
stop_server
echo "open after a clean stop: $(opening)"
serve ${SERVE_FLAGS:-}
job --verify_only
echo "read back after a clean stop: verified, $(grep -o 'READ: bw=[^(]*([^)]*), [^,]*, io=[^ ]*' "$work/fio.log")"
job --number_ios=$((ios / 10)) --randseed=43 --fsync=16 --do_verify=0
kill_server
echo "open after kill -9: $(opening)"
serve ${SERVE_FLAGS:-}
job --verify_only --randseed=42
echo "read back after kill -9 (the first writes): verified, $(grep -o 'READ: bw=[^(]*([^)]*), [^,]*, io=[^ ]*' "$work/fio.log")"
