//! The intent log (issue 14): a FLUSH after a small write goes to the log
//! on M+1 members instead of sealing a short stripe, and whatever a FLUSH
//! acknowledged reads back after a crash: with torn log writes, with M
//! members lost, with a log too small or failing (short stripes then).

use crate::common::{headers, named, open_list};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;
use tessera_array::device::{Device, Faults, MemoryDevice, RandomFaults};
use tessera_array::format::{self, Geometry, BLOCK_BYTES};
use tessera_array::{Array, CreateOptions, EngineOptions, LogPlace, MemberState};
use tessera_checksum::Algorithm;

const MEMBER_BYTES: u64 = 32 << 20;

fn members(n: usize) -> Vec<Arc<MemoryDevice>> {
    (0..n).map(|_| Arc::new(MemoryDevice::new(MEMBER_BYTES))).collect()
}

fn options(compression: Option<tessera_compress::Codec>, log_bytes: Option<u64>) -> CreateOptions {
    CreateOptions {
        data: 4,
        parity: 2,
        chunk_bytes: 64 << 10,
        checksum: Algorithm::Sha256,
        compression,
        logical_bytes: None,
        log_bytes,
    }
}

/// No background thread: nothing seals or syncs behind the test's back.
fn quiet() -> EngineOptions {
    EngineOptions {
        background: false,
        ..EngineOptions::default()
    }
}

fn create(devices: &[Arc<MemoryDevice>], options: &CreateOptions) -> Array {
    tessera_array::create_with(named(devices), options, quiet()).unwrap()
}

/// Opens the array from the devices not in `missing`.
fn reopen_without(devices: &[Arc<MemoryDevice>], missing: &[usize]) -> Array {
    tessera_array::open_with(open_list(devices, missing), quiet()).unwrap()
}

/// Power loss on every member: what was not synced is gone.
fn crash(array: Array, devices: &[Arc<MemoryDevice>]) {
    drop(array);
    for d in devices {
        d.crash(0);
    }
}

/// 4 KiB blocks of random bytes (or, compressible, half a pattern).
fn blocks(rng: &mut impl Rng, count: usize, compressible: bool) -> Vec<u8> {
    let mut data = vec![0u8; count * BLOCK_BYTES];
    rng.fill(&mut data[..]);
    if compressible {
        for (i, b) in data.iter_mut().enumerate() {
            if i % BLOCK_BYTES < BLOCK_BYTES / 2 {
                *b = (i / BLOCK_BYTES) as u8;
            }
        }
    }
    data
}

/// Power loss, then open: every block of `model` (by LBA) reads back, and
/// the map and slots agree.
fn crash_and_check(array: Array, devices: &[Arc<MemoryDevice>], model: &BTreeMap<u64, Vec<u8>>) -> Array {
    crash(array, devices);
    let array = reopen_without(devices, &[]);
    for (lba, data) in model {
        assert!(
            &read(&array, lba * BLOCK_BYTES as u64, BLOCK_BYTES) == data,
            "block {lba}"
        );
    }
    array.check().unwrap();
    array
}

fn read(array: &Array, offset: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    array.read(offset, &mut out).unwrap();
    out
}

/// The members whose log area holds a valid block.
fn members_with_log_blocks(devices: &[Arc<MemoryDevice>], g: &Geometry) -> Vec<usize> {
    devices
        .iter()
        .enumerate()
        .filter(|(_, d)| {
            let mut area = vec![0u8; g.log_bytes as usize];
            d.read_at(&mut area, g.log_offset()).unwrap();
            (0..area.len())
                .step_by(format::LOG_ALIGN)
                .any(|at| format::decode_log_block(&area[at..], g).is_ok())
        })
        .map(|(i, _)| i)
        .collect()
}

