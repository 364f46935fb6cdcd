//! The fuzz targets' corpora as a regression test on stable (issue 23):
//! every file in `fuzz/corpus/TARGET/` (the seeds, and any input a fuzzing
//! run found and added there) goes through the target's entry point in
//! `worklease::fuzz`, which panics on a broken invariant. Fuzzing itself
//! runs with cargo-fuzz (see `fuzz/Cargo.toml`). The command's targets
//! (`cli_*`) are run by the worklease-cli crate's `tests/fuzz_corpus.rs`.
#![cfg(all(
    feature = "fuzzing",
    feature = "object-store",
    feature = "sqlite",
    feature = "postgres",
    feature = "redis",
    feature = "etcd"
))]

use std::path::Path;

type Target = fn(&[u8]);

const TARGETS: &[(&str, Target)] = &[
    ("token", worklease::fuzz::token),
    ("store_url", worklease::fuzz::store_url),
    ("election_record", worklease::fuzz::election_record),
    ("fair_line", worklease::fuzz::fair_line),
    ("work_id", worklease::fuzz::work_id),
    ("register_record", worklease::fuzz::register_record),
    ("object_key", worklease::fuzz::object_key),
    ("sqlite_row", worklease::fuzz::sqlite_row),
    ("sql_row", worklease::fuzz::sql_row),
    ("redis_reply", worklease::fuzz::redis_reply),
    ("etcd_values", worklease::fuzz::etcd_values),
];

#[test]
fn every_corpus_input_keeps_its_targets_invariants() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut targets = std::fs::read_dir(root.join("fuzz_targets"))
        .expect("fuzz/fuzz_targets")
        .map(|e| e.expect("an entry").path())
        .filter_map(|p| Some(p.file_stem()?.to_str()?.to_string()))
        .filter(|name| !name.starts_with("cli_"))
        .collect::<Vec<_>>();
    targets.sort();
    let mut known: Vec<String> = TARGETS.iter().map(|(n, _)| n.to_string()).collect();
    known.sort();
    assert_eq!(targets, known, "every fuzz target has its entry here");
    for (name, target) in TARGETS {
        worklease::fuzz::run_corpus(&root, name, *target);
    }
}
