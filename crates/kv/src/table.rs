//! Sorted tables: a table is records sorted by one column (the key, or an
//! indexed field, then the key), in batches of at most `TABLE_ROWS`
//! written back to back as frames, and a directory frame after them that
//! lists each batch's offset, rows and first and last value (as
//! ordinals, `schema::ordinals`). A lookup reads the directory once
//! (kept by the space) and then only the batches whose bounds meet the
//! range asked. A sorted run of the deferred sort is a table too.

use crate::frame::{self, Kind};
use crate::manifest::Table;
use crate::schema::ordinals;
use crate::KvError;
use arrow_array::cast::AsArray;
use arrow_array::types::UInt64Type;
use arrow_array::{RecordBatch, UInt64Array};
use arrow_schema::{DataType, Field, Schema};
use std::sync::Arc;
use tessera_array::Volume;

/// Rows in a batch of an index's table (and the unit the deferred sort
/// merges in): a range reads few more rows than it returns, in few
/// frames.
pub const TABLE_ROWS: usize = 4096;
/// Rows in a batch of the key's table, which point gets read one batch
/// of: a get of one key read 4096 rows (144 KiB of 36-byte records) and
/// took 0.82-1.11 ms at p50 on a 2-core AMD Zen 4 VM, 0.57-0.59 ms with
/// 1024 (docs/PERFORMANCE.md, "A point get reads a smaller batch"). The
/// directory a space keeps for it is 32 bytes a batch: 312 KB for 10 M
/// records.
pub const KEY_TABLE_ROWS: usize = 1024;

/// A table's directory, as read from its frame.
#[derive(Debug)]
pub struct Directory {
    pub offsets: Vec<u64>,
    pub rows: Vec<u64>,
    pub first: Vec<u64>,
    pub last: Vec<u64>,
    /// Where the last batch ends: the directory's own frame.
    pub end: u64,
}

impl Directory {
    fn schema() -> Arc<Schema> {
        Arc::new(Schema::new(
            ["offset", "rows", "first", "last"]
                .map(|name| Field::new(name, DataType::UInt64, false))
                .to_vec(),
        ))
    }

    pub fn read(volume: &Volume, table: &Table) -> Result<Directory, KvError> {
        let (_, batch) = frame::read_expected(volume, table.directory, Kind::Directory, 0)?;
        let column = |i: usize| -> Result<Vec<u64>, KvError> {
            match batch.columns().get(i).map(|c| c.as_primitive_opt::<UInt64Type>()) {
                Some(Some(values)) => Ok(values.values().to_vec()),
                _ => Err(KvError::Corrupt {
                    why: format!("table directory at byte {} of {}", table.directory, volume.name()),
                }),
            }
        };
        let directory = Directory {
            offsets: column(0)?,
            rows: column(1)?,
            first: column(2)?,
            last: column(3)?,
            end: table.directory,
        };
        // Batches lie back to back from the table's start up to the
        // directory, each a frame of at most `frame::PAYLOAD_MAX`:
        // `each_batch` slices one read by these offsets.
        let frame_max = frame::frame_bytes(frame::PAYLOAD_MAX);
        let in_order = directory.offsets.first().is_none_or(|&first| first == table.start)
            && (0..directory.offsets.len()).all(|i| {
                let (start, end) = (directory.offsets[i], directory.end_of(i));
                start < end && end - start <= frame_max
            });
        if !in_order
            || directory.offsets.len() as u64 != table.batches
            || directory.rows.iter().sum::<u64>() != table.rows
        {
            return Err(KvError::Corrupt {
                why: format!(
                    "table directory at byte {} disagrees with the manifest",
                    table.directory
                ),
            });
        }
        Ok(directory)
    }

    /// The batches whose values may fall in [lo, hi] (ordinals).
    pub fn meeting(&self, lo: u64, hi: u64) -> std::ops::Range<usize> {
        let from = self.last.partition_point(|&last| last < lo);
        let to = self.first.partition_point(|&first| first <= hi);
        from..to.max(from)
    }

