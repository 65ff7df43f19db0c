//! The real array on in-memory members with injected faults, checked
//! against a model: a plain byte vector.

use crate::common::{self, headers, named, open_list};
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use tessera_array::device::{Device, Faults, MemoryDevice};
use tessera_array::format::{Stream, SECTOR_BYTES};
use tessera_array::{ArrayError, CreateOptions, LeftOut};
use tessera_checksum::Algorithm;

const MEMBER_BYTES: u64 = 6 << 20;
const CHUNK: usize = 16 << 10;

fn members(n: usize) -> Vec<Arc<MemoryDevice>> {
    (0..n).map(|_| Arc::new(MemoryDevice::new(MEMBER_BYTES))).collect()
}

fn reopen(devices: &[Arc<MemoryDevice>], skip: &[usize]) -> Result<tessera_array::Array, ArrayError> {
    tessera_array::open(open_list(devices, skip))
}

fn options(k: usize, m: usize, compression: Option<tessera_compress::Codec>) -> CreateOptions {
    CreateOptions {
        data: k,
        parity: m,
        chunk_bytes: CHUNK,
        checksum: Algorithm::Crc32c,
        compression,
        logical_bytes: None,
        log_bytes: None,
    }
}

/// Random writes (some compressible, some zero, some unaligned), trims and
/// reads, mirrored on `model`.
fn exercise(array: &tessera_array::Array, model: &mut [u8], rng: &mut impl Rng, operations: usize) {
    let size = model.len() as u64;
    for _ in 0..operations {
        let len = rng.gen_range(1..=96 << 10).min(size as usize);
        let offset = rng.gen_range(0..=size - len as u64);
        match rng.gen_range(0..10) {
            0..=4 => {
                let mut data = vec![0u8; len];
                match rng.gen_range(0..3) {
                    0 => rng.fill(&mut data[..]),
                    1 => data.iter_mut().enumerate().for_each(|(i, b)| *b = (i / 97) as u8),
                    _ => {}
                }
                array.write(offset, &data, rng.gen_bool(0.05)).unwrap();
                model[offset as usize..offset as usize + len].copy_from_slice(&data);
            }
            5 => {
                array.trim(offset, len as u64, false).unwrap();
                model[offset as usize..offset as usize + len].fill(0);
            }
            6 => array.flush().unwrap(),
            _ => {
                let mut buf = vec![0u8; len];
                array.read(offset, &mut buf).unwrap();
                assert!(
                    buf == model[offset as usize..offset as usize + len],
                    "read at {offset}+{len}"
                );
            }
        }
    }
}

/// A 4+2 array on six members after 100 random operations, flushed:
/// Engine options that keep a member in however many bad chunks it
/// shows, so that tests of repair see every one repaired (by default a
/// member is failed after 32); a scrub lists its stripes 5 slots at a
/// time, in many chunks, as on an array of hundreds of millions.
fn repairing() -> tessera_array::EngineOptions {
    tessera_array::EngineOptions {
        member_errors_max: 0,
        slot_walk_chunk: 5,
        ..Default::default()
    }
}

/// (members, array, model, the rng to go on with).
fn flushed_4_plus_2(
    seed: u64,
) -> (
    Vec<Arc<MemoryDevice>>,
    tessera_array::Array,
    Vec<u8>,
    rand::rngs::StdRng,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let devices = members(6);
    let array = tessera_array::create_with(named(&devices), &options(4, 2, None), repairing()).unwrap();
    let mut model = vec![0u8; array.logical_bytes() as usize];
    exercise(&array, &mut model, &mut rng, 100);
    array.flush().unwrap();
    (devices, array, model, rng)
}

fn check_all(array: &tessera_array::Array, model: &[u8]) {
    let mut buf = vec![0u8; model.len()];
    array.read(0, &mut buf).unwrap();
    let first_bad = buf.iter().zip(model).position(|(a, b)| a != b);
    assert_eq!(first_bad, None, "first wrong byte");
}

#[test]
fn random_io_matches_the_model_through_gc_and_reopen() {
    let mut gc_runs = 0;
    for (k, m, n, compression) in [
        (4, 2, 6, None),
        (4, 2, 7, Some(tessera_compress::Codec::Lz4)),
        (3, 1, 5, Some(tessera_compress::Codec::Zstd { level: 1 })),
    ] {
        let seed = 7 + n as u64;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let devices = members(n);
        let array = tessera_array::create(named(&devices), &options(k, m, compression)).unwrap();
        let mut model = vec![0u8; array.logical_bytes() as usize];
        // Enough operations to overwrite the volume several times: GC must run.
        exercise(&array, &mut model, &mut rng, 3000);
        check_all(&array, &model);
        let status = array.status().unwrap();
        // Slots were reused: more stripes sealed than the array has.
        assert!(
            status.stripes_sealed > status.stripes_total,
            "seed {seed}: {} stripes sealed, {} slots",
            status.stripes_sealed,
            status.stripes_total
        );
        gc_runs += status.gc_stripes_collected;
        assert!(
            status.checkpoints_written > 1,
            "seed {seed}: the window was never used up"
        );
        array.flush().unwrap();
        drop(array);
        let array = reopen(&devices, &[]).unwrap();
        let recovery = array.status().unwrap().recovery;
        assert!(
            recovery.checkpoint_sequence.is_some() && recovery.checkpoint_error.is_none(),
            "{recovery:?}"
        );
        // A window holds at most half the slots (a quarter kept, a quarter
        // added) and the open stripes.
        assert!(
            recovery.slots_scanned <= status.stripes_total / 2 + 2,
            "seed {seed}: recovery read {} slots' headers of {}",
            recovery.slots_scanned,
            status.stripes_total
        );
        check_all(&array, &model);
        exercise(&array, &mut model, &mut rng, 200);
        check_all(&array, &model);
    }
    assert!(gc_runs > 0, "GC never moved live data");
}

