//! The reconstruction cache: data areas of stripes rebuilt for degraded
//! reads, each rebuilt once for all the readers that want it.
//!
//! # Guarantees
//!
//! - Keyed by (slot, sequence): a slot rewritten with a newer stripe never
//!   serves the old one's bytes.
//! - The first reader to miss starts the rebuild; readers of the same
//!   stripe that arrive meanwhile wait for it rather than rebuild it again.
//!   A failed rebuild is not kept: the next reader tries again.
//! - Sized in bytes, and at least as many stripes as readers may rebuild
//!   at once, so a stripe is not evicted while the readers of its
//!   neighbours still need it: sequential degraded reads from many clients
//!   rebuild each stripe about once. Entries in use outlive eviction.

use crate::device::AlignedBuf;
use crate::error::ArrayError;
use crate::limits::RECONSTRUCT_CACHE_STRIPES_MIN;
use lru::LruCache;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, OnceLock};

type Key = (u64, u64);
type Cell = Arc<OnceLock<Option<Arc<AlignedBuf>>>>;

pub struct ReconstructCache {
    entries: Mutex<LruCache<Key, Cell>>,
}

impl ReconstructCache {
    /// A cache of `bytes` of data areas of `area_bytes` each.
    pub fn new(bytes: usize, area_bytes: usize) -> ReconstructCache {
        let stripes = (bytes / area_bytes.max(1)).max(RECONSTRUCT_CACHE_STRIPES_MIN);
        ReconstructCache {
            entries: Mutex::new(LruCache::new(NonZeroUsize::new(stripes).expect("at least the minimum"))),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<Key, Cell>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stripes it holds at most.
    pub fn capacity(&self) -> usize {
        self.lock().cap().get()
    }

    /// The stripe's data area if it has been rebuilt, or once it is, if a
    /// reader is rebuilding it now: a reader of the stripe's healthy chunks
    /// then takes them from the rebuild instead of reading them again.
    pub fn peek(&self, key: Key) -> Option<Arc<AlignedBuf>> {
        let cell = self.lock().get(&key).cloned()?;
        cell.wait().clone()
    }

    /// The stripe's data area, rebuilt by `build` unless another reader
    /// has rebuilt it or is rebuilding it (then this waits for that one).
    /// An area this pushes out of the cache that no reader still holds is
    /// handed to `recycle`, so the next rebuild need not allocate (and
    /// zero) one afresh.
    pub fn get_or_build(
        &self,
        key: Key,
        build: impl FnOnce() -> Result<AlignedBuf, ArrayError>,
        recycle: impl FnOnce(Arc<AlignedBuf>),
    ) -> Result<Arc<AlignedBuf>, ArrayError> {
        let (cell, evicted) = {
            let mut entries = self.lock();
            match entries.get(&key) {
                Some(cell) => (cell.clone(), None),
                None => {
                    let cell = Cell::default();
                    let evicted = entries.push(key, cell.clone()).map(|(_, old)| old);
                    (cell, evicted)
                }
            }
        };
        if let Some(area) = evicted
            .and_then(|old| Arc::try_unwrap(old).ok())
            .and_then(|old| old.into_inner().flatten())
        {
            recycle(area);
        }
        let mut error = None;
        let area = cell.get_or_init(|| match build() {
            Ok(area) => Some(Arc::new(area)),
            Err(e) => {
                error = Some(e);
                None
            }
        });
        if let Some(area) = area {
            return Ok(area.clone());
        }
        // Not kept: the next reader tries again.
        let mut entries = self.lock();
        if entries.peek(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
            entries.pop(&key);
        }
        Err(error.unwrap_or(ArrayError::Unreadable { slot: key.0 }))
    }
}
