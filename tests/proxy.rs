//! The fencing proxy end to end: a real proxy process in front of real S3
//! servers (s3s-fs in process, moto_server), the same tests on both.

#[macro_use]
mod support;

use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart, Delete, ObjectIdentifier};
use base64::Engine as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use support::harness::{Env, Harness};
use support::s3::*;
use support::{write_file, xml_value};

const BUCKET: &str = "bkt";

async fn env(kind: BackendKind) -> Env {
    env_with(kind, "").await
}

async fn env_with(kind: BackendKind, extra_toml: &str) -> Env {
    Harness::new(kind).proxy_config(extra_toml).start().await
}

on_every_backend!(
    threads = 4;
    reference_scenario_and_the_unfenced_negative,
    equal_tokens_accepted_higher_raises_and_max_survives_kill_9,
    every_write_operation_is_fenced,
    multipart_token_binds_at_create_and_a_new_holder_stops_complete,
    epoch_barrier_cuts_a_stale_streaming_upload,
    concurrent_writers_never_lower_a_stored_token,
    forged_tokens_are_refused_and_leave_max_unchanged,
    client_errors_get_clear_s3_errors_and_write_nothing,
    writes_the_store_refuses_leave_the_object_as_it_was,
    the_lean_put_forwards_what_describes_the_object_and_nothing_else,
    a_new_key_costs_one_round_trip_and_an_unknown_existing_key_is_read_after_the_store_refuses,
    signed_puts_take_the_edge_and_a_body_unlike_its_signed_hash_writes_nothing,
    a_body_unlike_its_trailing_checksum_writes_nothing,
    copy_source_conditions_are_never_dropped,
);

/// CRC-32 (IEEE), as `x-amz-checksum-crc32` carries it: base64 of the
/// big-endian value.
fn crc32_b64(data: &[u8]) -> String {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    base64::engine::general_purpose::STANDARD.encode((!crc).to_be_bytes())
}

/// SHA-256, as `x-amz-checksum-sha256` carries it: base64.
fn sha256_b64(data: &[u8]) -> String {
    use sha2::Digest as _;
    base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(data))
}

/// A PutObject sent as botocore sends it by default: `aws-chunked`, chunks
/// unsigned, a CRC-32 trailer (`checksum_of` is what the trailer claims to
/// be the checksum of), signed with the proxy's client key.
async fn trailer_put(
    e: &Env,
    key: &str,
    token: &str,
    data: &[u8],
    checksum_of: &[u8],
    declared: usize,
) -> (u16, String) {
    let crc = crc32_b64(checksum_of);
    let trailer = [("x-amz-checksum-crc32", crc.as_str())];
    trailer_put_with(
        e,
        key,
        token,
        data,
        &trailer,
        "x-amz-checksum-crc32",
        declared,
    )
    .await
}

