#!/usr/bin/env bash
# Rebuild and resync speed on a served array, against the members' own
# sequential write speed and the client's speed without a rebuild, in one
# run (same disk, same minute):
#
#   1. fio sequential 1 MiB direct writes of one member's size to a file
#      beside the members: the member's sequential write speed.
#   2. The array filled, member 2 failed, `replace --with` a new file with
#      no rate limit and no clients: rebuild MiB/s (bytes written to the
#      new member) and its ratio to 1.
#   3. A client writing sequentially (fio 1 MiB QD16, SECONDS s) without a
#      rebuild, then with one started (default --busy-rate): the client's
#      ratio, and how far the rebuild got meanwhile.
#   4. Member 3 failed, 1% of the volume rewritten, `replace` on its own
#      device: the resync's time against step 2's full rebuild.
#
#   [TESSERA=path/to/tessera] scripts/bench-rebuild.sh [K M N] [MEMBER_SIZE] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
k=${1:-4}; m=${2:-2}; n=${3:-6}; member=${4:-256M}; seconds=${5:-10}
source scripts/bench-lib.sh
uri="nbd+unix:///tessera?socket=$work/s.sock"
bytes=$(numfmt --from=iec "$member")

echo "Tessera $k+$m on $n members of $member, 64 KiB chunks; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
seq_mib=$(fio --name=seq --filename="$work/seq.img" --rw=write --bs=1M --size="$member" --direct=1 --end_fsync=1 \
  --output-format=json 2>/dev/null | json_expr "round(j['jobs'][0]['write']['bw']/1024,1)")
rm -f "$work/seq.img"
echo "member sequential write (fio 1 MiB direct, $member): $seq_mib MiB/s"

"$TESSERA" create --data "$k" --parity "$m" --dir "$work/array" --devices "$n" --device-size "$member" >/dev/null
size=$("$TESSERA" status "$work/array" --json | json_expr "j['logical_bytes']")
serve
fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=4 --size="$size" --end_fsync=1 \
  --output-format=json >/dev/null 2>&1
"$TESSERA" fail "$work/array" --device 2 >/dev/null
# The rebuild's own time (from its start to its last stripe), as it reports it.
seconds_of() { grep -o 'in [0-9.]* s' "$1" | awk '{print $2}'; }
"$TESSERA" replace "$work/array" --device 2 --with "$work/new-2.img" --rate 0 >"$work/replace.txt" 2>/dev/null
full=$(seconds_of "$work/replace.txt")
written=$(grep -o '([0-9.]* [KMG]iB)' "$work/replace.txt" | head -1 | tr -d '()B ' | numfmt --from=iec-i)
rebuild_mib=$(echo "scale=1; $written / 1048576 / $full" | bc)
echo "rebuild, idle: $(cut -d';' -f1 "$work/replace.txt"); $rebuild_mib MiB/s = $(echo "scale=2; $rebuild_mib / $seq_mib" | bc)x the member's sequential write"

client() {
  fio --name=client --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=16 --size="$size" --time_based \
    --runtime="$seconds" --output-format=json 2>/dev/null | json_expr "round(j['jobs'][0]['write']['bw']/1024,1)"
}
alone=$(client)
"$TESSERA" fail "$work/array" --device 4 >/dev/null
"$TESSERA" replace "$work/array" --device 4 --with "$work/new-4.img" --detach >/dev/null
with=$(client)
progress=$("$TESSERA" status "$work/array" --json | json_expr "'%d of %d stripes' % (j['rebuild']['stripes_done'], j['rebuild']['stripes_total']) if j['rebuild'] else 'done'")
echo "client sequential write: alone $alone MiB/s, during a rebuild $with MiB/s = $(echo "scale=2; $with / $alone" | bc)x; the rebuild got $progress in those $seconds s"
# Let the rebuild end (no client now: full speed).
for _ in $(seq 600); do
  [ "$("$TESSERA" status "$work/array" --json | json_expr "j['members'][4]['state']")" = healthy ] && break
  sleep 0.5
done

"$TESSERA" fail "$work/array" --device 3 >/dev/null
fio --name=one-percent --ioengine=nbd --uri="$uri" --rw=randwrite --bs=64k --iodepth=16 --size="$size" \
  --io_size=$((size / 100)) --end_fsync=1 --output-format=json >/dev/null 2>&1
"$TESSERA" replace "$work/array" --device 3 --rate 0 >"$work/resync.txt" 2>/dev/null
resync=$(seconds_of "$work/resync.txt")
echo "resync after 1% rewritten: $(cut -d';' -f1 "$work/resync.txt"); $(echo "scale=3; $resync / $full" | bc)x the full rebuild's time"
stop_server