/// With the GC stream off (GC's copies go into the clients' open stripes,
/// the mode `scripts/bench-waf.sh` compares against), the data is as
/// right through GC and reopen as with it, and fewer stripes are GC's.
/// Collection runs in the writers (no background thread), so the counts
/// do not hang on timing; four client lanes leave other lanes' stripes
/// open while a writer whose own lane is full collects.
#[test]
fn gc_copies_in_the_user_stripes_keep_the_data_right() {
    let mut gc_stripes = Vec::new();
    for gc_stream in [true, false] {
        let mut rng = rand::rngs::StdRng::seed_from_u64(21);
        let devices = members(6);
        let engine = tessera_array::EngineOptions {
            gc_stream,
            background: false,
            user_lanes: Some(4),
            ..tessera_array::EngineOptions::default()
        };
        let array = tessera_array::create_with(named(&devices), &options(4, 2, None), engine).unwrap();
        let mut model = vec![0u8; array.logical_bytes() as usize];
        exercise(&array, &mut model, &mut rng, 3000);
        check_all(&array, &model);
        let status = array.status().unwrap();
        assert!(
            status.gc_stripes_collected > 0 && status.gc_bytes_relocated > 0,
            "{status:?}"
        );
        array.check().unwrap();
        array.flush().unwrap();
        let g = array.geometry().clone();
        gc_stripes.push(
            headers(&devices, &g)
                .iter()
                .filter(|(_, _, h)| h.stream == tessera_array::format::Stream::Gc && h.index == 0)
                .count(),
        );
        drop(array);
        let array = reopen(&devices, &[]).unwrap();
        check_all(&array, &model);
        array.check().unwrap();
    }
    // Mixed, the copies went into client stripes where one was open.
    // With background collection the counts hung on timing (33 own
    // against 29 mixed failed this bound in CI under load); run in the
    // writers they are the same every run: 35 own, 19 mixed.
    assert!(
        gc_stripes[1] * 20 < gc_stripes[0] * 17,
        "GC-stream stripes: own stream {}, mixed {}",
        gc_stripes[0],
        gc_stripes[1]
    );
}

#[test]
fn reads_survive_m_failed_members_and_corruption() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let devices = members(7);
    let array = tessera_array::create_with(named(&devices), &options(4, 2, None), repairing()).unwrap();
    let mut model = vec![0u8; array.logical_bytes() as usize];
    exercise(&array, &mut model, &mut rng, 300);
    array.flush().unwrap();
    // Flip bits all over one member: every read is still right, and the
    // mismatches are counted.
    for _ in 0..200 {
        let offset = rng.gen_range(1 << 20..MEMBER_BYTES - 4096);
        devices[2].flip_bit(offset, rng.gen_range(0..8));
    }
    check_all(&array, &model);
    let status = array.status().unwrap();
    assert!(status.checksum_errors > 0);
    assert_eq!(
        status.chunks_repaired, status.checksum_errors,
        "every bad chunk read was rewritten"
    );
    // Scrub finds the flips reads did not touch (parity, unused bytes) and
    // repairs them; a second scrub finds nothing.
    let report = array.scrub().unwrap();
    assert!(report.stripes_checked > 0);
    assert_eq!(
        report.stripes_checked, report.stripes_total,
        "every stripe, chunk by chunk"
    );
    assert_eq!(report.chunks_bad, report.chunks_repaired);
    assert_eq!(array.scrub().unwrap().chunks_bad, 0);
    // Two members fail: reads reconstruct, writes go on.
    array.fail_member(0).unwrap();
    devices[5].set_faults(Faults {
        fail_reads: true,
        fail_writes: true,
        ..Faults::default()
    });
    check_all(&array, &model);
    exercise(&array, &mut model, &mut rng, 300);
    check_all(&array, &model);
    let status = array.status().unwrap();
    assert!(status.reconstructed_reads > 0);
    assert!(matches!(array.fail_member(1), Err(ArrayError::TooManyFailed { .. })));
    array.flush().unwrap();
    drop(array);
    // Reopened without the two, degraded: the same bytes.
    let array = reopen(&devices, &[0, 5]).unwrap();
    check_all(&array, &model);
    drop(array);
    // Three missing is more than M.
    assert!(matches!(
        reopen(&devices, &[0, 1, 5]),
        Err(ArrayError::TooManyUnavailable { .. })
    ));
}

