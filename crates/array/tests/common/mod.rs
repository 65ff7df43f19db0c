//! Helpers shared by the array's integration tests (each uses some).
#![allow(dead_code)]

use std::sync::Arc;
use tessera_array::device::{Device, MemoryDevice};
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
