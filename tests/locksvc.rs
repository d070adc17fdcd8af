//! The lease service as a real process: the reference scenarios, crash and
//! restart, waiting in line, auth, bad input on every endpoint, and the
//! `fencegate lease` CLI against it.

mod support;

use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::*;

#[test]
fn reference_scenario_a_then_b_after_expiry() {
    let (_dir, _svc, api) = fresh_locksvc();

    let (s, a) = api.acquire("backup", "A", 1500);
    assert_eq!(s, 200, "{a}");
    let t1 = token_of(&a);
    assert!(
        a["fencing_token"]
            .as_str()
            .expect("signed")
            .starts_with("fgt1:backup:")
    );

    let (s, refused) = api.acquire("backup", "B", 1500);
    assert_eq!(s, 409, "{refused}");
    assert_eq!(refused["error"]["code"], "LockHeld");
    assert_eq!(refused["error"]["holder"], "A");

    let (s, renewed) = api.renew("backup", signed_of(&a), 1500);
    assert_eq!(s, 200, "{renewed}");
    assert_eq!(token_of(&renewed), t1, "a renewal keeps the token");

    // A pauses past its expiry.
    let expires = renewed["expires_at_ms"].as_u64().expect("expiry");
    wait_until_ms(expires + 50);
    let (s, b) = api.acquire("backup", "B", 1500);
    assert_eq!(s, 200, "{b}");
    let t2 = token_of(&b);
    assert!(t2 > t1, "B's token {t2} must be above A's {t1}");

    let (s, lost) = api.renew("backup", signed_of(&a), 1500);
    assert_eq!(s, 409, "{lost}");
    assert_eq!(lost["error"]["code"], "LeaseLost");
    assert_eq!(lost["error"]["current_token"], t2);
}

#[test]
fn a_thousand_alternating_grants_strictly_increase() {
    let (_dir, _svc, api) = fresh_locksvc();
    let mut last = 0;
    for i in 0..1000 {
        let owner = if i % 2 == 0 { "A" } else { "B" };
        let (s, v) = api.acquire("alt", owner, 10_000);
        assert_eq!(s, 200, "grant {i}: {v}");
        let t = token_of(&v);
        assert!(t > last, "grant {i}: token {t} not above {last}");
        last = t;
        let (s, r) = api.release("alt", signed_of(&v));
        assert_eq!(s, 200, "release {i}: {r}");
    }
}

