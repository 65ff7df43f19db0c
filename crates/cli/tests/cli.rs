//! The `tessera` binary driven as a user would: `ec encode|decode` and the benches.

use crate::common::*;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::path::Path;
use std::process::Output;

fn shard(dir: &Path, index: usize) -> std::path::PathBuf {
    dir.join(index.to_string())
}

#[test]
fn encode_then_decode_restores_every_lost_shard() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    for (data, parity, len, matrix) in [
        (4, 2, 3_000_001, "cauchy"),
        (10, 4, 65_536, "vandermonde"),
        (1, 3, 17, "cauchy"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut originals = Vec::new();
        for i in 0..data {
            let bytes: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            std::fs::write(shard(dir.path(), i), &bytes).unwrap();
            originals.push(bytes);
        }
        let (k, m, d) = (
            data.to_string(),
            parity.to_string(),
            dir.path().to_str().unwrap().to_string(),
        );
        let args = [
            "--data",
            k.as_str(),
            "--parity",
            m.as_str(),
            "--matrix",
            matrix,
            d.as_str(),
        ];
        let out = tessera(&[&["ec", "encode"][..], &args[..]].concat());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let all: Vec<Vec<u8>> = (0..data + parity)
            .map(|i| std::fs::read(shard(dir.path(), i)).unwrap())
            .collect();
        assert!(all[..data] == originals[..], "encode leaves the data shards alone");
        let mut lost: Vec<usize> = (0..data + parity).collect();
        lost.shuffle(&mut rng);
        lost.truncate(parity);
        for &i in &lost {
            std::fs::remove_file(shard(dir.path(), i)).unwrap();
        }
        let out = tessera(&[&["ec", "decode"][..], &args[..]].concat());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        for (i, expected) in all.iter().enumerate() {
            assert!(
                std::fs::read(shard(dir.path(), i)).unwrap() == *expected,
                "shard {i} of {data}+{parity}"
            );
        }
        assert!(
            std::fs::read_dir(dir.path()).unwrap().count() == data + parity,
            "no temporary files left"
        );
    }
}

#[test]
fn decode_refuses_more_losses_than_parity() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..3 {
        std::fs::write(shard(dir.path(), i), [i as u8; 100]).unwrap();
    }
    let d = dir.path().to_str().unwrap();
    assert!(tessera(&["ec", "encode", "--data", "3", "--parity", "2", d])
        .status
        .success());
    for i in [0, 2, 4] {
        std::fs::remove_file(shard(dir.path(), i)).unwrap();
    }
    let out = tessera(&["ec", "decode", "--data", "3", "--parity", "2", d]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("3 shards are missing"), "{stderr}");
    assert!(!shard(dir.path(), 0).exists(), "a refused decode writes nothing");
}

