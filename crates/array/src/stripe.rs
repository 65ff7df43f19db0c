//! Stripes: packing extents into an open stripe, sealing it (summary,
//! parity, Merkle root, headers) and reading it back, reconstructing from
//! any K good chunks when a member is failed or a chunk is corrupt.
//!
//! A sealed stripe is never written again until the volume has moved all
//! of its live data elsewhere and synced: there is no read-modify-write of
//! parity, so no write hole.

use crate::format::{self, ChunkHeader, Geometry, Record, Stream, SECTOR_BYTES};
use tessera_checksum::{merkle, Algorithm, Digest};

/// An open stripe being filled: data from the front of the data area,
/// records for the summary at the back.
pub struct OpenStripe {
    pub slot: u64,
    pub stream: Stream,
    pub data: Vec<u8>,
    pub used: usize,
    pub records: Vec<Record>,
}

impl OpenStripe {
    pub fn new(geometry: &Geometry, slot: u64, stream: Stream) -> OpenStripe {
        OpenStripe::with_buffer(slot, stream, None, geometry)
    }

    /// An open stripe reusing a data-area buffer of a sealed one; its old
    /// bytes are never read (sealing zeroes what was not written).
    pub fn with_buffer(slot: u64, stream: Stream, buffer: Option<Vec<u8>>, geometry: &Geometry) -> OpenStripe {
        let data = match buffer {
            Some(b) if b.len() == geometry.data_area_bytes() => b,
            _ => vec![0; geometry.data_area_bytes()],
        };
        OpenStripe {
            slot,
            stream,
            data,
            used: 0,
            records: Vec::new(),
        }
    }

    /// Whether `bytes` more data and one more record fit.
    pub fn fits(&self, algorithm: Algorithm, bytes: usize) -> bool {
        self.used + bytes + format::summary_bytes(algorithm, self.records.len() + 1) <= self.data.len()
    }

    /// Appends stored bytes; returns their offset in the data area.
    pub fn push_data(&mut self, bytes: &[u8]) -> u32 {
        let offset = self.used;
        self.data[offset..offset + bytes.len()].copy_from_slice(bytes);
        self.used += bytes.len();
        u32::try_from(offset).expect("data areas are under 4 GiB")
    }
}

/// Builds the chunks of a stripe into `chunks`: (K+M) * (4 KiB + C) bytes,
/// chunk j's header then its payload. Writes the summary into the tail of
/// the data area, zeroes the unused middle, computes parity, leaves, root
/// and headers.
pub fn seal(
    geometry: &Geometry,
    codec: &tessera_ec::Codec,
    array_uuid: [u8; 16],
    open: &mut OpenStripe,
    sequence: u64,
    synced_through: u64,
    chunks: &mut Vec<u8>,
) {
    let algorithm = geometry.checksum;
    let summary = format::encode_summary(algorithm, &open.records);
    let area = open.data.len();
    assert!(
        open.used + summary.len() <= area,
        "the summary always fits: push checks"
    );
    open.data[open.used..area - summary.len()].fill(0);
    open.data[area - summary.len()..].copy_from_slice(&summary);
    let summary_digest = algorithm.digest(&summary);

    let c = geometry.chunk_bytes;
    let stride = SECTOR_BYTES + c;
    let width = geometry.width();
    chunks.resize(width * stride, 0);
    for (j, piece) in open.data.chunks(c).enumerate() {
        chunks[j * stride + SECTOR_BYTES..(j + 1) * stride].copy_from_slice(piece);
    }
    {
        let (data_part, parity_part) = chunks.split_at_mut(geometry.data * stride);
        let data: Vec<&[u8]> = data_part.chunks(stride).map(|ch| &ch[SECTOR_BYTES..]).collect();
        let mut parity: Vec<&mut [u8]> = parity_part
            .chunks_mut(stride)
            .map(|ch| &mut ch[SECTOR_BYTES..])
            .collect();
        codec.encode(&data, &mut parity).expect("shapes match the codec");
    }
    let leaves: Vec<Digest> = (0..width)
        .map(|j| merkle::leaf(algorithm, j, &chunks[j * stride + SECTOR_BYTES..(j + 1) * stride]))
        .collect();
    let root = merkle::Tree::from_leaves(algorithm, leaves.clone())
        .expect("a stripe has chunks")
        .root();
    for (j, leaf) in leaves.into_iter().enumerate() {
        let header = ChunkHeader {
            index: j,
            stream: open.stream,
            array_uuid,
            sequence,
            slot: open.slot,
            synced_through,
            summary_bytes: summary.len() as u32,
            data_bytes: open.used as u32,
            leaf,
            root,
            summary_digest,
        };
        chunks[j * stride..j * stride + SECTOR_BYTES].copy_from_slice(&header.encode());
    }
}

