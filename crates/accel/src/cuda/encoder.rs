//! Encoding kernels specialised to one shape: the Cauchy coefficients are
//! compiled in, so each parity row is a fixed network of XORs and
//! doublings instead of the generic kernel's mask per coefficient bit.
//!
//! Each thread owns 8 bytes of a stripe and up to [`GROUP`] parity rows.
//! For row r it XORs every data word whose coefficient has bit b set into
//! plane s[r][b], then folds the planes by Horner's rule,
//! p = (((s7 * x) ^ s6) * x ^ ...) ^ s0, so a coefficient costs its set
//! bits in XORs and a row 7 doublings, whatever K is. A shape with more
//! than GROUP parity rows gets a kernel per group of rows.

use std::fmt::Write;

/// The widest K given kernels of its own: wider ones use the generic
/// kernel. On an H100, 200+16 compiled this way ran at 41 GB/s against the
/// generic kernel's 265 (the unrolled loads of 200 inputs spill), while
/// 92+8 ran at 1,268 against 557; NVRTC also takes seconds on wide shapes.
pub const DATA_MAX: usize = 128;

/// Parity rows one kernel computes (8 planes of 2 words each per row live
/// in registers: 64 for four rows).
pub const GROUP: usize = 4;

/// The kernels' source for K data and the `parity` rows of `matrix`
/// (row-major, parity x K): `encode_0`, `encode_1`, ... each computing rows
/// [g * GROUP, (g + 1) * GROUP).
pub fn source(k: usize, rows: &[u8], parity: usize) -> String {
    assert_eq!(rows.len(), k * parity);
    let mut s = String::new();
    s.push_str(
        "typedef unsigned char u8; typedef unsigned int u32; typedef unsigned long long u64;\n\
         static __device__ __forceinline__ u32 xt(u32 v) {\n\
         \x20   u32 h = v & 0x80808080u;\n\
         \x20   return ((v ^ h) << 1) ^ ((h >> 7) * 0x1du);\n\
         }\n",
    );
    for (g, first) in (0..parity).step_by(GROUP).enumerate() {
        let group: Vec<usize> = (first..parity.min(first + GROUP)).collect();
        let _ = writeln!(
            s,
            "extern \"C\" __global__ void __launch_bounds__(256) encode_{g}(u8* buffer, u32 width, u64 slot, u64 stripes) {{\n\
             \x20   u64 units = slot / 8, total = stripes * units;\n\
             \x20   for (u64 unit = blockIdx.x * (u64)blockDim.x + threadIdx.x; unit < total; unit += (u64)gridDim.x * blockDim.x) {{\n\
             \x20       u8* base = buffer + (unit / units) * width * slot + (unit % units) * 8;"
        );
        for &r in &group {
            for b in 0..8 {
                let _ = writeln!(s, "        uint2 s{r}_{b} = make_uint2(0, 0);");
            }
        }
        for j in 0..k {
            let _ = writeln!(s, "        {{ uint2 d = *(const uint2*)(base + {j} * slot);");
            for &r in &group {
                let c = rows[r * k + j];
                for b in 0..8 {
                    if c >> b & 1 == 1 {
                        let _ = writeln!(s, "          s{r}_{b}.x ^= d.x; s{r}_{b}.y ^= d.y;");
                    }
                }
            }
            s.push_str("        }\n");
        }
        for &r in &group {
            let _ = writeln!(s, "        {{ uint2 p = s{r}_7;");
            for b in (0..7).rev() {
                let _ = writeln!(s, "          p.x = xt(p.x) ^ s{r}_{b}.x; p.y = xt(p.y) ^ s{r}_{b}.y;");
            }
            let _ = writeln!(s, "          *(uint2*)(base + {} * slot) = p; }}", k + r);
        }
        s.push_str("    }\n}\n");
    }
    s
}

/// Kernels per shape.
pub fn kernels(parity: usize) -> usize {
    parity.div_ceil(GROUP)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the generated network on the host, a byte at a time, the way
    /// the kernel runs it on words: planes, then Horner's rule.
    fn host_encode(k: usize, rows: &[u8], parity: usize, data: &[u8]) -> Vec<u8> {
        let xt = |v: u8| (v << 1) ^ if v & 0x80 != 0 { 0x1d } else { 0 };
        (0..parity)
            .map(|r| {
                let mut planes = [0u8; 8];
                for j in 0..k {
                    for (b, plane) in planes.iter_mut().enumerate() {
                        if rows[r * k + j] >> b & 1 == 1 {
                            *plane ^= data[j];
                        }
                    }
                }
                (0..7).rev().fold(planes[7], |p, b| xt(p) ^ planes[b])
            })
            .collect()
    }

    #[test]
    fn planes_and_horners_rule_give_the_codecs_parity() {
        for (k, m) in [(1, 1), (4, 2), (10, 4), (17, 9), (200, 16)] {
            let codec = tessera_ec::Codec::new(k, m, tessera_ec::MatrixKind::Cauchy).expect("shape");
            let rows = &codec.encoding_matrix()[k * k..];
            let data: Vec<u8> = (0..k).map(|j| (j * 37 + 11) as u8).collect();
            let inputs: Vec<&[u8]> = data.chunks(1).collect();
            let mut parity = vec![0u8; m];
            let mut outputs: Vec<&mut [u8]> = parity.chunks_mut(1).collect();
            codec.encode(&inputs, &mut outputs).expect("encode");
            assert_eq!(host_encode(k, rows, m, &data), parity, "{k}+{m}");
            let text = source(k, rows, m);
            assert_eq!(text.matches("__global__").count(), kernels(m));
            assert!(text.contains(&format!("base + {} * slot) = p;", k + m - 1)));
        }
    }
}
