//! The HTTP server: S3 on every path, operations endpoints for GET/HEAD of
//! `/_fencegate/...` in path style (no bucket can be named `_fencegate`; a
//! virtual-hosted key `_fencegate/...` is S3's), handlers that outlive their
//! connection, graceful shutdown. Connections themselves (cap, header and
//! idle timeouts, TLS) are `fencegate_net`'s.

use crate::edge::Edge;
use crate::gate::Gate;
use crate::host::VirtualHosts;
use futures::FutureExt as _;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::Service;
use s3s::service::S3Service;
use s3s::{Body, HttpError};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio_util::task::TaskTracker;

#[derive(Clone)]
struct Router {
    s3: S3Service,
    edge: Arc<Edge>,
    gate: Arc<Gate>,
    hosts: Arc<VirtualHosts>,
    viewers: Arc<crate::access::Viewers>,
    answered: Arc<fencegate_net::browser::AllowedHosts>,
    /// The log of failed requests, once a second.
    failures: Arc<parking_lot::Mutex<fencegate_durable::Throttle>>,
}

impl Router {
    /// The operations endpoint a request names, if it is one: GET or HEAD
    /// of `/_fencegate/<endpoint>` addressed path style, or POST of
    /// `/_fencegate/fence`.
    fn endpoint<'r, B>(&self, req: &'r Request<B>) -> Option<&'r str> {
        let fence = *req.method() == http::Method::POST && req.uri().path() == "/_fencegate/fence";
        if !fence && !matches!(*req.method(), http::Method::GET | http::Method::HEAD) {
            return None;
        }
        let virtual_hosted = req
            .headers()
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .is_some_and(|h| self.hosts.bucket(h).is_some());
        if virtual_hosted {
            return None;
        }
        req.uri().path().strip_prefix("/_fencegate/")
    }
}

