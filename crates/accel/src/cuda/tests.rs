//! Host-side tests run everywhere; the GPU tests run where a GPU opens
//! (`TESSERA_REQUIRE_GPU=1` makes its absence a failure, as on the GPU
//! machine), and the kernels are compiled wherever NVRTC is found
//! (`TESSERA_REQUIRE_NVRTC=1`, as in CI, makes its absence a failure).

use super::*;
use crate::cpu::Cpu;
use rand::{Rng, SeedableRng};

fn required(variable: &str) -> bool {
    std::env::var(variable).is_ok_and(|v| v == "1")
}

/// The GPU backend, or None (with a note) where none opens.
fn gpu(policy: Policy) -> Option<Cuda> {
    match Cuda::open(policy, 2) {
        Ok(gpu) => Some(gpu),
        Err(e) => {
            assert!(!required("TESSERA_REQUIRE_GPU"), "TESSERA_REQUIRE_GPU=1 but: {e}");
            eprintln!("NOTE: no GPU test ran: {e}");
            None
        }
    }
}

#[test]
fn pieces_cover_every_stripe_once_within_the_piece_size() {
    for (count, stripe_bytes) in [
        (0, 1 << 20),
        (1, 1 << 30),
        (7, 1 << 20),
        (1000, 640 << 10),
        (65, PIECE_BYTES),
    ] {
        let plan = pieces(count, stripe_bytes);
        let mut next = 0;
        for &(first, stripes) in &plan {
            assert_eq!(first, next, "pieces are in order without gaps");
            assert!(stripes >= 1);
            assert!(
                stripes == 1 || stripes * stripe_bytes <= PIECE_BYTES,
                "{stripes} x {stripe_bytes}"
            );
            next += stripes;
        }
        assert_eq!(next, count);
    }
}

#[test]
fn output_slots_are_copied_in_runs_of_adjacent_slots() {
    assert_eq!(runs(&[]), vec![]);
    assert_eq!(runs(&[10, 11, 12, 13]), vec![(10, 4)]);
    assert_eq!(runs(&[0, 3, 4, 9]), vec![(0, 1), (3, 2), (9, 1)]);
    assert_eq!(runs(&[4, 3]), vec![(4, 1), (3, 1)]);
}

#[test]
fn gf_params_hold_slots_then_a_mask_per_coefficient_bit() {
    let words = gf_params(&[0, 2, 3], &[1, 4], &[0x01, 0x80, 0x00, 0xff, 0x03, 0x10]);
    assert_eq!(&words[..5], &[0, 2, 3, 1, 4]);
    assert_eq!(words.len(), 8 + 6 * 8, "masks start on a 16-byte boundary");
    let mask = |coefficient: usize, bit: usize| words[8 + coefficient * 8 + bit];
    assert_eq!(mask(0, 0), u32::MAX);
    assert!((1..8).all(|b| mask(0, b) == 0));
    assert_eq!(mask(1, 7), u32::MAX);
    assert!((0..8).all(|b| mask(2, b) == 0 && mask(3, b) == u32::MAX));
    assert_eq!((mask(4, 0), mask(4, 1), mask(4, 2)), (u32::MAX, u32::MAX, 0));
}

