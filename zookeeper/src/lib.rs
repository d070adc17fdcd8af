//! Reading an election the cluster runs in ZooKeeper: who holds it, and the
//! holder's fencing token, a zxid (ZooKeeper's transaction id: global,
//! only growing, like an etcd revision).
//!
//! - **A lock** (the lock recipes of Curator and kazoo: Kafka, HBase, Solr,
//!   Hadoop): each contender creates an ephemeral sequential znode under
//!   the lock's path; the lowest sequence number holds. Its `czxid` (the
//!   transaction that created it) is the token, and its data names the
//!   holder (kazoo's `Lock(path, identifier)` writes the identifier there).
//!   A contender writes only its own znode, and a new one is created after
//!   the old holder's is deleted or its session expired, so each new holder
//!   has a higher token.
//! - **A leader znode** (one ephemeral znode whose data names the leader,
//!   as Kafka's `/controller`): the token is its `mzxid`, the transaction
//!   of its last write, so a holder that writes its name over another's
//!   znode begins a new term with a higher token (see `fencegate-etcd`'s
//!   leader key, where Patroni does this).
//!
//! **Reads are made current.** A ZooKeeper server answers reads from its
//! own copy, which may lag the leader; every read here follows a `sync` of
//! the path, so it sees every write committed before it began (ZooKeeper's
//! documented way to a linearizable read).
//!
//! **The session.** One client session, opened at the first read and
//! dropped at any error, so that the next read opens a new one: an expired
//! session is never read through. Every read is bounded by the request
//! timeout.
//!
//! The client is `zookeeper-client` (kezhuw/zookeeper-client-rust): async,
//! on tokio, released steadily (0.1 to 0.11 since 2022), tested in its CI
//! against real ZooKeeper servers (3.5 to 3.9), with `sync` and the
//! persistent watches of 3.6. The alternatives were `zookeeper-async` (an
//! async port of the older `zookeeper` crate, fewer releases, no `sync`
//! helper in its API) and `zookeeper` (blocking threads).

use fencegate_core::election::Shows;
use parking_lot::Mutex;
use std::time::Duration;
use zookeeper_client as zk;

/// Where a ZooKeeper election keeps its holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seat {
    /// A lock's path: the child with the lowest sequence number holds.
    Lock(String),
    /// A leader znode: whoever its data names holds.
    Node(String),
}

impl std::fmt::Display for Seat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Seat::Lock(p) => write!(f, "the ZooKeeper lock {p}"),
            Seat::Node(p) => write!(f, "the ZooKeeper leader znode {p}"),
        }
    }
}

/// A ZooKeeper ensemble, and the session its reads go through.
pub struct ZooKeeper {
    /// `host:port` of each server.
    hosts: String,
    request_timeout: Duration,
    session: Mutex<Option<zk::Client>>,
}

impl std::fmt::Debug for ZooKeeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZooKeeper")
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

/// Shortest session ZooKeeper grants by default (2 × its tickTime of 2 s
/// is 4 s); the session only carries reads, so its length matters little.
const SESSION_TIMEOUT: Duration = Duration::from_secs(10);

impl ZooKeeper {
    /// The servers at `hosts` (`host:port` each); every read within
    /// `request_timeout`.
    pub fn new(hosts: &[String], request_timeout: Duration) -> ZooKeeper {
        ZooKeeper {
            hosts: hosts.join(","),
            request_timeout,
            session: Mutex::new(None),
        }
    }

    /// The problems with `hosts` as a list of servers, each prefixed
    /// `table.endpoints`.
    pub fn problems(hosts: &[String], table: &str) -> Vec<String> {
        hosts
            .iter()
            .filter(|h| {
                h.contains("://")
                    || h.rsplit_once(':')
                        .is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err())
            })
            .map(|h| format!("{table}.endpoints: {h:?} is not host:port (ZooKeeper servers are named without a scheme)"))
            .collect()
    }

    async fn client(&self) -> Result<zk::Client, String> {
        if let Some(c) = self.session.lock().clone() {
            return Ok(c);
        }
        let client = zk::Client::connector()
            .with_session_timeout(SESSION_TIMEOUT)
            .with_connection_timeout(self.request_timeout)
            .connect(&self.hosts)
            .await
            .map_err(|e| {
                format!(
                    "cannot open a session with ZooKeeper at {}: {e}",
                    self.hosts
                )
            })?;
        *self.session.lock() = Some(client.clone());
        Ok(client)
    }

    /// Who holds the election at `seat` now, read after a `sync`.
    pub async fn shows(&self, seat: &Seat) -> Result<Shows, String> {
        let read = async {
            let client = self.client().await?;
            read(&client, seat).await
        };
        let answer = match tokio::time::timeout(self.request_timeout, read).await {
            Ok(answer) => answer,
            Err(_) => Err(format!(
                "ZooKeeper at {} did not answer within {:?}",
                self.hosts, self.request_timeout
            )),
        };
        if answer.is_err() {
            // The next read opens a new session: this one may be expired,
            // or stuck on a server that went away.
            *self.session.lock() = None;
        }
        answer
    }
}