#[test]
fn a_crash_loses_nothing_flushed_and_tears_no_block() {
    let mut torn = 0;
    for seed in 0..8u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let devices = members(6);
        let mut array = tessera_array::create(named(&devices), &options(4, 2, None)).unwrap();
        let mut flushed = vec![0u8; array.logical_bytes() as usize];
        // Several crashes in a row: what one recovery left must survive the
        // next crash too (a torn stripe must not come back once later
        // stripes are synced past it).
        for round in 0..4 {
            exercise(&array, &mut flushed, &mut rng, 200);
            array.flush().unwrap();
            // Unflushed writes of whole blocks, enough to cross checkpoints:
            // after a crash each block may hold its flushed value or any
            // value written since.
            let block_count = flushed.len() / 4096;
            let mut allowed: Vec<Vec<Vec<u8>>> = (0..block_count)
                .map(|b| vec![flushed[b * 4096..(b + 1) * 4096].to_vec()])
                .collect();
            for _ in 0..rng.gen_range(10..120) {
                let blocks = rng.gen_range(1..40);
                let lba = rng.gen_range(0..block_count - blocks);
                let mut data = vec![0u8; blocks * 4096];
                rng.fill(&mut data[..]);
                array.write(lba as u64 * 4096, &data, false).unwrap();
                for (i, block) in data.chunks(4096).enumerate() {
                    allowed[lba + i].push(block.to_vec());
                }
            }
            // Power loss. Even rounds: each member keeps a random prefix of
            // its unsynced writes. Odd rounds: any of them, each whole, lost
            // or torn at a 4 KiB sector (a disk cache reorders and tears).
            drop(array);
            for d in &devices {
                if round % 2 == 0 {
                    let keep = rng.gen_range(0..=d.pending_writes());
                    d.crash(keep);
                } else {
                    d.crash_with(|_, len| match rng.gen_range(0..3) {
                        0 => 0,
                        1 => len,
                        _ => rng.gen_range(0..=len / SECTOR_BYTES) * SECTOR_BYTES,
                    });
                }
            }
            array = reopen(&devices, &[]).unwrap_or_else(|e| panic!("seed {seed} round {round}: {e}"));
            torn += array.status().unwrap().recovery.torn_stripes_dropped;
            array.read(0, &mut flushed).unwrap();
            for (block, values) in allowed.iter().enumerate() {
                let got = &flushed[block * 4096..(block + 1) * 4096];
                assert!(
                    values.iter().any(|v| v == got),
                    "seed {seed} round {round}: block {block} is neither the flushed data nor any later write"
                );
            }
        }
    }
    assert!(torn > 0, "no crash tore a stripe: the test proves less than it says");
}

#[test]
fn a_full_array_says_so_and_changes_nothing() {
    let devices = members(6);
    let mut opts = options(4, 2, None);
    opts.logical_bytes = Some(64 << 20); // thin: far more than the raw space
    let array = tessera_array::create(named(&devices), &opts).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut written = 0u64;
    let error = loop {
        let mut data = vec![0u8; 64 << 10];
        rng.fill(&mut data[..]);
        match array.write(written, &data, false) {
            Ok(()) => written += data.len() as u64,
            Err(e) => break e,
        }
        assert!(written < 64 << 20, "never filled");
    };
    assert!(matches!(error, ArrayError::NoSpace), "{error}");
    let status = array.status().unwrap();
    assert!(status.mapped_bytes <= status.usable_bytes);
    // Trimming frees space: writes go on.
    array.trim(0, written / 2, false).unwrap();
    array.write(written, &[1u8; 4096], false).unwrap();
    assert!(matches!(
        array.write(64 << 20, &[0u8; 4096], false),
        Err(ArrayError::OutOfRange { .. })
    ));
}

/// `a`'s members by name, with `replace` (index, device) swapped in.
fn listed(a: &[Arc<MemoryDevice>], replace: &[(usize, Arc<dyn Device>)]) -> Vec<(String, Option<Arc<dyn Device>>)> {
    let mut list: Vec<(String, Option<Arc<dyn Device>>)> = a
        .iter()
        .enumerate()
        .map(|(i, d)| (format!("a{i}"), Some(d.clone() as Arc<dyn Device>)))
        .collect();
    for (index, device) in replace {
        list[*index] = (format!("bad{index}"), Some(device.clone()));
    }
    list
}