#[test]
fn kill_9_during_a_burst_never_reissues_a_token() {
    let dir = tempdir();
    let mut max_returned = 0u64;
    for cycle in 0..5 {
        let mut svc = start_locksvc(dir.path());
        let api = Api::new(&svc.url);
        let (s, first) = api.acquire(&format!("after-crash-{cycle}"), "probe", 60_000);
        assert_eq!(s, 200, "{first}");
        assert!(
            token_of(&first) > max_returned,
            "cycle {cycle}: token {} after restart is not above {max_returned}",
            token_of(&first)
        );
        let returned = Arc::new(Mutex::new(vec![token_of(&first)]));
        let workers: Vec<_> = (0..8)
            .map(|w| {
                let returned = returned.clone();
                let url = svc.url.clone();
                std::thread::spawn(move || {
                    let client = reqwest::blocking::Client::new();
                    // Fresh locks each cycle: those of earlier cycles are
                    // still held (60 s), and an acquire naming their owner
                    // is refused, not handed the old lease.
                    for i in 0.. {
                        let body = format!(r#"{{"owner":"w{w}-{i}","ttl_ms":60000}}"#);
                        let resp = client
                            .post(format!("{url}/v1/locks/burst-{cycle}-{w}-{i}/acquire"))
                            .header("content-type", "application/json")
                            .body(body)
                            .send();
                        let Ok(resp) = resp else { return };
                        let Ok(v) = resp.json::<Value>() else { return };
                        if let Some(t) = v["token"].as_u64() {
                            returned.lock().expect("lock").push(t);
                        }
                    }
                })
            })
            .collect();
        // Kill once the burst is under way (grants are coming back and the
        // workers keep sending), however long its fsyncs take on this
        // machine.
        let deadline = Instant::now() + Duration::from_secs(60);
        while returned.lock().expect("lock").len() <= 10 {
            assert!(
                Instant::now() < deadline,
                "cycle {cycle}: the burst granted only {} in 60 s",
                returned.lock().expect("lock").len()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        svc.kill9();
        for w in workers {
            w.join().expect("worker");
        }
        let returned = returned.lock().expect("lock");
        max_returned = max_returned.max(*returned.iter().max().expect("some tokens"));
    }
    let svc = start_locksvc(dir.path());
    let (s, v) = Api::new(&svc.url).acquire("final", "probe", 1000);
    assert_eq!(s, 200);
    assert!(token_of(&v) > max_returned);
}

#[test]
fn a_lease_live_at_a_crash_keeps_its_remaining_time() {
    let dir = tempdir();
    let mut svc = start_locksvc(dir.path());
    let api = Api::new(&svc.url);
    let (_, a) = api.acquire("job", "A", 4000);
    let t1 = token_of(&a);
    let expires = a["expires_at_ms"].as_u64().expect("expiry");
    svc.kill9();

    // The lease comes back exactly as granted: same holder, token and
    // expiry (the recorded expiry, not a fresh TTL from the restart).
    let svc = start_locksvc(dir.path());
    let api = Api::new(&svc.url);
    let (s, st) = api.status("job");
    assert_eq!(s, 200, "{st}");
    assert_eq!(
        (
            &st["held"],
            &st["owner"],
            st["token"].as_u64(),
            st["expires_at_ms"].as_u64()
        ),
        (
            &Value::Bool(true),
            &Value::from("A"),
            Some(t1),
            Some(expires)
        ),
        "A's lease after the restart: {st}"
    );
    let (s, refused) = api.acquire("job", "B", 1000);
    assert_eq!(s, 409, "A's lease survives the restart: {refused}");
    assert_eq!(refused["error"]["holder"], "A");
    let (s, renewed) = api.renew("job", signed_of(&a), 1000);
    assert_eq!(s, 200, "A can still renew: {renewed}");
    assert_eq!(token_of(&renewed), t1);
    wait_until_ms(renewed["expires_at_ms"].as_u64().expect("expiry") + 50);
    let (s, b) = api.acquire("job", "B", 1000);
    assert_eq!(s, 200);
    assert!(token_of(&b) > t1);
}

#[test]
fn waiters_are_served_in_arrival_order() {
    let (_dir, _svc, api) = fresh_locksvc();
    let (_, a) = api.acquire("line", "A", 30_000);
    let spawn_waiter = |owner: &'static str| {
        let api = api.clone();
        std::thread::spawn(move || api.acquire_wait("line", owner, 30_000, 20_000))
    };
    // B is in line (the status counts it) before C asks.
    let b = spawn_waiter("B");
    api.wait_for_waiting("line", 1);
    let c = spawn_waiter("C");
    api.wait_for_waiting("line", 2);

    // A newcomer that does not wait is refused even though the line moves,
    // whether the engine sees it before or after the release: the lock
    // goes to B in the release's own batch, so it is never free while
    // anyone is in line.
    let newcomer = {
        let api = api.clone();
        std::thread::spawn(move || api.acquire("line", "D", 1000))
    };
    let started = Instant::now();
    // The release answers the releaser only that: B's grant (same batch)
    // goes to B's own waiting request, nowhere else.
    let (s, r) = api.release("line", signed_of(&a));
    assert_eq!(s, 200, "{r}");
    assert_eq!(r, serde_json::json!({"lock": "line", "released": true}));
    let (s, b) = b.join().expect("B");
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["owner"], "B");
    assert!(started.elapsed() < Duration::from_secs(5));
    let (s, d) = newcomer.join().expect("D");
    assert_eq!(
        (s, d["error"]["code"].as_str()),
        (409, Some("LockHeld")),
        "{d}"
    );
    let holder = d["error"]["holder"].as_str().expect("holder");
    assert!(holder == "A" || holder == "B", "{d}");
    let (_, st) = api.status("line");
    assert_eq!(
        (&st["owner"], &st["waiting"]),
        (&Value::from("B"), &Value::from(1)),
        "{st}"
    );
    let (s, d) = api.acquire("line", "D", 1000);
    assert_eq!(s, 409, "B holds it, C is next");
    assert_eq!(d["error"]["holder"], "B", "{d}");
    let (s, r) = api.release("line", signed_of(&b));
    assert_eq!(s, 200, "{r}");
    let (s, c) = c.join().expect("C");
    assert_eq!(s, 200, "{c}");
    assert_eq!(c["owner"], "C");
    assert!(token_of(&c) > token_of(&b));

    // A wait that runs out is refused with who holds the lock.
    let started = Instant::now();
    let (s, v) = api.acquire_wait("line", "E", 1000, 500);
    assert_eq!(s, 409, "{v}");
    assert_eq!(v["error"]["holder"], "C");
    assert!(started.elapsed() >= Duration::from_millis(450));
}

/// Waits until `lock`'s line holds `n` acquires (the status counts them).

#[test]
fn a_waiter_gets_the_lock_when_the_lease_expires() {
    let (_dir, _svc, api) = fresh_locksvc();
    let (_, a) = api.acquire("exp", "A", 1000);
    let (s, b) = api.acquire_wait("exp", "B", 1000, 10_000);
    assert_eq!(s, 200, "{b}");
    assert!(token_of(&b) > token_of(&a));
    let now = unix_ms();
    assert!(
        now >= a["expires_at_ms"].as_u64().expect("expiry"),
        "granted only after A expired"
    );
}

#[test]
fn api_keys_are_required_when_configured() {
    let dir = tempdir();
    let svc = Service::start(locksvc_cmd(
        dir.path(),
        &[(
            "FENCEGATE_LOCKSVC_API_KEYS",
            "key-one-123456,key-two-123456",
        )],
    ));
    let mut api = Api::new(&svc.url);
    let (s, v) = api.acquire("auth", "A", 1000);
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (401, Some("Unauthorized"))
    );
    api.bearer = Some("key-one-12345X".into());
    assert_eq!(api.acquire("auth", "A", 1000).0, 401);
    assert_eq!(api.status("auth").0, 401);
    api.bearer = Some("key-two-123456".into());
    assert_eq!(api.acquire("auth", "A", 1000).0, 200);
    // Health needs no key (load balancers probe it).
    assert_eq!(Api::new(&svc.url).raw("GET", "/health", None).0, 200);
}

