//! TLS and connection limits end to end: real `fencegate locksvc` and
//! `fencegate proxy` processes, certificates from a CA generated per test
//! (rcgen), the real CLI, raw sockets for the misbehaving clients.

mod support;

use fencegate_net::test_pki::{CertFiles, TestCa};
use fencegate_net::tls::ClientTls;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use std::time::{Duration, Instant};
use support::s3::*;
use support::*;

const BUCKET: &str = "bkt";

/// A CA, a server certificate for localhost/127.0.0.1 and a client
/// certificate, as PEM files in a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
    ca: TestCa,
    ca_file: PathBuf,
    server: CertFiles,
    client: CertFiles,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempdir();
        let ca = TestCa::new("fencegate e2e CA");
        let ca_file = ca.write(dir.path(), "ca.crt");
        let server = ca.server(dir.path(), "server");
        let client = ca.client(dir.path(), "client", "backup-job");
        Pki {
            dir,
            ca,
            ca_file,
            server,
            client,
        }
    }

    /// A `[tls]` table serving this PKI's server certificate.
    fn tls_table(&self, client_certs: bool) -> String {
        let mut t = format!(
            "[tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
            self.server.cert.display(),
            self.server.key.display()
        );
        if client_certs {
            t += &format!("client_ca_file = \"{}\"\n", self.ca_file.display());
        }
        t
    }

    fn client_tls(&self, with_cert: bool) -> ClientTls {
        ClientTls {
            ca_file: Some(self.ca_file.clone()),
            cert_file: with_cert.then(|| self.client.cert.clone()),
            key_file: with_cert.then(|| self.client.key.clone()),
        }
    }
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// A lease service started with `toml` as its config file.
fn locksvc_with(dir: &Path, toml: &str, env: &[(&str, &str)]) -> Service {
    let config = dir.join("locksvc.toml");
    std::fs::write(&config, toml).expect("write config");
    let mut cmd = locksvc_cmd(dir, env);
    cmd.arg("--config").arg(&config);
    Service::start(cmd)
}

