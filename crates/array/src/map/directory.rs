//! The map's directory: where each map page's durable image is.
//!
//! The images of map pages `512 d .. 512 d + 511` are named by directory
//! page `d` (`MAP_DIRECTORY_PAGES`), itself an image in a map stripe
//! (FORMAT.md, "Map directory"); the root names the directory pages. So
//! the root, and what memory must hold before any page is read, grow by
//! one entry per GiB of keys written rather than one per 2 MiB: 1 M
//! random blocks scattered over a terabyte fell in 453,349 map pages,
//! whose places alone held ~97 MB from opening on (PERFORMANCE.md).
//!
//! A directory page is resident (its entries in memory) or held only as
//! its image, read back when a lookup needs it, and evicted with the map
//! pages when the cache is full. It changes only when a checkpoint that
//! wrote it is durable (`publish`), so it is always as its image says.
//!
//! # Guarantees
//!
//! - `lookup` answers from memory, or says which directory page to read.
//! - A directory page is installed only if it is still held as the image
//!   it was read from.
//! - Totals (pages named, their images' bytes) follow every publish.

use super::btree_entry_bytes;
use crate::format::PageImage;
use crate::limits::MAP_DIRECTORY_PAGES;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Map pages to their images: what a directory page names.
pub type Images = BTreeMap<u64, Arc<PageImage>>;

/// A directory page's entries, and the map pages whose entries changed
/// since its image: those the delta over it lists (none without one).
/// Its next delta lists them and those changed since.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DirEntries {
    pub images: Images,
    pub changed: BTreeSet<u64>,
}

/// The directory page that names map page `page`.
pub fn dir_of(page: u64) -> u64 {
    page / MAP_DIRECTORY_PAGES
}

/// The map pages directory page `dir` names.
pub fn pages_under(dir: u64) -> std::ops::Range<u64> {
    dir * MAP_DIRECTORY_PAGES..(dir + 1) * MAP_DIRECTORY_PAGES
}

/// Those of `sorted` (in page order, `page` saying each one's page) that
/// directory page `dir` names.
pub fn under_directory_page<T>(sorted: &[T], dir: u64, page: impl Fn(&T) -> u64) -> &[T] {
    let pages = pages_under(dir);
    let from = sorted.partition_point(|t| page(t) < pages.start);
    let to = sorted.partition_point(|t| page(t) < pages.end);
    &sorted[from..to]
}

/// What the directory says of a map page.
#[derive(Debug)]
pub enum Lookup {
    /// No durable image: the page was never written, or emptied.
    None,
    Image(Arc<PageImage>),
    /// The page's directory page (this one) is held only as its image.
    NotInMemory(u64),
}

/// A directory page as a durable checkpoint wrote it (`Directory::publish`):
/// its entries packed (`None`: not kept, for one not in memory when the
/// checkpoint wrote it), the pages it names and their images' bytes, its
/// own image (with the delta over it, if written as one), and the map
/// pages changed since that image.
pub struct NewDir {
    images: Option<Packed>,
    totals: (u64, u64),
    own: Arc<PageImage>,
    changed: BTreeSet<u64>,
}

impl NewDir {
    /// Written whole: its entries as its stored image has them
    /// (`format::encode_directory_image`).
    pub fn whole(dir: u64, stored: &[u8], digest_bytes: usize, own: Arc<PageImage>) -> NewDir {
        let images = Packed::from_stored(dir, stored, digest_bytes);
        NewDir {
            totals: images.totals(),
            images: Some(images),
            own,
            changed: BTreeSet::new(),
        }
    }

    /// Written as a delta over its image (`own` names both): its entries
    /// now, packed from `images` (no whole image is encoded for it).
    pub fn delta(dir: u64, images: &Images, own: Arc<PageImage>, changed: BTreeSet<u64>) -> NewDir {
        let images = Packed::pack(dir, images);
        NewDir {
            totals: images.totals(),
            images: Some(images),
            own,
            changed,
        }
    }

    /// Written, whole or as a delta (`own`), its entries `images` not
    /// kept: it was not in memory, and stays out (read back when a lookup
    /// needs it). A checkpoint after writes all over a large array
    /// rewrites most directory pages, and kept them all until it was
    /// durable: 16 MB of a heap's 85 MB peak with a 32 MiB map cache
    /// (PERFORMANCE.md, "A checkpoint's working memory").
    /// `changed`: the pages its delta lists (none if written whole).
    pub fn out_of_memory(images: &Images, own: Arc<PageImage>, changed: BTreeSet<u64>) -> NewDir {
        NewDir {
            images: None,
            totals: (images.len() as u64, images.values().map(|i| i.stored_bytes()).sum()),
            own,
            changed,
        }
    }
}