#[test]
fn the_kernels_compile_with_nvrtc() {
    if let Err(why) = probe_nvrtc() {
        assert!(!required("TESSERA_REQUIRE_NVRTC"), "TESSERA_REQUIRE_NVRTC=1 but: {why}");
        eprintln!("NOTE: the kernels were not compiled: {why}");
        return;
    }
    for (major, minor) in [(7, 5), (8, 0), (9, 0)] {
        let ptx = compile(major, minor).unwrap_or_else(|e| panic!("sm_{major}{minor}: {e}"));
        for entry in ["gf_dot", "leaves", "roots", "digests", "leaves_warp", "digests_warp"] {
            assert!(
                ptx.contains(&format!(".entry {entry}(")),
                "sm_{major}{minor} lacks {entry}"
            );
        }
    }
    // The probes of `bench::ceiling`, with the kernels before them.
    let source = format!("{KERNELS}\n{}", include_str!("probes.cu"));
    let ptx = compile_source(&source, 9, 0).unwrap_or_else(|e| panic!("probes: {e}"));
    for entry in [
        "probe_lop3",
        "probe_shf",
        "probe_imad",
        "probe_keccak_shifts",
        "probe_keccak_multiplies",
    ] {
        assert!(ptx.contains(&format!(".entry {entry}(")), "the probes lack {entry}");
    }
    // The kernels generated for a shape, narrow and wide.
    for (k, m) in [(10, 4), (200, 16)] {
        let codec = Codec::new(k, m, tessera_ec::MatrixKind::Cauchy).expect("shape");
        let source = encoder::source(k, &codec.encoding_matrix()[k * k..], m, encoder::GROUP);
        let options = cudarc::nvrtc::CompileOptions {
            options: vec!["--gpu-architecture=compute_90".to_string()],
            ..Default::default()
        };
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(source, options)
            .unwrap_or_else(|e| panic!("{k}+{m}: {e:?}"))
            .to_src();
        for g in 0..encoder::kernels(k, m, encoder::GROUP) {
            assert!(ptx.contains(&format!(".entry encode_{g}(")), "{k}+{m} lacks encode_{g}");
        }
    }
}

fn probe_nvrtc() -> Result<(), String> {
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        Ok(())
    } else {
        Err("libnvrtc.so was not found".to_string())
    }
}

#[test]
fn without_a_driver_cuda_is_refused_with_the_reason_and_auto_is_the_cpu() {
    if probe().is_ok() {
        eprintln!("NOTE: a CUDA driver is here; the no-driver path was not tested");
        return;
    }
    let error = Cuda::open(Policy::Always, 1).err().expect("no driver, no backend");
    assert!(matches!(&error, AccelError::Unavailable { .. }), "{error}");
    assert!(error.to_string().contains("not available"), "{error}");
    assert!(crate::select(crate::Kind::Cuda).is_err());
    assert_eq!(crate::select(crate::Kind::Auto).expect("the CPU").name(), "cpu");
}

fn random_bytes(rng: &mut impl Rng, len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    rng.fill(&mut bytes[..]);
    bytes
}

/// Seals `stripes` random stripes on both backends and compares everything.
fn seal_both(gpu: &Cuda, cpu: &Cpu, shape: &Shape, stripes: usize, rng: &mut impl Rng) {
    let (k, m, c) = (shape.data, shape.parity, shape.chunk_bytes);
    let data: Vec<Vec<u8>> = (0..stripes).map(|_| random_bytes(rng, k * c)).collect();
    let mut parity_gpu: Vec<Vec<u8>> = (0..stripes).map(|_| random_bytes(rng, m * c)).collect();
    let mut parity_cpu: Vec<Vec<u8>> = vec![vec![0u8; m * c]; stripes];
    let mut jobs: Vec<SealJob> = data
        .iter()
        .zip(&mut parity_gpu)
        .map(|(d, p)| SealJob { data: d, parity: p })
        .collect();
    let leaves_gpu = gpu.seal(shape, &mut jobs).expect("GPU seal");
    let mut jobs: Vec<SealJob> = data
        .iter()
        .zip(&mut parity_cpu)
        .map(|(d, p)| SealJob { data: d, parity: p })
        .collect();
    let leaves_cpu = cpu.seal(shape, &mut jobs).expect("CPU seal");
    assert!(parity_gpu == parity_cpu, "parity differs for {shape:?} x {stripes}");
    assert!(leaves_gpu == leaves_cpu, "leaves differ for {shape:?} x {stripes}");
}