/// `fencegate <args>` with no TLS settings inherited from the environment.
fn cli(args: &[&str]) -> Command {
    let mut cmd = fencegate();
    cmd.args(args);
    for var in [
        "FENCEGATE_LOCKSVC",
        "FENCEGATE_CA_FILE",
        "FENCEGATE_CLIENT_CERT",
        "FENCEGATE_CLIENT_KEY",
        "FENCEGATE_API_KEY",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("fencegate runs")
}

fn describe(out: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn addr_of(url: &str) -> String {
    url.split("://")
        .nth(1)
        .expect("scheme")
        .trim_end_matches('/')
        .to_owned()
}

#[test]
fn lease_commands_over_https_with_the_ca_file() {
    let pki = Pki::new();
    let dir = tempdir();
    // TLS from the environment, like the other settings.
    let svc = Service::start(locksvc_cmd(
        dir.path(),
        &[
            ("FENCEGATE_TLS_CERT_FILE", path_str(&pki.server.cert)),
            ("FENCEGATE_TLS_KEY_FILE", path_str(&pki.server.key)),
        ],
    ));
    assert!(svc.url.starts_with("https://"), "announced {}", svc.url);
    let url = svc.url.as_str();
    let ca = path_str(&pki.ca_file);

    let out = run(&mut cli(&[
        "lease",
        "acquire",
        "backups",
        "--owner",
        "alice",
        "--format",
        "token",
        "--locksvc",
        url,
        "--ca-file",
        ca,
    ]));
    assert!(out.status.success(), "{}", describe(&out));
    let token = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(token.starts_with("fgt1:backups:"), "{token}");

    // The CA file from the environment; status shows alice's lease.
    let out =
        run(cli(&["lease", "status", "backups", "--locksvc", url]).env("FENCEGATE_CA_FILE", ca));
    assert!(out.status.success(), "{}", describe(&out));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(status["owner"], "alice");

    // Renew and release over https too (the same client).
    for sub in ["renew", "release"] {
        let out = run(&mut cli(&[
            "lease",
            sub,
            "backups",
            "--token",
            &token,
            "--locksvc",
            url,
            "--ca-file",
            ca,
        ]));
        assert!(out.status.success(), "{sub}: {}", describe(&out));
    }

    // `fencegate run` acquires, renews (TTL 1 s: renewals every ~330 ms
    // while the command runs 1.5 s) and releases over https.
    let out = run(cli(&[
        "run",
        "--lock",
        "nightly",
        "--ttl",
        "1s",
        "--locksvc",
        url,
        "--",
        "sh",
        "-c",
        "sleep 1.5; echo \"$FENCING_TOKEN\"",
    ])
    .env("FENCEGATE_CA_FILE", ca));
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("fgt1:nightly:"),
        "{}",
        describe(&out)
    );
    let out =
        run(cli(&["lease", "status", "nightly", "--locksvc", url]).env("FENCEGATE_CA_FILE", ca));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(status["held"], false, "run released its lease: {status}");

    // Issue 34: with TLS settings, the fence raise (the signed token) and
    // the S3 endpoint (lease-bound credentials) are refused in clear text,
    // before a lease is taken; nothing reaches the plain listener.
    let plain_proxy = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    plain_proxy.set_nonblocking(true).expect("nonblocking");
    let plain_url = format!("http://{}", plain_proxy.local_addr().expect("addr"));
    for flags in [
        vec!["--fence", plain_url.as_str()],
        vec!["--s3-endpoint", plain_url.as_str(), "--s3-credentials"],
    ] {
        let mut args = vec!["run", "--lock", "clear", "--locksvc", url];
        args.extend(flags.iter().copied());
        args.extend(["--", "true"]);
        let out = run(cli(&args).env("FENCEGATE_CA_FILE", ca));
        assert_eq!(out.status.code(), Some(1), "{flags:?}: {}", describe(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("{} {plain_url} is not https://", flags[0])),
            "{err}"
        );
        assert!(
            plain_proxy.accept().is_err(),
            "{flags:?}: something was sent"
        );
    }
    let out =
        run(cli(&["lease", "status", "clear", "--locksvc", url]).env("FENCEGATE_CA_FILE", ca));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(status["held"], false, "no lease was taken: {status}");

    // `fencegate health` speaks https with the CA.
    let health = format!("{url}/health");
    let out = run(&mut cli(&["health", &health, "--ca-file", ca]));
    assert!(out.status.success(), "{}", describe(&out));

    // Without the CA, the service's certificate is not trusted.
    let out = run(&mut cli(&["lease", "status", "backups", "--locksvc", url]));
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    fencegate_testkit::assert_mentions(&err, &["cannot reach the lease service"]);

    // Plain http to the TLS port: refused with a clear word, not a hang.
    let plain = url.replace("https://", "http://");
    let out = run(&mut cli(&[
        "lease",
        "status",
        "backups",
        "--locksvc",
        &plain,
    ]));
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    // A CA file next to an http:// URL is a mistake, stopped before sending
    // anything.
    let out = run(&mut cli(&[
        "lease",
        "status",
        "backups",
        "--locksvc",
        &plain,
        "--ca-file",
        ca,
    ]));
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    fencegate_testkit::assert_mentions(&err, &["is not https://"]);
    let resp = reqwest::blocking::get(format!("{plain}/health")).expect("an answer");
    assert_eq!(resp.status(), 400);
    assert!(resp.text().expect("body").contains("https://"));
}

#[test]
fn a_lease_service_with_client_ca_requires_client_certificates() {
    let pki = Pki::new();
    let dir = tempdir();
    let svc = locksvc_with(dir.path(), &pki.tls_table(true), &[]);
    let (url, ca) = (svc.url.as_str(), path_str(&pki.ca_file));
    let acquire = |extra: &[&str]| {
        let mut args = vec![
            "lease",
            "acquire",
            "mtls",
            "--owner",
            "bob",
            "--locksvc",
            url,
            "--ca-file",
            ca,
        ];
        args.extend_from_slice(extra);
        run(&mut cli(&args))
    };
    let out = acquire(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let (cert, key) = (path_str(&pki.client.cert), path_str(&pki.client.key));
    let out = acquire(&["--client-cert", cert, "--client-key", key]);
    assert!(out.status.success(), "{}", describe(&out));
    // A certificate from another CA is refused.
    let stranger = TestCa::new("stranger CA").client(pki.dir.path(), "stranger", "stranger");
    let out = acquire(&[
        "--client-cert",
        path_str(&stranger.cert),
        "--client-key",
        path_str(&stranger.key),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    // Client certificate paths from the environment work too.
    let out = run(
        cli(&["lease", "status", "mtls", "--locksvc", url, "--ca-file", ca])
            .env("FENCEGATE_CLIENT_CERT", cert)
            .env("FENCEGATE_CLIENT_KEY", key),
    );
    assert!(out.status.success(), "{}", describe(&out));
}

#[test]
fn bad_tls_files_are_refused_at_start_with_every_problem_named() {
    let pki = Pki::new();
    let dir = tempdir();
    let other = pki.ca.server(pki.dir.path(), "other");
    let garbage = pki.dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not PEM at all").expect("write");

    // Locksvc: the key of another certificate.
    let config = dir.path().join("mismatch.toml");
    std::fs::write(
        &config,
        format!(
            "[tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
            pki.server.cert.display(),
            other.key.display()
        ),
    )
    .expect("write");
    let out = run(locksvc_cmd(dir.path(), &[])
        .arg("--config")
        .arg(&config)
        .arg("--check"));
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    fencegate_testkit::assert_mentions(&err, &["does not match the certificate in tls.cert_file"]);

    // Proxy: a missing certificate, a key file with no key, and a lease
    // service CA that is not PEM, all in one report.
    let backend_stub =
        "[backend]\nendpoint = \"http://127.0.0.1:1\"\naccess_key = \"a\"\nsecret_key = \"b\"\n";
    let config = dir.path().join("proxy.toml");
    std::fs::write(
        &config,
        format!(
            "allow_anonymous = true\naccept_unsigned_tokens = false\nlocksvc_url = \"https://127.0.0.1:1\"\nlocksvc_ca_file = \"{}\"\n\
             [tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n{backend_stub}",
            garbage.display(),
            dir.path().join("missing.crt").display(),
            pki.server.cert.display(),
        ),
    )
    .expect("write");
    let out = run(fencegate()
        .args(["proxy", "--check", "--config"])
        .arg(&config));
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    fencegate_testkit::assert_mentions(
        &err,
        &[
            "missing.crt: cannot read it",
            "no PEM private key",
            "garbage.pem: no PEM certificate",
        ],
    );
}

/// The backend, a TLS lease service requiring client certificates, and a
/// proxy served over TLS that checks plain tokens with that lease service.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn proxy_over_https_serves_s3_and_checks_plain_tokens_with_the_lease_service_over_https() {
    let pki = Pki::new();
    let backend = Backend::start(BackendKind::S3Fs).await;
    backend.create_bucket(BUCKET).await;
    let dir = tempdir();
    let locksvc = {
        let (dir, tls) = (dir.path().to_owned(), pki.tls_table(true));
        tokio::task::spawn_blocking(move || locksvc_with(&dir, &tls, &[]))
            .await
            .expect("locksvc")
    };
    assert!(locksvc.url.starts_with("https://"));
    let issuer_settings = |with_cert: bool| {
        // The issuer check is for plain tokens, which only trusted clients
        // may send (accept_unsigned_tokens).
        let mut s = format!(
            "accept_unsigned_tokens = true\nlocksvc_url = \"{}\"\nlocksvc_ca_file = \"{}\"\n",
            locksvc.url,
            pki.ca_file.display()
        );
        if with_cert {
            s += &format!(
                "locksvc_client_cert_file = \"{}\"\nlocksvc_client_key_file = \"{}\"\n",
                pki.client.cert.display(),
                pki.client.key.display()
            );
        }
        s
    };
    let proxy = Proxy::start(
        &proxy_toml(
            &backend,
            dir.path(),
            BUCKET,
            &format!("{}{}", issuer_settings(true), pki.tls_table(false)),
        ),
        dir.path(),
    )
    .await;
    assert!(proxy.url.starts_with("https://"), "announced {}", proxy.url);

    let http = pki
        .client_tls(false)
        .http_client()
        .expect("TLS")
        .build()
        .expect("client");
    let with_certificate = pki
        .client_tls(true)
        .http_client()
        .expect("TLS")
        .build()
        .expect("client");
    let lease = alice_lease(&with_certificate, &locksvc.url, BUCKET).await;
    let number = lease["token"].as_u64().expect("token");
    let signed = lease["fencing_token"].as_str().expect("signed").to_owned();

    let put = |key: &str, token: String, body: &'static str| {
        http.put(format!("{}/{BUCKET}/{key}", proxy.url))
            .header("fencing-token", token)
            .header("content-type", "text/plain")
            .body(body)
            .send()
    };
    // S3 over https: a signed token.
    let resp = put("signed.txt", signed, "signed write")
        .await
        .expect("PUT");
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    // A plain number: the proxy asks the lease service, over https with its
    // client certificate, and the lease service confirms it.
    let resp = put("plain.txt", number.to_string(), "plain write")
        .await
        .expect("PUT");
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    // A made-up number: the lease service (really asked) denies it.
    let resp = put("forged.txt", (number + 5).to_string(), "forged")
        .await
        .expect("PUT");
    assert_eq!(resp.status(), 403);
    fencegate_testkit::assert_mentions(
        &resp.text().await.expect("body"),
        &["FencingTokenNotIssued"],
    );
    let resp = http
        .get(format!("{}/{BUCKET}/plain.txt", proxy.url))
        .send()
        .await
        .expect("GET");
    assert_eq!(resp.text().await.expect("body"), "plain write");
    assert_eq!(
        stored(&backend, BUCKET, "signed.txt").await.map(|s| s.1),
        Some(Some(number))
    );

    // Negative control: a proxy without the client certificate cannot ask,
    // so the same plain token gets a retryable 503, not a 200.
    let dir2 = tempdir();
    let uncertified = Proxy::start(
        &proxy_toml(&backend, dir2.path(), BUCKET, &issuer_settings(false)),
        dir2.path(),
    )
    .await;
    let resp = reqwest::Client::new()
        .put(format!("{}/{BUCKET}/plain2.txt", uncertified.url))
        .header("fencing-token", number.to_string())
        .header("content-type", "text/plain")
        .body("x")
        .send()
        .await
        .expect("PUT");
    assert_eq!(resp.status(), 503);
    fencegate_testkit::assert_mentions(
        &resp.text().await.expect("body"),
        &["cannot check plain token"],
    );
}

/// How long until the server closes `s`; panics if still open after `limit`.
fn closed_within(s: &mut TcpStream, limit: Duration) -> Duration {
    let started = Instant::now();
    s.set_read_timeout(Some(limit)).expect("timeout");
    let mut buf = [0u8; 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                panic!("the connection was still open after {limit:?}")
            }
            Err(_) => break,
        }
    }
    started.elapsed()
}

