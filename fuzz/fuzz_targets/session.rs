//! A server session (memory backend) running a sequence of arbitrary
//! requests: never a panic, whatever the order, handles or paths.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_server::fuzz::session(data));
