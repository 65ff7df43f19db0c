#!/usr/bin/env bash
# Opening after a clean stop against the slots in use: an 8+2 array of 4
# KiB chunks (32 KiB stripes, so that a few GiB fill many slots) on 10
# sparse 8 GiB member files, filled with SIZE by nbdcopy from nbdkit's
# pattern plugin, stopped cleanly, then opened by `tessera status --json`
# once to warm the page cache and five times timed (its
# `recovery.milliseconds`, with the slot pages it left for later and
# those the root names, and the slots used); then the peak RSS of one
# more `status`. Builds alternate for each size; each array is made by
# the build that opens it (the format may differ).
#
# With KILL=1 the server is killed (kill -9) after the fill, which
# nbdcopy FLUSHes, instead of stopped, for each of SHAPES (default 8+2;
# K+M members of DEVICE_SIZE, default 8G): one killed array a size, made
# by the last build, and ROUNDS (default 5) rounds in which each build in
# turn opens a fresh sparse copy of it (an opening leaves a checkpoint
# behind it, so the next one would be after a clean stop); with OWN=1,
# each build makes and opens its own (the window a checkpoint takes is
# the writer's), and what its fill cost is printed (seconds, checkpoints,
# member bytes a client byte). Members of 4 KiB chunks take 2.5x the
# data on disk (a header sector a chunk): 4G needs ~25 GB; OWN=1 that
# much a build. With RANDOM_S=seconds, the array is instead exported thin
# at SIZE and written by fio at random (4 KiB, QD32, fsync every 256
# writes, incompressible) for that long, then killed: the window full of
# writes each in a map page of its own (CHUNK sets the chunk size,
# default 4K). Each opening also prints the map pages read in and the
# reads of map stripes that brought them, and how long reading the chunk
# headers, mapping the records and replaying the intent log took
# (`recovery.phases`; '-' for a build that does not time them), and
# after the slots scanned the chunk headers read, for a build that
# counts them (`recovery.headers_read`), and the stripes taken as whole
# on M+1 of them (`recovery.stripes_whole_on_m_plus_1`). With FULL=1 (and RANDOM_S), the export is not thin: the
# default export is filled whole by nbdcopy first, so that the window's
# slots hold older stripes on the members rather than holes (a full
# array's opening; SIZE is then only a label). Then (unless SERVED=0:
# a full array's copies are many GB each) each build serves one more fresh
# copy in each round: the milliseconds until `nbdinfo` answers, and until
# `status` shows no replayed record waiting to be mapped
# (`replay_pages_waiting`; a build without it maps them all before
# serving). With KILL_LATE=1 (and RANDOM_S), fio goes on after RANDOM_S
# and the server is killed late in a window: 80% of the interval between
# the last two checkpoints after the last, so that more of the window's
# slots hold stripes written since the checkpoint. With WRITES_AFTER=1
# (and SERVED), each served copy is written at once, as a client that
# was waiting would write: fio random 4 KiB writes at QD1 for 10 s from
# the moment `nbdinfo` answers, and their longest and p99.9 latency
# printed beside the milliseconds to serve and the opening's own (on a
# full array the first writes need garbage collected while the replay's
# records wait); the openings by `status` are then not made.
#
#   [KILL=1 [OWN=1] [SHAPES="8+2 92+8"] [DEVICE_SIZE=8G] [ROUNDS=5] [RANDOM_S=55 [CHUNK=64K] [FULL=1] [KILL_LATE=1]] [WRITES_AFTER=1]] \
#     OLD=path/to/old/tessera [TESSERA=path/to/new] scripts/bench-open.sh [SIZE ...]   (default: 2G 8G)
#
# e.g. the window after random writes over a 1 TiB export:
#   KILL=1 RANDOM_S=55 CHUNK=64K DEVICE_SIZE=4G ROUNDS=3 OLD=... scripts/bench-open.sh 1T
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -gt 0 ]; then sizes=("$@"); else sizes=(2G 8G); fi
if [ -z "${TESSERA:-}" ]; then
  cargo build --release -q -p tessera
  TESSERA=$PWD/target/release/tessera