impl hyper::service::Service<Request<Incoming>> for Router {
    type Response = Response<Body>;
    type Error = HttpError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, HttpError>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let this = self.clone();
        let remote = req
            .extensions()
            .get::<fencegate_net::PeerAddr>()
            .map(|p| p.0);
        // The handler's future is boxed before `attempt` wraps it: it is
        // the size of the deepest request path (kilobytes), and moved by
        // value into the task-local scope and then into this box it was
        // copied whole four times per request (BENCHMARKS.md, "Instructions
        // per PUT").
        Box::pin(crate::events::attempt(
            remote,
            Box::pin(async move {
                let started = Instant::now();
                // For the log line (the URI is shared, not copied).
                let (method, uri) = (req.method().clone(), req.uri().clone());
                let path = uri.path();
                if let Some(endpoint) = this.endpoint(&req) {
                    if let Err(refused) = this.browser_rules(endpoint, &req) {
                        return Ok(*refused);
                    }
                    // Boxed: the pages' futures (the acquisition fence, the
                    // status) are twice a PutObject's, and held inline
                    // they would be every request's size, copied whole.
                    return Ok(Box::pin(this.ops(endpoint, &req)).await);
                }
                // Read once, as s3s reads it (`presented`): a credential
                // that cannot be read is refused, never counted either way.
                let presented = match crate::presented::Presented::of(&req) {
                    Ok(p) => p,
                    Err(why) => {
                        return Ok(*crate::early::refuse(
                            StatusCode::BAD_REQUEST,
                            "AuthorizationHeaderMalformed",
                            &why.to_string(),
                        ));
                    }
                };
                let mut req = req;
                req.extensions_mut().insert(presented);
                // An anonymous request's only credential is where it comes
                // from: a web page's (DNS rebinding) names the page's host.
                if presented.is_anonymous()
                    && let Err(r) =
                        fencegate_net::browser::check_host(req.headers(), req.uri(), &this.answered)
                {
                    return Ok(*crate::early::refuse(
                        StatusCode::MISDIRECTED_REQUEST,
                        "HostNotAllowed",
                        &host_refusal(&r),
                    ));
                }
                let body_read =
                    match crate::early::check(&req, &this.hosts, this.gate.body_budget().max_one())
                    {
                        Ok(read) => read,
                        Err(refused) => return Ok(*refused),
                    };
                let expects_continue = req
                    .headers()
                    .get(http::header::EXPECT)
                    .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
                // The connection stays busy (no idle or header timer) until the
                // body is read, here or by the drain below.
                let polled = Arc::new(std::sync::atomic::AtomicBool::new(false));
                // A body read whole (and its share of the budget, taken by
                // `access` once the request proved it may write) gets
                // `client_idle_timeout_secs` in all, so a client trickling it
                // cannot hold either.
                let deadline = (body_read == crate::early::BodyRead::Whole)
                    .then(|| Box::pin(tokio::time::sleep(this.gate.writer.client_idle())));
                // A body read whole is checked against its integrity values
                // here: s3s checks none of them on these bodies. Its payload
                // hash too, signed or not: the check costs a few hundred
                // bytes' SHA-256 and then rests on no claim about the
                // request.
                let whole = (body_read == crate::early::BodyRead::Whole).then(|| {
                    let complete = req
                        .uri()
                        .query()
                        .is_some_and(|q| q.split('&').any(|p| p.starts_with("uploadId=")));
                    (req.headers().clone(), complete)
                });
                let mut whole_verdict = None;
                let req = fencegate_net::track_request_body(req).map(|body| {
                    let mut body = DrainOnDrop::new(body, expects_continue, polled.clone());
                    body.deadline = deadline;
                    match whole {
                        Some((headers, complete)) => {
                            let (checked, verdict) =
                                crate::trailer::check_whole(body, &headers, complete);
                            whole_verdict = Some(verdict);
                            s3s::Body::http_body_unsync(checked)
                        }
                        None => s3s::Body::http_body_unsync(body),
                    }
                });
                let call = async {
                    let declined = match this.edge.put(&this.gate, req).await {
                        Ok(resp) => return Ok(resp),
                        Err(req) => req,
                    };
                    // Boxed: s3s's future is several times the edge's, and held
                    // inline it would be every request's size, copied whole
                    // (twice) when the request starts, the edge's PutObjects
                    // too (BENCHMARKS.md, "Instructions per PUT").
                    Box::pin(this.s3.call(declined)).await
                };
                let mut resp = match AssertUnwindSafe(call).catch_unwind().await {
                    Ok(r) => r?,
                    Err(_) => {
                        tracing::error!(%method, %path, "request handler panicked");
                        json(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            r#"{"error":"internal error"}"#.into(),
                        )
                    }
                };
                if let Some(e) = whole_verdict.and_then(|v| v.failed()) {
                    resp = e.to_http_response().unwrap_or(resp);
                }
                // A client that asked for `100 Continue` and got a final answer
                // instead may still send its body (botocore does, when the
                // answer took over a second): on a reused connection those
                // bytes would be read as the next request (a 400). Close it.
                if expects_continue && !polled.load(std::sync::atomic::Ordering::Acquire) {
                    resp.headers_mut().insert(
                        http::header::CONNECTION,
                        http::HeaderValue::from_static("close"),
                    );
                }
                let status = resp.status();
                if status.is_server_error() {
                    // Once a second with a count of the rest: an outage of
                    // etcd or the lease service fails every request.
                    let ready = this.failures.lock().ready();
                    if let Some(not_logged) = ready {
                        tracing::warn!(%method, %path, %status, elapsed = ?started.elapsed(), not_logged, "request failed (and {not_logged} more since the last line)");
                    }
                } else {
                    tracing::debug!(%method, %path, %status, elapsed = ?started.elapsed(), "request");
                }
                Ok(resp)
            }),
        ))
    }
}

/// Most of an unread request body drained so its connection can be reused.
const DRAIN_LIMIT: u64 = 64 * 1024 * 1024;
/// Longest the drain of an unread request body may take.
const DRAIN_TIME: Duration = Duration::from_secs(30);

/// A request body that, dropped before its end, is read to its end in the
/// background (up to [`DRAIN_LIMIT`] bytes and [`DRAIN_TIME`]).
///
/// A write refused on its headers (a stale token) is answered before its
/// body is read. Hyper then closes the connection, and a client still
/// sending gets a broken pipe instead of the answer, or puts the closing
/// connection back in its pool and loses its next request to it. Drained,
/// the connection stays usable and the client reads its 409.
///
/// A client that sent `Expect: 100-continue` and was answered before its
/// body was asked for has sent no body: reading would make hyper send a
/// `100 Continue` after the final answer, so that body is left alone.
struct DrainOnDrop {
    inner: Option<fencegate_net::RequestBody>,
    expects_continue: bool,
    /// Set once the handler reads the body (shared with the router, which
    /// closes the connection of an unread `100-continue` body).
    polled: Arc<std::sync::atomic::AtomicBool>,
    /// For a body read whole: when it passes, the body ends where it is
    /// (the request fails to parse) and is dropped unread.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl DrainOnDrop {
    fn new(
        body: fencegate_net::RequestBody,
        expects_continue: bool,
        polled: Arc<std::sync::atomic::AtomicBool>,
    ) -> DrainOnDrop {
        DrainOnDrop {
            inner: Some(body),
            expects_continue,
            polled,
            deadline: None,
        }
    }
}