/// A connection that has been served once and stays open (keep-alive).
fn held_connection(addr: &str, path: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    write!(s, "GET {path} HTTP/1.1\r\nhost: {addr}\r\n\r\n").expect("write");
    let (status, _) = read_response(&mut s).expect("served");
    assert_eq!(status, 200);
    s
}

/// Against a real server at `url` with header timeout 1 s and
/// `max_connections` 4: a stuck head is closed, a fifth client gets a 503
/// whose body contains `refusal`, and clients are served again once held
/// connections close.
fn stuck_heads_and_the_cap(url: &str, health: &str, refusal: &str) {
    let addr = addr_of(url);
    let mut stuck = TcpStream::connect(&addr).expect("connect");
    write!(stuck, "GET {health} HTTP/1.1\r\nhost: x\r\nx-padding: ").expect("write");
    let closed = closed_within(&mut stuck, Duration::from_secs(8));
    assert!(
        closed >= Duration::from_millis(800) && closed < Duration::from_secs(4),
        "a head stuck midway was closed after {closed:?}, expected about 1 s"
    );

    let mut held: Vec<TcpStream> = (0..4).map(|_| held_connection(&addr, health)).collect();
    let client = reqwest::blocking::Client::new();
    let resp = client
        .get(format!("{url}{health}"))
        .send()
        .expect("over the cap: an HTTP answer, not a hang");
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["connection"], "close");
    let body = resp.text().expect("body");
    assert!(body.contains(refusal), "refusal body {body:?}");
    // The held connections still work.
    write!(held[0], "GET {health} HTTP/1.1\r\nhost: x\r\n\r\n").expect("write");
    assert_eq!(read_response(&mut held[0]).expect("served").0, 200);

    // Two close: new clients are served again, without a restart.
    held.truncate(2);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let status = client
            .get(format!("{url}{health}"))
            .send()
            .expect("answer")
            .status();
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "never served again ({status})");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_lease_service_closes_stuck_heads_and_refuses_over_the_cap_then_recovers() {
    let limits = "header_read_timeout = \"1s\"\nidle_timeout = \"60s\"\nmax_connections = 4\nmax_connections_per_address = 4\n";
    let dir = tempdir();
    let svc = locksvc_with(dir.path(), limits, &[]);
    stuck_heads_and_the_cap(&svc.url, "/health", r#""code":"TooManyConnections""#);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_proxy_closes_stuck_heads_and_refuses_over_the_cap_then_recovers() {
    let backend = Backend::start(BackendKind::S3Fs).await;
    backend.create_bucket(BUCKET).await;
    let dir = tempdir();
    let proxy = Proxy::start(
        &proxy_toml(
            &backend,
            dir.path(),
            BUCKET,
            "header_read_timeout_secs = 1\nidle_timeout_secs = 60\nmax_connections = 4\nmax_connections_per_address = 4\n",
        ),
        dir.path(),
    )
    .await;
    let url = proxy.url.clone();
    tokio::task::spawn_blocking(move || {
        stuck_heads_and_the_cap(
            &url,
            "/_fencegate/health",
            "<Code>ServiceUnavailable</Code>",
        )
    })
    .await
    .expect("scenario");
}

/// A connection to `addr` from `source` (any 127.x.y.z is this host's),
/// and what it is answered within two seconds of sending a health check
/// (nothing: still being served, waiting for more).
async fn from_address(
    source: &str,
    addr: std::net::SocketAddr,
    path: &str,
) -> (tokio::net::TcpStream, String) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(format!("{source}:0").parse().expect("source"))
        .expect("bind the source address");
    let mut c = socket.connect(addr).await.expect("connect");
    let head = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    let _ = c.write_all(head.as_bytes()).await;
    let mut out = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(2), c.read(&mut out))
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or(0);
    (c, String::from_utf8_lossy(&out[..n]).into_owned())
}

