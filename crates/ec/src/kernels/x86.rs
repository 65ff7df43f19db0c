//! SIMD kernels for x86-64: AVX2 and AVX-512 nibble lookups, AVX2 and
//! AVX-512 GFNI.
//!
//! One tiled driver (`tiled`) serves all four; a kernel supplies only its
//! vector type and its multiply-accumulate step through `Lanes`. The driver is
//! inlined into a `#[target_feature]` entry point per kernel, so the
//! intrinsics compile to the instructions of that kernel alone.
//!
//! Three choices the speed depends on, measured with `tessera bench ec
//! --kernel K --layout L` on builds with and without each (2-core AMD EPYC
//! Zen 4, which runs all four kernels, so the AVX2 ones were tuned on its
//! AVX2 units, not on an AVX2-only CPU; docs/PERFORMANCE.md has the
//! comparison with ISA-L):
//! - the in-registers loop takes several vectors of each input per step
//!   (`UNROLL`), so each coefficient loaded is applied to all of them:
//!   AVX2+GFNI 10+4 (skewed) 32-33 GB/s a vector a step, 40-41 at four;
//!   AVX2 18.0 -> 18.4-19.7 at two;
//! - one group of rows (M at most the group) runs over the whole length at
//!   once; tiles only help when later groups read the inputs again;
//! - the inputs go in passes, the outputs taken up again by each: of four
//!   where every buffer starts at the same offset in its 4 KiB page (a
//!   stripe's chunks in one area, as the array holds them: all K+M
//!   buffers' lines of a column then fall in one set of an 8-way L1; area
//!   8+2 went 42 -> 59-61 GB/s on AVX2+GFNI, 23-25 -> 33 on AVX2), else
//!   of sixteen. With passes, this one loop beat the streaming loop the
//!   wide stripes had used (each input in turn through the outputs) on
//!   every wide shape tried: 92+8 of 64 KiB shards (in L3) 5.4 -> 14.8
//!   GB/s (AVX-512+GFNI, area), 200+16 3.0 -> 7.3; from memory (1 MiB
//!   shards, 256 MiB) 4.4 -> 9.8; so that loop is gone.

// Indexed loops over the const G rows keep the register arrays explicit.
#![allow(clippy::needless_range_loop)]

use super::{Coefficients, Kernel};
use std::arch::x86_64::*;

/// Bytes of all K inputs kept in L2 while every group of rows runs over them.
const TILE_BUDGET_BYTES: usize = 512 * 1024;
/// Tiles are never narrower than this, so loading a group's tables is amortised.
const TILE_BYTES_MIN: usize = 512;
/// Nor wider: a group's output tile (8 rows of this) stays in a 32 KiB L1.
const TILE_BYTES_MAX: usize = 2 * 1024;

/// One kernel's vector operations.
trait Lanes {
    type Vector: Copy;
    type Input: Copy;
    type Table: Copy;
    /// Bytes per vector.
    const WIDTH: usize;
    /// Output rows kept in registers at once.
    const GROUP_MAX: usize;
    /// Bytes of one coefficient's table.
    const TABLE_BYTES: usize;
    /// Vectors of each input the in-registers loop takes per step: each
    /// coefficient loaded (broadcast) once is applied to all of them.
    const UNROLL: usize;
    unsafe fn zero() -> Self::Vector;
    unsafe fn load(from: *const u8) -> Self::Vector;
    unsafe fn store(to: *mut u8, value: Self::Vector);
    /// Work shared by every row an input vector feeds (splitting nibbles).
    unsafe fn prepare(x: Self::Vector) -> Self::Input;
    /// The coefficient at `index` of the kernel's tables, in registers.
    unsafe fn load_table(tables: *const u8, index: usize) -> Self::Table;
    /// `c * x`.
    unsafe fn mul(x: Self::Input, table: Self::Table) -> Self::Vector;
    /// `acc ^ c * x`.
    unsafe fn mul_xor(acc: Self::Vector, x: Self::Input, table: Self::Table) -> Self::Vector;
    /// The base of this kernel's per-coefficient tables.
    fn tables(coefficients: &Coefficients) -> *const u8;
}

