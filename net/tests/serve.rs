//! The serving layer over real sockets: header and idle timeouts, the
//! connection cap and its recovery, TLS with a generated CA, shutdown,
//! serving threads.

use bytes::Bytes;
use fencegate_net::test_pki::TestCa;
use fencegate_net::tls::{ClientTls, TlsConfig};
use fencegate_net::{Refusal, ServerOptions};
use http::{Request, Response};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// `GET /` answers "hello"; `GET /slow` answers after 1.5 s; `POST /refuse`
/// answers 409 at once and reads its body in the background, slowly (like
/// the proxy refusing a write on its headers); any other POST reads its
/// body and echoes its length.
async fn handler(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let text = |s: String| Ok(Response::new(Full::new(Bytes::from(s))));
    match (req.method().as_str(), req.uri().path()) {
        ("GET", "/thread") => text(std::thread::current().name().unwrap_or("").to_owned()),
        ("GET", "/slow") => {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            text("slow hello".into())
        }
        ("POST", "/refuse") => {
            let body = fencegate_net::track_request_body(req).into_body();
            tokio::spawn(async move {
                let _ = body.collect().await;
            });
            let mut r = Response::new(Full::new(Bytes::from_static(b"refused")));
            *r.status_mut() = http::StatusCode::CONFLICT;
            Ok(r)
        }
        ("POST", _) => {
            let n = req
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes().len())
                .unwrap_or(0);
            text(format!("{n} bytes"))
        }
        _ => text("hello".into()),
    }
}

struct Server {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    async fn start(options: ServerOptions) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let service = hyper::service::service_fn(handler);
        let task = tokio::spawn(fencegate_net::serve(listener, service, options, async {
            let _ = rx.await;
        }));
        Server {
            addr,
            stop: Some(tx),
            task,
        }
    }

    fn url(&self, scheme: &str, path: &str) -> String {
        let host = if scheme == "https" {
            "localhost"
        } else {
            "127.0.0.1"
        };
        format!("{scheme}://{host}:{}{path}", self.addr.port())
    }

    async fn connect(&self) -> TcpStream {
        TcpStream::connect(self.addr).await.expect("connect")
    }

    async fn shutdown(mut self) -> Duration {
        let started = Instant::now();
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        (&mut self.task)
            .await
            .expect("server task")
            .expect("server ends cleanly");
        started.elapsed()
    }
}

fn options(header_ms: u64, idle_ms: u64) -> ServerOptions {
    ServerOptions {
        header_read_timeout: Duration::from_millis(header_ms),
        idle_timeout: Duration::from_millis(idle_ms),
        ..ServerOptions::default()
    }
}

/// Reads one response (head, then `content-length` bytes); `None` if the
/// connection closed first.
async fn read_response<S: AsyncRead + Unpin>(s: &mut S) -> Option<(u16, String, String)> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte).await {
            Ok(1) => buf.push(byte[0]),
            _ => return None,
        }
    }
    let head = String::from_utf8(buf).expect("ascii head");
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await.ok()?;
    Some((status, head, String::from_utf8_lossy(&body).into_owned()))
}

/// How long until the peer closes `s` (reads returning 0 or an error),
/// discarding anything it sends; panics after `limit`.
async fn closed_within<S: AsyncRead + Unpin>(s: &mut S, limit: Duration) -> Duration {
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    let wait = async { while let Ok(1..) = s.read(&mut buf).await {} };
    tokio::time::timeout(limit, wait)
        .await
        .unwrap_or_else(|_| panic!("the connection was still open after {limit:?}"));
    started.elapsed()
}

const GET: &[u8] = b"GET / HTTP/1.1\r\nhost: test\r\n\r\n";

#[tokio::test]
async fn a_head_stuck_midway_is_closed_after_the_header_timeout() {
    let server = Server::start(options(500, 30_000)).await;
    let mut c = server.connect().await;
    c.write_all(b"GET / HTTP/1.1\r\nhost: te")
        .await
        .expect("write");
    let closed = closed_within(&mut c, Duration::from_secs(5)).await;
    assert!(
        closed >= Duration::from_millis(400) && closed < Duration::from_secs(2),
        "closed after {closed:?}, expected about 500 ms"
    );
}

