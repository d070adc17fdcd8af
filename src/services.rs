//! `fencegate locksvc` and `fencegate proxy`: load config, bind, serve
//! until SIGINT/SIGTERM, then shut down gracefully; `fencegate health`.

use crate::open_files::{self, Cap};
use anyhow::Context as _;
use clap::Args;
use fencegate_locksvc::LocksvcConfig;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};

/// Whether a service may create its database, and where a new one starts.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Create the SQLite database if it is missing (a first start). Without
    /// it a missing database is refused: it may have been lost, and a new
    /// one would count tokens from the start again.
    #[arg(long)]
    pub create_db: bool,
    /// A new database's tokens start above N (the lease service's counter;
    /// the proxy's max of every lock); an existing one is raised to N, and
    /// one below its high-water mark (DB.mark) starts only with N at least
    /// the mark's token. A proxy replica ([cluster]) puts N in etcd as the
    /// cluster's floor. Refused by the lease service on etcd (raise
    /// etcd.epoch there). After a lost database: above every token ever
    /// issued (README, "A lost database").
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub token_floor: u64,
}

/// What starting either service takes: its file and what overrides it.
#[derive(Debug, Args)]
pub struct ServiceArgs {
    /// TOML configuration file (examples: config/locksvc.toml, config/proxy-*.toml).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Listen address; overrides `listen` in the file.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// SQLite database; overrides `db` in the file.
    #[arg(long)]
    pub db: Option<PathBuf>,
    #[command(flatten)]
    pub create: CreateArgs,
    /// Only validate the configuration, then exit.
    #[arg(long)]
    pub check: bool,
}

#[derive(Debug, Args)]
pub struct LocksvcArgs {
    #[command(flatten)]
    pub service: ServiceArgs,
    #[command(subcommand)]
    pub action: Option<LocksvcAction>,
}

#[derive(Debug, clap::Subcommand)]
pub enum LocksvcAction {
    /// Move the locks and the token counter from a SQLite database to the
    /// etcd cluster of `[etcd]` (or FENCEGATE_ETCD_*). Stop the SQLite
    /// service first. Safe to run again.
    Migrate {
        /// The SQLite database to read (the old service's `db`).
        #[arg(long)]
        from_db: PathBuf,
    },
}

/// Resolves when the process gets SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers we still serve; the process then stops by
        // default disposition.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("shutdown requested; finishing in-flight requests");
}

/// Reads and parses a service's TOML config (empty when no file is given).
///
/// The text is parsed on a thread of its own, and what it yields is copied
/// here. The parser builds a document several times the text's size (about
/// 200 MiB for 100,000 `[[scopes]]`), and the parsed config's own strings
/// lie among it, one or two on every page: the allocator can give back
/// only whole pages, so without the copy the proxy kept nearly all of it
/// for good (BENCHMARKS.md, "Do many locks and scopes stay flat?").
pub fn load_config<T: Clone + Send>(
    path: &Option<PathBuf>,
    parse: impl FnOnce(&str) -> anyhow::Result<T> + Send,
) -> anyhow::Result<T> {
    let name = path
        .as_ref()
        .map_or_else(|| "(defaults)".to_owned(), |p| p.display().to_string());
    let text = read_config_text(path)?;
    let parsed = std::thread::scope(|s| s.spawn(|| parse(&text)).join())
        .map_err(|_| anyhow::anyhow!("the config parser failed unexpectedly"))?
        .with_context(|| format!("invalid config {name}"))?;
    Ok(parsed.clone())
}

pub fn read_config_text(path: &Option<PathBuf>) -> anyhow::Result<String> {
    match path {
        Some(p) => std::fs::read_to_string(p)
            .with_context(|| format!("cannot read config {}", p.display())),
        None => Ok(String::new()),
    }
}

/// Announces the bound address on stdout (first line; tests and scripts
/// read it to find a port chosen by the OS): `fencegate locksvc listening
/// on http://127.0.0.1:7070`, or with `FENCEGATE_LOG_FORMAT=json` a JSON
/// log line with the URL in `url` (and in its message, followed by a
/// blank: scripts cut the URL there).
pub fn announce(service: &str, addr: SocketAddr, tls: bool, max_connections: usize) {
    let scheme = if tls { "https" } else { "http" };
    let url = format!("{scheme}://{addr}");
    if crate::logs::json_logs() {
        tracing::info!(
            target: crate::logs::BANNER,
            service,
            url = %url,
            max_connections,
            "fencegate {service} listening on {url} (max_connections {max_connections})"
        );
        return;
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "fencegate {service} listening on {url}");
    let _ = out.flush();
}

/// `cap.max_connections`, or less if the open-file limit cannot hold it
/// (see [`open_files`]).
fn fit_cap(cap: Cap) -> usize {
    open_files::fit_caps(&[cap])
        .first()
        .copied()
        .unwrap_or(cap.max_connections)
}

