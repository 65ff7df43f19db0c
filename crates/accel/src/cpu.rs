//! The CPU backend: the SIMD kernels of `tessera_ec` and the hashes of
//! `tessera_checksum`, on the calling thread for small batches and on a
//! pool of threads sized to the machine for large ones.
//!
//! Small batches run where they are handed over: the data the caller just
//! packed is still in its cache, and no thread is woken for 20 µs of work.
//! A batch of at least [`PARALLEL_BYTES_MIN`] is spread over the pool: by
//! stripe when there are several, by byte range of the chunks (and by
//! chunk for the leaves) when one wide stripe makes the batch.

use crate::{AccelError, Accelerator, Leaves, ReconstructJob, SealJob, Shape, Work, WorkCounters};
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tessera_checksum::{merkle, Algorithm, Digest};
use tessera_ec::{Codec, MatrixKind};

/// Batches smaller than this (bytes of data read) run on the caller: below
/// it, waking pool threads costs more than it saves.
pub const PARALLEL_BYTES_MIN: usize = 4 << 20;

/// The same bound for batches hashed with SHA-256 or SHA3-512, which a
/// core hashes at 0.1-1.2 GB/s: 256 KiB is already 0.2-2 ms of one core.
/// With the 4 MiB bound, a 1 MiB client write's SHA3-512 digests took
/// 8.7 ms on one core of a 16-core Xeon (an H100 machine), where the pool
/// has 16 cores for them.
pub const PARALLEL_SLOW_HASH_BYTES_MIN: usize = 256 << 10;

/// Threads the pool has by default: one per CPU the process may use.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

pub struct Cpu {
    pool: rayon::ThreadPool,
    threads: usize,
    codecs: Mutex<HashMap<(usize, usize), Arc<Codec>>>,
    counters: WorkCounters,
}

impl Cpu {
    /// A backend whose pool has `threads` threads.
    pub fn new(threads: usize) -> Cpu {
        let threads = threads.max(1);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("tessera-accel-{i}"))
            .build()
            .expect("threads can be started");
        Cpu {
            pool,
            threads,
            codecs: Mutex::new(HashMap::new()),
            counters: WorkCounters::default(),
        }
    }

    /// The Cauchy codec for a shape, built once (the GPU backend uses
    /// its CPU backend's).
    pub(crate) fn codec(&self, shape: &Shape) -> Result<Arc<Codec>, AccelError> {
        let mut codecs = self.codecs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(codec) = codecs.get(&(shape.data, shape.parity)) {
            return Ok(codec.clone());
        }
        let codec = Arc::new(Codec::new(shape.data, shape.parity, MatrixKind::Cauchy)?);
        codecs.insert((shape.data, shape.parity), codec.clone());
        Ok(codec)
    }

    /// Runs `work` on the backend's threads (the GPU backend packs and
    /// unpacks its staging buffers there).
    pub fn install<R: Send>(&self, work: impl FnOnce() -> R + Send) -> R {
        self.pool.install(work)
    }

    /// Whether a batch reading `bytes` and hashing them with `algorithm`
    /// goes to the pool.
    fn parallel(&self, algorithm: Algorithm, bytes: usize) -> bool {
        let min = match algorithm {
            Algorithm::Sha256 | Algorithm::Sha3_512 => PARALLEL_SLOW_HASH_BYTES_MIN,
            Algorithm::Crc32c | Algorithm::Xxh3 | Algorithm::Blake3 => PARALLEL_BYTES_MIN,
        };
        self.threads > 1 && bytes >= min
    }
}

/// The leaves of `chunks` (in order) and their root; on the pool when asked.
pub(crate) fn leaves(algorithm: Algorithm, chunks: &[&[u8]], parallel: bool) -> Leaves {
    let leaf = |(j, chunk): (usize, &&[u8])| merkle::leaf(algorithm, j, chunk);
    let leaves: Vec<Digest> = if parallel {
        chunks.par_iter().enumerate().map(leaf).collect()
    } else {
        chunks.iter().enumerate().map(leaf).collect()
    };
    let root = merkle::Tree::from_leaves(algorithm, leaves.clone())
        .expect("a stripe has chunks")
        .root();
    Leaves { leaves, root }
}

