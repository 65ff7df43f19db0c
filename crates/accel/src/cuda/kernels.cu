// Tessera's CUDA kernels, compiled at run time by NVRTC (crates/accel/src/cuda).
//
// Every result must equal the CPU reference bit for bit:
// - GF(2^8) with polynomial 0x11d (ISA-L's), products of a coefficient
//   matrix with chunks: parity (the Cauchy rows) and rebuilt chunks (a
//   decode matrix), computed four bytes at a time;
// - SHA-256 and SHA3-512 of "prefix || body", the Merkle leaves
//   (prefix 0x00 || chunk index, u32 little-endian) and inner nodes
//   (prefix 0x01 || left || right) of `tessera_checksum::merkle`.
//
// Layout shared with the host: a batch is `stripes` stripes of `width`
// chunk slots; slot j of stripe s starts at (s * width + j) * slot bytes,
// the slot size being the chunk size rounded up to 16 bytes, and every
// buffer has 64 bytes of slack after its end (the word loads below may
// read, never use, up to 15 bytes past a chunk).
//
// This file also compiles as host C++ (TESSERA_HOST_TEST), so that its
// hash functions are checked on any machine, GPU or not (host_check.cpp,
// and the test host_hashes_equal_the_reference in tests.rs).

#ifdef TESSERA_HOST_TEST
#include <cstdint>
#define __device__
#define __forceinline__ inline
#define __constant__ static const
typedef uint8_t u8;
typedef uint32_t u32;
typedef uint64_t u64;
static inline u32 bswap32(u32 x) { return __builtin_bswap32(x); }
static inline u64 __ldg(const u64* p) { return *p; }
static inline u32 __umulhi(u32 x, u32 y) { return (u32)(((u64)x * y) >> 32); }
#else
typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;
static __device__ __forceinline__ u32 bswap32(u32 x) { return __byte_perm(x, 0, 0x0123); }
#endif

// ---------------------------------------------------------------- GF(2^8)

// Each byte of v times x (the polynomial 0x11d).
static __device__ __forceinline__ u32 xtime4(u32 v) {
    u32 high = v & 0x80808080u;
    return ((v ^ high) << 1) ^ ((high >> 7) * 0x1du);
}

// ------------------------------------------------------- message reading

// A message "prefix || body": prefix of plen <= 8 bytes (little-endian in
// a u64), body 8-byte aligned and n bytes long.
struct Message {
    const u8* body;
    u64 n;
    u64 prefix;
    u32 plen;
};

// The 8 message bytes at offset o (a multiple of 8), little-endian, zero
// past the message's end.
static __device__ __forceinline__ u64 message_le64(const Message& m, u64 o) {
    if (o >= m.plen && o + 8 <= m.plen + m.n) {
        u64 x = o - m.plen;
        const u64* w = (const u64*)(m.body + (x & ~(u64)7));
        u32 shift = (u32)(x & 7) * 8;
        u64 low = w[0];
        return shift ? (low >> shift) | (w[1] << (64 - shift)) : low;
    }
    u64 v = 0;
    for (u32 i = 0; i < 8; i++) {
        u64 p = o + i;
        u64 b = 0;
        if (p < m.plen) {
            b = (m.prefix >> (8 * p)) & 0xff;
        } else if (p < m.plen + m.n) {
            b = m.body[p - m.plen];
        }
        v |= b << (8 * i);
    }
    return v;
}

// -------------------------------------------------------------- SHA3-512

__constant__ u64 KECCAK_ROUND[24] = {
    0x0000000000000001ull, 0x0000000000008082ull, 0x800000000000808aull, 0x8000000080008000ull,
    0x000000000000808bull, 0x0000000080000001ull, 0x8000000080008081ull, 0x8000000000008009ull,
    0x000000000000008aull, 0x0000000000000088ull, 0x0000000080008009ull, 0x000000008000000aull,
    0x000000008000808bull, 0x800000000000008bull, 0x8000000000008089ull, 0x8000000000008003ull,
    0x8000000000008002ull, 0x8000000000000080ull, 0x000000000000800aull, 0x800000008000000aull,
    0x8000000080008081ull, 0x8000000000008080ull, 0x0000000080000001ull, 0x8000000080008008ull,
};

