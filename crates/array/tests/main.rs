//! The array's integration tests, one binary: each file of this folder is
//! a module of it, so the crate and its generics are compiled and linked
//! once for all of them, not once a file (`docs/PERFORMANCE.md`, "What
//! CI's time goes to"). Run one file's tests by its module name:
//! `cargo test --release -p tessera-array --test array crash::`.

mod common;

mod array;
mod close;
mod crash;
mod heal;
mod intent;
mod layers;
mod map_pages;
mod rebuild;
mod regressions;
mod simulation;
mod space;
mod volumes;
