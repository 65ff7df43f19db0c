//! `tessera bench hash` and `tessera bench compress`: per-core speed of the
//! checksum and compression crates, with the reference tool measured in the
//! same run (`openssl speed`, `b3sum`, `zstd -b`, `lz4 -b`) where one exists.

use anyhow::{Context, Result};
use rand::RngCore;
use serde::Serialize;
use std::process::Command;
use std::time::{Duration, Instant};
use tessera_checksum::Algorithm;
use tessera_compress::Codec;

/// Minimum time per measurement.
const MEASURE_SECONDS: f64 = 0.5;

#[derive(Serialize)]
pub struct HashReport {
    pub algorithm: &'static str,
    pub block_bytes: usize,
    pub gbps: f64,
    pub reference: Option<String>,
    pub reference_gbps: Option<f64>,
    pub ratio: Option<f64>,
}

#[derive(Serialize)]
pub struct CompressReport {
    pub codec: String,
    pub input: String,
    pub input_bytes: usize,
    pub block_bytes: usize,
    pub ratio: f64,
    pub gbps: f64,
    pub decompress_gbps: f64,
    pub reference: Option<String>,
    pub reference_gbps: Option<f64>,
    pub reference_decompress_gbps: Option<f64>,
}

fn random_bytes(len: usize) -> Vec<u8> {
    let mut data = vec![0u8; len];
    rand::thread_rng().fill_bytes(&mut data);
    data
}

/// Bytes per second of `work`, which processes `bytes` per call, as GB/s.
fn measure(bytes: usize, mut work: impl FnMut()) -> f64 {
    let minimum = Duration::from_secs_f64(MEASURE_SECONDS);
    work();
    let start = Instant::now();
    let mut calls = 0u32;
    while start.elapsed() < minimum {
        work();
        calls += 1;
    }
    bytes as f64 * f64::from(calls) / start.elapsed().as_secs_f64() / 1e9
}

pub fn hash(algorithm: Algorithm, bytes: usize, block_bytes: usize) -> Result<HashReport> {
    let data = random_bytes(bytes.max(block_bytes));
    let gbps = measure(data.len(), || {
        for block in data.chunks(block_bytes) {
            std::hint::black_box(algorithm.digest(block));
        }
    });
    let (reference, reference_gbps) = match algorithm {
        Algorithm::Sha256 => ("openssl speed -evp sha256", openssl_speed("sha256", block_bytes)),
        Algorithm::Sha3_512 => ("openssl speed -evp sha3-512", openssl_speed("sha3-512", block_bytes)),
        Algorithm::Blake3 => ("b3sum --num-threads 1", b3sum_speed(&data)),
        Algorithm::Crc32c | Algorithm::Xxh3 => ("", None),
    };
    Ok(HashReport {
        algorithm: algorithm.name(),
        block_bytes,
        gbps,
        reference: (!reference.is_empty()).then(|| reference.to_string()),
        ratio: reference_gbps.map(|r| gbps / r),
        reference_gbps,
    })
}

/// `openssl speed` for one block size: its last line's last figure, in 1000s of bytes per second.
fn openssl_speed(name: &str, block_bytes: usize) -> Option<f64> {
    let out = Command::new("openssl")
        .args([
            "speed",
            "-seconds",
            "2",
            "-bytes",
            &block_bytes.to_string(),
            "-evp",
            name,
        ])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().rev().find(|l| l.trim_end().ends_with('k'))?;
    let kilobytes: f64 = last.split_whitespace().last()?.trim_end_matches('k').parse().ok()?;
    Some(kilobytes * 1e3 / 1e9)
}

/// `b3sum --num-threads 1` over a file of `data`, best of three, as GB/s.
fn b3sum_speed(data: &[u8]) -> Option<f64> {
    let dir = tempfile::tempdir().ok()?;
    let path = dir.path().join("input");
    std::fs::write(&path, data).ok()?;
    let mut best = f64::MAX;
    for _ in 0..3 {
        let start = Instant::now();
        let status = Command::new("b3sum")
            .arg("--num-threads")
            .arg("1")
            .arg(&path)
            .output()
            .ok()?
            .status;
        if !status.success() {
            return None;
        }
        best = best.min(start.elapsed().as_secs_f64());
    }
    Some(data.len() as f64 / best / 1e9)
}

