//! When to compress: a policy in the manner of Ceph BlueStore.
//!
//! - `mode`: `none` never compresses; `passive` compresses only data a client
//!   hints as compressible; `aggressive` compresses everything not hinted
//!   incompressible; `force` tries everything, hints or not.
//! - `required_ratio` (default 0.875): the compressed form is kept only if it
//!   is at most that fraction of the original, else the blob is stored raw.
//! - `min_blob` / `max_blob`: blobs under `min_blob` are stored raw (the
//!   saving cannot pay for the work); data over `max_blob` is cut into blobs
//!   of `max_blob` so a small read never decompresses a large blob.
//!
//! Before compressing, every mode but `force` runs a cheap test on a sample
//! (byte entropy of windows spread over the blob, and an LZ4 pass over its
//! first 4 KiB); data that looks random is stored raw without a full
//! compression attempt, so random data costs little.

use crate::{Codec, CompressError};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    None,
    Passive,
    Aggressive,
    Force,
}

/// What a client said about its data (NBD has no such hint; other front ends may).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Hint {
    #[default]
    None,
    Compressible,
    Incompressible,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Policy {
    pub mode: Mode,
    pub codec: Codec,
    pub required_ratio: f64,
    pub min_blob: usize,
    pub max_blob: usize,
}

/// Why a blob was stored the way it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Compressed and kept.
    Compressed,
    /// The mode or hint said not to try.
    NotTried,
    /// Shorter than `min_blob`.
    TooSmall,
    /// The sample test judged it incompressible.
    LooksIncompressible,
    /// Compressed, but not below `required_ratio`.
    RatioNotMet,
}

/// One blob as it is to be stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blob {
    /// `None` when stored raw.
    pub codec: Option<Codec>,
    pub original_len: usize,
    pub bytes: Vec<u8>,
    pub outcome: Outcome,
}

/// Windows sampled for the entropy test, and their size.
const SAMPLE_WINDOW_COUNT: usize = 16;
const SAMPLE_WINDOW_BYTES: usize = 256;
/// Bytes of the blob's start given to the LZ4 test pass.
const SAMPLE_PREFIX_BYTES: usize = 4096;

