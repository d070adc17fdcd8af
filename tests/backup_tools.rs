//! Real backup tools through the proxy, the way the README documents them:
//! rclone and s3cmd with the Fencing-Token header, the aws CLI and restic
//! with lease-bound credentials, and a backup job under `fencegate run`.
//!
//! Each tool: a fenced backup succeeds; after a newer holder writes, the old
//! holder's next write fails with the stale error, and the stored data is
//! the newer holder's. The tools are installed by scripts/test.sh.

mod support;

use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use support::harness::{Env, Harness};
use support::s3::*;
use support::{output_of, output_text};

const BUCKET: &str = "bkt";

/// Each tool test on the backends named, as `test::backend`.
macro_rules! on_backends {
    ($($name:ident: $($backend:ident => $kind:ident),+;)*) => {
        $(mod $name {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $backend() {
                    super::$name(super::BackendKind::$kind).await
                }
            )+
        })*
    };
}

// restic is not run on s3s-fs: s3s-fs lists a restic repository
// incompletely (measured: `restic check` fails on s3s-fs even without the
// proxy).
on_backends!(
    rclone_backup_job_under_fencegate_run_and_a_stale_rerun: s3s_fs => S3Fs, rgw => Rgw;
    s3cmd_with_add_header_including_multipart: s3s_fs => S3Fs, rgw => Rgw;
    aws_cli_with_lease_bound_credentials: s3s_fs => S3Fs, rgw => Rgw;
    restic_with_lease_bound_credentials_stays_consistent: moto => Moto, rgw => Rgw;
);

/// Backend + lease service + proxy, with `bkt` fenced by lock `nightly`.
async fn env() -> Env {
    env_on(BackendKind::S3Fs).await
}

async fn env_on(kind: BackendKind) -> Env {
    Harness::new(kind)
        .proxy_config("[[scopes]]\nbucket = \"bkt\"\nlock = \"nightly\"")
        .locksvc(1)
        .start()
        .await
}

impl Env {
    /// A shell command with the environment a user would have: the lease
    /// service URL, an rclone remote `fg:` and the tools on PATH.
    fn shell(&self, script: &str) -> Command {
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(script);
        support::without_fencegate_env(&mut cmd);
        self.environment(&mut cmd);
        cmd
    }

    fn environment(&self, cmd: &mut Command) {
        let bin = Path::new(env!("CARGO_BIN_EXE_fencegate"))
            .parent()
            .expect("bin dir")
            .to_owned();
        let venv = venv_bin("aws").parent().expect("venv").to_owned();
        let path = format!(
            "{}:{}:{}",
            bin.display(),
            venv.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        cmd.env("PATH", path)
            .env("FENCEGATE_LOCKSVC", &self.locksvc().url)
            .env("FENCEGATE_LOG", "warn")
            .env("PROXY", &self.proxy().url)
            .env("PROXY_HOST", self.proxy().url.trim_start_matches("http://"))
            .env("RCLONE_CONFIG_FG_TYPE", "s3")
            .env("RCLONE_CONFIG_FG_PROVIDER", "Other")
            .env("RCLONE_CONFIG_FG_ENDPOINT", &self.proxy().url)
            .env("RCLONE_CONFIG_FG_ACCESS_KEY_ID", CLIENT_KEY.0)
            .env("RCLONE_CONFIG_FG_SECRET_ACCESS_KEY", CLIENT_KEY.1)
            .env("RCLONE_CONFIG_FG_FORCE_PATH_STYLE", "true")
            .env("RESTIC_PASSWORD", "test-password")
            .env("HOME", self.dir.path())
            .env_remove("AWS_CA_BUNDLE")
            .env_remove("AWS_PROFILE")
            .current_dir(self.dir.path());
    }

    fn write(&self, rel: &str, content: &str) {
        let p = self.dir.path().join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, content).expect("write");
    }

    async fn lease(&self, owner: &str, ttl: &str) -> Value {
        let out = output_of(self.shell(&format!(
            "fencegate lease acquire nightly --owner {owner} --ttl {ttl}"
        )))
        .await;
        assert!(out.status.success(), "acquire: {}", output_text(&out));
        serde_json::from_slice(&out.stdout).expect("lease json")
    }
}

