//! Test harness: real `fencegate` processes on OS-chosen ports.
//!
//! Every service is the real binary (`CARGO_BIN_EXE_fencegate`), started on
//! `127.0.0.1:0`; the harness reads the "listening on" line the binary prints
//! first on stdout to learn the port. Processes are killed when dropped.

#![allow(
    dead_code,
    reason = "each test file uses a different part of the harness"
)]

#[macro_use]
pub mod s3;

use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub const SIGNING_KEY: &str = "test-signing-key-0123456789";

/// The `fencegate` binary, with none of the caller's `FENCEGATE_*`
/// variables: a service or CLI under test sees only what the test sets.
pub fn fencegate() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fencegate"));
    without_fencegate_env(&mut cmd);
    cmd
}

/// Removes from `cmd` every `FENCEGATE_*` variable of whoever runs the tests
/// (set them on `cmd` afterwards to pass one on). The harness's own settings
/// (`FENCEGATE_MOTO_SERVER`, replay seeds) are read in this process, never
/// by what it starts.
pub fn without_fencegate_env(cmd: &mut Command) -> &mut Command {
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("FENCEGATE_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// A running service process.
#[derive(Debug)]
pub struct Service {
    pub child: Child,
    pub url: String,
    /// The whole "listening on" line (`fencegate dev` also names its lease
    /// service and backend there).
    pub banner: String,
}

impl Service {
    /// Starts `fencegate <args>` and waits for its "listening on" line.
    pub fn start(mut cmd: Command) -> Service {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("fencegate starts");
        let stdout = child.stdout.take().expect("stdout piped");
        let mut lines = BufReader::new(stdout).lines();
        let first = lines
            .next()
            .expect("service printed a line")
            .expect("readable stdout");
        let url = first
            .split("listening on ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
            .to_owned();
        // Keep draining stdout so the service never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Service {
            child,
            url,
            banner: first,
        }
    }

    /// The `http://host:port` that follows `label` in the banner, as
    /// `fencegate dev` prints them: `(locksvc http://..., backend http://...)`.
    pub fn banner_url(&self, label: &str) -> String {
        self.banner
            .split(&format!("{label} http://"))
            .nth(1)
            .and_then(|rest| rest.split([',', ')', ' ']).next())
            .map(|addr| format!("http://{addr}"))
            .unwrap_or_else(|| panic!("no {label} address in {:?}", self.banner))
    }

    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pid fits")
    }

    /// kill -9, and reap.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig)
            .expect("signal delivered");
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A lease service on a database in `dir`.
pub fn locksvc_cmd(dir: &Path, extra_env: &[(&str, &str)]) -> Command {
    let mut cmd = fencegate();
    cmd.args(["locksvc", "--listen", "127.0.0.1:0", "--db"])
        .arg(dir.join("locksvc.db"))
        .env("FENCEGATE_SIGNING_KEYS", SIGNING_KEY)
        .env("FENCEGATE_LOG", "warn");
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    cmd
}

pub fn start_locksvc(dir: &Path) -> Service {
    Service::start(locksvc_cmd(dir, &[]))
}

/// A blocking JSON client for the lease service.
#[derive(Debug, Clone)]
pub struct Api {
    pub url: String,
    http: reqwest::blocking::Client,
    pub bearer: Option<String>,
}

impl Api {
    pub fn new(url: &str) -> Api {
        Api {
            url: url.to_owned(),
            http: reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .expect("client"),
            bearer: None,
        }
    }

    /// Sends `method path` with a raw body; returns status and JSON body.
    pub fn raw(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut req = self.http.request(method, format!("{}{path}", self.url));
        if let Some(b) = &self.bearer {
            req = req.bearer_auth(b);
        }
        if let Some(body) = body {
            req = req
                .header("content-type", "application/json")
                .body(body.to_owned());
        }
        let resp = req.send().expect("request sent");
        let status = resp.status().as_u16();
        let text = resp.text().expect("body");
        let v =
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON ({status}): {text}"));
        (status, v)
    }

    pub fn acquire(&self, lock: &str, owner: &str, ttl_ms: u64) -> (u16, Value) {
        self.raw(
            "POST",
            &format!("/v1/locks/{lock}/acquire"),
            Some(&json!({"owner": owner, "ttl_ms": ttl_ms}).to_string()),
        )
    }

    pub fn acquire_wait(&self, lock: &str, owner: &str, ttl_ms: u64, wait_ms: u64) -> (u16, Value) {
        self.raw(
            "POST",
            &format!("/v1/locks/{lock}/acquire"),
            Some(&json!({"owner": owner, "ttl_ms": ttl_ms, "wait_ms": wait_ms}).to_string()),
        )
    }

    /// Acquire with an idempotency key (the proof that a retry comes from
    /// the same client).
    pub fn acquire_with_key(
        &self,
        lock: &str,
        owner: &str,
        ttl_ms: u64,
        key: &str,
    ) -> (u16, Value) {
        self.raw(
            "POST",
            &format!("/v1/locks/{lock}/acquire"),
            Some(&json!({"owner": owner, "ttl_ms": ttl_ms, "idempotency_key": key}).to_string()),
        )
    }

    /// Renew, proven by `token`: the signed `fencing_token` of the lease
    /// (see [`signed_of`]), or any JSON value an adversarial test sends.
    pub fn renew(&self, lock: &str, token: impl Into<Value>, ttl_ms: u64) -> (u16, Value) {
        self.raw(
            "POST",
            &format!("/v1/locks/{lock}/renew"),
            Some(&json!({"token": token.into(), "ttl_ms": ttl_ms}).to_string()),
        )
    }

    /// Release, proven by `token` (as for [`Api::renew`]).
    pub fn release(&self, lock: &str, token: impl Into<Value>) -> (u16, Value) {
        self.raw(
            "POST",
            &format!("/v1/locks/{lock}/release"),
            Some(&json!({"token": token.into()}).to_string()),
        )
    }

    pub fn status(&self, lock: &str) -> (u16, Value) {
        self.raw("GET", &format!("/v1/locks/{lock}"), None)
    }
}

pub fn token_of(v: &Value) -> u64 {
    v["token"]
        .as_u64()
        .unwrap_or_else(|| panic!("no token in {v}"))
}

/// The signed `fencing_token` of a lease answer: what proves holding it.
pub fn signed_of(v: &Value) -> String {
    v["fencing_token"]
        .as_str()
        .unwrap_or_else(|| panic!("no fencing_token in {v}"))
        .to_owned()
}

pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// Sleeps until the wall clock reaches `deadline` (Unix milliseconds).
pub fn wait_until_ms(deadline: u64) {
    loop {
        let now = unix_ms();
        if now >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(deadline - now));
    }
}

/// The wall clock in Unix milliseconds (tests compare it with lease expiries).
#[allow(clippy::disallowed_methods, reason = "tests observe real expiry")]
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after epoch")
        .as_millis() as u64
}