/// Zeroing, loading and storing vectors of one width: the part of `Lanes`
/// every kernel of that width shares.
macro_rules! vector_io {
    ($vector:ty, $zero:ident, $load:ident, $store:ident) => {
        #[inline(always)]
        unsafe fn zero() -> $vector {
            $zero()
        }
        #[inline(always)]
        unsafe fn load(from: *const u8) -> $vector {
            $load(from.cast())
        }
        #[inline(always)]
        unsafe fn store(to: *mut u8, value: $vector) {
            $store(to.cast(), value)
        }
    };
}

/// A GFNI kernel of one vector width: a product is one affine transform of
/// the input by the coefficient's 8x8 bit matrix, broadcast to every lane.
macro_rules! gfni_lanes {
    ($name:ident, $vector:ty, $width:expr, $group:expr, $unroll:expr, $set1:ident, $affine:ident, $xor:ident,
     ($zero:ident, $load:ident, $store:ident)) => {
        impl Lanes for $name {
            type Vector = $vector;
            type Input = $vector;
            type Table = $vector;
            const WIDTH: usize = $width;
            const GROUP_MAX: usize = $group;
            const UNROLL: usize = $unroll;
            const TABLE_BYTES: usize = 8;

            vector_io!($vector, $zero, $load, $store);
            #[inline(always)]
            unsafe fn prepare(x: $vector) -> $vector {
                x
            }
            #[inline(always)]
            unsafe fn load_table(tables: *const u8, index: usize) -> $vector {
                $set1(tables.cast::<i64>().add(index).read_unaligned())
            }
            #[inline(always)]
            unsafe fn mul(x: $vector, matrix: $vector) -> $vector {
                $affine::<0>(x, matrix)
            }
            #[inline(always)]
            unsafe fn mul_xor(acc: $vector, x: $vector, matrix: $vector) -> $vector {
                $xor(acc, Self::mul(x, matrix))
            }
            fn tables(coefficients: &Coefficients) -> *const u8 {
                coefficients.affine_matrices.as_ptr().cast()
            }
        }
    };
}

/// The most vectors of each input a step of the in-registers loop takes
/// (fewer where more rows take the registers: `run_in_registers`). The
/// nibble kernels keep each input as two vectors and each table as two,
/// so AVX2's sixteen registers take two; the others four.
const UNROLL_AVX2: usize = 2;
const UNROLL_AVX512: usize = 4;
/// Rows a group of AVX2+GFNI holds: six accumulators (twelve at two
/// vectors a step), the input and a matrix in sixteen registers.
const GROUP_AVX2_GFNI: usize = 6;
const UNROLL_AVX2_GFNI: usize = 4;
const UNROLL_AVX512_GFNI: usize = 4;

struct Avx2;
struct Avx2Gfni;
struct Avx512;
struct Avx512Gfni;

impl Lanes for Avx2 {
    type Vector = __m256i;
    type Input = (__m256i, __m256i);
    type Table = (__m256i, __m256i);
    const WIDTH: usize = 32;
    // Eight table registers of sixteen, leaving room for the input and temporaries.
    const GROUP_MAX: usize = 4;
    const UNROLL: usize = UNROLL_AVX2;
    const TABLE_BYTES: usize = 32;

    vector_io!(__m256i, _mm256_setzero_si256, _mm256_loadu_si256, _mm256_storeu_si256);
    #[inline(always)]
    unsafe fn prepare(x: __m256i) -> (__m256i, __m256i) {
        let mask = _mm256_set1_epi8(0x0f);
        (
            _mm256_and_si256(x, mask),
            _mm256_and_si256(_mm256_srli_epi64(x, 4), mask),
        )
    }
    #[inline(always)]
    unsafe fn load_table(tables: *const u8, index: usize) -> (__m256i, __m256i) {
        let table = tables.add(index * 32);
        (
            _mm256_broadcastsi128_si256(_mm_loadu_si128(table.cast())),
            _mm256_broadcastsi128_si256(_mm_loadu_si128(table.add(16).cast())),
        )
    }
    #[inline(always)]
    unsafe fn mul((lo, hi): (__m256i, __m256i), (table_lo, table_hi): (__m256i, __m256i)) -> __m256i {
        _mm256_xor_si256(_mm256_shuffle_epi8(table_lo, lo), _mm256_shuffle_epi8(table_hi, hi))
    }
    #[inline(always)]
    unsafe fn mul_xor(acc: __m256i, x: (__m256i, __m256i), table: (__m256i, __m256i)) -> __m256i {
        _mm256_xor_si256(acc, Self::mul(x, table))
    }
    fn tables(coefficients: &Coefficients) -> *const u8 {
        coefficients.nibble_tables.as_ptr().cast()
    }
}

