//! The array's on-disk decoders on arbitrary bytes, as corrupt members
//! would give them (docs/FORMAT.md): each must return a value or a typed
//! error, never panic, and never allocate for a count it has not checked.
//!
//! The first byte picks a decoder, the second an array's shape (checksum,
//! chunk size, K+M), the rest is the input. Formats whose checksum the
//! decoder itself checks (superblocks, chunk headers, log blocks, the
//! checkpoint directory) are sealed here first, so the fields behind the
//! checksum are reached, as they would be by a bug that wrote a wrong field
//! with a right checksum. Map pages are also made from the input as real
//! pages (mappings inserted, the page encoded), and stripe summaries, slot
//! pages and directory pages with their deltas by their encoders, then a
//! few bytes changed, so the decoders meet images that are valid but for
//! a few bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tessera_array::device::SECTOR_BYTES;
use tessera_array::format::volume::VolumeTable;
use tessera_array::format::{
    self, BlockCrcs, Checkpoint, ChunkHeader, Extent, Geometry, ImagePiece, LogDeviceHeader, MapImages, MapStripe,
    PageImage, Record, SlotEntry, SlotPageImage, Superblock, CHECKPOINT_DIRECTORY_MAGIC, CHUNK_MAGIC, FORMAT_VERSION,
    LOG_ALIGN, LOG_DEVICE_MAGIC, LOG_MAGIC, SUPERBLOCK_MAGIC,
};
use tessera_array::map::{Map, Rule, Target};
use tessera_checksum::{Algorithm, Digest};
use tessera_compress::Codec;

fn geometry(pick: u8) -> Geometry {
    let checksum = [
        Algorithm::Crc32c,
        Algorithm::Xxh3,
        Algorithm::Blake3,
        Algorithm::Sha256,
        Algorithm::Sha3_512,
    ][usize::from(pick % 5)];
    let (data, parity, chunk_bytes) =
        [(4, 2, 65536), (8, 2, 4096), (1, 1, 16 << 20), (92, 8, 65536)][usize::from(pick / 5 % 4)];
    let members = data + parity + usize::from(pick / 20 % 2);
    let rows = 1 << (8 + u32::from(pick / 40 % 4) * 4);
    Geometry {
        data,
        parity,
        members,
        chunk_bytes,
        rows,
        member_bytes: format::DATA_START + rows * (chunk_bytes as u64 + SECTOR_BYTES as u64) + (1 << 20),
        logical_bytes: 1 << 40,
        checksum,
        compression: pick.is_multiple_of(3).then_some(Codec::Zstd { level: 3 }),
        log_bytes: 1 << 20,
        log_devices: 0,
        log_device_bytes: 0,
    }
}

/// `body` as one sector behind `magic` and this build's version, sealed.
fn sector(magic: &[u8; 8], body: &[u8]) -> Vec<u8> {
    let mut s = vec![0u8; SECTOR_BYTES];
    let n = body.len().min(SECTOR_BYTES - 12);
    s[12..12 + n].copy_from_slice(&body[..n]);
    s[..8].copy_from_slice(magic);
    s[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    format::seal_sector(&mut s);
    s
}

/// A little-endian reader over the input that gives zeros once it runs out.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn take(&mut self, n: usize) -> u64 {
        let mut v = 0u64;
        for i in 0..n {
            if let Some((&b, rest)) = self.0.split_first() {
                v |= u64::from(b) << (8 * i);
                self.0 = rest;
            }
        }
        v
    }
}