/// A directory page in memory: the images it names, packed, and its own.
struct DirPage {
    images: Packed,
    own: Arc<PageImage>,
    changed: BTreeSet<u64>,
    /// The map's clock when last looked at.
    used: AtomicU64,
}

impl DirPage {
    /// Bytes it holds in memory: its entry in the index of directory
    /// pages, its packed images, the set of the pages changed.
    fn bytes(&self) -> usize {
        btree_entry_bytes(8, std::mem::size_of::<DirPage>())
            + self.images.bytes()
            + self.changed.len() * btree_entry_bytes(8, 0)
    }
}

/// A directory page's entries packed as its image has them (page u64 |
/// stored bytes u32 | pieces u32 | digest | per piece: slot u64, offset
/// u32, bytes u32), with each one's page and place: 44 bytes an entry
/// with CRC32C, where a `PageImage` in an `Arc` in a B-tree took ~170
/// (a 1 TiB export's 1,024 directory pages filled a 32 MiB cache and left
/// no room for the map pages). An image is built when one is needed:
/// when its page is read in, or by a checkpoint.
struct Packed {
    bytes: Vec<u8>,
    /// Each entry's page (less `first`) and where it starts in `bytes`,
    /// in page order.
    index: Vec<(u16, u32)>,
    /// The directory page's first map page.
    first: u64,
    digest_bytes: usize,
}

impl Packed {
    fn pack(dir: u64, images: &Images) -> Packed {
        let digest_bytes = images.values().next().map_or(0, |i| i.digest.as_bytes().len());
        let mut packed = Packed {
            bytes: Vec::new(),
            index: Vec::with_capacity(images.len()),
            first: dir * MAP_DIRECTORY_PAGES,
            digest_bytes,
        };
        for (&page, image) in images {
            debug_assert_eq!(image.digest.as_bytes().len(), digest_bytes);
            debug_assert_eq!(dir_of(page), dir);
            let key = (page - packed.first) as u16;
            packed.index.push((key, packed.bytes.len() as u32));
            crate::format::encode_directory_entry(&mut packed.bytes, page, image);
        }
        packed.bytes.shrink_to_fit();
        packed
    }

    /// A directory page's entries as its stored image (`format::encode_directory_image`,
    /// checked or just made) has them.
    fn from_stored(dir: u64, stored: &[u8], digest_bytes: usize) -> Packed {
        const HEADER: usize = crate::format::STORED_IMAGE_HEADER_BYTES + 24;
        let bytes = stored[HEADER..].to_vec();
        let mut index = Vec::new();
        let mut at = 0;
        let first = dir * MAP_DIRECTORY_PAGES;
        while at < bytes.len() {
            let page = u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
            assert_eq!(dir_of(page), dir, "directory page {dir} names page {page}");
            index.push(((page - first) as u16, at as u32));
            at = crate::format::directory_entry_parts(&bytes, at, digest_bytes).0;
        }
        assert_eq!(at, bytes.len(), "directory page {dir}'s entries");
        Packed {
            bytes,
            index,
            first,
            digest_bytes,
        }
    }

    /// Pages named, and their images' stored bytes (their deltas' too).
    fn totals(&self) -> (u64, u64) {
        let bytes = self.index.iter().map(|&(_, at)| self.image_at(at).stored_bytes());
        (self.index.len() as u64, bytes.sum())
    }

    /// The image (with its delta) of the entry that starts at `at`.
    fn image_at(&self, at: u32) -> PageImage {
        use crate::format::{decode_image_place, directory_entry_parts};
        let (_, image, delta) = directory_entry_parts(&self.bytes, at as usize, self.digest_bytes);
        PageImage {
            delta: delta.map(|d| Arc::new(decode_image_place(&self.bytes, d, self.digest_bytes))),
            ..decode_image_place(&self.bytes, image, self.digest_bytes)
        }
    }

    fn get(&self, page: u64) -> Option<PageImage> {
        self.find(page).map(|i| self.image_at(self.index[i].1))
    }

