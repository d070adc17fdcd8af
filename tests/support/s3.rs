//! S3 backends and proxies for tests: real servers on real sockets.
//!
//! - [`BackendKind::S3Fs`]: s3s-fs served in this test process;
//! - [`BackendKind::Moto`]: `moto_server` (installed by scripts/test.sh into
//!   `.venv`; `FENCEGATE_MOTO_SERVER` may point elsewhere);
//! - [`BackendKind::Rgw`]: Ceph RGW 16.2, a production S3 server (Debian
//!   packages installed by scripts/install-test-tools.sh): one single-node
//!   cluster per test binary, started on first use by
//!   `tests/support/ceph-rgw.sh`, which stops it when the binary exits;
//!   each backend is a user of its own tenant, so tests sharing the
//!   cluster share no bucket;
//! - [`Backend::start_ignoring_conditions`]: s3s-fs behind a layer that drops
//!   `If-Match` / `If-None-Match`, like stores that accept and ignore them.

use super::{SIGNING_KEY, Service, fencegate, without_fencegate_env};

use aws_sdk_s3::error::ProvideErrorMetadata as _;
use s3s::dto::*;
use s3s::service::S3ServiceBuilder;
use s3s::{S3, S3Request, S3Response, S3Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

pub const BACKEND_KEY: (&str, &str) = ("backend-key", "backend-secret-123");
pub const CLIENT_KEY: (&str, &str) = ("client-key", "client-secret-123");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    S3Fs,
    Moto,
    Rgw,
}

