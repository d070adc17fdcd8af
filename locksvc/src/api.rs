//! The HTTP JSON API of the lease service.
//!
//! | method | path                         | body                                  |
//! |--------|------------------------------|---------------------------------------|
//! | POST   | `/v1/locks/{lock}/acquire`   | `{"owner", "ttl_ms"?, "wait_ms"?}`    |
//! | POST   | `/v1/locks/{lock}/renew`     | `{"token", "ttl_ms"?}`                |
//! | POST   | `/v1/locks/{lock}/release`   | `{"token"}`                           |
//! | GET    | `/v1/locks/{lock}`           |                                       |
//! | GET    | `/health`                    |                                       |
//! | GET    | `/metrics`                   | Prometheus text                       |
//!
//! Every error is JSON: `{"error": {"code", "message", ...}}` with a 4xx
//! status for the client's mistakes and 503 when the database cannot commit.

use crate::config::LocksvcConfig;
use crate::engine::{EngineError, EngineHandle, LockStatus};
use crate::metrics::Metrics;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use fencegate_core::{Lease, LockName, TokenKeys};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use subtle::ConstantTimeEq;

/// Longest owner identifier accepted.
pub const MAX_OWNER_LEN: usize = 256;

/// Shared state of every handler.
#[derive(Debug, Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: LocksvcConfig,
    engine: EngineHandle,
    metrics: Arc<Metrics>,
    keys: TokenKeys,
}

impl AppState {
    /// Validates `config` and builds the handlers' state.
    pub fn new(
        config: LocksvcConfig,
        engine: EngineHandle,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<AppState> {
        let config = config.validated()?;
        let keys = TokenKeys::new(
            config
                .signing_keys
                .iter()
                .map(|k| k.as_bytes().to_vec())
                .collect(),
        )
        .ok_or_else(|| anyhow::anyhow!("signing_keys are invalid"))?;
        Ok(AppState {
            inner: Arc::new(Inner {
                config,
                engine,
                metrics,
                keys,
            }),
        })
    }
}

/// The router with every route, auth, and the body limit.
pub fn router(state: AppState) -> Router {
    let api = Router::new()
        .route("/v1/locks/{lock}/acquire", post(acquire))
        .route("/v1/locks/{lock}/renew", post(renew))
        .route("/v1/locks/{lock}/release", post(release))
        .route("/v1/locks/{lock}", get(status))
        .route_layer(middleware::from_fn_with_state(state.clone(), authenticate));
    Router::new()
        .merge(api)
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.inner.config.max_body_bytes))
        .with_state(state)
}

/// A JSON error with an HTTP status and a stable code.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    extra: serde_json::Map<String, Value>,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            extra: serde_json::Map::new(),
        }
    }

    fn bad_request(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }

    fn with(mut self, key: &str, value: impl Into<Value>) -> ApiError {
        self.extra.insert(key.to_owned(), value.into());
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = serde_json::Map::new();
        body.insert("code".into(), self.code.into());
        body.insert("message".into(), self.message.into());
        body.extend(self.extra);
        (self.status, axum::Json(json!({ "error": body }))).into_response()
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> ApiError {
        match e {
            EngineError::Held { holder } => ApiError::new(
                StatusCode::CONFLICT,
                "LockHeld",
                format!(
                    "lock {} is held by {:?}; retry after it expires or pass wait_ms",
                    holder.lock, holder.owner
                ),
            )
            .with("holder", holder.owner)
            .with("expires_at_ms", holder.expires_at.as_millis()),
            EngineError::NotHolder { current } => {
                let mut err = ApiError::new(
                    StatusCode::CONFLICT,
                    "LeaseLost",
                    "no live lease on this lock holds that token: it expired, was released, or was taken over; acquire again for a new token",
                );
                if let Some(c) = current {
                    err = err
                        .with("current_token", c.token)
                        .with("current_owner", c.owner);
                }
                err
            }
            EngineError::TooManyWaiters => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "TooManyWaiters",
                "too many clients are already waiting for this lock; retry later",
            ),
            EngineError::Storage(e) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "StorageUnavailable",
                format!("the lease database could not commit ({e}); nothing was granted, retry"),
            ),
            EngineError::Stopped => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "ShuttingDown",
                "the lease service is shutting down; retry",
            ),
        }
    }
}

/// A JSON body that rejects with [`ApiError`]: bad JSON, unknown fields and
/// oversized bodies all get a JSON error that says what to fix.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|rej| {
            if rej.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "BodyTooLarge",
                    "request body is larger than max_body_bytes",
                )
            } else {
                ApiError::bad_request("InvalidRequest", format!("cannot read body: {rej}"))
            }
        })?;
        parse_object(&bytes)
            .map(JsonBody)
            .map_err(|e| ApiError::bad_request("InvalidRequest", e))
    }
}

