//! Every decoder fed a frame (`ferry_server::fuzz::frame`): no panic, and
//! what a decoder accepts encodes again to exactly the same bytes.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_server::fuzz::frame(data));
