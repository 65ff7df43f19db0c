#!/usr/bin/env bash
# Tessera's erasure-coding kernels against ISA-L's, instruction set by
# instruction set, on this CPU: for every kernel the CPU runs (avx2,
# avx2-gfni, avx512, avx512-gfni), Tessera's forced kernel (`tessera bench
# ec --kernel`) beside ISA-L's matching ec_encode_data_<isa> called from a
# plain C loop, encode and decode (the first M data shards rebuilt from
# the survivors, as `bench ec` does), on the same memory layouts (LAYOUTS:
# area, as the array holds a stripe, and skewed; see crates/cli/src/
# bench_ec.rs), alternating, the best of ROUNDS rounds each.
#
# ISA-L is built from source (the 2.31 release vendored by the isal-sys
# crate, fetched with cargo; nasm from Debian), static, so that its
# per-ISA functions can be called directly: the system's libisal (2.30)
# exports only the dispatcher, which picks one kernel for this CPU.
#
#   [ROUNDS=3] [SECONDS_EACH=0.3] [SHAPES="4+2 8+2 ..."] [LAYOUTS="area skewed"] [ISAS="avx2-gfni ..."]
#   [SHARD_BYTES=65536] scripts/bench-ec-isa.sh
#
# SHARD_BYTES sets the in-cache shapes' shard size (4096: a 4+2 stripe in
# L1, to tell the kernels' arithmetic from the L2's bandwidth).
#
# The last column, "xor", is the same C loop with no arithmetic but XOR:
# each column of the K inputs read once and XORed, and stored to all M
# outputs, with AVX2 loads and stores, over the same buffers. No kernel
# of that shape moves fewer bytes, so where both codecs run near it, the
# shape is bound by the caches' bandwidth, not by the kernels.
#
# Shapes: in cache (64 KiB shards, one stripe as the working set) 4+2,
# 8+2, 10+4, 12+4, 16+4, 20+4, 32+8 (suffix c); wide stripes of 64 KiB
# shards, one stripe (6-14 MiB: in L3 where it is large enough), 92+8 and
# 200+16 (suffix l, SHAPES entries 92+8@l); and from memory (1 MiB shards,
# 256 MiB working set) 92+8 and 200+16 (suffix m, 92+8@m). Prints a
# table, the CPU named first.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3}
seconds=${SECONDS_EACH:-0.3}
shapes=${SHAPES:-"4+2 8+2 10+4 12+4 16+4 20+4 32+8 92+8@l 200+16@l 92+8@m 200+16@m"}
layouts=${LAYOUTS:-"area skewed"}
command -v nasm >/dev/null || { echo "nasm is needed to build ISA-L (apt-get install nasm)" >&2; exit 1; }
cargo build --release -q -p tessera
tessera=$PWD/target/release/tessera
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# ISA-L 2.31's source, as the isal-sys crate vendors it.
mkdir -p "$work/fetch/src"
cat >"$work/fetch/Cargo.toml" <<'TOML'
[package]
name = "fetch-isal"
version = "0.1.0"
edition = "2021"
[dependencies]
isal-sys = "=0.5.3"
TOML
echo 'fn main() {}' >"$work/fetch/src/main.rs"
(cd "$work/fetch" && cargo fetch -q)
source=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/isal-sys-0.5.3*/isa-l | head -1)
cp -r "$source" "$work/isa-l"
version=$(sed -n 's/^ *\[\([0-9.]*\)\],$/\1/p' "$work/isa-l/configure.ac" | head -1)
make -C "$work/isa-l" -f Makefile.unx -j"$(nproc)" lib >"$work/isa-l.log" 2>&1 \
  || { tail -20 "$work/isa-l.log" >&2; exit 1; }

