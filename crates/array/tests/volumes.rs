//! Volumes: many thin block devices in one array. Each is written and
//! read apart from the others; they survive a clean stop and kill -9; a
//! deleted volume's space is freed and its data never shows through a
//! later volume (with the same id), after a crash either; shrinking then
//! growing finds zeros; bad requests change nothing.

use crate::common::{kill_and_reopen, named, open_list};
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tessera_array::device::MemoryDevice;
use tessera_array::{Array, ArrayError};

const MEMBER_BYTES: u64 = 16 << 20;
const MIB: u64 = 1 << 20;

fn array() -> (Vec<Arc<MemoryDevice>>, Array) {
    let devices: Vec<_> = (0..6).map(|_| Arc::new(MemoryDevice::new(MEMBER_BYTES))).collect();
    let array = tessera_array::create(named(&devices), &tessera_array::CreateOptions::new(4, 2)).unwrap();
    (devices, array)
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill(&mut bytes[..]);
    bytes
}

fn read(volume: &tessera_array::Volume, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    volume.read(offset, &mut buf).unwrap();
    buf
}

#[test]
fn volumes_hold_their_own_data_across_a_clean_stop_and_kill_9() {
    let (devices, array) = array();
    let a = array.create_volume("a", 4 * MIB).unwrap();
    let b = array.create_volume("b", 8 * MIB).unwrap();
    let (pa, pb, pd) = (
        pattern(1, MIB as usize),
        pattern(2, MIB as usize),
        pattern(3, MIB as usize),
    );
    a.write(0, &pa, false).unwrap();
    b.write(MIB, &pb, false).unwrap();
    array.write(0, &pd, false).unwrap();
    array.flush().unwrap();
    assert!(read(&a, 0, MIB as usize) == pa, "read(&a, 0, MIB as usize)");
    assert!(read(&b, MIB, MIB as usize) == pb, "read(&b, MIB, MIB as usize)");
    assert!(read(&b, 0, MIB as usize) == vec![0u8; MIB as usize], "expected zeros");
    assert!(matches!(
        a.write(4 * MIB - 4096, &[0u8; 8192], false),
        Err(ArrayError::OutOfRange { size, .. }) if size == 4 * MIB
    ));
    assert_eq!(
        b.allocation(0, 3 * MIB).unwrap(),
        [(MIB, false), (MIB, true), (MIB, false)]
    );
    let listed: Vec<(String, u64, u64)> = array
        .volumes()
        .into_iter()
        .map(|v| (v.name, v.bytes, v.mapped_bytes))
        .collect();
    assert_eq!(
        listed[1..],
        [("a".to_string(), 4 * MIB, MIB), ("b".to_string(), 8 * MIB, MIB)]
    );
    assert_eq!(listed[0].0, "tessera");
    array.check().unwrap();

    // A clean stop.
    drop((a, b));
    drop(array);
    let array = tessera_array::open(open_list(&devices, &[])).unwrap();
    let (a, b) = (array.volume("a").unwrap(), array.volume("b").unwrap());
    assert!(read(&a, 0, MIB as usize) == pa, "read(&a, 0, MIB as usize)");
    assert!(read(&b, MIB, MIB as usize) == pb, "read(&b, MIB, MIB as usize)");
    assert!(
        read(&array.volume("tessera").unwrap(), 0, MIB as usize) == pd,
        "volume tessera"
    );

    // kill -9 after more FLUSHed writes, with a volume created since.
    let c = array.create_volume("c", 2 * MIB).unwrap();
    let pc = pattern(4, MIB as usize);
    c.write(MIB, &pc, true).unwrap();
    let pa2 = pattern(5, 64 << 10);
    a.write(MIB, &pa2, false).unwrap();
    array.flush().unwrap();
    drop((a, b, c));
    let array = kill_and_reopen(&devices, array);
    assert!(read(&array.volume("c").unwrap(), MIB, MIB as usize) == pc, "volume c");
    assert!(read(&array.volume("a").unwrap(), 0, MIB as usize) == pa, "volume a");
    assert!(read(&array.volume("a").unwrap(), MIB, 64 << 10) == pa2, "volume a");
    assert!(read(&array.volume("b").unwrap(), MIB, MIB as usize) == pb, "volume b");
    array.check().unwrap();
}

