#!/bin/sh
# The GPU backend's figures (issues 15 and 28), each beside the CPU's and
# the PCIe link's measured in the same run. Needs a GPU, its driver and
# NVRTC (libnvrtc.so on the loader's path); prints a log to stdout.
#   scripts/bench-gpu.sh [WORKDIR]     (TESSERA=path/to/tessera to pick a binary)
# SECTIONS picks what runs (default: "ec sha3 hash array engine"); BYTES is what
# each array run writes (default 8G); ARRAY_RUNS the array runs (default
# all, e.g. "cpu:crc32c cuda:sha3-512:packed").
set -u
tessera=${TESSERA:-target/release/tessera}
work=${1:-/tmp/tessera-bench-gpu}
sections=${SECTIONS:-ec sha3 hash array engine}
bytes=${BYTES:-8G}
threads=$(nproc)
mkdir -p "$work"
has() { case " $sections " in *" $1 "*) return 0 ;; esac; return 1; }
# Every run goes on after one fails; the script's status says whether any did.
failed=0
tessera() { "$tessera" "$@" || failed=1; }
echo "== $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $threads; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
# Encoding end to end is measured twice: from pageable memory (packed into
# staging buffers) and from the page-locked memory the backend lends
# (copied in place).
has ec && for shape in "10 4" "92 8" "200 16"; do
    set -- $shape
    echo "== bench ec $1+$2, 64 KiB shards, $threads threads"
    tessera bench ec --data "$1" --parity "$2" --shard-bytes 64K --threads "$threads" --rounds 3 --accel cuda
done
# SHA3-512's kernels rotate the permutation's lanes with shifts by default;
# KECCAK_ROTS="0 1" measures the multiplies too (TESSERA_CUDA_KECCAK_ROT).
has sha3 && for rot in ${KECCAK_ROTS:-0}; do
    echo "== bench hash sha3-512, 64K blocks, TESSERA_CUDA_KECCAK_ROT=$rot, with the issue rates, the permutation in registers, a thread and a warp a message"
    TESSERA_CUDA_KECCAK_ROT=$rot tessera bench hash --algorithm sha3-512 --block-bytes 64K --bytes 256M --accel cuda
done
has hash && for algorithm in sha3-512 sha256; do
    for block in 64K 4K; do
        echo "== bench hash $algorithm, $block blocks"
        tessera bench hash --algorithm "$algorithm" --block-bytes "$block" --bytes 256M --accel cuda
    done
done
if has hash; then
    echo "== bench hash sha3-512, 64K blocks, batches of 4 GiB (more chunks than GPU threads)"
    tessera bench hash --algorithm sha3-512 --block-bytes 64K --bytes 64M --accel cuda --gpu-batch 4G
fi
# The array: 92+8 over files on local disk, sequential 1 MiB writes, each
# worker FLUSHing every 16 writes. "packed" lends no page-locked memory
# (TESSERA_CUDA_PINNED_MAX=0), so every stripe is packed into staging
# buffers as before the allocator seam; "spin" has threads waiting for the
# GPU spin on their cores (TESSERA_CUDA_SPIN=1) rather than sleep; "thread"
# hashes SHA3-512 a thread a message however few (TESSERA_CUDA_WARP_MAX=0),
# "warpmax=N" a warp a message in launches of at most N, "hashlanes=N"
# N hash batches in flight (TESSERA_ACCEL_HASH_LANES);
# "auto" measures the shape as the array opens and says what it chose.
runs=${ARRAY_RUNS:-cpu:crc32c cpu:sha3-512 cuda:sha3-512 cuda:sha3-512:packed auto:sha3-512 auto:crc32c}
has array && for run in $runs; do
    set -- $(echo "$run" | tr : ' ')
    pinned= spin= warp= hashlanes=
    [ "${3:-}" = packed ] && pinned=0
    [ "${3:-}" = spin ] && spin=1
    [ "${3:-}" = thread ] && warp=0
    case "${3:-}" in warpmax=*) warp=${3#warpmax=} ;; hashlanes=*) hashlanes=${3#hashlanes=} ;; esac
    echo "== bench array 92+8, --accel $1 --checksum $2 ${3:-}"
    TESSERA_CUDA_PINNED_MAX=$pinned TESSERA_CUDA_SPIN=$spin TESSERA_CUDA_WARP_MAX=$warp TESSERA_ACCEL_HASH_LANES=$hashlanes tessera bench array --data 92 --parity 8 --devices 100 --device-size 256M --chunk-size 64K \
        --checksum "$2" --accel "$1" --members "$work" --threads 4 --queue-depth 4 --bytes "$bytes" --block-size 1M --flush-every 16
done
# The engine alone on the CPU (members in memory): how one array's writes
# scale with client threads.
has engine && for t in 1 4 16; do
    echo "== bench array 92+8 in memory, --accel cpu --checksum crc32c, $t threads"
    tessera bench array --data 92 --parity 8 --devices 100 --device-size 128M --chunk-size 64K \
        --checksum crc32c --accel cpu --members memory --threads "$t" --queue-depth 1 --bytes 4G --block-size 1M
done
exit $failed
