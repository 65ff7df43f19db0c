//! KV spaces: records inserted in bulk at the array's write speed, sorted
//! by key and indexed afterwards, queried reading only what they select
//! (KV-CSD's split of work, in software).
//!
//! - [`schema`]: a space's schema (a u64 key, typed fields, indexes).
//! - `frame`: how batches sit in a volume (Arrow IPC in checked frames);
//!   [`message`]: inserted batches checked as Flight carries them, stored
//!   without decoding.
//! - `manifest`: a space's durable state, in two copies at its start.
//! - [`space`]: one space: insert, finalize, query, its deferred work.
//! - `sort`: the deferred work, an external sort into tables; `pace`:
//!   how it yields to clients.
//! - `table`: sorted tables, their directories and lookups; `cache`:
//!   their batches kept for the queries that read them again.
//! - [`store`]: the spaces of an array, each in its own thin volume, and
//!   the thread that does their deferred work.
//! - [`flight`]: the spaces served with Arrow Flight.
//!
//! Threads and locks: `docs/KV.md`.

mod cache;
pub mod flight;
mod frame;
mod intake;
mod manifest;
pub mod message;
mod pace;
pub mod query;
pub mod schema;
mod sort;
pub mod space;
pub mod store;
mod table;

pub use cache::CacheStatus;
pub use message::{Incoming, IpcBatch};
pub use query::{Bound, Query, QueryResult};
pub use schema::{Duplicates, FieldSpec, FieldType, SpaceSchema};
pub use space::{Phase, Progress, Space, SpaceStatus};
pub use store::{Store, StoreOptions};
pub use table::KEY_TABLE_ROWS;

use tessera_array::ArrayError;

#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error("bad schema: {why}")]
    BadSchema { why: String },
    #[error("the batch does not match the space's schema: {why}")]
    SchemaMismatch { why: String },
    #[error("an Arrow IPC batch the space cannot take: {why}")]
    BadBatch { why: String },
    #[error("bad space name {name:?}: 1 to {max} bytes of letters, digits, '-', '_' and '.'", max = store::SPACE_NAME_BYTES_MAX)]
    BadName { name: String },
    #[error("no space named {name:?}")]
    UnknownSpace { name: String },
    #[error("a space named {name:?} exists already")]
    SpaceExists { name: String },
    #[error("space {name:?} is finalized: it takes no more inserts")]
    Finalized { name: String },
    #[error("bad query: {why}")]
    BadQuery { why: String },
    #[error("too large: {why}")]
    TooLarge { why: String },
    #[error("space data is corrupt: {why}")]
    Corrupt { why: String },
    #[error("space {name:?} stopped taking inserts after a failed one whose frames could not be cleared ({why}): open it again")]
    Poisoned { name: String, why: String },
    #[error("the deferred work was stopped")]
    Stopped,
    #[error(transparent)]
    Array(#[from] ArrayError),
}
