//! Challenge–response authentication: both sides prove knowledge of the
//! shared token with HMAC-SHA256 over both nonces; the token never travels.

use hmac::{Hmac, Mac};
use sha2::Sha256;

pub type Nonce = [u8; 32];

fn mac(token: &[u8], label: &[u8], a: &Nonce, b: &Nonce) -> [u8; 32] {
    let mut m = Hmac::<Sha256>::new_from_slice(token).expect("HMAC accepts any key length");
    m.update(label);
    m.update(a);
    m.update(b);
    m.finalize().into_bytes().into()
}

/// What the client sends to prove it holds the token.
pub fn client_proof(token: &[u8], server_nonce: &Nonce, client_nonce: &Nonce) -> [u8; 32] {
    mac(token, b"ferry v1 client", server_nonce, client_nonce)
}

/// What the server sends back to prove it holds the token too.
pub fn server_proof(token: &[u8], server_nonce: &Nonce, client_nonce: &Nonce) -> [u8; 32] {
    mac(token, b"ferry v1 server", client_nonce, server_nonce)
}

/// Compares proofs without an early exit, so timing does not leak a prefix.
pub fn proofs_equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
