//! The serving layer shared by the lease service and the proxy.
//!
//! It owns everything between a bound [`TcpListener`] and a hyper service:
//!
//! - accepting connections, without spinning when `accept` fails (a process
//!   out of file descriptors backs off and recovers on its own);
//! - the connection cap: a connection over [`ServerOptions::max_connections`]
//!   is answered `503` with the service's own error body and
//!   `Connection: close`, then closed ([`Refusal`]);
//! - the share of one client address: connections are taken before any
//!   request can prove anything, so they are shared out per address
//!   ([`ServerOptions::max_connections_per_address`]; IPv6 by its /64):
//!   one address holding its whole share is refused the same way, and
//!   cannot take the slots of the others;
//! - noticing peers that vanished without a word ([`liveness`]: TCP
//!   keepalive and user timeouts, for every connection fencegate accepts
//!   or opens);
//! - per-connection timeouts ([`conn`]): a request head must arrive within
//!   [`ServerOptions::header_read_timeout`] of its first byte (of the
//!   accept, for the first request), and a keep-alive connection with no
//!   request in flight is closed after [`ServerOptions::idle_timeout`];
//! - reporting a configuration's problems all at once ([`problems`]);
//! - TLS termination ([`tls`]), and the TLS configuration of fencegate's own
//!   HTTP clients ([`tls::ClientTls`]);
//! - graceful shutdown: stop accepting, let in-flight requests finish (up to
//!   [`ServerOptions::drain_timeout`]), close idle connections at once.
//!
//! It does not own what a request means, a request body that stalls
//! mid-stream (the proxy's `client_idle_timeout_secs`), or a handler's life
//! after its connection closed (the proxy's `Detached`).
//!
//! **Invariant:** every accepted connection either holds one of the
//! `max_connections` slots for its whole life or is refused; a refusal holds
//! one of [`MAX_REFUSING`] slots for at most [`REFUSAL_TIME`]. So the
//! descriptors the server holds for clients are bounded by
//! `max_connections + MAX_REFUSING`.

mod answer;
pub mod browser;
pub mod conn;
pub mod liveness;
pub mod problems;
mod refuse;
mod slots;
pub mod tls;
pub mod workers;

pub use conn::{PeerAddr, RequestBody, track_request_body};
pub use workers::Workers;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Most connections being refused at once (each is answered and closed
/// within [`REFUSAL_TIME`]); connections beyond it are closed unanswered.
pub const MAX_REFUSING: usize = 64;
use conn::BoxError;
pub use refuse::REFUSAL_TIME;
pub use slots::default_share;

/// How a server treats its connections.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Longest a client may take to send a request head, counted from its
    /// first byte (for a connection's first request: from the accept,
    /// TLS handshake included).
    pub header_read_timeout: Duration,
    /// A keep-alive connection with no request in flight and no byte of a
    /// new one for this long is closed.
    pub idle_timeout: Duration,
    /// Most connections served at once; more are refused (see [`Refusal`]).
    pub max_connections: usize,
    /// Most connections served at once from one client address (IPv4),
    /// or one /64 (IPv6); more from it are refused like those over
    /// `max_connections`.
    pub max_connections_per_address: usize,
    /// Serve HTTPS with this configuration; `None` serves plain HTTP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// The answer to a connection over the cap.
    pub refusal: Refusal,
    /// Longest a graceful shutdown waits for open connections to finish
    /// their requests.
    pub drain_timeout: Duration,
    /// Serve each connection on one of these threads; `None` serves them
    /// on the caller's runtime. Whoever passes them keeps them until the
    /// work those connections started is done ([`Workers`] stop when
    /// dropped).
    pub workers: Option<Arc<Workers>>,
    /// A client may end its sending side once its request is out (a
    /// half-close: `shutdown(SHUT_WR)`, `nc -N`) and still read the answer.
    /// `false` takes that end, before the answer, for the client leaving:
    /// the connection closes unanswered and its handler is dropped, so a
    /// handler that waits for long (a lease acquire in line) stops when its
    /// client goes. A service whose handlers run to their end anyway should
    /// set it: its answer is then not lost to the race between the client's
    /// end and the handler's.
    pub half_close: bool,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 1024,
            max_connections_per_address: 256,
            tls: None,
            refusal: Refusal::text("too many connections; retry later\n"),
            drain_timeout: Duration::from_secs(30),
            workers: None,
            half_close: false,
        }
    }
}

