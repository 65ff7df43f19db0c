//! What happened to the array since it was opened, oldest first, for
//! `tessera events` and the operator's view: openings, members failed,
//! writes refused, rebuilds, scrubs and heals, the clean stop. Kept in
//! memory, the newest [`EVENTS_MAX`]; a new opening starts a new history.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::Mutex;

/// Events kept at most; the oldest go first.
pub const EVENTS_MAX: usize = 1024;

/// One thing that happened, with when (Unix time, milliseconds).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub unix_ms: u64,
    #[serde(flatten)]
    pub what: What,
}

/// What happened, typed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum What {
    /// The array was opened: how long it took, whether it followed a
    /// clean stop, and what recovery read and replayed.
    Opened {
        milliseconds: u64,
        clean_stop: bool,
        slots_scanned: u64,
        stripes_replayed: u64,
    },
    /// A member was failed: by hand (`fail`), or by its errors.
    MemberFailed {
        member: usize,
        name: String,
        by_hand: bool,
    },
    /// More members are lost than the parity covers: writes are refused.
    /// `why` in words, `reason` typed (none in a history written before
    /// it was kept: such lines still read, a missing `Option` being
    /// `None` to serde).
    WritesRefused {
        why: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<Refused>,
    },
    RebuildStarted {
        member: usize,
        name: String,
    },
    /// A rebuild ended: done, stopped (it goes on at the next start), or
    /// failed (`error`).
    RebuildEnded {
        member: usize,
        stripes_done: u64,
        stripes_total: u64,
        error: Option<String>,
    },
    ScrubEnded {
        stripes_checked: u64,
        chunks_bad: u64,
        chunks_repaired: u64,
        stopped: bool,
    },
    HealEnded {
        stripes_healed: u64,
        stripes_degraded: u64,
        stopped: bool,
    },
    /// A slot page opening left for later could not be read: what needs
    /// it fails (a checkpoint, so a clean stop), and the next opening
    /// reads every page (and scans every slot if it still cannot).
    SlotPagesUnreadable {
        why: String,
    },
    /// A replay mapped after opening could not read a page it needed:
    /// what needs the page fails (a checkpoint, so a clean stop), and a
    /// crash reopens from the same root.
    ReplayUnfinished {
        why: String,
    },
    /// Closed: cleanly (the next opening reads no stripe header) or not.
    Closed {
        clean: bool,
    },
}

/// Why writes were refused (`error::Lost`, less the I/O error itself,
/// which `why` words): typed by its `kind`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Refused {
    /// Member `member` failed with `already` others unavailable, more in
    /// all than the `parity` covers.
    MemberFailed {
        member: usize,
        name: String,
        already: usize,
        parity: usize,
    },
    /// Member `member`'s superblock could not be written, and no more
    /// members may fail.
    SuperblockUnwritten { member: usize, name: String },
}

impl std::fmt::Display for What {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            What::Opened {
                milliseconds,
                clean_stop,
                slots_scanned,
                stripes_replayed,
            } => write!(
                f,
                "opened in {milliseconds} ms{}: {slots_scanned} slots scanned, {stripes_replayed} stripes replayed",
                if *clean_stop { " after a clean stop" } else { "" }
            ),
            What::MemberFailed { member, name, by_hand } => {
                write!(f, "member {member} ({name}) failed{}", if *by_hand { " by hand" } else { "" })
            }
            What::WritesRefused { why, .. } => write!(f, "writes refused: {why}"),
            What::SlotPagesUnreadable { why } => write!(f, "slot pages left for after opening cannot be read: {why}"),
            What::ReplayUnfinished { why } => write!(f, "the replay left for after opening cannot be mapped: {why}"),
            What::RebuildStarted { member, name } => write!(f, "rebuild of member {member} onto {name} started"),
            What::RebuildEnded {
                member,
                stripes_done,
                stripes_total,
                error,
            } => match error {
                None if stripes_done == stripes_total => {
                    write!(f, "rebuild of member {member} done: {stripes_total} stripes")
                }
                None => write!(f, "rebuild of member {member} stopped at {stripes_done} of {stripes_total} stripes"),
                Some(error) => write!(f, "rebuild of member {member} failed at {stripes_done} of {stripes_total} stripes: {error}"),
            },
            What::ScrubEnded {
                stripes_checked,
                chunks_bad,
                chunks_repaired,
                stopped,
            } => write!(
                f,
                "scrub {}: {stripes_checked} stripes checked, {chunks_bad} bad chunks found, {chunks_repaired} repaired",
                if *stopped { "stopped" } else { "done" }
            ),
            What::HealEnded {
                stripes_healed,
                stripes_degraded,
                stopped,
            } => write!(
                f,
                "heal {}: {stripes_healed} stripes moved to healthy members, {stripes_degraded} still degraded",
                if *stopped { "stopped" } else { "done" }
            ),
            What::Closed { clean } => write!(f, "closed{}", if *clean { " cleanly" } else { "" }),
        }
    }
}

/// The history.
#[derive(Default)]
pub struct Events(Mutex<Kept>);

#[derive(Default)]
struct Kept {
    events: VecDeque<Event>,
    /// Events recorded since the array was opened, those dropped included.
    recorded: u64,
}

impl Events {
    pub fn record(&self, what: What) {
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if kept.events.len() == EVENTS_MAX {
            kept.events.pop_front();
        }
        kept.events.push_back(Event { unix_ms, what });
        kept.recorded += 1;
    }

    /// Every event kept, oldest first.
    pub fn list(&self) -> Vec<Event> {
        self.since(0).0
    }

    /// The events kept of those recorded after the first `seen`, oldest
    /// first, and how many have been recorded: what to ask for next time
    /// (a reader that falls more than `EVENTS_MAX` behind misses some).
    pub fn since(&self, seen: u64) -> (Vec<Event>, u64) {
        let kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let first = kept.recorded - kept.events.len() as u64;
        let skip = seen.saturating_sub(first).min(kept.events.len() as u64) as usize;
        (kept.events.iter().skip(skip).cloned().collect(), kept.recorded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_history_keeps_the_newest_and_round_trips() {
        let events = Events::default();
        for member in 0..EVENTS_MAX + 3 {
            events.record(What::RebuildStarted {
                member,
                name: format!("m{member}"),
            });
        }
        let list = events.list();
        assert_eq!(list.len(), EVENTS_MAX);
        assert_eq!(
            list[0].what,
            What::RebuildStarted {
                member: 3,
                name: "m3".into()
            }
        );
        let json = serde_json::to_string(&list[0]).unwrap();
        assert!(json.contains("\"kind\":\"rebuild_started\""), "{json}");
        assert_eq!(serde_json::from_str::<Event>(&json).unwrap(), list[0]);
        assert_eq!(list[0].what.to_string(), "rebuild of member 3 onto m3 started");
        // Read from where a reader left off: none twice, none missed
        // while it keeps up.
        let (newest, recorded) = events.since(EVENTS_MAX as u64 + 1);
        assert_eq!((newest.len(), recorded), (2, EVENTS_MAX as u64 + 3));
        assert_eq!(newest, list[EVENTS_MAX - 2..]);
        events.record(What::Closed { clean: true });
        let (newer, recorded) = events.since(recorded);
        assert_eq!((newer.len(), recorded), (1, EVENTS_MAX as u64 + 4));
        assert_eq!(events.since(recorded).0, []);
        assert_eq!(events.since(0).0.len(), EVENTS_MAX, "fallen behind: what is kept");
    }
}
