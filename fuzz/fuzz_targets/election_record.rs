//! Fuzz target: `worklease::fuzz::election_record` (see its docs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| worklease::fuzz::election_record(data));
