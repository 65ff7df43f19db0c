//! Block checksums and per-stripe Merkle trees.
//!
//! Guarantees: every algorithm computes exactly the published function (known
//! answers and agreement with `sha256sum`, `b3sum` and `openssl` are tested),
//! through crates that reach the hardware: `crc-fast` (CRC32C folded with
//! VPCLMULQDQ on AVX-512, SSE4.2 or NEON elsewhere) and `crc32c` (the
//! SSE4.2 instruction, for pieces under 64 KiB on x86-64 without AVX-512), `xxhash-rust`,
//! `blake3` (its AVX-512 path), and the system's OpenSSL for SHA-256 and
//! SHA3-512 (SHA-NI or AVX2 assembly, the same code `openssl speed` times).
//! No hash is written by hand here; what is, [`crc32c_of_4k_blocks`], only
//! combines CRC32Cs those crates computed, with tables made from their own
//! CRCs of zeros.
//!
//! - [`Algorithm`] and [`Digest`]: one checksum of one block, chosen by name.
//! - [`merkle`]: a tree over the chunks of a stripe, its root, and proofs that
//!   one chunk belongs to a root.

pub mod merkle;

use std::fmt;

/// CRC32C (Castagnoli, as iSCSI and ext4 use it) of `data`: the one
/// implementation the project uses, for block digests and the on-disk
/// format's own sector checks alike.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c_parts(&[data])
}

/// CRC32C of `parts` one after another, as if they were one slice.
pub fn crc32c_parts(parts: &[&[u8]]) -> u32 {
    if short_crc32c_is_faster(parts.iter().map(|p| p.len()).sum()) {
        return parts.iter().fold(0, |crc, part| crc32c::crc32c_append(crc, part));
    }
    if let [data] = parts {
        return crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32;
    }
    let mut digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    parts.iter().for_each(|p| digest.update(p));
    digest.finalize() as u32
}

/// The CRC32C of 4 KiB blocks one after another, from each block's own
/// CRC32C: no pass over the bytes. CRC32C is linear in its register, so
/// the CRC of A then B is the CRC of A advanced over |B| zero bytes
/// (with no initial value or final inversion, a linear map of its 32
/// bits) XOR the CRC of B. For |B| = 4 KiB that map is four tables of
/// 256 words, made once from 32 CRCs of 4 KiB of zeros.
pub fn crc32c_of_4k_blocks(crcs: &[u32]) -> u32 {
    static ADVANCE: std::sync::OnceLock<[[u32; 256]; 4]> = std::sync::OnceLock::new();
    let tables = ADVANCE.get_or_init(|| {
        let zeros = [0u8; 4096];
        // The register advanced over 4 KiB of zeros from each single bit.
        let bit: Vec<u32> = (0..32).map(|i| !crc32c::crc32c_append(!(1u32 << i), &zeros)).collect();
        let mut tables = [[0u32; 256]; 4];
        for (k, table) in tables.iter_mut().enumerate() {
            for (byte, entry) in table.iter_mut().enumerate() {
                *entry = (0..8)
                    .filter(|j| byte & (1 << j) != 0)
                    .fold(0, |acc, j| acc ^ bit[8 * k + j]);
            }
        }
        tables
    });
    let advance = |x: u32| {
        let [b0, b1, b2, b3] = x.to_le_bytes();
        tables[0][usize::from(b0)]
            ^ tables[1][usize::from(b1)]
            ^ tables[2][usize::from(b2)]
            ^ tables[3][usize::from(b3)]
    };
    match crcs {
        [] => 0,
        [first, rest @ ..] => rest.iter().fold(*first, |crc, &next| advance(crc) ^ next),
    }
}

/// The digest `Algorithm::Crc32c` gives bytes whose CRC32C is `crc`.
pub fn crc32c_digest(crc: u32) -> Digest {
    // Big-endian, as `crc32c` tools and RFC 3720 examples print it.
    Digest::from_bytes(&crc.to_be_bytes())
}

