//! Fuzz target: `worklease_cli::fuzz::work_id_file` (see its docs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| worklease_cli::fuzz::work_id_file(data));
