//! Fuzz target: `worklease::fuzz::register_record` (see its docs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| worklease::fuzz::register_record(data));
