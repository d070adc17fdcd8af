//! TCP relays between a proxy and its store, to put the store's timing in
//! a test's hands.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// Serves a TCP relay on 127.0.0.1 in front of `target`: each connection
/// accepted is handed to `serve`, with the target, on a task of its own.
/// The relay's URL.
pub async fn relay<F, Fut>(target: String, serve: F) -> String
where
    F: Fn(TcpStream, String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            tokio::spawn(serve(client, target.clone()));
        }
    });
    format!("http://{addr}")
}

/// A relayed connection's two sides, each split: the client's (the
/// proxy's) read and write halves, then the store's.
pub type Sides = (OwnedReadHalf, OwnedWriteHalf, OwnedReadHalf, OwnedWriteHalf);

/// Connects `client` to the store at `target`; None if it is not there.
pub async fn connect(client: TcpStream, target: &str) -> Option<Sides> {
    let store = TcpStream::connect(target).await.ok()?;
    let (client_read, client_write) = client.into_split();
    let (store_read, store_write) = store.into_split();
    Some((client_read, client_write, store_read, store_write))
}

/// [`relay`] that connects each client to the store first (a client the
/// store does not answer is dropped) and hands `serve` both sides.
pub async fn relayed<F, Fut>(target: String, serve: F) -> String
where
    F: Fn(Sides) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let serve = Arc::new(serve);
    relay(target, move |client, target| {
        let serve = serve.clone();
        async move {
            if let Some(sides) = connect(client, &target).await {
                serve(sides).await;
            }
        }
    })
    .await
}

/// What a [`holding_relay`] has seen of the request it holds.
#[derive(Default)]
pub struct Held {
    /// The marker reached the relay: the store side holds the request.
    pub reached: AtomicBool,
    /// The client closed a connection that carried the marker.
    pub closed: AtomicBool,
}

impl Held {
    pub fn reached(&self) -> bool {
        self.reached.load(Ordering::Acquire)
    }

    pub fn closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

/// A TCP relay in front of a store that holds back the request whose bytes
/// (head or body) contain `marker` for `hold` before passing them on, as a
/// store does that has received a request and not yet committed it. The
/// store still gets (and commits) the request if the client closes its
/// connection meanwhile; `held` says when the marker arrived and when the
/// client closed a connection that carried it.
pub async fn holding_relay(
    target: String,
    marker: &'static str,
    hold: Duration,
    held: Arc<Held>,
) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    relayed(target, move |(mut cr, mut cw, mut sr, mut sw)| {
        let held = held.clone();
        async move {
            let (seen_tx, seen_rx) = tokio::sync::watch::channel(false);
            // Client → store: every byte is delivered, after the hold when
            // the marker passes, even once the client is gone.
            let (to_store, mut queue) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
            tokio::spawn(async move {
                while let Some(chunk) = queue.recv().await {
                    if String::from_utf8_lossy(&chunk).contains(marker) {
                        tokio::time::sleep(hold).await;
                    }
                    if sw.write_all(&chunk).await.is_err() {
                        return;
                    }
                }
            });
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match cr.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if String::from_utf8_lossy(&buf[..n]).contains(marker) {
                                let _ = seen_tx.send(true);
                                held.reached.store(true, Ordering::Release);
                            }
                            if to_store.send(buf[..n].to_vec()).is_err() {
                                return;
                            }
                        }
                    }
                }
                if *seen_tx.borrow() {
                    held.closed.store(true, Ordering::Release);
                }
            });
            // Store → client: answers pass through; the store's side is
            // read to the end even when the client is gone.
            let mut buf = vec![0u8; 64 * 1024];
            let mut client_gone = false;
            while let Ok(n) = sr.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                if !client_gone && cw.write_all(&buf[..n]).await.is_err() {
                    client_gone = true;
                }
            }
            drop(seen_rx);
        }
    })
    .await
}