fi
builds=("new=$TESSERA")
[ -n "${OLD:-}" ] && builds=("old=$OLD" "${builds[@]}")
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), model $(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | xargs)"
if [ "${KILL:-0}" = 1 ]; then
  device_size=${DEVICE_SIZE:-8G}
  chunk=${CHUNK:-4K}
  echo "killed after the fill; $chunk chunks, members of $device_size, sparse$([ -n "${RANDOM_S:-}" ] && echo ", ${RANDOM_S} s of random 4 KiB writes"); $cpu"
  for shape in ${SHAPES:-8+2}; do
    data=${shape%+*}
    parity=${shape#*+}
    for size in "${sizes[@]}"; do
      (
        source scripts/bench-lib.sh
        makers=("${builds[-1]}")
        [ "${OWN:-0}" = 1 ] && makers=("${builds[@]}")
        for build in "${makers[@]}"; do
          TESSERA=${build#*=}
          thin=()
          [ -n "${RANDOM_S:-}" ] && thin=(--size "$size" --compress none)
          [ "${FULL:-0}" = 1 ] && thin=(--compress none)
          "$TESSERA" create --data "$data" --parity "$parity" --dir "$work/array" --devices $((data + parity)) \
            --device-size "$device_size" --chunk-size "$chunk" "${thin[@]}" >/dev/null
          serve
          start=$(date +%s.%N)
          if [ "${FULL:-0}" = 1 ]; then
            export_bytes=$("$TESSERA" status "$work/array" --json | json_expr "j['logical_bytes']")
            nbdcopy --flush --connections=4 --requests=64 -- [ nbdkit pattern size="$export_bytes" ] "nbd+unix:///tessera?socket=$work/s.sock"
          fi
          if [ -n "${RANDOM_S:-}" ] && [ "${KILL_LATE:-0}" = 1 ]; then
            # Killed late in a window: fio goes on past RANDOM_S while the
            # checkpoints are watched, and the server is killed, fio still
            # writing, 80% of the interval between the last two after the
            # last.
            fio --name=random --ioengine=nbd --uri="nbd+unix:///tessera?socket=$work/s.sock" --rw=randwrite --bs=4k \
              --iodepth=32 --refill_buffers --norandommap --randrepeat=0 --fsync=256 --time_based --runtime=$((RANDOM_S + 600)) \
              --output=/dev/null 2>/dev/null & fio_pid=$!
            sleep "$RANDOM_S"
            checkpoints() { "$TESSERA" status "$work/array" --json | json_expr "j['checkpoints_written']"; }
            seen=() last=$(checkpoints)
            for _ in $(seq 6000); do
              now=$(checkpoints)
              if [ "$now" != "$last" ]; then seen+=("$(date +%s.%N)"); last=$now; fi
              [ "${#seen[@]}" -ge 3 ] && break
              sleep 0.1
            done
            [ "${#seen[@]}" -ge 3 ] || { echo "no three checkpoints within 10 minutes" >&2; exit 1; }
            sleep "$(python3 -c "print(0.8 * (${seen[2]} - ${seen[1]}))")"
            echo "killed $(python3 -c "print(f'{0.8 * (${seen[2]} - ${seen[1]}):.1f}')") s after a checkpoint (the one before came $(python3 -c "print(f'{${seen[2]} - ${seen[1]}:.1f}')") s before it)"
          elif [ -n "${RANDOM_S:-}" ]; then
            fio --name=random --ioengine=nbd --uri="nbd+unix:///tessera?socket=$work/s.sock" --rw=randwrite --bs=4k \
              --iodepth=32 --refill_buffers --norandommap --randrepeat=0 --fsync=256 --time_based --runtime="$RANDOM_S" \
              --output=/dev/null
          else
            nbdcopy --flush --connections=4 --requests=64 -- [ nbdkit pattern size="$size" ] "nbd+unix:///tessera?socket=$work/s.sock"
          fi
          end=$(date +%s.%N)
          fill=$("$TESSERA" status "$work/array" --json | json_expr "'%d checkpoints, %.2f member bytes a client byte' % (j['checkpoints_written'], j['member_bytes_written'] / j['user_bytes_written'])")
          kill_server
          [ -n "${fio_pid:-}" ] && { wait "$fio_pid" 2>/dev/null || true; fio_pid=""; }
          mv "$work/array" "$work/killed-${build%%=*}"
          echo "$shape $size ${build%%=*}: fill $(python3 -c "print(f'{$end - $start:.1f}')") s, $fill"
        done
        declare -A runs=() served=()
        # Milliseconds from `serve` until nbdinfo answers, and until no
        # replayed record waits to be mapped.
        served_ms() {
          local t0 t1 t2 waiting
          TESSERA=$1
          t0=$(date +%s%N)
          serve
          for _ in $(seq 1500); do
            nbdinfo --size "nbd+unix:///tessera?socket=$work/s.sock" >/dev/null 2>&1 && break
            sleep 0.02
          done
          t1=$(date +%s%N)
          local wrote=""
          if [ "${WRITES_AFTER:-0}" = 1 ]; then
            wrote=$("$TESSERA" status "$work/array" --json | json_expr "'/%s ms opening, %s pages waiting' % (j['recovery']['milliseconds'], j.get('replay_pages_waiting', 0))")
            fio --name=after --ioengine=nbd --uri="nbd+unix:///tessera?socket=$work/s.sock" --rw=randwrite --bs=4k \
              --iodepth=1 --time_based --runtime=10 --norandommap --randseed=5 --output-format=json \
              >"$work/after.json" 2>/dev/null || true
            wrote="$wrote/$(json_expr "(lambda w, e: '%d writes, max %.0f ms, p99.9 %.0f us, error %s' % (w['total_ios'], w['clat_ns']['max'] / 1e6, w['clat_ns']['percentile']['99.900000'] / 1e3, e))(j['jobs'][0]['write'], j['jobs'][0]['error'])" <"$work/after.json")"
          fi
          for _ in $(seq 1200); do
            waiting=$("$TESSERA" status "$work/array" --json | json_expr "j.get('replay_pages_waiting', 0)")
            [ "$waiting" = 0 ] && break
            sleep 0.05
          done
          t2=$(date +%s%N)
          kill_server
          echo "$(( (t1 - t0) / 1000000 ))/$(( (t2 - t0) / 1000000 ))$wrote"
        }
        for _ in $(seq "${ROUNDS:-5}"); do
          for build in "${builds[@]}"; do
            maker=${builds[-1]%%=*}
            [ "${OWN:-0}" = 1 ] && maker=${build%%=*}
            if [ "${WRITES_AFTER:-0}" != 1 ]; then
              rm -rf "$work/array"
              cp -a --sparse=always "$work/killed-$maker" "$work/array"
              sync
              runs[$build]="${runs[$build]:-} $("${build#*=}" status "$work/array" --json | json_expr "'%s/%s%s/%s/%s/%s/%s/%s/%s/%s/%s/%s' % (j['recovery']['milliseconds'], j['recovery']['slots_scanned'], ' (%s headers%s)' % (j['recovery']['headers_read'], ', %s whole on M+1' % j['recovery']['stripes_whole_on_m_plus_1'] if 'stripes_whole_on_m_plus_1' in j['recovery'] else '') if 'headers_read' in j['recovery'] else '', j['recovery']['stripes_replayed'], j['recovery'].get('slot_pages_deferred', '-'), j['recovery'].get('slot_pages', '-'), j['map_page_misses'], j.get('map_page_reads', '-'), j['recovery'].get('phases', {}).get('headers', '-'), j['recovery'].get('phases', {}).get('mapping', '-'), j['recovery'].get('pages_mapped_later', '-'), j['recovery'].get('phases', {}).get('log', '-'))")"
            fi
            [ "${SERVED:-1}" = 1 ] || continue
            rm -rf "$work/array"
            cp -a --sparse=always "$work/killed-$maker" "$work/array"
            sync
            served[$build]="${served[$build]:-} $(served_ms "${build#*=}")"
          done
        done
        for build in "${builds[@]}"; do
          [ "${WRITES_AFTER:-0}" = 1 ] || echo "$shape $size ${build%%=*} (killed): opening ms/slots scanned/stripes replayed/slot pages left for later/named/map pages read in/reads of map stripes/headers ms/mapping ms/map pages mapped after opening/intent log's replay ms:${runs[$build]}"
          echo "$shape $size ${build%%=*} (killed, served): ms to serve/ms until no replayed record waits$([ "${WRITES_AFTER:-0}" = 1 ] && echo " (after 10 s of writes)/opening/writes at QD1, longest, p99.9"):${served[$build]:-}"
        done
      )
    done
  done
  exit 0
fi
echo "8+2, 4 KiB chunks, 10 x 8 GiB sparse members; $cpu"
for size in "${sizes[@]}"; do
  for build in "${builds[@]}"; do
    (
      export TESSERA=${build#*=}
      source scripts/bench-lib.sh
      "$TESSERA" create --data 8 --parity 2 --dir "$work/array" --devices 10 --device-size 8G --chunk-size 4K >/dev/null
      serve
      nbdcopy --connections=4 --requests=64 -- [ nbdkit pattern size="$size" ] "nbd+unix:///tessera?socket=$work/s.sock"
      stop_server
      "$TESSERA" status "$work/array" --json >/dev/null
      runs=""
      for _ in 1 2 3 4 5; do
        runs="$runs $("$TESSERA" status "$work/array" --json | json_expr "'%s/%s/%s/%s' % (j['recovery']['milliseconds'], j['recovery'].get('slot_pages_deferred', '-'), j['recovery'].get('slot_pages', '-'), j['stripes_used'])")"
      done
      peak=$(/usr/bin/time -f %M "$TESSERA" status "$work/array" --json 2>&1 >/dev/null | tail -1)
      echo "${build%%=*} $size: opening ms/slot pages left for later/named/slots used:$runs; status peak RSS $((peak / 1024)) MB"
    )
  done
done
