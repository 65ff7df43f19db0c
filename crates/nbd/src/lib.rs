//! NBD server.