impl Lanes for Avx512 {
    type Vector = __m512i;
    type Input = (__m512i, __m512i);
    type Table = (__m512i, __m512i);
    const WIDTH: usize = 64;
    // Sixteen table registers of thirty-two.
    const GROUP_MAX: usize = 8;
    const UNROLL: usize = UNROLL_AVX512;
    const TABLE_BYTES: usize = 32;

    vector_io!(__m512i, _mm512_setzero_si512, _mm512_loadu_si512, _mm512_storeu_si512);
    #[inline(always)]
    unsafe fn prepare(x: __m512i) -> (__m512i, __m512i) {
        let mask = _mm512_set1_epi8(0x0f);
        (
            _mm512_and_si512(x, mask),
            _mm512_and_si512(_mm512_srli_epi64(x, 4), mask),
        )
    }
    #[inline(always)]
    unsafe fn load_table(tables: *const u8, index: usize) -> (__m512i, __m512i) {
        let table = tables.add(index * 32);
        (
            _mm512_broadcast_i32x4(_mm_loadu_si128(table.cast())),
            _mm512_broadcast_i32x4(_mm_loadu_si128(table.add(16).cast())),
        )
    }
    #[inline(always)]
    unsafe fn mul((lo, hi): (__m512i, __m512i), (table_lo, table_hi): (__m512i, __m512i)) -> __m512i {
        _mm512_xor_si512(_mm512_shuffle_epi8(table_lo, lo), _mm512_shuffle_epi8(table_hi, hi))
    }
    #[inline(always)]
    unsafe fn mul_xor(acc: __m512i, (lo, hi): (__m512i, __m512i), (table_lo, table_hi): (__m512i, __m512i)) -> __m512i {
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

// Sixteen registers for AVX2: six accumulators and six matrices, the input
// and room for the loads. Thirty-two for AVX-512: eight of each.
gfni_lanes!(
    Avx2Gfni,
    __m256i,
    32,
    GROUP_AVX2_GFNI,
    UNROLL_AVX2_GFNI,
    _mm256_set1_epi64x,
    _mm256_gf2p8affine_epi64_epi8,
    _mm256_xor_si256,
    (_mm256_setzero_si256, _mm256_loadu_si256, _mm256_storeu_si256)
);
gfni_lanes!(
    Avx512Gfni,
    __m512i,
    64,
    8,
    UNROLL_AVX512_GFNI,
    _mm512_set1_epi64,
    _mm512_gf2p8affine_epi64_epi8,
    _mm512_xor_si512,
    (_mm512_setzero_si512, _mm512_loadu_si512, _mm512_storeu_si512)
);

/// Runs `kernel` (not the reference) over the longest prefix it handles; returns its length.
pub fn dot(
    kernel: Kernel,
    coefficients: &Coefficients,
    inputs: &[&[u8]],
    outputs: &mut [&mut [u8]],
    accumulate: bool,
) -> usize {
    let len = inputs[0].len();
    // On the stack, and left uninitialised past what is written: K + M <=
    // 256, and a call on 4 KiB shards takes well under a microsecond, so
    // two allocations a call showed (`tessera bench ec --shard-bytes 4K`).
    const MAX: usize = crate::SHARD_COUNT_MAX;
    assert!(inputs.len() <= MAX && outputs.len() <= MAX, "at most {MAX} shards");
    let mut input_pointers = [std::mem::MaybeUninit::<*const u8>::uninit(); MAX];
    let mut output_pointers = [std::mem::MaybeUninit::<*mut u8>::uninit(); MAX];
    for (pointer, input) in input_pointers.iter_mut().zip(inputs) {
        pointer.write(input.as_ptr());
    }
    for (pointer, output) in output_pointers.iter_mut().zip(outputs.iter_mut()) {
        pointer.write(output.as_mut_ptr());
    }
    // SAFETY: the first inputs.len() and outputs.len() were written above.
    let (input_pointers, output_pointers) = unsafe {
        (
            std::slice::from_raw_parts(input_pointers.as_ptr().cast::<*const u8>(), inputs.len()),
            std::slice::from_raw_parts(output_pointers.as_ptr().cast::<*mut u8>(), outputs.len()),
        )
    };
    // SAFETY: the caller checked that the CPU has the kernel's features, and
    // every buffer is `len` bytes long; the kernels touch only
    // `[0, len rounded down to their width)`.
    unsafe {
        match kernel {
            Kernel::Avx2 => dot_avx2(coefficients, input_pointers, output_pointers, len, accumulate),
            Kernel::Avx2Gfni => dot_avx2_gfni(coefficients, input_pointers, output_pointers, len, accumulate),
            Kernel::Avx512 => dot_avx512(coefficients, input_pointers, output_pointers, len, accumulate),
            Kernel::Avx512Gfni => dot_avx512_gfni(coefficients, input_pointers, output_pointers, len, accumulate),
            Kernel::Reference | Kernel::Neon => unreachable!("not an x86 kernel"),
        }
    }
}

/// A kernel's entry point: the tiled driver compiled with the kernel's
/// target features, so its intrinsics become those instructions alone.
macro_rules! entry {
    ($name:ident, $features:literal, $lanes:ty) => {
        #[target_feature(enable = $features)]
        unsafe fn $name(
            c: &Coefficients,
            inputs: &[*const u8],
            outputs: &[*mut u8],
            len: usize,
            accumulate: bool,
        ) -> usize {
            tiled::<$lanes>(c, inputs, outputs, len, accumulate)
        }
    };
}

entry!(dot_avx2, "avx2", Avx2);
entry!(dot_avx2_gfni, "avx2,gfni", Avx2Gfni);
entry!(dot_avx512, "avx512f,avx512bw", Avx512);
entry!(dot_avx512_gfni, "avx512f,avx512bw,gfni", Avx512Gfni);

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
    // One group of rows reads each input once whatever the tile: no tiles.
    let tile = match c.rows <= L::GROUP_MAX {
        true => done.max(L::WIDTH),
        false => tile_bytes(c.columns, L::WIDTH),
    };
    let tables = L::tables(c);
    let pass = passes(inputs, outputs);
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
            // Only the first group reads the tile from memory; later groups
            // find it in L2.
            macro_rules! run {
                ($g:literal) => {
                    rows.run_in_passes::<L, $g>(inputs, outputs, start, end, accumulate, pass)
                };
            }
            super::with_group!(group, run);
            row += group;
        }
        start = end;
    }
    done
}

