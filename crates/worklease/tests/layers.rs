//! The layers of `crates/worklease/src` are its folders, and arrows point
//! down only (docs/architecture.md, issue 35). This test reads the sources
//! and fails when a file names, in code, a module of a layer above its
//! own, or when a store names the dispatcher (`store/url.rs`) or another
//! store.
//!
//! The layers, lowest first: the foundation (the root files: errors,
//! limits, tokens, reserved IDs, observation, metrics), `store/`, `lease/`,
//! `primitives/`, `recipes/`, `testkit/`. `lib.rs` is the public surface
//! and names every layer; it is not checked. Doc comments and comments
//! may name any module (they tell a reader where a thing is used); only
//! code counts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The folders that are layers, and their rank (a file may name its own
/// rank and lower ones). A root file is the foundation, rank 0.
const FOLDERS: &[(&str, u8)] = &[
    ("store", 1),
    ("lease", 2),
    ("primitives", 3),
    ("recipes", 4),
    ("testkit", 5),
];

/// The layer names, for messages.
const NAMES: [&str; 6] = [
    "foundation",
    "store",
    "lease",
    "primitives",
    "recipes",
    "testkit",
];

/// Which store adapter other stores may build on: the register adapter
/// turns a compare-and-swap register (an object, an item) into a store.
const SHARED_ADAPTER: &str = "register";

/// The rank of a file from its path below `src/` (`None`: `lib.rs`).
fn file_rank(rel: &str) -> Option<u8> {
    if rel == "lib.rs" {
        return None;
    }
    match rel.split_once('/') {
        None => Some(0),
        Some((folder, _)) => Some(
            FOLDERS
                .iter()
                .find(|(name, _)| *name == folder)
                .unwrap_or_else(|| {
                    panic!("src/{folder}/ is no layer: add it to FOLDERS and docs/architecture.md")
                })
                .1,
        ),
    }
}

/// The module path of a file below `src/` (`store/sqlite/ops.rs` →
/// `["store", "sqlite", "ops"]`; `mod.rs` is its folder's module).
fn module_of(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// What each name at the crate root stands for: its rank, from `lib.rs`'s
/// `mod` declarations (where the module's file lives) and `pub use`
/// re-exports (the rank of the module they come from).
fn root_names(src: &Path, lib: &str) -> BTreeMap<String, u8> {
    let mut names = BTreeMap::new();
    let code = strip_comments(lib);
    for stmt in code.split(';') {
        let stmt = stmt.trim();
        let stmt = stmt.rsplit(']').next().unwrap_or(stmt).trim();
        if let Some(name) = stmt
            .strip_prefix("pub mod ")
            .or_else(|| stmt.strip_prefix("mod "))
        {
            let name = name.trim();
            let rank = if src.join(format!("{name}.rs")).is_file() {
                0
            } else {
                file_rank(&format!("{name}/mod.rs")).expect("a module folder")
            };
            names.insert(name.to_string(), rank);
        }
    }
    for stmt in code.split(';') {
        let stmt = stmt.trim();
        let stmt = stmt.rsplit(']').next().unwrap_or(stmt).trim();
        if let Some(path) = stmt.strip_prefix("pub use ") {
            let (first, rest) = path.split_once("::").expect("pub use a::b");
            let rank = *names
                .get(first.trim())
                .unwrap_or_else(|| panic!("lib.rs re-exports from unknown module {first}"));
            for name in last_names(rest) {
                names.insert(name, rank);
            }
        }
    }
    names
}

/// The names a `use` tail brings in: `a::B` → B, `a::{b, c::D}` → b, D.
fn last_names(tail: &str) -> Vec<String> {
    let tail = tail.trim();
    if let Some(open) = tail.find('{') {
        let group = tail[open + 1..].trim_end().trim_end_matches('}');
        split_top(group)
            .iter()
            .flat_map(|part| last_names(part))
            .collect()
    } else {
        let last = tail.rsplit("::").next().unwrap_or(tail).trim();
        let last = last.rsplit(" as ").next().unwrap_or(last).trim();
        if last.is_empty() {
            Vec::new()
        } else {
            vec![last.to_string()]
        }
    }
}

/// `s` split at the commas outside braces.
fn split_top(s: &str) -> Vec<&str> {
    let (mut depth, mut start, mut out) = (0i32, 0, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out.into_iter().filter(|p| !p.trim().is_empty()).collect()
}

/// The source without whole-line comments and doc comments, without the
/// rest of a line after ` // ` (code never holds that in a string that
/// names a module), and without `#[cfg(test)]` modules: a unit test may
/// drive a store through the lease API above it, which is the test's
/// dependency, not the code's.
fn strip_comments(source: &str) -> String {
    let mut out = Vec::new();
    let mut lines = source.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("//") {
            continue;
        }
        if trimmed == "#[cfg(test)]" && lines.peek().is_some_and(|next| is_module_start(next)) {
            skip_block(&mut lines);
            continue;
        }
        out.push(line.split(" // ").next().unwrap_or(line));
    }
    out.join("\n")
}

/// Whether `line` opens an inline module (`mod tests {`).
fn is_module_start(line: &str) -> bool {
    let line = line.trim();
    (line.starts_with("mod ") || line.starts_with("pub(crate) mod ")) && line.ends_with('{')
}

/// Consumes the lines of the block that the next line opens, to its
/// closing brace (comments and strings hold balanced braces, if any).
fn skip_block<'a>(lines: &mut impl Iterator<Item = &'a str>) {
    let mut depth = 0i32;
    for line in lines {
        let code = if line.trim_start().starts_with("//") {
            ""
        } else {
            line
        };
        depth += code.matches('{').count() as i32 - code.matches('}').count() as i32;
        if depth <= 0 {
            return;
        }
    }
}

