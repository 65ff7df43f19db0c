//! Inline compression: codecs and the policy that decides when to use them.
//!
//! Guarantees: compressed blocks are the standard formats (LZ4 block, zstd
//! frame, raw deflate, gzip, zlib, Snappy raw), so data never depends on
//! Tessera to be read: `gzip -d` reads what the gzip codec writes and Tessera
//! reads what `gzip` writes. Decompression is told the original length and
//! never allocates more than that (itself capped by [`BLOB_BYTES_MAX`]);
//! corrupt or truncated input is a typed error, never a panic.
//!
//! - [`Codec`]: one compression format and level, chosen by name.
//! - [`policy`]: a BlueStore-like policy (mode, required ratio, blob sizes,
//!   hints) with a fast test that skips incompressible data.

pub mod policy;

use std::fmt;
use std::io::Read;

/// The largest blob compressed or decompressed at once: a bound on the memory
/// a corrupt length field can make a decoder ask for.
pub const BLOB_BYTES_MAX: usize = 64 << 20;

/// A compression format and its level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Codec {
    /// LZ4 block format: the fastest.
    Lz4,
    /// Zstandard frame at a level (1..=22; 3 is zstd's default).
    Zstd { level: i32 },
    /// Raw deflate (RFC 1951) at a level (0..=9).
    Deflate { level: u32 },
    /// Deflate in gzip framing (RFC 1952), as `gzip` reads and writes.
    Gzip { level: u32 },
    /// Deflate in zlib framing (RFC 1950).
    Zlib { level: u32 },
    /// Snappy raw format.
    Snappy,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CompressError {
    #[error("unknown codec '{name}': use lz4, zstd[:LEVEL], deflate[:LEVEL], gzip[:LEVEL], zlib[:LEVEL] or snappy")]
    UnknownCodec { name: String },
    #[error("level {level} is out of range for {codec}: use {min}..={max}")]
    BadLevel {
        codec: &'static str,
        level: i64,
        min: i64,
        max: i64,
    },
    #[error("{codec} data is corrupt or truncated: {reason}")]
    Corrupt { codec: &'static str, reason: String },
    #[error("{codec} data decompressed to {actual} bytes, not the {expected} recorded")]
    LengthMismatch {
        codec: &'static str,
        expected: usize,
        actual: usize,
    },
    #[error("a blob of {len} bytes is over the {max}-byte limit")]
    TooLarge { len: usize, max: usize },
}

thread_local! {
    /// Each thread's zstd contexts, kept from call to call: making one
    /// allocates and clears its tables (about a megabyte at level 1), which
    /// cost more than compressing a 64 KiB blob and, with many threads,
    /// contended in the kernel (zstd:1 writes stopped scaling at 2.4 GB/s
    /// on 16 cores).
    static ZSTD_COMPRESSOR: std::cell::RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { std::cell::RefCell::new(None) };
    static ZSTD_DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

fn zstd_compress(input: &[u8], level: i32) -> std::io::Result<Vec<u8>> {
    ZSTD_COMPRESSOR.with(|c| {
        let mut c = c.borrow_mut();
        if c.as_ref().is_none_or(|(l, _)| *l != level) {
            *c = Some((level, zstd::bulk::Compressor::new(level)?));
        }
        c.as_mut().expect("made above").1.compress(input)
    })
}

impl Codec {
    /// The family name, without the level.
    pub fn family(self) -> &'static str {
        match self {
            Codec::Lz4 => "lz4",
            Codec::Zstd { .. } => "zstd",
            Codec::Deflate { .. } => "deflate",
            Codec::Gzip { .. } => "gzip",
            Codec::Zlib { .. } => "zlib",
            Codec::Snappy => "snappy",
        }
    }

    /// Compresses `input` (at most [`BLOB_BYTES_MAX`] bytes).
    pub fn compress(self, input: &[u8]) -> Result<Vec<u8>, CompressError> {
        if input.len() > BLOB_BYTES_MAX {
            return Err(CompressError::TooLarge {
                len: input.len(),
                max: BLOB_BYTES_MAX,
            });
        }
        let flate_level = |level: u32| flate2::Compression::new(level);
        let out = match self {
            Codec::Lz4 => lz4::block::compress(input, None, false).map_err(|e| self.corrupt(e))?,
            Codec::Zstd { level } => zstd_compress(input, level).map_err(|e| self.corrupt(e))?,
            Codec::Deflate { level } => {
                drain(flate2::read::DeflateEncoder::new(input, flate_level(level))).map_err(|e| self.corrupt(e))?
            }
            Codec::Gzip { level } => {
                drain(flate2::read::GzEncoder::new(input, flate_level(level))).map_err(|e| self.corrupt(e))?
            }
            Codec::Zlib { level } => {
                drain(flate2::read::ZlibEncoder::new(input, flate_level(level))).map_err(|e| self.corrupt(e))?
            }
            Codec::Snappy => snap::raw::Encoder::new()
                .compress_vec(input)
                .map_err(|e| self.corrupt(e))?,
        };
        Ok(out)
    }

    /// Decompresses `input`, which must expand to exactly `original_len` bytes.
    pub fn decompress(self, input: &[u8], original_len: usize) -> Result<Vec<u8>, CompressError> {
        if original_len > BLOB_BYTES_MAX {
            return Err(CompressError::TooLarge {
                len: original_len,
                max: BLOB_BYTES_MAX,
            });
        }
        let out = match self {
            Codec::Lz4 => {
                // LZ4_decompress_safe: bounded by the output buffer, checked against the input.
                let mut out = vec![0u8; original_len];
                let written = lz4::block::decompress_to_buffer(input, Some(original_len as i32), &mut out)
                    .map_err(|e| self.corrupt(e))?;
                out.truncate(written);
                out
            }
            Codec::Zstd { .. } => {
                // One byte of slack tells "longer than recorded" from "exactly right".
                let mut out = Vec::with_capacity(original_len + 1);
                ZSTD_DECOMPRESSOR
                    .with(|d| {
                        let mut d = d.borrow_mut();
                        if d.is_none() {
                            *d = Some(zstd::bulk::Decompressor::new()?);
                        }
                        d.as_mut().expect("made above").decompress_to_buffer(input, &mut out)
                    })
                    .map_err(|e| self.corrupt(e))?;
                out
            }
            Codec::Deflate { .. } => self.read_bounded(flate2::read::DeflateDecoder::new(input), original_len)?,
            Codec::Gzip { .. } => self.read_bounded(flate2::read::MultiGzDecoder::new(input), original_len)?,
            Codec::Zlib { .. } => self.read_bounded(flate2::read::ZlibDecoder::new(input), original_len)?,
            Codec::Snappy => {
                let claimed = snap::raw::decompress_len(input).map_err(|e| self.corrupt(e))?;
                if claimed != original_len {
                    return Err(self.length_mismatch(original_len, claimed));
                }
                let mut out = vec![0u8; original_len];
                let written = snap::raw::Decoder::new()
                    .decompress(input, &mut out)
                    .map_err(|e| self.corrupt(e))?;
                out.truncate(written);
                out
            }
        };
        if out.len() != original_len {
            return Err(self.length_mismatch(original_len, out.len()));
        }
        Ok(out)
    }

    /// Reads at most `original_len + 1` bytes from a streaming decoder.
    fn read_bounded(self, decoder: impl Read, original_len: usize) -> Result<Vec<u8>, CompressError> {
        let mut out = Vec::with_capacity(original_len);
        decoder
            .take(original_len as u64 + 1)
            .read_to_end(&mut out)
            .map_err(|e| self.corrupt(e))?;
        Ok(out)
    }

    fn corrupt(self, error: impl fmt::Display) -> CompressError {
        CompressError::Corrupt {
            codec: self.family(),
            reason: error.to_string(),
        }
    }

    fn length_mismatch(self, expected: usize, actual: usize) -> CompressError {
        CompressError::LengthMismatch {
            codec: self.family(),
            expected,
            actual,
        }
    }
}

/// Everything a streaming encoder produces.
fn drain(mut encoder: impl Read) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    encoder.read_to_end(&mut out)?;
    Ok(out)
}

