//! The NEON kernel for aarch64 (AWS Graviton, Ampere, NVIDIA Grace): the
//! nibble method on 16-byte vectors, a product being two `tbl` lookups
//! (`vqtbl1q_u8`) of the coefficient's two 16-entry tables, as ISA-L's
//! NEON code does it.
//!
//! The loop is the x86 kernels' in-registers loop (`x86.rs`): a group of
//! up to `GROUP_MAX` output rows accumulates in registers while every
//! input passes, `UNROLL` vectors of each input a step, so each table
//! pair loaded serves all of them. aarch64 has thirty-two 128-bit
//! registers: eight rows of two vectors take sixteen accumulators, the
//! inputs' nibbles four, a table pair two. SVE would give wider vectors
//! on some of these cores, but its intrinsics are not in stable Rust.
//!
//! Its speed has not been measured on an ARM core (none is at hand: the
//! tests run it under qemu-aarch64, which checks the bytes, not the
//! time); see docs/PERFORMANCE.md for what the design should reach.

// Indexed loops over the const G rows keep the register arrays explicit.
#![allow(clippy::needless_range_loop)]

use super::Coefficients;
use std::arch::aarch64::*;

/// Rows accumulated in registers at once.
const GROUP_MAX: usize = 8;
/// Vectors of each input taken per step.
const UNROLL: usize = 2;
const WIDTH: usize = 16;

/// Runs the kernel over the longest prefix that is whole vectors; returns its length.
pub fn dot(coefficients: &Coefficients, inputs: &[&[u8]], outputs: &mut [&mut [u8]], accumulate: bool) -> usize {
    let len = inputs[0].len();
    let done = len / WIDTH * WIDTH;
    let input_pointers: Vec<*const u8> = inputs.iter().map(|i| i.as_ptr()).collect();
    let output_pointers: Vec<*mut u8> = outputs.iter_mut().map(|o| o.as_mut_ptr()).collect();
    let tables: *const u8 = coefficients.nibble_tables.as_ptr().cast();
    let rows = coefficients.rows;
    let mut first = 0;
    while first < rows {
        let group = (rows - first).min(GROUP_MAX);
        let run = Rows { tables, rows, first };
        // SAFETY: NEON is part of every aarch64 CPU; every buffer is `len`
        // bytes and the loop touches `[0, done)` only.
        unsafe {
            macro_rules! run {
                ($g:literal) => {
                    run.run::<$g>(&input_pointers, &output_pointers, done, accumulate)
                };
            }
            super::with_group!(group, run)
        }
        first += group;
    }
    done
}

/// A group of consecutive output rows, computed together in registers.
struct Rows {
    tables: *const u8,
    rows: usize,
    first: usize,
}

/// An input vector split into its low and high nibbles.
#[derive(Clone, Copy)]
struct Nibbles(uint8x16_t, uint8x16_t);

#[inline(always)]
unsafe fn nibbles(from: *const u8) -> Nibbles {
    let x = vld1q_u8(from);
    Nibbles(vandq_u8(x, vdupq_n_u8(0x0f)), vshrq_n_u8::<4>(x))
}

/// `c * x` from the coefficient's two tables.
#[inline(always)]
unsafe fn mul(x: Nibbles, (lo, hi): (uint8x16_t, uint8x16_t)) -> uint8x16_t {
    veorq_u8(vqtbl1q_u8(lo, x.0), vqtbl1q_u8(hi, x.1))
}

impl Rows {
    #[inline(always)]
    unsafe fn table(&self, index: usize) -> (uint8x16_t, uint8x16_t) {
        let at = self.tables.add(index * 32);
        (vld1q_u8(at), vld1q_u8(at.add(16)))
    }

    /// Columns of `UNROLL` vectors, then single vectors, over `[0, done)`.
    #[inline(always)]
    unsafe fn run<const G: usize>(&self, inputs: &[*const u8], outputs: &[*mut u8], done: usize, accumulate: bool) {
        let mut offset = 0;
        while offset + UNROLL * WIDTH <= done {
            self.column::<G, UNROLL>(inputs, outputs, offset, accumulate);
            offset += UNROLL * WIDTH;
        }
        while offset < done {
            self.column::<G, 1>(inputs, outputs, offset, accumulate);
            offset += WIDTH;
        }
    }

    /// One column of U vectors at `offset` through the G rows.
    #[inline(always)]
    unsafe fn column<const G: usize, const U: usize>(
        &self,
        inputs: &[*const u8],
        outputs: &[*mut u8],
        offset: usize,
        accumulate: bool,
    ) {
        let outputs = &outputs[self.first..self.first + G];
        let mut acc = [[vdupq_n_u8(0); U]; G];
        if accumulate {
            for g in 0..G {
                for u in 0..U {
                    acc[g][u] = vld1q_u8(outputs[g].add(offset + u * WIDTH));
                }
            }
        }
        for (j, input) in inputs.iter().enumerate() {
            let mut x = [nibbles(input.add(offset)); U];
            for u in 1..U {
                x[u] = nibbles(input.add(offset + u * WIDTH));
            }
            let base = j * self.rows + self.first;
            for g in 0..G {
                let table = self.table(base + g);
                for u in 0..U {
                    acc[g][u] = veorq_u8(acc[g][u], mul(x[u], table));
                }
            }
        }
        for g in 0..G {
            for u in 0..U {
                vst1q_u8(outputs[g].add(offset + u * WIDTH), acc[g][u]);
            }
        }
    }
}
