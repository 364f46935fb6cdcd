//! The fuzz targets' corpora as a regression test on stable (issue 23):
//! every file in `fuzz/corpus/TARGET/` (the seeds, and any input a fuzzing
//! run found and added there) goes through the target's entry point in
//! `worklease::fuzz`, which panics on a broken invariant. Fuzzing itself
//! runs with cargo-fuzz (see `fuzz/Cargo.toml`).
#![cfg(all(feature = "fuzzing", feature = "object-store"))]

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
];

#[test]
fn every_corpus_input_keeps_its_targets_invariants() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut targets = std::fs::read_dir(root.join("fuzz_targets"))
        .expect("fuzz/fuzz_targets")
        .map(|e| e.expect("an entry").path())
        .filter_map(|p| Some(p.file_stem()?.to_str()?.to_string()))
        .collect::<Vec<_>>();
    targets.sort();
    let mut known: Vec<String> = TARGETS.iter().map(|(n, _)| n.to_string()).collect();
    known.sort();
    assert_eq!(targets, known, "every fuzz target has its entry here");
    for (name, target) in TARGETS {
        let dir = root.join("corpus").join(name);
        let inputs: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("an entry").path())
            .collect();
        assert!(!inputs.is_empty(), "{name}: no seed in {}", dir.display());
        for input in inputs {
            let data = std::fs::read(&input).expect("a corpus file");
            target(&data);
        }
    }
}
