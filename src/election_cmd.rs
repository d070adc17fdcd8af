//! `fencegate election`: the client side of a lock that follows an etcd
//! election (`[[elections]]` in the proxy's config).
//!
//! - `election token` prints the fencing token of an election this
//!   process's identity holds: the revision its term began at,
//!   signed for the lock with the election's key when one is given;
//! - `election run` runs a command while the identity holds it
//!   ([`crate::election_run`]).

use crate::election::{ElectionArgs, not_held, token_text};
use crate::failure::Failure;
use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Subcommand)]
pub enum ElectionCommand {
    /// Print the election's current token (its holder key's
    /// term's revision, signed with --signing-key-file if given) if
    /// IDENTITY holds it; exit 3 if another holds it or nobody does.
    Token(TokenArgs),
    /// Run a command while IDENTITY holds the election: wait until it
    /// does, raise the fence, keep the role files fresh, and stop the
    /// command (exit 4) when the election moves on.
    Run(crate::election_run::ElectionRunArgs),
}

#[derive(Debug, Args)]
pub struct TokenArgs {
    #[command(flatten)]
    pub election: ElectionArgs,
    /// First raise the fence of --lock at this proxy (its S3 endpoint URL)
    /// with the token, so that the old holder's writes are refused from now
    /// on, before this holder writes anything (for Patroni's
    /// `on_role_change` callback). The token is printed once the fence is
    /// raised.
    #[arg(long, requires = "lock")]
    pub fence: Option<String>,
    /// The lock that follows this election in the proxy's `[[elections]]`
    /// (needed with --fence and --signing-key-file: a signed token names
    /// its lock).
    #[arg(long)]
    pub lock: Option<String>,
    /// PEM CA certificate(s) of an https:// --fence proxy.
    #[arg(long)]
    pub proxy_ca_file: Option<PathBuf>,
}

pub async fn run(cmd: ElectionCommand) -> Result<u8, Failure> {
    match cmd {
        ElectionCommand::Token(a) => token(a).await.map(|()| 0),
        ElectionCommand::Run(a) => crate::election_run::run(a).await,
    }
}

async fn token(a: TokenArgs) -> Result<(), Failure> {
    let keys = a.election.keys()?;
    if keys.is_some() && a.lock.is_none() {
        return Err(anyhow::anyhow!(
            "--signing-key-file signs a token for one lock: name it with --lock"
        )
        .into());
    }
    let election = a.election.election()?;
    let seat = election.seat();
    let shows = election
        .shows()
        .await
        .map_err(|e| anyhow::anyhow!("cannot read {seat}: {e}"))?;
    match shows.held_by(&a.election.identity) {
        Some(revision) => {
            let text = token_text(keys.as_ref(), a.lock.as_deref().unwrap_or(""), revision)?;
            if let (Some(proxy), Some(lock)) = (&a.fence, &a.lock) {
                let tls = fencegate_net::tls::ClientTls {
                    ca_file: a.proxy_ca_file.clone(),
                    ..Default::default()
                };
                let until = tokio::time::Instant::now() + a.election.timeout;
                let raised =
                    crate::fence_client::raise(proxy, &tls, &text, Some(lock), until).await?;
                if raised == crate::fence_client::Raised::NotFencedThere {
                    return Err(anyhow::anyhow!(
                        "{proxy} fences no scope with lock {lock}: check [[elections]] and the scopes there"
                    )
                    .into());
                }
            }
            println!("{text}");
            Ok(())
        }
        None => Err(not_held(seat, &shows, &a.election.identity)),
    }
}
