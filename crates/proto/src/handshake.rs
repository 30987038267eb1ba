//! The handshake, as two state machines without I/O: the server and the
//! client feed them the frames they read and send the frames they write.
//! Both sides of the negotiation (versions, capabilities, frame limits, the
//! token proofs) live here once, so they cannot drift apart.

use crate::auth::{bound_token, client_proof, proofs_equal, server_proof, Nonce};
use crate::frame::{Header, FLAG_ERROR, HEADER_LEN};
use crate::msg::{op, ErrorReply, Reply, Request, Welcome};
use crate::{MIN_MAX_FRAME, VERSION_MAX, VERSION_MIN};

/// Largest handshake frame body either side reads: anything bigger before
/// authentication is hostile or not ferry.
pub const HANDSHAKE_MAX_FRAME: u32 = 1024;

/// Request ids of the two handshake requests.
const HELLO_ID: u64 = 1;
const AUTH_ID: u64 = 2;

const EPROTO: u32 = 71;
const EACCES: u32 = 13;
const EPROTONOSUPPORT: u32 = 93;

// ---------------------------------------------------------------------------
// Client

/// What the client proposes.
#[derive(Clone, Debug)]
pub struct ClientOffer {
    pub min_version: u16,
    pub max_version: u16,
    pub caps: u64,
    /// Largest reply body the client accepts.
    pub max_frame: u32,
    pub token: Option<Vec<u8>>,
    /// The TLS session's channel binding, if the connection is under TLS:
    /// the proofs are then made with the token bound to it.
    pub binding: Option<[u8; 32]>,
}

/// The key the proofs of a connection use: the token, bound to the TLS
/// session if there is one.
fn proof_key(token: &[u8], binding: &Option<[u8; 32]>) -> Vec<u8> {
    match binding {
        Some(b) => bound_token(token, b).to_vec(),
        None => token.to_vec(),
    }
}

/// Why the client's handshake failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientError {
    /// The peer's first bytes are not a ferry reply; `said` quotes them when
    /// they are text (a web or ssh server), else it is empty.
    NotFerry { said: String },
    /// The server refused with an error reply (version, limits, busy...).
    Refused { errno: u32, message: String },
    /// The server wants a token and the client has none.
    NoToken,
    /// The server could not prove it holds the token.
    BadServerProof,
    /// The server broke the protocol during the handshake.
    Protocol(String),
}

enum ClientState {
    AwaitWelcome,
    AwaitAuthOk(Welcome),
    Done,
}

pub struct ClientHandshake {
    offer: ClientOffer,
    nonce: Nonce,
    state: ClientState,
}

impl ClientHandshake {
    /// Starts a handshake; `out` receives the `Hello` frame to send.
    pub fn start(offer: ClientOffer, nonce: Nonce, out: &mut Vec<u8>) -> ClientHandshake {
        Request::Hello {
            min_version: offer.min_version,
            max_version: offer.max_version,
            caps: offer.caps,
            max_frame: offer.max_frame,
            nonce,
        }
        .encode(HELLO_ID, out);
        ClientHandshake { offer, nonce, state: ClientState::AwaitWelcome }
    }

    /// Checks the first bytes of a reply (`raw`, at most a header's worth;
    /// fewer if the peer closed) before its body is read. A ferry server
    /// echoes the request's op and id with flags 0 or error and a small
    /// body; a web or ssh server answers text that makes no such header.
    pub fn header(&self, raw: &[u8]) -> Result<Header, ClientError> {
        let (op, id) = match self.state {
            ClientState::AwaitWelcome => (op::HELLO, HELLO_ID),
            ClientState::AwaitAuthOk(_) => (op::AUTH, AUTH_ID),
            ClientState::Done => return Err(ClientError::Protocol("handshake already done".into())),
        };
        let Ok(hb) = <&[u8; HEADER_LEN]>::try_from(raw) else {
            return Err(not_ferry(raw));
        };
        let h = Header::decode(hb);
        let plausible = h.op == op && h.id == id && h.flags & !FLAG_ERROR == 0 && h.len <= HANDSHAKE_MAX_FRAME;
        if plausible {
            Ok(h)
        } else {
            Err(not_ferry(raw))
        }
    }

