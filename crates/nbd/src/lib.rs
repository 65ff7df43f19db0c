//! An NBD server for any [`Export`]: fixed newstyle negotiation
//! (NBD_OPT_GO, INFO, LIST, ABORT, EXPORT_NAME, STARTTLS,
//! STRUCTURED_REPLY, LIST_META_CONTEXT and SET_META_CONTEXT with
//! `base:allocation`), block size information, and READ, WRITE, FLUSH,
//! TRIM, CACHE, WRITE_ZEROES (with FAST_ZERO), BLOCK_STATUS and DISC with
//! FUA, over TCP, Unix sockets or a socket systemd passed, in plaintext or
//! TLS (X.509 or pre-shared keys), many connections at once.
//!
//! A request that is malformed or out of range gets the protocol's error
//! and changes nothing; a request whose framing cannot be trusted (bad
//! magic, a write payload over the limit) ends the connection, as the
//! protocol allows. What clients can make the server hold (connections,
//! threads, bytes) is bounded by [`Limits`].
//!
//! The rooms, in the order a connection passes through them:
//! - [`wire`]: the wire format, pure functions (property-tested, fuzzed);
//! - `listen`: accepting connections, and draining them on stop;
//! - `server`: one connection's life, the threads it uses;
//! - `negotiate`: option negotiation;
//! - `tls`: the TLS upgrade;
//! - `transmit` and `pool`: requests, carried out by workers shared by
//!   all connections, and their replies.

mod export;
mod listen;
mod negotiate;
mod pool;
mod server;
mod tls;
mod transmit;
pub mod wire;

pub use export::{Catalog, Export, Failure, Single};
pub use listen::{run, Listener};
pub use server::{Connection, Limits, Server, REQUESTS_IN_FLIGHT_MAX};
pub use tls::{Tls, TlsError};
pub use wire::{errno, STATE_HOLE, STATE_ZERO};

#[cfg(test)]
mod tests;
