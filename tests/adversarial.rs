//! The proxy against hostile and buggy clients: one test per class of hole
//! an adversarial review found (see ARCHITECTURE.md, "Threat model"), on
//! the dev store (s3s-fs behind `DevStore`) and on moto, through real
//! proxy processes and raw sockets where an SDK or URL library would
//! normalise the attack away.
//!
//! The threat-model roles: (1) honest stale writers are `tests/proxy.rs`'s
//! core; (2) buggy clients that echo `Fencing-Max-Token` or retry with any
//! token they saw; (3) clients with valid proxy credentials but no lease;
//! (4) unauthenticated network clients, who must change nothing and
//! exhaust nothing.

#[macro_use]
mod support;

use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{Delete, ObjectIdentifier};
use std::time::Duration;
use support::harness::{Env, Harness};
use support::s3::*;
use support::xml_value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const BUCKET: &str = "bkt";
const OTHER: &str = "other";

/// A second client key: valid proxy credentials, no lease.
const MALLORY_KEY: (&str, &str) = ("mallory-key", "mallory-secret-123");

async fn env_with(kind: BackendKind, extra: &str) -> Env {
    let extra = format!(
        "{extra}\n[[clients]]\naccess_key = \"{}\"\nsecret_key = \"{}\"\n",
        MALLORY_KEY.0, MALLORY_KEY.1
    );
    Harness::new(kind)
        .bucket(OTHER)
        .proxy_config(&extra)
        .start()
        .await
}

impl Env {
    fn addr(&self) -> String {
        self.proxy().url.trim_start_matches("http://").to_owned()
    }

    /// One raw HTTP/1.1 request, sent byte for byte (no URL
    /// normalisation); returns the status line's code, headers and body.
    async fn raw(
        &self,
        method: &str,
        target: &str,
        headers: &[(&str, String)],
        body: &[u8],
    ) -> (u16, String) {
        let headers: Vec<(&str, Vec<u8>)> = headers
            .iter()
            .map(|(k, v)| (*k, v.as_bytes().to_vec()))
            .collect();
        self.raw_bytes(method, target, &headers, body).await
    }

    /// [`Env::raw`] with header values as bytes (any bytes: not UTF-8,
    /// not ASCII).
    async fn raw_bytes(
        &self,
        method: &str,
        target: &str,
        headers: &[(&str, Vec<u8>)],
        body: &[u8],
    ) -> (u16, String) {
        let mut conn = tokio::net::TcpStream::connect(self.addr())
            .await
            .expect("connect");
        // A Host among `headers` replaces the proxy's own address.
        let host = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("host"))
            .map_or_else(|| self.addr().into_bytes(), |(_, v)| v.clone());
        let mut head = format!("{method} {target} HTTP/1.1\r\nHost: ").into_bytes();
        head.extend_from_slice(&host);
        head.extend_from_slice(
            format!(
                "\r\nConnection: close\r\nContent-Length: {}\r\n",
                body.len()
            )
            .as_bytes(),
        );
        for (k, v) in headers
            .iter()
            .filter(|(k, _)| !k.eq_ignore_ascii_case("host"))
        {
            head.extend_from_slice(k.as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(v);
            head.extend_from_slice(b"\r\n");
        }
        head.extend_from_slice(b"\r\n");
        conn.write_all(&head).await.expect("head");
        let _ = conn.write_all(body).await;
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(20), conn.read_to_end(&mut out)).await;
        let text = String::from_utf8_lossy(&out).to_string();
        let code = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        (code, text)
    }

    async fn put_signed(
        &self,
        key: &str,
        token: &str,
        body: &str,
    ) -> Result<(), (Option<u16>, String)> {
        self.put(key, token, body)
            .await
            .map_err(|(status, code, _)| (status, code))
    }

    fn proxy_pid(&self) -> i32 {
        self.proxy().service.as_ref().expect("running").pid()
    }
}

fn token_header(lock: &str, n: u64) -> Vec<(&'static str, String)> {
    vec![
        ("Fencing-Token", signed(lock, n)),
        ("Content-Type", "application/octet-stream".into()),
    ]
}

/// The proxy's resident memory, in MiB.
fn rss_mib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS")
        / 1024
}

on_every_backend!(
    threads = 2;
    h1_keys_with_dot_or_empty_segments_are_refused_before_any_work,
    h1_prefix_scopes_cannot_be_escaped,
    h2_a_buggy_client_echoing_the_max_cannot_write,
    h3_role_clients_with_proxy_credentials_but_no_lease_cannot_write,
    h4_create_bucket_cannot_change_an_existing_bucket,
    h8_delete_objects_takes_at_most_1000_keys,
    unknown_query_parameters_are_refused,
    uploads_answer_only_to_their_creator,
    scopes_sharing_a_lock_share_its_fence,
    a_cut_upload_always_learns_it_is_stale,
    write_headers_that_do_what_refused_operations_do_are_refused,
    integrity_values_are_checked_on_every_path,
);

/// H1: every way of spelling a dot segment (raw, percent-encoded, in the
/// middle, at the start), an empty segment, a backslash: 400 before any
/// scope or backend work, for writes, deletes and reads; the object of
/// another bucket and the other bucket itself are untouched.
async fn h1_keys_with_dot_or_empty_segments_are_refused_before_any_work(kind: BackendKind) {
    let e = env_with(kind, "").await;
    e.backend
        .direct()
        .put_object()
        .bucket(OTHER)
        .key("victim.txt")
        .body(ByteStream::from_static(b"victim"))
        .send()
        .await
        .expect("victim");
    let targets = [
        "/bkt/..%2Fother%2Fvictim.txt",
        "/bkt/%2E%2E%2Fother%2Fvictim.txt",
        "/bkt/%2e%2e/other/victim.txt",
        "/bkt/x/../../other/victim.txt",
        "/bkt/../other/new.txt",
        "/bkt/.%2F",
        "/bkt/..%2Fother%2F",
        "/bkt/a/./b",
        "/bkt/a//b",
        "/bkt/%2Fother%2Fvictim.txt",
        "/bkt/a%5C..%5C..%5Cother%5Cvictim.txt",
    ];
    for target in targets {
        for method in ["PUT", "DELETE", "GET"] {
            let (code, text) = e
                .raw(method, target, &token_header(BUCKET, 5), b"attacker")
                .await;
            assert_eq!(code, 400, "{method} {target}: {text}");
            assert!(
                text.contains("<Code>InvalidArgument</Code>"),
                "{method} {target}: {text}"
            );
            assert!(
                text.contains("is refused"),
                "the error names the rule: {text}"
            );
        }
    }
    assert_eq!(
        stored(&e.backend, OTHER, "victim.txt").await,
        Some((b"victim".to_vec(), None)),
        "the other bucket's object is untouched"
    );
    assert_eq!(stored(&e.backend, OTHER, "new.txt").await, None);
    assert!(
        e.backend.bucket_exists(OTHER).await,
        "no bucket was removed"
    );
    assert_eq!(
        e.proxy().max_token(BUCKET).await,
        None,
        "nothing reached the fence"
    );

    // A copy whose source escapes, and a batch delete naming one such key.
    let c = e.proxy().client();
    let copy = c
        .copy_object()
        .bucket(BUCKET)
        .key("copy")
        .copy_source("bkt/../other/victim.txt");
    assert_eq!(
        refusal_of!(copy, signed(BUCKET, 5), "refused"),
        (Some(400), "InvalidArgument".into())
    );
    e.put_signed("keep", &signed(BUCKET, 5), "keep")
        .await
        .expect("a normal write");
    let batch = c.delete_objects().bucket(BUCKET).delete(
        Delete::builder()
            .objects(ObjectIdentifier::builder().key("keep").build().expect("id"))
            .objects(
                ObjectIdentifier::builder()
                    .key("../other/victim.txt")
                    .build()
                    .expect("id"),
            )
            .build()
            .expect("delete"),
    );
    assert_eq!(
        refusal_of!(batch, signed(BUCKET, 5), "refused"),
        (Some(400), "InvalidArgument".into())
    );
    assert!(
        stored(&e.backend, BUCKET, "keep").await.is_some(),
        "no key of the batch was deleted"
    );
    assert!(stored(&e.backend, OTHER, "victim.txt").await.is_some());

    // Defence in depth: the dev store refuses the same keys on its own.
    if kind == BackendKind::S3Fs {
        let direct = e
            .backend
            .direct()
            .put_object()
            .bucket(BUCKET)
            .key("x/../../other/victim.txt")
            .body(ByteStream::from_static(b"direct attacker"))
            .send()
            .await
            .expect_err("the dev store refuses it");
        assert_eq!(error_of(&direct).0, Some(400), "{direct:?}");
        assert_eq!(
            stored_body(&e.backend, OTHER, "victim.txt").await,
            Some(b"victim".to_vec())
        );
    }
}