    /// Where page `page`'s entry is in `index`, if it has one.
    fn find(&self, page: u64) -> Option<usize> {
        let key = page.checked_sub(self.first).filter(|&k| k < MAP_DIRECTORY_PAGES)? as u16;
        self.index.binary_search_by_key(&key, |&(k, _)| k).ok()
    }

    /// The pages of [first, last] it names.
    fn pages_in(&self, first: u64, last: u64) -> impl Iterator<Item = u64> + '_ {
        let from = self.index.partition_point(|&(k, _)| self.first + u64::from(k) < first);
        self.index[from..]
            .iter()
            .map(|&(k, _)| self.first + u64::from(k))
            .take_while(move |&p| p <= last)
    }

    fn unpack(&self) -> Images {
        self.index
            .iter()
            .map(|&(k, at)| (self.first + u64::from(k), Arc::new(self.image_at(at))))
            .collect()
    }

    fn bytes(&self) -> usize {
        self.bytes.capacity() + self.index.capacity() * std::mem::size_of::<(u16, u32)>()
    }
}

#[derive(Default)]
pub struct Directory {
    resident: BTreeMap<u64, DirPage>,
    /// Directory pages held only as their image.
    evicted: BTreeMap<u64, Arc<PageImage>>,
    /// Map pages named over every directory page, and their images' stored bytes.
    pages: u64,
    page_bytes: u64,
    /// What the resident directory pages hold in memory.
    bytes: usize,
}

impl Directory {
    /// The directory as a root names it, no page of it in memory.
    pub fn open(dirs: &BTreeMap<u64, Arc<PageImage>>, pages: u64, page_bytes: u64) -> Directory {
        Directory {
            evicted: dirs.clone(),
            pages,
            page_bytes,
            ..Directory::default()
        }
    }

    pub fn lookup(&self, page: u64) -> Lookup {
        let dir = dir_of(page);
        if let Some(d) = self.resident.get(&dir) {
            return match d.images.get(page) {
                Some(image) => Lookup::Image(Arc::new(image)),
                None => Lookup::None,
            };
        }
        match self.evicted.get(&dir) {
            Some(_) => Lookup::NotInMemory(dir),
            None => Lookup::None,
        }
    }

    /// Marks the directory pages of map pages [first, last] looked at now.
    pub fn touch(&self, first: u64, last: u64, now: u64) {
        for (_, d) in self.resident.range(dir_of(first)..=dir_of(last)) {
            if d.used.load(Ordering::Relaxed) != now {
                d.used.store(now, Ordering::Relaxed);
            }
        }
    }

