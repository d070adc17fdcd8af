//! Real S3 clients through the proxy: boto3, curl (anonymous and SigV4),
//! and the backup tools of tests/backup_tools.rs use the same harness.

#[macro_use]
mod support;

use std::process::{Command, Output};
use support::harness::{Env, Harness};
use support::s3::*;
use support::xml_value;

const BUCKET: &str = "bkt";

async fn env(kind: BackendKind) -> Env {
    Harness::new(kind).start().await
}

async fn run(mut cmd: Command) -> Output {
    tokio::task::spawn_blocking(move || cmd.output().expect("client runs"))
        .await
        .expect("joined")
}

fn script(name: &str) -> String {
    format!("{}/tests/clients/{name}", env!("CARGO_MANIFEST_DIR"))
}

on_every_backend!(
    threads = 2;
    boto3_every_write_is_fenced,
    curl_every_write_is_fenced,
    virtual_hosted_style_is_fenced_like_path_style
);

async fn raise_max_to(e: &Env, token: u64) {
    let c = e.proxy().client();
    fenced!(
        c.put_object()
            .bucket(BUCKET)
            .key("raise")
            .body(aws_sdk_s3::primitives::ByteStream::from_static(b"x")),
        signed(BUCKET, token)
    )
    .send()
    .await
    .expect("raise");
}

async fn boto3_every_write_is_fenced(kind: BackendKind) {
    let e = env(kind).await;
    raise_max_to(&e, 5).await;
    let mut cmd = Command::new(venv_bin("python"));
    cmd.arg(script("boto3_fenced.py"))
        .args([&e.proxy().url, BUCKET, CLIENT_KEY.0, CLIENT_KEY.1])
        .arg(signed(BUCKET, 4))
        .arg(signed(BUCKET, 5));
    let out = run(cmd).await;
    assert!(
        out.status.success(),
        "boto3 script failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stored(&e.backend, BUCKET, "b3/mpu")
            .await
            .map(|(b, t)| (b.len(), t)),
        Some((1024, Some(5)))
    );
}

