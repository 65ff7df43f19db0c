//! The map's checkpoints write only the pages that changed since the last
//! one; map stripes left mostly dead are rewritten and freed; the images
//! come back exactly when the array opens (after a clean stop and after
//! kill -9), and an image corrupted on M members is repaired from the
//! other chunks, by a read and by scrub. A map eight times its cache
//! reads back exactly, its pages evicted and read again, and the array
//! opens without reading them.

use crate::common::{self, kill, kill_and_reopen, kill_and_reopen_with, named, open_list};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;
use tessera_array::device::{Device, MemoryDevice};
use tessera_array::format::{meta_stripe_bytes, Checkpoint, Geometry, Superblock, SECTOR_BYTES};
use tessera_array::{Array, EngineOptions};

const BLOCK: u64 = 4096;
/// Blocks of a map page.
const PAGE: u64 = 512;

/// A block's contents: its number and a tag, so a block read from the
/// wrong place or an older write is told apart.
fn block(lba: u64, tag: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; BLOCK as usize];
    for (i, word) in bytes.chunks_mut(8).enumerate() {
        word.copy_from_slice(&(lba ^ (tag << 32) ^ (i as u64 * 0x9e37_79b9)).to_le_bytes());
    }
    bytes
}

fn verify(array: &Array, model: &BTreeMap<u64, u64>) {
    let mut back = vec![0u8; BLOCK as usize];
    for (&lba, &tag) in model {
        array.read(lba * BLOCK, &mut back).unwrap();
        assert!(back == block(lba, tag), "block {lba} (tag {tag})");
    }
    // A block never written, beside each of some written ones.
    for &lba in model.keys().step_by(97) {
        if !model.contains_key(&(lba + 1)) {
            array.read((lba + 1) * BLOCK, &mut back).unwrap();
            assert!(back.iter().all(|&b| b == 0), "block {} was never written", lba + 1);
        }
    }
}

fn write_random(array: &Array, model: &mut BTreeMap<u64, u64>, rng: &mut impl Rng, count: usize, pages: u64) {
    for _ in 0..count {
        let lba = rng.gen_range(0..pages * PAGE);
        let tag = rng.gen::<u32>() as u64;
        array.write(lba * BLOCK, &block(lba, tag), false).unwrap();
        model.insert(lba, tag);
    }
}

/// FLUSHes, kill -9s and reopens `array`, from its checkpoint, and checks
/// every block of `model` and the engine's invariants.
fn flushed_killed_and_verified(
    devices: &[Arc<MemoryDevice>],
    array: Array,
    engine: EngineOptions,
    model: &BTreeMap<u64, u64>,
) -> Array {
    array.flush().unwrap();
    let array = kill_and_reopen_with(devices, array, engine);
    let s = array.status().unwrap();
    assert!(s.recovery.checkpoint_error.is_none(), "{:?}", s.recovery);
    verify(&array, model);
    array.check().unwrap();
    array
}

/// Engine options with a map cache of `bytes`.
fn cached(bytes: usize) -> EngineOptions {
    EngineOptions {
        map_cache_bytes: bytes,
        ..EngineOptions::default()
    }
}

/// Six members of 64 MiB in memory.
fn six_members() -> Vec<Arc<MemoryDevice>> {
    (0..6).map(|_| Arc::new(MemoryDevice::new(64 << 20))).collect()
}

fn stripe_bytes(g: &Geometry) -> u64 {
    (g.width() * (SECTOR_BYTES + g.chunk_bytes)) as u64
}

fn checkpoint_bytes(array: &Array) -> u64 {
    array.status().unwrap().checkpoint_bytes_written
}

/// 4+2 on six 128 MiB members in memory, exported thin at 8 GiB.
fn thin_4_plus_2() -> (Vec<Arc<MemoryDevice>>, Array) {
    let devices: Vec<_> = (0..6).map(|_| Arc::new(MemoryDevice::new(128 << 20))).collect();
    let options = tessera_array::CreateOptions {
        logical_bytes: Some(8 << 30),
        ..tessera_array::CreateOptions::new(4, 2)
    };
    let array = tessera_array::create(named(&devices), &options).unwrap();
    (devices, array)
}

#[test]
fn a_checkpoint_writes_only_the_pages_that_changed() {
    let (devices, array) = thin_4_plus_2();
    let g = array.geometry().clone();
    let stripe = stripe_bytes(&g);
    let mut rng = rand::rngs::StdRng::seed_from_u64(25);
    let mut model = BTreeMap::new();
    // 30,000 random blocks over 1,024 pages (2 GiB): ~1.3 MB of images,
    // ~0.5 MB compressed.
    write_random(&array, &mut model, &mut rng, 30_000, 1024);
    let before = checkpoint_bytes(&array);
    array.checkpoint().unwrap();
    let whole = checkpoint_bytes(&array) - before;
    // (In two stripes of 4 x 64 KiB, the root behind the images.)
    assert!(
        whole >= 2 * stripe,
        "the first checkpoint writes every page: {whole} bytes"
    );
    assert_eq!(array.status().unwrap().map_dirty_pages, 0);

    // What the checkpoints so far held, by part: every page (its 30,000
    // blocks at a few bytes each at least), the directory pages and slot
    // pages naming them, roots; in stored bytes, within the stripes that
    // carried them.
    let parts = |array: &Array| array.status().unwrap().checkpoint_parts;
    let first = parts(&array);
    assert!(first.page_images > 100_000, "{first:?}");
    assert!(
        first.directory_pages > 0 && first.slot_pages > 0 && first.roots > 0,
        "{first:?}"
    );
    let held = |p: &tessera_array::CheckpointParts| p.page_images + p.directory_pages + p.slot_pages + p.roots;
    assert!(held(&first) <= checkpoint_bytes(&array), "{first:?}");

    // Nothing changed: the root alone.
    let before = checkpoint_bytes(&array);
    array.checkpoint().unwrap();
    assert_eq!(checkpoint_bytes(&array) - before, stripe, "only the root");
    let root_alone = parts(&array);
    assert_eq!(
        (
            root_alone.page_images,
            root_alone.directory_pages,
            root_alone.slot_pages
        ),
        (first.page_images, first.directory_pages, first.slot_pages),
        "a root alone writes no page"
    );
    assert!(root_alone.roots > first.roots);

    // Twenty blocks of one page: its image and the root.
    for i in 0..20 {
        let lba = 7 * PAGE + i * 3;
        array.write(lba * BLOCK, &block(lba, 1), false).unwrap();
        model.insert(lba, 1);
    }
    assert_eq!(array.status().unwrap().map_dirty_pages, 1);
    let before = checkpoint_bytes(&array);
    array.checkpoint().unwrap();
    let one_page = checkpoint_bytes(&array) - before;
    assert_eq!(
        one_page, stripe,
        "the page's image, its directory page and the root in one stripe"
    );
    // One page's image (its ~50 blocks), and the one directory page that
    // names it, as a delta over its image: that page's entry.
    let after = parts(&array);
    let image = after.page_images - root_alone.page_images;
    assert!((100..4096).contains(&image), "one page's image: {image} bytes");
    let dir_delta = after.directory_page_deltas - root_alone.directory_page_deltas;
    assert_eq!(after.directory_pages, root_alone.directory_pages, "{after:?}");
    assert!((100..200).contains(&dir_delta), "one entry's delta: {dir_delta} bytes");

    // Many small rounds: map stripes whose images died are rewritten and
    // freed, so they stay within a few times what the images need.
    let per_stripe = meta_stripe_bytes(&g) as u64;
    for _ in 0..40 {
        write_random(&array, &mut model, &mut rng, 300, 1024);
        array.checkpoint().unwrap();
        let s = array.status().unwrap();
        let images = s.map_mappings * 44 + s.map_pages * 16;
        let bound = 4 * images.div_ceil(per_stripe) + 2;
        assert!(
            s.map_stripes <= bound,
            "{} map stripes for {images} bytes of images",
            s.map_stripes
        );
    }
    // Some of the images written were moved: clean pages' copied out of
    // the sparse map stripes.
    let moved = parts(&array);
    assert!(
        moved.page_images_moved > 0 && moved.page_images_moved < moved.page_images,
        "{moved:?}"
    );
    verify(&array, &model);

    // Back after a clean stop, and after kill -9 (the writes since the
    // last checkpoint replayed over its pages).
    // Every page has its image named by the directory (a checkpoint was
    // just written).
    let (mappings, pages) = {
        let s = array.status().unwrap();
        assert_eq!(s.map_dirty_pages, 0);
        (s.map_mappings, s.map_pages_on_members)
    };
    drop(array);
    let array = tessera_array::open(open_list(&devices, &[])).unwrap();
    let s = array.status().unwrap();
    assert!(s.recovery.checkpoint_error.is_none(), "{:?}", s.recovery);
    // Opened without reading a page: each is read when first looked at.
    assert_eq!((s.map_pages, s.map_pages_on_members), (0, pages));
    verify(&array, &model);
    let s = array.status().unwrap();
    assert_eq!((s.map_mappings, s.map_pages, s.map_dirty_pages), (mappings, pages, 0));
    assert_eq!(s.map_page_misses, pages);
    write_random(&array, &mut model, &mut rng, 2_000, 1024);
    array.flush().unwrap();
    let array = kill_and_reopen(&devices, array);
    let s = array.status().unwrap();
    assert!(s.recovery.checkpoint_error.is_none(), "{:?}", s.recovery);
    assert!(s.recovery.stripes_replayed > 0);
    verify(&array, &model);
}

/// A checkpoint's root ends where a stripe's room ends: behind its page
/// images, in the stripe they end in, where it fits there (format 12),
/// so that a checkpoint of a few pages takes one stripe, not two. The
/// stripe is a map stripe (freed once no image in it is named), not one
/// of the root's own (freed once a newer root is durable). Read back
/// after a clean stop, after kill -9, and with that stripe corrupt on M
/// members: the root read from its offset in the stripe rebuilt.
#[test]
fn the_root_fills_the_tail_of_the_stripe_its_images_end_in() {
    let (devices, array) = thin_4_plus_2();
    let g = array.geometry().clone();
    let per_stripe = meta_stripe_bytes(&g);
    let mut rng = rand::rngs::StdRng::seed_from_u64(26);
    let mut model = BTreeMap::new();
    let reference = |devices: &[Arc<MemoryDevice>]| superblock(devices).checkpoint.expect("a checkpoint");
    for round in 0..6 {
        write_random(&array, &mut model, &mut rng, 300, 64);
        let before = checkpoint_bytes(&array);
        array.checkpoint().unwrap();
        let r = reference(&devices);
        let images = root(&devices).images;
        let shared = r.slots[0];
        assert!(r.root_offset(per_stripe) > 0, "round {round}: {r:?}");
        let live = images.stripes.get(&shared).map(|s| s.live);
        assert!(
            live.is_some_and(|live| live <= r.root_offset(per_stripe) as u64),
            "round {round}: the root's first stripe is the images' last ({live:?} bytes of images)"
        );
        // 300 blocks' pages, their directory page, slot pages and the
        // root, in one stripe.
        assert_eq!(r.slots.len(), 1, "round {round}");
        assert_eq!(checkpoint_bytes(&array) - before, stripe_bytes(&g), "round {round}");
        verify(&array, &model);
    }
    // A clean stop, then kill -9 after more (a root alone in between: in
    // a stripe of its own, from its offset).
    drop(array);
    let array = tessera_array::open(open_list(&devices, &[])).unwrap();
    verify(&array, &model);
    let held = |array: &Array| {
        let p = array.status().unwrap().checkpoint_parts;
        p.page_images + p.page_deltas + p.directory_pages + p.directory_page_deltas + p.slot_pages + p.slot_page_deltas
    };
    let images_before = held(&array);
    array.checkpoint().unwrap();
    assert_eq!(held(&array), images_before, "nothing changed: a root alone");
    assert!(!root(&devices)
        .images
        .stripes
        .contains_key(&reference(&devices).slots[0]));
    write_random(&array, &mut model, &mut rng, 300, 64);
    array.checkpoint().unwrap();
    write_random(&array, &mut model, &mut rng, 300, 64);
    let array = flushed_killed_and_verified(&devices, array, EngineOptions::default(), &model);
    array.checkpoint().unwrap();
    drop(array);
    // The shared stripe corrupt on two members of 4+2 (data chunks 0
    // and 3: the images' bytes and the root's): rebuilt when opening
    // reads the root, and its images read back.
    let r = reference(&devices);
    assert!(root(&devices).images.stripes.contains_key(&r.slots[0]));
    corrupt_at(&devices, &g, r.slots[0], 0, 100);
    corrupt_at(&devices, &g, r.slots[0], 3, g.chunk_bytes - 100);
    let array = tessera_array::open(open_list(&devices, &[])).unwrap();
    let s = array.status().unwrap();
    assert!(s.recovery.checkpoint_error.is_none(), "{:?}", s.recovery);
    verify(&array, &model);
    array.check().unwrap();
}

