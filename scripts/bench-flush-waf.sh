#!/usr/bin/env bash
# What FLUSH costs: write amplification (bytes written to members / bytes
# written by the client) for 4 KiB random writes with a FLUSH every N
# writes, from `tessera status`, with the intent log (the default) and
# without one (--log-size 0: FLUSH seals a short stripe), in one run.
#
#   [TESSERA=path/to/tessera] scripts/bench-flush-waf.sh [K M N] [SIZE]
set -euo pipefail
cd "$(dirname "$0")/.."
k=${1:-8}; m=${2:-2}; n=${3:-10}; size=${4:-32M}
source scripts/bench-lib.sh

echo "4 KiB random writes, $size per run, Tessera $k+$m on $n members, 64 KiB chunks"
echo "(full-stripe floor: (K+M)/K * (64K+4K)/64K = $(python3 -c "print(round(($k+$m)/$k*68/64,3))"); target with a FLUSH after every write: M+3 = $((m + 3)))"
printf "%-12s %-8s %8s %8s %8s %14s %14s %8s\n" "FLUSH every" "log" "WAF" "stripes" "log" "short stripes" "FLUSHes logged" "IOPS"
for every in 1 8 64 512 never; do
  for log in default 0; do
    rm -rf "$work/array"
    log_opt=()
    [ "$log" = 0 ] && log_opt=(--log-size 0)
    "$TESSERA" create --data "$k" --parity "$m" --dir "$work/array" --devices "$n" --device-size 256M "${log_opt[@]}" >/dev/null
    serve
    sync_opt=()
    [ "$every" != never ] && sync_opt=(--fsync="$every")
    iops=$(fio --name=waf --ioengine=nbd --uri="nbd+unix:///tessera?socket=$work/s.sock" --rw=randwrite --bs=4k \
        --iodepth=1 --size="$size" --randseed=1 "${sync_opt[@]}" --output-format=json 2>/dev/null |
      json_expr "round(j['jobs'][0]['write']['iops'])")
    "$TESSERA" status "$work/array" --json |
      python3 -c "
import json,sys
s=json.load(sys.stdin); l=s['log'] or {}
print(f'{\"$every\":<12} {\"$log\":<8} {s[\"write_amplification\"]:8.2f} {s[\"write_amplification_stripes\"]:8.2f} {s[\"write_amplification_log\"]:8.2f} {s[\"short_stripes_sealed\"]:14} {l.get(\"flushes_logged\",0):14} {$iops:8}')"
    stop_server
  done
done
