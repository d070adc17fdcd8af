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
