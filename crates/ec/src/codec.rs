//! The Reed-Solomon codec: encode, reconstruct, update and verify.
//!
//! A `Codec` is built once for a (K, M, matrix) and shared; it is `Sync`, and
//! its decode plans (the inverted matrix for an erasure pattern) are cached so
//! that a degraded array pays for the inversion once per pattern, not per read.

use crate::kernels::{self, Coefficients, Kernel};
use crate::matrix::{self, MatrixKind};
use crate::{EcError, SHARD_COUNT_MAX};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Below this many input bytes a call is not worth splitting across threads.
const PARALLEL_BYTES_MIN: usize = 4 << 20;
/// Erasure patterns whose plans are kept; the cache is emptied when it fills.
const PLAN_CACHE_COUNT_MAX: usize = 4096;

/// Which shards an erasure pattern rebuilds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Targets {
    /// Every missing shard, data and parity.
    All,
    /// Only the missing data shards: what a degraded read needs.
    DataOnly,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct PlanKey {
    missing: [u64; 4],
    targets: Targets,
}

/// How to rebuild one erasure pattern: targets from K chosen survivors.
#[derive(Debug)]
struct DecodePlan {
    sources: Vec<usize>,
    targets: Vec<usize>,
    coefficients: Coefficients,
}

/// A Reed-Solomon code with `data` + `parity` shards.
#[derive(Debug)]
pub struct Codec {
    data: usize,
    parity: usize,
    kind: MatrixKind,
    matrix: Vec<u8>,
    encoder: Coefficients,
    kernel: Kernel,
    threads: usize,
    plans: Mutex<HashMap<PlanKey, Arc<DecodePlan>>>,
}

impl Codec {
    /// A codec for `data` + `parity` shards using `kind`'s matrix, the kernel
    /// named by `TESSERA_EC_KERNEL` or else the fastest, on one thread.
    pub fn new(data: usize, parity: usize, kind: MatrixKind) -> Result<Self, EcError> {
        if data == 0 {
            return Err(EcError::NoDataShards);
        }
        if data + parity > SHARD_COUNT_MAX {
            return Err(EcError::TooManyShards {
                data,
                parity,
                total: data + parity,
            });
        }
        if kind == MatrixKind::Vandermonde {
            let data_max = matrix::vandermonde_data_max(parity);
            if data > data_max {
                return Err(EcError::NotMds { data, parity, data_max });
            }
        }
        let matrix = matrix::encoding_matrix(kind, data, parity);
        let encoder = Coefficients::new(parity, data, matrix[data * data..].to_vec());
        Ok(Codec {
            data,
            parity,
            kind,
            matrix,
            encoder,
            kernel: Kernel::from_env_or_best()?,
            threads: 1,
            plans: Mutex::new(HashMap::new()),
        })
    }

    /// Uses `kernel` instead of the one chosen at construction.
    pub fn with_kernel(mut self, kernel: Kernel) -> Result<Self, EcError> {
        if !kernel.is_available() {
            return Err(EcError::KernelUnavailable { name: kernel.name() });
        }
        self.kernel = kernel;
        Ok(self)
    }