    /// Batch `i`, and the bytes its frame takes.
    pub fn batch(&self, volume: &Volume, i: usize) -> Result<(RecordBatch, u64), KvError> {
        let mut one = None;
        self.each_batch(volume, i..i + 1, |_, batch, bytes| {
            one = Some((batch, bytes));
            Ok(())
        })?;
        Ok(one.expect("one batch asked"))
    }

    /// Bytes the frames of batches `range` take.
    pub fn bytes_of(&self, range: std::ops::Range<usize>) -> u64 {
        match range.is_empty() {
            true => 0,
            false => self.end_of(range.end - 1) - self.offsets[range.start],
        }
    }

    /// Where batch `i`'s frame ends: the next one's start.
    fn end_of(&self, i: usize) -> u64 {
        self.offsets.get(i + 1).copied().unwrap_or(self.end)
    }

    /// Calls `each` with the number, batch and frame bytes of each batch
    /// in `range`, in order. The frames lie back to back, so neighbours
    /// are read together, up to `READ_BYTES` a read: a query's few
    /// batches are one read, not two per batch (a header, then the rest),
    /// and the array reads its members side by side for it.
    pub fn each_batch(
        &self,
        volume: &Volume,
        range: std::ops::Range<usize>,
        mut each: impl FnMut(usize, RecordBatch, u64) -> Result<(), KvError>,
    ) -> Result<(), KvError> {
        let mut i = range.start;
        while i < range.end {
            let start = self.offsets[i];
            let mut to = i + 1;
            while to < range.end && self.end_of(to) - start <= READ_BYTES {
                to += 1;
            }
            let end = self.end_of(to - 1);
            let corrupt = |what: String| KvError::Corrupt {
                why: format!("{what} at byte {start} of {}", volume.name()),
            };
            if end > volume.size() {
                return Err(corrupt(format!("table batches {i}..{to} ending at byte {end}")));
            }
            let mut bytes = vec![0u8; (end - start) as usize];
            volume.read(start, &mut bytes)?;
            for n in i..to {
                let frame = &bytes[(self.offsets[n] - start) as usize..(self.end_of(n) - start) as usize];
                match frame::parse_expected(frame, Kind::Table, n as u64) {
                    Some((header, batch)) if batch.num_rows() as u64 == self.rows[n] => {
                        each(n, batch, header.frame_bytes())?
                    }
                    _ => return Err(corrupt(format!("no whole table batch {n} (of batches {i}..{to} read)"))),
                }
            }
            i = to;
        }
        Ok(())
    }
}

/// The most a read of neighbouring batches takes (a whole batch more if
/// one batch is larger).
const READ_BYTES: u64 = 4 << 20;

/// Writes a table's batches from `start`, then its directory. Nothing is
/// flushed: the caller flushes before a manifest names the table.
pub struct TableWriter<'a> {
    volume: &'a Volume,
    column: String,
    sort_column: usize,
    start: u64,
    at: u64,
    /// Rows a batch holds at most.
    rows: usize,
    entries: [Vec<u64>; 4],
}

