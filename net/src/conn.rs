//! One connection: its TLS handshake, its header and idle timeouts, and the
//! wrappers that tell the timer what the connection is doing.
//!
//! A connection is, at any moment, in one of three phases ([`Phase`]):
//!
//! - **head**: a request head is expected and its first byte has arrived
//!   (for the connection's first request: the connection was accepted).
//!   The head must be complete within the header timeout, counted from that
//!   moment, however the bytes trickle in: a client sending one byte a
//!   second does not keep the slot.
//! - **busy**: a request is being served: its body is being read or its
//!   response written. No timer of ours runs; a request body that stalls is
//!   the service's business (the proxy's `client_idle_timeout_secs`), and
//!   a long handler (a lease acquire waiting in line) is legitimate.
//! - **idle**: between requests, nothing received. Closed after the idle
//!   timeout, gracefully (hyper closes an idle connection at once).
//!
//! Busy is counted, not flagged: a request counts once for its response
//! (until the response body is done or dropped) and, when the service calls
//! [`track_request_body`], once for its body (until it is read to its end or
//! dropped). A response sent before its request body was read (a write
//! refused on its headers) thus keeps the connection busy while the body
//! drains, instead of timing the drained bytes as a new head.
//!
//! The phase machine ([`State`]) has no I/O and no clock: time is passed in.

use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The error of a service or body, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// After a graceful close was asked of an idle connection, how long it has
/// to close before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// What every connection of one server shares.
pub(crate) struct Shared {
    pub(crate) http: hyper::server::conn::http1::Builder,
    pub(crate) tls: Option<tokio_rustls::TlsAcceptor>,
    pub(crate) timeouts: Timeouts,
    /// Cancelled when the server shuts down.
    pub(crate) stop: CancellationToken,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("tls", &self.tls.is_some())
            .field("timeouts", &self.timeouts)
            .finish_non_exhaustive()
    }
}

/// The two timers of a connection.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub header: Duration,
    pub idle: Duration,
}

/// Which phase a connection is in (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Head,
    Busy,
    Idle,
}

/// The phase machine of one connection.
#[derive(Debug)]
pub struct State {
    /// Requests whose response or tracked body is not done yet.
    busy: usize,
    /// When the head now expected started: the first byte read while idle,
    /// or the accept. `None` while busy or idle.
    head_since: Option<Instant>,
    /// When the connection last became idle.
    idle_since: Instant,
}

impl State {
    /// A connection accepted at `now`: its first head is expected.
    pub fn accepted(now: Instant) -> State {
        State {
            busy: 0,
            head_since: Some(now),
            idle_since: now,
        }
    }

    pub fn phase(&self) -> Phase {
        match (self.busy, self.head_since) {
            (1.., _) => Phase::Busy,
            (0, Some(_)) => Phase::Head,
            (0, None) => Phase::Idle,
        }
    }

    /// Bytes arrived at `now`. Returns whether the deadline changed.
    pub fn read(&mut self, now: Instant) -> bool {
        if self.phase() == Phase::Idle {
            self.head_since = Some(now);
            return true;
        }
        false
    }

    /// A request (or its body) started being served.
    pub fn begin(&mut self) {
        self.busy += 1;
        self.head_since = None;
    }

    /// A response or request body is done at `now`. Returns whether the
    /// deadline changed (the connection became idle).
    pub fn end(&mut self, now: Instant) -> bool {
        self.busy = self.busy.saturating_sub(1);
        if self.busy == 0 {
            self.idle_since = now;
            return true;
        }
        false
    }

    /// When the connection expires if nothing happens, and in which phase.
    pub fn deadline(&self, t: Timeouts) -> Option<(Instant, Phase)> {
        match self.phase() {
            Phase::Busy => None,
            Phase::Head => self.head_since.map(|since| (since + t.header, Phase::Head)),
            Phase::Idle => Some((self.idle_since + t.idle, Phase::Idle)),
        }
    }
}

/// A connection's [`State`], shared by its reads, its requests and its
/// timer task.
#[derive(Debug)]
pub(crate) struct Watch {
    state: Mutex<State>,
    /// Woken when the deadline may have come closer.
    changed: Notify,
}