#[test]
fn bad_input_gets_a_json_4xx_on_every_endpoint() {
    let (_dir, svc, api) = fresh_locksvc();
    let big = format!(r#"{{"owner":"{}"}}"#, "x".repeat(20_000));
    let long_lock = "l".repeat(129);
    let keys = fencegate_core::TokenKeys::new(vec![SIGNING_KEY.as_bytes().to_vec()]).expect("key");
    let sign = |lock: &str, n: u64| {
        keys.sign(&fencegate_core::LockName::new(lock).expect("lock"), n)
            .to_string()
    };
    let forged = format!(r#"{{"token":"fgt1:a:7:{}"}}"#, "A".repeat(43));
    let other_lock = format!(r#"{{"token":"{}"}}"#, sign("b", 7));
    let never_granted = format!(r#"{{"token":"{}"}}"#, sign("a", 7));
    let cases: Vec<(&str, String, Option<&str>, u16, &str)> = vec![
        (
            "POST",
            "/v1/locks/a/acquire".into(),
            Some("{not json"),
            400,
            "InvalidRequest",
        ),
        (
            "POST",
            "/v1/locks/a/acquire".into(),
            Some(r#"{"owner":"A","extra":1}"#),
            400,
            "InvalidRequest",
        ),
        (
            "POST",
            "/v1/locks/a/acquire".into(),
            Some(r#"{"ttl_ms":1000}"#),
            400,
            "InvalidRequest",
        ),
        (
            "POST",
            "/v1/locks/a/acquire".into(),
            Some(r#"{"owner":""}"#),
            400,
            "InvalidOwner",
        ),
        (
            "POST",
            "/v1/locks/a/acquire".into(),
            Some("{\"owner\":\"a\\nb\"}"),
            400,
            "InvalidOwner",
        ),
        (
            "POST",
            "/v1/locks/a/acquire".into(),
            Some(r#"{"owner":"A","ttl_ms":1}"#),
            400,
            "InvalidTtl",
        ),
        (
            "POST",
            "/v1/locks/a/acquire".into(),
            Some(r#"{"owner":"A","ttl_ms":99999999999}"#),
            400,
            "InvalidTtl",
        ),
        (
            "POST",
            "/v1/locks/a/acquire".into(),
            Some(r#"{"owner":"A","wait_ms":99999999999}"#),
            400,
            "InvalidWait",
        ),
        (
            "POST",
            "/v1/locks/a/acquire".into(),
            Some(r#"{"owner":"A","ttl_ms":-5}"#),
            400,
            "InvalidRequest",
        ),
        (
            "POST",
            "/v1/locks/a/acquire".into(),
            Some(&big),
            413,
            "BodyTooLarge",
        ),
        (
            "POST",
            "/v1/locks/a:b/acquire".into(),
            Some(r#"{"owner":"A"}"#),
            400,
            "InvalidLockName",
        ),
        (
            "POST",
            format!("/v1/locks/{long_lock}/acquire"),
            Some(r#"{"owner":"A"}"#),
            400,
            "InvalidLockName",
        ),
        (
            "POST",
            "/v1/locks/a/acquire".into(),
            None,
            400,
            "InvalidRequest",
        ),
        (
            "GET",
            "/v1/locks/a/acquire".into(),
            None,
            405,
            "MethodNotAllowed",
        ),
        (
            "POST",
            "/v1/locks/a/renew".into(),
            Some(r#"{"token":"seven"}"#),
            400,
            "InvalidRequest",
        ),
        // A number is public: it never renews or releases anything.
        (
            "POST",
            "/v1/locks/a/renew".into(),
            Some(r#"{"token":7}"#),
            400,
            "SignedTokenRequired",
        ),
        (
            "POST",
            "/v1/locks/a/renew".into(),
            Some(r#"{"token":"7"}"#),
            400,
            "SignedTokenRequired",
        ),
        (
            "POST",
            "/v1/locks/a/renew".into(),
            Some(r#"{"token":"fgt1:a:7"}"#),
            400,
            "InvalidRequest",
        ),
        (
            "POST",
            "/v1/locks/a/renew".into(),
            Some(&forged),
            403,
            "FencingTokenSignatureInvalid",
        ),
        (
            "POST",
            "/v1/locks/a/release".into(),
            Some(&forged),
            403,
            "FencingTokenSignatureInvalid",
        ),
        (
            "POST",
            "/v1/locks/a/renew".into(),
            Some(&other_lock),
            403,
            "FencingTokenWrongLock",
        ),
        // A genuine signed token of a lease that does not exist.
        (
            "POST",
            "/v1/locks/a/renew".into(),
            Some(&never_granted),
            409,
            "LeaseLost",
        ),
        (
            "POST",
            "/v1/locks/a/acquire".into(),
            Some(r#"{"owner":"A","idempotency_key":"too-short"}"#),
            400,
            "InvalidIdempotencyKey",
        ),
        (
            "POST",
            "/v1/locks/a/renew".into(),
            Some(r#"{"token":7,"ttl_ms":0}"#),
            400,
            "InvalidTtl",
        ),
        (
            "PUT",
            "/v1/locks/a/renew".into(),
            Some(r#"{"token":7}"#),
            405,
            "MethodNotAllowed",
        ),
        (
            "POST",
            "/v1/locks/a/release".into(),
            Some("[1]"),
            400,
            "InvalidRequest",
        ),
        (
            "POST",
            "/v1/locks/a/release".into(),
            Some(r#"{}"#),
            400,
            "InvalidRequest",
        ),
        (
            "POST",
            "/v1/locks/a/release".into(),
            Some(r#"{"token":123456}"#),
            400,
            "SignedTokenRequired",
        ),
        (
            "DELETE",
            "/v1/locks/a/release".into(),
            None,
            405,
            "MethodNotAllowed",
        ),
        (
            "GET",
            "/v1/locks/bad%20name".into(),
            None,
            400,
            "InvalidLockName",
        ),
        ("POST", "/v1/locks/a".into(), None, 405, "MethodNotAllowed"),
        ("GET", "/v2/whatever".into(), None, 404, "NotFound"),
    ];
    for (method, path, body, status, code) in cases {
        let (s, v) = api.raw(method, &path, body);
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (status, Some(code)),
            "{method} {path} {body:?} -> {v}"
        );
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
    }
    // Nothing above took the lock, or issued any token.
    let (s, st) = api.status("a");
    assert_eq!(s, 200);
    assert_eq!(st["held"], false, "{st}");
    let m = Metrics::fetch(&format!("{}/metrics", svc.url));
    assert_eq!(m.count("fencegate_locksvc_grants_total", &[]), 0);
    if lease_backend() == LeaseBackend::Sqlite {
        // On etcd, last_token is the store's revision, which every write
        // raises (it bounds the tokens issued, see locksvc/src/etcd.rs).
        assert_eq!(st["last_token"], 0, "{st}");
    }
}

#[test]
fn metrics_count_grants_refusals_and_fsyncs() {
    let (_dir, svc, api) = fresh_locksvc();
    let (_, a) = api.acquire("m", "A", 5000);
    api.acquire("m", "B", 5000);
    assert_eq!(api.renew("m", signed_of(&a), 5000).0, 200);
    assert_eq!(api.release("m", signed_of(&a)).0, 200);
    let m = Metrics::fetch(&format!("{}/metrics", svc.url));
    for (name, labels) in [
        ("fencegate_locksvc_grants_total", &[][..]),
        ("fencegate_locksvc_renewals_total", &[]),
        ("fencegate_locksvc_releases_total", &[]),
        ("fencegate_locksvc_refusals_total", &[("reason", "held")]),
        ("fencegate_locksvc_fsync_seconds_count", &[]),
    ] {
        assert_eq!(m.count(name, labels), 1, "{name}{labels:?}");
    }
}

#[test]
fn the_lease_cli_renews_and_releases_with_the_signed_token() {
    let dir = tempdir();
    let svc = start_locksvc(dir.path());
    let lease = |args: &[&str]| {
        let out = fencegate()
            .arg("lease")
            .args(args)
            .env("FENCEGATE_LOCKSVC", &svc.url)
            .env_remove("FENCEGATE_API_KEY")
            .env("FENCEGATE_LOG", "warn")
            .output()
            .expect("runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // A retry is the same client only with the same owner and key (the
    // default owner, <host>-<pid>, differs per run).
    let key = [
        "--owner",
        "cli-job",
        "--idempotency-key",
        "cli-secret-0123456789",
    ];
    let (code, token, err) = lease(&[&["acquire", "cli", "--format", "token"][..], &key].concat());
    assert_eq!(code, Some(0), "{err}");
    assert!(token.starts_with("fgt1:cli:"), "{token}");
    let number: u64 = token
        .split(':')
        .nth(2)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no token number in {token}"));
    if lease_backend() == LeaseBackend::Sqlite {
        assert_eq!(number, 1, "a fresh database's first token: {token}");
    }
    // The same acquire again, with its key, gets the same lease back.
    let (code, again, err) = lease(&[&["acquire", "cli", "--format", "token"][..], &key].concat());
    assert_eq!((code, again.as_str()), (Some(0), token.as_str()), "{err}");

    let (code, out, err) = lease(&["renew", "cli", "--token", &token, "--ttl", "5s"]);
    assert_eq!(code, Some(0), "{err}");
    let renewed: Value = serde_json::from_str(&out).expect("JSON lease");
    assert_eq!(
        (renewed["token"].as_u64(), renewed["ttl_ms"].as_u64()),
        (Some(number), Some(5000))
    );

    // A number is refused before anything is sent (usage error), saying what
    // to pass instead.
    for cmd in ["renew", "release"] {
        let (code, _, err) = lease(&[cmd, "cli", "--token", "1"]);
        assert_eq!(code, Some(2), "{cmd}: {err}");
        assert!(err.contains("fencing_token"), "{cmd}: {err}");
    }
    let (_, st) = Api::new(&svc.url).status("cli");
    assert_eq!(st["held"], true, "{st}");

    let (code, out, err) = lease(&["release", "cli", "--token", &token]);
    assert_eq!(code, Some(0), "{err}");
    let released: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(released["released"], true, "{released}");
    Api::new(&svc.url).assert_free("cli", "the CLI released it");
}

#[test]
fn release_ends_a_lease_live_or_expired_and_never_a_newer_one() {
    let (_dir, _svc, api) = fresh_locksvc();
    // Released twice: the second is a retry, not an error.
    let (_, a) = api.acquire("r", "A", 10_000);
    assert_eq!(api.release("r", signed_of(&a)).0, 200);
    let (s, again) = api.release("r", signed_of(&a));
    assert_eq!(s, 200, "a retried release: {again}");
    // Expired and not taken since: releasing it is not an error either.
    let (_, b) = api.acquire("r", "B", 100);
    wait_until_ms(b["expires_at_ms"].as_u64().expect("expiry") + 50);
    let (s, late) = api.release("r", signed_of(&b));
    assert_eq!(s, 200, "an ended lease nobody took: {late}");
    // Taken by C after B expired: B's release must not end C's lease.
    let (_, b2) = api.acquire("r", "B2", 100);
    wait_until_ms(b2["expires_at_ms"].as_u64().expect("expiry") + 50);
    let (s, c) = api.acquire("r", "C", 10_000);
    assert_eq!(s, 200, "{c}");
    let (s, refused) = api.release("r", signed_of(&b2));
    assert_eq!(s, 409, "{refused}");
    assert_eq!(refused["error"]["code"], "LeaseLost");
    assert_eq!(refused["error"]["current_token"], token_of(&c));
    let (_, st) = api.status("r");
    assert_eq!(
        (st["held"].as_bool(), st["token"].as_u64()),
        (Some(true), Some(token_of(&c))),
        "{st}"
    );
    // And once C released, B2's old token still releases nothing of anyone.
    assert_eq!(api.release("r", signed_of(&c)).0, 200);
    let (_, d) = api.acquire("r", "D", 10_000);
    let (s, _) = api.release("r", signed_of(&b2));
    assert_eq!(s, 409, "a newer grant exists");
    let (_, st) = api.status("r");
    assert_eq!(st["token"].as_u64(), Some(token_of(&d)), "{st}");
}
