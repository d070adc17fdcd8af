//! The backend S3 server: the SDK client the proxy forwards with, and the
//! few calls the proxy makes on its own behalf (HEAD, copy, probe).
//!
//! Backend SDK errors are turned into S3 errors here and in
//! [`crate::errors::from_backend`], nowhere else.

use crate::config::BackendConfig;
use crate::dialect::{Dialect, SourceCondition, SourceNames, strip_quotes};
use crate::fences::Admission;
use crate::keys::Known;
use crate::op::Op;
use crate::send_check::{Check, SdkClient};
use aws_credential_types::Credentials;
use aws_sdk_s3::config::{
    BehaviorVersion, Region, RequestChecksumCalculation, ResponseChecksumValidation,
    StalledStreamProtectionConfig,
};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_smithy_types::retry::RetryConfig;
use aws_smithy_types::timeout::TimeoutConfig;
use http::StatusCode;
use s3s::{S3Error, S3ErrorCode};
use std::time::Duration;

use crate::tokens::TOKEN_METADATA_KEY;
use crate::tokens::upload::UploadBinding;
use s3s::dto::{
    AbortMultipartUploadInput, AbortMultipartUploadOutput, CreateBucketInput, CreateBucketOutput,
    CreateMultipartUploadInput, CreateMultipartUploadOutput, UploadPartInput, UploadPartOutput,
};
use s3s::{S3, S3Request, S3Response, S3Result};

/// Longest a connection to the store may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The backend: an SDK client, and the s3s-aws adapter forwarding client
/// requests through it. Only the gate holds one; ops see [`Reads`].
pub struct Backend {
    /// Writes in AWS's dialect, and the proxy's own calls (HEAD, probe).
    client: aws_sdk_s3::Client,
    /// Private: every call through it takes a witness of the fence
    /// (below), so none can be sent that the fence did not let through.
    forward: s3s_aws::Proxy,
    /// The write client's configuration, to which [`Backend::writes`]
    /// adds a store's dialect.
    write_config: aws_sdk_s3::Config,
    /// One write client per dialect in use (one per store, in practice).
    dialects: parking_lot::Mutex<std::collections::HashMap<Dialect, aws_sdk_s3::Client>>,
    reads: Reads,
    /// The lean forwarder of PutObject (see `lean`), when the endpoint
    /// allows one.
    lean: Option<std::sync::Arc<crate::lean::Lean>>,
}

/// The backend's read operations: what the ops forward untouched. It has
/// no write method, so an op cannot send a write past the gate.
pub struct Reads(s3s_aws::Proxy);

impl std::fmt::Debug for Reads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reads").finish_non_exhaustive()
    }
}

macro_rules! reads {
    ($($name:ident: $input:ty => $output:ty;)*) => {
        impl Reads {
            $(
                pub async fn $name(
                    &self,
                    req: s3s::S3Request<$input>,
                ) -> s3s::S3Result<s3s::S3Response<$output>> {
                    s3s::S3::$name(&self.0, req).await
                }
            )*
        }
    };
}

reads! {
    get_object: s3s::dto::GetObjectInput => s3s::dto::GetObjectOutput;
    head_object: s3s::dto::HeadObjectInput => s3s::dto::HeadObjectOutput;
    list_objects: s3s::dto::ListObjectsInput => s3s::dto::ListObjectsOutput;
    list_objects_v2: s3s::dto::ListObjectsV2Input => s3s::dto::ListObjectsV2Output;
    list_object_versions: s3s::dto::ListObjectVersionsInput => s3s::dto::ListObjectVersionsOutput;
    list_buckets: s3s::dto::ListBucketsInput => s3s::dto::ListBucketsOutput;
    head_bucket: s3s::dto::HeadBucketInput => s3s::dto::HeadBucketOutput;
    get_bucket_location: s3s::dto::GetBucketLocationInput => s3s::dto::GetBucketLocationOutput;
    list_multipart_uploads: s3s::dto::ListMultipartUploadsInput => s3s::dto::ListMultipartUploadsOutput;
    list_parts: s3s::dto::ListPartsInput => s3s::dto::ListPartsOutput;
    get_object_tagging: s3s::dto::GetObjectTaggingInput => s3s::dto::GetObjectTaggingOutput;
    get_object_attributes: s3s::dto::GetObjectAttributesInput => s3s::dto::GetObjectAttributesOutput;
    get_bucket_versioning: s3s::dto::GetBucketVersioningInput => s3s::dto::GetBucketVersioningOutput;
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend").finish_non_exhaustive()
    }
}

impl Backend {
    /// The reads the ops forward untouched.
    pub fn reads(&self) -> &Reads {
        &self.reads
    }

