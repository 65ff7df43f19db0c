//! Helpers shared by the array's integration tests (each uses some).
#![allow(dead_code)]

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use tessera_array::device::{Device, Faults, MemoryDevice};
use tessera_array::format::{ChunkHeader, Geometry, SECTOR_BYTES};

/// The members as the array names them: m0, m1, ...
pub fn named(devices: &[Arc<MemoryDevice>]) -> Vec<(String, Arc<dyn Device>)> {
    devices
        .iter()
        .enumerate()
        .map(|(i, d)| (format!("m{i}"), d.clone() as Arc<dyn Device>))
        .collect()
}

/// The members as `open` takes them: m0, m1, ..., those in `missing`
/// absent.
pub fn open_list(devices: &[Arc<MemoryDevice>], missing: &[usize]) -> Vec<(String, Option<Arc<dyn Device>>)> {
    named(devices)
        .into_iter()
        .enumerate()
        .map(|(i, (name, device))| (name, (!missing.contains(&i)).then_some(device)))
        .collect()
}

/// kill -9: the members stop taking writes at once; what they were given
/// stays (the page cache), then the array opens again.
pub fn kill_and_reopen(devices: &[Arc<MemoryDevice>], array: tessera_array::Array) -> tessera_array::Array {
    kill_and_reopen_with(devices, array, tessera_array::EngineOptions::default())
}

/// `kill_and_reopen`, opening with `engine`.
pub fn kill_and_reopen_with(
    devices: &[Arc<MemoryDevice>],
    array: tessera_array::Array,
    engine: tessera_array::EngineOptions,
) -> tessera_array::Array {
    kill(devices, array);
    tessera_array::open_with(open_list(devices, &[]), engine).unwrap()
}

/// kill -9, and nothing opened after it.
pub fn kill(devices: &[Arc<MemoryDevice>], array: tessera_array::Array) {
    let dead = Arc::new(AtomicBool::new(true));
    for d in devices {
        d.set_faults(Faults {
            dead: Some(dead.clone()),
            ..Faults::default()
        });
    }
    drop(array);
    for d in devices {
        d.set_faults(Faults::default());
        d.crash(d.pending_writes());
    }
}

/// Every chunk header on `devices` that decodes: (member, offset, header).
pub fn headers(devices: &[Arc<MemoryDevice>], g: &Geometry) -> Vec<(usize, u64, ChunkHeader)> {
    let mut found = Vec::new();
    for (member, device) in devices.iter().enumerate() {
        for row in 0..g.rows {
            let mut sector = vec![0u8; SECTOR_BYTES];
            device.read_at(&mut sector, g.row_offset(row)).unwrap();
            if let Ok(header) = ChunkHeader::decode(&sector, g.checksum) {
                found.push((member, g.row_offset(row), header));
            }
        }
    }
    found
}

/// A 4+2 array of 64 KiB chunks (CRC32C, no compression) on `n` members
/// of `member_bytes` in memory, `bytes` of random data from `seed` written
/// and flushed: (members, array, data). Its walks over every slot (a
/// rebuild's, a heal's, a scrub's) go 7 slots per hold of the index's
/// lock, in many chunks, as on an array of hundreds of millions.
pub fn written_4_plus_2_on(
    n: usize,
    member_bytes: u64,
    seed: u64,
    bytes: usize,
) -> (Vec<Arc<MemoryDevice>>, tessera_array::Array, Vec<u8>) {
    use rand::{Rng, SeedableRng};
    let devices: Vec<_> = (0..n).map(|_| Arc::new(MemoryDevice::new(member_bytes))).collect();
    let engine = tessera_array::EngineOptions {
        slot_walk_chunk: 7,
        ..tessera_array::EngineOptions::default()
    };
    let array = tessera_array::create_with(named(&devices), &tessera_array::CreateOptions::new(4, 2), engine).unwrap();
    let mut data = vec![0u8; bytes];
    rand::rngs::StdRng::seed_from_u64(seed).fill(&mut data[..]);
    array.write(0, &data, false).unwrap();
    array.flush().unwrap();
    (devices, array, data)
}

/// The seeds a seeded test runs: `default`, or `FIRST..END` from the
/// environment variable `var`.
pub fn seeds(var: &str, default: std::ops::Range<u64>) -> std::ops::Range<u64> {
    match std::env::var(var) {
        Ok(range) => {
            let (a, b) = range.split_once("..").unwrap_or_else(|| panic!("{var}=FIRST..END"));
            a.parse().expect("a seed")..b.parse().expect("a seed")
        }
        Err(_) => default,
    }
}
