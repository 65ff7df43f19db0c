//! Rebuilding a member while the array serves: clients write and read
//! throughout, another member fails during it, a stopped rebuild goes on
//! where it stopped, and a device that fails stops it cleanly.

use crate::common::{self, open_list};
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tessera_array::device::{Device, Faults, MemoryDevice};
use tessera_array::{Array, ArrayError, MemberState, RebuildOptions, RebuildResume};

const MEMBER_BYTES: u64 = 64 << 20;

/// A 4+2 array of 64 KiB chunks on six members in memory, 16 MiB of
/// random data from `seed` written and flushed: (members, array, data).
fn written(seed: u64) -> (Vec<Arc<MemoryDevice>>, Array, Vec<u8>) {
    common::written_4_plus_2_on(6, MEMBER_BYTES, seed, 16 << 20)
}

fn state(array: &Array, index: usize) -> MemberState {
    array.status().unwrap().members[index].state
}

fn reads_back(array: &Array, data: &[u8], what: &str) {
    let mut back = vec![0u8; data.len()];
    array.read(0, &mut back).unwrap();
    let first_bad = back.iter().zip(data).position(|(a, b)| a != b);
    assert!(first_bad.is_none(), "{what}: first wrong byte at {first_bad:?}");
}

/// Random 4-64 KiB overwrites of the first `size` bytes, each applied to
/// `data` with the write, a FLUSH every 16, until `stop` (or 20,000
/// writes); returns how many were made.
fn write_until(array: &Array, data: &Mutex<Vec<u8>>, size: u64, stop: &AtomicBool, seed: u64) -> u64 {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut writes = 0;
    while !stop.load(Ordering::Relaxed) && writes < 20_000 {
        let len = rng.gen_range(1..=16u64) * 4096;
        let offset = rng.gen_range(0..(size - len) / 4096) * 4096;
        let mut bytes = vec![0u8; len as usize];
        rng.fill(&mut bytes[..]);
        // The model is updated under its lock with the write, so that it
        // always matches what was written last to each byte.
        let mut model = data.lock().unwrap();
        array.write(offset, &bytes, false).unwrap();
        model[offset as usize..(offset + len) as usize].copy_from_slice(&bytes);
        drop(model);
        writes += 1;
        if writes % 16 == 0 {
            array.flush().unwrap();
        }
    }
    writes
}

#[test]
fn a_member_is_rebuilt_while_clients_write_and_another_member_fails() {
    let (devices, array, data) = written(1);
    array.fail_member(3).unwrap();
    let new = Arc::new(MemoryDevice::new(MEMBER_BYTES));
    let model = Mutex::new(data);
    let stop = AtomicBool::new(false);
    let writes_during = std::sync::atomic::AtomicU64::new(0);
    let report = std::thread::scope(|scope| {
        // The first 4 MiB rewritten over and over: the rest stays in the
        // stripes the rebuild must rebuild.
        let writer = scope.spawn(|| write_until(&array, &model, 4 << 20, &stop, 2));
        let options = RebuildOptions {
            // About 2 s: 64 KiB chunks, at most 2 MiB a second.
            rate: Some(2 << 20),
            ..RebuildOptions::default()
        };
        let report = array.rebuild_member(
            3,
            new.clone(),
            &options,
            |report| {
                if report.stripes_done == 8 {
                    // M-1 more: member 1 fails for good half-way.
                    devices[1].set_faults(Faults {
                        fail_reads: true,
                        fail_writes: true,
                        ..Faults::default()
                    });
                }
                assert_eq!(array.status().unwrap().rebuild.map(|r| r.member), Some(3));
                true
            },
            |_| Ok(()),
        );
        stop.store(true, Ordering::Relaxed);
        writes_during.store(writer.join().unwrap(), Ordering::Relaxed);
        report
    });
    let report = report.unwrap();
    let writes_during = writes_during.into_inner();
    assert!(writes_during > 50, "only {writes_during} writes ran during the rebuild");
    assert_eq!(report.stripes_done, report.stripes_total);
    assert!(
        report.chunks_written > report.stripes_total / 2 && report.chunks_current == 0,
        "{report:?}"
    );
    assert_eq!(state(&array, 3), MemberState::Healthy, "rebuilt, in memory");
    assert_eq!(state(&array, 1), MemberState::Failed);
    assert!(array.status().unwrap().rebuild.is_none());
    array.check().unwrap();
    let data = model.into_inner().unwrap();
    // With member 1 failed and 0 failed now, every stripe needs member 3:
    // what it was rebuilt with and what was written to it during.
    array.fail_member(0).unwrap();
    reads_back(&array, &data, "members 0 and 1 out, after the rebuild");
    // The writer's last writes, after its last FLUSH, made durable.
    array.flush().unwrap();
    drop(array);
    // Reopened on the new device: the superblocks say it is healthy.
    devices[1].set_faults(Faults::default());
    let mut with_new = devices.clone();
    with_new[3] = new;
    let array = tessera_array::open(open_list(&with_new, &[0, 1])).unwrap();
    assert_eq!(state(&array, 3), MemberState::Healthy);
    reads_back(&array, &data, "reopened with members 0 and 1 missing");
}

