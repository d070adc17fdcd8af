//! The lease service against clients that try to act as a holder without
//! being one (design rule 7), and against API keys used outside their
//! locks. Real `fencegate locksvc` processes; one test per class of attack.
//!
//! Every refusal is checked for what it must not carry: a lease's proofs
//! (its signed `fencing_token`, its lease-bound S3 credentials). Numbers and
//! owner names may appear; they are public.

mod support;

use fencegate_core::{LockName, TokenKeys};
use serde_json::{Value, json};
use std::process::Stdio;
use support::*;

/// Asserts that `body` (a refusal) gives away none of `lease`'s proofs, and
/// no proof of any lease on `lock` at all.
fn assert_no_capability(body: &Value, lease: &Value, lock: &str) {
    let text = body.to_string();
    for field in ["fencing_token", "s3_access_key_id", "s3_secret_access_key"] {
        assert!(
            !text.contains(&format!("\"{field}\"")),
            "a refusal carries {field}: {text}"
        );
        let secret = lease[field].as_str().expect("the lease has it");
        assert!(
            !text.contains(secret),
            "a refusal carries the holder's {field}: {text}"
        );
    }
    assert!(
        !text.contains(&format!("fgt1:{lock}:"))
            && !text.contains("fgk2.")
            && !text.contains("fgk1."),
        "a refusal carries a proof: {text}"
    );
}

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("(no code)")
}

/// The lease on `lock` is still `lease`'s, unchanged.
fn assert_still_held(api: &Api, lock: &str, lease: &Value) {
    let (s, st) = api.status(lock);
    assert_eq!(s, 200, "{st}");
    assert_eq!(st["held"], true, "{st}");
    assert_eq!(st["owner"], lease["owner"], "{st}");
    assert_eq!(st["token"], lease["token"], "{st}");
    assert_eq!(st["expires_at_ms"], lease["expires_at_ms"], "{st}");
}

#[test]
fn a_stale_holder_gets_nothing_with_the_current_number() {
    let (_dir, _svc, api) = fresh_locksvc();
    let (_, alice) = api.acquire("backups", "alice", 300);
    wait_until_ms(alice["expires_at_ms"].as_u64().expect("expiry") + 50);
    let (s, bob) = api.acquire("backups", "bob", 30_000);
    assert_eq!(s, 200, "{bob}");

    // Alice learns bob's number the ordinary way: her renewal is refused
    // with the current token (rule 4).
    let (s, lost) = api.renew("backups", signed_of(&alice), 30_000);
    assert_eq!((s, code(&lost)), (409, "LeaseLost"), "{lost}");
    assert_eq!(lost["error"]["current_token"], bob["token"]);
    assert_no_capability(&lost, &bob, "backups");

    // The number, as a JSON number or a string, renews nothing and gets
    // nothing.
    let n = token_of(&bob);
    for token in [json!(n), json!(n.to_string())] {
        let (s, v) = api.renew("backups", token.clone(), 30_000);
        assert_eq!((s, code(&v)), (400, "SignedTokenRequired"), "{token}: {v}");
        let message = v["error"]["message"].as_str().expect("message");
        assert!(message.contains("fencing_token"), "says what to send: {v}");
        assert_no_capability(&v, &bob, "backups");
    }
    assert_still_held(&api, "backups", &bob);
    let (s, renewed) = api.renew("backups", signed_of(&bob), 30_000);
    assert_eq!(s, 200, "the holder still renews: {renewed}");
    assert_eq!(renewed["fencing_token"], bob["fencing_token"]);
}