/// Issue 24: connection slots are shared out per client address. One
/// address holding its share (`max_connections_per_address`) is refused
/// more, while another address is still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_the_connection_slots_of_others() {
    let backend = Backend::start(BackendKind::S3Fs).await;
    backend.create_bucket(BUCKET).await;
    let dir = tempdir();
    let proxy = Proxy::start(
        &proxy_toml(
            &backend,
            dir.path(),
            BUCKET,
            "max_connections = 16\nmax_connections_per_address = 3\nidle_timeout_secs = 60\n",
        ),
        dir.path(),
    )
    .await;
    let addr: std::net::SocketAddr = proxy
        .url
        .trim_start_matches("http://")
        .parse()
        .expect("addr");
    let mut held = Vec::new();
    for i in 0..3 {
        let (c, answer) = from_address("127.0.0.2", addr, "/_fencegate/health").await;
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "connection {i}: {answer}"
        );
        held.push(c);
    }
    let (_, answer) = from_address("127.0.0.2", addr, "/_fencegate/health").await;
    assert!(
        answer.starts_with("HTTP/1.1 503"),
        "a fourth from the same address: {answer}"
    );
    let (_, answer) = from_address("127.0.0.3", addr, "/_fencegate/health").await;
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "another address is served: {answer}"
    );
    drop(held);
}

