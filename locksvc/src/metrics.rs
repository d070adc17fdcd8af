//! Prometheus metrics of the lease service.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Why a request was refused, as a metric label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    pub reason: &'static str,
}

/// Every metric the lease service exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Grants that issued a new token.
    pub grants: Counter,
    /// Renewals, including re-acquires by the live holder.
    pub renewals: Counter,
    /// Refused acquires, renewals and releases, by reason.
    pub refusals: Family<RefusalLabels, Counter>,
    pub releases: Counter,
    /// Leases that ended by expiry rather than release.
    pub expiries: Counter,
    /// Time to make a grant durable: on SQLite, a batch that issued tokens
    /// (WAL fsync included); on etcd, the grant transaction (committed by
    /// a quorum, each member's WAL fsync'd).
    pub fsync_seconds: Histogram,
    /// Requests per group commit.
    pub batch_size: Histogram,
    /// Acquires waiting in line for a held lock.
    pub waiting: Gauge,
    /// The last token issued.
    pub last_token: Gauge,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("fencegate_locksvc");
        let m = Metrics {
            grants: Counter::default(),
            renewals: Counter::default(),
            refusals: Family::default(),
            releases: Counter::default(),
            expiries: Counter::default(),
            fsync_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            waiting: Gauge::default(),
            last_token: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register("grants", "Grants that issued a new token", m.grants.clone());
        registry.register("renewals", "Renewals of a live lease", m.renewals.clone());
        registry.register("refusals", "Refused requests by reason", m.refusals.clone());
        registry.register(
            "releases",
            "Leases released by their holder",
            m.releases.clone(),
        );
        registry.register("expiries", "Leases that expired", m.expiries.clone());
        registry.register(
            "fsync_seconds",
            "Duration of durable commits that issued tokens (SQLite: WAL fsync; etcd: the grant transaction)",
            m.fsync_seconds.clone(),
        );
        registry.register(
            "batch_size",
            "Requests per group commit",
            m.batch_size.clone(),
        );
        registry.register(
            "waiting",
            "Acquires waiting for a held lock",
            m.waiting.clone(),
        );
        registry.register("last_token", "The last token issued", m.last_token.clone());
        Metrics { registry, ..m }
    }

    pub fn refused(&self, reason: &'static str) {
        self.refusals.get_or_create(&RefusalLabels { reason }).inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
