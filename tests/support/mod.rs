//! Test harness: real `fencegate` processes on OS-chosen ports.
//!
//! Every service is the real binary (`CARGO_BIN_EXE_fencegate`), started on
//! `127.0.0.1:0`; the harness reads the "listening on" line the binary prints
//! first on stdout to learn the port. Processes are killed when dropped.

#![allow(
    dead_code,
    reason = "each test file uses a different part of the harness"
)]

/// One test per S3 server for each `name`: `name(BackendKind::S3Fs)`,
/// `name(BackendKind::Moto)` and `name(BackendKind::Rgw)`, each on a
/// runtime of `threads` workers (`on_every_backend!(threads = 4; a, b)`).
#[macro_export]
macro_rules! on_every_backend {
    (threads = $threads:literal; $($name:ident),* $(,)?) => {
        mod s3s_fs {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = $threads)]
                async fn $name() {
                    super::$name(super::BackendKind::S3Fs).await
                }
            )*
        }
        mod moto {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = $threads)]
                async fn $name() {
                    super::$name(super::BackendKind::Moto).await
                }
            )*
        }
        mod rgw {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = $threads)]
                async fn $name() {
                    super::$name(super::BackendKind::Rgw).await
                }
            )*
        }
    };
}

#[macro_use]
pub mod s3;
pub mod etcd;
pub mod harness;
#[allow(
    unused_imports,
    reason = "each test file uses a different part of the harness"
)]
pub use etcd::{LeaseBackend, lease_backend};
pub mod netns;
pub mod relay;
pub mod zookeeper;

use parking_lot::Mutex;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

pub const SIGNING_KEY: &str = "test-signing-key-0123456789";

/// The key list every service under test signs and verifies with.
pub fn test_keys() -> fencegate_core::TokenKeys {
    fencegate_core::TokenKeys::new(vec![SIGNING_KEY.as_bytes().to_vec()]).expect("key")
}

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

/// The URL after "listening on " in a service's first line, cut at the
/// first blank: how the harness, the bench and scripts read it.
pub fn listening_url(first: &str) -> String {
    first
        .split("listening on ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no URL in the first line {first:?}"))
        .to_owned()
}

/// The text of the first `<tag>` element in an S3 XML answer.
pub fn xml_value(xml: &str, tag: &str) -> Option<String> {
    let (_, rest) = xml.split_once(&format!("<{tag}>"))?;
    let (value, _) = rest.split_once(&format!("</{tag}>"))?;
    Some(value.to_owned())
}

/// A finished command's stdout then stderr, as text.
pub fn output_text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `cmd` to its end off the async runtime's threads.
pub async fn output_of(mut cmd: Command) -> std::process::Output {
    tokio::task::spawn_blocking(move || cmd.output().expect("runs"))
        .await
        .expect("joined")
}

/// The `http://host:port` that follows `label` in a banner, as `fencegate
/// dev` prints them: `(locksvc http://..., backend http://...)`.
pub fn labelled_url(banner: &str, label: &str) -> String {
    banner
        .split(&format!("{label} http://"))
        .nth(1)
        .and_then(|rest| rest.split([',', ')', ' ']).next())
        .map(|addr| format!("http://{addr}"))
        .unwrap_or_else(|| panic!("no {label} address in {banner:?}"))
}

/// Runs `cmd` to its end and fails the test unless it succeeded: `what`
/// names the command in a failure, with its stderr.
pub fn succeeds(cmd: &mut Command, what: &str) -> std::process::Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what} does not run: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A lease of `lock` for `alice` (60 s) from the lease service at
/// `locksvc`, asked by `http`; the lease's JSON.
pub async fn alice_lease(http: &reqwest::Client, locksvc: &str, lock: &str) -> Value {
    http.post(format!("{locksvc}/v1/locks/{lock}/acquire"))
        .json(&json!({"owner": "alice", "ttl_ms": 60_000}))
        .send()
        .await
        .expect("acquire")
        .json()
        .await
        .expect("lease")
}

/// A port of 127.0.0.1 no service answers on: its listener, held so that
/// nothing else takes the port (drop it for a refused connection), and its
/// `http://` URL.
pub fn unserved() -> (std::net::TcpListener, String) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    (listener, url)
}

/// Starts `cmd` with stdin closed and its stdout and stderr piped.
pub fn spawn_piped(cmd: &mut Command) -> Child {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fencegate starts")
}

