//! The store behind the gate: what it enforces (the probe, once per
//! bucket), how it spells conditions, and the few calls that are not
//! writes of objects (a copy's source, a bucket's existence and creation).
//! It owns the [`Backend`]: the later stages reach the store through it.

use super::call::{Call, within};
use crate::backend::{Backend, Reads};
use crate::dialect::Dialect;
use crate::errors;
use crate::keys::Known;
use crate::metrics::{Metrics, ProbeLabels};
use crate::probe::{ProbeError, ProbeReport, probe};
use parking_lot::Mutex;
use s3s::S3Result;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// The store's state: its client, what each bucket's probe found, and the
/// answer timeout of the calls that change no object.
#[derive(Debug)]
pub struct Store {
    backend: Backend,
    probes: Mutex<HashMap<String, Arc<ProbeReport>>>,
    probing: tokio::sync::Mutex<()>,
    accept_weak_backend: bool,
    /// How long the backend has to answer once a request is fully sent.
    timeout: Duration,
    metrics: Arc<Metrics>,
}

impl Store {
    pub fn new(
        backend: Backend,
        accept_weak_backend: bool,
        timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Store {
        Store {
            backend,
            probes: Mutex::default(),
            probing: tokio::sync::Mutex::new(()),
            accept_weak_backend,
            timeout,
            metrics,
        }
    }

    /// The backend, for the stages after this one (admission reads a key,
    /// the write stage sends).
    pub(super) fn backend(&self) -> &Backend {
        &self.backend
    }

    /// How long the backend has to answer once a request is fully sent.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether writes that ignore the store's conditions are accepted.
    pub fn accepts_weak(&self) -> bool {
        self.accept_weak_backend
    }

    /// Awaits a call that changes no object, within the answer timeout
    /// (see [`within`]).
    pub(super) async fn call<T>(
        &self,
        fut: Call<'_, T>,
        body_sent: Option<Arc<tokio::sync::Notify>>,
    ) -> S3Result<T> {
        within(self.timeout, fut, body_sent).await
    }

    /// What the store holds at `bucket/key`, read now.
    pub(super) async fn head(&self, bucket: &str, key: &str) -> S3Result<Known> {
        self.call(Box::pin(self.backend.head(bucket, key)), None)
            .await
    }

    /// The backend's read operations, the only part of it ops may call
    /// directly.
    pub fn reads(&self) -> &Reads {
        self.backend.reads()
    }

    /// Whether the backend has a lean forwarder (`crate::lean`), which
    /// sends a PutObject as it came.
    pub fn has_lean_forwarder(&self) -> bool {
        self.backend.lean().is_some()
    }

    /// HEAD of a copy source (a read), with the answer timeout.
    pub async fn head_source(
        &self,
        bucket: &str,
        key: &str,
        version: Option<&str>,
    ) -> S3Result<aws_sdk_s3::operation::head_object::HeadObjectOutput> {
        let head = self
            .backend
            .unfenced()
            .head_object()
            .bucket(bucket)
            .key(key)
            .set_version_id(version.map(str::to_owned));
        self.call(
            Box::pin(async { head.send().await.map_err(crate::backend::sdk_error) }),
            None,
        )
        .await
    }

    /// Whether `bucket` exists (false only when the backend says 404).
    pub async fn bucket_exists(&self, bucket: &str) -> bool {
        let head = self.backend.unfenced().head_bucket().bucket(bucket);
        let answer = self
            .call(
                Box::pin(async {
                    Ok(head.send().await.map_err(|e| crate::backend::status_of(&e)))
                }),
                None,
            )
            .await;
        !matches!(answer, Ok(Err(Some(404))))
    }

    /// Creates a bucket: only the bucket and its location go to the store
    /// (see `ops::create_bucket` for what is refused before).
    pub async fn create_bucket(
        &self,
        req: s3s::S3Request<s3s::dto::CreateBucketInput>,
    ) -> S3Result<s3s::S3Response<s3s::dto::CreateBucketOutput>> {
        let location = req
            .input
            .create_bucket_configuration
            .as_ref()
            .and_then(|c| c.location_constraint.clone());
        let plain = s3s::dto::CreateBucketInput {
            bucket: req.input.bucket.clone(),
            create_bucket_configuration: location.map(|l| s3s::dto::CreateBucketConfiguration {
                location_constraint: Some(l),
                ..Default::default()
            }),
            ..Default::default()
        };
        let req = req.map_input(|_| plain);
        self.call(Box::pin(self.backend.create_bucket(req)), None)
            .await
            .map_err(errors::from_backend)
    }

    /// Probe reports so far, by bucket.
    pub fn probe_reports(&self) -> Vec<ProbeReport> {
        let mut v: Vec<_> = self
            .probes
            .lock()
            .values()
            .map(|r| ProbeReport::clone(r))
            .collect();
        v.sort_by(|a, b| a.bucket.cmp(&b.bucket));
        v
    }

    /// How `bucket`'s store reads conditions (AWS's way until probed).
    pub fn dialect_of(&self, bucket: &str) -> Dialect {
        self.probes
            .lock()
            .get(bucket)
            .map_or(Dialect::AWS, |r| r.dialect())
    }

    /// The client that writes to `bucket` in its store's dialect.
    pub fn writes_to(&self, bucket: &str) -> aws_sdk_s3::Client {
        self.backend.writes(self.dialect_of(bucket))
    }

    /// The report of `bucket`'s probe, if it was probed.
    pub fn probed(&self, bucket: &str) -> Option<Arc<ProbeReport>> {
        self.probes.lock().get(bucket).cloned()
    }

    /// Probes `bucket` now (or returns the earlier report: shared, since
    /// every write asks).
    pub async fn probe_bucket(&self, bucket: &str) -> Result<Arc<ProbeReport>, ProbeError> {
        if let Some(r) = self.probed(bucket) {
            return Ok(r);
        }
        // Boxed: the probe's SDK calls would otherwise sit inline in every
        // write's future (see `Call`).
        Box::pin(self.probe_now(bucket)).await
    }

    /// Probes `bucket`, one probe at a time, unless another probe reported
    /// on it meanwhile.
    async fn probe_now(&self, bucket: &str) -> Result<Arc<ProbeReport>, ProbeError> {
        let _one_at_a_time = self.probing.lock().await;
        if let Some(r) = self.probed(bucket) {
            return Ok(r);
        }
        let report = Arc::new(probe(self.backend.unfenced(), bucket, self.timeout).await?);
        if report.safe() {
            tracing::info!(probe = %report.summary(), "backend probe");
        } else {
            tracing::warn!(probe = %report.summary(), "backend probe: conditional PUT is not enforced");
        }
        for line in report.checks() {
            self.metrics
                .probe_enforced
                .get_or_create(&ProbeLabels {
                    bucket: bucket.to_owned(),
                    check: line.name,
                })
                .set(i64::from(line.check.enforced()));
        }
        self.probes.lock().insert(bucket.to_owned(), report.clone());
        Ok(report)
    }

    /// Refuses writes to a bucket whose backend does not enforce
    /// conditional PUTs (unless the operator accepted that).
    pub async fn require_safe(&self, bucket: &str) -> S3Result<()> {
        match self.probe_bucket(bucket).await {
            Ok(r) if r.safe() || self.accept_weak_backend => Ok(()),
            Ok(r) => Err(errors::unsafe_backend(
                bucket,
                &format!(
                    "the backend ignores conditional writes ({}); set accept_weak_backend = true to run with the proxy as the only fence",
                    r.summary()
                ),
            )),
            Err(ProbeError::NoSuchBucket(_)) => Err(s3s::s3_error!(
                NoSuchBucket,
                "bucket {bucket} does not exist: create it first (on the backend, or with CreateBucket through the proxy)"
            )),
            Err(ProbeError::Store(e)) => Err(errors::retry(format!(
                "cannot check that bucket {bucket} enforces conditional writes: {e}"
            ))),
        }
    }
}
