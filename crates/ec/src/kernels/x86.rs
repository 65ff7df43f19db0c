//! SIMD kernels for x86-64: AVX2 and AVX-512 nibble lookups, AVX-512 GFNI.
//!
//! One tiled driver (`tiled`) serves all three; a kernel supplies only its
//! vector type and its multiply-accumulate step through `Lanes`. The driver is
//! inlined into a `#[target_feature]` entry point per kernel, so the
//! intrinsics compile to the instructions of that kernel alone.

use super::{Coefficients, Kernel};
use std::arch::x86_64::*;

/// Bytes of all K inputs kept in cache while every group of rows runs over them.
const TILE_BUDGET_BYTES: usize = 192 * 1024;
/// Tiles are never narrower than this, so a row group's loop amortises its setup.
const TILE_BYTES_MIN: usize = 512;
/// Nor wider: the outputs of a tile stay in L1.
const TILE_BYTES_MAX: usize = 16 * 1024;

/// One kernel's vector operations.
trait Lanes {
    type Vector: Copy;
    type Input: Copy;
    /// Bytes per vector.
    const WIDTH: usize;
    /// Output rows kept in registers at once.
    const GROUP_MAX: usize;
    unsafe fn zero() -> Self::Vector;
    unsafe fn load(from: *const u8) -> Self::Vector;
    unsafe fn store(to: *mut u8, value: Self::Vector);
    /// Work shared by every row an input vector feeds (splitting nibbles).
    unsafe fn prepare(x: Self::Vector) -> Self::Input;
    /// `acc ^ c * x`, with `c` the coefficient at `index` of the kernel's tables.
    unsafe fn mul_xor(acc: Self::Vector, x: Self::Input, tables: *const u8, index: usize) -> Self::Vector;
    /// The base of this kernel's per-coefficient tables.
    fn tables(coefficients: &Coefficients) -> *const u8;
}

struct Avx2;
struct Avx512;
struct Avx512Gfni;

impl Lanes for Avx2 {
    type Vector = __m256i;
    type Input = (__m256i, __m256i);
    const WIDTH: usize = 32;
    const GROUP_MAX: usize = 6;

    #[inline(always)]
    unsafe fn zero() -> __m256i {
        _mm256_setzero_si256()
    }
    #[inline(always)]
    unsafe fn load(from: *const u8) -> __m256i {
        _mm256_loadu_si256(from.cast())
    }
    #[inline(always)]
    unsafe fn store(to: *mut u8, value: __m256i) {
        _mm256_storeu_si256(to.cast(), value)
    }
    #[inline(always)]
    unsafe fn prepare(x: __m256i) -> (__m256i, __m256i) {
        let mask = _mm256_set1_epi8(0x0f);
        (
            _mm256_and_si256(x, mask),
            _mm256_and_si256(_mm256_srli_epi64(x, 4), mask),
        )
    }
    #[inline(always)]
    unsafe fn mul_xor(acc: __m256i, (lo, hi): (__m256i, __m256i), tables: *const u8, index: usize) -> __m256i {
        let table = tables.add(index * 32);
        let table_lo = _mm256_broadcastsi128_si256(_mm_loadu_si128(table.cast()));
        let table_hi = _mm256_broadcastsi128_si256(_mm_loadu_si128(table.add(16).cast()));
        let product = _mm256_xor_si256(_mm256_shuffle_epi8(table_lo, lo), _mm256_shuffle_epi8(table_hi, hi));
        _mm256_xor_si256(acc, product)
    }
    fn tables(coefficients: &Coefficients) -> *const u8 {
        coefficients.nibble_tables.as_ptr().cast()
    }
}

impl Lanes for Avx512 {
    type Vector = __m512i;
    type Input = (__m512i, __m512i);
    const WIDTH: usize = 64;
    const GROUP_MAX: usize = 8;

