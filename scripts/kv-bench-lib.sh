# Sourced by the KV benchmark scripts, from the repository root, with a
# name for the scratch directory: sets $work (under $BENCH_DIR, or
# target/; removed on exit, with the server in $server stopped) and gives
# kv_serve and kv_stop.

work=$(mktemp -d -p "${BENCH_DIR:-$PWD/target}" "${1:-bench-kv}.XXXXXX")
server=
cleanup() {
  [ -n "$server" ] && kill -TERM "$server" 2>/dev/null && wait "$server" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

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
