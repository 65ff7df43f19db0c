#!/usr/bin/env bash
# KV spaces against their peers in one run on one disk (scripts/bench-kv.py
# says what is measured): a 4+2 array of sparse member files under
# target/ (or $BENCH_DIR), served with --kv; RocksDB's and Parquet's files
# beside it on the same file system.
#
#   scripts/bench-kv.sh [RECORDS]        (default 10000000; 36 bytes each)
#   ROCKSDB=0 scripts/bench-kv.sh ...     (leave RocksDB out)
#   TLS=1 scripts/bench-kv.sh ...         (the Flight server over TLS: --kv-tls-cert,
#                                          a self-signed P-256 certificate)
#   TESSERA=path scripts/bench-kv.sh ...  (another build, an older commit's, to compare)
#   KV_CACHE=0 scripts/bench-kv.sh ...    (serve --kv-cache 0: every query reads its batches)
#   WRITTEN=1 scripts/bench-kv.sh ...     (member files written with zeros first, as a disk:
#                                          see kv_create in scripts/kv-bench-lib.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
records=${1:-10000000}
scripts/install-test-deps.sh
if [ -z "${TESSERA:-}" ]; then cargo build --release --quiet; fi
# pyarrow, numpy and rocksdict, apart from the tests' environment.
venv=target/test-deps/bench-venv
if ! "$venv/bin/python" -c "import pyarrow.flight, numpy, rocksdict" 2>/dev/null; then
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --only-binary=:all: pyarrow==26.0.1 numpy==2.4.6 rocksdict==0.3.29
fi
tessera=${TESSERA:-$PWD/target/release/tessera}
source scripts/kv-bench-lib.sh bench-kv
# The log, the table and the index (3x the records), the baseline's copy,
# over 4 data members, twice over for room.
member=$(( (records * 36 * 8 / 4 >> 20) + 1024 ))M
kv_create "$work/array" "$member"
tls=() scheme=grpc client_tls=() cache=()
[ -n "${KV_CACHE:-}" ] && cache=(--kv-cache "$KV_CACHE")
if [ "${TLS:-0}" = 1 ]; then
  # Not a CA (openssl's default for -x509): rustls, `tessera kv`'s TLS,
  # refuses a CA certificate as the server's own (CaUsedAsEndEntity).
  openssl req -x509 -days 1 -subj /CN=localhost -addext "subjectAltName=IP:127.0.0.1" \
    -addext "basicConstraints=critical,CA:FALSE" \
    -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
  tls=(--kv-tls-cert "$work/cert.pem" --kv-tls-key "$work/key.pem") scheme=grpc+tls
  client_tls=(--tls-ca "$work/cert.pem")
fi
kv_serve "$work/array" "${tls[@]}" "${cache[@]}"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; disk: $(df --output=source "$work" | tail -1)"
rocksdb=() written=()
[ "${ROCKSDB:-1}" = 1 ] && rocksdb=(--rocksdb)
[ "${WRITTEN:-0}" = 1 ] && written=(--written)
"$venv/bin/python" scripts/bench-kv.py --address "$scheme://127.0.0.1:$port" "${client_tls[@]}" \
  --nbd "nbd+unix:///tessera?socket=$work/nbd.sock" --records "$records" --work "$work" "${rocksdb[@]}" \
  --server-pid "$server" "${written[@]}"