#[test]
fn gpu_sealing_equals_the_cpu_for_every_kind_of_shape() {
    let Some(mut gpu) = gpu(Policy::Always) else { return };
    let cpu = Cpu::new(2);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x6b75);
    let mut shapes = vec![
        (1, 0, 16),
        (1, 1, 1),
        (2, 1, 5),
        (4, 2, 4096),
        (10, 4, 65536),
        (92, 8, 4096),
        (200, 16, 1024),
        (240, 16, 4096),
        (128, 128, 256),
        (255, 1, 64),
        (17, 9, 1000),
    ];
    for _ in 0..8 {
        let k = rng.gen_range(1..=250);
        let m = rng.gen_range(0..=(256 - k).min(40));
        shapes.push((k, m, rng.gen_range(1..=9000)));
    }
    // SHA3-512 leaves of these few stripes are hashed a warp a chunk;
    // then again a thread a chunk.
    assert_eq!(gpu.hash_form(ALG_SHA3_512, 3 * 256), HashForm::Warp);
    for (k, m, c) in &shapes {
        for checksum in Algorithm::ALL {
            let shape = Shape::new(*k, *m, *c, checksum);
            let stripes = rng.gen_range(1..=3);
            seal_both(&gpu, &cpu, &shape, stripes, &mut rng);
        }
    }
    gpu.warp_max = 0;
    for (k, m, c) in shapes {
        let shape = Shape::new(k, m, c, Algorithm::Sha3_512);
        seal_both(&gpu, &cpu, &shape, 2, &mut rng);
    }
    gpu.warp_max = WARP_HASH_MAX;
    // Several pieces in one batch, and a partial last one (4 MiB stripes).
    let shape = Shape::new(60, 4, 65536, Algorithm::Sha3_512);
    let stripes = PIECE_BYTES / (4 << 20) * 2 + 3;
    seal_both(&gpu, &cpu, &shape, stripes, &mut rng);
    assert!(gpu.failure().is_none(), "{:?}", gpu.failure());
    assert!(gpu.bytes_on_device() > 0);
}

#[test]
fn gpu_rebuilds_equal_the_cpu_for_random_patterns() {
    let Some(gpu) = gpu(Policy::Always) else { return };
    let cpu = Cpu::new(2);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x7265);
    for (k, m, c) in [(4, 2, 4096), (10, 4, 8192), (92, 8, 4096), (200, 16, 1000), (3, 3, 7)] {
        for checksum in [Algorithm::Sha256, Algorithm::Sha3_512, Algorithm::Crc32c] {
            let shape = Shape::new(k, m, c, checksum);
            let stripes = 5;
            let data: Vec<Vec<u8>> = (0..stripes).map(|_| random_bytes(&mut rng, k * c)).collect();
            let mut parity = vec![vec![0u8; m * c]; stripes];
            let mut jobs: Vec<SealJob> = data
                .iter()
                .zip(&mut parity)
                .map(|(d, p)| SealJob { data: d, parity: p })
                .collect();
            let sealed = cpu.seal(&shape, &mut jobs).expect("seal");
            // Stripes with the same pattern come in runs; mix run lengths.
            let mut patterns = Vec::new();
            for s in 0..stripes {
                let lost = if s % 2 == 0 { m } else { rng.gen_range(0..=m) };
                let mut missing: Vec<usize> = (0..k + m).collect();
                for i in (1..missing.len()).rev() {
                    missing.swap(i, rng.gen_range(0..=i));
                }
                missing.truncate(lost);
                patterns.push(missing);
            }
            let mut stripes_bytes: Vec<Vec<u8>> = (0..stripes)
                .map(|s| {
                    let mut all = [data[s].clone(), parity[s].clone()].concat();
                    for &j in &patterns[s] {
                        all[j * c..(j + 1) * c].fill(0xa5);
                    }
                    all
                })
                .collect();
            let mut jobs: Vec<ReconstructJob> = stripes_bytes
                .iter_mut()
                .zip(&patterns)
                .map(|(bytes, missing)| ReconstructJob {
                    chunks: bytes.chunks_mut(c).collect(),
                    missing: missing.clone(),
                })
                .collect();
            let leaves = gpu.reconstruct(&shape, &mut jobs).expect("GPU rebuild");
            drop(jobs);
            for s in 0..stripes {
                assert!(
                    stripes_bytes[s] == [data[s].clone(), parity[s].clone()].concat(),
                    "{shape:?} stripe {s} {:?}",
                    patterns[s]
                );
                assert_eq!(leaves[s], sealed[s], "{shape:?} stripe {s}");
            }
        }
    }
    assert!(gpu.failure().is_none(), "{:?}", gpu.failure());
}