#[test]
fn forged_or_foreign_signed_tokens_are_refused_with_403() {
    let (_dir, _svc, api) = fresh_locksvc();
    let (_, bob) = api.acquire("backups", "bob", 30_000);
    let (_, carol) = api.acquire("other", "carol", 30_000);
    let n = token_of(&bob);
    let lock = LockName::new("backups").expect("lock");
    let attacker_keys =
        TokenKeys::new(vec![b"not-the-service-key-0123".to_vec()]).expect("long enough");
    let genuine = signed_of(&bob);
    let mac = genuine.rsplit(':').next().expect("a MAC");
    let cases = [
        (
            format!("fgt1:backups:{n}:{}", "A".repeat(43)),
            "FencingTokenSignatureInvalid",
        ),
        (
            attacker_keys.sign(&lock, n).to_string(),
            "FencingTokenSignatureInvalid",
        ),
        // Bob's genuine MAC on another number.
        (
            format!("fgt1:backups:{}:{mac}", n + 1),
            "FencingTokenSignatureInvalid",
        ),
        // A genuine token, of another lock.
        (signed_of(&carol), "FencingTokenWrongLock"),
    ];
    for (token, expected) in cases {
        for (what, (s, v)) in [
            ("renew", api.renew("backups", token.as_str(), 30_000)),
            ("release", api.release("backups", token.as_str())),
        ] {
            assert_eq!((s, code(&v)), (403, expected), "{what} with {token}: {v}");
            assert_no_capability(&v, &bob, "backups");
        }
    }
    // Bob's genuine token does not reach carol's lock either.
    let (s, v) = api.release("other", genuine.as_str());
    assert_eq!((s, code(&v)), (403, "FencingTokenWrongLock"), "{v}");
    assert_eq!(v["error"]["token_lock"], "backups", "{v}");
    assert_no_capability(&v, &carol, "other");
    assert_still_held(&api, "backups", &bob);
    assert_still_held(&api, "other", &carol);
}

#[test]
fn a_third_client_cannot_release_with_the_published_number() {
    let (_dir, _svc, api) = fresh_locksvc();
    let (_, bob) = api.acquire("backups", "bob", 30_000);
    let (_, st) = api.status("backups");
    let published = st["token"].as_u64().expect("status publishes the number");
    assert_eq!(published, token_of(&bob));

    for token in [json!(published), json!(published.to_string())] {
        let (s, v) = api.release("backups", token.clone());
        assert_eq!((s, code(&v)), (400, "SignedTokenRequired"), "{token}: {v}");
        assert!(v.get("released").is_none(), "{v}");
    }
    assert_still_held(&api, "backups", &bob);
    let (s, v) = api.acquire("backups", "mallory", 30_000);
    assert_eq!((s, code(&v)), (409, "LockHeld"), "{v}");
    assert_no_capability(&v, &bob, "backups");

    // The holder releases with its proof; the answer is exactly this.
    let (s, v) = api.release("backups", signed_of(&bob));
    assert_eq!(s, 200, "{v}");
    assert_eq!(v, json!({"lock": "backups", "released": true}));
    api.assert_free("backups", "released");
}

#[test]
fn reacquiring_with_the_holders_name_needs_its_idempotency_key() {
    let (_dir, _svc, api) = fresh_locksvc();
    // A lease taken without a key is given back to nobody, not even by name.
    let (_, alice) = api.acquire("plain", "alice", 30_000);
    let (s, v) = api.acquire("plain", "alice", 30_000);
    assert_eq!((s, code(&v)), (409, "LockHeld"), "{v}");
    assert_no_capability(&v, &alice, "plain");

    let key = "bob-secret-0123456789";
    let (s, bob) = api.acquire_with_key("backups", "bob", 30_000, key);
    assert_eq!(s, 200, "{bob}");
    let (_, st) = api.status("backups");
    assert_eq!(st["owner"], "bob", "owner names are public: {st}");

    let impostors = [
        json!({"owner": "bob", "ttl_ms": 30_000}),
        json!({"owner": "bob", "ttl_ms": 30_000, "idempotency_key": "guessed-key-0123456789"}),
        // The right key under another name is not bob either.
        json!({"owner": "mallory", "ttl_ms": 30_000, "idempotency_key": key}),
        // Waiting in line does not help while bob's lease lives.
        json!({"owner": "bob", "ttl_ms": 30_000, "wait_ms": 300}),
    ];
    for body in impostors {
        let (s, v) = api.raw("POST", "/v1/locks/backups/acquire", Some(&body.to_string()));
        assert_eq!((s, code(&v)), (409, "LockHeld"), "{body}: {v}");
        assert_eq!(v["error"]["holder"], "bob");
        assert_no_capability(&v, &bob, "backups");
        if body["owner"] == "bob" {
            let message = v["error"]["message"].as_str().expect("message");
            assert!(message.contains("idempotency_key"), "{v}");
        }
    }
    assert_still_held(&api, "backups", &bob);

    // The real client, retrying with its key, gets its own lease back.
    let (s, again) = api.acquire_with_key("backups", "bob", 30_000, key);
    assert_eq!(s, 200, "{again}");
    assert_eq!(again["token"], bob["token"]);
    assert_eq!(again["fencing_token"], bob["fencing_token"]);
}

