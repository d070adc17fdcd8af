//! `fencegate election token`: the fencing token of an etcd election this
//! process's identity holds, the `create_revision` of the holder's key,
//! for a lock the proxy lets that election issue (`[[elections]]`).

use crate::failure::Failure;
use clap::{Args, Subcommand};
use fencegate_etcd::election::{Seat, Shows};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Subcommand)]
pub enum ElectionCommand {
    /// Print the election's current token (its holder key's
    /// create_revision) if IDENTITY holds it; exit 3 if another holds it or
    /// nobody does.
    Token(TokenArgs),
}

#[derive(Debug, Args)]
pub struct TokenArgs {
    /// Client URLs of the election's etcd members, comma separated.
    #[arg(
        long,
        env = "FENCEGATE_ELECTION_ENDPOINTS",
        value_delimiter = ',',
        required = true
    )]
    pub endpoints: Vec<String>,
    /// The leader key: whoever it names holds (Patroni:
    /// /service/<scope>/leader, or /<namespace>/<scope>/leader).
    #[arg(long, conflicts_with = "prefix", required_unless_present = "prefix")]
    pub key: Option<String>,
    /// The election or lock prefix (etcd's recipes: `etcdctl elect NAME`
    /// puts keys under NAME/): the key with the lowest create_revision
    /// holds.
    #[arg(long)]
    pub prefix: Option<String>,
    /// Who this process is, as the holder's key names it (Patroni: the
    /// member's `name`).
    #[arg(long)]
    pub identity: String,
    /// etcd user, if etcd auth is on.
    #[arg(long, env = "FENCEGATE_ELECTION_USERNAME")]
    pub username: Option<String>,
    /// Its password.
    #[arg(long, env = "FENCEGATE_ELECTION_PASSWORD", hide_env_values = true)]
    pub password: Option<String>,
    /// PEM CA certificate(s) for https:// endpoints.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// Longest the read may take.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// First raise the fence of --lock at this proxy (its S3 endpoint URL)
    /// with the token, so that the old holder's writes are refused from now
    /// on, before this holder writes anything (for Patroni's
    /// `on_role_change` callback). The token is printed once the fence is
    /// raised.
    #[arg(long, requires = "lock")]
    pub fence: Option<String>,
    /// The lock that follows this election in the proxy's `[[elections]]`.
    #[arg(long)]
    pub lock: Option<String>,
    /// PEM CA certificate(s) of an https:// --fence proxy.
    #[arg(long)]
    pub proxy_ca_file: Option<PathBuf>,
}

pub async fn run(cmd: ElectionCommand) -> Result<(), Failure> {
    match cmd {
        ElectionCommand::Token(a) => token(a).await,
    }
}

async fn token(a: TokenArgs) -> Result<(), Failure> {
    let seat = match (a.key, a.prefix) {
        (Some(k), None) => Seat::Key(k),
        (None, Some(p)) => Seat::Prefix(p),
        _ => return Err(anyhow::anyhow!("name the election: --key or --prefix").into()),
    };
    let connection = fencegate_etcd::Connection {
        endpoints: a.endpoints,
        credentials: a.username.zip(a.password),
        ca_file: a.ca_file,
        cert_file: None,
        key_file: None,
        request_timeout: a.timeout,
        connect_timeout: a.timeout.min(Duration::from_secs(2)),
    };
    if let Some(p) = connection.problems("election").first() {
        return Err(anyhow::anyhow!("{p}").into());
    }
    let etcd = fencegate_etcd::Etcd::new(&connection)?;
    let shows = fencegate_etcd::election::shows(&etcd, &seat)
        .await
        .map_err(|e| anyhow::anyhow!("cannot read {seat}: {e}"))?;
    match shows {
        Shows::Held {
            holder, revision, ..
        } if holder == a.identity => {
            if let (Some(proxy), Some(lock)) = (&a.fence, &a.lock) {
                let tls = fencegate_net::tls::ClientTls {
                    ca_file: a.proxy_ca_file.clone(),
                    ..Default::default()
                };
                let until = tokio::time::Instant::now() + a.timeout;
                let raised = crate::fence_client::raise(
                    proxy,
                    &tls,
                    &revision.to_string(),
                    Some(lock),
                    until,
                )
                .await?;
                if raised == crate::fence_client::Raised::NotFencedThere {
                    return Err(anyhow::anyhow!(
                        "{proxy} fences no scope with lock {lock}: check [[elections]] and the scopes there"
                    )
                    .into());
                }
            }
            println!("{revision}");
            Ok(())
        }
        Shows::Held {
            key,
            holder,
            revision,
        } => Err(Failure::Held(format!(
            "{seat} is held by {holder:?} (key {key}, token {revision}), not by {:?}",
            a.identity
        ))),
        Shows::Vacant => Err(Failure::Held(format!("{seat} has no holder"))),
    }
}