    /// Takes a reply checked by [`header`](Self::header). `Ok(None)`: `out`
    /// holds the next frame to send. `Ok(Some(w))`: the handshake is done.
    pub fn receive(&mut self, h: &Header, body: &[u8], out: &mut Vec<u8>) -> Result<Option<Welcome>, ClientError> {
        if h.is_error() {
            let e = ErrorReply::decode(body).map_err(|e| ClientError::Protocol(e.to_string()))?;
            return Err(ClientError::Refused { errno: e.errno, message: e.message.to_string() });
        }
        match std::mem::replace(&mut self.state, ClientState::Done) {
            ClientState::AwaitWelcome => {
                let w = match Reply::decode(h.op, body) {
                    Ok(Reply::Welcome(w)) => w,
                    _ => return Err(ClientError::Protocol("bad welcome".into())),
                };
                if w.max_frame < MIN_MAX_FRAME {
                    return Err(ClientError::Protocol(format!(
                        "server frame limit {} is below the minimum",
                        w.max_frame
                    )));
                }
                if w.version < self.offer.min_version || w.version > self.offer.max_version {
                    return Err(ClientError::Protocol(format!("server chose version {} we did not offer", w.version)));
                }
                if !w.auth_required {
                    return Ok(Some(w));
                }
                let Some(token) = &self.offer.token else {
                    return Err(ClientError::NoToken);
                };
                let proof = client_proof(&proof_key(token, &self.offer.binding), &w.nonce, &self.nonce);
                Request::Auth { proof }.encode(AUTH_ID, out);
                self.state = ClientState::AwaitAuthOk(w);
                Ok(None)
            }
            ClientState::AwaitAuthOk(w) => {
                let key = proof_key(self.offer.token.as_deref().unwrap_or_default(), &self.offer.binding);
                match Reply::decode(h.op, body) {
                    Ok(Reply::AuthOk { proof }) if proofs_equal(&proof, &server_proof(&key, &w.nonce, &self.nonce)) => {
                        Ok(Some(w))
                    }
                    _ => Err(ClientError::BadServerProof),
                }
            }
            ClientState::Done => Err(ClientError::Protocol("handshake already done".into())),
        }
    }
}

/// Quotes the start of a non-ferry answer when it is text.
fn not_ferry(first: &[u8]) -> ClientError {
    let printable = !first.is_empty() && first.iter().take(8).all(|b| b.is_ascii_graphic() || *b == b' ');
    let said = if printable {
        first
            .iter()
            .take_while(|b| **b != b'\r' && **b != b'\n')
            .map(|&b| if b.is_ascii_graphic() || b == b' ' { b as char } else { '.' })
            .collect()
    } else {
        String::new()
    };
    ClientError::NotFerry { said }
}

// ---------------------------------------------------------------------------
// Server

/// What the server offers.
#[derive(Clone, Debug)]
pub struct ServerOffer {
    pub caps: u64,
    /// Largest request body the server accepts.
    pub max_frame: u32,
    pub window_requests: u32,
    pub window_bytes: u64,
    pub boot_id: u64,
    /// The tokens a client may prove (one per client of a server with
    /// several); empty: no authentication.
    pub tokens: Vec<Vec<u8>>,
    /// The TLS session's channel binding, if the connection is under TLS.
    pub binding: Option<[u8; 32]>,
}

/// What both sides agreed on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    pub version: u16,
    /// Capabilities in force (both sides have them).
    pub caps: u64,
    /// Largest reply body the client accepts.
    pub client_max_frame: u32,
    /// The token the client proved (`None` without authentication).
    pub token: Option<Vec<u8>>,
    /// Both nonces of this connection (sessions derive their secrets and
    /// proofs from them).
    pub server_nonce: Nonce,
    pub client_nonce: Nonce,
}

/// Why the server ends a handshake; `out` already holds the error reply
/// to send (best effort) before closing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Protocol(String),
    AuthFailed,
}

