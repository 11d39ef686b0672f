#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tessera::fuzzing::bootstrap_answer(data));
