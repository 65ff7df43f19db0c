//! Encoding matrices, byte-compatible with Intel ISA-L, and their inverses.
//!
//! # Theory
//!
//! A systematic Reed-Solomon code with K data and M parity shards is a
//! (K+M) x K matrix `G` over GF(2^8) whose top K rows are the identity: shard
//! `i` is row `i` of `G` times the data column. The code survives any M lost
//! shards exactly when every K x K matrix made of K rows of `G` is invertible
//! (the code is MDS), which holds when every square submatrix of the bottom M
//! rows, the parity matrix `P`, is invertible.
//!
//! ISA-L builds `P` in two ways, and Tessera builds the same bytes:
//!
//! * `gf_gen_cauchy1_matrix`: `P[p][j] = 1 / ((K + p) ^ j)`. Every square
//!   submatrix of a Cauchy matrix is invertible, so every K+M <= 256 is MDS.
//! * `gf_gen_rs_matrix`: `P[p][j] = 2^(p * j)`, a Vandermonde-like matrix. Its
//!   square submatrices are generalised Vandermonde matrices and some are
//!   singular: this code is not MDS for K >= 22 with M = 4, K >= 6 with M = 5,
//!   K >= 5 with M = 6 (and so on). Tessera checks the (K, M) asked for and
//!   refuses a layout whose parity could not be decoded.
//!
//! Worked example, K = 2, M = 2, Cauchy: rows 2 and 3 are
//! `[1/(2^0), 1/(2^1)] = [1/2, 1/3] = [142, 244]` and
//! `[1/(3^0), 1/(3^1)] = [1/3, 1/2] = [244, 142]`:
//!
//! ```text
//!        d0   d1
//!  s0 [   1    0 ]
//!  s1 [   0    1 ]
//!  s2 [ 142  244 ]     s2 = 142*d0 ^ 244*d1
//!  s3 [ 244  142 ]     s3 = 244*d0 ^ 142*d1
//! ```
//!
//! Losing s0 and s1, the rows of s2 and s3 form an invertible 2x2 matrix whose
//! inverse, times (s2, s3), gives back (d0, d1).

use crate::gf;
use crate::EcError;

/// Which parity matrix a codec uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatrixKind {
    /// ISA-L's `gf_gen_cauchy1_matrix`: MDS for every K+M <= 256.
    Cauchy,
    /// ISA-L's `gf_gen_rs_matrix`: MDS only for some (K, M).
    Vandermonde,
}

impl MatrixKind {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            MatrixKind::Cauchy => "cauchy",
            MatrixKind::Vandermonde => "vandermonde",
        }
    }
}

impl std::str::FromStr for MatrixKind {
    type Err = EcError;

    fn from_str(name: &str) -> Result<Self, EcError> {
        match name {
            "cauchy" => Ok(MatrixKind::Cauchy),
            "vandermonde" | "rs" => Ok(MatrixKind::Vandermonde),
            _ => Err(EcError::UnknownMatrix { name: name.to_string() }),
        }
    }
}

/// The (K+M) x K encoding matrix, row-major, identity on top.
///
/// The caller has checked the shape; this only builds bytes.
pub fn encoding_matrix(kind: MatrixKind, data: usize, parity: usize) -> Vec<u8> {
    assert!(data >= 1 && data + parity <= crate::SHARD_COUNT_MAX);
    let rows = data + parity;
    let mut matrix = vec![0u8; rows * data];
    for i in 0..data {
        matrix[i * data + i] = 1;
    }
    for p in 0..parity {
        let row = data + p;
        for j in 0..data {
            matrix[row * data + j] = match kind {
                MatrixKind::Cauchy => gf::inv((row ^ j) as u8),
                MatrixKind::Vandermonde => gf::exp2(p * j),
            };
        }
    }
    matrix
}

