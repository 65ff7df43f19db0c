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
set -euo pipefail
cd "$(dirname "$0")/.."
records=${1:-10000000} streams=${2:-3}
scripts/install-test-deps.sh
if [ -z "${TESSERA:-}" ]; then cargo build --release --quiet; fi
venv=target/test-deps/bench-venv
if ! "$venv/bin/python" -c "import pyarrow.flight, numpy" 2>/dev/null; then
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --only-binary=:all: pyarrow==26.0.1 numpy==2.4.6
fi
builds=("new:${TESSERA:-$PWD/target/release/tessera}")
[ -n "${OLD:-}" ] && builds=("old:$OLD" "${builds[@]}")
work=$(mktemp -d -p "${BENCH_DIR:-$PWD/target}" bench-kv-stall.XXXXXX)
server=
cleanup() {
  [ -n "$server" ] && kill -TERM "$server" 2>/dev/null && wait "$server" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; disk: $(df --output=source "$work" | tail -1)"
for round in $(seq "${ROUNDS:-1}"); do
  for build in "${builds[@]}"; do
    label=${build%%:*} tessera=${build#*:}
    rm -rf "$work/array"
    "$tessera" create --data 4 --parity 2 --dir "$work/array" --devices 6 --device-size 2G >/dev/null
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "$tessera" serve "$work/array" --socket "$work/nbd.sock" --kv "127.0.0.1:$port" 2>"$work/serve.log" &
    server=$!
    for _ in $(seq 200); do grep -q "KV spaces" "$work/serve.log" && break; sleep 0.05; done
    "$venv/bin/python" scripts/bench-kv-stall.py "grpc://127.0.0.1:$port" "$records" "$streams" "$label"
    kill -TERM "$server"; wait "$server" 2>/dev/null || true
    server=
  done
done
