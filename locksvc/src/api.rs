//! The HTTP JSON API of the lease service: routes, request decoding, and
//! JSON errors. The wire types (bodies, answers, error codes) are
//! `fencegate_lease_api`'s, shared with every client; they are re-exported
//! here.
//!
//! | method | path                         | body                                                    |
//! |--------|------------------------------|---------------------------------------------------------|
//! | POST   | `/v1/locks/{lock}/acquire`   | `{"owner", "ttl_ms"?, "wait_ms"?, "idempotency_key"?}`  |
//! | POST   | `/v1/locks/{lock}/renew`     | `{"token": "<fencing_token>", "ttl_ms"?}`               |
//! | POST   | `/v1/locks/{lock}/release`   | `{"token": "<fencing_token>"}`                          |
//! | GET    | `/v1/locks/{lock}`           |                                                         |
//! | GET    | `/health`                    |                                                         |
//! | GET    | `/metrics`                   | Prometheus text                                         |
//!
//! Every error is JSON: `{"error": {"code", "message", ...}}`. The codes and
//! their statuses are [`ErrorCode`]:
//!
//! | status | code                            | when                                                             |
//! |--------|---------------------------------|------------------------------------------------------------------|
//! | 400    | `InvalidRequest`                | bad JSON, unknown or missing field, malformed token string       |
//! | 400    | `InvalidLockName`, `InvalidOwner`, `InvalidTtl`, `InvalidWait`, `InvalidIdempotencyKey` | the field named      |
//! | 400    | `SignedTokenRequired`           | renew/release sent a plain token number (public, proves nothing) |
//! | 401    | `Unauthorized`                  | API keys are configured and none was sent, or an unknown one     |
//! | 403    | `LockNotAllowed`                | the API key's lock patterns do not match the lock (field `lock`) |
//! | 403    | `FencingTokenSignatureInvalid`  | the signed token's MAC does not verify                           |
//! | 403    | `FencingTokenWrongLock`         | a genuine signed token of another lock                           |
//! | 403    | `BrowserRequestRefused`         | a `/v1/` request with an `Origin` header (a web page sent it)    |
//! | 404    | `NotFound`                      | no such endpoint                                                 |
//! | 405    | `MethodNotAllowed`              | wrong method                                                     |
//! | 409    | `LockHeld`                      | someone else holds the lock (`holder`, `expires_at_ms`)          |
//! | 409    | `LeaseLost`                     | the token is not the live lease's (`current_token`, `current_owner`) |
//! | 413    | `BodyTooLarge`                  | body above `max_body_bytes`                                      |
//! | 415    | `UnsupportedMediaType`          | a body not declared `Content-Type: application/json`             |
//! | 421    | `HostNotAllowed`                | `Host` is not a name the service answers to (`allowed_hosts`)    |
//! | 429    | `TooManyWaiters`                | the lock's line is full, or the caller holds its share of it     |
//! | 503    | `StorageUnavailable`, `ShuttingDown` | retry                                                       |
//!
//! **Who gets a capability.** The signed token, the lease-bound S3
//! credentials (everything in a [`LeaseResponse`]) are proofs of holding
//! (design rule 7), so a `LeaseResponse` goes only to the client that holds
//! the lease: the acquire that was granted it (also when it waited in line:
//! the grant answers that request and no other), a re-acquire that presents
//! the first acquire's `idempotency_key`, and a renewal that presents the
//! signed token. Refusals carry numbers and names only.
//!
//! **Who is refused before any of that** (`browser`): a request whose
//! `Host` the service does not answer to (every path but `/health`), and on
//! `/v1/` one with an `Origin` or a body not declared JSON, so that a web
//! page cannot take a lease (DNS rebinding, CSRF). The Host rule runs
//! first; the `/v1/` rule after authentication.