/// Inverts the n x n row-major matrix, or returns None if it is singular.
pub fn invert(matrix: &[u8], n: usize) -> Option<Vec<u8>> {
    assert_eq!(matrix.len(), n * n);
    let mut work = matrix.to_vec();
    let mut inverse = vec![0u8; n * n];
    for i in 0..n {
        inverse[i * n + i] = 1;
    }
    // Gauss-Jordan elimination; in GF(2^8) there is no pivoting for accuracy,
    // only for a zero pivot.
    for column in 0..n {
        let pivot = (column..n).find(|&row| work[row * n + column] != 0)?;
        if pivot != column {
            for j in 0..n {
                work.swap(pivot * n + j, column * n + j);
                inverse.swap(pivot * n + j, column * n + j);
            }
        }
        let scale = gf::inv(work[column * n + column]);
        for j in 0..n {
            work[column * n + j] = gf::mul(work[column * n + j], scale);
            inverse[column * n + j] = gf::mul(inverse[column * n + j], scale);
        }
        for row in 0..n {
            let factor = work[row * n + column];
            if row == column || factor == 0 {
                continue;
            }
            for j in 0..n {
                work[row * n + j] ^= gf::mul(factor, work[column * n + j]);
                inverse[row * n + j] ^= gf::mul(factor, inverse[column * n + j]);
            }
        }
    }
    Some(inverse)
}

/// The largest K for which the Vandermonde code with `parity` rows is MDS.
///
/// `P[p][j] = 2^(p*j)` is symmetric in p and j, and shifting the chosen rows
/// (or columns) by a constant multiplies each column (or row) of a minor by a
/// non-zero constant, which does not change whether it is singular. So only
/// minors whose smallest row and smallest column are both 0 need checking, and
/// a minor with consecutive rows or columns is a true Vandermonde matrix in
/// distinct points, never singular. Columns are added one at a time, so the
/// search stops at the first K that fails.
pub fn vandermonde_data_max(parity: usize) -> usize {
    let limit = crate::SHARD_COUNT_MAX - parity;
    if parity <= 1 {
        return limit;
    }
    for data in 2..=limit {
        if !vandermonde_new_column_ok(data, parity) {
            return data - 1;
        }
    }
    limit
}

/// Whether every minor that uses column `data - 1` of the parity matrix is
/// invertible (the columns before it having been checked already).
fn vandermonde_new_column_ok(data: usize, parity: usize) -> bool {
    let last = data - 1;
    let size_max = data.min(parity);
    for size in 2..=size_max {
        // Rows: 0 plus size-1 of 1..parity; columns: 0, last, and size-2 of 1..last.
        let mut rows_rest = Combinations::new(parity - 1, size - 1);
        while let Some(rows) = rows_rest.next_set() {
            let rows: Vec<usize> = std::iter::once(0).chain(rows.iter().map(|r| r + 1)).collect();
            if is_consecutive(&rows) {
                continue;
            }
            let mut columns_middle = Combinations::new(last.saturating_sub(1), size - 2);
            while let Some(middle) = columns_middle.next_set() {
                let mut columns = Vec::with_capacity(size);
                columns.push(0);
                columns.extend(middle.iter().map(|c| c + 1));
                columns.push(last);
                if is_consecutive(&columns) {
                    continue;
                }
                let mut minor = vec![0u8; size * size];
                for (a, &r) in rows.iter().enumerate() {
                    for (b, &c) in columns.iter().enumerate() {
                        minor[a * size + b] = gf::exp2(r * c);
                    }
                }
                if determinant_is_zero(&mut minor, size) {
                    return false;
                }
            }
        }
    }
    true
}

fn is_consecutive(indices: &[usize]) -> bool {
    indices.windows(2).all(|w| w[1] == w[0] + 1)
}

