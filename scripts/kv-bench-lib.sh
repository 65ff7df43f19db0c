# Sourced by the KV benchmark scripts, from the repository root, with a
# name for the scratch directory: sets $work (under $BENCH_DIR, or
# target/; removed on exit, with the server in $server stopped) and gives
# kv_create, kv_serve and kv_stop.

work=$(mktemp -d -p "${BENCH_DIR:-$PWD/target}" "${1:-bench-kv}.XXXXXX")
server=
cleanup() {
  [ -n "$server" ] && kill -TERM "$server" 2>/dev/null && wait "$server" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# kv_create DIR SIZE: `$tessera create` of a 4+2 array in DIR over six
# member files of SIZE (K, M or G suffix): sparse, or with WRITTEN=1
# written with zeros first (`--preallocate`, so a build that has it), as
# a disk is. A sparse file's first write to a block makes the next
# fdatasync commit the file system's journal too (fallocate's unwritten
# extents do the same), which a disk does not: each durable KV insert's
# flush took 62-70 ms on written files against 84-126 ms on sparse ones
# (docs/PERFORMANCE.md).
kv_create() {
  local preallocate=()
  [ "${WRITTEN:-0}" = 1 ] && preallocate=(--preallocate)
  # Its progress lines kept out of the results, shown if it fails.
  "$tessera" create --data 4 --parity 2 --dir "$1" --devices 6 --device-size "$2" "${preallocate[@]}" \
    >/dev/null 2>"$work/create.log" || { cat "$work/create.log" >&2; return 1; }
}

# kv_serve ARRAY [serve flags]: `$tessera serve` of ARRAY with its KV
# spaces on a free loopback port ($port), NBD on $work/nbd.sock, its log
# in $work/serve.log, its pid in $server; returns once it serves.
kv_serve() {
  local array=$1
  shift
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$tessera" serve "$array" --socket "$work/nbd.sock" --kv "127.0.0.1:$port" "$@" 2>"$work/serve.log" &
  server=$!
  for _ in $(seq 200); do grep -q "KV spaces" "$work/serve.log" && break; sleep 0.05; done
}

# Stops the server kv_serve started (SIGTERM: a clean stop).
kv_stop() {
  kill -TERM "$server"
  wait "$server" 2>/dev/null || true
  server=
}