#[test]
fn wrong_members_are_left_out_within_m_and_refused_beyond() {
    // Reported: one bad device kept the whole array from opening (and a
    // foreign one could make a healthy member look foreign). Each is now
    // left out, named, and counted with the missing.
    // Each case on a fresh array: opening without a member records it as
    // failed (it would miss what is written next), for good.
    let data: Vec<u8> = (0..(1 << 20)).map(|i| (i % 251) as u8).collect();
    let fresh = || {
        let a = members(6);
        let array = tessera_array::create(named(&a), &options(4, 2, None)).unwrap();
        array.write(0, &data, true).unwrap();
        a
    };
    // b is newer than a: its superblock generation is higher.
    let b = members(6);
    let other = tessera_array::create(named(&b), &options(4, 2, None)).unwrap();
    for _ in 0..3 {
        other.checkpoint().unwrap();
    }
    drop(other);
    let check = |list, bad: &[&str]| {
        let array = tessera_array::open(list).unwrap();
        let status = array.status().unwrap();
        let rejected: Vec<&str> = status.devices_rejected.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(rejected, bad, "{:?}", status.devices_rejected);
        let mut back = vec![0u8; data.len()];
        array.read(0, &mut back).unwrap();
        assert!(back == data);
        status
    };
    // A member of another (newer) array, a blank device, a truncated one.
    // Each says why in words and typed (`reason`), as `status --json`
    // gives both.
    let status = check(listed(&fresh(), &[(3, b[3].clone())]), &["bad3"]);
    assert!(status.devices_rejected[0].why.contains("belongs to another array"));
    let other_uuid = tessera_array::read_superblock(b[3].as_ref()).unwrap().array_uuid;
    let other_hex: String = other_uuid.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        status.devices_rejected[0].reason,
        LeftOut::OtherArray { array: other_hex }
    );
    let status = check(
        listed(&fresh(), &[(0, Arc::new(MemoryDevice::new(MEMBER_BYTES)))]),
        &["bad0"],
    );
    assert_eq!(status.devices_rejected[0].reason, LeftOut::NotAMember);
    let a = fresh();
    let short = MemoryDevice::new(MEMBER_BYTES / 2);
    let mut sector = vec![0u8; 4096];
    a[4].read_at(&mut sector, 0).unwrap();
    short.write_at(&sector, 0).unwrap();
    let status = check(listed(&a, &[(4, Arc::new(short))]), &["bad4"]);
    assert!(
        status.devices_rejected[0].why.contains("truncated"),
        "{:?}",
        status.devices_rejected
    );
    let needed = tessera_array::read_superblock(a[4].as_ref())
        .unwrap()
        .geometry
        .member_bytes;
    let bytes = MEMBER_BYTES / 2;
    assert_eq!(status.devices_rejected[0].reason, LeftOut::TooShort { bytes, needed });
    // The JSON API tags the reason by kind.
    let json = serde_json::to_value(&status.devices_rejected[0]).unwrap();
    assert_eq!(json["reason"]["kind"], "too_short", "{json}");
    // Both superblocks of a member corrupt.
    let a = fresh();
    let size = a[1].size();
    a[1].flip_bit(100, 3);
    a[1].flip_bit(size - 4096 + 100, 3);
    let status = check(listed(&a, &[]), &["a1"]);
    assert_eq!(status.devices_rejected[0].reason, LeftOut::NotAMember);
    // Three bad with M = 2: refused, saying which and why.
    let a = fresh();
    a[1].flip_bit(100, 3);
    a[1].flip_bit(size - 4096 + 100, 3);
    let refused = tessera_array::open(listed(
        &a,
        &[(2, b[2].clone()), (5, Arc::new(MemoryDevice::new(MEMBER_BYTES)))],
    ));
    let message = refused.err().expect("3 bad members of 4+2 opened").to_string();
    assert!(
        message.contains("bad2 belongs to another array") && message.contains("a1"),
        "{message}"
    );
    // The same member twice: which is right cannot be told.
    let a = fresh();
    let mut twice = listed(&a, &[]);
    twice[3].1 = Some(a[2].clone());
    assert!(matches!(
        tessera_array::open(twice),
        Err(ArrayError::DuplicateMember { .. })
    ));
    // Devices split evenly between two arrays: refused.
    let mut split = listed(&b, &[]);
    for (i, device) in fresh().iter().enumerate().take(3) {
        split[i].1 = Some(device.clone());
    }
    assert!(matches!(
        tessera_array::open(split),
        Err(ArrayError::SplitMembers { .. })
    ));
}

#[test]
fn lost_writes_on_a_member_are_caught_and_repaired() {
    let (devices, array, mut model, mut rng) = flushed_4_plus_2(11);
    // Member 3 acknowledges writes and drops them: its chunks go stale.
    devices[3].set_faults(Faults {
        lose_writes: true,
        ..Faults::default()
    });
    exercise(&array, &mut model, &mut rng, 300);
    array.flush().unwrap();
    devices[3].set_faults(Faults::default());
    check_all(&array, &model);
    let bad = array.scrub().unwrap().chunks_bad;
    let status = array.status().unwrap();
    assert!(status.checksum_errors > 0, "stale chunks were noticed");
    assert_eq!(status.chunks_repaired, status.checksum_errors, "and rewritten");
    assert_eq!(
        array.scrub().unwrap().chunks_bad,
        0,
        "nothing bad is left after {bad} more repairs"
    );
    // Reopened, the same bytes.
    drop(array);
    check_all(&reopen(&devices, &[]).unwrap(), &model);
}

/// A 4+2 array stopped as a crash would leave it: 1 MiB of random bytes
/// from `seed` written and flushed, then its first 256 KiB overwritten
/// (several stripes) and not flushed. Dropping the array waits for its
/// writer, so every sealed stripe is on the members.
struct Crashed {
    devices: Vec<Arc<MemoryDevice>>,
    g: tessera_array::format::Geometry,
    flushed: Vec<u8>,
    /// The bytes written last (the overwrites not flushed).
    data: Vec<u8>,
    /// Every chunk header on the members (`common::headers`).
    all: Vec<(usize, u64, tessera_array::format::ChunkHeader)>,
    /// The newest stripe's sequence.
    newest: u64,
}

fn crashed_with_unflushed_overwrites(seed: u64) -> Crashed {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let devices = members(6);
    let array = tessera_array::create(named(&devices), &options(4, 2, None)).unwrap();
    let mut data = vec![0u8; 1 << 20];
    rng.fill(&mut data[..]);
    array.write(0, &data, false).unwrap();
    array.flush().unwrap();
    let flushed = data.clone();
    rng.fill(&mut data[..256 << 10]);
    array.write(0, &data[..256 << 10], false).unwrap();
    let g = array.geometry().clone();
    drop(array);
    let all = headers(&devices, &g);
    let newest = all.iter().map(|(_, _, h)| h.sequence).max().unwrap();
    Crashed {
        devices,
        g,
        flushed,
        data,
        all,
        newest,
    }
}