/// Every module path a file's code names: `crate::a::b`, `super::x`,
/// `self::y`, and each member of a `{...}` group after them, resolved to
/// a path from the crate root.
fn named_paths(module: &[String], code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < code.len() {
        let rest = &code[i..];
        let at_word_start = i == 0
            || !(bytes[i - 1].is_ascii_alphanumeric()
                || bytes[i - 1] == b'_'
                || bytes[i - 1] == b':'
                || bytes[i - 1] == b'$');
        let head = ["crate::", "super::", "self::"]
            .into_iter()
            .find(|h| rest.starts_with(h));
        match head {
            Some(h) if at_word_start => {
                let end = path_end(rest);
                let path = &rest[..end];
                for resolved in expand(path) {
                    if let Some(p) = resolve(module, &resolved, h) {
                        out.push(p);
                    }
                }
                i += end.max(h.len());
            }
            _ => i += rest.chars().next().map_or(1, char::len_utf8),
        }
    }
    out
}

/// Where a path that starts at `s` ends: identifiers, `::` and balanced
/// `{...}` groups.
fn path_end(s: &str) -> usize {
    let mut depth = 0i32;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth > 0 => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ if depth > 0 => {}
            c if c.is_alphanumeric() || c == '_' || c == ':' => {}
            _ => return i,
        }
    }
    s.len()
}

/// A path with groups expanded: `crate::{a::b, c}` → `crate::a::b`, `crate::c`.
fn expand(path: &str) -> Vec<String> {
    match path.find('{') {
        None => vec![path.trim_end_matches(':').to_string()],
        Some(open) => {
            let prefix = &path[..open];
            let inner = path[open + 1..].trim_end_matches('}');
            split_top(inner)
                .into_iter()
                .flat_map(|member| expand(&format!("{prefix}{}", member.trim())))
                .collect()
        }
    }
}

/// `path` (starting with `crate::`, `super::` or `self::`) from the crate
/// root, seen from `module`.
fn resolve(module: &[String], path: &str, head: &str) -> Option<Vec<String>> {
    let mut segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let mut base: Vec<String> = match head {
        "crate::" => Vec::new(),
        _ => module.to_vec(),
    };
    if head == "crate::" {
        segments.remove(0);
    }
    while let Some(first) = segments.first() {
        match *first {
            "super" => {
                base.pop()?;
                segments.remove(0);
            }
            "self" => {
                segments.remove(0);
            }
            _ => break,
        }
    }
    base.extend(segments.into_iter().map(String::from));
    (!base.is_empty()).then_some(base)
}