/// A map page made of mappings the input names, encoded; then some of its
/// bytes changed as the input says; then decoded, alone and with the rest
/// of the input as a delta over it.
fn made_page(g: &Geometry, input: &[u8]) {
    let mut input = Input(input);
    let mut map = Map::new(usize::MAX);
    let page = input.take(1) % 4;
    let base = page * tessera_array::limits::MAP_PAGE_BLOCKS;
    let records = input.take(1) % 40;
    for version in 1..=records {
        let lba = base + input.take(2) % tessera_array::limits::MAP_PAGE_BLOCKS;
        let blocks = (input.take(1) % 16 + 1) as u32;
        let kind = input.take(1);
        let slot = input.take(2) % g.slot_count().max(1);
        let target = if kind % 4 == 0 {
            Target::Zero { slot }
        } else {
            let codec = match kind % 4 {
                1 => Some(Codec::Lz4),
                2 => Some(Codec::Zstd { level: 0 }),
                _ => None,
            };
            let block_crcs: BlockCrcs = match codec {
                None => (0..blocks).map(|i| input.take(1) as u32 * (i + 1)).collect(),
                Some(_) => BlockCrcs::new(),
            };
            let digest_bytes: Vec<u8> = (0..g.checksum.digest_bytes()).map(|_| input.take(1) as u8).collect();
            Target::Data {
                extent: Arc::new(Extent {
                    slot,
                    offset: (input.take(2) as u32) * 64,
                    stored_bytes: blocks * 4096,
                    blocks,
                    codec,
                    digest: Digest::from_bytes(&digest_bytes),
                    block_crcs,
                }),
                skip: 0,
            }
        };
        map.insert(lba, blocks, version, &target, Rule::Always);
    }
    let mut image = Vec::new();
    if !map.encode_page(page, &mut image) {
        return;
    }
    mutate(&mut image, &mut input);
    let _ = Map::decode_image(&image, g);
    let _ = Map::decode_with_delta(&image, input.0, g);
}

/// Up to seven bytes of `bytes` changed where the input says.
fn mutate(bytes: &mut [u8], input: &mut Input) {
    for _ in 0..input.take(1) % 8 {
        let at = input.take(2) as usize;
        let value = input.take(1) as u8;
        if !bytes.is_empty() {
            let n = bytes.len();
            bytes[at % n] = value;
        }
    }
}

/// Slot table entries of slot page `page` the input names, in order.
fn slot_entries(g: &Geometry, page: u64, input: &mut Input) -> Vec<SlotEntry> {
    let per_page = tessera_array::limits::SLOT_TABLE_PAGE_SLOTS;
    let mut slots: Vec<u64> = (0..input.take(1) % 24)
        .map(|_| page * per_page + input.take(2) % per_page)
        .filter(|&s| s < g.slot_count())
        .collect();
    slots.sort_unstable();
    slots.dedup();
    slots
        .into_iter()
        .map(|slot| SlotEntry {
            slot,
            sequence: input.take(3),
            live: input.take(3),
            pieces: input.take(2) as u32,
        })
        .collect()
}

/// A piece of an image in one of `stripes` (which the encoder needs: a
/// root names the map stripes its images lie in).
fn image_piece(stripes: &[u64], input: &mut Input) -> ImagePiece {
    ImagePiece {
        slot: stripes[input.take(1) as usize % stripes.len()],
        offset: input.take(3) as u32,
        bytes: input.take(2) as u32 + 1,
    }
}

/// An image (with a delta over it, as the input says) in `stripes`.
fn page_image(g: &Geometry, stripes: &[u64], input: &mut Input) -> PageImage {
    let mut digest = || {
        Digest::from_bytes(
            &(0..g.checksum.digest_bytes())
                .map(|_| input.take(1) as u8)
                .collect::<Vec<_>>(),
        )
    };
    let (d1, d2) = (digest(), digest());
    let pieces: Vec<ImagePiece> = (0..input.take(1) % 3 + 1)
        .map(|_| image_piece(stripes, input))
        .collect();
    let mut image = PageImage::whole(pieces.iter().map(|p| p.bytes).sum(), d1, pieces);
    if input.take(1).is_multiple_of(3) {
        let piece = image_piece(stripes, input);
        image.delta = Some(Arc::new(PageImage::whole(piece.bytes, d2, vec![piece])));
    }
    image
}

