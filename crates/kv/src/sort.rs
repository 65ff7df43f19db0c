//! The deferred work of a finalized space: its records sorted by key
//! into the primary table, then, for each index the schema declares, a
//! copy sorted by that field (then the key): a covering index, so that a
//! range query reads the records it returns and few others.
//!
//! Each table is an external sort: runs of as many records as the
//! memory given holds, each sorted and written as a table, then one
//! merge of the runs (a single run is the table already).
//!
//! # Crash consistency
//!
//! The manifest's `job` lists the runs done and how much of the source
//! they hold. A run is written past `next_free`, flushed, and only then
//! named by a manifest (with `next_free` past it): a crash while a run
//! is written leaves a manifest that does not name it, and the run is
//! made again from the same source records. The merge writes past the
//! last run and is named only once whole; a crash restarts it. Whatever
//! a committed table replaces (the log, the runs) is listed in the
//! manifest's `trim` in the same write, and trimmed after it: a crash
//! in between trims at the next opening. So every record is in exactly
//! one of: the log (before the primary table is committed) or the table.

use crate::frame::{self, Kind};
use crate::manifest::{Job, Table};
use crate::schema::{ordinals, Duplicates};
use crate::space::{Progress, Space, Writer};
use crate::table::{Directory, TableWriter, TABLE_ROWS};
use crate::KvError;
use arrow_array::cast::AsArray;
use arrow_array::types::UInt64Type;
use arrow_array::{RecordBatch, UInt32Array};
use rayon::prelude::*;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// What one table's sort reads: the log (for the key) or the primary
/// table (for an index).
enum Source {
    Log { frames: u64 },
    Primary(Directory),
}

impl Source {
    fn frames(&self) -> u64 {
        match self {
            Source::Log { frames } => *frames,
            Source::Primary(dir) => dir.offsets.len() as u64,
        }
    }
}

impl Space {
    /// Whether the space has deferred work left.
    pub fn has_work(&self) -> bool {
        let view = self.view();
        let m = &view.manifest;
        m.finalized && (m.primary.is_none() || m.indexes.len() < m.schema.indexes.len() || !m.trim.is_empty())
    }

    /// Does the deferred work, a run or a merge at a time, until it is
    /// all done or `stop()` says to (then `Err(Stopped)`, to go on later):
    /// runs of at most `memory` bytes of records.
    /// After each piece, `moved` is told the bytes it wrote (the pace
    /// behind clients, `pace.rs`).
    pub fn work(&self, memory: usize, stop: &dyn Fn() -> bool, moved: &mut dyn FnMut(u64)) -> Result<(), KvError> {
        let mut writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let result = self.work_locked(&mut writer, memory, stop, moved);
        *self.progress.lock().unwrap_or_else(|p| p.into_inner()) = None;
        result
    }

    fn work_locked(
        &self,
        writer: &mut Writer,
        memory: usize,
        stop: &dyn Fn() -> bool,
        moved: &mut dyn FnMut(u64),
    ) -> Result<(), KvError> {
        loop {
            if stop() {
                return Err(KvError::Stopped);
            }
            self.trim_pending(writer)?;
            let m = &writer.manifest;
            if !m.finalized {
                return Ok(());
            }
            let schema = &m.schema;
            let (column, source) = match &m.primary {
                None => (schema.key.clone(), Source::Log { frames: m.log.frames }),
                Some(primary) => match schema.indexes.get(m.indexes.len()) {
                    None => return Ok(()),
                    Some(field) => (
                        field.clone(),
                        Source::Primary(Directory::read(&self.background, primary)?),
                    ),
                },
            };
            let job = match &m.job {
                Some(job) if job.column == column => job.clone(),
                _ => Job {
                    column: column.clone(),
                    runs: Vec::new(),
                    consumed: 0,
                    consumed_rows: 0,
                    at: m.log.start,
                },
            };
            if job.consumed < source.frames() {
                self.make_run(writer, job, &source, memory, moved)?;
            } else {
                self.merge(writer, job, stop, moved)?;
            }
        }
    }

    /// Trims what the manifest no longer names (while no query reads).
    fn trim_pending(&self, writer: &mut Writer) -> Result<(), KvError> {
        if writer.manifest.trim.is_empty() {
            return Ok(());
        }
        {
            let _regions = self.regions.write().unwrap_or_else(|p| p.into_inner());
            for &(start, end) in &writer.manifest.trim {
                self.background.write_zeroes(start, end - start, false)?;
            }
        }
        self.background.flush()?;
        let mut manifest = writer.manifest.clone();
        manifest.trim.clear();
        manifest.write(&self.background)?;
        writer.manifest = manifest;
        self.publish(writer, false)
    }

    fn set_progress(&self, step: &str, done: u64, total: u64) {
        *self.progress.lock().unwrap_or_else(|p| p.into_inner()) = Some(Progress {
            step: step.to_string(),
            done,
            total,
        });
    }

