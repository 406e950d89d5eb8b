//! Who is at the other end of a TCP connection, and a cap on connections
//! shared out among them, so that no one of them holds them all: the
//! agent's metrics server and `runlock ui` serve any local user (and the
//! metrics, other hosts), and a cap alone lets one of them take every
//! connection. A peer on this host is its user, found in `/proc/net/tcp`
//! (and `tcp6`), which lists every socket of this network namespace with
//! its owner; any other peer is its address. Linux only, as runlock is.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};

/// Who a connection comes from, as the cap counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Peer {
    /// A user of this host, by uid.
    User(u32),
    /// Anything else (another host, or a local socket the kernel no longer
    /// lists), by address.
    Address(IpAddr),
}

impl Peer {
    /// The peer of a connection accepted on `local` from `remote`.
    pub fn of(local: SocketAddr, remote: SocketAddr) -> Peer {
        let ip = remote.ip().to_canonical();
        let user = ip
            .is_loopback()
            .then(|| loopback_owner(local, remote))
            .flatten();
        user.map_or(Peer::Address(ip), Peer::User)
    }
}

/// The uid owning the local socket `remote` that is connected to `local`.
fn loopback_owner(local: SocketAddr, remote: SocketAddr) -> Option<u32> {
    // The kernel writes a table a page at a time, resuming by position, so
    // a socket opened or closed meanwhile can make it skip one: once more.
    (0..2).find_map(|_| {
        ["/proc/net/tcp", "/proc/net/tcp6"].iter().find_map(|path| {
            let table = std::fs::read_to_string(path).ok()?;
            owner_in(&table, local, remote)
        })
    })
}

/// TIME_WAIT: a socket already closed, listed as root's; a new connection may
/// reuse its ports.
const TIME_WAIT: &str = "06";

/// In a `/proc/net/tcp` table, the uid of the socket whose own address is
/// `remote` and whose peer is `local`: the other end of our connection.
fn owner_in(table: &str, local: SocketAddr, remote: SocketAddr) -> Option<u32> {
    let same = |a: SocketAddr, b: SocketAddr| {
        a.port() == b.port() && a.ip().to_canonical() == b.ip().to_canonical()
    };
    table.lines().skip(1).find_map(|line| {
        // sl local_address rem_address st tx:rx tr:when retrnsmt uid ...
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (own, peer, state, uid) = (
            fields.get(1)?,
            fields.get(2)?,
            fields.get(3)?,
            fields.get(7)?,
        );
        let matches = *state != TIME_WAIT
            && same(parse_address(own)?, remote)
            && same(parse_address(peer)?, local);
        matches.then(|| uid.parse().ok()).flatten()
    })
}

/// `0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6): the address
/// as the kernel prints it, in 32-bit words of the host's byte order.
fn parse_address(text: &str) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let hex = ip.get(8 * i..8 * i + 8)?;
        Some(u32::from_str_radix(hex, 16).ok()?.to_ne_bytes())
    };
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[4 * i..4 * i + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// At most `total` connections at once, and at most `per_peer` of them
/// from any one [`Peer`].
#[derive(Debug)]
pub struct PeerSlots {
    total: usize,
    per_peer: usize,
    held: Mutex<HashMap<Peer, usize>>,
}

/// One connection's place among [`PeerSlots`], given back when dropped.
#[derive(Debug)]
pub struct PeerSlot {
    slots: Arc<PeerSlots>,
    peer: Peer,
}

impl PeerSlots {
    /// A cap of `total` connections, `per_peer` of them from one peer.
    pub fn new(total: usize, per_peer: usize) -> Arc<PeerSlots> {
        Arc::new(PeerSlots {
            total,
            per_peer,
            held: Mutex::new(HashMap::new()),
        })
    }

    /// A place for a connection from `peer`, unless the cap or the peer's
    /// share of it is reached.
    pub fn take(self: &Arc<Self>, peer: Peer) -> Option<PeerSlot> {
        let mut held = self
            .held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let all: usize = held.values().sum();
        let theirs = held.get(&peer).copied().unwrap_or(0);
        if all >= self.total || theirs >= self.per_peer {
            return None;
        }
        *held.entry(peer).or_insert(0) += 1;
        Some(PeerSlot {
            slots: self.clone(),
            peer,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let held = self.slots.held.lock();
        let mut held = held.unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(count) = held.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_s_addresses_read_back_as_written() {
        let v4 = format!("{:08X}:1F90", u32::from_ne_bytes([127, 0, 0, 1]));
        assert_eq!(parse_address(&v4), "127.0.0.1:8080".parse().ok());
        let words: String = Ipv6Addr::LOCALHOST
            .octets()
            .chunks(4)
            .map(|w| format!("{:08X}", u32::from_ne_bytes([w[0], w[1], w[2], w[3]])))
            .collect();
        assert_eq!(
            parse_address(&format!("{words}:0050")),
            "[::1]:80".parse().ok()
        );
        assert_eq!(parse_address("0100007F"), None);
        assert_eq!(parse_address("7F:0050"), None);
    }

    #[test]
    fn the_owner_is_the_uid_of_the_other_end_of_the_connection() {
        let hex = |a: &str| {
            let a: SocketAddr = a.parse().expect("an address");
            let IpAddr::V4(ip) = a.ip() else { panic!() };
            format!("{:08X}:{:04X}", u32::from_ne_bytes(ip.octets()), a.port())
        };
        let line = |own: &str, peer: &str, state: &str, uid: u32| {
            format!(
                "0: {} {} {state} 0:0 00:0 0 {uid} 0 1234",
                hex(own),
                hex(peer)
            )
        };
        let table = [
            "sl local rem st queue timer retrnsmt uid timeout inode".to_string(),
            line("127.0.0.1:8080", "0.0.0.0:0", "0A", 1000),
            line("127.0.0.1:8080", "127.0.0.1:5000", "01", 1000),
            line("127.0.0.1:5000", "127.0.0.1:8080", "06", 0),
            line("127.0.0.1:5000", "127.0.0.1:8080", "01", 65534),
        ]
        .join("\n");
        let local = "127.0.0.1:8080".parse().expect("an address");
        let remote = "127.0.0.1:5000".parse().expect("an address");
        assert_eq!(owner_in(&table, local, remote), Some(65534));
        let unknown = "127.0.0.1:5001".parse().expect("an address");
        assert_eq!(owner_in(&table, local, unknown), None);
    }

    #[test]
    fn a_peer_of_this_host_is_its_user() -> std::io::Result<()> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let _client = std::net::TcpStream::connect(listener.local_addr()?)?;
        let (stream, remote) = listener.accept()?;
        // SAFETY: takes no argument and touches no memory.
        let me = unsafe { libc::geteuid() };
        assert_eq!(Peer::of(stream.local_addr()?, remote), Peer::User(me));
        Ok(())
    }

    #[test]
    fn no_peer_takes_more_than_its_share_nor_all_more_than_the_cap() {
        let slots = PeerSlots::new(3, 2);
        let (a, b, c) = (Peer::User(1), Peer::User(2), Peer::User(3));
        let first = slots.take(a).expect("a's first");
        let _second = slots.take(a).expect("a's second");
        assert!(slots.take(a).is_none(), "a's third is over its share");
        let _b = slots.take(b).expect("b's first");
        assert!(slots.take(c).is_none(), "the cap is reached");
        drop(first);
        assert!(slots.take(c).is_some(), "a slot given back is free again");
    }
}
