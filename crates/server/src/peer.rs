//! Who a connection comes from, as the server's fair shares count it: one
//! IPv4 address, one IPv6 /64 (what one host or site usually gets, so a
//! peer cannot multiply itself by picking addresses from its own prefix),
//! or one local user on the Unix socket.

use ferry_sock::Socket;
use std::net::{IpAddr, SocketAddr};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Peer {
    Ip(IpAddr),
    /// A local process, by its user id (`None`: the kernel did not say).
    Local(Option<u32>),
}

impl Peer {
    pub fn of(sock: &Socket) -> Peer {
        if sock.is_unix() {
            return Peer::Local(sock.peer_cred().map(|(_, uid)| uid));
        }
        // `peer_name` is the address as text; a socket gone already has
        // none, and all such peers share one key (they are about to end).
        match sock.peer_name().parse::<SocketAddr>() {
            Ok(a) => Peer::from_ip(a.ip()),
            Err(_) => Peer::Local(None),
        }
    }

    fn from_ip(ip: IpAddr) -> Peer {
        match ip {
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Peer::Ip(IpAddr::V4(v4)),
                None => Peer::Ip(IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into())),
            },
            v4 => Peer::Ip(v4),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_ipv6_prefix_is_one_peer() {
        let a = Peer::from_ip("2001:db8::1".parse().unwrap());
        let b = Peer::from_ip("2001:db8::ffff:1234".parse().unwrap());
        let c = Peer::from_ip("2001:db8:0:1::1".parse().unwrap());
        assert_eq!(a, b);
        assert_ne!(a, c);
        let mapped = Peer::from_ip("::ffff:127.0.0.2".parse().unwrap());
        assert_eq!(mapped, Peer::from_ip("127.0.0.2".parse().unwrap()));
        assert_ne!(mapped, Peer::from_ip("127.0.0.3".parse().unwrap()));
    }
}
