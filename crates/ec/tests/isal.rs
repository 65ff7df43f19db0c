//! Tessera's codec against the system's Intel ISA-L: same matrices, same
//! parity bytes, same rebuilt shards, for random shapes up to 255+1.
//!
//! ISA-L must be installed (the README's test command installs libisal-dev);
//! these tests fail rather than skip without it, so a green run proves
//! compatibility.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tessera_ec::{matrix, Codec, EcError, Kernel, MatrixKind};
use tessera_isal::Isal;

fn isal() -> Isal {
    Isal::load().expect("ISA-L is needed for these tests: run scripts/install-test-deps.sh")
}

fn random_shards(rng: &mut StdRng, count: usize, len: usize) -> Vec<Vec<u8>> {
    (0..count).map(|_| (0..len).map(|_| rng.gen()).collect()).collect()
}

fn isal_encode(isal: &Isal, matrix: &[u8], data: usize, parity: usize, shards: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let tables = isal.init_tables(parity, data, &matrix[data * data..]);
    let inputs: Vec<&[u8]> = shards.iter().map(|s| s.as_slice()).collect();
    let mut parity_shards = vec![vec![0u8; shards[0].len()]; parity];
    let mut outputs: Vec<&mut [u8]> = parity_shards.iter_mut().map(|p| p.as_mut_slice()).collect();
    isal.encode_data(&tables, &inputs, &mut outputs)
        .expect("shape fits ISA-L");
    parity_shards
}

fn tessera_encode(codec: &Codec, shards: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let inputs: Vec<&[u8]> = shards.iter().map(|s| s.as_slice()).collect();
    let mut parity_shards = vec![vec![0u8; shards[0].len()]; codec.parity_shards()];
    let mut outputs: Vec<&mut [u8]> = parity_shards.iter_mut().map(|p| p.as_mut_slice()).collect();
    codec.encode(&inputs, &mut outputs).expect("valid shape");
    parity_shards
}

/// Shapes that cover the corners and a random spread, up to K+M = 256.
fn shapes(rng: &mut StdRng, kind: MatrixKind) -> Vec<(usize, usize)> {
    let mut shapes = vec![
        (1, 1),
        (2, 2),
        (10, 4),
        (8, 2),
        (1, 255),
        (255, 1),
        (92, 8),
        (200, 16),
        (17, 3),
    ];
    for _ in 0..40 {
        let data = rng.gen_range(1..=255);
        let parity = rng.gen_range(1..=256 - data);
        shapes.push((data, parity));
    }
    if kind == MatrixKind::Vandermonde {
        shapes.retain(|&(d, p)| d <= matrix::vandermonde_data_max(p));
        shapes.extend([(21, 4), (5, 5), (4, 6), (3, 100), (253, 3)]);
    }
    shapes
}

#[test]
fn matrices_are_byte_identical_to_isal() {
    let isal = isal();
    for data in 1..=255 {
        for parity in [1, 2, 3, 4, 8, 16, 256 - data].into_iter().filter(|&p| data + p <= 256) {
            assert_eq!(
                matrix::encoding_matrix(MatrixKind::Cauchy, data, parity),
                isal.gen_cauchy1_matrix(data, parity),
                "cauchy {data}+{parity}"
            );
            assert_eq!(
                matrix::encoding_matrix(MatrixKind::Vandermonde, data, parity),
                isal.gen_rs_matrix(data, parity),
                "vandermonde {data}+{parity}"
            );
        }
    }
}

#[test]
fn parity_is_byte_identical_to_isal_for_every_kernel() {
    let isal = isal();
    let mut rng = StdRng::seed_from_u64(0x7e55e7a);
    for kind in [MatrixKind::Cauchy, MatrixKind::Vandermonde] {
        for (data, parity) in shapes(&mut rng, kind) {
            let len = *[1usize, 63, 64, 1000, 4096 + 17].choose(&mut rng).unwrap();
            let shards = random_shards(&mut rng, data, len);
            let codec = Codec::new(data, parity, kind).expect("valid shape");
            let expected = isal_encode(&isal, codec.encoding_matrix(), data, parity, &shards);
            for kernel in Kernel::ALL.into_iter().filter(|k| k.is_available()) {
                let codec = Codec::new(data, parity, kind).unwrap().with_kernel(kernel).unwrap();
                assert!(
                    tessera_encode(&codec, &shards) == expected,
                    "{} {data}+{parity} len {len} kernel {}",
                    kind.name(),
                    kernel.name()
                );
            }
        }
    }
}