#[test]
fn gpu_hashes_equal_the_cpu_for_odd_lengths() {
    let Some(mut gpu) = gpu(Policy::Always) else { return };
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x6861);
    let inputs: Vec<Vec<u8>> = [
        0usize, 1, 5, 7, 8, 55, 56, 63, 64, 71, 72, 73, 135, 136, 4095, 4096, 65536, 100_003,
    ]
    .iter()
    .map(|&n| random_bytes(&mut rng, n))
    .collect();
    let refs: Vec<&[u8]> = inputs.iter().map(|i| &i[..]).collect();
    // SHA3-512 both ways: a warp a message (a short batch), a thread a message.
    for (warp_max, form) in [(WARP_HASH_MAX, HashForm::Warp), (0, HashForm::Thread)] {
        gpu.warp_max = warp_max;
        assert_eq!(gpu.hash_form(ALG_SHA3_512, refs.len() as u64), form);
        for algorithm in Algorithm::ALL {
            let want: Vec<Digest> = refs.iter().map(|i| algorithm.digest(i)).collect();
            assert_eq!(gpu.hash(algorithm, &refs), want, "{algorithm}, {form:?}");
        }
    }
    assert_eq!(gpu.hash_form(0, 1), HashForm::Thread, "SHA-256 has no warp kernel");
    assert!(gpu.failure().is_none(), "{:?}", gpu.failure());
}

#[test]
fn a_gpu_that_fails_hands_the_batch_and_what_follows_to_the_cpu() {
    let Some(gpu) = gpu(Policy::Always) else { return };
    let cpu = Cpu::new(2);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x6661);
    let shape = Shape::new(8, 3, 4096, Algorithm::Sha3_512);
    gpu.inject_failure();
    seal_both(&gpu, &cpu, &shape, 4, &mut rng);
    assert!(
        gpu.failure().is_some_and(|why| why.contains("injected")),
        "{:?}",
        gpu.failure()
    );
    assert!(gpu.detail().contains("CPU in use"), "{}", gpu.detail());
    let before = gpu.bytes_on_device();
    seal_both(&gpu, &cpu, &shape, 4, &mut rng);
    assert_eq!(gpu.bytes_on_device(), before, "nothing more goes to a failed GPU");
    assert_eq!(gpu.work().stripes_sealed, 8);
}

#[test]
fn auto_sends_only_big_sha_batches_to_the_gpu() {
    let Some(gpu) = gpu(Policy::Auto) else { return };
    let cpu = Cpu::new(2);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x6175);
    let small = Shape::new(4, 2, 4096, Algorithm::Sha256);
    seal_both(&gpu, &cpu, &small, 2, &mut rng);
    let cheap = Shape::new(10, 4, 65536, Algorithm::Crc32c);
    seal_both(&gpu, &cpu, &cheap, 8, &mut rng);
    assert_eq!(gpu.bytes_on_device(), 0);
    let big = Shape::new(10, 4, 65536, Algorithm::Sha3_512);
    seal_both(&gpu, &cpu, &big, 8, &mut rng);
    assert_eq!(gpu.bytes_on_device(), 8 * 14 * 65536);
}

