// What limits the SHA3-512 kernels (`tessera bench hash --accel cuda`,
// `cuda::bench::ceiling`): compiled after kernels.cu, whose permutation
// they run.
//
// - probe_lop3, probe_shf, probe_imad: eight independent chains per
//   thread of one instruction each (a three-input XOR, a funnel shift, a
//   multiply-add), kept by `asm volatile` from being folded; their rate
//   is the GPU's issue rate for that kind of instruction.
// - probe_keccak_*: Keccak-f[1600] on a state in registers, `perms`
//   times per thread, no memory touched: the most SHA3 can do with this
//   permutation, 72 bytes of SHA3-512 input per permutation.

#define PROBE_CHAINS(INSTRUCTION)                                                \
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;                               \
    u32 v[8];                                                                    \
    _Pragma("unroll") for (int j = 0; j < 8; j++) v[j] = i * 0x9e3779b9u + j;    \
    u32 b = i ^ 0x5bd1e995u, c = i * 3u + 1u;                                    \
    for (u32 it = 0; it < iterations; it++) {                                    \
        _Pragma("unroll") for (int u = 0; u < 4; u++) {                          \
            _Pragma("unroll") for (int j = 0; j < 8; j++) INSTRUCTION;           \
        }                                                                        \
    }                                                                            \
    u32 x = 0;                                                                   \
    _Pragma("unroll") for (int j = 0; j < 8; j++) x ^= v[j];                     \
    out[i] = x;

// 32 instructions an iteration.
extern "C" __global__ void __launch_bounds__(128) probe_lop3(u32 iterations, u32* out) {
    PROBE_CHAINS(asm volatile("lop3.b32 %0, %0, %1, %2, 0x96;" : "+r"(v[j]) : "r"(b), "r"(c)))
}

extern "C" __global__ void __launch_bounds__(128) probe_shf(u32 iterations, u32* out) {
    PROBE_CHAINS(asm volatile("shf.l.wrap.b32 %0, %0, %1, %2;" : "+r"(v[j]) : "r"(b), "r"(c)))
}

extern "C" __global__ void __launch_bounds__(128) probe_imad(u32 iterations, u32* out) {
    PROBE_CHAINS(asm volatile("mad.lo.u32 %0, %0, %1, %2;" : "+r"(v[j]) : "r"(b), "r"(c)))
}

template <int Rot>
static __device__ __forceinline__ void probe_keccak(u32 perms, u64* out) {
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    u64 a[25];
#pragma unroll
    for (int k = 0; k < 25; k++) a[k] = (i + 1) * 0x9e3779b97f4a7c15ull ^ (u64)k;
    for (u32 r = 0; r < perms; r++) keccak_rounds<Rot>(a);
    u64 x = 0;
#pragma unroll
    for (int k = 0; k < 25; k++) x ^= a[k];
    out[i] = x;
}

extern "C" __global__ void __launch_bounds__(128) probe_keccak_shifts(u32 perms, u64* out) {
    probe_keccak<0>(perms, out);
}

extern "C" __global__ void __launch_bounds__(128) probe_keccak_multiplies(u32 perms, u64* out) {
    probe_keccak<1>(perms, out);
}