/// CPU time (user + system) the process `pid` has used so far.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc stat");
    // Fields after the command name (which may contain spaces): state is
    // field 3, utime 14, stime 15, in clock ticks (USER_HZ, 100 on Linux).
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<u64> = rest
        .split(' ')
        .skip(11)
        .take(2)
        .map(|f| f.parse().expect("ticks"))
        .collect();
    Duration::from_millis((fields[0] + fields[1]) * 10)
}

#[test]
fn out_of_file_descriptors_the_lease_service_does_not_spin_and_recovers() {
    // A cap far above the descriptor limit, so accept() hits EMFILE.
    let limits = "header_read_timeout = \"60s\"\nmax_connections = 1000\n";
    let dir = tempdir();
    let config = write_file(dir.path(), "locksvc.toml", limits);
    let mut cmd = Command::new("sh");
    support::without_fencegate_env(&mut cmd);
    cmd.args(["-c", "ulimit -n 64 && exec \"$0\" \"$@\""])
        .arg(env!("CARGO_BIN_EXE_fencegate"))
        .args(["locksvc", "--create-db", "--listen", "127.0.0.1:0", "--db"])
        .arg(dir.path().join("locksvc.db"))
        .arg("--config")
        .arg(&config)
        .env("FENCEGATE_SIGNING_KEYS", SIGNING_KEY)
        .env("FENCEGATE_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("a line").expect("readable");
    let url = listening_url(&first);
    let (stderr, _) = collect_stderr(&mut child);
    let guard = KillOnDrop(child);
    let addr = addr_of(&url);

    // More connections than descriptors: the kernel completes them all, the
    // service accepts until EMFILE, the rest wait in the backlog.
    let flood: Vec<TcpStream> = (0..100)
        .map(|_| TcpStream::connect(&addr).expect("connect"))
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let before = cpu_time(guard.0.id());
    std::thread::sleep(Duration::from_secs(3));
    let used = cpu_time(guard.0.id()) - before;
    let log = stderr.lock().clone();
    assert!(
        log.contains("accept failed") && log.contains("Too many open files"),
        "the service never ran out of descriptors, so this test shows nothing:\n{log}"
    );
    assert!(
        used < Duration::from_millis(600),
        "{used:?} of CPU in 3 s while out of descriptors: the accept loop spins"
    );

    // The flood goes away: the service recovers without a restart.
    drop(flood);
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("client");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match client.get(format!("{url}/health")).send() {
            Ok(r) if r.status() == 200 => break,
            other => assert!(
                Instant::now() < deadline,
                "not serving again after the flood: {other:?}"
            ),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