use crate::auth::{Caller, Keyring};
use crate::backend::Leases;
use crate::browser::{self, AllowedHosts, Refusal};
use crate::config::LocksvcConfig;
use crate::leases::{Acquire, EngineError, LockStatus};
use crate::metrics::Metrics;
use crate::proof::{self, HeldToken, IdempotencyKey, ProofError};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use fencegate_core::FencingToken;
use fencegate_core::line::{LineFull, Party};
use fencegate_core::{Lease, LockName, TokenKeys};
pub use fencegate_lease_api::{
    AcquireRequest, ErrorBody, ErrorCode, ErrorResponse, LeaseResponse, LockStatusResponse,
    ReleaseRequest, ReleaseResponse, RenewRequest,
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

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
    engine: Leases,
    metrics: Arc<Metrics>,
    keys: TokenKeys,
    api_keys: Keyring,
    hosts: AllowedHosts,
}

impl AppState {
    /// Validates `config` and builds the handlers' state.
    pub fn new(
        config: LocksvcConfig,
        engine: Leases,
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
        // The first signing key keys the API keys' parties: the same on
        // every replica, and secret (see `auth`).
        let secret = config
            .signing_keys
            .first()
            .map(|k| k.as_bytes().to_vec())
            .unwrap_or_default();
        let api_keys = Keyring::new(&config.api_keys, &secret)?;
        let hosts = AllowedHosts::new(&config.allowed_hosts).map_err(anyhow::Error::msg)?;
        Ok(AppState {
            inner: Arc::new(Inner {
                config,
                engine,
                metrics,
                keys,
                api_keys,
                hosts,
            }),
        })
    }
}

/// The router with every route, auth, the browser rules, and the body
/// limit.
pub fn router(state: AppState) -> Router {
    let rules = Arc::new(browser::Rules {
        hosts: state.inner.hosts.clone(),
        metrics: state.inner.metrics.clone(),
    });
    let api = Router::new()
        .route("/v1/locks/{lock}/acquire", post(acquire))
        .route("/v1/locks/{lock}/renew", post(renew))
        .route("/v1/locks/{lock}/release", post(release))
        .route("/v1/locks/{lock}", get(status))
        // Inside `authenticate` (added after it, so it runs first): a
        // request without a valid key is told so, whatever its shape.
        .route_layer(middleware::from_fn_with_state(
            rules.clone(),
            browser::shape_rule,
        ))
        .route("/", get(page))
        .route_layer(middleware::from_fn_with_state(state.clone(), authenticate));
    Router::new()
        .merge(api)
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.inner.config.max_body_bytes))
        // Outermost: an unknown host gets nothing else, not even a 404.
        .layer(middleware::from_fn_with_state(rules, browser::host_rule))
        .with_state(state)
}

/// A JSON error: the wire's [`ErrorBody`] (a code, which knows its status,
/// a message saying what to do, and the facts it may carry).
#[derive(Debug)]
pub struct ApiError {
    /// Boxed: errors are the rare path, and every `Result` carries one.
    body: Box<ErrorBody>,
}