impl http_body::Body for DrainOnDrop {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, hyper::Error>>> {
        self.polled
            .store(true, std::sync::atomic::Ordering::Release);
        if let Some(deadline) = self.deadline.as_mut()
            && deadline.as_mut().poll(cx).is_ready()
        {
            // Dropped, not drained: the connection closes.
            self.inner = None;
            return std::task::Poll::Ready(None);
        }
        match self.inner.as_mut() {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => std::task::Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner
            .as_ref()
            .is_none_or(http_body::Body::is_end_stream)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner
            .as_ref()
            .map(http_body::Body::size_hint)
            .unwrap_or_default()
    }
}

impl Drop for DrainOnDrop {
    fn drop(&mut self) {
        let Some(mut body) = self.inner.take() else {
            return;
        };
        if http_body::Body::is_end_stream(&body)
            || (self.expects_continue && !self.polled.load(std::sync::atomic::Ordering::Acquire))
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            use http_body_util::BodyExt as _;
            let drain = async {
                let mut read = 0u64;
                while read <= DRAIN_LIMIT {
                    match body.frame().await {
                        Some(Ok(frame)) => {
                            read += frame.data_ref().map_or(0, |d| d.len() as u64);
                        }
                        _ => return,
                    }
                }
            };
            let _ = tokio::time::timeout(DRAIN_TIME, drain).await;
        });
    }
}

fn json(status: StatusCode, body: String) -> Response<Body> {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r.headers_mut().insert(
        http::header::X_CONTENT_TYPE_OPTIONS,
        http::HeaderValue::from_static("nosniff"),
    );
    r
}

/// What a request to a host the proxy does not answer to is told.
fn host_refusal(r: &fencegate_net::browser::Refusal) -> String {
    match r {
        fencegate_net::browser::Refusal::Host { host } => format!(
            "this proxy does not answer to the host {host:?} (a web page reaching it by DNS rebinding would send its own name): \
             address it by IP address, localhost or a virtual_host_domains name, or add the name to allowed_hosts in the proxy config"
        ),
        _ => "send exactly one Host header".to_owned(),
    }
}

impl Router {
    /// The rules that keep web pages off the operations endpoints: the
    /// Host rule on all but `health`, and no `Origin` on the fence (the
    /// one that acts).
    fn browser_rules<B>(
        &self,
        endpoint: &str,
        req: &Request<B>,
    ) -> Result<(), Box<Response<Body>>> {
        if matches!(endpoint, "health" | "ready") {
            return Ok(());
        }
        if let Err(r) = fencegate_net::browser::check_host(req.headers(), req.uri(), &self.answered)
        {
            return Err(Box::new(json(
                StatusCode::MISDIRECTED_REQUEST,
                serde_json::json!({ "code": "HostNotAllowed", "error": host_refusal(&r) })
                    .to_string(),
            )));
        }
        if endpoint == "fence" && req.headers().contains_key(http::header::ORIGIN) {
            return Err(Box::new(json(
                StatusCode::FORBIDDEN,
                serde_json::json!({
                    "code": "BrowserRequestRefused",
                    "error": "a request with an Origin header comes from a web page; fencegate run raises the fence without one",
                })
                .to_string(),
            )));
        }
        Ok(())
    }
}

/// The `lock` parameter of a request's query, as sent (a lock name needs
/// no escaping: `A-Z a-z 0-9 . _ -`).
fn lock_param(uri: &http::Uri) -> Option<String> {
    uri.query()?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| *k == "lock")
        .map(|(_, v)| v.to_owned())
}

