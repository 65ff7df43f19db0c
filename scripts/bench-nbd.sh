#!/usr/bin/env bash
# Tessera over NBD against `nbdkit file` serving one file on the same disk,
# measured with fio in the same run: sequential 1 MiB writes and reads at
# queue depth 16, 4 KiB random reads and writes at queue depth 32, a
# whole-export nbdcopy with 4 connections x 64 requests, then reads with M
# members failed (fio, and nbdcopy against the healthy copy): once right
# after the random writes scattered the data, then, rewritten in order, in
# rounds.
#
# Reads are measured twice. "cold": the page cache is dropped before each
# server's read round (needs root), so both read from the disk: like with
# like. "warm": as the write round left the cache; nbdkit then serves much
# of it from the page cache, which Tessera (direct I/O) never uses.
#
#   [TESSERA=path/to/tessera] scripts/bench-nbd.sh [K M N] [SIZE] [ROUNDS] [direct|cached]
#
# Defaults: 8+2 on 10 members, 512M of I/O, 3 alternating rounds (median),
# direct. The two modes compare like with like:
#   direct  Tessera as it runs by default (chunk writes with O_DIRECT, so
#           freshly written data is not in the page cache) against
#           `nbdkit file cache=none` (drops the pages it writes).
#   cached  Tessera with TESSERA_NO_DIRECT_IO=1 (everything through the
#           page cache) against `nbdkit file` as it runs by default.
set -euo pipefail
cd "$(dirname "$0")/.."
k=${1:-8}; m=${2:-2}; n=${3:-10}; size=${4:-512M}; rounds=${5:-3}; mode=${6:-direct}
case "$mode" in
  direct) nbdkit_cache=none ;;
  cached) nbdkit_cache=default; export TESSERA_NO_DIRECT_IO=1 ;;
  *) echo "mode: direct or cached" >&2; exit 2 ;;
esac
# TESSERA=path runs another build (an older commit's, to compare).
if [ -z "${TESSERA:-}" ]; then cargo build --release -q -p tessera; fi
tessera=${TESSERA:-$PWD/target/release/tessera}
work=$(mktemp -d "${TMPDIR:-/var/tmp}/tessera-bench.XXXXXX")
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

# Exported as large as the region fio uses, so that nbdcopy copies what
# was written (not gigabytes of holes).
"$tessera" create --data "$k" --parity "$m" --dir "$work/array" --devices "$n" --device-size 1G --size "$size" >/dev/null
"$tessera" serve "$work/array" --socket "$work/tessera.sock" 2>"$work/serve.log" & pids+=($!)
server=$!
truncate -s "$size" "$work/reference.img"
nbdkit --foreground --unix "$work/nbdkit.sock" file "$work/reference.img" cache="$nbdkit_cache" & pids+=($!)
for s in tessera.sock nbdkit.sock; do
  for _ in $(seq 100); do [ -S "$work/$s" ] && break; sleep 0.05; done
done
tessera_uri="nbd+unix:///tessera?socket=$work/tessera.sock"
nbdkit_uri="nbd+unix:///?socket=$work/nbdkit.sock"