#[test]
fn reconstruction_matches_isal_decoding() {
    let isal = isal();
    let mut rng = StdRng::seed_from_u64(0xdec0de);
    for kind in [MatrixKind::Cauchy, MatrixKind::Vandermonde] {
        for (data, parity) in shapes(&mut rng, kind) {
            let len = rng.gen_range(1..3000);
            let codec = Codec::new(data, parity, kind).unwrap();
            let data_shards = random_shards(&mut rng, data, len);
            let mut all = data_shards.clone();
            all.extend(tessera_encode(&codec, &data_shards));
            let lost = rng.gen_range(1..=parity);
            let mut missing: Vec<usize> = (0..data + parity).collect();
            missing.shuffle(&mut rng);
            missing.truncate(lost);

            // ISA-L's way: invert the survivors' rows, then encode with the inverse.
            let survivors: Vec<usize> = (0..data + parity).filter(|i| !missing.contains(i)).take(data).collect();
            let matrix = codec.encoding_matrix();
            let rows: Vec<u8> = survivors
                .iter()
                .flat_map(|&s| matrix[s * data..(s + 1) * data].to_vec())
                .collect();
            let inverse = isal.invert_matrix(&rows, data).expect("MDS");
            let survivor_shards: Vec<Vec<u8>> = survivors.iter().map(|&s| all[s].clone()).collect();
            let recovered_data = isal_encode(
                &isal,
                &[vec![0; data * data], inverse].concat(),
                data,
                data,
                &survivor_shards,
            );
            assert_eq!(recovered_data, data_shards, "ISA-L decode {data}+{parity}");

            let mut damaged = all.clone();
            for &m in &missing {
                damaged[m].fill(0xA5);
            }
            let mut refs: Vec<&mut [u8]> = damaged.iter_mut().map(|s| s.as_mut_slice()).collect();
            codec.reconstruct(&mut refs, &missing).expect("at most M missing");
            assert!(damaged == all, "{} {data}+{parity} missing {missing:?}", kind.name());
        }
    }
}

#[test]
fn data_only_reconstruction_leaves_parity_alone() {
    let mut rng = StdRng::seed_from_u64(5);
    let codec = Codec::new(10, 4, MatrixKind::Cauchy).unwrap();
    let data_shards = random_shards(&mut rng, 10, 777);
    let mut all = data_shards.clone();
    all.extend(tessera_encode(&codec, &data_shards));
    let missing = [1, 7, 11, 13];
    let mut damaged = all.clone();
    for &m in &missing {
        damaged[m].fill(0);
    }
    let mut refs: Vec<&mut [u8]> = damaged.iter_mut().map(|s| s.as_mut_slice()).collect();
    codec.reconstruct_data(&mut refs, &missing).unwrap();
    assert_eq!(damaged[..10], all[..10]);
    assert!(damaged[11].iter().all(|&b| b == 0) && damaged[13].iter().all(|&b| b == 0));
}

#[test]
fn update_matches_isal_progressive_encoding_and_reencoding() {
    let isal = isal();
    let mut rng = StdRng::seed_from_u64(99);
    for (data, parity) in [(10, 4), (92, 8), (3, 200)] {
        let len = 2049;
        let codec = Codec::new(data, parity, MatrixKind::Cauchy).unwrap();
        let shards = random_shards(&mut rng, data, len);
        let encoded = tessera_encode(&codec, &shards);

        // From zero parity, each shard as its own delta builds the parity: ISA-L's progressive encode.
        let mut ours = vec![vec![0u8; len]; parity];
        let mut theirs = vec![vec![0u8; len]; parity];
        let tables = isal.init_tables(parity, data, &codec.encoding_matrix()[data * data..]);
        for (index, shard) in shards.iter().enumerate() {
            let mut refs: Vec<&mut [u8]> = ours.iter_mut().map(|p| p.as_mut_slice()).collect();
            codec.update(index, shard, &mut refs).unwrap();
            let mut refs: Vec<&mut [u8]> = theirs.iter_mut().map(|p| p.as_mut_slice()).collect();
            isal.encode_data_update(&tables, index, shard, &mut refs).unwrap();
        }
        assert_eq!(ours, theirs);
        assert_eq!(ours, encoded);

        // Changing one data shard by its delta equals re-encoding the stripe.
        let index = rng.gen_range(0..data);
        let mut changed = shards.clone();
        changed[index] = (0..len).map(|_| rng.gen()).collect();
        let delta: Vec<u8> = shards[index].iter().zip(&changed[index]).map(|(a, b)| a ^ b).collect();
        let mut refs: Vec<&mut [u8]> = ours.iter_mut().map(|p| p.as_mut_slice()).collect();
        codec.update(index, &delta, &mut refs).unwrap();
        assert_eq!(ours, tessera_encode(&codec, &changed));
    }
}

