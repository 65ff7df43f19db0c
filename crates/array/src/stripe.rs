//! Stripes: packing extents into an open stripe, sealing it (summary,
//! parity, Merkle leaves and root, headers) and reading it back whole,
//! rebuilding from any K good chunks.
//!
//! # Guarantees
//!
//! - A sealed stripe is never written again until the volume has moved all
//!   of its live data elsewhere and synced: there is no read-modify-write
//!   of parity, so no write hole.
//! - A rebuilt stripe is returned only if every chunk it was built from
//!   matches the leaf in its own header and the leaves of all K+M chunks
//!   (the rebuilt ones included) hash to the root the headers carry. A
//!   chunk that passes its own checksum but does not belong to the stripe
//!   (a stale or misdirected copy whose header was rewritten with it) is
//!   found by the root, set aside, and rebuilt from the others.

use crate::device::AlignedBuf;
use crate::format::{self, ChunkHeader, Geometry, Record, Stream, BLOCK_BYTES, SECTOR_BYTES};
use tessera_accel::{Accelerator, Leaves, ReconstructJob, SealJob, Shape};
use tessera_checksum::{Algorithm, Digest};

/// The accelerator's view of a geometry.
pub fn shape(geometry: &Geometry) -> Shape {
    Shape {
        data: geometry.data,
        parity: geometry.parity,
        chunk_bytes: geometry.chunk_bytes,
        checksum: geometry.checksum,
    }
}

/// An open stripe being filled: data from the front of the data area,
/// records for the summary at the back.
pub struct OpenStripe {
    pub slot: u64,
    pub stream: Stream,
    /// Aligned, so its chunks go to the members with direct I/O.
    pub data: AlignedBuf,
    pub used: usize,
    pub records: Vec<Record>,
    /// Bytes the summary of `records` takes.
    summary_bytes: usize,
    /// Records from this index on are not in the map yet (their versions
    /// are given when they are mapped).
    pub mapped: usize,
    /// Records before this index are in the intent log.
    pub logged: usize,
    /// The sequence this stripe is sealed as (0 until it is): log blocks
    /// holding its records are dead once that sequence is synced.
    pub sealed_as: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// What a raw extent's start is rounded up to in the data area, so that a
/// read of its blocks is aligned for direct I/O.
const RAW_ALIGN: usize = BLOCK_BYTES;

impl OpenStripe {
    /// An open stripe, reusing a data-area buffer if given; its old bytes
    /// are never read (sealing zeroes what was not written).
    /// An open stripe filling `data`, a data area of `geometry`'s size.
    pub fn new(slot: u64, stream: Stream, data: AlignedBuf, geometry: &Geometry) -> OpenStripe {
        assert_eq!(data.len(), geometry.data_area_bytes(), "a whole data area");
        OpenStripe {
            slot,
            stream,
            data,
            used: 0,
            records: Vec::new(),
            summary_bytes: format::SUMMARY_HEADER_BYTES,
            mapped: 0,
            logged: 0,
            sealed_as: Default::default(),
        }
    }

    /// Where data of `stored` bytes would start.
    fn start(&self, raw: bool) -> usize {
        if raw {
            self.used.next_multiple_of(RAW_ALIGN)
        } else {
            self.used
        }
    }

    /// Whether a record of `record_bytes` with `stored` bytes of data fits.
    pub fn fits(&self, raw: bool, stored: usize, record_bytes: usize) -> bool {
        self.start(raw) + stored + self.summary_bytes + record_bytes <= self.data.len()
    }

    /// Blocks of a raw extent (each with its CRC) that fit, at most `want`.
    pub fn raw_blocks_that_fit(&self, algorithm: Algorithm, want: usize) -> usize {
        let fixed = self.start(true) + self.summary_bytes + format::data_record_bytes(algorithm, 0);
        let room = self.data.len().saturating_sub(fixed);
        (room / (BLOCK_BYTES + 4)).min(want)
    }

