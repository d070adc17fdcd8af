//! The fencegate lease service.
//!
//! An HTTP JSON service that grants, renews and releases leases on named
//! locks and hands every new holder a higher fencing token, signed so that a
//! proxy can tell it was issued here.
//!
//! Module map:
//! - [`config`]: the service's configuration (TOML, env overrides, validation);
//! - [`backend`]: where the locks live, SQLite or etcd, behind one type;
//! - [`store`]: the SQLite file that makes the token counter and the leases
//!   durable;
//! - [`engine`]: the single thread that owns the lock table, applies
//!   requests in arrival order, group-commits them, and serves waiters;
//! - [`etcd`]: the same rules on an etcd cluster, for several replicas;
//! - [`migrate`]: moving the locks and the counter from SQLite to etcd;
//! - [`api`]: the HTTP routes, the wire types, request decoding and JSON
//!   errors;
//! - [`auth`]: API keys and the lock patterns each may use, and who a
//!   caller is in a lock's line;
//! - [`browser`]: what keeps web pages out (the `Host` allowlist against
//!   DNS rebinding, no `Origin`, JSON bodies only);
//! - [`proof`]: what proves holding a lease (the signed token, the
//!   idempotency key), and the [`proof::HeldToken`] the engine requires;
//! - [`metrics`]: Prometheus counters and histograms.
//!
//! Connections (cap, header and idle timeouts, TLS) are `fencegate_net`'s.
//!
//! **Architecture invariants:**
//! - a grant is answered only after the token it carries is fsync'd (SQLite
//!   WAL, `synchronous=FULL`; on etcd, committed by its quorum), so a token
//!   that was ever returned is never issued again, whatever crashes;
//! - renew and release reach the engine only with a [`proof::HeldToken`]
//!   (a verified signed token of the request's lock), never with a bare
//!   number; a lease (signed token, S3 credentials) is answered only to the
//!   request that holds it (design rule 7);
//! - every `/v1/locks/{lock}` handler gets its lock through
//!   [`api::AllowedLock`], which checks the caller's API-key scope;
//! - no request but `/health` reaches a handler with a `Host` the service
//!   does not answer to, and no `/v1/` request with an `Origin` or a body
//!   not declared JSON ([`browser`]);
//! - a waiter joins a line only if `fencegate_core::line::admit` says so,
//!   on both backends: the bound and each caller's share mean the same.

pub mod api;
pub mod auth;
pub mod backend;
pub mod browser;
pub mod clock;
pub mod config;
pub mod engine;
pub mod etcd;
pub mod leases;
pub mod metrics;
pub mod migrate;
pub mod page;
pub mod proof;
pub mod store;

pub use config::LocksvcConfig;

use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;

/// How long a replica on etcd retries reaching the cluster at start.
const ETCD_STARTUP: std::time::Duration = std::time::Duration::from_secs(30);

/// Serves the lease service on `listener` until `shutdown` resolves, then
/// finishes in-flight requests and stops the engine.
pub async fn run(
    listener: TcpListener,
    config: LocksvcConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    prepare(config).await?.serve(listener, shutdown).await
}

/// A lease service with its state open (the SQLite file checked and
/// loaded, or etcd joined), not serving yet: whatever keeps it from
/// serving fails here, before it says it listens.
#[derive(Debug)]
pub struct Prepared {
    config: LocksvcConfig,
    options: fencegate_net::ServerOptions,
    metrics: Arc<metrics::Metrics>,
    leases: backend::Leases,
    engine: Option<engine::Engine>,
}

/// Opens the lease service's state.
pub async fn prepare(config: LocksvcConfig) -> anyhow::Result<Prepared> {
    let config = config.validated()?;
    let options = config.server_options()?;
    let metrics = Arc::new(metrics::Metrics::new());
    let (leases, engine) = match &config.etcd {
        None => {
            let opening = if config.create_db {
                fencegate_durable::Opening::CreateIfMissing
            } else {
                fencegate_durable::Opening::Existing
            };
            let store = store::Store::open(&config.db, opening, config.token_floor)?;
            let engine = engine::Engine::start(
                store,
                metrics.clone(),
                config.max_waiters_per_lock,
                config.storage_timeout,
            )?;
            (backend::Leases::Sqlite(engine.handle()), Some(engine))
        }
        Some(etcd) => {
            let leases = etcd::EtcdLeases::start(
                etcd,
                metrics.clone(),
                config.max_waiters_per_lock,
                ETCD_STARTUP,
            )
            .await?;
            (backend::Leases::Etcd(leases), None)
        }
    };
    Ok(Prepared {
        config,
        options,
        metrics,
        leases,
        engine,
    })
}

impl Prepared {
    /// Serves on `listener` until `shutdown` resolves, then finishes
    /// in-flight requests and stops the engine.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let Prepared {
            config,
            options,
            metrics,
            leases,
            engine,
        } = self;
        let allowed_hosts = config.allowed_hosts.clone();
        let state = api::AppState::new(config, leases, metrics)?;
        let app = api::router(state);
        tracing::info!(
            addr = %listener.local_addr()?,
            tls = options.tls.is_some(),
            max_connections = options.max_connections,
            "locksvc listening"
        );
        let addr = listener.local_addr()?;
        if !addr.ip().is_loopback() && allowed_hosts.is_empty() {
            tracing::info!(
                "answering to IP addresses and localhost only: clients that reach {addr} by a host name are refused (421 HostNotAllowed) until the name is in allowed_hosts (or FENCEGATE_LOCKSVC_ALLOWED_HOSTS)"
            );
        }
        let service = hyper::service::service_fn(move |req| {
            use tower::ServiceExt as _;
            // The connection counts as busy until the body is read or dropped,
            // not only until the answer is sent.
            app.clone().oneshot(fencegate_net::track_request_body(req))
        });
        let served = fencegate_net::serve(listener, service, options, shutdown).await;
        if let Some(engine) = engine {
            engine.stop();
        }
        Ok(served?)
    }
}