#[test]
fn a_spent_window_writes_a_root_alone_until_the_pages_are_worth_writing() {
    let (devices, array) = thin_4_plus_2();
    let stripe = stripe_bytes(array.geometry());
    let mut rng = rand::rngs::StdRng::seed_from_u64(26);
    let mut model = BTreeMap::new();
    write_random(&array, &mut model, &mut rng, 30_000, 1024);
    array.checkpoint().unwrap();
    let pages_at = array.status().unwrap().checkpoint_sequence;
    // 300 random writes dirty ~260 of 1,024 pages: writing them (~400 KB)
    // costs more than 1/20 of the 1.2 MB written. A root alone, eight
    // times; the ninth writes the pages.
    for round in 1..=9u64 {
        write_random(&array, &mut model, &mut rng, 300, 1024);
        let before = array.status().unwrap();
        assert!(before.map_dirty_pages > 200, "{}", before.map_dirty_pages);
        array.checkpoint_as_needed().unwrap();
        let s = array.status().unwrap();
        if round <= 8 {
            assert_eq!(s.checkpoints_root_only, round);
            assert_eq!(s.checkpoint_bytes_written - before.checkpoint_bytes_written, stripe);
            assert_eq!(s.map_dirty_pages, before.map_dirty_pages, "no page written");
            assert_eq!(s.checkpoint_sequence, pages_at, "the pages' sequence stays");
        } else {
            assert_eq!(s.checkpoints_root_only, 8);
            assert_eq!(s.map_dirty_pages, 0);
            assert!(s.checkpoint_sequence > pages_at);
        }
    }
    // Roots alone again, then kill -9: replay reads every window since
    // the pages, and nothing FLUSHed is lost.
    for _ in 0..3 {
        write_random(&array, &mut model, &mut rng, 300, 1024);
        array.checkpoint_as_needed().unwrap();
    }
    assert_eq!(array.status().unwrap().checkpoints_root_only, 11);
    write_random(&array, &mut model, &mut rng, 300, 1024);
    array.flush().unwrap();
    let array = kill_and_reopen(&devices, array);
    let s = array.status().unwrap();
    assert!(s.recovery.checkpoint_error.is_none(), "{:?}", s.recovery);
    verify(&array, &model);
    // And the first checkpoint after opening writes the pages.
    array.checkpoint_as_needed().unwrap();
    assert_eq!(array.status().unwrap().map_dirty_pages, 0);
    drop(array);
    let array = tessera_array::open(open_list(&devices, &[])).unwrap();
    verify(&array, &model);
}

/// The data area of stripe `slot`, from its data chunks' payloads.
/// Pages of ~400 entries each, changed in a few keys a round: each
/// checkpoint writes them as deltas over their images (every change since
/// the image, a fraction of its bytes), until their deltas would have
/// held more keys than the pages have entries, which writes them whole
/// again. They read back exactly through a cache too small to keep them
/// (each image and delta read again), after a clean stop, after kill -9,
/// and with every map stripe corrupt on M members.
#[test]
fn pages_changed_in_a_few_keys_are_written_as_deltas_and_read_back_exactly() {
    let (devices, array) = thin_4_plus_2();
    let g = array.geometry().clone();
    let mut rng = rand::rngs::StdRng::seed_from_u64(26);
    let mut model = BTreeMap::new();
    let pages = 16;
    write_random(&array, &mut model, &mut rng, 800 * pages as usize, pages);
    array.checkpoint().unwrap();
    let parts = |array: &Array| array.status().unwrap().checkpoint_parts;
    let first = parts(&array);
    assert_eq!(first.page_deltas, 0, "no page had an image: {first:?}");
    let whole_per_page = first.page_images / pages;
    // Six rounds of ~10 blocks a page: deltas alone (~210 keys held in
    // all, of ~400 entries), each round's holding every change since the
    // images (so growing).
    let mut last = first.clone();
    let mut sizes = Vec::new();
    for _ in 0..6 {
        write_random(&array, &mut model, &mut rng, 10 * pages as usize, pages);
        array.checkpoint().unwrap();
        let now = parts(&array);
        let (images, deltas) = (now.page_images - last.page_images, now.page_deltas - last.page_deltas);
        assert_eq!(images, 0, "only deltas: {now:?}");
        sizes.push(deltas / pages);
        last = now;
    }
    assert!(
        sizes[0] * 8 < whole_per_page,
        "a delta of ~10 keys: {sizes:?} bytes a page, whole {whole_per_page}"
    );
    assert!(
        sizes[5] > 2 * sizes[0],
        "a delta holds every change since the image: {sizes:?}"
    );
    verify(&array, &model);
    // A round of a write a key (~320 keys changed a page): more keys held
    // in deltas since their images than the pages have entries, so
    // whole again.
    write_random(&array, &mut model, &mut rng, 512 * pages as usize, pages);
    array.checkpoint().unwrap();
    let now = parts(&array);
    assert!(now.page_images - last.page_images > 12 * whole_per_page, "{now:?}");
    assert_eq!(now.page_deltas, last.page_deltas, "{now:?}");
    // And deltas over the new images after that.
    write_random(&array, &mut model, &mut rng, 10 * pages as usize, pages);
    array.checkpoint().unwrap();
    let after = parts(&array);
    assert!(
        after.page_deltas > now.page_deltas && after.page_images == now.page_images,
        "{after:?}"
    );
    write_random(&array, &mut model, &mut rng, 10 * pages as usize, pages);
    array.checkpoint().unwrap();
    drop(array);

    // Read back through a cache of a few pages: each image and its delta
    // read as the page is looked at.
    let engine = || cached(24 << 10);
    let array = tessera_array::open_with(open_list(&devices, &[]), engine()).unwrap();
    verify(&array, &model);
    let s = array.status().unwrap();
    assert!(s.map_page_misses > pages && s.map_pages_evicted > 0, "{s:?}");
    array.check().unwrap();
    // Deltas again over what was read back, then kill -9 after more.
    write_random(&array, &mut model, &mut rng, 10 * pages as usize, pages);
    let before = parts(&array);
    array.checkpoint().unwrap();
    assert!(parts(&array).page_deltas > before.page_deltas, "{:?}", parts(&array));
    write_random(&array, &mut model, &mut rng, 10 * pages as usize, pages);
    let array = flushed_killed_and_verified(&devices, array, engine(), &model);
    array.checkpoint().unwrap();
    drop(array);

    // Every map stripe corrupt on two members (M = 2): rebuilt as read.
    let array = opened_with_map_stripes_corrupt(&devices, &g, [0, 3], engine(), &model);
    assert!(array.status().unwrap().chunks_repaired >= 2);
    array.check().unwrap();
}

/// Chunks `chunks` of every map stripe the durable checkpoint names
/// corrupt, then the array opened with `engine`: every block of `model`
/// reads back (each image rebuilt as it is read).
fn opened_with_map_stripes_corrupt(
    devices: &[Arc<MemoryDevice>],
    g: &Geometry,
    chunks: [usize; 2],
    engine: EngineOptions,
    model: &BTreeMap<u64, u64>,
) -> Array {
    for slot in map_stripes(devices) {
        for j in chunks {
            corrupt(devices, g, slot, j);
        }
    }
    let array = tessera_array::open_with(open_list(devices, &[]), engine).unwrap();
    verify(&array, model);
    array
}

fn data_area(devices: &[Arc<MemoryDevice>], g: &Geometry, slot: u64) -> Vec<u8> {
    let mut area = vec![0u8; g.data_area_bytes()];
    for (j, chunk) in area.chunks_mut(g.chunk_bytes).enumerate() {
        let (member, row) = g.place(slot, j);
        devices[member]
            .read_at(chunk, g.row_offset(row) + SECTOR_BYTES as u64)
            .unwrap();
    }
    area
}

/// The map stripes the durable checkpoint names, read from the members.
fn map_stripes(devices: &[Arc<MemoryDevice>]) -> Vec<u64> {
    root(devices).images.stripes.keys().copied().collect()
}

/// Flips a byte of the payload of chunk `j` of stripe `slot`.
fn corrupt(devices: &[Arc<MemoryDevice>], g: &Geometry, slot: u64, j: usize) {
    corrupt_at(devices, g, slot, j, 100);
}

/// Flips the byte at `within` of the payload of chunk `j` of stripe `slot`.
fn corrupt_at(devices: &[Arc<MemoryDevice>], g: &Geometry, slot: u64, j: usize, within: usize) {
    let (member, row) = g.place(slot, j);
    let at = g.row_offset(row) + (SECTOR_BYTES + within) as u64;
    let mut byte = [0u8; 1];
    devices[member].read_at(&mut byte, at).unwrap();
    byte[0] ^= 0x5a;
    devices[member].write_at(&byte, at).unwrap();
}

#[test]
fn a_map_stripe_corrupt_on_m_members_is_repaired_by_a_read_and_by_scrub() {
    let devices: Vec<_> = (0..6).map(|_| Arc::new(MemoryDevice::new(64 << 20))).collect();
    let array = tessera_array::create(named(&devices), &tessera_array::CreateOptions::new(4, 2)).unwrap();
    let g = array.geometry().clone();
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let mut model = BTreeMap::new();
    write_random(&array, &mut model, &mut rng, 5_000, 64);
    array.checkpoint().unwrap();
    drop(array);
    let stripes = map_stripes(&devices);
    assert!(!stripes.is_empty());
    // Two data chunks of the first map stripe: M = 2, so it is rebuilt.
    corrupt(&devices, &g, stripes[0], 0);
    corrupt(&devices, &g, stripes[0], 1);
    let array = tessera_array::open(open_list(&devices, &[])).unwrap();
    let recovery = array.status().unwrap().recovery;
    assert!(recovery.checkpoint_error.is_none(), "{recovery:?}");
    assert!(
        recovery.slots_scanned < g.slot_count(),
        "from the checkpoint, not a scan"
    );
    // The pages are read when looked at: the bad stripe is rebuilt then,
    // and its chunks rewritten.
    verify(&array, &model);
    assert!(array.status().unwrap().chunks_repaired >= 2);
    drop(array);
    // Repaired on the members: reading every page again finds nothing wrong.
    let array = tessera_array::open(open_list(&devices, &[])).unwrap();
    verify(&array, &model);
    assert_eq!(array.status().unwrap().chunks_repaired, 0);
    // Corrupted while the array is open: scrub finds and repairs it.
    let stripes = map_stripes(&devices);
    corrupt(&devices, &g, stripes[0], 2);
    corrupt(&devices, &g, stripes[0], 4);
    let report = array.scrub().unwrap();
    assert!(
        report.chunks_repaired >= 2 && report.stripes_unrecoverable == 0,
        "{report:?}"
    );
    drop(array);
    let array = tessera_array::open(open_list(&devices, &[])).unwrap();
    verify(&array, &model);
    assert_eq!(array.status().unwrap().chunks_repaired, 0);
}

/// A map about eight times the cache: after a checkpoint the cache holds
/// at most its size; every block reads back (pages evicted and read
/// again); writes that dirty more than the cache make the background
/// write them so they can go; after a clean stop and after kill -9 the
/// array opens without reading a page it does not need, and reads back
/// exactly.
#[test]
fn a_map_eight_times_its_cache_reads_back_exactly() {
    let cache = 24 << 10;
    let engine = || cached(cache);
    let devices = six_members();
    let array =
        tessera_array::create_with(named(&devices), &tessera_array::CreateOptions::new(4, 2), engine()).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut model = BTreeMap::new();
    write_random(&array, &mut model, &mut rng, 20_000, 64);
    array.checkpoint().unwrap();
    let s = array.status().unwrap();
    let map = s.map_mappings * 13;
    assert!(s.map_bytes <= cache as u64, "{} bytes of pages kept", s.map_bytes);
    assert!(s.map_bytes_on_members > 0 && s.map_pages_on_members > 0, "{s:?}");
    verify(&array, &model);
    let s = array.status().unwrap();
    assert!(s.map_bytes <= cache as u64, "{} bytes of pages kept", s.map_bytes);
    assert!(s.map_page_misses > s.map_pages_on_members, "{s:?}");
    // The whole map, counted once the check brings every page in.
    array.check().unwrap();
    let whole = array.status().unwrap().map_bytes;
    assert!(
        whole >= 6 * cache as u64,
        "the map ({whole} bytes, {map} in entries) is not much larger than its cache"
    );
    // More random writes than the cache holds dirty: the background
    // writes the pages, and they go.
    write_random(&array, &mut model, &mut rng, 20_000, 64);
    array.flush().unwrap();
    verify(&array, &model);
    drop(array);
    let array = tessera_array::open_with(open_list(&devices, &[]), engine()).unwrap();
    let s = array.status().unwrap();
    assert!(s.recovery.checkpoint_error.is_none(), "{:?}", s.recovery);
    assert!(s.map_bytes <= cache as u64 + (64 << 10), "{s:?}");
    verify(&array, &model);
    array.check().unwrap();
    write_random(&array, &mut model, &mut rng, 5_000, 64);
    let array = flushed_killed_and_verified(&devices, array, engine(), &model);
    // (Pages replay changed stay until a checkpoint writes them: the
    // background's may not have yet.)
    array.checkpoint().unwrap();
    verify(&array, &model);
    assert!(array.status().unwrap().map_pages_evicted > 0);
}