/// A checkpoint's root made of what the input names: map stripes, the
/// directory pages' and slot pages' images in them, the stripes sealed
/// since, the window, the volumes' counts.
fn made_checkpoint(g: &Geometry, input: &mut Input) -> Checkpoint {
    let mut images = MapImages::default();
    for _ in 0..input.take(1) % 6 + 1 {
        let stripe = MapStripe {
            sequence: input.take(3),
            live: input.take(3),
        };
        images.stripes.insert(input.take(3) % g.slot_count().max(1), stripe);
    }
    let stripes: Vec<u64> = images.stripes.keys().copied().collect();
    for _ in 0..input.take(1) % 6 {
        let image = page_image(g, &stripes, input);
        if image.delta.is_some() {
            images.dir_deltas.insert(input.take(1), input.take(2) as u32);
        }
        images.dirs.insert(input.take(2), Arc::new(image));
    }
    for _ in 0..input.take(1) % 6 {
        let image = Arc::new(page_image(g, &stripes, input));
        let page = SlotPageImage {
            deltas: if image.delta.is_some() { input.take(2) as u32 } else { 0 },
            image,
            kept: input.take(2) as u32,
        };
        images.slot_pages.insert(input.take(2), page);
    }
    images.slot_live = u128::from(input.take(8)) << (input.take(1) % 64);
    (images.pages, images.page_bytes) = (input.take(4), input.take(5));
    Checkpoint {
        sequence: input.take(4),
        next_version: input.take(4),
        resealed: (0..input.take(1) % 4).map(|_| (input.take(3), input.take(4))).collect(),
        window: (0..input.take(1) % 8).map(|_| input.take(3)).collect(),
        images,
        volumes: (0..input.take(1) % 3)
            .map(|_| (input.take(2), u128::from(input.take(8))))
            .collect(),
    }
}