/// A TCP relay whose store-bound direction carries at most `per_tick`
/// bytes every 100 ms: a store slow to take a body, so that the proxy holds
/// what its client sent. Answers pass freely. When the proxy closes its
/// side, the store gets what was relayed and then the end of the stream.
/// The count is of the bytes passed on to the store so far.
pub async fn throttled_relay(target: String, per_tick: usize) -> (String, Arc<AtomicU64>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let passed = Arc::new(AtomicU64::new(0));
    let count = passed.clone();
    let url = relayed(target, move |(mut cr, mut cw, mut sr, mut sw)| {
        let count = count.clone();
        async move {
            tokio::spawn(async move {
                let mut buf = vec![0u8; per_tick];
                while let Ok(n) = cr.read(&mut buf).await {
                    if n == 0 || sw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    count.fetch_add(n as u64, Ordering::AcqRel);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                let _ = sw.shutdown().await;
            });
            let _ = tokio::io::copy(&mut sr, &mut cw).await;
        }
    })
    .await;
    (url, passed)
}

/// A TCP relay that records the request line of every request it passes
/// (`"PUT /bkt/key"`), in order. It reads request heads only where a new
/// request can start, so it serves clients that send one request at a time
/// per connection and a `Content-Length` body (the proxy's backend client).
pub async fn recording_relay(target: String) -> (String, Arc<parking_lot::Mutex<Vec<String>>>) {
    recording(target, false).await
}

/// [`recording_relay`] that records each request's whole head (request
/// line and headers) instead of its method and path.
pub async fn recording_relay_heads(
    target: String,
) -> (String, Arc<parking_lot::Mutex<Vec<String>>>) {
    recording(target, true).await
}

async fn recording(
    target: String,
    whole_heads: bool,
) -> (String, Arc<parking_lot::Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let seen: Arc<parking_lot::Mutex<Vec<String>>> = Arc::default();
    let log = seen.clone();
    let url = relayed(target, move |(mut cr, mut cw, mut sr, mut sw)| {
        let log = log.clone();
        async move {
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut sr, &mut cw).await;
            });
            let mut buf = vec![0u8; 64 * 1024];
            // Bytes of the current request's body still to pass.
            let mut body_left = 0usize;
            let mut head = Vec::new();
            loop {
                let n = match cr.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let mut chunk = &buf[..n];
                while !chunk.is_empty() {
                    if body_left > 0 {
                        let k = body_left.min(chunk.len());
                        body_left -= k;
                        chunk = &chunk[k..];
                        continue;
                    }
                    head.push(chunk[0]);
                    chunk = &chunk[1..];
                    if head.ends_with(b"\r\n\r\n") {
                        let text = String::from_utf8_lossy(&head).to_string();
                        let line = text.lines().next().unwrap_or("");
                        let mut parts = line.split(' ');
                        let method = parts.next().unwrap_or("");
                        let path = parts.next().unwrap_or("").split('?').next().unwrap_or("");
                        log.lock().push(if whole_heads {
                            text.clone()
                        } else {
                            format!("{method} {path}")
                        });
                        body_left = super::content_length(&text);
                        head.clear();
                    }
                }
                if sw.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }
    })
    .await;
    (url, seen)
}

/// A TCP link between a service and etcd that a test can slow down and
/// cut: answers (etcd → service) are delayed by [`Link::delay`], requests
/// (service → etcd) by [`Link::delay_requests`], and [`Link::cut`] drops
/// every open connection and black-holes new ones (accepted, never served)
/// until [`Link::restore`]. A request sent just before a cut reaches etcd
/// and is applied; its answer is lost. A delayed request reaches etcd
/// late, whether or not its sender still waits for it, as it would from a
/// member paused with the request in its socket.
#[derive(Debug, Clone)]
pub struct Link {
    pub endpoint: String,
    state: Arc<LinkState>,
}

#[derive(Debug, Default)]
struct LinkState {
    delay_ms: AtomicU64,
    request_delay_ms: AtomicU64,
    cut: AtomicBool,
    /// Bumped by every cut and restore: a connection of an older one ends.
    epoch: AtomicU64,
}