/// One byte range of a stripe: its data chunks' part in, parity's out.
type Piece<'a> = (Vec<&'a [u8]>, Vec<&'a mut [u8]>);

/// Parity of one stripe's data; split by byte ranges over the pool when asked.
fn encode(codec: &Codec, shape: &Shape, data: &[u8], parity: &mut [u8], pieces: usize) -> Result<(), AccelError> {
    let c = shape.chunk_bytes;
    // Whole cache lines per piece, so threads never share one.
    let piece = c.div_ceil(pieces.max(1)).next_multiple_of(64).min(c);
    let mut work: Vec<Piece> = (0..c.div_ceil(piece))
        .map(|_| (Vec::with_capacity(shape.data), Vec::with_capacity(shape.parity)))
        .collect();
    for chunk in data.chunks(c) {
        for (p, part) in chunk.chunks(piece).enumerate() {
            work[p].0.push(part);
        }
    }
    for chunk in parity.chunks_mut(c) {
        for (p, part) in chunk.chunks_mut(piece).enumerate() {
            work[p].1.push(part);
        }
    }
    let run = |(inputs, outputs): &mut Piece| codec.encode(inputs, outputs);
    if work.len() == 1 {
        return Ok(run(&mut work[0])?);
    }
    work.par_iter_mut().try_for_each(run)?;
    Ok(())
}

impl Cpu {
    fn seal_one(
        &self,
        codec: &Codec,
        shape: &Shape,
        job: &mut SealJob<'_>,
        pieces: usize,
    ) -> Result<Leaves, AccelError> {
        encode(codec, shape, job.data, job.parity, pieces)?;
        let chunks: Vec<&[u8]> = job
            .data
            .chunks(shape.chunk_bytes)
            .chain(job.parity.chunks(shape.chunk_bytes))
            .collect();
        Ok(leaves(shape.checksum, &chunks, pieces > 1))
    }

    fn reconstruct_one(
        &self,
        codec: &Codec,
        shape: &Shape,
        job: &mut ReconstructJob<'_>,
        parallel: bool,
    ) -> Result<Leaves, AccelError> {
        if !job.missing.is_empty() {
            codec.reconstruct(&mut job.chunks, &job.missing)?;
        }
        let chunks: Vec<&[u8]> = job.chunks.iter().map(|c| &**c).collect();
        Ok(leaves(shape.checksum, &chunks, parallel))
    }
}

impl Accelerator for Cpu {
    fn name(&self) -> &str {
        "cpu"
    }