/// H1 with prefix scopes: a `logs/` token cannot reach `db/` by any
/// spelling, and an ordinary `db/` key needs the `db` lock.
async fn h1_prefix_scopes_cannot_be_escaped(kind: BackendKind) {
    let scopes = "[[scopes]]\nbucket = \"bkt\"\nprefix = \"logs/\"\nlock = \"logs\"\n\
                  [[scopes]]\nbucket = \"bkt\"\nprefix = \"db/\"\nlock = \"db\"\n";
    let e = env_with(kind, scopes).await;
    let db = signed("db", 3);
    e.put_signed("db/x", &db, "db data")
        .await
        .expect("db's holder writes");
    for target in [
        "/bkt/logs/..%2Fdb%2Fx",
        "/bkt/logs/../db/x",
        "/bkt/logs%2F..%2Fdb%2Fx",
        "/bkt/logs/%2E%2E/db/x",
    ] {
        for method in ["PUT", "DELETE"] {
            let (code, text) = e
                .raw(method, target, &token_header("logs", 9), b"logs writer")
                .await;
            assert_eq!(code, 400, "{method} {target}: {text}");
        }
    }
    let err = e
        .put_signed("db/x", &signed("logs", 9), "wrong lock")
        .await
        .expect_err("refused");
    assert_eq!(err, (Some(403), "FencingTokenWrongLock".into()));
    assert_stored(&e.backend, BUCKET, "db/x", b"db data", 3).await;
}

/// Role 2, H2 at the proxy: a client that retries with the number the
/// refusal published (`Fencing-Max-Token`), or with any plain number, gets
/// 403: a number alone proves nothing. The object stays the holder's.
async fn h2_a_buggy_client_echoing_the_max_cannot_write(kind: BackendKind) {
    let e = env_with(kind, "").await;
    e.put_signed("k", &signed(BUCKET, 2), "bob")
        .await
        .expect("bob writes");
    let (code, text) = e
        .raw("PUT", "/bkt/k", &token_header(BUCKET, 1), b"alice")
        .await;
    assert_eq!(code, 409, "{text}");
    let max = text
        .lines()
        .find_map(|l| l.strip_prefix("fencing-max-token: "))
        .expect("the refusal publishes the max")
        .trim()
        .to_owned();
    assert_eq!(max, "2");
    for token in [max.clone(), "3".into(), "9223372036854775807".into()] {
        let (code, text) = e
            .raw(
                "PUT",
                "/bkt/k",
                &[
                    ("Fencing-Token", token.clone()),
                    ("Content-Type", "text/plain".into()),
                ],
                b"alice echoes",
            )
            .await;
        assert_eq!(code, 403, "plain {token}: {text}");
        fencegate_testkit::assert_mentions(&text, &["FencingTokenUnsigned"]);
    }
    assert_stored(&e.backend, BUCKET, "k", b"bob", 2).await;
    assert_eq!(
        e.proxy().max_token(BUCKET).await,
        Some(2),
        "no plain number raised the max"
    );
}

/// Role 3: valid proxy credentials without the lease: no token (428), a
/// plain number (403), another lock's signed token (403), a forged one
/// (403) — and nothing changes.
async fn h3_role_clients_with_proxy_credentials_but_no_lease_cannot_write(kind: BackendKind) {
    let e = env_with(kind, "").await;
    e.put_signed("k", &signed(BUCKET, 4), "holder")
        .await
        .expect("holder");
    let mallory = sdk_client(&e.proxy().url, MALLORY_KEY);
    let put = || {
        mallory
            .put_object()
            .bucket(BUCKET)
            .key("k")
            .body(ByteStream::from_static(b"mallory"))
    };
    let err = put().send().await.expect_err("no token");
    assert_eq!(error_of(&err), (Some(428), "FencingTokenRequired".into()));
    for (token, code) in [
        ("4".to_owned(), "FencingTokenUnsigned"),
        (signed(OTHER, 99), "FencingTokenWrongLock"),
        (
            signed(BUCKET, 4).replacen(":4:", ":99:", 1),
            "FencingTokenSignatureInvalid",
        ),
    ] {
        let err = fenced!(put(), token).send().await.expect_err("refused");
        assert_eq!(error_of(&err), (Some(403), code.into()), "{token}");
    }
    let del = mallory.delete_object().bucket(BUCKET).key("k");
    let err = fenced!(del, "4".to_owned())
        .send()
        .await
        .expect_err("refused");
    assert_eq!(error_of(&err).0, Some(403));
    assert_stored(&e.backend, BUCKET, "k", b"holder", 4).await;
}

/// Issue 24, browsers: a web page that reaches the proxy by DNS rebinding
/// sends its own name as Host. The proxy's pages and anonymous requests
/// answer only to the names it knows (421 otherwise; `health` answers
/// any), the fence refuses a request with an Origin, and JSON endpoints
/// are served with `nosniff`. `allowed_hosts` adds a name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_pages_cannot_use_the_proxy_by_another_name() {
    let e = env_with(BackendKind::S3Fs, "allowed_hosts = [\"proxy.internal\"]").await;
    e.put_signed("k", &signed(BUCKET, 1), "secret data")
        .await
        .expect("write");
    let attacker = || ("Host", "attacker.example:80".to_owned());
    for target in [
        "/_fencegate/".to_owned(),
        "/_fencegate/events".to_owned(),
        "/_fencegate/status".to_owned(),
        "/_fencegate/metrics".to_owned(),
        format!("/{BUCKET}/k"),
        format!("/{BUCKET}?list-type=2"),
        // A parameter's value that names a signature signs nothing.
        format!("/{BUCKET}?delimiter=Signature="),
        format!("/{BUCKET}/k?response-content-type=X-Amz-Signature="),
    ] {
        let (code, text) = e.raw("GET", &target, &[attacker()], b"").await;
        assert_eq!(code, 421, "{target}: {text}");
        assert!(
            text.contains("HostNotAllowed") && text.contains("allowed_hosts"),
            "{text}"
        );
        assert!(!text.contains("secret data"), "{text}");
    }
    let (code, text) = e
        .raw(
            "POST",
            "/_fencegate/fence",
            &[attacker(), ("Fencing-Token", signed(BUCKET, 2))],
            b"",
        )
        .await;
    assert_eq!(code, 421, "{text}");
    let (code, text) = e.raw("GET", "/_fencegate/health", &[attacker()], b"").await;
    assert_eq!(code, 200, "health answers any host: {text}");
    // By a name it knows: served.
    for host in ["proxy.internal:9000", "localhost", "127.0.0.1"] {
        let (code, text) = e
            .raw(
                "GET",
                &format!("/{BUCKET}/k"),
                &[("Host", host.to_owned())],
                b"",
            )
            .await;
        assert_eq!(code, 200, "{host}: {text}");
        assert!(text.contains("secret data"));
    }
    let (code, text) = e.raw("GET", "/_fencegate/events", &[], b"").await;
    assert_eq!(code, 200, "{text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("x-content-type-options: nosniff"),
        "{text}"
    );
    // A page's POST to the fence carries an Origin.
    let (code, text) = e
        .raw(
            "POST",
            "/_fencegate/fence",
            &[
                ("Origin", "http://attacker.example".to_owned()),
                ("Fencing-Token", signed(BUCKET, 2)),
            ],
            b"",
        )
        .await;
    assert_eq!(code, 403, "{text}");
    fencegate_testkit::assert_mentions(&text, &["BrowserRequestRefused"]);
}