/// Before the log, this FLUSH sealed a short stripe: write amplification
/// 260 for a FLUSH after every 4 KiB write. Now each goes to the log, and
/// every acknowledged block is back after power loss.
#[test]
fn small_writes_flushed_go_to_the_log_and_survive_power_loss() {
    for compression in [None, Some(tessera_compress::Codec::Lz4)] {
        let devices = members(6);
        let array = create(&devices, &options(compression, None));
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let mut model = BTreeMap::new();
        for i in 0..40u64 {
            let lba = rng.gen_range(0..2000u64);
            let data = blocks(&mut rng, 1, compression.is_some());
            array.write(lba * BLOCK_BYTES as u64, &data, i % 3 == 0).unwrap();
            if i % 3 != 0 {
                array.flush().unwrap();
            }
            model.insert(lba, data);
        }
        // A TRIM of a written block is logged too (as a zero record).
        let trimmed = *model.keys().next().expect("written");
        array
            .trim(trimmed * BLOCK_BYTES as u64, BLOCK_BYTES as u64, false)
            .unwrap();
        array.flush().unwrap();
        model.insert(trimmed, vec![0u8; BLOCK_BYTES]);
        let status = array.status().unwrap();
        let log = status.log.clone().expect("the array has a log");
        assert_eq!(status.short_stripes_sealed, 0, "{compression:?}");
        assert_eq!(log.flushes_logged, 41, "{compression:?}");
        // M+1 = 3 copies of 4 KiB and its header in 512-byte sectors.
        if compression.is_none() {
            let per_write =
                status.write_amplification_log * status.user_bytes_written as f64 / (40 * BLOCK_BYTES) as f64;
            assert!(
                (3.0..=3.5).contains(&per_write),
                "log bytes per byte written {per_write}"
            );
        }
        // On the members: no user stripe at all yet, only log blocks.
        let g = array.geometry().clone();
        let user_chunks = headers(&devices, &g)
            .into_iter()
            .filter(|(_, _, h)| h.stream == format::Stream::User)
            .count();
        assert_eq!(user_chunks, 0, "{compression:?}");
        let array = crash_and_check(array, &devices, &model);
        let recovery = array.status().unwrap().recovery.log.expect("the log was read");
        assert!(recovery.records_replayed >= 41, "{recovery:?}");
        // Replayed into stripes: a second crash and open finds it all again.
        crash_and_check(array, &devices, &model);
    }
}

/// A log block is on M+1 members: with M of those lost, the last copy
/// brings the acknowledged writes back.
#[test]
fn logged_writes_survive_the_loss_of_m_members_that_hold_the_log() {
    let devices = members(6);
    let array = create(&devices, &options(None, None));
    let g = array.geometry().clone();
    let data = blocks(&mut rand::rngs::StdRng::seed_from_u64(2), 3, false);
    array.write(8 * BLOCK_BYTES as u64, &data, true).unwrap();
    let holders = members_with_log_blocks(&devices, &g);
    assert_eq!(holders.len(), 3, "one block, M+1 copies: {holders:?}");
    crash(array, &devices);
    let array = reopen_without(&devices, &holders[..2]);
    assert_eq!(read(&array, 8 * BLOCK_BYTES as u64, data.len()), data);
}

/// A log write torn by power loss was never acknowledged: its block fails
/// its CRC and is ignored, never replayed as data; what came before it
/// reads back.
#[test]
fn a_torn_log_block_is_ignored() {
    let devices = members(6);
    let array = create(&devices, &options(None, None));
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let first = blocks(&mut rng, 2, false);
    array.write(0, &first, true).unwrap();
    // The second FLUSH's block reaches each member torn after 4 KiB of
    // its 8.5 KiB, and the power fails before the FLUSH returns.
    let second = blocks(&mut rng, 2, false);
    array.write(0, &second, false).unwrap();
    for d in &devices {
        d.set_faults(Faults {
            random: Some(RandomFaults {
                seed: 9,
                torn_write: 1.0,
                ..RandomFaults::default()
            }),
            ..Faults::default()
        });
    }
    array.flush().unwrap();
    for d in &devices {
        d.set_faults(Faults::default());
    }
    crash(array, &devices);
    let array = reopen_without(&devices, &[]);
    let recovery = array.status().unwrap().recovery.log.unwrap();
    assert_eq!(recovery.blocks_replayed, 1, "only the whole block: {recovery:?}");
    assert_eq!(read(&array, 0, first.len()), first);
}

/// A log too small for the workload: FLUSH seals short stripes instead,
/// and nothing is lost.
#[test]
fn a_full_log_falls_back_to_short_stripes() {
    let devices = members(6);
    // Room for one 4 KiB record's block on each member, not two: the
    // second FLUSH finds the first's block live (its stripe still open).
    let array = create(&devices, &options(None, Some(8 << 10)));
    let mut rng = rand::rngs::StdRng::seed_from_u64(4);
    let mut written = Vec::new();
    for i in 0..12u64 {
        let data = blocks(&mut rng, 1, false);
        array.write(i * 64 * BLOCK_BYTES as u64, &data, true).unwrap();
        written.push((i * 64, data));
    }
    let status = array.status().unwrap();
    let log = status.log.unwrap();
    assert!(log.stripes_sealed_instead > 0, "{log:?}");
    assert!(log.flushes_logged > 0, "{log:?}");
    crash(array, &devices);
    let array = reopen_without(&devices, &[]);
    for (lba, data) in &written {
        assert!(
            &read(&array, lba * BLOCK_BYTES as u64, data.len()) == data,
            "block {lba}"
        );
    }
}

