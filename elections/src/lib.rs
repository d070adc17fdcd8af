//! An election the cluster already runs, wherever it keeps its holder:
//! in etcd (`fencegate_etcd::election`: a leader key, an election or lock
//! prefix) or in ZooKeeper (`fencegate_zookeeper`: a lock, a leader
//! znode). One type to read it and to wait for its next change, shared by
//! the proxy (which checks writes with it and watches it) and the CLI
//! (`fencegate election token` / `run`, on the holder's side).

pub use fencegate_core::election::Shows;
use fencegate_etcd::{Connection, Etcd};
use fencegate_zookeeper::ZooKeeper;
use std::time::Duration;

/// Where an election keeps its holder, and in which store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seat {
    Etcd(fencegate_etcd::election::Seat),
    ZooKeeper(fencegate_zookeeper::Seat),
}

impl std::fmt::Display for Seat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Seat::Etcd(s) => s.fmt(f),
            Seat::ZooKeeper(s) => s.fmt(f),
        }
    }
}

/// The four ways to name a seat, as the proxy's `[[elections]]` table
/// and the CLI's flags spell them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Named<'a> {
    pub etcd_key: Option<&'a str>,
    pub etcd_prefix: Option<&'a str>,
    pub zookeeper_lock: Option<&'a str>,
    pub zookeeper_node: Option<&'a str>,
}

impl Seat {
    /// The seat `named`, if exactly one is.
    pub fn one_of(named: Named<'_>) -> Option<Seat> {
        use fencegate_etcd::election::Seat as E;
        use fencegate_zookeeper::Seat as Z;
        let seats: Vec<Seat> = [
            named.etcd_key.map(|k| Seat::Etcd(E::Key(k.to_owned()))),
            named
                .etcd_prefix
                .map(|p| Seat::Etcd(E::Prefix(p.to_owned()))),
            named
                .zookeeper_lock
                .map(|p| Seat::ZooKeeper(Z::Lock(p.to_owned()))),
            named
                .zookeeper_node
                .map(|p| Seat::ZooKeeper(Z::Node(p.to_owned()))),
        ]
        .into_iter()
        .flatten()
        .collect();
        match seats.as_slice() {
            [one] => Some(one.clone()),
            _ => None,
        }
    }

    /// The problems with `servers` as this seat's store's servers (etcd
    /// client URLs with their TLS and auth; ZooKeeper `host:port`, read
    /// without either), each prefixed `table`.
    pub fn problems(&self, servers: &Connection, table: &str) -> Vec<String> {
        match self {
            Seat::Etcd(_) => servers.problems(table),
            Seat::ZooKeeper(_) => {
                let mut p = ZooKeeper::problems(&servers.endpoints, table);
                let unsupported = [
                    ("username", servers.credentials.is_some()),
                    ("ca_file", servers.ca_file.is_some()),
                    ("cert_file", servers.cert_file.is_some()),
                    ("key_file", servers.key_file.is_some()),
                ];
                for (option, set) in unsupported {
                    if set {
                        p.push(format!(
                            "{table}.{option}: ZooKeeper elections are read without authentication or TLS (not built yet); remove it"
                        ));
                    }
                }
                p
            }
        }
    }
}

/// The store an election is read from.
#[derive(Debug)]
enum Store {
    Etcd(Etcd),
    ZooKeeper(ZooKeeper),
}

/// One election: its seat, and a client of its store.
#[derive(Debug)]
pub struct Election {
    seat: Seat,
    store: Store,
}

impl Election {
    /// The election at `seat`, read through `servers` (whose problems were
    /// checked: [`Seat::problems`]).
    pub fn new(seat: Seat, servers: &Connection) -> anyhow::Result<Election> {
        let store = match &seat {
            Seat::Etcd(_) => Store::Etcd(Etcd::new(servers)?),
            Seat::ZooKeeper(_) => {
                Store::ZooKeeper(ZooKeeper::new(&servers.endpoints, servers.request_timeout))
            }
        };
        Ok(Election { seat, store })
    }

    /// Where it keeps its holder, for messages.
    pub fn seat(&self) -> &Seat {
        &self.seat
    }

    /// Who holds it now, read linearizably.
    pub async fn shows(&self) -> Result<Shows, String> {
        self.read().await.map(|(shows, _)| shows)
    }

    /// [`Election::shows`], and where to watch from (etcd: the revision
    /// the read saw; ZooKeeper: 0, its watches start when set).
    pub async fn read(&self) -> Result<(Shows, i64), String> {
        match (&self.store, &self.seat) {
            (Store::Etcd(etcd), Seat::Etcd(seat)) => {
                fencegate_etcd::election::read(etcd, seat).await
            }
            (Store::ZooKeeper(zk), Seat::ZooKeeper(seat)) => zk.shows(seat).await.map(|s| (s, 0)),
            _ => Err(format!("{} is not in this election's store", self.seat)),
        }
    }

    /// Waits until the election may have changed since `seen` (from
    /// [`Election::read`]), by a watch, or until `patience` passes.
    pub async fn changed(&self, seen: i64, patience: Duration) -> Result<(), String> {
        match (&self.store, &self.seat) {
            (Store::Etcd(etcd), Seat::Etcd(seat)) => {
                fencegate_etcd::election::changed(etcd, seat, seen, patience).await
            }
            (Store::ZooKeeper(zk), Seat::ZooKeeper(seat)) => zk.changed(seat, patience).await,
            _ => Err(format!("{} is not in this election's store", self.seat)),
        }
    }
}