#[test]
fn gpu_rebuilds_batches_of_several_pieces() {
    let Some(gpu) = gpu(Policy::Always) else { return };
    let cpu = Cpu::new(2);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x7069);
    let shape = Shape::new(60, 4, 65536, Algorithm::Sha256);
    let (k, m, c) = (shape.data, shape.parity, shape.chunk_bytes);
    let stripes = PIECE_BYTES / (4 << 20) * 2 + 3;
    let data: Vec<Vec<u8>> = (0..stripes).map(|_| random_bytes(&mut rng, k * c)).collect();
    let mut parity = vec![vec![0u8; m * c]; stripes];
    let mut jobs: Vec<SealJob> = data
        .iter()
        .zip(&mut parity)
        .map(|(d, p)| SealJob { data: d, parity: p })
        .collect();
    let sealed = cpu.seal(&shape, &mut jobs).expect("seal");
    let missing = vec![k + 1, 3, 0];
    let mut all: Vec<Vec<u8>> = (0..stripes)
        .map(|s| {
            let mut bytes = [data[s].clone(), parity[s].clone()].concat();
            for &j in &missing {
                bytes[j * c..(j + 1) * c].fill(0);
            }
            bytes
        })
        .collect();
    let mut jobs: Vec<ReconstructJob> = all
        .iter_mut()
        .map(|bytes| ReconstructJob {
            chunks: bytes.chunks_mut(c).collect(),
            missing: missing.clone(),
        })
        .collect();
    let leaves = gpu.reconstruct(&shape, &mut jobs).expect("GPU rebuild");
    drop(jobs);
    for s in 0..stripes {
        assert!(all[s] == [data[s].clone(), parity[s].clone()].concat(), "stripe {s}");
    }
    assert_eq!(leaves, sealed);
    assert!(gpu.failure().is_none(), "{:?}", gpu.failure());
}

/// The kernels' SHA3-512 (a thread a message and a warp a message) and
/// SHA-256, built for the host with the system's
/// C++ compiler (`host_check.cpp`), equal `tessera_checksum` for every
/// length from 0 to 600 bytes and random ones up to 70,000, with the
/// leaves' 5-byte prefix, the inner nodes' 1-byte prefix and none. This
/// checks the message reader (aligned words for whole blocks, the general
/// reader at the edges) on any machine, GPU or not.
#[test]
fn host_hashes_equal_the_reference() {
    let dir = tempfile_dir();
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cuda");
    let mut rng = rand::rngs::StdRng::seed_from_u64(28);
    let mut input = Vec::new();
    let mut expected = Vec::new();
    for i in 0..1200usize {
        let n = if i < 601 { i } else { rng.gen_range(0..70_000) };
        let body: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
        let (plen, prefix) = match i % 3 {
            0 => (0u32, 0u64),
            1 => (5, (rng.gen_range(0..256u64)) << 8),
            _ => (1, 0x01),
        };
        // The warp formulation (2) runs 32 lanes' steps one after the
        // other here: every short message, an eighth of the long ones.
        let warp = i < 601 || i % 8 == 0;
        for (number, algorithm) in [
            (0u32, Algorithm::Sha256),
            (1, Algorithm::Sha3_512),
            (2, Algorithm::Sha3_512),
        ] {
            if number == 2 && !warp {
                continue;
            }
            input.extend_from_slice(&number.to_le_bytes());
            input.extend_from_slice(&plen.to_le_bytes());
            input.extend_from_slice(&prefix.to_le_bytes());
            input.extend_from_slice(&(n as u64).to_le_bytes());
            input.extend_from_slice(&body);
            let mut message = prefix.to_le_bytes()[..plen as usize].to_vec();
            message.extend_from_slice(&body);
            let digest = algorithm.digest(&message);
            let mut out = [0u8; 64];
            out[..digest.as_bytes().len()].copy_from_slice(digest.as_bytes());
            expected.push((i, number, out.iter().map(|b| format!("{b:02x}")).collect::<String>()));
        }
    }
    // Both ways of rotating the permutation's lanes (kernels.cu, KECCAK_ROT).
    for rot in [0, 1] {
        let binary = dir.join(format!("host_check_{rot}"));
        let built = std::process::Command::new("c++")
            .args(["-O1", "-w", "-DTESSERA_HOST_TEST", &format!("-DKECCAK_ROT={rot}"), "-I"])
            .arg(&source)
            .arg(source.join("host_check.cpp"))
            .arg("-o")
            .arg(&binary)
            .status()
            .expect("a C++ compiler (c++) runs");
        assert!(built.success(), "host_check.cpp builds with KECCAK_ROT={rot}");
        let mut child = std::process::Command::new(&binary)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("host_check runs");
        let mut stdin = child.stdin.take().expect("stdin");
        let sent = input.clone();
        let writer = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &sent));
        let output = child.wait_with_output().expect("host_check ends");
        writer.join().expect("writer").expect("input written");
        assert!(output.status.success(), "host_check: {:?}", output.status);
        let lines: Vec<&str> = std::str::from_utf8(&output.stdout).expect("hex").lines().collect();
        assert_eq!(lines.len(), expected.len());
        for (line, (i, number, want)) in lines.iter().zip(&expected) {
            assert_eq!(
                line, want,
                "KECCAK_ROT={rot}: message {i}, algorithm {number} (host_check.cpp)"
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A fresh directory under the system's temporary one.
fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "tessera-host-check-{}-{}",
        std::process::id(),
        rand::random::<u64>()
    ));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    dir
}