/// Copies `from` to `to`, each read passed on `delay()` after it arrived,
/// in order, until either side closes or `ended()`.
async fn delayed_pipe(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    delay: impl Fn() -> u64,
    ended: impl Fn() -> bool + Clone,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let writer = {
        let ended = ended.clone();
        async move {
            while let Some((due, bytes)) = rx.recv().await {
                tokio::time::sleep_until(due).await;
                if ended() || to.write_all(&bytes).await.is_err() {
                    return;
                }
            }
        }
    };
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = from.read(&mut buf).await {
            if n == 0 || ended() {
                return;
            }
            let due = tokio::time::Instant::now() + Duration::from_millis(delay());
            if tx.send((due, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    };
    // The writer drains what was read before the reader ended.
    tokio::join!(reader, writer);
}

impl Link {
    pub async fn start(target: String) -> Link {
        let state = Arc::new(LinkState::default());
        let st = state.clone();
        let endpoint = relay(target, move |client, target| {
            let st = st.clone();
            async move {
                let epoch = st.epoch.load(Ordering::Acquire);
                let ended = {
                    let st = st.clone();
                    move || st.epoch.load(Ordering::Acquire) != epoch
                };
                if st.cut.load(Ordering::Acquire) {
                    // A black hole: held open, never served.
                    while !ended() {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    return;
                }
                let Some((cr, cw, sr, sw)) = connect(client, &target).await else {
                    return;
                };
                // The delay of one direction, read afresh for each chunk.
                let delay = |of: fn(&LinkState) -> &AtomicU64| {
                    let st = st.clone();
                    move || of(&st).load(Ordering::Acquire)
                };
                let up = delayed_pipe(cr, sw, delay(|s| &s.request_delay_ms), ended.clone());
                let down = delayed_pipe(sr, cw, delay(|s| &s.delay_ms), ended.clone());
                let watch_end = async move {
                    while !ended() {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                };
                // Whichever ends first ends the connection (both sockets
                // drop with this task).
                tokio::select! {
                    () = up => {}
                    () = down => {}
                    () = watch_end => {}
                }
            }
        })
        .await;
        Link { endpoint, state }
    }

    /// Every answer from now on arrives this much later.
    pub fn delay(&self, d: Duration) {
        self.state.delay_ms.store(millis(d), Ordering::Release);
    }

    /// Every request from now on reaches etcd this much later.
    pub fn delay_requests(&self, d: Duration) {
        self.state
            .request_delay_ms
            .store(millis(d), Ordering::Release);
    }

    /// Drops every connection; new ones are black-holed.
    pub fn cut(&self) {
        self.state.cut.store(true, Ordering::Release);
        self.state.epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// Serves new connections again (black-holed ones are dropped).
    pub fn restore(&self) {
        self.state.cut.store(false, Ordering::Release);
        self.state.epoch.fetch_add(1, Ordering::AcqRel);
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// How a [`quirky_store`] misbehaves, at the HTTP level, in front of a real
/// store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quirk {
    /// Closes each connection after its first answer, as a store closes
    /// idle connections, without saying so.
    ClosesWhenIdle,
    /// Says `Connection: close` in each answer, and closes after it.
    SaysClose,
    /// Sends `100 Continue` before each answer.
    Continues,
    /// Answers `200` with a longer body announced than it sends, then
    /// closes: a response that ends early.
    EndsEarly,
    /// Answers each request with a `503 SlowDown` in a chunked body.
    ChunkedError,
    /// Answers each request with a `500` whose body is 1 MiB.
    HugeError,
    /// Answers `403 AccessDenied` as soon as a request's head arrives,
    /// before its body, reads the body and closes.
    AnswersEarly,
    /// Reads a request whole and closes its connection without an answer,
    /// then passes the request on to the store [`LATE`] later: a store
    /// that commits a request whose connection was reset (by a middlebox,
    /// or by the store itself) before it answered.
    CommitsUnanswered,
    /// As [`Quirk::CommitsUnanswered`], with an answer no HTTP client can
    /// read sent before the close.
    CommitsGarbled,
}

/// How long after closing the connection a [`Quirk::CommitsUnanswered`]
/// store commits the request.
pub const LATE: Duration = Duration::from_secs(2);

/// What a [`quirky_store`] saw: each request line, with the number of the
/// connection it came on (from 0, in the order they were accepted).
#[derive(Debug, Default)]
pub struct QuirkLog {
    /// Off, a new connection is relayed as it is (the proxy's start, and
    /// its probe of the store, meet the store itself); turned on, those
    /// connections close, so the proxy's next writes come on new ones.
    on: tokio::sync::watch::Sender<bool>,
    connections: AtomicU64,
    pub requests: parking_lot::Mutex<Vec<(u64, String)>>,
}

impl QuirkLog {
    /// Connections accepted from now on misbehave.
    pub fn turn_on(&self) {
        self.on.send_replace(true);
    }

    /// The connections each `PUT` of `path` (with any query) came on, in
    /// order.
    pub fn puts_of(&self, path: &str) -> Vec<u64> {
        let line = format!("PUT {path}");
        self.requests
            .lock()
            .iter()
            .filter(|(_, l)| {
                l.strip_prefix(&line)
                    .is_some_and(|rest| rest.starts_with([' ', '?']))
            })
            .map(|(c, _)| *c)
            .collect()
    }
}

/// Reads one HTTP/1.1 head (up to the blank line) from `from`, with what
/// was read past it left in `buf`. None at the end of the stream.
async fn read_head(from: &mut OwnedReadHalf, buf: &mut Vec<u8>) -> Option<String> {
    use tokio::io::AsyncReadExt;
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head: Vec<u8> = buf.drain(..end + 4).collect();
            return Some(String::from_utf8_lossy(&head).into_owned());
        }
        let mut chunk = [0u8; 16 * 1024];
        match from.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The `n` bytes of a body from `from`, after what `buf` holds; None if
/// `from` ended first.
async fn take_body(from: &mut OwnedReadHalf, buf: &mut Vec<u8>, n: usize) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    while buf.len() < n {
        let mut chunk = [0u8; 64 * 1024];
        match from.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(m) => buf.extend_from_slice(&chunk[..m]),
        }
    }
    Some(buf.drain(..n).collect())
}

/// An S3 error answer with `status` and `code`, its XML in a
/// `content-length` body.
fn error_answer(status: &str, code: &str, message: &str, close: bool) -> Vec<u8> {
    let xml = format!(
        "<?xml version=\"1.0\"?><Error><Code>{code}</Code><Message>{message}</Message></Error>"
    );
    let close = if close { "connection: close\r\n" } else { "" };
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/xml\r\ncontent-length: {}\r\n{close}\r\n{xml}",
        xml.len()
    )
    .into_bytes()
}

/// What a [`quirky_store`] sends back for a `PUT` the store answered
/// `answer` (head) with `body`.
fn quirked(quirk: Quirk, answer: &str, body: &[u8]) -> Vec<u8> {
    match quirk {
        Quirk::SaysClose => [
            answer
                .replacen("\r\n", "\r\nConnection: close\r\n", 1)
                .as_bytes(),
            body,
        ]
        .concat(),
        Quirk::Continues => [
            b"HTTP/1.1 100 Continue\r\n\r\n".as_slice(),
            answer.as_bytes(),
            body,
        ]
        .concat(),
        Quirk::EndsEarly => {
            let kept: Vec<&str> = answer
                .trim_end()
                .split("\r\n")
                .filter(|l| !l.to_ascii_lowercase().starts_with("content-length:"))
                .collect();
            format!(
                "{}\r\ncontent-length: 100\r\n\r\ncut short",
                kept.join("\r\n")
            )
            .into_bytes()
        }
        _ => [answer.as_bytes(), body].concat(),
    }
}

/// What the key of a `PUT` a [`quirky_store`] misbehaves on contains.
pub const QUIRKY: &str = "quirky-";

/// A store at `target` behind a relay that misbehaves as `quirk` says, on
/// connections accepted once [`QuirkLog::turn_on`] was called, and on
/// `PUT`s of keys with [`QUIRKY`] in them only (the proxy's other requests
/// pass as they are). It serves
/// one request at a time per connection, each with a `Content-Length`
/// body (as the proxy sends them). The errors are answered by the relay:
/// their `PUT`s never reach the store. The relay's URL, and what it saw.
pub async fn quirky_store(target: String, quirk: Quirk) -> (String, Arc<QuirkLog>) {
    use tokio::io::AsyncWriteExt;
    let log = Arc::new(QuirkLog::default());
    let seen = log.clone();
    let url = relayed(target, move |(mut cr, mut cw, mut sr, mut sw)| {
        let seen = seen.clone();
        async move {
            if !*seen.on.borrow() {
                let mut turned_on = seen.on.subscribe();
                tokio::select! {
                    _ = tokio::io::copy(&mut sr, &mut cw) => {}
                    _ = tokio::io::copy(&mut cr, &mut sw) => {}
                    _ = turned_on.wait_for(|on| *on) => {}
                }
                return;
            }
            let connection = seen.connections.fetch_add(1, Ordering::AcqRel);
            let (mut from_client, mut from_store) = (Vec::new(), Vec::new());
            while let Some(head) = read_head(&mut cr, &mut from_client).await {
                let line = head.lines().next().unwrap_or_default().to_owned();
                let put = line.starts_with("PUT ") && line.contains(QUIRKY);
                let head_request = line.starts_with("HEAD ");
                seen.requests.lock().push((connection, line));
                let length = super::content_length(&head);
                let refusal = match quirk {
                    Quirk::AnswersEarly => Some(error_answer(
                        "403 Forbidden",
                        "AccessDenied",
                        "refused before the body",
                        true,
                    )),
                    Quirk::HugeError => Some(
                        format!(
                            "HTTP/1.1 500 Internal Server Error\r\ncontent-length: {}\r\n\r\n{}",
                            1 << 20,
                            "x".repeat(1 << 20)
                        )
                        .into_bytes(),
                    ),
                    Quirk::ChunkedError => {
                        let xml = "<?xml version=\"1.0\"?><Error><Code>SlowDown</Code>\
                                   <Message>chunked slow down</Message></Error>";
                        let (a, b) = xml.split_at(20);
                        Some(
                            format!(
                                "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/xml\r\n\
                                 transfer-encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
                                a.len(),
                                b.len()
                            )
                            .into_bytes(),
                        )
                    }
                    _ => None,
                };
                if let Some(refusal) = refusal.filter(|_| put) {
                    if quirk == Quirk::AnswersEarly {
                        // Answered before the body; the body is read, and
                        // the connection closed.
                        let _ = cw.write_all(&refusal).await;
                        let _ = take_body(&mut cr, &mut from_client, length).await;
                        return;
                    }
                    if take_body(&mut cr, &mut from_client, length).await.is_none()
                        || cw.write_all(&refusal).await.is_err()
                    {
                        return;
                    }
                    continue;
                }
                let Some(body) = take_body(&mut cr, &mut from_client, length).await else {
                    return;
                };
                if put && matches!(quirk, Quirk::CommitsUnanswered | Quirk::CommitsGarbled) {
                    if quirk == Quirk::CommitsGarbled {
                        let _ = cw.write_all(b"HTTP/1.1 2x0 Garbled\r\n\r\n").await;
                    }
                    // The client's connection closes now (returning drops
                    // it); the store gets the request later, on its own.
                    tokio::spawn(async move {
                        tokio::time::sleep(LATE).await;
                        if sw.write_all(head.as_bytes()).await.is_ok()
                            && sw.write_all(&body).await.is_ok()
                        {
                            let _ = read_head(&mut sr, &mut from_store).await;
                        }
                    });
                    return;
                }
                if sw.write_all(head.as_bytes()).await.is_err() || sw.write_all(&body).await.is_err() {
                    return;
                }
                let Some(answer) = read_head(&mut sr, &mut from_store).await else {
                    return;
                };
                let bodiless =
                    head_request || [" 204 ", " 304 "].iter().any(|s| answer.contains(s));
                let length = if bodiless { 0 } else { super::content_length(&answer) };
                let Some(answer_body) = take_body(&mut sr, &mut from_store, length).await else {
                    return;
                };
                let out = if put {
                    quirked(quirk, &answer, &answer_body)
                } else {
                    [answer.as_bytes(), &answer_body].concat()
                };
                if cw.write_all(&out).await.is_err() {
                    return;
                }
                let closes = matches!(
                    quirk,
                    Quirk::ClosesWhenIdle | Quirk::SaysClose | Quirk::EndsEarly
                );
                if put && closes {
                    return;
                }
            }
        }
    })
    .await;
    (url, log)
}
