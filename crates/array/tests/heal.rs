//! Healing: with more members than a stripe is wide, stripes with a chunk
//! on a member that is out are moved onto healthy members, and survive M
//! more failures again without a new drive.

use crate::common;
use std::sync::Arc;
use tessera_array::device::{Faults, MemoryDevice};
use tessera_array::{Array, ArrayError};

const MEMBER_BYTES: u64 = 64 << 20;

/// A 4+2 array on `n` members in memory with 16 MiB of random data.
fn written(n: usize, seed: u64) -> (Vec<Arc<MemoryDevice>>, Array, Vec<u8>) {
    common::written_4_plus_2_on(n, MEMBER_BYTES, seed, 16 << 20)
}

/// Whether the whole of `data` reads back.
fn reads_back(array: &Array, data: &[u8]) -> bool {
    let mut back = vec![0u8; data.len()];
    array.read(0, &mut back).is_ok() && back == data
}

#[test]
fn degraded_stripes_are_healed_onto_healthy_members_and_survive_two_more_failures() {
    // Eight members, stripes of six: slots rotate, and those on members 0
    // to 5 have nothing on 6 and 7.
    let (devices, array, data) = written(8, 1);
    array.fail_member(6).unwrap();
    array.fail_member(7).unwrap();
    let before = array.status().unwrap().stripes_degraded;
    assert!(before > 32, "{before} degraded stripes");
    // Members 0 and 1 start failing every read (not yet failed: the
    // parity cannot spare them): most stripes are now short of K chunks.
    let broken = Faults {
        fail_reads: true,
        ..Faults::default()
    };
    devices[0].set_faults(broken.clone());
    devices[1].set_faults(broken.clone());
    assert!(
        !reads_back(&array, &data),
        "the data survived four members out before healing"
    );
    devices[0].set_faults(Faults::default());
    devices[1].set_faults(Faults::default());
    let mut calls = 0;
    let report = array
        .heal_with(None, |_| {
            calls += 1;
            true
        })
        .unwrap();
    assert!(
        report.stripes_healed > 32 && report.stripes_degraded == 0 && report.bytes_relocated > 0 && calls > 0,
        "{report:?}"
    );
    // Every degraded stripe counted at the start was listed, a chunk of
    // slots at a time, and healed (nothing else wrote meanwhile): the
    // count and the walk agree.
    assert_eq!(
        (report.stripes_done, report.stripes_healed),
        (report.stripes_total, report.stripes_total),
        "{report:?}"
    );
    // (`status` counts the checkpoint's degraded stripes too; heal, the
    // data stripes it moves.)
    assert!(report.stripes_total <= before, "{report:?} of {before}");
    // (`status` may still count a checkpoint stripe: the map, not data.)
    array.check().unwrap();
    // Every stripe now has all six chunks on members 0 to 5: two of them
    // failing leaves K.
    devices[0].set_faults(broken.clone());
    devices[1].set_faults(broken);
    assert!(
        reads_back(&array, &data),
        "what was healed does not survive two more failures"
    );
    // A second heal finds nothing to do.
    devices[0].set_faults(Faults::default());
    devices[1].set_faults(Faults::default());
    let again = array.heal_with(None, |_| true).unwrap();
    assert_eq!((again.stripes_total, again.stripes_healed), (0, 0), "{again:?}");
}

#[test]
fn heal_stops_when_no_healthy_slot_is_left_and_refuses_arrays_without_spare_members() {
    // Members 0 and 6 out: every slot of the rotation touches one of them,
    // so there is nowhere to heal to, and nothing is moved.
    let (_devices, array, data) = written(8, 2);
    array.fail_member(0).unwrap();
    array.fail_member(6).unwrap();
    let report = array.heal_with(None, |_| true).unwrap();
    assert_eq!(report.stripes_healed, 0, "{report:?}");
    assert!(
        report.stripes_degraded >= report.stripes_total && report.stripes_total > 0,
        "{report:?}"
    );
    assert!(reads_back(&array, &data));
    // Six members, stripes of six: no room by construction.
    let (_devices, array, _) = written(6, 3);
    array.fail_member(2).unwrap();
    assert!(matches!(
        array.heal_with(None, |_| true),
        Err(ArrayError::NoRoomToHeal { members: 6, width: 6 })
    ));
}