impl ZooKeeper {
    /// Waits until `seat` changes (a one-shot watch on the lock's children
    /// or the leader znode, set now), or `patience` passes: a change just
    /// before the watch was set is seen by the caller's next read, at most
    /// `patience` later.
    pub async fn changed(&self, seat: &Seat, patience: Duration) -> Result<(), String> {
        let wait = async {
            let client = self.client().await?;
            let watched = match seat {
                Seat::Lock(dir) => match client.list_and_watch_children(dir).await {
                    Err(zk::Error::NoNode) => {
                        client.check_and_watch_stat(dir).await.map(|(_, w)| w)
                    }
                    other => other.map(|(_, w)| w),
                },
                Seat::Node(path) => client.check_and_watch_stat(path).await.map(|(_, w)| w),
            };
            let watcher = watched.map_err(|e| format!("cannot watch {seat}: {e}"))?;
            watcher.changed().await;
            Ok(())
        };
        match tokio::time::timeout(patience, wait).await {
            Ok(Err(e)) => {
                *self.session.lock() = None;
                Err(e)
            }
            Ok(Ok(())) | Err(_) => Ok(()),
        }
    }
}

/// `seat` as `client` sees it after a `sync`.
async fn read(client: &zk::Client, seat: &Seat) -> Result<Shows, String> {
    let failed = |e: zk::Error| format!("ZooKeeper refused the read of {seat}: {e}");
    let path = match seat {
        Seat::Lock(p) | Seat::Node(p) => p.as_str(),
    };
    match client.sync(path).await {
        Ok(()) | Err(zk::Error::NoNode) => {}
        Err(e) => return Err(failed(e)),
    }
    match seat {
        Seat::Node(path) => match client.get_data(path).await {
            Ok((data, stat)) => Ok(held(path.clone(), &data, stat.mzxid)),
            Err(zk::Error::NoNode) => Ok(Shows::Vacant),
            Err(e) => Err(failed(e)),
        },
        Seat::Lock(dir) => {
            // The holder may go between the listing and its read: list again.
            for _ in 0..3 {
                let children = match client.list_children(dir).await {
                    Ok(c) => c,
                    Err(zk::Error::NoNode) => return Ok(Shows::Vacant),
                    Err(e) => return Err(failed(e)),
                };
                let Some(lowest) = children
                    .iter()
                    .filter_map(|c| sequence_of(c).map(|n| (n, c)))
                    .min()
                    .map(|(_, c)| c)
                else {
                    return Ok(Shows::Vacant);
                };
                let key = format!("{}/{lowest}", dir.trim_end_matches('/'));
                match client.get_data(&key).await {
                    Ok((data, stat)) => return Ok(held(key, &data, stat.czxid)),
                    Err(zk::Error::NoNode) => continue,
                    Err(e) => return Err(failed(e)),
                }
            }
            Err(format!(
                "{seat} changed holders during three reads in a row; retry"
            ))
        }
    }
}

fn held(key: String, data: &[u8], zxid: i64) -> Shows {
    Shows::Held {
        key,
        holder: String::from_utf8_lossy(data).into_owned(),
        revision: u64::try_from(zxid).unwrap_or(0),
    }
}

/// The sequence number ZooKeeper appends to a sequential znode's name: its
/// last ten digits (Curator's `_c_…-lock-0000000007`, kazoo's
/// `…__lock__0000000007`).
fn sequence_of(name: &str) -> Option<u64> {
    let digits = name.len().checked_sub(10).and_then(|i| name.get(i..))?;
    digits
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| digits.parse().ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sequence_is_the_last_ten_digits() {
        assert_eq!(sequence_of("f43942__lock__0000000012"), Some(12));
        assert_eq!(sequence_of("_c_6f1e-lock-0000000003"), Some(3));
        assert_eq!(sequence_of("lock"), None);
        assert_eq!(sequence_of("x__lock__00000000a1"), None);
    }

    #[test]
    fn servers_are_host_and_port() {
        let bad = ZooKeeper::problems(
            &[
                "zk1:2181".into(),
                "http://zk2:2181".into(),
                "zk3".into(),
                ":2181".into(),
            ],
            "elections[0]",
        );
        assert_eq!(bad.len(), 3, "{bad:?}");
        assert!(bad[0].contains("http://zk2:2181"), "{bad:?}");
    }
}