static __device__ __forceinline__ u64 rotl64(u64 x, u32 n) {
    return (x << n) | (x >> (64 - n));
}

// Which way the permutation rotates its 64-bit lanes (NVRTC's
// -DKECCAK_ROT, from TESSERA_CUDA_KECCAK_ROT): 0 with shifts, which the
// GPU runs as two funnel shifts on its integer pipe, the pipe the XORs
// and the chi steps also need; 1 with multiplies by 2^n, which run on
// the multiply-add pipe beside it (`rotl64_mul`).
#ifndef KECCAK_ROT
#define KECCAK_ROT 0
#endif

// 2^n, read from constant memory so that the compiler cannot turn the
// products below back into shifts.
__constant__ u32 KECCAK_POW2[32] = {
    1u << 0, 1u << 1, 1u << 2, 1u << 3, 1u << 4, 1u << 5, 1u << 6, 1u << 7,
    1u << 8, 1u << 9, 1u << 10, 1u << 11, 1u << 12, 1u << 13, 1u << 14, 1u << 15,
    1u << 16, 1u << 17, 1u << 18, 1u << 19, 1u << 20, 1u << 21, 1u << 22, 1u << 23,
    1u << 24, 1u << 25, 1u << 26, 1u << 27, 1u << 28, 1u << 29, 1u << 30, 1u << 31,
};

// x rotated left by n (1 to 63) with three 32-bit multiply-adds. On the
// halves (lo, hi) and for n < 32 (n >= 32 swaps the halves first):
// p = 2^n; lo * p = (lo >> (32 - n)) : (lo << n), and the two parts of
// each product do not overlap, so adding them is OR-ing them:
//   carry = hi(lo * p)                         = lo >> (32 - n)
//   r     = hi * p + carry  (64-bit)           = (hi >> (32 - n)) : new hi
//   new lo = lo(lo * p) + hi(r)                = (lo << n) | (hi >> (32 - n))
//
// On the GPU each step is one PTX instruction (mul.hi, mad.wide, mad.lo),
// written out because the compiler made a 64-bit multiply of the middle
// one; the halves are split and joined with register moves, which cost
// nothing.
#ifdef TESSERA_HOST_TEST
static inline u64 rotl64_mul(u64 x, u32 n) {
    u32 lo = (u32)x, hi = (u32)(x >> 32);
    if (n >= 32) {
        u32 t = lo;
        lo = hi;
        hi = t;
        n -= 32;
    }
    if (n == 0) return ((u64)hi << 32) | lo;
    u32 p = KECCAK_POW2[n];
    u32 carry = __umulhi(lo, p);
    u64 r = (u64)hi * p + carry;
    u32 new_lo = lo * p + (u32)(r >> 32);
    return ((u64)(u32)r << 32) | new_lo;
}
#else
static __device__ __forceinline__ u64 rotl64_mul(u64 x, u32 n) {
    u32 lo, hi;
    asm("mov.b64 {%0, %1}, %2;" : "=r"(lo), "=r"(hi) : "l"(x));
    if (n >= 32) {
        u32 t = lo;
        lo = hi;
        hi = t;
        n -= 32;
    }
    u64 y;
    if (n == 0) {
        asm("mov.b64 %0, {%1, %2};" : "=l"(y) : "r"(lo), "r"(hi));
        return y;
    }
    u32 p = KECCAK_POW2[n];
    u32 carry, r_lo, r_hi, new_lo;
    u64 r;
    asm("mul.hi.u32 %0, %1, %2;" : "=r"(carry) : "r"(lo), "r"(p));
    asm("mad.wide.u32 %0, %1, %2, %3;" : "=l"(r) : "r"(hi), "r"(p), "l"((u64)carry));
    asm("mov.b64 {%0, %1}, %2;" : "=r"(r_lo), "=r"(r_hi) : "l"(r));
    asm("mad.lo.u32 %0, %1, %2, %3;" : "=r"(new_lo) : "r"(lo), "r"(p), "r"(r_hi));
    asm("mov.b64 %0, {%1, %2};" : "=l"(y) : "r"(new_lo), "r"(r_lo));
    return y;
}
#endif