impl<'a> TableWriter<'a> {
    /// A table sorted by `column` (the key's table if `key`, with
    /// batches of `KEY_TABLE_ROWS`; else of `TABLE_ROWS`), written from
    /// byte `start` of `volume`.
    pub fn new(volume: &'a Volume, column: &str, sort_column: usize, key: bool, start: u64) -> TableWriter<'a> {
        TableWriter {
            volume,
            column: column.to_string(),
            sort_column,
            start,
            at: start,
            rows: if key { KEY_TABLE_ROWS } else { TABLE_ROWS },
            entries: Default::default(),
        }
    }

    /// Appends `batch` (sorted, and after every batch before) as batches
    /// of at most the table's rows.
    pub fn push(&mut self, batch: &RecordBatch) -> Result<(), KvError> {
        for start in (0..batch.num_rows()).step_by(self.rows) {
            let part = batch.slice(start, self.rows.min(batch.num_rows() - start));
            let ords = ordinals(part.column(self.sort_column).as_ref());
            let number = self.entries[0].len() as u64;
            let bytes = frame::encode(Kind::Table, number, &part);
            self.volume.write(self.at, &bytes, false)?;
            for (list, value) in self.entries.iter_mut().zip([
                self.at,
                part.num_rows() as u64,
                ords[0],
                *ords.last().expect("a batch of rows"),
            ]) {
                list.push(value);
            }
            self.at += bytes.len() as u64;
        }
        Ok(())
    }

    /// Writes the directory; the table as a manifest names it.
    pub fn finish(self) -> Result<Table, KvError> {
        let columns = self
            .entries
            .iter()
            .map(|values| Arc::new(UInt64Array::from(values.clone())) as _)
            .collect();
        let directory = RecordBatch::try_new(Directory::schema(), columns).expect("the directory's schema");
        let bytes = frame::encode(Kind::Directory, 0, &directory);
        self.volume.write(self.at, &bytes, false)?;
        Ok(Table {
            column: self.column,
            start: self.start,
            end: self.at + bytes.len() as u64,
            batches: self.entries[0].len() as u64,
            rows: self.entries[1].iter().sum(),
            directory: self.at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_array::device::{Device, MemoryDevice};

    fn volume() -> Volume {
        let devices = (0..6)
            .map(|i| {
                (
                    format!("m{i}"),
                    Arc::new(MemoryDevice::new(48 << 20)) as Arc<dyn Device>,
                )
            })
            .collect();
        let array = tessera_array::create(devices, &tessera_array::CreateOptions::new(4, 2)).unwrap();
        array.create_volume("t", 1 << 30).unwrap()
    }

    /// `each_batch` slices one read by the directory's offsets, so a
    /// directory whose batches do not lie back to back, in order, each at
    /// most a frame's size, is refused as corrupt before anything is read
    /// by them (a checked frame can still say so: written by a bug).
    #[test]
    fn a_directory_whose_batches_do_not_lie_back_to_back_is_refused() {
        let volume = volume();
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::UInt64, false)]));
        let ids = Arc::new(UInt64Array::from_iter_values(0..3000)) as _;
        let batch = RecordBatch::try_new(schema, vec![ids]).unwrap();
        let mut writer = TableWriter::new(&volume, "id", 0, true, 8192);
        writer.push(&batch).unwrap();
        let table = writer.finish().unwrap();
        let good = Directory::read(&volume, &table).unwrap();
        assert_eq!(good.offsets.len(), 3);
        let mut rows = Vec::new();
        good.each_batch(&volume, 0..3, |_, b, _| {
            rows.push(b.num_rows());
            Ok(())
        })
        .unwrap();
        assert_eq!(rows, [1024, 1024, 952]);
        let [a, b, c] = [good.offsets[0], good.offsets[1], good.offsets[2]];
        let far = table.start + 2 * frame::frame_bytes(frame::PAYLOAD_MAX);
        let cases = [
            (vec![a, c, b], table.clone()),
            (vec![a + 4096, b, c], table.clone()),
            (vec![a, b, b], table.clone()),
            // The last batch reaching far past a frame's size.
            (
                vec![a, b, c],
                Table {
                    directory: far,
                    end: far + 4096,
                    ..table.clone()
                },
            ),
        ];
        for (i, (offsets, table)) in cases.into_iter().enumerate() {
            let n = offsets.len();
            let columns = [offsets, good.rows.clone(), good.first.clone(), good.last.clone()]
                .map(|values| Arc::new(UInt64Array::from(values)) as _)
                .to_vec();
            let directory = RecordBatch::try_new(Directory::schema(), columns).unwrap();
            volume
                .write(table.directory, &frame::encode(Kind::Directory, 0, &directory), false)
                .unwrap();
            match Directory::read(&volume, &table) {
                Err(KvError::Corrupt { why }) => assert!(why.contains("disagrees"), "case {i}: {why}"),
                other => panic!("case {i} ({n} batches): {other:?}"),
            }
        }
    }
}