    /// Appends stored bytes (a raw extent at a block boundary); returns
    /// their offset in the data area.
    pub fn push_data(&mut self, bytes: &[u8], raw: bool) -> u32 {
        let offset = self.start(raw);
        self.data[self.used..offset].fill(0);
        self.data[offset..offset + bytes.len()].copy_from_slice(bytes);
        self.used = offset + bytes.len();
        u32::try_from(offset).expect("data areas are under 4 GiB")
    }

    pub fn push_record(&mut self, algorithm: Algorithm, record: Record) {
        self.summary_bytes += format::record_bytes(algorithm, &record);
        assert!(
            self.used + self.summary_bytes <= self.data.len(),
            "push checks the room first"
        );
        self.records.push(record);
    }

    /// Bytes of the data area neither data nor summary takes yet: what
    /// sealing it now would leave unused.
    pub fn unused_bytes(&self) -> usize {
        self.data.len() - self.used - self.summary_bytes
    }

    /// Whether the stripe holds anything to write.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

/// What sealing records about a stripe before its chunks are built.
#[derive(Clone, Debug)]
pub struct StripeInfo {
    pub slot: u64,
    pub stream: Stream,
    pub sequence: u64,
    pub synced_through: u64,
    /// The opening that sealed it (`ChunkHeader::opening`).
    pub opening: u64,
    pub summary_bytes: u32,
    pub data_bytes: u32,
    pub summary_digest: Digest,
}

/// Closes an open stripe's data area: the summary goes into its tail and
/// the unused middle is zeroed. The area is final after this.
pub fn finish(
    geometry: &Geometry,
    open: &mut OpenStripe,
    sequence: u64,
    synced_through: u64,
    opening: u64,
) -> StripeInfo {
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
        opening,
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
    /// Buffers sized for `geometry` (reusing these if they are), the
    /// parity made in the accelerator's `memory` if it lends any.
    pub fn sized(
        mut self,
        geometry: &Geometry,
        memory: Option<&std::sync::Arc<dyn tessera_accel::HostMemory>>,
    ) -> Built {
        self.headers.resize(geometry.width() * SECTOR_BYTES);
        let parity = geometry.parity * geometry.chunk_bytes;
        if self.parity.len() != parity {
            self.parity = AlignedBuf::zeroed_in(memory, parity);
        }
        self
    }

    /// Chunk j's header and payload.
    pub fn chunk<'a>(&'a self, geometry: &Geometry, area: &'a [u8], j: usize) -> (&'a [u8], &'a [u8]) {
        let header = &self.headers[j * SECTOR_BYTES..(j + 1) * SECTOR_BYTES];
        (header, payload(geometry, area, &self.parity, j))
    }

