//! One KV space in its volume: inserts appended to the log as they come,
//! `finalize`, queries, and what `status` shows. The deferred work (sort
//! and indexes) is `sort.rs`.
//!
//! # Guarantees
//!
//! - An insert returns once its records are durable, and is taken whole
//!   or not at all (its last frame says it ends it); one that fails
//!   leaves no record behind (its frames are cleared, or the space takes
//!   no more inserts until it is opened again).
//! - After a crash, opening finds every acknowledged insert: the log is
//!   read from the manifest's end of it, frame after frame, to the first
//!   that is not whole with the next sequence; what lies beyond (at most
//!   one unacknowledged insert) is cleared before any new insert.
//! - A query answers from the sorted tables where they are built, and by
//!   reading every record where not, and says which.
//!
//! # Locks
//!
//! `writer` orders what changes the space (inserts, `finalize`, the
//! deferred work) and is held across their I/O: a space has one writer
//! at a time by design (a writer per space per timestep). Queries and
//! `status` never take it: they read `view`, a snapshot published after
//! each change, and hold `regions` shared while they read frames;
//! trimming what no manifest names any more takes it exclusively.

use crate::cache::BatchCache;
use crate::frame::{self, Kind};
use crate::manifest::{Log, Manifest};
use crate::message::Incoming;
use crate::query::{Plan, Query, QueryResult};
use crate::schema::{Duplicates, SpaceSchema};
use crate::table::Directory;
use crate::KvError;
use arrow_array::cast::AsArray;
use arrow_array::types::UInt64Type;
use arrow_array::RecordBatch;
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use tessera_array::Volume;

/// The largest message a client may send (a gRPC message of Arrow
/// Flight): one record batch of up to this size is one insert.
pub const MESSAGE_BYTES_MAX: usize = 256 << 20;
/// Bytes of log frames one insert call may write (larger inserts are cut
/// by the caller): the most an unacknowledged insert leaves past the
/// log's end, which opening clears. A message's batch framed takes more
/// than the message (a frame's header, the schema message and padding
/// to a block, for each of the frames a batch is cut into): a megabyte
/// more holds that for any schema a message can carry.
pub const INSERT_BYTES_MAX: usize = MESSAGE_BYTES_MAX + (1 << 20);
/// The manifest records the log's end every this many inserts, so that
/// opening reads at most this many frames past it.
const MANIFEST_EVERY: u32 = 16;

/// Where a space is in its life.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Taking inserts.
    Open,
    /// Finalized; the sort by key is to do or under way.
    Sorting,
    /// Sorted by key; building the index on a field.
    Indexing(String),
    /// Sorted and indexed: queries read only what they select.
    Ready,
}

#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct SpaceStatus {
    pub name: String,
    pub schema: SpaceSchema,
    pub phase: Phase,
    /// Records inserted (every copy of a key).
    pub inserted: u64,
    /// Records the sorted table holds (duplicates dropped where the
    /// schema says so), once sorted.
    pub sorted: Option<u64>,
    pub indexes_built: Vec<String>,
    /// Bytes of the log (0 once the primary table has replaced it).
    pub log_bytes: u64,
    /// The deferred work's progress: rows done of rows to do, in the
    /// step under way (runs, then the merge).
    pub progress: Option<Progress>,
}

#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct Progress {
    pub step: String,
    pub done: u64,
    pub total: u64,
}

#[derive(Clone, Debug)]
pub(crate) struct Tail {
    pub offset: u64,
    pub frames: u64,
    pub rows: u64,
}

pub(crate) struct Writer {
    pub manifest: Manifest,
    pub tail: Tail,
    since_manifest: u32,
    poisoned: Option<String>,
}

/// What queries and `status` read: the manifest as of the last change,
/// the log's end, and the tables' directories.
pub(crate) struct View {
    pub manifest: Manifest,
    pub tail: Tail,
    pub primary: Option<Arc<Directory>>,
    pub indexes: Vec<Arc<Directory>>,
}

