//! The crate's layers as `docs/ENGINE.md` states them, read from the
//! sources: the modules below the engine import only each other, never
//! in a cycle; every module names the module an item comes from, never
//! the crate root's re-exports; `lib.rs` only declares modules and
//! re-exports.
//!
//! A module is a file of `src/` (a folder's files belong to the module of
//! the same name: `map/entries.rs` is `map`); what it imports is every
//! `crate::NAME` it says outside comments and outside its tests (its
//! `#[cfg(test)] mod tests`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Below the engine: the I/O seam, the format, the map, the slot table,
/// the members, the stripe layer, the index layer over it (the index and
/// the map cache), the lanes over both (open stripes, sealing, handing
/// stripes to the members, syncs; the sequences' tracker), the read path
/// over those, the intent log over the lanes, the work opening left for
/// later (slot pages, a replay's records), the checkpoints over those,
/// recovery (which rebuilds the index and loads the checkpoints),
/// and what they share. None of them knows the engine or anything built
/// on it.
const BELOW_THE_ENGINE: &[&str] = &[
    "activity",
    "cache",
    "catalog",
    "checkpoint",
    "counters",
    "deferred",
    "device",
    "error",
    "events",
    "fanout",
    "format",
    "index",
    "intent",
    "io",
    "lanes",
    "limits",
    "map",
    "members",
    "options",
    "read",
    "recovery",
    "replay",
    "slot_loader",
    "slot_set",
    "slots",
    "stripe",
    "stripes",
    "tracker",
];

/// Each module's imports of other modules, and the names it reaches
/// through the crate root that are not modules.
fn imports() -> (BTreeMap<String, BTreeSet<String>>, BTreeMap<String, BTreeSet<String>>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            for inner in std::fs::read_dir(&path).unwrap() {
                let inner = inner.unwrap().path();
                files.push((path.file_name().unwrap().to_str().unwrap().to_string(), inner));
            }
        } else {
            files.push((path.file_stem().unwrap().to_str().unwrap().to_string(), path));
        }
    }
    let modules: BTreeSet<String> = files.iter().map(|(m, _)| m.clone()).filter(|m| m != "lib").collect();
    // A folder's file that `lib.rs` re-exports as a module of the crate
    // root (`pub use format::volume;`) is reached as `crate::volume`:
    // it is its folder's module.
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let aliases: BTreeMap<String, String> = files
        .iter()
        .filter_map(|(module, path)| {
            let stem = path.file_stem()?.to_str()?;
            (stem != module.as_str() && lib.contains(&format!("pub use {module}::{stem};")))
                .then(|| (stem.to_string(), module.clone()))
        })
        .collect();
    let resolve = |name: &str| aliases.get(name).cloned().unwrap_or_else(|| name.to_string());
    let (mut deps, mut root): (BTreeMap<String, BTreeSet<String>>, BTreeMap<String, BTreeSet<String>>) =
        Default::default();
    for (module, path) in &files {
        if module == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(path).unwrap();
        let code = code_of(&text);
        for name in crate_paths(&code) {
            let name = resolve(&name);
            if name == *module || name == "self" || name == "super" {
                continue;
            }
            if modules.contains(&name) {
                deps.entry(module.clone()).or_default().insert(name);
            } else {
                root.entry(module.clone()).or_default().insert(name);
            }
        }
    }
    (deps, root)
}

/// `text` without comments and without its tests module (from
/// `#[cfg(test)]` before `mod tests` to the `}` that closes it, the first
/// line that is `}` alone).
fn code_of(text: &str) -> String {
    let mut code = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]")
            && lines.peek().is_some_and(|next| {
                next.trim_start()
                    .trim_start_matches("pub(crate) ")
                    .starts_with("mod tests")
            })
        {
            lines.by_ref().take_while(|l| *l != "}").for_each(drop);
            continue;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        code.push_str(line.split(" // ").next().unwrap());
        code.push('\n');
    }
    code
}

/// The first name after each `crate::`, and each top-level name of a
/// `crate::{...}` group.
fn crate_paths(code: &str) -> Vec<String> {
    let ident = |s: &str| -> String { s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect() };
    let mut names = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        names.push(ident(item.trim()));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            names.push(ident(item.trim()));
        } else {
            names.push(ident(rest));
        }
    }
    names.retain(|n| !n.is_empty());
    names
}

#[test]
fn the_modules_below_the_engine_import_only_each_other_and_in_no_cycle() {
    let (deps, _) = imports();
    let below: BTreeSet<String> = BELOW_THE_ENGINE.iter().map(|m| m.to_string()).collect();
    for module in &below {
        let upward: Vec<_> = deps
            .get(module)
            .into_iter()
            .flatten()
            .filter(|d| !below.contains(*d))
            .collect();
        assert!(upward.is_empty(), "{module}, below the engine, imports {upward:?}");
    }
    // Depth-first, each module's imports done before it: a module met
    // again while its own are being walked closes a cycle.
    fn walk(
        module: &str,
        deps: &BTreeMap<String, BTreeSet<String>>,
        walking: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) {
        if done.contains(module) {
            return;
        }
        if let Some(at) = walking.iter().position(|m| m == module) {
            panic!("a cycle below the engine: {:?} -> {module}", &walking[at..]);
        }
        walking.push(module.to_string());
        for next in deps.get(module).into_iter().flatten() {
            walk(next, deps, walking, done);
        }
        walking.pop();
        done.insert(module.to_string());
    }
    let mut done = BTreeSet::new();
    for module in &below {
        walk(module, &deps, &mut Vec::new(), &mut done);
    }
    // The check sees imports: the stripe layer uses the format and the
    // members (so a parser that found nothing would fail here).
    assert!(deps["stripes"].contains("format") && deps["stripes"].contains("members"));
    assert!(deps["engine"].contains("stripes"));
}

#[test]
fn modules_name_where_an_item_comes_from_not_the_crate_root() {
    let (_, root) = imports();
    assert!(root.is_empty(), "items reached through lib.rs's re-exports: {root:?}");
}

#[test]
fn lib_rs_only_declares_modules_and_re_exports() {
    let lib = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let mut in_use = false;
    for line in code_of(&lib).lines().map(str::trim).filter(|l| !l.is_empty()) {
        let declares = line.starts_with("mod ") || line.starts_with("pub mod ") || line.starts_with("#[");
        if !in_use && !declares && !line.starts_with("pub use ") {
            panic!("lib.rs holds more than modules and re-exports: {line:?}");
        }
        if line.starts_with("pub use ") {
            in_use = true;
        }
        if in_use && line.ends_with(';') {
            in_use = false;
        }
    }
}

#[test]
fn crate_paths_are_read_as_rust_writes_them() {
    let code = code_of(
        "use crate::a::B;\nuse crate::{c, d::{E, F}, g::H as I};\n// crate::comment\nlet x = crate::j::k(); // crate::tail\n#[cfg(test)]\nmod tests {\n    use crate::z;\n}\nfn after() { crate::m::n() }\n",
    );
    assert_eq!(crate_paths(&code), ["a", "c", "d", "g", "j", "m"]);
}