/// A running S3 server.
#[derive(Debug)]
pub struct Backend {
    pub kind: BackendKind,
    pub endpoint: String,
    /// The credentials of this backend's user (on RGW, one per backend).
    pub key: (String, String),
    _dir: Option<tempfile::TempDir>,
    process: Option<Child>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Some(p) = &mut self.process {
            let _ = p.kill();
            let _ = p.wait();
        }
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

fn owned((a, b): (&str, &str)) -> (String, String) {
    (a.to_owned(), b.to_owned())
}

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Where moto_server is; fails loudly (never skips) if it is not installed.
pub fn moto_server() -> PathBuf {
    if let Ok(p) = std::env::var("FENCEGATE_MOTO_SERVER") {
        return PathBuf::from(p);
    }
    let p = workspace_root().join(".venv/bin/moto_server");
    assert!(
        p.exists(),
        "moto_server is not installed at {}: run scripts/test.sh (it installs moto into .venv) or set FENCEGATE_MOTO_SERVER",
        p.display()
    );
    p
}

/// The venv's python (boto3 installed), for client tests.
pub fn venv_bin(name: &str) -> PathBuf {
    let p = workspace_root().join(".venv/bin").join(name);
    assert!(
        p.exists(),
        "{} is missing: run scripts/test.sh to install the test tools",
        p.display()
    );
    p
}

/// The Ceph RGW cluster of this test binary.
#[derive(Debug)]
struct RgwCluster {
    dir: PathBuf,
    endpoint: String,
}

fn ceph_rgw_script() -> PathBuf {
    workspace_root().join("tests/support/ceph-rgw.sh")
}

/// Starts the cluster (about 14 s): the script prints its endpoint once
/// RGW answers, and watches this process, killing the daemons and removing
/// the directory when it is gone. Fails loudly if Ceph is not installed.
fn start_rgw_cluster() -> RgwCluster {
    use std::io::{BufRead as _, BufReader};
    assert!(
        Path::new("/usr/bin/radosgw").exists(),
        "Ceph RGW is not installed (/usr/bin/radosgw): run scripts/test.sh (scripts/install-test-tools.sh installs it)"
    );
    let dir = std::env::temp_dir().join(format!("fencegate-rgw-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cmd = Command::new(ceph_rgw_script());
    without_fencegate_env(&mut cmd);
    let mut child = cmd
        .arg(&dir)
        .arg(std::process::id().to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tests/support/ceph-rgw.sh starts");
    // Its stderr is passed on, and its last lines kept: if the cluster
    // does not start, they are the panic's message, which every RGW test
    // of this binary then repeats (a CI log shows a failure's message
    // before any other output).
    let said: std::sync::Arc<parking_lot::Mutex<std::collections::VecDeque<String>>> =
        std::sync::Arc::default();
    let stderr = BufReader::new(child.stderr.take().expect("stderr piped"));
    let stderr_done = {
        let said = said.clone();
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                eprintln!("{line}");
                let mut said = said.lock();
                if said.len() == 80 {
                    said.pop_front();
                }
                said.push_back(line);
            }
        })
    };
    let mut lines = BufReader::new(child.stdout.take().expect("stdout piped")).lines();
    let endpoint = loop {
        match lines.next() {
            Some(Ok(line)) => {
                if let Some(e) = line.strip_prefix("endpoint ") {
                    break e.trim().to_owned();
                }
            }
            _ => {
                let status = child.wait();
                // Its last lines, unless a daemon it left holds the pipe.
                let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
                while !stderr_done.is_finished() && std::time::Instant::now() < until {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                let said = said.lock();
                panic!(
                    "Ceph RGW did not start (tests/support/ceph-rgw.sh: {status:?}); the end of what it said:\n{}",
                    Vec::from(said.clone()).join("\n")
                )
            }
        }
    };
    std::thread::spawn(move || for _ in lines {});
    // The script lives as long as this process; it is never waited for.
    std::mem::forget(child);
    RgwCluster { dir, endpoint }
}

/// The cluster, or why it did not start (so that later tests fail at once
/// instead of waiting for a start that failed already).
static RGW: std::sync::OnceLock<Result<RgwCluster, String>> = std::sync::OnceLock::new();
static RGW_USERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A fresh user in a tenant of its own on this binary's RGW cluster: its
/// endpoint and key.
fn rgw_user() -> (String, (String, String)) {
    let cluster = match RGW.get_or_init(|| {
        std::panic::catch_unwind(start_rgw_cluster).map_err(|p| {
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "Ceph RGW did not start".to_owned())
        })
    }) {
        Ok(c) => c,
        Err(why) => panic!("{why}"),
    };
    let n = RGW_USERS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let tenant = format!("t{n}");
    let key = (format!("rgw-key-{n}"), format!("rgw-secret-{n}-0123456789"));
    super::succeeds(
        Command::new(ceph_rgw_script())
            .arg("user")
            .arg(&cluster.dir)
            .args([&tenant, &key.0, &key.1]),
        "ceph-rgw.sh user (creating an RGW user)",
    );
    (cluster.endpoint.clone(), key)
}

/// Starts moto_server on port 0 and reads back the port it bound: werkzeug
/// logs ` * Running on http://127.0.0.1:PORT` on stderr once it listens. No
/// port number is ever guessed free and then bound by someone else.
fn start_moto() -> (Child, u16) {
    use std::io::{BufRead as _, BufReader};
    let mut cmd = Command::new(moto_server());
    without_fencegate_env(&mut cmd);
    let mut child = cmd
        .args(["-H", "127.0.0.1", "-p", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("moto_server starts");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr piped")).lines();
    let mut seen = Vec::new();
    let port = loop {
        let Some(Ok(line)) = lines.next() else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("moto_server stopped before listening: {seen:?}");
        };
        let port = line
            .split(" * Running on http://127.0.0.1:")
            .nth(1)
            .and_then(|p| p.trim().parse().ok());
        if let Some(port) = port {
            break port;
        }
        seen.push(line);
    };
    // moto logs every request: keep draining so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (child, port)
}

/// s3s-fs that answers every multipart call 501 (the S3 trait's default).
#[derive(Debug)]
struct NoMultipart(s3s_fs::FileSystem);

impl NoMultipart {
    fn fs(&self) -> &s3s_fs::FileSystem {
        &self.0
    }
}

#[async_trait::async_trait]
impl S3 for NoMultipart {
    fencegate_proxy::forward_s3! { fs => std::convert::identity;
        put_object: PutObjectInput => PutObjectOutput;
        head_object: HeadObjectInput => HeadObjectOutput;
        get_object: GetObjectInput => GetObjectOutput;
        delete_object: DeleteObjectInput => DeleteObjectOutput;
        create_bucket: CreateBucketInput => CreateBucketOutput;
    }
}

/// s3s-fs with conditional headers removed before they reach it.
#[derive(Debug)]
struct IgnoresConditions(s3s_fs::FileSystem);

impl IgnoresConditions {
    fn fs(&self) -> &s3s_fs::FileSystem {
        &self.0
    }
}

#[async_trait::async_trait]
impl S3 for IgnoresConditions {
    async fn put_object(
        &self,
        mut req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        req.input.if_match = None;
        req.input.if_none_match = None;
        self.0.put_object(req).await
    }
    async fn complete_multipart_upload(
        &self,
        mut req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        req.input.if_match = None;
        req.input.if_none_match = None;
        self.0.complete_multipart_upload(req).await
    }
    fencegate_proxy::forward_s3! { fs => std::convert::identity;
        head_object: HeadObjectInput => HeadObjectOutput;
        get_object: GetObjectInput => GetObjectOutput;
        delete_object: DeleteObjectInput => DeleteObjectOutput;
        create_bucket: CreateBucketInput => CreateBucketOutput;
        create_multipart_upload: CreateMultipartUploadInput => CreateMultipartUploadOutput;
        upload_part: UploadPartInput => UploadPartOutput;
        abort_multipart_upload: AbortMultipartUploadInput => AbortMultipartUploadOutput;
    }
}

/// How an emulated store misreads `If-Match` on PutObject (s3s-fs behind
/// a layer that reads the raw header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OddIfMatch {
    /// A bare ETag is ignored and a quoted one honoured: answers that
    /// contradict each other.
    IgnoresBare,
    /// Every `If-Match` is refused (412), even the right ETag in either
    /// spelling.
    RefusesAll,
}

#[derive(Debug)]
struct OddStore(s3s_fs::FileSystem, OddIfMatch);

impl OddStore {
    fn fs(&self) -> &s3s_fs::FileSystem {
        &self.0
    }
}

#[async_trait::async_trait]
impl S3 for OddStore {
    async fn put_object(
        &self,
        mut req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        if let Some(raw) = req.headers.get("if-match") {
            match self.1 {
                OddIfMatch::IgnoresBare if !raw.as_bytes().starts_with(b"\"") => {
                    req.input.if_match = None;
                }
                OddIfMatch::RefusesAll => {
                    return Err(s3s::s3_error!(PreconditionFailed));
                }
                OddIfMatch::IgnoresBare => {}
            }
        }
        self.0.put_object(req).await
    }
    fencegate_proxy::forward_s3! { fs => std::convert::identity;
        head_object: HeadObjectInput => HeadObjectOutput;
        head_bucket: HeadBucketInput => HeadBucketOutput;
        get_object: GetObjectInput => GetObjectOutput;
        delete_object: DeleteObjectInput => DeleteObjectOutput;
        copy_object: CopyObjectInput => CopyObjectOutput;
        create_bucket: CreateBucketInput => CreateBucketOutput;
        create_multipart_upload: CreateMultipartUploadInput => CreateMultipartUploadOutput;
        upload_part: UploadPartInput => UploadPartOutput;
        complete_multipart_upload: CompleteMultipartUploadInput => CompleteMultipartUploadOutput;
        abort_multipart_upload: AbortMultipartUploadInput => AbortMultipartUploadOutput;
    }
}

impl Backend {
    /// An s3s-fs that misreads `If-Match` on PutObject as `odd` says.
    pub async fn start_odd(odd: OddIfMatch) -> Backend {
        let dir = tempfile::tempdir().expect("tempdir");
        let fs = s3s_fs::FileSystem::new(dir.path()).expect("s3s-fs root");
        Backend::serve(
            BackendKind::S3Fs,
            dir,
            S3ServiceBuilder::new(OddStore(fs, odd)),
        )
        .await
    }

