# Sourced by the NBD benchmark scripts, from the repository root: sets
# $TESSERA (built in release unless given) and $work (a scratch directory
# removed on exit, with the server whose pid is in $pid stopped, and any
# paths added to $scratch); serves on $work/s.sock.

if [ -z "${TESSERA:-}" ]; then
  cargo build --release -q -p tessera
  TESSERA=$PWD/target/release/tessera
fi
work=$(mktemp -d "${TMPDIR:-/var/tmp}/tessera-bench.XXXXXX")
pid=""
scratch=()
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$work" "${scratch[@]}"; }
trap cleanup EXIT

# Waits for $work/s.sock ($SOCKET_WAIT_S seconds at most, default 10:
# opening a large map takes longer).
wait_socket() {
  for _ in $(seq $(( ${SOCKET_WAIT_S:-10} * 20 ))); do [ -S "$work/s.sock" ] && return; sleep 0.05; done
  echo "no socket" >&2; exit 1
}

# `tessera serve` of the array in $work/array on $work/s.sock, with flags
# "$@"; its log goes to $SERVE_LOG if set.
serve() {
  rm -f "$work/s.sock"
  "$TESSERA" serve "$work/array" --socket "$work/s.sock" "$@" 2>>"${SERVE_LOG:-/dev/null}" & pid=$!
  wait_socket
}

stop_server() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""; }

# The server killed as a crash would kill it.
kill_server() { kill -9 "$pid"; wait "$pid" 2>/dev/null || true; pid=""; }

# The server's resident memory in MB, and the most it has been since the
# server started.
rss_mb() { awk '/^VmRSS/ {print int($2 / 1024)}' "/proc/$pid/status"; }
peak_mb() { awk '/^VmHWM/ {print int($2 / 1024)}' "/proc/$pid/status"; }

# Prints the Python expression $1 of the JSON on stdin (as `j`), skipping
# whatever comes before it (fio's nbd engine prints a line first).
json_expr() { python3 -c "import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index(chr(123)):]); print($1)"; }