/// Whether `crc32c`'s three streams of the SSE4.2 instruction beat
/// `crc-fast` on `bytes`: below 64 KiB on an x86-64 CPU without
/// AVX-512 VPCLMULQDQ, where `crc-fast` folds 128 bits at a time and pays
/// a fixed cost a call. On an AMD Zen 3, 4 KiB blocks (one a call, as
/// every block's CRC is taken) went at 6.5 GB/s with `crc32c` against
/// 3.4-3.9 with `crc-fast`, and 64 KiB at about the same speed
/// (docs/PERFORMANCE.md, "CRC32C of 4 KiB blocks"). Elsewhere `crc-fast`
/// is kept: its AVX-512 and NEON paths were not measured against it.
fn short_crc32c_is_faster(bytes: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        bytes < 64 * 1024
            && std::arch::is_x86_feature_detected!("sse4.2")
            && !(std::arch::is_x86_feature_detected!("avx512vl") && std::arch::is_x86_feature_detected!("vpclmulqdq"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = bytes;
        false
    }
}

/// The longest digest (SHA3-512), in bytes.
pub const DIGEST_BYTES_MAX: usize = 64;

/// A checksum algorithm, chosen at run time by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// CRC-32C (Castagnoli), as iSCSI, ext4 and Btrfs use: detects accidents, not attacks.
    Crc32c,
    /// XXH3, 64-bit: fast and non-cryptographic.
    Xxh3,
    /// BLAKE3, 256-bit: cryptographic and fast on SIMD.
    Blake3,
    /// SHA-256.
    Sha256,
    /// SHA3-512: cryptographic, slow on CPUs (a GPU backend's work).
    Sha3_512,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChecksumError {
    #[error("unknown checksum '{name}': use crc32c, xxh3, blake3, sha256 or sha3-512")]
    UnknownAlgorithm { name: String },
    #[error("Merkle proof for chunk {index} does not lead to the root")]
    ProofMismatch { index: usize },
    #[error("Merkle proof is for chunk {index} of {count}, which does not exist")]
    ProofOutOfRange { index: usize, count: usize },
    #[error("a Merkle tree needs at least one chunk")]
    NoChunks,
}

impl Algorithm {
    pub const ALL: [Algorithm; 5] = [
        Algorithm::Crc32c,
        Algorithm::Xxh3,
        Algorithm::Blake3,
        Algorithm::Sha256,
        Algorithm::Sha3_512,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Crc32c => "crc32c",
            Algorithm::Xxh3 => "xxh3",
            Algorithm::Blake3 => "blake3",
            Algorithm::Sha256 => "sha256",
            Algorithm::Sha3_512 => "sha3-512",
        }
    }

    /// Digest length in bytes.
    pub fn digest_bytes(self) -> usize {
        match self {
            Algorithm::Crc32c => 4,
            Algorithm::Xxh3 => 8,
            Algorithm::Blake3 | Algorithm::Sha256 => 32,
            Algorithm::Sha3_512 => 64,
        }
    }

    /// The checksum of `data`.
    pub fn digest(self, data: &[u8]) -> Digest {
        self.digest_parts(&[data])
    }

    /// The checksum of the concatenation of `parts`, without copying them together.
    pub fn digest_parts(self, parts: &[&[u8]]) -> Digest {
        let mut out = Digest {
            bytes: [0; DIGEST_BYTES_MAX],
            len: self.digest_bytes() as u8,
        };
        match self {
            Algorithm::Crc32c => return crc32c_digest(crc32c_parts(parts)),
            Algorithm::Xxh3 => {
                let mut hasher = xxhash_rust::xxh3::Xxh3::new();
                parts.iter().for_each(|p| hasher.update(p));
                out.bytes[..8].copy_from_slice(&hasher.digest().to_be_bytes());
            }
            Algorithm::Blake3 => {
                let mut hasher = blake3::Hasher::new();
                parts.iter().for_each(|p| {
                    hasher.update(p);
                });
                out.bytes[..32].copy_from_slice(hasher.finalize().as_bytes());
            }
            Algorithm::Sha256 => openssl_digest(openssl::hash::MessageDigest::sha256(), parts, &mut out.bytes[..32]),
            Algorithm::Sha3_512 => {
                openssl_digest(openssl::hash::MessageDigest::sha3_512(), parts, &mut out.bytes[..64])
            }
        }
        out
    }
}

fn openssl_digest(kind: openssl::hash::MessageDigest, parts: &[&[u8]], out: &mut [u8]) {
    // OpenSSL fails only on allocation failure or a digest it was built
    // without; both are broken installations, not conditions to handle.
    let mut hasher = openssl::hash::Hasher::new(kind).expect("OpenSSL provides SHA-256 and SHA3-512");
    for part in parts {
        hasher.update(part).expect("hashing in memory cannot fail");
    }
    out.copy_from_slice(&hasher.finish().expect("hashing in memory cannot fail"));
}

impl std::str::FromStr for Algorithm {
    type Err = ChecksumError;