impl Router {
    async fn ops<B>(&self, endpoint: &str, req: &Request<B>) -> Response<Body> {
        let (method, headers) = (req.method(), req.headers());
        match endpoint {
            "fence" => self.fence(method, headers, lock_param(req.uri())).await,
            "health" => json(StatusCode::OK, r#"{"status":"ok"}"#.into()),
            "ready" => match self.gate.not_ready() {
                None => json(StatusCode::OK, r#"{"status":"ready"}"#.into()),
                Some(why) => json(
                    StatusCode::SERVICE_UNAVAILABLE,
                    serde_json::json!({ "status": "not ready", "reason": why }).to_string(),
                ),
            },
            "status" => json(StatusCode::OK, self.gate.status().await.to_string()),
            "" | "events" => {
                if let Err(why) = self.viewers.admit(headers) {
                    let mut r = json(
                        StatusCode::UNAUTHORIZED,
                        serde_json::json!({ "error": why }).to_string(),
                    );
                    r.headers_mut().insert(
                        http::header::WWW_AUTHENTICATE,
                        http::HeaderValue::from_static(fencegate_page::CHALLENGE),
                    );
                    return r;
                }
                let events = self.gate.refuser.events();
                if endpoint == "events" {
                    let mut r = json(StatusCode::OK, events.to_json().to_string());
                    r.headers_mut().insert(
                        http::header::CACHE_CONTROL,
                        http::HeaderValue::from_static("no-store"),
                    );
                    return r;
                }
                let (recent, recorded) = events.recent(crate::page::EVENTS_SHOWN);
                let page = crate::page::render(
                    &self.gate.status_for_viewers().await,
                    &recent,
                    recorded,
                    events.capacity(),
                );
                let mut r = Response::new(Body::from(page.into_string()));
                for (name, value) in fencegate_page::HEADERS {
                    r.headers_mut()
                        .insert(name.clone(), http::HeaderValue::from_static(value));
                }
                r
            }
            "metrics" => {
                let mut r = Response::new(Body::from(self.gate.metrics().encode()));
                r.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
                );
                r
            }
            _ => json(
                StatusCode::NOT_FOUND,
                r#"{"error":"unknown endpoint; try /_fencegate/ (the status page), /_fencegate/health, /_fencegate/status, /_fencegate/events or /_fencegate/metrics"}"#.into(),
            ),
        }
    }

    /// `POST /_fencegate/fence` with the new holder's signed token (or, for
    /// a lock that follows an election, `?lock=NAME` and the holder's
    /// plain token): raises its lock's fence before the holder writes
    /// (`Gate::fence`: the stages composed).
    async fn fence(
        &self,
        method: &http::Method,
        headers: &http::HeaderMap,
        lock: Option<String>,
    ) -> Response<Body> {
        if method != http::Method::POST {
            return json(
                StatusCode::METHOD_NOT_ALLOWED,
                serde_json::json!({
                    "code": "MethodNotAllowed",
                    "error": "POST /_fencegate/fence with the lease's signed fencing_token in the Fencing-Token header",
                })
                .to_string(),
            );
        }
        match self.gate.fence(headers, lock.as_deref()).await {
            Ok((lock, token, max)) => json(
                StatusCode::OK,
                serde_json::json!({ "lock": lock, "token": token, "max_token": max }).to_string(),
            ),
            Err(e) => {
                let status = e.status_code().unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                let mut r = json(
                    status,
                    serde_json::json!({
                        "code": e.code().as_str(),
                        "error": e.message().unwrap_or_default(),
                    })
                    .to_string(),
                );
                if let Some(max) = e
                    .headers()
                    .and_then(|h| h.get(crate::errors::MAX_TOKEN_HEADER))
                {
                    r.headers_mut()
                        .insert(crate::errors::MAX_TOKEN_HEADER, max.clone());
                }
                r
            }
        }
    }
}

/// Lets every request handler run to its end. Hyper drops a connection's
/// in-flight handler when the connection closes; a handler dropped between
/// two steps of one write would leave them apart (s3s-fs renames the
/// object's data into place before it writes its metadata, and the proxy
/// would let go of a key while the store is still writing it).
///
/// A handler runs inline on its connection's task (the body streams without
/// a task switch per chunk); if the connection goes away first, what is left
/// of the handler is moved to a task of its own (`tracker`, which shutdown
/// waits for). A handler whose body arrived whole then finishes; one whose
/// body was cut short fails on the body, as before.
#[derive(Clone)]
struct Detached<S> {
    inner: S,
    tracker: TaskTracker,
}

impl<S> hyper::service::Service<Request<Incoming>> for Detached<S>
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<Body>, Error = HttpError>,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = HttpError;
    type Future = FinishOnDrop<S::Future>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        FinishOnDrop {
            handler: Some(Box::pin(self.inner.call(req))),
            tracker: self.tracker.clone(),
        }
    }
}

/// A handler future that, dropped before it is done, finishes in the
/// background instead of stopping where it was.
struct FinishOnDrop<F: Future + Send + 'static> {
    handler: Option<Pin<Box<F>>>,
    tracker: TaskTracker,
}

impl<F: Future + Send + 'static> Future for FinishOnDrop<F> {
    type Output = F::Output;

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let Some(handler) = self.handler.as_mut() else {
            return std::task::Poll::Pending;
        };
        let out = handler.as_mut().poll(cx);
        if out.is_ready() {
            self.handler = None;
        }
        out
    }
}