#[test]
fn bad_shapes_and_unequal_shards_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(shard(dir.path(), 0), [1u8; 10]).unwrap();
    std::fs::write(shard(dir.path(), 1), [1u8; 11]).unwrap();
    let d = dir.path().to_str().unwrap();
    let out = tessera(&["ec", "encode", "--data", "2", "--parity", "1", d]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("same length"));
    assert!(!shard(dir.path(), 2).exists());

    let out = tessera(&["ec", "encode", "--data", "0", "--parity", "1", d]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least one data shard"));
    let out = tessera(&["ec", "encode", "--data", "200", "--parity", "57", d]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("over the limit of 256"));
    let out = tessera(&[
        "ec",
        "encode",
        "--data",
        "6",
        "--parity",
        "5",
        "--matrix",
        "vandermonde",
        d,
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not MDS"));
}

#[test]
fn bench_ec_prints_the_documented_json_keys() {
    let out = tessera(&[
        "bench",
        "ec",
        "--data",
        "4",
        "--parity",
        "2",
        "--shard-bytes",
        "4K",
        "--working-set",
        "64K",
        "--rounds",
        "1",
        "--seconds",
        "0.01",
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    for key in [
        "\"encode_gbps\":",
        "\"decode_gbps\":",
        "\"isal_encode_gbps\":",
        "\"isal_decode_gbps\":",
    ] {
        assert!(text.contains(key), "missing {key} in {text}");
    }
    assert_eq!(text.lines().count(), 1, "one JSON object");
}

#[test]
fn bench_hash_and_compress_print_the_documented_json_keys() {
    let out = tessera(&["bench", "hash", "--algorithm", "crc32c", "--bytes", "1M", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with('{') && text.contains("\"gbps\":"), "{text}");

    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input");
    std::fs::write(&input, b"tessera stripe parity ".repeat(10_000)).unwrap();
    let out = tessera(&[
        "bench",
        "compress",
        "--codec",
        "snappy",
        "--input",
        input.to_str().unwrap(),
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    for key in ["\"gbps\":", "\"ratio\":", "\"decompress_gbps\":"] {
        assert!(text.contains(key), "missing {key} in {text}");
    }
    let out = tessera(&["bench", "compress", "--codec", "brotli"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown codec"));
}

#[test]
fn resilience_prints_the_documented_json_and_plots_every_layout() {
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("loss.svg");
    let out = tessera(&[
        "resilience",
        "--layout",
        "10x8+2",
        "--layout",
        "1x92+8",
        "--afr",
        "0.01",
        "--trials",
        "200",
        "--json",
        "--plot",
        plot.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    for key in [
        "{\"layouts\":[",
        "\"layout\":\"10x8+2\"",
        "\"drives\":100",
        "\"loss_probability\":[",
        "\"monte_carlo\":[",
        "\"mttdl_hours\":",
    ] {
        assert!(text.contains(key), "missing {key}");
    }
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.contains("10x8+2") && svg.contains("1x92+8"));
    let out = tessera(&["resilience", "--layout", "8+2"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("SPANSxK+M"));
}

#[test]
fn resilience_plots_png_too() {
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("loss.png");
    let out = tessera(&[
        "resilience",
        "--layout",
        "10x8+2",
        "--trials",
        "10",
        "--plot",
        plot.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let png = std::fs::read(&plot).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}

fn json(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn tco_reproduces_the_snia_case_and_compares() {
    for (example, printed) in [
        ("snia-baseline", 565.09),
        ("snia-csd-3.84", 389.19),
        ("snia-csd-15.36", 141.05),
    ] {
        let v = json(&tessera(&["tco", example, "--json"]));
        let tco = v["report"]["tco_per_effective_tb"].as_f64().unwrap();
        assert!((tco - printed).abs() < printed * 0.01, "{example}: {tco} vs {printed}");
        assert!(v["inputs"]["drive_capacity_gb"].is_number());
    }
    let v = json(&tessera(&[
        "tco",
        "--compare",
        "snia-baseline",
        "snia-csd-3.84",
        "--json",
    ]));
    let saving = v["tco_per_effective_tb_saving_percent"].as_f64().unwrap();
    assert!((saving - 31.1).abs() < 0.1, "{saving}");

    // Flags override the example; a file written by --print-toml reads back.
    let dir = tempfile::tempdir().unwrap();
    let out = tessera(&["tco", "snia-baseline", "--layout", "1x8+2", "--print-toml"]);
    assert!(out.status.success());
    let file = dir.path().join("mine.toml");
    std::fs::write(&file, &out.stdout).unwrap();
    let v = json(&tessera(&["tco", file.to_str().unwrap(), "--json"]));
    assert_eq!(v["report"]["overhead"].as_f64(), Some(1.25));

    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/tco");
    let (a, b) = (root.join("hdd-10x8+2.toml"), root.join("hdd-1x92+8.toml"));
    let v = json(&tessera(&[
        "tco",
        "--compare",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--json",
    ]));
    let saving = v["tco_per_effective_tb_saving_percent"].as_f64().unwrap();
    // Same hardware; only the overhead differs: 1 - (100/92) / (10/8).
    assert!(
        (saving - (1.0 - (100.0 / 92.0) / 1.25) * 100.0).abs() < 1e-9,
        "{saving}"
    );
}

#[test]
fn tco_refuses_bad_input_by_name() {
    let out = tessera(&["tco", "snia-baseline", "--duty-cycle", "30"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("duty_cycle"));
    let out = tessera(&["tco", "no-such-example"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("snia-baseline"));
    let out = tessera(&["tco"]);
    assert!(!out.status.success());
}
