//! `fencegate`: the one binary. It runs the lease service and the proxy,
//! takes leases from the command line, and runs a command under a lease.
//!
//! Exit codes (stable; scripts rely on them):
//! - 0: success (or, for `run`, the command's own status);
//! - 1: an error (bad input, service unreachable, ...);
//! - 2: bad command-line usage;
//! - 3: the lock is held by someone else;
//! - 4: the lease was lost (expired, released or taken over).

mod client;
mod credential_process;
mod dev;
mod election;
mod election_cmd;
mod election_run;
mod failure;
mod fence_client;
mod lease_cmd;
mod logs;
mod open_files;
mod probe_cmd;
mod role_files;
mod run_cmd;
mod services;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::process::ExitCode;

use failure::Failure;
use logs::{EXIT, init_tracing, json_logs};

/// mimalloc, not glibc's malloc: a small PUT allocates ~75 small blocks
/// (hyper's and `http`'s header maps), each freed on the thread that made
/// it; mimalloc's thread-local free lists make each a few instructions.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "fencegate",
    version,
    about = "Fencing tokens for S3: keep stale writers out of your buckets"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the lease service.
    Locksvc(services::LocksvcArgs),
    /// Run the fencing S3 proxy.
    Proxy(services::ProxyArgs),
    /// Run lease service, proxy and an embedded S3 backend in one process.
    Dev(dev::DevArgs),
    /// Take, renew, release or inspect a lease.
    #[command(subcommand)]
    Lease(lease_cmd::LeaseCommand),
    /// Read an etcd election a lock follows (Patroni's leader key, etcd's
    /// election and lock recipes).
    #[command(subcommand)]
    Election(election_cmd::ElectionCommand),
    /// Run a command while holding a lease; stop it if the lease is lost.
    Run(run_cmd::RunArgs),
    /// Print the role's current lease-bound credentials for an AWS
    /// `credential_process` (from the env file `run --env-file` keeps).
    CredentialProcess(credential_process::CredentialProcessArgs),
    /// Probe a store: which conditions it enforces, how it spells them,
    /// and what the proxy would do. Exits 1 if the proxy would refuse
    /// fenced writes to a bucket.
    Probe(probe_cmd::ProbeArgs),
    /// Put a backup in place of a stopped service's SQLite database (the
    /// lease service's or the proxy's): refuses while the service runs,
    /// checks the backup, drops the old write-ahead log.
    RestoreDb(services::RestoreArgs),
    /// Check a service's health endpoint (for container health checks):
    /// exits 0 if it answers 200.
    Health {
        /// e.g. http://127.0.0.1:9000/_fencegate/health or https://127.0.0.1:7070/health
        url: String,
        #[command(flatten)]
        tls: client::TlsArgs,
    },
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Some(msg) = matches
        .subcommand_matches("run")
        .and_then(run_cmd::usage_error)
    {
        let mut cmd = Cli::command();
        let run = cmd.find_subcommand_mut("run").expect("run is a subcommand");
        run.error(clap::error::ErrorKind::MissingRequiredArgument, msg)
            .exit();
    }
    init_tracing();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("fencegate: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result: Result<u8, Failure> = runtime.block_on(async move {
        match cli.command {
            Command::Locksvc(args) => services::locksvc(args)
                .await
                .map(|()| 0)
                .map_err(Failure::from),
            Command::Proxy(args) => services::proxy(args)
                .await
                .map(|()| 0)
                .map_err(Failure::from),
            Command::Dev(args) => dev::dev(args).await.map(|()| 0).map_err(Failure::from),
            Command::Lease(cmd) => lease_cmd::run(cmd).await.map(|()| 0),
            Command::Election(cmd) => election_cmd::run(cmd).await,
            Command::Run(args) => run_cmd::run(args).await,
            Command::CredentialProcess(args) => credential_process::credential_process(&args)
                .map(|()| 0)
                .map_err(Failure::from),
            Command::Probe(args) => match probe_cmd::probe(args).await {
                Ok(true) => Ok(0),
                Ok(false) => Ok(1),
                Err(e) => Err(Failure::from(e)),
            },
            Command::RestoreDb(args) => services::restore_db(&args)
                .map(|()| 0)
                .map_err(Failure::from),
            Command::Health { url, tls } => services::health(&url, &tls.client_tls())
                .await
                .map(|()| 0)
                .map_err(Failure::from),
        }
    });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            if json_logs() {
                tracing::error!(target: EXIT, "fencegate: {e:#}");
            } else {
                eprintln!("fencegate: {e:#}");
            }
            ExitCode::from(e.exit_code())
        }
    }
}
