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
mod fence_client;
mod lease_cmd;
mod open_files;
mod probe_cmd;
mod role_files;
mod run_cmd;
mod services;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

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

/// A failure that maps to a documented exit code.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error("{0}")]
    Held(String),
    #[error("{0}")]
    LeaseLost(String),
    /// `run` could not start its command: 127 if it does not exist, 126 if
    /// it cannot be executed (as `env`, `timeout` and shells answer).
    #[error("{message}")]
    CannotStart { message: String, code: u8 },
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

impl Failure {
    fn exit_code(&self) -> u8 {
        match self {
            Failure::Other(_) => 1,
            Failure::Held(_) => 3,
            Failure::LeaseLost(_) => 4,
            Failure::CannotStart { code, .. } => *code,
        }
    }
}

/// The target of the line that announces a service's address. In JSON
/// mode it is a log line on stdout (where scripts and the tests read the
/// address), whatever `FENCEGATE_LOG` says; in text mode the plain banner
/// is printed instead.
pub const BANNER: &str = "fencegate::banner";
/// The target of the error a command ends with in JSON mode: never
/// filtered out, as the plain text one is never silenced.
const EXIT: &str = "fencegate::exit";

/// Whether log lines are JSON (`FENCEGATE_LOG_FORMAT=json`).
static JSON_LOGS: AtomicBool = AtomicBool::new(false);

/// Whether log lines are JSON: then every line fencegate writes on stdout
/// and stderr is a JSON object, the banner too.
pub fn json_logs() -> bool {
    JSON_LOGS.load(Ordering::Relaxed)
}

fn init_tracing() {
    // s3s logs every client error at ERROR; the proxy logs what matters
    // itself, so s3s stays quiet unless FENCEGATE_LOG names it.
    let wanted = std::env::var("FENCEGATE_LOG").unwrap_or_else(|_| "info".into());
    let mut directives = if wanted.contains("s3s") {
        wanted.clone()
    } else {
        format!("{wanted},s3s=off,s3s_aws=off,s3s_fs=off")
    };
    // rustls warns on every connection of a client that sends an IP
    // address as SNI (pgBackRest does), which the server ignores anyway.
    if !wanted.contains("rustls") {
        directives.push_str(",rustls=error");
    }
    let filter = |extra: &str| {
        tracing_subscriber::EnvFilter::try_new(format!("{directives}{extra}")).unwrap_or_else(
            |_| {
                tracing_subscriber::EnvFilter::new(format!(
                    "info,s3s=off,s3s_aws=off,s3s_fs=off{extra}"
                ))
            },
        )
    };
    // FENCEGATE_LOG_FORMAT=json: one JSON object per line (fields flattened
    // beside "message", "level", "target" and "timestamp"), for log
    // pipelines; the banner is one too, on stdout. Any other value logs as
    // text, with a warning first.
    match log_format() {
        Ok(LogFormat::Json) => {
            use tracing_subscriber::Layer as _;
            use tracing_subscriber::layer::SubscriberExt as _;
            use tracing_subscriber::util::SubscriberInitExt as _;
            JSON_LOGS.store(true, Ordering::Relaxed);
            let logs = tracing_subscriber::fmt::layer()
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_writer(std::io::stderr)
                .with_filter(filter(&format!(",{BANNER}=off,{EXIT}=error")));
            let banner = tracing_subscriber::fmt::layer()
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_writer(std::io::stdout)
                .with_filter(tracing_subscriber::filter::filter_fn(|m| {
                    m.target() == BANNER
                }));
            tracing_subscriber::registry()
                .with(logs)
                .with(banner)
                .init();
        }
        format => {
            // Colours only on a terminal, not in a log file or a pipe.
            tracing_subscriber::fmt()
                .with_env_filter(filter(""))
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_writer(std::io::stderr)
                .init();
            if let Err(bad) = format {
                tracing::warn!(
                    "FENCEGATE_LOG_FORMAT={bad:?} is neither \"text\" nor \"json\"; logging as text"
                );
            }
        }
    }
}

/// How log lines are written (`FENCEGATE_LOG_FORMAT`).
enum LogFormat {
    Text,
    Json,
}

fn log_format() -> Result<LogFormat, String> {
    match std::env::var("FENCEGATE_LOG_FORMAT") {
        Err(_) => Ok(LogFormat::Text),
        Ok(v) if v.is_empty() || v.eq_ignore_ascii_case("text") => Ok(LogFormat::Text),
        Ok(v) if v.eq_ignore_ascii_case("json") => Ok(LogFormat::Json),
        Ok(v) => Err(v),
    }
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