#[test]
fn a_torn_stripe_stays_dropped_after_later_syncs() {
    // The crash tears the older of the two newest stripes: three of its
    // six chunks are gone, but the one holding its summary is there.
    let c = crashed_with_unflushed_overwrites(5);
    let (devices, data, flushed) = (&c.devices, &c.data, &c.flushed);
    let torn = c
        .all
        .iter()
        .find(|(_, _, h)| h.sequence == c.newest - 1)
        .unwrap()
        .2
        .slot;
    for (member, offset, header) in &c.all {
        if header.slot == torn && header.sequence == c.newest - 1 && [0, 1, 4].contains(&header.index) {
            devices[*member]
                .write_at(&vec![0u8; SECTOR_BYTES + c.g.chunk_bytes], *offset)
                .unwrap();
        }
    }
    let array = reopen(devices, &[]).unwrap();
    assert_eq!(array.status().unwrap().recovery.torn_stripes_dropped, 1);
    let mut after_crash = vec![0u8; data.len()];
    array.read(0, &mut after_crash).unwrap();
    for (block, got) in after_crash.chunks(4096).enumerate() {
        let range = block * 4096..(block + 1) * 4096;
        assert!(got == &flushed[range.clone()] || got == &data[range], "block {block}");
    }
    // A later stripe, synced: it says every sequence up to it is durable,
    // the torn stripe's included. Reopened, the torn stripe must not return.
    array.write(8 << 20, &[7u8; 4096], true).unwrap();
    drop(array);
    let array = reopen(devices, &[]).unwrap();
    let mut again = vec![0u8; data.len()];
    array.read(0, &mut again).unwrap();
    assert!(again == after_crash, "the volume changed across a clean reopen");
}

/// A stripe written after the last sync is checked chunk by chunk when
/// opening after a crash: one bad chunk of it (of M allowed) is rebuilt
/// and rewritten, counted in `recovery.chunks_repaired`, and its writes
/// are kept (the volume reads as the same crash without the bad chunk
/// left it).
#[test]
fn a_damaged_chunk_of_an_unsynced_stripe_is_repaired_by_recovery() {
    // Flushed writes, then unflushed overwrites over several stripes, and
    // the crash: what the reopened array reads (the overwrites but those
    // of the stripe still open), with one chunk of the older of the two
    // newest stripes damaged or not.
    let crash = |damage: bool| {
        let c = crashed_with_unflushed_overwrites(6);
        let (devices, g) = (&c.devices, &c.g);
        let (member, offset) = c
            .all
            .iter()
            .find(|(_, _, h)| h.sequence == c.newest - 1 && h.index == 1)
            .map(|(member, offset, _)| (*member, *offset + SECTOR_BYTES as u64))
            .unwrap();
        let mut body = vec![0u8; g.chunk_bytes];
        devices[member].read_at(&mut body, offset).unwrap();
        if damage {
            let mut bad = body.clone();
            bad[100] ^= 0x40;
            devices[member].write_at(&bad, offset).unwrap();
        }
        let array = reopen(devices, &[]).unwrap();
        let recovery = array.status().unwrap().recovery;
        let mut back = vec![0u8; c.data.len()];
        array.read(0, &mut back).unwrap();
        drop(array);
        let mut chunk = vec![0u8; g.chunk_bytes];
        devices[member].read_at(&mut chunk, offset).unwrap();
        let kept = back
            .chunks(4096)
            .zip(c.flushed.chunks(4096))
            .filter(|(a, b)| a != b)
            .count();
        (recovery, back, kept, chunk == body)
    };
    let (clean, control, kept, _) = crash(false);
    assert_eq!((clean.chunks_repaired, clean.torn_stripes_dropped), (0, 0), "{clean:?}");
    assert!(kept >= 32, "the crash kept {kept} blocks of the sealed overwrites");
    let (recovery, back, _, whole) = crash(true);
    assert_eq!(
        (recovery.chunks_repaired, recovery.torn_stripes_dropped),
        (1, 0),
        "{recovery:?}"
    );
    assert!(back == control, "the damaged stripe's writes are kept");
    assert!(whole, "the chunk was rewritten on its member");
}

#[test]
fn an_unreadable_checkpoint_falls_back_to_scanning_every_stripe() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let devices = members(6);
    let array = tessera_array::create(named(&devices), &options(4, 2, None)).unwrap();
    let mut model = vec![0u8; array.logical_bytes() as usize];
    exercise(&array, &mut model, &mut rng, 600);
    array.checkpoint().unwrap();
    exercise(&array, &mut model, &mut rng, 100);
    array.flush().unwrap();
    let g = array.geometry().clone();
    // Dropping the array waits for its writer: every sealed stripe is written.
    drop(array);
    let all = headers(&devices, &g);
    // Every checkpoint stripe loses three chunks: more than M.
    let mut erased = 0;
    for (member, offset, header) in &all {
        if header.stream == Stream::Meta && header.index < 3 {
            devices[*member]
                .write_at(&vec![0u8; SECTOR_BYTES + g.chunk_bytes], *offset)
                .unwrap();
            erased += 1;
        }
    }
    assert!(erased >= 3);
    let array = reopen(&devices, &[]).unwrap();
    let status = array.status().unwrap();
    assert!(status.recovery.checkpoint_error.is_some());
    assert_eq!(status.recovery.slots_scanned, status.stripes_total);
    check_all(&array, &model);
    // It wrote a new checkpoint, which the next open uses.
    drop(array);
    let array = reopen(&devices, &[]).unwrap();
    let recovery = array.status().unwrap().recovery;
    assert!(recovery.checkpoint_error.is_none() && recovery.slots_scanned < g.slot_count());
    check_all(&array, &model);
}