/// A stripe summary, a slot page or its delta, a checkpoint's root, or a
/// directory page or its delta, made of what the input names, then changed in a few bytes, then
/// decoded.
fn made_other(g: &Geometry, kind: u8, input: &[u8]) {
    let mut input = Input(input);
    let mut bytes = match kind {
        0 => {
            let records: Vec<Record> = (0..input.take(1) % 16)
                .map(|version| {
                    let (lba, blocks) = (input.take(4), (input.take(1) % 16 + 1) as u32);
                    if input.take(1) % 2 == 0 {
                        Record::Zero { lba, blocks, version }
                    } else {
                        let digest: Vec<u8> = (0..g.checksum.digest_bytes()).map(|_| input.take(1) as u8).collect();
                        Record::Data {
                            lba,
                            version,
                            extent: Extent {
                                slot: 0,
                                offset: input.take(2) as u32 * 16,
                                stored_bytes: blocks * 4096,
                                blocks,
                                codec: None,
                                digest: Digest::from_bytes(&digest),
                                block_crcs: (0..blocks).map(|_| input.take(4) as u32).collect(),
                            },
                        }
                    }
                })
                .collect();
            format::encode_summary(g.checksum, &records)
        }
        1 => {
            let page = input.take(1) % 4;
            format::encode_slot_page_image(page, &slot_entries(g, page, &mut input))
        }
        2 => {
            let page = input.take(1) % 4;
            let entries = slot_entries(g, page, &mut input);
            let mut changed: Vec<u64> = entries.iter().map(|e| e.slot).collect();
            changed.push(page * tessera_array::limits::SLOT_TABLE_PAGE_SLOTS);
            changed.sort_unstable();
            changed.dedup();
            format::encode_slot_delta_image(page, &changed, &entries)
        }
        4 => made_checkpoint(g, &mut input).encode(g.checksum),
        _ => {
            let dir = input.take(1) % 4;
            let per_dir = tessera_array::limits::MAP_DIRECTORY_PAGES;
            let mut pages = BTreeMap::new();
            for _ in 0..input.take(1) % 12 {
                let digest: Vec<u8> = (0..g.checksum.digest_bytes()).map(|_| input.take(1) as u8).collect();
                let piece = |input: &mut Input| ImagePiece {
                    slot: input.take(2) % g.slot_count().max(1),
                    offset: input.take(2) as u32,
                    bytes: input.take(2) as u32 + 1,
                };
                let pieces = vec![piece(&mut input)];
                let mut image = PageImage::whole(pieces[0].bytes, Digest::from_bytes(&digest), pieces);
                if input.take(1) % 2 == 0 {
                    let delta = vec![piece(&mut input)];
                    image.delta = Some(Arc::new(PageImage::whole(
                        delta[0].bytes,
                        Digest::from_bytes(&digest),
                        delta,
                    )));
                }
                pages.insert(dir * per_dir + input.take(2) % per_dir, Arc::new(image));
            }
            if input.take(1) % 2 == 0 {
                format::encode_directory_image(g.checksum, dir, &pages)
            } else {
                let changed: BTreeSet<u64> = pages.keys().copied().chain([dir * per_dir]).collect();
                format::encode_directory_delta_image(g.checksum, dir, &changed, &pages)
            }
        }
    };
    mutate(&mut bytes, &mut input);
    match kind {
        0 => drop(format::decode_summary(&bytes, g, 3)),
        4 => drop(Checkpoint::decode(&bytes, g)),
        1 => drop(format::decode_slot_page_image(&bytes, g)),
        2 => drop(format::decode_slot_delta_image(&bytes, g)),
        _ => {
            let _ = format::decode_directory_image(&bytes, g);
            let _ = format::decode_directory_delta_image(&bytes, g);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let [which, shape, body @ ..] = data else {
        return;
    };
    let g = geometry(*shape);
    match which % 21 {
        0 => {
            let _ = Superblock::decode(&sector(&SUPERBLOCK_MAGIC, body));
        }
        1 => {
            let _ = ChunkHeader::decode(&sector(&CHUNK_MAGIC, body), g.checksum);
        }
        2 => {
            let _ = LogDeviceHeader::decode(&sector(&LOG_DEVICE_MAGIC, body));
            let _ = LogDeviceHeader::decode(body.get(..SECTOR_BYTES).unwrap_or(&[0; SECTOR_BYTES]));
        }
        3 => {
            let slot = body.first().map_or(0, |&b| u64::from(b));
            let _ = format::decode_summary(body, &g, slot);
        }
        4 => {
            let _ = format::decode_slot_page_image(body, &g);
        }
        5 => {
            let _ = format::decode_slot_delta_image(body, &g);
        }
        6 => {
            let _ = Checkpoint::decode(body, &g);
        }
        7 => {
            // The directory's length follows from its count of stripes;
            // sealed with the array's digest at its end.
            let stripes = body.first().map_or(1, |&b| usize::from(b) + 1);
            let len = format::checkpoint_directory_bytes(g.checksum, stripes);
            let end = len - g.checksum.digest_bytes();
            let mut bytes = vec![0u8; len];
            let n = body.len().min(end);
            bytes[..n].copy_from_slice(&body[..n]);
            bytes[..8].copy_from_slice(&CHECKPOINT_DIRECTORY_MAGIC);
            let digest = g.checksum.digest(&bytes[..end]);
            bytes[end..].copy_from_slice(digest.as_bytes());
            let _ = format::decode_checkpoint_directory(&bytes, &g, stripes);
        }
        8 => {
            let _ = format::decode_directory_image(body, &g);
        }
        9 => {
            let _ = format::decode_directory_delta_image(body, &g);
        }
        10 => {
            if let Ok(image) = format::load_page_image(body) {
                let _ = Map::decode_image(&image, &g);
            }
            let _ = format::load_delta_image(body);
        }
        11 => {
            let _ = Map::decode_image(body, &g);
        }
        12 => made_page(&g, body),
        13 => {
            // A log block: its length field kept within the input, its CRC
            // taken over the block with the CRC field zero.
            let mut block = body.to_vec();
            let len = block.len() / LOG_ALIGN * LOG_ALIGN;
            if len == 0 {
                return;
            }
            block.truncate(len);
            block[..8].copy_from_slice(&LOG_MAGIC);
            block[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
            let at = format::LOG_BYTES_OFFSET;
            let declared = u32::from_le_bytes(block[at..at + 4].try_into().unwrap()) as usize;
            let declared = (declared % (len / LOG_ALIGN) + 1) * LOG_ALIGN;
            block[at..at + 4].copy_from_slice(&(declared as u32).to_le_bytes());
            format::seal_log_block(&mut block[..declared]);
            let _ = format::decode_log_block(&block, &g);
        }
        14 => {
            let _ = VolumeTable::decode(body, &[7; 16]);
        }
        15 => {
            let _ = format::decode_log_block(body, &g);
        }
        kind => made_other(&g, kind - 16, body),
    }
});