#[test]
fn a_stopped_rebuild_goes_on_where_it_stopped() {
    let (devices, array, data) = written(3);
    let mut data = data;
    let mut rng = rand::rngs::StdRng::seed_from_u64(4);
    // The first 2 MiB rewritten: their first stripes are freed, and (after
    // a checkpoint) reused first by what is written between the runs,
    // below where the first run stops.
    rng.fill(&mut data[..2 << 20]);
    array.write(0, &data[..2 << 20], true).unwrap();
    array.checkpoint().unwrap();
    array.fail_member(2).unwrap();
    let new = Arc::new(MemoryDevice::new(MEMBER_BYTES));
    let saved: Mutex<Option<RebuildResume>> = Mutex::new(None);
    let first = array
        .rebuild_member(
            2,
            new.clone(),
            &RebuildOptions::default(),
            |report| report.stripes_done < report.stripes_total - 2,
            |at| {
                *saved.lock().unwrap() = Some(*at);
                Ok(())
            },
        )
        .unwrap();
    let saved = saved
        .into_inner()
        .unwrap()
        .expect("a stopped rebuild saves where it stopped");
    assert_eq!(first.stripes_done, first.stripes_total - 2, "{first:?}");
    assert_eq!(
        state(&array, 2),
        MemberState::Failed,
        "a stopped rebuild leaves it failed"
    );
    // Written while it is out, between the two runs.
    rng.fill(&mut data[8 << 20..9 << 20]);
    array.write(8 << 20, &data[8 << 20..9 << 20], true).unwrap();
    let options = RebuildOptions {
        resume: Some(saved),
        ..RebuildOptions::default()
    };
    let second = array
        .rebuild_member(2, new.clone(), &options, |_| true, |_| Ok(()))
        .unwrap();
    assert!(
        second.stripes_resumed >= first.stripes_done - 8,
        "it did not go on where it stopped: {first:?} then {second:?}"
    );
    assert_eq!(second.stripes_done, second.stripes_total);
    assert_eq!(state(&array, 2), MemberState::Healthy);
    array.fail_member(0).unwrap();
    array.fail_member(1).unwrap();
    reads_back(&array, &data, "members 0 and 1 out, after the resumed rebuild");
    drop(devices);
}

#[test]
fn a_rebuild_stops_cleanly_when_its_device_fails_or_the_member_is_failed() {
    let (_devices, array, data) = written(5);
    array.fail_member(4).unwrap();
    // The device fails its writes: the rebuild stops, the member stays
    // failed, and the array goes on.
    let bad = Arc::new(MemoryDevice::new(MEMBER_BYTES));
    bad.set_faults(Faults {
        fail_writes: true,
        ..Faults::default()
    });
    let error = array
        .rebuild_member(4, bad, &RebuildOptions::default(), |_| true, |_| Ok(()))
        .unwrap_err();
    assert!(
        matches!(
            error,
            ArrayError::Io { member: 4, .. } | ArrayError::RebuildStopped { index: 4 }
        ),
        "{error}"
    );
    assert_eq!(state(&array, 4), MemberState::Failed);
    array.write(0, &data[..1 << 20], true).unwrap();
    // Failed by hand during it: stopped at the next stripe. Member 0 is
    // out too, and cannot be rebuilt meanwhile: one rebuild at a time.
    array.fail_member(0).unwrap();
    let device = Arc::new(MemoryDevice::new(MEMBER_BYTES)) as Arc<dyn Device>;
    let error = array
        .rebuild_member(
            4,
            device,
            &RebuildOptions::default(),
            |report| {
                if report.stripes_done == 2 {
                    let again = Arc::new(MemoryDevice::new(MEMBER_BYTES)) as Arc<dyn Device>;
                    let error = array
                        .rebuild_member(4, again, &RebuildOptions::default(), |_| true, |_| Ok(()))
                        .unwrap_err();
                    assert!(matches!(error, ArrayError::RebuildRunning { index: 4 }), "{error}");
                    let other = Arc::new(MemoryDevice::new(MEMBER_BYTES)) as Arc<dyn Device>;
                    let error = array
                        .rebuild_member(0, other, &RebuildOptions::default(), |_| true, |_| Ok(()))
                        .unwrap_err();
                    assert!(matches!(error, ArrayError::RebuildRunning { index: 4 }), "{error}");
                    assert_eq!(
                        state(&array, 0),
                        MemberState::Failed,
                        "a refused rebuild changes nothing"
                    );
                }
                if report.stripes_done == 3 {
                    array.fail_member(4).unwrap();
                }
                true
            },
            |_| Ok(()),
        )
        .unwrap_err();
    assert!(matches!(error, ArrayError::RebuildStopped { index: 4 }), "{error}");
    assert_eq!(state(&array, 4), MemberState::Failed);
    // A healthy member has nothing to rebuild.
    let spare = Arc::new(MemoryDevice::new(MEMBER_BYTES)) as Arc<dyn Device>;
    let error = array
        .rebuild_member(1, spare, &RebuildOptions::default(), |_| true, |_| Ok(()))
        .unwrap_err();
    assert!(matches!(error, ArrayError::MemberHealthy { index: 1 }), "{error}");
    reads_back(&array, &data, "after two stopped rebuilds");
}

