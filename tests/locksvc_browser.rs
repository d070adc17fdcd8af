//! What a web page, or a client that is not the holder, can do to the lease
//! service: a page reaching it by DNS rebinding or CSRF takes no lease (the
//! `Host` allowlist, no `Origin`, JSON bodies only), while the project's
//! own clients keep working; and the waiting line's bound, and each
//! caller's share of it, mean the same on SQLite and on etcd
//! (`FENCEGATE_TEST_LEASE_BACKEND=etcd` runs these on a 3-member cluster).

mod support;

use serde_json::Value;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};
use support::*;

/// The address of a service's `http://ip:port` URL.
fn addr_of(url: &str) -> SocketAddr {
    url.trim_start_matches("http://")
        .parse()
        .unwrap_or_else(|e| panic!("{url}: {e}"))
}

/// A client whose DNS answers `name` with the service's address: what a
/// browser does once a page's name has been rebound to the service.
fn rebound(name: &str, svc: &Service) -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .resolve(name, addr_of(&svc.url))
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

/// Status and JSON body of an answer.
fn read(resp: reqwest::blocking::Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    let text = resp.text().expect("body");
    let v = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON ({status}): {text}"));
    (status, v)
}

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or_default()
}

fn message(v: &Value) -> &str {
    v["error"]["message"].as_str().unwrap_or_default()
}

#[test]
fn a_web_page_takes_no_lease_and_the_cli_still_does() {
    let dir = tempdir();
    let svc = start_locksvc(dir.path());
    let port = addr_of(&svc.url).port();
    let body = r#"{"owner":"a-web-page","ttl_ms":60000}"#;

    // The request of the issue, as a rebound page sends it: its own name in
    // Host, its own Origin, a text/plain body (no CORS preflight needed).
    let page = format!("http://attacker.example:{port}");
    let (s, v) = read(
        rebound("attacker.example", &svc)
            .post(format!("{page}/v1/locks/db/acquire"))
            .header("origin", &page)
            .header("content-type", "text/plain;charset=UTF-8")
            .body(body)
            .send()
            .expect("sent"),
    );
    assert_eq!((s, code(&v)), (421, "HostNotAllowed"), "{v}");
    assert!(message(&v).contains("allowed_hosts"), "names the fix: {v}");
    assert!(v.get("fencing_token").is_none() && v["error"].get("fencing_token").is_none());
    // The status page and the lock's status are not read under that name
    // either; /health is.
    for path in ["/", "/v1/locks/db", "/metrics"] {
        let (s, v) = read(
            rebound("attacker.example", &svc)
                .get(format!("{page}{path}"))
                .send()
                .expect("sent"),
        );
        assert_eq!((s, code(&v)), (421, "HostNotAllowed"), "{path}: {v}");
    }
    let health = rebound("attacker.example", &svc)
        .get(format!("{page}/health"))
        .send()
        .expect("sent");
    assert_eq!(health.status(), 200);

    // Under the service's own address, each browser trait alone is refused,
    // each saying what to do.
    let http = reqwest::blocking::Client::new();
    let acquire = format!("{}/v1/locks/db/acquire", svc.url);
    /// Headers, then the status, code and advice expected.
    type Case<'a> = (&'a [(&'a str, &'a str)], u16, &'a str, &'a str);
    let cases: [Case<'_>; 4] = [
        (
            &[("content-type", "text/plain;charset=UTF-8")],
            415,
            "UnsupportedMediaType",
            "Content-Type: application/json",
        ),
        (
            &[("content-type", "application/x-www-form-urlencoded")],
            415,
            "UnsupportedMediaType",
            "Content-Type: application/json",
        ),
        (&[], 415, "UnsupportedMediaType", "no Content-Type"),
        (
            &[
                ("content-type", "application/json"),
                ("origin", "http://attacker.example"),
            ],
            403,
            "BrowserRequestRefused",
            "Origin",
        ),
    ];
    for (headers, status, want, fix) in cases {
        let mut req = http.post(&acquire).body(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let (s, v) = read(req.send().expect("sent"));
        assert_eq!((s, code(&v)), (status, want), "{headers:?}: {v}");
        assert!(message(&v).contains(fix), "{headers:?}: {v}");
    }
    let api = Api::new(&svc.url);
    api.assert_free("db", "no refused request took the lock");
    let m = Metrics::fetch(&format!("{}/metrics", svc.url));
    assert_eq!(m.count("fencegate_locksvc_grants_total", &[]), 0);
    for (reason, n) in [
        ("host_not_allowed", 4),
        ("content_type", 3),
        ("browser_origin", 1),
    ] {
        assert_eq!(
            m.count("fencegate_locksvc_refusals_total", &[("reason", reason)]),
            n,
            "{reason}"
        );
    }

    // The project's clients: the CLI, `fencegate run`, the shared wire
    // types (JSON with its type), and a name the service answers to.
    let out = fencegate()
        .args([
            "lease", "acquire", "db", "--owner", "cli", "--format", "token",
        ])
        .env("FENCEGATE_LOCKSVC", &svc.url)
        .env("FENCEGATE_LOG", "warn")
        .output()
        .expect("runs");
    let token = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        out.status.success() && token.starts_with("fgt1:db:"),
        "{token} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (s, v) = api.release("db", token);
    assert_eq!(s, 200, "{v}");
    let status = run_cmd(&svc.url, &["--lock", "job", "--ttl", "30s", "--", "true"])
        .status()
        .expect("runs");
    assert!(status.success(), "fencegate run: {status}");
    let (s, v) = read(
        rebound("localhost", &svc)
            .post(format!("http://localhost:{port}/v1/locks/local/acquire"))
            .json(&serde_json::json!({"owner": "local", "ttl_ms": 60000}))
            .send()
            .expect("sent"),
    );
    assert_eq!(s, 200, "localhost is always answered: {v}");
}