/// [`trailer_put`] with the trailer's lines and the `x-amz-trailer` that
/// announces them given.
async fn trailer_put_with(
    e: &Env,
    key: &str,
    token: &str,
    data: &[u8],
    trailer: &[(&str, &str)],
    announced: &str,
    declared: usize,
) -> (u16, String) {
    // Chunks of at most 5 bytes, so a body can run past its declared length.
    let mut body = Vec::new();
    for chunk in data.chunks(5) {
        body.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        body.extend_from_slice(chunk);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(b"0\r\n");
    for (name, value) in trailer {
        body.extend_from_slice(format!("{name}:{value}\r\n").as_bytes());
    }
    body.extend_from_slice(b"\r\n");
    // `key` may carry a query (an UploadPart's).
    let url = format!("{}/{BUCKET}/{key}", e.proxy().url);
    let declared = declared.to_string();
    let headers = client_signed(
        &url,
        body.len(),
        &[
            ("content-encoding", "aws-chunked"),
            ("x-amz-decoded-content-length", declared.as_str()),
            ("x-amz-trailer", announced),
        ],
        "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
    );
    send_put(&url, token, headers, body).await
}

/// A body whose `aws-chunked` trailer carries a checksum it does not match
/// is refused with 400 `BadDigest` and never lands, for a new key, for a
/// key the proxy streams over, and for an upload's part; so is a body
/// longer than its declared `x-amz-decoded-content-length` (the trailer arrives after the data: the
/// proxy keeps the last chunk back until it has checked it).
async fn a_body_unlike_its_trailing_checksum_writes_nothing(kind: BackendKind) {
    let e = env(kind).await;
    let token = signed(BUCKET, 1);
    let (status, text) = trailer_put(&e, "t", &token, b"hello", b"hello", b"hello".len()).await;
    assert_eq!(status, 200, "{text}");
    assert_stored(&e.backend, BUCKET, "t", b"hello", 1).await;
    let (status, text) = trailer_put(&e, "t", &token, b"hellO", b"hello", b"hellO".len()).await;
    assert_eq!(status, 400, "{text}");
    fencegate_testkit::assert_mentions(&text, &["BadDigest"]);
    assert_stored_as(
        &e.backend,
        BUCKET,
        "t",
        b"hello",
        1,
        "the object is as it was",
    )
    .await;
    let (status, text) = trailer_put(&e, "new", &token, b"hellO", b"hello", b"hellO".len()).await;
    assert_eq!(status, 400, "{text}");
    assert_eq!(stored(&e.backend, BUCKET, "new").await, None);

    // Every value the trailer carries is checked, not the first one only:
    // a right CRC-32 first and a wrong SHA-256 second, either order; a
    // name the proxy cannot check; a value the trailer did not announce.
    let (right, wrong) = (crc32_b64(b"hellO"), sha256_b64(b"hello"));
    let both = "x-amz-checksum-crc32,x-amz-checksum-sha256";
    for (trailer, announced) in [
        (
            vec![
                ("x-amz-checksum-crc32", right.as_str()),
                ("x-amz-checksum-sha256", wrong.as_str()),
            ],
            both,
        ),
        (
            vec![
                ("x-amz-checksum-sha256", wrong.as_str()),
                ("x-amz-checksum-crc32", right.as_str()),
            ],
            "x-amz-checksum-sha256, x-amz-checksum-crc32",
        ),
        (
            vec![
                ("x-amz-checksum-crc32", right.as_str()),
                ("x-amz-checksum-xxh3", "AAAA"),
            ],
            "x-amz-checksum-crc32,x-amz-checksum-xxh3",
        ),
        (
            vec![
                ("x-amz-checksum-crc32", right.as_str()),
                ("x-amz-checksum-sha256", wrong.as_str()),
            ],
            "x-amz-checksum-crc32",
        ),
    ] {
        for key in ["t", "two"] {
            let (status, text) =
                trailer_put_with(&e, key, &token, b"hellO", &trailer, announced, 5).await;
            assert_eq!(status, 400, "{trailer:?} announced {announced}: {text}");
        }
        assert_stored_as(
            &e.backend,
            BUCKET,
            "t",
            b"hello",
            1,
            &format!("the object is as it was after {trailer:?}"),
        )
        .await;
        assert_eq!(stored(&e.backend, BUCKET, "two").await, None);
    }
    let right_sha = sha256_b64(b"hellO");
    let (status, text) = trailer_put_with(
        &e,
        "two",
        &token,
        b"hellO",
        &[
            ("x-amz-checksum-crc32", right.as_str()),
            ("x-amz-checksum-sha256", right_sha.as_str()),
        ],
        both,
        5,
    )
    .await;
    assert_eq!(status, 200, "both values right: {text}");
    assert_stored(&e.backend, BUCKET, "two", b"hellO", 1).await;

    // An empty body: a sender never reads a body of length 0, so its
    // trailer is checked before anything is sent.
    let (status, text) = trailer_put(&e, "empty", &token, b"", b"x", 0).await;
    assert_eq!(status, 400, "{text}");
    fencegate_testkit::assert_mentions(&text, &["BadDigest"]);
    assert_eq!(stored(&e.backend, BUCKET, "empty").await, None);
    let (status, text) = trailer_put(&e, "t", &token, b"", b"x", 0).await;
    assert_eq!(status, 400, "{text}");
    assert_stored_as(
        &e.backend,
        BUCKET,
        "t",
        b"hello",
        1,
        "the object is as it was",
    )
    .await;
    let (status, text) = trailer_put(&e, "empty", &token, b"", b"", 0).await;
    assert_eq!(
        status, 200,
        "an empty body with its right checksum lands: {text}"
    );
    assert_eq!(
        stored(&e.backend, BUCKET, "empty").await,
        Some((Vec::new(), Some(1)))
    );

    // A body longer than its declared decoded length: a sender that
    // stops at the length would deliver its first 5 bytes as the object.
    let (status, text) = trailer_put(&e, "long", &token, b"hellohello", b"hellohello", 5).await;
    assert_eq!(status, 400, "{text}");
    fencegate_testkit::assert_mentions(&text, &["x-amz-decoded-content-length"]);
    assert_eq!(stored(&e.backend, BUCKET, "long").await, None);
    let (status, text) = trailer_put(&e, "t", &token, b"hellohello", b"hellohello", 5).await;
    assert_eq!(status, 400, "{text}");
    assert_stored_as(
        &e.backend,
        BUCKET,
        "t",
        b"hello",
        1,
        "the object is as it was",
    )
    .await;

    // An upload's part, the same way.
    let up = fenced!(
        e.proxy()
            .client()
            .create_multipart_upload()
            .bucket(BUCKET)
            .key("parts"),
        token.clone()
    )
    .send()
    .await
    .expect("create");
    let id = up.upload_id().expect("id").to_owned();
    let part = format!("parts?partNumber=1&uploadId={id}");
    let (status, text) = trailer_put(
        &e,
        &part,
        &token,
        b"part twO",
        b"part two",
        b"part twO".len(),
    )
    .await;
    assert_eq!(status, 400, "{text}");
    fencegate_testkit::assert_mentions(&text, &["BadDigest"]);
    let empty_part = format!("parts?partNumber=2&uploadId={id}");
    let (status, text) = trailer_put(&e, &empty_part, &token, b"", b"x", 0).await;
    assert_eq!(status, 400, "an empty part unlike its checksum: {text}");
    fencegate_testkit::assert_mentions(&text, &["BadDigest"]);
    // Had the part landed, the store would complete the upload with it.
    let etag = {
        use s3s::crypto::Checksum as _;
        let mut md5 = s3s::crypto::Md5::new();
        md5.update(b"part twO");
        format!("\"{}\"", hex::encode(md5.finalize()))
    };
    let landed = e
        .backend
        .direct()
        .complete_multipart_upload()
        .bucket(BUCKET)
        .key("parts")
        .upload_id(&id)
        .multipart_upload(fencegate_testkit::s3::completed_parts([Some(
            etag.as_str(),
        )]))
        .send()
        .await;
    assert!(landed.is_err(), "the part unlike its checksum landed");
}

/// A PUT signed with the proxy's client key by `aws-sigv4`, with
/// `x-amz-content-sha256` the SHA-256 of `signed_body` (sent: `body`),
/// and `signature_ok = false` to spoil the signature.
async fn hand_signed_put(
    e: &Env,
    key: &str,
    token: &str,
    signed_body: &[u8],
    body: &'static [u8],
    signature_ok: bool,
) -> (u16, String) {
    use sha2::Digest as _;
    let url = format!("{}/{BUCKET}/{key}", e.proxy().url);
    let hash = hex::encode(sha2::Sha256::digest(signed_body));
    let mut headers = client_signed(&url, body.len(), &[], &hash);
    if !signature_ok {
        let mut value = headers["authorization"].to_str().expect("text").to_owned();
        let last = value.pop().expect("signature");
        value.push(if last == '0' { '1' } else { '0' });
        headers.insert("authorization", value.parse().expect("value"));
    }
    send_put(&url, token, headers, body.to_vec()).await
}

/// The headers of a PUT of `length` bytes to `url`, signed with the
/// proxy's client key (see [`sigv4_headers`]).
fn client_signed(
    url: &str,
    length: usize,
    headers: &[(&str, &str)],
    payload: &str,
) -> http::HeaderMap {
    sigv4_headers(CLIENT_KEY, "PUT", url, length, headers, payload)
}

/// Sends a PUT with `headers` (from [`client_signed`]) and the token.
async fn send_put(
    url: &str,
    token: &str,
    headers: http::HeaderMap,
    body: Vec<u8>,
) -> (u16, String) {
    // Set here: an empty body would go without it, and it is signed.
    let length = body.len();
    let resp = reqwest::Client::new()
        .put(url)
        .header("fencing-token", token)
        .headers(headers)
        .header(http::header::CONTENT_LENGTH, length)
        .body(body)
        .send()
        .await
        .expect("sent");
    (
        resp.status().as_u16(),
        resp.text().await.unwrap_or_default(),
    )
}

/// Signed PutObjects are served by the edge, without s3s (see
/// `fencegate_proxy::edge`): the SDK's, and a hand-signed one with its
/// payload's SHA-256. A body unlike the hash it was signed with writes
/// nothing, and a spoiled signature is refused (by s3s, as before).
async fn signed_puts_take_the_edge_and_a_body_unlike_its_signed_hash_writes_nothing(
    kind: BackendKind,
) {
    let e = env(kind).await;
    let edge = || async {
        e.proxy()
            .metric("fencegate_proxy_edge_puts_total", &[])
            .await
            .unwrap_or(0.0)
    };
    let before = edge().await;
    let token = signed(BUCKET, 1);
    e.put("sdk", &token, "by the sdk").await.expect("sdk put");
    assert_stored(&e.backend, BUCKET, "sdk", b"by the sdk", 1).await;
    let (status, text) = hand_signed_put(&e, "hashed", &token, b"mine", b"mine", true).await;
    assert_eq!(status, 200, "{text}");
    assert_stored(&e.backend, BUCKET, "hashed", b"mine", 1).await;
    assert_eq!(edge().await - before, 2.0, "both went through the edge");

    // A new key (its small body held, then sent) and a key the proxy
    // knows (the body streamed to the store under If-Match).
    let (status, text) = hand_signed_put(&e, "swapped", &token, b"signed", b"sent!!", true).await;
    assert_eq!(status, 400, "{text}");
    fencegate_testkit::assert_mentions(&text, &["x-amz-content-sha256"]);
    assert_eq!(stored(&e.backend, BUCKET, "swapped").await, None);
    let (status, text) = hand_signed_put(&e, "hashed", &token, b"MINE", b"mind", true).await;
    assert_eq!(status, 400, "{text}");
    assert_stored_as(
        &e.backend,
        BUCKET,
        "hashed",
        b"mine",
        1,
        "the streamed body unlike its hash never landed",
    )
    .await;
    assert_eq!(edge().await - before, 4.0, "verified by the edge");

    // An empty body, which no sender reads: its hash is checked before
    // anything is sent.
    let (status, text) = hand_signed_put(&e, "emptied", &token, b"mine", b"", true).await;
    assert_eq!(status, 400, "{text}");
    fencegate_testkit::assert_mentions(&text, &["x-amz-content-sha256"]);
    assert_eq!(stored(&e.backend, BUCKET, "emptied").await, None);
    let (status, text) = hand_signed_put(&e, "hashed", &token, b"mine", b"", true).await;
    assert_eq!(status, 400, "{text}");
    assert_stored_as(
        &e.backend,
        BUCKET,
        "hashed",
        b"mine",
        1,
        "the empty body unlike its hash never landed",
    )
    .await;
    let (status, text) = hand_signed_put(&e, "empty", &token, b"", b"", true).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        stored(&e.backend, BUCKET, "empty").await,
        Some((Vec::new(), Some(1)))
    );
    assert_eq!(edge().await - before, 7.0, "verified by the edge");

    let (status, text) = hand_signed_put(&e, "forged", &token, b"mine", b"mine", false).await;
    assert_eq!(status, 403, "{text}");
    fencegate_testkit::assert_mentions(&text, &["SignatureDoesNotMatch"]);
    assert_eq!(stored(&e.backend, BUCKET, "forged").await, None);
    assert_eq!(
        edge().await - before,
        7.0,
        "a spoiled signature goes to s3s"
    );
}

