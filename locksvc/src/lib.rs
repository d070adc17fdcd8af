//! The fencegate lease service.
//!
//! An HTTP JSON service that grants, renews and releases leases on named
//! locks and hands every new holder a higher fencing token, signed so that a
//! proxy can tell it was issued here.
//!
//! Module map:
//! - [`config`]: the service's configuration (TOML, env overrides, validation);
//! - [`store`]: the SQLite file that makes the token counter and the leases
//!   durable;
//! - [`engine`]: the single thread that owns the lock table, applies
//!   requests in arrival order, group-commits them, and serves waiters;
//! - [`api`]: the HTTP routes, request decoding and JSON errors;
//! - [`metrics`]: Prometheus counters and histograms.
//!
//! Connections (cap, header and idle timeouts, TLS) are `fencegate_net`'s.
//!
//! **Architecture invariant:** a grant is answered only after the token it
//! carries is fsync'd (SQLite WAL, `synchronous=FULL`), so a token that was
//! ever returned is never issued again, whatever crashes.

pub mod api;
pub mod clock;
pub mod config;
pub mod engine;
pub mod metrics;
pub mod store;

pub use config::LocksvcConfig;

use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;

/// Serves the lease service on `listener` until `shutdown` resolves, then
/// finishes in-flight requests and stops the engine.
pub async fn run(
    listener: TcpListener,
    config: LocksvcConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let config = config.validated()?;
    let options = config.server_options()?;
    let metrics = Arc::new(metrics::Metrics::new());
    let store = store::Store::open(&config.db)?;
    let engine = engine::Engine::start(store, metrics.clone(), config.max_waiters_per_lock)?;
    let state = api::AppState::new(config, engine.handle(), metrics)?;
    let app = api::router(state);
    tracing::info!(
        addr = %listener.local_addr()?,
        tls = options.tls.is_some(),
        max_connections = options.max_connections,
        "locksvc listening"
    );
    let service = hyper::service::service_fn(move |req| {
        use tower::ServiceExt as _;
        // The connection counts as busy until the body is read or dropped,
        // not only until the answer is sent.
        app.clone().oneshot(fencegate_net::track_request_body(req))
    });
    let served = fencegate_net::serve(listener, service, options, shutdown).await;
    engine.stop();
    Ok(served?)
}
