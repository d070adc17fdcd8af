//! The lean forwarder's connections to the store: hyper's connection-level
//! HTTP/1 client, the idle connections kept in a list per thread instead
//! of a shared pool. A serving thread (`fencegate_net::workers`) runs its
//! requests and their connections on its own event loop, so a checkout is
//! a scan of a short list: no hashing, no lock, no boxed future.
//!
//! What hyper-util's pool did, and this keeps:
//! - a connection idle for [`TURN_AFTER`] or more is given one turn of the
//!   event loop before it is used, so a close the store sent while this
//!   thread was busy is read before the request is written (else hyper
//!   writes it on the closed connection, and its loss is an unknown
//!   outcome);
//! - a request meant for an idle connection the store has closed meanwhile
//!   is sent on another only when hyper hands it back unsent: no byte of it
//!   left ([`Conns::send`]);
//! - a connection goes back to the list only once its answer was read to
//!   the end, and not when the store said `Connection: close`
//!   ([`Conn::put_back`]);
//! - a connection idle for [`IDLE_FOR`] or more is dropped (found at
//!   checkout or at a return on its thread);
//! - every connection is opened by the [`CheckedConnector`]: the standing
//!   check on each write of bytes, the connect bound. Nothing else is set
//!   on the socket (no keepalive: see `send_check::store_connector`).

use crate::no_answer::NoAnswer;
use crate::send_check::CheckedConnector;
use http::uri::{Authority, Scheme};
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::client::legacy::connect::HttpConnector;
use prometheus_client::metrics::counter::Counter;
use std::cell::RefCell;
use std::time::{Duration, Instant};

/// How long a connection may stay idle in a list: stores close idle
/// connections themselves (after 5 s to minutes), and one closed while idle
/// costs a resend at checkout.
pub const IDLE_FOR: Duration = Duration::from_secs(30);

/// How long a connection may have been idle before it is given a turn of
/// the event loop at checkout. A close (or a reset) the store sent while
/// this thread was busy is not known to the connection's task until the
/// event loop polls for it; without that poll, hyper writes the request on
/// the closed connection, and its loss is an unknown outcome (a 503 that
/// holds back raises). With it, the close is read before the request is
/// written, and hyper hands the request back unsent. A connection in steady
/// use (idle less than this) is taken at once, at no cost: stores close
/// connections for idleness after seconds, and otherwise say
/// `Connection: close`, which is honoured.
pub const TURN_AFTER: Duration = Duration::from_millis(100);

/// Most idle connections a thread keeps; a return past it closes the
/// connection (the list is scanned at checkout).
const MOST_IDLE: usize = 256;

/// A request body the lean client sends.
pub type Body =
    http_body_util::combinators::BoxBody<bytes::Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// The store's connector.
pub type Connector = CheckedConnector<hyper_rustls::HttpsConnector<HttpConnector>>;

/// An error of a send: the connect's, or hyper's.
pub type SendError = Box<dyn std::error::Error + Send + Sync>;

/// A connection kept idle, for the forwarder `lean` (two proxies in one
/// process keep theirs apart).
struct Idle {
    lean: usize,
    authority: Authority,
    sender: SendRequest<Body>,
    since: Instant,
}

thread_local! {
    static IDLE: RefCell<Vec<Idle>> = const { RefCell::new(Vec::new()) };
}

/// One forwarder's connections to its store.
pub struct Conns {
    connector: Connector,
    scheme: Scheme,
    id: usize,
    /// Requests handed back unsent and sent on another connection.
    resends: Counter,
    /// [`TURN_AFTER`], but for a test of what it prevents.
    turn_after: Duration,
}

/// A connection in use, whose answer is being read; dropped, it closes.
pub struct Conn {
    lean: usize,
    authority: Authority,
    sender: SendRequest<Body>,
}

impl Conn {
    /// Keeps the connection for the next request, once its answer was read
    /// to the end (`read_whole`) and the store did not say it closes it.
    pub fn put_back(self, read_whole: bool, headers: &http::HeaderMap) {
        if !read_whole || closes(headers) || self.sender.is_closed() {
            return;
        }
        let now = Instant::now();
        IDLE.with_borrow_mut(|idle| {
            idle.retain(|c| now.duration_since(c.since) < IDLE_FOR && !c.sender.is_closed());
            if idle.len() < MOST_IDLE {
                idle.push(Idle {
                    lean: self.lean,
                    authority: self.authority,
                    sender: self.sender,
                    since: now,
                });
            }
        });
    }
}