template <int Rot>
static __device__ __forceinline__ u64 keccak_rot(u64 x, u32 n) {
    return Rot == 0 ? rotl64(x, n) : rotl64_mul(x, n);
}

// Keccak-f[1600] on a[x + 5y]. The rounds stay a loop: unrolled (and
// inlined at four call sites) the kernel ran 10% slower on an H200,
// 152.6 GB/s against 170.4, its code no longer fitting the instruction
// cache.
template <int Rot>
static __device__ __forceinline__ void keccak_rounds(u64 a[25]) {
    for (int round = 0; round < 24; round++) {
        u64 c[5], d[5];
#pragma unroll
        for (int x = 0; x < 5; x++) {
            c[x] = a[x] ^ a[x + 5] ^ a[x + 10] ^ a[x + 15] ^ a[x + 20];
        }
#pragma unroll
        for (int x = 0; x < 5; x++) {
            d[x] = c[(x + 4) % 5] ^ keccak_rot<Rot>(c[(x + 1) % 5], 1);
        }
#pragma unroll
        for (int i = 0; i < 25; i++) {
            a[i] ^= d[i % 5];
        }
        // rho and pi: b[y + 5((2x + 3y) % 5)] = rot(a[x + 5y], r[x][y]).
        u64 b[25];
        b[0] = a[0];
        b[10] = keccak_rot<Rot>(a[1], 1);
        b[20] = keccak_rot<Rot>(a[2], 62);
        b[5] = keccak_rot<Rot>(a[3], 28);
        b[15] = keccak_rot<Rot>(a[4], 27);
        b[16] = keccak_rot<Rot>(a[5], 36);
        b[1] = keccak_rot<Rot>(a[6], 44);
        b[11] = keccak_rot<Rot>(a[7], 6);
        b[21] = keccak_rot<Rot>(a[8], 55);
        b[6] = keccak_rot<Rot>(a[9], 20);
        b[7] = keccak_rot<Rot>(a[10], 3);
        b[17] = keccak_rot<Rot>(a[11], 10);
        b[2] = keccak_rot<Rot>(a[12], 43);
        b[12] = keccak_rot<Rot>(a[13], 25);
        b[22] = keccak_rot<Rot>(a[14], 39);
        b[23] = keccak_rot<Rot>(a[15], 41);
        b[8] = keccak_rot<Rot>(a[16], 45);
        b[18] = keccak_rot<Rot>(a[17], 15);
        b[3] = keccak_rot<Rot>(a[18], 21);
        b[13] = keccak_rot<Rot>(a[19], 8);
        b[14] = keccak_rot<Rot>(a[20], 18);
        b[24] = keccak_rot<Rot>(a[21], 2);
        b[9] = keccak_rot<Rot>(a[22], 61);
        b[19] = keccak_rot<Rot>(a[23], 56);
        b[4] = keccak_rot<Rot>(a[24], 14);
#pragma unroll
        for (int y = 0; y < 25; y += 5) {
#pragma unroll
            for (int x = 0; x < 5; x++) {
                a[y + x] = b[y + x] ^ (~b[y + (x + 1) % 5] & b[y + (x + 2) % 5]);
            }
        }
        a[0] ^= KECCAK_ROUND[round];
    }
}

static __device__ __forceinline__ void keccak_f(u64 a[25]) {
    keccak_rounds<KECCAK_ROT>(a);
}

// Where SHA3-512's 72-byte blocks of a message lie: blocks [first, end)
// lie wholly in the body (block b starts at body offset 72b - plen), read
// as aligned words from `w` shifted right by `shift` bits; the others
// (the one holding the prefix, the last ones with the padding) through
// the general reader (`sha3_edge_word`).
struct Sha3Blocks {
    u64 total, blocks, first, end;
    u32 shift;
    const u64* w;
};

static __device__ __forceinline__ Sha3Blocks sha3_blocks(const Message& m) {
    const u64 rate = 72;
    Sha3Blocks p;
    p.total = m.plen + m.n;
    p.blocks = p.total / rate + 1;
    p.first = m.plen == 0 ? 0 : 1;
    p.end = p.total / rate;
    if (p.end < p.first) p.end = p.first;
    u64 x = p.first * rate - m.plen;
    p.shift = (u32)(x & 7) * 8;
    p.w = (const u64*)(m.body + (x & ~(u64)7));
    return p;
}

