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

use crate::format::PageImage;
use crate::limits::MAP_DIRECTORY_PAGES;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Map pages to their images: what a directory page names.
pub type Images = BTreeMap<u64, Arc<PageImage>>;

/// The directory page that names map page `page`.
pub fn dir_of(page: u64) -> u64 {
    page / MAP_DIRECTORY_PAGES
}

/// What the directory says of a map page.
#[derive(Debug)]
pub enum Lookup {
    /// No durable image: the page was never written, or emptied.
    None,
    Image(Arc<PageImage>),
    /// The page's directory page is held only as this image.
    NotInMemory(u64, Arc<PageImage>),
}

/// A directory page in memory: the images it names, by map page, and its own.
pub struct DirPage {
    pub images: Images,
    pub own: Arc<PageImage>,
    /// The map's clock when last looked at.
    pub used: AtomicU64,
}

impl DirPage {
    /// Bytes it holds in memory (a B-tree slot, the image and its pieces,
    /// for each entry), about.
    fn bytes(&self) -> usize {
        let entry = std::mem::size_of::<(u64, Arc<PageImage>)>() + 16 + std::mem::size_of::<PageImage>();
        let pieces: usize = self.images.values().map(|i| i.pieces.capacity()).sum();
        std::mem::size_of::<(u64, DirPage)>() + self.images.len() * entry + pieces * 16
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
            return match d.images.get(&page) {
                Some(image) => Lookup::Image(image.clone()),
                None => Lookup::None,
            };
        }
        match self.evicted.get(&dir) {
            Some(image) => Lookup::NotInMemory(dir, image.clone()),
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

    /// The map pages of [first, last] the directory names, with their
    /// images, from the resident directory pages.
    pub fn named_in(&self, first: u64, last: u64) -> impl Iterator<Item = (u64, &Arc<PageImage>)> {
        self.resident
            .range(dir_of(first)..=dir_of(last))
            .flat_map(move |(_, d)| d.images.range(first..=last))
            .map(|(&p, i)| (p, i))
    }

    /// The directory pages of map pages [first, last] held only as their image.
    pub fn evicted_in(&self, first: u64, last: u64) -> impl Iterator<Item = (u64, &Arc<PageImage>)> {
        self.evicted.range(dir_of(first)..=dir_of(last)).map(|(&d, i)| (d, i))
    }

    /// The resident directory page `dir`'s entries.
    pub fn resident(&self, dir: u64) -> Option<&Images> {
        self.resident.get(&dir).map(|d| &d.images)
    }

    /// Every directory page, resident or not, with its own image.
    pub fn own_images(&self) -> impl Iterator<Item = (u64, &Arc<PageImage>)> {
        self.resident
            .iter()
            .map(|(&d, page)| (d, &page.own))
            .chain(self.evicted.iter().map(|(&d, i)| (d, i)))
    }

    /// Puts directory page `dir`, read from `own`, in memory: false (and
    /// nothing done) if it is no longer held as that image.
    pub fn install(&mut self, dir: u64, images: Images, own: &PageImage, now: u64) -> bool {
        if self.evicted.get(&dir).is_none_or(|held| **held != *own) {
            return false;
        }
        let own = self.evicted.remove(&dir).expect("looked at just now");
        let page = DirPage {
            images,
            own,
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
    /// was and `resident` is false; else kept in memory.
    pub fn publish(&mut self, dir: u64, old: (u64, u64), new: Option<(Images, Arc<PageImage>)>, resident: bool) {
        let was_resident = match self.resident.remove(&dir) {
            Some(page) => {
                self.bytes -= page.bytes();
                true
            }
            None => false,
        };
        let was_evicted = self.evicted.remove(&dir).is_some();
        self.pages -= old.0;
        self.page_bytes -= old.1;
        let Some((images, own)) = new else {
            return;
        };
        self.pages += images.len() as u64;
        self.page_bytes += images.values().map(|i| u64::from(i.bytes)).sum::<u64>();
        if was_resident || resident || !was_evicted {
            let page = DirPage {
                images,
                own,
                used: AtomicU64::new(0),
            };
            self.bytes += page.bytes();
            self.resident.insert(dir, page);
        } else {
            self.evicted.insert(dir, own);
        }
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
}
