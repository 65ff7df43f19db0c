//! The array's history, kept in its directory (`DIR/events.jsonl`: one
//! event a line, as the API gives it) so that it outlives the process:
//! the server appends what the array recorded about once a second and
//! when it stops, and the commands that change an array they opened
//! themselves (scrub, heal, replace, fail, volume changes) append theirs.
//! `tessera events` and the dashboard read it back, the newest
//! `EVENTS_MAX`. Past `HISTORY_BYTES_MAX` the file is renamed
//! `events.jsonl.1` (replacing the one before) and a new one begun.
//!
//! A line a crash tore is skipped when read. Appends are synced: events
//! are rare (a member failing, a rebuild ending), and the history is
//! what an operator reads after something went wrong.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
use tessera_array::events::{Event, EVENTS_MAX};
use tessera_array::Array;

pub const HISTORY_FILE: &str = "events.jsonl";
/// The file's size past which it is set aside and a new one begun.
pub const HISTORY_BYTES_MAX: u64 = 1 << 20;

/// Appends an opened array's events to its directory's history.
pub struct History {
    path: PathBuf,
    /// Events of this opening already appended.
    seen: u64,
}

impl History {
    pub fn new(dir: &Path) -> History {
        History {
            path: dir.join(HISTORY_FILE),
            seen: 0,
        }
    }

    /// Appends what `array` recorded since the last call (since it was
    /// opened, the first time), and syncs it.
    pub fn save(&mut self, array: &Array) -> Result<()> {
        self.append(array)?.map_or(Ok(()), |written| written.sync())
    }

    /// Appends what `array` recorded since the last call, in one write
    /// (so that appends in turn never interleave); the file to sync, if
    /// anything was written. A caller that holds a lock around this syncs
    /// after letting it go.
    pub fn append(&mut self, array: &Array) -> Result<Option<Written>> {
        let (events, recorded) = array.events_since(self.seen);
        if events.is_empty() {
            self.seen = recorded;
            return Ok(None);
        }
        let mut text = String::new();
        for event in &events {
            text += &serde_json::to_string(event)?;
            text.push('\n');
        }
        if std::fs::metadata(&self.path).is_ok_and(|m| m.len() + text.len() as u64 > HISTORY_BYTES_MAX) {
            let older = self.path.with_extension("jsonl.1");
            std::fs::rename(&self.path, &older)
                .with_context(|| format!("setting the history {} aside", self.path.display()))?;
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .with_context(|| format!("opening the history {}", self.path.display()))?;
        file.write_all(text.as_bytes())
            .with_context(|| format!("appending to the history {}", self.path.display()))?;
        self.seen = recorded;
        Ok(Some(Written {
            file,
            path: self.path.clone(),
        }))
    }
}

/// An append to the history, not yet synced.
pub struct Written {
    file: std::fs::File,
    path: PathBuf,
}

impl Written {
    pub fn sync(self) -> Result<()> {
        self.file
            .sync_data()
            .with_context(|| format!("syncing the history {}", self.path.display()))
    }
}

/// The history kept in `dir`, oldest first: the newest `EVENTS_MAX`
/// events of the file and the one set aside before it; empty where there
/// is none.
pub fn read(dir: &Path) -> Result<Vec<Event>> {
    let path = dir.join(HISTORY_FILE);
    let mut events = Vec::new();
    for path in [path.with_extension("jsonl.1"), path] {
        let text = match std::fs::read(&path) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("reading the history {}", path.display())),
        };
        // A line a crash tore does not parse, and is left out.
        events.extend(text.lines().filter_map(|line| serde_json::from_str::<Event>(line).ok()));
    }
    let extra = events.len().saturating_sub(EVENTS_MAX);
    events.drain(..extra);
    Ok(events)
}

/// Closes an array opened here (a clean stop), then appends its events
/// to the history: for the commands that change it.
pub fn close_and_save(dir: &Path, array: &Array) -> Result<()> {
    let closed = array.close();
    let saved = History::new(dir).save(array);
    closed?;
    saved
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_array::events::What;

    fn event(member: usize) -> Event {
        Event {
            unix_ms: member as u64,
            what: What::RebuildStarted {
                member,
                name: format!("m{member}"),
            },
        }
    }

    #[test]
    fn the_history_keeps_the_newest_skips_torn_lines_and_rotates() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read(dir.path()).unwrap().is_empty());
        let line = |e: &Event| serde_json::to_string(e).unwrap() + "\n";
        let mut text: String = (0..EVENTS_MAX + 5).map(|m| line(&event(m))).collect();
        text += "{\"unix_ms\":12,\"kind\":\"rebuild_sta";
        std::fs::write(dir.path().join(HISTORY_FILE), &text).unwrap();
        let events = read(dir.path()).unwrap();
        assert_eq!(events.len(), EVENTS_MAX);
        assert_eq!(events[0], event(5));
        assert_eq!(events[EVENTS_MAX - 1], event(EVENTS_MAX + 4));
        // Set aside, the older file is read first.
        std::fs::rename(
            dir.path().join(HISTORY_FILE),
            dir.path().join(HISTORY_FILE).with_extension("jsonl.1"),
        )
        .unwrap();
        std::fs::write(dir.path().join(HISTORY_FILE), line(&event(9_999))).unwrap();
        let events = read(dir.path()).unwrap();
        assert_eq!(events.len(), EVENTS_MAX);
        assert_eq!(events[EVENTS_MAX - 1], event(9_999));
        assert_eq!(events[EVENTS_MAX - 2], event(EVENTS_MAX + 4));
    }

    /// A history written before writes refused said why typed still reads
    /// (with no `reason`), beside one that does.
    #[test]
    fn writes_refused_reads_with_and_without_its_typed_reason() {
        let dir = tempfile::tempdir().unwrap();
        let new = Event {
            unix_ms: 2,
            what: What::WritesRefused {
                why: "member 2 (m2) failed".into(),
                reason: Some(tessera_array::events::Refused::MemberFailed {
                    member: 2,
                    name: "m2".into(),
                    already: 2,
                    parity: 2,
                }),
            },
        };
        let text = format!(
            "{{\"unix_ms\":1,\"kind\":\"writes_refused\",\"why\":\"member 1 (m1) failed\"}}\n{}\n",
            serde_json::to_string(&new).unwrap()
        );
        assert!(
            text.contains("\"reason\":{\"kind\":\"member_failed\",\"member\":2"),
            "{text}"
        );
        std::fs::write(dir.path().join(HISTORY_FILE), text).unwrap();
        let events = read(dir.path()).unwrap();
        let old = Event {
            unix_ms: 1,
            what: What::WritesRefused {
                why: "member 1 (m1) failed".into(),
                reason: None,
            },
        };
        assert_eq!(events, [old, new]);
    }
}
