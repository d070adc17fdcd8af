//! A role fenced for its lifetime: `fencegate run` holds the lease while
//! the role lives, keeps its current credentials in files every process of
//! the role reads (AWS shared credentials, an env file, pgBackRest's
//! config, and `fencegate credential-process` for the AWS SDKs), and
//! raises the fence at the proxy when it takes the lease, before the new
//! holder writes anything.

mod support;

use aws_sdk_s3::primitives::ByteStream;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::harness::{BUCKET, Env, Harness};
use support::s3::*;
use support::{Api, Service, fencegate, locksvc_cmd, output_of, output_text, run_cmd, write_file};

/// The lock and the bucket it fences.
const LOCK: &str = "primary";

fn scoped() -> Harness {
    Harness::new(BackendKind::S3Fs).proxy_config(&format!(
        "[[scopes]]\nbucket = \"{BUCKET}\"\nlock = \"{LOCK}\""
    ))
}

/// A lease service whose lease-bound credentials last `credential_ttl`.
async fn locksvc_with(dir: &Path, credential_ttl: &str) -> Service {
    let config = dir.join("locksvc.toml");
    std::fs::write(&config, format!("credential_ttl = \"{credential_ttl}\"\n")).expect("write");
    let mut cmd = locksvc_cmd(dir, &[]);
    cmd.arg("--config").arg(&config);
    tokio::task::spawn_blocking(move || Service::start(cmd))
        .await
        .expect("locksvc")
}

/// A PUT through the proxy signed with `key`.
async fn put_with(e: &Env, key: (&str, &str), name: &str) -> Result<(), (Option<u16>, String)> {
    sdk_client(&e.proxy().url, key)
        .put_object()
        .bucket(BUCKET)
        .key(name)
        .body(ByteStream::from_static(b"wal segment"))
        .send()
        .await
        .map(|_| ())
        .map_err(|e| error_of(&e))
}

/// A PUT through the proxy with a Fencing-Token header.
async fn put_token(e: &Env, token: &str, name: &str) -> Result<(), (Option<u16>, String)> {
    fenced!(
        e.proxy()
            .client()
            .put_object()
            .bucket(BUCKET)
            .key(name)
            .body(ByteStream::from_static(b"backup")),
        token
    )
    .send()
    .await
    .map(|_| ())
    .map_err(|e| error_of(&e))
}