/// Seals `stripes` random stripes on both backends, those where `lent(s)`
/// with data and parity in memory the GPU lent (the rest pageable), and
/// compares everything; returns how many went straight from lent memory.
fn seal_lent_and_pageable(
    gpu: &Cuda,
    cpu: &Cpu,
    shape: &Shape,
    stripes: usize,
    lent: impl Fn(usize) -> bool,
    rng: &mut impl Rng,
) -> u64 {
    use crate::HostMemory;
    let (k, m, c) = (shape.data, shape.parity, shape.chunk_bytes);
    let stripe = (k + m) * c;
    let mut held = Vec::new();
    let mut pageable = Vec::new();
    let mut buffers: Vec<&mut [u8]> = Vec::new();
    for s in 0..stripes {
        if lent(s) {
            let at = gpu.pinned.alloc(stripe.max(1)).expect("the GPU lends memory");
            held.push(at);
        } else {
            pageable.push(vec![0u8; stripe]);
        }
    }
    let mut pageable_left = pageable.iter_mut();
    let mut held_left = held.iter();
    for s in 0..stripes {
        let buffer: &mut [u8] = if lent(s) {
            let at = held_left.next().expect("one per lent stripe");
            // SAFETY: lent for `stripe` bytes, freed only after the last use below.
            unsafe { std::slice::from_raw_parts_mut(at.as_ptr(), stripe) }
        } else {
            pageable_left.next().expect("one per pageable stripe")
        };
        rng.fill(&mut buffer[..]); // data, and parity poisoned
        buffers.push(buffer);
    }
    let mut parity_cpu: Vec<Vec<u8>> = vec![vec![0u8; m * c]; stripes];
    let mut jobs: Vec<SealJob> = buffers
        .iter()
        .zip(&mut parity_cpu)
        .map(|(b, p)| SealJob {
            data: &b[..k * c],
            parity: p,
        })
        .collect();
    let leaves_cpu = cpu.seal(shape, &mut jobs).expect("CPU seal");
    let before = gpu.direct_stripes();
    let mut jobs: Vec<SealJob> = buffers
        .iter_mut()
        .map(|b| {
            let (data, parity) = b.split_at_mut(k * c);
            SealJob { data, parity }
        })
        .collect();
    let leaves_gpu = gpu.seal(shape, &mut jobs).expect("GPU seal");
    drop(jobs);
    let direct = gpu.direct_stripes() - before;
    for (s, buffer) in buffers.iter().enumerate() {
        assert!(
            buffer[k * c..] == parity_cpu[s][..],
            "parity of stripe {s} differs for {shape:?}"
        );
    }
    assert!(leaves_gpu == leaves_cpu, "leaves differ for {shape:?} x {stripes}");
    drop(buffers);
    for at in held {
        // SAFETY: lent above for `stripe` bytes; nothing uses it now.
        unsafe { gpu.pinned.free(at, stripe.max(1)) };
    }
    direct
}