    #[inline(always)]
    unsafe fn zero() -> __m512i {
        _mm512_setzero_si512()
    }
    #[inline(always)]
    unsafe fn load(from: *const u8) -> __m512i {
        _mm512_loadu_si512(from.cast())
    }
    #[inline(always)]
    unsafe fn store(to: *mut u8, value: __m512i) {
        _mm512_storeu_si512(to.cast(), value)
    }
    #[inline(always)]
    unsafe fn prepare(x: __m512i) -> (__m512i, __m512i) {
        let mask = _mm512_set1_epi8(0x0f);
        (
            _mm512_and_si512(x, mask),
            _mm512_and_si512(_mm512_srli_epi64(x, 4), mask),
        )
    }
    #[inline(always)]
    unsafe fn mul_xor(acc: __m512i, (lo, hi): (__m512i, __m512i), tables: *const u8, index: usize) -> __m512i {
        let table = tables.add(index * 32);
        let table_lo = _mm512_broadcast_i32x4(_mm_loadu_si128(table.cast()));
        let table_hi = _mm512_broadcast_i32x4(_mm_loadu_si128(table.add(16).cast()));
        // 0x96 is the truth table of a ^ b ^ c: both lookups and the
        // accumulator in one instruction.
        _mm512_ternarylogic_epi64::<0x96>(
            acc,
            _mm512_shuffle_epi8(table_lo, lo),
            _mm512_shuffle_epi8(table_hi, hi),
        )
    }
    fn tables(coefficients: &Coefficients) -> *const u8 {
        coefficients.nibble_tables.as_ptr().cast()
    }
}

impl Lanes for Avx512Gfni {
    type Vector = __m512i;
    type Input = __m512i;
    const WIDTH: usize = 64;
    const GROUP_MAX: usize = 8;

    #[inline(always)]
    unsafe fn zero() -> __m512i {
        _mm512_setzero_si512()
    }
    #[inline(always)]
    unsafe fn load(from: *const u8) -> __m512i {
        _mm512_loadu_si512(from.cast())
    }
    #[inline(always)]
    unsafe fn store(to: *mut u8, value: __m512i) {
        _mm512_storeu_si512(to.cast(), value)
    }
    #[inline(always)]
    unsafe fn prepare(x: __m512i) -> __m512i {
        x
    }
    #[inline(always)]
    unsafe fn mul_xor(acc: __m512i, x: __m512i, tables: *const u8, index: usize) -> __m512i {
        let matrix = _mm512_set1_epi64(tables.cast::<i64>().add(index).read_unaligned());
        _mm512_xor_si512(acc, _mm512_gf2p8affine_epi64_epi8::<0>(x, matrix))
    }
    fn tables(coefficients: &Coefficients) -> *const u8 {
        coefficients.affine_matrices.as_ptr().cast()
    }
}

/// Runs `kernel` (not the reference) over the longest prefix it handles; returns its length.
pub fn dot(
    kernel: Kernel,
    coefficients: &Coefficients,
    inputs: &[&[u8]],
    outputs: &mut [&mut [u8]],
    accumulate: bool,
) -> usize {
    let len = inputs[0].len();
    let input_pointers: Vec<*const u8> = inputs.iter().map(|i| i.as_ptr()).collect();
    let output_pointers: Vec<*mut u8> = outputs.iter_mut().map(|o| o.as_mut_ptr()).collect();
    // SAFETY: the caller checked that the CPU has the kernel's features, and
    // every buffer is `len` bytes long; the kernels touch only
    // `[0, len rounded down to their width)`.
    unsafe {
        match kernel {
            Kernel::Avx2 => dot_avx2(coefficients, &input_pointers, &output_pointers, len, accumulate),
            Kernel::Avx512 => dot_avx512(coefficients, &input_pointers, &output_pointers, len, accumulate),
            Kernel::Avx512Gfni => dot_avx512_gfni(coefficients, &input_pointers, &output_pointers, len, accumulate),
            Kernel::Reference => unreachable!("the reference kernel is not an x86 kernel"),
        }
    }
}

