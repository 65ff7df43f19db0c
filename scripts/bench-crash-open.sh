#!/usr/bin/env bash
# Opening after kill -9 against the stripe's width (issue 25: "at most 3 s
# after kill -9"). For each shape, each build makes an array of its own
# (4 KiB chunks, so that a few GiB fill many slots; sparse member files of
# DEVICE_SIZE), fills it with SIZE from nbdkit's pattern plugin through
# nbdcopy (4 connections, 64 requests, FLUSHed), prints what the fill cost
# (seconds, checkpoints, member bytes per client byte), is killed, and
# then opens a fresh sparse copy of its killed array ROUNDS times,
# alternating builds (`tessera status --json`: `recovery.milliseconds`,
# slots whose headers were read, stripes replayed).
#
#   [OLD=path/to/old/tessera] [TESSERA=path/to/new] [SHAPES="8+2 92+8"] \
#     [SIZE=2G] [DEVICE_SIZE=2G] [ROUNDS=3] scripts/bench-crash-open.sh
#
# Members of 4 KiB chunks take 2.5x the data on disk (a header sector a
# chunk, and parity): 92+8 with SIZE=2G needs ~5 GB a build.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
size=${SIZE:-2G}
device_size=${DEVICE_SIZE:-2G}
rounds=${ROUNDS:-3}
builds=("new=$TESSERA")
[ -n "${OLD:-}" ] && builds=("old=$OLD" "${builds[@]}")
echo "$(nproc) x $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), model $(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | xargs); $size written, 4 KiB chunks, members of $device_size"
for shape in ${SHAPES:-8+2 92+8}; do
  data=${shape%+*}
  parity=${shape#*+}
  declare -A runs=()
  for build in "${builds[@]}"; do
    name=${build%%=*}
    TESSERA=${build#*=}
    "$TESSERA" create --data "$data" --parity "$parity" --dir "$work/array" --devices $((data + parity)) \
      --device-size "$device_size" --chunk-size 4K >/dev/null
    serve
    start=$(date +%s.%N)
    nbdcopy --flush --connections=4 --requests=64 -- [ nbdkit pattern size="$size" ] "nbd+unix:///tessera?socket=$work/s.sock"
    end=$(date +%s.%N)
    fill=$("$TESSERA" status "$work/array" --json | json_expr "'%d checkpoints, %.2f member bytes a client byte' % (j['checkpoints_written'], j['member_bytes_written'] / j['user_bytes_written'])")
    kill_server
    mv "$work/array" "$work/killed-$name"
    echo "$shape $name: fill $(python3 -c "print(f'{$end - $start:.1f}')") s, $fill"
  done
  for _ in $(seq "$rounds"); do
    for build in "${builds[@]}"; do
      name=${build%%=*}
      rm -rf "$work/array"
      cp -a --sparse=always "$work/killed-$name" "$work/array"
      sync
      runs[$name]="${runs[$name]:-} $("${build#*=}" status "$work/array" --json | json_expr "'%s/%s/%s' % (j['recovery']['milliseconds'], j['recovery']['slots_scanned'], j['recovery']['stripes_replayed'])")"
    done
  done
  for build in "${builds[@]}"; do
    name=${build%%=*}
    echo "$shape $name (killed): opening ms/slots scanned/stripes replayed:${runs[$name]}"
    rm -rf "$work/killed-$name"
  done
  rm -rf "$work/array"
  unset runs
done