/// Decodes a request body: a JSON object with exactly the documented
/// fields (serde would also take a positional array; the API does not).
fn parse_object<T: DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err("request body must be a JSON object".into());
    }
    serde_json::from_slice(body).map_err(|e| format!("request body is not valid: {e}"))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AcquireRequest {
    owner: String,
    ttl_ms: Option<u64>,
    wait_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RenewRequest {
    #[serde(deserialize_with = "token_field")]
    token: u64,
    ttl_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseRequest {
    #[serde(deserialize_with = "token_field")]
    token: u64,
}

/// The `token` of renew and release: the number, or either string the
/// service handed out (the signed `fencing_token`, or the number written as
/// a string), so a client can send back what it holds.
fn token_field<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    struct TokenVisitor;
    impl serde::de::Visitor<'_> for TokenVisitor {
        type Value = u64;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a token: the number, or the fencing_token string")
        }
        fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<u64, E> {
            Ok(n)
        }
        fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<u64, E> {
            fencegate_core::FencingToken::parse(s)
                .map(|t| t.number())
                .map_err(|e| E::custom(format!("token {s:?}: {e}")))
        }
    }
    d.deserialize_any(TokenVisitor)
}

/// The owner check of acquire: 1 to [`MAX_OWNER_LEN`] bytes, no control
/// characters.
fn owner_is_valid(owner: &str) -> bool {
    !(owner.is_empty() || owner.len() > MAX_OWNER_LEN || owner.chars().any(char::is_control))
}

/// Which request body [`decode_request`] decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    Acquire,
    Renew,
    Release,
}

/// A request body as the handlers see it after decoding and the checks that
/// do not depend on the configuration (TTL and wait bounds do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodedRequest {
    Acquire {
        owner: String,
        ttl_ms: Option<u64>,
        wait_ms: Option<u64>,
    },
    Renew {
        token: u64,
        ttl_ms: Option<u64>,
    },
    Release {
        token: u64,
    },
}

/// Decodes a request body exactly as the handlers do (same serde structs,
/// same owner check), without HTTP: for fuzzing and property tests. The
/// error is `"<code>: <message>"` with the code the API would answer.
pub fn decode_request(kind: RequestKind, body: &[u8]) -> Result<DecodedRequest, String> {
    fn json<T: DeserializeOwned>(body: &[u8]) -> Result<T, String> {
        parse_object(body).map_err(|e| format!("InvalidRequest: {e}"))
    }
    match kind {
        RequestKind::Acquire => {
            let AcquireRequest {
                owner,
                ttl_ms,
                wait_ms,
            } = json(body)?;
            if !owner_is_valid(&owner) {
                return Err(format!(
                    "InvalidOwner: owner must be 1 to {MAX_OWNER_LEN} bytes without control characters"
                ));
            }
            Ok(DecodedRequest::Acquire {
                owner,
                ttl_ms,
                wait_ms,
            })
        }
        RequestKind::Renew => {
            let RenewRequest { token, ttl_ms } = json(body)?;
            Ok(DecodedRequest::Renew { token, ttl_ms })
        }
        RequestKind::Release => {
            let ReleaseRequest { token } = json(body)?;
            Ok(DecodedRequest::Release { token })
        }
    }
}

/// What acquire and renew return.
#[derive(Debug, Serialize, Deserialize, Clone, PartialEq, Eq)]
pub struct LeaseResponse {
    pub lock: String,
    pub owner: String,
    /// The numeric token.
    pub token: u64,
    /// The signed token; send it verbatim in the `Fencing-Token` header.
    pub fencing_token: String,
    /// The TTL granted, in milliseconds.
    pub ttl_ms: u64,
    /// When the lease expires, in Unix milliseconds.
    pub expires_at_ms: u64,
    /// S3 access key bound to this lease (for tools that cannot send the
    /// `Fencing-Token` header); sign with `s3_secret_access_key`.
    pub s3_access_key_id: String,
    pub s3_secret_access_key: String,
    /// When those credentials stop working, in Unix milliseconds.
    pub s3_credentials_expire_at_ms: u64,
}

fn lock_name(path: Result<Path<String>, PathRejection>) -> Result<LockName, ApiError> {
    let Path(raw) = path.map_err(|e| ApiError::bad_request("InvalidLockName", e.body_text()))?;
    LockName::new(&raw).map_err(|e| ApiError::bad_request("InvalidLockName", e.to_string()))
}