/// Starts a lease service whose API keys are `admin-key-0123` (every lock)
/// and `db-a-key-0123` (locks `db-a` and `backup-*`), configured in the
/// `environment` or in a TOML `file`.
fn scoped_service(dir: &std::path::Path, source: &str) -> Service {
    if source == "environment" {
        return Service::start(locksvc_cmd(
            &dir.join("env"),
            &[
                ("FENCEGATE_LOCKSVC_API_KEYS", "admin-key-0123"),
                (
                    "FENCEGATE_LOCKSVC_SCOPED_API_KEYS",
                    "db-a-key-0123:db-a|backup-*",
                ),
            ],
        ));
    }
    let config = dir.join("locksvc.toml");
    std::fs::write(
        &config,
        r#"
[[api_keys]]
key = "admin-key-0123"
locks = ["*"]

[[api_keys]]
key = "db-a-key-0123"
locks = ["db-a", "backup-*"]
"#,
    )
    .expect("write config");
    let mut cmd = locksvc_cmd(&dir.join("file"), &[]);
    // The file's keys, not whatever the environment running the tests has.
    cmd.arg("--config")
        .arg(&config)
        .env_remove("FENCEGATE_LOCKSVC_API_KEYS")
        .env_remove("FENCEGATE_LOCKSVC_SCOPED_API_KEYS");
    Service::start(cmd)
}

