//! The probe as an operator meets it: `fencegate probe` before deploying,
//! and the proxy's own probe at start-up. Each store tested here (s3s-fs,
//! moto, Ceph RGW 16.2) is reported as measured, and README "Stores" is
//! this file's table; stores emulated on s3s-fs show the unsafe findings
//! (a condition ignored, answers that contradict each other, the right
//! ETag refused in every spelling).

mod support;

use aws_sdk_s3::primitives::ByteStream;
use serde_json::Value;
use std::path::Path;
use std::process::Output;
use support::s3::*;
use support::write_file;

const BUCKET: &str = "bkt";

/// The report's checks, in the order of the findings below.
const CHECKS: [&str; 9] = [
    "put_if_none_match",
    "put_if_match",
    "complete_if_none_match",
    "complete_if_match",
    "copy_if_none_match",
    "copy_if_match",
    "delete_if_match",
    "copy_source_if_match",
    "copy_source_if_match_old_name",
];

const S3FS_FINDINGS: [&str; 9] = [
    "enforced",
    "enforced quoted",
    "enforced",
    "enforced quoted",
    "ignored",
    "ignored",
    "ignored",
    "enforced quoted",
    "ignored",
];

const MOTO_FINDINGS: [&str; 9] = [
    "enforced",
    "enforced quoted",
    "enforced",
    "ignored",
    "ignored",
    "ignored",
    "enforced quoted",
    "ignored",
    "ignored",
];

/// Ceph RGW 16.2: If-Match on PUT only bare, nothing on Complete, Copy or
/// DELETE, and the copy's source condition only under its older name.
const RGW_FINDINGS: [&str; 9] = [
    "enforced",
    "enforced bare",
    "ignored",
    "ignored",
    "ignored",
    "ignored",
    "ignored",
    "ignored",
    "enforced quoted",
];

/// A report's findings: each check's verdict and, where enforced with an
/// ETag, its spelling.
fn findings(report: &Value) -> Vec<String> {
    CHECKS
        .iter()
        .map(|c| {
            let verdict = report[c]["verdict"].as_str().unwrap_or("(missing)");
            match report[c]["spelling"].as_str() {
                Some(s) => format!("{verdict} {s}"),
                None => verdict.to_owned(),
            }
        })
        .collect()
}

/// `fencegate probe --config <config>` with `args`.
async fn probe(config: &Path, args: &[&str]) -> Output {
    let mut cmd = support::fencegate();
    cmd.arg("probe").arg("--config").arg(config).args(args);
    tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("joined")
        .expect("fencegate probe ran")
}

