//! Fuzz target: `worklease::fuzz::etcd_values` (see its docs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| worklease::fuzz::etcd_values(data));