fn determinant_is_zero(matrix: &mut [u8], n: usize) -> bool {
    for column in 0..n {
        let Some(pivot) = (column..n).find(|&row| matrix[row * n + column] != 0) else {
            return true;
        };
        for j in 0..n {
            matrix.swap(pivot * n + j, column * n + j);
        }
        let scale = gf::inv(matrix[column * n + column]);
        for row in column + 1..n {
            let factor = gf::mul(matrix[row * n + column], scale);
            if factor == 0 {
                continue;
            }
            for j in column..n {
                matrix[row * n + j] ^= gf::mul(factor, matrix[column * n + j]);
            }
        }
    }
    false
}

/// The k-subsets of 0..n in lexicographic order, without allocation per step.
struct Combinations {
    n: usize,
    indices: Vec<usize>,
    started: bool,
}

impl Combinations {
    fn new(n: usize, k: usize) -> Self {
        Combinations {
            n,
            indices: (0..k).collect(),
            started: false,
        }
    }

    fn next_set(&mut self) -> Option<&[usize]> {
        let k = self.indices.len();
        if k > self.n {
            return None;
        }
        if !self.started {
            self.started = true;
            return Some(&self.indices);
        }
        let mut i = k;
        while i > 0 {
            i -= 1;
            if self.indices[i] < self.n - k + i {
                self.indices[i] += 1;
                for j in i + 1..k {
                    self.indices[j] = self.indices[j - 1] + 1;
                }
                return Some(&self.indices);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn multiply(a: &[u8], b: &[u8], n: usize) -> Vec<u8> {
        let mut product = vec![0u8; n * n];
        for i in 0..n {
            for j in 0..n {
                let mut sum = 0u8;
                for t in 0..n {
                    sum ^= gf::mul(a[i * n + t], b[t * n + j]);
                }
                product[i * n + j] = sum;
            }
        }
        product
    }

    #[test]
    fn worked_example_cauchy_2_2() {
        let matrix = encoding_matrix(MatrixKind::Cauchy, 2, 2);
        assert_eq!(matrix, vec![1, 0, 0, 1, 142, 244, 244, 142]);
    }

    #[test]
    fn inverse_times_matrix_is_identity() {
        let matrix = encoding_matrix(MatrixKind::Cauchy, 4, 4);
        let bottom = &matrix[16..];
        let inverse = invert(bottom, 4).expect("Cauchy matrices are invertible");
        let product = multiply(bottom, &inverse, 4);
        for i in 0..4 {
            for j in 0..4 {
                assert_eq!(product[i * 4 + j], u8::from(i == j));
            }
        }
    }

    #[test]
    fn singular_matrix_is_refused() {
        assert!(invert(&[1, 2, 1, 2], 2).is_none());
    }

    /// Every erasure pattern of exactly M shards, by brute force.
    fn brute_force_mds(data: usize, parity: usize) -> bool {
        let matrix = encoding_matrix(MatrixKind::Vandermonde, data, parity);
        let total = data + parity;
        let mut kept = Combinations::new(total, data);
        while let Some(rows) = kept.next_set() {
            let mut sub = Vec::with_capacity(data * data);
            for &r in rows {
                sub.extend_from_slice(&matrix[r * data..(r + 1) * data]);
            }
            if invert(&sub, data).is_none() {
                return false;
            }
        }
        true
    }

    #[test]
    fn vandermonde_limits_match_isal_documentation() {
        assert_eq!(vandermonde_data_max(4), 21);
        assert_eq!(vandermonde_data_max(5), 5);
        assert_eq!(vandermonde_data_max(6), 4);
        assert_eq!(vandermonde_data_max(1), 255);
        assert_eq!(vandermonde_data_max(2), 254);
        assert_eq!(vandermonde_data_max(3), 253);
    }

    #[test]
    fn vandermonde_limit_agrees_with_brute_force() {
        for parity in 2..=7 {
            let max = vandermonde_data_max(parity);
            for data in 1..=(max + 1).min(9) {
                assert_eq!(brute_force_mds(data, parity), data <= max, "K={data} M={parity}");
            }
        }
    }
}