impl ApiError {
    fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError {
            body: Box::new(ErrorBody::new(code, message)),
        }
    }

    /// The same error with more facts set.
    fn with(mut self, set: impl FnOnce(&mut ErrorBody)) -> ApiError {
        set(&mut self.body);
        self
    }

    pub fn code(&self) -> ErrorCode {
        self.body.code
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = self.body.code;
        let status =
            StatusCode::from_u16(code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (status, axum::Json(ErrorResponse { error: *self.body })).into_response();
        if code == ErrorCode::Unauthorized {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        resp
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> ApiError {
        match e {
            EngineError::Held { holder } => ApiError::new(
                ErrorCode::LockHeld,
                format!(
                    "lock {} is held by {:?}; retry after it expires or pass wait_ms",
                    holder.lock, holder.owner
                ),
            )
            .with(|e| {
                e.holder = Some(holder.owner);
                e.expires_at_ms = Some(holder.expires_at.as_millis());
            }),
            EngineError::NotHolder { current } => {
                let mut err = ApiError::new(
                    ErrorCode::LeaseLost,
                    "no live lease on this lock holds that token: it expired, was released, or was taken over; acquire again for a new token",
                );
                if let Some(c) = current {
                    err = err.with(|e| {
                        e.current_token = Some(c.token);
                        e.current_owner = Some(c.owner);
                    });
                }
                err
            }
            EngineError::TooManyWaiters(LineFull::Line { max }) => ApiError::new(
                ErrorCode::TooManyWaiters,
                format!(
                    "{max} clients already wait for this lock (max_waiters_per_lock); retry later"
                ),
            ),
            EngineError::TooManyWaiters(LineFull::Share { share }) => ApiError::new(
                ErrorCode::TooManyWaiters,
                format!(
                    "this caller already has {share} acquires waiting for this lock, its share of the line (a quarter of max_waiters_per_lock); retry when one of them is answered. A caller is its API key, or without API keys its address"
                ),
            ),
            EngineError::InLine { waiting } => ApiError::new(
                ErrorCode::LockHeld,
                format!(
                    "the lock is free, but {waiting} acquires wait in line for it and go first; pass wait_ms to join the line"
                ),
            )
            .with(|e| e.waiting = Some(waiting)),
            EngineError::Storage(e) => ApiError::new(
                ErrorCode::StorageUnavailable,
                format!(
                    "the lease store did not confirm the change ({e}); retry (an acquire retried with the same idempotency_key gets its lease back if it was granted)"
                ),
            ),
            EngineError::Stopped => ApiError::new(
                ErrorCode::ShuttingDown,
                "the lease service is shutting down; retry",
            ),
        }
    }
}

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> ApiError {
        match r {
            Refusal::Host { host } => ApiError::new(
                ErrorCode::HostNotAllowed,
                format!(
                    "this lease service does not answer to host {host:?}: reach it by an IP address or localhost, or add the name to allowed_hosts in its configuration (FENCEGATE_LOCKSVC_ALLOWED_HOSTS). Unknown names are refused because a web page can reach the service under a name it controls (DNS rebinding)"
                ),
            ),
            Refusal::AmbiguousHost => ApiError::new(
                ErrorCode::HostNotAllowed,
                "send exactly one Host header, naming a host this lease service answers to",
            ),
            Refusal::Origin { origin } => ApiError::new(
                ErrorCode::BrowserRequestRefused,
                format!(
                    "this request carries Origin: {origin}, which web browsers send and API clients do not: the lease API does not serve web pages. Call it from a program (fencegate lease, fencegate run, or an HTTP client that sends no Origin header)"
                ),
            ),
            Refusal::ContentType { found } => ApiError::new(
                ErrorCode::UnsupportedMediaType,
                format!(
                    "send the request body as JSON with Content-Type: application/json ({})",
                    match found {
                        Some(t) => format!("this one is {t:?}"),
                        None => "this one has no Content-Type".to_owned(),
                    }
                ),
            ),
        }
    }
}

impl IntoResponse for browser::Refused {
    fn into_response(self) -> Response {
        ApiError::from(self.0).into_response()
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
                    ErrorCode::BodyTooLarge,
                    "request body is larger than max_body_bytes",
                )
            } else {
                ApiError::new(
                    ErrorCode::InvalidRequest,
                    format!("cannot read body: {rej}"),
                )
            }
        })?;
        parse_object(&bytes)
            .map(JsonBody)
            .map_err(|e| ApiError::new(ErrorCode::InvalidRequest, e))
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

/// The owner check of acquire: 1 to [`MAX_OWNER_LEN`] bytes, no control
/// characters.
fn owner_is_valid(owner: &str) -> bool {
    !(owner.is_empty() || owner.len() > MAX_OWNER_LEN || owner.chars().any(char::is_control))
}

fn owner_error() -> ApiError {
    ApiError::new(
        ErrorCode::InvalidOwner,
        format!("owner must be 1 to {MAX_OWNER_LEN} bytes without control characters"),
    )
}

/// Which request body [`decode_request`] decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    Acquire,
    Renew,
    Release,
}

/// A request body as the handlers see it after decoding and the checks that
/// do not depend on the configuration (TTL and wait bounds do) or on the
/// signing keys (the token's MAC does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodedRequest {
    Acquire {
        owner: String,
        ttl_ms: Option<u64>,
        wait_ms: Option<u64>,
        idempotency_key: Option<String>,
    },
    Renew {
        token: FencingToken,
        ttl_ms: Option<u64>,
    },
    Release {
        token: FencingToken,
    },
}

