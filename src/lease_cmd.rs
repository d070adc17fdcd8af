//! `fencegate lease acquire|renew|release|status`: one request each, JSON
//! on stdout.

use crate::Failure;
use crate::client::{Client, LocksvcConn, default_owner};
use clap::{Args, Subcommand};
use std::time::Duration;

#[derive(Debug, Subcommand)]
pub enum LeaseCommand {
    /// Acquire LOCK; prints the lease with its `fencing_token`.
    Acquire(AcquireArgs),
    /// Renew the lease holding TOKEN on LOCK (the token does not change).
    Renew(TokenArgs),
    /// Release the lease holding TOKEN on LOCK.
    Release(TokenArgs),
    /// Show who holds LOCK.
    Status(StatusArgs),
}

#[derive(Debug, Args)]
pub struct AcquireArgs {
    pub lock: String,
    /// Who is taking the lease (default: <hostname>-<pid>).
    #[arg(long)]
    pub owner: Option<String>,
    /// How long the lease lasts unless renewed.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub ttl: Duration,
    /// Wait in line up to this long if the lock is held.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub wait: Duration,
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
    /// The token the lease was granted with: its number, or the signed
    /// fencing token string.
    #[arg(long, value_parser = parse_token)]
    pub token: u64,
    /// New TTL from now (renew only).
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

/// Accepts `42` or `fgt1:<lock>:42:<mac>` (the number is what the lease
/// service needs; it checks the lease itself).
fn parse_token(s: &str) -> Result<u64, String> {
    fencegate_core::FencingToken::parse(s)
        .map(|t| t.number())
        .map_err(|e| e.to_string())
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
            let owner = a.owner.unwrap_or_else(default_owner);
            let lease = client.acquire(&a.lock, &owner, a.ttl, a.wait).await?;
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
                    .renew(&a.lock, a.token, a.ttl, Duration::from_secs(10))
                    .await?,
            )
        }
        LeaseCommand::Release(a) => {
            let client = Client::new(a.conn)?;
            print(&client.release(&a.lock, a.token).await?)
        }
        LeaseCommand::Status(a) => {
            let client = Client::new(a.conn)?;
            print(&client.status(&a.lock).await?)
        }
    }
}
