//! Which election a command follows (etcd or ZooKeeper), who this node is
//! in it, and what it sends for it: shared by `election token` and
//! `election run`.

use crate::failure::Failure;
use clap::Args;
use fencegate_core::{LockName, TokenKeys};
use fencegate_elections::{Election, Named, Seat, Shows};
use std::path::PathBuf;
use std::time::Duration;

/// Which election, who this process is in it, and how to read it.
#[derive(Debug, Args)]
pub struct ElectionArgs {
    /// The election's servers, comma separated: etcd client URLs, or
    /// ZooKeeper host:port.
    #[arg(
        long,
        env = "FENCEGATE_ELECTION_ENDPOINTS",
        value_delimiter = ',',
        required = true
    )]
    pub endpoints: Vec<String>,
    #[command(flatten)]
    pub seat: SeatArgs,
    /// Who this process is, as the holder's key (or znode) names it
    /// (Patroni: the member's `name`; kazoo: the lock's identifier).
    #[arg(long)]
    pub identity: String,
    /// etcd user, if etcd auth is on (not for ZooKeeper).
    #[arg(long, env = "FENCEGATE_ELECTION_USERNAME")]
    pub username: Option<String>,
    /// Its password.
    #[arg(long, env = "FENCEGATE_ELECTION_PASSWORD", hide_env_values = true)]
    pub password: Option<String>,
    /// PEM CA certificate(s) for https:// endpoints.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// Longest one read of the election may take.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// A file holding one of the election's `signing_keys` in the proxy's
    /// `[[elections]]` table (its text, at least 16 bytes; a final newline
    /// is ignored): tokens are then signed with it, and credentials bound
    /// to the token can be made. Keep it readable by the node's service
    /// user only.
    #[arg(long, env = "FENCEGATE_ELECTION_SIGNING_KEY_FILE")]
    pub signing_key_file: Option<PathBuf>,
}

/// Where the election keeps its holder: exactly one of these.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct SeatArgs {
    /// The leader key: whoever it names holds (Patroni:
    /// /service/<scope>/leader, or /<namespace>/<scope>/leader).
    #[arg(long)]
    pub key: Option<String>,
    /// The election or lock prefix (etcd's recipes: `etcdctl elect NAME`
    /// puts keys under NAME/): the key with the lowest create_revision
    /// holds.
    #[arg(long)]
    pub prefix: Option<String>,
    /// A ZooKeeper lock's path (Curator's and kazoo's lock recipes): the
    /// child with the lowest sequence number holds, its data names the
    /// holder (kazoo's identifier).
    #[arg(long)]
    pub zookeeper_lock: Option<String>,
    /// A ZooKeeper leader znode: whoever its data names holds.
    #[arg(long)]
    pub zookeeper_node: Option<String>,
}

impl ElectionArgs {
    /// Where the election keeps its holder.
    pub fn seat(&self) -> Result<Seat, Failure> {
        Seat::one_of(Named {
            etcd_key: self.seat.key.as_deref(),
            etcd_prefix: self.seat.prefix.as_deref(),
            zookeeper_lock: self.seat.zookeeper_lock.as_deref(),
            zookeeper_node: self.seat.zookeeper_node.as_deref(),
        })
        .ok_or_else(|| {
            anyhow::anyhow!(
                "name the election: --key, --prefix, --zookeeper-lock or --zookeeper-node"
            )
            .into()
        })
    }

    /// The election, and a client of its store.
    pub fn election(&self) -> Result<Election, Failure> {
        let seat = self.seat()?;
        let servers = fencegate_etcd::Connection {
            endpoints: self.endpoints.clone(),
            credentials: self.username.clone().zip(self.password.clone()),
            ca_file: self.ca_file.clone(),
            cert_file: None,
            key_file: None,
            request_timeout: self.timeout,
            connect_timeout: self.timeout.min(Duration::from_secs(2)),
        };
        if let Some(p) = seat.problems(&servers, "election").first() {
            return Err(anyhow::anyhow!("{p}").into());
        }
        Ok(Election::new(seat, &servers)?)
    }

    /// The signing key, if one is given.
    pub fn keys(&self) -> Result<Option<TokenKeys>, Failure> {
        let Some(path) = &self.signing_key_file else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read the signing key {}: {e}", path.display()))?;
        let key = text.strip_suffix('\n').unwrap_or(&text);
        TokenKeys::new(vec![key.as_bytes().to_vec()])
            .map(Some)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "the signing key in {} is {} bytes; keys are at least {} bytes",
                    path.display(),
                    key.len(),
                    fencegate_core::token::MIN_KEY_LEN
                )
                .into()
            })
    }
}

/// The token to send for `lock` at the election's `revision`: signed with
/// `keys` when the election has them, else the plain number.
pub fn token_text(keys: Option<&TokenKeys>, lock: &str, revision: u64) -> Result<String, Failure> {
    match keys {
        None => Ok(revision.to_string()),
        Some(keys) => {
            let lock = LockName::new(lock).map_err(|e| anyhow::anyhow!("--lock {lock:?}: {e}"))?;
            Ok(keys.sign(&lock, revision).to_string())
        }
    }
}

/// Why `identity` does not hold the election: exit 3.
pub fn not_held(seat: &Seat, shows: &Shows, identity: &str) -> Failure {
    match shows {
        Shows::Held {
            key,
            holder,
            revision,
        } => Failure::Held(format!(
            "{seat} is held by {holder:?} (key {key}, token {revision}), not by {identity:?}"
        )),
        Shows::Vacant => Failure::Held(format!("{seat} has no holder")),
    }
}