enum ServerState {
    AwaitHello,
    AwaitAuth { client_nonce: Nonce, accepted: Accepted },
    Done,
}

pub struct ServerHandshake {
    offer: ServerOffer,
    nonce: Nonce,
    state: ServerState,
}

impl ServerHandshake {
    /// `nonce`: fresh random bytes for this connection.
    pub fn new(offer: ServerOffer, nonce: Nonce) -> ServerHandshake {
        ServerHandshake { offer, nonce, state: ServerState::AwaitHello }
    }

    /// Takes one frame from the client. `Ok(None)`: send `out` and read the
    /// next frame. `Ok(Some(a))`: send `out`; the handshake is done.
    /// `Err(r)`: send `out` (an error reply) and close.
    pub fn receive(&mut self, h: &Header, body: &[u8], out: &mut Vec<u8>) -> Result<Option<Accepted>, Refusal> {
        match std::mem::replace(&mut self.state, ServerState::Done) {
            ServerState::AwaitHello => self.hello(h, body, out),
            ServerState::AwaitAuth { client_nonce, mut accepted } => {
                // Whichever client's token the proof was made with.
                let matched = match Request::decode(h.op, body) {
                    Ok(Request::Auth { proof }) => self.offer.tokens.iter().find_map(|t| {
                        let key = proof_key(t, &self.offer.binding);
                        proofs_equal(&proof, &client_proof(&key, &self.nonce, &client_nonce)).then_some((t, key))
                    }),
                    _ => None,
                };
                let Some((token, key)) = matched else {
                    ErrorReply { errno: EACCES, message: "authentication failed" }.encode(h.op, h.id, out);
                    return Err(Refusal::AuthFailed);
                };
                accepted.token = Some(token.clone());
                Reply::AuthOk { proof: server_proof(&key, &self.nonce, &client_nonce) }.encode(op::AUTH, h.id, out);
                Ok(Some(accepted))
            }
            ServerState::Done => Err(refuse(h, out, EPROTO, "handshake already done".into())),
        }
    }

    fn hello(&mut self, h: &Header, body: &[u8], out: &mut Vec<u8>) -> Result<Option<Accepted>, Refusal> {
        if h.op != op::HELLO {
            return Err(refuse(h, out, EPROTO, format!("expected HELLO, got op {}", h.op)));
        }
        let (min_version, max_version, caps, max_frame, client_nonce) = match Request::decode(op::HELLO, body) {
            Ok(Request::Hello { min_version, max_version, caps, max_frame, nonce }) => {
                (min_version, max_version, caps, max_frame, nonce)
            }
            Ok(_) => return Err(refuse(h, out, EPROTO, "bad HELLO".into())),
            Err(e) => return Err(refuse(h, out, EPROTO, format!("bad HELLO: {e}"))),
        };
        let version = max_version.min(VERSION_MAX);
        if version < min_version.max(VERSION_MIN) {
            let msg = format!("no common protocol version (server speaks {VERSION_MIN}..{VERSION_MAX})");
            return Err(refuse(h, out, EPROTONOSUPPORT, msg));
        }
        if max_frame < MIN_MAX_FRAME {
            return Err(refuse(h, out, EPROTO, format!("client frame limit {max_frame} below the minimum")));
        }
        let accepted = Accepted {
            version,
            caps: caps & self.offer.caps,
            client_max_frame: max_frame,
            token: None,
            server_nonce: self.nonce,
            client_nonce,
        };
        let welcome = Welcome {
            version,
            caps: accepted.caps,
            max_frame: self.offer.max_frame,
            window_requests: self.offer.window_requests,
            window_bytes: self.offer.window_bytes,
            boot_id: self.offer.boot_id,
            nonce: self.nonce,
            auth_required: !self.offer.tokens.is_empty(),
        };
        Reply::Welcome(welcome).encode(op::HELLO, h.id, out);
        if self.offer.tokens.is_empty() {
            return Ok(Some(accepted));
        }
        self.state = ServerState::AwaitAuth { client_nonce, accepted };
        Ok(None)
    }
}