    /// Sorts the next source records that fit `memory` into a run.
    fn make_run(
        &self,
        writer: &mut Writer,
        mut job: Job,
        source: &Source,
        memory: usize,
        moved: &mut dyn FnMut(u64),
    ) -> Result<(), KvError> {
        let m = &writer.manifest;
        let schema = &m.schema;
        let total_rows = match source {
            Source::Log { .. } => m.log.rows,
            Source::Primary(dir) => dir.rows.iter().sum(),
        };
        self.set_progress(
            &format!("sorting by {} (runs)", job.column),
            job.consumed_rows,
            total_rows,
        );
        // The batches, their concatenation, the sorted copy, and the
        // sort's own (ordinal, key, index) per row.
        let rows_max = (memory / (3 * schema.record_bytes() + 24)).max(TABLE_ROWS) as u64;
        let mut batches = Vec::new();
        let (mut rows, mut frames) = (0u64, 0u64);
        while job.consumed + frames < source.frames() && rows < rows_max {
            let number = job.consumed + frames;
            let batch = match source {
                Source::Log { .. } => {
                    let (header, batch) = frame::read_expected(&self.background, job.at, Kind::Log, number)?;
                    job.at += header.frame_bytes();
                    batch
                }
                Source::Primary(dir) => dir.batch(&self.background, number as usize)?.0,
            };
            rows += batch.num_rows() as u64;
            frames += 1;
            batches.push(batch);
        }
        let key = job.column == schema.key;
        let sorted = sort_batches(schema, &job.column, &batches, key)?;
        drop(batches);
        let column = schema.column_of(&job.column).expect("a job sorts by a field");
        // A run is the table itself when it is the only one: the key's
        // runs are cut as the key's table is.
        let mut table = TableWriter::new(&self.background, &job.column, column, key, m.next_free);
        table.push(&sorted)?;
        let run = table.finish()?;
        self.background.flush()?;
        moved(run.end - run.start);
        let mut manifest = m.clone();
        manifest.next_free = run.end.next_multiple_of(frame::BLOCK);
        job.runs.push(run);
        job.consumed += frames;
        job.consumed_rows += rows;
        self.set_progress(
            &format!("sorting by {} (runs)", job.column),
            job.consumed_rows,
            total_rows,
        );
        manifest.job = Some(job);
        manifest.write(&self.background)?;
        writer.manifest = manifest;
        self.publish(writer, false)
    }

    /// Merges the job's runs into its table and commits it.
    fn merge(
        &self,
        writer: &mut Writer,
        job: Job,
        stop: &dyn Fn() -> bool,
        moved: &mut dyn FnMut(u64),
    ) -> Result<(), KvError> {
        let m = &writer.manifest;
        let schema = &m.schema;
        let primary = job.column == schema.key;
        let mut manifest = m.clone();
        // No run: a space finalized with no record gets an empty table.
        let table = if job.runs.len() == 1 {
            job.runs[0].clone()
        } else {
            let table = self.merge_runs(writer, &job, stop, moved)?;
            self.background.flush()?;
            manifest.trim.extend(job.runs.iter().map(|r| (r.start, r.end)));
            table
        };
        manifest.next_free = manifest.next_free.max(table.end.next_multiple_of(frame::BLOCK));
        if primary {
            manifest.trim.push((m.log.start, m.log.end));
            manifest.primary = Some(table);
        } else {
            manifest.indexes.push(table);
        }
        manifest.job = None;
        manifest.write(&self.background)?;
        writer.manifest = manifest;
        self.publish(writer, true)
    }