/// Collects `child`'s piped stderr line by line, as it comes, into the
/// returned text; the handle ends when the pipe closes.
pub fn collect_stderr(child: &mut Child) -> (Arc<Mutex<String>>, std::thread::JoinHandle<()>) {
    let text = Arc::new(Mutex::new(String::new()));
    let (pipe, log) = (child.stderr.take().expect("stderr piped"), text.clone());
    let done = std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            let mut log = log.lock();
            log.push_str(&line);
            log.push('\n');
        }
    });
    (text, done)
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
    pub fn start(cmd: Command) -> Service {
        Service::start_logging(cmd, Stdio::inherit())
    }

    /// [`Service::start`] with the service's log (stderr) sent to `log`.
    pub fn start_logging(mut cmd: Command, log: impl Into<Stdio>) -> Service {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("fencegate starts");
        let stdout = child.stdout.take().expect("stdout piped");
        let mut lines = BufReader::new(stdout).lines();
        let first = lines
            .next()
            .expect("service printed a line")
            .expect("readable stdout");
        let url = listening_url(&first);
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
        labelled_url(&self.banner, label)
    }

    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pid fits")
    }

    /// kill -9, and reap.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM (a graceful stop), and reap.
    pub fn terminate(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGTERM);
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

/// A lease service whose state lives in `dir`: a SQLite database there,
/// or, in an etcd pass (`FENCEGATE_TEST_LEASE_BACKEND=etcd`, see
/// [`etcd`]), a key prefix of its own on the shared cluster.
pub fn locksvc_cmd(dir: &Path, extra_env: &[(&str, &str)]) -> Command {
    let mut cmd = fencegate();
    cmd.args(["locksvc", "--listen", "127.0.0.1:0", "--db"])
        .arg(dir.join("locksvc.db"))
        .env("FENCEGATE_SIGNING_KEYS", SIGNING_KEY)
        .env("FENCEGATE_LOG", "warn");
    if etcd::lease_backend() == etcd::LeaseBackend::Etcd {
        cmd.envs(etcd::shared_env(dir));
    } else {
        // On etcd the flag is refused: there is no database file.
        cmd.arg("--create-db");
    }
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    cmd
}

/// A lease service of the test's own in a new directory, and a client of
/// it: keep the directory and the service alive while the test runs.
pub fn fresh_locksvc() -> (tempfile::TempDir, Service, Api) {
    let dir = tempdir();
    let svc = start_locksvc(dir.path());
    let api = Api::new(&svc.url);
    (dir, svc, api)
}