/// Rebuilds member `index` onto `device`, keeping what it holds.
fn resync(array: &Array, index: usize, device: Arc<MemoryDevice>) -> tessera_array::RebuildReport {
    let options = RebuildOptions {
        keep_current: true,
        ..RebuildOptions::default()
    };
    array
        .rebuild_member(index, device, &options, |_| true, |_| Ok(()))
        .unwrap()
}

#[test]
fn a_returning_member_is_resynced_looking_only_at_what_was_written_while_it_was_away() {
    let (devices, array, mut data) = written(7);
    // Failed by hand (a checkpoint first), 1 MiB rewritten meanwhile.
    array.fail_member(2).unwrap();
    rand::rngs::StdRng::seed_from_u64(8).fill(&mut data[4 << 20..5 << 20]);
    array.write(4 << 20, &data[4 << 20..5 << 20], true).unwrap();
    let report = resync(&array, 2, devices[2].clone());
    // 16 MiB is 64 stripes of 4 x 64 KiB, all held already; what was
    // written while it was away (4 stripes, and their FLUSH) is rebuilt.
    let looked_at = report.stripes_total - report.stripes_trusted;
    assert!(
        report.stripes_trusted >= 60 && looked_at <= 8 && report.chunks_written >= 4,
        "{report:?}"
    );
    assert_eq!(state(&array, 2), MemberState::Healthy);
    array.fail_member(0).unwrap();
    array.fail_member(1).unwrap();
    reads_back(&array, &data, "members 0 and 1 out, after the resync");
}

#[test]
fn a_device_rebuilt_half_way_as_another_member_is_not_taken_for_its_old_self() {
    let (devices, array, data) = written(9);
    array.fail_member(2).unwrap();
    array.fail_member(3).unwrap();
    // Member 2's device (its superblock still says member 2) is given to
    // member 3's rebuild, which stops half-way: its chunks are member 3's.
    array
        .rebuild_member(
            3,
            devices[2].clone(),
            &RebuildOptions::default(),
            |report| report.stripes_done < report.stripes_total / 2,
            |_| Ok(()),
        )
        .unwrap();
    assert_eq!(state(&array, 3), MemberState::Failed);
    // Given back to member 2, it is checked, not trusted.
    let report = resync(&array, 2, devices[2].clone());
    assert_eq!(report.stripes_trusted, 0, "{report:?}");
    assert!(report.chunks_written >= 30, "{report:?}");
    array.fail_member(0).unwrap();
    reads_back(&array, &data, "members 0 and 3 out, after the resync of member 2");
}

#[test]
fn at_open_a_member_that_was_away_is_stale_and_one_failed_by_hand_is_failed() {
    let (devices, array, mut data) = written(11);
    array.fail_member(4).unwrap();
    drop(array);
    // Member 2 away while 1 MiB is rewritten.
    let array = tessera_array::open(open_list(&devices, &[2])).unwrap();
    rand::rngs::StdRng::seed_from_u64(12).fill(&mut data[..1 << 20]);
    array.write(0, &data[..1 << 20], true).unwrap();
    drop(array);
    let array = tessera_array::open(open_list(&devices, &[])).unwrap();
    assert_eq!(state(&array, 2), MemberState::Stale);
    assert_eq!(state(&array, 4), MemberState::Failed);
    // Neither is read: with member 0 failed too, the data is whole only
    // if member 2 is left out.
    assert!(matches!(array.fail_member(0), Err(ArrayError::TooManyFailed { .. })));
    reads_back(&array, &data, "members 2 and 4 out");
    // Failed by hand while stale, it is failed, and stays so at the next
    // open (not resynced by itself), still holding what it held.
    array.fail_member(2).unwrap();
    assert_eq!(state(&array, 2), MemberState::Failed);
    drop(array);
    let array = tessera_array::open(open_list(&devices, &[])).unwrap();
    assert_eq!(
        state(&array, 2),
        MemberState::Failed,
        "failed by hand, it came back stale"
    );
    // Both come back on their own devices, each taking only what it missed
    // on its superblock's word (member 4's, written when it was failed).
    for member in [2, 4] {
        let report = resync(&array, member, devices[member].clone());
        assert!(report.stripes_trusted >= 56, "member {member}: {report:?}");
        assert_eq!(state(&array, member), MemberState::Healthy);
    }
    array.fail_member(0).unwrap();
    array.fail_member(1).unwrap();
    reads_back(&array, &data, "members 0 and 1 out, after both resyncs");
}