/// A member whose log write fails is failed, the FLUSH seals short
/// stripes instead and returns, and every acknowledged write reads back.
#[test]
fn a_failed_log_write_fails_the_member_and_falls_back() {
    let devices = members(6);
    let array = create(&devices, &options(None, None));
    let data = blocks(&mut rand::rngs::StdRng::seed_from_u64(5), 1, false);
    devices[0].set_faults(Faults {
        fail_writes: true,
        ..Faults::default()
    });
    array.write(0, &data, true).unwrap();
    let status = array.status().unwrap();
    assert_eq!(status.members_unavailable, 1);
    let log = status.log.unwrap();
    assert_eq!(log.write_failures, 1, "{log:?}");
    assert_eq!(status.short_stripes_sealed, 1);
    // Later FLUSHes log again, on the members left.
    array.write(BLOCK_BYTES as u64, &data, true).unwrap();
    assert_eq!(array.status().unwrap().log.unwrap().flushes_logged, 1);
    crash(array, &devices);
    let array = reopen_without(&devices, &[0]);
    assert_eq!(read(&array, 0, BLOCK_BYTES), data);
    assert_eq!(read(&array, BLOCK_BYTES as u64, BLOCK_BYTES), data);
}

/// Arrays made without a log (or before there was one) seal short
/// stripes on FLUSH, as they always did.
#[test]
fn an_array_without_a_log_seals_short_stripes() {
    let devices = members(6);
    let array = create(&devices, &options(None, Some(0)));
    assert!(array.status().unwrap().log.is_none());
    fua_write_seals_a_short_stripe_and_survives(array, &devices, 7);
}

/// A FUA write of one block of `byte`s seals one short stripe (no log to
/// take it), and reads back after power loss.
fn fua_write_seals_a_short_stripe_and_survives(array: Array, devices: &[Arc<MemoryDevice>], byte: u8) {
    array.write(0, &[byte; BLOCK_BYTES], true).unwrap();
    assert_eq!(array.status().unwrap().short_stripes_sealed, 1);
    crash(array, devices);
    let array = reopen_without(devices, &[]);
    assert_eq!(read(&array, 0, BLOCK_BYTES), vec![byte; BLOCK_BYTES]);
}

/// Many writers and FLUSHes at once (group commit), random sizes, power
/// loss at the end: everything a FLUSH returned for reads back, and the
/// log never overwrote a block still needed (the log is small, so it
/// wraps many times).
#[test]
fn concurrent_writers_and_flushes_survive_power_loss() {
    let devices = members(8);
    let mut o = options(None, Some(256 << 10));
    o.data = 5;
    let array = Arc::new(tessera_array::create_with(named(&devices), &o, EngineOptions::default()).unwrap());
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let array = array.clone();
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(100 + t);
                let mut acknowledged = Vec::new();
                for i in 0..150u64 {
                    // Each thread owns its own blocks: t, t+4, t+8, ...
                    let lba = (rng.gen_range(0..500u64) * 4 + t) * 4;
                    let count = rng.gen_range(1..=4);
                    let data = blocks(&mut rng, count, false);
                    array.write(lba * BLOCK_BYTES as u64, &data, false).unwrap();
                    if i % 2 == 0 {
                        array.flush().unwrap();
                    }
                    acknowledged.push((lba, data));
                }
                array.flush().unwrap();
                acknowledged
            })
        })
        .collect();
    let mut model = BTreeMap::new();
    for thread in threads {
        for (lba, data) in thread.join().unwrap() {
            for (i, block) in data.chunks(BLOCK_BYTES).enumerate() {
                model.insert(lba + i as u64, block.to_vec());
            }
        }
    }
    let log = array.status().unwrap().log.unwrap();
    assert!(log.flushes_logged > 10, "{log:?}");
    crash_and_check(Arc::into_inner(array).unwrap(), &devices, &model);
}

const LOG_DEVICE_BYTES: u64 = 8 << 20;

/// `quiet()` with the log devices of `logs` in `keep`, in that order.
fn with_logs(logs: &[Arc<MemoryDevice>], keep: &[usize]) -> EngineOptions {
    EngineOptions {
        log_devices: keep
            .iter()
            .map(|&i| (format!("log{i}"), logs[i].clone() as Arc<dyn Device>))
            .collect(),
        ..quiet()
    }
}