    /// The map pages of [first, last] the resident directory pages name.
    pub fn named_in(&self, first: u64, last: u64) -> impl Iterator<Item = u64> + '_ {
        self.resident
            .range(dir_of(first)..=dir_of(last))
            .flat_map(move |(_, d)| d.images.pages_in(first, last))
    }

    /// The directory pages of map pages [first, last] held only as their image.
    pub fn evicted_in(&self, first: u64, last: u64) -> impl Iterator<Item = (u64, &Arc<PageImage>)> {
        self.evicted.range(dir_of(first)..=dir_of(last)).map(|(&d, i)| (d, i))
    }

    /// Whether directory page `dir` is in memory.
    pub fn is_resident(&self, dir: u64) -> bool {
        self.resident.contains_key(&dir)
    }

    /// The resident directory page `dir`'s entries.
    pub fn resident(&self, dir: u64) -> Option<DirEntries> {
        self.resident.get(&dir).map(|d| DirEntries {
            images: d.images.unpack(),
            changed: d.changed.clone(),
        })
    }

    /// Whether directory page `dir` is held only as `image`.
    pub fn held_only_as(&self, dir: u64, image: &PageImage) -> bool {
        self.evicted.get(&dir).is_some_and(|held| **held == *image)
    }

    /// Every directory page, resident or not, with its own image.
    #[cfg(test)]
    pub fn own_images(&self) -> impl Iterator<Item = (u64, &Arc<PageImage>)> {
        self.resident
            .iter()
            .map(|(&d, page)| (d, &page.own))
            .chain(self.evicted.iter().map(|(&d, i)| (d, i)))
    }

    /// Puts directory page `dir`, read from `own`, in memory: false (and
    /// nothing done) if it is no longer held as that image.
    pub fn install(&mut self, dir: u64, entries: DirEntries, own: &PageImage, now: u64) -> bool {
        if !self.held_only_as(dir, own) {
            return false;
        }
        let own = self.evicted.remove(&dir).expect("looked at just now");
        let page = DirPage {
            images: Packed::pack(dir, &entries.images),
            own,
            changed: entries.changed,
            used: AtomicU64::new(now),
        };
        self.bytes += page.bytes();
        self.resident.insert(dir, page);
        true
    }

    /// Resident directory pages `keep` does not hold back, least recently
    /// looked at first.
    pub fn eviction_candidates(&self, keep: &dyn Fn(u64) -> bool) -> Vec<(u64, u64)> {
        self.resident
            .iter()
            .filter(|(&d, _)| !keep(d))
            .map(|(&d, page)| (page.used.load(Ordering::Relaxed), d))
            .collect()
    }

    /// Holds directory page `dir` as its image only; returns the bytes freed.
    pub fn evict(&mut self, dir: u64) -> usize {
        let page = self.resident.remove(&dir).expect("a resident directory page");
        let bytes = page.bytes();
        self.bytes -= bytes;
        self.evicted.insert(dir, page.own);
        bytes
    }

    /// A durable checkpoint's directory page `dir`: its entries and its
    /// image, or `None` where it names no page any more; `old` is what it
    /// named before (pages, their images' bytes). Held as its image if it
    /// was (evicted while the checkpoint was written); else kept in
    /// memory.
    ///
    /// `written` are the map pages of this directory page the checkpoint
    /// wrote, in page order, each with its new image (`None`: emptied):
    /// one read in while the checkpoint was written without keeping its
    /// entries (`NewDir::out_of_memory`) is as its old image, with those.
    pub fn publish(
        &mut self,
        dir: u64,
        old: (u64, u64),
        new: Option<NewDir>,
        written: &[(u64, Option<Arc<PageImage>>)],
    ) {
        let was_resident = self.resident.remove(&dir).inspect(|page| self.bytes -= page.bytes());
        let was_evicted = self.evicted.remove(&dir).is_some();
        self.pages -= old.0;
        self.page_bytes -= old.1;
        let Some(NewDir {
            images,
            totals,
            own,
            changed,
        }) = new
        else {
            return;
        };
        self.pages += totals.0;
        self.page_bytes += totals.1;
        let images = match (images, was_resident) {
            (Some(images), _) if !was_evicted => images,
            (None, Some(was)) => {
                let mut images = was.images.unpack();
                for (page, image) in written {
                    match image {
                        Some(image) => images.insert(*page, image.clone()),
                        None => images.remove(page),
                    };
                }
                let images = Packed::pack(dir, &images);
                debug_assert_eq!(images.totals(), totals, "directory page {dir} as written");
                images
            }
            _ => {
                self.evicted.insert(dir, own);
                return;
            }
        };
        let page = DirPage {
            images,
            own,
            changed,
            used: AtomicU64::new(0),
        };
        self.bytes += page.bytes();
        self.resident.insert(dir, page);
    }

    /// Map pages named, and their images' stored bytes.
    pub fn totals(&self) -> (u64, u64) {
        (self.pages, self.page_bytes)
    }

    /// Directory pages, and those of them in memory.
    pub fn counts(&self) -> (usize, usize) {
        (self.resident.len() + self.evicted.len(), self.resident.len())
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// What `bytes` should be: the resident pages' bytes, summed.
    pub fn bytes_counted_again(&self) -> usize {
        self.resident.values().map(DirPage::bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::ImagePiece;
    use tessera_checksum::Algorithm;

    /// Images packed as a resident directory page holds them come back
    /// whole, one by one and all together, and only for their pages.
    #[test]
    fn packed_entries_give_back_the_images() {
        for algorithm in [Algorithm::Crc32c, Algorithm::Sha3_512] {
            let dir = 7;
            let first = dir * MAP_DIRECTORY_PAGES;
            let images: Images = [0u64, 1, 5, 200, 511]
                .iter()
                .map(|&k| {
                    let pieces = (0..=k % 3)
                        .map(|i| ImagePiece {
                            slot: 1000 + k * 10 + i,
                            offset: (k as u32) << 8,
                            bytes: 100 + i as u32,
                        })
                        .collect();
                    // Some with a delta over them, in pieces of its own.
                    let delta = (k % 2 == 1).then(|| {
                        let piece = ImagePiece {
                            slot: 7,
                            offset: k as u32,
                            bytes: 300,
                        };
                        Arc::new(PageImage::whole(
                            300,
                            algorithm.digest(&[k as u8]),
                            vec![piece; 1 + k as usize % 2],
                        ))
                    });
                    let image = PageImage {
                        bytes: 9000 + k as u32,
                        digest: algorithm.digest(&k.to_le_bytes()),
                        pieces,
                        delta,
                    };
                    (first + k, Arc::new(image))
                })
                .collect();
            let packed = Packed::pack(dir, &images);
            assert_eq!(packed.unpack(), images);
            for (&page, image) in &images {
                assert_eq!(packed.get(page).as_ref(), Some(&**image));
            }
            for absent in [first + 2, first + 510, first - 1, first + MAP_DIRECTORY_PAGES] {
                assert_eq!(packed.get(absent), None);
            }
            let some: Vec<u64> = packed.pages_in(first + 1, first + 200).collect();
            assert_eq!(some, [first + 1, first + 5, first + 200]);
            assert_eq!(
                packed.totals().1,
                images.values().map(|i| i.stored_bytes()).sum::<u64>()
            );
            // 16 bytes, the digest and 16 a piece an entry, and 8 to find
            // it; a delta 8, its digest and 16 a piece.
            let pieces: usize = images.values().map(|i| i.all_pieces().count()).sum();
            let deltas = images.values().filter(|i| i.delta.is_some()).count();
            let expected = images.len() * (16 + algorithm.digest_bytes() + 8)
                + deltas * (8 + algorithm.digest_bytes())
                + 16 * pieces;
            assert!(packed.bytes() <= expected + 64, "{} bytes", packed.bytes());
        }
    }

    /// A directory page a checkpoint wrote without keeping its entries
    /// (it was out of memory) stays out of memory; read in while the
    /// checkpoint was written, it is made from the entries read and the
    /// pages the checkpoint wrote, as if it had kept them.
    #[test]
    fn a_directory_page_not_kept_is_made_again_if_read_in_meanwhile() {
        let algorithm = Algorithm::Crc32c;
        let dir = 3;
        let first = dir * MAP_DIRECTORY_PAGES;
        let image = |n: u64| {
            let piece = ImagePiece {
                slot: 100 + n,
                offset: 0,
                bytes: 40 + n as u32,
            };
            Arc::new(PageImage::whole(
                40 + n as u32,
                algorithm.digest(&n.to_le_bytes()),
                vec![piece],
            ))
        };
        let before: Images = (0..6).map(|k| (first + k * 10, image(k))).collect();
        let own_before = image(90);
        let own_after = image(91);
        // Page 10 emptied, 20 rewritten, 7 new.
        let written: Vec<(u64, Option<Arc<PageImage>>)> = vec![
            (first + 7, Some(image(7))),
            (first + 10, None),
            (first + 20, Some(image(22))),
        ];
        let mut after = before.clone();
        after.insert(first + 7, image(7));
        after.remove(&(first + 10));
        after.insert(first + 20, image(22));
        let totals = |images: &Images| {
            (
                images.len() as u64,
                images.values().map(|i| i.stored_bytes()).sum::<u64>(),
            )
        };
        let mut named = BTreeMap::new();
        named.insert(dir, own_before.clone());
        for read_in in [false, true] {
            let (pages, bytes) = totals(&before);
            let mut directory = Directory::open(&named, pages, bytes);
            if read_in {
                let entries = DirEntries {
                    images: before.clone(),
                    changed: BTreeSet::new(),
                };
                assert!(directory.install(dir, entries, &own_before, 1));
            }
            let changed: BTreeSet<u64> = written.iter().map(|(page, _)| *page).collect();
            let new = NewDir::out_of_memory(&after, own_after.clone(), changed.clone());
            directory.publish(dir, totals(&before), Some(new), &written);
            assert_eq!((directory.pages, directory.page_bytes), totals(&after));
            assert_eq!(directory.is_resident(dir), read_in);
            match read_in {
                true => {
                    let entries = directory.resident(dir).expect("resident");
                    assert_eq!(entries.images, after);
                    assert_eq!(entries.changed, changed);
                }
                false => {
                    assert!(matches!(directory.lookup(first), Lookup::NotInMemory(d) if d == dir));
                    assert!(directory.held_only_as(dir, &own_after));
                }
            }
        }
    }
}
