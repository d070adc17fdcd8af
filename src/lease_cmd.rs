//! `fencegate lease acquire|renew|release|status`: one request each, JSON
//! on stdout.

use crate::client::{Client, LeaseTerms, LocksvcConn, default_owner};
use crate::failure::Failure;
use clap::{Args, Subcommand};
use fencegate_core::FencingToken;
use std::time::Duration;

#[derive(Debug, Subcommand)]
pub enum LeaseCommand {
    /// Acquire LOCK; prints the lease with its `fencing_token`.
    Acquire(AcquireArgs),
    /// Renew your lease on LOCK, proven by its FENCING_TOKEN (the token does
    /// not change; the lease then expires --ttl from now).
    Renew(TokenArgs),
    /// Release your lease on LOCK, proven by its FENCING_TOKEN.
    Release(TokenArgs),
    /// Show who holds LOCK.
    Status(StatusArgs),
}

#[derive(Debug, Args)]
pub struct AcquireArgs {
    pub lock: String,
    #[command(flatten)]
    pub terms: LeaseTerms,
    /// A secret of your choosing (16 to 256 bytes). Run the same acquire
    /// again with the same --owner and key (say, after a timeout) and you
    /// get the same lease back while it is live; without the key, a live
    /// lease is never handed out again, even to its owner's name.
    #[arg(long, env = "FENCEGATE_IDEMPOTENCY_KEY", hide_env_values = true)]
    pub idempotency_key: Option<String>,
    /// What to print: the whole lease as JSON, only the signed token (for
    /// the Fencing-Token header), or only the token number.
    #[arg(long, value_enum, default_value = "json")]
    pub format: Format,
    #[command(flatten)]
    pub conn: LocksvcConn,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Format {
    Json,
    Token,
    Number,
}

#[derive(Debug, Args)]
pub struct TokenArgs {
    pub lock: String,
    /// The signed fencing token the acquire printed (`fgt1:...`, what
    /// `--format token` prints). The token number alone is refused: it is
    /// public, so it proves nothing.
    #[arg(long, value_name = "FENCING_TOKEN", value_parser = parse_token)]
    pub token: FencingToken,
    /// The lease then expires this long from now, shorter or longer than
    /// before (renew only).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub ttl: Duration,
    #[command(flatten)]
    pub conn: LocksvcConn,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    pub lock: String,
    #[command(flatten)]
    pub conn: LocksvcConn,
}

/// Accepts the signed token only: the lease service refuses a number
/// (SignedTokenRequired), so say so before asking it.
fn parse_token(s: &str) -> Result<FencingToken, String> {
    match FencingToken::parse(s).map_err(|e| e.to_string())? {
        FencingToken::Plain(_) => Err(
            "a token number proves nothing (anyone can read it): pass the fencing_token the acquire printed (fgt1:..., `--format token`)"
                .into(),
        ),
        signed => Ok(signed),
    }
}

fn print(v: &impl serde::Serialize) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(v).map_err(anyhow::Error::from)?;
    println!("{text}");
    Ok(())
}

pub async fn run(cmd: LeaseCommand) -> Result<(), Failure> {
    match cmd {
        LeaseCommand::Acquire(a) => {
            let client = Client::new(a.conn)?;
            let owner = a.terms.owner.unwrap_or_else(default_owner);
            let lease = client
                .acquire(
                    &a.lock,
                    &owner,
                    a.idempotency_key.as_deref(),
                    a.terms.ttl,
                    a.terms.wait,
                )
                .await?;
            match a.format {
                Format::Json => print(&lease),
                Format::Token => {
                    println!("{}", lease.fencing_token);
                    Ok(())
                }
                Format::Number => {
                    println!("{}", lease.token);
                    Ok(())
                }
            }
        }
        LeaseCommand::Renew(a) => {
            let client = Client::new(a.conn)?;
            print(
                &client
                    .renew(&a.lock, &a.token, a.ttl, Duration::from_secs(10))
                    .await?,
            )
        }
        LeaseCommand::Release(a) => {
            let client = Client::new(a.conn)?;
            print(&client.release(&a.lock, &a.token).await?)
        }
        LeaseCommand::Status(a) => {
            let client = Client::new(a.conn)?;
            print(&client.status(&a.lock).await?)
        }
    }
}