/// The broken rules of one file (`rel` below `src/`).
fn violations(
    rel: &str,
    source: &str,
    roots: &BTreeMap<String, u8>,
    stores: &[String],
) -> Vec<String> {
    let Some(rank) = file_rank(rel) else {
        return Vec::new();
    };
    let module = module_of(rel);
    let own_store = match module.as_slice() {
        [store, name, ..] if store == "store" && stores.contains(name) => Some(name.clone()),
        _ => None,
    };
    let mut out = Vec::new();
    for path in named_paths(&module, &strip_comments(source)) {
        let first = &path[0];
        if first == "*" {
            continue;
        }
        let Some(&target) = roots.get(first.as_str()) else {
            // A path inside the file's own module tree (`self::x`) or an
            // item of the crate root that lib.rs does not name.
            if module.first() == Some(first) {
                continue;
            }
            out.push(format!(
                "src/{rel} names crate::{}, which lib.rs does not declare",
                path.join("::")
            ));
            continue;
        };
        if target > rank {
            out.push(format!(
                "src/{rel} ({} layer) names crate::{} ({} layer, above it)",
                NAMES[rank as usize],
                path.join("::"),
                NAMES[target as usize]
            ));
        }
        if let (Some(own), [store, other, ..]) = (&own_store, path.as_slice()) {
            if store == "store" && other != own {
                let is_store = stores.contains(other);
                if other == "url" || (is_store && other != SHARED_ADAPTER) {
                    out.push(format!(
                        "src/{rel} (the {own} store) names crate::{}: a store knows the contract and the shared \
                         store modules, never the dispatcher or another store",
                        path.join("::")
                    ));
                }
            }
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The stores: each folder under `src/store/`, and the in-memory store.
fn store_names(src: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(src.join("store"))
        .expect("read src/store")
        .filter_map(|e| {
            let path = e.ok()?.path();
            path.is_dir()
                .then(|| path.file_name()?.to_str().map(String::from))?
        })
        .collect();
    names.push("memory".to_string());
    names
}

#[test]
fn lower_layers_never_name_higher_ones() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let roots = root_names(
        &src,
        &std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs"),
    );
    let stores = store_names(&src);
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(
        files.len() > 100,
        "found only {} files under {}",
        files.len(),
        src.display()
    );
    let mut broken = Vec::new();
    for file in &files {
        let rel = file
            .strip_prefix(&src)
            .expect("below src")
            .to_string_lossy()
            .replace('\\', "/");
        let source = std::fs::read_to_string(file).expect("read a source file");
        broken.extend(violations(&rel, &source, &roots, &stores));
    }
    assert!(
        broken.is_empty(),
        "arrows that point up:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_root_keeps_at_most_ten_files() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let root: Vec<_> = std::fs::read_dir(&src)
        .expect("read src")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    assert!(
        root.len() <= 10,
        "src/ holds {} files at its root (at most 10: the foundation and lib.rs): {root:?}",
        root.len()
    );
}

/// The check catches what it exists for: upward arrows in a `use` group,
/// through `super::`, and a store naming the dispatcher or another store.
#[test]
fn the_check_catches_upward_arrows() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let roots = root_names(
        &src,
        &std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs"),
    );
    let stores = store_names(&src);
    let cases = [
        (
            "store/sqlite/ops.rs",
            "use crate::{error::Error, lease::Leases};",
            1,
        ),
        ("internal.rs", "use crate::fair::QUEUE_SUFFIX;", 1),
        (
            "lease/mod.rs",
            "let s = crate::semaphore::Semaphore::new();",
            1,
        ),
        (
            "primitives/election/term.rs",
            "use crate::recipes::runner::Runner;",
            1,
        ),
        (
            "recipes/pool.rs",
            "use crate::Semaphore;\nuse crate::testkit::sim;",
            1,
        ),
        ("store/sqlite/ops.rs", "use super::super::url::parse;", 1),
        (
            "store/sqlite/mod.rs",
            "let x = super::redis::RedisStore::new();",
            1,
        ),
        (
            "store/object/mod.rs",
            "use crate::store::register::Register;",
            0,
        ),
        (
            "store/sqlite/ops.rs",
            "/// see [`crate::lease::Leases`]\nuse crate::store::record::Record;",
            0,
        ),
        (
            "primitives/semaphore.rs",
            "use crate::fair::TryTarget;\nuse crate::lease::Leases;",
            0,
        ),
    ];
    for (file, code, expected) in cases {
        let found = violations(file, code, &roots, &stores);
        assert_eq!(found.len(), expected, "{file}: {code:?} gave {found:?}");
    }
}
