//! The multiply-accumulate kernels and the table that picks one at run time.
//!
//! Every operation of the codec is one "dot product": for each output row `r`,
//! `out[r] = sum_j coeff[r][j] * in[j]` (or `out[r] ^= ...` when
//! accumulating), byte by byte, over equal-length buffers. A kernel computes
//! that for a prefix of the buffers whose length is a multiple of its vector
//! width and returns how many bytes it did; the portable reference finishes the
//! tail. Each SIMD kernel is tested against the reference over every shape.
//!
//! # Cache blocking for wide stripes
//!
//! A naive kernel streams every input once per group of parities it can hold
//! in registers (ISA-L: six), so a 200+16 stripe reads 200 inputs three times
//! from memory. These kernels instead walk the columns in tiles sized so that
//! one tile of all K inputs stays in L2: the first group of rows pulls each
//! input tile from memory once, later groups find it in cache, and each output
//! tile is written once.

/// Calls `$run!(G)` with the literal G that equals `$group` (1 to 8): a
/// row group's size made a const generic, so that each size gets its own
/// loop with its accumulators in registers.
#[allow(unused_macros)]
macro_rules! with_group {
    ($group:expr, $run:ident) => {
        match $group {
            1 => $run!(1),
            2 => $run!(2),
            3 => $run!(3),
            4 => $run!(4),
            5 => $run!(5),
            6 => $run!(6),
            7 => $run!(7),
            8 => $run!(8),
            _ => unreachable!("row groups are at most 8"),
        }
    };
}
#[allow(unused_imports)]
pub(crate) use with_group;

#[cfg(target_arch = "aarch64")]
mod neon;
mod reference;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::gf;
use crate::EcError;

/// An implementation of the dot product.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Portable byte-at-a-time code: the definition the others are tested against.
    Reference,
    /// 16-byte `tbl` nibble lookups (aarch64 NEON).
    Neon,
    /// 32-byte `vpshufb` nibble lookups (AVX2).
    Avx2,
    /// 32-byte GF(2) affine transforms (AVX2 with GFNI, no AVX-512: Intel's
    /// client and efficiency cores, parts with AVX-512 off).
    Avx2Gfni,
    /// 64-byte `vpshufb` nibble lookups (AVX-512 F and BW).
    Avx512,
    /// 64-byte GF(2) affine transforms (AVX-512 with GFNI): one instruction a product.
    Avx512Gfni,
}

/// The environment variable that forces a kernel, as `--kernel` does.
pub const KERNEL_ENV: &str = "TESSERA_EC_KERNEL";

impl Kernel {
    /// Every kernel, slowest first.
    pub const ALL: [Kernel; 6] = [
        Kernel::Reference,
        Kernel::Neon,
        Kernel::Avx2,
        Kernel::Avx2Gfni,
        Kernel::Avx512,
        Kernel::Avx512Gfni,
    ];