/// Pieces of a data-area byte range: (chunk index, offset in chunk, length, offset in range).
pub fn pieces(geometry: &Geometry, offset: usize, len: usize) -> Vec<(usize, usize, usize, usize)> {
    let c = geometry.chunk_bytes;
    let mut out = Vec::new();
    let mut done = 0;
    while done < len {
        let at = offset + done;
        let (chunk, within) = (at / c, at % c);
        let n = (c - within).min(len - done);
        out.push((chunk, within, n, done));
        done += n;
    }
    out
}

/// Reconstructs a stripe's data area from what `read_chunk` returns for
/// each chunk index (header sector + payload, or `None` if unavailable).
/// A chunk counts only if its header is intact, names this slot and
/// sequence, and its payload matches the header's leaf. With `check_all`
/// every chunk is read and checked (scrub, recovery of a possibly torn
/// stripe); otherwise reading stops at K good ones. Returns the data area
/// and the indices of the chunks read that were unavailable or bad.
pub fn reconstruct(
    geometry: &Geometry,
    codec: &tessera_ec::Codec,
    slot: u64,
    sequence: u64,
    check_all: bool,
    read_chunk: impl Fn(usize) -> Option<Vec<u8>>,
) -> Result<(Vec<u8>, Vec<usize>), usize> {
    let algorithm = geometry.checksum;
    let c = geometry.chunk_bytes;
    let width = geometry.width();
    let mut payloads: Vec<Vec<u8>> = Vec::with_capacity(width);
    let mut bad = Vec::new();
    let mut missing = Vec::new();
    for j in 0..width {
        // Without `check_all`, K good chunks are enough: the rest are not read.
        if !check_all && j - bad.len() >= geometry.data {
            missing.push(j);
            payloads.push(vec![0; c]);
            continue;
        }
        let good = read_chunk(j).filter(|chunk| {
            let Ok(header) = ChunkHeader::decode(&chunk[..SECTOR_BYTES], algorithm) else {
                return false;
            };
            header.slot == slot
                && header.sequence == sequence
                && header.index == j
                && merkle::leaf(algorithm, j, &chunk[SECTOR_BYTES..]) == header.leaf
        });
        match good {
            Some(chunk) => payloads.push(chunk[SECTOR_BYTES..].to_vec()),
            None => {
                bad.push(j);
                missing.push(j);
                payloads.push(vec![0; c]);
            }
        }
    }
    let good = width - missing.len();
    if good < geometry.data {
        return Err(good);
    }
    if missing.iter().any(|&j| j < geometry.data) {
        let mut shards: Vec<&mut [u8]> = payloads.iter_mut().map(|p| p.as_mut_slice()).collect();
        codec
            .reconstruct_data(&mut shards, &missing)
            .expect("at least K good chunks decode");
    }
    let mut area = Vec::with_capacity(geometry.data_area_bytes());
    for payload in &payloads[..geometry.data] {
        area.extend_from_slice(payload);
    }
    Ok((area, bad))
}