/// Whether an answer says its connection closes after it.
fn closes(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(http::header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .any(|token| token.trim_ascii().eq_ignore_ascii_case(b"close"))
}

impl Conns {
    /// Connections to the store reached at `scheme`, opened by `connector`;
    /// each request sent again is counted in `resends`.
    pub fn new(connector: Connector, scheme: Scheme, resends: Counter) -> Conns {
        static IDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        Conns {
            connector,
            scheme,
            id: IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            resends,
            turn_after: TURN_AFTER,
        }
    }

    /// Sends `request` (its URI in origin form) to the store at
    /// `authority`, on an idle connection if this thread has one. A request
    /// hyper hands back unsent (the connection closed while idle) goes on
    /// the next one, or a new one; a request that failed on a new
    /// connection is not sent again. A failure after the request may have
    /// left whole is marked [`NoAnswer`].
    pub async fn send(
        &self,
        authority: &Authority,
        mut request: Request<Body>,
    ) -> Result<(Response<Incoming>, Conn), SendError> {
        loop {
            let (mut sender, reused) = match self.checkout(authority) {
                Some((sender, idle)) => {
                    if idle >= self.turn_after {
                        // The event loop polls for what arrived while this
                        // thread was busy, so a close is read before the
                        // request is written (tokio runs a yielded task
                        // again only after its driver polled; the lean
                        // tests pin that the close is then seen).
                        tokio::task::yield_now().await;
                    }
                    (sender, true)
                }
                None => (self.connect(authority).await?, false),
            };
            if reused && (sender.is_closed() || sender.ready().await.is_err()) {
                continue;
            }
            match sender.try_send_request(request).await {
                Ok(response) => {
                    let conn = Conn {
                        lean: self.id,
                        authority: authority.clone(),
                        sender,
                    };
                    return Ok((response, conn));
                }
                Err(mut e) => match e.take_message() {
                    Some(unsent) if reused => {
                        self.resends.inc();
                        request = unsent;
                    }
                    // Handed back: no byte of it left.
                    Some(_) => return Err(e.into_error().into()),
                    None => return Err(NoAnswer::mark(e.into_error().into())),
                },
            }
        }
    }

    /// This thread's most recently used idle connection to `authority`, and
    /// how long it was idle, dropping those idle too long or closed on the
    /// way.
    fn checkout(&self, authority: &Authority) -> Option<(SendRequest<Body>, Duration)> {
        IDLE.with_borrow_mut(|idle| {
            let now = Instant::now();
            while let Some(i) = idle
                .iter()
                .rposition(|c| c.lean == self.id && c.authority == *authority)
            {
                let c = idle.swap_remove(i);
                let idle_for = now.duration_since(c.since);
                if idle_for < IDLE_FOR && !c.sender.is_closed() {
                    return Some((c.sender, idle_for));
                }
            }
            None
        })
    }

    /// Every idle connection taken at once, without a turn of the event
    /// loop: for the test of what the turn prevents.
    #[cfg(test)]
    pub fn never_turn(&mut self) {
        self.turn_after = Duration::MAX;
    }

    /// A new connection to `authority`, its task on this thread's runtime.
    async fn connect(&self, authority: &Authority) -> Result<SendRequest<Body>, SendError> {
        let uri = Uri::builder()
            .scheme(self.scheme.clone())
            .authority(authority.clone())
            .path_and_query("/")
            .build()?;
        let io = tower::ServiceExt::oneshot(self.connector.clone(), uri).await?;
        let (sender, connection) = http1::Builder::new().handshake(io).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("a connection to the store ended: {e}");
            }
        });
        Ok(sender)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_that_closes_its_connection_is_seen() {
        let mut h = http::HeaderMap::new();
        assert!(!closes(&h));
        h.append(
            http::header::CONNECTION,
            http::HeaderValue::from_static("keep-alive"),
        );
        assert!(!closes(&h));
        h.append(
            http::header::CONNECTION,
            http::HeaderValue::from_static("TE, Close"),
        );
        assert!(closes(&h));
    }
}
