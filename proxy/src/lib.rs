//! The fencegate S3 proxy: every write to a fenced scope carries a token
//! that must not be below the highest one the scope has admitted, and every
//! forwarded write is a compare-and-set at the store.
//!
//! Module map (request order):
//! - [`server`]: HTTP, operations endpoints, graceful shutdown (connection
//!   limits, timeouts and TLS: `fencegate_net`);
//! - [`host`]: virtual-hosted-style addressing (bucket in the `Host`);
//! - [`early`]: refusals on the request head (POST forms, the budget of
//!   bodies read whole); [`presented`]: the request's credentials as s3s
//!   reads them (signed only if a signature is verified);
//! - [`edge`]: plain signed PutObjects verified and handed to the handler
//!   without s3s (everything else goes through s3s);
//! - [`access`]: client SigV4 keys, anonymous policy, operation allowlist,
//!   with [`query`] (query parameters) and [`object_key`] (the key rule);
//! - [`ops`]: one module per S3 operation family, fenced or forwarded;
//! - [`gate`]: the stages every fenced write goes through, and `gate::Writer`, the
//!   only sender of object writes;
//! - [`scope`]: which lock fences a bucket/key;
//! - [`tokens`]: the `Fencing-Token` header and its verification;
//!   [`issuer`]: plain tokens checked with the lease service, or with the
//!   lock's election ([`election`]: Patroni's leader key, etcd's election
//!   and lock recipes, ZooKeeper locks); [`follow`]: the proxy's own watch
//!   of each election, raising the fence at every new term;
//! - [`fences`]: max_token per lock and the epoch barrier;
//! - [`keys`]: per-key serialization and the ETag cache;
//! - [`body`]: request bodies a newer epoch can cut; [`trailer`]:
//!   `aws-chunked` trailing checksums checked before the last byte goes on;
//! - [`backend`]: the backend SDK client; [`probe`]: which conditions the
//!   store enforces, and [`dialect`]: how each must be spelled for it;
//! - [`state`]: SQLite (max_token, upload bindings), or the same
//!   shared by replicas through etcd; [`errors`]: S3 errors;
//!   [`metrics`]; [`config`].
//!
//! **Architecture invariant:** no request reaches the backend's write API
//! without passing [`gate::Admitter::admit`] for its lock, and every object
//! write is sent by the [`gate::Writer`] for an `Admitted` write from [`gate::Admitter::begin`] (key lock, known state, per-key
//! token) and is sent with `If-Match` or `If-None-Match` in the store's
//! dialect, where the probe saw the store enforce it.

// An internal crate: its docs link to its private modules on purpose.
#![allow(rustdoc::private_intra_doc_links)]

#[macro_use]
pub mod forward;

pub mod access;
mod backend;
mod body;
mod clock;
pub mod config;
pub mod devstore;
mod dialect;
mod early;
pub mod edge;
mod election;
mod errors;
mod events;
pub mod fences;
mod follow;
pub mod gate;
mod header_names;
pub mod host;
mod issuer;
pub mod keys;
mod lean;
mod metrics;
mod no_answer;
pub mod object_key;
mod op;
mod ops;
mod page;
mod presented;
pub mod probe;
mod query;
mod read_ahead;
mod recent;
mod request;
pub mod scope;
mod send_check;
pub mod server;
pub mod sigv4;
pub mod state;
mod state_error;
mod tokens;
mod trailer;
mod write_headers;

pub use config::ProxyConfig;

use s3s::service::{S3Service, S3ServiceBuilder};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

/// A built proxy, ready to serve.
#[derive(Debug)]
pub struct Proxy {
    gate: Arc<gate::Gate>,
    service: S3Service,
    edge: edge::Edge,
    hosts: host::VirtualHosts,
    viewers: access::Viewers,
    answered: fencegate_net::browser::AllowedHosts,
    options: fencegate_net::ServerOptions,
}

/// How long the start-up probe keeps retrying a backend that is not up yet.
const PROBE_PATIENCE: Duration = Duration::from_secs(30);