# MB/s of one fio job (fio's nbd engine prints a line before the JSON).
# Dirty pages are written back first, so one run's writeback does not land
# in the next run's time. With a server pid, also appends the cores that
# server kept busy during the job (its user+system time over the job's
# wall time, all threads) to $work/cores.RW.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
measure() { # uri rw [server pid]
  sync
  local before=0 start=0
  if [ -n "${3:-}" ]; then before=$(cpu_ticks "$3"); start=$(date +%s.%N); fi
  fio --name=bench --ioengine=nbd --uri="$1" --rw="$2" --bs=1M --iodepth=16 --size="$size" \
      --output-format=json 2>/dev/null >"$work/fio.json"
  if [ -n "${3:-}" ]; then
    python3 -c "print(f'{($(cpu_ticks "$3") - $before) / $(getconf CLK_TCK) / ($(date +%s.%N) - $start):.2f}', end=' ')" \
      >>"$work/cores.$2"
  fi
  python3 -c 'import json,sys; t=open(sys.argv[1]).read(); j=json.loads(t[t.index("{"):])["jobs"][0]; print(round((j["write"]["bw_bytes"]+j["read"]["bw_bytes"])/1e6,1))' "$work/fio.json"
}
median() { tr ' ' '\n' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# Empties the page cache, so the next read comes from the disk.
drop_cache() { sync; echo 3 >/proc/sys/vm/drop_caches; }
if ! (drop_cache) 2>/dev/null; then
  echo "cannot drop the page cache (not root?): cold reads are skipped" >&2
  drop_cache() { return 1; }
fi

# MB/s of a whole-export copy to nowhere with many requests in flight
# (nbdcopy --connections=4 --requests=64), as clients that read in
# parallel do.
nbdcopy_read() { # uri
  local bytes start
  bytes=$(nbdinfo --size "$1")
  start=$(date +%s.%N)
  nbdcopy --connections=4 --requests=64 "$1" null:
  python3 -c "print(round($bytes / ($(date +%s.%N) - $start) / 1e6, 1))"
}
# IOPS of 4 KiB random I/O at queue depth 32 over the first 1 GiB, for 5 s.
iops() { # uri rw
  sync
  fio --name=bench --ioengine=nbd --uri="$1" --rw="$2" --bs=4k --iodepth=32 --size=1G \
      --time_based --runtime=5 --randseed=3 --output-format=json 2>/dev/null >"$work/fio.json"
  python3 -c 'import json,sys; t=open(sys.argv[1]).read(); j=json.loads(t[t.index("{"):])["jobs"][0]; print(round(j["write"]["iops"]+j["read"]["iops"]))' "$work/fio.json"
}

declare -A runs
for round in $(seq "$rounds"); do
  runs[tessera_write]+="$(measure "$tessera_uri" write "$server") "
  runs[nbdkit_write]+="$(measure "$nbdkit_uri" write) "
  runs[tessera_read]+="$(measure "$tessera_uri" read "$server") "
  runs[nbdkit_read]+="$(measure "$nbdkit_uri" read) "
  if drop_cache; then
    runs[tessera_cold]+="$(measure "$tessera_uri" read "$server") "
    drop_cache
    runs[nbdkit_cold]+="$(measure "$nbdkit_uri" read) "
  fi
  runs[tessera_copy]+="$(nbdcopy_read "$tessera_uri") "
done
for round in $(seq "$rounds"); do
  # Random reads from the disk for both (nbdkit's cold round above left
  # its file in the page cache).
  drop_cache || true
  runs[tessera_randread]+="$(iops "$tessera_uri" randread) "
  drop_cache || true
  runs[nbdkit_randread]+="$(iops "$nbdkit_uri" randread) "
  runs[tessera_randwrite]+="$(iops "$tessera_uri" randwrite) "
  runs[nbdkit_randwrite]+="$(iops "$nbdkit_uri" randwrite) "
done
# Random writes scatter every block of the first GiB over the log; a
# degraded read of that is the worst case, measured once as it is, then
# the GiB is written again in order (as the healthy reads above read it)
# before the degraded rounds.
for i in $(seq 0 $((m - 1))); do "$tessera" fail "$work/array" --device "$i" >/dev/null; done
drop_cache || true
runs[scattered_degraded]="$(measure "$tessera_uri" read "$server")"
measure "$tessera_uri" write >/dev/null
for round in $(seq "$rounds"); do
  runs[degraded_read]+="$(measure "$tessera_uri" read "$server") "
  if drop_cache; then runs[degraded_cold]+="$(measure "$tessera_uri" read "$server") "; fi
  runs[degraded_copy]+="$(nbdcopy_read "$tessera_uri") "
done

med() { echo ${runs[$1]:-0} | median; }
tw=$(med tessera_write); nw=$(med nbdkit_write)
tr_=$(med tessera_read); nr=$(med nbdkit_read); dr=$(med degraded_read)
tc=$(med tessera_cold); nc=$(med nbdkit_cold); dc=$(med degraded_cold)
ratio() { python3 -c "print(f'{$1/$2:.2f}' if $2 else '-')"; }
echo "fio, 1 MiB sequential, QD16, $size per run, median of $rounds; Tessera $k+$m on $n file members ($mode) vs nbdkit file cache=$nbdkit_cache"
printf "%-36s %10s %10s %8s\n" "" "tessera" "nbdkit" "ratio"
printf "%-36s %10s %10s %8s\n" "write MB/s" "$tw" "$nw" "$(ratio "$tw" "$nw")"
printf "%-36s %10s %10s %8s\n" "read MB/s, cold" "$tc" "$nc" "$(ratio "$tc" "$nc")"
printf "%-36s %10s %10s %8s\n" "read MB/s, warm" "$tr_" "$nr" "$(ratio "$tr_" "$nr")"
printf "%-36s %10s %10s %8s\n" "read, $m members failed MB/s, cold" "$dc" "(healthy)" "$(ratio "$dc" "$tc")"
printf "%-36s %10s %10s %8s\n" "read, $m members failed MB/s, warm" "$dr" "(healthy)" "$(ratio "$dr" "$tr_")"
trr=$(med tessera_randread); nrr=$(med nbdkit_randread); trw=$(med tessera_randwrite); nrw=$(med nbdkit_randwrite)
tcp=$(med tessera_copy); dcp=$(med degraded_copy)
printf "%-36s %10s %10s %8s\n" "4K random read IOPS, QD32" "$trr" "$nrr" "$(ratio "$trr" "$nrr")"
printf "%-36s %10s %10s %8s\n" "4K random write IOPS, QD32" "$trw" "$nrw" "$(ratio "$trw" "$nrw")"
printf "%-36s %10s %10s %8s\n" "nbdcopy 4x64 read MB/s" "$tcp" "" ""
printf "%-36s %10s %10s %8s\n" "nbdcopy 4x64, $m failed MB/s" "$dcp" "(healthy)" "$(ratio "$dcp" "$tcp")"
sdr=$(med scattered_degraded)
printf "%-36s %10s %10s %8s\n" "read, $m failed, after random writes" "$sdr" "(healthy)" "$(ratio "$sdr" "$tc")"
for key in tessera_write nbdkit_write tessera_cold nbdkit_cold tessera_read nbdkit_read degraded_cold degraded_read \
    tessera_randread nbdkit_randread tessera_randwrite nbdkit_randwrite tessera_copy degraded_copy scattered_degraded; do
  echo "runs $key: ${runs[$key]:-}"
done
echo "Tessera server cores busy (of $(nproc)), writes: $(cat "$work/cores.write"); reads (healthy, then degraded): $(cat "$work/cores.read")"
"$tessera" status "$work/array" | tail -3