/// The role outlives `credential_ttl`: the first credentials expire, and
/// every process of the role keeps writing with what the files hold (they
/// are rewritten on every renewal, mode 0600, and gone when the lease
/// ends). Before, `run` dropped the renewed credentials and a primary
/// stopped archiving after `credential_ttl` (default 24 h) of uptime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_outlives_credential_ttl_through_files_its_processes_read() {
    let e = scoped().start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let svc = locksvc_with(dir.path(), "1m").await;
    let files = dir.path().join("role");
    std::fs::create_dir(&files).expect("dir");
    let (env, aws, pgbr) = (
        files.join("role.env"),
        files.join("credentials"),
        files.join("s3.conf"),
    );
    let mut holder = run_cmd(
        &svc.url,
        &[
            "--lock",
            LOCK,
            "--ttl",
            "3s",
            "--s3-endpoint",
            &e.proxy().url,
            "--env-file",
            &env.display().to_string(),
            "--aws-credentials-file",
            &aws.display().to_string(),
            "--pgbackrest-file",
            &pgbr.display().to_string(),
            "--",
            "sleep",
            "600",
        ],
    )
    .stdin(Stdio::null())
    .spawn()
    .expect("the role's holder starts");
    support::wait_for_file(&pgbr).await;
    for f in [&env, &aws, &pgbr] {
        let mode = std::fs::metadata(f).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", f.display());
    }
    let first = support::role_env(&env);
    let first_key = (
        first["AWS_ACCESS_KEY_ID"].clone(),
        first["AWS_SECRET_ACCESS_KEY"].clone(),
    );
    put_with(&e, (&first_key.0, &first_key.1), "wal/1")
        .await
        .expect("the first credentials write");
    let pg = std::fs::read_to_string(&pgbr).expect("pgbackrest file");
    assert!(
        pg.contains("[global]")
            && pg.contains(&format!("repo1-s3-key={}", first_key.0))
            && pg.contains(&format!("repo1-s3-key-secret={}", first_key.1)),
        "{pg}"
    );
    let shared = std::fs::read_to_string(&aws).expect("aws file");
    assert!(
        shared.contains("[default]")
            && shared.contains(&format!("aws_access_key_id = {}", first_key.0)),
        "{shared}"
    );

    // Past credential_ttl (1 minute) of the first credentials.
    tokio::time::sleep(Duration::from_secs(65)).await;
    let expired = put_with(&e, (&first_key.0, &first_key.1), "wal/2")
        .await
        .expect_err("the first credentials have expired");
    assert_eq!(expired.0, Some(403), "{expired:?}");
    let now = support::role_env(&env);
    assert_ne!(
        now["AWS_ACCESS_KEY_ID"], first_key.0,
        "rewritten on renewal"
    );
    put_with(
        &e,
        (&now["AWS_ACCESS_KEY_ID"], &now["AWS_SECRET_ACCESS_KEY"]),
        "wal/2",
    )
    .await
    .expect("what the env file holds now writes");
    // The pgBackRest file too (renewed every second here, so it may
    // already hold newer credentials than the env file read above).
    let pg = std::fs::read_to_string(&pgbr).expect("pgbackrest file");
    let value = |name: &str| {
        pg.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name} in {pg}"))
            .to_owned()
    };
    let (key, secret) = (value("repo1-s3-key"), value("repo1-s3-key-secret"));
    assert_ne!(key, first_key.0, "{pg}");
    put_with(&e, (&key, &secret), "wal/pg")
        .await
        .expect("what the pgBackRest file holds now writes");

    // The AWS CLI through credential_process: refreshed by the SDK itself.
    let config = dir.path().join("aws-config");
    std::fs::write(
        &config,
        format!(
            "[default]\ncredential_process = {} credential-process --env-file {}\n",
            env!("CARGO_BIN_EXE_fencegate"),
            env.display()
        ),
    )
    .expect("write");
    let src = write_file(dir.path(), "segment", "from the aws CLI");
    let aws_cp = || {
        let mut cmd = Command::new(venv_bin("aws"));
        support::without_fencegate_env(&mut cmd);
        cmd.args(["s3", "cp"])
            .arg(&src)
            .arg(format!("s3://{BUCKET}/wal/3"))
            .env("AWS_CONFIG_FILE", &config)
            .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
            .env("AWS_ENDPOINT_URL", &e.proxy().url)
            .env("AWS_DEFAULT_REGION", "us-east-1")
            .env("AWS_MAX_ATTEMPTS", "1")
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY");
        cmd
    };
    let out = output_of(aws_cp()).await;
    assert!(out.status.success(), "{}", output_text(&out));
    assert_eq!(
        stored_body(&e.backend, BUCKET, "wal/3").await,
        Some(b"from the aws CLI".to_vec())
    );

    // The role ends: its files go, and so do the SDKs' credentials.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(holder.id()).expect("pid")),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let status = tokio::task::spawn_blocking(move || holder.wait())
        .await
        .expect("joined")
        .expect("waited");
    assert!(status.code().is_some(), "{status:?}");
    for f in [&env, &aws, &pgbr] {
        assert!(!f.exists(), "{} outlived the lease", f.display());
    }
    let mut cp = fencegate();
    cp.args(["credential-process", "--env-file"]).arg(&env);
    let out = output_of(cp).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        output_text(&out).contains("no lease holds this role now"),
        "{}",
        output_text(&out)
    );
    let out = output_of(aws_cp()).await;
    assert!(
        !out.status.success(),
        "no lease, no credentials: {}",
        output_text(&out)
    );
}

/// Issue 34: while `run` stops its command gracefully it still holds the
/// lease (renewed until the command is gone), so the role files stay
/// fresh and `credential-process` keeps answering; the moment the lease
/// is lost (here the lease service dies and the lease runs out), the files
/// are removed, though the command is still stopping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn role_files_follow_the_lease_while_the_command_stops() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut svc = locksvc_with(dir.path(), "1m").await;
    let env = dir.path().join("role.env");
    let stopped = dir.path().join("stopped");
    // The command takes 20 s to stop after SIGTERM.
    let script = format!(
        "trap 'sleep 20; touch {}; exit 0' TERM; while true; do sleep 0.1; done",
        stopped.display()
    );
    let mut holder = run_cmd(
        &svc.url,
        &[
            "--lock",
            LOCK,
            "--ttl",
            "2s",
            "--grace",
            "30s",
            "--env-file",
            &env.display().to_string(),
            "--",
            "sh",
            "-c",
            &script,
        ],
    )
    .stdin(Stdio::null())
    .spawn()
    .expect("the role's holder starts");
    support::wait_for_file(&env).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(holder.id()).expect("pid")),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM to run");
    let before = support::role_env(&env)["FENCEGATE_CREDENTIALS_REFRESH_BY"].clone();
    // Past the 2 s lease, still stopping: refreshed, and it answers.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let now = support::role_env(&env)["FENCEGATE_CREDENTIALS_REFRESH_BY"].clone();
    assert_ne!(
        now, before,
        "the env file was refreshed while the command stops"
    );
    let mut cp = fencegate();
    cp.args(["credential-process", "--env-file"]).arg(&env);
    let out = output_of(cp).await;
    assert!(out.status.success(), "{}", output_text(&out));
    // The lease service dies: the lease runs out within its 2 s, and
    // the files go with it, while the command is still stopping.
    svc.kill9();
    let deadline = Instant::now() + Duration::from_secs(10);
    while env.exists() {
        assert!(
            Instant::now() < deadline,
            "the role files outlived the lease"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!stopped.exists(), "the command is still stopping");
    let status = tokio::task::spawn_blocking(move || holder.wait())
        .await
        .expect("joined")
        .expect("waited");
    assert!(stopped.exists() && status.success(), "{status:?}");
}