impl Proxy {
    /// Validates `config`, opens the database and, when a probe bucket is
    /// known, probes the backend (refusing a backend that ignores
    /// conditional PUTs unless `accept_weak_backend`).
    pub async fn build(config: ProxyConfig) -> anyhow::Result<Proxy> {
        let config = config.validated()?;
        let options = config.server_options()?;
        let db = state::db::Db::open(
            &config.db,
            if config.create_db {
                fencegate_durable::Opening::CreateIfMissing
            } else {
                fencegate_durable::Opening::Existing
            },
            config.token_floor,
        )?;
        let cluster = config
            .cluster
            .as_ref()
            .map(|c| {
                state::cluster::Cluster::new(
                    c,
                    Duration::from_secs(config.backend.store_decision_secs),
                    config.token_floor,
                )
            })
            .transpose()?;
        let gate = Arc::new(gate::Gate::new(&config, db, cluster)?);
        follow::spawn_all(&gate);
        gate.join_cluster(PROBE_PATIENCE).await?;
        let probe_bucket = config
            .probe_bucket
            .clone()
            .or_else(|| config.scopes.first().map(|s| s.bucket.clone()));
        if let Some(bucket) = probe_bucket {
            let started = Instant::now();
            let report = loop {
                match gate.store.probe_bucket(&bucket).await {
                    Ok(r) => break r,
                    Err(e) if started.elapsed() < PROBE_PATIENCE => {
                        tracing::warn!(error = format!("{e:#}"), "backend probe failed; retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Err(e) => {
                        // Nothing was served: this run ends as the last one did.
                        gate.end_run();
                        anyhow::bail!("backend probe failed: {e:#}")
                    }
                }
            };
            if !report.safe() && !config.accept_weak_backend {
                gate.end_run();
                anyhow::bail!(
                    "the backend does not enforce conditional writes ({}; it answered: {}); refusing to serve fenced traffic. \
                     `fencegate probe` prints the whole report. Use a backend that does (MinIO, AWS S3, Ceph RGW), \
                     or set accept_weak_backend = true to run with the proxy as the only fence (one replica, no other writers)",
                    report.summary(),
                    report.failed_answers()
                );
            }
        }
        let mut builder = S3ServiceBuilder::new(ops::FencedS3::new(gate.clone()));
        builder.set_auth(access::ClientAuth::new(
            &config.clients,
            gate.tokens.keys().cloned(),
            gate.tokens.election_keys(),
        ));
        builder.set_access(access::Access {
            allow_anonymous: config.allow_anonymous,
            gate: gate.clone(),
        });
        let hosts = host::VirtualHosts::new(&config.virtual_host_domains);
        let edge = edge::Edge::new(
            Arc::new(access::ClientAuth::new(
                &config.clients,
                gate.tokens.keys().cloned(),
                gate.tokens.election_keys(),
            )),
            Arc::new(hosts.clone()),
        );
        builder.set_host(hosts.clone());
        let mut s3_config = s3s::config::S3Config::default();
        s3_config.xml_max_body_size = config.max_xml_body_bytes;
        // POST object is refused before s3s sees it (`early`); should one
        // get through anyway, s3s reads as little of the form as it can.
        s3_config.post_object_max_file_size = 0;
        s3_config.form_max_field_size = 64 * 1024;
        s3_config.form_max_fields_size = 256 * 1024;
        s3_config.form_max_parts = 32;
        builder.set_config(Arc::new(s3s::config::StaticConfigProvider::new(Arc::new(
            s3_config,
        ))));
        Ok(Proxy {
            gate,
            service: builder.build(),
            edge,
            hosts,
            viewers: access::Viewers::new(&config.viewers, config.allow_anonymous),
            answered: config.answered_hosts()?,
            options,
        })
    }

    /// Whether the proxy serves HTTPS.
    pub fn tls(&self) -> bool {
        self.options.tls.is_some()
    }

    /// Serves until `shutdown` resolves, then drains in-flight requests.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> anyhow::Result<()> {
        tracing::info!(
            addr = %listener.local_addr()?,
            tls = self.options.tls.is_some(),
            max_connections = self.options.max_connections,
            "proxy listening"
        );
        server::serve(
            listener,
            server::Front {
                s3: self.service,
                edge: self.edge,
                hosts: self.hosts,
                viewers: self.viewers,
                answered: self.answered,
            },
            self.gate,
            self.options,
            shutdown,
        )
        .await
    }
}

/// Builds and serves the proxy on `listener` until `shutdown` resolves.
pub async fn run(
    listener: TcpListener,
    config: ProxyConfig,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    Proxy::build(config).await?.serve(listener, shutdown).await
}