/// Text-like input: words drawn from a small vocabulary, which compresses
/// roughly as source code and logs do.
fn generated_text(len: usize) -> Vec<u8> {
    let words: Vec<&str> = "the stripe parity chunk block device array member rebuild scrub checksum merkle root \
        degraded extent volume write read flush sector offset length sequence summary healthy failed replace"
        .split_whitespace()
        .collect();
    let mut rng = rand::thread_rng();
    let mut out = Vec::with_capacity(len + 16);
    while out.len() < len {
        let word = words[(rng.next_u32() as usize) % words.len()];
        out.extend_from_slice(word.as_bytes());
        out.push(if rng.next_u32().is_multiple_of(12) { b'\n' } else { b' ' });
    }
    out.truncate(len);
    out
}

pub fn compress(codec: Codec, input: Option<&std::path::Path>, block_bytes: usize) -> Result<CompressReport> {
    let (data, input_name) = match input {
        Some(path) => (
            std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
            path.display().to_string(),
        ),
        None => (generated_text(64 << 20), "generated text (64 MiB)".to_string()),
    };
    anyhow::ensure!(!data.is_empty(), "the input is empty");
    let blocks: Vec<&[u8]> = data.chunks(block_bytes).collect();
    let packed: Vec<Vec<u8>> = blocks.iter().map(|b| codec.compress(b)).collect::<Result<_, _>>()?;
    let packed_bytes: usize = packed.iter().map(Vec::len).sum();
    let gbps = measure(data.len(), || {
        for block in &blocks {
            std::hint::black_box(codec.compress(block).expect("compressed once already"));
        }
    });
    let decompress_gbps = measure(data.len(), || {
        for (p, b) in packed.iter().zip(&blocks) {
            std::hint::black_box(codec.decompress(p, b.len()).expect("our own output"));
        }
    });
    let reference = cli_bench(codec, &data, block_bytes)?;
    Ok(CompressReport {
        codec: codec.to_string(),
        input: input_name,
        input_bytes: data.len(),
        block_bytes,
        ratio: packed_bytes as f64 / data.len() as f64,
        gbps,
        decompress_gbps,
        reference: reference.as_ref().map(|r| r.0.clone()),
        reference_gbps: reference.as_ref().map(|r| r.1),
        reference_decompress_gbps: reference.as_ref().map(|r| r.2),
    })
}

/// `zstd -b` or `lz4 -b` on the same bytes and block size: (command, compress, decompress GB/s).
fn cli_bench(codec: Codec, data: &[u8], block_bytes: usize) -> Result<Option<(String, f64, f64)>> {
    let (program, level) = match codec {
        Codec::Zstd { level } => ("zstd", level),
        Codec::Lz4 => ("lz4", 1),
        _ => return Ok(None),
    };
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("input");
    std::fs::write(&path, data)?;
    let args = vec![format!("-b{level}"), format!("-B{block_bytes}"), "-i3".to_string()];
    let Ok(out) = Command::new(program).args(&args).arg(&path).output() else {
        return Ok(None);
    };
    // Both print "... -> N (x R), C MB/s, D MB/s" (the result on stderr or stdout).
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let line = text.rsplit(['\r', '\n']).find(|l| l.contains("MB/s"));
    let speeds: Vec<f64> = line
        .map(|l| {
            l.split("MB/s")
                .filter_map(|part| part.rsplit([',', ' ']).find(|t| !t.is_empty())?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    Ok(match speeds[..] {
        [compress, decompress, ..] => Some((
            format!("{program} {}", args.join(" ")),
            compress * 1e6 / 1e9,
            decompress * 1e6 / 1e9,
        )),
        _ => None,
    })
}