    fn from_str(name: &str) -> Result<Self, ChecksumError> {
        let lower = name.to_ascii_lowercase();
        let canonical = match lower.as_str() {
            "xxh3-64" | "xxhash3" | "xxh3_64" => "xxh3",
            "sha-256" => "sha256",
            "sha3_512" | "sha3512" => "sha3-512",
            other => other,
        };
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == canonical)
            .ok_or_else(|| ChecksumError::UnknownAlgorithm { name: name.to_string() })
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A digest of up to 64 bytes, stored inline (no allocation per block).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest {
    bytes: [u8; DIGEST_BYTES_MAX],
    len: u8,
}

impl Digest {
    /// A digest read back from storage. Panics on more than 64 bytes: the
    /// caller sizes the slice by [`Algorithm::digest_bytes`].
    pub fn from_bytes(bytes: &[u8]) -> Digest {
        assert!(
            bytes.len() <= DIGEST_BYTES_MAX,
            "a digest has at most {DIGEST_BYTES_MAX} bytes"
        );
        let mut digest = Digest {
            bytes: [0; DIGEST_BYTES_MAX],
            len: bytes.len() as u8,
        };
        digest.bytes[..bytes.len()].copy_from_slice(bytes);
        digest
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    pub fn to_hex(&self) -> String {
        self.as_bytes().iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.to_hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Published test vectors: RFC 3720 B.4 / the CRC catalogue "check" value
    /// for CRC-32C, the xxHash reference for XXH3-64 of "", the BLAKE3
    /// reference for "", FIPS 180-2 and FIPS 202 examples for "abc".
    #[test]
    fn known_answers() {
        let cases: [(Algorithm, &[u8], &str); 8] = [
            (Algorithm::Crc32c, b"123456789", "e3069283"),
            (Algorithm::Crc32c, &[0u8; 32], "8a9136aa"),
            (Algorithm::Xxh3, b"", "2d06800538d394c2"),
            (Algorithm::Blake3, b"", "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"),
            (Algorithm::Sha256, b"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
            (Algorithm::Sha256, b"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
            (
                Algorithm::Sha3_512,
                b"abc",
                "b751850b1a57168a5693cd924b6b096e08f621827444f70d884f5d0240d2712e10e116e9192af3c91a7ec57647e3934057340b4cf408d5a56592f8274eec53f0",
            ),
            (
                Algorithm::Sha3_512,
                b"",
                "a69f73cca23a9ac5c8b567dc185a756e97c982164fe25859e0d1dcc1475c80a615b2123af1f5f94c11e3e9402c3ac558f500199d95b6d3e301758586281dcd26",
            ),
        ];
        for (algorithm, input, expected) in cases {
            assert_eq!(algorithm.digest(input).to_hex(), expected, "{algorithm}");
        }
    }

    #[test]
    fn parts_hash_as_their_concatenation() {
        for algorithm in Algorithm::ALL {
            let whole = algorithm.digest(b"hello, world");
            assert_eq!(algorithm.digest_parts(&[b"hello", b", ", b"world"]), whole);
            assert_eq!(whole.as_bytes().len(), algorithm.digest_bytes());
        }
    }

    /// Whichever crate a length goes to, the CRC is `crc-fast`'s of the
    /// whole: lengths on both sides of the 64 KiB switch, around 4 KiB
    /// blocks, and cut into parts anywhere.
    #[test]
    fn crc32c_is_the_same_whichever_crate_takes_the_length() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(32);
        let data: Vec<u8> = (0..200_000).map(|_| rng.gen()).collect();
        let lengths = [
            0, 1, 7, 8, 255, 256, 257, 4095, 4096, 4097, 8192, 65_535, 65_536, 65_537, 200_000,
        ];
        let random: Vec<usize> = (0..40).map(|_| rng.gen_range(0..200_000)).collect();
        for length in lengths.into_iter().chain(random) {
            let bytes = &data[..length];
            let reference = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, bytes) as u32;
            assert_eq!(crc32c(bytes), reference, "{length} bytes whole");
            let cut = rng.gen_range(0..=length);
            assert_eq!(
                crc32c_parts(&[&bytes[..cut], &bytes[cut..]]),
                reference,
                "{length} bytes cut at {cut}"
            );
            assert_eq!(crc32c::crc32c(bytes), reference, "{length} bytes through crc32c");
        }
    }

    /// The CRC of blocks from their CRCs is the CRC of their bytes, for
    /// every count of blocks an extent can have and more, random and
    /// all-zero bytes alike.
    #[test]
    fn crc32c_of_4k_blocks_is_the_crc_of_their_bytes() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(4096);
        let random: Vec<u8> = (0..40 * 4096).map(|_| rng.gen()).collect();
        let zeros = vec![0u8; 40 * 4096];
        for bytes in [&random, &zeros] {
            for blocks in 0..=40 {
                let whole = &bytes[..blocks * 4096];
                let crcs: Vec<u32> = whole.chunks(4096).map(crc32c).collect();
                assert_eq!(crc32c_of_4k_blocks(&crcs), crc32c(whole), "{blocks} blocks");
                assert_eq!(
                    crc32c_digest(crc32c_of_4k_blocks(&crcs)),
                    Algorithm::Crc32c.digest(whole),
                    "{blocks} blocks' digest"
                );
            }
        }
    }

    #[test]
    fn names_round_trip_and_unknown_is_refused() {
        for algorithm in Algorithm::ALL {
            assert_eq!(algorithm.name().parse::<Algorithm>(), Ok(algorithm));
        }
        assert_eq!("SHA-256".parse::<Algorithm>(), Ok(Algorithm::Sha256));
        assert!(matches!(
            "md5".parse::<Algorithm>(),
            Err(ChecksumError::UnknownAlgorithm { .. })
        ));
    }
}
