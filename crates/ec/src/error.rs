//! The codec's errors: every one names what was wrong and what is allowed.

/// Why an erasure-coding operation was refused. Nothing was written.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EcError {
    #[error("a code needs at least one data shard (got --data 0)")]
    NoDataShards,
    #[error("{data} data + {parity} parity shards is {total}, over the limit of 256 (GF(2^8) has 256 elements)")]
    TooManyShards { data: usize, parity: usize, total: usize },
    #[error(
        "the Vandermonde matrix is not MDS for {data} data + {parity} parity: some losses of {parity} shards could not be decoded; use at most {data_max} data shards with it, or the Cauchy matrix"
    )]
    NotMds {
        data: usize,
        parity: usize,
        data_max: usize,
    },
    #[error("unknown matrix '{name}': use cauchy or vandermonde")]
    UnknownMatrix { name: String },
    #[error("unknown kernel '{name}': use reference, neon, avx2, avx2-gfni, avx512 or avx512-gfni")]
    UnknownKernel { name: String },
    #[error("kernel {name} needs CPU features this machine lacks")]
    KernelUnavailable { name: &'static str },
    #[error("expected {expected} shards, got {actual}")]
    WrongShardCount { expected: usize, actual: usize },
    #[error("shard {shard} is {actual} bytes but shard 0 is {expected}: all shards must be the same length")]
    ShardLengthMismatch {
        shard: usize,
        expected: usize,
        actual: usize,
    },
    #[error("shards are empty: there is nothing to code")]
    EmptyShards,
    #[error("shard index {index} is out of range: there are {count} shards")]
    ShardIndexOutOfRange { index: usize, count: usize },
    #[error("shard {index} is listed as missing twice")]
    DuplicateMissing { index: usize },
    #[error("{missing} shards are missing but only {parity} can be rebuilt: the data is lost")]
    TooManyMissing { missing: usize, parity: usize },
}
