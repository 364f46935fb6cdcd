//! Fuzz target: `worklease::fuzz::sqlite_row` (see its docs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| worklease::fuzz::sqlite_row(data));