#[test]
fn verify_names_the_parity_that_disagrees() {
    let mut rng = StdRng::seed_from_u64(3);
    let codec = Codec::new(6, 3, MatrixKind::Cauchy).unwrap();
    let data_shards = random_shards(&mut rng, 6, 100);
    let mut all = data_shards.clone();
    all.extend(tessera_encode(&codec, &data_shards));
    let refs: Vec<&[u8]> = all.iter().map(|s| s.as_slice()).collect();
    assert_eq!(codec.verify(&refs).unwrap(), Vec::<usize>::new());
    all[7][42] ^= 1;
    let refs: Vec<&[u8]> = all.iter().map(|s| s.as_slice()).collect();
    assert_eq!(codec.verify(&refs).unwrap(), vec![7]);
    // A flipped data byte shows up in every parity it feeds.
    all[7][42] ^= 1;
    all[0][0] ^= 0x80;
    let refs: Vec<&[u8]> = all.iter().map(|s| s.as_slice()).collect();
    assert_eq!(codec.verify(&refs).unwrap(), vec![6, 7, 8]);
}

#[test]
fn threads_split_large_buffers_into_the_same_bytes() {
    let mut rng = StdRng::seed_from_u64(11);
    let (data, parity, len) = (12, 4, (1 << 20) + 77);
    let shards = random_shards(&mut rng, data, len);
    let one = Codec::new(data, parity, MatrixKind::Cauchy).unwrap();
    let three = Codec::new(data, parity, MatrixKind::Cauchy).unwrap().with_threads(3);
    assert_eq!(tessera_encode(&one, &shards), tessera_encode(&three, &shards));
}

#[test]
fn bad_input_gets_a_typed_error_and_writes_nothing() {
    assert_eq!(Codec::new(0, 4, MatrixKind::Cauchy).unwrap_err(), EcError::NoDataShards);
    assert_eq!(
        Codec::new(250, 7, MatrixKind::Cauchy).unwrap_err(),
        EcError::TooManyShards {
            data: 250,
            parity: 7,
            total: 257
        }
    );
    assert_eq!(
        Codec::new(22, 4, MatrixKind::Vandermonde).unwrap_err(),
        EcError::NotMds {
            data: 22,
            parity: 4,
            data_max: 21
        }
    );
    assert!(Codec::new(21, 4, MatrixKind::Vandermonde).is_ok());

    let codec = Codec::new(3, 2, MatrixKind::Cauchy).unwrap();
    let mut parity = [vec![7u8; 4], vec![7u8; 4]];
    let mut parity_refs: Vec<&mut [u8]> = parity.iter_mut().map(|p| p.as_mut_slice()).collect();
    assert_eq!(
        codec
            .encode(&[&[1; 4], &[2; 4], &[3; 5]], &mut parity_refs)
            .unwrap_err(),
        EcError::ShardLengthMismatch {
            shard: 2,
            expected: 4,
            actual: 5
        }
    );
    assert_eq!(
        codec.encode(&[&[1; 4], &[2; 4]], &mut parity_refs).unwrap_err(),
        EcError::WrongShardCount { expected: 3, actual: 2 }
    );
    assert_eq!(
        codec.encode(&[&[], &[], &[]], &mut [&mut [], &mut []]).unwrap_err(),
        EcError::EmptyShards
    );
    assert_eq!(parity, [vec![7u8; 4], vec![7u8; 4]], "a refused call wrote nothing");

    let mut shards = vec![vec![9u8; 4]; 5];
    let mut refs: Vec<&mut [u8]> = shards.iter_mut().map(|s| s.as_mut_slice()).collect();
    assert_eq!(
        codec.reconstruct(&mut refs, &[0, 1, 2]).unwrap_err(),
        EcError::TooManyMissing { missing: 3, parity: 2 }
    );
    assert_eq!(
        codec.reconstruct(&mut refs, &[5]).unwrap_err(),
        EcError::ShardIndexOutOfRange { index: 5, count: 5 }
    );
    assert_eq!(
        codec.reconstruct(&mut refs, &[1, 1]).unwrap_err(),
        EcError::DuplicateMissing { index: 1 }
    );
    assert_eq!(shards, vec![vec![9u8; 4]; 5], "a refused call wrote nothing");
    assert!(matches!(Kernel::select("sse9"), Err(EcError::UnknownKernel { .. })));
}