#[test]
fn a_deleted_volume_frees_its_space_and_never_shows_through_a_new_one() {
    let (devices, array) = array();
    let keep = array.create_volume("keep", 2 * MIB).unwrap();
    let gone = array.create_volume("gone", 8 * MIB).unwrap();
    let pk = pattern(7, 2 * MIB as usize);
    keep.write(0, &pk, false).unwrap();
    gone.write(0, &pattern(8, 6 * MIB as usize), false).unwrap();
    array.flush().unwrap();
    let stored_before = array.status().unwrap().stored_bytes;
    array.delete_volume("gone").unwrap();
    let error = gone.read(0, &mut [0u8; 4096]).unwrap_err();
    assert!(matches!(error, ArrayError::VolumeGone { .. }), "{error}");
    assert!(matches!(array.volume("gone"), Err(ArrayError::NoSuchVolume { .. })));
    let stored_after = array.status().unwrap().stored_bytes;
    assert!(
        stored_before - stored_after >= 6 * MIB,
        "deleting freed {} bytes of 6 MiB",
        stored_before - stored_after
    );
    array.check().unwrap();
    // A new volume takes the deleted one's id: it must read zeros, now
    // and after a crash (the deleted records are still in their stripes,
    // newer than the last checkpoint).
    let fresh = array.create_volume("fresh", 8 * MIB).unwrap();
    assert!(
        read(&fresh, 0, 6 * MIB as usize) == vec![0u8; 6 * MIB as usize],
        "expected zeros"
    );
    drop((keep, gone, fresh));
    let array = kill_and_reopen(&devices, array);
    let fresh = array.volume("fresh").unwrap();
    assert!(
        read(&fresh, 0, 6 * MIB as usize) == vec![0u8; 6 * MIB as usize],
        "expected zeros"
    );
    assert_eq!(fresh.allocation(0, 8 * MIB).unwrap(), [(8 * MIB, false)]);
    assert!(
        read(&array.volume("keep").unwrap(), 0, 2 * MIB as usize) == pk,
        "volume keep"
    );
    array.check().unwrap();
    // Its space is reused: the array's whole usable space can be written
    // again through another volume (this fails with NoSpace if not).
    let usable = array.status().unwrap().usable_bytes;
    let filler = array.create_volume("filler", 64 * MIB).unwrap();
    let chunk = pattern(9, MIB as usize);
    let mut written = 0;
    for round in 0..3 {
        for at in 0..(usable / 2 / MIB) {
            filler
                .write(at * MIB, &chunk, false)
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
            written += MIB;
        }
    }
    assert!(written > usable);
    array.flush().unwrap();
    array.check().unwrap();
}

/// The deleted volume's records in a checkpoint's page images: pages are
/// read when first needed after the crash, and every mapping older than
/// the new volume (which took the deleted one's id) must be dropped as
/// it is read in, though the page is the new volume's.
#[test]
fn a_deleted_volume_s_checkpointed_pages_never_show_through_a_new_one() {
    let (devices, array) = array();
    let gone = array.create_volume("gone", 8 * MIB).unwrap();
    gone.write(0, &pattern(11, 6 * MIB as usize), false).unwrap();
    array.flush().unwrap();
    array.checkpoint().unwrap();
    array.delete_volume("gone").unwrap();
    let fresh = array.create_volume("fresh", 8 * MIB).unwrap();
    // Half of one page of the new volume written, the rest of it and the
    // pages after it left as the deleted volume's images hold them.
    let pf = pattern(12, MIB as usize / 2);
    fresh.write(MIB, &pf, false).unwrap();
    fresh.flush().unwrap();
    drop((gone, fresh));
    let array = kill_and_reopen(&devices, array);
    let fresh = array.volume("fresh").unwrap();
    let mut want = vec![0u8; 6 * MIB as usize];
    want[MIB as usize..MIB as usize + pf.len()].copy_from_slice(&pf);
    assert!(
        read(&fresh, 0, 6 * MIB as usize) == want,
        "the deleted volume shows through"
    );
    array.check().unwrap();
}

#[test]
fn shrinking_then_growing_finds_zeros_after_a_crash_too() {
    let (devices, array) = array();
    let v = array.create_volume("v", 4 * MIB).unwrap();
    let p = pattern(11, 4 * MIB as usize);
    v.write(0, &p, false).unwrap();
    array.flush().unwrap();
    array.resize_volume("v", MIB).unwrap();
    assert_eq!(v.size(), MIB);
    assert!(matches!(
        v.read(MIB, &mut [0u8; 4096]),
        Err(ArrayError::OutOfRange { .. })
    ));
    array.resize_volume("v", 4 * MIB).unwrap();
    // What was kept reads back, what was cut off reads as zeros.
    let kept_and_cut = |v: &tessera_array::Volume, when: &str| {
        assert_eq!(v.size(), 4 * MIB, "{when}");
        assert!(read(v, 0, MIB as usize) == p[..MIB as usize], "{when}: the kept MiB");
        assert!(
            read(v, MIB, 3 * MIB as usize) == vec![0u8; 3 * MIB as usize],
            "{when}: the part cut off is not zeros"
        );
    };
    kept_and_cut(&v, "grown again");
    drop(v);
    let array = kill_and_reopen(&devices, array);
    kept_and_cut(&array.volume("v").unwrap(), "after kill -9");
    // The default volume can be resized too, and the size is kept.
    let size = array.logical_bytes();
    array.resize_volume("tessera", size + MIB).unwrap();
    drop(array);
    let array = tessera_array::open(open_list(&devices, &[])).unwrap();
    assert_eq!(array.logical_bytes(), size + MIB);
    assert_eq!(array.status().unwrap().logical_bytes, size + MIB);
}