/// A small PUT to a key the proxy knows nothing of is sent with
/// `If-None-Match: *` and no read first. When the key exists after all,
/// the store refuses, the proxy reads the key and decides as it would have:
/// the same body goes again with `If-Match` when the stored token allows,
/// and the write is stale when it does not.
async fn a_new_key_costs_one_round_trip_and_an_unknown_existing_key_is_read_after_the_store_refuses(
    kind: BackendKind,
) {
    let harness = Harness::new(kind);
    let backend = harness.backend().await;
    let (relay, seen) =
        support::relay::recording_relay(backend.endpoint.trim_start_matches("http://").to_owned())
            .await;
    let e = harness.first_proxy_via(&relay).start_on(backend).await;
    let direct_put = |key: &'static str, token: &'static str| {
        e.backend
            .direct()
            .put_object()
            .bucket(BUCKET)
            .key(key)
            .metadata("fencing-token", token)
            .body(ByteStream::from_static(b"written behind the proxy"))
            .send()
    };
    direct_put("behind", "1").await.expect("direct");
    direct_put("newer", "5").await.expect("direct");
    let requests = || std::mem::take(&mut *seen.lock());
    requests();

    e.put("fresh", &signed(BUCKET, 1), "new key")
        .await
        .expect("new key");
    assert_eq!(requests(), ["PUT /bkt/fresh"], "one round trip");
    e.put("fresh", &signed(BUCKET, 1), "again")
        .await
        .expect("known key");
    assert_eq!(
        requests(),
        ["PUT /bkt/fresh"],
        "one round trip (If-Match from the cache)"
    );

    e.put("behind", &signed(BUCKET, 1), "over it")
        .await
        .expect("existing key");
    assert_eq!(
        requests(),
        ["PUT /bkt/behind", "HEAD /bkt/behind", "PUT /bkt/behind"],
        "refused, read, sent again"
    );
    assert_stored(&e.backend, BUCKET, "behind", b"over it", 1).await;

    let err = e
        .put("newer", &signed(BUCKET, 2), "stale")
        .await
        .expect_err("the stored token is higher");
    assert_eq!(
        err,
        (
            Some(409),
            "FencingTokenStale".to_owned(),
            Some("5".to_owned())
        )
    );
    assert_eq!(requests(), ["PUT /bkt/newer", "HEAD /bkt/newer"]);
    assert_stored(&e.backend, BUCKET, "newer", b"written behind the proxy", 5).await;
}

/// PutObject goes through the lean forwarder (not the SDK): the object's
/// headers and metadata arrive as the client sent them, keys with spaces,
/// `+`, `%` and non-ASCII characters land at the right key, the client's
/// own token metadata is replaced, and its conditions are not sent as is.
async fn the_lean_put_forwards_what_describes_the_object_and_nothing_else(kind: BackendKind) {
    let e = env(kind).await;
    let http = reqwest::Client::new();
    let before = e
        .proxy()
        .metric("fencegate_proxy_lean_forwards_total", &[])
        .await
        .unwrap_or(0.0);
    for key in ["plain", "a b/c+d%e", "ünï/cödé~x"] {
        let url = format!(
            "{}/{BUCKET}/{}",
            e.proxy().url,
            fencegate_proxy::sigv4::encode_key(key)
        );
        let r = http
            .put(&url)
            .header("fencing-token", signed(BUCKET, 1))
            .header("content-type", "text/x-fencegate")
            .header("cache-control", "no-store")
            .header("content-disposition", "attachment; filename=\"x.txt\"")
            .header("content-language", "fr")
            .header("x-amz-meta-owner", "alice")
            .header("x-amz-meta-fencing-token", "999")
            .header("x-amz-storage-class", "STANDARD")
            .body(format!("body of {key}"))
            .send()
            .await
            .expect("sent");
        assert_eq!(
            r.status(),
            200,
            "{key}: {}",
            r.text().await.unwrap_or_default()
        );
        assert!(
            r.headers().contains_key("etag"),
            "{key}: the ETag comes back"
        );
        let got = e
            .backend
            .direct()
            .get_object()
            .bucket(BUCKET)
            .key(key)
            .send()
            .await
            .unwrap_or_else(|err| panic!("{key} is stored at its key: {err:?}"));
        assert_eq!(got.content_type(), Some("text/x-fencegate"), "{key}");
        assert_eq!(got.cache_control(), Some("no-store"), "{key}");
        assert_eq!(
            got.content_disposition(),
            Some("attachment; filename=\"x.txt\""),
            "{key}"
        );
        assert_eq!(got.content_language(), Some("fr"), "{key}");
        let meta = got.metadata().cloned().unwrap_or_default();
        assert_eq!(
            meta.get("owner").map(String::as_str),
            Some("alice"),
            "{key}"
        );
        assert_eq!(
            meta.get("fencing-token").map(String::as_str),
            Some("1"),
            "{key}: the proxy's token, not the client's"
        );
        let body = got.body.collect().await.expect("body").into_bytes();
        assert_eq!(body.as_ref(), format!("body of {key}").as_bytes());
    }
    // A second write of a key goes out with If-Match of the first: a
    // client's own If-None-Match: * is checked by the proxy (the key
    // exists) and refused, not sent.
    let url = format!("{}/{BUCKET}/plain", e.proxy().url);
    let r = http
        .put(&url)
        .header("fencing-token", signed(BUCKET, 1))
        .header("if-none-match", "*")
        .body("again")
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 412);
    let after = e
        .proxy()
        .metric("fencegate_proxy_lean_forwards_total", &[])
        .await
        .expect("counted");
    assert_eq!(after - before, 3.0, "the three PUTs took the lean path");
}

async fn acquire(locksvc: &str, lock: &str, owner: &str, ttl_ms: u64) -> serde_json::Value {
    let resp = reqwest::Client::new()
        .post(format!("{locksvc}/v1/locks/{lock}/acquire"))
        .json(&serde_json::json!({"owner": owner, "ttl_ms": ttl_ms}))
        .send()
        .await
        .expect("locksvc answers");
    assert_eq!(resp.status(), 200);
    resp.json().await.expect("json")
}

async fn reference_scenario_and_the_unfenced_negative(kind: BackendKind) {
    let e = env(kind).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let locksvc = tokio::task::spawn_blocking({
        let p = dir.path().to_owned();
        move || support::start_locksvc(&p)
    })
    .await
    .expect("locksvc");

    let a = acquire(&locksvc.url, BUCKET, "A", 1000).await;
    let a_token = a["fencing_token"].as_str().expect("token").to_owned();
    e.put("report.db", &a_token, "from A")
        .await
        .expect("A writes");

    // A pauses past its lease; B takes over and writes.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let b = acquire(&locksvc.url, BUCKET, "B", 30_000).await;
    let b_number = b["token"].as_u64().expect("number");
    assert!(b_number > a["token"].as_u64().expect("number"));
    e.put(
        "report.db",
        b["fencing_token"].as_str().expect("token"),
        "from B",
    )
    .await
    .expect("B writes");

    // A wakes up and writes with its old token: refused, with B's token.
    let err = e
        .put("report.db", &a_token, "late A")
        .await
        .expect_err("stale");
    assert_eq!(
        err,
        (
            Some(409),
            "FencingTokenStale".into(),
            Some(b_number.to_string())
        )
    );
    assert_stored_as(
        &e.backend,
        BUCKET,
        "report.db",
        b"from B",
        b_number,
        "the object holds B's data and B's token",
    )
    .await;

    // The negative: the same late write straight to the store overwrites B.
    e.backend
        .direct()
        .put_object()
        .bucket(BUCKET)
        .key("report.db")
        .body(ByteStream::from_static(b"late A"))
        .send()
        .await
        .expect("an unfenced store accepts anything");
    assert_eq!(
        stored_body(&e.backend, BUCKET, "report.db").await,
        Some(b"late A".to_vec()),
        "without the fence, A's late write destroys B's"
    );
}