cat >"$work/isa.c" <<'C'
// ISA-L's ec_encode_data_<isa> from a plain loop: encode K data shards
// into M parity, or decode the first M data shards from the survivors.
#include <erasure_code.h>
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
typedef void (*encode_fn)(int, int, int, unsigned char *, unsigned char **, unsigned char **);
void ec_encode_data_avx2(int, int, int, unsigned char *, unsigned char **, unsigned char **);
void ec_encode_data_avx512(int, int, int, unsigned char *, unsigned char **, unsigned char **);
void ec_encode_data_avx2_gfni(int, int, int, unsigned char *, unsigned char **, unsigned char **);
void ec_encode_data_avx512_gfni(int, int, int, unsigned char *, unsigned char **, unsigned char **);
void ec_init_tables_gfni(int, int, unsigned char *, unsigned char *);
// The bytes an encode of this shape moves, and no arithmetic: each
// column of the K inputs read once, XORed, and stored to all M outputs.
__attribute__((target("avx2"))) static void xor_only(int len, int k, int m, unsigned char *tables,
                                                      unsigned char **in, unsigned char **out) {
  (void)tables;
  for (int x = 0; x + 128 <= len; x += 128) {
    __m256i a0 = _mm256_loadu_si256((const __m256i *)(in[0] + x));
    __m256i a1 = _mm256_loadu_si256((const __m256i *)(in[0] + x + 32));
    __m256i a2 = _mm256_loadu_si256((const __m256i *)(in[0] + x + 64));
    __m256i a3 = _mm256_loadu_si256((const __m256i *)(in[0] + x + 96));
    for (int j = 1; j < k; j++) {
      a0 = _mm256_xor_si256(a0, _mm256_loadu_si256((const __m256i *)(in[j] + x)));
      a1 = _mm256_xor_si256(a1, _mm256_loadu_si256((const __m256i *)(in[j] + x + 32)));
      a2 = _mm256_xor_si256(a2, _mm256_loadu_si256((const __m256i *)(in[j] + x + 64)));
      a3 = _mm256_xor_si256(a3, _mm256_loadu_si256((const __m256i *)(in[j] + x + 96)));
    }
    for (int o = 0; o < m; o++) {
      _mm256_storeu_si256((__m256i *)(out[o] + x), a0);
      _mm256_storeu_si256((__m256i *)(out[o] + x + 32), a1);
      _mm256_storeu_si256((__m256i *)(out[o] + x + 64), a2);
      _mm256_storeu_si256((__m256i *)(out[o] + x + 96), a3);
    }
  }
}
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
  const char *isa = argv[1], *mode = argv[2];
  int k = atoi(argv[3]), m = atoi(argv[4]);
  size_t len = (size_t)atol(argv[5]), set = (size_t)atol(argv[6]);
  double seconds = atof(argv[7]);
  const char *layout = argv[8];
  int gfni = strstr(isa, "gfni") != NULL;
  encode_fn f = !strcmp(isa, "xor") ? xor_only
              : !strcmp(isa, "avx2") ? ec_encode_data_avx2
              : !strcmp(isa, "avx512") ? ec_encode_data_avx512
              : !strcmp(isa, "avx2-gfni") ? ec_encode_data_avx2_gfni
              : !strcmp(isa, "avx512-gfni") ? ec_encode_data_avx512_gfni : NULL;
  if (!f) { fprintf(stderr, "unknown isa %s\n", isa); return 2; }
  size_t stripes = set / ((size_t)(k + m) * len); if (stripes < 1) stripes = 1;
  unsigned char *a = malloc((size_t)(k + m) * k), *rows = malloc((size_t)m * k);
  unsigned char *tables = malloc((size_t)k * m * 32);
  gf_gen_cauchy1_matrix(a, k + m, k);
  if (!strcmp(mode, "encode")) {
    memcpy(rows, &a[k * k], (size_t)m * k);
  } else {
    // Survivors: data shards m..k-1, then parity 0..m-1; the rows of the
    // inverse of their matrix that give data shards 0..m-1.
    unsigned char *b = malloc((size_t)k * k), *inv = malloc((size_t)k * k);
    int r = 0;
    for (int i = m; i < k; i++, r++) memcpy(&b[r * k], &a[i * k], k);
    for (int i = 0; i < m; i++, r++) memcpy(&b[r * k], &a[(k + i) * k], k);
    if (gf_invert_matrix(b, inv, k)) { fprintf(stderr, "singular\n"); return 3; }
    memcpy(rows, inv, (size_t)m * k);
  }
  if (gfni) ec_init_tables_gfni(k, m, rows, tables); else ec_init_tables(k, m, rows, tables);
  // Each stripe in one 4 KiB-aligned allocation, as `tessera bench ec
  // --layout` lays it out: data shards, parity, then the rebuilt, each
  // `stride` bytes after the last (area: the next 4 KiB boundary;
  // skewed: 320 bytes further into its page than the last).
  size_t stride = !strcmp(layout, "area") ? (len + 4095) / 4096 * 4096 : (len + 63) / 64 * 64 + 320;
  unsigned char ***in = malloc(stripes * sizeof *in), ***out = malloc(stripes * sizeof *out);
  for (size_t s = 0; s < stripes; s++) {
    unsigned char *area;
    if (posix_memalign((void **)&area, 4096, (size_t)(k + 2 * m) * stride)) return 1;
    for (size_t j = 0; j < (size_t)(k + 2 * m) * stride; j++) area[j] = (unsigned char)rand();
    in[s] = malloc((size_t)k * sizeof **in); out[s] = malloc((size_t)m * sizeof **out);
    for (int i = 0; i < k; i++) {
      // Decoding reads the survivors: data shards m..k-1, then parity 0..m-1.
      int shard = !strcmp(mode, "encode") ? i : (i < k - m ? m + i : k + (i - (k - m)));
      in[s][i] = area + (size_t)shard * stride;
    }
    for (int i = 0; i < m; i++) out[s][i] = area + (size_t)((!strcmp(mode, "encode") ? k : k + m) + i) * stride;
  }
  double start = now(), t; long sweeps = 0;
  do { for (size_t s = 0; s < stripes; s++) f((int)len, k, m, tables, in[s], out[s]); sweeps++; t = now(); } while (t - start < seconds);
  printf("%.3f\n", (double)sweeps * stripes * k * len / (t - start) / 1e9);
  return 0;
}
C
gcc -O2 -I"$work/isa-l/include" -o "$work/isa" "$work/isa.c" "$work/isa-l/bin/isa-l.a"