impl Inner {
    fn ttl(&self, ttl_ms: Option<u64>) -> Result<Duration, ApiError> {
        let c = &self.config;
        let ttl = ttl_ms.map_or(c.default_ttl, Duration::from_millis);
        if ttl < c.min_ttl || ttl > c.max_ttl {
            return Err(ApiError::bad_request(
                "InvalidTtl",
                format!(
                    "ttl_ms must be between {} and {}",
                    c.min_ttl.as_millis(),
                    c.max_ttl.as_millis()
                ),
            ));
        }
        Ok(ttl)
    }

    fn response(&self, lease: Lease, ttl: Duration) -> LeaseResponse {
        let now_secs = crate::clock::now().as_millis() / 1000;
        let cred_expiry = now_secs.saturating_add(self.config.credential_ttl.as_secs());
        let creds = self.keys.credentials(&lease.lock, lease.token, cred_expiry);
        LeaseResponse {
            s3_access_key_id: creds.access_key,
            s3_secret_access_key: creds.secret_key,
            s3_credentials_expire_at_ms: cred_expiry.saturating_mul(1000),
            fencing_token: self.keys.sign(&lease.lock, lease.token).to_string(),
            lock: lease.lock.to_string(),
            owner: lease.owner,
            token: lease.token,
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            expires_at_ms: lease.expires_at.as_millis(),
        }
    }
}

async fn acquire(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    JsonBody(req): JsonBody<AcquireRequest>,
) -> Result<axum::Json<LeaseResponse>, ApiError> {
    let s = &state.inner;
    let lock = lock_name(path)?;
    if !owner_is_valid(&req.owner) {
        return Err(ApiError::bad_request(
            "InvalidOwner",
            format!("owner must be 1 to {MAX_OWNER_LEN} bytes without control characters"),
        ));
    }
    let ttl = s.ttl(req.ttl_ms)?;
    let wait = Duration::from_millis(req.wait_ms.unwrap_or(0));
    if wait > s.config.max_wait {
        return Err(ApiError::bad_request(
            "InvalidWait",
            format!("wait_ms must be at most {}", s.config.max_wait.as_millis()),
        ));
    }
    let lease = s.engine.acquire(lock, req.owner, ttl, wait).await?;
    Ok(axum::Json(s.response(lease, ttl)))
}

async fn renew(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    JsonBody(req): JsonBody<RenewRequest>,
) -> Result<axum::Json<LeaseResponse>, ApiError> {
    let s = &state.inner;
    let lock = lock_name(path)?;
    let ttl = s.ttl(req.ttl_ms)?;
    let lease = s.engine.renew(lock, req.token, ttl).await?;
    Ok(axum::Json(s.response(lease, ttl)))
}

async fn release(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    JsonBody(req): JsonBody<ReleaseRequest>,
) -> Result<axum::Json<Value>, ApiError> {
    let lock = lock_name(path)?;
    state.inner.engine.release(lock.clone(), req.token).await?;
    Ok(axum::Json(
        json!({ "lock": lock.as_str(), "released": true }),
    ))
}

async fn status(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<axum::Json<Value>, ApiError> {
    let lock = lock_name(path)?;
    let LockStatus {
        lease,
        last_token,
        waiting,
    } = state.inner.engine.status(lock.clone()).await?;
    Ok(axum::Json(json!({
        "lock": lock.as_str(),
        "held": lease.is_some(),
        "owner": lease.as_ref().map(|l| l.owner.clone()),
        "token": lease.as_ref().map(|l| l.token),
        "expires_at_ms": lease.as_ref().map(|l| l.expires_at.as_millis()),
        "waiting": waiting,
        "last_token": last_token,
    })))
}

async fn health() -> axum::Json<Value> {
    axum::Json(json!({ "status": "ok" }))
}

async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.inner.metrics.encode(),
    )
        .into_response()
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "NotFound",
        "no such endpoint; see /v1/locks/{lock}/acquire|renew|release and GET /v1/locks/{lock}",
    )
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "MethodNotAllowed",
        "wrong method: acquire, renew and release take POST; lock status takes GET",
    )
}

/// Checks `Authorization: Bearer <key>` when API keys are configured.
async fn authenticate(
    State(state): State<AppState>,
    headers: HeaderMap,
    req: Request,
    next: Next,
) -> Response {
    let keys = &state.inner.config.api_keys;
    if keys.is_empty() {
        return next.run(req).await;
    }
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let ok = presented.is_some_and(|p| {
        keys.iter().fold(false, |ok, k| {
            ok | bool::from(k.as_bytes().ct_eq(p.as_bytes()))
        })
    });
    if ok {
        next.run(req).await
    } else {
        state.inner.metrics.refused("unauthorized");
        let mut resp = ApiError::new(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "missing or invalid API key: send Authorization: Bearer <key>",
        )
        .into_response();
        resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
        resp
    }
}
