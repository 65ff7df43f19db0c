//! The batch cache: decoded batches of the spaces' sorted tables, kept
//! for the queries that read them again (a hot energy range, keys looked
//! up near each other), least recently used out first, within a byte
//! budget for all spaces (`serve --kv-cache`). RocksDB keeps its blocks
//! so (its block cache, and the page cache under it); a space's tables
//! are read from the members `O_DIRECT`, so without this every query
//! paid its reads again: a 0.1% query of 10 M records read 504 KiB in
//! 0.8-1.0 ms of its ~2.3 on a 2-core VM (docs/PERFORMANCE.md).
//!
//! An entry is keyed by its table's directory (`Arc<Directory>`: one per
//! table a view names, shared by the views after it) and batch number,
//! and holds a `Weak` of that directory: it answers only while that very
//! directory lives, so a table dropped (with its space, or replaced by
//! the deferred work) is never answered from, even where its bytes or
//! its directory's address are used again. Tables are written once and
//! never changed in place, so a live directory's batches cannot change.
//!
//! A read of more than a quarter of the budget (a scan) goes through it
//! but leaves nothing in it: one scan would push out everything hot for a
//! table read once.

use crate::table::Directory;
use crate::KvError;
use arrow_array::RecordBatch;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex, Weak};
use tessera_array::Volume;

/// What `CacheStatus` reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheStatus {
    /// The budget, bytes.
    pub capacity: u64,
    /// Bytes of batches held.
    pub bytes: u64,
    pub batches: u64,
    /// Batches a query found here, and batches it read from the volume.
    pub hits: u64,
    pub misses: u64,
}

struct Entry {
    table: Weak<Directory>,
    batch: RecordBatch,
    frame_bytes: u64,
    bytes: usize,
}

struct Inner {
    entries: lru::LruCache<(usize, usize), Entry>,
    bytes: usize,
    hits: u64,
    misses: u64,
}

pub struct BatchCache {
    capacity: usize,
    inner: Mutex<Inner>,
}

impl BatchCache {
    /// A cache of at most `capacity` bytes of batches (0: none kept).
    pub fn new(capacity: usize) -> BatchCache {
        BatchCache {
            capacity,
            inner: Mutex::new(Inner {
                entries: lru::LruCache::unbounded(),
                bytes: 0,
                hits: 0,
                misses: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn status(&self) -> CacheStatus {
        let inner = self.lock();
        CacheStatus {
            capacity: self.capacity as u64,
            bytes: inner.bytes as u64,
            batches: inner.entries.len() as u64,
            hits: inner.hits,
            misses: inner.misses,
        }
    }

    /// Batch `i` of `table`, if held for it. An entry's key is its
    /// table's address, which its `Weak` keeps from being used again: a
    /// live entry at that key is `table`'s own.
    fn get(&self, table: &Arc<Directory>, i: usize) -> Option<(RecordBatch, u64)> {
        let mut inner = self.lock();
        let key = (Arc::as_ptr(table) as usize, i);
        let entry = inner.entries.get(&key)?;
        if entry.table.strong_count() > 0 {
            return Some((entry.batch.clone(), entry.frame_bytes));
        }
        // Its table is gone (a query held it over a drop): nothing to keep
        // it for.
        let gone = inner.entries.pop(&key).expect("found above");
        inner.bytes -= gone.bytes;
        None
    }

    fn put(&self, table: &Arc<Directory>, i: usize, batch: &RecordBatch, frame_bytes: u64) {
        // A decoded batch's columns are slices of one buffer, its frame's
        // IPC body (`get_array_memory_size` counts that buffer once a
        // column): the frame's bytes are what it holds.
        let bytes = frame_bytes as usize;
        let mut inner = self.lock();
        let entry = Entry {
            table: Arc::downgrade(table),
            batch: batch.clone(),
            frame_bytes,
            bytes,
        };
        if let Some(old) = inner.entries.put((Arc::as_ptr(table) as usize, i), entry) {
            inner.bytes -= old.bytes;
        }
        inner.bytes += bytes;
        while inner.bytes > self.capacity {
            match inner.entries.pop_lru() {
                Some((_, old)) => inner.bytes -= old.bytes,
                None => break,
            }
        }
    }

    /// Lets go of the batches of tables that are gone (a space dropped):
    /// they could never answer again, only wait to be pushed out.
    pub fn forget_gone(&self) {
        let mut inner = self.lock();
        let gone: Vec<(usize, usize)> = inner
            .entries
            .iter()
            .filter(|(_, entry)| entry.table.strong_count() == 0)
            .map(|(key, _)| *key)
            .collect();
        for key in gone {
            if let Some(entry) = inner.entries.pop(&key) {
                inner.bytes -= entry.bytes;
            }
        }
    }

    fn count(&self, hits: u64, misses: u64) {
        let mut inner = self.lock();
        inner.hits += hits;
        inner.misses += misses;
    }

    /// Calls `each` with the number, batch and frame bytes of each batch
    /// of `table` in `range`, in order, and whether it was held here; the
    /// others are read from `volume` (neighbours together,
    /// `Directory::each_batch`) and kept, unless the range is a scan.
    pub fn each_batch(
        &self,
        table: &Arc<Directory>,
        volume: &Volume,
        range: std::ops::Range<usize>,
        mut each: impl FnMut(usize, RecordBatch, u64, bool) -> Result<(), KvError>,
    ) -> Result<(), KvError> {
        let keep = self.capacity > 0 && table.bytes_of(range.clone()) <= self.capacity as u64 / 4;
        let (mut hits, mut misses) = (0, 0);
        let mut missing = range.start..range.start;
        let result = (|| {
            for i in range.clone() {
                let Some((batch, frame_bytes)) = self.get(table, i) else {
                    missing.end = i + 1;
                    continue;
                };
                hits += 1;
                misses += missing.len() as u64;
                self.read(
                    table,
                    volume,
                    std::mem::replace(&mut missing, i + 1..i + 1),
                    keep,
                    &mut each,
                )?;
                each(i, batch, frame_bytes, true)?;
            }
            misses += missing.len() as u64;
            self.read(table, volume, missing.clone(), keep, &mut each)
        })();
        self.count(hits, misses);
        result
    }

    fn read(
        &self,
        table: &Arc<Directory>,
        volume: &Volume,
        range: std::ops::Range<usize>,
        keep: bool,
        each: &mut impl FnMut(usize, RecordBatch, u64, bool) -> Result<(), KvError>,
    ) -> Result<(), KvError> {
        if range.is_empty() {
            return Ok(());
        }
        table.each_batch(volume, range, |i, batch, frame_bytes| {
            if keep {
                self.put(table, i, &batch, frame_bytes);
            }
            each(i, batch, frame_bytes, false)
        })
    }
}
