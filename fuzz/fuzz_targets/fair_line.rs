//! Fuzz target: `worklease::fuzz::fair_line` (see its docs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| worklease::fuzz::fair_line(data));
