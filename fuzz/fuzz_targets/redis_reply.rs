//! Fuzz target: `worklease::fuzz::redis_reply` (see its docs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| worklease::fuzz::redis_reply(data));
