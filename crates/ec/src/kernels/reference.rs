//! The portable kernel: the definition of the dot product, one byte at a time.

use super::Coefficients;
use crate::gf;

/// `outputs[r] (^)= sum_j c[r][j] * inputs[j]`, byte by byte.
pub fn dot(coefficients: &Coefficients, inputs: &[&[u8]], outputs: &mut [&mut [u8]], accumulate: bool) {
    for (r, output) in outputs.iter_mut().enumerate() {
        if !accumulate {
            output.fill(0);
        }
        for (j, input) in inputs.iter().enumerate() {
            let c = coefficients.get(r, j);
            if c == 0 {
                continue;
            }
            for (o, &x) in output.iter_mut().zip(input.iter()) {
                *o ^= gf::mul(c, x);
            }
        }
    }
}
