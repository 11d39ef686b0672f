#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tessera::fuzzing::sharding_machines(data));