/// The `503 Service Unavailable` a connection over the cap gets, in the
/// service's own error format (S3 XML for the proxy, JSON for the lease
/// service), with `Retry-After: 1` and `Connection: close`.
#[derive(Debug, Clone)]
pub struct Refusal {
    content_type: &'static str,
    body: Bytes,
}

impl Refusal {
    pub fn new(content_type: &'static str, body: impl Into<Bytes>) -> Refusal {
        Refusal {
            content_type,
            body: body.into(),
        }
    }

    pub fn text(body: &'static str) -> Refusal {
        Refusal::new("text/plain; charset=utf-8", body)
    }

    /// The whole HTTP/1.1 response, as written on the wire.
    fn response(&self) -> Bytes {
        let mut r = format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: {}\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n",
            self.content_type,
            self.body.len()
        )
        .into_bytes();
        r.extend_from_slice(&self.body);
        r.into()
    }
}

/// Serves `service` on `listener` until `shutdown` resolves, then stops
/// accepting, asks every connection to close once its request is answered,
/// and waits for them (up to [`ServerOptions::drain_timeout`]).
///
/// `service` is cloned for every connection. A service that wants the
/// connection's idle timer to wait for its request bodies to be read too
/// (not only for its responses) calls [`track_request_body`].
pub async fn serve<S, B>(
    listener: TcpListener,
    service: S,
    options: ServerOptions,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let mut http = hyper::server::conn::http1::Builder::new();
    // hyper's own header timer starts whenever the connection is ready for a
    // request, so it would also close idle keep-alive connections after the
    // (short) header timeout; `conn` times heads from their first byte
    // instead (as Go's ReadHeaderTimeout/IdleTimeout and nginx's
    // client_header_timeout/keepalive_timeout do).
    http.header_read_timeout(None)
        .keep_alive(true)
        .half_close(options.half_close);
    let shared = Arc::new(conn::Shared {
        http,
        tls: options.tls.clone().map(tokio_rustls::TlsAcceptor::from),
        timeouts: conn::Timeouts {
            header: options.header_read_timeout,
            idle: options.idle_timeout,
        },
        stop: CancellationToken::new(),
    });
    let refusal = options.refusal.response();
    let slots = slots::Slots::new(options.max_connections, options.max_connections_per_address);
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    let tasks = TaskTracker::new();
    let mut backoff = AcceptBackoff::default();
    let mut refusals_logged = Throttle::every(Duration::from_secs(10));
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => {
                backoff.reset();
                accepted
            }
            // The connection went away before it was accepted: nothing to do.
            Err(e) if is_per_connection(&e) => continue,
            // Out of descriptors (EMFILE/ENFILE) or memory: accepting again at
            // once would fail again, in a busy loop. Pause, and try again
            // (the pending connections wait in the backlog meanwhile).
            Err(e) => {
                let pause = backoff.next();
                if let Some(suppressed) = backoff.log.ready(Instant::now()) {
                    tracing::warn!(error = %e, ?pause, suppressed, "accept failed; pausing before accepting again");
                }
                tokio::select! {
                    () = tokio::time::sleep(pause) => continue,
                    () = &mut shutdown => break,
                }
            }
        };
        let _ = tcp.set_nodelay(true);
        liveness::accepted(&tcp);
        let slot = slots.take(peer.ip());
        match slot {
            Some(slot) => match &options.workers {
                None => {
                    tasks.spawn(conn::serve_connection(
                        tcp,
                        service.clone(),
                        shared.clone(),
                        slot,
                    ));
                }
                // The socket leaves this runtime's event loop for its
                // worker's, where the connection then lives.
                Some(workers) => match tcp.into_std() {
                    Ok(tcp) => {
                        let (worker, assigned) = workers.assign();
                        let (service, shared) = (service.clone(), shared.clone());
                        tasks.spawn_on(
                            async move {
                                let _assigned = assigned;
                                match tokio::net::TcpStream::from_std(tcp) {
                                    Ok(tcp) => {
                                        conn::serve_connection(tcp, service, shared, slot).await;
                                    }
                                    Err(e) => tracing::warn!(error = %e, "cannot serve a connection on its worker"),
                                }
                            },
                            worker,
                        );
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot hand a connection to a worker"),
                },
            },
            None => {
                let answered = match refusing.clone().try_acquire_owned() {
                    Ok(permit) => {
                        tasks.spawn(refuse::refuse(
                            tcp,
                            shared.tls.clone(),
                            refusal.clone(),
                            permit,
                        ));
                        true
                    }
                    // Too many refusals in progress: close without a word
                    // rather than hold more descriptors.
                    Err(_) => false,
                };
                if let Some(suppressed) = refusals_logged.ready(Instant::now()) {
                    tracing::warn!(
                        max_connections = options.max_connections,
                        max_connections_per_address = options.max_connections_per_address,
                        %peer,
                        answered,
                        suppressed,
                        "connection refused: at max_connections, or its address at max_connections_per_address"
                    );
                }
            }
        }
    }
    drop(listener);
    shared.stop.cancel();
    tasks.close();
    if tokio::time::timeout(options.drain_timeout, tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            open = tasks.len(),
            "gave up waiting for open connections to finish"
        );
    }
    Ok(())
}

