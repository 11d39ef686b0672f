#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tessera::fuzzing::cluster_heartbeat(data));