fn log_devices(count: usize) -> Vec<Arc<MemoryDevice>> {
    (0..count)
        .map(|_| Arc::new(MemoryDevice::new(LOG_DEVICE_BYTES)))
        .collect()
}

/// Opens the array from every member and the log devices in `keep`.
fn open_with_logs(
    devices: &[Arc<MemoryDevice>],
    logs: &[Arc<MemoryDevice>],
    keep: &[usize],
) -> Result<Array, tessera_array::ArrayError> {
    tessera_array::open_with(open_list(devices, &[]), with_logs(logs, keep))
}

/// Small FLUSHed writes, each block of them in `model`.
fn write_flushed(array: &Array, seed: u64, count: u64) -> BTreeMap<u64, Vec<u8>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut model = BTreeMap::new();
    for _ in 0..count {
        let lba = rng.gen_range(0..2000u64);
        let data = blocks(&mut rng, 1, false);
        array.write(lba * BLOCK_BYTES as u64, &data, false).unwrap();
        array.flush().unwrap();
        model.insert(lba, data);
    }
    model
}

fn check_model(array: &Array, model: &BTreeMap<u64, Vec<u8>>) {
    for (lba, data) in model {
        assert!(
            &read(array, lba * BLOCK_BYTES as u64, BLOCK_BYTES) == data,
            "block {lba}"
        );
    }
    array.check().unwrap();
}

/// With a log device, FLUSHed small writes go to it alone (one copy
/// there; nothing on the members, which have no log area), and come back
/// from it after power loss on every device.
#[test]
fn a_log_device_takes_the_log_and_brings_it_back_after_power_loss() {
    let devices = members(6);
    let logs = log_devices(1);
    let array = tessera_array::create_with(named(&devices), &options(None, None), with_logs(&logs, &[0])).unwrap();
    let g = array.geometry().clone();
    assert_eq!((g.log_bytes, g.log_devices), (0, 1));
    let model = write_flushed(&array, 10, 30);
    let status = array.status().unwrap();
    let log = status.log.clone().unwrap();
    assert_eq!(log.on, LogPlace::Devices);
    assert_eq!(log.devices[0].state, MemberState::Healthy);
    assert_eq!(log.flushes_logged, 30);
    assert_eq!(status.short_stripes_sealed, 0);
    // No user stripe on the members (and they have no log area).
    let user_chunks = headers(&devices, &g)
        .into_iter()
        .filter(|(_, _, h)| h.stream == format::Stream::User)
        .count();
    assert_eq!(user_chunks, 0);
    assert!(
        status.write_amplification_log > 1.0 && status.write_amplification_log < 1.3,
        "{status:?}"
    );
    crash(array, &[&devices[..], &logs[..]].concat());
    let array = open_with_logs(&devices, &logs, &[0]).unwrap();
    let recovery = array.status().unwrap().recovery.log.unwrap();
    assert_eq!(recovery.records_replayed, 30, "{recovery:?}");
    check_model(&array, &model);
}

/// Two log devices mirror the log: with one gone at open, the other
/// brings the writes back; the one gone is recorded failed and, when it
/// returns, is not trusted again.
#[test]
fn a_mirrored_log_device_survives_the_loss_of_one() {
    let devices = members(6);
    let logs = log_devices(2);
    let array = tessera_array::create_with(named(&devices), &options(None, None), with_logs(&logs, &[0, 1])).unwrap();
    let model = write_flushed(&array, 11, 20);
    crash(array, &[&devices[..], &logs[..]].concat());
    // Given in the other order: log devices are found by their headers.
    let array = open_with_logs(&devices, &logs, &[1]).unwrap();
    check_model(&array, &model);
    let log = array.status().unwrap().log.unwrap();
    assert_eq!(log.devices[0].state, MemberState::Missing, "{log:?}");
    assert_eq!(log.devices[1].state, MemberState::Healthy, "{log:?}");
    let more = write_flushed(&array, 12, 10);
    crash(array, &[&devices[..], &logs[..]].concat());
    // Log device 0 is back with stale blocks: failed, not read.
    let array = open_with_logs(&devices, &logs, &[1, 0]).unwrap();
    let log = array.status().unwrap().log.unwrap();
    assert_eq!(log.devices[0].state, MemberState::Failed, "{log:?}");
    check_model(&array, &model.into_iter().chain(more).collect());
}