/// Errors of `accept` that concern one connection only.
fn is_per_connection(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionAborted | ConnectionReset | ConnectionRefused | Interrupted | WouldBlock
    )
}

/// The pause after a failed `accept`: 10 ms, doubling up to 1 s while the
/// failures go on.
#[derive(Debug)]
struct AcceptBackoff {
    pause: Duration,
    log: Throttle,
}

impl Default for AcceptBackoff {
    fn default() -> Self {
        AcceptBackoff {
            pause: Duration::ZERO,
            log: Throttle::every(Duration::from_secs(10)),
        }
    }
}

impl AcceptBackoff {
    fn next(&mut self) -> Duration {
        self.pause = (self.pause * 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
        self.pause
    }

    fn reset(&mut self) {
        self.pause = Duration::ZERO;
    }
}

/// At most one log line per period; counts the lines it held back.
#[derive(Debug)]
struct Throttle {
    every: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttle {
    fn every(every: Duration) -> Throttle {
        Throttle {
            every,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(lines held back since the last one)` if a line may be logged now.
    fn ready(&mut self, now: Instant) -> Option<u64> {
        if self.last.is_some_and(|last| now < last + self.every) {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// Raises this process's soft limit on open files to its hard limit (as Go
/// programs do at start) and returns the soft limit now in force, or `None`
/// if it cannot be read.
///
/// Each connection holds a descriptor (a proxy connection usually two: the
/// client's and one to the backend). When the limit is below what
/// `max_connections` needs, `accept` fails with EMFILE before the cap is
/// reached, and clients wait in the backlog instead of getting the cap's
/// clear refusal.
pub fn raise_open_file_limit() -> Option<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return Some(hard);
    }
    Some(soft)
}

/// A warning when `max_connections` connections of `fds_per_connection`
/// descriptors each (plus some for everything else) would not fit in the
/// open-file limit `limit`.
pub fn open_file_limit_warning(
    limit: u64,
    max_connections: usize,
    fds_per_connection: u64,
) -> Option<String> {
    const OTHER_FILES: u64 = 64;
    let needed = (max_connections as u64 + MAX_REFUSING as u64) * fds_per_connection + OTHER_FILES;
    (needed > limit).then(|| {
        format!(
            "max_connections = {max_connections} needs about {needed} open files, but the limit is {limit}: \
             clients beyond it will hang instead of getting a 503. Lower max_connections or raise the limit (ulimit -n, LimitNOFILE=)"
        )
    })
}

#[cfg(feature = "test-pki")]
pub mod test_pki;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_second_and_resets() {
        let mut b = AcceptBackoff::default();
        let pauses: Vec<_> = (0..10).map(|_| b.next().as_millis()).collect();
        assert_eq!(pauses, [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
        b.reset();
        assert_eq!(b.next(), Duration::from_millis(10));
    }

    #[test]
    fn throttle_counts_what_it_holds_back() {
        let t0 = Instant::now();
        let mut t = Throttle::every(Duration::from_secs(10));
        assert_eq!(t.ready(t0), Some(0));
        assert_eq!(t.ready(t0 + Duration::from_secs(1)), None);
        assert_eq!(t.ready(t0 + Duration::from_secs(2)), None);
        assert_eq!(t.ready(t0 + Duration::from_secs(10)), Some(2));
    }

    #[test]
    fn refusal_is_a_complete_response() {
        let r = Refusal::new("application/json", r#"{"e":1}"#).response();
        let text = std::str::from_utf8(&r).expect("ascii");
        assert!(text.starts_with("HTTP/1.1 503 Service Unavailable\r\n"));
        assert!(text.contains("content-length: 7\r\n"));
        assert!(text.contains("connection: close\r\n"));
        assert!(text.ends_with("\r\n\r\n{\"e\":1}"));
    }

    #[test]
    fn the_open_file_limit_must_fit_the_cap() {
        assert!(open_file_limit_warning(256, 1024, 1).is_some());
        assert!(open_file_limit_warning(1_048_576, 1024, 2).is_none());
    }
}
