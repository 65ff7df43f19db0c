//! The array: N member devices as one checked, erasure-coded block volume.
//!
//! Bottom up, each module owning one thing (threads and locks: `docs/ENGINE.md`):
//!
//! - [`device`]: the I/O seam (files, block devices, a faulty in-memory device for tests).
//! - [`format`]: superblocks, chunk headers, stripe summaries, checkpoints, placement.
//! - [`limits`]: the engine's limits and defaults, with why.
//! - [`stripe`]: packing one stripe, sealing it, reading it back whole.
//! - [`map`]: logical blocks to extents (L2P), with versions.
//! - [`slots`]: what each stripe slot holds; allocation; pins.
//! - `members`: member health and the superblocks that record it.
//! - `io`: each member's queue of chunk writes, and syncs; `fanout`: the
//!   threads a request's chunk reads go out on side by side.
//! - `stripes`: the stripe layer's state (members, their I/O, the
//!   reconstruction cache, spare buffers) and its reads: a stripe's data
//!   area or a range of it, checked; a stripe rebuilt from any K chunks;
//!   bad chunks rewritten. It knows nothing of the map.
//! - `index`: what the index's lock protects (the map, the slot table,
//!   where unwritten stripes are, a replay's records not mapped yet).
//! - `catalog`: the index layer over the stripes: the index under its
//!   lock, the slots' pins, the map cache.
//! - `lanes`: the open stripes writes are packed into, sealing, handing
//!   stripes to the members, syncs; `tracker`: sequences, and how far
//!   writes and syncs have gone.
//! - `read`: the read path over the stripes, the index and the lanes.
//! - `intent`: the intent log over the lanes; `deferred` (with
//!   `slot_loader` and `replay`): the work opening left for later.
//! - `checkpoint`: the checkpoints over those; `recovery`: the map
//!   rebuilt at open from them and the stripes since.
//! - `engine`: the layers above those and the public [`Array`]; beside
//!   it `write`, `gc`, `repair`, `rebuild`, `heal`, `maintenance`,
//!   `volumes` and `status`.
//!
//! - `create`, `open`: formatting members; opening them, checked, and
//!   recovering the map. `error`: every error, typed.
//!
//! This file only declares the modules and re-exports.

pub mod activity;
mod cache;
mod catalog;
mod checkpoint;
mod counters;
mod create;
mod deferred;
pub mod device;
mod engine;
mod error;
pub mod events;
mod fanout;
pub mod format;
mod gc;
mod heal;
mod index;
mod intent;
mod io;
mod lanes;
pub mod limits;
mod maintenance;
pub mod map;
mod members;
mod open;
mod options;
mod read;
mod rebuild;
mod recovery;
mod repair;
mod replay;
mod slot_loader;
mod slot_set;
pub mod slots;
mod status;
pub mod stripe;
mod stripes;
#[cfg(test)]
mod test_heap;
mod tracker;
mod volumes;
mod write;

pub use checkpoint::CheckpointParts;
pub use create::{create, create_with, plan, CreateOptions};
pub use engine::Array;
pub use error::{
    ArrayError, ArrayId, CheckpointFault, GeometryError, LeftOut, LogsMissing, Lost, Opener, Rejected, Rejections,
};
pub use format::hex;
pub use format::volume;
pub use heal::HealReport;
pub use intent::{LogDeviceStatus, LogPlace, LogRecovery, LogStatus};
pub use members::{read_superblock, Member, MemberState};
pub use open::{open, open_with};
pub use options::EngineOptions;
pub use rebuild::{RebuildOptions, RebuildReport, RebuildResume};
pub use recovery::{Recovery, RecoveryPhases};
pub use repair::ScrubReport;
pub use status::{AcceleratorStatus, MemberStatus, Status};
pub use volumes::{Volume, VolumeStatus};
pub use write::extent_blocks_max;