/// Reads at random over a map many times its cache: a page not in
/// memory, once the cache is full, is read for the lookup alone and let
/// go, unless it was read so lately; a page looked at again and again is
/// kept. Every block reads back exactly, the map stays within its cache,
/// and the engine's check passes.
#[test]
fn pages_read_at_random_past_a_full_cache_are_read_once_unless_read_again() {
    // Room for the directory pages (8, naming 2,048 pages' images in
    // ~275 KB of memory) and a few hundred pages: a page whose directory
    // page is not in memory is installed with it.
    let cache = 512 << 10;
    let devices: Vec<_> = (0..6).map(|_| Arc::new(MemoryDevice::new(128 << 20))).collect();
    let options = tessera_array::CreateOptions {
        logical_bytes: Some(8 << 30),
        ..tessera_array::CreateOptions::new(4, 2)
    };
    let array = tessera_array::create_with(named(&devices), &options, cached(cache)).unwrap();
    let pages = (8 << 30) / BLOCK / PAGE;
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    let mut model = BTreeMap::new();
    write_random(&array, &mut model, &mut rng, 100_000, pages);
    array.checkpoint().unwrap();
    drop(array);
    let array = tessera_array::open_with(open_list(&devices, &[]), cached(cache)).unwrap();
    let mut order: Vec<(u64, u64)> = model.iter().map(|(&lba, &tag)| (lba, tag)).collect();
    order.shuffle(&mut rng);
    let mut back = vec![0u8; BLOCK as usize];
    for &(lba, tag) in &order {
        array.read(lba * BLOCK, &mut back).unwrap();
        assert!(back == block(lba, tag), "block {lba} (tag {tag})");
    }
    let s = array.status().unwrap();
    assert!(s.map_bytes <= cache as u64, "{} bytes of pages kept", s.map_bytes);
    // Most pages were read once; far fewer kept (a page is kept on its
    // second look while remembered: here about 1 in 8 of the others).
    assert!(
        s.map_pages_read_once > 50_000 && s.map_page_misses * 3 < s.map_pages_read_once,
        "{} pages read once, {} kept; {} reads of map stripes, {} pages evicted, {} of {} directory pages in memory",
        s.map_pages_read_once,
        s.map_page_misses,
        s.map_page_reads,
        s.map_pages_evicted,
        s.map_directory_pages_in_memory,
        s.map_directory_pages
    );
    // A page looked at again and again: read once (the first block
    // whose read reads its page once: its page was not in memory), kept
    // on its second look, then found.
    let mut reads = order.iter().map(|&(lba, tag)| {
        let before = array.status().unwrap().map_pages_read_once;
        array.read(lba * BLOCK, &mut back).unwrap();
        assert!(back == block(lba, tag), "block {lba} (tag {tag})");
        (lba, tag, array.status().unwrap().map_pages_read_once > before)
    });
    let (lba, tag, _) = reads
        .by_ref()
        .take(1_000)
        .find(|&(_, _, once)| once)
        .expect("a page read once in 1,000 reads");
    drop(reads);
    let before = array.status().unwrap();
    for _ in 0..9 {
        array.read(lba * BLOCK, &mut back).unwrap();
        assert!(back == block(lba, tag), "block {lba} (tag {tag})");
    }
    let after = array.status().unwrap();
    let delta = |count: fn(&tessera_array::Status) -> u64| count(&after) - count(&before);
    assert_eq!(
        (
            delta(|s| s.map_pages_read_once),
            delta(|s| s.map_page_misses),
            delta(|s| s.map_page_hits)
        ),
        (0, 1, 8),
        "read once, kept and found in the 9 reads after the first"
    );
    verify(&array, &model);
    // The whole map, counted once the check brings every page in.
    array.check().unwrap();
    let whole = array.status().unwrap().map_bytes;
    assert!(
        whole >= 3 * cache as u64,
        "the map ({whole} bytes) is not much larger than its cache"
    );
}

/// Blocks one per directory page's worth of keys (1 GiB) over a thin
/// 4 TiB export: each in a map page and a directory page of its own.
/// The root names the directory pages only; with a cache that holds a
/// few dozen, they are evicted and read back as blocks are looked at;
/// the array opens reading no page of either kind; and every block reads
/// back after a clean stop, after kill -9, and with every map stripe
/// corrupt on M members (directory pages' images included).
#[test]
fn a_directory_larger_than_its_cache_reads_back_exactly() {
    let cache = 64 << 10;
    let engine = || cached(cache);
    let devices = six_members();
    let options = tessera_array::CreateOptions {
        logical_bytes: Some(4 << 40),
        ..tessera_array::CreateOptions::new(4, 2)
    };
    let array = tessera_array::create_with(named(&devices), &options, engine()).unwrap();
    let g = array.geometry().clone();
    let mut rng = rand::rngs::StdRng::seed_from_u64(31);
    let mut model = BTreeMap::new();
    let per_dir = 512 * PAGE;
    let dirs = 1500u64;
    let write_in = |array: &Array, model: &mut BTreeMap<u64, u64>, rng: &mut rand::rngs::StdRng, dir: u64| {
        let lba = dir * per_dir + rng.gen_range(0..per_dir);
        let tag = rng.gen::<u32>() as u64;
        array.write(lba * BLOCK, &block(lba, tag), false).unwrap();
        model.insert(lba, tag);
    };
    for i in 0..dirs {
        write_in(&array, &mut model, &mut rng, 2 * i);
    }
    array.checkpoint().unwrap();
    let s = array.status().unwrap();
    assert_eq!((s.map_directory_pages, s.map_pages_on_members), (dirs, dirs), "{s:?}");
    assert!(s.map_bytes <= cache as u64, "{} bytes of pages kept", s.map_bytes);
    verify(&array, &model);
    let s = array.status().unwrap();
    assert!(s.map_bytes <= cache as u64, "{} bytes of pages kept", s.map_bytes);
    // Most directory pages evicted: pages go first, then directory pages
    // none of whose pages is in memory, and the 64 KiB cache keeps what
    // it can of those (each names one page here: about 390 of 1,500).
    assert!(s.map_directory_pages_in_memory < dirs / 3, "{s:?}");
    drop(array);
    let array = tessera_array::open_with(open_list(&devices, &[]), engine()).unwrap();
    let s = array.status().unwrap();
    assert!(s.recovery.checkpoint_error.is_none(), "{:?}", s.recovery);
    assert_eq!(
        (s.map_pages, s.map_directory_pages_in_memory),
        (0, 0),
        "nothing read at opening"
    );
    verify(&array, &model);
    // Each block read its directory page and its page: the directory
    // page installed, the page (past the full cache, and never read
    // before) looked at once and let go.
    let s = array.status().unwrap();
    assert!(
        s.map_pages_read_once > dirs * 3 / 4,
        "{} pages read once, {} kept",
        s.map_pages_read_once,
        s.map_page_misses
    );
    // Overwrites and new blocks, some in directory pages not read since
    // opening, then kill -9: replayed over the pages they land in.
    for i in 0..500 {
        let dir = 2 * rng.gen_range(0..dirs) + i % 2;
        write_in(&array, &mut model, &mut rng, dir);
    }
    let array = flushed_killed_and_verified(&devices, array, engine(), &model);
    array.checkpoint().unwrap();
    drop(array);
    // Every map stripe corrupt on two data chunks (M = 2): each page and
    // directory page is rebuilt as it is read, and its chunks rewritten.
    let array = opened_with_map_stripes_corrupt(&devices, &g, [0, 1], engine(), &model);
    let s = array.status().unwrap();
    assert!(s.chunks_repaired >= 2 && s.map_directory_pages > dirs, "{s:?}");
}

/// A volume written all over and deleted: every page of it is emptied
/// in memory until a checkpoint writes them, and their directory pages
/// go as the cache needs, as any do (an emptied page names the image it
/// replaces itself). Until 2026-12-03 each emptied page kept its
/// directory page in memory: here 1,000 of them past a 64 KiB cache.
/// The other volume reads back exactly before and after the checkpoint
/// that writes the pages empty, a clean stop and a kill -9.
#[test]
fn a_volume_deleted_all_over_lets_its_directory_pages_go() {
    let cache = 64 << 10;
    let engine = || EngineOptions {
        background: false,
        ..cached(cache)
    };
    let devices = six_members();
    let options = tessera_array::CreateOptions {
        logical_bytes: Some(1 << 40),
        ..tessera_array::CreateOptions::new(4, 2)
    };
    let array = tessera_array::create_with(named(&devices), &options, engine()).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(37);
    let per_dir = 512 * PAGE;
    let (kept, spread) = (500u64, 1000u64);
    let mut model = BTreeMap::new();
    for dir in 0..kept {
        let lba = dir * per_dir + rng.gen_range(0..per_dir);
        let tag = rng.gen::<u32>() as u64;
        array.write(lba * BLOCK, &block(lba, tag), false).unwrap();
        model.insert(lba, tag);
    }
    let gone = array.create_volume("gone", spread * per_dir * BLOCK).unwrap();
    let mut written = Vec::new();
    for dir in 0..spread {
        let lba = dir * per_dir + rng.gen_range(0..per_dir);
        gone.write(lba * BLOCK, &block(lba, 1), false).unwrap();
        written.push(lba);
    }
    array.checkpoint().unwrap();
    assert_eq!(array.status().unwrap().map_pages_on_members, kept + spread);
    drop(gone);
    array.delete_volume("gone").unwrap();
    verify(&array, &model);
    // (Its 1,000 pages emptied, not yet written, are counted with the
    // room their checkpoint needs: past the cache, and not evicted.)
    let s = array.status().unwrap();
    assert!(
        s.map_directory_pages_in_memory < (kept + spread) / 3,
        "{} directory pages kept with pages emptied",
        s.map_directory_pages_in_memory
    );
    // A new volume takes the deleted one's keys and reads zeros there.
    // Each emptied page's directory page is read in again, and not the
    // emptied page's old image with it (until 2026-12-03 it was read,
    // decoded and dropped: two reads a block where one is needed).
    let again = array.create_volume("again", spread * per_dir * BLOCK).unwrap();
    let reads = array.status().unwrap().map_page_reads;
    let mut back = vec![0u8; BLOCK as usize];
    for &lba in &written {
        again.read(lba * BLOCK, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0), "block {lba} of a deleted volume");
    }
    let reads = array.status().unwrap().map_page_reads - reads;
    assert!(reads <= spread + spread / 10, "{reads} map reads for {spread} blocks");
    drop(again);
    array.delete_volume("again").unwrap();
    array.check().unwrap();
    array.checkpoint().unwrap();
    verify(&array, &model);
    let s = array.status().unwrap();
    assert!(s.map_bytes <= cache as u64, "{s:?}");
    assert_eq!((s.map_pages_on_members, s.map_directory_pages), (kept, kept), "{s:?}");
    drop(array);
    let array = tessera_array::open_with(open_list(&devices, &[]), engine()).unwrap();
    verify(&array, &model);
    flushed_killed_and_verified(&devices, array, engine(), &model);
}

/// `thin_4_plus_2` with block 0 of each of the first `pages` map pages
/// written, stopped cleanly (the pages' images written one after another
/// by its checkpoint) and opened again, with the model of what it holds.
fn a_block_in_each_page_reopened(pages: u64) -> (Vec<Arc<MemoryDevice>>, Array, BTreeMap<u64, u64>) {
    let (devices, array) = thin_4_plus_2();
    let mut model = BTreeMap::new();
    for p in 0..pages {
        array.write(p * PAGE * BLOCK, &block(p * PAGE, 1), false).unwrap();
        model.insert(p * PAGE, 1);
    }
    array.close().unwrap();
    drop(array);
    let array = tessera_array::open(open_list(&devices, &[])).unwrap();
    (devices, array, model)
}

#[test]
fn replay_reads_only_the_pages_its_records_land_in() {
    // A replayed stripe's records are scattered over one directory page's
    // range (pages 10, 34, ..., 178 of 200 written): opening reads the
    // directory page and those pages, not every page between them.
    let (devices, array, mut model) = a_block_in_each_page_reopened(200);
    let scattered: Vec<u64> = (0..8).map(|i| 10 + 24 * i).collect();
    for &p in &scattered {
        array
            .write((p * PAGE + 7) * BLOCK, &block(p * PAGE + 7, 2), false)
            .unwrap();
        model.insert(p * PAGE + 7, 2);
    }
    array.flush().unwrap();
    let array = kill_and_reopen(&devices, array);
    let s = array.status().unwrap();
    let replayed = s.recovery.stripes_replayed + s.recovery.log.as_ref().map_or(0, |l| l.records_replayed);
    assert!(replayed > 0, "{:?}", s.recovery);
    assert!(
        s.map_page_misses <= scattered.len() as u64,
        "opening read {} map pages for records in {} (recovery {:?})",
        s.map_page_misses,
        scattered.len(),
        s.recovery
    );
    verify(&array, &model);
    array.check().unwrap();
}

/// 64 pages with an image each in one map stripe (a clean stop writes
/// them one after another), then four blocks written in each and
/// FLUSHed (stripes sealed, not only the intent log), the array killed;
/// `damage` runs on the members before they are opened again.
fn pages_to_replay_together(damage: impl FnOnce(&[Arc<MemoryDevice>], &Geometry)) -> (Array, BTreeMap<u64, u64>) {
    let (devices, array, mut model) = a_block_in_each_page_reopened(64);
    for p in 0..64 {
        for b in 3..7 {
            array
                .write((p * PAGE + b) * BLOCK, &block(p * PAGE + b, 2), false)
                .unwrap();
            model.insert(p * PAGE + b, 2);
        }
    }
    (killed_and_replayed(&devices, array, 64, damage), model)
}

