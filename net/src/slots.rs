//! A connection's place: one of `max_connections`, and one of its client
//! address's share of them (IPv4 by address, IPv6 by its /64), so that one
//! address cannot take every connection.

use std::sync::Arc;
use tokio::sync::Semaphore;

/// Every place of a server: the global cap and the shares per address.
#[derive(Debug, Clone)]
pub(crate) struct Slots {
    global: Arc<Semaphore>,
    shares: AddressShares,
}

impl Slots {
    pub(crate) fn new(max_connections: usize, per_address: usize) -> Slots {
        Slots {
            global: Arc::new(Semaphore::new(max_connections)),
            shares: AddressShares::new(per_address),
        }
    }

    /// A place for a connection from `ip`, unless the server is full or
    /// the address holds its whole share.
    pub(crate) fn take(&self, ip: std::net::IpAddr) -> Option<Slot> {
        let global = self.global.clone().try_acquire_owned().ok()?;
        let share = self.shares.take(ip)?;
        Some(Slot {
            _global: global,
            _share: share,
        })
    }
}

/// The default share of one address: a quarter of `max_connections` (at
/// least one), so that it takes four addresses to fill the server.
pub fn default_share(max_connections: usize) -> usize {
    (max_connections / 4).max(1)
}

/// A connection's place: one of `max_connections`, and one of its
/// address's share.
pub(crate) struct Slot {
    _global: tokio::sync::OwnedSemaphorePermit,
    _share: Share,
}

/// The connections held per client address.
#[derive(Debug, Clone)]
struct AddressShares {
    /// The connections one address may hold.
    share: usize,
    held: Arc<parking_lot::Mutex<std::collections::HashMap<AddressKey, usize>>>,
}

/// One connection of an address; given back when dropped.
struct Share {
    shares: AddressShares,
    key: AddressKey,
}

/// An IPv4 address, or the /64 an IPv6 address is in (one host is
/// usually given a whole /64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum AddressKey {
    V4(std::net::Ipv4Addr),
    V6(u64),
}

impl AddressKey {
    fn of(ip: std::net::IpAddr) -> AddressKey {
        match ip {
            std::net::IpAddr::V4(v4) => AddressKey::V4(v4),
            std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => AddressKey::V4(v4),
                None => AddressKey::V6((v6.to_bits() >> 64) as u64),
            },
        }
    }
}

impl AddressShares {
    fn new(share: usize) -> AddressShares {
        AddressShares {
            share: share.max(1),
            held: Arc::default(),
        }
    }

    /// One more connection for `ip`, unless it holds its whole share.
    fn take(&self, ip: std::net::IpAddr) -> Option<Share> {
        let key = AddressKey::of(ip);
        let mut held = self.held.lock();
        let n = held.entry(key).or_insert(0);
        if *n >= self.share {
            return None;
        }
        *n += 1;
        Some(Share {
            shares: self.clone(),
            key,
        })
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut held = self.shares.held.lock();
        if let Some(n) = held.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_takes_its_share_and_no_more() {
        let shares = AddressShares::new(2);
        let a: std::net::IpAddr = "10.0.0.1".parse().expect("ip");
        let b: std::net::IpAddr = "10.0.0.2".parse().expect("ip");
        let one = shares.take(a).expect("first");
        let two = shares.take(a).expect("second");
        assert!(shares.take(a).is_none(), "over its share");
        assert!(shares.take(b).is_some(), "another address has its own");
        drop(one);
        assert!(shares.take(a).is_some(), "a share comes back");
        drop(two);
        // IPv6 by its /64; an IPv4-mapped address is its IPv4 address.
        let v6 = |s: &str| s.parse::<std::net::IpAddr>().expect("ip");
        assert_eq!(
            AddressKey::of(v6("2001:db8:1:2::1")),
            AddressKey::of(v6("2001:db8:1:2:ffff::9"))
        );
        assert_ne!(
            AddressKey::of(v6("2001:db8:1:2::1")),
            AddressKey::of(v6("2001:db8:1:3::1"))
        );
        assert_eq!(AddressKey::of(v6("::ffff:10.0.0.1")), AddressKey::of(a));
        assert!(shares.held.lock().len() <= 1);
    }
}