/// Inputs per pass of the in-registers loop: a few where every buffer
/// starts at the same offset in a 4 KiB page (a stripe's chunks in one
/// area, as the array holds them: a column's lines of all of them fall in
/// one set of the L1 cache, and past its ways they evict each other),
/// else at most sixteen (wide stripes: a few streams at a time for the
/// prefetchers); the outputs are taken up again by each pass.
fn passes(inputs: &[*const u8], outputs: &[*mut u8]) -> usize {
    let page = |p: usize| p & 4095;
    let first = page(inputs[0] as usize);
    let aliased =
        inputs.iter().all(|&p| page(p as usize) == first) && outputs.iter().all(|&p| page(p as usize) == first);
    match aliased {
        true => PASS_INPUTS_ALIASED,
        false => PASS_INPUTS_MAX,
    }
}

/// Inputs a pass takes where buffers share their page offset. 3, 4 and 6
/// were tried on 8+2, 10+4, 16+4 and 20+4 (area layout, Zen 4, timing
/// `Codec::encode` with a throwaway harness, not kept): 3 lost 5-15%
/// everywhere; 6 matched 4 on AVX-512+GFNI and lost up to 11% on AVX2
/// and AVX2+GFNI.
const PASS_INPUTS_ALIASED: usize = 4;
/// Tried 16 against all at once on 92+8 and 200+16 of 64 KiB shards,
/// skewed layout (`tessera bench ec`): 200+16 went 5.7 -> 8.3 GB/s
/// (AVX2+GFNI), 2.5 -> 4.5 (AVX2); 20+4 and 32+8 unchanged.
const PASS_INPUTS_MAX: usize = 16;

