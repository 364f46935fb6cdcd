//! The corpora of the command's fuzz targets (`fuzz/corpus/cli_*`) as a
//! regression test on stable (issue 23): every file goes through the
//! target's entry point in `worklease_cli::fuzz`, which panics on a
//! broken invariant. The library's targets are run by the worklease
//! crate's `tests/fuzz_corpus.rs`.

use std::path::Path;

type Target = fn(&[u8]);

const TARGETS: &[(&str, Target)] = &[
    ("cli_values", worklease_cli::fuzz::values),
    ("cli_work_id_file", worklease_cli::fuzz::work_id_file),
];

#[test]
fn every_cli_corpus_input_keeps_its_targets_invariants() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    for (name, target) in TARGETS {
        worklease::fuzz::run_corpus(&root, name, *target);
    }
}