async fn expire(lease: &Value) {
    let ms = lease["expires_at_ms"].as_u64().expect("expiry");
    let now = support::unix_ms();
    tokio::time::sleep(Duration::from_millis(ms.saturating_sub(now) + 100)).await;
}

async fn rclone_backup_job_under_fencegate_run_and_a_stale_rerun(kind: BackendKind) {
    let e = env_on(kind).await;
    e.write("data/report.txt", "night one, from A");
    // The backup job exactly as the README documents it.
    let job = r#"fencegate run --lock nightly --ttl 30s -- sh -c 'rclone copy ./data fg:bkt/nightly --header "Fencing-Token: $FENCING_TOKEN"'"#;
    let out = output_of(e.shell(job)).await;
    assert!(out.status.success(), "backup job: {}", output_text(&out));
    assert_eq!(
        stored_body(&e.backend, BUCKET, "nightly/report.txt").await,
        Some(b"night one, from A".to_vec())
    );

    // A holder that stalled: it has a token, the lease expires, B runs.
    let a = e.lease("A", "1s").await;
    expire(&a).await;
    e.write("data/report.txt", "night two, from B (a longer file)");
    let out = output_of(e.shell(job)).await;
    assert!(out.status.success(), "B's job: {}", output_text(&out));

    // A's next run with its old token fails and changes nothing.
    e.write("data/report.txt", "late A");
    let late = format!(
        r#"rclone copy ./data fg:bkt/nightly --retries 1 --low-level-retries 1 --header "Fencing-Token: {}""#,
        a["fencing_token"].as_str().expect("token")
    );
    let out = output_of(e.shell(&late)).await;
    assert!(
        !out.status.success(),
        "the stale rclone run must fail: {}",
        output_text(&out)
    );
    assert!(
        output_text(&out).contains("409") || output_text(&out).contains("FencingTokenStale"),
        "{}",
        output_text(&out)
    );
    let (body, token) = stored(&e.backend, BUCKET, "nightly/report.txt")
        .await
        .expect("object");
    assert_eq!(body, b"night two, from B (a longer file)");
    assert!(token > a["token"].as_u64());
}

async fn s3cmd_with_add_header_including_multipart(kind: BackendKind) {
    let e = env_on(kind).await;
    std::fs::write(e.dir.path().join("big.bin"), vec![b'a'; 12 * 1024 * 1024]).expect("write");
    let s3cmd = |token: &str, file: &str| {
        format!(
            "s3cmd --host=$PROXY_HOST --host-bucket=$PROXY_HOST --no-ssl --access_key={} --secret_key={} \
             --multipart-chunk-size-mb=5 --add-header=Fencing-Token:{token} put {file} s3://bkt/s3cmd/big.bin",
            CLIENT_KEY.0, CLIENT_KEY.1
        )
    };
    let a = e.lease("A", "1s").await;
    let a_token = a["fencing_token"].as_str().expect("token").to_owned();
    // s3cmd sends the header on Create only; parts and Complete use the
    // token bound to the upload.
    let out = output_of(e.shell(&s3cmd(&a_token, "big.bin"))).await;
    assert!(
        out.status.success(),
        "A's multipart upload: {}",
        output_text(&out)
    );
    assert_eq!(
        stored(&e.backend, BUCKET, "s3cmd/big.bin")
            .await
            .map(|(b, t)| (b.len(), t)),
        Some((12 * 1024 * 1024, a["token"].as_u64()))
    );

    expire(&a).await;
    let b = e.lease("B", "30s").await;
    e.write("small.bin", "from B");
    let out = output_of(e.shell(&s3cmd(
        b["fencing_token"].as_str().expect("token"),
        "small.bin",
    )))
    .await;
    assert!(out.status.success(), "B: {}", output_text(&out));

    let out = output_of(e.shell(&s3cmd(&a_token, "big.bin"))).await;
    assert!(
        !out.status.success(),
        "A's late upload must fail: {}",
        output_text(&out)
    );
    assert!(
        output_text(&out).contains("409") || output_text(&out).contains("FencingTokenStale"),
        "{}",
        output_text(&out)
    );
    assert_eq!(
        stored(&e.backend, BUCKET, "s3cmd/big.bin").await,
        Some((b"from B".to_vec(), b["token"].as_u64()))
    );
}