/// The checks of an acquire body that need no configuration.
fn check_acquire(req: &AcquireRequest) -> Result<Option<IdempotencyKey>, ApiError> {
    if !owner_is_valid(&req.owner) {
        return Err(owner_error());
    }
    req.idempotency_key
        .clone()
        .map(IdempotencyKey::new)
        .transpose()
        .map_err(|e| ApiError::new(ErrorCode::InvalidIdempotencyKey, e))
}

/// Decodes a request body exactly as the handlers do (same serde structs,
/// same owner and idempotency-key checks), without HTTP: for fuzzing and
/// property tests. The error is `"<code>: <message>"` with the code the API
/// would answer.
pub fn decode_request(kind: RequestKind, body: &[u8]) -> Result<DecodedRequest, String> {
    fn json<T: DeserializeOwned>(body: &[u8]) -> Result<T, String> {
        parse_object(body).map_err(|e| format!("InvalidRequest: {e}"))
    }
    let api = |e: ApiError| format!("{}: {}", e.body.code.as_str(), e.body.message);
    match kind {
        RequestKind::Acquire => {
            let req: AcquireRequest = json(body)?;
            check_acquire(&req).map_err(api)?;
            Ok(DecodedRequest::Acquire {
                owner: req.owner,
                ttl_ms: req.ttl_ms,
                wait_ms: req.wait_ms,
                idempotency_key: req.idempotency_key,
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

/// Who the caller is in a lock's line ([`Caller::party`]): its API key,
/// or without keys the address its connection comes from.
#[derive(Debug, Clone)]
pub struct WaiterParty(pub Party);

impl<S: Send + Sync> FromRequestParts<S> for WaiterParty {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let peer = parts
            .extensions
            .get::<fencegate_net::PeerAddr>()
            .map(|p| p.0);
        let party = match parts.extensions.get::<Caller>() {
            Some(caller) => caller.party(peer),
            None => crate::auth::peer_party(peer),
        };
        Ok(WaiterParty(party))
    }
}

/// The `{lock}` of the path, valid, and within the caller's API-key scope.
/// Handlers get their lock only through this, so no endpoint can forget the
/// scope check.
#[derive(Debug, Clone)]
pub struct AllowedLock(LockName);

impl FromRequestParts<AppState> for AllowedLock {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::new(ErrorCode::InvalidLockName, e.body_text()))?;
        let lock = LockName::new(&raw)
            .map_err(|e| ApiError::new(ErrorCode::InvalidLockName, e.to_string()))?;
        // `authenticate` puts the caller there; without it, refuse rather
        // than assume an open service.
        let allowed = parts
            .extensions
            .get::<Caller>()
            .is_some_and(|caller| caller.allows(&lock));
        if !allowed {
            state.inner.metrics.refused("lock_not_allowed");
            return Err(ApiError::new(
                ErrorCode::LockNotAllowed,
                format!(
                    "this API key is not allowed to use lock {lock:?}: its locks (api_keys in the lease service's configuration) do not match it; use the key issued for this lock"
                ),
            )
            .with(|e| e.lock = Some(lock.to_string())));
        }
        Ok(AllowedLock(lock))
    }
}

impl Inner {
    fn ttl(&self, ttl_ms: Option<u64>) -> Result<Duration, ApiError> {
        let c = &self.config;
        let ttl = ttl_ms.map_or(c.default_ttl, Duration::from_millis);
        if ttl < c.min_ttl || ttl > c.max_ttl {
            return Err(ApiError::new(
                ErrorCode::InvalidTtl,
                format!(
                    "ttl_ms must be between {} and {}",
                    c.min_ttl.as_millis(),
                    c.max_ttl.as_millis()
                ),
            ));
        }
        Ok(ttl)
    }

    /// The proof renew and release need: a genuine signed token of `lock`.
    fn prove(&self, token: &FencingToken, lock: &LockName) -> Result<HeldToken, ApiError> {
        proof::verify(&self.keys, token, lock).map_err(|e| match e {
            ProofError::Plain(n) => {
                self.metrics.refused("plain_token");
                ApiError::new(
                    ErrorCode::SignedTokenRequired,
                    format!(
                        "token {n} is a plain number, which anyone can read (lock status and LeaseLost answers show it), so it proves nothing: send as token the fencing_token string (fgt1:...) your acquire returned"
                    ),
                )
            }
            ProofError::BadSignature => {
                self.metrics.refused("bad_signature");
                ApiError::new(
                    ErrorCode::FencingTokenSignatureInvalid,
                    "the token's signature does not verify with this lease service's keys: send the fencing_token your acquire returned, unchanged",
                )
            }
            ProofError::WrongLock { expected, found } => {
                self.metrics.refused("wrong_lock");
                ApiError::new(
                    ErrorCode::FencingTokenWrongLock,
                    format!(
                        "the token was issued for lock {found:?}, not {expected:?}: send the fencing_token of this lock's lease"
                    ),
                )
                .with(|e| e.token_lock = Some(found.to_string()))
            }
        })
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
            // The core sets the expiry to exactly the grant's or renewal's
            // `now + ttl`, so this is the TTL in force.
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            expires_at_ms: lease.expires_at.as_millis(),
            remaining_ms: Some(
                lease
                    .expires_at
                    .as_millis()
                    .saturating_sub(crate::clock::now().as_millis()),
            ),
        }
    }
}

async fn acquire(
    State(state): State<AppState>,
    AllowedLock(lock): AllowedLock,
    WaiterParty(party): WaiterParty,
    JsonBody(req): JsonBody<AcquireRequest>,
) -> Result<axum::Json<LeaseResponse>, ApiError> {
    let s = &state.inner;
    let key = check_acquire(&req)?;
    let ttl = s.ttl(req.ttl_ms)?;
    let wait = Duration::from_millis(req.wait_ms.unwrap_or(0));
    if wait > s.config.max_wait {
        return Err(ApiError::new(
            ErrorCode::InvalidWait,
            format!("wait_ms must be at most {}", s.config.max_wait.as_millis()),
        ));
    }
    let result = s
        .engine
        .acquire(Acquire {
            lock,
            owner: req.owner.clone(),
            key: key.map(|k| k.digest()),
            ttl,
            wait,
            party,
        })
        .await;
    match result {
        Ok(lease) => Ok(axum::Json(s.response(lease, ttl))),
        Err(EngineError::Held { holder }) if holder.owner == req.owner => {
            // Names are public, so a name proves nothing; say how the real
            // holder gets its lease back.
            let mut err = ApiError::from(EngineError::Held { holder });
            err.body.message.push_str(
                ". An acquire gets a live lease back only with the idempotency_key sent with the acquire that took it; without it, wait for the lease to end",
            );
            Err(err)
        }
        Err(e) => Err(e.into()),
    }
}

async fn renew(
    State(state): State<AppState>,
    AllowedLock(lock): AllowedLock,
    JsonBody(req): JsonBody<RenewRequest>,
) -> Result<axum::Json<LeaseResponse>, ApiError> {
    let s = &state.inner;
    let ttl = s.ttl(req.ttl_ms)?;
    let held = s.prove(&req.token, &lock)?;
    let lease = s.engine.renew(held, ttl).await?;
    Ok(axum::Json(s.response(lease, ttl)))
}

async fn release(
    State(state): State<AppState>,
    AllowedLock(lock): AllowedLock,
    JsonBody(req): JsonBody<ReleaseRequest>,
) -> Result<axum::Json<ReleaseResponse>, ApiError> {
    let s = &state.inner;
    let held = s.prove(&req.token, &lock)?;
    s.engine.release(held).await?;
    Ok(axum::Json(ReleaseResponse {
        lock: lock.to_string(),
        released: true,
    }))
}

async fn status(
    State(state): State<AppState>,
    AllowedLock(lock): AllowedLock,
) -> Result<axum::Json<LockStatusResponse>, ApiError> {
    let LockStatus {
        lease,
        last_token,
        waiting,
    } = state.inner.engine.status(lock.clone()).await?;
    Ok(axum::Json(LockStatusResponse {
        lock: lock.to_string(),
        held: lease.is_some(),
        owner: lease.as_ref().map(|l| l.owner.clone()),
        token: lease.as_ref().map(|l| l.token),
        expires_at_ms: lease.as_ref().map(|l| l.expires_at.as_millis()),
        waiting,
        last_token,
    }))
}

/// Locks the status page shows at most.
const PAGE_LOCKS: usize = 500;

/// The status page: the locks the caller may inspect, each with its
/// holder, token, expiry (counting down) and waiters.
async fn page(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> Result<Response, ApiError> {
    let listed = state
        .inner
        .engine
        .list(PAGE_LOCKS, move |lock| caller.allows(lock))
        .await?;
    let html = crate::page::render(&listed, state.inner.engine.kind(), PAGE_LOCKS);
    let mut resp = html.into_string().into_response();
    for (name, value) in fencegate_page::HEADERS {
        resp.headers_mut()
            .insert(name.clone(), header::HeaderValue::from_static(value));
    }
    Ok(resp)
}

async fn health() -> axum::Json<Value> {
    axum::Json(json!({ "status": "ok" }))
}

/// Readiness: whether the service can grant now (its last commit
/// succeeded and its database file is still there). What a load balancer
/// or a Kubernetes readiness probe should watch; `/health` is liveness.
async fn ready(State(state): State<AppState>) -> Response {
    let inner = &state.inner;
    let problem = inner.engine.readiness_problem().or_else(|| {
        (matches!(inner.engine, Leases::Sqlite(_)) && !inner.config.db.exists()).then(|| {
            format!(
                "the lease database {} is gone: the next commit will fail",
                inner.config.db.display()
            )
        })
    });
    match problem {
        None => axum::Json(json!({ "status": "ready" })).into_response(),
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({ "status": "not ready", "reason": why })),
        )
            .into_response(),
    }
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
        ErrorCode::NotFound,
        "no such endpoint; see /v1/locks/{lock}/acquire|renew|release and GET /v1/locks/{lock}",
    )
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        ErrorCode::MethodNotAllowed,
        "wrong method: acquire, renew and release take POST; lock status takes GET",
    )
}

