#!/usr/bin/env bash
# What clients see while a replay is mapped after kill -9: an 8+2 array
# on ten sparse DEVICE_SIZE member files (default 4G, 64 KiB chunks, a
# 1 TiB thin export) written by fio at random (4 KiB, QD32, fsync every
# 256 writes) for RANDOM_S seconds (default 55), then killed. In each of
# ROUNDS rounds (default 3), each build serves a fresh sparse copy and
# fio reads 4 KiB at random at QD1 for 2 s at once (while the background
# thread maps the replay), then the ms from `serve` until `status` shows
# no replayed record waiting, then 2 s more of the same reads.
#
#   [OLD=path/to/old/tessera] [TESSERA=path] [RANDOM_S=55] [ROUNDS=3] scripts/bench-replay-latency.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
builds=()
[ -n "${OLD:-}" ] && builds+=("old=$OLD")
builds+=("new=$TESSERA")
uri="nbd+unix:///tessera?socket=$work/s.sock"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"

"$TESSERA" create --data 8 --parity 2 --dir "$work/array" --devices 10 --device-size "${DEVICE_SIZE:-4G}" \
  --chunk-size 64K --size 1T --compress none >/dev/null
serve
fio --name=random --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=32 --refill_buffers \
  --norandommap --randrepeat=0 --fsync=256 --time_based --runtime="${RANDOM_S:-55}" --output=/dev/null
kill_server
mv "$work/array" "$work/killed"

# fio's random 4 KiB reads at QD1 for 2 s: its completion latency.
reads() {
  fio --name=r --ioengine=nbd --uri="$uri" --rw=randread --bs=4k --iodepth=1 --time_based --runtime=2 \
    --randrepeat=0 --output-format=json |
    json_expr "(lambda r: '%d reads, p50 %.0f us, p99 %.0f us, p99.9 %.0f us, max %.1f ms' % (r['total_ios'], r['clat_ns']['percentile']['50.000000'] / 1e3, r['clat_ns']['percentile']['99.000000'] / 1e3, r['clat_ns']['percentile']['99.900000'] / 1e3, r['clat_ns']['max'] / 1e6))(j['jobs'][0]['read'])"
}

waiting() { "$TESSERA_NOW" status "$work/array" --json | json_expr "j.get('replay_pages_waiting', 0)"; }

for round in $(seq "${ROUNDS:-3}"); do
  for build in "${builds[@]}"; do
    TESSERA_NOW=${build#*=}
    rm -rf "$work/array"
    cp -a --sparse=always "$work/killed" "$work/array"
    sync
    t0=$(date +%s%N)
    TESSERA=$TESSERA_NOW SOCKET_WAIT_S=60 serve
    for _ in $(seq 1500); do nbdinfo --size "$uri" >/dev/null 2>&1 && break; sleep 0.02; done
    at_start=$(waiting)
    while_mapping=$(reads)
    for _ in $(seq 1200); do [ "$(waiting)" = 0 ] && break; sleep 0.05; done
    done_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    after=$(reads)
    kill_server
    echo "round $round ${build%%=*}: while mapping ($at_start pages waiting at first): $while_mapping"
    echo "round $round ${build%%=*}: no record waits $done_ms ms after serve; after: $after"
  done
done
