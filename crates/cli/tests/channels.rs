//! Data channels (the split path): bulk reads and writes on further
//! connections joined to the session, with every pairing of old and new
//! peers, the fallback when a channel cannot be set up or fails mid-read,
//! and the order between writes sent behind on the main connection and
//! reads on a channel. All on TCP: the server's host is the client's, and
//! the same-host path (same_host.rs) would take the data off TCP.

mod common;

use std::io::{Read, Write};
use std::process::Command;

use common::proxy::Proxy;
use common::{random_bytes, Server, FERRY};
use ferry_client::{Client, OpenOptions, Options};

const LEN: usize = 24 << 20;

/// Reads `/big` sequentially (read-ahead) and in one large positional
/// read, and writes `/out` with one large positional write: all must match.
fn round_trip(c: &Client, srv: &Server, data: &[u8]) {
    common::read_both_ways(c, "/big", data).close().unwrap();
    let out = c.open("/out", OpenOptions::new().write(true).create(true).truncate(true)).unwrap();
    out.write_at(data, 0).unwrap();
    out.close().unwrap();
    assert!(std::fs::read(srv.export.path().join("out")).unwrap() == data, "written file differs");
}

fn setup(extra: &[&str]) -> (Server, Vec<u8>) {
    let srv = Server::start(extra);
    let data = random_bytes(LEN, 9);
    std::fs::write(srv.export.path().join("big"), &data).unwrap();
    (srv, data)
}

#[test]
fn a_new_client_and_server_move_bulk_data_on_a_channel() {
    let (srv, data) = setup(&[]);
    let c = srv.tcp_client();
    assert_eq!(c.data_channels(), 0, "made on first use only");
    round_trip(&c, &srv, &data);
    assert_eq!(c.data_channels(), 1);
    // Small files and metadata need none.
    let small = srv.tcp_client();
    assert_eq!(small.read("/big").unwrap().len(), LEN);
    small.metadata("/big").unwrap();
}

/// Small writes set up no channel, though a file's first transfer looks
/// for the same-host path (not offered here: as by a server on another
/// host). (Reads may: their read-ahead goes on a channel.)
#[test]
fn small_writes_set_up_no_channel() {
    let (srv, _) = setup(&["--disable-caps", "same-host"]);
    let c = srv.client();
    let mut f = c.open("/big", OpenOptions::new().write(true)).unwrap();
    f.write_at(&[1u8; 4096], 0).unwrap();
    f.write_all(&[2u8; 4096]).unwrap();
    f.flush_writes().unwrap();
    assert_eq!(c.data_channels(), 0);
    f.write_at(&vec![3u8; 1 << 20], 0).unwrap();
    assert_eq!(c.data_channels(), 1, "a large write sets one up");
}

/// Everything right on one connection, and no channel opened.
fn on_one_connection(server_args: &[&str], channels: u32) {
    let (srv, data) = setup(server_args);
    let c = Client::connect(&srv.addr(), &Options { data_channels: channels, ..srv.tcp_options() }).unwrap();
    round_trip(&c, &srv, &data);
    assert_eq!(c.data_channels(), 0);
}

#[test]
fn a_server_without_the_capability_gets_everything_on_one_connection() {
    on_one_connection(&["--disable-caps", "data-channels"], 1);
}

#[test]
fn a_server_without_sessions_gets_no_channels() {
    on_one_connection(&["--disable-caps", "sessions"], 1);
}

#[test]
fn a_client_that_asks_for_none_opens_none() {
    on_one_connection(&[], 0);
}

/// A channel the server refuses (over its connection limit): the transfer
/// goes on the main connection, said once on stderr, no error.
#[test]
fn a_channel_that_cannot_be_set_up_falls_back_and_says_so_once() {
    let (srv, data) = setup(&["--max-connections", "1"]);
    let dst = common::TempDir::new("channels-dst");
    let copy = dst.path().join("copy");
    let out = srv.ferry_env(&["cp", &srv.url("/big"), copy.to_str().unwrap()], &[("FERRY_SAME_HOST", "0")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "ferry cp failed: {err}");
    assert!(std::fs::read(&copy).unwrap() == data, "the copy differs");
    assert_eq!(err.matches("bulk data goes on the main connection").count(), 1, "stderr: {err}");
}

/// The data channel cut after 4 MiB of a 24 MiB read: the read finishes
/// on the main connection with the right bytes, and later ones too.
#[test]
fn a_channel_lost_mid_read_falls_back_to_the_main_connection() {
    let (srv, data) = setup(&[]);
    // Connection 0 is the main one, 1 the data channel.
    let proxy = Proxy::cutting_only(srv.addr(), Some(1), usize::MAX, 4 << 20);
    let c = Client::connect(&format!("127.0.0.1:{}", proxy.port), &srv.tcp_options()).unwrap();
    let mut f = c.open("/big", OpenOptions::new().read(true)).unwrap();
    let mut got = Vec::new();
    f.read_to_end(&mut got).unwrap();
    assert!(got == data, "read differs after the channel was cut");
    assert_eq!(c.data_channels(), 0, "the cut channel is dropped");
    let mut whole = vec![0u8; LEN];
    assert_eq!(f.read_at(&mut whole, 0).unwrap(), LEN);
    assert!(whole == data);
}

/// Writes sent behind on the main connection, then at once a large read of
/// the same bytes through another handle: the read must not overtake them.
#[test]
fn a_read_on_a_channel_sees_the_writes_sent_behind_before_it() {
    let (srv, _) = setup(&[]);
    let c = srv.tcp_client();
    // Open the channel first.
    let mut warm = vec![0u8; 1 << 20];
    c.open("/big", OpenOptions::new().read(true)).unwrap().read_at(&mut warm, 0).unwrap();
    assert_eq!(c.data_channels(), 1);
    let r = c.open("/big", OpenOptions::new().read(true)).unwrap();
    for round in 0..20u64 {
        let new = random_bytes(8 << 20, 100 + round);
        let mut w = c.open("/big", OpenOptions::new().write(true)).unwrap();
        w.write_all(&new).unwrap();
        // The last part written is the last the server gets to.
        let mut got = vec![0u8; 1 << 20];
        let at = (new.len() - got.len()) as u64;
        assert_eq!(r.read_at(&mut got, at).unwrap(), got.len());
        assert!(got == new[at as usize..], "round {round}: the read overtook the writes");
        w.close().unwrap();
    }
}

/// `FERRY_DATA_CHANNELS=0`: the CLI tries no channel (so a server that
/// would refuse one draws no fallback notice).
#[test]
fn the_environment_turns_channels_off() {
    let (srv, data) = setup(&["--max-connections", "1"]);
    let dst = common::TempDir::new("channels-env");
    let copy = dst.path().join("copy");
    let out = Command::new(FERRY)
        .args(["cp", &srv.url("/big"), copy.to_str().unwrap()])
        .env("FERRY_TOKEN_FILE", &srv.token_file)
        .env("FERRY_DATA_CHANNELS", "0")
        .env("FERRY_SAME_HOST", "0")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(std::fs::read(&copy).unwrap() == data);
    assert!(!err.contains("data channel"), "stderr: {err}");
}