/// Taking the lease fences the old holder before the new one writes:
/// without it (`--no-fence`) the old holder's token is still admitted
/// until the new holder's first write; with it (the default when `run`
/// knows the proxy) the old token is refused as soon as the lease is
/// taken, though the new holder wrote nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taking_the_lease_fences_the_old_holder_before_it_writes() {
    let e = scoped().start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let svc = locksvc_with(dir.path(), "24h").await;
    let url = svc.url.clone();
    let (s, old) =
        tokio::task::spawn_blocking(move || Api::new(&url).acquire(LOCK, "old-primary", 1000))
            .await
            .expect("joined");
    assert_eq!(s, 200, "{old}");
    let zombie = old["fencing_token"].as_str().expect("token").to_owned();
    put_token(&e, &zombie, "wal/1")
        .await
        .expect("the old primary writes");
    tokio::time::sleep(Duration::from_millis(1200)).await;

    // The new primary's command writes nothing to the store: it only
    // notes its token.
    let noted = dir.path().join("token");
    let seen = dir.path().join("status.json");
    let script = format!(
        "echo $FENCING_TOKEN_NUMBER > {}; curl -sf {}/_fencegate/status > {}",
        noted.display(),
        e.proxy().url,
        seen.display()
    );
    let new_primary = |extra: &'static [&'static str]| {
        let mut args = vec!["--lock", LOCK, "--ttl", "5s"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", &script]);
        let mut cmd = run_cmd(&svc.url, &args);
        cmd.env("FENCEGATE_S3_ENDPOINT", &e.proxy().url);
        cmd
    };
    // The window the fence closes: a new holder that has not written.
    let out = output_of(new_primary(&["--no-fence"])).await;
    assert!(out.status.success(), "{}", output_text(&out));
    put_token(&e, &zombie, "wal/2")
        .await
        .expect("without --fence, the zombie still writes until the new holder does");

    let out = output_of(new_primary(&[])).await;
    assert!(out.status.success(), "{}", output_text(&out));
    let newest: u64 = std::fs::read_to_string(&noted)
        .expect("the new primary ran")
        .trim()
        .parse()
        .expect("a token number");
    let refused = put_token(&e, &zombie, "wal/3")
        .await
        .expect_err("the zombie is fenced");
    assert_eq!(refused, (Some(409), "FencingTokenStale".to_owned()));
    assert_eq!(e.proxy().max_token(LOCK).await, Some(newest));
    // Raised before the command started, not by anything it did.
    let status: Value =
        serde_json::from_str(&std::fs::read_to_string(&seen).expect("status")).expect("JSON");
    let at_start = status["locks"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["lock"] == LOCK))
        .and_then(|l| l["max_token"].as_u64());
    assert_eq!(at_start, Some(newest), "{status}");
    assert_eq!(stored(&e.backend, BUCKET, "wal/3").await, None);
}