/// A map whose checkpoint needs more stripes than the superblock can list
/// (480): the checkpoint is written with a directory, and opening reads
/// it instead of scanning every slot, even with a directory chunk bad.
/// (Before directories, no checkpoint was written at all past 480
/// stripes, and every opening scanned every slot.)
#[test]
fn a_checkpoint_larger_than_the_superblock_can_list_has_a_directory() {
    use tessera_array::format::Superblock;
    let devices: Vec<_> = (0..3).map(|_| Arc::new(MemoryDevice::new(128 << 20))).collect();
    let create = CreateOptions {
        chunk_bytes: 4096,
        logical_bytes: Some(1 << 47),
        ..options(2, 1, Some(tessera_compress::Codec::Lz4))
    };
    let array = tessera_array::create(named(&devices), &create).unwrap();
    // A block in each of 130,000 map directory pages (1 GiB apart): the
    // root lists each directory page's image (32 bytes), 4 MiB, more than
    // 480 stripes of 8 KiB.
    let blocks = 130_000u64;
    let step = 512 * 512 * 4096u64;
    for i in 0..blocks {
        array.write(i * step, &[i as u8; 4096], false).unwrap();
    }
    array.checkpoint().unwrap();
    let status = array.status().unwrap();
    assert!(status.checkpoint_sequence.is_some() && status.checkpoints_dropped == 0);
    let g = array.geometry().clone();
    drop(array);
    let superblock = |member: usize| {
        let mut sector = vec![0u8; SECTOR_BYTES];
        devices[member].read_at(&mut sector, 0).unwrap();
        Superblock::decode(&sector).unwrap()
    };
    let reference = superblock(0).checkpoint.expect("a checkpoint");
    assert!(reference.directory, "{} listed slots", reference.slots.len());
    let check = |array: &tessera_array::Array| {
        let recovery = array.status().unwrap().recovery;
        assert!(recovery.checkpoint_error.is_none(), "{recovery:?}");
        // The window's slots only, not every slot.
        assert!(
            recovery.checkpoint_sequence.is_some() && recovery.slots_scanned < g.slot_count(),
            "{recovery:?}"
        );
        let mut back = vec![0u8; 2 * 4096];
        for i in (0..blocks).step_by(997).chain([blocks - 1]) {
            array.read(i * step, &mut back).unwrap();
            assert!(back[..4096].iter().all(|&b| b == i as u8), "block at {} GiB", i);
            assert!(back[4096..].iter().all(|&b| b == 0), "the block after it");
        }
    };
    check(&tessera_array::open(open_list(&devices, &[])).unwrap());
    // A bad chunk in the directory's first stripe: read around (M = 1).
    let (member, row) = g.place(reference.slots[0], 0);
    let mut chunk = vec![0u8; g.chunk_bytes];
    devices[member]
        .read_at(&mut chunk, g.row_offset(row) + SECTOR_BYTES as u64)
        .unwrap();
    chunk[100] ^= 0xff;
    devices[member]
        .write_at(&chunk, g.row_offset(row) + SECTOR_BYTES as u64)
        .unwrap();
    check(&tessera_array::open(open_list(&devices, &[])).unwrap());
}

#[test]
fn a_member_whose_superblock_write_fails_is_failed_and_the_array_goes_on() {
    let (devices, array, mut model, mut rng) = flushed_4_plus_2(11);
    // Member 0 stops taking writes; the first write it sees is the
    // superblock update that records member 1's failure.
    devices[0].set_faults(Faults {
        fail_writes: true,
        ..Faults::default()
    });
    array.fail_member(1).unwrap();
    let states: Vec<_> = array.status().unwrap().members.iter().map(|m| m.state).collect();
    use tessera_array::MemberState::{Failed, Healthy};
    assert_eq!(states, [Failed, Failed, Healthy, Healthy, Healthy, Healthy]);
    // Checkpoints and writes go on with the other four.
    check_all(&array, &model);
    exercise(&array, &mut model, &mut rng, 100);
    array.checkpoint().unwrap();
    check_all(&array, &model);
    drop(array);
    // The others' superblocks say so: reopened with every device, both
    // are failed and the data is whole.
    let array = reopen(&devices, &[]).unwrap();
    assert_eq!(array.status().unwrap().members_unavailable, 2);
    check_all(&array, &model);
}

#[test]
fn concurrent_readers_of_a_degraded_stripe_rebuild_it_once() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let devices = members(6);
    let array = tessera_array::create(named(&devices), &options(4, 2, None)).unwrap();
    // Four stripes' worth of data from block 0, on the members.
    let span = 4 * 4 * CHUNK;
    let mut data = vec![0u8; span];
    rng.fill(&mut data[..]);
    array.write(0, &data, true).unwrap();
    array.fail_member(0).unwrap();
    let before = array.status().unwrap().stripes_reconstructed;
    // Eight readers at once, each over all of it, in pieces of half a
    // stripe (a read that wants most of a degraded stripe rebuilds it
    // whole; smaller ones decode just their range).
    let start = std::sync::Barrier::new(8);
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| {
                start.wait();
                let mut piece = vec![0u8; 32 << 10];
                for offset in (0..span).step_by(piece.len()) {
                    array.read(offset as u64, &mut piece).unwrap();
                    assert!(piece == data[offset..offset + piece.len()], "read at {offset}");
                }
            });
        }
    });
    let status = array.status().unwrap();
    // A stripe's summary (a few records) takes its last block, so each
    // holds one block less than its data area.
    let stripes = span.div_ceil(array.geometry().data_area_bytes() - 4096) as u64;
    let rebuilt = status.stripes_reconstructed - before;
    assert!(
        rebuilt > 0 && rebuilt <= stripes,
        "each degraded stripe is rebuilt once at most, and serves every reader: {rebuilt} rebuilds of {stripes} stripes"
    );
}

