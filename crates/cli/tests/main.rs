//! The command's integration tests, one binary: each file of this folder
//! is a module of it, so they are compiled and linked once, not once a
//! file. Run one file's tests by its module name:
//! `cargo test --release -p tessera --test cli nbd::`.

mod common;

mod cli;
mod kv;
mod nbd;