/// Issue 34: a request counts as signed only if s3s verifies a signature
/// on it. An `Authorization` header s3s cannot read (not text, or two of
/// them) made the proxy skip its Host rule while s3s served the request as
/// anonymous: a page reached by DNS rebinding read objects and listings,
/// and a DeleteObjects skipped the anonymous payload-hash check. Now such a
/// request is a 400 that says what to fix, from any host, and changes
/// nothing; a presigned query s3s reads as signed is verified, never served
/// on its name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_nobody_verified_never_counts_as_signed() {
    use sha2::Digest as _;
    let e = env_with(BackendKind::S3Fs, "").await;
    e.put_signed("k", &signed(BUCKET, 1), "secret data")
        .await
        .expect("write");
    e.put_signed("victim", &signed(BUCKET, 1), "keep me")
        .await
        .expect("write");
    let attacker = ("Host", b"attacker.example".to_vec());
    let unreadable: [Vec<(&str, Vec<u8>)>; 4] = [
        vec![("Authorization", b"\xff".to_vec())],
        vec![(
            "Authorization",
            b"AWS4-HMAC-SHA256 Credential=\xc3\xa9".to_vec(),
        )],
        vec![
            ("Authorization", b"AWS4-HMAC-SHA256 a".to_vec()),
            ("Authorization", b"AWS4-HMAC-SHA256 b".to_vec()),
        ],
        vec![("Authorization", b"\x80\x81".to_vec())],
    ];
    for auth in &unreadable {
        for host in [Some(attacker.clone()), None] {
            let mut headers = auth.clone();
            headers.extend(host.clone());
            for target in [format!("/{BUCKET}/k"), format!("/{BUCKET}?list-type=2")] {
                let (code, text) = e.raw_bytes("GET", &target, &headers, b"").await;
                assert_eq!(code, 400, "{target} {headers:?}: {text}");
                assert!(
                    text.contains("AuthorizationHeaderMalformed") && text.contains("Authorization"),
                    "{text}"
                );
                assert!(!text.contains("secret data") && !text.contains("<Key>k</Key>"));
            }
        }
    }
    // A DeleteObjects whose payload hash is not its body's: refused whether
    // its Authorization is unreadable, readable but no signature, or absent.
    let xml = "<Delete><Object><Key>victim</Key></Object></Delete>";
    let wrong = hex::encode(sha2::Sha256::digest(b"another body"));
    for auth in [Some(b"\xff".to_vec()), Some(b"garbage".to_vec()), None] {
        let mut headers = vec![
            ("Fencing-Token", signed(BUCKET, 1).into_bytes()),
            ("x-amz-content-sha256", wrong.clone().into_bytes()),
        ];
        headers.extend(auth.clone().map(|a| ("Authorization", a)));
        let (code, text) = e
            .raw_bytes(
                "POST",
                &format!("/{BUCKET}?delete"),
                &headers,
                xml.as_bytes(),
            )
            .await;
        assert!(
            (400..500).contains(&code),
            "{auth:?}: a DeleteObjects with a wrong payload hash: {code} {text}"
        );
        assert_stored_as(
            &e.backend,
            BUCKET,
            "victim",
            b"keep me",
            1,
            &format!("{auth:?}: {text}"),
        )
        .await;
    }
    // A presigned query by any spelling s3s decodes is verified: a wrong
    // signature serves nothing, from any host.
    for target in [
        format!("/{BUCKET}/k?X-Amz-Signatur%65=00"),
        format!("/{BUCKET}/k?Signature=00&AWSAccessKeyId=x&Expires=9999999999"),
    ] {
        for host in [Some(attacker.clone()), None] {
            let headers: Vec<_> = host.into_iter().collect();
            let (code, text) = e.raw_bytes("GET", &target, &headers, b"").await;
            assert!(
                (400..500).contains(&code) && !text.contains("secret data"),
                "{target}: {code} {text}"
            );
        }
    }
    // The refusals are the proxy's, not a broken proxy's: signed and
    // anonymous reads by a known name are served.
    let (code, text) = e.raw("GET", &format!("/{BUCKET}/k"), &[], b"").await;
    assert_eq!(code, 200, "{text}");
}

