//! Fuzz target: `worklease::fuzz::sql_row` (see its docs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| worklease::fuzz::sql_row(data));
