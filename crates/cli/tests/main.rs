//! The command's integration tests, one binary: each file of this folder
//! is a module of it, so they are compiled and linked once, not once a
//! file. Run one file's tests by its module name:
//! `cargo test --release --workspace --test cli nbd::`. (That every file
//! is a module here is checked by the array's tests.)

mod common;

mod cli;
mod kv;
mod nbd;