    /// The name used by `--kernel` and `TESSERA_EC_KERNEL`.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Reference => "reference",
            Kernel::Neon => "neon",
            Kernel::Avx2 => "avx2",
            Kernel::Avx2Gfni => "avx2-gfni",
            Kernel::Avx512 => "avx512",
            Kernel::Avx512Gfni => "avx512-gfni",
        }
    }

    /// Whether this CPU can run the kernel.
    pub fn is_available(self) -> bool {
        match self {
            Kernel::Reference => true,
            #[cfg(target_arch = "aarch64")]
            Kernel::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2Gfni => Kernel::Avx2.is_available() && std::arch::is_x86_feature_detected!("gfni"),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => {
                std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bw")
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Gfni => Kernel::Avx512.is_available() && std::arch::is_x86_feature_detected!("gfni"),
            #[cfg(not(target_arch = "aarch64"))]
            Kernel::Neon => false,
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The fastest kernel this CPU runs.
    pub fn best() -> Kernel {
        Kernel::ALL
            .into_iter()
            .rev()
            .find(|k| k.is_available())
            .unwrap_or(Kernel::Reference)
    }

    /// `TESSERA_EC_KERNEL` if set (an error if it names an unknown or
    /// unavailable kernel), else the best one.
    pub fn from_env_or_best() -> Result<Kernel, EcError> {
        match std::env::var(KERNEL_ENV) {
            Ok(name) if !name.is_empty() => Kernel::select(&name),
            _ => Ok(Kernel::best()),
        }
    }

    /// The named kernel, if this CPU runs it.
    pub fn select(name: &str) -> Result<Kernel, EcError> {
        let kernel: Kernel = name.parse()?;
        if !kernel.is_available() {
            return Err(EcError::KernelUnavailable { name: kernel.name() });
        }
        Ok(kernel)
    }
}

impl std::str::FromStr for Kernel {
    type Err = EcError;

    fn from_str(name: &str) -> Result<Self, EcError> {
        Kernel::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| EcError::UnknownKernel { name: name.to_string() })
    }
}

/// A coefficient matrix prepared for every kernel.
///
/// `coefficients` is row-major, `rows` x `columns`. The kernel forms are laid
/// out column-major (all rows of input `j` together), the order a kernel
/// reads them in.
#[derive(Clone, Debug)]
pub struct Coefficients {
    rows: usize,
    columns: usize,
    coefficients: Vec<u8>,
    nibble_tables: Vec<[u8; 32]>,
    /// The GFNI kernels' form (x86 only).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    affine_matrices: Vec<u64>,
}

impl Coefficients {
    /// Prepares a `rows` x `columns` row-major matrix.
    pub fn new(rows: usize, columns: usize, coefficients: Vec<u8>) -> Self {
        assert_eq!(coefficients.len(), rows * columns);
        let mut nibble_tables = Vec::with_capacity(rows * columns);
        let mut affine_matrices = Vec::with_capacity(rows * columns);
        for j in 0..columns {
            for r in 0..rows {
                let c = coefficients[r * columns + j];
                nibble_tables.push(gf::nibble_table(c));
                affine_matrices.push(gf::affine_matrix(c));
            }
        }
        Coefficients {
            rows,
            columns,
            coefficients,
            nibble_tables,
            affine_matrices,
        }
    }

    /// Output count.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input count.
    pub fn columns(&self) -> usize {
        self.columns
    }

    /// Coefficient of input `column` in output `row`.
    pub fn get(&self, row: usize, column: usize) -> u8 {
        self.coefficients[row * self.columns + column]
    }
}

/// Computes `outputs[r] (^)= sum_j c[r][j] * inputs[j]` with `kernel`.
///
/// All buffers have the same length; `accumulate` XORs into the outputs
/// instead of overwriting them.
pub fn dot(kernel: Kernel, coefficients: &Coefficients, inputs: &[&[u8]], outputs: &mut [&mut [u8]], accumulate: bool) {
    assert_eq!(inputs.len(), coefficients.columns);
    assert_eq!(outputs.len(), coefficients.rows);
    let Some(len) = inputs.first().map(|i| i.len()) else {
        return;
    };
    assert!(inputs.iter().all(|i| i.len() == len));
    assert!(outputs.iter().all(|o| o.len() == len));
    if outputs.is_empty() || len == 0 {
        return;
    }
    assert!(
        kernel.is_available(),
        "kernel {} forced on a CPU without it",
        kernel.name()
    );
    let done = match kernel {
        Kernel::Reference => 0,
        #[cfg(target_arch = "aarch64")]
        Kernel::Neon => neon::dot(coefficients, inputs, outputs, accumulate),
        #[cfg(target_arch = "x86_64")]
        _ => x86::dot(kernel, coefficients, inputs, outputs, accumulate),
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("an x86 kernel is never available here"),
    };
    assert!(done <= len);
    if done < len {
        let tails: Vec<&[u8]> = inputs.iter().map(|i| &i[done..]).collect();
        let mut tail_outputs: Vec<&mut [u8]> = outputs.iter_mut().map(|o| &mut o[done..]).collect();
        reference::dot(coefficients, &tails, &mut tail_outputs, accumulate);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn run(kernel: Kernel, seed: u64, rows: usize, columns: usize, len: usize, accumulate: bool) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let coefficients: Vec<u8> = (0..rows * columns).map(|_| rng.gen()).collect();
        let coefficients = Coefficients::new(rows, columns, coefficients);
        let inputs: Vec<Vec<u8>> = (0..columns).map(|_| (0..len).map(|_| rng.gen()).collect()).collect();
        let initial: Vec<Vec<u8>> = (0..rows).map(|_| (0..len).map(|_| rng.gen()).collect()).collect();
        let input_refs: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();

        let mut expected = initial.clone();
        let mut expected_refs: Vec<&mut [u8]> = expected.iter_mut().map(|v| v.as_mut_slice()).collect();
        reference::dot(&coefficients, &input_refs, &mut expected_refs, accumulate);

        let mut actual = initial.clone();
        let mut actual_refs: Vec<&mut [u8]> = actual.iter_mut().map(|v| v.as_mut_slice()).collect();
        dot(kernel, &coefficients, &input_refs, &mut actual_refs, accumulate);
        assert!(
            expected == actual,
            "kernel {} differs from reference: seed {seed} rows {rows} columns {columns} len {len} accumulate {accumulate}",
            kernel.name()
        );
    }

    /// As `run`, with every buffer a slice of one area at `stride` bytes
    /// from the next, from `shift` bytes past a 4 KiB boundary: a stride
    /// that is a multiple of 4 KiB puts every buffer at the same offset in
    /// its page, as a stripe's chunks are (the kernels then take the
    /// inputs a few at a time).
    fn run_in_area(
        kernel: Kernel,
        seed: u64,
        (rows, columns, len): (usize, usize, usize),
        accumulate: bool,
        stride: usize,
        shift: usize,
    ) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let coefficients: Vec<u8> = (0..rows * columns).map(|_| rng.gen()).collect();
        let coefficients = Coefficients::new(rows, columns, coefficients);
        let buffers = rows + columns;
        let mut area = vec![0u8; buffers * stride + 8192];
        let start = area.as_ptr().align_offset(4096) + shift;
        rng.fill(&mut area[..]);
        let before = area.clone();
        let ranges: Vec<std::ops::Range<usize>> = (0..buffers)
            .map(|i| start + i * stride..start + i * stride + len)
            .collect();
        let mut expected: Vec<Vec<u8>> = ranges[columns..].iter().map(|r| before[r.clone()].to_vec()).collect();
        {
            let inputs: Vec<&[u8]> = ranges[..columns].iter().map(|r| &before[r.clone()]).collect();
            let mut outs: Vec<&mut [u8]> = expected.iter_mut().map(|v| v.as_mut_slice()).collect();
            reference::dot(&coefficients, &inputs, &mut outs, accumulate);
        }
        let (input_area, output_area) = area.split_at_mut(start + columns * stride);
        let inputs: Vec<&[u8]> = ranges[..columns].iter().map(|r| &input_area[r.clone()]).collect();
        let mut outputs: Vec<&mut [u8]> = output_area[..rows * stride]
            .chunks_mut(stride)
            .map(|c| &mut c[..len])
            .collect();
        dot(kernel, &coefficients, &inputs, &mut outputs, accumulate);
        let actual: Vec<Vec<u8>> = outputs.iter().map(|o| o.to_vec()).collect();
        assert!(
            expected == actual,
            "kernel {} differs from reference in an area: seed {seed} rows {rows} columns {columns} len {len} accumulate {accumulate} stride {stride} shift {shift}",
            kernel.name()
        );
    }

    #[test]
    fn every_kernel_matches_reference_on_buffers_sharing_their_page_offset() {
        for kernel in Kernel::ALL.into_iter().filter(|k| k.is_available()) {
            let mut seed = 1_000;
            for rows in [1, 2, 3, 4, 5, 6, 7, 8, 9, 16] {
                for columns in [1, 2, 3, 4, 5, 7, 10, 17, 33] {
                    for (len, stride, shift) in [(4096, 4096, 0), (8000, 8192, 1), (300, 4096, 64), (65, 12288, 3)] {
                        for accumulate in [false, true] {
                            seed += 1;
                            run_in_area(kernel, seed, (rows, columns, len), accumulate, stride, shift);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn reference_is_the_definition() {
        let coefficients = Coefficients::new(1, 2, vec![3, 5]);
        let mut out = vec![0u8; 2];
        reference::dot(&coefficients, &[&[7, 1], &[2, 0]], &mut [&mut out], false);
        assert_eq!(out, vec![gf::mul(3, 7) ^ gf::mul(5, 2), 3]);
    }

    #[test]
    fn every_kernel_matches_reference_over_shapes() {
        for kernel in Kernel::ALL.into_iter().filter(|k| k.is_available()) {
            let mut seed = 0;
            // Every row-group remainder and small column count, odd lengths and tails.
            for rows in 1..=17 {
                for columns in [1, 2, 3, 5, 10, 17] {
                    for len in [1, 31, 63, 64, 65, 127, 200, 4096 + 33] {
                        for accumulate in [false, true] {
                            seed += 1;
                            run(kernel, seed, rows, columns, len, accumulate);
                        }
                    }
                }
            }
            // Wide shapes, across tile boundaries.
            for (rows, columns, len) in [
                (8, 92, 20_000),
                (16, 200, 9_000),
                (1, 255, 3_000),
                (255, 1, 700),
                (32, 224, 5_000),
            ] {
                seed += 1;
                run(kernel, seed, rows, columns, len, false);
            }
        }
    }

    /// The kernel chosen by default is one this CPU runs, and every other
    /// is refused by name where the CPU lacks it: a build that picked
    /// AVX-512 on an AVX2 machine would die of SIGILL at the first stripe.
    #[test]
    fn the_default_kernel_is_one_the_cpu_has() {
        let best = Kernel::best();
        assert!(best.is_available(), "{} chosen without the CPU's support", best.name());
        // The fastest available: none later in the list is available.
        let after = Kernel::ALL.iter().skip_while(|&&k| k != best).skip(1);
        assert!(
            after.clone().all(|k| !k.is_available()),
            "{} is not the fastest available",
            best.name()
        );
        #[cfg(target_arch = "x86_64")]
        {
            assert!(!Kernel::Neon.is_available());
            assert_ne!(best, Kernel::Reference, "every x86-64 CPU these tests run on has AVX2");
        }
        #[cfg(target_arch = "aarch64")]
        {
            assert_eq!(best, Kernel::Neon);
            assert!(Kernel::ALL.iter().filter(|k| k.is_available()).count() == 2);
        }
        for kernel in Kernel::ALL.into_iter().filter(|k| !k.is_available()) {
            assert!(matches!(
                Kernel::select(kernel.name()),
                Err(EcError::KernelUnavailable { .. })
            ));
        }
    }

    #[test]
    fn kernel_names_round_trip() {
        for kernel in Kernel::ALL {
            assert_eq!(kernel.name().parse::<Kernel>().ok(), Some(kernel));
        }
        assert!(matches!("sse9".parse::<Kernel>(), Err(EcError::UnknownKernel { .. })));
    }
}