    /// The lean forwarder of PutObject, when the endpoint allows one (its
    /// sends come only from the gate's `Writer`).
    pub fn lean(&self) -> Option<&std::sync::Arc<crate::lean::Lean>> {
        self.lean.as_ref()
    }

    /// The SDK client with no fence in front of it: only for the proxy's
    /// own calls (a bucket's HEAD, a copy source's HEAD) and the probe's
    /// scratch keys, never for a
    /// client's object.
    pub fn unfenced(&self) -> &aws_sdk_s3::Client {
        &self.client
    }

    /// The backend of `config`; with replicas, `check` is the replica's
    /// standing, asked before every write's bytes leave (`send_check`).
    /// `resends` counts the lean forwarder's writes sent again.
    pub fn new(
        config: &BackendConfig,
        check: Option<Check>,
        resends: prometheus_client::metrics::counter::Counter,
    ) -> Backend {
        let creds = Credentials::new(
            config.access_key.clone(),
            config.secret_key.clone(),
            None,
            None,
            "fencegate-config",
        );
        let sdk_config = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .endpoint_url(config.endpoint.clone())
            .region(Region::new(config.region.clone()))
            .credentials_provider(creds)
            .force_path_style(config.path_style)
            // A conditional write that failed is re-read and re-decided by
            // the proxy, never retried blindly by the SDK.
            .retry_config(RetryConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(CONNECT_TIMEOUT)
                    .build(),
            )
            // A paused client must not be cut by the SDK's stall detector:
            // only a newer token cuts an upload.
            .stalled_stream_protection(StalledStreamProtectionConfig::disabled())
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired);
        let reads_client = aws_sdk_s3::Client::from_conf(sdk_config.clone().build());
        // Writes go over connections that ask the check before each write
        // of bytes; reads do not need to.
        let https = config.endpoint.starts_with("https://");
        let sdk_config = sdk_config.interceptor(EmptyBodyLength);
        let write_config = match crate::send_check::store_connector(https, CONNECT_TIMEOUT) {
            Ok(connector) => sdk_config
                .http_client(SdkClient::new(connector, check.clone(), CONNECT_TIMEOUT))
                .build(),
            Err(e) => {
                tracing::warn!(error = %e, "no checked connections to the store; writes go out with the SDK's own client, checked only before they are sent");
                sdk_config.build()
            }
        };
        let client = aws_sdk_s3::Client::from_conf(write_config.clone());
        let lean = match crate::lean::Lean::new(config, check, resends) {
            Ok(l) => Some(std::sync::Arc::new(l)),
            Err(e) => {
                tracing::warn!(error = %e, "no lean forwarder for this backend; every write goes through the SDK");
                None
            }
        };
        Backend {
            lean,
            forward: s3s_aws::Proxy::from(client.clone()),
            reads: Reads(s3s_aws::Proxy::from(reads_client)),
            client,
            write_config,
            dialects: Default::default(),
        }
    }

    /// The write client for a store that reads conditions in `dialect`:
    /// every write it sends has its conditions rewritten so (see
    /// [`Respell`]). It shares the connections of every other.
    pub fn writes(&self, dialect: Dialect) -> aws_sdk_s3::Client {
        if dialect == Dialect::AWS {
            return self.client.clone();
        }
        let mut dialects = self.dialects.lock();
        dialects
            .entry(dialect)
            .or_insert_with(|| {
                aws_sdk_s3::Client::from_conf(
                    self.write_config
                        .to_builder()
                        .interceptor(Respell(dialect))
                        .build(),
                )
            })
            .clone()
    }

    /// Creates a multipart upload in a scope that admitted its token.
    pub async fn create_upload(
        &self,
        _admitted: &Admission,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        self.forward.create_multipart_upload(req).await
    }

    /// Sends a part of an upload whose token the scope admitted.
    pub async fn upload_part(
        &self,
        _admitted: &Admission,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        self.forward.upload_part(req).await
    }

    /// Aborts the upload of `bound`, the binding verified for this
    /// request's client (an abort changes no object); a request for another
    /// upload than the binding's is refused.
    pub async fn abort_upload(
        &self,
        bound: &UploadBinding,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let i = &req.input;
        if (i.upload_id.as_str(), i.bucket.as_str(), i.key.as_str())
            != (bound.upload_id(), bound.bucket(), bound.key())
        {
            return Err(crate::errors::unknown_upload(&i.upload_id));
        }
        self.forward.abort_multipart_upload(req).await
    }

    /// Creates a bucket (the gate sends only plain creates, which touch no
    /// object: `Store::create_bucket`).
    pub async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        self.forward.create_bucket(req).await
    }

    /// What the store holds at `bucket/key`: absent, or its ETag and token.
    pub async fn head(&self, bucket: &str, key: &str) -> Result<Known, S3Error> {
        match self
            .client
            .head_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
        {
            Ok(out) => Ok(Known::Present {
                etag: out.e_tag().map(strip_quotes).unwrap_or_default(),
                token: out
                    .metadata()
                    .and_then(|m| m.get(TOKEN_METADATA_KEY))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0),
            }),
            Err(e) if status_of(&e) == Some(404) => Ok(Known::Absent),
            Err(e) => Err(sdk_error(e)),
        }
    }
}