    /// Splits large calls across up to `threads` threads.
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads.max(1);
        self
    }

    pub fn data_shards(&self) -> usize {
        self.data
    }

    pub fn parity_shards(&self) -> usize {
        self.parity
    }

    pub fn total_shards(&self) -> usize {
        self.data + self.parity
    }

    pub fn kernel(&self) -> Kernel {
        self.kernel
    }

    pub fn matrix_kind(&self) -> MatrixKind {
        self.kind
    }

    /// The (K+M) x K encoding matrix, row-major: what ISA-L's generator writes.
    pub fn encoding_matrix(&self) -> &[u8] {
        &self.matrix
    }

    /// Computes the M parity shards of the K data shards.
    pub fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), EcError> {
        check_count(data.len(), self.data)?;
        check_count(parity.len(), self.parity)?;
        let len = shard_len(data.iter().map(|d| d.len()).chain(parity.iter().map(|p| p.len())))?;
        debug_assert!(len > 0);
        self.dot(&self.encoder, data, parity, false);
        Ok(())
    }

    /// Rebuilds every shard listed in `missing` from the others.
    ///
    /// `shards` holds all K+M shards; the missing ones are buffers of the
    /// right length whose contents are ignored and overwritten.
    pub fn reconstruct(&self, shards: &mut [&mut [u8]], missing: &[usize]) -> Result<(), EcError> {
        self.rebuild(shards, missing, Targets::All)
    }

    /// Rebuilds only the missing data shards; missing parity shards are left as they are.
    pub fn reconstruct_data(&self, shards: &mut [&mut [u8]], missing: &[usize]) -> Result<(), EcError> {
        self.rebuild(shards, missing, Targets::DataOnly)
    }

    /// Brings the parity up to date after data shard `index` changed, given
    /// `delta = old ^ new`, without reading the other data shards.
    ///
    /// From zero parity, applying each data shard as its own delta encodes the
    /// stripe: this is ISA-L's `ec_encode_data_update`.
    pub fn update(&self, index: usize, delta: &[u8], parity: &mut [&mut [u8]]) -> Result<(), EcError> {
        if index >= self.data {
            return Err(EcError::ShardIndexOutOfRange {
                index,
                count: self.data,
            });
        }
        check_count(parity.len(), self.parity)?;
        shard_len(std::iter::once(delta.len()).chain(parity.iter().map(|p| p.len())))?;
        let column: Vec<u8> = (0..self.parity).map(|p| self.encoder.get(p, index)).collect();
        let coefficients = Coefficients::new(self.parity, 1, column);
        self.dot(&coefficients, &[delta], parity, true);
        Ok(())
    }

    /// Returns the indices (K..K+M) of the parity shards that do not match
    /// the data; empty when the stripe is consistent.
    pub fn verify(&self, shards: &[&[u8]]) -> Result<Vec<usize>, EcError> {
        check_count(shards.len(), self.total_shards())?;
        let len = shard_len(shards.iter().map(|s| s.len()))?;
        let mut expected = vec![vec![0u8; len]; self.parity];
        let mut outputs: Vec<&mut [u8]> = expected.iter_mut().map(|e| e.as_mut_slice()).collect();
        self.dot(&self.encoder, &shards[..self.data], &mut outputs, false);
        Ok((0..self.parity)
            .filter(|&p| expected[p] != shards[self.data + p])
            .map(|p| self.data + p)
            .collect())
    }

    fn rebuild(&self, shards: &mut [&mut [u8]], missing: &[usize], targets: Targets) -> Result<(), EcError> {
        check_count(shards.len(), self.total_shards())?;
        shard_len(shards.iter().map(|s| s.len()))?;
        let key = self.plan_key(missing, targets)?;
        let plan = self.plan(key);
        if plan.targets.is_empty() {
            return Ok(());
        }
        let mut inputs: Vec<&[u8]> = Vec::with_capacity(plan.sources.len());
        let mut outputs: Vec<&mut [u8]> = Vec::with_capacity(plan.targets.len());
        let (mut next_source, mut next_target) = (0, 0);
        for (index, shard) in shards.iter_mut().enumerate() {
            if plan.sources.get(next_source) == Some(&index) {
                inputs.push(&**shard);
                next_source += 1;
            } else if plan.targets.get(next_target) == Some(&index) {
                outputs.push(&mut **shard);
                next_target += 1;
            }
        }
        assert_eq!(inputs.len(), self.data);
        assert_eq!(outputs.len(), plan.targets.len());
        self.dot(&plan.coefficients, &inputs, &mut outputs, false);
        Ok(())
    }

    /// The survivors a rebuild of `missing` reads, and the row-major
    /// (missing x K) matrix that computes the missing shards from them, one
    /// row per missing shard in ascending order of index: what
    /// an ISA-L application hands `ec_init_tables` to decode.
    pub fn decode_matrix(&self, missing: &[usize]) -> Result<(Vec<usize>, Vec<u8>), EcError> {
        let plan = self.plan(self.plan_key(missing, Targets::All)?);
        let c = &plan.coefficients;
        let rows = (0..c.rows())
            .flat_map(|r| (0..c.columns()).map(move |j| c.get(r, j)))
            .collect();
        Ok((plan.sources.clone(), rows))
    }

    /// Checks `missing` and turns it into a cache key.
    fn plan_key(&self, missing: &[usize], targets: Targets) -> Result<PlanKey, EcError> {
        let total = self.total_shards();
        let mut key = PlanKey {
            missing: [0; 4],
            targets,
        };
        for &index in missing {
            if index >= total {
                return Err(EcError::ShardIndexOutOfRange { index, count: total });
            }
            let (word, bit) = (index / 64, 1u64 << (index % 64));
            if key.missing[word] & bit != 0 {
                return Err(EcError::DuplicateMissing { index });
            }
            key.missing[word] |= bit;
        }
        if missing.len() > self.parity {
            return Err(EcError::TooManyMissing {
                missing: missing.len(),
                parity: self.parity,
            });
        }
        Ok(key)
    }

    fn plan(&self, key: PlanKey) -> Arc<DecodePlan> {
        let mut plans = self.plans.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(plan) = plans.get(&key) {
            return Arc::clone(plan);
        }
        let plan = Arc::new(self.make_plan(key));
        if plans.len() >= PLAN_CACHE_COUNT_MAX {
            plans.clear();
        }
        plans.insert(key, Arc::clone(&plan));
        plan
    }

    fn make_plan(&self, key: PlanKey) -> DecodePlan {
        let is_missing = |i: usize| key.missing[i / 64] & (1 << (i % 64)) != 0;
        let k = self.data;
        // Data shards first among the survivors: their rows are the identity,
        // and a pattern that lost only parity then needs no inversion.
        let sources: Vec<usize> = (0..self.total_shards()).filter(|&i| !is_missing(i)).take(k).collect();
        let targets: Vec<usize> = (0..self.total_shards())
            .filter(|&i| is_missing(i) && (key.targets == Targets::All || i < k))
            .collect();
        let mut survivors = Vec::with_capacity(k * k);
        for &s in &sources {
            survivors.extend_from_slice(&self.matrix[s * k..(s + 1) * k]);
        }
        let inverse = matrix::invert(&survivors, k).expect("every K rows of an MDS matrix are invertible");
        let mut rows = Vec::with_capacity(targets.len() * k);
        for &t in &targets {
            // Shard t is (row t of the matrix) x data, and data = inverse x sources.
            let row = &self.matrix[t * k..(t + 1) * k];
            for column in 0..k {
                let mut sum = 0u8;
                for (i, &r) in row.iter().enumerate() {
                    sum ^= crate::gf::mul(r, inverse[i * k + column]);
                }
                rows.push(sum);
            }
        }
        DecodePlan {
            coefficients: Coefficients::new(targets.len(), k, rows),
            sources,
            targets,
        }
    }

    /// Runs the kernel, split by columns across threads when the call is large.
    fn dot(&self, coefficients: &Coefficients, inputs: &[&[u8]], outputs: &mut [&mut [u8]], accumulate: bool) {
        let len = inputs[0].len();
        let parts = self.threads.min(len * inputs.len() / PARALLEL_BYTES_MIN).max(1);
        if parts == 1 {
            kernels::dot(self.kernel, coefficients, inputs, outputs, accumulate);
            return;
        }
        // Pieces are whole cache lines, so threads never share one.
        let piece = len.div_ceil(parts).next_multiple_of(64);
        let mut piece_inputs: Vec<Vec<&[u8]>> = Vec::new();
        let mut piece_outputs: Vec<Vec<&mut [u8]>> = Vec::new();
        for input in inputs {
            for (p, chunk) in input.chunks(piece).enumerate() {
                if p == piece_inputs.len() {
                    piece_inputs.push(Vec::with_capacity(inputs.len()));
                }
                piece_inputs[p].push(chunk);
            }
        }
        for output in outputs.iter_mut() {
            for (p, chunk) in output.chunks_mut(piece).enumerate() {
                if p == piece_outputs.len() {
                    piece_outputs.push(Vec::with_capacity(coefficients.rows()));
                }
                piece_outputs[p].push(chunk);
            }
        }
        let kernel = self.kernel;
        std::thread::scope(|scope| {
            for (piece_in, mut piece_out) in piece_inputs.into_iter().zip(piece_outputs) {
                scope.spawn(move || kernels::dot(kernel, coefficients, &piece_in, &mut piece_out, accumulate));
            }
        });
    }
}

fn check_count(actual: usize, expected: usize) -> Result<(), EcError> {
    if actual != expected {
        return Err(EcError::WrongShardCount { expected, actual });
    }
    Ok(())
}

/// The common length of the shards, or why there is none.
fn shard_len(mut lens: impl Iterator<Item = usize>) -> Result<usize, EcError> {
    let Some(expected) = lens.next() else {
        return Err(EcError::EmptyShards);
    };
    if expected == 0 {
        return Err(EcError::EmptyShards);
    }
    for (i, actual) in lens.enumerate() {
        if actual != expected {
            return Err(EcError::ShardLengthMismatch {
                shard: i + 1,
                expected,
                actual,
            });
        }
    }
    Ok(expected)
}
