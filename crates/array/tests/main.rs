//! The array's integration tests, one binary: each file of this folder is
//! a module of it, so their tests share the cores (twelve binaries ran one
//! after another, each waiting for its slowest test) and are compiled and
//! linked once (`docs/PERFORMANCE.md`, "What CI's time goes to"). Run one
//! file's tests by its module name:
//! `cargo test --release --workspace --test array crash::` (`--workspace`
//! builds the dependencies with the features the workspace's build gave
//! them; `-p tessera-array` would build them again).

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

/// Every file of a crate's `tests/` is a module of its `tests/main.rs`,
/// in each crate of the workspace that has one binary for its tests
/// (`autotests = false`): cargo no longer finds the files itself, so a
/// new one left out would never run.
#[test]
fn every_test_file_is_a_module_of_its_crate_s_binary() {
    let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = 0;
    let mut left_out = Vec::new();
    for krate in std::fs::read_dir(&crates).unwrap() {
        let krate = krate.unwrap().path();
        let manifest = std::fs::read_to_string(krate.join("Cargo.toml")).unwrap_or_default();
        if !manifest.lines().any(|l| l.trim() == "autotests = false") {
            continue;
        }
        let folder = krate.join("tests");
        let main = std::fs::read_to_string(folder.join("main.rs")).unwrap();
        checked += 1;
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
            let rust = path.extension().is_some_and(|e| e == "rs") || path.join("mod.rs").exists();
            if rust && stem != "main" && !main.lines().any(|l| l.trim() == format!("mod {stem};")) {
                left_out.push(path);
            }
        }
    }
    assert!(
        checked >= 2,
        "the array's and the command's tests are one binary each; {checked} found"
    );
    assert!(
        left_out.is_empty(),
        "files that are no module of their tests/main.rs: {left_out:?}"
    );
}