/// FLUSHes `array`, kill -9s it, runs `damage` on the members, opens
/// them again, and waits for replay to map its records into the `pages`
/// pages they land in, each read once.
fn killed_and_replayed(
    devices: &[Arc<MemoryDevice>],
    array: Array,
    pages: u64,
    damage: impl FnOnce(&[Arc<MemoryDevice>], &Geometry),
) -> Array {
    let g = array.geometry().clone();
    array.flush().unwrap();
    kill(devices, array);
    damage(devices, &g);
    let array = tessera_array::open(open_list(devices, &[])).unwrap();
    let s = array.status().unwrap();
    assert!(s.recovery.stripes_replayed > 0, "{:?}", s.recovery);
    // Opening serves first; the background thread maps the records into
    // the pages after.
    assert_eq!(s.recovery.pages_mapped_later, pages, "{:?}", s.recovery);
    let s = replayed_in_background(&array);
    assert_eq!(s.map_page_misses, pages, "{:?}", s.recovery);
    array
}

/// Every block of `model` back, `check` clean, after replay read its
/// pages (and their deltas) with at most `reads` reads of map stripes.
fn read_at_most(array: &Array, model: &BTreeMap<u64, u64>, reads: u64) {
    let s = array.status().unwrap();
    assert!(
        s.map_page_reads <= reads,
        "the replay read {} pages with {} reads of map stripes",
        s.map_page_misses,
        s.map_page_reads
    );
    verify(array, model);
    array.check().unwrap();
}

