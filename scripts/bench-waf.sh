#!/usr/bin/env bash
# Write amplification of random overwrites on a full array: the volume is
# written once sequentially, then overwritten at random with 4 KiB writes
# (QD16, no FLUSH) for TIMES its size, uniform and skewed (fio zipf:1.2),
# with garbage collection's copies in stripes of their own (the default)
# and mixed into the clients' open stripes (serve --no-gc-stream), in one
# run; GC/user is bytes GC copied per client byte, ckpt/user the bytes of
# checkpoint stripes (roots and map pages) per client byte, and below each
# row what those checkpoints held by part (page images, directory pages,
# slot pages, roots), in stored bytes per client byte, how many were a
# root alone, the stripes a checkpoint took on average, and the room
# their data chunks left unused, per client byte. WAF is
# member bytes per client byte over the overwrite phase alone (the server
# restarts after the fill, which resets its counters); the full-stripe
# floor is (K+M)/K * (chunk + 4 KiB header)/chunk. Then the server is
# killed (kill -9) and `tessera status` times the opening: its whole run
# (which, after a crash, ends by writing a checkpoint of what replay
# found), and the opening alone as `status` reports it. With
# AFTER_KILL=writes, the killed array is served instead and written at
# once, as a client that was waiting would: fio's random 4 KiB writes at
# QD1 for 10 s from the moment the export answers (their latency: the
# first write garbage collection needs after opening a full array waits
# for what opening left for later), with the opening and the replay's
# pages waiting when the writes began, as the server's `status` says.
#
# CHUNK sets the chunk size (default 64K; 4K makes many slots: every
# slot page changes between checkpoints), IO the bytes overwritten
# (fio's units, e.g. 2G) in place of TIMES the volume.
#
#   [TESSERA=path/to/tessera] [PATTERNS="random zipf:1.2"] [GC_MODES="own none"] \
#     [AFTER_KILL=status|writes] [CHUNK=4K] [IO=2G] scripts/bench-waf.sh [K M N] [MEMBER_SIZE] [TIMES]
set -euo pipefail
cd "$(dirname "$0")/.."
k=${1:-8}; m=${2:-2}; n=${3:-10}; member=${4:-64M}; times=${5:-2}
chunk=${CHUNK:-64K}; chunk_bytes=$(numfmt --from=iec "$chunk")
source scripts/bench-lib.sh
uri="nbd+unix:///tessera?socket=$work/s.sock"

echo "Tessera $k+$m on $n members of $member, $chunk chunks, default exported size; random 4 KiB overwrites of ${IO:-${times}x the volume} at QD16; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "full-stripe floor: $(python3 -c "print(round(($k+$m)/$k*($chunk_bytes+4096)/$chunk_bytes,3))")"
printf "%-10s %-10s %6s %8s %8s %12s %9s %6s %9s  %s\n" "pattern" "GC stream" "WAF" "GC/user" "victims" "checkpoints" "ckpt/user" "short" "IOPS" "open after kill -9"
for dist in ${PATTERNS:-random zipf:1.2}; do
  for gc in ${GC_MODES:-own none}; do
    rm -rf "$work/array"
    "$TESSERA" create --data "$k" --parity "$m" --dir "$work/array" --devices "$n" --device-size "$member" --chunk-size "$chunk" >/dev/null
    size=$("$TESSERA" status "$work/array" --json | json_expr "j['logical_bytes']")
    serve
    fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=4 --size="$size" --output-format=json >/dev/null 2>&1
    stop_server
    gc_opt=()
    [ "$gc" = none ] && gc_opt=(--no-gc-stream)
    serve "${gc_opt[@]}"
    dist_opt=()
    [ "$dist" != random ] && dist_opt=(--random_distribution="$dist")
    # A failed write (the array full) fails the run: shown, not hidden.
    fio --name=overwrite --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=16 --size="$size" \
        --io_size="${IO:-$((size * times))}" --norandommap --randseed=3 "${dist_opt[@]}" --output-format=json \
        >"$work/fio.json" 2>/dev/null || true
    iops=$(json_expr "round(j['jobs'][0]['write']['iops']) if j['jobs'][0]['error'] == 0 else 'error ' + str(j['jobs'][0]['error'])" <"$work/fio.json")
    "$TESSERA" status "$work/array" --json | python3 -c "
