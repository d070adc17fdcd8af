//! What an election the cluster already runs shows: who holds it, and the
//! token of the holder's term. etcd (`fencegate-etcd`) and ZooKeeper
//! (`fencegate-zookeeper`) read it; the proxy and the CLI compare it.

/// What an election shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shows {
    /// Held through the key (or znode) `key`, whose value names the
    /// `holder`, in the term that began at `revision`: the holder's token.
    Held {
        key: String,
        holder: String,
        revision: u64,
    },
    /// Nobody holds it.
    Vacant,
}

impl Shows {
    /// The token of the term `identity` holds, if it holds: the holder's
    /// value names it, or `identity` is the holder's key itself (etcd's
    /// lock recipe writes no value; `etcdctl lock` tells its command the
    /// key, as `ETCD_LOCK_KEY`).
    pub fn held_by(&self, identity: &str) -> Option<u64> {
        match self {
            Shows::Held {
                key,
                holder,
                revision,
            } if holder == identity || key == identity => Some(*revision),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_is_named_by_its_value_or_its_key() {
        let shows = Shows::Held {
            key: "/locks/nightly/694d8a".into(),
            holder: String::new(),
            revision: 7,
        };
        assert_eq!(shows.held_by("/locks/nightly/694d8a"), Some(7));
        assert_eq!(shows.held_by("/locks/nightly/694d8b"), None);
        let named = Shows::Held {
            key: "/service/main/leader".into(),
            holder: "node1".into(),
            revision: 9,
        };
        assert_eq!(named.held_by("node1"), Some(9));
        assert_eq!(named.held_by("node2"), None);
        assert_eq!(Shows::Vacant.held_by(""), None);
    }
}