#[test]
fn small_degraded_reads_decode_only_their_range_and_never_trust_it_blindly() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    let devices = members(6);
    let array = tessera_array::create(named(&devices), &options(4, 2, None)).unwrap();
    let span = 16 * 4 * CHUNK;
    let mut data = vec![0u8; span];
    rng.fill(&mut data[..]);
    array.write(0, &data, true).unwrap();
    array.fail_member(0).unwrap();
    let read_all_in_blocks = |array: &tessera_array::Array| {
        for offset in (0..span).step_by(4096) {
            let mut block = [0u8; 4096];
            array.read(offset as u64, &mut block).unwrap();
            assert!(block[..] == data[offset..offset + 4096], "read at {offset}");
        }
    };
    read_all_in_blocks(&array);
    let status = array.status().unwrap();
    assert!(
        status.ranges_decoded > 0,
        "small reads on the failed member decode ranges"
    );
    assert_eq!(status.stripes_reconstructed, 0, "and rebuild no stripe");
    // A second member returns bad bytes: a decoded range no longer checks,
    // and the read falls back to a rebuild that finds the bad chunks by
    // their leaves.
    for _ in 0..400 {
        let offset = rng.gen_range(1 << 20..MEMBER_BYTES - 4096);
        devices[3].flip_bit(offset, rng.gen_range(0..8));
    }
    read_all_in_blocks(&array);
    let status = array.status().unwrap();
    assert!(
        status.stripes_reconstructed > 0 && status.checksum_errors > 0,
        "{status:?}"
    );
    assert_eq!(status.unrecoverable_reads, 0);
}

#[test]
fn writers_whose_stripes_and_hashes_are_batched_together_lose_nothing() {
    // The accelerator merges concurrent seals and hashes (as it does in
    // front of a GPU), one batch at a time, so that client threads' stripes
    // are sealed by whichever thread leads, with SHA3-512 on every block.
    let cpu: Arc<dyn tessera_accel::Accelerator> = Arc::new(tessera_accel::cpu::Cpu::new(2));
    let batching = Arc::new(tessera_accel::batch::Batching::new(cpu, 1, 4 << 20));
    let engine = tessera_array::EngineOptions {
        accel: Some(batching.clone()),
        ..Default::default()
    };
    let devices = members(6);
    let mut create = options(4, 2, None);
    create.checksum = Algorithm::Sha3_512;
    let array = tessera_array::create_with(named(&devices), &create, engine).unwrap();
    let size = array.logical_bytes() as usize;
    let writers = 8;
    let region = (size / writers) & !4095;
    let mut model = vec![0u8; size];
    std::thread::scope(|scope| {
        for (w, part) in model.chunks_mut(region).take(writers).enumerate() {
            let array = &array;
            scope.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(w as u64);
                for round in 0..40 {
                    let len = rng.gen_range(1..=48 << 10).min(part.len());
                    let at = rng.gen_range(0..=part.len() - len);
                    let mut data = vec![0u8; len];
                    rng.fill(&mut data[..]);
                    array.write((w * region + at) as u64, &data, false).unwrap();
                    part[at..at + len].copy_from_slice(&data);
                    if round % 10 == 9 {
                        array.flush().unwrap();
                    }
                }
            });
        }
    });
    array.flush().unwrap();
    check_all(&array, &model);
    let (calls, batches) = batching.merged();
    assert!(
        batches < calls,
        "concurrent writers' requests were merged: {calls} calls in {batches} batches"
    );
    // Every stripe's leaves and root, computed in merged batches, check
    // out after a crash and reopen, when every chunk is read and verified.
    let array = common::kill_and_reopen(&devices, array);
    check_all(&array, &model);
    let report = array.scrub().unwrap();
    assert_eq!(report.chunks_bad, 0, "{report:?}");
}

/// Memory lent as a GPU backend lends it (bounded, each range recorded),
/// from plain aligned memory.
type Lent = tessera_accel::lend::Lender<tessera_accel::lend::Aligned>;

/// The CPU backend, lending `Lent` memory and counting the stripes it is
/// asked to seal that lie wholly in it (data and parity) and those that do not.
struct Lending {
    cpu: tessera_accel::cpu::Cpu,
    memory: Arc<Lent>,
    in_lent: std::sync::atomic::AtomicU64,
    plain: std::sync::atomic::AtomicU64,
}