// Word i of block `block` by the general reader, with SHA3's padding
// (0x06 after the message, 0x80 in the rate's last byte) in the last.
static __device__ __forceinline__ u64 sha3_edge_word(const Message& m, const Sha3Blocks& p, u64 block, u32 i) {
    u64 base = block * 72;
    u64 v = message_le64(m, base + 8 * i);
    if (block + 1 == p.blocks) {
        u64 pad = p.total - base;  // where the padding starts
        if (pad / 8 == i) v ^= 0x06ull << (8 * (pad % 8));
        if (i == 8) v ^= 0x80ull << 56;
    }
    return v;
}

// SHA3-512 of the message; the digest's 64 bytes as 8 little-endian words.
//
// The blocks that lie wholly in the body are read as aligned words: a
// block starts at body offset x = 72 * block - plen, and since 72 is a
// multiple of 8, x mod 8 is the same for every block. So each block is
// the 10 aligned words from x rounded down, shifted by that amount, and
// the 10th word is the next block's first: 9 loads a block where the
// general reader made 18 and tested each word's place. The first block
// (it holds the prefix) and the last ones (the padding) go through the
// general reader. The permutation has one call site, so it is inlined
// once.
static __device__ void sha3_512(const Message& m, u64 out[8]) {
    u64 a[25];
#pragma unroll
    for (int i = 0; i < 25; i++) a[i] = 0;
    Sha3Blocks p = sha3_blocks(m);
    const u32 shift = p.shift;
    const u64* w = p.w;
    u64 next = p.first < p.end && shift != 0 ? __ldg(w) : 0;
    for (u64 block = 0; block < p.blocks; block++) {
        if (block >= p.first && block < p.end) {
            if (shift == 0) {
#pragma unroll
                for (u32 i = 0; i < 9; i++) a[i] ^= __ldg(w + i);
            } else {
                u64 words[10];
                words[0] = next;
#pragma unroll
                for (u32 i = 1; i < 10; i++) words[i] = __ldg(w + i);
                next = words[9];
#pragma unroll
                for (u32 i = 0; i < 9; i++) a[i] ^= (words[i] >> shift) | (words[i + 1] << (64 - shift));
            }
            w += 9;
        } else {
#pragma unroll
            for (u32 i = 0; i < 9; i++) a[i] ^= sha3_edge_word(m, p, block, i);
        }
        keccak_f(a);
    }
#pragma unroll
    for (int i = 0; i < 8; i++) out[i] = a[i];
}

// ------------------------------------------- SHA3-512, a warp a message
//
// The kernels above give each message one thread: the most messages a
// second when there are tens of thousands to hash, but a lone 64 KiB
// message takes that thread about 900 permutations in a row, some 5 ms
// on an H100/H200. The array's batches are far smaller than the GPU (a
// write's 16 extents, a FLUSH's few stripes), so they wait that long
// whatever their size. Here a warp holds one state, lane t < 25 its
// lane a[t] (x = t % 5, y = t / 5), and a round is a few steps on every
// lane at once with the others' values fetched by warp shuffles: 9
// shuffles of 64 bits a round (theta's column parities 4 and its two
// neighbours 2, pi 1, chi 2). A permutation takes fewer dependent
// steps, at the price of the shuffles: the shuffle unit, one warp-wide
// shuffle a clock per SM, caps the whole GPU near 43 GB/s by count (38
// measured on an H200), a fifth of the thread-a-message kernels, so the
// host picks this formulation only for launches of few messages
// (`Cuda::hash_form`; a lone 64 KiB message in 2.4 ms against 4.7). Lanes 25 to 31 compute
// values nobody reads.
//
// The code is written on values of a whole warp (`Lanes`: one u64 a
// lane), so that the host build runs the same steps, with a warp of 32
// values and a shuffle that gathers.

__constant__ u32 KECCAK_RHO[25] = {
    0, 1, 62, 28, 27, 36, 44, 6, 55, 20, 3, 10, 43, 25, 39, 41, 45, 15, 21, 8, 18, 2, 61, 56, 14,
};