/// Issue 24: every integrity value a write carries is checked by the
/// proxy, or refused with a 400 that says why, whoever sent it and
/// whichever path it takes: an anonymous PutObject's payload hash (s3s
/// checks none), `Content-MD5` and `x-amz-checksum-*` on PutObject and
/// UploadPart (RGW 16.2 ignores `x-amz-checksum-*`), and `Content-MD5` on
/// DeleteObjects (read whole by s3s, checked by nobody). Nothing that
/// failed a check reaches the store.
async fn integrity_values_are_checked_on_every_path(kind: BackendKind) {
    use base64::Engine as _;
    use sha2::Digest as _;
    let e = env_with(kind, "").await;
    let token = signed(BUCKET, 2);
    let body = b"the body".as_slice();
    let sha = sha2::Sha256::digest(body);
    let hex_sha = hex::encode(sha);
    let b64_sha = base64::engine::general_purpose::STANDARD.encode(sha);
    let wrong_b64 = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
    let put = |headers: Vec<(&'static str, String)>| {
        let mut h = vec![("Fencing-Token", token.clone())];
        h.extend(headers);
        let e = &e;
        async move { e.raw("PUT", &format!("/{BUCKET}/k"), &h, body).await }
    };
    for (what, headers, code) in [
        (
            "a payload hash that is not hex",
            vec![("x-amz-content-sha256", "z".repeat(64))],
            "InvalidArgument",
        ),
        (
            "an upper-case payload hash",
            vec![("x-amz-content-sha256", hex_sha.to_uppercase())],
            "InvalidArgument",
        ),
        (
            "a wrong payload hash",
            vec![("x-amz-content-sha256", hex::encode([7u8; 32]))],
            "BadDigest",
        ),
        (
            "a malformed Content-MD5",
            vec![("Content-MD5", "bm90IGFuIG1kNQ".to_owned())],
            "InvalidDigest",
        ),
        (
            "a wrong Content-MD5",
            vec![(
                "Content-MD5",
                base64::engine::general_purpose::STANDARD.encode([7u8; 16]),
            )],
            "BadDigest",
        ),
        (
            "a wrong x-amz-checksum-sha256",
            vec![("x-amz-checksum-sha256", wrong_b64.clone())],
            "BadDigest",
        ),
    ] {
        let (status, text) = put(headers).await;
        assert_eq!(status, 400, "{what}: {text}");
        assert!(text.contains(code), "{what}: {text}");
        assert_eq!(
            stored(&e.backend, BUCKET, "k").await,
            None,
            "{what} reached the store"
        );
    }
    // A checksum in the query (where presigned URLs carry them).
    let (status, text) = e
        .raw(
            "PUT",
            &format!(
                "/{BUCKET}/k?x-amz-checksum-sha256={}",
                urlencoding_of(&wrong_b64)
            ),
            &[("Fencing-Token", token.clone())],
            body,
        )
        .await;
    assert_eq!(status, 400, "a wrong checksum in the query: {text}");
    fencegate_testkit::assert_mentions(&text, &["BadDigest"]);
    assert_eq!(stored(&e.backend, BUCKET, "k").await, None);
    let (status, text) = put(vec![
        ("x-amz-content-sha256", hex_sha.clone()),
        ("x-amz-checksum-sha256", b64_sha.clone()),
    ])
    .await;
    assert_eq!(status, 200, "the right values pass: {text}");
    assert_stored(&e.backend, BUCKET, "k", body, 2).await;

    // A part, anonymous, of an anonymous upload.
    let (status, text) = e
        .raw(
            "POST",
            &format!("/{BUCKET}/mp?uploads"),
            &[("Fencing-Token", token.clone())],
            b"",
        )
        .await;
    assert_eq!(status, 200, "{text}");
    let upload_id = xml_value(&text, "UploadId").expect("upload id");
    let part = format!("/{BUCKET}/mp?partNumber=1&uploadId={upload_id}");
    let (status, text) = e
        .raw(
            "PUT",
            &part,
            &[
                ("Fencing-Token", token.clone()),
                ("x-amz-checksum-sha256", wrong_b64),
            ],
            body,
        )
        .await;
    assert_eq!(status, 400, "a part with a wrong checksum: {text}");
    fencegate_testkit::assert_mentions(&text, &["BadDigest"]);
    let (status, text) = e
        .raw(
            "PUT",
            &part,
            &[
                ("Fencing-Token", token.clone()),
                ("x-amz-checksum-sha256", b64_sha),
            ],
            body,
        )
        .await;
    assert_eq!(status, 200, "a part with the right checksum: {text}");

    // DeleteObjects, whose body s3s reads whole.
    let xml = b"<Delete><Object><Key>k</Key></Object></Delete>";
    let (status, text) = e
        .raw(
            "POST",
            &format!("/{BUCKET}?delete"),
            &[
                ("Fencing-Token", token.clone()),
                (
                    "Content-MD5",
                    base64::engine::general_purpose::STANDARD.encode([7u8; 16]),
                ),
            ],
            xml,
        )
        .await;
    assert_eq!(
        status, 400,
        "a batch delete with a wrong Content-MD5: {text}"
    );
    fencegate_testkit::assert_mentions(&text, &["BadDigest"]);
    assert!(
        stored(&e.backend, BUCKET, "k").await.is_some(),
        "nothing was deleted"
    );
}

/// Issue 24: a header that changes what a refused operation would change
/// (the ACL, retention, tags, website redirect, encryption, request
/// payment, the expected owner) is refused as that operation is (501),
/// on PutObject (signed and anonymous), CopyObject and
/// CreateMultipartUpload, with the holder's token, and the store is
/// unchanged; `allow_write_headers` lets a family through.
async fn write_headers_that_do_what_refused_operations_do_are_refused(kind: BackendKind) {
    use aws_sdk_s3::types::{
        ObjectCannedAcl, ObjectLockMode, RequestPayer, ServerSideEncryption, TaggingDirective,
    };
    let e = env_with(kind, "").await;
    let c = e.proxy().client();
    let holder = signed(BUCKET, 3);
    e.put_signed("src", &holder, "source")
        .await
        .expect("source");
    let put = || {
        c.put_object()
            .bucket(BUCKET)
            .key("k")
            .body(ByteStream::from_static(b"zombie"))
    };
    let until = aws_sdk_s3::primitives::DateTime::from_secs(4_000_000_000);
    let refused = [
        (
            "acl",
            fenced!(put().acl(ObjectCannedAcl::PublicRead), holder.clone())
                .send()
                .await,
        ),
        (
            "grant",
            fenced!(
                put().grant_read("uri=\"http://acs.amazonaws.com/groups/global/AllUsers\""),
                holder.clone()
            )
            .send()
            .await,
        ),
        (
            "object lock",
            fenced!(
                put()
                    .object_lock_mode(ObjectLockMode::Compliance)
                    .object_lock_retain_until_date(until),
                holder.clone()
            )
            .send()
            .await,
        ),
        (
            "tagging",
            fenced!(put().tagging("a=b"), holder.clone()).send().await,
        ),
        (
            "website redirect",
            fenced!(
                put().website_redirect_location("/elsewhere"),
                holder.clone()
            )
            .send()
            .await,
        ),
        (
            "encryption",
            fenced!(
                put().server_side_encryption(ServerSideEncryption::AwsKms),
                holder.clone()
            )
            .send()
            .await,
        ),
        (
            "request payer",
            fenced!(put().request_payer(RequestPayer::Requester), holder.clone())
                .send()
                .await,
        ),
        (
            "expected owner",
            fenced!(put().expected_bucket_owner("123456789012"), holder.clone())
                .send()
                .await,
        ),
        (
            "customer key",
            fenced!(
                put()
                    .sse_customer_algorithm("AES256")
                    .sse_customer_key("MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTIzNDU2Nzg5MDE=")
                    .sse_customer_key_md5("x"),
                holder.clone()
            )
            .send()
            .await,
        ),
    ];
    for (what, r) in refused {
        let err = r.expect_err(what);
        assert_eq!(
            error_of(&err),
            (Some(501), "NotImplemented".into()),
            "PutObject with {what}"
        );
    }
    let err = fenced!(
        c.copy_object()
            .bucket(BUCKET)
            .key("k")
            .copy_source(format!("{BUCKET}/src"))
            .tagging_directive(TaggingDirective::Replace)
            .tagging("a=b"),
        holder.clone()
    )
    .send()
    .await
    .expect_err("a copy that replaces tags");
    assert_eq!(error_of(&err).0, Some(501));
    let err = fenced!(
        c.create_multipart_upload()
            .bucket(BUCKET)
            .key("k")
            .acl(ObjectCannedAcl::PublicReadWrite),
        holder.clone()
    )
    .send()
    .await
    .expect_err("an upload with an ACL");
    assert_eq!(error_of(&err).0, Some(501));
    // Anonymous, through the other front door.
    let (code, text) = e
        .raw(
            "PUT",
            &format!("/{BUCKET}/k"),
            &[
                ("Fencing-Token", holder.clone()),
                ("x-amz-acl", "public-read".into()),
            ],
            b"zombie",
        )
        .await;
    assert_eq!(code, 501, "{text}");
    assert!(
        text.contains("x-amz-acl") && text.contains("allow_write_headers"),
        "{text}"
    );
    assert_eq!(
        stored(&e.backend, BUCKET, "k").await,
        None,
        "nothing was written"
    );
    // What every new object gets anyway passes, and a copy keeps its tags.
    fenced!(put().acl(ObjectCannedAcl::Private), holder.clone())
        .send()
        .await
        .expect("x-amz-acl: private");
    fenced!(
        c.copy_object()
            .bucket(BUCKET)
            .key("copy")
            .copy_source(format!("{BUCKET}/src"))
            .tagging_directive(TaggingDirective::Copy),
        holder.clone()
    )
    .send()
    .await
    .expect("a copy that keeps the source's tags");

    // The operator allows tagging: it passes, and only it.
    let e = env_with(kind, "allow_write_headers = [\"tagging\"]").await;
    let c = e.proxy().client();
    fenced!(
        c.put_object()
            .bucket(BUCKET)
            .key("tagged")
            .tagging("a=b")
            .body(ByteStream::from_static(b"v")),
        holder.clone()
    )
    .send()
    .await
    .expect("tagging allowed");
    if kind != BackendKind::S3Fs {
        let tags = e
            .backend
            .direct()
            .get_object_tagging()
            .bucket(BUCKET)
            .key("tagged")
            .send()
            .await
            .expect("tags");
        assert_eq!(tags.tag_set().len(), 1, "{tags:?}");
    }
    let err = fenced!(
        c.put_object()
            .bucket(BUCKET)
            .key("acl")
            .acl(ObjectCannedAcl::PublicRead)
            .body(ByteStream::from_static(b"v")),
        holder
    )
    .send()
    .await
    .expect_err("the ACL family is still refused");
    assert_eq!(error_of(&err).0, Some(501));
}