#[test]
fn a_scoped_api_key_reaches_only_its_locks() {
    let dir = tempdir();
    for source in ["environment", "file"] {
        let svc = scoped_service(dir.path(), source);
        let with = |key: &str| {
            let mut api = Api::new(&svc.url);
            api.bearer = Some(key.to_owned());
            api
        };
        let (admin, scoped) = (with("admin-key-0123"), with("db-a-key-0123"));

        // Outside: refused, even with the holder's real proof.
        let (s, b) = admin.acquire("db-b", "job-b", 30_000);
        assert_eq!(s, 200, "{source}: the admin key reaches every lock: {b}");
        let proof = json!({"token": signed_of(&b), "ttl_ms": 30_000}).to_string();
        let acquire = json!({"owner": "job-a", "ttl_ms": 30_000}).to_string();
        let attempts = [
            (
                "POST",
                "/v1/locks/db-b/acquire",
                Some(acquire.as_str()),
                "db-b",
            ),
            ("POST", "/v1/locks/db-b/renew", Some(proof.as_str()), "db-b"),
            (
                "POST",
                "/v1/locks/db-b/release",
                Some(proof.as_str()),
                "db-b",
            ),
            ("GET", "/v1/locks/db-b", None, "db-b"),
            (
                "POST",
                "/v1/locks/db-a2/acquire",
                Some(acquire.as_str()),
                "db-a2",
            ),
            (
                "POST",
                "/v1/locks/backup/acquire",
                Some(acquire.as_str()),
                "backup",
            ),
        ];
        for (method, path, body, lock) in attempts {
            let (s, v) = scoped.raw(method, path, body);
            assert_eq!(
                (s, code(&v)),
                (403, "LockNotAllowed"),
                "{source}: {method} {path}: {v}"
            );
            assert_eq!(v["error"]["lock"], lock, "{source}: {v}");
            let message = v["error"]["message"].as_str().expect("message");
            assert!(
                message.contains("not allowed") && message.contains(&format!("{lock:?}")),
                "{source}: {v}"
            );
            assert_no_capability(&v, &b, "db-b");
        }
        assert_still_held(&admin, "db-b", &b);

        // Inside its patterns, everything works.
        for lock in ["db-a", "backup-nightly", "backup-"] {
            let (s, lease) = scoped.acquire(lock, "job-a", 30_000);
            assert_eq!(s, 200, "{source}: {lock}: {lease}");
            assert_eq!(scoped.status(lock).0, 200, "{source}: {lock}");
            assert_eq!(
                scoped.renew(lock, signed_of(&lease), 30_000).0,
                200,
                "{source}: {lock}"
            );
            assert_eq!(
                scoped.release(lock, signed_of(&lease)).0,
                200,
                "{source}: {lock}"
            );
        }

        // No key, or an unknown one: 401 before anything else.
        for bearer in [None, Some("db-a-key-012")] {
            let mut api = Api::new(&svc.url);
            api.bearer = bearer.map(str::to_owned);
            let (s, v) = api.acquire("db-a", "x", 30_000);
            assert_eq!((s, code(&v)), (401, "Unauthorized"), "{source}: {v}");
        }
    }
}

#[test]
fn every_bad_key_scope_is_reported_at_start() {
    let bad = r#"
[[api_keys]]
key = "first-key-0123"
locks = ["db a", "backup-*", "x:y"]

[[api_keys]]
key = "second-key-0123"
locks = []

[[api_keys]]
key = "short"
locks = ["*"]
"#;
    let dir = tempdir();
    let config = write_file(dir.path(), "bad.toml", bad);
    let out = fencegate()
        .args(["locksvc", "--check", "--config"])
        .arg(&config)
        .env("FENCEGATE_SIGNING_KEYS", SIGNING_KEY)
        .env_remove("FENCEGATE_LOCKSVC_API_KEYS")
        .env_remove("FENCEGATE_LOCKSVC_SCOPED_API_KEYS")
        .stdout(Stdio::null())
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    fencegate_testkit::assert_mentions(
        &err,
        &[
            "api_keys[0].locks[0] = \"db a\"",
            "api_keys[0].locks[2] = \"x:y\"",
            "api_keys[1] names no locks",
            "api_keys[2] is shorter than 8 characters",
        ],
    );
    assert!(!err.contains("api_keys[0].locks[1]"), "{err}");
    for key in ["first-key-0123", "second-key-0123"] {
        assert!(!err.contains(key), "keys are never printed:\n{err}");
    }

    // The environment form is checked the same way.
    let out = fencegate()
        .args(["locksvc", "--check"])
        .env("FENCEGATE_SIGNING_KEYS", SIGNING_KEY)
        .env_remove("FENCEGATE_LOCKSVC_API_KEYS")
        .env(
            "FENCEGATE_LOCKSVC_SCOPED_API_KEYS",
            "no-scope-key-0123,ok-key-0123:db?",
        )
        .stdout(Stdio::null())
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    fencegate_testkit::assert_mentions(&err, &["api_keys[0] names no locks"]);
    fencegate_testkit::assert_mentions(&err, &["api_keys[1].locks[0] = \"db?\""]);
}