/// U vectors of an input from `offset`, prepared. (A function, not a
/// closure: a closure is compiled without the caller's target features,
/// and its intrinsics became calls: the nibble kernels ran 30x slower.)
#[inline(always)]
unsafe fn load_input<L: Lanes, const U: usize>(input: *const u8, offset: usize) -> [L::Input; U] {
    let mut x = [L::prepare(L::load(input.add(offset))); U];
    for u in 1..U {
        x[u] = L::prepare(L::load(input.add(offset + u * L::WIDTH)));
    }
    x
}

/// A group of consecutive output rows, computed together in registers.
#[derive(Clone, Copy)]
struct Rows {
    tables: *const u8,
    rows: usize,
    first: usize,
}

impl Rows {
    /// `run_in_registers` over the inputs `pass` at a time.
    #[inline(always)]
    unsafe fn run_in_passes<L: Lanes, const G: usize>(
        &self,
        inputs: &[*const u8],
        outputs: &[*mut u8],
        start: usize,
        end: usize,
        accumulate: bool,
        pass: usize,
    ) {
        for (i, chunk) in inputs.chunks(pass).enumerate() {
            let rows = Rows {
                tables: self.tables.add(i * pass * self.rows * L::TABLE_BYTES),
                ..*self
            };
            rows.run_in_registers::<L, G>(chunk, outputs, start, end, accumulate || i > 0);
        }
    }

    /// For each column of `L::UNROLL` vectors, runs every input through
    /// the G rows with the accumulators in registers, loading each table
    /// as it goes and applying it to every vector of the column. Best
    /// when a group's tables (K x G x 32 bytes) sit in L1 and K streams
    /// are few enough for the hardware prefetcher. A tail narrower than
    /// the column is done a vector at a time.
    #[inline(always)]
    unsafe fn run_in_registers<L: Lanes, const G: usize>(
        &self,
        inputs: &[*const u8],
        outputs: &[*mut u8],
        start: usize,
        end: usize,
        accumulate: bool,
    ) {
        let mut offset = start;
        macro_rules! columns {
            ($u:literal) => {
                while offset + $u * L::WIDTH <= end {
                    self.column::<L, G, $u>(inputs, outputs, offset, accumulate);
                    offset += $u * L::WIDTH;
                }
            };
        }
        // Fewer rows leave registers for more vectors of each input.
        match (L::UNROLL, G) {
            (1, _) => {}
            (2, _) => columns!(2),
            (_, 1 | 2) => columns!(4),
            (_, 3) => columns!(3),
            _ => columns!(2),
        }
        columns!(1);
    }

    /// One column of U vectors at `offset` through the G rows.
    #[inline(always)]
    unsafe fn column<L: Lanes, const G: usize, const U: usize>(
        &self,
        inputs: &[*const u8],
        outputs: &[*mut u8],
        offset: usize,
        accumulate: bool,
    ) {
        let outputs = &outputs[self.first..self.first + G];
        // The first input's products start the sums, unless the outputs do.
        let mut acc = [[L::zero(); U]; G];
        let first = match accumulate {
            true => {
                for g in 0..G {
                    for u in 0..U {
                        acc[g][u] = L::load(outputs[g].add(offset + u * L::WIDTH));
                    }
                }
                0
            }
            false => {
                let x = load_input::<L, U>(inputs[0], offset);
                for g in 0..G {
                    let table = L::load_table(self.tables, self.first + g);
                    for u in 0..U {
                        acc[g][u] = L::mul(x[u], table);
                    }
                }
                1
            }
        };
        for j in first..inputs.len() {
            let x = load_input::<L, U>(inputs[j], offset);
            let base = j * self.rows + self.first;
            for g in 0..G {
                let table = L::load_table(self.tables, base + g);
                for u in 0..U {
                    acc[g][u] = L::mul_xor(acc[g][u], x[u], table);
                }
            }
        }
        for g in 0..G {
            for u in 0..U {
                L::store(outputs[g].add(offset + u * L::WIDTH), acc[g][u]);
            }
        }
    }
}