#ifdef TESSERA_HOST_TEST
struct Lanes {
    u64 v[32];
};
template <class F>
static inline Lanes lanes(F f) {
    Lanes r;
    for (u32 t = 0; t < 32; t++) r.v[t] = f(t);
    return r;
}
static inline Lanes operator^(const Lanes& a, const Lanes& b) {
    return lanes([&](u32 t) { return a.v[t] ^ b.v[t]; });
}
// ~b & c (chi), as one operation so that the host needs no more operators.
static inline Lanes andn(const Lanes& b, const Lanes& c) {
    return lanes([&](u32 t) { return ~b.v[t] & c.v[t]; });
}
static inline Lanes shfl(const Lanes& a, const Lanes& from) {
    return lanes([&](u32 t) { return a.v[from.v[t] & 31]; });
}
static inline Lanes rotl_lanes(const Lanes& x, const Lanes& n) {
    return lanes([&](u32 t) { return n.v[t] == 0 ? x.v[t] : rotl64(x.v[t], (u32)n.v[t]); });
}
static inline Lanes rotl1_lanes(const Lanes& x) {
    return lanes([&](u32 t) { return rotl64(x.v[t], 1); });
}
static inline void store_lanes(const Lanes& a, u64* out, u32 n) {
    for (u32 t = 0; t < n; t++) out[t] = a.v[t];
}
#else
typedef u64 Lanes;
template <class F>
static __device__ __forceinline__ Lanes lanes(F f) {
    return f(threadIdx.x & 31);
}
static __device__ __forceinline__ Lanes andn(Lanes b, Lanes c) { return ~b & c; }
static __device__ __forceinline__ Lanes shfl(Lanes a, Lanes from) {
    return __shfl_sync(0xffffffffu, a, (int)from);
}
// x rotated left by n (0 to 63, a different amount on every lane): the
// halves swapped where n >= 32, then two funnel shifts (which take n mod 32).
static __device__ __forceinline__ Lanes rotl_lanes(Lanes x, Lanes n) {
    u32 lo = (u32)x, hi = (u32)(x >> 32), k = (u32)n;
    if (k >= 32) {
        u32 t = lo;
        lo = hi;
        hi = t;
    }
    u32 new_hi = __funnelshift_l(lo, hi, k);
    u32 new_lo = __funnelshift_l(hi, lo, k);
    return ((u64)new_hi << 32) | new_lo;
}
static __device__ __forceinline__ Lanes rotl1_lanes(Lanes x) { return rotl64(x, 1); }
static __device__ __forceinline__ void store_lanes(Lanes a, u64* out, u32 n) {
    u32 t = threadIdx.x & 31;
    if (t < n) out[t] = a;
}
#endif

// Where each lane fetches from, fixed for a warp's life. Lane q = x + 5y
// (lanes past 24 act as lane 0): theta's column is the lanes x + 5y' and
// its neighbours' parities are on lanes (x -+ 1) + 5y; pi puts a[x + 5y]
// at b[y + 5(2x + 3y)], so lane X + 5Y takes lane x + 5X with
// x = 3(Y - 3X) mod 5 (3 is 2's inverse mod 5); chi reads (X + 1, Y)
// and (X + 2, Y).
struct KeccakLanes {
    Lanes column[4], left, right, rho, pi, chi1, chi2;
};

static __device__ __forceinline__ u32 keccak_lane(u32 t) { return t < 25 ? t : 0; }

static __device__ __forceinline__ KeccakLanes keccak_lanes() {
    KeccakLanes k;
#pragma unroll
    for (u32 j = 0; j < 4; j++) {
        k.column[j] = lanes([=](u32 t) -> u64 {
            u32 q = keccak_lane(t);
            return q % 5 + 5 * ((q / 5 + 1 + j) % 5);
        });
    }
    k.left = lanes([](u32 t) -> u64 { u32 q = keccak_lane(t); return (q % 5 + 4) % 5 + 5 * (q / 5); });
    k.right = lanes([](u32 t) -> u64 { u32 q = keccak_lane(t); return (q % 5 + 1) % 5 + 5 * (q / 5); });
    k.rho = lanes([](u32 t) -> u64 { return KECCAK_RHO[keccak_lane(t)]; });
    k.pi = lanes([](u32 t) -> u64 {
        u32 q = keccak_lane(t), X = q % 5, Y = q / 5;
        return 3 * (Y + 15 - 3 * X) % 5 + 5 * X;
    });
    k.chi1 = lanes([](u32 t) -> u64 { u32 q = keccak_lane(t); return (q % 5 + 1) % 5 + 5 * (q / 5); });
    k.chi2 = lanes([](u32 t) -> u64 { u32 q = keccak_lane(t); return (q % 5 + 2) % 5 + 5 * (q / 5); });
    return k;
}