#[test]
fn stripes_in_lent_memory_go_straight_to_the_gpu_and_seal_as_the_cpu_does() {
    let Some(gpu) = gpu(Policy::Always) else { return };
    let cpu = Cpu::new(2);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x6c65);
    let even = |s: usize| s.is_multiple_of(2);
    for (k, m, c, checksum, direct) in [
        (10, 4, 65536, Algorithm::Sha3_512, 3),
        (92, 8, 4096, Algorithm::Sha256, 3),
        (6, 3, 4096, Algorithm::Crc32c, 3),
        // Slots wider than the chunks, or no parity to bring back: packed.
        (5, 3, 1000, Algorithm::Sha3_512, 0),
        (4, 0, 4096, Algorithm::Sha256, 0),
    ] {
        let shape = Shape::new(k, m, c, checksum);
        let went = seal_lent_and_pageable(&gpu, &cpu, &shape, 5, even, &mut rng);
        assert_eq!(went, direct, "{shape:?}");
    }
    // Several pieces, every stripe lent.
    let shape = Shape::new(60, 4, 65536, Algorithm::Sha3_512);
    let stripes = PIECE_BYTES / (4 << 20) * 2 + 3;
    let went = seal_lent_and_pageable(&gpu, &cpu, &shape, stripes, |_| true, &mut rng);
    assert_eq!(went, stripes as u64);
    // A GPU that fails mid-batch: the CPU redoes the stripes in lent memory.
    gpu.inject_failure();
    let shape = Shape::new(8, 3, 4096, Algorithm::Sha3_512);
    seal_lent_and_pageable(&gpu, &cpu, &shape, 4, even, &mut rng);
    assert!(gpu.failure().is_some());
}

#[test]
fn the_driver_lends_page_locked_memory_through_the_lender() {
    // The lender's bookkeeping is tested on the CPU (`lend::tests`); this
    // checks its driver source: aligned, zeroed, bounded, given back.
    use crate::HostMemory;
    let Some(gpu) = gpu(Policy::Always) else { return };
    let pool = pinned::lender(gpu.ctx.clone(), 1 << 20);
    let a = pool.alloc(768 << 10).expect("within the limit");
    // SAFETY: lent for 768 KiB.
    let bytes = unsafe { std::slice::from_raw_parts(a.as_ptr(), 768 << 10) };
    assert!(bytes.iter().all(|&b| b == 0), "lent zeroed");
    assert_eq!(pool.block(&bytes[100..200]), Some(a.as_ptr() as usize));
    assert!(pool.alloc(512 << 10).is_none(), "over the limit");
    unsafe { pool.free(a, 768 << 10) };
    let other = pool
        .alloc(512 << 10)
        .expect("what is kept goes back to the driver to make room");
    unsafe { pool.free(other, 512 << 10) };
    assert_eq!(pool.lent(), (0, 0));
}

#[test]
fn auto_measures_a_prepared_shape_and_keeps_to_its_choice() {
    let Some(gpu) = gpu(Policy::Auto) else { return };
    let cpu = Cpu::new(2);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x6368);
    for checksum in [Algorithm::Crc32c, Algorithm::Sha3_512] {
        let shape = Shape::new(10, 4, 65536, checksum);
        gpu.prepare(&shape);
        let chosen = gpu.choices.lock().unwrap().get(&shape).copied().expect("measured");
        assert!(chosen.gpu_gbps > 0.0 && chosen.cpu_gbps > 0.0, "{chosen:?}");
        assert!(
            chosen.hash_gpu_seconds > 0.0 && chosen.hash_cpu_seconds > 0.0,
            "{chosen:?}"
        );
        assert!(
            gpu.detail().contains(&format!("10+4 {checksum} seals on the")),
            "{}",
            gpu.detail()
        );
        let before = gpu.bytes_on_device();
        seal_both(&gpu, &cpu, &shape, 8, &mut rng);
        assert_eq!(gpu.bytes_on_device() > before, chosen.gpu, "{chosen:?}");
        // A write's hashes, in a batch big enough for auto's fixed rule.
        let data = random_bytes(&mut rng, 2 << 20);
        let inputs: Vec<&[u8]> = data.chunks(64 << 10).collect();
        let before = gpu.bytes_on_device();
        assert_eq!(gpu.hash(checksum, &inputs), cpu.hash(checksum, &inputs));
        assert_eq!(gpu.bytes_on_device() > before, chosen.hash_gpu, "{chosen:?}");
    }
}

