//! Fuzz target: `worklease_cli::fuzz::values` (see its docs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| worklease_cli::fuzz::values(data));