async fn equal_tokens_accepted_higher_raises_and_max_survives_kill_9(kind: BackendKind) {
    let mut e = env(kind).await;
    for i in 0..5 {
        e.put("k", &signed(BUCKET, 5), &format!("v{i}"))
            .await
            .expect("equal token accepted");
    }
    assert_eq!(e.proxy().max_token(BUCKET).await, Some(5));
    let err = e
        .put("k", &signed(BUCKET, 4), "old")
        .await
        .expect_err("lower");
    assert_eq!(err.2.as_deref(), Some("5"));
    e.put("k", &signed(BUCKET, 7), "v7")
        .await
        .expect("higher accepted");
    assert_eq!(e.proxy().max_token(BUCKET).await, Some(7));

    e.proxies[0].kill9();
    e.proxies[0].restart().await;
    assert_eq!(
        e.proxy().max_token(BUCKET).await,
        Some(7),
        "max survives kill -9"
    );
    let err = e
        .put("other-key", &signed(BUCKET, 6), "stale after restart")
        .await
        .expect_err("lower");
    assert_eq!(err.0, Some(409));
    assert_eq!(err.2.as_deref(), Some("7"));
    e.put("k", &signed(BUCKET, 7), "v7 again")
        .await
        .expect("equal after restart");
    assert_eq!(stored(&e.backend, BUCKET, "other-key").await, None);
}

/// Asserts an SDK call failed with `status` and `code`.
macro_rules! assert_refused {
    ($call:expr, $status:expr, $code:expr, $what:expr) => {{
        match $call.await {
            Ok(_) => panic!("{} was accepted", $what),
            Err(e) => {
                let (s, c) = error_of(&e);
                assert_eq!((s, c.as_str()), (Some($status), $code), "{}: {e:?}", $what);
            }
        }
    }};
}

async fn every_write_operation_is_fenced(kind: BackendKind) {
    let e = env(kind).await;
    let c = e.proxy().client();
    let t = |n: u64| signed(BUCKET, n);
    e.put("src", &t(10), "source").await.expect("max is now 10");

    // PutObject
    assert_refused!(
        c.put_object()
            .bucket(BUCKET)
            .key("p")
            .body(ByteStream::from_static(b"x"))
            .send(),
        428,
        "FencingTokenRequired",
        "put without token"
    );
    assert_refused!(
        fenced!(
            c.put_object()
                .bucket(BUCKET)
                .key("p")
                .body(ByteStream::from_static(b"x")),
            t(9)
        )
        .send(),
        409,
        "FencingTokenStale",
        "stale put"
    );
    fenced!(
        c.put_object()
            .bucket(BUCKET)
            .key("p")
            .body(ByteStream::from_static(b"x")),
        t(10)
    )
    .send()
    .await
    .expect("put");

    // CopyObject (destination fenced)
    let copy = || {
        c.copy_object()
            .bucket(BUCKET)
            .key("copy")
            .copy_source(format!("{BUCKET}/src"))
    };
    assert_refused!(
        copy().send(),
        428,
        "FencingTokenRequired",
        "copy without token"
    );
    assert_refused!(
        fenced!(copy(), t(9)).send(),
        409,
        "FencingTokenStale",
        "stale copy"
    );
    fenced!(copy(), t(10)).send().await.expect("copy");
    assert_stored(&e.backend, BUCKET, "copy", b"source", 10).await;

    // DeleteObject
    let del = || c.delete_object().bucket(BUCKET).key("copy");
    assert_refused!(
        del().send(),
        428,
        "FencingTokenRequired",
        "delete without token"
    );
    assert_refused!(
        fenced!(del(), t(9)).send(),
        409,
        "FencingTokenStale",
        "stale delete"
    );
    assert!(
        stored(&e.backend, BUCKET, "copy").await.is_some(),
        "refused deletes deleted nothing"
    );
    fenced!(del(), t(10)).send().await.expect("delete");
    assert_eq!(stored(&e.backend, BUCKET, "copy").await, None);

    // DeleteObjects
    let batch = || {
        c.delete_objects().bucket(BUCKET).delete(
            Delete::builder()
                .objects(ObjectIdentifier::builder().key("p").build().expect("id"))
                .build()
                .expect("delete"),
        )
    };
    assert_refused!(
        batch().send(),
        428,
        "FencingTokenRequired",
        "batch delete without token"
    );
    assert_refused!(
        fenced!(batch(), t(9)).send(),
        409,
        "FencingTokenStale",
        "stale batch delete"
    );
    assert!(stored(&e.backend, BUCKET, "p").await.is_some());
    let out = fenced!(batch(), t(10)).send().await.expect("batch delete");
    assert_eq!(out.deleted().len(), 1, "{out:?}");
    assert!(out.errors().is_empty(), "{out:?}");
    assert_eq!(stored(&e.backend, BUCKET, "p").await, None);

    // CreateMultipartUpload, UploadPart, UploadPartCopy, Complete, Abort
    let create = || c.create_multipart_upload().bucket(BUCKET).key("mpu");
    assert_refused!(
        create().send(),
        428,
        "FencingTokenRequired",
        "create without token"
    );
    assert_refused!(
        fenced!(create(), t(9)).send(),
        409,
        "FencingTokenStale",
        "stale create"
    );
    let up = fenced!(create(), t(10)).send().await.expect("create");
    let id = up.upload_id().expect("id").to_owned();
    let part = |n: i32| {
        c.upload_part()
            .bucket(BUCKET)
            .key("mpu")
            .upload_id(&id)
            .part_number(n)
            .body(ByteStream::from(vec![b'a'; 5 * 1024 * 1024]))
    };
    assert_refused!(
        fenced!(part(1), t(11)).send(),
        400,
        "InvalidFencingToken",
        "part with another token"
    );
    let p1 = part(1)
        .send()
        .await
        .expect("part without header uses the bound token");
    let p2 = c
        .upload_part_copy()
        .bucket(BUCKET)
        .key("mpu")
        .upload_id(&id)
        .part_number(2)
        .copy_source(format!("{BUCKET}/src"))
        .send()
        .await
        .expect("part copy");
    let parts = fencegate_testkit::s3::completed_parts([
        p1.e_tag(),
        p2.copy_part_result().and_then(|r| r.e_tag()),
    ]);
    c.complete_multipart_upload()
        .bucket(BUCKET)
        .key("mpu")
        .upload_id(&id)
        .multipart_upload(parts)
        .send()
        .await
        .expect("complete without header uses the bound token");
    let (body, token) = stored(&e.backend, BUCKET, "mpu").await.expect("object");
    assert_eq!((body.len(), token), (5 * 1024 * 1024 + 6, Some(10)));

    // A stale upload can no longer send parts, but its own client may
    // abort it (an abort changes no object: it only frees the parts).
    let up = fenced!(create(), t(10)).send().await.expect("create");
    let id = up.upload_id().expect("id").to_owned();
    e.put("raise", &t(11), "x").await.expect("max is now 11");
    assert_refused!(
        c.upload_part()
            .bucket(BUCKET)
            .key("mpu")
            .upload_id(&id)
            .part_number(1)
            .body(ByteStream::from_static(b"stale part"))
            .send(),
        409,
        "FencingTokenStale",
        "a stale part"
    );
    c.abort_multipart_upload()
        .bucket(BUCKET)
        .key("mpu")
        .upload_id(&id)
        .send()
        .await
        .expect("the stale upload's own client aborts it");
    assert_refused!(
        c.upload_part()
            .bucket(BUCKET)
            .key("mpu")
            .upload_id(&id)
            .part_number(1)
            .body(ByteStream::from_static(b"after abort"))
            .send(),
        404,
        "NoSuchUpload",
        "a part of the aborted upload"
    );
    let up = fenced!(create(), t(11)).send().await.expect("create");
    c.abort_multipart_upload()
        .bucket(BUCKET)
        .key("mpu")
        .upload_id(up.upload_id().expect("id"))
        .send()
        .await
        .expect("abort with the bound token");

    // An upload the proxy did not create has no token: refused.
    let direct = e
        .backend
        .direct()
        .create_multipart_upload()
        .bucket(BUCKET)
        .key("sneaky")
        .send()
        .await
        .expect("direct create");
    assert_refused!(
        fenced!(
            c.upload_part()
                .bucket(BUCKET)
                .key("sneaky")
                .upload_id(direct.upload_id().expect("id"))
                .part_number(1)
                .body(ByteStream::from_static(b"x")),
            t(11)
        )
        .send(),
        404,
        "NoSuchUpload",
        "part of an upload created behind the proxy's back"
    );
}