/// H4: CreateBucket forwards plain creates only; ACL, grant, ownership and
/// object-lock headers are refused, and an existing bucket is unchanged.
/// Anonymous clients create nothing.
async fn h4_create_bucket_cannot_change_an_existing_bucket(kind: BackendKind) {
    let e = env_with(kind, "").await;
    let c = e.proxy().client();
    let err = c
        .create_bucket()
        .bucket(BUCKET)
        .acl(aws_sdk_s3::types::BucketCannedAcl::PublicRead)
        .send()
        .await
        .expect_err("refused");
    assert_eq!(error_of(&err), (Some(403), "AccessDenied".into()));
    let err = c
        .create_bucket()
        .bucket(BUCKET)
        .grant_read("uri=\"http://acs.amazonaws.com/groups/global/AllUsers\"")
        .send()
        .await
        .expect_err("refused");
    assert_eq!(error_of(&err).0, Some(403));
    let err = c
        .create_bucket()
        .bucket(BUCKET)
        .object_lock_enabled_for_bucket(true)
        .send()
        .await
        .expect_err("refused");
    assert_eq!(error_of(&err).0, Some(403));
    if kind == BackendKind::Moto {
        let acl = e
            .backend
            .direct()
            .get_bucket_acl()
            .bucket(BUCKET)
            .send()
            .await
            .expect("acl");
        assert!(
            !format!("{acl:?}").contains("AllUsers"),
            "no public grant was added: {acl:?}"
        );
        let lock = e
            .backend
            .direct()
            .get_object_lock_configuration()
            .bucket(BUCKET)
            .send()
            .await;
        assert!(lock.is_err(), "object lock was not turned on: {lock:?}");
    }
    let (code, text) = e.raw("PUT", "/anon-bucket", &[], b"").await;
    assert_eq!(code, 403, "{text}");
    assert!(!e.backend.bucket_exists("anon-bucket").await);
    c.create_bucket()
        .bucket("plain-bucket")
        .send()
        .await
        .expect("a plain create works");
    assert!(e.backend.bucket_exists("plain-bucket").await);
}

/// H8: DeleteObjects names at most 1000 keys, as on S3.
async fn h8_delete_objects_takes_at_most_1000_keys(kind: BackendKind) {
    let e = env_with(kind, "").await;
    e.put_signed("k0", &signed(BUCKET, 1), "v")
        .await
        .expect("write");
    let ids: Vec<ObjectIdentifier> = (0..1001)
        .map(|i| {
            ObjectIdentifier::builder()
                .key(format!("k{i}"))
                .build()
                .expect("id")
        })
        .collect();
    let batch = e.proxy().client().delete_objects().bucket(BUCKET).delete(
        Delete::builder()
            .set_objects(Some(ids))
            .build()
            .expect("delete"),
    );
    assert_eq!(
        refusal_of!(batch, signed(BUCKET, 1), "refused"),
        (Some(400), "MalformedXML".into())
    );
    assert!(
        stored(&e.backend, BUCKET, "k0").await.is_some(),
        "nothing deleted"
    );
}

/// Operations are decided by an allowlist of query parameters:
/// `PUT ?renameObject` is not a PutObject.
async fn unknown_query_parameters_are_refused(kind: BackendKind) {
    let e = env_with(kind, "").await;
    e.put_signed("src", &signed(BUCKET, 1), "source")
        .await
        .expect("write");
    for target in [
        "/bkt/dst?renameObject",
        "/bkt/dst?renameObject=&x-id=RenameObject",
        "/bkt/dst?x-id=RenameObject",
    ] {
        let mut h = token_header(BUCKET, 1);
        h.push(("x-amz-rename-source", "/bkt/src".into()));
        let (code, text) = e.raw("PUT", target, &h, b"").await;
        assert_eq!(code, 400, "{target}: {text}");
        fencegate_testkit::assert_mentions(&text, &["InvalidArgument"]);
    }
    assert_eq!(stored(&e.backend, BUCKET, "dst").await, None);
    assert!(stored(&e.backend, BUCKET, "src").await.is_some());
}

/// Multipart uploads bind to the identity that created them: another
/// client key, or an anonymous client, cannot send parts, complete or
/// abort; an anonymous upload answers only to its token.
async fn uploads_answer_only_to_their_creator(kind: BackendKind) {
    let e = env_with(kind, "").await;
    let owner = e.proxy().client();
    let mallory = sdk_client(&e.proxy().url, MALLORY_KEY);
    let t = signed(BUCKET, 3);
    let id = create_upload(&owner, "mpu", &t).await;
    let part = |c: &aws_sdk_s3::Client| {
        c.upload_part()
            .bucket(BUCKET)
            .key("mpu")
            .upload_id(&id)
            .part_number(1)
            .body(ByteStream::from(vec![b'm'; 1024]))
    };
    // Even with the right token, another key is not the creator.
    let err = fenced!(part(&mallory), t.clone())
        .send()
        .await
        .expect_err("refused");
    assert_eq!(error_of(&err), (Some(403), "AccessDenied".into()));
    let (code, text) = e
        .raw(
            "PUT",
            &format!("/bkt/mpu?partNumber=1&uploadId={id}"),
            &token_header(BUCKET, 3),
            b"anonymous part",
        )
        .await;
    assert_eq!(code, 403, "an anonymous part of a keyed upload: {text}");
    let err = mallory
        .abort_multipart_upload()
        .bucket(BUCKET)
        .key("mpu")
        .upload_id(&id)
        .send()
        .await
        .expect_err("refused");
    assert_eq!(error_of(&err).0, Some(403));
    let p = part(&owner).send().await.expect("the creator's part");
    let complete = |c: &aws_sdk_s3::Client| {
        c.complete_multipart_upload()
            .bucket(BUCKET)
            .key("mpu")
            .upload_id(&id)
            .multipart_upload(fencegate_testkit::s3::completed_parts([p.e_tag()]))
    };
    let err = complete(&mallory).send().await.expect_err("refused");
    assert_eq!(error_of(&err).0, Some(403));
    assert_eq!(
        stored(&e.backend, BUCKET, "mpu").await,
        None,
        "mallory completed nothing"
    );
    complete(&owner)
        .send()
        .await
        .expect("the creator completes");
    assert_eq!(
        stored(&e.backend, BUCKET, "mpu")
            .await
            .map(|(b, t)| (b.len(), t)),
        Some((1024, Some(3)))
    );

    // An anonymous upload: every request must carry its token.
    let (code, text) = e
        .raw("POST", "/bkt/anon?uploads", &token_header(BUCKET, 3), b"")
        .await;
    assert_eq!(code, 200, "{text}");
    let anon_id = xml_value(&text, "UploadId").expect("upload id");
    let target = format!("/bkt/anon?partNumber=1&uploadId={anon_id}");
    let (code, text) = e
        .raw(
            "PUT",
            &target,
            &[("Content-Type", "application/octet-stream".into())],
            b"tokenless",
        )
        .await;
    assert_eq!(code, 403, "a tokenless part of an anonymous upload: {text}");
    let (code, text) = e
        .raw("PUT", &target, &token_header(BUCKET, 3), b"with token")
        .await;
    assert_eq!(code, 200, "{text}");
}

