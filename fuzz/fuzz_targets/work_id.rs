//! Fuzz target: `worklease::fuzz::work_id` (see its docs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| worklease::fuzz::work_id(data));