/// `POST /_fencegate/fence`: only a signed token raises a fence; a number,
/// garbage, another proxy's lock, a lower token and a GET are refused with
/// an error that says what to send; replicas share the raise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_endpoint_takes_only_the_signed_token_and_replicas_share_it() {
    let e = scoped().proxies(2).start().await;
    let http = reqwest::Client::new();
    let fence = |proxy: usize, token: Option<String>| {
        let mut req = http.post(format!("{}/_fencegate/fence", e.proxies[proxy].url));
        if let Some(t) = token {
            req = req.header("Fencing-Token", t);
        }
        async move {
            let r = req.send().await.expect("sent");
            let max = r
                .headers()
                .get("fencing-max-token")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            (
                r.status().as_u16(),
                r.json::<Value>().await.expect("JSON"),
                max,
            )
        }
    };
    let (s, body, _) = fence(0, Some(signed(LOCK, 5))).await;
    assert_eq!(
        (s, &body["max_token"], &body["lock"]),
        (200, &Value::from(5), &Value::from(LOCK)),
        "{body}"
    );
    // The other replica refuses a lower token at once, writes included.
    let (s, body, max) = fence(1, Some(signed(LOCK, 4))).await;
    assert_eq!(
        (s, body["code"].as_str(), max.as_deref()),
        (409, Some("FencingTokenStale"), Some("5")),
        "{body}"
    );
    let stale = fenced!(
        e.proxies[1]
            .client()
            .put_object()
            .bucket(BUCKET)
            .key("k")
            .body(ByteStream::from_static(b"stale")),
        signed(LOCK, 4)
    )
    .send()
    .await
    .map_err(|e| error_of(&e))
    .expect_err("stale through the other replica");
    assert_eq!(stale, (Some(409), "FencingTokenStale".to_owned()));
    // Equal tokens are the holder's: accepted.
    assert_eq!(fence(1, Some(signed(LOCK, 5))).await.0, 200);

    for (token, status, code) in [
        (None, 400, "InvalidRequest"),
        (Some("9".to_owned()), 403, "FencingTokenUnsigned"),
        (Some("not a token".to_owned()), 400, "InvalidRequest"),
        (Some(signed("elsewhere", 9)), 404, "FencingLockUnknown"),
    ] {
        let (s, body, _) = fence(0, token.clone()).await;
        assert_eq!(
            (s, body["code"].as_str()),
            (status, Some(code)),
            "{token:?}: {body}"
        );
        assert!(
            body["error"].as_str().is_some_and(|m| !m.is_empty()),
            "{body}"
        );
    }
    let forged = signed(LOCK, 99).replace(":99:", ":98:");
    let (s, body, _) = fence(0, Some(forged)).await;
    assert_eq!(s, 403, "a token whose signature does not verify: {body}");
    assert_eq!(
        e.proxies[0].max_token(LOCK).await,
        Some(5),
        "nothing raised it"
    );
    let r = http
        .get(format!("{}/_fencegate/fence", e.proxy().url))
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status().as_u16(), 405);

    // A proxy without signing_keys cannot tell a lease service's token
    // from a made-up one: it raises no fence, whatever it is sent.
    let dir = tempfile::tempdir().expect("tempdir");
    let toml = proxy_toml(
        &e.backend,
        dir.path(),
        BUCKET,
        "accept_unsigned_tokens = true",
    )
    .lines()
    .filter(|l| !l.starts_with("signing_keys"))
    .collect::<Vec<_>>()
    .join("\n");
    let keyless = Proxy::start(&toml, dir.path()).await;
    let r = http
        .post(format!("{}/_fencegate/fence", keyless.url))
        .header("Fencing-Token", signed(BUCKET, u64::MAX))
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status().as_u16(), 403);
    let body: Value = r.json().await.expect("JSON");
    assert_eq!(body["code"], "FencingTokenUnverifiable", "{body}");
    assert_eq!(keyless.max_token(BUCKET).await, None, "nothing was raised");
}

/// A credentials file that cannot be written stops `run` before it takes
/// the lease, with a message that names the file and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unwritable_credentials_file_stops_run_before_it_holds_anything() {
    let dir = tempfile::tempdir().expect("tempdir");
    let svc = locksvc_with(dir.path(), "24h").await;
    let not_a_dir = write_file(dir.path(), "plain-file", "x");
    let cases: [(PathBuf, &str); 2] = [
        (dir.path().join("missing/role.env"), "does not exist"),
        (not_a_dir.join("role.env"), "is not a directory"),
    ];
    for (path, why) in cases {
        let out = output_of(run_cmd(
            &svc.url,
            &[
                "--lock",
                LOCK,
                "--env-file",
                &path.display().to_string(),
                "--",
                "true",
            ],
        ))
        .await;
        assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
        assert!(
            output_text(&out).contains(&path.display().to_string())
                && output_text(&out).contains(why),
            "{}",
            output_text(&out)
        );
        let url = svc.url.clone();
        let (_, st) = tokio::task::spawn_blocking(move || Api::new(&url).status(LOCK))
            .await
            .expect("joined");
        assert_eq!(st["held"], false, "nothing was held: {st}");
    }
}
