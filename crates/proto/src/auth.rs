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

/// The token as the proofs of a connection under TLS use it: bound to
/// that TLS session's exporter value (`binding`), so a proof relayed from
/// one TLS session into another does not hold.
pub fn bound_token(token: &[u8], binding: &[u8; 32]) -> [u8; 32] {
    let mut m = Hmac::<Sha256>::new_from_slice(token).expect("HMAC accepts any key length");
    m.update(b"ferry v1 tls binding");
    m.update(binding);
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
    use subtle::ConstantTimeEq;
    bool::from(a.ct_eq(b))
}

/// A session's secret, known to both ends and never sent: derived from the
/// token (empty without authentication) and the nonces of the connection
/// that created the session.
pub fn session_secret(token: &[u8], server_nonce: &Nonce, client_nonce: &Nonce) -> [u8; 32] {
    mac(token, b"ferry v1 session", server_nonce, client_nonce)
}

/// What a connection sends to join session `id`: the secret proven over
/// this connection's own nonces, so an attach seen on the wire cannot be
/// replayed on another connection.
pub fn attach_proof(secret: &[u8; 32], id: u64, server_nonce: &Nonce, client_nonce: &Nonce) -> [u8; 32] {
    let mut m = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC accepts any key length");
    m.update(b"ferry v1 attach");
    m.update(&id.to_le_bytes());
    m.update(server_nonce);
    m.update(client_nonce);
    m.finalize().into_bytes().into()
}