fn refuse(h: &Header, out: &mut Vec<u8>, errno: u32, msg: String) -> Refusal {
    ErrorReply { errno, message: &msg }.encode(h.op, h.id, out);
    Refusal::Protocol(msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caps;

    fn offers(token: Option<&[u8]>, client_token: Option<&[u8]>) -> (ClientOffer, ServerOffer) {
        (
            ClientOffer {
                min_version: VERSION_MIN,
                max_version: VERSION_MAX,
                caps: caps::ALL,
                max_frame: MIN_MAX_FRAME,
                token: client_token.map(<[u8]>::to_vec),
                binding: None,
            },
            ServerOffer {
                caps: caps::READDIRPLUS,
                max_frame: MIN_MAX_FRAME,
                window_requests: 8,
                window_bytes: 1 << 20,
                boot_id: 42,
                tokens: token.map(<[u8]>::to_vec).into_iter().collect(),
                binding: None,
            },
        )
    }

    /// Runs both machines against each other, frame by frame.
    fn run(c: ClientOffer, s: ServerOffer) -> (Result<Welcome, ClientError>, Result<Accepted, Refusal>) {
        let mut to_server = Vec::new();
        let mut client = ClientHandshake::start(c, [1; 32], &mut to_server);
        let mut server = ServerHandshake::new(s, [2; 32]);
        let mut accepted = None;
        loop {
            let h = Header::decode(to_server[..HEADER_LEN].try_into().unwrap());
            let mut to_client = Vec::new();
            let sr = server.receive(&h, &to_server[HEADER_LEN..], &mut to_client);
            let refused = match sr {
                Ok(Some(a)) => {
                    accepted = Some(a);
                    None
                }
                Ok(None) => None,
                Err(r) => Some(r),
            };
            let h = client.header(&to_client[..HEADER_LEN]).expect("a ferry header");
            to_server.clear();
            let cr = client.receive(&h, &to_client[HEADER_LEN..], &mut to_server);
            match (cr, refused) {
                (Ok(Some(w)), None) => return (Ok(w), Ok(accepted.expect("server done"))),
                (Ok(None), None) => continue,
                (Err(e), Some(r)) => return (Err(e), Err(r)),
                (Err(e), None) => return (Err(e), accepted.ok_or(Refusal::Protocol("client gave up".into()))),
                (Ok(_), Some(r)) => panic!("client went on after a refusal {r:?}"),
            }
        }
    }

    #[test]
    fn agrees_without_a_token() {
        let (c, s) = offers(None, None);
        let (w, a) = run(c, s);
        let (w, a) = (w.unwrap(), a.unwrap());
        assert_eq!(w.caps, caps::READDIRPLUS);
        assert_eq!(a.caps, caps::READDIRPLUS);
        assert_eq!(w.boot_id, 42);
        assert!(!w.auth_required);
    }

    #[test]
    fn agrees_with_the_same_token() {
        let (c, s) = offers(Some(b"secret"), Some(b"secret"));
        let (w, a) = run(c, s);
        assert!(w.unwrap().auth_required);
        assert_eq!(a.unwrap().version, VERSION_MAX);
    }

    #[test]
    fn a_proof_bound_to_another_tls_session_is_refused() {
        // Both ends of one TLS session agree...
        let (mut c, mut s) = offers(Some(b"secret"), Some(b"secret"));
        (c.binding, s.binding) = (Some([3; 32]), Some([3; 32]));
        let (w, a) = run(c, s);
        assert!(w.is_ok() && a.is_ok());
        // ...a relay between two sessions (its own TLS to each end, or
        // none to the server) cannot make the proofs hold.
        for server_binding in [Some([4; 32]), None] {
            let (mut c, mut s) = offers(Some(b"secret"), Some(b"secret"));
            (c.binding, s.binding) = (Some([3; 32]), server_binding);
            let (w, a) = run(c, s);
            assert_eq!(a.unwrap_err(), Refusal::AuthFailed);
            assert!(matches!(w, Err(ClientError::Refused { errno: EACCES, .. })));
        }
    }

    #[test]
    fn any_of_several_tokens_is_accepted_and_named() {
        let (c, mut s) = offers(Some(b"alice-token"), Some(b"bob-token"));
        s.tokens.push(b"bob-token".to_vec());
        let (w, a) = run(c, s);
        assert!(w.is_ok());
        assert_eq!(a.unwrap().token.as_deref(), Some(&b"bob-token"[..]));
    }

    #[test]
    fn a_wrong_token_is_refused_with_eacces() {
        let (c, s) = offers(Some(b"secret"), Some(b"guess"));
        let (w, a) = run(c, s);
        assert_eq!(w.unwrap_err(), ClientError::Refused { errno: EACCES, message: "authentication failed".into() });
        assert_eq!(a.unwrap_err(), Refusal::AuthFailed);
    }

    #[test]
    fn no_token_for_a_server_that_wants_one() {
        let (c, s) = offers(Some(b"secret"), None);
        assert_eq!(run(c, s).0.unwrap_err(), ClientError::NoToken);
    }

    #[test]
    fn versions_that_do_not_meet_are_refused() {
        let (mut c, s) = offers(None, None);
        c.min_version = VERSION_MAX + 1;
        c.max_version = VERSION_MAX + 2;
        let (w, a) = run(c, s);
        assert!(matches!(w.unwrap_err(), ClientError::Refused { errno: EPROTONOSUPPORT, .. }));
        assert!(matches!(a.unwrap_err(), Refusal::Protocol(_)));
    }

    #[test]
    fn a_server_that_cannot_prove_the_token_is_caught() {
        let (c, _) = offers(None, Some(b"secret"));
        let mut out = Vec::new();
        let mut client = ClientHandshake::start(c, [1; 32], &mut out);
        let w = Welcome {
            version: VERSION_MAX,
            caps: 0,
            max_frame: MIN_MAX_FRAME,
            window_requests: 1,
            window_bytes: 1,
            boot_id: 0,
            nonce: [9; 32],
            auth_required: true,
        };
        let mut reply = Vec::new();
        Reply::Welcome(w).encode(op::HELLO, HELLO_ID, &mut reply);
        let h = client.header(&reply[..HEADER_LEN]).unwrap();
        out.clear();
        assert_eq!(client.receive(&h, &reply[HEADER_LEN..], &mut out), Ok(None));
        reply.clear();
        Reply::AuthOk { proof: [0; 32] }.encode(op::AUTH, AUTH_ID, &mut reply);
        let h = client.header(&reply[..HEADER_LEN]).unwrap();
        assert_eq!(client.receive(&h, &reply[HEADER_LEN..], &mut out), Err(ClientError::BadServerProof));
    }

    #[test]
    fn text_answers_are_not_ferry_and_are_quoted() {
        let (c, _) = offers(None, None);
        let client = ClientHandshake::start(c, [1; 32], &mut Vec::new());
        let said = |raw: &[u8]| match client.header(raw) {
            Err(ClientError::NotFerry { said }) => said,
            other => panic!("{other:?}"),
        };
        assert_eq!(said(b"HTTP/1.1 400 Bad"), "HTTP/1.1 400 Bad");
        assert_eq!(said(b"SSH-2.0-OpenSSH\r\n"[..16].as_ref()), "SSH-2.0-OpenSSH");
        assert_eq!(said(&[0xff; 16]), "");
        assert_eq!(said(b"short"), "short");
        assert_eq!(said(b""), "");
    }

    #[test]
    fn a_first_frame_other_than_hello_is_refused() {
        let (_, s) = offers(None, None);
        let mut server = ServerHandshake::new(s, [2; 32]);
        let mut req = Vec::new();
        Request::Ping.encode(5, &mut req);
        let h = Header::decode(req[..HEADER_LEN].try_into().unwrap());
        let mut out = Vec::new();
        assert!(matches!(server.receive(&h, &req[HEADER_LEN..], &mut out), Err(Refusal::Protocol(_))));
        let eh = Header::decode(out[..HEADER_LEN].try_into().unwrap());
        assert!(eh.is_error() && eh.id == 5);
        assert_eq!(ErrorReply::decode(&out[HEADER_LEN..]).unwrap().errno, EPROTO);
    }
}