/// Scopes that share a lock share its fence: after a newer holder wrote in
/// one scope, the stale holder cannot write in the other.
async fn scopes_sharing_a_lock_share_its_fence(kind: BackendKind) {
    let scopes = "[[scopes]]\nbucket = \"bkt\"\nprefix = \"a/\"\nlock = \"shared\"\n\
                  [[scopes]]\nbucket = \"bkt\"\nprefix = \"b/\"\nlock = \"shared\"\n";
    let e = env_with(kind, scopes).await;
    e.put_signed("a/x", &signed("shared", 2), "new holder")
        .await
        .expect("write");
    let err = e
        .put_signed("b/y", &signed("shared", 1), "stale")
        .await
        .expect_err("stale");
    assert_eq!(err, (Some(409), "FencingTokenStale".into()));
    assert_eq!(stored(&e.backend, BUCKET, "b/y").await, None);
    assert_eq!(e.proxy().max_token("shared").await, Some(2));
}

/// H3: a replica whose cache says a key is absent does not delete it
/// unconditionally. Two proxies on one moto bucket, each with its own
/// fence database: replica 1 saw only token 1 and last saw the key
/// deleted; bob writes it with token 2 through replica 2; alice's stale
/// DELETE through replica 1 must not remove bob's object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h3_a_replica_never_deletes_without_a_verified_condition() {
    let backend = Backend::start(BackendKind::Moto).await;
    backend.create_bucket(BUCKET).await;
    let d1 = tempfile::tempdir().expect("tempdir");
    let d2 = tempfile::tempdir().expect("tempdir");
    let r1 = Proxy::start(&proxy_toml(&backend, d1.path(), BUCKET, ""), d1.path()).await;
    let r2 = Proxy::start(&proxy_toml(&backend, d2.path(), BUCKET, ""), d2.path()).await;
    let (c1, c2) = (r1.client(), r2.client());
    let put = |c: &aws_sdk_s3::Client, body: &'static [u8]| {
        c.put_object()
            .bucket(BUCKET)
            .key("k")
            .body(ByteStream::from_static(body))
    };
    fenced!(put(&c1, b"alice"), signed(BUCKET, 1))
        .send()
        .await
        .expect("alice");
    fenced!(
        c1.delete_object().bucket(BUCKET).key("k"),
        signed(BUCKET, 1)
    )
    .send()
    .await
    .expect("alice deletes: replica 1 now believes k is absent");
    fenced!(put(&c2, b"bob"), signed(BUCKET, 2))
        .send()
        .await
        .expect("bob through replica 2");
    let err = fenced!(
        c1.delete_object().bucket(BUCKET).key("k"),
        signed(BUCKET, 1)
    )
    .send()
    .await
    .expect_err("alice's stale delete through replica 1");
    assert_eq!(error_of(&err), (Some(409), "FencingTokenStale".into()));
    assert_stored(&backend, BUCKET, "k", b"bob", 2).await;
    // The same through DeleteObjects.
    let batch = c1.delete_objects().bucket(BUCKET).delete(
        Delete::builder()
            .objects(ObjectIdentifier::builder().key("k").build().expect("id"))
            .build()
            .expect("delete"),
    );
    let out = fenced!(batch, signed(BUCKET, 1))
        .send()
        .await
        .expect("answered per key");
    assert_eq!(out.errors().len(), 1, "{out:?}");
    assert_eq!(out.errors()[0].code(), Some("FencingTokenStale"));
    assert_stored(&backend, BUCKET, "k", b"bob", 2).await;
}

/// H5, role 4: POST form uploads are refused before their body is read,
/// and bodies read whole share a bounded budget: through a 1 GiB
/// anonymous POST, 100 concurrent 8 MiB POSTs and 40 concurrent 8 MiB
/// DeleteObjects bodies, the proxy grows by no more than its connections'
/// read buffers (a few tens of MiB, not the 2 GiB sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h5_unauthenticated_bodies_do_not_grow_the_proxy() {
    let e = env_with(BackendKind::S3Fs, "").await;
    let pid = e.proxy_pid();
    let before = rss_mib(pid);
    let post = |size: u64, target: &'static str| {
        let addr = e.addr();
        // Form uploads, and XML bodies for the operations that take them.
        let content_type = if target.ends_with("?delete") {
            "application/xml"
        } else {
            "multipart/form-data; boundary=x"
        };
        async move {
            let mut conn = tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connect");
            let head = format!(
                "POST {target} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: {content_type}\r\nContent-Length: {size}\r\n\r\n"
            );
            conn.write_all(head.as_bytes()).await.expect("head");
            let chunk = vec![b'z'; 1 << 20];
            let mut sent = 0u64;
            while sent < size {
                if conn.write_all(&chunk).await.is_err() {
                    break; // the proxy answered and closed
                }
                sent += chunk.len() as u64;
            }
            let mut out = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut out)).await;
            String::from_utf8_lossy(&out).to_string()
        }
    };
    let answer = post(1 << 30, "/bkt").await;
    assert!(answer.starts_with("HTTP/1.1 501"), "{answer}");
    // s3s routes a form POST to PostObject whatever its query: a served
    // operation's query does not let a form through.
    let answer = post(1 << 30, "/bkt?uploads").await;
    assert!(answer.starts_with("HTTP/1.1 501"), "{answer}");
    let many: Vec<_> = (0..100)
        .map(|_| tokio::spawn(post(8 << 20, "/bkt")))
        .collect();
    for h in many {
        let a = h.await.expect("joined");
        assert!(a.starts_with("HTTP/1.1 501"), "{a}");
    }
    let xml: Vec<_> = (0..40)
        .map(|_| tokio::spawn(post(8 << 20, "/bkt?delete")))
        .collect();
    for h in xml {
        let a = h.await.expect("joined");
        // Without a token, refused on its head (428), its body unread.
        assert!(
            a.starts_with("HTTP/1.1 428"),
            "a large XML body without a token is refused unread: {}",
            a.lines().next().unwrap_or("")
        );
    }
    let after = rss_mib(pid);
    // What a correct proxy may hold at the peak (glibc keeps it as RSS):
    // what it held before, hyper's read buffer on each of the 100
    // connections at once (at most 8 KiB + 400 KiB each, hyper's default),
    // and the whole-read body budget the DeleteObjects bodies share
    // (`max_buffered_body_bytes`, 16 MiB by default). One that read these
    // bodies would hold their 2 GiB. (The bound was a flat 64 MiB, which a
    // correct proxy crossed now and then: 50-61 MiB before the fence
    // events, 41-65 after, in runs of this test alone.)
    let ceiling = before + (100 * (8 + 400)) / 1024 + 16;
    println!("proxy RSS {before} MiB before, {after} MiB after (ceiling {ceiling} MiB)");
    assert!(
        after < ceiling,
        "proxy RSS {after} MiB (was {before} MiB; ceiling {ceiling} MiB)"
    );
    // The same attack again costs nothing more: what it held is reused, so
    // memory does not grow with what is sent.
    let again: Vec<_> = (0..100)
        .map(|_| tokio::spawn(post(8 << 20, "/bkt")))
        .collect();
    for h in again {
        let a = h.await.expect("joined");
        assert!(a.starts_with("HTTP/1.1 501"), "{a}");
    }
    let second = rss_mib(pid);
    println!("proxy RSS {second} MiB after the same POSTs again");
    assert!(
        second <= after + 8,
        "the second round of POSTs grew the proxy from {after} to {second} MiB"
    );
    // And the proxy still serves.
    e.put_signed("after", &signed(BUCKET, 1), "ok")
        .await
        .expect("still serving");
}

