//! `fencegate run` against a real lease service: the token reaches the
//! command, the exit status passes through, and a lost lease stops it.

mod support;

use nix::sys::signal::Signal;
use std::process::Stdio;
use std::time::{Duration, Instant};
use support::*;

fn process_alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

fn read_pid(path: &std::path::Path) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(s) = std::fs::read_to_string(path)
            && let Ok(pid) = s.trim().parse()
        {
            return pid;
        }
        assert!(Instant::now() < deadline, "child never wrote its pid");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A file in `dir` and the shell command that writes `line` (its
/// variables expanded by the shell) into it.
fn echo_into(dir: &std::path::Path, line: &str) -> (std::path::PathBuf, String) {
    let out = dir.join("env.txt");
    let echo = format!("echo \"{line}\" > {}", out.display());
    (out, echo)
}

#[test]
fn exports_the_token_passes_the_exit_status_and_releases() {
    let dir = tempdir();
    let svc = start_locksvc(dir.path());
    let (out, echo) = echo_into(
        dir.path(),
        "$FENCING_TOKEN $FENCING_TOKEN_NUMBER $FENCEGATE_LOCK",
    );
    let script = format!("{echo}; exit 7");
    let status = run_cmd(
        &svc.url,
        &[
            "--lock", "nightly", "--ttl", "5s", "--", "sh", "-c", &script,
        ],
    )
    .status()
    .expect("runs");
    assert_eq!(status.code(), Some(7), "CMD's status passes through");
    let env = std::fs::read_to_string(&out).expect("CMD ran");
    let parts: Vec<&str> = env.split_whitespace().collect();
    assert_eq!(parts.len(), 3, "{env}");
    // The signed token carries the same number as FENCING_TOKEN_NUMBER
    // (1 on a fresh SQLite database; an etcd revision on etcd).
    let number = parts[1];
    assert!(
        parts[0].starts_with(&format!("fgt1:nightly:{number}:")),
        "{env}"
    );
    if lease_backend() == LeaseBackend::Sqlite {
        assert_eq!(number, "1", "{env}");
    } else {
        assert!(number.parse::<u64>().is_ok_and(|n| n > 0), "{env}");
    }
    assert_eq!(parts[2], "nightly");
    Api::new(&svc.url).assert_free("nightly", "the lease is released after CMD");
}

/// `FENCEGATE_S3_ENDPOINT` is a default for the runs that take
/// `--s3-credentials`; it must not make every other run a usage error (it
/// did: clap's `requires` counted the variable as a typed `--s3-endpoint`,
/// and `run` exited 2 without running anything).
#[test]
fn an_s3_endpoint_in_the_environment_needs_no_credentials_flag() {
    let dir = tempdir();
    let svc = start_locksvc(dir.path());
    let (out, script) = echo_into(dir.path(), "[$AWS_ENDPOINT_URL] [$AWS_ACCESS_KEY_ID]");
    let endpoint = "http://127.0.0.1:9";
    let run = |extra: &[&str]| {
        // No proxy listens at the endpoint: nothing to fence there.
        let mut args = vec!["--lock", "env", "--no-fence"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", &script]);
        let _ = std::fs::remove_file(&out);
        let o = run_cmd(&svc.url, &args)
            .env("FENCEGATE_S3_ENDPOINT", endpoint)
            .env_remove("AWS_ENDPOINT_URL")
            .env_remove("AWS_ACCESS_KEY_ID")
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(0), "{extra:?}: {stderr}");
        std::fs::read_to_string(&out).expect("CMD ran")
    };
    assert_eq!(
        run(&[]),
        "[] []\n",
        "without --s3-credentials nothing S3 is exported"
    );
    let with = run(&["--s3-credentials"]);
    assert!(
        with.starts_with(&format!("[{endpoint}] [fgk2.")),
        "with --s3-credentials the variable is the endpoint: {with}"
    );

    // Typed on the command line, --s3-endpoint that nothing uses (no
    // fence, no credentials, no env file) is refused as usage, naming the
    // fix.
    let o = run_cmd(
        &svc.url,
        &[
            "--lock",
            "env",
            "--no-fence",
            "--s3-endpoint",
            endpoint,
            "--",
            "true",
        ],
    )
    .output()
    .expect("runs");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    fencegate_testkit::assert_mentions(&stderr, &["drop --s3-endpoint"]);
}

#[test]
fn a_command_that_cannot_start_exits_127_or_126_and_releases() {
    let dir = tempdir();
    let svc = start_locksvc(dir.path());
    let not_executable = write_file(dir.path(), "data.txt", "not a program");
    for (command, code) in [
        ("/nonexistent/backup-tool".to_owned(), 127),
        (not_executable.display().to_string(), 126),
    ] {
        let out = run_cmd(&svc.url, &["--lock", "job", "--", &command])
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{command}: {stderr}");
        fencegate_testkit::assert_mentions(&stderr, &["cannot start"]);
        Api::new(&svc.url).assert_free("job", "the lease is released");
    }
}

#[test]
fn a_held_lock_exits_3_without_running_the_command() {
    let dir = tempdir();
    let svc = start_locksvc(dir.path());
    Api::new(&svc.url).acquire("busy", "someone-else", 30_000);
    let marker = dir.path().join("ran");
    let status = run_cmd(
        &svc.url,
        &[
            "--lock",
            "busy",
            "--",
            "touch",
            marker.to_str().expect("utf8"),
        ],
    )
    .stderr(Stdio::null())
    .status()
    .expect("runs");
    assert_eq!(status.code(), Some(3));
    assert!(!marker.exists(), "CMD must not run without the lease");
}

#[test]
fn the_command_is_stopped_when_the_lease_service_is_gone() {
    let dir = tempdir();
    let mut svc = start_locksvc(dir.path());
    let pidfile = dir.path().join("child.pid");
    let script = format!("echo $$ > {}; exec sleep 120", pidfile.display());
    let mut run = run_cmd(
        &svc.url,
        &[
            "--lock", "gone", "--ttl", "2s", "--grace", "1s", "--", "sh", "-c", &script,
        ],
    )
    .spawn()
    .expect("runs");
    let child_pid = read_pid(&pidfile);
    svc.kill9();
    let started = Instant::now();
    let status = run.wait().expect("run exits");
    assert_eq!(status.code(), Some(4), "exit code says the lease was lost");
    assert!(started.elapsed() < Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(100));
    assert!(!process_alive(child_pid), "the command was stopped");
}

#[test]
fn the_command_is_stopped_when_the_lease_is_taken_after_a_pause() {
    let (dir, svc, api) = fresh_locksvc();
    let pidfile = dir.path().join("child.pid");
    let termfile = dir.path().join("got-term");
    // The child survives SIGTERM (its trap only records it), so only the
    // SIGKILL after the grace stops it.
    let grace = Duration::from_secs(2);
    let script = format!(
        "trap 'echo term > {}' TERM; echo $$ > {}; while true; do sleep 0.1; done",
        termfile.display(),
        pidfile.display()
    );
    let mut run = run_cmd(
        &svc.url,
        &[
            "--lock", "stolen", "--ttl", "1s", "--grace", "2s", "--", "sh", "-c", &script,
        ],
    )
    .stderr(Stdio::piped())
    .spawn()
    .expect("runs");
    let child_pid = read_pid(&pidfile);
    let run_pid = nix::unistd::Pid::from_raw(i32::try_from(run.id()).expect("pid"));
    let _reap = KillIfPanicking(vec![run_pid, nix::unistd::Pid::from_raw(child_pid)]);

    // The runner stalls past its lease; someone else takes the lock.
    nix::sys::signal::kill(run_pid, Signal::SIGSTOP).expect("stop");
    let deadline = Instant::now() + Duration::from_secs(10);
    while api.status("stolen").1["held"] == true {
        assert!(Instant::now() < deadline, "the stalled lease never expired");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (s, b) = api.acquire("stolen", "B", 30_000);
    assert_eq!(s, 200, "{b}");
    nix::sys::signal::kill(run_pid, Signal::SIGCONT).expect("cont");

    // SIGTERM first, and the child is still running through the grace...
    let deadline = Instant::now() + Duration::from_secs(10);
    while !termfile.exists() {
        assert!(Instant::now() < deadline, "the child never got SIGTERM");
        std::thread::sleep(Duration::from_millis(10));
    }
    let termed = Instant::now();
    // ...then SIGKILL once the grace is over, not before and not much later.
    while process_alive(child_pid) {
        assert!(
            termed.elapsed() < grace + Duration::from_secs(5),
            "the child ignoring SIGTERM was not killed {:?} after SIGTERM",
            termed.elapsed()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let killed_after = termed.elapsed();
    // The trap's write lags the SIGTERM a little, never the other way round.
    assert!(
        killed_after >= grace - Duration::from_millis(300),
        "killed {killed_after:?} after SIGTERM, before the {grace:?} grace"
    );
    let status = wait_with_deadline(&mut run, Duration::from_secs(10));
    assert_eq!(status.code(), Some(4));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut run.stderr.take().expect("piped"), &mut stderr)
        .expect("stderr");
    fencegate_testkit::assert_mentions(&stderr, &["sending SIGKILL"]);
    let (_, st) = api.status("stolen");
    assert_eq!(st["owner"], "B", "the new holder keeps the lock: {st}");
}

/// SIGKILLs the processes when a failing test unwinds, so a `run` that
/// never stops its command does not leave both running.
struct KillIfPanicking(Vec<nix::unistd::Pid>);

impl Drop for KillIfPanicking {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for pid in &self.0 {
                let _ = nix::sys::signal::kill(*pid, Signal::SIGKILL);
            }
        }
    }
}

/// Waits for `child` to exit, failing the test after `limit` (a hung
/// `run` must fail the test, not hang it).
fn wait_with_deadline(
    child: &mut std::process::Child,
    limit: Duration,
) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("run did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn renews_with_its_signed_token_past_the_ttl_and_releases_at_the_end() {
    let (dir, svc, api) = fresh_locksvc();
    // The command outlives its 1 s TTL three times over: only renewals keep
    // the lease.
    let (out, echo) = echo_into(dir.path(), "$FENCING_TOKEN_NUMBER");
    let script = format!("{echo}; sleep 3.5");
    let mut run = run_cmd(
        &svc.url,
        &["--lock", "long", "--ttl", "1s", "--", "sh", "-c", &script],
    )
    .spawn()
    .expect("runs");
    std::thread::sleep(Duration::from_millis(2500));
    let token: u64 = std::fs::read_to_string(&out)
        .expect("CMD ran")
        .trim()
        .parse()
        .expect("a number");
    let (_, st) = api.status("long");
    assert_eq!(st["held"], true, "renewed past its TTL: {st}");
    assert_eq!(st["token"], token, "{st}");
    assert!(
        st["expires_at_ms"].as_u64().expect("expiry") > unix_ms(),
        "{st}"
    );
    let status = run.wait().expect("run exits");
    assert_eq!(status.code(), Some(0));
    api.assert_free("long", "released after CMD");
    let m = Metrics::fetch(&format!("{}/metrics", svc.url));
    assert!(
        m.count("fencegate_locksvc_renewals_total", &[]) >= 3,
        "renewals were accepted"
    );
    assert_eq!(m.count("fencegate_locksvc_releases_total", &[]), 1);
    // A labelled counter's series appears at its first increment.
    assert_eq!(
        m.get(
            "fencegate_locksvc_refusals_total",
            &[("reason", "plain_token")]
        ),
        None,
        "run never sends a bare number"
    );
}

/// With the replicas of a lease service listed, an acquire moves past one
/// that took the request and dropped it only when it carries an
/// idempotency key (`run` always sends one): without a key, the first
/// replica may have granted a lease the client would never see.
#[test]
fn an_acquire_moves_past_a_replica_that_dropped_it_only_with_an_idempotency_key() {
    let dir = tempdir();
    let svc = start_locksvc(dir.path());
    let (silent, dropped) = unserved();
    std::thread::spawn(move || {
        for conn in silent.incoming() {
            drop(conn);
        }
    });
    let both = format!("{dropped},{}", svc.url);
    let api = Api::new(&svc.url);

    let status = run_cmd(&both, &["--lock", "listed", "--", "true"])
        .status()
        .expect("runs");
    assert_eq!(status.code(), Some(0), "run moves on to the second replica");

    let acquire = |extra: &[&str]| {
        let mut cmd = fencegate();
        cmd.args(["lease", "acquire", "keyed", "--owner", "o", "--ttl", "30s"])
            .args(extra)
            .env("FENCEGATE_LOCKSVC", &both)
            .env("FENCEGATE_LOG", "warn");
        cmd.output().expect("runs")
    };
    let out = acquire(&[]);
    assert_eq!(out.status.code(), Some(1), "without a key it is not resent");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&dropped),
        "the error names the replica that dropped it: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(api.status("keyed").1["held"], false);
    let out = acquire(&["--idempotency-key", "a-secret-of-this-acquire"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(api.status("keyed").1["owner"], "o");
}

/// `--stop-signal INT` (PostgreSQL's fast shutdown) is what the command
/// gets when `run` is stopped; the default stays SIGTERM.
/// Issue 34: a fence endpoint that cannot be reached is retried for the
/// fence's patience (safe: the command does not start), and the operator
/// sees each cause as it happens, not only at the end.
#[test]
fn an_unreachable_fence_endpoint_is_reported_while_it_is_retried() {
    let dir = tempdir();
    let svc = start_locksvc(dir.path());
    let (closed, fence) = unserved();
    drop(closed);
    let marker = dir.path().join("started");
    let log = dir.path().join("run.log");
    let mut run = run_cmd(
        &svc.url,
        &[
            "--lock",
            "unreachable-fence",
            "--fence",
            &fence,
            "--",
            "touch",
            marker.to_str().expect("utf-8"),
        ],
    )
    .env("FENCEGATE_LOG", "warn")
    .stderr(std::fs::File::create(&log).expect("log"))
    .spawn()
    .expect("runs");
    // Retried every half second; said at once and then every 5 s.
    let words = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("the fence is not raised yet") && l.contains("unreachable"))
            .count()
    };
    let started = Instant::now();
    while words() < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the cause was not said twice: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let waited = started.elapsed().as_secs();
    assert!(run.try_wait().expect("wait").is_none(), "still retrying");
    run.kill().expect("kill");
    let _ = run.wait();
    let said = words();
    assert!(
        said <= 2 + usize::try_from(waited / 5).expect("small"),
        "{said} lines in {waited} s: once every 5 s, not once a retry"
    );
    assert!(
        !marker.exists(),
        "the command ran before the fence was raised"
    );
}