/// Checks `Authorization: Bearer <key>` when API keys are configured, and
/// records who the caller is (and so which locks it may use) for
/// [`AllowedLock`].
async fn authenticate(
    State(state): State<AppState>,
    headers: HeaderMap,
    mut req: Request,
    next: Next,
) -> Response {
    let ring = &state.inner.api_keys;
    let page = req.uri().path() == "/" && req.method() == axum::http::Method::GET;
    let caller = if ring.is_empty() {
        Some(Caller::Open)
    } else {
        headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .map(str::to_owned)
            // A browser (the status page) sends the key as a Basic
            // password; the user name is not checked. Only for the page:
            // a browser sends saved Basic credentials with any request to
            // the host, also one a hostile site makes it send (an acquire),
            // so the API itself takes Bearer only.
            .or_else(|| {
                page.then(|| fencegate_page::basic_credentials(&headers))
                    .flatten()
                    .map(|(_, key)| key)
            })
            .and_then(|presented| ring.identify(&presented))
    };
    match caller {
        Some(caller) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        None => {
            state.inner.metrics.refused("unauthorized");
            let mut resp = ApiError::new(
                ErrorCode::Unauthorized,
                if page {
                    "missing or invalid API key: sign in with the API key as the password"
                } else {
                    "missing or invalid API key: send Authorization: Bearer <key>"
                },
            )
            .into_response();
            if page {
                resp.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    header::HeaderValue::from_static(fencegate_page::CHALLENGE),
                );
            }
            resp
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt as _;

    /// The router over a real engine in `dir`, configured by `config`.
    fn app(dir: &std::path::Path, config: LocksvcConfig) -> (Router, crate::engine::Engine) {
        let metrics = Arc::new(Metrics::new());
        let store = crate::store::Store::open(
            &dir.join("locksvc.db"),
            fencegate_durable::Opening::CreateIfMissing,
            0,
        )
        .expect("store");
        let engine = crate::engine::Engine::start(
            store,
            metrics.clone(),
            8,
            std::time::Duration::from_secs(10),
        )
        .expect("engine");
        let state = AppState::new(config, Leases::Sqlite(engine.handle()), metrics).expect("state");
        (router(state), engine)
    }

    fn config() -> LocksvcConfig {
        LocksvcConfig {
            signing_keys: vec!["0123456789abcdef-api".into()],
            ..LocksvcConfig::default()
        }
    }

    /// Sends `method path` with `headers` and `body`; status and JSON.
    async fn send(
        app: &Router,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (u16, Value) {
        let mut req = axum::http::Request::builder().method(method).uri(path);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .body(axum::body::Body::from(body.to_owned()))
            .expect("request");
        let resp = app.clone().oneshot(req).await.expect("answered");
        let status = resp.status().as_u16();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .expect("body");
        let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, v)
    }

    const LOCAL: (&str, &str) = ("host", "127.0.0.1:7070");
    const JSON: (&str, &str) = ("content-type", "application/json");
    const ACQUIRE: &str = r#"{"owner":"a-page","ttl_ms":60000}"#;

    #[tokio::test]
    async fn a_web_page_takes_no_lease_and_an_api_client_does() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (app, engine) = app(dir.path(), config());
        let path = "/v1/locks/db/acquire";
        // What a rebound page sends: its own name, its own origin, a body
        // it may send without asking (text/plain). The name is refused
        // first, then each browser trait on its own.
        let page = [
            ("host", "attacker.example"),
            ("origin", "http://attacker.example"),
            ("content-type", "text/plain;charset=UTF-8"),
        ];
        let (s, v) = send(&app, "POST", path, &page, ACQUIRE).await;
        assert_eq!(
            (s, &v["error"]["code"]),
            (421, &json!("HostNotAllowed")),
            "{v}"
        );
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("allowed_hosts"))
        );
        for (headers, status, code, fix) in [
            (
                vec![LOCAL, ("content-type", "text/plain")],
                415,
                "UnsupportedMediaType",
                "Content-Type: application/json",
            ),
            (vec![LOCAL], 415, "UnsupportedMediaType", "no Content-Type"),
            (
                vec![LOCAL, JSON, ("origin", "http://attacker.example")],
                403,
                "BrowserRequestRefused",
                "Origin",
            ),
        ] {
            let (s, v) = send(&app, "POST", path, &headers, ACQUIRE).await;
            assert_eq!(
                (s, v["error"]["code"].as_str()),
                (status, Some(code)),
                "{headers:?}: {v}"
            );
            let message = v["error"]["message"].as_str().expect("message");
            assert!(message.contains(fix), "{headers:?}: {message}");
        }
        // The page, the status and the metrics answer no unknown name
        // either; /health answers any.
        for path in ["/", "/v1/locks/db", "/metrics", "/nowhere"] {
            let (s, v) = send(&app, "GET", path, &[("host", "attacker.example")], "").await;
            assert_eq!(
                (s, v["error"]["code"].as_str()),
                (421, Some("HostNotAllowed")),
                "{path}"
            );
        }
        let (s, _) = send(&app, "GET", "/health", &[("host", "attacker.example")], "").await;
        assert_eq!(s, 200);
        // Nothing above took the lock.
        let (s, st) = send(&app, "GET", "/v1/locks/db", &[LOCAL], "").await;
        assert_eq!((s, &st["held"]), (200, &json!(false)), "{st}");

        // What the project's clients send (reqwest's .json(): the type, no
        // Origin), with or without a charset, with or without Host.
        let (s, lease) = send(&app, "POST", path, &[LOCAL, JSON], ACQUIRE).await;
        assert_eq!(s, 200, "{lease}");
        let renew = json!({"token": lease["fencing_token"], "ttl_ms": 60000}).to_string();
        let typed = ("content-type", "application/json; charset=utf-8");
        let (s, v) = send(&app, "POST", "/v1/locks/db/renew", &[typed], &renew).await;
        assert_eq!(s, 200, "{v}");
        // A POST with neither body nor type is told which body it lacks;
        // a wrong method is still a 405.
        let (s, v) = send(&app, "POST", path, &[LOCAL], "").await;
        assert_refusal((s, &v), 400, "InvalidRequest");
        let (s, v) = send(&app, "POST", "/v1/locks/db", &[LOCAL], "").await;
        assert_refusal((s, &v), 405, "MethodNotAllowed");
        drop(app);
        engine.stop();
    }

    /// Fails unless the answer `(status, body)` is a refusal with
    /// `status` and the error `code`.
    #[track_caller]
    fn assert_refusal((s, v): (u16, &serde_json::Value), status: u16, code: &str) {
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (status, Some(code)),
            "{v}"
        );
    }

    #[tokio::test]
    async fn allowed_hosts_add_names_and_keys_are_checked_before_the_shape() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (app, engine) = app(
            dir.path(),
            LocksvcConfig {
                allowed_hosts: vec!["Locks.Internal".into(), "*.svc.cluster.local".into()],
                api_keys: vec![crate::config::ApiKey::every_lock("admin-key-123")],
                ..config()
            },
        );
        let bearer = ("authorization", "Bearer admin-key-123");
        for host in [
            "locks.internal:7070",
            "locksvc.ns.svc.cluster.local",
            "[::1]:1",
        ] {
            let (s, v) = send(&app, "GET", "/v1/locks/db", &[("host", host), bearer], "").await;
            assert_eq!(s, 200, "{host}: {v}");
        }
        let (s, _) = send(
            &app,
            "GET",
            "/v1/locks/db",
            &[("host", "other.internal"), bearer],
            "",
        )
        .await;
        assert_eq!(s, 421);
        // Without the key, a browser-shaped request is first of all not
        // authenticated (a site cannot send a Bearer key without asking).
        let form = [LOCAL, ("content-type", "application/x-www-form-urlencoded")];
        let (s, v) = send(&app, "POST", "/v1/locks/db/acquire", &form, ACQUIRE).await;
        assert_refusal((s, &v), 401, "Unauthorized");
        let keyed = [
            LOCAL,
            bearer,
            ("content-type", "application/x-www-form-urlencoded"),
        ];
        let (s, v) = send(&app, "POST", "/v1/locks/db/acquire", &keyed, ACQUIRE).await;
        assert_refusal((s, &v), 415, "UnsupportedMediaType");
        drop(app);
        engine.stop();
    }

    #[test]
    fn wire_types_round_trip_and_plain_tokens_decode_for_a_precise_refusal() {
        let keys = TokenKeys::new(vec![b"0123456789abcdef-api".to_vec()]).expect("keys");
        let signed = keys.sign(&LockName::new("db").expect("lock"), 3);
        let renew = RenewRequest {
            token: FencingToken::Signed(signed.clone()),
            ttl_ms: Some(500),
        };
        let text = serde_json::to_string(&renew).expect("serializes");
        assert_eq!(text, format!(r#"{{"token":"{signed}","ttl_ms":500}}"#));
        assert_eq!(
            serde_json::from_str::<RenewRequest>(&text).expect("decodes"),
            renew
        );
        for plain in [r#"{"token":3}"#, r#"{"token":"3"}"#] {
            assert_eq!(
                serde_json::from_str::<ReleaseRequest>(plain)
                    .expect("decodes")
                    .token,
                FencingToken::Plain(3)
            );
        }
        let acquire = AcquireRequest {
            owner: "a".into(),
            ttl_ms: None,
            wait_ms: None,
            idempotency_key: Some("secret-secret-secret".into()),
        };
        assert!(!format!("{acquire:?}").contains("secret-secret"));
        assert_eq!(
            serde_json::to_string(&acquire).expect("serializes"),
            r#"{"owner":"a","idempotency_key":"secret-secret-secret"}"#
        );
    }

    #[test]
    fn every_code_has_the_documented_status() {
        use ErrorCode::*;
        for (code, status) in [
            (SignedTokenRequired, 400),
            (InvalidIdempotencyKey, 400),
            (Unauthorized, 401),
            (LockNotAllowed, 403),
            (FencingTokenSignatureInvalid, 403),
            (FencingTokenWrongLock, 403),
            (LockHeld, 409),
            (LeaseLost, 409),
            (BrowserRequestRefused, 403),
            (UnsupportedMediaType, 415),
            (HostNotAllowed, 421),
            (TooManyWaiters, 429),
        ] {
            assert_eq!(code.status(), status, "{}", code.as_str());
        }
    }
}