impl Watch {
    fn new(now: Instant) -> Watch {
        Watch {
            state: Mutex::new(State::accepted(now)),
            changed: Notify::new(),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        // The state stays consistent whatever panicked while holding it.
        let mut state = self.state.lock();
        f(&mut state)
    }

    fn read(&self) {
        if self.with(|s| s.read(Instant::now())) {
            self.changed.notify_one();
        }
    }

    fn deadline(&self, t: Timeouts) -> Option<(Instant, Phase)> {
        self.with(|s| s.deadline(t))
    }
}

/// Holds its connection busy until dropped.
#[derive(Debug)]
struct Busy(Arc<Watch>);

impl Busy {
    fn new(watch: Arc<Watch>) -> Busy {
        watch.with(State::begin);
        Busy(watch)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if self.0.with(|s| s.end(Instant::now())) {
            self.0.changed.notify_one();
        }
    }
}

/// Serves one accepted connection until it closes, times out, or the
/// server's shutdown has drained it. `_slot` is its place under the cap.
pub(crate) async fn serve_connection<S, B>(
    tcp: TcpStream,
    service: S,
    shared: Arc<Shared>,
    _slot: crate::slots::Slot,
) where
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let watch = Arc::new(Watch::new(Instant::now()));
    let timeouts = shared.timeouts;
    let peer = tcp.peer_addr().ok().map(PeerAddr);
    let stream = match &shared.tls {
        None => Stream::Plain(tcp),
        Some(acceptor) => {
            // The handshake is part of the first head: same deadline.
            let handshake = crate::tls::accept(tcp, acceptor);
            let deadline = Instant::now() + timeouts.header;
            tokio::select! {
                r = tokio::time::timeout_at(deadline, handshake) => match r {
                    Ok(Ok(tls)) => Stream::Tls(Box::new(tls)),
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!("TLS handshake not done within the header timeout");
                        return;
                    }
                },
                () = shared.stop.cancelled() => return,
            }
        }
    };
    let io = TokioIo::new(WatchedIo {
        inner: stream,
        watch: watch.clone(),
    });
    let conn = shared.http.serve_connection(
        io,
        Watched {
            inner: service,
            watch: watch.clone(),
            peer,
        },
    );
    tokio::pin!(conn);
    let mut stopping = false;
    // Once a graceful close was asked because the connection sat idle: when
    // to give up waiting for it.
    let mut closing_by: Option<Instant> = None;
    loop {
        let wake = closing_by.or_else(|| watch.deadline(timeouts).map(|(at, _)| at));
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            () = shared.stop.cancelled(), if !stopping => {
                // Finish the request in flight, if any, then close; an idle
                // connection closes at once. The timers go on meanwhile.
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
            () = watch.changed.notified() => {}
            () = sleep_until(wake) => {
                let now = Instant::now();
                if closing_by.is_some_and(|by| now >= by) {
                    return;
                }
                match watch.deadline(timeouts) {
                    Some((at, Phase::Head)) if at <= now => {
                        tracing::debug!(timeout = ?timeouts.header, "closing a connection whose request head did not arrive in time");
                        return;
                    }
                    Some((at, Phase::Idle)) if at <= now && closing_by.is_none() => {
                        tracing::trace!("closing an idle connection");
                        conn.as_mut().graceful_shutdown();
                        closing_by = Some(now + CLOSE_GRACE);
                    }
                    _ => {}
                }
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A plain or TLS connection.
#[derive(Debug)]
pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// The connection's byte stream (after TLS), reporting reads to its watch.
#[derive(Debug)]
struct WatchedIo {
    inner: Stream,
    watch: Arc<Watch>,
}

impl AsyncRead for WatchedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let out = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(out, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.watch.read();
        }
        out
    }
}

impl AsyncWrite for WatchedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The connection's watch, carried in a request's extensions so that the
/// service can track its body ([`track_request_body`]).
#[derive(Debug, Clone)]
struct BodyWatch(Arc<Watch>);

/// The service of one connection: every request holds the connection busy
/// until its response is done.
#[derive(Debug)]
struct Watched<S> {
    inner: S,
    watch: Arc<Watch>,
    peer: Option<PeerAddr>,
}

/// The address a request's connection came from, in every request's
/// extensions (for logs and fence events: who sent it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub std::net::SocketAddr);

impl<S, B> hyper::service::Service<Request<Incoming>> for Watched<S>
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>>,
{
    type Response = Response<BusyBody<B>>;
    type Error = S::Error;
    type Future = WatchedFuture<S::Future>;

    fn call(&self, mut req: Request<Incoming>) -> Self::Future {
        let busy = Busy::new(self.watch.clone());
        req.extensions_mut().insert(BodyWatch(self.watch.clone()));
        if let Some(peer) = self.peer {
            req.extensions_mut().insert(peer);
        }
        WatchedFuture {
            inner: self.inner.call(req),
            busy: Some(busy),
        }
    }
}

pin_project_lite::pin_project! {
    /// A response future holding its connection busy (and its response
    /// body, once there is one).
    struct WatchedFuture<F> {
        #[pin]
        inner: F,
        busy: Option<Busy>,
    }
}

impl<F, B, E> Future for WatchedFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<BusyBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let out = ready!(this.inner.poll(cx));
        let busy = this.busy.take();
        Poll::Ready(out.map(|resp| resp.map(|inner| BusyBody { inner, busy })))
    }
}

