//! Fuzz target: `worklease::fuzz::object_key` (see its docs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| worklease::fuzz::object_key(data));