impl Default for Policy {
    fn default() -> Self {
        Policy {
            mode: Mode::Aggressive,
            codec: Codec::Lz4,
            required_ratio: 0.875,
            min_blob: 8 << 10,
            max_blob: 64 << 10,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PolicyError {
    #[error("required ratio {0} is not in (0, 1]")]
    BadRatio(f64),
    #[error("min_blob {min} is larger than max_blob {max}")]
    BadBlobSizes { min: usize, max: usize },
    #[error("max_blob {max} is over the {limit}-byte limit")]
    BlobTooLarge { max: usize, limit: usize },
    #[error("unknown compression mode '{0}': use none, passive, aggressive or force")]
    UnknownMode(String),
}

impl std::str::FromStr for Mode {
    type Err = PolicyError;

    fn from_str(name: &str) -> Result<Self, PolicyError> {
        match name {
            "none" => Ok(Mode::None),
            "passive" => Ok(Mode::Passive),
            "aggressive" => Ok(Mode::Aggressive),
            "force" => Ok(Mode::Force),
            _ => Err(PolicyError::UnknownMode(name.to_string())),
        }
    }
}

impl Policy {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if !(self.required_ratio > 0.0 && self.required_ratio <= 1.0) {
            return Err(PolicyError::BadRatio(self.required_ratio));
        }
        if self.min_blob > self.max_blob || self.max_blob == 0 {
            return Err(PolicyError::BadBlobSizes {
                min: self.min_blob,
                max: self.max_blob,
            });
        }
        if self.max_blob > crate::BLOB_BYTES_MAX {
            return Err(PolicyError::BlobTooLarge {
                max: self.max_blob,
                limit: crate::BLOB_BYTES_MAX,
            });
        }
        Ok(())
    }

    /// Cuts `data` into blobs of at most `max_blob` and stores each per the policy.
    pub fn compress(&self, data: &[u8], hint: Hint) -> Result<Vec<Blob>, CompressError> {
        data.chunks(self.max_blob.max(1))
            .map(|blob| self.compress_blob(blob, hint))
            .collect()
    }

    /// Stores one blob (at most `max_blob` bytes) per the policy.
    pub fn compress_blob(&self, blob: &[u8], hint: Hint) -> Result<Blob, CompressError> {
        let raw = |outcome| Blob {
            codec: None,
            original_len: blob.len(),
            bytes: blob.to_vec(),
            outcome,
        };
        let try_it = match self.mode {
            Mode::None => false,
            Mode::Passive => hint == Hint::Compressible,
            Mode::Aggressive => hint != Hint::Incompressible,
            Mode::Force => true,
        };
        if !try_it {
            return Ok(raw(Outcome::NotTried));
        }
        if blob.len() < self.min_blob || blob.is_empty() {
            return Ok(raw(Outcome::TooSmall));
        }
        if self.mode != Mode::Force && looks_incompressible(blob, self.required_ratio) {
            return Ok(raw(Outcome::LooksIncompressible));
        }
        let packed = self.codec.compress(blob)?;
        if packed.len() as f64 > self.required_ratio * blob.len() as f64 {
            return Ok(raw(Outcome::RatioNotMet));
        }
        Ok(Blob {
            codec: Some(self.codec),
            original_len: blob.len(),
            bytes: packed,
            outcome: Outcome::Compressed,
        })
    }
}

impl Blob {
    /// The original bytes.
    pub fn restore(&self) -> Result<Vec<u8>, CompressError> {
        match self.codec {
            None => Ok(self.bytes.clone()),
            Some(codec) => codec.decompress(&self.bytes, self.original_len),
        }
    }
}

/// A cheap guess that `data` would not compress to `required_ratio`, from
/// two samples: the byte entropy of windows spread over the blob, and what
/// LZ4 makes of its first 4 KiB.
///
/// A compressor removes repeats (LZ matching) and codes what is left byte by
/// byte, and no byte-by-byte code beats the bytes' entropy: H bits per byte
/// give at best H/8 of the size. So the best to expect is about LZ4's ratio on
/// the prefix (the repeats) times H/8 (the rest); a blob whose estimate is
/// above `required_ratio` is stored raw untried. Random data (8 bits, no
/// repeats) and data that is not quite random (fio's default buffers: 7.3 to
/// 7.6 bits, LZ4 up to 4% on a prefix, zstd -1 to 0.90-0.96) are skipped;
/// text (about 4.5 bits) and repeated random blocks (LZ4 to a fraction) are
/// tried. Repeats further apart than the prefix are missed, as before.
pub fn looks_incompressible(data: &[u8], required_ratio: f64) -> bool {
    let mut histogram = [0u32; 256];
    let mut sampled = 0u32;
    let stride = (data.len() / SAMPLE_WINDOW_COUNT).max(SAMPLE_WINDOW_BYTES);
    let mut start = 0;
    while start < data.len() {
        for &b in &data[start..(start + SAMPLE_WINDOW_BYTES).min(data.len())] {
            histogram[b as usize] += 1;
            sampled += 1;
        }
        start += stride;
    }
    let total = f64::from(sampled);
    let entropy: f64 = histogram
        .iter()
        .filter(|&&n| n > 0)
        .map(|&n| {
            let p = f64::from(n) / total;
            -p * p.log2()
        })
        .sum();
    // A sample understates entropy by about (symbols - 1) / (2 n ln 2) bits
    // (Miller-Madow), and cannot show more than log2(n) bits: a short sample
    // is judged against that ceiling instead of 8.
    let symbols = histogram.iter().filter(|&&n| n > 0).count() as f64;
    let entropy = entropy + (symbols - 1.0) / (2.0 * total * std::f64::consts::LN_2);
    let literal_ratio = entropy / 8.0_f64.min(total.log2() - 0.5);
    if literal_ratio <= required_ratio {
        return false;
    }
    let prefix = &data[..data.len().min(SAMPLE_PREFIX_BYTES)];
    let repeat_ratio = crate::Codec::Lz4
        .compress(prefix)
        .map_or(1.0, |packed| packed.len() as f64 / prefix.len() as f64);
    repeat_ratio * literal_ratio > required_ratio
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngCore, SeedableRng};

    fn random(len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        rand::rngs::StdRng::seed_from_u64(len as u64).fill_bytes(&mut v);
        v
    }

    fn text(len: usize) -> Vec<u8> {
        b"The quick brown fox jumps over the lazy dog; stripes and parity. "
            .iter()
            .cycle()
            .take(len)
            .copied()
            .collect()
    }

    #[test]
    fn modes_follow_hints_as_bluestore_does() {
        let data = text(32 << 10);
        let outcome = |mode, hint| {
            let policy = Policy {
                mode,
                ..Policy::default()
            };
            policy.compress_blob(&data, hint).unwrap().outcome
        };
        use Outcome::*;
        assert_eq!(outcome(Mode::None, Hint::Compressible), NotTried);
        assert_eq!(outcome(Mode::Passive, Hint::None), NotTried);
        assert_eq!(outcome(Mode::Passive, Hint::Compressible), Compressed);
        assert_eq!(outcome(Mode::Aggressive, Hint::None), Compressed);
        assert_eq!(outcome(Mode::Aggressive, Hint::Incompressible), NotTried);
        assert_eq!(outcome(Mode::Force, Hint::Incompressible), Compressed);
    }

    #[test]
    fn random_data_is_stored_raw_without_a_full_attempt() {
        let policy = Policy::default();
        let blob = policy.compress_blob(&random(64 << 10), Hint::None).unwrap();
        assert_eq!(blob.outcome, Outcome::LooksIncompressible);
        assert_eq!(blob.codec, None);
        // Force skips the sample test, and the ratio check stores it raw.
        let forced = Policy {
            mode: Mode::Force,
            ..policy
        };
        assert_eq!(
            forced.compress_blob(&random(64 << 10), Hint::None).unwrap().outcome,
            Outcome::RatioNotMet
        );
    }

    #[test]
    fn data_whose_entropy_cannot_meet_the_ratio_is_not_tried() {
        // Bytes drawn one by one, a zero 15% more often than the rest:
        // about 7.4 bits per byte, so no better than 0.92 without repeats.
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let data: Vec<u8> = (0..64 << 10)
            .map(|_| {
                if rng.next_u32() % 100 < 15 {
                    0
                } else {
                    rng.next_u32() as u8
                }
            })
            .collect();
        let policy = Policy {
            codec: Codec::Zstd { level: 1 },
            ..Policy::default()
        };
        assert_eq!(
            policy.compress_blob(&data, Hint::None).unwrap().outcome,
            Outcome::LooksIncompressible
        );
        // Tried anyway, it misses the ratio: skipping lost nothing.
        let forced = Policy {
            mode: Mode::Force,
            ..policy
        };
        assert_eq!(
            forced.compress_blob(&data, Hint::None).unwrap().outcome,
            Outcome::RatioNotMet
        );
        // A laxer ratio is worth trying for (entropy coding gets ~0.93).
        let lax = Policy {
            required_ratio: 0.98,
            ..policy
        };
        assert_eq!(
            lax.compress_blob(&data, Hint::None).unwrap().outcome,
            Outcome::Compressed
        );
    }

    #[test]
    fn repeated_random_blocks_are_not_mistaken_for_random() {
        let block = random(1024);
        let data: Vec<u8> = block.iter().cycle().take(64 << 10).copied().collect();
        assert!(!looks_incompressible(&data, Policy::default().required_ratio));
        let blob = Policy::default().compress_blob(&data, Hint::None).unwrap();
        assert_eq!(blob.outcome, Outcome::Compressed);
    }

    #[test]
    fn required_ratio_and_blob_sizes_apply() {
        // Half text, half random: compresses to about 0.5-0.6, so a 0.4 ratio refuses it.
        let mut data = text(16 << 10);
        data.extend(random(16 << 10));
        let strict = Policy {
            required_ratio: 0.4,
            mode: Mode::Force,
            ..Policy::default()
        };
        assert_eq!(
            strict.compress_blob(&data, Hint::None).unwrap().outcome,
            Outcome::RatioNotMet
        );
        let small = Policy::default().compress_blob(&text(100), Hint::None).unwrap();
        assert_eq!(small.outcome, Outcome::TooSmall);
        let blobs = Policy::default().compress(&text(200 << 10), Hint::None).unwrap();
        assert_eq!(blobs.len(), 4);
        let restored: Vec<u8> = blobs.iter().flat_map(|b| b.restore().unwrap()).collect();
        assert_eq!(restored, text(200 << 10));
    }

    #[test]
    fn bad_settings_are_refused() {
        let bad_ratio = Policy {
            required_ratio: 1.5,
            ..Policy::default()
        };
        assert_eq!(bad_ratio.validate(), Err(PolicyError::BadRatio(1.5)));
        let bad_sizes = Policy {
            min_blob: 10,
            max_blob: 5,
            ..Policy::default()
        };
        assert!(matches!(bad_sizes.validate(), Err(PolicyError::BadBlobSizes { .. })));
        assert_eq!(Policy::default().validate(), Ok(()));
        assert!("sometimes".parse::<Mode>().is_err());
    }
}