/// The status once the background thread has mapped every record a
/// replay left for after opening (within 30 s).
fn replayed_in_background(array: &Array) -> tessera_array::Status {
    for _ in 0..3_000 {
        let s = array.status().unwrap();
        if s.replay_pages_waiting == 0 {
            return s;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!(
        "the replay was not mapped in 30 s: {:?}",
        array.status().unwrap().recovery
    );
}

#[test]
fn replay_reads_pages_lying_together_in_a_map_stripe_at_once() {
    // Replay needs all 64 pages again: a few reads of their map stripe,
    // not one a page.
    let (array, model) = pages_to_replay_together(|_, _| {});
    read_at_most(&array, &model, 4);
}

/// 64 pages of ~100 entries written whole by a checkpoint, then a few
/// keys of each changed and checkpointed (each page written as a delta,
/// the 64 side by side in one map stripe), then four blocks of each
/// FLUSHed and the array killed: replay needs every page, and reads the
/// images in a few reads of their map stripe and the deltas in a few of
/// theirs, not one read a delta.
#[test]
fn replay_reads_deltas_lying_together_in_a_map_stripe_at_once() {
    let (devices, array) = thin_4_plus_2();
    let mut rng = rand::rngs::StdRng::seed_from_u64(27);
    let mut model = BTreeMap::new();
    let pages = 64;
    for p in 0..pages {
        for _ in 0..100 {
            let lba = p * PAGE + rng.gen_range(0..PAGE);
            array.write(lba * BLOCK, &block(lba, 1), false).unwrap();
            model.insert(lba, 1);
        }
    }
    array.checkpoint().unwrap();
    let mut write_each = |tag: u64, count: u64| {
        for p in 0..pages {
            for _ in 0..count {
                let lba = p * PAGE + rng.gen_range(0..PAGE);
                array.write(lba * BLOCK, &block(lba, tag), false).unwrap();
                model.insert(lba, tag);
            }
        }
    };
    write_each(2, 2);
    let before = array.status().unwrap().checkpoint_parts;
    array.checkpoint().unwrap();
    let after = array.status().unwrap().checkpoint_parts;
    assert_eq!(after.page_images, before.page_images, "deltas only: {after:?}");
    assert!(after.page_deltas > before.page_deltas, "{after:?}");
    write_each(3, 4);
    let array = killed_and_replayed(&devices, array, pages, |_, _| {});
    read_at_most(&array, &model, 8);
}

#[test]
fn a_bad_image_among_pages_read_together_is_rebuilt_and_repaired() {
    // A byte of the images flipped on one member: the page it lies in
    // fails its digest in the read of the run, is read again alone, its
    // stripe rebuilt and the chunk rewritten; the others install as read.
    let (array, model) = pages_to_replay_together(|devices, g| {
        let stripes = map_stripes(devices);
        assert!(!stripes.is_empty());
        corrupt_at(devices, g, stripes[0], 0, 600);
    });
    let s = array.status().unwrap();
    assert!(s.chunks_repaired >= 1, "{s:?}");
    assert!(s.map_page_reads > 1, "{s:?}");
    verify(&array, &model);
    array.check().unwrap();
}

/// The durable checkpoint's root, read from the members.
fn root(devices: &[Arc<MemoryDevice>]) -> Checkpoint {
    let superblock = superblock(devices);
    let g = superblock.geometry.clone();
    let reference = superblock.checkpoint.expect("a checkpoint");
    assert!(!reference.directory);
    let per_stripe = meta_stripe_bytes(&g);
    let mut bytes = Vec::new();
    for &slot in &reference.slots {
        bytes.extend_from_slice(&data_area(devices, &g, slot)[..per_stripe]);
    }
    // It ends where its last stripe's area does.
    let root = bytes.split_off(reference.root_offset(per_stripe));
    assert_eq!(root.len() as u64, reference.bytes);
    Checkpoint::decode(&root, &g).unwrap()
}

/// Member 0's superblock.
fn superblock(devices: &[Arc<MemoryDevice>]) -> Superblock {
    let mut sector = vec![0u8; SECTOR_BYTES];
    devices[0].read_at(&mut sector, 0).unwrap();
    Superblock::decode(&sector).unwrap()
}

/// A root over several stripes (4 KiB chunks: 16 KiB stripes, a window
/// of ~2,400 slots: a root of ~40 KB), begun behind the images in their
/// last stripe, read back with each of its stripes corrupt on two
/// members of 4+2: rebuilt stripe by stripe, the first from the root's
/// offset, the others whole.
#[test]
fn a_root_over_several_stripes_is_read_from_its_offset_when_rebuilt() {
    let devices: Vec<_> = (0..6).map(|_| Arc::new(MemoryDevice::new(80 << 20))).collect();
    let options = tessera_array::CreateOptions {
        chunk_bytes: 4096,
        ..tessera_array::CreateOptions::new(4, 2)
    };
    let array = tessera_array::create(named(&devices), &options).unwrap();
    let g = array.geometry().clone();
    let per_stripe = meta_stripe_bytes(&g);
    let mut rng = rand::rngs::StdRng::seed_from_u64(28);
    let mut model = BTreeMap::new();
    // Rounds of writes until a checkpoint's root begins behind its
    // images (whether it fits there depends on both sizes).
    let shared = (0..20).find(|_| {
        write_random(&array, &mut model, &mut rng, 500, 16);
        array.checkpoint().unwrap();
        let r = superblock(&devices).checkpoint.expect("a checkpoint");
        r.slots.len() >= 2 && root(&devices).images.stripes.contains_key(&r.slots[0])
    });
    assert!(shared.is_some(), "no root over several stripes began behind its images");
    // Nothing written since: the clean stop writes no checkpoint.
    array.close().unwrap();
    drop(array);
    let r = superblock(&devices).checkpoint.expect("a checkpoint");
    assert!(!r.directory && r.root_offset(per_stripe) > 0, "{r:?}");
    assert!(root(&devices).images.stripes.contains_key(&r.slots[0]));
    for &slot in &r.slots {
        corrupt(&devices, &g, slot, 1);
        corrupt_at(&devices, &g, slot, 3, g.chunk_bytes - 100);
    }
    let array = tessera_array::open(open_list(&devices, &[])).unwrap();
    let s = array.status().unwrap();
    assert!(s.recovery.checkpoint_error.is_none(), "{:?}", s.recovery);
    assert!(s.recovery.clean_stop, "{:?}", s.recovery);
    verify(&array, &model);
    array.check().unwrap();
}

/// 4+2 of 4 KiB chunks on six 64 MiB members in memory: ~7,700 slots of
/// 16 KiB, many slot pages.
fn four_kib_chunks() -> (Vec<Arc<MemoryDevice>>, Array) {
    let devices = six_members();
    let options = tessera_array::CreateOptions {
        chunk_bytes: 4096,
        ..tessera_array::CreateOptions::new(4, 2)
    };
    let array = tessera_array::create(named(&devices), &options).unwrap();
    (devices, array)
}

/// The slot table's durable form is paged (1,024 slots a page): a
/// checkpoint after a few writes writes the pages of the slots they
/// touched, not a list of every used slot (the root listed 36 bytes per
/// used slot, whatever changed: 210 KB here, 7.5 GB at 100 TiB of 8+2),
/// and opening after kill -9 puts the table together from its pages.
#[test]
fn a_checkpoint_writes_only_the_slot_pages_that_changed() {
    let (devices, array) = four_kib_chunks();
    let g = array.geometry().clone();
    let stripe = stripe_bytes(&g);
    let mut model = BTreeMap::new();
    // About 6,000 stripes of three blocks, 16 blocks a write.
    for first in (0..18_000u64).step_by(16) {
        write_run(&array, &mut model, first, 1);
    }
    array.checkpoint().unwrap();
    let used = array.status().unwrap().stripes_used;
    assert!(used > 5_000, "{used} slots used");
    let full = root(&devices);
    let pages = full.images.slot_pages.len() as u64;
    assert!(pages >= used.div_ceil(1024), "{pages} slot pages for {used} slots");

    // One block overwritten: its new slot's page and its old one's (the
    // map page and directory page), and the root.
    let lba = 9_001;
    array.write(lba * BLOCK, &block(lba, 2), false).unwrap();
    model.insert(lba, 2);
    let before = checkpoint_bytes(&array);
    array.checkpoint().unwrap();
    let written = checkpoint_bytes(&array) - before;
    assert!(
        written <= 8 * stripe,
        "one block's checkpoint wrote {written} bytes, {} stripes",
        written / stripe
    );
    let after = root(&devices);
    let changed = full
        .images
        .slot_pages
        .iter()
        .filter(|(page, image)| after.images.slot_pages.get(page) != Some(image))
        .count();
    assert!(changed <= 2, "{changed} slot pages written again");

    // Random overwrites across them, FLUSHed, kill -9: read back whole
    // from the pages, the stripes sealed since and the replay.
    let mut rng = rand::rngs::StdRng::seed_from_u64(41);
    for round in 0..3 {
        for _ in 0..400 {
            let lba = rng.gen_range(0..18_000u64);
            array.write(lba * BLOCK, &block(lba, 10 + round), false).unwrap();
            model.insert(lba, 10 + round);
        }
        array.checkpoint().unwrap();
    }
    for _ in 0..200 {
        let lba = rng.gen_range(0..18_000u64);
        array.write(lba * BLOCK, &block(lba, 20), false).unwrap();
        model.insert(lba, 20);
    }
    // Opened with two slot pages a batch: every page still taken, in
    // batch after batch (the default reads 256 at once, more than any
    // test array has).
    let pages = root(&devices).images.slot_pages.len();
    assert!(pages > 4, "{pages} slot pages");
    let engine = EngineOptions {
        open_slot_pages_per_batch: 2,
        ..EngineOptions::default()
    };
    let array = flushed_killed_and_verified(&devices, array, engine, &model);
    let s = array.status().unwrap();
    assert!(s.recovery.stripes_replayed > 0, "{:?}", s.recovery);
}

/// Slot pages of which a few slots change between checkpoints are
/// written as deltas over their images (FORMAT.md, "Slot page deltas"),
/// for much less than the pages whole, and read back exactly: after a
/// clean stop (pages left for later, then read), after kill -9, and with
/// a delta written after each opening, which must list what the delta
/// before it did (its slots changed since the image): the engine's
/// check, which counts every slot against the map, fails otherwise.
#[test]
fn slot_pages_changed_in_a_few_slots_are_written_as_deltas_and_read_back_exactly() {
    let (devices, array) = many_slots();
    let mut model = BTreeMap::new();
    for first in (0..18_000u64).step_by(16) {
        write_run(&array, &mut model, first, 1);
    }
    array.checkpoint().unwrap();
    let pages = root(&devices).images.slot_pages.len();
    assert!(pages >= 6, "{pages} slot pages");
    let mut rng = rand::rngs::StdRng::seed_from_u64(47);
    // A few overwrites (a few slots a page) between checkpoints.
    let mut rounds = |array: &Array, model: &mut BTreeMap<u64, u64>, count: u64, tag: u64| {
        for round in 0..count {
            for _ in 0..24 {
                let lba = rng.gen_range(0..18_000u64);
                array.write(lba * BLOCK, &block(lba, tag + round), false).unwrap();
                model.insert(lba, tag + round);
            }
            array.checkpoint().unwrap();
        }
    };
    let parts = || array.status().unwrap().checkpoint_parts;
    let before = parts();
    rounds(&array, &mut model, 12, 100);
    let after = parts();
    let (whole, deltas) = (
        after.slot_pages - before.slot_pages,
        after.slot_page_deltas - before.slot_page_deltas,
    );
    let named = root(&devices);
    let with_delta = named
        .images
        .slot_pages
        .values()
        .filter(|p| p.image.delta.is_some())
        .count();
    assert!(
        deltas > 0 && with_delta > 0,
        "{deltas} bytes of deltas, {with_delta} pages with one"
    );
    // Every page changes each round: whole, they would have taken their
    // images' bytes each time.
    let images: u64 = named.images.slot_pages.values().map(|p| u64::from(p.image.bytes)).sum();
    assert!(
        whole + deltas < 12 * images / 2,
        "{whole} + {deltas} bytes of slot pages in 12 rounds, {images} a round whole"
    );
    // (The deltas since an image take at most what the page would whole
    // when the last was written: that may be more than the image, as the
    // sequences' span grows.)
    for p in named.images.slot_pages.values() {
        let delta = p.image.delta.as_ref().map_or(0, |d| d.bytes);
        assert!(delta <= p.deltas && p.deltas <= 2 * p.image.bytes, "{p:?}");
    }
    verify(&array, &model);
    array.check().unwrap();

    // A clean stop: the pages (with their deltas) left for later, read,
    // then changed again and written as deltas again.
    array.close().unwrap();
    drop(array);
    let later = EngineOptions {
        slot_pages_in_background: false,
        ..EngineOptions::default()
    };
    let array = tessera_array::open_with(open_list(&devices, &[]), later.clone()).unwrap();
    assert!(array.status().unwrap().slot_pages_unread > 0, "pages left for later");
    verify(&array, &model);
    let deltas = array.status().unwrap().checkpoint_parts.slot_page_deltas;
    rounds(&array, &mut model, 3, 200);
    assert!(array.status().unwrap().checkpoint_parts.slot_page_deltas > deltas);
    array.check().unwrap();
    array.close().unwrap();
    drop(array);
    let array = tessera_array::open_with(open_list(&devices, &[]), later).unwrap();
    verify(&array, &model);
    array.check().unwrap();

    // kill -9 after deltas, FLUSHed writes since: opening takes every page
    // with its delta, then the stripes since.
    rounds(&array, &mut model, 3, 300);
    for lba in (7..18_000u64).step_by(180) {
        array.write(lba * BLOCK, &block(lba, 400), false).unwrap();
        model.insert(lba, 400);
    }
    let array = flushed_killed_and_verified(&devices, array, EngineOptions::default(), &model);
    rounds(&array, &mut model, 2, 500);
    let array = flushed_killed_and_verified(&devices, array, EngineOptions::default(), &model);
    drop(array);
}

/// A slot page past repair (its image's chunk and two more of its map
/// stripe corrupt, on a 4+2): opening refuses the checkpoint, says which
/// page, scans every slot, and loses nothing; the checkpoint it then
/// writes is used by the next opening.
#[test]
fn a_slot_page_past_repair_falls_back_to_a_full_scan() {
    let (devices, array) = four_kib_chunks();
    let g = array.geometry().clone();
    let mut rng = rand::rngs::StdRng::seed_from_u64(43);
    let mut model = BTreeMap::new();
    write_random(&array, &mut model, &mut rng, 6_000, 16);
    array.checkpoint().unwrap();
    drop(array);
    let image = {
        let root = root(&devices);
        root.images.slot_pages.values().last().expect("a slot page").clone()
    };
    let piece = image.image.pieces[0];
    let at = piece.offset as usize + piece.bytes as usize / 2;
    let (j, within) = (at / g.chunk_bytes, at % g.chunk_bytes);
    corrupt_at(&devices, &g, piece.slot, j, within);
    for other in (0..g.width()).filter(|&o| o != j).take(2) {
        corrupt(&devices, &g, piece.slot, other);
    }
    let array = tessera_array::open(open_list(&devices, &[])).unwrap();
    let recovery = array.status().unwrap().recovery;
    let error = recovery.checkpoint_error.clone().expect("the checkpoint refused");
    // The first page read that lies in the stripe (slot pages share map stripes).
    assert!(
        error.contains("slot table page") && error.contains(&format!("slot {}", piece.slot)),
        "{error}"
    );
    assert_eq!(recovery.slots_scanned, g.slot_count());
    verify(&array, &model);
    array.check().unwrap();
    drop(array);
    let array = tessera_array::open(open_list(&devices, &[])).unwrap();
    let recovery = array.status().unwrap().recovery;
    assert!(recovery.checkpoint_error.is_none(), "{recovery:?}");
    verify(&array, &model);
}

/// A 4+2 array of 4 KiB chunks on members of 256 MiB (written
/// sparsely): 32,000 slots, of which a window is 8,192 at most. 18,000
/// blocks written in runs of 16 fill about 6,000 stripes of three
/// blocks: slot pages 0 to 5 list them, the window is past them.
fn many_slots() -> (Vec<Arc<MemoryDevice>>, Array) {
    let devices: Vec<Arc<MemoryDevice>> = (0..6).map(|_| Arc::new(MemoryDevice::new(256 << 20))).collect();
    let options = tessera_array::CreateOptions {
        chunk_bytes: 4096,
        ..tessera_array::CreateOptions::new(4, 2)
    };
    let array = tessera_array::create(named(&devices), &options).unwrap();
    (devices, array)
}

/// `blocks` blocks written in runs of 16 (about a stripe for every
/// three: 18,000 are listed by slot pages 0 to 5), a checkpoint, then
/// every fifth run of blocks 3,200 to 12,000 written again, tagged `tag`:
/// whole stripes of pages 1 to 3 emptied.
fn runs_then_some_emptied(array: &Array, model: &mut BTreeMap<u64, u64>, tag: u64, blocks: u64) {
    for first in (0..blocks).step_by(16) {
        write_run(array, model, first, 1);
    }
    array.checkpoint().unwrap();
    for first in (3_200..12_000u64).step_by(16 * 5) {
        write_run(array, model, first, tag);
    }
}

/// Blocks `first..first + 16` written as one request, tagged `tag`.
fn write_run(array: &Array, model: &mut BTreeMap<u64, u64>, first: u64, tag: u64) {
    let mut data = Vec::with_capacity(16 * BLOCK as usize);
    for lba in first..first + 16 {
        data.extend_from_slice(&block(lba, tag));
        model.insert(lba, tag);
    }
    array.write(first * BLOCK, &data, false).unwrap();
}

/// Opening after a clean stop reads the root and the slot pages that
/// list the window's slots, and leaves the others for later: a read of
/// a stripe in one reads its page first, overwrites of blocks in them
/// are counted once their pages are read (here emptying whole stripes),
/// and whatever walks every slot (the engine's check, a checkpoint)
/// reads them all. Then every count agrees with the map, the free slots
/// with what the root said of the pages not read, and every
/// block reads back, after a clean stop and after kill -9.
#[test]
fn opening_after_a_clean_stop_leaves_slot_pages_for_later() {
    let (devices, array) = many_slots();
    let mut model = BTreeMap::new();
    // Some stripes emptied and freed. (The next window takes their
    // slots, the lowest free ones, so their pages are read at opening:
    // a page read later with free slots in it is the unit test's,
    // `slots::tests::a_page_read_after_opening_is_as_if_read_at_opening_then_changed`.)
    runs_then_some_emptied(&array, &mut model, 1, 18_000);
    array.flush().unwrap();
    array.checkpoint().unwrap();
    array.close().unwrap();
    drop(array);
    let later = EngineOptions {
        slot_pages_in_background: false,
        background: false,
        ..EngineOptions::default()
    };
    let reopen = |engine: &EngineOptions| tessera_array::open_with(open_list(&devices, &[]), engine.clone()).unwrap();

    // A member missing: a degraded read checks the chunks' sequences, which
    // it takes from the slot pages. Then every page read at once: the
    // free slots are what the root counted.
    let array = tessera_array::open_with(open_list(&devices, &[1]), later.clone()).unwrap();
    let unread = array.status().unwrap().slot_pages_unread;
    assert!(unread >= 3, "{unread} slot pages unread");
    // NBD_CMD_CACHE over it all rebuilds stripes of unread pages too
    // (their sequences read from the pages).
    array.prefetch(0, 18_000 * BLOCK).unwrap();
    let prefetched = array.status().unwrap().slot_pages_unread;
    assert!(
        prefetched < unread,
        "{prefetched} of {unread} slot pages unread after a prefetch"
    );
    // 16 blocks a read: most of each stripe read, so each is rebuilt whole.
    let mut run = vec![0u8; 16 * BLOCK as usize];
    for first in (0..18_000u64).step_by(16) {
        array.read(first * BLOCK, &mut run).unwrap();
        for (lba, back) in (first..).zip(run.chunks(BLOCK as usize)) {
            assert!(back == block(lba, model[&lba]), "block {lba}");
        }
    }
    let s = array.status().unwrap();
    assert!(
        s.stripes_reconstructed > 1_000,
        "{} stripes rebuilt, {} ranges decoded",
        s.stripes_reconstructed,
        s.ranges_decoded
    );
    assert!(s.recovery.clean_stop, "{:?}", s.recovery);
    let deferred = s.recovery.slot_pages_deferred;
    assert!(
        deferred >= 3 && deferred < s.recovery.slot_pages,
        "{deferred} of {} slot pages left for later",
        s.recovery.slot_pages
    );
    assert!(s.slot_pages_unread < deferred, "{s:?}");
    array.check().unwrap();
    let read = array.status().unwrap();
    assert_eq!(read.slot_pages_unread, 0);
    array.close().unwrap();
    drop(array);

    // Every page read at once: the free slots are what the root counted.
    let array = reopen(&later);
    let s = array.status().unwrap();
    assert_eq!(s.slot_pages_unread, deferred);
    array.check().unwrap();
    let read = array.status().unwrap();
    assert_eq!(
        (read.stripes_free, read.stripes_used),
        (s.stripes_free, s.stripes_used),
        "free slots as the root counted them"
    );
    array.close().unwrap();
    drop(array);

    // A read reads its stripe's page; overwrites in pages not read yet
    // wait for them to be counted.
    let array = reopen(&later);
    let mut back = vec![0u8; BLOCK as usize];
    array.read(0, &mut back).unwrap();
    assert!(back == block(0, 1));
    let s = array.status().unwrap();
    assert_eq!(s.slot_pages_unread, deferred - 1, "block 0's page read");
    // Whole runs (their middle stripes emptied) and single blocks, in
    // pages 1 to 4.
    for first in (3_000..12_000u64).step_by(16 * 7) {
        write_run(&array, &mut model, first, 2);
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(47);
    for _ in 0..300 {
        let lba = rng.gen_range(3_000..15_000u64);
        array.write(lba * BLOCK, &block(lba, 3), false).unwrap();
        model.insert(lba, 3);
    }
    array.flush().unwrap();
    assert_eq!(
        array.status().unwrap().slot_pages_unread,
        deferred - 1,
        "written without them"
    );
    array.check().unwrap();
    verify(&array, &model);
    for first in (0..18_000u64).step_by(16 * 11) {
        write_run(&array, &mut model, first, 4);
    }
    array.checkpoint().unwrap();
    array.check().unwrap();
    array.close().unwrap();
    drop(array);

    // Read in the background.
    let array = reopen(&EngineOptions::default());
    verify(&array, &model);
    array.check().unwrap();
    for first in (1_600..18_000u64).step_by(16 * 13) {
        write_run(&array, &mut model, first, 5);
    }
    array.close().unwrap();
    drop(array);

    // Then kill -9 (the pages read at once).
    let array = reopen(&EngineOptions::default());
    verify(&array, &model);
    let array = flushed_killed_and_verified(&devices, array, EngineOptions::default(), &model);
    assert_eq!(array.status().unwrap().recovery.slot_pages_deferred, 0);
}

/// A map stripe of the root on `devices` all of whose bytes are slot
/// pages' images, none of them a page opening reads (those of the
/// window's slots and of the stripes sealed since): its slot, and the
/// pages it holds.
fn slot_pages_left_for_later(devices: &[Arc<MemoryDevice>]) -> (u64, Vec<u64>) {
    let root = root(devices);
    let per_page = tessera_array::limits::SLOT_TABLE_PAGE_SLOTS;
    let now: std::collections::BTreeSet<u64> = root
        .window
        .iter()
        .chain(root.resealed.iter().map(|(slot, _)| slot))
        .map(|slot| slot / per_page)
        .collect();
    let mut in_stripe: BTreeMap<u64, (u64, Vec<u64>)> = BTreeMap::new();
    for (&page, p) in &root.images.slot_pages {
        for piece in &p.image.pieces {
            let (bytes, pages) = in_stripe.entry(piece.slot).or_default();
            *bytes += u64::from(piece.bytes);
            pages.push(page);
        }
    }
    in_stripe
        .iter()
        .find(|(slot, (bytes, pages))| {
            *bytes == root.images.stripes[slot].live && pages.iter().all(|page| !now.contains(page))
        })
        .map(|(&slot, (_, pages))| (slot, pages.clone()))
        .expect("a map stripe of slot pages left for later")
}

/// Corrupts three chunks (of a 4+2) of a map stripe that holds only slot
/// pages an opening leaves for later, then opens the array: the array,
/// and the pages now past repair.
fn opened_with_slot_pages_past_repair(devices: &[Arc<MemoryDevice>], g: &Geometry) -> (Array, Vec<u64>) {
    let (slot, pages) = slot_pages_left_for_later(devices);
    for j in 0..3 {
        corrupt(devices, g, slot, j);
    }
    (tessera_array::open(open_list(devices, &[])).unwrap(), pages)
}

/// Reads every block of `model`: those in stripes a page that cannot be
/// read lists are refused naming it, the others come back. Returns how
/// many of each.
fn read_around_a_bad_slot_page(array: &Array, model: &BTreeMap<u64, u64>) -> (usize, usize) {
    let (mut good, mut refused) = (0, 0);
    let mut back = vec![0u8; BLOCK as usize];
    for (&lba, &tag) in model {
        match array.read(lba * BLOCK, &mut back) {
            Ok(()) => {
                assert!(back == block(lba, tag), "block {lba}");
                good += 1;
            }
            Err(error) => {
                assert!(error.to_string().contains("slot table page"), "{error}");
                refused += 1;
            }
        }
    }
    (good, refused)
}

/// Waits (boundedly) for the event that says a slot page left for later
/// cannot be read; returns its text.
fn slot_pages_unreadable_event(array: &Array) -> String {
    let said = (0..500).find_map(|_| {
        let found = array
            .events()
            .into_iter()
            .find(|e| matches!(e.what, tessera_array::events::What::SlotPagesUnreadable { .. }));
        if found.is_none() {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        found
    });
    said.expect("an event says a slot page cannot be read").what.to_string()
}

/// Whether the members' activity records come to say `want` of reading
/// every slot page at the next opening (any member asking counts),
/// waited for boundedly: a heartbeat carries the mark.
fn pages_mark_becomes(devices: &[Arc<MemoryDevice>], want: bool) -> bool {
    (0..300).any(|_| {
        let now = devices
            .iter()
            .filter_map(|d| tessera_array::activity::read(d.as_ref()))
            .any(|r| r.read_pages);
        if now != want {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        now == want
    })
}

/// The opening after one that could not read a slot page it left for
/// later: it refuses the checkpoint, naming the page, scans every slot,
/// loses nothing, and the members' mark clears.
fn opened_by_the_full_scan(devices: &[Arc<MemoryDevice>], model: &BTreeMap<u64, u64>) -> Array {
    let array = tessera_array::open(open_list(devices, &[])).unwrap();
    let recovery = array.status().unwrap().recovery;
    let error = recovery.checkpoint_error.clone().expect("the checkpoint refused");
    assert!(error.contains("slot table page"), "{error}");
    assert_eq!(recovery.slots_scanned, array.geometry().slot_count());
    verify(&array, model);
    array.check().unwrap();
    assert!(pages_mark_becomes(devices, false), "the mark cleared");
    assert!(!array.status().unwrap().slot_pages_unreadable);
    array
}

/// A slot page left for after opening that cannot be read (a map stripe
/// holding only slot pages' images, corrupt on three chunks of a 4+2):
/// opening serves; a read of a stripe the page lists, and what needs
/// every page (the engine's check, a checkpoint, so a clean stop), fail
/// naming it, and an event says so; other reads go on; the next opening, not after a
/// clean stop, reads every page, refuses the checkpoint, scans every
/// slot and loses nothing.
#[test]
fn a_slot_page_left_for_later_past_repair_fails_what_needs_it() {
    let (devices, array) = many_slots();
    let g = array.geometry().clone();
    let mut model = BTreeMap::new();
    // Twelve slot pages, as above.
    for first in (0..36_000u64).step_by(16) {
        write_run(&array, &mut model, first, 1);
    }
    array.close().unwrap();
    drop(array);
    let (array, pages) = opened_with_slot_pages_past_repair(&devices, &g);
    let s = array.status().unwrap();
    assert!(
        s.recovery.clean_stop && s.recovery.checkpoint_error.is_none(),
        "{:?}",
        s.recovery
    );
    let (good, refused) = read_around_a_bad_slot_page(&array, &model);
    assert!(good > 10_000 && refused > 0, "{good} blocks read, {refused} refused");
    let said = slot_pages_unreadable_event(&array);
    assert!(said.contains("slot table page"), "{said}");
    assert!(pages_mark_becomes(&devices, true), "the members ask for every page");
    assert!(array.status().unwrap().slot_pages_unreadable, "status says so");
    assert!(array.status().unwrap().slot_pages_unread > 0, "pages left for later");
    let error = array.check().unwrap_err();
    assert!(
        pages
            .iter()
            .any(|page| error.contains(&format!("slot table page {page}"))),
        "{error} (pages {pages:?})"
    );
    write_run(&array, &mut model, 0, 2);
    array.flush().unwrap();
    assert!(array.close().is_err(), "no clean stop without the pages");
    drop(array);

    opened_by_the_full_scan(&devices, &model);
}

/// Opening after kill -9 leaves the slot pages that do not list the
/// window's slots for later, as after a clean stop: the stripes replayed
/// overwrote blocks of stripes those pages list (their counts kept aside
/// until the pages are read), reads of those blocks read the pages, and
/// what walks every slot reads them all. Every count agrees with the
/// map, and every block reads back, after each of two kills.
#[test]
fn opening_after_kill_leaves_slot_pages_for_later() {
    let (devices, array) = many_slots();
    let mut model = BTreeMap::new();
    // Replayed after the kill: whole stripes of pages 1 to 3 emptied,
    // single blocks of others overwritten.
    runs_then_some_emptied(&array, &mut model, 2, 18_000);
    let mut rng = rand::rngs::StdRng::seed_from_u64(48);
    for _ in 0..200 {
        let lba = rng.gen_range(0..18_000u64);
        array.write(lba * BLOCK, &block(lba, 3), false).unwrap();
        model.insert(lba, 3);
    }
    array.flush().unwrap();
    let later = EngineOptions {
        slot_pages_in_background: false,
        background: false,
        ..EngineOptions::default()
    };
    let array = kill_and_reopen_with(&devices, array, later);
    let s = array.status().unwrap();
    assert!(
        !s.recovery.clean_stop && s.recovery.checkpoint_error.is_none(),
        "{:?}",
        s.recovery
    );
    assert!(s.recovery.stripes_replayed > 0, "{:?}", s.recovery);
    let deferred = s.recovery.slot_pages_deferred;
    assert!(
        deferred >= 3 && deferred < s.recovery.slot_pages,
        "{deferred} of {} slot pages left for later",
        s.recovery.slot_pages
    );
    assert_eq!(s.slot_pages_unread, deferred);
    verify(&array, &model);
    assert!(array.status().unwrap().slot_pages_unread < deferred, "reads read pages");
    for first in (0..18_000u64).step_by(16 * 11) {
        write_run(&array, &mut model, first, 4);
    }
    array.flush().unwrap();
    array.check().unwrap();
    assert_eq!(array.status().unwrap().slot_pages_unread, 0);
    verify(&array, &model);
    // Again, the pages read in the background this time.
    let array = flushed_killed_and_verified(&devices, array, EngineOptions::default(), &model);
    array.checkpoint().unwrap();
    array.check().unwrap();
}

/// As `a_slot_page_left_for_later_past_repair_fails_what_needs_it`, after
/// kill -9: opening leaves the bad page for later again, so only the
/// members' activity records, marked when it fails to read, send the
/// next opening to read every page, and so to the full scan. Without the
/// mark no opening would ever write a checkpoint again.
#[test]
fn a_slot_page_left_for_later_after_a_kill_past_repair_is_marked_for_the_next_opening() {
    let (devices, array) = many_slots();
    let g = array.geometry().clone();
    let mut model = BTreeMap::new();
    // Twelve slot pages: packed, several share a map stripe, and one
    // stripe must hold only pages opening leaves for later.
    runs_then_some_emptied(&array, &mut model, 2, 36_000);
    array.flush().unwrap();
    kill(&devices, array);
    let (array, pages) = opened_with_slot_pages_past_repair(&devices, &g);
    let s = array.status().unwrap();
    assert!(
        !s.recovery.clean_stop && s.recovery.checkpoint_error.is_none() && s.recovery.slot_pages_deferred > 0,
        "{:?}",
        s.recovery
    );
    let (good, refused) = read_around_a_bad_slot_page(&array, &model);
    assert!(good > 10_000 && refused > 0, "{good} blocks read, {refused} refused");
    let said = slot_pages_unreadable_event(&array);
    assert!(
        pages
            .iter()
            .any(|page| said.contains(&format!("slot table page {page}"))),
        "{said} (pages {pages:?})"
    );
    assert!(pages_mark_becomes(&devices, true), "the members ask for every page");
    assert!(array.status().unwrap().slot_pages_unreadable, "status says so");
    write_run(&array, &mut model, 0, 5);
    array.flush().unwrap();
    kill(&devices, array);

    let array = opened_by_the_full_scan(&devices, &model);
    kill(&devices, array);
    let array = tessera_array::open(open_list(&devices, &[])).unwrap();
    let recovery = array.status().unwrap().recovery;
    assert!(recovery.checkpoint_error.is_none(), "{recovery:?}");
    verify(&array, &model);
    array.check().unwrap();
}

/// Engine options for opening after a crash: the replay mapped after
/// opening (`later`) or before serving, no background thread (so what
/// is left waits for whoever needs it), and a map cache of `cache` bytes.
fn replaying(later: bool, cache: usize) -> EngineOptions {
    EngineOptions {
        replay_later: later,
        background: false,
        map_cache_bytes: cache,
        ..EngineOptions::default()
    }
}

/// What a replay leaves in the counts, to compare two ways of doing it.
fn counts(array: &Array) -> (u64, u64, u64) {
    let s = array.status().unwrap();
    (s.mapped_bytes, s.stored_bytes, s.map_mappings)
}

/// `thin_4_plus_2` with a block in each of 300 pages, stopped cleanly and
/// opened, then random blocks over those pages and 100 more, writes
/// across page boundaries and a TRIM over two page boundaries, FLUSHed,
/// and killed: the replay's records fall in ~400 pages.
fn killed_with_a_replay_over_many_pages() -> (Vec<Arc<MemoryDevice>>, BTreeMap<u64, u64>) {
    let (devices, array, mut model) = a_block_in_each_page_reopened(300);
    let mut rng = rand::rngs::StdRng::seed_from_u64(25);
    write_random(&array, &mut model, &mut rng, 1_500, 400);
    for p in [17u64, 18, 250, 399] {
        // Two blocks, the last of page p and the first of the next.
        let lba = p * PAGE + PAGE - 1;
        let mut two = block(lba, 7);
        two.extend(block(lba + 1, 7));
        array.write(lba * BLOCK, &two, false).unwrap();
        model.insert(lba, 7);
        model.insert(lba + 1, 7);
    }
    let (from, to) = (40 * PAGE + 100, 42 * PAGE + 100);
    array.trim(from * BLOCK, (to - from) * BLOCK, false).unwrap();
    model.retain(|&lba, _| lba < from || lba >= to);
    array.flush().unwrap();
    kill(&devices, array);
    (devices, model)
}

#[test]
fn a_replay_mapped_after_opening_serves_before_it_is_done_and_ends_as_one_mapped_before() {
    let (devices, mut model) = killed_with_a_replay_over_many_pages();
    // Mapped before serving: what every block reads and what the counts
    // say, to compare with.
    let array = tessera_array::open_with(open_list(&devices, &[]), replaying(false, 64 << 20)).unwrap();
    let eager = array.status().unwrap().recovery;
    assert_eq!(eager.pages_mapped_later, 0, "{eager:?}");
    verify(&array, &model);
    array.check().unwrap();
    let before = counts(&array);
    // Killed again before any checkpoint: the next opening replays the
    // same stripes (and the one that opening wrote the intent log's
    // records to).
    kill(&devices, array);
    // Mapped after opening: no map page read to open, every block reads
    // as it did, and the counts end the same.
    let array = tessera_array::open_with(open_list(&devices, &[]), replaying(true, 64 << 20)).unwrap();
    let s = array.status().unwrap();
    assert!(
        s.recovery.stripes_replayed >= eager.stripes_replayed,
        "{:?}",
        s.recovery
    );
    assert!(s.recovery.pages_mapped_later >= 300, "{:?}", s.recovery);
    assert_eq!(s.map_page_misses, 0, "opening read map pages: {:?}", s.recovery);
    assert_eq!(s.replay_pages_waiting, s.recovery.pages_mapped_later);
    verify(&array, &model);
    array.check().unwrap();
    assert_eq!(array.status().unwrap().replay_pages_waiting, 0);
    assert_eq!(counts(&array), before, "mapped, stored, mappings");
    kill(&devices, array);
    // With a cache of a few pages (pages read, mapped and evicted in
    // turn): writes, a TRIM and reads into pages still waiting, then a
    // kill before the rest is mapped.
    let array = tessera_array::open_with(open_list(&devices, &[]), replaying(true, 16 << 10)).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(26);
    write_random(&array, &mut model, &mut rng, 200, 400);
    let (from, to) = (120 * PAGE, 120 * PAGE + 300);
    array.trim(from * BLOCK, (to - from) * BLOCK, false).unwrap();
    model.retain(|&lba, _| lba < from || lba >= to);
    let mut back = vec![0u8; BLOCK as usize];
    for (&lba, &tag) in model.range(200 * PAGE..260 * PAGE) {
        array.read(lba * BLOCK, &mut back).unwrap();
        assert!(back == block(lba, tag), "block {lba} (tag {tag})");
    }
    let waiting = array.status().unwrap().replay_pages_waiting;
    assert!(
        waiting > 0 && waiting < s.recovery.pages_mapped_later,
        "{waiting} pages waiting"
    );
    array.flush().unwrap();
    kill(&devices, array);
    // Opened again: the first replay's stripes and the writes since.
    let array = tessera_array::open_with(open_list(&devices, &[]), replaying(true, 16 << 10)).unwrap();
    assert!(array.status().unwrap().recovery.pages_mapped_later > 0);
    verify(&array, &model);
    array.check().unwrap();
    array.close().unwrap();
    drop(array);
    let array = tessera_array::open(open_list(&devices, &[])).unwrap();
    assert!(array.status().unwrap().recovery.clean_stop);
    verify(&array, &model);
    array.check().unwrap();
}

#[test]
fn a_replay_with_a_trim_of_many_pages_is_mapped_before_serving() {
    // A TRIM spanning more than `REPLAY_LATER_SPAN_PAGES_MAX` pages would
    // wait in each of them: the whole replay is mapped before serving.
    let (devices, array, mut model) = a_block_in_each_page_reopened(300);
    let (from, to) = (10 * PAGE, 200 * PAGE);
    array.trim(from * BLOCK, (to - from) * BLOCK, false).unwrap();
    model.retain(|&lba, _| lba < from || lba >= to);
    // Enough after it that its stripe is sealed, not only logged.
    let mut rng = rand::rngs::StdRng::seed_from_u64(27);
    write_random(&array, &mut model, &mut rng, 600, 8);
    array.flush().unwrap();
    kill(&devices, array);
    let array = tessera_array::open_with(open_list(&devices, &[]), replaying(true, 64 << 20)).unwrap();
    let s = array.status().unwrap();
    assert!(s.recovery.stripes_replayed > 0, "{:?}", s.recovery);
    assert_eq!(s.recovery.pages_mapped_later, 0, "{:?}", s.recovery);
    verify(&array, &model);
    array.check().unwrap();
}

/// 4+2 on six 64 MiB members, exported at 200 MiB, written whole and then
/// overwritten at random (40,000 blocks), a checkpoint, `after` blocks
/// more at random, FLUSHed: the checkpoint's window holds stripes garbage
/// collection emptied and wrote again. With an intent log on the members
/// (the default) or, not `log`, none. Returns the members, the array,
/// the model, the export's blocks, every tag each block was written
/// with, and where chunk headers were at the checkpoint (slot ->
/// sequence of the data stripe each slot then held).
#[allow(clippy::type_complexity)]
fn full_array_overwritten_past_a_checkpoint(
    log: bool,
    after: usize,
) -> (
    Vec<Arc<MemoryDevice>>,
    Array,
    BTreeMap<u64, u64>,
    u64,
    BTreeMap<u64, Vec<u64>>,
    BTreeMap<u64, u64>,
) {
    let devices = six_members();
    let options = tessera_array::CreateOptions {
        logical_bytes: Some(200 << 20),
        log_bytes: (!log).then_some(0),
        ..tessera_array::CreateOptions::new(4, 2)
    };
    let array = tessera_array::create_with(named(&devices), &options, replaying(true, 64 << 20)).unwrap();
    let g = array.geometry().clone();
    let blocks = (200 << 20) / BLOCK;
    let (mut model, mut tags) = (BTreeMap::new(), BTreeMap::<u64, Vec<u64>>::new());
    let mut rng = rand::rngs::StdRng::seed_from_u64(28);
    let mut write = |array: &Array, model: &mut BTreeMap<u64, u64>, lba: u64| {
        let tag = rng.gen::<u32>() as u64;
        array.write(lba * BLOCK, &block(lba, tag), false).unwrap();
        model.insert(lba, tag);
        tags.entry(lba).or_default().push(tag);
    };
    for lba in 0..blocks {
        write(&array, &mut model, lba);
    }
    let mut at = rand::rngs::StdRng::seed_from_u64(29);
    for _ in 0..40_000 {
        write(&array, &mut model, at.gen_range(0..blocks));
    }
    array.checkpoint().unwrap();
    let held = data_stripes_held(&devices, &g);
    for _ in 0..after {
        write(&array, &mut model, at.gen_range(0..blocks));
    }
    array.flush().unwrap();
    let s = array.status().unwrap();
    assert!(s.gc_bytes_relocated > 0, "no garbage collected: {s:?}");
    (devices, array, model, blocks, tags, held)
}

#[test]
fn a_replay_on_a_full_array_is_mapped_after_opening() {
    // The slot table the checkpoint restores counts pieces in slots the
    // replay finds newer stripes in: those pages are checked as they are
    // mapped, where the replay was mapped before serving.
    let (devices, array, mut model, blocks, _, _) = full_array_overwritten_past_a_checkpoint(true, 30_000);
    // A TRIM, so that writing there again adds live data.
    let trimmed = 1_000..1_256u64;
    array.trim(trimmed.start * BLOCK, 256 * BLOCK, false).unwrap();
    model.retain(|lba, _| !trimmed.contains(lba));
    array.flush().unwrap();
    kill(&devices, array);
    let array = tessera_array::open_with(open_list(&devices, &[]), replaying(true, 64 << 20)).unwrap();
    let s = array.status().unwrap();
    assert!(s.recovery.checkpoint_error.is_none(), "{:?}", s.recovery);
    assert!(s.recovery.replayed_slots_reused > 0, "{:?}", s.recovery);
    assert!(s.recovery.pages_mapped_later > 0, "{:?}", s.recovery);
    assert!(s.replay_pages_waiting > 0, "{s:?}");
    assert_eq!(s.replay_pages_stale, 0);
    // Admission counts both what the waiting records overwrote and what
    // they add (more than the array has room for here): refused so, the
    // write maps them first and is asked about again.
    for lba in trimmed {
        array.write(lba * BLOCK, &block(lba, 2), false).unwrap();
        model.insert(lba, 2);
    }
    // Writes that need garbage collected (which maps the rest first).
    let mut rng = rand::rngs::StdRng::seed_from_u64(30);
    write_random(&array, &mut model, &mut rng, 3_000, blocks / PAGE);
    assert_eq!(array.status().unwrap().replay_pages_waiting, 0);
    verify(&array, &model);
    array.check().unwrap();
    array.checkpoint().unwrap();
    let array = flushed_killed_and_verified(&devices, array, EngineOptions::default(), &model);
    array.check().unwrap();
}

/// Garbage collection while a replay waits to be mapped reads only the
/// pages its victims' records land in, not every page the replay left
/// (on a killed full 8+2 array of 24 GiB on a slow disk, mapping every
/// waiting page took 1.6 s of a round a writer waited for: PERFORMANCE.md,
/// "Garbage collected while a replay waits"). It failed before (0 of
/// 100 pages still waiting after 4 rounds). 4+2 on six 64 MiB members exported at 200 MiB,
/// filled in order, a checkpoint, random writes over every page, kill;
/// opened with the replay left for later (and no background thread to
/// map it), then random writes confined to four pages until collection
/// has run: its victims hold those pages' blocks, and the other pages
/// still wait. Every block then reads back, before and after a kill.
#[test]
fn garbage_collected_while_a_replay_waits_maps_only_its_victims_pages() {
    let devices = six_members();
    let options = tessera_array::CreateOptions {
        logical_bytes: Some(200 << 20),
        ..tessera_array::CreateOptions::new(4, 2)
    };
    let array = tessera_array::create_with(named(&devices), &options, replaying(true, 64 << 20)).unwrap();
    let blocks = (200 << 20) / BLOCK;
    let mut model = BTreeMap::new();
    const RUN: u64 = 64;
    for first in (0..blocks).step_by(RUN as usize) {
        let mut run = Vec::with_capacity((RUN * BLOCK) as usize);
        for lba in first..first + RUN {
            run.extend(block(lba, 1));
            model.insert(lba, 1);
        }
        array.write(first * BLOCK, &run, false).unwrap();
    }
    array.checkpoint().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(31);
    write_random(&array, &mut model, &mut rng, 3_000, blocks / PAGE);
    array.flush().unwrap();
    kill(&devices, array);
    let array = tessera_array::open_with(open_list(&devices, &[]), replaying(true, 64 << 20)).unwrap();
    let s = array.status().unwrap();
    assert!(s.recovery.checkpoint_error.is_none(), "{:?}", s.recovery);
    let waiting = s.replay_pages_waiting;
    assert!(
        waiting >= blocks / PAGE * 9 / 10,
        "{waiting} pages waiting: {:?}",
        s.recovery
    );
    let (rounds, checkpoints) = (s.gc_rounds, s.checkpoints_written);
    const PAGES: u64 = 4;
    let mut written = 0;
    while array.status().unwrap().gc_rounds == rounds {
        assert!(written < 100_000, "no garbage collected after {written} writes");
        write_random(&array, &mut model, &mut rng, 500, PAGES);
        written += 500;
    }
    let s = array.status().unwrap();
    assert!(
        s.replay_pages_waiting + PAGES >= waiting,
        "{} of {waiting} pages still waiting after {} rounds of collection and {} checkpoints ({written} writes)",
        s.replay_pages_waiting,
        s.gc_rounds - rounds,
        s.checkpoints_written - checkpoints
    );
    verify(&array, &model);
    array.check().unwrap();
    let array = flushed_killed_and_verified(&devices, array, replaying(true, 64 << 20), &model);
    drop(array);
}

/// Whether `back`, read from block `lba`, is what one of the writes to
/// it (`tags`) wrote.
fn one_of_its_writes(back: &[u8], lba: u64, tags: &BTreeMap<u64, Vec<u64>>) -> bool {
    tags[&lba].iter().any(|&tag| back == block(lba, tag))
}

/// Kills `array`, then erases every stripe the window gained (newer than
/// the checkpoint) in a slot that held no data stripe at the checkpoint
/// (not in `held`), as a lost write would leave it: blocks those stripes
/// overwrote, or that garbage collection copied out of a slot used again
/// since, are then mapped by the checkpoint alone into slots that hold
/// newer stripes.
fn killed_with_window_stripes_erased(devices: &[Arc<MemoryDevice>], array: Array, held: &BTreeMap<u64, u64>) {
    let g = array.geometry().clone();
    kill(devices, array);
    let (kept, erased) = window_stripes(devices, &g, held);
    assert!(!kept.is_empty() && !erased.is_empty(), "{kept:?} {erased:?}");
    let zeros = vec![0u8; SECTOR_BYTES + g.chunk_bytes];
    for &slot in &erased {
        for j in 0..g.width() {
            let (member, row) = g.place(slot, j);
            devices[member].write_at(&zeros, g.row_offset(row)).unwrap();
        }
    }
}

/// The slots of the data stripes on `devices` newer than the durable
/// checkpoint: those `held` names, and the others.
fn window_stripes(devices: &[Arc<MemoryDevice>], g: &Geometry, held: &BTreeMap<u64, u64>) -> (Vec<u64>, Vec<u64>) {
    let from = superblock(devices).checkpoint.expect("a checkpoint").sequence;
    let mut newest: BTreeMap<u64, u64> = BTreeMap::new();
    for (_, _, h) in common::headers(devices, g) {
        if h.stream != tessera_array::format::Stream::Meta && h.sequence > from {
            let seen = newest.entry(h.slot).or_default();
            *seen = (*seen).max(h.sequence);
        }
    }
    newest.keys().partition(|slot| held.contains_key(slot))
}

/// Where the data stripes are on `devices` (slot -> sequence of the one
/// each slot holds), read at a checkpoint: what
/// `killed_with_window_stripes_erased` tells the window's stripes by.
fn data_stripes_held(devices: &[Arc<MemoryDevice>], g: &Geometry) -> BTreeMap<u64, u64> {
    common::headers(devices, g)
        .into_iter()
        .filter(|(_, _, h)| h.stream != tessera_array::format::Stream::Meta)
        .map(|(_, _, h)| (h.slot, h.sequence))
        .collect()
}

/// A checkpoint, where the data stripes are then, and rounds of `more`
/// (writes, FLUSHed) until the data stripes newer than the checkpoint lie
/// both in slots that held one then and in others (`window_stripes`),
/// what `killed_with_window_stripes_erased` needs; 40 rounds at most.
/// Where a writer takes a checkpoint meanwhile (the window spent), it
/// starts again from that one: told apart from slots held many windows
/// back, the stripes newer than the last checkpoint at times all lay in
/// slots held then (1 run in 16 of the suite under load).
fn held_at_a_checkpoint_until_the_window_holds_both(
    devices: &[Arc<MemoryDevice>],
    array: &Array,
    mut more: impl FnMut(&Array),
) -> BTreeMap<u64, u64> {
    let g = array.geometry().clone();
    let checkpoints = || array.status().unwrap().checkpoints_written;
    array.checkpoint().unwrap();
    let (mut held, mut at) = (data_stripes_held(devices, &g), checkpoints());
    for _ in 0..40 {
        more(array);
        if checkpoints() != at {
            array.checkpoint().unwrap();
            (held, at) = (data_stripes_held(devices, &g), checkpoints());
            continue;
        }
        let (kept, erased) = window_stripes(devices, &g, &held);
        if !kept.is_empty() && !erased.is_empty() {
            break;
        }
    }
    held
}

/// Opened after the map was found stale (by `open_with`, or by the
/// opening before this one, which marked the members): the checkpoint
/// refused, every slot scanned, every block one of its writes or never
/// mapped (the erased stripes held its newest ones), the engine's check
/// passes, and the members' mark is cleared.
fn opened_by_the_scan_after_a_stale_map(devices: &[Arc<MemoryDevice>], blocks: u64, tags: &BTreeMap<u64, Vec<u64>>) {
    let array = tessera_array::open_with(open_list(devices, &[]), replaying(true, 64 << 20)).unwrap();
    let recovery = array.status().unwrap().recovery;
    let error = recovery.checkpoint_error.clone().expect("the checkpoint refused");
    assert!(error.contains("which holds a newer stripe"), "{error}");
    assert_eq!(recovery.slots_scanned, array.geometry().slot_count());
    let mut back = vec![0u8; BLOCK as usize];
    for lba in 0..blocks {
        array.read(lba * BLOCK, &mut back).unwrap();
        let never = back.iter().all(|&b| b == 0);
        assert!(never || one_of_its_writes(&back, lba, tags), "block {lba}");
    }
    array.check().unwrap();
    assert!(pages_mark_becomes(devices, false), "the mark cleared");
}

/// A replay mapped after opening that finds the checkpoint's map pointing
/// into a replayed slot where it wrote nothing (`killed_with_window_stripes_erased`).
/// Eager replay refuses such a checkpoint and scans every slot; mapped
/// after opening, the pages so found are refused (reads and writes there
/// fail naming the block and slot, never a wrong byte), the replay never
/// finishes (no checkpoint, the engine's check fails), and the members
/// ask the next opening to map the replay before serving: it refuses the
/// checkpoint and scans every slot. (No intent log, so that opening
/// brings in no page: see the next test.)
#[test]
fn a_page_the_replay_finds_stale_after_opening_is_refused_and_the_next_opening_scans() {
    let (devices, array, _, blocks, tags, held) = full_array_overwritten_past_a_checkpoint(false, 6_000);
    killed_with_window_stripes_erased(&devices, array, &held);
    let array = tessera_array::open_with(open_list(&devices, &[]), replaying(true, 64 << 20)).unwrap();
    let s = array.status().unwrap();
    assert!(s.recovery.checkpoint_error.is_none(), "{:?}", s.recovery);
    assert!(s.recovery.replayed_slots_reused > 0, "{:?}", s.recovery);
    let (mut good, mut refused) = (0, 0);
    let mut back = vec![0u8; BLOCK as usize];
    for lba in 0..blocks {
        match array.read(lba * BLOCK, &mut back) {
            Ok(()) => {
                assert!(one_of_its_writes(&back, lba, &tags), "block {lba}");
                good += 1;
            }
            Err(error) => {
                assert!(error.to_string().contains("which holds a newer stripe"), "{error}");
                refused += 1;
            }
        }
    }
    // How many are refused depends on where the window's slots were
    // (54-57% with format 14's smaller slot pages, under half with
    // format 13's): many must still be read.
    assert!(
        good > blocks / 3 && refused > 0,
        "{good} blocks read, {refused} refused"
    );
    let stale_lba = (0..blocks)
        .find(|&lba| array.read(lba * BLOCK, &mut back).is_err())
        .expect("a block refused");
    let error = array.write(stale_lba * BLOCK, &block(stale_lba, 1), false).unwrap_err();
    assert!(error.to_string().contains("which holds a newer stripe"), "{error}");
    assert!(array.status().unwrap().replay_pages_stale > 0);
    let error = array.check().unwrap_err();
    assert!(error.contains("which holds a newer stripe"), "{error}");
    assert!(array.checkpoint().is_err(), "no checkpoint over a stale map");
    assert!(
        pages_mark_becomes(&devices, true),
        "the members ask for the replay before serving"
    );
    kill(&devices, array);

    opened_by_the_scan_after_a_stale_map(&devices, blocks, &tags);
}

/// As above with an intent log: opening replays its records as a client's
/// writes, which brings in their pages (and may need room, which maps the
/// whole replay): the stale map is found before serving, and opening
/// starts again with everything done before serving, so the same opening
/// refuses the checkpoint and scans every slot.
#[test]
fn a_page_the_replay_finds_stale_while_opening_sends_it_to_the_scan() {
    let (devices, array, _, blocks, mut tags, _) = full_array_overwritten_past_a_checkpoint(true, 100_000);
    // From a checkpoint taken now (writers took ~50 since the one the
    // helper read the stripes at), rounds of random writes (so that the
    // window takes stripes garbage collection emptied and wrote again),
    // then a block in each page, each FLUSHed alone so that the log
    // holds it (until a stripe fills with them): opening's replay of the
    // log brings in its pages, tens of the 100, where the erased
    // stripes' blocks lie in about half. (Without them, whether opening
    // brought in a stale page depended on where the window's slots were,
    // and with format 15's smaller checkpoints it brought in none.)
    let pages = blocks.div_ceil(tessera_array::limits::MAP_PAGE_BLOCKS);
    let mut rng = rand::rngs::StdRng::seed_from_u64(31);
    let mut round = 0;
    let held = held_at_a_checkpoint_until_the_window_holds_both(&devices, &array, |array| {
        for _ in 0..1_000 {
            let (lba, tag) = (rng.gen_range(0..blocks), rng.gen::<u32>() as u64);
            array.write(lba * BLOCK, &block(lba, tag), false).unwrap();
            tags.entry(lba).or_default().push(tag);
        }
        for page in 0..pages {
            let (lba, tag) = (
                page * tessera_array::limits::MAP_PAGE_BLOCKS + page % 7,
                7 + page + 1000 * round,
            );
            array.write(lba * BLOCK, &block(lba, tag), false).unwrap();
            tags.entry(lba).or_default().push(tag);
            array.flush().unwrap();
        }
        round += 1;
    });
    assert!(
        array.status().unwrap().log.unwrap().live_bytes > 0,
        "the blocks in the log"
    );
    killed_with_window_stripes_erased(&devices, array, &held);
    opened_by_the_scan_after_a_stale_map(&devices, blocks, &tags);
}

/// A directory page of which a few entries change between checkpoints
/// is written as a delta over its image (FORMAT.md, "Directory page
/// deltas"), each listing every page changed since the image, until the
/// deltas would take more than the page whole (then whole again): for
/// much less than the page whole each time, and read back exactly with a
/// cache too small to keep it, after a clean stop, after kill -9 (a delta
/// written after each opening must list what the one before it did, or
/// those pages read back as their older images), and with the stripe
/// its delta is in corrupt on M members.
#[test]
fn directory_pages_changed_in_a_few_entries_are_written_as_deltas_and_read_back_exactly() {
    let (devices, array) = thin_4_plus_2();
    let g = array.geometry().clone();
    let mut model = BTreeMap::new();
    // A block in each of 400 map pages: directory page 0 names them all.
    let pages = 400u64;
    for p in 0..pages {
        let lba = p * PAGE;
        array.write(lba * BLOCK, &block(lba, 1), false).unwrap();
        model.insert(lba, 1);
    }
    array.checkpoint().unwrap();
    let whole = u64::from(root(&devices).images.dirs[&0].bytes);
    let mut rng = rand::rngs::StdRng::seed_from_u64(53);
    // Three pages' worth of overwrites a round, then a checkpoint.
    let mut rounds = |array: &Array, model: &mut BTreeMap<u64, u64>, count: u64, tag: u64| {
        for round in 0..count {
            for _ in 0..3 {
                let lba = rng.gen_range(0..pages) * PAGE + rng.gen_range(0..PAGE);
                array.write(lba * BLOCK, &block(lba, tag + round), false).unwrap();
                model.insert(lba, tag + round);
            }
            array.checkpoint().unwrap();
        }
    };
    let parts = |array: &Array| array.status().unwrap().checkpoint_parts;
    let before = parts(&array);
    rounds(&array, &mut model, 30, 100);
    let after = parts(&array);
    let (wholes, deltas) = (
        after.directory_pages - before.directory_pages,
        after.directory_page_deltas - before.directory_page_deltas,
    );
    // Written whole again once the deltas since its image grew to its size.
    assert!(deltas > 0 && wholes > 0, "{wholes} bytes whole, {deltas} of deltas");
    assert!(
        wholes + deltas < 30 * whole / 3,
        "{wholes} + {deltas} bytes of directory pages in 30 rounds, {whole} a round whole"
    );
    verify(&array, &model);
    array.check().unwrap();

    // Read back through a cache too small to keep it: after a clean stop,
    // changed again (a delta after opening), and after kill -9.
    let small = || cached(8 << 10);
    array.close().unwrap();
    drop(array);
    let array = tessera_array::open_with(open_list(&devices, &[]), small()).unwrap();
    verify(&array, &model);
    rounds(&array, &mut model, 2, 200);
    let named = root(&devices);
    let dir = &named.images.dirs[&0];
    let delta = dir.delta.as_ref().expect("directory page 0 written as a delta");
    assert!(u64::from(named.images.dir_deltas[&0]) >= u64::from(delta.bytes));
    assert!(u64::from(named.images.dir_deltas[&0]) <= whole + 64, "{named:?}");
    array.close().unwrap();
    drop(array);
    let array = tessera_array::open_with(open_list(&devices, &[]), small()).unwrap();
    verify(&array, &model);
    array.check().unwrap();
    rounds(&array, &mut model, 1, 300);
    let array = flushed_killed_and_verified(&devices, array, small(), &model);
    array.check().unwrap();
    rounds(&array, &mut model, 1, 400);
    array.close().unwrap();
    drop(array);

    // The stripe the delta is in, corrupt on two members (of 4+2): its
    // chunk holding the delta and another.
    let named = root(&devices);
    let delta = named.images.dirs[&0]
        .delta
        .clone()
        .expect("a delta over directory page 0");
    let piece = delta.pieces[0];
    let chunk = piece.offset as usize / g.chunk_bytes;
    let within = piece.offset as usize % g.chunk_bytes;
    corrupt_at(&devices, &g, piece.slot, chunk, within);
    corrupt_at(&devices, &g, piece.slot, (chunk + 1) % g.data, 10);
    let array = tessera_array::open_with(open_list(&devices, &[]), small()).unwrap();
    verify(&array, &model);
    let s = array.status().unwrap();
    assert!(s.chunks_repaired >= 1, "{s:?}");
    array.check().unwrap();
}

/// A slot's counts that do not fit the bits the table packs them in are
/// kept in a map beside it (a stripe of 64 MiB of data or more needs
/// that; `EngineOptions::slot_counts_narrow` makes every slot of 15
/// pieces or more need it here): the same writes count the same, the
/// engine's check passes (it fails on counts beside that would fit), and
/// every block reads back after a checkpoint, a clean stop and kill -9,
/// opened with either packing (it is in memory only).
#[test]
fn counts_kept_beside_the_slot_table_read_back() {
    let narrow = EngineOptions {
        slot_counts_narrow: true,
        ..EngineOptions::default()
    };
    let mut tables = Vec::new();
    for engine in [narrow.clone(), EngineOptions::default()] {
        let devices = six_members();
        let options = tessera_array::CreateOptions::new(4, 2);
        let array = tessera_array::create_with(named(&devices), &options, engine.clone()).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(81);
        let mut model = BTreeMap::new();
        // Sequential runs first (stripes of 64 raw blocks, one piece a
        // block), then random overwrites that cut some of them down.
        for lba in 0..4_096 {
            array.write(lba * BLOCK, &block(lba, 1), false).unwrap();
            model.insert(lba, 1);
        }
        array.check().unwrap();
        let full = array.status().unwrap().slot_table_bytes;
        write_random(&array, &mut model, &mut rng, 3_000, 8);
        array.check().unwrap();
        tables.push(full);
        array.checkpoint().unwrap();
        array.close().unwrap();
        // Opened with the other packing, then killed and opened again
        // with the first.
        let other = EngineOptions {
            slot_counts_narrow: !engine.slot_counts_narrow,
            ..engine.clone()
        };
        let array = tessera_array::open_with(open_list(&devices, &[]), other).unwrap();
        verify(&array, &model);
        array.check().unwrap();
        write_random(&array, &mut model, &mut rng, 1_000, 8);
        let array = flushed_killed_and_verified(&devices, array, engine, &model);
        write_random(&array, &mut model, &mut rng, 500, 8);
        array.check().unwrap();
        verify(&array, &model);
    }
    // The narrow packing keeps the counts of the full stripes beside
    // (some 30 bytes a slot more): the table takes more memory for the
    // same writes.
    let (narrow, fitted) = (tables[0], tables[1]);
    assert!(narrow > fitted, "{narrow} {fitted}");
}