    fn seal(&self, shape: &Shape, jobs: &mut [SealJob<'_>]) -> Result<Vec<Leaves>, AccelError> {
        crate::check_seal_jobs(shape, jobs)?;
        let codec = self.codec(shape)?;
        let bytes = jobs.len() * shape.data * shape.chunk_bytes;
        let result = if !self.parallel(shape.checksum, bytes) {
            jobs.iter_mut()
                .map(|job| self.seal_one(&codec, shape, job, 1))
                .collect()
        } else if jobs.len() == 1 {
            self.pool
                .install(|| self.seal_one(&codec, shape, &mut jobs[0], self.threads))
                .map(|l| vec![l])
        } else {
            self.pool.install(|| {
                jobs.par_iter_mut()
                    .map(|job| self.seal_one(&codec, shape, job, 1))
                    .collect()
            })
        };
        self.counters.sealed(jobs.len(), bytes);
        result
    }

    fn reconstruct(&self, shape: &Shape, jobs: &mut [ReconstructJob<'_>]) -> Result<Vec<Leaves>, AccelError> {
        crate::check_reconstruct_jobs(shape, jobs)?;
        let codec = self.codec(shape)?;
        let bytes = jobs.len() * shape.width() * shape.chunk_bytes;
        let result = if !self.parallel(shape.checksum, bytes) {
            jobs.iter_mut()
                .map(|job| self.reconstruct_one(&codec, shape, job, false))
                .collect()
        } else if jobs.len() == 1 {
            self.pool
                .install(|| self.reconstruct_one(&codec, shape, &mut jobs[0], true))
                .map(|l| vec![l])
        } else {
            self.pool.install(|| {
                jobs.par_iter_mut()
                    .map(|job| self.reconstruct_one(&codec, shape, job, false))
                    .collect()
            })
        };
        self.counters.reconstructed(jobs.len(), bytes);
        result
    }

    fn decode(&self, shape: &Shape, jobs: &mut [ReconstructJob<'_>]) -> Result<(), AccelError> {
        crate::check_reconstruct_jobs(shape, jobs)?;
        let codec = self.codec(shape)?;
        for job in jobs.iter_mut() {
            codec.reconstruct_data(&mut job.chunks, &job.missing)?;
        }
        self.counters
            .reconstructed(jobs.len(), jobs.len() * shape.data * shape.chunk_bytes);
        Ok(())
    }

    fn hash(&self, algorithm: Algorithm, inputs: &[&[u8]]) -> Vec<Digest> {
        let bytes: usize = inputs.iter().map(|i| i.len()).sum();
        self.counters.hashed(inputs.len(), bytes);
        if self.parallel(algorithm, bytes) && inputs.len() > 1 {
            self.pool
                .install(|| inputs.par_iter().map(|input| algorithm.digest(input)).collect())
        } else {
            inputs.iter().map(|input| algorithm.digest(input)).collect()
        }
    }

    fn work(&self) -> Work {
        self.counters.snapshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn random(rng: &mut impl Rng, len: usize) -> Vec<u8> {
        let mut bytes = vec![0u8; len];
        rng.fill(&mut bytes[..]);
        bytes
    }

    /// The reference: one stripe sealed with the codec and the Merkle tree
    /// directly, chunk by chunk.
    fn reference(shape: &Shape, data: &[u8]) -> (Vec<u8>, Leaves) {
        let c = shape.chunk_bytes;
        let codec = Codec::new(shape.data, shape.parity, MatrixKind::Cauchy).unwrap();
        let mut parity = vec![0u8; shape.parity * c];
        {
            let inputs: Vec<&[u8]> = data.chunks(c).collect();
            let mut outputs: Vec<&mut [u8]> = parity.chunks_mut(c).collect();
            codec.encode(&inputs, &mut outputs).unwrap();
        }
        let chunks: Vec<&[u8]> = data.chunks(c).chain(parity.chunks(c)).collect();
        let tree = merkle::Tree::new(shape.checksum, &chunks).unwrap();
        let leaves = chunks
            .iter()
            .enumerate()
            .map(|(j, chunk)| merkle::leaf(shape.checksum, j, chunk))
            .collect();
        (
            parity,
            Leaves {
                leaves,
                root: tree.root(),
            },
        )
    }

    #[test]
    fn sealing_matches_the_reference_serial_and_on_the_pool() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        // Narrow and wide shapes; chunk sizes that do and do not split
        // evenly; batches below and above the parallel threshold.
        for (k, m, c, stripes) in [(4, 2, 4096, 1), (8, 2, 65536, 10), (20, 4, 212_992, 1), (3, 1, 4160, 3)] {
            for checksum in [Algorithm::Crc32c, Algorithm::Blake3] {
                let shape = Shape {
                    data: k,
                    parity: m,
                    chunk_bytes: c,
                    checksum,
                };
                let data: Vec<Vec<u8>> = (0..stripes).map(|_| random(&mut rng, k * c)).collect();
                let mut parity: Vec<Vec<u8>> = (0..stripes).map(|_| vec![0u8; m * c]).collect();
                for threads in [1, 3] {
                    let cpu = Cpu::new(threads);
                    let mut jobs: Vec<SealJob> = data
                        .iter()
                        .zip(parity.iter_mut())
                        .map(|(d, p)| SealJob { data: d, parity: p })
                        .collect();
                    let results = cpu.seal(&shape, &mut jobs).unwrap();
                    for (i, result) in results.iter().enumerate() {
                        let (want_parity, want_leaves) = reference(&shape, &data[i]);
                        assert!(parity[i] == want_parity, "{k}+{m} x {c}, {threads} threads: parity");
                        assert_eq!(*result, want_leaves, "{k}+{m} x {c}, {threads} threads: leaves");
                    }
                    assert_eq!(cpu.work().stripes_sealed, stripes as u64);
                }
            }
        }
    }

    #[test]
    fn reconstruction_rebuilds_every_pattern_and_yields_the_sealed_leaves() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let shape = Shape {
            data: 5,
            parity: 3,
            chunk_bytes: 8192,
            checksum: Algorithm::Crc32c,
        };
        let c = shape.chunk_bytes;
        let data = random(&mut rng, shape.data * c);
        let (parity, sealed) = reference(&shape, &data);
        let whole: Vec<u8> = data.iter().chain(&parity).copied().collect();
        let cpu = Cpu::new(2);
        for missing in [vec![], vec![0], vec![4, 6], vec![1, 2, 7], vec![5, 6, 7]] {
            let mut copy = whole.clone();
            for &j in &missing {
                copy[j * c..(j + 1) * c].fill(0xAA);
            }
            let mut jobs = vec![ReconstructJob {
                chunks: copy.chunks_mut(c).collect(),
                missing: missing.clone(),
            }];
            let result = cpu.reconstruct(&shape, &mut jobs).unwrap();
            assert_eq!(result[0], sealed, "{missing:?}");
            drop(jobs);
            assert!(copy == whole, "{missing:?}: rebuilt bytes");
        }
        let mut copy = whole.clone();
        let mut jobs = vec![ReconstructJob {
            chunks: copy.chunks_mut(c).collect(),
            missing: vec![0, 1, 2, 3],
        }];
        assert!(cpu.reconstruct(&shape, &mut jobs).is_err(), "more than M missing");
        // A byte range of every chunk decodes on its own: data chunks 0 and
        // 3 rebuilt from bytes 100..612 of the others.
        let range = |j: usize| whole[j * c + 100..j * c + 612].to_vec();
        let mut pieces: Vec<Vec<u8>> = (0..shape.width()).map(range).collect();
        pieces[0].fill(0);
        pieces[3].fill(0);
        let mut jobs = vec![ReconstructJob {
            chunks: pieces.iter_mut().map(|p| &mut p[..]).collect(),
            missing: vec![0, 3, 7],
        }];
        let ranged = Shape {
            chunk_bytes: 512,
            ..shape
        };
        cpu.decode(&ranged, &mut jobs).unwrap();
        drop(jobs);
        assert_eq!(pieces[0], range(0));
        assert_eq!(pieces[3], range(3));
    }

    #[test]
    fn bad_shapes_are_refused_and_hashes_match_the_reference() {
        let shape = Shape {
            data: 2,
            parity: 1,
            chunk_bytes: 4096,
            checksum: Algorithm::Sha256,
        };
        let cpu = Cpu::new(2);
        let data = vec![0u8; 4096];
        let mut parity = vec![0u8; 4096];
        let mut jobs = vec![SealJob {
            data: &data,
            parity: &mut parity,
        }];
        assert!(matches!(
            cpu.seal(&shape, &mut jobs),
            Err(AccelError::WrongSize { index: 0, .. })
        ));
        let inputs: Vec<Vec<u8>> = (0..40).map(|i| vec![i as u8; 200_000]).collect();
        let slices: Vec<&[u8]> = inputs.iter().map(|i| &i[..]).collect();
        for algorithm in Algorithm::ALL {
            let digests = cpu.hash(algorithm, &slices);
            for (input, digest) in inputs.iter().zip(digests) {
                assert_eq!(digest, algorithm.digest(input));
            }
        }
        assert_eq!(cpu.work().buffers_hashed, 5 * 40);
        assert_eq!("CPU".parse::<crate::Kind>().unwrap(), crate::Kind::Cpu);
        assert!("fpga".parse::<crate::Kind>().is_err());
    }
}