impl std::str::FromStr for Codec {
    type Err = CompressError;

    /// `lz4`, `snappy`, `zstd`, `zstd:19`, `deflate:6`, `gzip`, `zlib:1`.
    fn from_str(text: &str) -> Result<Self, CompressError> {
        let (family, level_text) = match text.split_once(':') {
            Some((family, level)) => (family, Some(level)),
            None => (text, None),
        };
        let level = |default: i64, min: i64, max: i64, codec: &'static str| -> Result<i64, CompressError> {
            let Some(level) = level_text else { return Ok(default) };
            let value: i64 = level
                .parse()
                .map_err(|_| CompressError::UnknownCodec { name: text.to_string() })?;
            if !(min..=max).contains(&value) {
                return Err(CompressError::BadLevel {
                    codec,
                    level: value,
                    min,
                    max,
                });
            }
            Ok(value)
        };
        let no_level = |codec: Codec| match level_text {
            Some(_) => Err(CompressError::UnknownCodec { name: text.to_string() }),
            None => Ok(codec),
        };
        match family {
            "lz4" => no_level(Codec::Lz4),
            "snappy" => no_level(Codec::Snappy),
            "zstd" => Ok(Codec::Zstd {
                level: level(3, 1, 22, "zstd")? as i32,
            }),
            "deflate" => Ok(Codec::Deflate {
                level: level(6, 0, 9, "deflate")? as u32,
            }),
            "gzip" => Ok(Codec::Gzip {
                level: level(6, 0, 9, "gzip")? as u32,
            }),
            "zlib" => Ok(Codec::Zlib {
                level: level(6, 0, 9, "zlib")? as u32,
            }),
            _ => Err(CompressError::UnknownCodec { name: text.to_string() }),
        }
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Codec::Lz4 | Codec::Snappy => f.write_str(self.family()),
            Codec::Zstd { level } => write!(f, "zstd:{level}"),
            Codec::Deflate { level } | Codec::Gzip { level } | Codec::Zlib { level } => {
                write!(f, "{}:{level}", self.family())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, RngCore, SeedableRng};