impl tessera_accel::Accelerator for Lending {
    fn name(&self) -> &str {
        "lending"
    }
    fn seal(
        &self,
        shape: &tessera_accel::Shape,
        jobs: &mut [tessera_accel::SealJob<'_>],
    ) -> Result<Vec<tessera_accel::Leaves>, tessera_accel::AccelError> {
        for job in jobs.iter() {
            let counter = if self.memory.block(job.data).is_some() && self.memory.block(job.parity).is_some() {
                &self.in_lent
            } else {
                &self.plain
            };
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.cpu.seal(shape, jobs)
    }
    fn reconstruct(
        &self,
        shape: &tessera_accel::Shape,
        jobs: &mut [tessera_accel::ReconstructJob<'_>],
    ) -> Result<Vec<tessera_accel::Leaves>, tessera_accel::AccelError> {
        self.cpu.reconstruct(shape, jobs)
    }
    fn decode(
        &self,
        shape: &tessera_accel::Shape,
        jobs: &mut [tessera_accel::ReconstructJob<'_>],
    ) -> Result<(), tessera_accel::AccelError> {
        self.cpu.decode(shape, jobs)
    }
    fn hash(&self, algorithm: Algorithm, inputs: &[&[u8]]) -> Vec<tessera_checksum::Digest> {
        self.cpu.hash(algorithm, inputs)
    }
    fn work(&self) -> tessera_accel::Work {
        self.cpu.work()
    }
    fn host_memory(&self) -> Option<Arc<dyn tessera_accel::HostMemory>> {
        Some(self.memory.clone())
    }
}

#[test]
fn stripes_are_built_in_the_memory_the_accelerator_lends_and_all_of_it_is_given_back() {
    // A GPU backend copies stripes in page-locked memory it lent without
    // packing them; the array must build its stripes there, fall back to
    // plain memory when the backend has none left to lend, and give back
    // everything it was lent, once, when it closes.
    let g_area = 4 * CHUNK;
    let lending = |limit: usize| {
        Arc::new(Lending {
            cpu: tessera_accel::cpu::Cpu::new(2),
            memory: Arc::new(Lent::new(tessera_accel::lend::Aligned, limit, 0)),
            in_lent: Default::default(),
            plain: Default::default(),
        })
    };
    let devices = members(6);
    let mut model = vec![0u8; 0];
    // Room for a few stripes' buffers: the rest must come from plain memory.
    for (round, limit) in [(0u64, 2 * g_area), (1, 64 << 20)] {
        let accel = lending(limit);
        let engine = tessera_array::EngineOptions {
            accel: Some(accel.clone()),
            ..Default::default()
        };
        let array = if round == 0 {
            tessera_array::create_with(named(&devices), &options(4, 2, None), engine).unwrap()
        } else {
            tessera_array::open_with(open_list(&devices, &[]), engine).unwrap()
        };
        if model.is_empty() {
            model = vec![0u8; array.logical_bytes() as usize];
        }
        check_all(&array, &model);
        let mut rng = rand::rngs::StdRng::seed_from_u64(round);
        exercise(&array, &mut model, &mut rng, 300);
        array.flush().unwrap();
        check_all(&array, &model);
        let (in_lent, plain) = (
            accel.in_lent.load(std::sync::atomic::Ordering::Relaxed),
            accel.plain.load(std::sync::atomic::Ordering::Relaxed),
        );
        assert!(in_lent > 0, "stripes built in lent memory: {in_lent} (plain {plain})");
        let refused = accel.memory.refused();
        if round == 0 {
            assert!(
                refused > 0 && plain > 0,
                "the limit was reached: {refused} refused, {plain} plain"
            );
        }
        drop(array);
        let lent = tessera_accel::HostMemory::lent(&*accel.memory);
        assert_eq!(lent, (0, 0), "everything lent was given back");
    }
}

/// A read on healthy members reads each byte it needs once, however many
/// stripes and extents it covers: its raw pieces are read in runs, one
/// round for all of them, and checked. A run cut or placed wrong fails its
/// CRCs and is read again the usual way, which this counts.
#[test]
fn a_read_over_several_stripes_reads_each_byte_it_needs_once() {
    let devices: Vec<_> = (0..6).map(|_| Arc::new(MemoryDevice::new(64 << 20))).collect();
    let array = tessera_array::create(named(&devices), &CreateOptions::new(4, 2)).unwrap();
    let mut data = vec![0u8; 4 << 20];
    rand::rngs::StdRng::seed_from_u64(5).fill(&mut data[..]);
    array.write(0, &data, false).unwrap();
    array.flush().unwrap();
    let read_bytes = || -> u64 { array.status().unwrap().members.iter().map(|m| m.io.read_bytes).sum() };
    // Within one extent, across extents of one stripe, across three and
    // five stripes (of ~256 KiB of data each), unaligned to extents.
    for (offset, len) in [
        (8 << 10, 4 << 10),
        (60 << 10, 20 << 10),
        (100 << 10, 600 << 10),
        (1 << 20, 1 << 20),
    ] {
        let before = read_bytes();
        let mut got = vec![0u8; len];
        array.read(offset as u64, &mut got).unwrap();
        assert!(got == data[offset..offset + len], "{len} bytes at {offset}");
        assert_eq!(read_bytes() - before, len as u64, "{len} bytes at {offset}");
    }
}

/// A scrub checks the stripes on the members when it began: those
/// sealed while it runs, in slots it has not reached yet, are not in its
/// total, and not checked either (its total and what it checked agree
/// whatever clients write meanwhile). The walk goes 7 slots at a time
/// (`common::written_4_plus_2_on`), so new stripes land in chunks it has
/// not listed yet. It failed with the scrub counting at its start and
/// listing each chunk as it came: 50 checked of 17 counted.
#[test]
fn a_scrub_checks_the_stripes_there_when_it_began() {
    let (_devices, array, _) = common::written_4_plus_2_on(6, 64 << 20, 11, 4 << 20);
    let data = vec![0x5au8; 1 << 20];
    let mut writes = 0u64;
    let report = array
        .scrub_with(None, |_| {
            // A MiB more at each of the first eight stripes checked, sealed.
            if writes < 8 {
                array.write((8 << 20) + writes * (1 << 20), &data, false).unwrap();
                array.flush().unwrap();
                writes += 1;
            }
            true
        })
        .unwrap();
    assert_eq!(writes, 8);
    assert_eq!(
        report.stripes_checked, report.stripes_total,
        "checked {} of {} counted when it began",
        report.stripes_checked, report.stripes_total
    );
}
