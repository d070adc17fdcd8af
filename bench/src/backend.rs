//! The S3 backend every benchmark writes to: `DevStore` (s3s-fs) on a temp
//! dir, served in this process on its own runtime (so the client's tasks
//! and the backend's do not share workers), behind a layer that counts
//! HTTP requests and S3 operations.

use fencegate_proxy::devstore::DevStore;
use http::Request;
use hyper::body::Incoming;
use parking_lot::Mutex;
use s3s::dto::*;
use s3s::service::{S3Service, S3ServiceBuilder};
use s3s::{S3, S3Request, S3Response, S3Result};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub const BACKEND_KEY: (&str, &str) = ("bench-backend-key", "bench-backend-secret-123");
pub const CLIENT_KEY: (&str, &str) = ("bench-client-key", "bench-client-secret-123");
pub const BUCKET: &str = "bench";

/// Requests the backend served.
#[derive(Debug, Default)]
pub struct Counters {
    http: AtomicU64,
    ops: Mutex<BTreeMap<&'static str, u64>>,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    pub http: u64,
    pub ops: BTreeMap<String, u64>,
}

impl Counts {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &Counts) -> Counts {
        let mut ops = BTreeMap::new();
        for (k, v) in &self.ops {
            let d = v - earlier.ops.get(k).copied().unwrap_or(0);
            if d > 0 {
                ops.insert(k.clone(), d);
            }
        }
        Counts {
            http: self.http - earlier.http,
            ops,
        }
    }
}

impl Counters {
    fn op(&self, name: &'static str) {
        *self.ops.lock().entry(name).or_default() += 1;
    }

    pub fn snapshot(&self) -> Counts {
        Counts {
            http: self.http.load(Ordering::SeqCst),
            ops: self
                .ops
                .lock()
                .iter()
                .map(|(k, v)| ((*k).to_owned(), *v))
                .collect(),
        }
    }
}

/// DevStore with every served operation counted.
#[derive(Debug)]
struct Counting {
    inner: DevStore,
    counters: Arc<Counters>,
}

/// Counts, then delegates (in the shape `async_trait` gives trait methods).
macro_rules! delegate {
    ($($name:ident: $input:ty => $output:ty;)*) => {
        $(
            fn $name<'life0, 'async_trait>(
                &'life0 self,
                req: S3Request<$input>,
            ) -> std::pin::Pin<Box<dyn std::future::Future<Output = S3Result<S3Response<$output>>> + Send + 'async_trait>>
            where
                'life0: 'async_trait,
                Self: 'async_trait,
            {
                Box::pin(async move {
                    self.counters.op(stringify!($name));
                    self.inner.$name(req).await
                })
            }
        )*
    };
}

#[async_trait::async_trait]
impl S3 for Counting {
    delegate! {
        create_bucket: CreateBucketInput => CreateBucketOutput;
        copy_object: CopyObjectInput => CopyObjectOutput;
        delete_bucket: DeleteBucketInput => DeleteBucketOutput;
        delete_object: DeleteObjectInput => DeleteObjectOutput;
        delete_objects: DeleteObjectsInput => DeleteObjectsOutput;
        get_bucket_location: GetBucketLocationInput => GetBucketLocationOutput;
        head_bucket: HeadBucketInput => HeadBucketOutput;
        list_buckets: ListBucketsInput => ListBucketsOutput;
        list_objects: ListObjectsInput => ListObjectsOutput;
        list_objects_v2: ListObjectsV2Input => ListObjectsV2Output;
        put_object: PutObjectInput => PutObjectOutput;
        create_multipart_upload: CreateMultipartUploadInput => CreateMultipartUploadOutput;
        upload_part: UploadPartInput => UploadPartOutput;
        upload_part_copy: UploadPartCopyInput => UploadPartCopyOutput;
        list_parts: ListPartsInput => ListPartsOutput;
        complete_multipart_upload: CompleteMultipartUploadInput => CompleteMultipartUploadOutput;
        abort_multipart_upload: AbortMultipartUploadInput => AbortMultipartUploadOutput;
        head_object: HeadObjectInput => HeadObjectOutput;
        get_object: GetObjectInput => GetObjectOutput;
    }
}

/// Counts HTTP requests before s3s sees them (so requests s3s refuses
/// before reaching an operation are counted too).
#[derive(Debug, Clone)]
struct CountHttp {
    inner: S3Service,
    counters: Arc<Counters>,
}

impl hyper::service::Service<Request<Incoming>> for CountHttp {
    type Response = <S3Service as hyper::service::Service<Request<Incoming>>>::Response;
    type Error = <S3Service as hyper::service::Service<Request<Incoming>>>::Error;
    type Future = <S3Service as hyper::service::Service<Request<Incoming>>>::Future;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        self.counters.http.fetch_add(1, Ordering::SeqCst);
        hyper::service::Service::call(&self.inner, req)
    }
}