#[test]
fn the_stop_signal_is_the_one_asked_for() {
    let dir = tempdir();
    let svc = start_locksvc(dir.path());
    for (flag, expected) in [(None, "term"), (Some("INT"), "int")] {
        let pidfile = dir.path().join(format!("{expected}.pid"));
        let got = dir.path().join(format!("{expected}.got"));
        let script = format!(
            "trap 'echo term > {g}; exit 0' TERM; trap 'echo int > {g}; exit 0' INT; echo $$ > {p}; while true; do sleep 0.1; done",
            g = got.display(),
            p = pidfile.display()
        );
        let mut args = vec!["--lock", "signal", "--ttl", "5s", "--grace", "5s"];
        if let Some(f) = flag {
            args.extend_from_slice(&["--stop-signal", f]);
        }
        args.extend_from_slice(&["--", "sh", "-c", &script]);
        let mut run = run_cmd(&svc.url, &args).spawn().expect("runs");
        read_pid(&pidfile);
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(run.id()).expect("pid")),
            Signal::SIGTERM,
        )
        .expect("SIGTERM to run");
        let status = run.wait().expect("run exits");
        assert_eq!(status.code(), Some(0), "{flag:?}");
        assert_eq!(
            std::fs::read_to_string(&got)
                .expect("the command saw a signal")
                .trim(),
            expected,
            "{flag:?}"
        );
    }
    let bad = run_cmd(
        &svc.url,
        &["--lock", "signal", "--stop-signal", "HUP", "--", "true"],
    )
    .output()
    .expect("runs");
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not TERM, INT or QUIT"));
}