/// Writes `text` to the file `name` in `dir`; its path.
pub fn write_file(dir: &Path, name: &str, text: impl AsRef<[u8]>) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("temp file written");
    path
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

    /// Sends `body`, one of the API's wire types (`fencegate_lease_api`).
    pub fn send(&self, method: &str, path: &str, body: &impl serde::Serialize) -> (u16, Value) {
        let body = serde_json::to_string(body).expect("a wire type encodes");
        self.raw(method, path, Some(&body))
    }

    pub fn acquire(&self, lock: &str, owner: &str, ttl_ms: u64) -> (u16, Value) {
        self.acquire_as(lock, owner, Some(ttl_ms), None, None)
    }

    pub fn acquire_wait(&self, lock: &str, owner: &str, ttl_ms: u64, wait_ms: u64) -> (u16, Value) {
        self.acquire_as(lock, owner, Some(ttl_ms), Some(wait_ms), None)
    }

    fn acquire_as(
        &self,
        lock: &str,
        owner: &str,
        ttl_ms: Option<u64>,
        wait_ms: Option<u64>,
        idempotency_key: Option<&str>,
    ) -> (u16, Value) {
        let req = fencegate_lease_api::AcquireRequest {
            owner: owner.to_owned(),
            ttl_ms,
            wait_ms,
            idempotency_key: idempotency_key.map(str::to_owned),
        };
        self.send("POST", &fencegate_lease_api::path::acquire(lock), &req)
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
        self.acquire_as(lock, owner, Some(ttl_ms), None, Some(key))
    }

    /// Renew, proven by `token`: the signed `fencing_token` of the lease
    /// (see [`signed_of`]), or any JSON value an adversarial test sends
    /// (which is why the body is not a `RenewRequest`: that type cannot
    /// hold a malformed token).
    pub fn renew(&self, lock: &str, token: impl Into<Value>, ttl_ms: u64) -> (u16, Value) {
        self.raw(
            "POST",
            &fencegate_lease_api::path::renew(lock),
            Some(&json!({"token": token.into(), "ttl_ms": ttl_ms}).to_string()),
        )
    }

    /// Release, proven by `token` (as for [`Api::renew`]).
    pub fn release(&self, lock: &str, token: impl Into<Value>) -> (u16, Value) {
        self.raw(
            "POST",
            &fencegate_lease_api::path::release(lock),
            Some(&json!({"token": token.into()}).to_string()),
        )
    }

    /// Waits (up to 30 s, else fails) until `n` acquires wait in line for
    /// `lock`.
    pub fn wait_for_waiting(&self, lock: &str, n: u64) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let (_, st) = self.status(lock);
            if st["waiting"].as_u64() == Some(n) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "never {n} waiting: {st}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Fails unless no lease holds `lock`; `why` says what freed it.
    #[track_caller]
    pub fn assert_free(&self, lock: &str, why: &str) {
        let (_, st) = self.status(lock);
        assert_eq!(st["held"], false, "{why}: {st}");
    }

    pub fn status(&self, lock: &str) -> (u16, Value) {
        self.raw("GET", &fencegate_lease_api::path::status(lock), None)
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

/// One sample: name, labels (sorted), value.
type Sample = (String, Vec<(String, String)>, f64);

/// A Prometheus text exposition, parsed so that a test reads the exact
/// value of one series (a substring such as `_total 1` would also match
/// 10 to 19, and a misspelt name would read as absent).
#[derive(Debug)]
pub struct Metrics {
    text: String,
    /// Metric family names declared by `# TYPE` lines.
    families: Vec<String>,
    samples: Vec<Sample>,
}

impl Metrics {
    /// Fetches `url` (a `/metrics` endpoint) with a blocking client.
    pub fn fetch(url: &str) -> Metrics {
        let text = reqwest::blocking::get(url)
            .and_then(|r| r.error_for_status())
            .and_then(|r| r.text())
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        Metrics::parse(&text)
    }

    pub fn parse(text: &str) -> Metrics {
        let mut families = Vec::new();
        let mut samples = Vec::new();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest
                    .split_whitespace()
                    .next()
                    .expect("a TYPE line names a family");
                families.push(name.to_owned());
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            samples.push(parse_sample(line));
        }
        Metrics {
            text: text.to_owned(),
            families,
            samples,
        }
    }

    /// The value of exactly the series `name{labels}` (labels in any order,
    /// no others), `None` if the family exists but has no such series yet
    /// (a labelled counter appears at its first increment). Panics if no
    /// family declares `name`, or if the series appears twice.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let declared = self.families.iter().any(|f| {
            name.strip_prefix(f.as_str()).is_some_and(|suffix| {
                [
                    "", "_total", "_count", "_sum", "_bucket", "_created", "_info",
                ]
                .contains(&suffix)
            })
        });
        assert!(declared, "no metric family declares {name}:\n{}", self.text);
        let mut want: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        want.sort();
        let mut found = self
            .samples
            .iter()
            .filter(|(n, l, _)| n == name && *l == want)
            .map(|(_, _, v)| *v);
        let value = found.next();
        assert!(
            found.next().is_none(),
            "series {name}{labels:?} appears twice:\n{}",
            self.text
        );
        value
    }

    /// [`Metrics::get`] of a counter or gauge that must exist, as an integer.
    pub fn count(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let v = self
            .get(name, labels)
            .unwrap_or_else(|| panic!("no series {name}{labels:?} in:\n{}", self.text));
        assert!(
            v >= 0.0 && v.fract() == 0.0,
            "{name}{labels:?} = {v} is not a count"
        );
        v as u64
    }
}

