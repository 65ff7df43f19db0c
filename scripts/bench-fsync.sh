#!/usr/bin/env bash
# Small synchronous writes: fio 4 KiB random writes at queue depth 1 with
# a FLUSH after each (--fsync=1), as a database or a VM's journal does,
# against `nbdkit file cache=none` serving one file on the same disk, in
# one run: Tessera with its intent log on the members (the default),
# with the log on a dedicated log device in tmpfs (standing in for a fast
# SSD or NVDIMM in front of the members), and without one (--log-size 0:
# each FLUSH seals a short stripe). Rounds alternate the servers; the
# median IOPS of each is printed with the ratio to nbdkit.
#
#   [TESSERA=path/to/tessera] scripts/bench-fsync.sh [K M N] [SECONDS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
k=${1:-8}; m=${2:-2}; n=${3:-10}; seconds=${4:-10}; rounds=${5:-3}
source scripts/bench-lib.sh
fast=$(mktemp -d /dev/shm/tessera-fsync.XXXXXX)
scratch+=("$fast")
size=256M

# IOPS of one fio run against the NBD server on $work/s.sock.
fio_iops() {
  fio --name=fsync --ioengine=nbd --uri="nbd+unix:///$1?socket=$work/s.sock" --rw=randwrite --bs=4k \
      --iodepth=1 --fsync=1 --size=128M --time_based --runtime="$seconds" --randseed=7 \
      --output-format=json 2>/dev/null | json_expr "round(j['jobs'][0]['write']['iops'])"
}

run_nbdkit() {
  rm -f "$work/s.sock" "$work/file"
  truncate -s "$size" "$work/file"
  nbdkit --foreground --unix "$work/s.sock" file "$work/file" cache=none 2>/dev/null & pid=$!
  wait_socket
  fio_iops ""
  stop_server
}

run_tessera() {
  rm -rf "$work/array" "$work/s.sock" "$fast/log"
  "$TESSERA" create --data "$k" --parity "$m" --dir "$work/array" --devices "$n" --device-size "$size" "$@" >/dev/null
  serve
  fio_iops tessera
  stop_server
}

echo "fio randwrite 4k QD1 --fsync=1, ${seconds}s a run, $rounds rounds; Tessera $k+$m on $n files; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
declare -a nbdkit log fastlog nolog
for r in $(seq "$rounds"); do
  nbdkit+=("$(run_nbdkit)")
  log+=("$(run_tessera)")
  fastlog+=("$(run_tessera --log-device "$fast/log" --log-size 64M)")
  nolog+=("$(run_tessera --log-size 0)")
  echo "round $r: nbdkit file cache=none ${nbdkit[-1]}, tessera (log on members) ${log[-1]}, (log device in tmpfs) ${fastlog[-1]}, (no log) ${nolog[-1]} IOPS"
done
median() { printf "%s\n" "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
a=$(median "${nbdkit[@]}"); b=$(median "${log[@]}"); d=$(median "${fastlog[@]}"); c=$(median "${nolog[@]}")
python3 -c "print(f'median IOPS: nbdkit {$a}; tessera: log on members {$b} ({$b/$a:.2f}x), log device in tmpfs {$d} ({$d/$a:.2f}x), no log {$c} ({$c/$a:.2f}x)')"
