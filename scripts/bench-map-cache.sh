#!/usr/bin/env bash
# Random 4 KiB reads with the whole map cached and with a cache much
# smaller than the map (issue 25: "with the cache at 1/8 of the map, random
# reads at least 0.5x of fully cached"), for one build or two alternating.
#
#   scripts/bench-map-cache.sh [ROUNDS]                 (default 3)
#   OLD=/path/to/old/tessera scripts/bench-map-cache.sh 3   (A/B, alternating)
#   BLOCKS=2M CACHE=3M scripts/bench-map-cache.sh        (the defaults)
#
# An 8+2 array on 10 sparse member files (lz4, exported 64 GiB), one per build, gets
# BLOCKS distinct 4 KiB blocks written at random (fio, QD32; a repeated
# byte pattern, so each is its own small compressed extent); 2 M blocks
# make a map of about 24 MiB, 8x the 3 MiB cache. Then, for each round and
# build: `serve` with the whole map cached (default --map-cache), then with
# --map-cache CACHE, each time two passes of 20 s of random 4 KiB reads
# over the written blocks (QD32); IOPS of each pass are printed.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
blocks=$(numfmt --from=iec "${BLOCKS:-2M}")
cache=${CACHE:-3M}
export SOCKET_WAIT_S=60
source scripts/bench-lib.sh
builds=("new=$TESSERA")
[ -z "${OLD:-}" ] || builds=("old=$OLD" "new=$TESSERA")
uri="nbd+unix:///tessera?socket=$work/s.sock"
# Each build fills an array of its own, made by itself (builds of two
# format versions cannot share one); $work/array points at the one served.
for build in "${builds[@]}"; do
  name=${build%%=*}
  ${build#*=} create --data 8 --parity 2 --dir "$work/array-$name" --devices 10 --device-size 2G --compress lz4 \
    --size 64G >/dev/null
  ln -sfn "array-$name" "$work/array"
  TESSERA=${build#*=} serve
  fio --name=fill --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=32 --size=$((blocks * 4096)) \
      --randseed=5 --buffer_pattern=0x5a >"$work/fio.log" 2>&1 || { cat "$work/fio.log" >&2; exit 1; }
  stop_server
done
echo "$(nproc) x $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo); $blocks blocks written at random"
for round in $(seq "$rounds"); do
  for build in "${builds[@]}"; do
    name=${build%%=*}
    ln -sfn "array-$name" "$work/array"
    for flags in "" "--map-cache $cache"; do
      TESSERA=${build#*=} serve $flags
      iops=""
      for pass in 1 2; do
        fio --name=read --ioengine=nbd --uri="$uri" --rw=randread --bs=4k --iodepth=32 --size=$((blocks * 4096)) \
            --time_based --runtime=20 --output-format=json >"$work/fio.log" 2>&1 || { cat "$work/fio.log" >&2; exit 1; }
        iops="$iops${iops:+ }$(json_expr "round(j['jobs'][0]['read']['iops'])" <"$work/fio.log")"
      done
      stop_server
      echo "round $round  $name  ${flags:-whole map cached}  read IOPS: $iops"
    done
  done
done