/// curl's status code and body for one request.
async fn curl(args: &[&str]) -> (u16, String) {
    let mut cmd = Command::new("curl");
    // moto drops the body of a PUT sent as curl's default
    // application/x-www-form-urlencoded (measured; a moto quirk, S3 keeps it).
    cmd.args([
        "-sS",
        "-o",
        "-",
        "-w",
        "\n%{http_code}",
        "-H",
        "Content-Type: application/octet-stream",
    ])
    .args(args);
    let out = run(cmd).await;
    assert!(
        out.status.success(),
        "curl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').expect("status line");
    (code.trim().parse().expect("status"), body.to_owned())
}

async fn curl_every_write_is_fenced(kind: BackendKind) {
    let e = env(kind).await;
    raise_max_to(&e, 5).await;
    let url = |k: &str| format!("{}/{BUCKET}/{k}", e.proxy().url);
    let (stale, current) = (
        format!("Fencing-Token: {}", signed(BUCKET, 4)),
        format!("Fencing-Token: {}", signed(BUCKET, 5)),
    );
    let put = |hdr: Option<&str>, key: &str| {
        let mut a = vec![
            "-X".to_owned(),
            "PUT".into(),
            "--data-binary".into(),
            "curl body".into(),
            url(key),
        ];
        if let Some(h) = hdr {
            a.extend(["-H".into(), h.to_owned()]);
        }
        a
    };
    let go = |a: Vec<String>| async move {
        curl(&a.iter().map(String::as_str).collect::<Vec<_>>()).await
    };

    // PutObject, anonymous, plain body.
    let (s, body) = go(put(None, "c/put")).await;
    assert_eq!(s, 428, "{body}");
    assert!(body.contains("FencingTokenRequired"));
    let (s, body) = go(put(Some(&stale), "c/put")).await;
    assert_eq!(s, 409, "{body}");
    assert!(body.contains("FencingTokenStale"));
    assert_eq!(go(put(Some(&current), "c/put")).await.0, 200);

    // CopyObject.
    let copy = |h: &str| {
        vec![
            "-X".to_owned(),
            "PUT".into(),
            "-H".into(),
            format!("x-amz-copy-source: /{BUCKET}/c/put"),
            "-H".into(),
            h.to_owned(),
            url("c/copy"),
        ]
    };
    assert_eq!(go(copy(&stale)).await.0, 409);
    assert_eq!(go(copy(&current)).await.0, 200);
    assert_stored(&e.backend, BUCKET, "c/copy", b"curl body", 5).await;

    // DeleteObject.
    assert_eq!(
        go(vec!["-X".into(), "DELETE".into(), url("c/copy")])
            .await
            .0,
        428
    );
    assert_eq!(
        go(vec![
            "-X".into(),
            "DELETE".into(),
            "-H".into(),
            stale.clone(),
            url("c/copy")
        ])
        .await
        .0,
        409
    );
    assert_eq!(
        go(vec![
            "-X".into(),
            "DELETE".into(),
            "-H".into(),
            current.clone(),
            url("c/copy")
        ])
        .await
        .0,
        204
    );
    assert_eq!(stored(&e.backend, BUCKET, "c/copy").await, None);

    // Multipart, anonymous: an anonymous upload has no identity but its
    // token, so every request for it carries the token.
    let (s, body) = go(vec![
        "-X".into(),
        "POST".into(),
        "-H".into(),
        current.clone(),
        format!("{}?uploads", url("c/mpu")),
    ])
    .await;
    assert_eq!(s, 200, "{body}");
    let id = xml_value(&body, "UploadId").expect("upload id");
    let (s, body) = go(vec![
        "-X".into(),
        "PUT".into(),
        "--data-binary".into(),
        "tokenless part".into(),
        format!("{}?partNumber=1&uploadId={id}", url("c/mpu")),
    ])
    .await;
    assert_eq!(s, 403, "a tokenless part of an anonymous upload: {body}");
    fencegate_testkit::assert_mentions(&body, &["AccessDenied"]);
    let (s, _) = go(vec![
        "-X".into(),
        "PUT".into(),
        "-H".into(),
        current.clone(),
        "--data-binary".into(),
        "part one".into(),
        format!("{}?partNumber=1&uploadId={id}", url("c/mpu")),
    ])
    .await;
    assert_eq!(s, 200);
    let etag_of = dump_headers(&[
        "-X",
        "PUT",
        "-H",
        &current,
        "--data-binary",
        "part one",
        &format!("{}?partNumber=1&uploadId={id}", url("c/mpu")),
    ])
    .await;
    let xml = format!(
        "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>{etag_of}</ETag></Part></CompleteMultipartUpload>"
    );
    let (s, body) = go(vec![
        "-X".into(),
        "POST".into(),
        "-H".into(),
        current.clone(),
        "--data-binary".into(),
        xml,
        format!("{}?uploadId={id}", url("c/mpu")),
    ])
    .await;
    assert_eq!(s, 200, "{body}");
    assert_stored(&e.backend, BUCKET, "c/mpu", b"part one", 5).await;

    // Signed with --aws-sigv4 (curl sends no payload hash unless told).
    let user = format!("{}:{}", CLIENT_KEY.0, CLIENT_KEY.1);
    let signed_put = |h: &str| {
        vec![
            "--aws-sigv4".to_owned(),
            "aws:amz:us-east-1:s3".into(),
            "--user".into(),
            user.clone(),
            "-H".into(),
            "x-amz-content-sha256: UNSIGNED-PAYLOAD".into(),
            "-H".into(),
            h.to_owned(),
            "-X".into(),
            "PUT".into(),
            "--data-binary".into(),
            "signed body".into(),
            url("c/signed"),
        ]
    };
    assert_eq!(go(signed_put(&stale)).await.0, 409);
    let (s, body) = go(signed_put(&current)).await;
    assert_eq!(s, 200, "{body}");
    assert_stored(&e.backend, BUCKET, "c/signed", b"signed body", 5).await;
}

/// Sends a request and returns the ETag response header.
async fn dump_headers(args: &[&str]) -> String {
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sS",
        "-o",
        "/dev/null",
        "-D",
        "-",
        "-H",
        "Content-Type: application/octet-stream",
    ])
    .args(args);
    let out = run(cmd).await;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            l.strip_prefix("etag: ")
                .or_else(|| l.strip_prefix("ETag: "))
        })
        .map(|v| v.trim().to_owned())
        .expect("etag header")
}

