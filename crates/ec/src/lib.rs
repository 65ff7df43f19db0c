//! Reed-Solomon erasure coding over GF(2^8), byte-compatible with Intel ISA-L.
//!
//! Guarantees: for any K data + M parity shards with K+M <= 256, parity is the
//! bytes ISA-L's `ec_encode_data` writes for the same matrix (Cauchy or
//! Vandermonde), any M lost shards are rebuilt exactly, and a layout that
//! could not be decoded is refused when the codec is built, not when data is
//! lost. Every SIMD kernel computes the same bytes as the reference kernel.
//!
//! Contents, bottom up:
//! - [`gf`]: the field, and the tables the kernels use.
//! - [`matrix`]: encoding matrices, inversion, the MDS check.
//! - [`kernels`]: the dot-product kernels and run-time dispatch.
//! - [`Codec`]: encode, reconstruct, update, verify.

mod codec;
mod error;
pub mod gf;
pub mod kernels;
pub mod matrix;

pub use codec::Codec;
pub use error::EcError;
pub use kernels::Kernel;
pub use matrix::MatrixKind;

/// Data plus parity shards at most: GF(2^8) has 256 distinct elements to
/// build distinct matrix rows from.
pub const SHARD_COUNT_MAX: usize = 256;