/// The only log device missing after a crash: its blocks may be the only
/// copy of acknowledged writes, so the open is refused, unless asked to
/// discard them; then the array goes on with short stripes.
#[test]
fn a_missing_sole_log_device_refuses_the_open_unless_discarded() {
    let devices = members(6);
    let logs = log_devices(1);
    let array = tessera_array::create_with(named(&devices), &options(None, None), with_logs(&logs, &[0])).unwrap();
    write_flushed(&array, 13, 5);
    crash(array, &[&devices[..], &logs[..]].concat());
    let error = open_with_logs(&devices, &logs, &[]).err().expect("refused");
    assert!(
        matches!(error, tessera_array::ArrayError::LogDevicesMissing { .. }),
        "{error}"
    );
    // A foreign device given as the log device is no better, and named.
    let other = log_devices(1);
    let other_array =
        tessera_array::create_with(named(&members(6)), &options(None, None), with_logs(&other, &[0])).unwrap();
    drop(other_array);
    let error = open_with_logs(&devices, &other, &[0]).err().expect("refused");
    assert!(error.to_string().contains("belongs to array"), "{error}");
    let array = tessera_array::open_with(
        open_list(&devices, &[]),
        EngineOptions {
            discard_missing_log: true,
            ..quiet()
        },
    )
    .unwrap();
    let status = array.status().unwrap();
    assert_eq!(status.log.as_ref().unwrap().devices[0].state, MemberState::Missing);
    fua_write_seals_a_short_stripe_and_survives(array, &devices, 5);
}

/// A log device whose writes fail: it is failed, that FLUSH and the
/// later ones seal short stripes, and nothing acknowledged is lost.
#[test]
fn a_failing_log_device_falls_back_to_short_stripes() {
    let devices = members(6);
    let logs = log_devices(1);
    let array = tessera_array::create_with(named(&devices), &options(None, None), with_logs(&logs, &[0])).unwrap();
    let first = write_flushed(&array, 14, 3);
    logs[0].set_faults(Faults {
        fail_writes: true,
        ..Faults::default()
    });
    let second = write_flushed(&array, 15, 3);
    let status = array.status().unwrap();
    let log = status.log.unwrap();
    assert_eq!(log.devices[0].state, MemberState::Failed, "{log:?}");
    assert_eq!(log.write_failures, 1, "{log:?}");
    assert_eq!(status.short_stripes_sealed, 3);
    assert_eq!(status.members_unavailable, 0);
    crash(array, &[&devices[..], &logs[..]].concat());
    logs[0].set_faults(Faults::default());
    // Recorded failed: opens without it, and never reads it.
    let array = open_with_logs(&devices, &logs, &[]).unwrap();
    check_model(&array, &first.into_iter().chain(second).collect());
}

/// Replay at open into a member that refuses writes, with M members out
/// already (issue 31, item 1): the stripe the log records go to reaches
/// fewer than K members, so the records must not be taken as replayed.
/// The array opens with writes refused, says so, and serves the FLUSHed
/// blocks; once the member takes writes again, a reopening finds them all.
#[test]
fn a_replay_that_cannot_reach_k_members_keeps_the_log_and_serves_it() {
    let devices = members(6);
    let array = create(&devices, &options(None, None));
    array.fail_member(0).unwrap();
    array.fail_member(1).unwrap();
    let model = write_flushed(&array, 7, 6);
    assert!(array.status().unwrap().log.unwrap().flushes_logged > 0);
    // kill -9: what was written stays; member 5's filesystem is then
    // full: its data area takes no new stripe.
    let g = array.geometry().clone();
    drop(array);
    for d in &devices {
        d.crash(d.pending_writes());
    }
    devices[5].set_faults(Faults {
        full: Some(format::DATA_START..g.log_offset()),
        ..Faults::default()
    });
    let array = reopen_without(&devices, &[]);
    let status = array.status().unwrap();
    assert!(
        status.writes_refused.is_some(),
        "writes not refused after a failed replay"
    );
    for (lba, data) in &model {
        let mut back = vec![0u8; BLOCK_BYTES];
        array
            .read(lba * BLOCK_BYTES as u64, &mut back)
            .unwrap_or_else(|e| panic!("block {lba}: {e}"));
        assert!(&back == data, "block {lba}");
    }
    assert!(array.write(0, &[1u8; BLOCK_BYTES], false).is_err());
    drop(array);
    devices[5].set_faults(Faults::default());
    let array = reopen_without(&devices, &[]);
    assert!(array.status().unwrap().writes_refused.is_none());
    for (lba, data) in &model {
        assert!(
            &read(&array, lba * BLOCK_BYTES as u64, BLOCK_BYTES) == data,
            "block {lba}"
        );
    }
}

