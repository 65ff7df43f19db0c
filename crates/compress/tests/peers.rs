//! Compressed data is the standard formats: the reference tools read what
//! Tessera writes, and Tessera reads what they write.

use std::io::Write;
use std::process::{Command, Stdio};
use tessera_compress::Codec;

fn sample() -> Vec<u8> {
    let mut data = Vec::new();
    for i in 0..20_000u32 {
        writeln!(data, "block {i} of stripe {} holds parity {}", i / 14, i % 4).unwrap();
    }
    data
}

/// Runs `program args` with `input` on stdin and returns its stdout.
fn pipe(program: &str, args: &[&str], input: &[u8]) -> Vec<u8> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{program} is needed for this test (scripts/install-test-deps.sh): {e}"));
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "{program} {args:?} failed");
    out.stdout
}

#[test]
fn gzip_reads_ours_and_we_read_gzips() {
    let data = sample();
    for level in [1, 6, 9] {
        let ours = Codec::Gzip { level }.compress(&data).unwrap();
        assert_eq!(pipe("gzip", &["-d", "-c"], &ours), data);
        let theirs = pipe("gzip", &["-c", &format!("-{level}")], &data);
        assert_eq!(Codec::Gzip { level }.decompress(&theirs, data.len()).unwrap(), data);
    }
}

#[test]
fn zstd_reads_ours_and_we_read_zstds() {
    let data = sample();
    for level in [1, 3, 19] {
        let ours = Codec::Zstd { level }.compress(&data).unwrap();
        assert_eq!(pipe("zstd", &["-d", "-c", "-q"], &ours), data);
        let theirs = pipe("zstd", &["-c", "-q", &format!("-{level}")], &data);
        assert_eq!(Codec::Zstd { level }.decompress(&theirs, data.len()).unwrap(), data);
    }
}

#[test]
fn zlib_and_raw_deflate_interoperate_with_pythons_zlib() {
    let data = sample();
    let script = "import sys, zlib; d = sys.stdin.buffer.read(); w = int(sys.argv[1]); op = sys.argv[2]
o = zlib.decompressobj(w) if op == 'd' else zlib.compressobj(6, zlib.DEFLATED, w)
sys.stdout.buffer.write((o.decompress(d) + o.flush()) if op == 'd' else (o.compress(d) + o.flush()))";
    // wbits 15: zlib framing; -15: raw deflate.
    for (codec, wbits) in [(Codec::Zlib { level: 6 }, "15"), (Codec::Deflate { level: 6 }, "-15")] {
        let ours = codec.compress(&data).unwrap();
        assert_eq!(pipe("python3", &["-c", script, wbits, "d"], &ours), data, "{codec}");
        let theirs = pipe("python3", &["-c", script, wbits, "c"], &data);
        assert_eq!(codec.decompress(&theirs, data.len()).unwrap(), data, "{codec}");
    }
}
