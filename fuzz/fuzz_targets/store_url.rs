//! Fuzz target: `worklease::fuzz::store_url` (see its docs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| worklease::fuzz::store_url(data));