/// The store with a bucket, and a proxy config for it (plus `extra`).
async fn store(backend: Backend, extra: &str) -> (Backend, tempfile::TempDir, std::path::PathBuf) {
    backend.create_bucket(BUCKET).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_file(
        dir.path(),
        "proxy.toml",
        proxy_toml(&backend, dir.path(), BUCKET, extra),
    );
    (backend, dir, config)
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "probe --json printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// `fencegate probe` and the proxy's start-up probe find `expected` on
/// `kind`, the probe exits 0, and the proxy serves fenced writes.
async fn the_probe_tells_the_truth(kind: BackendKind, expected: [&str; 9]) {
    let (backend, dir, config) = store(Backend::start(kind).await, "").await;
    let out = probe(&config, &["--json"]).await;
    assert!(out.status.success(), "{kind:?}: {out:?}");
    let reports = json(&out);
    assert_eq!(
        findings(&reports[0]["report"]),
        expected,
        "{kind:?}: {reports}"
    );
    assert_eq!(reports[0]["safe"], true);
    assert_eq!(reports[0]["report"]["bucket"], BUCKET);

    let text = probe(&config, &[]).await;
    assert!(text.status.success());
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!("s3://{BUCKET} on {}: SAFE", backend.endpoint)),
        "{text}"
    );
    // Every request and answer the findings rest on is listed.
    assert!(
        text.contains("PUT If-Match with the wrong ETag written quoted: 412 (refused)")
            && text.contains("PUT If-None-Match: * on an existing key: 412 (refused)"),
        "{text}"
    );
    if kind == BackendKind::Rgw {
        for line in [
            "PUT If-Match with the right ETag written quoted: 412 (refused)",
            "PUT If-Match with the right ETag written bare: 2xx (passed)",
            "sent as If-Match: <etag> on overwrites",
            "forwarded as x-amz-copy-if-match",
        ] {
            assert!(text.contains(line), "{line}: {text}");
        }
    }

    let proxy = Proxy::start(
        &std::fs::read_to_string(&config).expect("config"),
        dir.path(),
    )
    .await;
    let status = proxy.status().await;
    assert_eq!(
        findings(&status["probe"][0]["report"]),
        expected,
        "the proxy's own probe: {status}"
    );
    let c = proxy.client();
    for body in ["first", "an overwrite"] {
        fenced!(
            c.put_object()
                .bucket(BUCKET)
                .key("k")
                .body(ByteStream::from(body.as_bytes().to_vec())),
            signed(BUCKET, 1)
        )
        .send()
        .await
        .unwrap_or_else(|e| panic!("{kind:?} {body}: {e:?}"));
    }
    assert_stored(&backend, BUCKET, "k", b"an overwrite", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_tells_the_truth_about_s3s_fs() {
    the_probe_tells_the_truth(BackendKind::S3Fs, S3FS_FINDINGS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_tells_the_truth_about_moto() {
    the_probe_tells_the_truth(BackendKind::Moto, MOTO_FINDINGS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_tells_the_truth_about_ceph_rgw() {
    the_probe_tells_the_truth(BackendKind::Rgw, RGW_FINDINGS).await;
}

/// A store that ignores a required condition, answers that contradict
/// each other, or refuses the right ETag in every spelling: the probe says
/// which, shows the answers, and exits 1; the proxy refuses to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsafe_stores_are_named_with_their_answers_and_the_probe_exits_1() {
    let cases = [
        (
            Backend::start_ignoring_conditions().await,
            "ignored",
            "IGNORED (a wrong value passes)",
            "PUT If-Match with the wrong ETag written quoted: 2xx (passed)",
        ),
        (
            Backend::start_odd(OddIfMatch::IgnoresBare).await,
            "contradictory",
            "CONTRADICTORY answers",
            "PUT If-Match with the wrong ETag written bare: 2xx (passed)",
        ),
        (
            Backend::start_odd(OddIfMatch::RefusesAll).await,
            "refuses_correct",
            "REFUSES THE CORRECT VALUE in every spelling",
            "PUT If-Match with the right ETag written bare: 412 (refused)",
        ),
    ];
    for (backend, verdict, said, answer) in cases {
        let (_backend, dir, config) = store(backend, "").await;
        let out = probe(&config, &[]).await;
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(out.status.code(), Some(1), "{verdict}: {stdout}{stderr}");
        assert!(
            stdout.contains("UNSAFE: the proxy refuses fenced writes to this bucket")
                && stdout.contains(said)
                && stdout.contains(answer)
                && stdout.contains("REQUIRED: the proxy refuses fenced writes"),
            "{verdict}: {stdout}"
        );
        assert!(
            stderr.contains(&format!("would refuse fenced writes to {BUCKET}")),
            "{stderr}"
        );
        let reports = json(&probe(&config, &["--json"]).await);
        assert_eq!(reports[0]["report"]["put_if_match"]["verdict"], verdict);
        assert_eq!(reports[0]["safe"], false);

        // Twice: a refused start served nothing, so it is no unclean stop
        // that the next start would have to wait out.
        for attempt in 0..2 {
            let started = {
                let mut cmd = proxy_cmd(&config);
                tokio::task::spawn_blocking(move || cmd.output())
                    .await
                    .expect("joined")
                    .expect("ran")
            };
            let stderr = String::from_utf8_lossy(&started.stderr);
            assert!(
                !started.status.success(),
                "{verdict}: the proxy must refuse"
            );
            assert!(
                stderr.contains("refusing to serve fenced traffic") && stderr.contains(said),
                "{verdict}: {stderr}"
            );
            assert!(
                !stderr.contains("did not end cleanly"),
                "{verdict}, start {attempt}: {stderr}"
            );
        }
        drop(dir);
    }
}

/// A store that refuses even the right ETag (as Ceph RGW 16.2 refuses a
/// quoted one), run with `accept_weak_backend = true`: the proxy sends no
/// condition the store would refuse, so overwrites go through (before,
/// every overwrite failed for good with 503), and the proxy's own fence
/// still refuses a stale token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weak_store_that_refuses_the_right_etag_still_takes_overwrites() {
    let (backend, dir, config) = store(
        Backend::start_odd(OddIfMatch::RefusesAll).await,
        "accept_weak_backend = true",
    )
    .await;
    let out = probe(&config, &[]).await;
    assert!(out.status.success(), "the proxy runs: {out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("UNSAFE, but accept_weak_backend = true"),
        "{out:?}"
    );
    let proxy = Proxy::start(
        &std::fs::read_to_string(&config).expect("config"),
        dir.path(),
    )
    .await;
    let c = proxy.client();
    let put = |token: u64, body: &'static str| {
        fenced!(
            c.put_object()
                .bucket(BUCKET)
                .key("k")
                .body(ByteStream::from_static(body.as_bytes())),
            signed(BUCKET, token)
        )
        .send()
    };
    put(1, "one").await.expect("a new key");
    put(1, "one again").await.expect("an overwrite");
    put(2, "two").await.expect("a newer holder's overwrite");
    let stale = put(1, "stale").await.expect_err("a stale token");
    assert_eq!(
        error_of(&stale),
        (Some(409), "FencingTokenStale".to_owned())
    );
    assert_stored(&backend, BUCKET, "k", b"two", 2).await;
}

/// Without a bucket to probe, the command says how to name one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_without_a_bucket_says_how_to_name_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_file(
        dir.path(),
        "empty.toml",
        "[backend]\nendpoint = \"http://127.0.0.1:9\"\n",
    );
    let out = probe(&config, &[]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("name a bucket to probe: --bucket NAME"),
        "{out:?}"
    );
}