/// Shrinking a huge, thinly written volume zeroes terabytes: the zeros
/// are recorded, and mapped, only where data was. The map holds a range
/// of zeros as an entry per 2 MiB page, so one record over the whole cut
/// took an entry in each of its 2 million pages (80 MB, seconds under
/// the index's lock), and as many again at every replay of it.
#[test]
fn shrinking_a_huge_thin_volume_maps_zeros_only_where_data_was() {
    const TIB: u64 = 1 << 40;
    let (devices, array) = array();
    let v = array.create_volume("big", 4 * TIB).unwrap();
    let places = [0, TIB + 7 * 4096, 3 * TIB + 5 * MIB];
    for (i, &at) in places.iter().enumerate() {
        v.write(at, &pattern(20 + i as u64, 8192), false).unwrap();
    }
    array.flush().unwrap();
    array.resize_volume("big", 4096).unwrap();
    let mappings = |array: &Array| array.status().unwrap().map_mappings;
    // The first block kept, a zero record over each of the others.
    assert!(mappings(&array) <= 8, "{} mappings after the shrink", mappings(&array));
    array.resize_volume("big", 4 * TIB).unwrap();
    let zeros_where_data_was = |v: &tessera_array::Volume, when: &str| {
        assert_eq!(read(v, 0, 4096), pattern(20, 8192)[..4096], "{when}");
        assert_eq!(read(v, 4096, 4096), vec![0u8; 4096], "{when}");
        for &at in &places[1..] {
            assert_eq!(read(v, at, 8192), vec![0u8; 8192], "{when}: at {at}");
        }
    };
    zeros_where_data_was(&v, "grown again");
    drop(v);
    let array = kill_and_reopen(&devices, array);
    zeros_where_data_was(&array.volume("big").unwrap(), "after kill -9");
    assert!(mappings(&array) <= 8, "{} mappings after replay", mappings(&array));
}

#[test]
fn bad_volume_requests_are_refused_and_change_nothing() {
    let (_devices, array) = array();
    array.create_volume("a", MIB).unwrap();
    let before = array.volumes();
    let refused = [
        array.create_volume("", MIB).err(),
        array.create_volume(".x", MIB).err(),
        array.create_volume("a b", MIB).err(),
        array.create_volume("a", MIB).err(),
        array.create_volume("b", 0).err(),
        array.create_volume("b", 4097).err(),
        array.create_volume("b", (4u64 << 50) + 4096).err(),
        array.resize_volume("nope", MIB).err(),
        array.resize_volume("a", 100).err(),
        array.delete_volume("nope").err(),
        array.delete_volume("tessera").err(),
    ];
    for (i, error) in refused.iter().enumerate() {
        assert!(error.is_some(), "request {i} was taken");
    }
    assert!(matches!(refused[3], Some(ArrayError::VolumeExists { .. })));
    assert!(matches!(refused[4], Some(ArrayError::BadVolumeSize { .. })));
    assert!(matches!(refused[10], Some(ArrayError::DefaultVolume { .. })));
    assert_eq!(array.volumes(), before);
}

#[test]
fn volumes_come_and_go_while_another_is_written_and_checked() {
    let (devices, array) = array();
    let served = array.create_volume("served", 4 * MIB).unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let (served, stop) = (&served, &stop);
        let client = scope.spawn(move || {
            let mut rng = rand::rngs::StdRng::seed_from_u64(21);
            let mut model = vec![0u8; 4 * MIB as usize];
            let mut rounds = 0;
            while !stop.load(Ordering::Relaxed) || rounds < 50 {
                let block = rng.gen_range(0..(4 * MIB / 4096)) as usize;
                let blocks = rng.gen_range(1..=8).min(1024 - block);
                let data = pattern(rounds, blocks * 4096);
                served.write(block as u64 * 4096, &data, false).unwrap();
                model[block * 4096..(block + blocks) * 4096].copy_from_slice(&data);
                let at = rng.gen_range(0..1024) * 4096;
                assert!(read(served, at as u64, 4096) == model[at..at + 4096], "round {rounds}");
                rounds += 1;
                assert!(rounds < 100_000);
            }
            served.flush().unwrap();
            model
        });
        for round in 0..12u64 {
            let name = format!("v{}", round % 3);
            let _ = array.delete_volume(&name);
            let v = array.create_volume(&name, 2 * MIB).unwrap();
            let data = pattern(100 + round, MIB as usize);
            v.write(0, &data, false).unwrap();
            assert!(read(&v, 0, MIB as usize) == data, "read(&v, 0, MIB as usize)");
            array.check().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        let model = client.join().unwrap();
        assert!(
            read(served, 0, 4 * MIB as usize) == model,
            "read(&served, 0, 4 * MIB as usize)"
        );
    });
    drop(served);
    drop(array);
    let array = tessera_array::open(open_list(&devices, &[])).unwrap();
    let names: Vec<String> = array.volumes().into_iter().map(|v| v.name).collect();
    assert_eq!(names, ["tessera", "served", "v0", "v1", "v2"]);
    array.check().unwrap();
}
