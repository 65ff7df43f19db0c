#!/usr/bin/env bash
# How long a DoPut's sender is held up (an insert stall), builds
# alternating: each round serves a fresh 4+2 array of six sparse 2 GiB
# files under target/ (or $BENCH_DIR) with --kv, and streams RECORDS
# VPIC-like records (36 bytes each) into STREAMS fresh spaces, one DoPut
# each (scripts/bench-kv-stall.py says what is printed).
#
#   scripts/bench-kv-stall.sh [RECORDS] [STREAMS]   (default 10000000, 3)
#   OLD=path scripts/bench-kv-stall.sh ...           (another build, alternating)
#   TESSERA=path ROUNDS=3 scripts/bench-kv-stall.sh ...
#   WRITTEN=1 scripts/bench-kv-stall.sh ...         (member files written with zeros first)
#   AT_ONCE=1 scripts/bench-kv-stall.sh ...         (the streams at once, a client each; the server's peak RSS)
set -euo pipefail
cd "$(dirname "$0")/.."
records=${1:-10000000} streams=${2:-3}
# pyarrow and numpy: the tests' environment (target/test-deps/venv).
scripts/install-test-deps.sh
if [ -z "${TESSERA:-}" ]; then cargo build --release --quiet; fi
python=$PWD/target/test-deps/venv/bin/python
builds=("new:${TESSERA:-$PWD/target/release/tessera}")
[ -n "${OLD:-}" ] && builds=("old:$OLD" "${builds[@]}")
source scripts/kv-bench-lib.sh bench-kv-stall
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; disk: $(df --output=source "$work" | tail -1)"
for round in $(seq "${ROUNDS:-1}"); do
  for build in "${builds[@]}"; do
    label=${build%%:*} tessera=${build#*:}
    rm -rf "$work/array"
    kv_create "$work/array" 2G
    kv_serve "$work/array"
    at_once=()
    [ "${AT_ONCE:-0}" = 1 ] && at_once=("$server")
    "$python" scripts/bench-kv-stall.py "grpc://127.0.0.1:$port" "$records" "$streams" "$label" "${at_once[@]}"
    kv_stop
  done
done
