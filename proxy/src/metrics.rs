//! Prometheus metrics of the proxy.

use crate::op::Op;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// How a fenced write ended: the `outcome` label of
/// `fencegate_proxy_writes_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Forwarded, and the store took it.
    Accepted,
    /// Refused: its token is below the max.
    Stale,
    /// Refused: no token.
    Missing,
    /// Refused: a token the proxy does not accept.
    InvalidToken,
    /// Refused: an upload another client created.
    NotOwner,
    /// Refused: a key in no fence scope.
    Unscoped,
    /// The store refused its condition (another writer won the race).
    Conflict,
    /// The store did not answer: in time, or at all (its connection
    /// ended after the request may have left whole).
    Timeout,
    /// The store answered with an error.
    BackendError,
    /// Refused 503: the proxy's own state could not be kept or read.
    Unavailable,
}

impl Outcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Stale => "stale",
            Outcome::Missing => "missing",
            Outcome::InvalidToken => "invalid_token",
            Outcome::NotOwner => "not_owner",
            Outcome::Unscoped => "unscoped",
            Outcome::Conflict => "conflict",
            Outcome::Timeout => "timeout",
            Outcome::BackendError => "backend_error",
            Outcome::Unavailable => "unavailable",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    pub op: Op,
    /// The lock fencing the write, or `(none)` for a refusal naming no lock
    /// the proxy knows (so made-up bucket names add no series).
    pub lock: String,
    /// `accepted`, or the reason for a refusal (`stale`, `missing`, ...).
    pub outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LockLabels {
    pub lock: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    pub op: Op,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabels {
    pub bucket: String,
    pub check: &'static str,
}

/// Every metric the proxy exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub writes: Family<WriteLabels, Counter>,
    pub max_token: Family<LockLabels, Gauge>,
    pub backend_seconds: Family<OpLabels, Histogram>,
    pub probe_enforced: Family<ProbeLabels, Gauge>,
    pub inflight_writes: Gauge,
    /// Writes the store did not answer (in time, or at all) that may still commit (see
    /// `gate::linger`): each holds back a raise of its lock.
    pub lingering_writes: Gauge,
    /// PutObjects sent by the lean forwarder rather than the SDK.
    pub lean_forwards: Counter,
    /// PutObjects served before s3s (`edge`).
    pub edge_puts: Counter,
    /// PutObjects the lean forwarder sent again on another connection: the
    /// idle one it took had been closed by the store, and hyper handed the
    /// request back with no byte of it sent.
    pub lean_resends: Counter,
    /// How long a raise waited for the older epoch to let go.
    pub raise_wait_seconds: Family<LockLabels, Histogram>,
    /// With replicas: 1 while this replica admits writes (its registration
    /// is current), 0 while it refuses them.
    pub cluster_admitting: Gauge,
    /// With replicas: how long the cluster part of a raise took (the
    /// transaction and the wait for every replica's ack or lock delay).
    pub cluster_raise_seconds: Histogram,
    /// With replicas: replicas this one evicted for not acknowledging a
    /// raise within `ack_timeout`.
    pub cluster_evictions: Counter,
}

/// Every metric at zero, registered under `fencegate_proxy`.
impl Default for Metrics {
    fn default() -> Metrics {
        let mut registry = Registry::with_prefix("fencegate_proxy");
        let writes = Family::<WriteLabels, Counter>::default();
        let max_token = Family::<LockLabels, Gauge>::default();
        let backend_seconds = Family::<OpLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 2.0, 16))
        });
        let probe_enforced = Family::<ProbeLabels, Gauge>::default();
        let inflight_writes = Gauge::default();
        let lingering_writes = Gauge::default();
        let lean_forwards = Counter::default();
        let edge_puts = Counter::default();
        let lean_resends = Counter::default();
        let raise_wait_seconds = Family::<LockLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 2.0, 18))
        });
        registry.register(
            "writes",
            "Fenced writes by operation, scope and outcome",
            writes.clone(),
        );
        registry.register(
            "max_token",
            "Current max token per fence scope",
            max_token.clone(),
        );
        registry.register(
            "backend_seconds",
            "Latency of forwarded requests by operation",
            backend_seconds.clone(),
        );
        registry.register(
            "probe_enforced",
            "1 if the backend enforces the conditional-write check, 0 if not",
            probe_enforced.clone(),
        );
        registry.register(
            "inflight_writes",
            "Fenced writes in progress",
            inflight_writes.clone(),
        );
        registry.register(
            "lingering_writes",
            "Writes the backend did not answer (in time, or before their connection ended) that may still commit; each holds back raises of its lock",
            lingering_writes.clone(),
        );
        registry.register(
            "raise_wait_seconds",
            "How long a raise of the max waited for the older token's writes to finish or become unable to commit",
            raise_wait_seconds.clone(),
        );
        let cluster_admitting = Gauge::default();
        let cluster_raise_seconds = Histogram::new(exponential_buckets(0.0005, 2.0, 18));
        let cluster_evictions = Counter::default();
        registry.register(
            "cluster_admitting",
            "With replicas: 1 while this replica's registration is current and it admits writes, 0 while it refuses them",
            cluster_admitting.clone(),
        );
        registry.register(
            "cluster_raise_seconds",
            "With replicas: how long a raise took in the cluster (its transaction and the wait for every replica's ack or lock delay)",
            cluster_raise_seconds.clone(),
        );
        registry.register(
            "cluster_evictions",
            "With replicas: replicas this one evicted for not acknowledging a raise in time",
            cluster_evictions.clone(),
        );
        registry.register(
            "lean_forwards",
            "PutObjects sent by the lean forwarder (the others went through the SDK)",
            lean_forwards.clone(),
        );
        registry.register(
            "edge_puts",
            "PutObjects recognised and verified before s3s (the others were parsed by s3s)",
            edge_puts.clone(),
        );
        registry.register(
            "lean_resends",
            "PutObjects the lean forwarder sent again on a new connection, because the idle one it took had been closed by the store before any byte of the request left",
            lean_resends.clone(),
        );
        Metrics {
            registry,
            writes,
            max_token,
            backend_seconds,
            probe_enforced,
            inflight_writes,
            lingering_writes,
            lean_forwards,
            edge_puts,
            lean_resends,
            raise_wait_seconds,
            cluster_admitting,
            cluster_raise_seconds,
            cluster_evictions,
        }
    }
}

impl Metrics {
    pub fn write(&self, op: Op, lock: &str, outcome: Outcome) {
        self.writes
            .get_or_create(&WriteLabels {
                op,
                lock: lock.to_owned(),
                outcome: outcome.as_str(),
            })
            .inc();
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// An operation is its S3 name in a metric's labels.
impl prometheus_client::encoding::EncodeLabelValue for Op {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelValueEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        self.name().encode(encoder)
    }
}