async fn complete(
    c: &aws_sdk_s3::Client,
    key: &str,
    id: &str,
    parts: Vec<(i32, Option<String>)>,
) -> Result<(), (Option<u16>, String)> {
    let mut b = CompletedMultipartUpload::builder();
    for (n, etag) in parts {
        b = b.parts(
            CompletedPart::builder()
                .part_number(n)
                .set_e_tag(etag)
                .build(),
        );
    }
    c.complete_multipart_upload()
        .bucket(BUCKET)
        .key(key)
        .upload_id(id)
        .multipart_upload(b.build())
        .send()
        .await
        .map(|_| ())
        .map_err(|e| error_of(&e))
}

async fn multipart_token_binds_at_create_and_a_new_holder_stops_complete(kind: BackendKind) {
    let e = env(kind).await;
    let c = e.proxy().client();
    // As s3cmd does it: the token only on Create.
    let id = create_upload(&c, "big", &signed(BUCKET, 1)).await;
    let part = |n: i32| {
        part_of(&c, "big", &id, n)
            .body(ByteStream::from(vec![b'1'; 5 * 1024 * 1024]))
            .send()
    };
    let p1 = part(1).await.expect("part 1");

    // A new holder arrives between parts and writes the same key.
    e.put("big", &signed(BUCKET, 2), "new holder")
        .await
        .expect("B writes");

    assert_refused!(
        part(2),
        409,
        "FencingTokenStale",
        "part after a newer holder"
    );
    let err = complete(&c, "big", &id, vec![(1, p1.e_tag().map(str::to_owned))])
        .await
        .expect_err("stale complete");
    assert_eq!(err, (Some(409), "FencingTokenStale".to_owned()));
    assert_stored_as(
        &e.backend,
        BUCKET,
        "big",
        b"new holder",
        2,
        "the old upload never lands",
    )
    .await;

    // The binding survives a proxy restart: a restarted proxy still knows
    // the upload's token and still refuses it.
    let mut e = e;
    e.proxies[0].kill9();
    e.proxies[0].restart().await;
    let c = e.proxy().client();
    let err = complete(&c, "big", &id, vec![(1, p1.e_tag().map(str::to_owned))])
        .await
        .expect_err("stale after restart");
    assert_eq!(err, (Some(409), "FencingTokenStale".to_owned()));
}

async fn epoch_barrier_cuts_a_stale_streaming_upload(kind: BackendKind) {
    use tokio::io::AsyncWriteExt;
    let e = env(kind).await;
    e.put("warmup", &signed(BUCKET, 1), "x")
        .await
        .expect("token 1 admitted");

    // A token-1 writer starts a 4 MiB upload, sends half, and stalls.
    let addr = e.proxy().url.trim_start_matches("http://").to_owned();
    let mut slow = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let total = 4 * 1024 * 1024;
    let head = format!(
        "PUT /{BUCKET}/epoch HTTP/1.1\r\nHost: {addr}\r\nFencing-Token: {}\r\nContent-Length: {total}\r\n\r\n",
        signed(BUCKET, 1)
    );
    slow.write_all(head.as_bytes()).await.expect("head");
    slow.write_all(&vec![b'1'; total / 2])
        .await
        .expect("first half");
    e.proxy().wait_for_inflight_writes(1).await;
    let page = e.proxy().page().await;
    assert!(
        page.contains(&format!("<code>s3://{BUCKET}/epoch</code>")),
        "the status page names the key being written: {page}"
    );

    // The new holder's write is admitted in bounded time: the stalled
    // upload is cut, not waited for.
    tokio::time::timeout(
        Duration::from_secs(20),
        e.put("epoch", &signed(BUCKET, 2), "token 2"),
    )
    .await
    .expect("token 2 is not blocked by the stalled upload")
    .expect("token 2 accepted");

    // The stalled writer was answered as it was cut: stale, with the token
    // that cut it.
    let answer = support::read_answer(&mut slow, Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("the stale upload gets a whole answer: {e}"));
    assert!(
        answer.starts_with("HTTP/1.1 409")
            && answer.contains("<Code>FencingTokenStale</Code>")
            && answer.to_ascii_lowercase().contains("fencing-max-token: 2"),
        "the stale upload was not answered stale: {answer}"
    );
    // Operators see it: a cut event, with the token it lost to.
    let events: serde_json::Value = reqwest::get(format!("{}/_fencegate/events", e.proxy().url))
        .await
        .expect("events")
        .json()
        .await
        .expect("json");
    let cut = events["events"]
        .as_array()
        .and_then(|l| l.iter().find(|ev| ev["kind"] == "cut"))
        .unwrap_or_else(|| panic!("no cut event: {events}"));
    assert_eq!(
        (
            cut["key"].as_str(),
            cut["token"].as_u64(),
            cut["max"].as_u64()
        ),
        (Some("epoch"), Some(1), Some(2)),
        "{cut}"
    );

    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_stored_as(
        &e.backend,
        BUCKET,
        "epoch",
        b"token 2",
        2,
        "the token-1 object never appears",
    )
    .await;
}