#[test]
fn every_answer_tells_the_truth_about_the_lease() {
    let (_dir, _svc, api) = fresh_locksvc();
    let key = "client-secret-0123456789";

    // Every field of a grant.
    let before = unix_ms();
    let (s, a) = api.acquire("ttl", "A", 30_000);
    let after = unix_ms();
    assert_eq!(s, 200, "{a}");
    let t = token_of(&a);
    assert_eq!((&a["lock"], &a["owner"]), (&json!("ttl"), &json!("A")));
    assert!(signed_of(&a).starts_with(&format!("fgt1:ttl:{t}:")), "{a}");
    assert_eq!(a["ttl_ms"], 30_000);
    let expires = a["expires_at_ms"].as_u64().expect("expiry");
    assert!((before + 30_000..=after + 30_000).contains(&expires), "{a}");
    let cred_expiry = a["s3_credentials_expire_at_ms"].as_u64().expect("expiry");
    assert!(
        (before / 1000 * 1000 + 86_400_000..=after + 86_400_000).contains(&cred_expiry),
        "credentials last credential_ttl (24h): {a}"
    );
    assert_eq!(
        a["s3_access_key_id"],
        format!(
            "fgk2.{}.{t}.{}.ttl",
            support::test_keys().key_id(),
            cred_expiry / 1000
        ),
        "the access key names the signing key, token, expiry and lock it is bound to"
    );

    // A renewal with a shorter, then a longer TTL: the answer is the lease
    // in force, and status agrees.
    let mut last_expiry = expires;
    for ttl in [1_000u64, 5_000, 900] {
        let before = unix_ms();
        let (s, r) = api.renew("ttl", signed_of(&a), ttl);
        let after = unix_ms();
        assert_eq!(s, 200, "{r}");
        assert_eq!(
            (r["token"].as_u64(), r["ttl_ms"].as_u64()),
            (Some(t), Some(ttl))
        );
        let e = r["expires_at_ms"].as_u64().expect("expiry");
        assert!(
            (before + ttl..=after + ttl).contains(&e),
            "ttl {ttl}: expiry {e} is not now + ttl ({before}..{after}): {r}"
        );
        if ttl == 1_000 {
            assert!(e < last_expiry, "the shorter TTL was applied: {r}");
        }
        last_expiry = e;
        let (_, st) = api.status("ttl");
        assert_eq!(st["expires_at_ms"], r["expires_at_ms"], "{st}");
        assert_eq!(st["token"], t, "{st}");
    }

    // And the lease really ends then: B gets the lock just after.
    wait_until_ms(last_expiry + 20);
    let (s, b) = api.acquire("ttl", "B", 30_000);
    assert_eq!(s, 200, "the lease ended at the expiry it announced: {b}");
    assert!(token_of(&b) > t);
    let (_, st) = api.status("ttl");
    assert_eq!(
        st,
        json!({
            "lock": "ttl", "held": true, "owner": "B", "token": b["token"],
            "expires_at_ms": b["expires_at_ms"], "waiting": 0, "last_token": b["token"],
        })
    );

    // An idempotent re-acquire with a shorter TTL tells the truth the same
    // way.
    let (s, k) = api.acquire_with_key("ttl-key", "K", 30_000, key);
    assert_eq!(s, 200, "{k}");
    let before = unix_ms();
    let (s, again) = api.acquire_with_key("ttl-key", "K", 600, key);
    let after = unix_ms();
    assert_eq!(s, 200, "{again}");
    assert_eq!(
        (again["token"].as_u64(), again["ttl_ms"].as_u64()),
        (k["token"].as_u64(), Some(600))
    );
    let e = again["expires_at_ms"].as_u64().expect("expiry");
    assert!((before + 600..=after + 600).contains(&e), "{again}");
    let (_, st) = api.status("ttl-key");
    assert_eq!(st["expires_at_ms"], again["expires_at_ms"], "{st}");
    wait_until_ms(e + 20);
    let (s, v) = api.acquire("ttl-key", "L", 30_000);
    assert_eq!(
        s, 200,
        "the re-acquired lease ended at its announced expiry: {v}"
    );
}