    pub async fn start(kind: BackendKind) -> Backend {
        match kind {
            BackendKind::S3Fs => {
                let dir = tempfile::tempdir().expect("tempdir");
                let fs = fencegate_proxy::devstore::DevStore::new(dir.path()).expect("s3s-fs root");
                Backend::serve(kind, dir, S3ServiceBuilder::new(fs)).await
            }
            BackendKind::Moto => {
                let (process, port) = tokio::task::spawn_blocking(start_moto)
                    .await
                    .expect("moto_server started");
                Backend {
                    kind,
                    endpoint: format!("http://127.0.0.1:{port}"),
                    key: owned(BACKEND_KEY),
                    _dir: None,
                    process: Some(process),
                    task: None,
                }
            }
            BackendKind::Rgw => {
                let (endpoint, key) = tokio::task::spawn_blocking(rgw_user)
                    .await
                    .expect("RGW user created");
                Backend {
                    kind,
                    endpoint,
                    key,
                    _dir: None,
                    process: None,
                    task: None,
                }
            }
        }
    }

    /// An s3s-fs that silently ignores conditional headers.
    pub async fn start_ignoring_conditions() -> Backend {
        let dir = tempfile::tempdir().expect("tempdir");
        let fs = s3s_fs::FileSystem::new(dir.path()).expect("s3s-fs root");
        Backend::serve(
            BackendKind::S3Fs,
            dir,
            S3ServiceBuilder::new(IgnoresConditions(fs)),
        )
        .await
    }

