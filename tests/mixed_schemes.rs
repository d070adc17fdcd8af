//! A list of lease-service URLs that mixes `http://` and `https://` is
//! refused wherever one is given (`--locksvc`, `FENCEGATE_LOCKSVC`, the
//! proxy's `locksvc_url` and `FENCEGATE_LOCKSVC_URL`), before anything is
//! sent: a failover from the https:// replica to the http:// one would send
//! the signed token in clear. Every URL here is a listener that must see
//! no connection.

mod support;

use std::net::TcpListener;
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use support::s3::{proxy_cmd, signed};
use support::*;

/// A bound port that accepts nothing: a client that connected would be in
/// its backlog.
struct Trap {
    listener: TcpListener,
    addr: String,
}

impl Trap {
    fn new() -> Trap {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr").to_string();
        Trap { listener, addr }
    }

    fn assert_untouched(&self, context: &str) {
        match self.listener.accept() {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Ok((_, peer)) => panic!("{context}: {peer} connected to {}", self.addr),
            Err(e) => panic!("{context}: accept on {}: {e}", self.addr),
        }
    }
}

/// An https:// replica and a plain one, and the message that must name
/// the plain one.
struct Mixed {
    tls: Trap,
    plain: Trap,
}

impl Mixed {
    fn new() -> Mixed {
        Mixed {
            tls: Trap::new(),
            plain: Trap::new(),
        }
    }

    /// `https://A,http://B`.
    fn list(&self) -> String {
        format!("https://{},http://{}", self.tls.addr, self.plain.addr)
    }

    fn message(&self) -> String {
        format!(
            "the lease service URLs mix http:// and https://: http://{} is plain HTTP while https://{} is HTTPS",
            self.plain.addr, self.tls.addr
        )
    }

    fn assert_untouched(&self, context: &str) {
        self.tls.assert_untouched(context);
        self.plain.assert_untouched(context);
    }
}

/// Runs `cmd` to its end (killed and failed after 30 s: a command that
/// accepted the list would wait for its replicas or serve).
fn finish(mut cmd: Command) -> Output {
    let mut child = spawn_piped(&mut cmd);
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "still running after 30 s: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// Refused as bad usage (exit 2), naming the plain URL, and sent nowhere.
fn assert_refused(out: &Output, mixed: &Mixed, context: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{context}: {err}");
    assert!(err.contains(&mixed.message()), "{context}: {err}");
    assert!(
        err.contains("Use https:// for every replica"),
        "{context}: {err}"
    );
    assert!(out.stdout.is_empty(), "{context}: printed {:?}", out.stdout);
    mixed.assert_untouched(context);
}

#[test]
fn the_lease_commands_refuse_a_mixed_list_before_sending_anything() {
    let mixed = Mixed::new();
    let list = mixed.list();
    let token = signed("backups", 7);
    let commands: [&[&str]; 4] = [
        &["lease", "acquire", "backups", "--owner", "alice"],
        &["lease", "status", "backups"],
        &["lease", "renew", "backups", "--token", &token],
        &["lease", "release", "backups", "--token", &token],
    ];
    for args in commands {
        let mut cmd = fencegate();
        cmd.args(args).args(["--locksvc", &list]);
        assert_refused(&finish(cmd), &mixed, &args.join(" "));
        // The same list from the environment.
        let mut cmd = fencegate();
        cmd.args(args).env("FENCEGATE_LOCKSVC", &list);
        assert_refused(&finish(cmd), &mixed, &format!("{} (env)", args.join(" ")));
    }
    // Whichever comes first: http://B,https://A names B all the same.
    let mut cmd = fencegate();
    cmd.args(["lease", "status", "backups", "--locksvc"])
        .arg(format!(
            "http://{},https://{}",
            mixed.plain.addr, mixed.tls.addr
        ));
    let out = finish(cmd);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "http://{} is plain HTTP while https://{} is HTTPS",
            mixed.plain.addr, mixed.tls.addr
        )),
        "{err}"
    );
    // TLS settings do not make the plain replica any safer.
    let mut cmd = fencegate();
    cmd.args(["lease", "acquire", "backups", "--locksvc", &list])
        .args(["--ca-file", "/nonexistent/ca.pem"]);
    assert_refused(&finish(cmd), &mixed, "acquire --ca-file");
}

#[test]
fn run_refuses_a_mixed_list_and_never_starts_its_command() {
    let dir = tempdir();
    let mixed = Mixed::new();
    let list = mixed.list();
    let marker = dir.path().join("ran");
    let script = format!("touch {}", marker.display());
    let mut cmd = fencegate();
    cmd.args(["run", "--lock", "backups", "--locksvc", &list, "--"])
        .args(["sh", "-c", &script]);
    assert_refused(&finish(cmd), &mixed, "run --locksvc");
    let cmd = run_cmd(&list, &["--lock", "backups", "--", "sh", "-c", &script]);
    assert_refused(&finish(cmd), &mixed, "run with FENCEGATE_LOCKSVC");
    assert!(!marker.exists(), "the command ran");
}

#[test]
fn a_proxy_with_a_mixed_locksvc_url_refuses_to_start() {
    let dir = tempdir();
    let mixed = Mixed::new();
    // The backend is a trap too: the proxy stops before probing it.
    let backend = Trap::new();
    let toml = |locksvc_url: &str| {
        format!(
            r#"
db = "{db}"
allow_anonymous = true
signing_keys = ["{SIGNING_KEY}"]
{locksvc_url}

[backend]
endpoint = "http://{backend}"
access_key = "backend-key"
secret_key = "backend-secret"
"#,
            db = dir.path().join("proxy.db").display(),
            backend = backend.addr,
        )
    };
    let expected = format!("locksvc_url: {}", mixed.message());
    let start = |config_text: String, env: Option<&str>| {
        let config = write_file(dir.path(), "proxy.toml", config_text);
        let mut cmd = proxy_cmd(&config);
        if let Some(list) = env {
            cmd.env("FENCEGATE_LOCKSVC_URL", list);
        }
        finish(cmd)
    };
    for (context, out) in [
        (
            "locksvc_url",
            start(toml(&format!("locksvc_url = \"{}\"", mixed.list())), None),
        ),
        (
            "FENCEGATE_LOCKSVC_URL",
            start(toml(""), Some(&mixed.list())),
        ),
    ] {
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{context}: {err}");
        assert!(err.contains(&expected), "{context}: {err}");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("listening on"),
            "{context}: it started"
        );
        mixed.assert_untouched(context);
        backend.assert_untouched(context);
    }
}