    /// Writes every chunk's header from the stripe's leaves and root.
    pub fn write_headers(&mut self, array_uuid: [u8; 16], info: &StripeInfo, leaves: &Leaves) {
        for (j, leaf) in leaves.leaves.iter().enumerate() {
            let header = ChunkHeader {
                index: j,
                stream: info.stream,
                array_uuid,
                sequence: info.sequence,
                slot: info.slot,
                synced_through: info.synced_through,
                summary_bytes: info.summary_bytes,
                data_bytes: info.data_bytes,
                leaf: *leaf,
                root: leaves.root,
                summary_digest: info.summary_digest,
                opening: info.opening,
            };
            self.headers[j * SECTOR_BYTES..(j + 1) * SECTOR_BYTES].copy_from_slice(&header.encode());
        }
    }
}

/// Chunk j's payload: a data chunk of `area` or a parity chunk of `parity`.
fn payload<'a>(geometry: &Geometry, area: &'a [u8], parity: &'a [u8], j: usize) -> &'a [u8] {
    let c = geometry.chunk_bytes;
    if j < geometry.data {
        &area[j * c..(j + 1) * c]
    } else {
        &parity[(j - geometry.data) * c..(j - geometry.data + 1) * c]
    }
}

/// Seals finished stripes in one batch through the accelerator: parity,
/// leaves, root and headers into each `Built`.
pub fn build(
    geometry: &Geometry,
    accel: &dyn Accelerator,
    array_uuid: [u8; 16],
    stripes: &mut [(&[u8], &StripeInfo, &mut Built)],
) -> Result<(), tessera_accel::AccelError> {
    let mut jobs: Vec<SealJob> = stripes
        .iter_mut()
        .map(|(area, _, built)| SealJob {
            data: area,
            parity: &mut built.parity,
        })
        .collect();
    let results = accel.seal(&shape(geometry), &mut jobs)?;
    drop(jobs);
    for ((_, info, built), leaves) in stripes.iter_mut().zip(results) {
        built.write_headers(array_uuid, info, &leaves);
    }
    Ok(())
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

/// A stripe read back whole: its data area and parity, the chunks found
/// bad (unreadable, stale, corrupt, or not belonging), every chunk's leaf
/// and the root, and one of its good headers (to rebuild the others from).
pub struct Rebuilt {
    pub area: AlignedBuf,
    pub parity: AlignedBuf,
    pub bad: Vec<usize>,
    pub leaves: Leaves,
    pub header: ChunkHeader,
}

impl Rebuilt {
    /// Chunk j's header and payload as they should be on its member.
    pub fn chunk(&self, geometry: &Geometry, j: usize) -> (Vec<u8>, &[u8]) {
        let mut header = self.header.clone();
        header.index = j;
        header.leaf = self.leaves.leaves[j];
        (header.encode(), payload(geometry, &self.area, &self.parity, j))
    }
}

/// Which stripe a rebuild is of: the one in `slot` with `sequence`, of
/// the array `array_uuid`; chunks whose headers say otherwise are not it.
#[derive(Clone, Copy, Debug)]
pub struct Which {
    pub slot: u64,
    pub sequence: u64,
    pub array_uuid: [u8; 16],
}

/// Why a stripe could not be rebuilt.
#[derive(Debug)]
pub enum RebuildError {
    /// Fewer than K chunks could be read with headers of this stripe.
    TooFewChunks {
        good: usize,
    },
    /// K or more were read, but no K of them hash to the stripe's root.
    RootMismatch,
    Accel(tessera_accel::AccelError),
}

/// Reads stripe `which` back whole through `read` (which reads a batch of
/// chunks, header sector and payload each, marking those it could),
/// rebuilding what is missing or bad.
/// With `check_all`, every chunk is read and checked (scrub, recovery of a
/// possibly torn stripe); otherwise reading stops at K.
pub fn reconstruct(
    geometry: &Geometry,
    accel: &dyn Accelerator,
    Which {
        slot,
        sequence,
        array_uuid,
    }: Which,
    check_all: bool,
    mut area: AlignedBuf,
    available: impl Fn(usize) -> bool,
    read: impl Fn(&mut [ChunkRead<'_>]),
) -> Result<Rebuilt, RebuildError> {
    let (k, width) = (geometry.data, geometry.width());
    let algorithm = geometry.checksum;
    area.resize(geometry.data_area_bytes());
    let mut parity = AlignedBuf::zeroed(geometry.parity * geometry.chunk_bytes);
    // Per chunk: its header once read and plausible; whether it was tried.
    let mut headers: Vec<Option<ChunkHeader>> = vec![None; width];
    let mut tried = vec![false; width];
    let mut bad = Vec::new();
    let plausible = |h: &ChunkHeader, j: usize| {
        h.slot == slot && h.sequence == sequence && h.index == j && h.array_uuid == array_uuid
    };
    // Each round either succeeds, fails, or sets aside at least one chunk.
    for _ in 0..=2 * width {
        // The chunks still wanted, on available members first.
        let have = headers.iter().filter(|h| h.is_some()).count();
        let mut wanted: Vec<usize> = (0..width).filter(|&j| !tried[j]).collect();
        wanted.sort_by_key(|&j| !available(j));
        if !check_all {
            wanted.truncate(k.saturating_sub(have));
        }
        for (j, header) in read_chunks(geometry, &mut area, &mut parity, &wanted, &read) {
            tried[j] = true;
            match header
                .and_then(|sector| ChunkHeader::decode(&sector, algorithm).ok())
                .filter(|h| plausible(h, j))
            {
                Some(h) => headers[j] = Some(h),
                None => bad.push(j),
            }
        }
        let present_count = headers.iter().filter(|h| h.is_some()).count();
        if present_count < k && tried.iter().any(|t| !t) {
            continue;
        }
        let present: Vec<usize> = (0..width).filter(|&j| headers[j].is_some()).collect();
        if present.len() < k {
            return Err(RebuildError::TooFewChunks { good: present.len() });
        }
        // The root most headers carry; chunks carrying another do not belong.
        let root = majority(present.iter().map(|&j| headers[j].as_ref().expect("present").root));
        let odd: Vec<usize> = present
            .iter()
            .copied()
            .filter(|&j| headers[j].as_ref().expect("present").root != root)
            .collect();
        if !odd.is_empty() {
            set_aside(&mut headers, &mut bad, &odd);
            continue;
        }
        let missing: Vec<usize> = (0..width).filter(|&j| headers[j].is_none()).collect();
        let leaves = rebuild(geometry, accel, &mut area, &mut parity, &missing)?;
        let corrupt: Vec<usize> = present
            .iter()
            .copied()
            .filter(|&j| leaves.leaves[j] != headers[j].as_ref().expect("present").leaf)
            .collect();
        if !corrupt.is_empty() {
            set_aside(&mut headers, &mut bad, &corrupt);
            continue;
        }
        if leaves.root == root {
            return Ok(done(area, parity, bad, leaves, headers));
        }
        // Every chunk matches its own header, yet together they do not make
        // the root: one or two of them are copies that do not belong. Read
        // the rest and find which to leave out.
        return find_outsiders(geometry, accel, area, parity, headers, tried, bad, root, &read);
    }
    Err(RebuildError::RootMismatch)
}

/// One chunk to read: its index in the stripe, and where its header
/// sector and payload go; `ok` says whether the read succeeded.
pub struct ChunkRead<'a> {
    pub index: usize,
    pub header: &'a mut [u8],
    pub payload: &'a mut [u8],
    pub ok: bool,
}

/// Reads chunks `wanted` (header sectors and payloads into `area` and
/// `parity`) with `read`, which may read them in parallel; returns each
/// chunk's header sector, or `None` where the read failed.
fn read_chunks(
    geometry: &Geometry,
    area: &mut [u8],
    parity: &mut [u8],
    wanted: &[usize],
    read: &impl Fn(&mut [ChunkRead<'_>]),
) -> Vec<(usize, Option<AlignedBuf>)> {
    let c = geometry.chunk_bytes;
    let mut payloads: Vec<Option<&mut [u8]>> = area.chunks_mut(c).chain(parity.chunks_mut(c)).map(Some).collect();
    let mut sectors: Vec<AlignedBuf> = wanted.iter().map(|_| AlignedBuf::zeroed(SECTOR_BYTES)).collect();
    let mut reads: Vec<ChunkRead> = wanted
        .iter()
        .zip(sectors.iter_mut())
        .map(|(&j, sector)| ChunkRead {
            index: j,
            header: sector,
            payload: payloads[j].take().expect("each chunk is wanted once"),
            ok: false,
        })
        .collect();
    read(&mut reads);
    let ok: Vec<bool> = reads.iter().map(|r| r.ok).collect();
    drop(reads);
    wanted
        .iter()
        .zip(sectors)
        .zip(ok)
        .map(|((&j, sector), ok)| (j, ok.then_some(sector)))
        .collect()
}

fn majority(roots: impl Iterator<Item = Digest>) -> Digest {
    let roots: Vec<Digest> = roots.collect();
    *roots
        .iter()
        .max_by_key(|r| roots.iter().filter(|s| s == r).count())
        .expect("at least K chunks are present")
}

fn set_aside(headers: &mut [Option<ChunkHeader>], bad: &mut Vec<usize>, chunks: &[usize]) {
    for &j in chunks {
        headers[j] = None;
        bad.push(j);
    }
}

/// Rebuilds the `missing` chunks of the stripe held in `area` and `parity`
/// and returns every leaf and the root.
fn rebuild(
    geometry: &Geometry,
    accel: &dyn Accelerator,
    area: &mut AlignedBuf,
    parity: &mut AlignedBuf,
    missing: &[usize],
) -> Result<Leaves, RebuildError> {
    let c = geometry.chunk_bytes;
    let mut jobs = [ReconstructJob {
        chunks: area.chunks_mut(c).chain(parity.chunks_mut(c)).collect(),
        missing: missing.to_vec(),
    }];
    let mut results = accel
        .reconstruct(&shape(geometry), &mut jobs)
        .map_err(RebuildError::Accel)?;
    Ok(results.remove(0))
}

fn done(
    area: AlignedBuf,
    parity: AlignedBuf,
    mut bad: Vec<usize>,
    leaves: Leaves,
    headers: Vec<Option<ChunkHeader>>,
) -> Rebuilt {
    bad.sort_unstable();
    bad.dedup();
    let header = headers.into_iter().flatten().next().expect("K chunks are present");
    Rebuilt {
        area,
        parity,
        bad,
        leaves,
        header,
    }
}

/// The rare path: chunks agree with their headers but not with the root.
/// Reads every chunk, then tries leaving out each one (and each pair,
/// where the parity allows) until the rest rebuild to the root.
#[allow(clippy::too_many_arguments)]
fn find_outsiders(
    geometry: &Geometry,
    accel: &dyn Accelerator,
    mut area: AlignedBuf,
    mut parity: AlignedBuf,
    mut headers: Vec<Option<ChunkHeader>>,
    tried: Vec<bool>,
    mut bad: Vec<usize>,
    root: Digest,
    read: &impl Fn(&mut [ChunkRead<'_>]),
) -> Result<Rebuilt, RebuildError> {
    let (k, width) = (geometry.data, geometry.width());
    let template = headers.iter().flatten().next().expect("K chunks are present").clone();
    let belongs = |h: &ChunkHeader, j: usize| {
        h.index == j
            && (h.slot, h.sequence, h.array_uuid, h.root)
                == (template.slot, template.sequence, template.array_uuid, root)
    };
    // The last rebuild overwrote the chunks not read; read them now.
    let untried: Vec<usize> = (0..width).filter(|&j| !tried[j]).collect();
    for (j, sector) in read_chunks(geometry, &mut area, &mut parity, &untried, read) {
        let header = sector
            .and_then(|sector| ChunkHeader::decode(&sector, geometry.checksum).ok())
            .filter(|h| belongs(h, j));
        match header {
            Some(h) => headers[j] = Some(h),
            None => bad.push(j),
        }
    }
    let present: Vec<usize> = (0..width).filter(|&j| headers[j].is_some()).collect();
    let spare = present.len().saturating_sub(k);
    let mut candidates: Vec<Vec<usize>> = present.iter().map(|&j| vec![j]).collect();
    if spare >= 2 {
        for (a, &x) in present.iter().enumerate() {
            candidates.extend(present[a + 1..].iter().map(|&y| vec![x, y]));
        }
    }
    let (read_area, read_parity) = (area.clone(), parity.clone());
    for leave_out in candidates.into_iter().filter(|s| s.len() <= spare) {
        area.copy_from_slice(&read_area);
        parity.copy_from_slice(&read_parity);
        let missing: Vec<usize> = (0..width)
            .filter(|&j| headers[j].is_none() || leave_out.contains(&j))
            .collect();
        let leaves = rebuild(geometry, accel, &mut area, &mut parity, &missing)?;
        let consistent = present
            .iter()
            .filter(|j| !leave_out.contains(j))
            .all(|&j| leaves.leaves[j] == headers[j].as_ref().expect("present").leaf);
        if consistent && leaves.root == root {
            set_aside(&mut headers, &mut bad, &leave_out);
            return Ok(done(area, parity, bad, leaves, headers));
        }
    }
    Err(RebuildError::RootMismatch)
}