#[tokio::test]
async fn a_head_trickled_in_byte_by_byte_does_not_keep_the_connection() {
    let server = Server::start(options(500, 30_000)).await;
    let c = server.connect().await;
    let (mut r, mut w) = c.into_split();
    // 31 bytes at one per 100 ms would take 3 s: each byte is activity, but
    // the head's deadline does not move.
    let trickle = tokio::spawn(async move {
        for b in GET {
            if w.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let closed = closed_within(&mut r, Duration::from_secs(5)).await;
    assert!(
        closed < Duration::from_millis(1500),
        "closed after {closed:?}"
    );
    trickle.abort();
}

#[tokio::test]
async fn a_silent_new_connection_is_closed_after_the_header_timeout() {
    let server = Server::start(options(500, 30_000)).await;
    let mut c = server.connect().await;
    let closed = closed_within(&mut c, Duration::from_secs(5)).await;
    assert!(closed < Duration::from_secs(2), "closed after {closed:?}");
}

#[tokio::test]
async fn an_idle_keep_alive_connection_lives_for_the_idle_timeout_not_the_header_timeout() {
    let server = Server::start(options(300, 1500)).await;
    let mut c = server.connect().await;
    c.write_all(GET).await.expect("write");
    let (status, _, body) = read_response(&mut c).await.expect("first answer");
    assert_eq!((status, body.as_str()), (200, "hello"));
    // Idle for longer than the header timeout: still usable.
    tokio::time::sleep(Duration::from_millis(800)).await;
    c.write_all(GET).await.expect("write");
    let (status, _, _) = read_response(&mut c)
        .await
        .expect("an idle connection is kept for the idle timeout");
    assert_eq!(status, 200);
    // Then idle for good: closed after about the idle timeout.
    let closed = closed_within(&mut c, Duration::from_secs(6)).await;
    assert!(
        closed >= Duration::from_millis(1300) && closed < Duration::from_millis(3500),
        "closed after {closed:?}, expected about 1.5 s"
    );
}

#[tokio::test]
async fn a_slow_answer_is_not_cut_by_either_timeout() {
    let server = Server::start(options(300, 500)).await;
    let mut c = server.connect().await;
    c.write_all(b"GET /slow HTTP/1.1\r\nhost: test\r\n\r\n")
        .await
        .expect("write");
    let (status, _, body) = read_response(&mut c).await.expect("answered");
    assert_eq!((status, body.as_str()), (200, "slow hello"));
}

/// A client that ends its sending side once its request is out
/// (`shutdown(SHUT_WR)`) reads the answer of a slow handler when the
/// server allows a half-close; without it, the connection closes
/// unanswered and the handler is dropped (what the lease service wants
/// for an acquire whose client left).
#[tokio::test]
async fn a_half_closed_client_gets_its_answer_only_where_half_close_is_allowed() {
    for half_close in [true, false] {
        let server = Server::start(ServerOptions {
            half_close,
            ..options(2000, 2000)
        })
        .await;
        let mut c = server.connect().await;
        c.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        c.shutdown().await.expect("half-close");
        let answer = tokio::time::timeout(Duration::from_secs(10), read_response(&mut c))
            .await
            .expect("the server answers or closes, no hang");
        match half_close {
            true => {
                let (status, _, body) = answer.expect("answered after the half-close");
                assert_eq!((status, body.as_str()), (200, "slow hello"));
            }
            false => assert!(
                answer.is_none(),
                "without half-close the end of the client's sending closes the connection: {answer:?}"
            ),
        }
        server.shutdown().await;
    }
}

#[tokio::test]
async fn a_request_body_still_arriving_after_its_answer_is_not_timed_as_a_head() {
    let server = Server::start(options(300, 5000)).await;
    let mut c = server.connect().await;
    c.write_all(b"POST /refuse HTTP/1.1\r\nhost: test\r\ncontent-length: 12\r\n\r\n")
        .await
        .expect("write");
    let (status, _, _) = read_response(&mut c).await.expect("refused at once");
    assert_eq!(status, 409);
    // The body comes slowly, well past the header timeout (the handler's
    // background task reads it, as the proxy drains a refused upload).
    for b in b"0123456789ab" {
        tokio::time::sleep(Duration::from_millis(100)).await;
        c.write_all(&[*b])
            .await
            .expect("the connection is still open while the body arrives");
    }
    c.write_all(GET).await.expect("write");
    let (status, _, body) = read_response(&mut c)
        .await
        .expect("the connection is still usable after the drained body");
    assert_eq!((status, body.as_str()), (200, "hello"));
}

#[tokio::test]
async fn at_the_cap_a_new_connection_gets_a_clear_503_and_service_resumes_when_others_close() {
    let server = Server::start(ServerOptions {
        max_connections: 2,
        refusal: Refusal::new(
            "application/json",
            r#"{"error":{"code":"TooManyConnections"}}"#,
        ),
        ..options(30_000, 30_000)
    })
    .await;
    let mut first = server.connect().await;
    first.write_all(GET).await.expect("write");
    assert_eq!(read_response(&mut first).await.expect("served").0, 200);
    let second = server.connect().await;

    // A real client over the cap: a 503 it can read, not a hang or a reset.
    let client = reqwest::Client::new();
    for _ in 0..3 {
        let resp = client
            .get(server.url("http", "/"))
            .send()
            .await
            .expect("the refusal is an HTTP answer");
        assert_eq!(resp.status(), 503);
        assert_eq!(resp.headers()["connection"], "close");
        assert_eq!(resp.headers()["retry-after"], "1");
        assert_eq!(
            resp.text().await.expect("body"),
            r#"{"error":{"code":"TooManyConnections"}}"#
        );
    }
    // The two held connections are unaffected.
    first.write_all(GET).await.expect("write");
    assert_eq!(
        read_response(&mut first).await.expect("still served").0,
        200
    );

    // One closes: new clients are served again, without a restart.
    drop(second);
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let resp = client
            .get(server.url("http", "/"))
            .send()
            .await
            .expect("answer");
        if resp.status() == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "never served again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn shutdown_finishes_the_request_in_flight_and_closes_idle_connections() {
    let server = Server::start(options(10_000, 60_000)).await;
    let mut idle = server.connect().await;
    idle.write_all(GET).await.expect("write");
    read_response(&mut idle).await.expect("answered");
    let mut busy = server.connect().await;
    busy.write_all(b"GET /slow HTTP/1.1\r\nhost: test\r\n\r\n")
        .await
        .expect("write");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let took = tokio::spawn(server.shutdown());
    closed_within(&mut idle, Duration::from_millis(500)).await;
    let (status, _, _) = read_response(&mut busy).await.expect("finished");
    assert_eq!(status, 200);
    let took = took.await.expect("shutdown");
    assert!(took < Duration::from_secs(3), "shutdown took {took:?}");
}

struct Pki {
    dir: tempfile::TempDir,
    ca: TestCa,
}

impl Pki {
    fn new() -> Pki {
        Pki {
            dir: tempfile::tempdir().expect("tempdir"),
            ca: TestCa::new("fencegate test CA"),
        }
    }

    fn server_tls(&self, client_ca: bool) -> TlsConfig {
        let files = self.ca.server(self.dir.path(), "server");
        TlsConfig {
            cert_file: Some(files.cert),
            key_file: Some(files.key),
            client_ca_file: client_ca.then(|| self.ca.write(self.dir.path(), "ca.crt")),
        }
    }

    fn client(&self, tls: ClientTls) -> reqwest::Client {
        tls.http_client()
            .expect("client TLS")
            .build()
            .expect("client")
    }

    fn trusting(&self) -> ClientTls {
        ClientTls {
            ca_file: Some(self.ca.write(self.dir.path(), "ca.crt")),
            ..ClientTls::default()
        }
    }
}

async fn tls_server(tls: &TlsConfig, header_ms: u64) -> Server {
    Server::start(ServerOptions {
        tls: tls.server_config().expect("valid TLS files"),
        ..options(header_ms, 30_000)
    })
    .await
}

#[tokio::test]
async fn tls_with_a_generated_ca_and_plain_http_to_the_tls_port_gets_a_clear_400() {
    let pki = Pki::new();
    let server = tls_server(&pki.server_tls(false), 10_000).await;
    let client = pki.client(pki.trusting());
    let resp = client
        .get(server.url("https", "/"))
        .send()
        .await
        .expect("https with the CA");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.expect("body"), "hello");

    // Without the CA (the system roots only), the server is not trusted.
    let err = pki
        .client(ClientTls::default())
        .get(server.url("https", "/"))
        .send()
        .await
        .expect_err("an unknown CA is refused");
    assert!(
        format!("{err:?}").contains("UnknownIssuer"),
        "unexpected error {err:?}"
    );

    // Plain HTTP to the TLS port: a readable 400, and the server goes on.
    let resp = reqwest::get(server.url("http", "/"))
        .await
        .expect("plain HTTP gets an answer");
    assert_eq!(resp.status(), 400);
    fencegate_testkit::assert_mentions(&resp.text().await.expect("body"), &["use an https:// URL"]);
    let resp = client
        .post(server.url("https", "/echo"))
        .body("twelve bytes")
        .send()
        .await
        .expect("still serving https");
    assert_eq!(resp.text().await.expect("body"), "12 bytes");
}

#[tokio::test]
async fn over_tls_a_stalled_handshake_and_a_stalled_head_are_closed() {
    let pki = Pki::new();
    let server = tls_server(&pki.server_tls(false), 500).await;
    // No handshake at all.
    let mut raw = server.connect().await;
    let closed = closed_within(&mut raw, Duration::from_secs(5)).await;
    assert!(closed < Duration::from_secs(2), "closed after {closed:?}");
    // Handshake done, head stalled midway.
    let connector = tokio_rustls::TlsConnector::from(Arc::new(
        pki.trusting().rustls_config().expect("client config"),
    ));
    let mut tls = connector
        .connect(
            "localhost".try_into().expect("name"),
            server.connect().await,
        )
        .await
        .expect("handshake");
    tls.write_all(b"GET / HTTP/1.1\r\nho").await.expect("write");
    let closed = closed_within(&mut tls, Duration::from_secs(5)).await;
    assert!(closed < Duration::from_secs(2), "closed after {closed:?}");
}

#[tokio::test]
async fn at_the_cap_a_tls_client_reads_its_503_through_tls() {
    let pki = Pki::new();
    let tls = pki.server_tls(false);
    let server = Server::start(ServerOptions {
        max_connections: 1,
        tls: tls.server_config().expect("valid"),
        ..options(30_000, 30_000)
    })
    .await;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(
        pki.trusting().rustls_config().expect("client config"),
    ));
    let held = connector
        .connect(
            "localhost".try_into().expect("name"),
            server.connect().await,
        )
        .await
        .expect("handshake");
    let resp = pki
        .client(pki.trusting())
        .get(server.url("https", "/"))
        .send()
        .await
        .expect("an HTTPS answer");
    assert_eq!(resp.status(), 503);
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(3);
    while pki
        .client(pki.trusting())
        .get(server.url("https", "/"))
        .send()
        .await
        .expect("answer")
        .status()
        != 200
    {
        assert!(Instant::now() < deadline, "never served again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn client_certificates_are_required_when_a_client_ca_is_set() {
    let pki = Pki::new();
    let server = tls_server(&pki.server_tls(true), 10_000).await;
    let url = server.url("https", "/");
    // No client certificate: the handshake fails.
    pki.client(pki.trusting())
        .get(&url)
        .send()
        .await
        .expect_err("a client without a certificate is refused");
    // A certificate from another CA: refused too.
    let other = TestCa::new("another CA");
    let stranger = other.client(pki.dir.path(), "stranger", "stranger");
    pki.client(ClientTls {
        cert_file: Some(stranger.cert),
        key_file: Some(stranger.key),
        ..pki.trusting()
    })
    .get(&url)
    .send()
    .await
    .expect_err("a certificate from another CA is refused");
    // One signed by the client CA: served.
    let alice = pki.ca.client(pki.dir.path(), "alice", "alice");
    let resp = pki
        .client(ClientTls {
            cert_file: Some(alice.cert),
            key_file: Some(alice.key),
            ..pki.trusting()
        })
        .get(&url)
        .send()
        .await
        .expect("a client with a certificate from the client CA is served");
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn bad_tls_files_are_reported_with_what_is_wrong() {
    let pki = Pki::new();
    let dir = pki.dir.path();
    let one = pki.ca.server(dir, "one");
    let two = pki.ca.server(dir, "two");
    let garbage = dir.join("garbage.pem");
    std::fs::write(&garbage, "not a certificate").expect("write");
    let problems = |cert: &std::path::Path, key: &std::path::Path| {
        TlsConfig {
            cert_file: Some(cert.to_owned()),
            key_file: Some(key.to_owned()),
            client_ca_file: None,
        }
        .problems()
        .join("\n")
    };
    assert_eq!(problems(&one.cert, &one.key), "");
    let p = problems(&one.cert, &two.key);
    fencegate_testkit::assert_mentions(&p, &["does not match the certificate"]);
    let p = problems(&dir.join("missing.crt"), &one.key);
    fencegate_testkit::assert_mentions(&p, &["missing.crt: cannot read it"]);
    // Both files wrong: both listed.
    let p = problems(&garbage, &one.cert);
    fencegate_testkit::assert_mentions(&p, &["no PEM certificate"]);
    fencegate_testkit::assert_mentions(&p, &["no PEM private key"]);
    let p = TlsConfig {
        client_ca_file: Some(garbage.clone()),
        ..pki.server_tls(false)
    }
    .problems()
    .join("\n");
    fencegate_testkit::assert_mentions(&p, &["tls.client_ca_file"]);

    let client = ClientTls {
        ca_file: Some(garbage),
        ..ClientTls::default()
    };
    let e = client.rustls_config().expect_err("garbage CA");
    assert!(e.to_string().contains("no PEM certificate"), "{e}");
}

#[tokio::test]
async fn with_serving_threads_each_connection_lives_on_one_and_they_share_the_load() {
    let workers = fencegate_net::Workers::start(2, "test-serve").expect("workers");
    let server = Server::start(ServerOptions {
        workers: Some(workers.clone()),
        ..options(300, 60_000)
    })
    .await;
    // Two open connections go to different threads (the least busy one
    // gets the next), and every request of a connection to the same one.
    let mut seen = Vec::new();
    let mut open = Vec::new();
    for _ in 0..2 {
        let mut c = server.connect().await;
        let mut names = Vec::new();
        for _ in 0..3 {
            c.write_all(b"GET /thread HTTP/1.1\r\nhost: test\r\n\r\n")
                .await
                .expect("write");
            let (status, _, name) = read_response(&mut c).await.expect("answered");
            assert_eq!(status, 200);
            names.push(name);
        }
        assert!(names.iter().all(|n| *n == names[0]), "{names:?}");
        assert!(names[0].starts_with("test-serve-"), "{names:?}");
        seen.push(names[0].clone());
        open.push(c);
    }
    assert_ne!(seen[0], seen[1], "both connections went to one thread");
    // The connection timers run on the serving threads too.
    let mut stuck = server.connect().await;
    stuck
        .write_all(b"GET / HTTP/1.1\r\nhos")
        .await
        .expect("write");
    let took = closed_within(&mut stuck, Duration::from_secs(3)).await;
    assert!(took >= Duration::from_millis(250), "closed after {took:?}");
    // Shutdown lets a slow request on a serving thread finish.
    let mut busy = server.connect().await;
    busy.write_all(b"GET /slow HTTP/1.1\r\nhost: test\r\n\r\n")
        .await
        .expect("write");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let took = tokio::spawn(server.shutdown());
    let (status, _, body) = read_response(&mut busy).await.expect("finished");
    assert_eq!((status, body.as_str()), (200, "slow hello"));
    for mut c in open {
        closed_within(&mut c, Duration::from_millis(500)).await;
    }
    took.await.expect("shutdown");
}