/// After a clean stop (a checkpoint sealed the stripe the logged writes
/// went to), opening replays nothing: the stop wrote a log block with no
/// records that is its own tail, so the blocks before it are not looked
/// at (once, every opening wrote their records again; then it read the
/// map pages of every record to see that they were mapped already, which
/// with a small map cache took most of a second). After a kill -9, the
/// replay does the same once its records are in synced stripes, so a
/// second crash replays nothing again.
#[test]
fn opening_after_a_clean_stop_or_a_replay_looks_at_no_logged_record() {
    let devices = members(6);
    let array = create(&devices, &options(None, None));
    let model = write_flushed(&array, 3, 5);
    assert!(array.status().unwrap().log.unwrap().flushes_logged > 0);
    array.checkpoint().unwrap();
    drop(array);
    let nothing_replayed = |array: &Array| {
        let s = array.status().unwrap();
        let log = s.recovery.log.clone().unwrap();
        assert!(log.blocks_found > 0, "{log:?}");
        assert_eq!(log.blocks_replayed, 0, "{log:?}");
        assert_eq!(log.records_replayed, 0, "{log:?}");
        assert_eq!(log.records_already_mapped, 0, "{log:?}");
        assert_eq!(s.stripes_sealed, 0, "opening wrote nothing");
    };
    for _ in 0..2 {
        let array = reopen_without(&devices, &[]);
        nothing_replayed(&array);
        check_model(&array, &model);
        drop(array);
    }
    // Logged, then kill -9: the first opening replays, the next does not.
    let array = reopen_without(&devices, &[]);
    let model: BTreeMap<u64, Vec<u8>> = model.into_iter().chain(write_flushed(&array, 4, 5)).collect();
    crash(array, &devices);
    let array = reopen_without(&devices, &[]);
    let log = array.status().unwrap().recovery.log.unwrap();
    assert!(log.records_replayed + log.records_already_mapped >= 5, "{log:?}");
    check_model(&array, &model);
    crash(array, &devices);
    let array = reopen_without(&devices, &[]);
    nothing_replayed(&array);
    check_model(&array, &model);
}

/// Devices given as log devices that are not this array's are left out,
/// each with its reason typed (blank, another array's, a second claim to
/// a place already held), and the array opens from the one that is.
#[test]
fn wrong_log_devices_are_left_out_with_their_reasons() {
    use tessera_array::LeftOut;
    let devices = members(6);
    let logs = log_devices(2);
    let array = tessera_array::create_with(named(&devices), &options(None, None), with_logs(&logs, &[0, 1])).unwrap();
    let model = write_flushed(&array, 13, 10);
    crash(array, &[&devices[..], &logs[..]].concat());
    let others = log_devices(1);
    let other = tessera_array::create_with(named(&members(6)), &options(None, None), with_logs(&others, &[0])).unwrap();
    let foreign = other.status().unwrap().array_uuid;
    drop(other);
    let given: Vec<(String, Arc<dyn Device>)> = vec![
        ("log0".into(), logs[0].clone()),
        ("log0-again".into(), logs[0].clone()),
        ("blank".into(), Arc::new(MemoryDevice::new(LOG_DEVICE_BYTES))),
        ("foreign".into(), others[0].clone()),
        ("log1".into(), logs[1].clone()),
    ];
    let engine = EngineOptions {
        log_devices: given,
        ..quiet()
    };
    let array = tessera_array::open_with(open_list(&devices, &[]), engine).unwrap();
    check_model(&array, &model);
    let status = array.status().unwrap();
    let rejected: Vec<(&str, &LeftOut)> = status
        .devices_rejected
        .iter()
        .map(|r| (r.name.as_str(), &r.reason))
        .collect();
    assert_eq!(
        rejected,
        [
            ("log0-again", &LeftOut::SameAs { other: "log0".into() }),
            ("blank", &LeftOut::NotALogDevice),
            ("foreign", &LeftOut::OtherArray { array: foreign }),
        ],
        "{:?}",
        status.devices_rejected
    );
    let log = status.log.unwrap();
    assert_eq!(log.devices[0].state, MemberState::Healthy, "{log:?}");
    assert_eq!(log.devices[1].state, MemberState::Healthy, "{log:?}");
}
