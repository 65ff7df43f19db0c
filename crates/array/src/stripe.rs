//! Stripes: packing extents into an open stripe, sealing it (summary,
//! parity, Merkle root, headers) and reading it back, reconstructing from
//! any K good chunks when a member is failed or a chunk is corrupt.
//!
//! A sealed stripe is never written again until the volume has moved all
//! of its live data elsewhere and synced: there is no read-modify-write of
//! parity, so no write hole.

use crate::device::AlignedBuf;
use crate::format::{self, ChunkHeader, Geometry, Record, Stream, SECTOR_BYTES};
use tessera_checksum::{merkle, Algorithm, Digest};

/// An open stripe being filled: data from the front of the data area,
/// records for the summary at the back.
pub struct OpenStripe {
    pub slot: u64,
    pub stream: Stream,
    /// Aligned, so its chunks go to the members with direct I/O.
    pub data: AlignedBuf,
    pub used: usize,
    pub records: Vec<Record>,
}

impl OpenStripe {
    /// An open stripe, reusing the data-area buffer of a sealed one if
    /// given; its old bytes are never read (sealing zeroes what was not
    /// written).
    pub fn new(slot: u64, stream: Stream, buffer: Option<AlignedBuf>, geometry: &Geometry) -> OpenStripe {
        let mut data = buffer.unwrap_or_default();
        data.resize(geometry.data_area_bytes());
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

/// What sealing records about a stripe before its chunks are built.
#[derive(Clone, Debug)]
pub struct StripeInfo {
    pub slot: u64,
    pub stream: Stream,
    pub sequence: u64,
    pub synced_through: u64,
    pub summary_bytes: u32,
    pub data_bytes: u32,
    pub summary_digest: Digest,
}

/// Closes an open stripe's data area: the summary goes into its tail and
/// the unused middle is zeroed. The area is final after this.
pub fn finish(geometry: &Geometry, open: &mut OpenStripe, sequence: u64, synced_through: u64) -> StripeInfo {
    let algorithm = geometry.checksum;
    let summary = format::encode_summary(algorithm, &open.records);
    let area = open.data.len();
    assert!(
        open.used + summary.len() <= area,
        "the summary always fits: push checks"
    );
    open.data[open.used..area - summary.len()].fill(0);
    open.data[area - summary.len()..].copy_from_slice(&summary);
    StripeInfo {
        slot: open.slot,
        stream: open.stream,
        sequence,
        synced_through,
        summary_bytes: summary.len() as u32,
        data_bytes: open.used as u32,
        summary_digest: algorithm.digest(&summary),
    }
}

/// A finished stripe's headers and parity, built for writing; the data
/// payloads are the data area itself, so it is not copied.
#[derive(Default)]
pub struct Built {
    /// K+M header sectors.
    pub headers: AlignedBuf,
    /// M parity payloads of C bytes.
    pub parity: AlignedBuf,
}

impl Built {
    /// Chunk j's header and payload.
    pub fn chunk<'a>(&'a self, geometry: &Geometry, area: &'a [u8], j: usize) -> (&'a [u8], &'a [u8]) {
        let c = geometry.chunk_bytes;
        let header = &self.headers[j * SECTOR_BYTES..(j + 1) * SECTOR_BYTES];
        let payload = if j < geometry.data {
            &area[j * c..(j + 1) * c]
        } else {
            &self.parity[(j - geometry.data) * c..(j - geometry.data + 1) * c]
        };
        (header, payload)
    }
}

/// Computes a finished stripe's parity, leaves, root and headers into `out`
/// (whose buffers are reused from stripe to stripe).
pub fn build(
    geometry: &Geometry,
    codec: &tessera_ec::Codec,
    array_uuid: [u8; 16],
    area: &[u8],
    info: &StripeInfo,
    out: &mut Built,
) {
    let algorithm = geometry.checksum;
    let c = geometry.chunk_bytes;
    let width = geometry.width();
    out.headers.resize(width * SECTOR_BYTES);
    out.parity.resize(geometry.parity * c);
    {
        let data: Vec<&[u8]> = area.chunks(c).collect();
        let mut parity: Vec<&mut [u8]> = out.parity.chunks_mut(c).collect();
        codec.encode(&data, &mut parity).expect("shapes match the codec");
    }
    let leaves: Vec<Digest> = (0..width)
        .map(|j| merkle::leaf(algorithm, j, out.chunk(geometry, area, j).1))
        .collect();
    let root = merkle::Tree::from_leaves(algorithm, leaves.clone())
        .expect("a stripe has chunks")
        .root();
    for (j, leaf) in leaves.into_iter().enumerate() {
        let header = ChunkHeader {
            index: j,
            stream: info.stream,
            array_uuid,
            sequence: info.sequence,
            slot: info.slot,
            synced_through: info.synced_through,
            summary_bytes: info.summary_bytes,
            data_bytes: info.data_bytes,
            leaf,
            root,
            summary_digest: info.summary_digest,
        };
        out.headers[j * SECTOR_BYTES..(j + 1) * SECTOR_BYTES].copy_from_slice(&header.encode());
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
/// sequence, and its payload matches the header's leaf. `area` is a buffer
/// to fill (any contents). With `check_all`
/// every chunk is read and checked (scrub, recovery of a possibly torn
/// stripe); otherwise reading stops at K good ones. Returns the data area
/// and the indices of the chunks read that were unavailable or bad.
pub fn reconstruct(
    geometry: &Geometry,
    codec: &tessera_ec::Codec,
    slot: u64,
    sequence: u64,
    check_all: bool,
    mut area: AlignedBuf,
    read_chunk: impl Fn(usize, &mut [u8], &mut [u8]) -> bool,
) -> Result<(AlignedBuf, Vec<usize>), usize> {
    let algorithm = geometry.checksum;
    let c = geometry.chunk_bytes;
    let width = geometry.width();
    // Data payloads are read straight into the area (a recycled buffer is
    // fine: every byte is read or rebuilt); parity beside it. All aligned,
    // so a chunk's header and payload come with one direct read.
    area.resize(geometry.data_area_bytes());
    let mut parity = AlignedBuf::zeroed(geometry.parity * c);
    let mut header = AlignedBuf::zeroed(SECTOR_BYTES);
    let mut bad = Vec::new();
    let mut missing = Vec::new();
    for j in 0..width {
        // Without `check_all`, K good chunks are enough: the rest are not read.
        if !check_all && j - missing.len() >= geometry.data {
            missing.push(j);
            continue;
        }
        let payload = if j < geometry.data {
            &mut area[j * c..(j + 1) * c]
        } else {
            &mut parity[(j - geometry.data) * c..(j - geometry.data + 1) * c]
        };
        let good = read_chunk(j, &mut header, payload)
            && ChunkHeader::decode(&header, algorithm).is_ok_and(|h| {
                h.slot == slot
                    && h.sequence == sequence
                    && h.index == j
                    && merkle::leaf(algorithm, j, payload) == h.leaf
            });
        if !good {
            bad.push(j);
            missing.push(j);
        }
    }
    let good = width - missing.len();
    if good < geometry.data {
        return Err(good);
    }
    if missing.iter().any(|&j| j < geometry.data) {
        let mut shards: Vec<&mut [u8]> = area.chunks_mut(c).chain(parity.chunks_mut(c)).collect();
        codec
            .reconstruct_data(&mut shards, &missing)
            .expect("at least K good chunks decode");
    }
    Ok((area, bad))
}