    /// An s3s-fs without multipart uploads (S3's default: 501), like a
    /// minimal S3 server.
    pub async fn start_without_multipart() -> Backend {
        let dir = tempfile::tempdir().expect("tempdir");
        let fs = s3s_fs::FileSystem::new(dir.path()).expect("s3s-fs root");
        Backend::serve(
            BackendKind::S3Fs,
            dir,
            S3ServiceBuilder::new(NoMultipart(fs)),
        )
        .await
    }

    async fn serve(
        kind: BackendKind,
        dir: tempfile::TempDir,
        mut builder: S3ServiceBuilder,
    ) -> Backend {
        builder.set_auth(s3s::auth::SimpleAuth::from_single(
            BACKEND_KEY.0,
            BACKEND_KEY.1,
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(fencegate_proxy::server::serve_service(
            listener,
            builder.build(),
            std::future::pending(),
        ));
        Backend {
            kind,
            endpoint: format!("http://{addr}"),
            key: owned(BACKEND_KEY),
            _dir: Some(dir),
            process: None,
            task: Some(task),
        }
    }

    /// A client straight to the backend (no fencing).
    pub fn direct(&self) -> aws_sdk_s3::Client {
        sdk_client(&self.endpoint, (&self.key.0, &self.key.1))
    }

    pub async fn create_bucket(&self, bucket: &str) {
        self.direct()
            .create_bucket()
            .bucket(bucket)
            .send()
            .await
            .unwrap_or_else(|e| panic!("create bucket {bucket}: {e:?}"));
    }

    /// Whether `bucket` exists on this server (asked directly).
    pub async fn bucket_exists(&self, bucket: &str) -> bool {
        self.direct()
            .head_bucket()
            .bucket(bucket)
            .send()
            .await
            .is_ok()
    }
}

/// An S3 client for `endpoint` with path-style addressing and no retries
/// (so a test sees every answer).
pub fn sdk_client(endpoint: &str, key: (&str, &str)) -> aws_sdk_s3::Client {
    aws_sdk_s3::Client::from_conf(
        fencegate_testkit::s3::client_config(endpoint, key, "test").build(),
    )
}

/// A proxy process in front of a backend.
#[derive(Debug)]
pub struct Proxy {
    pub service: Option<Service>,
    pub url: String,
    pub config: PathBuf,
}

/// The default proxy config for tests: client keys, anonymous allowed,
/// signed tokens required, probe on `bucket`.
pub fn proxy_toml(backend: &Backend, dir: &Path, bucket: &str, extra: &str) -> String {
    fencegate_testkit::config::ProxyToml {
        db: &dir.join("proxy.db"),
        signing_key: SIGNING_KEY,
        probe_bucket: bucket,
        endpoint: &backend.endpoint,
        backend_key: (&backend.key.0, &backend.key.1),
        client_key: CLIENT_KEY,
        extra: &format!("allow_anonymous = true\n{extra}"),
    }
    .text()
}

/// [`proxy_toml`] with the backend reached at `endpoint` (a relay in front
/// of it, or the backend itself) and `backend_options` (lines of
/// `[backend]`, such as `timeout_secs = 1`) added.
pub fn proxy_toml_to(
    backend: &Backend,
    dir: &Path,
    bucket: &str,
    endpoint: &str,
    backend_options: &str,
) -> String {
    proxy_toml(backend, dir, bucket, "").replace(
        &format!("endpoint = \"{}\"", backend.endpoint),
        &format!("endpoint = \"{endpoint}\"\n{backend_options}"),
    )
}

pub fn proxy_cmd(config: &Path) -> Command {
    fencegate_testkit::config::proxy_command(fencegate(), config)
}

impl Proxy {
    /// Writes the config and starts the proxy.
    pub async fn start(toml: &str, dir: &Path) -> Proxy {
        let config = dir.join(format!("proxy-{}.toml", std::process::id()));
        std::fs::write(&config, toml).expect("write config");
        let mut p = Proxy {
            service: None,
            url: String::new(),
            config,
        };
        p.restart().await;
        p
    }

    /// (Re)starts the process on a new port.
    pub async fn restart(&mut self) {
        let config = self.config.clone();
        let service = tokio::task::spawn_blocking(move || Service::start(proxy_cmd(&config)))
            .await
            .expect("started");
        self.url = service.url.clone();
        self.service = Some(service);
    }

    pub fn kill9(&mut self) {
        if let Some(s) = &mut self.service {
            s.kill9();
        }
        self.service = None;
    }

    /// A graceful stop (SIGTERM), waited for.
    pub fn terminate(&mut self) {
        if let Some(s) = &mut self.service {
            s.terminate();
        }
        self.service = None;
    }

    /// A signed S3 client through the proxy.
    pub fn client(&self) -> aws_sdk_s3::Client {
        sdk_client(&self.url, CLIENT_KEY)
    }

    /// The proxy's /_fencegate/status document.
    pub async fn status(&self) -> serde_json::Value {
        reqwest::get(format!("{}/_fencegate/status", self.url))
            .await
            .expect("status")
            .json()
            .await
            .expect("json")
    }

    /// The proxy's status page (open: the harness's proxies serve
    /// anonymous requests and have no viewers).
    pub async fn page(&self) -> String {
        reqwest::get(format!("{}/_fencegate/", self.url))
            .await
            .expect("page")
            .text()
            .await
            .expect("html")
    }

    /// The proxy's metrics.
    pub async fn metrics(&self) -> super::Metrics {
        let text = reqwest::get(format!("{}/_fencegate/metrics", self.url))
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text");
        super::Metrics::parse(&text)
    }

    /// The value of exactly the series `name{labels}` in the proxy's
    /// metrics (see [`super::Metrics::get`]).
    pub async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.metrics().await.get(name, labels)
    }

    /// Waits (up to 30 s) until `n` fenced writes are in flight: the
    /// proxy admitted them and holds their keys.
    pub async fn wait_for_inflight_writes(&self, n: u64) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let now = self.metric("fencegate_proxy_inflight_writes", &[]).await;
            if now == Some(n as f64) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{n} writes never got in flight (inflight_writes {now:?})"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Waits up to 10 s for the proxy's max of `lock` to be `max`.
    pub async fn wait_for_max(&self, lock: &str, max: u64) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let now = self.max_token(lock).await;
            if now == Some(max) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the fence of {lock} never reached {max}: it is at {now:?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// An anonymous PUT of `bucket/key` with `token` that sends 64 KiB of
    /// its 256 KiB and waits (see [`Stalled`]), once the proxy counts it in
    /// flight.
    pub async fn stalled_put(&self, (bucket, key): (&str, &str), token: &str) -> Stalled {
        let upload = Stalled::start(&self.url, (bucket, key), token, (64 * 1024, 256 * 1024));
        self.wait_for_inflight_writes(1).await;
        upload
    }

    /// The max token the proxy holds for `lock`: `None` when the status
    /// does not list the lock (no write in its scopes reached the fence),
    /// `Some(0)` when it is listed without an admitted token.
    pub async fn max_token(&self, lock: &str) -> Option<u64> {
        let st = self.status().await;
        let listed = st["locks"]
            .as_array()
            .unwrap_or_else(|| panic!("status has no locks list: {st}"))
            .iter()
            .find(|s| s["lock"] == lock)?;
        Some(
            listed["max_token"]
                .as_u64()
                .unwrap_or_else(|| panic!("lock {lock} without a numeric max_token: {st}")),
        )
    }
}

/// Signs `token` for `lock` with the test key, as the lease service would.
pub fn signed(lock: &str, token: u64) -> String {
    super::test_keys()
        .sign(&fencegate_core::LockName::new(lock).expect("lock"), token)
        .to_string()
}

/// Adds `Fencing-Token: <token>` to an SDK request.
#[macro_export]
macro_rules! fenced {
    ($builder:expr, $token:expr) => {{
        let value = http::HeaderValue::from_str(&*$token).expect("header value");
        $builder.customize().mutate_request(move |req| {
            req.headers_mut().insert("fencing-token", value.clone());
        })
    }};
}

/// Sends `$builder` with `Fencing-Token: $token` and expects a refusal
/// (`$why` says which): its status and S3 code.
#[macro_export]
macro_rules! refusal_of {
    ($builder:expr, $token:expr, $why:expr) => {{
        let e = fenced!($builder, $token).send().await.expect_err($why);
        $crate::support::s3::error_of(&e)
    }};
}

/// The S3 error code and HTTP status of an SDK error.
pub fn error_of<E: aws_sdk_s3::error::ProvideErrorMetadata, R>(
    e: &aws_sdk_s3::error::SdkError<E, R>,
) -> (Option<u16>, String)
where
    R: HasStatus + std::fmt::Debug,
{
    (
        e.raw_response().map(HasStatus::status),
        e.code().unwrap_or("").to_owned(),
    )
}

pub trait HasStatus {
    fn status(&self) -> u16;
}

impl HasStatus for aws_smithy_runtime_api::http::Response {
    fn status(&self) -> u16 {
        self.status().as_u16()
    }
}

/// The bytes and token metadata of an object, read straight from the backend.
pub async fn stored(backend: &Backend, bucket: &str, key: &str) -> Option<(Vec<u8>, Option<u64>)> {
    match backend
        .direct()
        .get_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
    {
        Ok(out) => {
            let token = out
                .metadata()
                .and_then(|m| m.get("fencing-token"))
                .and_then(|t| t.parse().ok());
            let body = out
                .body
                .collect()
                .await
                .expect("body")
                .into_bytes()
                .to_vec();
            Some((body, token))
        }
        Err(e) => {
            let (status, _) = error_of(&e);
            assert_eq!(status, Some(404), "unexpected backend error {e:?}");
            None
        }
    }
}

/// The token metadata of an object (HEAD straight to the backend).
/// Fails unless the backend holds `body` at `bucket/key`, tagged with
/// `token`.
pub async fn assert_stored(backend: &Backend, bucket: &str, key: &str, body: &[u8], token: u64) {
    assert_stored_as(backend, bucket, key, body, token, "").await;
}

/// [`assert_stored`], saying `why` on failure.
pub async fn assert_stored_as(
    backend: &Backend,
    bucket: &str,
    key: &str,
    body: &[u8],
    token: u64,
    why: &str,
) {
    assert_eq!(
        stored(backend, bucket, key).await,
        Some((body.to_vec(), Some(token))),
        "{bucket}/{key}: {why}"
    );
}

/// Creates a multipart upload of `key` in [`BUCKET`](super::harness::BUCKET)
/// through `client` with `Fencing-Token: token`; its upload id.
pub async fn create_upload(client: &aws_sdk_s3::Client, key: &str, token: &str) -> String {
    let req = client
        .create_multipart_upload()
        .bucket(super::harness::BUCKET)
        .key(key);
    let created = fenced!(req, token.to_owned())
        .send()
        .await
        .unwrap_or_else(|e| panic!("create an upload of {key}: {e:?}"));
    created.upload_id().expect("upload id").to_owned()
}

/// Part `n` of upload `id` of `key` in [`BUCKET`](super::harness::BUCKET),
/// to be given its body and sent.
pub fn part_of(
    client: &aws_sdk_s3::Client,
    key: &str,
    id: &str,
    n: i32,
) -> aws_sdk_s3::operation::upload_part::builders::UploadPartFluentBuilder {
    client
        .upload_part()
        .bucket(super::harness::BUCKET)
        .key(key)
        .upload_id(id)
        .part_number(n)
}

/// Completes upload `id` of `key` in [`BUCKET`](super::harness::BUCKET)
/// with parts `1..` of these ETags, through `client` with
/// `Fencing-Token: token`.
pub async fn complete_upload(
    client: &aws_sdk_s3::Client,
    key: &str,
    id: &str,
    e_tags: &[&str],
    token: &str,
) -> Result<
    aws_sdk_s3::operation::complete_multipart_upload::CompleteMultipartUploadOutput,
    aws_sdk_s3::error::SdkError<
        aws_sdk_s3::operation::complete_multipart_upload::CompleteMultipartUploadError,
        aws_smithy_runtime_api::client::orchestrator::HttpResponse,
    >,
> {
    let parts = fencegate_testkit::s3::completed_parts(e_tags.iter().copied().map(Some));
    let req = client
        .complete_multipart_upload()
        .bucket(super::harness::BUCKET)
        .key(key)
        .upload_id(id)
        .multipart_upload(parts);
    fenced!(req, token.to_owned()).send().await
}

/// The body the backend holds at `bucket/key`, token or not.
pub async fn stored_body(backend: &Backend, bucket: &str, key: &str) -> Option<Vec<u8>> {
    stored(backend, bucket, key).await.map(|(body, _)| body)
}

pub async fn stored_token(backend: &Backend, bucket: &str, key: &str) -> Option<u64> {
    match read_token(&backend.direct(), bucket, key).await {
        Ok(Read::Token(t)) => Some(t),
        Ok(Read::Missing | Read::NoToken) => None,
        Err(e) => panic!("HEAD {bucket}/{key} on the backend: {e}"),
    }
}

/// What a HEAD straight to the backend found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    Token(u64),
    /// 404: not written yet.
    Missing,
    /// An object without token metadata.
    NoToken,
}

async fn read_token(direct: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Result<Read, String> {
    match direct.head_object().bucket(bucket).key(key).send().await {
        Ok(out) => match out.metadata().and_then(|m| m.get("fencing-token")) {
            None => Ok(Read::NoToken),
            Some(t) => t
                .parse()
                .map(Read::Token)
                .map_err(|_| format!("token metadata {t:?} is not a number")),
        },
        Err(e) => match error_of(&e) {
            (Some(404), _) => Ok(Read::Missing),
            other => Err(format!("{other:?}: {e:?}")),
        },
    }
}

/// Reads the stored tokens of `keys` straight from the backend, over and
/// over, while a test runs; [`TokenMonitor::stop`] says what it saw.
#[derive(Debug)]
pub struct TokenMonitor {
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<Observed>,
}

/// What a [`TokenMonitor`] saw.
#[derive(Debug, Default)]
pub struct Observed {
    /// Per key, every token read, in order.
    pub tokens: std::collections::HashMap<String, Vec<u64>>,
    /// Reads that no test run should produce: failed HEADs, unparsable
    /// tokens, and an object that vanished or lost its token after a token
    /// was seen (the tests using the monitor delete nothing; a token-less
    /// read is read again 50 ms later, since both stores show an overwrite
    /// without its metadata for an instant). A missing or token-less object
    /// before its first token is expected: s3s-fs renames the data into
    /// place before it writes the metadata.
    pub errors: Vec<String>,
    /// Full rounds over every key.
    pub rounds: usize,
}

impl TokenMonitor {
    pub fn start(backend: &Backend, bucket: &str, keys: &[String]) -> TokenMonitor {
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (direct, bucket, keys, stop) = (
            backend.direct(),
            bucket.to_owned(),
            keys.to_vec(),
            done.clone(),
        );
        let task = tokio::spawn(async move {
            let mut seen = Observed::default();
            // One more full round after the stop, so the final state of
            // every key is read.
            loop {
                let last = stop.load(std::sync::atomic::Ordering::Acquire);
                for k in &keys {
                    let had_token = seen.tokens.contains_key(k);
                    let mut read = read_token(&direct, &bucket, k).await;
                    if had_token && read == Ok(Read::NoToken) {
                        // Both stores show a key being overwritten for an
                        // instant without its metadata: moto's PUT inserts
                        // the new key, then sets its metadata; s3s-fs
                        // renames the data into place, then writes the
                        // metadata. Read again: a write that landed
                        // without a token stays that way.
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        read = read_token(&direct, &bucket, k).await;
                    }
                    match read {
                        Ok(Read::Token(t)) => seen.tokens.entry(k.clone()).or_default().push(t),
                        Ok(Read::Missing | Read::NoToken) if !had_token => {}
                        Ok(r) => seen.errors.push(format!("{k}: {r:?} after it had a token")),
                        Err(e) => seen.errors.push(format!("{k}: {e}")),
                    }
                }
                seen.rounds += 1;
                if last {
                    return seen;
                }
            }
        });
        TokenMonitor { done, task }
    }

    /// Stops after one more round, and returns what was seen.
    pub async fn stop(self) -> Observed {
        self.done.store(true, std::sync::atomic::Ordering::Release);
        self.task.await.expect("monitor")
    }

    /// Stops; asserts that the monitor watched (see
    /// [`Observed::assert_watched`]) and that no key's stored token ever
    /// went down.
    pub async fn assert_never_decreased(
        self,
        context: &str,
        written: &[String],
        min_samples: usize,
    ) {
        let seen = self.stop().await;
        seen.assert_watched(context, written, min_samples);
        let down = seen.decreases();
        assert!(
            down.is_empty(),
            "{context}: stored tokens went down: {down:?}"
        );
    }
}

impl Observed {
    /// Fails on any unexpected read, unless every key of `written` was read
    /// with a token at least `min_samples` times, and unless some stored
    /// token was seen to change (else the monitor did not watch the run,
    /// and "never decreased" would hold trivially).
    pub fn assert_watched(&self, context: &str, written: &[String], min_samples: usize) {
        assert!(
            self.errors.is_empty(),
            "{context}: the monitor read {} unexpected answers: {:?}",
            self.errors.len(),
            &self.errors[..self.errors.len().min(10)]
        );
        for k in written {
            let n = self.tokens.get(k).map_or(0, Vec::len);
            assert!(
                n >= min_samples,
                "{context}: the monitor read {k}'s token {n} times in {} rounds; at least {min_samples} needed",
                self.rounds
            );
        }
        assert!(
            self.tokens
                .values()
                .any(|t| t.windows(2).any(|w| w[0] != w[1])),
            "{context}: the monitor never saw a stored token change ({} rounds): it did not watch the writes",
            self.rounds
        );
    }

    /// Every (key, before, after) where a stored token was seen to go down.
    pub fn decreases(&self) -> Vec<(String, u64, u64)> {
        let mut down: Vec<(String, u64, u64)> = self
            .tokens
            .iter()
            .flat_map(|(k, t)| {
                t.windows(2)
                    .filter(|w| w[1] < w[0])
                    .map(|w| (k.clone(), w[0], w[1]))
                    .collect::<Vec<_>>()
            })
            .collect();
        down.sort();
        down
    }
}

/// The headers of a `method` request of `length` body bytes to `url`,
/// signed with `key` by `aws-sigv4` (the SDK's signer): `headers`, then
/// the date, `payload` as the payload hash (a hex SHA-256 or
/// `UNSIGNED-PAYLOAD`), and the signature (`host` and `content-length` are
/// signed and left to the sender).
#[allow(
    clippy::disallowed_methods,
    reason = "a client signs with the wall clock"
)]
pub fn sigv4_headers(
    key: (&str, &str),
    method: &str,
    url: &str,
    length: usize,
    headers: &[(&str, &str)],
    payload: &str,
) -> http::HeaderMap {
    use aws_sigv4::http_request::{SignableBody, SignableRequest, sign};
    let settings = fencegate_testkit::s3::signing_settings();
    let identity = fencegate_testkit::s3::identity(key);
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region("us-east-1")
        .name("s3")
        .time(std::time::SystemTime::now())
        .settings(settings)
        .build()
        .expect("params")
        .into();
    let host = url
        .trim_start_matches("http://")
        .trim_start_matches("https://")
        .split('/')
        .next()
        .expect("host");
    let length = length.to_string();
    let mut signed = vec![("host", host), ("content-length", length.as_str())];
    signed.extend_from_slice(headers);
    let signable = SignableRequest::new(
        method,
        url,
        signed.iter().copied(),
        SignableBody::Precomputed(payload.to_owned()),
    )
    .expect("signable");
    let (instructions, _) = sign(signable, &params).expect("sign").into_parts();
    let mut req = http::Request::builder()
        .method(method)
        .uri(url)
        .body(())
        .expect("request");
    for (k, v) in headers {
        req.headers_mut().insert(
            http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
            v.parse().expect("value"),
        );
    }
    instructions.apply_to_request_http1x(&mut req);
    req.headers().clone()
}

/// An anonymous PUT of `bucket/key` through `proxy` with
/// `Fencing-Token: token`: the status, the body and `Fencing-Max-Token`.
pub async fn anonymous_put(
    proxy: &Proxy,
    (bucket, key): (&str, &str),
    token: &str,
    body: String,
) -> (u16, String, Option<String>) {
    let r = reqwest::Client::new()
        .put(format!("{}/{bucket}/{key}", proxy.url))
        .header("fencing-token", token)
        .body(body)
        .send()
        .await
        .expect("the proxy answers");
    let max = r
        .headers()
        .get("fencing-max-token")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    (r.status().as_u16(), r.text().await.unwrap_or_default(), max)
}

/// An anonymous PUT of `total` bytes with `Fencing-Token: token`, of
/// which only `first` are sent until `rest` is signalled: a writer paused
/// in the middle of its upload. `answer` is its status (0: no answer).
pub struct Stalled {
    pub rest: tokio::sync::oneshot::Sender<()>,
    pub answer: tokio::task::JoinHandle<u16>,
}

impl Stalled {
    pub fn start(
        url: &str,
        (bucket, key): (&str, &str),
        token: &str,
        (first, total): (usize, usize),
    ) -> Stalled {
        use futures::StreamExt as _;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let head = vec![b's'; first];
        let tail = vec![b't'; total - first];
        let body = futures::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from(head))])
            .chain(futures::stream::once(async move {
                let _ = rx.await;
                Ok(bytes::Bytes::from(tail))
            }));
        let req = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(60))
            .build()
            .expect("client")
            .put(format!("{url}/{bucket}/{key}"))
            .header("fencing-token", token)
            .header("content-length", total.to_string())
            .body(reqwest::Body::wrap_stream(body));
        let answer =
            tokio::spawn(async move { req.send().await.map_or(0, |r| r.status().as_u16()) });
        Stalled { rest: tx, answer }
    }
}