#[test]
fn direct_stripes_a_constant_stride_apart_are_copied_together() {
    let d = |input: usize, output: usize| {
        Some(Direct {
            input,
            output,
            blocks: (0, 0),
        })
    };
    // Three stripes of 100 bytes in, 40 out, laid 140 apart; then a packed
    // one; then one its next overlaps (a stride under the bytes copied);
    // that next one pairs with the one after (any stride that fits starts
    // a run), whose follower is out of step and starts another.
    let direct = [
        d(1000, 1100),
        d(1140, 1240),
        d(1280, 1380),
        None,
        d(5000, 9000),
        d(5050, 9050),
        d(7000, 9999),
        d(7200, 10199),
        d(7400, 10500),
    ];
    let runs = strided_runs(&direct, (100, 40));
    let summary: Vec<(usize, usize, bool, usize, usize)> = runs
        .iter()
        .map(|r| (r.first, r.count, r.direct.is_some(), r.in_stride, r.out_stride))
        .collect();
    assert_eq!(
        summary,
        vec![
            (0, 3, true, 140, 140),
            (3, 1, false, 0, 0),
            (4, 1, true, 0, 0),
            (5, 2, true, 1950, 949),
            (7, 2, true, 200, 301),
        ]
    );
    assert_eq!(strided_runs(&[], (10, 10)), vec![]);
    // Stripes in different allocations are never one copy, whatever their stride.
    let apart = [0, 1].map(|i| {
        Some(Direct {
            input: 1000 + 140 * i,
            output: 1100 + 140 * i,
            blocks: (i, 0),
        })
    });
    assert_eq!(strided_runs(&apart, (100, 40)).len(), 2);
}

#[test]
fn stripes_laid_end_to_end_in_lent_memory_seal_as_the_cpu_does() {
    use crate::HostMemory;
    let Some(gpu) = gpu(Policy::Always) else { return };
    let cpu = Cpu::new(2);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x3264);
    for (k, m, c, stripes) in [(10, 4, 65536, 40), (4, 2, 4096, 3), (3, 2, 16, 7)] {
        let shape = Shape::new(k, m, c, Algorithm::Sha3_512);
        let stripe = (k + m) * c;
        let bytes = stripes * stripe;
        let at = gpu.pinned.alloc(bytes).expect("lent");
        // SAFETY: lent for `bytes`, freed at the end of the iteration.
        let lent = unsafe { std::slice::from_raw_parts_mut(at.as_ptr(), bytes) };
        rng.fill(&mut lent[..]);
        let mut expected = lent.to_vec();
        let leaves_cpu = cpu.seal(&shape, &mut crate::seal_jobs(&shape, &mut expected)).unwrap();
        let before = gpu.direct_stripes();
        let leaves_gpu = gpu.seal(&shape, &mut crate::seal_jobs(&shape, lent)).unwrap();
        assert_eq!(gpu.direct_stripes() - before, stripes as u64);
        assert!(
            lent[..] == expected[..],
            "{shape:?}: every stripe's parity, and data untouched"
        );
        assert!(leaves_gpu == leaves_cpu);
        // SAFETY: as lent; nothing uses it now.
        unsafe { gpu.pinned.free(at, bytes) };
    }
}