#[test]
fn allowed_hosts_name_the_service() {
    let dir = tempdir();
    let svc = Service::start(locksvc_cmd(
        dir.path(),
        &[("FENCEGATE_LOCKSVC_ALLOWED_HOSTS", "locks.test,*.svc.test")],
    ));
    let port = addr_of(&svc.url).port();
    for (i, name) in ["locks.test", "a.svc.test"].into_iter().enumerate() {
        let (s, v) = read(
            rebound(name, &svc)
                .post(format!("http://{name}:{port}/v1/locks/named-{i}/acquire"))
                .json(&serde_json::json!({"owner": name, "ttl_ms": 60000}))
                .send()
                .expect("sent"),
        );
        assert_eq!(s, 200, "{name}: {v}");
    }
    // Names are compared without case, ports not at all.
    let (s, v) = read(
        reqwest::blocking::Client::new()
            .get(format!("{}/v1/locks/named-0", svc.url))
            .header("host", "LOCKS.Test:1")
            .send()
            .expect("sent"),
    );
    assert_eq!((s, &v["held"]), (200, &Value::Bool(true)), "{v}");
    let (s, v) = read(
        rebound("other.test", &svc)
            .get(format!("http://other.test:{port}/v1/locks/named"))
            .send()
            .expect("sent"),
    );
    assert_eq!((s, code(&v)), (421, "HostNotAllowed"), "{v}");
}

/// A lease service with `max_waiters_per_lock` and these API keys (none:
/// no authentication), on the backend of the run.
fn service_with(dir: &Path, max_waiters: usize, keys: &[&str]) -> Service {
    std::fs::create_dir_all(dir).expect("state directory");
    let config = dir.join("locksvc.toml");
    let keys: Vec<String> = keys.iter().map(|k| format!("{k:?}")).collect();
    std::fs::write(
        &config,
        format!(
            "max_waiters_per_lock = {max_waiters}\napi_keys = [{}]\n",
            keys.join(", ")
        ),
    )
    .expect("config written");
    let mut cmd = locksvc_cmd(dir, &[]);
    cmd.arg("--config").arg(&config);
    Service::start(cmd)
}

fn with_key(svc: &Service, key: &str) -> Api {
    let mut api = Api::new(&svc.url);
    api.bearer = Some(key.to_owned());
    api
}

/// An acquire of `lock` by `api` that waits up to 30 s, on a thread.
fn waiter(api: &Api, lock: &'static str, owner: &str) -> std::thread::JoinHandle<(u16, Value)> {
    let (api, owner) = (api.clone(), owner.to_owned());
    std::thread::spawn(move || api.acquire_wait(lock, &owner, 30_000, 30_000))
}

