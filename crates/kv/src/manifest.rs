//! A space's manifest: its schema, its state, and where everything it
//! holds is in its volume. Two copies at the volume's start, written in
//! turn, each a 32-byte header (magic "TKVM", generation, length, CRC32C
//! of the JSON) and the manifest as JSON; the whole copy with the newest
//! generation is the manifest. A manifest is written, then flushed,
//! before anything it stops naming is trimmed, and after everything it
//! names is flushed: a crash leaves the old manifest or the new, each
//! naming only whole frames.
//!
//! ```text
//!  0      manifest copy 0        (SLOT_BYTES)
//!  1 MiB  manifest copy 1
//!  2 MiB  the log: inserted batches, frame after frame
//!  ...    after `finalize`, from the log's end: runs, tables, directories
//! ```

use crate::frame::BLOCK;
use crate::schema::SpaceSchema;
use crate::KvError;
use serde::{Deserialize, Serialize};
use tessera_array::Volume;
use tessera_checksum::crc32c;

pub const SLOT_BYTES: u64 = 1 << 20;
pub const LOG_START: u64 = 2 * SLOT_BYTES;
const MAGIC: [u8; 4] = *b"TKVM";
const HEADER_BYTES: usize = 32;
pub const FORMAT: u32 = 1;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: u32,
    pub generation: u64,
    pub schema: SpaceSchema,
    pub finalized: bool,
    /// The log as of this manifest: frames before `end` are whole (more
    /// may follow, found by reading on).
    pub log: Log,
    /// The records sorted by key, once the deferred sort is done.
    pub primary: Option<Table>,
    /// The indexes built so far, in the schema's order.
    pub indexes: Vec<Table>,
    /// The deferred work under way.
    pub job: Option<Job>,
    /// Where the next region starts (past the log once finalized).
    pub next_free: u64,
    /// Ranges no longer named, to trim (then forgotten).
    pub trim: Vec<(u64, u64)>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Log {
    pub start: u64,
    pub end: u64,
    pub frames: u64,
    pub rows: u64,
}

/// Records sorted by `column` (then by key): batches of at most
/// `TABLE_ROWS` (`KEY_TABLE_ROWS` sorted by the key) back to back in
/// [start, end), and the directory frame at
/// `directory` (each batch's offset, bytes, rows and bounds).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Table {
    pub column: String,
    pub start: u64,
    pub end: u64,
    pub batches: u64,
    pub rows: u64,
    pub directory: u64,
}

/// A sort under way: into a table sorted by `column`, from the log (for
/// the key) or from the primary table (for an index). `runs` are done;
/// `consumed` source frames are in them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    pub column: String,
    /// Runs done, each a table sorted by `column`.
    pub runs: Vec<Table>,
    pub consumed: u64,
    pub consumed_rows: u64,
    /// Where the next source frame is (in the log).
    pub at: u64,
}

impl Manifest {
    pub fn new(schema: SpaceSchema) -> Manifest {
        Manifest {
            format: FORMAT,
            generation: 0,
            schema,
            finalized: false,
            log: Log {
                start: LOG_START,
                end: LOG_START,
                ..Log::default()
            },
            primary: None,
            indexes: Vec::new(),
            job: None,
            next_free: LOG_START,
            trim: Vec::new(),
        }
    }

    fn encode(&self) -> Result<Vec<u8>, KvError> {
        let json = serde_json::to_vec(self).expect("a manifest serializes");
        if (HEADER_BYTES + json.len()) as u64 > SLOT_BYTES {
            return Err(KvError::TooLarge {
                why: format!(
                    "a manifest of {} bytes (its runs: give the sort more memory)",
                    json.len()
                ),
            });
        }
        let mut out = vec![0u8; (HEADER_BYTES + json.len()).div_ceil(BLOCK as usize) * BLOCK as usize];
        out[..4].copy_from_slice(&MAGIC);
        out[4..8].copy_from_slice(&FORMAT.to_le_bytes());
        out[8..16].copy_from_slice(&self.generation.to_le_bytes());
        out[16..20].copy_from_slice(&(json.len() as u32).to_le_bytes());
        out[20..24].copy_from_slice(&crc32c(&json).to_le_bytes());
        out[HEADER_BYTES..HEADER_BYTES + json.len()].copy_from_slice(&json);
        Ok(out)
    }