/// Writes `Content-Length: 0` on a PUT or POST without a body: the SDK
/// leaves it to the connection, which sends none for the streamed body it
/// gets, and Ceph RGW answers 411 MissingContentLength to such an
/// UploadPartCopy.
#[derive(Debug)]
struct EmptyBodyLength;

impl aws_smithy_runtime_api::client::interceptors::Intercept for EmptyBodyLength {
    fn name(&self) -> &'static str {
        "fencegate::EmptyBodyLength"
    }

    fn modify_before_signing(
        &self,
        context: &mut aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextMut<'_>,
        _components: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        _cfg: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        let request = context.request_mut();
        let bodiless = matches!(request.method(), "PUT" | "POST")
            && request.body().bytes() == Some(&[])
            && request.headers().get("content-length").is_none();
        if bodiless {
            request.headers_mut().insert("content-length", "0");
        }
        Ok(())
    }
}

/// Rewrites the conditions of each write the SDK sends into the store's
/// dialect, whichever path built it (a forwarded client request or the
/// proxy's own call): `If-Match` in the spelling the store enforces, or
/// not at all where it enforces none; a copy's source conditions under the
/// names the store reads, or not at all where it reads none (the proxy
/// then checks them itself, `ops::copy`).
#[derive(Debug)]
struct Respell(Dialect);

impl aws_smithy_runtime_api::client::interceptors::Intercept for Respell {
    fn name(&self) -> &'static str {
        "fencegate::Respell"
    }

    fn modify_before_signing(
        &self,
        context: &mut aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextMut<'_>,
        _components: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        cfg: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        // Every operation a write client sends is one the proxy knows.
        let Some(op) = cfg
            .load::<aws_smithy_runtime_api::client::orchestrator::Metadata>()
            .and_then(|m| Op::parse(m.name()))
        else {
            return Ok(());
        };
        let headers = context.request_mut().headers_mut();
        if let Some(value) = headers.remove("if-match")
            && let Some(respelled) = self.0.if_match(op, &value)
        {
            headers.try_insert("if-match", respelled)?;
        }
        if matches!(op, Op::CopyObject | Op::UploadPartCopy) {
            for condition in SourceCondition::ALL {
                let Some(value) = headers.remove(SourceNames::Aws.header(condition)) else {
                    continue;
                };
                // `*` (the source exists) is what the copy checks anyway,
                // and Ceph RGW 16.2 refuses it: the proxy's own check of it
                // stands alone.
                if value.trim() == "*" {
                    continue;
                }
                if let Some((names, spelling)) = self.0.source() {
                    let value = if condition.is_etag() {
                        spelling.write(&value)
                    } else {
                        value
                    };
                    headers.try_insert(names.header(condition), value)?;
                }
            }
        }
        Ok(())
    }
}

/// The HTTP status of an SDK error, if the backend answered.
pub fn status_of<E, R: HasStatus>(e: &SdkError<E, R>) -> Option<u16> {
    e.raw_response().map(HasStatus::status)
}

/// Converts an SDK error into an S3 error for the client (5xx and transport
/// failures become retryable 503s).
pub fn sdk_error<
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: HasStatus + std::fmt::Debug + Send + Sync + 'static,
>(
    e: SdkError<E, R>,
) -> S3Error {
    let status = status_of(&e).and_then(|s| StatusCode::from_u16(s).ok());
    let code = e
        .code()
        .and_then(|c| S3ErrorCode::from_bytes(c.as_bytes()))
        .unwrap_or(S3ErrorCode::InternalError);
    let message = e
        .message()
        .map(str::to_owned)
        .unwrap_or_else(|| format!("{e}"));
    let mut err = S3Error::with_message(code, message);
    if let Some(s) = status {
        err.set_status_code(s);
    }
    // Kept: it says whether a failed write may still land (`no_answer`).
    err.set_source(Box::new(e));
    crate::errors::from_backend(err)
}

/// Anything with an HTTP status code (the SDK's raw response type).
pub trait HasStatus {
    fn status(&self) -> u16;
}

impl HasStatus for aws_smithy_runtime_api::http::Response {
    fn status(&self) -> u16 {
        self.status().as_u16()
    }
}