impl<F: Future + Send + 'static> Drop for FinishOnDrop<F> {
    fn drop(&mut self) {
        if let Some(handler) = self.handler.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            self.tracker.spawn_on(
                async move {
                    let _ = handler.await;
                },
                &runtime,
            );
        }
    }
}

/// What answers requests in front of the gate: s3s, the edge's fast path
/// for PutObject, the virtual hosts, and who may read the status page.
#[derive(Debug)]
pub struct Front {
    pub s3: S3Service,
    pub edge: Edge,
    pub hosts: VirtualHosts,
    pub viewers: crate::access::Viewers,
    /// The names it answers to (see `allowed_hosts`).
    pub answered: fencegate_net::browser::AllowedHosts,
}

/// Serves `front` on `listener` until `shutdown`, then stops accepting and
/// waits (up to [`crate::config::DRAIN_TIMEOUT`]) for in-flight requests.
pub async fn serve(
    listener: TcpListener,
    front: Front,
    gate: Arc<Gate>,
    options: fencegate_net::ServerOptions,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let router = Router {
        s3: front.s3,
        edge: Arc::new(front.edge),
        gate: gate.clone(),
        hosts: Arc::new(front.hosts),
        viewers: Arc::new(front.viewers),
        answered: Arc::new(front.answered),
        failures: Arc::default(),
    };
    if serve_detached(listener, router, options, shutdown).await? {
        gate.end_run();
    }
    Ok(())
}

/// What the serving loops take: a hyper service answering with our body
/// and error, cloned for each connection.
pub trait Handler:
    Service<Req, Response = Resp, Error = HttpError, Future: Send + 'static> + Clone + Send + 'static
{
}

impl<S: Service<Req, Response = Resp, Error = HttpError, Future: Send + 'static>> Handler for S where
    S: Clone + Send + 'static
{
}

type Req = Request<Incoming>;
type Resp = Response<Body>;

/// Serves any hyper service the same way, with the default connection
/// options but no share per client address (used for the embedded backend
/// of `fencegate dev`, the tests and the benchmark, whose clients are
/// proxies on this machine). Every request runs to its end (see
/// [`Detached`]).
pub async fn serve_service<S>(
    listener: TcpListener,
    router: S,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()>
where
    S: Handler,
{
    let defaults = fencegate_net::ServerOptions::default();
    let options = fencegate_net::ServerOptions {
        refusal: crate::config::refusal(),
        drain_timeout: crate::config::DRAIN_TIMEOUT,
        // The embedded store's clients are proxies on this machine, all
        // from one address: a share per address would cap them at a part
        // of the connections (the benchmark's four variants at c=64 hit
        // it).
        max_connections_per_address: defaults.max_connections,
        ..defaults
    };
    serve_detached(listener, router, options, shutdown)
        .await
        .map(drop)
}

/// Serves until `shutdown`, then drains; whether every connection and
/// request ended within the drain time.
async fn serve_detached<S>(
    listener: TcpListener,
    router: S,
    options: fencegate_net::ServerOptions,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<bool>
where
    S: Handler,
{
    // The serving threads run the handlers too: they stay until those end.
    let workers = options.workers.clone();
    let tracker = TaskTracker::new();
    let handlers = Detached {
        inner: router,
        tracker: tracker.clone(),
    };
    // One drain deadline for connections and detached handlers together,
    // counted from the shutdown request.
    let drain = options.drain_timeout;
    let requested = Arc::new(std::sync::OnceLock::new());
    let shutdown = {
        let requested = requested.clone();
        async move {
            shutdown.await;
            let _ = requested.set(tokio::time::Instant::now());
        }
    };
    // Every handler runs to its end, so a client that half-closes after its
    // request gets the answer; hyper's default would close its connection
    // unanswered whenever the end of its sending came first (a stale writer
    // then cannot tell a refusal from a network fault).
    let options = fencegate_net::ServerOptions {
        half_close: true,
        ..options
    };
    // Connections first (net's serve returns once they are closed), then
    // handlers whose client hung up.
    fencegate_net::serve(listener, handlers, options, shutdown).await?;
    tracker.close();
    let deadline = requested
        .get()
        .copied()
        .unwrap_or_else(tokio::time::Instant::now)
        + drain;
    // The deadline first: `fencegate_net::serve` gives up on connections
    // at the same deadline, and then returns with their handlers still
    // running, outside `tracker`.
    let drained = tokio::select! {
        biased;
        () = tokio::time::sleep_until(deadline) => {
            tracing::warn!("gave up waiting for in-flight requests to finish");
            false
        }
        () = tracker.wait() => {
            tracing::info!("all connections and requests drained");
            true
        }
    };
    drop(workers);
    Ok(drained)
}