/// `bkt.localhost:<port>` names the bucket in the Host header (the default
/// `virtual_host_domains`); curl connects to the proxy's address for it, as
/// a resolver answering `*.localhost` would.
async fn virtual_hosted_style_is_fenced_like_path_style(kind: BackendKind) {
    let e = env(kind).await;
    raise_max_to(&e, 5).await;
    let addr = e.proxy().url.trim_start_matches("http://").to_owned();
    let port = addr.rsplit_once(':').expect("port").1.to_owned();
    let vhost = format!("{BUCKET}.localhost:{port}");
    let connect = format!("{vhost}:{addr}");
    let go = |token: Option<String>, method: &'static str, key: &str, body: &str, sign: bool| {
        let mut a: Vec<String> = vec!["--connect-to".into(), connect.clone()];
        a.extend(["-X".into(), method.into()]);
        if !body.is_empty() {
            a.extend(["--data-binary".into(), body.into()]);
        }
        if let Some(t) = token {
            a.extend(["-H".into(), format!("Fencing-Token: {t}")]);
        }
        if sign {
            a.extend([
                "--aws-sigv4".into(),
                "aws:amz:us-east-1:s3".into(),
                "--user".into(),
                format!("{}:{}", CLIENT_KEY.0, CLIENT_KEY.1),
                "-H".into(),
                "x-amz-content-sha256: UNSIGNED-PAYLOAD".into(),
            ]);
        }
        a.push(format!("http://{vhost}/{key}"));
        async move { curl(&a.iter().map(String::as_str).collect::<Vec<_>>()).await }
    };

    let (s, body) = go(None, "PUT", "v/put", "no token", false).await;
    assert_eq!(s, 428, "{body}");
    let (s, body) = go(Some(signed(BUCKET, 4)), "PUT", "v/put", "stale", false).await;
    assert_eq!(s, 409, "{body}");
    fencegate_testkit::assert_mentions(&body, &["FencingTokenStale"]);
    let (s, body) = go(Some(signed(BUCKET, 5)), "PUT", "v/put", "vhost body", false).await;
    assert_eq!(s, 200, "{body}");
    let (s, body) = go(
        Some(signed(BUCKET, 5)),
        "PUT",
        "v/signed",
        "signed vhost",
        true,
    )
    .await;
    assert_eq!(s, 200, "{body}");
    assert_stored(&e.backend, BUCKET, "v/put", b"vhost body", 5).await;
    assert_stored(&e.backend, BUCKET, "v/signed", b"signed vhost", 5).await;
    // Reads and listings by virtual host see the same bucket.
    let (s, body) = go(None, "GET", "v/put", "", false).await;
    assert_eq!((s, body.as_str()), (200, "vhost body"));
    let (s, body) = go(None, "GET", "?list-type=2&prefix=v/", "", false).await;
    assert_eq!(s, 200, "{body}");
    assert!(
        body.contains("<Key>v/put</Key>") && body.contains("<Key>v/signed</Key>"),
        "{body}"
    );
    // A key under `_fencegate/` is an object here, not the proxy's
    // operations endpoint (that is path style only).
    let (s, body) = go(
        Some(signed(BUCKET, 5)),
        "PUT",
        "_fencegate/health",
        "mine",
        false,
    )
    .await;
    assert_eq!(s, 200, "{body}");
    assert_stored(&e.backend, BUCKET, "_fencegate/health", b"mine", 5).await;
    // A stale delete by virtual host is refused too.
    let (s, _) = go(Some(signed(BUCKET, 4)), "DELETE", "v/put", "", false).await;
    assert_eq!(s, 409);
    assert!(stored(&e.backend, BUCKET, "v/put").await.is_some());
}