pin_project_lite::pin_project! {
    /// A body holding its connection busy until it ends (its last frame
    /// or an error) or is dropped: a response's, and with
    /// [`track_request_body`] a request's.
    pub struct BusyBody<B> {
        #[pin]
        inner: B,
        busy: Option<Busy>,
    }
}

/// A request body counted by [`track_request_body`].
pub type RequestBody = BusyBody<Incoming>;

impl<B> std::fmt::Debug for BusyBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BusyBody")
            .field("tracked", &self.busy.is_some())
            .finish_non_exhaustive()
    }
}

impl<B: Body> Body for BusyBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let out = ready!(this.inner.poll_frame(cx));
        if matches!(out, None | Some(Err(_))) {
            this.busy.take();
        }
        Poll::Ready(out)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Makes the connection of `req` count as busy until the request body is
/// read to its end or dropped, not only until the response is done. Without
/// it, the bytes of a body still arriving after its response (a write
/// refused on its headers, its body drained) would be timed as a new
/// request head, and a slow body cut after the header timeout.
///
/// On a request that did not come through [`crate::serve`], the body is
/// only wrapped.
pub fn track_request_body(mut req: Request<Incoming>) -> Request<RequestBody> {
    let watch = req.extensions_mut().remove::<BodyWatch>();
    req.map(|inner| {
        let busy = watch
            .filter(|_| !inner.is_end_stream())
            .map(|w| Busy::new(w.0));
        BusyBody { inner, busy }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timeouts = Timeouts {
        header: Duration::from_secs(10),
        idle: Duration::from_secs(60),
    };

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn the_first_head_is_timed_from_the_accept() {
        let t0 = Instant::now();
        let mut s = State::accepted(t0);
        assert_eq!(s.deadline(T), Some((t0 + secs(10), Phase::Head)));
        // Bytes trickling in do not push the deadline back.
        assert!(!s.read(t0 + secs(5)));
        assert_eq!(s.deadline(T), Some((t0 + secs(10), Phase::Head)));
    }

    #[test]
    fn a_request_in_flight_has_no_deadline_and_idle_starts_when_it_ends() {
        let t0 = Instant::now();
        let mut s = State::accepted(t0);
        s.begin(); // response
        s.begin(); // tracked body
        assert_eq!(s.deadline(T), None);
        assert!(!s.read(t0 + secs(100)), "body bytes while busy");
        assert!(!s.end(t0 + secs(200)), "response done, body still read");
        assert_eq!(s.deadline(T), None);
        assert!(s.end(t0 + secs(300)));
        assert_eq!(s.deadline(T), Some((t0 + secs(360), Phase::Idle)));
    }

    #[test]
    fn the_next_head_is_timed_from_its_first_byte() {
        let t0 = Instant::now();
        let mut s = State::accepted(t0);
        s.begin();
        s.end(t0 + secs(1));
        assert_eq!(s.phase(), Phase::Idle);
        assert!(s.read(t0 + secs(30)));
        assert_eq!(s.deadline(T), Some((t0 + secs(40), Phase::Head)));
        assert!(!s.read(t0 + secs(35)));
        s.begin();
        assert_eq!(s.phase(), Phase::Busy);
    }
}