/// One sample line: `name{a="x",b="y"} value [timestamp]`.
fn parse_sample(line: &str) -> Sample {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = line[..name_end].to_owned();
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices().peekable();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            if c == '}' {
                end = Some(i);
                break;
            }
            if c == ',' || c == ' ' {
                continue;
            }
            // A label: key="value" with \\, \" and \n escapes.
            let mut key = String::from(c);
            for (_, c) in chars.by_ref() {
                if c == '=' {
                    break;
                }
                key.push(c);
            }
            assert_eq!(
                chars.next().map(|(_, c)| c),
                Some('"'),
                "bad label in {line:?}"
            );
            let mut value = String::new();
            loop {
                match chars.next().map(|(_, c)| c) {
                    Some('"') => break,
                    Some('\\') => match chars.next().map(|(_, c)| c) {
                        Some('n') => value.push('\n'),
                        Some(c) => value.push(c),
                        None => panic!("bad escape in {line:?}"),
                    },
                    Some(c) => value.push(c),
                    None => panic!("unterminated label value in {line:?}"),
                }
            }
            labels.push((key.trim().to_owned(), value));
        }
        let end = end.unwrap_or_else(|| panic!("unterminated labels in {line:?}"));
        rest = &body[end + 1..];
    }
    let value = rest
        .split_whitespace()
        .next()
        .unwrap_or_else(|| panic!("no value in {line:?}"));
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v
            .parse()
            .unwrap_or_else(|_| panic!("bad value {v:?} in {line:?}")),
    };
    labels.sort();
    (name, labels, value)
}

/// `fencegate run ARGS` against the lease service at `locksvc`.
pub fn run_cmd(locksvc: &str, args: &[&str]) -> Command {
    let mut cmd = fencegate();
    cmd.arg("run")
        .args(args)
        .env("FENCEGATE_LOCKSVC", locksvc)
        .env("FENCEGATE_LOG", "warn");
    cmd
}

/// The `content-length` of a response or request head (0 if none).
pub fn content_length(head: &str) -> usize {
    head.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0)
}

/// One HTTP/1.1 response read from `s`: its status and its body
/// (`content-length` bytes).
pub fn read_response(s: &mut impl std::io::Read) -> Option<(u16, String)> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    let head = String::from_utf8(head).ok()?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let mut body = vec![0u8; content_length(&head)];
    s.read_exact(&mut body).ok()?;
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}

/// A role env file's `KEY='value'` lines (`fencegate run --env-file`).
pub fn role_env(path: &Path) -> std::collections::HashMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.trim_matches('\'').to_owned()))
        .collect()
}

/// Waits up to 20 s for `path` to exist.
pub async fn wait_for_file(path: &Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !path.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// `child`'s exit status, if it exits within `limit`; else it is killed
/// and the test fails.
pub fn exits_within(child: &mut Child, limit: std::time::Duration) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            panic!("the process did not exit within {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Runs the end-to-end script `script` (a path in the repository) with
/// the fencegate binary, a fresh work directory and `args`; fails the test
/// with the script's whole output unless it exits 0.
pub fn run_script(script: &str, args: &[String]) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(script);
    let work = tempfile::tempdir().expect("tempdir");
    let out = Command::new("bash")
        .arg(&path)
        .arg(env!("CARGO_BIN_EXE_fencegate"))
        .arg(work.path())
        .args(args)
        .env_remove("FENCEGATE_LOG")
        .output()
        .unwrap_or_else(|e| panic!("{script} runs: {e}"));
    assert!(out.status.success(), "{}", output_text(&out));
}

/// A child process in a group of its own: continued, and the whole group
/// killed, when dropped.
pub struct KillOnDrop(pub std::process::Child);

impl KillOnDrop {
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.0.id()).expect("pid"));
        nix::sys::signal::kill(pid, sig).expect("signal delivered");
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGCONT);
        let group = nix::unistd::Pid::from_raw(i32::try_from(self.0.id()).expect("pid"));
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.0.wait();
    }
}

/// One HTTP/1.1 answer read from a raw connection: its head and its
/// `Content-Length` body (none without one: a chunked body is not read),
/// however many reads TCP splits them into. `Err` says why it is not whole
/// (the connection ended or failed first, or `within` passed) and what was
/// read.
pub async fn read_answer<R: tokio::io::AsyncRead + Unpin>(
    conn: &mut R,
    within: std::time::Duration,
) -> Result<String, String> {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    let read = tokio::time::timeout(within, async {
        loop {
            if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
                let len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                if got.len() >= end + 4 + len {
                    return Ok(());
                }
            }
            match conn.read(&mut buf).await {
                Ok(0) => return Err("the connection closed".to_owned()),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => return Err(format!("the read failed: {e}")),
            }
        }
    })
    .await
    .unwrap_or_else(|_| Err(format!("no whole answer within {within:?}")));
    let text = String::from_utf8_lossy(&got).into_owned();
    match read {
        Ok(()) => Ok(text),
        Err(why) => Err(format!("{why}, after: {text:?}")),
    }
}
