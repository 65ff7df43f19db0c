#!/usr/bin/env bash
# Two builds of tessera alternating in one loop, so that the machine's
# drift lands on both alike: round by round, OLD then NEW, each on a fresh
# array, and each result printed as it comes.
#
#   scripts/bench-ab.sh OLD NEW degraded [ROUNDS]   (default 3 rounds)
#   scripts/bench-ab.sh OLD NEW fastlog [ROUNDS]    (default 4 rounds)
#   scripts/bench-ab.sh OLD NEW random [ROUNDS]     (default 3 rounds)
#   scripts/bench-ab.sh OLD NEW seq [ROUNDS]        (default 3 rounds)
#
# degraded: 8+2 on ten 1 GiB files, 1 GiB written by fio, two healthy
#   passes of `nbdcopy --connections=4 --requests=64 URI null:`, members 0
#   and 1 failed with `tessera fail`, three degraded passes; the page cache
#   dropped before each pass (needs root). MB/s per pass.
# fastlog: 8+2 on ten 256 MiB files with the intent log on a 64 MiB tmpfs
#   device, fio 4 KiB randwrite QD1 --fsync=1 for 8 s; IOPS, and the
#   server's CPU ticks (user + system) over its life.
# random: 8+2 on ten 1 GiB files, fio 4 KiB randwrite QD32 over 2 GiB
#   (every block once: 524,288 map entries in 1,024 full pages), then
#   4 KiB randread QD32 for 15 s; IOPS of each, and the server's CPU
#   ticks over its life.
# seq: 4+2 on six 1 GiB member files written first (`create --preallocate`),
#   `nbdcopy --connections=4 --requests=64` of 1.5 GiB of random bytes from
#   /dev/shm; MB/s, and the server's CPU time (user + system, from its
#   start to the copy's end) per byte written: what the write path costs in
#   CPU, which a disk-bound rate hides.
# With PERF=DIR (random and seq), each round's server runs under
# `perf record -F 999` while it is measured (DIR/ROUND-old|new.data), and
# the share of its samples in CRC code and its five leading symbols are
# printed.
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 OLD NEW degraded|fastlog|random|seq [ROUNDS]" >&2; exit 2; }
old=$1; new=$2; mode=$3
case "$mode" in
  degraded) rounds=${4:-3} ;;
  fastlog) rounds=${4:-4} ;;
  random) rounds=${4:-3} ;;
  seq) rounds=${4:-3} ;;
  *) echo "mode: degraded, fastlog, random or seq" >&2; exit 2 ;;
esac
work=""; fast=""; pid=""; bytes_file=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$work" "$fast" "$bytes_file"; }
trap cleanup EXIT

serve() { # tessera
  "$1" serve "$work/array" --socket "$work/s.sock" 2>/dev/null & pid=$!
  for _ in $(seq 200); do [ -S "$work/s.sock" ] && return; sleep 0.05; done
  echo "no socket" >&2; exit 1
}
stop() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""; }
# MB/s of one pass of nbdcopy over 1 GiB, from a cold page cache.
copy_mbs() {
  sync; echo 3 >/proc/sys/vm/drop_caches
  local start end
  start=$(date +%s.%N)
  nbdcopy --connections=4 --requests=64 "nbd+unix:///?socket=$work/s.sock" null:
  end=$(date +%s.%N)
  python3 -c "print(round(1024 / ($end - $start)))"
}

# With PERF set, the server under `perf record` until `perf_stop`.
perf=""
perf_start() {
  [ -n "${PERF:-}" ] || return 0
  mkdir -p "$PERF"
  perf record -F 999 -p "$pid" -o "$PERF/$round-$which.data" >/dev/null 2>&1 & perf=$!
  sleep 0.5
}
perf_stop() {
  [ -n "$perf" ] || return 0
  kill -INT "$perf"; wait "$perf" || true; perf=""
  perf report -i "$PERF/$round-$which.data" --no-children --sort symbol --stdio 2>/dev/null |
    awk '/^ +[0-9.]+%/ {n++; if (n <= 5) top = top sprintf("%s %s; ", $1, $3)
                         if (tolower($0) ~ /crc/) {sub("%", "", $1); c += $1}}
         END {printf "round %s %s: %.1f%% of the server\x27s samples in CRC code; leading: %s\n", r, w, c, top}' \
      r="$round" w="$which"
}