static __device__ __forceinline__ void keccak_warp(Lanes& a, const KeccakLanes& k) {
    for (int round = 0; round < 24; round++) {
        Lanes c = a ^ shfl(a, k.column[0]) ^ shfl(a, k.column[1]) ^ shfl(a, k.column[2]) ^ shfl(a, k.column[3]);
        a = a ^ shfl(c, k.left) ^ rotl1_lanes(shfl(c, k.right));
        Lanes b = shfl(rotl_lanes(a, k.rho), k.pi);
        a = b ^ andn(shfl(b, k.chi1), shfl(b, k.chi2));
        u64 constant = KECCAK_ROUND[round];
        a = a ^ lanes([=](u32 t) -> u64 { return t == 0 ? constant : 0; });
    }
}

// SHA3-512 of the message by a whole warp (every lane must call it with
// the same message); lanes 0 to 7 write the digest's 8 words to out.
// Blocks are read as in sha3_512: aligned words where a block lies
// wholly in the body, the general reader at the edges; lane t < 9 reads
// the block's word t.
static __device__ void sha3_512_warp(const Message& m, u64* out) {
    KeccakLanes k = keccak_lanes();
    Lanes a = lanes([](u32) -> u64 { return 0; });
    Sha3Blocks p = sha3_blocks(m);
    const u32 shift = p.shift;
    const u64* w = p.w;
    for (u64 block = 0; block < p.blocks; block++) {
        Lanes word;
        if (block >= p.first && block < p.end) {
            word = lanes([&](u32 t) -> u64 {
                if (t >= 9) return 0;
                u64 low = __ldg(w + t);
                return shift == 0 ? low : (low >> shift) | (__ldg(w + t + 1) << (64 - shift));
            });
            w += 9;
        } else {
            word = lanes([&](u32 t) -> u64 { return t < 9 ? sha3_edge_word(m, p, block, t) : 0; });
        }
        a = a ^ word;
        keccak_warp(a, k);
    }
    store_lanes(a, out, 8);
}

// ---------------------------------------------------------------- SHA-256

__constant__ u32 SHA256_K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static __device__ __forceinline__ u32 rotr32(u32 x, u32 n) {
    return (x >> n) | (x << (32 - n));
}