/// The running backend; stopped when dropped.
#[derive(Debug)]
pub struct Backend {
    pub endpoint: String,
    pub counters: Arc<Counters>,
    /// Removed when dropped.
    _dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Backend {
    /// Starts s3s-fs on a fresh directory under `tmp`, with `worker_threads`
    /// runtime workers, and creates [`BUCKET`].
    pub async fn start(tmp: &std::path::Path, worker_threads: usize) -> anyhow::Result<Backend> {
        let dir = tempfile::Builder::new()
            .prefix("backend-")
            .tempdir_in(tmp)?;
        let store = DevStore::new(dir.path())?;
        let counters = Arc::new(Counters::default());
        let mut builder = S3ServiceBuilder::new(Counting {
            inner: store,
            counters: counters.clone(),
        });
        builder.set_auth(s3s::auth::SimpleAuth::from_single(
            BACKEND_KEY.0,
            BACKEND_KEY.1,
        ));
        let service = CountHttp {
            inner: builder.build(),
            counters: counters.clone(),
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(worker_threads.max(1))
            .thread_name("backend")
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("backend-rt".into())
            .spawn(move || {
                rt.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            eprintln!("backend: cannot listen: {e}");
                            return;
                        }
                    };
                    let serve = fencegate_proxy::server::serve_service(
                        listener,
                        service,
                        std::future::pending(),
                    );
                    tokio::select! {
                        r = serve => if let Err(e) = r { eprintln!("backend stopped: {e:#}") },
                        _ = stop_rx => {}
                    }
                });
                // Connections kept alive by clients would make a graceful
                // drain wait; the benchmark is over, drop them.
                rt.shutdown_timeout(std::time::Duration::from_millis(200));
            })?;
        let backend = Backend {
            endpoint,
            counters,
            _dir: dir,
            stop: Some(stop_tx),
            thread: Some(thread),
        };
        backend
            .direct()
            .create_bucket()
            .bucket(BUCKET)
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("create bucket {BUCKET}: {e:?}"))?;
        Ok(backend)
    }

    /// A client straight to the backend.
    pub fn direct(&self) -> aws_sdk_s3::Client {
        sdk_client(&self.endpoint, BACKEND_KEY)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The one S3 client configuration every benchmark uses, direct or through
/// the proxy: path style, no retries (every answer is seen), checksums only
/// when required (no aws-chunked trailers, so the same bytes go to both).
pub fn sdk_client(endpoint: &str, key: (&str, &str)) -> aws_sdk_s3::Client {
    use aws_sdk_s3::config::{
        RequestChecksumCalculation, ResponseChecksumValidation, StalledStreamProtectionConfig,
    };
    let config = fencegate_testkit::s3::client_config(endpoint, key, "bench")
        .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
        .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
        .stalled_stream_protection(StalledStreamProtectionConfig::disabled())
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

/// The proxy configuration: no `[[scopes]]` (bucket `bench` is fenced by
/// lock `bench`), signed tokens, the probe on [`BUCKET`]; `top` among
/// its top-level settings.
fn proxy_toml_with(backend_endpoint: &str, db: &std::path::Path, top: &str) -> String {
    fencegate_testkit::config::ProxyToml {
        db,
        signing_key: crate::util::SIGNING_KEY,
        probe_bucket: BUCKET,
        endpoint: backend_endpoint,
        backend_key: BACKEND_KEY,
        client_key: CLIENT_KEY,
        extra: top,
    }
    .text()
}

/// A fresh `fencegate proxy` process (the release binary) in front of
/// `backend`, with its database and log in a new directory under `tmp`.
#[derive(Debug)]
pub struct ProxyProc {
    pub proc: crate::util::Proc,
    /// Removed when dropped.
    _dir: tempfile::TempDir,
}

impl ProxyProc {
    pub async fn start(
        fencegate: &std::path::Path,
        backend: &Backend,
        tmp: &std::path::Path,
    ) -> anyhow::Result<ProxyProc> {
        ProxyProc::start_with(fencegate, backend, tmp, String::new()).await
    }

    /// [`ProxyProc::start`] with `extra` appended to the config (a
    /// `[cluster]` table).
    pub async fn start_with(
        fencegate: &std::path::Path,
        backend: &Backend,
        tmp: &std::path::Path,
        extra: String,
    ) -> anyhow::Result<ProxyProc> {
        ProxyProc::start_configured(fencegate, backend, tmp, "", extra).await
    }

    /// [`ProxyProc::start_with`], with `top` among the config's top-level
    /// settings.
    pub async fn start_configured(
        fencegate: &std::path::Path,
        backend: &Backend,
        tmp: &std::path::Path,
        top: &str,
        extra: String,
    ) -> anyhow::Result<ProxyProc> {
        let dir = tempfile::Builder::new().prefix("proxy-").tempdir_in(tmp)?;
        let config = dir.path().join("proxy.toml");
        std::fs::write(
            &config,
            proxy_toml_with(&backend.endpoint, &dir.path().join("proxy.db"), top) + &extra,
        )?;
        let cmd = fencegate_testkit::config::proxy_command(
            std::process::Command::new(fencegate),
            &config,
        );
        let log = dir.path().join("proxy.log");
        let proc =
            tokio::task::spawn_blocking(move || crate::util::Proc::start_fencegate(cmd, log))
                .await??;
        Ok(ProxyProc { proc, _dir: dir })
    }

    pub fn client(&self) -> aws_sdk_s3::Client {
        sdk_client(&self.proc.url, CLIENT_KEY)
    }
}

/// `Fencing-Token` for lock [`BUCKET`], signed as the lease service would.
pub fn token(n: u64) -> anyhow::Result<http::HeaderValue> {
    signed_token(BUCKET, n)
}

/// `Fencing-Token` `n` for `lock`, signed as the lease service would.
pub fn signed_token(lock: &str, n: u64) -> anyhow::Result<http::HeaderValue> {
    let keys = fencegate_core::TokenKeys::new(vec![crate::util::SIGNING_KEY.as_bytes().to_vec()])
        .ok_or_else(|| anyhow::anyhow!("invalid signing key"))?;
    let lock = fencegate_core::LockName::new(lock)?;
    Ok(http::HeaderValue::from_str(
        &keys.sign(&lock, n).to_string(),
    )?)
}

/// Sends a prepared request with the `Fencing-Token` header added.
#[macro_export]
macro_rules! fenced {
    ($builder:expr, $token:expr) => {{
        let value: http::HeaderValue = $token.clone();
        $builder.customize().mutate_request(move |req| {
            req.headers_mut().insert("fencing-token", value.clone());
        })
    }};
}