# fio's IOPS for direction $1, from its JSON on stdin.
json_iops() {
  python3 -c "import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index('{'):]); print(round(j['jobs'][0]['$1']['iops']))"
}

if [ "$mode" = seq ]; then
  # The same random bytes for every round, made before any is timed.
  bytes_file=$(mktemp /dev/shm/tessera-ab-seq.XXXXXX)
  head -c 1536M /dev/urandom >"$bytes_file"
fi
echo "$mode: $old against $new, $rounds rounds; $(nproc) x $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)"
for round in $(seq "$rounds"); do
  for which in old new; do
    tessera=${!which}
    work=$(mktemp -d "${TMPDIR:-/var/tmp}/tessera-ab.XXXXXX")
    case "$mode" in
      degraded)
        "$tessera" create --data 8 --parity 2 --dir "$work/array" --devices 10 --device-size 1G --size 1G >/dev/null
        serve "$tessera"
        fio --name=fill --ioengine=nbd --uri="nbd+unix:///?socket=$work/s.sock" --rw=write --bs=1M \
            --iodepth=16 --size=1G >/dev/null 2>&1
        healthy="$(copy_mbs) $(copy_mbs)"
        "$tessera" fail --device 0 "$work/array" >/dev/null
        "$tessera" fail --device 1 "$work/array" >/dev/null
        degraded="$(copy_mbs) $(copy_mbs) $(copy_mbs)"
        echo "round $round $which: healthy MB/s $healthy; 2 members failed MB/s $degraded"
        ;;
      fastlog)
        fast=$(mktemp -d /dev/shm/tessera-ab.XXXXXX)
        "$tessera" create --data 8 --parity 2 --dir "$work/array" --devices 10 --device-size 256M \
          --log-device "$fast/log" --log-size 64M >/dev/null
        serve "$tessera"
        iops=$(fio --name=fsync --ioengine=nbd --uri="nbd+unix:///tessera?socket=$work/s.sock" --rw=randwrite \
            --bs=4k --iodepth=1 --fsync=1 --size=128M --time_based --runtime=8 --randseed=7 --output-format=json \
            2>/dev/null | python3 -c "import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index('{'):]); print(round(j['jobs'][0]['write']['iops']))")
        ticks=$(awk '{print $14 + $15}' "/proc/$pid/stat")
        echo "round $round $which: $iops IOPS, server CPU ticks $ticks"
        ;;
      random)
        "$tessera" create --data 8 --parity 2 --dir "$work/array" --devices 10 --device-size 1G --size 4G >/dev/null
        serve "$tessera"
        perf_start
        uri="nbd+unix:///?socket=$work/s.sock"
        write=$(fio --name=w --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=32 --size=2G \
            --randseed=7 --output-format=json 2>/dev/null | json_iops write)
        read=$(fio --name=r --ioengine=nbd --uri="$uri" --rw=randread --bs=4k --iodepth=32 --size=2G \
            --time_based --runtime=15 --randseed=9 --output-format=json 2>/dev/null | json_iops read)
        ticks=$(awk '{print $14 + $15}' "/proc/$pid/stat")
        perf_stop
        echo "round $round $which: randwrite $write IOPS, randread $read IOPS, server CPU ticks $ticks"
        ;;
      seq)
        "$tessera" create --data 4 --parity 2 --dir "$work/array" --devices 6 --device-size 1G \
          --preallocate >/dev/null 2>&1
        serve "$tessera"
        perf_start
        start=$(date +%s.%N)
        nbdcopy --connections=4 --requests=64 "$bytes_file" "nbd+unix:///tessera?socket=$work/s.sock"
        end=$(date +%s.%N)
        ticks=$(awk '{print $14 + $15}' "/proc/$pid/stat")
        perf_stop
        python3 -c "b = 1536 << 20; t = $end - $start; c = $ticks / 100
print(f'round $round $which: {b / t / 1e6:.0f} MB/s, server CPU {c:.2f} s, {c / b * 1e9:.2f} ns a byte')"
        ;;
    esac
    stop
    rm -rf "$work" "$fast"; work=""; fast=""
  done
done