import json,sys
s=json.load(sys.stdin); u=max(s['user_bytes_written'],1)
c=s.get('checkpoint_bytes_written', 0)/u
parts=s.get('checkpoint_parts', {})
stripe=($k+$m)*(4096+$chunk_bytes)
n_ckpt=max(s['checkpoints_written'],1)
alone=s['checkpoints_root_only']
stripes=s.get('checkpoint_bytes_written', 0)/stripe
open('$work/parts.txt', 'w').write('  checkpoints held, stored bytes per client byte: ' + ', '.join(f'{k.replace(\"_\", \" \")} {v/u:.4f}' for k, v in parts.items()) + f'; {alone} roots alone, {stripes/n_ckpt:.2f} stripes a checkpoint, room left unused in them {(stripes*$k*$chunk_bytes-sum(v for k, v in parts.items() if k != \"page_images_moved\"))/u:.4f}; slot pages and their deltas {(parts.get(\"slot_pages\", 0)+parts.get(\"slot_page_deltas\", 0))/max(n_ckpt-alone,1)/1e6:.2f} MB a checkpoint of pages, directory pages and their deltas {(parts.get(\"directory_pages\", 0)+parts.get(\"directory_page_deltas\", 0))/max(n_ckpt-alone,1)/1e6:.2f} MB\\n')
print(f'{\"$dist\":<10} {\"$gc\":<10} {s[\"write_amplification\"]:6.2f} {s[\"gc_bytes_relocated\"]/u:8.2f} {s[\"gc_stripes_collected\"]:8} {str(s[\"checkpoints_written\"]) + (\" (\" + str(s[\"checkpoints_dropped\"]) + \" dropped)\" if s.get(\"checkpoints_dropped\") else \"\"):>12} {c:9.3f} {s[\"short_stripes_sealed\"]:6} {\"$iops\":>9}', end='  ')"
    # Killed as a crash would, then opened: the replay the last
    # checkpoint leaves (its window's headers, the stripes newer than it).
    kill_server
    if [ "${AFTER_KILL:-status}" = writes ]; then
      start=$(date +%s%N)
      SOCKET_WAIT_S=120 serve "${gc_opt[@]}"
      for _ in $(seq 3000); do nbdinfo --size "$uri" >/dev/null 2>&1 && break; sleep 0.02; done
      answered_ms=$(( ($(date +%s%N) - start) / 1000000 ))
      "$TESSERA" status "$work/array" --json >"$work/status.json"
      fio --name=after --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=1 --time_based --runtime=10 \
          --size="$size" --norandommap --randseed=5 --output-format=json >"$work/after.json" 2>/dev/null || true
      "$TESSERA" status "$work/array" --json >"$work/status-after.json"
      stop_server
      python3 - "$answered_ms" "$work/status.json" "$work/after.json" "$work/status-after.json" <<'PY'
import json, sys
answered, before, after, later = sys.argv[1:]
# (fio's nbd engine prints a line before its JSON)
load = lambda path: (lambda t: json.loads(t[t.index("{"):]))(open(path).read())
s, j, t = load(before), load(after), load(later)
w = j["jobs"][0]["write"]
c = w["clat_ns"]
pct = lambda p: c["percentile"][p] / 1e3
r = s["recovery"]
phases = ", ".join(f"{k} {v}" for k, v in r.get("phases", {}).items() if v)
if r.get("checkpoint_error"):
    phases += f"; the checkpoint not used: {r['checkpoint_error']}"
print(f"export answered {answered} ms after serve ({r['milliseconds']} ms opening: {phases}; "
      f"{r['stripes_replayed']} stripes replayed, {r['slots_scanned']} slots scanned, {r.get('headers_read', 0)} headers read, "
      f"{s.get('replay_pages_waiting', 0)} replay pages waiting); then {w['total_ios']} writes at QD1 in 10 s: "
      f"p50 {pct('50.000000'):.0f} us, p99 {pct('99.000000'):.0f} us, p99.9 {pct('99.900000'):.0f} us, max {c['max'] / 1e6:.1f} ms; "
      f"{t.get('replay_pages_waiting', 0)} pages waiting after, fio error {j['jobs'][0]['error']}")
PY
      cat "$work/parts.txt"
      continue
    fi
    start=$(date +%s.%N)
    "$TESSERA" status "$work/array" --json >"$work/status.json"
    end=$(date +%s.%N)
    python3 - "$start" "$end" "$work/status.json" <<'PY'
import json, sys
start, end, path = sys.argv[1:]
r = json.load(open(path))["recovery"]
print(f"{float(end) - float(start):.2f} s ({r['milliseconds']} ms opening, {r['stripes_replayed']} stripes replayed, {r['slots_scanned']} slots scanned)")
PY
    cat "$work/parts.txt"
  done
done