/// Saves the lease-bound credentials `fencegate run --s3-credentials`
/// exported, then runs `then`.
fn capture_credentials(then: &str) -> String {
    format!(r#"echo "$AWS_ACCESS_KEY_ID $AWS_SECRET_ACCESS_KEY" > creds.txt && {then}"#)
}

fn saved_credentials(e: &Env) -> (String, String) {
    let s = std::fs::read_to_string(e.dir.path().join("creds.txt")).expect("creds saved");
    let mut it = s.split_whitespace();
    (
        it.next().expect("key").to_owned(),
        it.next().expect("secret").to_owned(),
    )
}

async fn aws_cli_with_lease_bound_credentials(kind: BackendKind) {
    let e = env_on(kind).await;
    e.write("a.txt", "from A");
    let a_job = format!(
        "fencegate run --lock nightly --ttl 1s --s3-credentials --s3-endpoint $PROXY -- sh -c '{}'",
        capture_credentials("aws s3 cp a.txt s3://bkt/aws/file.txt")
    );
    let out = output_of(e.shell(&a_job)).await;
    assert!(out.status.success(), "A: {}", output_text(&out));
    let (a_key, a_secret) = saved_credentials(&e);
    assert!(a_key.starts_with("fgk2."), "{a_key}");
    assert_eq!(
        stored_body(&e.backend, BUCKET, "aws/file.txt").await,
        Some(b"from A".to_vec())
    );

    tokio::time::sleep(Duration::from_millis(1100)).await;
    e.write("b.txt", "from B");
    let out = output_of(e.shell("fencegate run --lock nightly --ttl 30s --s3-credentials --s3-endpoint $PROXY -- aws s3 cp b.txt s3://bkt/aws/file.txt")).await;
    assert!(out.status.success(), "B: {}", output_text(&out));

    // A's credentials, used late, are refused.
    let late = format!(
        "AWS_ACCESS_KEY_ID={a_key} AWS_SECRET_ACCESS_KEY={a_secret} AWS_DEFAULT_REGION=us-east-1 AWS_ENDPOINT_URL=$PROXY AWS_MAX_ATTEMPTS=1 aws s3 cp a.txt s3://bkt/aws/file.txt"
    );
    let out = output_of(e.shell(&late)).await;
    assert!(
        !out.status.success(),
        "A's late copy must fail: {}",
        output_text(&out)
    );
    assert!(
        output_text(&out).contains("FencingTokenStale"),
        "{}",
        output_text(&out)
    );
    assert_eq!(
        stored_body(&e.backend, BUCKET, "aws/file.txt").await,
        Some(b"from B".to_vec())
    );
}

async fn restic_with_lease_bound_credentials_stays_consistent(kind: BackendKind) {
    let e = env_on(kind).await;
    let repo = "restic -r s3:$PROXY/bkt/restic -o s3.bucket-lookup=path -o s3.region=us-east-1";
    e.write("src/one.txt", "first backup");
    let a_job = format!(
        "fencegate run --lock nightly --ttl 2s --s3-credentials -- sh -c '{}'",
        capture_credentials(&format!("{repo} init && {repo} backup src"))
    );
    let out = output_of(e.shell(&a_job)).await;
    assert!(out.status.success(), "A: {}", output_text(&out));
    let (a_key, a_secret) = saved_credentials(&e);

    tokio::time::sleep(Duration::from_millis(2100)).await;
    e.write("src/two.txt", "second backup");
    let out = output_of(e.shell(&format!(
        "fencegate run --lock nightly --ttl 30s --s3-credentials -- {repo} backup src"
    )))
    .await;
    assert!(out.status.success(), "B: {}", output_text(&out));

    // A wakes up and writes with its old credentials: refused.
    e.write("src/three.txt", "late A");
    let late =
        format!("AWS_ACCESS_KEY_ID={a_key} AWS_SECRET_ACCESS_KEY={a_secret} {repo} backup src");
    let out = output_of(e.shell(&late)).await;
    assert!(
        !out.status.success(),
        "A's late backup must fail: {}",
        output_text(&out)
    );
    // restic prints the proxy's message rather than the code.
    assert!(
        output_text(&out).contains("is stale"),
        "{}",
        output_text(&out)
    );

    // The repository is intact: check passes, and it has exactly A's and B's snapshots.
    let out = output_of(e.shell(&format!("fencegate run --lock nightly --ttl 30s --s3-credentials -- sh -c '{repo} check && {repo} snapshots --json'"))).await;
    assert!(out.status.success(), "restic check: {}", output_text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let snapshots: Value =
        serde_json::from_str(stdout.lines().last().expect("json line")).expect("snapshots json");
    assert_eq!(snapshots.as_array().map(Vec::len), Some(2), "{snapshots}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_lease_credentials_are_refused_and_write_nothing() {
    let e = env().await;
    let lease = e.lease("A", "30s").await;
    let key = lease["s3_access_key_id"].as_str().expect("key").to_owned();
    let secret = lease["s3_secret_access_key"]
        .as_str()
        .expect("secret")
        .to_owned();
    let token = lease["token"].as_u64().expect("token");
    let sdk = |k: &str, s: &str| sdk_client(&e.proxy().url, (k, s));
    let put = |c: aws_sdk_s3::Client, key: &'static str| async move {
        c.put_object()
            .bucket(BUCKET)
            .key(key)
            .body(aws_sdk_s3::primitives::ByteStream::from_static(b"x"))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| error_of(&e))
    };
    // Genuine credentials work, and carry the lease's token.
    put(sdk(&key, &secret), "genuine")
        .await
        .expect("genuine credentials");
    assert_eq!(
        stored_token(&e.backend, BUCKET, "genuine").await,
        Some(token)
    );

    let keys = support::test_keys();
    let wrong =
        fencegate_core::TokenKeys::new(vec![b"not-the-signing-key-at-all".to_vec()]).expect("keys");
    let lock = |l: &str| fencegate_core::LockName::new(l).expect("lock");
    let far = support::unix_ms() / 1000 + 3600;
    let wrong_hmac = wrong.credentials(&lock("nightly"), token + 5, far);
    // The same wrong secret under an access key naming the proxy's key.
    let wrong_hmac_our_id = wrong_hmac
        .access_key
        .replacen(wrong.key_id(), keys.key_id(), 1);
    let other_lock = keys.credentials(&lock("other"), token + 5, far);
    let expired = keys.credentials(&lock("nightly"), token + 5, support::unix_ms() / 1000 - 10);
    let tampered_key = key.replacen(&format!(".{token}."), &format!(".{}.", token + 5), 1);
    let cases: Vec<(String, String, u16, &str)> = vec![
        (
            wrong_hmac.access_key,
            wrong_hmac.secret_key.clone(),
            403,
            "InvalidAccessKeyId",
        ),
        (
            wrong_hmac_our_id,
            wrong_hmac.secret_key,
            403,
            "SignatureDoesNotMatch",
        ),
        (tampered_key, secret.clone(), 403, "SignatureDoesNotMatch"),
        (
            other_lock.access_key,
            other_lock.secret_key,
            403,
            "FencingTokenWrongLock",
        ),
        (expired.access_key, expired.secret_key, 403, "AccessDenied"),
    ];
    for (k, s, status, code) in cases {
        let err = put(sdk(&k, &s), "forged").await.expect_err("refused");
        assert_eq!(
            (err.0, err.1.as_str()),
            (Some(status), code),
            "credentials {k}"
        );
    }
    assert_eq!(
        stored(&e.backend, BUCKET, "forged").await,
        None,
        "nothing written"
    );
    assert_eq!(
        e.proxy().max_token("nightly").await,
        Some(token),
        "max of the scope's lock unchanged"
    );

    // A header that disagrees with the credentials is refused too.
    let c = sdk(&key, &secret);
    let req = c
        .put_object()
        .bucket(BUCKET)
        .key("both")
        .body(aws_sdk_s3::primitives::ByteStream::from_static(b"x"));
    let err = fenced!(req, signed("nightly", token + 1))
        .send()
        .await
        .expect_err("disagreement");
    let (s, code) = error_of(&err);
    assert_eq!((s, code.as_str()), (Some(400), "InvalidFencingToken"));
}