    fn merge_runs(
        &self,
        writer: &Writer,
        job: &Job,
        stop: &dyn Fn() -> bool,
        moved: &mut dyn FnMut(u64),
    ) -> Result<Table, KvError> {
        let schema = &writer.manifest.schema;
        let column = schema.column_of(&job.column).expect("a job sorts by a field");
        let key_column = schema.key_column();
        let key = job.column == schema.key;
        let last_only = key && schema.duplicates == Duplicates::KeepLast;
        let total: u64 = job.runs.iter().map(|r| r.rows).sum();
        let step = format!("sorting by {} (merging {} runs)", job.column, job.runs.len());
        let mut out = TableWriter::new(&self.background, &job.column, column, key, writer.manifest.next_free);
        let mut held: Vec<RecordBatch> = Vec::new();
        let mut cursors = Vec::new();
        let mut heap = BinaryHeap::new();
        for (i, run) in job.runs.iter().enumerate() {
            let mut cursor = Cursor {
                dir: Directory::read(&self.background, run)?,
                next: 0,
                slot: 0,
                ords: Vec::new(),
                keys: Vec::new(),
                row: 0,
            };
            if cursor.load(&self.background, column, key_column, &mut held)? {
                heap.push(Reverse((cursor.ords[0], cursor.keys[0], i)));
            }
            cursors.push(cursor);
        }
        // (slot in `held`, row) of the records to write next, and the
        // one held back while a later record may have its key.
        let mut picked: Vec<(usize, usize)> = Vec::with_capacity(TABLE_ROWS);
        let mut pending: Option<(u64, usize, usize)> = None;
        let mut merged = 0u64;
        while let Some(Reverse((_, key, i))) = heap.pop() {
            let cursor = &mut cursors[i];
            let at = (cursor.slot, cursor.row);
            if last_only {
                match pending {
                    Some((k, _, _)) if k == key => {}
                    Some((_, slot, row)) => picked.push((slot, row)),
                    None => {}
                }
                pending = Some((key, at.0, at.1));
            } else {
                picked.push(at);
            }
            cursor.row += 1;
            let more =
                cursor.row < cursor.ords.len() || cursor.load(&self.background, column, key_column, &mut held)?;
            if more {
                heap.push(Reverse((cursor.ords[cursor.row], cursor.keys[cursor.row], i)));
            }
            merged += 1;
            if picked.len() >= TABLE_ROWS {
                if stop() {
                    return Err(KvError::Stopped);
                }
                write_picked(&mut out, &held, &mut picked)?;
                self.set_progress(&step, merged, total);
                compact_held(&mut held, &mut cursors, &mut pending);
                moved((TABLE_ROWS * schema.record_bytes()) as u64);
            }
        }
        if let Some((_, slot, row)) = pending {
            picked.push((slot, row));
        }
        write_picked(&mut out, &held, &mut picked)?;
        self.set_progress(&step, merged, total);
        out.finish()
    }
}

/// A run being merged: its directory, the batch it is in, and the row.
struct Cursor {
    dir: Directory,
    next: usize,
    slot: usize,
    ords: Vec<u64>,
    keys: Vec<u64>,
    row: usize,
}

impl Cursor {
    /// Reads the run's next batch into `held`: false at the run's end.
    fn load(
        &mut self,
        volume: &tessera_array::Volume,
        column: usize,
        key_column: usize,
        held: &mut Vec<RecordBatch>,
    ) -> Result<bool, KvError> {
        if self.next == self.dir.offsets.len() {
            return Ok(false);
        }
        let (batch, _) = self.dir.batch(volume, self.next)?;
        self.next += 1;
        self.ords = ordinals(batch.column(column).as_ref());
        self.keys = batch.column(key_column).as_primitive::<UInt64Type>().values().to_vec();
        self.row = 0;
        self.slot = held.len();
        held.push(batch);
        Ok(true)
    }
}

fn write_picked(out: &mut TableWriter, held: &[RecordBatch], picked: &mut Vec<(usize, usize)>) -> Result<(), KvError> {
    if picked.is_empty() {
        return Ok(());
    }
    let refs: Vec<&RecordBatch> = held.iter().collect();
    let batch = arrow_select::interleave::interleave_record_batch(&refs, picked).expect("rows of held batches");
    picked.clear();
    out.push(&batch)
}

/// Keeps in `held` only the batches a cursor or the pending record is in.
fn compact_held(held: &mut Vec<RecordBatch>, cursors: &mut [Cursor], pending: &mut Option<(u64, usize, usize)>) {
    let mut kept: Vec<RecordBatch> = Vec::new();
    let mut moved: Vec<Option<usize>> = vec![None; held.len()];
    let mut keep = |slot: usize| -> usize {
        *moved[slot].get_or_insert_with(|| {
            kept.push(held[slot].clone());
            kept.len() - 1
        })
    };
    for cursor in cursors.iter_mut() {
        cursor.slot = keep(cursor.slot);
    }
    if let Some((_, slot, _)) = pending {
        *slot = keep(*slot);
    }
    *held = kept;
}

/// `batches` as one batch sorted by `column` then the key (insertion
/// order among equals); for the key, with only the last of equal keys
/// where the schema says so.
fn sort_batches(
    schema: &crate::schema::SpaceSchema,
    column: &str,
    batches: &[RecordBatch],
    by_key: bool,
) -> Result<RecordBatch, KvError> {
    let all = arrow_select::concat::concat_batches(&schema.arrow(), batches).expect("batches of the space's schema");
    let ords = ordinals(all.column(schema.column_of(column).expect("a field")).as_ref());
    let keys = all.column(schema.key_column()).as_primitive::<UInt64Type>().values();
    let mut order: Vec<u32> = (0..all.num_rows() as u32).collect();
    order.par_sort_by_key(|&i| (ords[i as usize], keys[i as usize]));
    if by_key && schema.duplicates == Duplicates::KeepLast {
        let last = |w: &[u32]| keys[w[0] as usize] != keys[w[1] as usize];
        let mut kept: Vec<u32> = order.windows(2).filter(|w| last(w)).map(|w| w[0]).collect();
        kept.extend(order.last());
        order = kept;
    }
    let indices = UInt32Array::from(order);
    Ok(arrow_select::take::take_record_batch(&all, &indices).expect("indices within the batch"))
}
