//! Encoding kernels specialised to one shape: the Cauchy coefficients are
//! compiled in, so each parity row is a fixed network of XORs and
//! doublings instead of the generic kernel's mask per coefficient bit.
//!
//! Each thread owns 8 bytes of a stripe and up to `group` parity rows.
//! For row r it XORs every data word whose coefficient has bit b set into
//! plane s[r][b], then folds the planes by Horner's rule,
//! p = (((s7 * x) ^ s6) * x ^ ...) ^ s0, so a coefficient costs its set
//! bits in XORs and a row 7 doublings, whatever K is.
//!
//! A shape gets a kernel per group of parity rows and per group of at
//! most [`INPUTS_MAX`] data chunks. Since parity is linear in the data,
//! the kernels of the first input group write their rows and the others
//! add (XOR) theirs in, launched after them on the same stream. Cutting
//! the inputs keeps each kernel's code small: on an H200, 200+16 as
//! kernels of all 200 inputs ran at 40-54 GB/s (41 on an H100), as four
//! kernels of 100 inputs at 1,125, and 92+8 as one kernel at 2,527.

use std::fmt::Write;

/// The widest K given kernels of its own by default: every K a shape can
/// have, so encoding never uses the generic kernel (which rebuilds still
/// use). `TESSERA_CUDA_OWN_MAX` sets a lower bound, to measure the
/// generic kernel against a shape's own.
pub const DATA_MAX: usize = 256;

/// Parity rows one kernel computes by default (8 planes of 2 words each
/// per row live in registers: 128 for eight rows). On an H200, 92+8 ran
/// at 2,527 GB/s with 8 rows a kernel against 1,589 with 4 (each kernel
/// reads every input). `TESSERA_CUDA_GROUP` sets another (measurements).
pub const GROUP: usize = 8;

/// Data chunks one kernel reads at most.
pub const INPUTS_MAX: usize = 128;

/// How a shape's kernels are generated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// The widest K given kernels of its own.
    pub data_max: usize,
    /// Parity rows per kernel.
    pub group: usize,
}

impl Tuning {
    /// The defaults, or what the environment says (for measurements).
    pub fn from_env() -> Tuning {
        let read = |name: &str, default: usize| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse::<usize>().ok())
                .filter(|&v| v > 0)
                .unwrap_or(default)
        };
        Tuning {
            data_max: read("TESSERA_CUDA_OWN_MAX", DATA_MAX),
            group: read("TESSERA_CUDA_GROUP", GROUP).min(16),
        }
    }
}

/// The input groups of K data chunks: near-equal runs of at most
/// [`INPUTS_MAX`], as (first, end).
fn input_groups(k: usize) -> Vec<(usize, usize)> {
    let groups = k.div_ceil(INPUTS_MAX).max(1);
    let per = k.div_ceil(groups);
    (0..k).step_by(per).map(|first| (first, (first + per).min(k))).collect()
}