    pub(crate) const ALL: [&str; 6] = ["lz4", "zstd:3", "deflate:6", "gzip:6", "zlib:6", "snappy"];

    fn text(len: usize) -> Vec<u8> {
        let words = [
            "stripe ",
            "parity ",
            "chunk ",
            "block ",
            "tessera ",
            "degraded ",
            "scrub\n",
        ];
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            out.extend_from_slice(words[rng.gen_range(0..words.len())].as_bytes());
        }
        out.truncate(len);
        out
    }

    #[test]
    fn every_codec_round_trips_text_random_and_empty() {
        let mut random = vec![0u8; 100_000];
        rand::rngs::StdRng::seed_from_u64(1).fill_bytes(&mut random);
        for name in ALL {
            let codec: Codec = name.parse().unwrap();
            assert_eq!(codec.to_string(), name);
            for input in [text(100_000), random.clone(), Vec::new(), vec![0u8; 4096]] {
                let packed = codec.compress(&input).unwrap();
                assert_eq!(codec.decompress(&packed, input.len()).unwrap(), input, "{name}");
            }
            assert!(
                codec.compress(&text(100_000)).unwrap().len() < 50_000,
                "{name} compresses text"
            );
        }
    }

    #[test]
    fn corrupt_truncated_and_mislabelled_input_is_a_typed_error() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let input = text(50_000);
        for name in ALL {
            let codec: Codec = name.parse().unwrap();
            let packed = codec.compress(&input).unwrap();
            // Truncated.
            assert!(
                codec.decompress(&packed[..packed.len() / 2], input.len()).is_err(),
                "{name}"
            );
            // Recorded length wrong either way.
            assert!(codec.decompress(&packed, input.len() - 1).is_err(), "{name}");
            assert!(codec.decompress(&packed, input.len() + 1).is_err(), "{name}");
            // Absurd recorded length: refused before any allocation.
            assert_eq!(
                codec.decompress(&packed, usize::MAX).unwrap_err(),
                CompressError::TooLarge {
                    len: usize::MAX,
                    max: BLOB_BYTES_MAX
                }
            );
            // Random garbage and bit flips: an error or (rarely, for formats
            // without a checksum) the wrong bytes of the right length; never a panic.
            for _ in 0..200 {
                let mut bad = packed.clone();
                let at = rng.gen_range(0..bad.len());
                bad[at] ^= 1 << rng.gen_range(0..8);
                if let Ok(out) = codec.decompress(&bad, input.len()) {
                    assert_eq!(out.len(), input.len());
                }
                let garbage: Vec<u8> = (0..rng.gen_range(0..300)).map(|_| rng.gen()).collect();
                let _ = codec.decompress(&garbage, rng.gen_range(0..100_000));
            }
        }
    }

    #[test]
    fn names_and_levels_are_checked() {
        assert_eq!("zstd:19".parse::<Codec>(), Ok(Codec::Zstd { level: 19 }));
        assert_eq!("zstd".parse::<Codec>(), Ok(Codec::Zstd { level: 3 }));
        assert!(matches!(
            "zstd:23".parse::<Codec>(),
            Err(CompressError::BadLevel { .. })
        ));
        assert!(matches!(
            "brotli".parse::<Codec>(),
            Err(CompressError::UnknownCodec { .. })
        ));
        assert!(matches!(
            "lz4:3".parse::<Codec>(),
            Err(CompressError::UnknownCodec { .. })
        ));
    }
}
