//! Fuzz target: `worklease::fuzz::token` (see its docs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| worklease::fuzz::token(data));