#[test]
fn with_max_waiters_2_two_wait_and_a_third_is_refused_on_either_backend() {
    let dir = tempdir();
    // Four callers: with a line of 2, each may hold one place (a quarter,
    // rounded up), so the bound alone decides here.
    let keys = [
        "holder-key-0123",
        "w1-key-0123",
        "w2-key-0123",
        "w3-key-0123",
    ];
    let svc = service_with(dir.path(), 2, &keys);
    let [holder, w1, w2, w3] = keys.map(|k| with_key(&svc, k));
    let (s, lease) = holder.acquire("line2", "H", 60_000);
    assert_eq!(s, 200, "{lease}");
    let first = waiter(&w1, "line2", "W1");
    holder.wait_for_waiting("line2", 1);
    let second = waiter(&w2, "line2", "W2");
    holder.wait_for_waiting("line2", 2);

    let started = Instant::now();
    let (s, v) = w3.acquire_wait("line2", "W3", 30_000, 30_000);
    assert_eq!((s, code(&v)), (429, "TooManyWaiters"), "{v}");
    assert!(message(&v).contains("2 clients already wait"), "{v}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "refused at once"
    );
    holder.wait_for_waiting("line2", 2);

    // Both waiters are served, in order.
    assert_eq!(holder.release("line2", signed_of(&lease)).0, 200);
    let (s, a) = first.join().expect("W1");
    assert_eq!((s, a["owner"].as_str()), (200, Some("W1")), "{a}");
    assert_eq!(w1.release("line2", signed_of(&a)).0, 200);
    let (s, b) = second.join().expect("W2");
    assert_eq!((s, b["owner"].as_str()), (200, Some("W2")), "{b}");
    assert!(token_of(&b) > token_of(&a) && token_of(&a) > token_of(&lease));
}

#[test]
fn a_caller_without_the_lease_cannot_fill_the_line() {
    let dir = tempdir();
    // A line of 8: each caller (API key) holds at most 2 places.
    let keys = ["holder-key-0123", "filler-key-0123", "next-key-0123"];
    let svc = service_with(&dir.path().join("keys"), 8, &keys);
    let [holder, filler, next] = keys.map(|k| with_key(&svc, k));
    let (s, lease) = holder.acquire("fill", "H", 60_000);
    assert_eq!(s, 200, "{lease}");
    let f1 = waiter(&filler, "fill", "F1");
    holder.wait_for_waiting("fill", 1);
    let f2 = waiter(&filler, "fill", "F2");
    holder.wait_for_waiting("fill", 2);
    let (s, v) = filler.acquire_wait("fill", "F3", 30_000, 30_000);
    assert_eq!((s, code(&v)), (429, "TooManyWaiters"), "{v}");
    assert!(message(&v).contains("its share of the line"), "{v}");
    // A new owner name is the same caller: names prove nothing.
    let (s, v) = filler.acquire_wait("fill", "next", 30_000, 30_000);
    assert_eq!((s, code(&v)), (429, "TooManyWaiters"), "{v}");

    // The rightful next holder still gets in line, and is served in turn.
    let n = waiter(&next, "fill", "N");
    holder.wait_for_waiting("fill", 3);
    assert_eq!(holder.release("fill", signed_of(&lease)).0, 200);
    for (t, who) in [(f1, "F1"), (f2, "F2")] {
        let (s, got) = t.join().expect(who);
        assert_eq!((s, got["owner"].as_str()), (200, Some(who)), "{got}");
        assert_eq!(filler.release("fill", signed_of(&got)).0, 200);
    }
    let (s, got) = n.join().expect("N");
    assert_eq!((s, got["owner"].as_str()), (200, Some("N")), "{got}");

    // Without API keys a caller is its address: from this host, a line of
    // 4 holds one of its waiters.
    let svc = service_with(&dir.path().join("open"), 4, &[]);
    let api = Api::new(&svc.url);
    let (_, lease) = api.acquire("fill", "H", 60_000);
    let only = waiter(&api, "fill", "W1");
    api.wait_for_waiting("fill", 1);
    let (s, v) = api.acquire_wait("fill", "W2", 30_000, 30_000);
    assert_eq!((s, code(&v)), (429, "TooManyWaiters"), "{v}");
    assert_eq!(api.release("fill", signed_of(&lease)).0, 200);
    assert_eq!(only.join().expect("W1").0, 200);
}
