#!/bin/sh
# A lent GPU machine has no package registry and little time: build here,
# carry the binaries, run the GPU checks and figures there in one call.
#   scripts/gpu-session.sh pack    here: release build of tessera and of the
#                                  accelerator's and the array's tests,
#                                  stripped into target/gpu-carry
#   scripts/gpu-session.sh run     there (carry target/gpu-carry): the GPU
#                                  tests (ACCEL_TESTS: name filters for the
#                                  accelerator's, all by default), then
#                                  scripts/bench-gpu.sh (SECTIONS, BYTES as
#                                  it takes them)
# Logs go to $OUT (or /tmp) and a summary to stdout.
set -eu
carry=target/gpu-carry
case "${1:-}" in
pack)
    cargo build --release -p tessera
    rm -rf "$carry" && mkdir -p "$carry"
    strip -o "$carry/tessera" target/release/tessera
    {
        cargo test --release --no-run -p tessera-accel --lib --message-format=json
        cargo test --release --no-run -p tessera-array --test array --message-format=json
    } 2>/dev/null |
        python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["target"]["name"], m["executable"])' |
        while read -r name exe; do
            case "$name" in
            tessera_accel) strip -o "$carry/accel-tests" "$exe" ;;
            array) strip -o "$carry/array-tests" "$exe" ;;
            esac
        done
    ls -la "$carry"
    ;;
run)
    out=${OUT:-/tmp}
    # NVRTC: the CUDA toolkit's, or a Python wheel's.
    libs=$(find /usr/local/cuda*/lib64 /usr/lib /opt /usr/local/lib -name 'libnvrtc.so*' 2>/dev/null | xargs -r -n1 dirname | sort -u | tr '\n' ':')
    export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:-}"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    status=0
    echo "== accelerator tests on the GPU"
    TESSERA_REQUIRE_GPU=1 timeout 300 "$carry/accel-tests" --test-threads=1 --skip host_hashes --skip kernels_compile \
        ${ACCEL_TESTS:-} >"$out/accel-tests.log" 2>&1 || status=1
    grep -E "^test |test result" "$out/accel-tests.log" | grep -v " ok$" || true
    echo "== the array's tests with TESSERA_ACCEL=cuda"
    TESSERA_ACCEL=cuda timeout 300 "$carry/array-tests" --test-threads=2 array:: >"$out/array-tests.log" 2>&1 || status=1
    grep -E "test result|FAILED|panicked" "$out/array-tests.log" || true
    TESSERA="$carry/tessera" timeout "${BENCH_SECONDS:-420}" scripts/bench-gpu.sh "${WORK:-/tmp/tessera-bench-gpu}" \
        >"$out/bench-gpu.log" 2>&1 || status=1
    grep -E "^==|GB/s|FLUSH|accelerator|auto:|CPU-s|issue rates" "$out/bench-gpu.log" || true
    exit $status
    ;;
*)
    echo "usage: $0 pack|run" >&2
    exit 2
    ;;
esac