async fn concurrent_writers_never_lower_a_stored_token(kind: BackendKind) {
    use parking_lot::Mutex;
    use std::sync::Arc;
    let e = Arc::new(env(kind).await);
    let keys: Vec<String> = std::iter::once("shared".to_owned())
        .chain((0..6).map(|i| format!("k{i}")))
        .collect();
    let acked: Arc<Mutex<Vec<(String, u64, String)>>> = Arc::default();

    // A monitor reads the stored tokens straight from the backend.
    let monitor = TokenMonitor::start(&e.backend, BUCKET, &keys);
    let writers: Vec<_> = (0..8u64)
        .map(|w| {
            let (e, keys, acked) = (e.clone(), keys.clone(), acked.clone());
            tokio::spawn(async move {
                for i in 0..12u64 {
                    // Tokens rise over time, and writers disagree: some are stale.
                    let token = 1 + (i / 3) + (w % 3);
                    let key = &keys[((w + i) % keys.len() as u64) as usize];
                    let key = if i % 2 == 0 { "shared" } else { key.as_str() };
                    let payload = format!("w{w}-i{i}-t{token}");
                    match e.put(key, &signed(BUCKET, token), &payload).await {
                        Ok(()) => acked.lock().push((key.to_owned(), token, payload)),
                        Err((Some(409), code, _)) if code == "FencingTokenStale" => {}
                        Err((Some(503), _, _)) => {} // retryable conflict: not acknowledged
                        Err(other) => panic!("unexpected answer {other:?}"),
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.await.expect("writer");
    }
    let acked = acked.lock().clone();
    // Every key with an acknowledged write was watched more than once.
    let written: Vec<String> = keys
        .iter()
        .filter(|k| acked.iter().any(|(key, _, _)| key == *k))
        .cloned()
        .collect();
    monitor
        .assert_never_decreased("concurrent writers", &written, 2)
        .await;

    assert!(
        acked.len() > 20,
        "too few writes were acknowledged: {}",
        acked.len()
    );
    for k in &keys {
        let mine: Vec<_> = acked.iter().filter(|(key, _, _)| key == k).collect();
        let Some(max) = mine.iter().map(|(_, t, _)| *t).max() else {
            continue;
        };
        let (body, token) = stored(&e.backend, BUCKET, k)
            .await
            .expect("acknowledged key exists");
        assert_eq!(
            token,
            Some(max),
            "{k}: the highest acknowledged token is what is stored"
        );
        let body = String::from_utf8(body).expect("utf8");
        assert!(
            mine.iter().any(|(_, t, p)| *t == max && *p == body),
            "{k}: stored {body:?} is not an acknowledged write with token {max}"
        );
    }
}

async fn forged_tokens_are_refused_and_leave_max_unchanged(kind: BackendKind) {
    let e = env(kind).await;
    e.put("k", &signed(BUCKET, 3), "genuine")
        .await
        .expect("genuine");
    let wrong_key = fencegate_core::TokenKeys::new(vec![b"some-other-key-0123456789".to_vec()])
        .expect("key")
        .sign(&fencegate_core::LockName::new(BUCKET).expect("lock"), 100)
        .to_string();
    let tampered = signed(BUCKET, 4).replacen(":4:", ":100:", 1);
    let cases = [
        ("100".to_owned(), 403, "FencingTokenUnsigned"),
        // Even at the max: a plain number proves nothing (refusals
        // publish it); only accept_unsigned_tokens lets it in.
        ("3".to_owned(), 403, "FencingTokenUnsigned"),
        (wrong_key, 403, "FencingTokenSignatureInvalid"),
        (signed("another-lock", 100), 403, "FencingTokenWrongLock"),
        (tampered, 403, "FencingTokenSignatureInvalid"),
        ("fgt1:bkt:100".to_owned(), 400, "InvalidFencingToken"),
        ("0".to_owned(), 400, "InvalidFencingToken"),
        ("-5".to_owned(), 400, "InvalidFencingToken"),
    ];
    for (token, status, code) in cases {
        let err = e.put("k", &token, "forged").await.expect_err("refused");
        assert_eq!(
            (err.0, err.1.as_str()),
            (Some(status), code),
            "token {token:?}"
        );
    }
    assert_eq!(
        e.proxy().max_token(BUCKET).await,
        Some(3),
        "no forged token raised the max"
    );
    assert_stored(&e.backend, BUCKET, "k", b"genuine", 3).await;
}

async fn client_errors_get_clear_s3_errors_and_write_nothing(kind: BackendKind) {
    let e = env(kind).await;
    let http = reqwest::Client::new();
    let url = |path: &str| format!("{}/{BUCKET}/{path}", e.proxy().url);
    let token = signed(BUCKET, 1);
    let check = |resp: reqwest::Response, status: u16, code: &'static str| async move {
        let got = resp.status().as_u16();
        let text = resp.text().await.expect("body");
        assert_eq!(got, status, "{text}");
        assert!(
            text.contains(&format!("<Code>{code}</Code>")),
            "expected {code}: {text}"
        );
    };

    // Malformed XML bodies.
    let r = http
        .post(format!("{}?delete", e.proxy().url.clone() + "/" + BUCKET))
        .header("fencing-token", &token)
        .body("<Delete><Object>")
        .send()
        .await
        .expect("sent");
    check(r, 400, "MalformedXML").await;
    let r = http
        .post(url("x?uploadId=nope"))
        .header("fencing-token", &token)
        .body("not xml at all")
        .send()
        .await
        .expect("sent");
    assert!(r.status().is_client_error(), "{:?}", r.status());

    // Unknown / unforwarded operations.
    let r = http
        .put(url("x?tagging"))
        .header("fencing-token", &token)
        .body("<Tagging><TagSet/></Tagging>")
        .send()
        .await
        .expect("sent");
    check(r, 501, "NotImplemented").await;
    let r = http
        .delete(format!("{}/{BUCKET}", e.proxy().url))
        .send()
        .await
        .expect("sent");
    check(r, 501, "NotImplemented").await;

    // Huge headers.
    let r = http
        .put(url("x"))
        .header("fencing-token", &token)
        .header("x-amz-meta-big", "a".repeat(512 * 1024))
        .body("x")
        .send()
        .await;
    match r {
        Ok(r) => assert!(r.status().is_client_error(), "{:?}", r.status()),
        Err(err) => assert!(
            err.is_request() || err.is_connect() || err.is_body(),
            "{err}"
        ),
    }

    // Wrong credentials.
    let bad_secret = sdk_client(&e.proxy().url, (CLIENT_KEY.0, "wrong-secret-123"));
    assert_refused!(
        fenced!(
            bad_secret
                .put_object()
                .bucket(BUCKET)
                .key("x")
                .body(ByteStream::from_static(b"x")),
            token.clone()
        )
        .send(),
        403,
        "SignatureDoesNotMatch",
        "wrong secret"
    );
    let unknown = sdk_client(&e.proxy().url, ("nobody", "wrong-secret-123"));
    assert_refused!(
        fenced!(
            unknown
                .put_object()
                .bucket(BUCKET)
                .key("x")
                .body(ByteStream::from_static(b"x")),
            token.clone()
        )
        .send(),
        403,
        "InvalidAccessKeyId",
        "unknown key"
    );

    assert_eq!(
        stored(&e.backend, BUCKET, "x").await,
        None,
        "nothing was written"
    );
    assert_eq!(
        e.proxy().max_token(BUCKET).await,
        None,
        "no refused request reached the fence"
    );
    // The proxy is still healthy.
    let health = http
        .get(format!("{}/_fencegate/health", e.proxy().url))
        .send()
        .await
        .expect("health");
    assert_eq!(health.status(), 200);
    let _ = &e.dir;
}

/// A body that fails its digest (where the store checks digests), a copy of
/// a missing source and a write into a missing bucket are the client's
/// mistakes: 4xx, the object as it was, and the proxy's view of the key
/// still right afterwards.
async fn writes_the_store_refuses_leave_the_object_as_it_was(kind: BackendKind) {
    let e = env(kind).await;
    let http = reqwest::Client::new();
    let url = |path: &str| format!("{}/{BUCKET}/{path}", e.proxy().url);
    let token = signed(BUCKET, 1);
    e.put("k", &token, "original").await.expect("first write");
    let error_of = |resp: reqwest::Response| async move {
        let status = resp.status().as_u16();
        let body = resp.text().await.expect("body");
        let code = xml_value(&body, "Code").unwrap_or_default();
        (status, code, body)
    };

    if kind == BackendKind::S3Fs {
        // moto does not check Content-MD5 at all (measured: a wrong one is
        // stored); the dev store checks it before it commits.
        let wrong_md5 = base64::engine::general_purpose::STANDARD.encode([0u8; 16]);
        let r = http
            .put(url("k"))
            .header("fencing-token", &token)
            .header("content-md5", wrong_md5)
            .body("corrupted in transit")
            .send()
            .await
            .expect("sent");
        let (status, code, body) = error_of(r).await;
        assert_eq!((status, code.as_str()), (400, "BadDigest"), "{body}");
        assert_stored_as(
            &e.backend,
            BUCKET,
            "k",
            b"original",
            1,
            "a body refused for its digest replaced nothing",
        )
        .await;
    }

    let r = http
        .put(url("copy"))
        .header("fencing-token", &token)
        .header("x-amz-copy-source", format!("/{BUCKET}/missing"))
        .send()
        .await
        .expect("sent");
    let (status, code, body) = error_of(r).await;
    assert_eq!((status, code.as_str()), (404, "NoSuchKey"), "{body}");
    assert!(
        body.contains("missing"),
        "the error names the source: {body}"
    );
    let r = http
        .put(url("copy"))
        .header("fencing-token", &token)
        .header("x-amz-copy-source", "/no-such-source-bucket/k")
        .send()
        .await
        .expect("sent");
    let (status, code, body) = error_of(r).await;
    assert_eq!((status, code.as_str()), (404, "NoSuchBucket"), "{body}");
    assert_eq!(stored(&e.backend, BUCKET, "copy").await, None);

    let r = http
        .put(format!("{}/no-such-bucket/k", e.proxy().url))
        .header("fencing-token", signed("no-such-bucket", 1))
        .body("x")
        .send()
        .await
        .expect("sent");
    let (status, code, body) = error_of(r).await;
    assert_eq!((status, code.as_str()), (404, "NoSuchBucket"), "{body}");
    assert!(
        !e.backend.bucket_exists("no-such-bucket").await,
        "the write did not create the bucket"
    );

    // The proxy still knows the key: the holder's next write goes through.
    e.put("k", &token, "second").await.expect("next write");
    assert_stored(&e.backend, BUCKET, "k", b"second", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backend_that_ignores_conditions_is_refused_unless_accepted() {
    let backend = Backend::start_ignoring_conditions().await;
    backend.create_bucket(BUCKET).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_file(
        dir.path(),
        "weak.toml",
        proxy_toml(&backend, dir.path(), BUCKET, ""),
    );
    let out = tokio::task::spawn_blocking(move || proxy_cmd(&config).output())
        .await
        .expect("joined")
        .expect("ran");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the proxy must refuse to start");
    assert!(
        stderr.contains("does not enforce conditional writes")
            && stderr.contains("PUT If-None-Match: * IGNORED")
            && stderr.contains("PUT If-Match IGNORED"),
        "the refusal says exactly what was found: {stderr}"
    );

    let proxy = Proxy::start(
        &proxy_toml(&backend, dir.path(), BUCKET, "accept_weak_backend = true"),
        dir.path(),
    )
    .await;
    let st = proxy.status().await;
    assert_eq!(st["probe"][0]["safe"], false, "{st}");
    assert_eq!(st["accept_weak_backend"], true);
    // The proxy's own fence still works in the weaker mode.
    let c = proxy.client();
    fenced!(
        c.put_object()
            .bucket(BUCKET)
            .key("k")
            .body(ByteStream::from_static(b"2")),
        signed(BUCKET, 2)
    )
    .send()
    .await
    .expect("admitted");
    assert_refused!(
        fenced!(
            c.put_object()
                .bucket(BUCKET)
                .key("k")
                .body(ByteStream::from_static(b"1")),
            signed(BUCKET, 1)
        )
        .send(),
        409,
        "FencingTokenStale",
        "stale in weak mode"
    );
}

/// A lease service that cannot be asked: it holds its address (the number
/// of a dropped listener could be taken by anything meanwhile) and closes
/// every connection unanswered. Its URL, and how many connections it took.
async fn silent_lease_service() -> (String, Arc<AtomicUsize>) {
    let (addr, taken) = fencegate_testkit::tcp::counting_server(|conn, counted| {
        counted.fetch_add(1, Ordering::SeqCst);
        drop(conn);
        async {}
    })
    .await;
    (format!("http://{addr}"), taken)
}

/// With `accept_unsigned_tokens` and `locksvc_url`, plain tokens are checked
/// with the lease service; when it cannot be asked, a plain token gets a
/// retryable 503 (never admitted unchecked), while signed tokens need no
/// lease service at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_tokens_wait_for_a_reachable_lease_service() {
    let backend = Backend::start(BackendKind::S3Fs).await;
    backend.create_bucket(BUCKET).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (url, _) = silent_lease_service().await;
    let proxy = Proxy::start(
        &proxy_toml(
            &backend,
            dir.path(),
            BUCKET,
            &format!("accept_unsigned_tokens = true\nlocksvc_url = \"{url}\""),
        ),
        dir.path(),
    )
    .await;
    let http = reqwest::Client::new();
    let put = |token: String| {
        http.put(format!("{}/{BUCKET}/k", proxy.url))
            .header("fencing-token", token)
            .body("x")
            .send()
    };
    let r = put("5".into()).await.expect("sent");
    assert_eq!(r.status().as_u16(), 503);
    fencegate_testkit::assert_mentions(&r.text().await.expect("body"), &["lease service"]);
    assert_eq!(put(signed(BUCKET, 5)).await.expect("sent").status(), 200);
    // Below the max, a plain token is stale without asking anyone.
    let r = put("4".into()).await.expect("sent");
    assert_eq!(r.status().as_u16(), 409);
    assert_stored(&backend, BUCKET, "k", b"x", 5).await;
}

/// `locksvc_url` may list the replicas of a lease service: a plain token is
/// checked with the next one when the first drops the question, and a
/// made-up number is still refused by the one that answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_tokens_are_checked_with_the_next_lease_service_replica() {
    let backend = Backend::start(BackendKind::S3Fs).await;
    backend.create_bucket(BUCKET).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (dropped, questions) = silent_lease_service().await;
    let locksvc = {
        let dir = dir.path().to_owned();
        tokio::task::spawn_blocking(move || support::start_locksvc(&dir))
            .await
            .expect("locksvc")
    };
    let proxy = Proxy::start(
        &proxy_toml(
            &backend,
            dir.path(),
            BUCKET,
            &format!(
                "accept_unsigned_tokens = true\nlocksvc_url = \"{dropped}, {}\"",
                locksvc.url
            ),
        ),
        dir.path(),
    )
    .await;
    let http = reqwest::Client::new();
    let lease = support::alice_lease(&http, &locksvc.url, BUCKET).await;
    let number = lease["token"].as_u64().expect("token");
    let put = |key: &str, token: u64| {
        http.put(format!("{}/{BUCKET}/{key}", proxy.url))
            .header("fencing-token", token.to_string())
            .body("x")
            .send()
    };
    let r = put("plain", number).await.expect("sent");
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    assert!(
        questions.load(Ordering::SeqCst) >= 1,
        "the first replica was never asked"
    );
    let r = put("made-up", number + 5).await.expect("sent");
    assert_eq!(r.status(), 403);
    fencegate_testkit::assert_mentions(&r.text().await.expect("body"), &["FencingTokenNotIssued"]);
    assert_eq!(stored(&backend, BUCKET, "made-up").await, None);
    assert_stored(&backend, BUCKET, "plain", b"x", number).await;
}

/// The multipart checks of the probe are optional: a store without
/// multipart uploads is reported as not enforcing them, and served, since
/// it enforces conditional PUTs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_without_multipart_is_probed_and_served() {
    let backend = Backend::start_without_multipart().await;
    backend.create_bucket(BUCKET).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let proxy = Proxy::start(&proxy_toml(&backend, dir.path(), BUCKET, ""), dir.path()).await;
    let st = proxy.status().await;
    let report = &st["probe"][0]["report"];
    assert_eq!(st["probe"][0]["safe"], true, "{st}");
    assert_eq!(report["put_if_none_match"]["verdict"], "enforced", "{st}");
    assert_eq!(report["put_if_match"]["verdict"], "enforced", "{st}");
    assert_eq!(
        report["complete_if_none_match"]["verdict"], "untested",
        "{st}"
    );
    assert_eq!(report["complete_if_match"]["verdict"], "untested", "{st}");
    let c = proxy.client();
    fenced!(
        c.put_object()
            .bucket(BUCKET)
            .key("k")
            .body(ByteStream::from_static(b"served")),
        signed(BUCKET, 1)
    )
    .send()
    .await
    .expect("a fenced PUT goes through");
    assert_stored(&backend, BUCKET, "k", b"served", 1).await;
    // What the backend lacks is 501, not a 503 that invites retries.
    assert_refused!(
        fenced!(
            c.create_multipart_upload().bucket(BUCKET).key("mpu"),
            signed(BUCKET, 1)
        )
        .send(),
        501,
        "NotImplemented",
        "multipart on a backend without it"
    );
}

/// A write refused on its headers is answered before its body is read; the
/// proxy drains the body so the client reads the 409 (not a broken pipe)
/// and its next request on the same connection goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_upload_leaves_its_connection_usable() {
    let e = env(BackendKind::S3Fs).await;
    e.put("k", &signed(BUCKET, 2), "current")
        .await
        .expect("raise to 2");
    let c = e.proxy().client();
    for round in 0..10 {
        let stale = fenced!(
            c.put_object()
                .bucket(BUCKET)
                .key("k")
                .body(ByteStream::from(vec![b's'; 5 * 1024 * 1024])),
            signed(BUCKET, 1)
        )
        .send()
        .await
        .expect_err("stale");
        assert_eq!(
            error_of(&stale),
            (Some(409), "FencingTokenStale".to_owned()),
            "round {round}: {stale:?}"
        );
        c.head_object()
            .bucket(BUCKET)
            .key("k")
            .send()
            .await
            .unwrap_or_else(|err| panic!("round {round}: the next request failed: {err:?}"));
    }
    // The same, on one connection: the 409, then the next request's answer.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = e.proxy().url.trim_start_matches("http://").to_owned();
    let mut conn = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let body = vec![b's'; 5 * 1024 * 1024];
    let head = format!(
        "PUT /{BUCKET}/k HTTP/1.1\r\nHost: {addr}\r\nFencing-Token: {}\r\nContent-Length: {}\r\n\r\n",
        signed(BUCKET, 1),
        body.len()
    );
    conn.write_all(head.as_bytes()).await.expect("head");
    conn.write_all(&body)
        .await
        .expect("the whole body is taken, not cut off");
    let get = format!("HEAD /{BUCKET}/k HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    conn.write_all(get.as_bytes())
        .await
        .expect("second request");
    let mut answers = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let deadline = Instant::now() + Duration::from_secs(10);
    while !String::from_utf8_lossy(&answers).contains("HTTP/1.1 200") {
        let left = deadline.saturating_duration_since(Instant::now());
        let n = tokio::time::timeout(left, conn.read(&mut buf))
            .await
            .expect("both answers arrive on the connection")
            .expect("read");
        assert!(
            n > 0,
            "the connection closed after: {}",
            String::from_utf8_lossy(&answers)
        );
        answers.extend_from_slice(&buf[..n]);
    }
    let answers = String::from_utf8_lossy(&answers).to_string();
    assert!(
        answers.starts_with("HTTP/1.1 409"),
        "the refused upload's answer comes first: {answers}"
    );
    assert_stored(&e.backend, BUCKET, "k", b"current", 2).await;
}

/// An upload keeps the fence scope it was created in: after the scopes are
/// reconfigured so its key belongs to another lock, its parts are refused
/// (409 FencingScopeChanged) and its token never enters the new scope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_upload_does_not_follow_its_key_into_another_scope() {
    let mut e = env(BackendKind::S3Fs).await;
    let c = e.proxy().client();
    let id = create_upload(&c, "scoped/big", &signed(BUCKET, 7)).await;

    e.proxies[0].kill9();
    let toml = proxy_toml(
        &e.backend,
        &e.proxy_dir(0),
        BUCKET,
        "unscoped_writes = \"bucket-lock\"\n[[scopes]]\nbucket = \"bkt\"\nprefix = \"scoped/\"\nlock = \"other\"",
    );
    std::fs::write(&e.proxy().config, toml).expect("rewrite config");
    e.proxies[0].restart().await;

    let c = e.proxy().client();
    assert_refused!(
        c.upload_part()
            .bucket(BUCKET)
            .key("scoped/big")
            .upload_id(&id)
            .part_number(1)
            .body(ByteStream::from_static(b"part"))
            .send(),
        409,
        "FencingScopeChanged",
        "a part after the scopes changed"
    );
    let st = e.proxy().status().await;
    let raised: Vec<&serde_json::Value> = st["locks"]
        .as_array()
        .expect("locks")
        .iter()
        .filter(|s| s["lock"] != "bkt" && s["max_token"] == 7)
        .collect();
    assert!(
        raised.is_empty(),
        "the upload's token entered another scope: {st}"
    );
}

/// A client's copy-source conditions are never dropped, whatever names the
/// store reads them under (Ceph RGW 16.2 reads only `x-amz-copy-if-*`,
/// moto none): a condition that does not hold is 412 and writes nothing,
/// one that holds copies, for CopyObject and UploadPartCopy alike. The
/// proxy checks them itself against the source it reads, and forwards them
/// under the name the probe found the store reads, so that a store that
/// reads them checks them again at the copy itself.
async fn copy_source_conditions_are_never_dropped(kind: BackendKind) {
    let harness = Harness::new(kind);
    let backend = harness.backend().await;
    let (relay, seen) = support::relay::recording_relay_heads(
        backend.endpoint.trim_start_matches("http://").to_owned(),
    )
    .await;
    let e = harness.first_proxy_via(&relay).start_on(backend).await;
    let token = signed(BUCKET, 1);
    e.put("src", &token, "the source").await.expect("source");
    let etag = head_src(&e).await.e_tag().expect("etag").to_owned();
    let c = e.proxy().client();
    let copy = || {
        c.copy_object()
            .bucket(BUCKET)
            .key("dst")
            .copy_source(format!("{BUCKET}/src"))
    };
    let tomorrow_ms = support::unix_ms() + 86_400_000;
    let future = aws_sdk_s3::primitives::DateTime::from_millis(tomorrow_ms as i64);
    let past = aws_sdk_s3::primitives::DateTime::from_secs(946_684_800); // 2000-01-01
    let failing = [
        (
            "If-Match a wrong ETag",
            copy().copy_source_if_match("\"0123456789abcdef0123456789abcdef\""),
        ),
        (
            "If-None-Match its ETag",
            copy().copy_source_if_none_match(&etag),
        ),
        (
            "If-Modified-Since tomorrow",
            copy().copy_source_if_modified_since(future),
        ),
        (
            "If-Unmodified-Since 2000",
            copy().copy_source_if_unmodified_since(past),
        ),
    ];
    for (what, req) in failing {
        let err = fenced!(req, token).send().await.expect_err(what);
        assert_eq!(
            error_of(&err),
            (Some(412), "PreconditionFailed".to_owned()),
            "{what}"
        );
        assert_eq!(stored(&e.backend, BUCKET, "dst").await, None, "{what}");
    }
    let requests = || std::mem::take(&mut *seen.lock());
    requests();
    fenced!(copy().copy_source_if_match(&etag), token)
        .send()
        .await
        .expect("a copy whose source condition holds");
    assert_stored(&e.backend, BUCKET, "dst", b"the source", 1).await;
    // What the store reads, per the probe: forwarded under that name only.
    let copy_head = requests()
        .into_iter()
        .find(|h| h.starts_with("PUT /bkt/dst"))
        .expect("the copy reached the store")
        .to_ascii_lowercase();
    match kind {
        BackendKind::Rgw => assert!(
            copy_head.contains("x-amz-copy-if-match:")
                && !copy_head.contains("x-amz-copy-source-if-match:"),
            "{copy_head}"
        ),
        BackendKind::S3Fs => assert!(
            copy_head.contains("x-amz-copy-source-if-match:")
                && !copy_head.contains("x-amz-copy-if-match:"),
            "{copy_head}"
        ),
        // moto reads neither: the proxy's own check is the only one.
        BackendKind::Moto => assert!(!copy_head.contains("if-match"), "{copy_head}"),
    }
    // `*` (any source) holds, whatever the store's spelling; and a
    // condition that fails is refused with the metadata replaced too.
    fenced!(copy().copy_source_if_match("*"), token)
        .send()
        .await
        .expect("a copy whose source condition is *");
    let err = fenced!(
        copy()
            .metadata_directive(aws_sdk_s3::types::MetadataDirective::Replace)
            .copy_source_if_none_match(&etag),
        token
    )
    .send()
    .await
    .expect_err("REPLACE with a failing source condition");
    assert_eq!(error_of(&err), (Some(412), "PreconditionFailed".to_owned()));

    // UploadPartCopy: the same conditions, checked the same way.
    let id = fenced!(
        c.create_multipart_upload().bucket(BUCKET).key("parts"),
        token
    )
    .send()
    .await
    .expect("create")
    .upload_id()
    .expect("id")
    .to_owned();
    let part_copy = || {
        c.upload_part_copy()
            .bucket(BUCKET)
            .key("parts")
            .upload_id(&id)
            .part_number(1)
            .copy_source(format!("{BUCKET}/src"))
    };
    let err = part_copy()
        .copy_source_if_match("\"0123456789abcdef0123456789abcdef\"")
        .send()
        .await
        .expect_err("a part copy whose source condition fails");
    assert_eq!(error_of(&err), (Some(412), "PreconditionFailed".to_owned()));
    part_copy()
        .copy_source_if_match(&etag)
        .send()
        .await
        .expect("a part copy whose source condition holds");
}

/// A copy the store refuses on the client's source condition after the
/// proxy's own check passed is the client's 412, not a re-decision's 503
/// that every retry would meet again. s3s-fs compares
/// `x-amz-copy-source-if-unmodified-since` with the source's time to the
/// nanosecond, the proxy (as HTTP dates, and AWS) to the second: the
/// source's own Last-Modified passes the proxy and fails at the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_condition_the_store_refuses_is_412_not_a_retry_loop() {
    let e = env(BackendKind::S3Fs).await;
    let token = signed(BUCKET, 1);
    e.put("src", &token, "the source").await.expect("source");
    let modified = *head_src(&e).await.last_modified().expect("last modified");
    let c = e.proxy().client();
    for attempt in 0..2 {
        let err = fenced!(
            c.copy_object()
                .bucket(BUCKET)
                .key("dst")
                .copy_source(format!("{BUCKET}/src"))
                .copy_source_if_unmodified_since(modified),
            token
        )
        .send()
        .await
        .expect_err("the store refuses the source condition");
        assert_eq!(
            error_of(&err),
            (Some(412), "PreconditionFailed".to_owned()),
            "attempt {attempt}"
        );
    }
    assert_eq!(stored(&e.backend, BUCKET, "dst").await, None);
}

/// The store's answer to HEAD of `src`, read directly.
async fn head_src(e: &Env) -> aws_sdk_s3::operation::head_object::HeadObjectOutput {
    e.backend
        .direct()
        .head_object()
        .bucket(BUCKET)
        .key("src")
        .send()
        .await
        .expect("head")
}