/// The kernels' source for K data and the `parity` rows of `matrix`
/// (row-major, parity x K): `encode_0`, `encode_1`, ..., to be launched
/// in that order (see [`kernels`]).
pub fn source(k: usize, rows: &[u8], parity: usize, group: usize) -> String {
    assert_eq!(rows.len(), k * parity);
    let mut s = String::new();
    s.push_str(
        "typedef unsigned char u8; typedef unsigned int u32; typedef unsigned long long u64;\n\
         static __device__ __forceinline__ u32 xt(u32 v) {\n\
         \x20   u32 h = v & 0x80808080u;\n\
         \x20   return ((v ^ h) << 1) ^ ((h >> 7) * 0x1du);\n\
         }\n",
    );
    let mut number = 0;
    for (h, &(lo, hi)) in input_groups(k).iter().enumerate() {
        for first in (0..parity).step_by(group) {
            let rows_here: Vec<usize> = (first..parity.min(first + group)).collect();
            let _ = writeln!(
                s,
                "// rows {first}..{}, inputs {lo}..{hi}\n\
                 extern \"C\" __global__ void __launch_bounds__(256) encode_{number}(u8* buffer, u32 width, u64 slot, u64 stripes) {{\n\
                 \x20   u64 units = slot / 8, total = stripes * units;\n\
                 \x20   for (u64 unit = blockIdx.x * (u64)blockDim.x + threadIdx.x; unit < total; unit += (u64)gridDim.x * blockDim.x) {{\n\
                 \x20       u8* base = buffer + (unit / units) * width * slot + (unit % units) * 8;",
                first + rows_here.len()
            );
            number += 1;
            for &r in &rows_here {
                for b in 0..8 {
                    let _ = writeln!(s, "        uint2 s{r}_{b} = make_uint2(0, 0);");
                }
            }
            for j in lo..hi {
                let _ = writeln!(s, "        {{ uint2 d = *(const uint2*)(base + {j} * slot);");
                for &r in &rows_here {
                    let c = rows[r * k + j];
                    for b in 0..8 {
                        if c >> b & 1 == 1 {
                            let _ = writeln!(s, "          s{r}_{b}.x ^= d.x; s{r}_{b}.y ^= d.y;");
                        }
                    }
                }
                s.push_str("        }\n");
            }
            for &r in &rows_here {
                let _ = writeln!(s, "        {{ uint2 p = s{r}_7;");
                for b in (0..7).rev() {
                    let _ = writeln!(s, "          p.x = xt(p.x) ^ s{r}_{b}.x; p.y = xt(p.y) ^ s{r}_{b}.y;");
                }
                let out = format!("*(uint2*)(base + {} * slot)", k + r);
                if h == 0 {
                    let _ = writeln!(s, "          {out} = p; }}");
                } else {
                    let _ = writeln!(s, "          uint2 q = {out}; q.x ^= p.x; q.y ^= p.y; {out} = q; }}");
                }
            }
            s.push_str("    }\n}\n");
        }
    }
    s
}

/// Kernels per shape: one per group of rows and group of inputs, the
/// first input group's (which write the parity) first.
pub fn kernels(k: usize, parity: usize, group: usize) -> usize {
    input_groups(k).len() * parity.div_ceil(group)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the generated networks on the host, a byte at a time, the way
    /// the kernels run them on words: per input group, planes, then
    /// Horner's rule, the groups' results added.
    fn host_encode(k: usize, rows: &[u8], parity: usize, data: &[u8]) -> Vec<u8> {
        let xt = |v: u8| (v << 1) ^ if v & 0x80 != 0 { 0x1d } else { 0 };
        (0..parity)
            .map(|r| {
                input_groups(k).iter().fold(0u8, |sum, &(lo, hi)| {
                    let mut planes = [0u8; 8];
                    for j in lo..hi {
                        for (b, plane) in planes.iter_mut().enumerate() {
                            if rows[r * k + j] >> b & 1 == 1 {
                                *plane ^= data[j];
                            }
                        }
                    }
                    sum ^ (0..7).rev().fold(planes[7], |p, b| xt(p) ^ planes[b])
                })
            })
            .collect()
    }

    #[test]
    fn planes_and_horners_rule_give_the_codecs_parity() {
        for (k, m) in [(1, 1), (4, 2), (10, 4), (17, 9), (129, 3), (200, 16), (255, 1)] {
            let codec = tessera_ec::Codec::new(k, m, tessera_ec::MatrixKind::Cauchy).expect("shape");
            let rows = &codec.encoding_matrix()[k * k..];
            let data: Vec<u8> = (0..k).map(|j| (j * 37 + 11) as u8).collect();
            let inputs: Vec<&[u8]> = data.chunks(1).collect();
            let mut parity = vec![0u8; m];
            let mut outputs: Vec<&mut [u8]> = parity.chunks_mut(1).collect();
            codec.encode(&inputs, &mut outputs).expect("encode");
            assert_eq!(host_encode(k, rows, m, &data), parity, "{k}+{m}");
            for group in [4, GROUP] {
                let text = source(k, rows, m, group);
                assert_eq!(text.matches("__global__").count(), kernels(k, m, group));
                assert!(text.contains(&format!("base + {} * slot) = p;", k + m - 1)));
                // Wide shapes add the later input groups' parts in.
                assert_eq!(text.contains("q.x ^= p.x"), k > INPUTS_MAX);
            }
            let text = source(k, rows, m, GROUP);
            assert!(text.contains(&format!("base + {} * slot) = p;", k + m - 1)));
        }
    }
}