/// H7, role 4: refused requests naming made-up buckets allocate no fence
/// and no metric series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h7_made_up_buckets_leave_no_trace() {
    let e = env_with(BackendKind::S3Fs, "").await;
    let metrics = || async {
        reqwest::get(format!("{}/_fencegate/metrics", e.proxy().url))
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text")
    };
    let before = metrics().await.len();
    for i in 0..300 {
        let (code, _) = e
            .raw(
                "PUT",
                &format!("/made-up-{i}/k"),
                &[("Content-Type", "text/plain".into())],
                b"x",
            )
            .await;
        assert_eq!(code, 428);
    }
    let text = metrics().await;
    assert!(
        !text.contains("made-up-"),
        "a made-up bucket became a metric label"
    );
    assert!(
        text.len() < before + 2048,
        "metrics grew from {before} to {} bytes",
        text.len()
    );
    assert_eq!(
        e.proxy()
            .metric(
                "fencegate_proxy_writes_total",
                &[
                    ("op", "PutObject"),
                    ("lock", "(none)"),
                    ("outcome", "missing")
                ],
            )
            .await,
        Some(300.0),
        "every refusal is counted, in the one series for unknown locks"
    );
    let st = e.proxy().status().await;
    assert!(!st.to_string().contains("made-up-"), "{st}");
}

/// A stale upload cut by the epoch barrier learns it lost its lease with
/// the non-retryable 409 `FencingTokenStale` and the token that cut it,
/// whether it was writing a new key or overwriting one (a retryable 503
/// would make rclone and the SDKs retry a write that can never succeed).
async fn a_cut_upload_always_learns_it_is_stale(kind: BackendKind) {
    let e = env_with(kind, "").await;
    e.put_signed("existing", &signed(BUCKET, 1), "old")
        .await
        .expect("token 1");
    for (key, stale) in [("new-key", 1), ("existing", 2)] {
        let mut slow = tokio::net::TcpStream::connect(e.addr())
            .await
            .expect("connect");
        let total = 2 * 1024 * 1024;
        let head = format!(
            "PUT /{BUCKET}/{key} HTTP/1.1\r\nHost: {}\r\nFencing-Token: {}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\nContent-Length: {total}\r\n\r\n",
            e.addr(),
            signed(BUCKET, stale)
        );
        slow.write_all(head.as_bytes()).await.expect("head");
        slow.write_all(&vec![b'1'; total / 2])
            .await
            .expect("first half");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let raise = stale + 1;
        tokio::time::timeout(
            Duration::from_secs(20),
            e.put_signed(
                &format!("raise-{raise}"),
                &signed(BUCKET, raise),
                "newer holder",
            ),
        )
        .await
        .expect("the raise is not blocked by the stalled upload")
        .expect("the newer holder writes");
        let _ = slow.write_all(&vec![b'1'; total / 2]).await;
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), slow.read_to_end(&mut answer)).await;
        let answer = String::from_utf8_lossy(&answer).to_string();
        assert!(answer.starts_with("HTTP/1.1 409"), "{key}: {answer}");
        assert!(answer.contains("FencingTokenStale"), "{key}: {answer}");
        assert!(
            answer
                .to_ascii_lowercase()
                .contains(&format!("fencing-max-token: {raise}")),
            "{key}: {answer}"
        );
    }
    assert_eq!(stored(&e.backend, BUCKET, "new-key").await, None);
    assert_stored(&e.backend, BUCKET, "existing", b"old", 1).await;
}

/// Role 4 with `allow_anonymous = false`: an unsigned request changes
/// nothing, even carrying the holder's signed token, and reads nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_clients_change_nothing_when_anonymous_is_off() {
    let e = Harness::new(BackendKind::S3Fs)
        .anonymous(false)
        .start()
        .await;
    e.put_signed("k", &signed(BUCKET, 1), "holder")
        .await
        .expect("a signed client writes");
    // (CreateMultipartUpload takes no body: one would be refused, 400,
    // before the credentials are looked at.)
    for (method, target, body) in [
        ("PUT", "/bkt/k", &b"anonymous"[..]),
        ("DELETE", "/bkt/k", b""),
        ("POST", "/bkt/k?uploads", b""),
        ("GET", "/bkt/k", b""),
        ("PUT", "/new-bucket", b""),
    ] {
        let (code, text) = e.raw(method, target, &token_header(BUCKET, 1), body).await;
        assert_eq!(code, 403, "{method} {target}: {text}");
        assert!(text.contains("AccessDenied"), "{method} {target}: {text}");
    }
    assert_stored(&e.backend, BUCKET, "k", b"holder", 1).await;
    assert!(!e.backend.bucket_exists("new-bucket").await);
}

/// A client that asked for `100 Continue`, was answered 409 instead, and
/// sends its body anyway (botocore does when the answer takes over a
/// second): those bytes must not be read as a next request on the same
/// connection. Here the "body" is a request of its own; it gets no answer,
/// because the connection is closed after the 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_sent_after_a_final_answer_is_never_read_as_a_request() {
    let e = env_with(BackendKind::S3Fs, "").await;
    e.put_signed("k", &signed(BUCKET, 2), "holder")
        .await
        .expect("holder");
    let smuggled = "GET /_fencegate/health HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut conn = tokio::net::TcpStream::connect(e.addr())
        .await
        .expect("connect");
    let head = format!(
        "PUT /{BUCKET}/k HTTP/1.1\r\nHost: {}\r\nFencing-Token: {}\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        e.addr(),
        signed(BUCKET, 1),
        smuggled.len()
    );
    conn.write_all(head.as_bytes()).await.expect("head");
    let first = support::read_answer(&mut conn, Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("an answer: {e}"));
    assert!(first.starts_with("HTTP/1.1 409"), "{first}");
    assert!(
        first.to_ascii_lowercase().contains("connection: close"),
        "{first}"
    );
    let _ = conn.write_all(smuggled.as_bytes()).await;
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut rest)).await;
    let rest = String::from_utf8_lossy(&rest).to_string();
    assert!(
        !rest.contains("HTTP/1.1"),
        "the late body was answered as a request: {rest}"
    );
    assert_stored(&e.backend, BUCKET, "k", b"holder", 2).await;
}

/// The head of a request sent on a connection kept open, its body never
/// sent; returns the connection and the answer's head, if one came within
/// five seconds.
async fn head_only(e: &Env, head: String) -> (tokio::net::TcpStream, Option<String>) {
    let mut c = tokio::net::TcpStream::connect(e.addr())
        .await
        .expect("connect");
    c.write_all(head.as_bytes()).await.expect("head");
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = [0u8; 4096];
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            match c.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let answer =
        (read.is_ok() && !answer.is_empty()).then(|| String::from_utf8_lossy(&answer).into_owned());
    (c, answer)
}