impl View {
    /// The view of `manifest` and `tail`: the tables' directories those
    /// of `old` where it has the same tables, else read.
    fn of(volume: &Volume, manifest: &Manifest, tail: &Tail, old: Option<&View>) -> Result<View, KvError> {
        let directory =
            |table: &crate::manifest::Table, was: Option<(&crate::manifest::Table, &Arc<Directory>)>| match was {
                Some((t, dir)) if t == table => Ok(dir.clone()),
                _ => Directory::read(volume, table).map(Arc::new),
            };
        let primary = match &manifest.primary {
            None => None,
            Some(table) => {
                let was = old.and_then(|o| o.manifest.primary.as_ref().zip(o.primary.as_ref()));
                Some(directory(table, was)?)
            }
        };
        let mut indexes = Vec::new();
        for (i, table) in manifest.indexes.iter().enumerate() {
            let was = old.and_then(|o| o.manifest.indexes.get(i).zip(o.indexes.get(i)));
            indexes.push(directory(table, was)?);
        }
        Ok(View {
            manifest: manifest.clone(),
            tail: tail.clone(),
            primary,
            indexes,
        })
    }
}

pub struct Space {
    name: String,
    pub(crate) volume: Volume,
    /// The same volume for the deferred work: not counted as clients'.
    pub(crate) background: Volume,
    pub(crate) writer: Mutex<Writer>,
    view: RwLock<Arc<View>>,
    pub(crate) regions: RwLock<()>,
    pub(crate) progress: Mutex<Option<Progress>>,
    /// The store's, shared by its spaces.
    cache: Arc<BatchCache>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Space {
    /// Writes a new space's manifest into `volume` (fresh, all zeros).
    pub(crate) fn create(
        name: &str,
        volume: Volume,
        schema: SpaceSchema,
        cache: Arc<BatchCache>,
    ) -> Result<Space, KvError> {
        schema.check()?;
        let mut manifest = Manifest::new(schema);
        manifest.write(&volume)?;
        Space::open(name, volume, cache)
    }

    /// Opens the space in `volume`: redoes the trims its manifest lists,
    /// finds the log's end and clears what lies past it.
    pub(crate) fn open(name: &str, volume: Volume, cache: Arc<BatchCache>) -> Result<Space, KvError> {
        let mut manifest = Manifest::read(&volume)?.ok_or_else(|| KvError::Corrupt {
            why: format!("volume {} holds no space manifest", volume.name()),
        })?;
        manifest.schema.check().map_err(|e| KvError::Corrupt {
            why: format!("the manifest's schema: {e}"),
        })?;
        if !manifest.trim.is_empty() {
            for &(start, end) in &manifest.trim {
                volume.write_zeroes(start, end - start, false)?;
            }
            volume.flush()?;
            manifest.trim.clear();
            manifest.write(&volume)?;
        }
        let log = &manifest.log;
        let mut tail = Tail {
            offset: log.end,
            frames: log.frames,
            rows: log.rows,
        };
        if !manifest.finalized {
            // An insert's frames count once its last is read whole.
            let mut reading = tail.clone();
            while let Some((header, _)) = frame::read(&volume, reading.offset, Kind::Log, reading.frames)? {
                reading.offset += header.frame_bytes();
                reading.frames += 1;
                reading.rows += u64::from(header.rows);
                if header.ends_insert {
                    tail = reading.clone();
                }
            }
            let clear = (INSERT_BYTES_MAX as u64 + (1 << 20)).min(volume.size() - tail.offset);
            volume.write_zeroes(tail.offset, clear, false)?;
            volume.flush()?;
            if tail.frames != manifest.log.frames {
                manifest.log = log_of(&manifest.log, &tail);
                manifest.write(&volume)?;
            }
        }
        let view = View::of(&volume, &manifest, &tail, None)?;
        Ok(Space {
            name: name.to_string(),
            background: volume.background(),
            volume,
            writer: Mutex::new(Writer {
                manifest,
                tail,
                since_manifest: 0,
                poisoned: None,
            }),
            view: RwLock::new(Arc::new(view)),
            regions: RwLock::new(()),
            progress: Mutex::new(None),
            cache,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn schema(&self) -> SpaceSchema {
        self.view().manifest.schema.clone()
    }

    pub(crate) fn view(&self) -> Arc<View> {
        self.view.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Publishes the writer's state for queries; with `tables`, reads the
    /// directories of tables the last view did not have.
    pub(crate) fn publish(&self, writer: &Writer, tables: bool) -> Result<(), KvError> {
        let old = self.view();
        let view = if tables {
            View::of(&self.volume, &writer.manifest, &writer.tail, Some(&old))?
        } else {
            View {
                manifest: writer.manifest.clone(),
                tail: writer.tail.clone(),
                primary: old.primary.clone(),
                indexes: old.indexes.clone(),
            }
        };
        *self.view.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(view);
        Ok(())
    }

    /// Appends `batches` to the log and returns once they are durable:
    /// the rows inserted.
    pub fn insert(&self, batches: &[RecordBatch]) -> Result<u64, KvError> {
        let batches: Vec<Incoming> = batches.iter().cloned().map(Incoming::Decoded).collect();
        self.insert_incoming(&batches)
    }

    /// `insert`, of batches decoded or as they came (checked against
    /// this space's schema by `IpcBatch::check`).
    pub fn insert_incoming(&self, batches: &[Incoming]) -> Result<u64, KvError> {
        let view = self.view();
        let schema = &view.manifest.schema;
        if view.manifest.finalized {
            return Err(KvError::Finalized {
                name: self.name.clone(),
            });
        }
        // The frames are built end to end outside the lock (the IPC
        // written in place, large bodies left where they came); their
        // headers once the log is held.
        let schema_message = frame::schema_message(&schema.arrow());
        let mut parts = Vec::new();
        for batch in batches {
            match batch {
                Incoming::Decoded(batch) => {
                    let batch = schema.conform(batch)?;
                    parts.extend(
                        frame::cut(&batch, schema.record_bytes())
                            .into_iter()
                            .map(Incoming::Decoded),
                    );
                }
                Incoming::Ipc(ipc) if ipc.rows() == 0 => {}
                Incoming::Ipc(_) => parts.push(batch.clone()),
            }
        }
        let mut frames = frame::LogFrames::for_parts(&parts, schema.record_bytes(), &schema_message);
        for part in &parts {
            match part {
                Incoming::Decoded(batch) => frames.push_batch(batch),
                Incoming::Ipc(ipc) => frames.push_ipc(&schema_message, ipc),
            }
        }
        drop(parts);
        if frames.bytes() > INSERT_BYTES_MAX {
            return Err(KvError::TooLarge {
                why: format!(
                    "an insert of {} bytes; at most {INSERT_BYTES_MAX} a call",
                    frames.bytes()
                ),
            });
        }
        let mut writer = lock(&self.writer);
        if writer.manifest.finalized {
            return Err(KvError::Finalized {
                name: self.name.clone(),
            });
        }
        if let Some(why) = &writer.poisoned {
            return Err(KvError::Poisoned {
                name: self.name.clone(),
                why: why.clone(),
            });
        }
        let start = writer.tail.clone();
        let mut tail = start.clone();
        frames.seal(tail.frames);
        tail.frames += frames.frames().len() as u64;
        tail.rows += frames.frames().iter().map(|f| u64::from(f.rows)).sum::<u64>();
        tail.offset += frames.bytes() as u64;
        let written = write_parallel(&self.volume, start.offset, &frames.pieces());
        if let Err(e) = written.and_then(|()| Ok(self.volume.flush()?)) {
            // Leave nothing a later opening could take for this insert's.
            let span = (frames.bytes() as u64).min(self.volume.size() - start.offset);
            if let Err(clear) = self.volume.write_zeroes(start.offset, span, false) {
                writer.poisoned = Some(clear.to_string());
            }
            return Err(e);
        }
        let rows = tail.rows - start.rows;
        writer.tail = tail;
        writer.since_manifest += 1;
        if writer.since_manifest >= MANIFEST_EVERY {
            let log = log_of(&writer.manifest.log, &writer.tail);
            let mut manifest = writer.manifest.clone();
            manifest.log = log;
            // The records are durable whatever this does; a manifest
            // not written is tried again at the next insert.
            if manifest.write(&self.volume).is_ok() {
                writer.manifest = manifest;
                writer.since_manifest = 0;
            }
        }
        self.publish(&writer, false)?;
        Ok(rows)
    }

    /// No more inserts: the deferred work may start. `false` if it was
    /// finalized already.
    pub fn finalize(&self) -> Result<bool, KvError> {
        let mut writer = lock(&self.writer);
        if writer.manifest.finalized {
            return Ok(false);
        }
        let mut manifest = writer.manifest.clone();
        manifest.finalized = true;
        manifest.log = log_of(&manifest.log, &writer.tail);
        manifest.next_free = writer.tail.offset.next_multiple_of(1 << 20);
        manifest.write(&self.volume)?;
        writer.manifest = manifest;
        self.publish(&writer, false)?;
        Ok(true)
    }

    pub fn status(&self) -> SpaceStatus {
        let view = self.view();
        let m = &view.manifest;
        let phase = if !m.finalized {
            Phase::Open
        } else if m.primary.is_none() {
            Phase::Sorting
        } else if let Some(field) = m.schema.indexes.get(m.indexes.len()) {
            Phase::Indexing(field.clone())
        } else {
            Phase::Ready
        };
        SpaceStatus {
            name: self.name.clone(),
            schema: m.schema.clone(),
            phase,
            inserted: view.tail.rows,
            sorted: m.primary.as_ref().map(|t| t.rows),
            indexes_built: m.indexes.iter().map(|t| t.column.clone()).collect(),
            log_bytes: if m.primary.is_some() {
                0
            } else {
                view.tail.offset - m.log.start
            },
            progress: lock(&self.progress).clone(),
        }
    }

    /// Whether tables built answer `query` (else it reads every record).
    pub fn answers_from_tables(&self, query: &Query) -> Result<bool, KvError> {
        let view = self.view();
        let schema = &view.manifest.schema;
        let plan = Plan::of(query, schema)?;
        Ok(plan.range.is_none()
            || if plan.column == schema.key {
                view.primary.is_some()
            } else {
                let i = schema.indexes.iter().position(|f| *f == plan.column);
                i.is_some_and(|i| i < view.indexes.len())
            })
    }

    /// Answers `query` from the tables built, or by reading every record.
    pub fn query(&self, query: &Query) -> Result<QueryResult, KvError> {
        let view = self.view();
        let _regions = self.regions.read().unwrap_or_else(|p| p.into_inner());
        let schema = &view.manifest.schema;
        let plan = Plan::of(query, schema)?;
        let column = schema.column_of(&plan.column).expect("a plan names a field");
        let mut result = QueryResult::default();
        let Some((lo, hi)) = plan.range else {
            result.indexed = true;
            return Ok(result);
        };
        let table = if plan.column == schema.key {
            view.primary.clone()
        } else {
            let i = schema.indexes.iter().position(|f| *f == plan.column);
            i.and_then(|i| view.indexes.get(i).cloned())
        };
        // The table sorted by the column asked reads only the batches
        // meeting the range; without it, the primary table is read whole.
        let source = match table {
            Some(dir) => {
                result.indexed = true;
                let range = dir.meeting(lo, hi);
                Some((dir, range))
            }
            None => view.primary.clone().map(|dir| {
                let all = 0..dir.offsets.len();
                (dir, all)
            }),
        };
        if let Some((dir, range)) = source {
            self.cache
                .each_batch(&dir, &self.volume, range, |_, batch, bytes, cached| {
                    result.count(bytes, cached);
                    keep(&mut result, &batch, &plan.matches(&batch, column));
                    Ok(())
                })?;
            return Ok(result);
        }
        self.scan_log(&view, &plan, column, &mut result)?;
        Ok(result)
    }

    /// Reads the whole log for a query; where the schema keeps only the
    /// last record of a key, a record answers only if no later one has
    /// its key (a second pass over the log, for the keys matched).
    fn scan_log(&self, view: &View, plan: &Plan, column: usize, result: &mut QueryResult) -> Result<(), KvError> {
        let schema = &view.manifest.schema;
        let key_column = schema.key_column();
        let last_only = schema.duplicates == Duplicates::KeepLast;
        // (frame, row) of each matching record, and its key.
        let mut found: Vec<(u64, usize, u64)> = Vec::new();
        let mut batches = Vec::new();
        self.each_log_frame(view, |number, batch, bytes| {
            result.count(bytes, false);
            let matches = plan.matches(&batch, column);
            if !last_only {
                keep(result, &batch, &matches);
                return;
            }
            let keys = batch.column(key_column).as_primitive::<UInt64Type>();
            for row in (0..batch.num_rows()).filter(|&r| matches.value(r)) {
                found.push((number, row, keys.value(row)));
            }
            batches.push(batch);
        })?;
        if !last_only || found.is_empty() {
            return Ok(());
        }
        let wanted: HashSet<u64> = found.iter().map(|f| f.2).collect();
        let mut last: HashMap<u64, (u64, usize)> = HashMap::new();
        for (number, batch) in batches.iter().enumerate() {
            let keys = batch.column(key_column).as_primitive::<UInt64Type>();
            for (row, key) in keys.values().iter().enumerate() {
                if wanted.contains(key) {
                    last.insert(*key, (number as u64, row));
                }
            }
        }
        for (number, batch) in batches.iter().enumerate() {
            let keys = batch.column(key_column).as_primitive::<UInt64Type>();
            let rows: Vec<bool> = (0..batch.num_rows())
                .map(|row| last.get(&keys.value(row)) == Some(&(number as u64, row)))
                .collect();
            let matches = plan.matches(batch, column);
            let visible = rows
                .iter()
                .zip(matches.iter())
                .map(|(&v, m)| Some(v && m == Some(true)))
                .collect();
            keep(result, batch, &visible);
        }
        Ok(())
    }

    /// Calls `each` with every log frame's number, batch and bytes.
    pub(crate) fn each_log_frame(
        &self,
        view: &View,
        mut each: impl FnMut(u64, RecordBatch, u64),
    ) -> Result<(), KvError> {
        let mut at = view.manifest.log.start;
        for number in 0..view.tail.frames {
            let (header, batch) = frame::read_expected(&self.volume, at, Kind::Log, number)?;
            at += header.frame_bytes();
            each(number, batch, header.frame_bytes());
        }
        Ok(())
    }
}

/// Writes `pieces` end to end from `offset`, cut into writes of at most
/// `WRITE_PIECE_BYTES`, from rayon's threads: a DoPut stream of 8 M
/// records went at 406-482 MB/s so, 348-352 written from one thread
/// (docs/PERFORMANCE.md, "KV spaces").
fn write_parallel(volume: &Volume, offset: u64, pieces: &[&[u8]]) -> Result<(), KvError> {
    use rayon::prelude::*;
    const WRITE_PIECE_BYTES: usize = 4 << 20;
    let mut writes = Vec::new();
    let mut at = offset;
    for piece in pieces {
        for chunk in piece.chunks(WRITE_PIECE_BYTES) {
            writes.push((at, chunk));
            at += chunk.len() as u64;
        }
    }
    writes
        .par_iter()
        .try_for_each(|&(at, bytes)| volume.write(at, bytes, false))?;
    Ok(())
}

fn keep(result: &mut QueryResult, batch: &RecordBatch, matches: &arrow_array::BooleanArray) {
    if matches.true_count() == 0 {
        return;
    }
    let kept = arrow_select::filter::filter_record_batch(batch, matches).expect("a mask as long as the batch");
    result.batches.push(kept);
}

fn log_of(log: &Log, tail: &Tail) -> Log {
    Log {
        start: log.start,
        end: tail.offset,
        frames: tail.frames,
        rows: tail.rows,
    }
}