pub async fn locksvc(args: LocksvcArgs) -> anyhow::Result<()> {
    let mut config = load_config(&args.service.config, LocksvcConfig::from_toml)?;
    if let Some(l) = args.service.listen {
        config.listen = l;
    }
    if let Some(db) = args.service.db {
        config.db = db;
    }
    config.create_db = args.service.create.create_db;
    config.token_floor = args.service.create.token_floor;
    let mut config = config.validated()?;
    if let Some(LocksvcAction::Migrate { from_db }) = &args.action {
        let etcd = config.etcd.as_ref().context(
            "migrate moves the locks to etcd: configure [etcd] (or FENCEGATE_ETCD_ENDPOINTS) and the epoch",
        )?;
        let m = fencegate_locksvc::migrate::migrate(from_db, etcd).await?;
        println!(
            "migrated {}: SQLite issued tokens up to {}; etcd now runs epoch {} (tokens from {}); {} live lease(s) copied, {} skipped (the lock already had a lease in etcd). Start every replica with etcd.epoch = {}.",
            from_db.display(),
            m.last_token,
            m.epoch,
            fencegate_locksvc::etcd::epoch_base(m.epoch) + 1,
            m.copied,
            m.skipped,
            m.epoch
        );
        return Ok(());
    }
    if args.service.check {
        println!("configuration is valid");
        return Ok(());
    }
    config.max_connections = fit_cap(Cap {
        server: "the lease service",
        max_connections: config.max_connections,
        files_per_connection: 1,
    });
    let (listen, tls, max_connections) =
        (config.listen, config.tls.enabled(), config.max_connections);
    // The state is opened (and a read-only or missing database refused)
    // before the service says it listens.
    let prepared = fencegate_locksvc::prepare(config).await?;
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    announce("locksvc", listener.local_addr()?, tls, max_connections);
    prepared.serve(listener, shutdown_signal()).await
}

#[derive(Debug, Args)]
pub struct ProxyArgs {
    #[command(flatten)]
    pub service: ServiceArgs,
    /// Backend endpoint URL; overrides `backend.endpoint` in the file.
    #[arg(long, env = "FENCEGATE_BACKEND_ENDPOINT")]
    pub backend: Option<String>,
}

pub async fn proxy(args: ProxyArgs) -> anyhow::Result<()> {
    let mut config = load_config(
        &args.service.config,
        fencegate_proxy::ProxyConfig::from_toml,
    )?;
    if let Some(l) = args.service.listen {
        config.listen = l;
    }
    if let Some(db) = args.service.db {
        config.db = db;
    }
    if let Some(b) = args.backend {
        config.backend.endpoint = b;
    }
    config.create_db = args.service.create.create_db;
    config.token_floor = args.service.create.token_floor;
    let mut config = config.validated()?;
    if args.service.check {
        println!("configuration is valid");
        return Ok(());
    }
    // Probe the backend before opening the port, so health checks fail
    // fast instead of hanging while the probe waits for the backend.
    let listen = config.listen;
    config.max_connections = fit_cap(Cap {
        server: "the proxy",
        max_connections: config.max_connections,
        // A client connection may hold one to the backend too.
        files_per_connection: 2,
    });
    let max_connections = config.max_connections;
    let proxy = fencegate_proxy::Proxy::build(config).await?;
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    announce(
        "proxy",
        listener.local_addr()?,
        proxy.tls(),
        max_connections,
    );
    proxy.serve(listener, shutdown_signal()).await
}

/// `fencegate restore-db`: puts a backup in place of a service's stopped
/// database (either service's).
#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The database to replace (the service's `db`).
    #[arg(long)]
    pub db: PathBuf,
    /// The backup to put in its place.
    #[arg(long)]
    pub from: PathBuf,
    /// A backup older than the database's high-water mark (`DB.mark`) is
    /// refused unless N is at least the mark's token; the restored
    /// database then starts at N (the lease service's counter; every
    /// lock's max on the proxy).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub token_floor: u64,
}

pub fn restore_db(args: &RestoreArgs) -> anyhow::Result<()> {
    let (kind, level) = fencegate_durable::restore(&args.from, &args.db, args.token_floor, || {
        fencegate_durable::in_use(&args.db)
    })?;
    println!(
        "restored the {} {} from {} (highest token {}); start the service (without --create-db)",
        kind.what(),
        args.db.display(),
        args.from.display(),
        level.token
    );
    Ok(())
}

pub async fn health(url: &str, tls: &fencegate_net::tls::ClientTls) -> anyhow::Result<()> {
    let resp = tls
        .http_client()?
        .timeout(std::time::Duration::from_secs(5))
        .build()?
        .get(url)
        .send()
        .await
        .with_context(|| format!("{url} is unreachable"))?;
    anyhow::ensure!(
        resp.status().is_success(),
        "{url} answered {}",
        resp.status()
    );
    println!("ok");
    Ok(())
}