/// Issue 24, roles 3 and 4: the shared budget of XML bodies read whole
/// (`max_buffered_body_bytes`) is taken only by a request that has shown
/// it may write. Clients without the lease (anonymous without a token, or
/// with a stale or forged one; another client's key, header-signed with
/// UNSIGNED-PAYLOAD) announce 8 MiB DeleteObjects and Complete bodies and
/// send none: each is answered on its head at once, and the holder's
/// DeleteObjects and Complete go through while they wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_without_the_lease_cannot_hold_the_body_budget() {
    let e = env_with(BackendKind::S3Fs, "client_idle_timeout_secs = 60").await;
    let holder = signed(BUCKET, 2);
    e.put_signed("k", &holder, "v").await.expect("write");
    let client = e.proxy().client();
    let upload_id = create_upload(&client, "big", &holder).await;
    let part = fenced!(
        client
            .upload_part()
            .bucket(BUCKET)
            .key("big")
            .upload_id(&upload_id)
            .part_number(1)
            .body(ByteStream::from_static(b"part one")),
        holder.clone()
    )
    .send()
    .await
    .expect("part");
    let big = 8usize << 20;
    let addr = e.addr();
    let anonymous = |target: &str, token: Option<&str>| {
        let token = token.map_or(String::new(), |t| format!("Fencing-Token: {t}\r\n"));
        format!("POST {target} HTTP/1.1\r\nHost: {addr}\r\n{token}Content-Length: {big}\r\n\r\n")
    };
    let mallory = |target: &str| {
        let url = format!("http://{addr}{target}");
        let headers = sigv4_headers(
            MALLORY_KEY,
            "POST",
            &url,
            big,
            &[("x-amz-content-sha256", "UNSIGNED-PAYLOAD")],
            "UNSIGNED-PAYLOAD",
        );
        let mut head =
            format!("POST {target} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {big}\r\n");
        for (k, v) in &headers {
            head.push_str(&format!("{k}: {}\r\n", v.to_str().expect("text")));
        }
        head + "\r\n"
    };
    let delete = format!("/{BUCKET}?delete");
    let complete = format!("/{BUCKET}/big?uploadId={upload_id}");
    let stale = signed(BUCKET, 1);
    let forged = format!("{}0", &holder[..holder.len() - 1]);
    let hogs = [
        (
            "anonymous DeleteObjects, no token",
            anonymous(&delete, None),
            "428",
        ),
        (
            "anonymous DeleteObjects, stale token",
            anonymous(&delete, Some(&stale)),
            "409",
        ),
        (
            "anonymous DeleteObjects, forged token",
            anonymous(&delete, Some(&forged)),
            "403",
        ),
        ("another client's DeleteObjects", mallory(&delete), "428"),
        (
            "anonymous Complete, no token",
            anonymous(&complete, None),
            "403",
        ),
        (
            "anonymous Complete, another token",
            anonymous(&complete, Some(&stale)),
            "400",
        ),
        ("another client's Complete", mallory(&complete), "403"),
    ];
    let mut held = Vec::new();
    for (who, head, want) in hogs {
        let (conn, answer) = head_only(&e, head).await;
        let answer = answer.unwrap_or_else(|| {
            panic!("{who}: no answer on the head alone (its body is awaited: the budget is taken)")
        });
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {want}")),
            "{who}: {}",
            answer.lines().next().unwrap_or("")
        );
        held.push(conn);
    }
    // Twice over, so the hogs' heads would hold the whole 16 MiB budget.
    for _ in 0..2 {
        for head in [anonymous(&delete, None), mallory(&complete)] {
            held.push(head_only(&e, head).await.0);
        }
    }
    let out = fenced!(
        client.delete_objects().bucket(BUCKET).delete(
            Delete::builder()
                .objects(ObjectIdentifier::builder().key("k").build().expect("id"))
                .build()
                .expect("delete"),
        ),
        holder.clone()
    )
    .send()
    .await
    .expect("the holder's DeleteObjects");
    assert_eq!(out.deleted().len(), 1, "{out:?}");
    let e_tag = part.e_tag().expect("etag");
    complete_upload(&client, "big", &upload_id, &[e_tag], &holder)
        .await
        .expect("the holder's Complete");
    assert_stored(&e.backend, BUCKET, "big", b"part one", 2).await;
    drop(held);
}

/// Role 4: a client trickling a body that is read whole cannot pin the
/// shared budget: the body gets `client_idle_timeout_secs` in all, then
/// the request fails and its share returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_xml_body_cannot_pin_the_budget() {
    let e = env_with(BackendKind::S3Fs, "client_idle_timeout_secs = 2").await;
    e.put_signed("k", &signed(BUCKET, 1), "v")
        .await
        .expect("write");
    // Two 8 MiB DeleteObjects bodies take the whole 16 MiB budget, one
    // byte each. Only a request that may write takes a share (see
    // `clients_without_the_lease_cannot_hold_the_body_budget`): these
    // carry the holder's token.
    let mut pins = Vec::new();
    for _ in 0..2 {
        let mut c = tokio::net::TcpStream::connect(e.addr())
            .await
            .expect("connect");
        let head = format!(
            "POST /{BUCKET}?delete HTTP/1.1\r\nHost: {}\r\nFencing-Token: {}\r\nContent-Length: {}\r\n\r\n<",
            e.addr(),
            signed(BUCKET, 1),
            8 << 20
        );
        c.write_all(head.as_bytes()).await.expect("head");
        pins.push(c);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let batch = || {
        e.proxy().client().delete_objects().bucket(BUCKET).delete(
            Delete::builder()
                .objects(ObjectIdentifier::builder().key("k").build().expect("id"))
                .build()
                .expect("delete"),
        )
    };
    let err = fenced!(batch(), signed(BUCKET, 1))
        .send()
        .await
        .expect_err("the budget is taken");
    assert_eq!(error_of(&err), (Some(503), "SlowDown".into()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let out = fenced!(batch(), signed(BUCKET, 1))
        .send()
        .await
        .expect("the trickled bodies timed out and gave their share back");
    assert_eq!(out.deleted().len(), 1, "{out:?}");
    drop(pins);
}

/// A DeleteObjects with a plain token (where the operator trusts plain
/// numbers) in a bucket fenced by prefix scopes: the token names no lock,
/// so its right to have the body read is proved against the bucket's
/// scopes, and the keys are then decided one by one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_delete_with_a_plain_token_in_prefix_scopes() {
    let e = env_with(
        BackendKind::S3Fs,
        "accept_unsigned_tokens = true\n[[scopes]]\nbucket = \"bkt\"\nprefix = \"logs/\"\nlock = \"logs\"\n\
         [[scopes]]\nbucket = \"bkt\"\nprefix = \"db/\"\nlock = \"db\"\n",
    )
    .await;
    let (code, text) = e
        .raw(
            "PUT",
            &format!("/{BUCKET}/db/x"),
            &[("Fencing-Token", "5".into())],
            b"v",
        )
        .await;
    assert_eq!(code, 200, "{text}");
    let c = e.proxy().client();
    let out = fenced!(
        c.delete_objects().bucket(BUCKET).delete(
            Delete::builder()
                .objects(ObjectIdentifier::builder().key("db/x").build().expect("id"))
                .build()
                .expect("delete"),
        ),
        "5".to_owned()
    )
    .send()
    .await
    .expect("the batch delete");
    assert_eq!(out.deleted().len(), 1, "{out:?}");
    assert_eq!(stored(&e.backend, BUCKET, "db/x").await, None);
}

/// `s` percent-encoded for a query value.
fn urlencoding_of(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
