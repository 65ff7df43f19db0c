//! Digests agree with the reference command-line tools on random files.
//! The tools come from scripts/install-test-deps.sh (coreutils, b3sum, openssl).

use rand::{Rng, RngCore, SeedableRng};
use std::process::Command;
use tessera_checksum::Algorithm;

fn tool_digest(program: &str, args: &[&str], path: &std::path::Path) -> String {
    let out = Command::new(program)
        .args(args)
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("{program} is needed for this test (scripts/install-test-deps.sh): {e}"));
    assert!(
        out.status.success(),
        "{program}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    // sha256sum and b3sum print "HEX  PATH"; openssl prints "NAME(PATH)= HEX".
    let hex = if text.contains("= ") {
        text.rsplit("= ").next().unwrap()
    } else {
        text.split_whitespace().next().unwrap()
    };
    hex.trim().to_string()
}

#[test]
fn digests_match_sha256sum_b3sum_and_openssl() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xc0ffee);
    for len in [0usize, 1, 63, 64, 1000, 65_536, 1_000_003] {
        let mut data = vec![0u8; len];
        rng.fill_bytes(&mut data);
        let path = dir.path().join(format!("file{}", rng.gen::<u32>()));
        std::fs::write(&path, &data).unwrap();
        assert_eq!(
            Algorithm::Sha256.digest(&data).to_hex(),
            tool_digest("sha256sum", &[], &path),
            "len {len}"
        );
        assert_eq!(
            Algorithm::Blake3.digest(&data).to_hex(),
            tool_digest("b3sum", &[], &path),
            "len {len}"
        );
        assert_eq!(
            Algorithm::Sha3_512.digest(&data).to_hex(),
            tool_digest("openssl", &["dgst", "-sha3-512"], &path),
            "len {len}"
        );
        assert_eq!(
            Algorithm::Sha256.digest(&data).to_hex(),
            tool_digest("openssl", &["dgst", "-sha256"], &path),
            "len {len}"
        );
    }
}