// SHA-256 of the message; the digest's 32 bytes as 4 little-endian words.
static __device__ void sha256(const Message& m, u64 out[8]) {
    u32 h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    u64 total = m.plen + m.n;
    u64 blocks = (total + 8) / 64 + 1;
    for (u64 block = 0; block < blocks; block++) {
        u64 base = block * 64;
        u32 w[16];
#pragma unroll
        for (u32 i = 0; i < 8; i++) {
            u64 o = base + 8 * i;
            u64 v = message_le64(m, o);
            if (total >= o && total < o + 8) v |= 0x80ull << (8 * (total - o));
            w[2 * i] = bswap32((u32)v);
            w[2 * i + 1] = bswap32((u32)(v >> 32));
        }
        if (block + 1 == blocks) {
            u64 bits = total * 8;
            w[14] = (u32)(bits >> 32);
            w[15] = (u32)bits;
        }
        u32 a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
#pragma unroll
        for (int t = 0; t < 64; t++) {
            u32 wt;
            if (t < 16) {
                wt = w[t];
            } else {
                u32 w15 = w[(t + 1) & 15], w2 = w[(t + 14) & 15];
                u32 s0 = rotr32(w15, 7) ^ rotr32(w15, 18) ^ (w15 >> 3);
                u32 s1 = rotr32(w2, 17) ^ rotr32(w2, 19) ^ (w2 >> 10);
                wt = w[t & 15] + s0 + w[(t + 9) & 15] + s1;
                w[t & 15] = wt;
            }
            u32 t1 = k + (rotr32(e, 6) ^ rotr32(e, 11) ^ rotr32(e, 25)) + ((e & f) ^ (~e & g)) + SHA256_K[t] + wt;
            u32 t2 = (rotr32(a, 2) ^ rotr32(a, 13) ^ rotr32(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
            k = g;
            g = f;
            f = e;
            e = d + t1;
            d = c;
            c = b;
            b = a;
            a = t1 + t2;
        }
        h[0] += a; h[1] += b; h[2] += c; h[3] += d;
        h[4] += e; h[5] += f; h[6] += g; h[7] += k;
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        out[i] = (u64)bswap32(h[2 * i]) | ((u64)bswap32(h[2 * i + 1]) << 32);
    }
#pragma unroll
    for (int i = 4; i < 8; i++) out[i] = 0;
}

// Algorithm numbers shared with the host.
#define ALG_SHA256 0
#define ALG_SHA3_512 1

static __device__ __forceinline__ void digest(int algorithm, const Message& m, u64 out[8]) {
    if (algorithm == ALG_SHA3_512) {
        sha3_512(m, out);
    } else {
        sha256(m, out);
    }
}

static __device__ __forceinline__ u32 digest_words(int algorithm) {
    return algorithm == ALG_SHA3_512 ? 8 : 4;
}

#ifndef TESSERA_HOST_TEST

// ------------------------------------------------------------- kernels

// out[r] = sum over j of c[r][j] * in[j], for the `rows` outputs of every
// stripe: inputs are slots src[0..k), outputs slots dst[0..rows), and
// masks[(r * k + j) * 8 + b] is all ones where bit b of c[r][j] is set.
// Each thread computes 16 bytes of ROWS outputs; blockIdx.y picks which
// ROWS rows (a wide matrix takes several passes over its inputs).
#define ROWS 8
extern "C" __global__ void __launch_bounds__(256) gf_dot(
    u8* buffer, u32 width, u64 slot, u64 stripes, const u32* params, u32 k, u32 rows) {
    const u32* src = params;
    const u32* dst = params + k;
    const uint4* masks = (const uint4*)(params + ((k + rows + 3) & ~3u));
    u32 row0 = blockIdx.y * ROWS;
    u32 here = rows - row0 < ROWS ? rows - row0 : ROWS;
    u64 units = slot / 16;
    u64 total = stripes * units;
    for (u64 unit = blockIdx.x * (u64)blockDim.x + threadIdx.x; unit < total;
         unit += (u64)gridDim.x * blockDim.x) {
        u64 stripe = unit / units;
        u64 offset = (unit % units) * 16;
        u8* base = buffer + stripe * width * slot + offset;
        uint4 acc[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; r++) acc[r] = make_uint4(0, 0, 0, 0);
        for (u32 j = 0; j < k; j++) {
            uint4 m[8];
            m[0] = *(const uint4*)(base + src[j] * slot);
#pragma unroll
            for (int b = 1; b < 8; b++) {
                m[b].x = xtime4(m[b - 1].x);
                m[b].y = xtime4(m[b - 1].y);
                m[b].z = xtime4(m[b - 1].z);
                m[b].w = xtime4(m[b - 1].w);
            }
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                if (r < here) {
                    const uint4* mask = masks + ((row0 + r) * k + j) * 2;
                    uint4 lo = mask[0], hi = mask[1];
                    u32 bits[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
                    for (int b = 0; b < 8; b++) {
                        acc[r].x ^= m[b].x & bits[b];
                        acc[r].y ^= m[b].y & bits[b];
                        acc[r].z ^= m[b].z & bits[b];
                        acc[r].w ^= m[b].w & bits[b];
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            if (r < here) *(uint4*)(base + dst[row0 + r] * slot) = acc[r];
        }
    }
}

// The Merkle leaf of every chunk: count = stripes * width chunks of
// `bytes` bytes each in their slots; leaf i goes to leaves + i * 64.
extern "C" __global__ void __launch_bounds__(128) leaves(
    int algorithm, const u8* buffer, u32 width, u64 slot, u64 bytes, u64 count, u64* leaves_out) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < count;
         i += (u64)gridDim.x * blockDim.x) {
        u64 index = i % width;
        Message m = {buffer + i * slot, bytes, (u64)0x00 | (index << 8), 5};
        u64 out[8];
        digest(algorithm, m, out);
#pragma unroll
        for (int w = 0; w < 8; w++) leaves_out[i * 8 + w] = out[w];
    }
}

// The digest of each of `count` buffers: offsets[i] (8-byte aligned) and
// lengths[i] into `buffer`; digest i goes to out + i * 64.
extern "C" __global__ void __launch_bounds__(128) digests(
    int algorithm, const u8* buffer, const u64* offsets, const u64* lengths, u64 count, u64* out) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < count;
         i += (u64)gridDim.x * blockDim.x) {
        Message m = {buffer + offsets[i], lengths[i], 0, 0};
        u64 d[8];
        digest(algorithm, m, d);
#pragma unroll
        for (int w = 0; w < 8; w++) out[i * 8 + w] = d[w];
    }
}

// As `leaves` and `digests` for SHA3-512, a warp a message (see
// sha3_512_warp): blocks of 128 threads, four messages a block.
extern "C" __global__ void __launch_bounds__(128) leaves_warp(
    const u8* buffer, u32 width, u64 slot, u64 bytes, u64 count, u64* leaves_out) {
    u64 warps = (u64)gridDim.x * blockDim.x / 32;
    for (u64 i = (blockIdx.x * (u64)blockDim.x + threadIdx.x) / 32; i < count; i += warps) {
        u64 index = i % width;
        Message m = {buffer + i * slot, bytes, (u64)0x00 | (index << 8), 5};
        sha3_512_warp(m, leaves_out + i * 8);
    }
}

extern "C" __global__ void __launch_bounds__(128) digests_warp(
    const u8* buffer, const u64* offsets, const u64* lengths, u64 count, u64* out) {
    u64 warps = (u64)gridDim.x * blockDim.x / 32;
    for (u64 i = (blockIdx.x * (u64)blockDim.x + threadIdx.x) / 32; i < count; i += warps) {
        Message m = {buffer + offsets[i], lengths[i], 0, 0};
        sha3_512_warp(m, out + i * 8);
    }
}

// The Merkle root of each stripe's `width` leaves (64-byte slots, of which
// the digest's bytes are used), built level by level in shared memory as
// `tessera_checksum::merkle` builds it: node(l, r) = H(0x01 || l || r),
// a node without a partner carried up unchanged. One block per stripe.
extern "C" __global__ void __launch_bounds__(128) roots(
    int algorithm, const u64* leaves_in, u32 width, u64* roots_out) {
    __shared__ u64 level[256 * 8];
    u32 words = digest_words(algorithm);
    const u64* mine = leaves_in + (u64)blockIdx.x * width * 8;
    for (u32 i = threadIdx.x; i < width; i += blockDim.x) {
        // Digests packed end to end, so that a pair is one message body.
        for (u32 w = 0; w < words; w++) level[i * words + w] = mine[i * 8 + w];
    }
    __syncthreads();
    for (u32 count = width; count > 1; count = (count + 1) / 2) {
        u32 pairs = (count + 1) / 2;
        for (u32 base = 0; base < pairs; base += blockDim.x) {
            u32 i = base + threadIdx.x;
            u64 node[8];
            if (i < pairs) {
                if (2 * i + 1 < count) {
                    Message m = {(const u8*)&level[2 * i * words], (u64)words * 16, 0x01, 1};
                    digest(algorithm, m, node);
                } else {
                    for (u32 w = 0; w < words; w++) node[w] = level[2 * i * words + w];
                }
            }
            __syncthreads();
            if (i < pairs) {
                for (u32 w = 0; w < words; w++) level[i * words + w] = node[w];
            }
            __syncthreads();
        }
    }
    if (threadIdx.x == 0) {
        for (u32 w = 0; w < 8; w++) roots_out[(u64)blockIdx.x * 8 + w] = w < words ? level[w] : 0;
    }
}

#endif
