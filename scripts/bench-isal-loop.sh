#!/usr/bin/env bash
# ISA-L's ec_encode_data from a plain C loop (the system's libisal, as
# `tessera bench ec` loads it) beside `tessera bench ec`'s own figure for
# ISA-L and for Tessera, on the same shape and the same memory layout
# (LAYOUT: area, the default, or skewed; see crates/cli/src/bench_ec.rs):
# K+M shards of SHARD bytes, one stripe as the working set (in cache), 0.3
# s a measurement, five of each, medians. A check that the in-tree
# comparison does not read ISA-L low.
#
#   [TESSERA=path/to/tessera] [LAYOUT=area|skewed] scripts/bench-isal-loop.sh [K M [SHARD]]   (default 10 4 65536)
set -euo pipefail
cd "$(dirname "$0")/.."
k=${1:-10}; m=${2:-4}; shard=${3:-65536}; layout=${LAYOUT:-area}
if [ -z "${TESSERA:-}" ]; then cargo build --release -q -p tessera; fi
tessera=${TESSERA:-$PWD/target/release/tessera}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/loop.c" <<'C'
#include <isa-l/erasure_code.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }
int main(int argc, char **argv) {
  int k = atoi(argv[1]), m = atoi(argv[2]);
  size_t len = (size_t)atol(argv[3]);
  unsigned char *a = malloc((size_t)(k + m) * k), *g = malloc((size_t)k * m * 32);
  unsigned char **shards = malloc((size_t)(k + m) * sizeof *shards);
  gf_gen_cauchy1_matrix(a, k + m, k);
  ec_init_tables(k, m, &a[k * k], g);
  // One 4 KiB-aligned area, as `tessera bench ec --layout` lays a stripe out.
  size_t stride = !strcmp(argv[4], "area") ? (len + 4095) / 4096 * 4096 : (len + 63) / 64 * 64 + 320;
  unsigned char *area;
  if (posix_memalign((void **)&area, 4096, (size_t)(k + m) * stride)) return 1;
  for (int i = 0; i < k + m; i++) {
    shards[i] = area + (size_t)i * stride;
    for (size_t j = 0; j < len; j++) shards[i][j] = (unsigned char)rand();
  }
  double runs[5];
  for (int r = 0; r < 5; r++) {
    double start = now(), t;
    long n = 0;
    do { ec_encode_data((int)len, k, m, g, shards, &shards[k]); n++; t = now(); } while (t - start < 0.3);
    runs[r] = (double)n * k * len / (t - start) / 1e9;
  }
  qsort(runs, 5, sizeof runs[0], cmp);
  printf("%.2f\n", runs[2]);
  return 0;
}
C
gcc -O2 -o "$work/loop" "$work/loop.c" -lisal
loop=$("$work/loop" "$k" "$m" "$shard" "$layout")
"$tessera" bench ec --data "$k" --parity "$m" --shard-bytes "$shard" --working-set $(( (k + m) * shard )) --layout "$layout" --json \
  | python3 -c "
import json, sys
j = json.load(sys.stdin)
loop = float(sys.argv[1])
print(f\"{sys.argv[2]}+{sys.argv[3]}, {sys.argv[4]}-byte shards, one stripe, $layout layout; $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)\")
print(f\"ISA-L from a C loop {loop:.2f} GB/s; tessera bench ec: ISA-L {j['isal_encode_gbps']:.2f} GB/s ({j['isal_encode_gbps'] / loop:.2f}x the loop), Tessera ({j.get('kernel')}) {j['encode_gbps']:.2f} GB/s\")
" "$loop" "$k" "$m" "$shard"
