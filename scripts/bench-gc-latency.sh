#!/usr/bin/env bash
# Write latency while garbage collection works: a 4+2 array of six sparse
# member files (DEVICE_SIZE, default 1G; chunks of CHUNK, default 64K), FILL percent of its export
# (default 90) written sequentially by fio (1 MiB, QD8; its rate and
# latency printed), then fio 4 KiB random writes over that range at QD
# (default 4) for SECONDS (default 40). Prints fio's completion latency
# (p50, p99, p99.9, max, and the share of writes past each ms bound),
# then what the array counted: GC rounds and bytes relocated,
# checkpoints, how long writers waited for the members and for a free
# slot (summed over writers), the stripes written to the next window's
# slots while a checkpoint was written, and how long FLUSHes waited for
# that checkpoint.
#
#   scripts/bench-gc-latency.sh
#   QD=1 SECONDS_RUN=20 scripts/bench-gc-latency.sh     (checkpoints, little GC)
#   SECONDS_RUN=0 scripts/bench-gc-latency.sh           (the fill alone)
#   FSYNC=64 SECONDS_RUN=0 scripts/bench-gc-latency.sh  (a FLUSH every 64 writes of the fill)
#   TESSERA=path scripts/bench-gc-latency.sh            (another build)
#   CHUNK=4K DEVICE_SIZE=4G FILL=100 SECONDS_RUN=60 scripts/bench-gc-latency.sh
#                                                       (524,031 slots: GC's choice of victims
#                                                        on many used slots)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
size=${DEVICE_SIZE:-1G} chunk=${CHUNK:-64K} fill_pct=${FILL:-90} qd=${QD:-4} seconds=${SECONDS_RUN:-40} fsync=${FSYNC:-0}
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; $TESSERA"
"$TESSERA" create --data 4 --parity 2 --dir "$work/array" --devices 6 --device-size "$size" --chunk-size "$chunk" >/dev/null
serve
uri="nbd+unix:///tessera?socket=$work/s.sock"
export_bytes=$(nbdinfo --size "$uri")
fill=$(( export_bytes * fill_pct / 100 / 1048576 ))M
fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1m --iodepth=8 --size="$fill" --fsync="$fsync" --output-format=json |
  json_expr "(lambda w: 'fill: %.0f MB/s; clat p50 %.1f ms, p99 %.1f ms, max %.0f ms' % (w['bw_bytes'] / 1e6, w['clat_ns']['percentile']['50.000000'] / 1e6, w['clat_ns']['percentile']['99.000000'] / 1e6, w['clat_ns']['max'] / 1e6))(j['jobs'][0]['write'])"
[ "$seconds" -gt 0 ] && fio --name=overwrite --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth="$qd" --size="$fill" \
  --time_based --runtime="$seconds" --randrepeat=0 --output-format=json |
  json_expr "(lambda w, lm: '%d writes, %.0f IOPS; clat p50 %.0f us, p99 %.0f us, p99.9 %.0f us, max %.1f ms\nwrites past each bound (ms: %%): %s' % (w['total_ios'], w['iops'], w['clat_ns']['percentile']['50.000000'] / 1e3, w['clat_ns']['percentile']['99.000000'] / 1e3, w['clat_ns']['percentile']['99.900000'] / 1e3, w['clat_ns']['max'] / 1e6, {k: round(v, 3) for k, v in lm.items() if v > 0}))(j['jobs'][0]['write'], j['jobs'][0]['latency_ms'])"
"$TESSERA" status "$work/array" --json |
  json_expr "'GC rounds %d, %d MB relocated; checkpoints %d; writers waited %d ms for the members, %d ms for a slot; %d stripes sealed early, FLUSHes waited %d ms for a checkpoint' % (j['gc_rounds'], j['gc_bytes_relocated'] / 1e6, j['checkpoints_written'], j['writers_waited_for_members_ms'], j['writers_waited_for_slot_ms'], j.get('stripes_sealed_early', 0), j.get('flushes_waited_for_checkpoint_ms', 0))"
stop_server
