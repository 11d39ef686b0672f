#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tessera::fuzzing::ddata_durable_record(data));
