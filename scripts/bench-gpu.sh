#!/bin/sh
# The GPU backend's figures (issues 15 and 28), each beside the CPU's and
# the PCIe link's measured in the same run. Needs a GPU, its driver and
# NVRTC (libnvrtc.so on the loader's path); prints a log to stdout.
#   scripts/bench-gpu.sh [WORKDIR]     (TESSERA=path/to/tessera to pick a binary)
set -eu
tessera=${TESSERA:-target/release/tessera}
work=${1:-/tmp/tessera-bench-gpu}
threads=$(nproc)
mkdir -p "$work"
echo "== $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $threads; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
for shape in "10 4" "92 8" "200 16"; do
    set -- $shape
    echo "== bench ec $1+$2, 64 KiB shards, $threads threads"
    "$tessera" bench ec --data "$1" --parity "$2" --shard-bytes 64K --threads "$threads" --rounds 3 --accel cuda
done
for algorithm in sha3-512 sha256; do
    for block in 64K 4K; do
        echo "== bench hash $algorithm, $block blocks"
        "$tessera" bench hash --algorithm "$algorithm" --block-bytes "$block" --bytes 256M --accel cuda
    done
done
echo "== bench hash sha3-512, 64K blocks, batches of 4 GiB (more chunks than GPU threads)"
"$tessera" bench hash --algorithm sha3-512 --block-bytes 64K --bytes 64M --accel cuda --gpu-batch 4G
# The array: 92+8 over files on local disk, sequential 1 MiB writes, each
# worker FLUSHing every 16 writes. "off" turns the batching of concurrent
# seals and hashes off (TESSERA_ACCEL_BATCH), "8" allows 8 batches in flight.
for run in "cpu crc32c" "cpu sha3-512" "cuda sha3-512" "cuda sha3-512 off" "cuda sha3-512 8" "auto sha3-512"; do
    set -- $run
    echo "== bench array 92+8, --accel $1 --checksum $2 ${3:+TESSERA_ACCEL_BATCH=$3}"
    TESSERA_ACCEL_BATCH=${3:-} "$tessera" bench array --data 92 --parity 8 --devices 100 --device-size 256M --chunk-size 64K \
        --checksum "$2" --accel "$1" --members "$work" --threads 4 --queue-depth 4 --bytes 8G --block-size 1M --flush-every 16
done
# The engine alone on the CPU (members in memory): how one array's writes
# scale with client threads.
for t in 1 4 16; do
    echo "== bench array 92+8 in memory, --accel cpu --checksum crc32c, $t threads"
    "$tessera" bench array --data 92 --parity 8 --devices 100 --device-size 128M --chunk-size 64K \
        --checksum crc32c --accel cpu --members memory --threads "$t" --queue-depth 1 --bytes 4G --block-size 1M
done