cpu=$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)
flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { [[ " $flags " == *" $1 "* ]]; }
isas=()
has avx2 && isas+=(avx2)
has avx2 && has gfni && isas+=(avx2-gfni)
has avx512f && has avx512bw && isas+=(avx512)
has avx512f && has avx512bw && has gfni && isas+=(avx512-gfni)
# ISAS="avx2-gfni ...": only these of the kernels the CPU runs.
if [ -n "${ISAS:-}" ]; then
  chosen=()
  for isa in "${isas[@]}"; do [[ " $ISAS " == *" $isa "* ]] && chosen+=("$isa"); done
  isas=("${chosen[@]}")
fi
echo "CPU: $cpu ($(nproc) cores); ISA-L $version built from source; best of $rounds alternating rounds, ${seconds} s each, one core"
printf '%-7s %-12s %-10s %-7s %10s %10s %7s %8s\n' layout kernel shape op "tessera" "isa-l" ratio xor
best() { sort -g | tail -1; }
for layout in $layouts; do
for isa in "${isas[@]}"; do
  for shape in $shapes; do
    case $shape in
      *@m) kind=memory; shape=${shape%@m}; shard=$((1 << 20)); set=$((256 << 20)) ;;
      *@l) kind=l3; shape=${shape%@l}; shard=65536; set=0 ;;
      *) kind=cache; shard=${SHARD_BYTES:-65536}; set=0 ;;
    esac
    k=${shape%+*}; m=${shape#*+}
    [ "$set" -eq 0 ] && set=$(( (k + m) * shard ))
    for op in encode decode; do
      ours=(); theirs=(); moved=()
      for _ in $(seq "$rounds"); do
        ours+=("$("$tessera" bench ec --data "$k" --parity "$m" --shard-bytes "$shard" --working-set "$set" \
          --kernel "$isa" --layout "$layout" --rounds 1 --seconds "$seconds" --json \
          | python3 -c "import json,sys; print(json.load(sys.stdin)['${op}_gbps'])")")
        theirs+=("$("$work/isa" "$isa" "$op" "$k" "$m" "$shard" "$set" "$seconds" "$layout")")
        moved+=("$("$work/isa" xor "$op" "$k" "$m" "$shard" "$set" "$seconds" "$layout")")
      done
      a=$(printf '%s\n' "${ours[@]}" | best); b=$(printf '%s\n' "${theirs[@]}" | best)
      c=$(printf '%s\n' "${moved[@]}" | best)
      printf '%-7s %-12s %-10s %-7s %10.2f %10.2f %6.2fx %8.2f\n' "$layout" "$isa" "$shape${kind:0:1}" "$op" "$a" "$b" "$(python3 -c "print($a / $b)")" "$c"
    done
  done
done
done
