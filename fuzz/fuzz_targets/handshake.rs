//! The server's handshake machine fed arbitrary frames: never a panic,
//! never an acceptance without the token's proof.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_server::fuzz::handshake(data));