#[target_feature(enable = "avx2")]
unsafe fn dot_avx2(c: &Coefficients, inputs: &[*const u8], outputs: &[*mut u8], len: usize, accumulate: bool) -> usize {
    tiled::<Avx2>(c, inputs, outputs, len, accumulate)
}

#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn dot_avx512(
    c: &Coefficients,
    inputs: &[*const u8],
    outputs: &[*mut u8],
    len: usize,
    accumulate: bool,
) -> usize {
    tiled::<Avx512>(c, inputs, outputs, len, accumulate)
}

#[target_feature(enable = "avx512f,avx512bw,gfni")]
unsafe fn dot_avx512_gfni(
    c: &Coefficients,
    inputs: &[*const u8],
    outputs: &[*mut u8],
    len: usize,
    accumulate: bool,
) -> usize {
    tiled::<Avx512Gfni>(c, inputs, outputs, len, accumulate)
}

/// Column tile width for `columns` inputs: all of them fit the cache budget.
fn tile_bytes(columns: usize, width: usize) -> usize {
    let tile = (TILE_BUDGET_BYTES / columns).clamp(TILE_BYTES_MIN, TILE_BYTES_MAX);
    tile / width * width
}

#[inline(always)]
unsafe fn tiled<L: Lanes>(
    c: &Coefficients,
    inputs: &[*const u8],
    outputs: &[*mut u8],
    len: usize,
    accumulate: bool,
) -> usize {
    let done = len / L::WIDTH * L::WIDTH;
    let tile = tile_bytes(c.columns, L::WIDTH);
    let tables = L::tables(c);
    let mut start = 0;
    while start < done {
        let end = (start + tile).min(done);
        let mut row = 0;
        while row < c.rows {
            let group = (c.rows - row).min(L::GROUP_MAX);
            let rows = Rows {
                tables,
                rows: c.rows,
                first: row,
            };
            match group {
                1 => rows.run::<L, 1>(inputs, outputs, start, end, accumulate),
                2 => rows.run::<L, 2>(inputs, outputs, start, end, accumulate),
                3 => rows.run::<L, 3>(inputs, outputs, start, end, accumulate),
                4 => rows.run::<L, 4>(inputs, outputs, start, end, accumulate),
                5 => rows.run::<L, 5>(inputs, outputs, start, end, accumulate),
                6 => rows.run::<L, 6>(inputs, outputs, start, end, accumulate),
                7 => rows.run::<L, 7>(inputs, outputs, start, end, accumulate),
                8 => rows.run::<L, 8>(inputs, outputs, start, end, accumulate),
                _ => unreachable!("row groups are at most 8"),
            }
            row += group;
        }
        start = end;
    }
    done
}

/// A group of consecutive output rows, computed together in registers.
struct Rows {
    tables: *const u8,
    rows: usize,
    first: usize,
}

impl Rows {
    #[inline(always)]
    unsafe fn run<L: Lanes, const G: usize>(
        &self,
        inputs: &[*const u8],
        outputs: &[*mut u8],
        start: usize,
        end: usize,
        accumulate: bool,
    ) {
        let outputs = &outputs[self.first..self.first + G];
        let mut offset = start;
        while offset < end {
            let mut acc = [L::zero(); G];
            if accumulate {
                for g in 0..G {
                    acc[g] = L::load(outputs[g].add(offset));
                }
            }
            for (j, input) in inputs.iter().enumerate() {
                let x = L::prepare(L::load(input.add(offset)));
                let base = j * self.rows + self.first;
                for g in 0..G {
                    acc[g] = L::mul_xor(acc[g], x, self.tables, base + g);
                }
            }
            for g in 0..G {
                L::store(outputs[g].add(offset), acc[g]);
            }
            offset += L::WIDTH;
        }
    }
}
