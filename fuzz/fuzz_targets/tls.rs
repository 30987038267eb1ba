//! The server's side of a TLS connection fed a hostile peer's bytes: a
//! ClientHello and what follows, or records after the handshake (sealed
//! right or not, in pieces). Never a panic, never a record's bytes handed
//! over that did not open, never an allocation sized by the peer.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_server::fuzz::tls(data));