    /// The copy at `slot`, if it is whole.
    fn read_slot(volume: &Volume, slot: u64) -> Result<Option<Manifest>, KvError> {
        let mut first = vec![0u8; BLOCK as usize];
        volume.read(slot * SLOT_BYTES, &mut first)?;
        let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        if first[..4] != MAGIC {
            return Ok(None);
        }
        let format = u32_at(&first, 4);
        if format != FORMAT {
            return Err(KvError::Corrupt {
                why: format!("a manifest of format {format}; this build reads format {FORMAT}"),
            });
        }
        let len = u32_at(&first, 16) as usize;
        if (HEADER_BYTES + len) as u64 > SLOT_BYTES {
            return Ok(None);
        }
        let mut bytes = first;
        bytes.resize((HEADER_BYTES + len).div_ceil(BLOCK as usize) * BLOCK as usize, 0);
        if bytes.len() > BLOCK as usize {
            volume.read(slot * SLOT_BYTES + BLOCK, &mut bytes[BLOCK as usize..])?;
        }
        let json = &bytes[HEADER_BYTES..HEADER_BYTES + len];
        if crc32c(json) != u32_at(&bytes, 20) {
            return Ok(None);
        }
        let manifest: Manifest = serde_json::from_slice(json).map_err(|e| KvError::Corrupt {
            why: format!("a manifest whose JSON does not parse: {e}"),
        })?;
        let generation = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
        if manifest.generation != generation {
            return Ok(None);
        }
        Ok(Some(manifest))
    }

    /// Checks that every range the manifest names lies in a volume of
    /// `size` bytes, past the manifest's copies, in order.
    fn check(&self, size: u64) -> Result<(), KvError> {
        let within = |start: u64, end: u64| LOG_START <= start && start <= end && end <= size;
        let log = &self.log;
        let tables = self
            .primary
            .iter()
            .chain(&self.indexes)
            .chain(self.job.iter().flat_map(|j| &j.runs));
        let ok = log.start == LOG_START
            && within(log.start, log.end)
            && within(log.start, self.next_free)
            && self.trim.iter().all(|&(start, end)| within(start, end))
            && self.job.as_ref().is_none_or(|j| within(log.start, j.at))
            && tables
                .into_iter()
                .all(|t| within(t.start, t.end) && t.start <= t.directory && t.directory < t.end);
        if ok {
            return Ok(());
        }
        Err(KvError::Corrupt {
            why: format!("a manifest whose ranges do not fit the volume of {size} bytes"),
        })
    }

    /// The newest whole copy; `None` where neither is (not a space).
    pub fn read(volume: &Volume) -> Result<Option<Manifest>, KvError> {
        let a = Manifest::read_slot(volume, 0)?;
        let b = Manifest::read_slot(volume, 1)?;
        let newest = match (a, b) {
            (Some(a), Some(b)) => Some(if a.generation > b.generation { a } else { b }),
            (a, b) => a.or(b),
        };
        if let Some(manifest) = &newest {
            manifest.check(volume.size())?;
        }
        Ok(newest)
    }

    /// Writes the next generation to the older copy's place and flushes:
    /// on return it is the manifest.
    pub fn write(&mut self, volume: &Volume) -> Result<(), KvError> {
        self.generation += 1;
        let bytes = match self.encode() {
            Ok(bytes) => bytes,
            Err(e) => {
                self.generation -= 1;
                return Err(e);
            }
        };
        let result = volume
            .write((self.generation % 2) * SLOT_BYTES, &bytes, false)
            .and_then(|()| volume.flush());
        if let Err(e) = result {
            // Which copy is newest on the members is unknown: the next
            // write goes to the other place, and either copy names whole
            // frames only.
            return Err(e.into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_naming_ranges_outside_its_volume_is_refused() {
        let schema: SpaceSchema =
            serde_json::from_str(r#"{"key":"id","fields":[{"name":"id","type":"u64"}]}"#).unwrap();
        const SIZE: u64 = 1 << 30;
        let good = Manifest::new(schema);
        good.check(SIZE).unwrap();
        let table = Table {
            column: "id".into(),
            start: LOG_START,
            end: LOG_START + 8192,
            batches: 1,
            rows: 1,
            directory: LOG_START + 4096,
        };
        let mut with_table = good.clone();
        with_table.primary = Some(table.clone());
        with_table.check(SIZE).unwrap();
        let cases: [fn(&mut Manifest); 7] = [
            |m| m.log.end = m.log.start - 1,
            |m| m.log.start = 0,
            |m| m.next_free = SIZE + 1,
            |m| m.trim = vec![(LOG_START + 10, LOG_START)],
            |m| m.trim = vec![(0, 4096)],
            |m| m.primary.as_mut().unwrap().directory = LOG_START + 8192,
            |m| m.primary.as_mut().unwrap().end = SIZE + 4096,
        ];
        for (i, bad) in cases.iter().enumerate() {
            let mut m = with_table.clone();
            bad(&mut m);
            let err = m.check(SIZE).unwrap_err().to_string();
            assert!(err.contains("do not fit"), "case {i}: {err}");
        }
    }
}
