//! The lean forwarder: the hot object upload (PutObject) sent to the store
//! on connections of its own ([`conns`]: hyper's connection-level client,
//! kept per serving thread) and signed by [`sign`], instead of through the
//! SDK's pipeline, which is most of the proxy's CPU per small PUT
//! (BENCHMARKS.md).
//!
//! It forwards what the SDK path forwards, from the client's own headers:
//! an allowlist of the headers that describe the object (content headers,
//! user metadata, storage class, tagging, encryption, object lock,
//! checksums). Everything else is dropped: the client's signature and
//! conditions, hop-by-hop headers, and any client `x-amz-meta-fencing-token`.
//! The gate's `Writer` adds the conditions and the token.
//!
//! Only requests it reproduces exactly take this path
//! (`request::AsIs::check`, with [`eligible_headers`]): a body
//! of known length sent as is. An `aws-chunked` body (s3s decoded it, and
//! its trailing checksum would need re-encoding) goes through the SDK.

mod conns;
mod sign;

use crate::config::BackendConfig;
use crate::dialect::Dialect;
use crate::errors;
use crate::header_names::{X_AMZ_CONTENT_SHA256, X_AMZ_META_FENCING_TOKEN};
use crate::send_check::{Check, CheckedConnector};
use crate::tokens::TOKEN_METADATA_KEY;
use bytes::Bytes;
use conns::Conns;
use futures::TryStreamExt;
use http::header::{CONTENT_LENGTH, HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery};
use http::{HeaderMap, Method, Request, StatusCode, Uri};
use http_body_util::BodyExt;
use s3s::dto::{ETag, ETagCondition, PutObjectOutput, StreamingBlob};
use s3s::{S3Error, S3ErrorCode, S3Response, S3Result};
use std::time::Duration;

/// Longest a connection to the store may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

pub use conns::Body;

/// A PutObject prepared for the store, without its conditions and body.
#[derive(Debug, Clone)]
pub struct LeanPut {
    /// Where it goes: the store's authority (a virtual-hosted bucket's own),
    /// and the path in origin form.
    authority: Authority,
    path: PathAndQuery,
    headers: HeaderMap,
}

/// The store's connections and what it signs with.
pub struct Lean {
    /// Connections to the store, each write on them checked last
    /// (`send_check`).
    conns: Conns,
    /// The store's authority, and the base path (without a trailing `/`).
    authority: http::uri::Authority,
    base_path: String,
    path_style: bool,
    /// `host` of every request to a path-style store: its authority.
    host: HeaderValue,
    signer: sign::Signer,
}

impl std::fmt::Debug for Lean {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lean")
            .field("authority", &self.authority)
            .finish_non_exhaustive()
    }
}

/// The request body's own error, if that is why a send failed: a client
/// body that ended early, or is not what it was signed as (a cut or a
/// stalled body is told apart by the gate, before this answer is used).
fn body_error(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cause = Some(e);
    while let Some(err) = cause {
        if let Some(h) = err.downcast_ref::<hyper::Error>()
            && h.is_user()
        {
            return Some(
                std::error::Error::source(h).map_or_else(|| h.to_string(), ToString::to_string),
            );
        }
        cause = err.source();
    }
    None
}

/// Whether a header of the client's request describes the object, and is
/// forwarded as it came (besides `x-amz-meta-*`, checked apart).
fn describes_object(name: &str) -> bool {
    matches!(
        name,
        "content-type"
            | "content-md5"
            | "content-encoding"
            | "content-language"
            | "content-disposition"
            | "cache-control"
            | "expires"
            | "x-amz-storage-class"
            | "x-amz-tagging"
            | "x-amz-website-redirect-location"
            | "x-amz-acl"
            | "x-amz-grant-full-control"
            | "x-amz-grant-read"
            | "x-amz-grant-read-acp"
            | "x-amz-grant-write-acp"
            | "x-amz-server-side-encryption"
            | "x-amz-server-side-encryption-aws-kms-key-id"
            | "x-amz-server-side-encryption-context"
            | "x-amz-server-side-encryption-bucket-key-enabled"
            | "x-amz-server-side-encryption-customer-algorithm"
            | "x-amz-server-side-encryption-customer-key"
            | "x-amz-server-side-encryption-customer-key-md5"
            | "x-amz-object-lock-mode"
            | "x-amz-object-lock-retain-until-date"
            | "x-amz-object-lock-legal-hold"
            | "x-amz-checksum-crc32"
            | "x-amz-checksum-crc32c"
            | "x-amz-checksum-crc64nvme"
            | "x-amz-checksum-sha1"
            | "x-amz-checksum-sha256"
            | "x-amz-sdk-checksum-algorithm"
            | "x-amz-request-payer"
            | "x-amz-expected-bucket-owner"
    )
}

/// Whether the lean path can forward a PutObject with these headers
/// exactly (with a known length: `request::AsIs` checks both): its body is
/// sent as is (not `aws-chunked`, no trailer), and every header it would
/// forward is plain text (the signer needs it as a string).
///
/// One pass over the headers (it runs on every PutObject).
pub fn eligible_headers(h: &HeaderMap) -> bool {
    h.iter().all(|(name, v)| match name.as_str() {
        "x-amz-content-sha256" => !v.as_bytes().starts_with(b"STREAMING-"),
        "content-encoding" => {
            !v.as_bytes().windows(11).any(|w| w == b"aws-chunked") && v.to_str().is_ok()
        }
        "x-amz-trailer" | "x-amz-decoded-content-length" => false,
        _ => !forwarded(name) || v.to_str().is_ok(),
    })
}

/// Whether the lean path forwards a header of the client's request as it
/// came: it describes the object ([`describes_object`]), or is user
/// metadata other than the token's.
pub fn forwarded(name: &HeaderName) -> bool {
    let n = name.as_str();
    describes_object(n)
        || n.strip_prefix("x-amz-meta-")
            .is_some_and(|m| !m.eq_ignore_ascii_case(TOKEN_METADATA_KEY))
}

impl Lean {
    /// A forwarder to `config`'s store whose every write asks `check` last,
    /// counting in `resends` the writes it sends again (`conns`); an error
    /// if the endpoint is not an `http(s)://host[:port][/path]` URL.
    pub fn new(
        config: &BackendConfig,
        check: Option<Check>,
        resends: prometheus_client::metrics::counter::Counter,
    ) -> anyhow::Result<Lean> {
        let uri: Uri = config.endpoint.parse()?;
        let scheme = uri
            .scheme()
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("the backend endpoint has no scheme"))?;
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("the backend endpoint has no host"))?;
        let connector = CheckedConnector::new(
            crate::send_check::store_connector(
                scheme == http::uri::Scheme::HTTPS,
                CONNECT_TIMEOUT,
            )?,
            check,
            CONNECT_TIMEOUT,
        );
        let host = HeaderValue::from_str(authority.as_str())?;
        for (what, text) in [
            ("access key", &config.access_key),
            ("region", &config.region),
        ] {
            anyhow::ensure!(
                HeaderValue::from_str(text).is_ok(),
                "the backend {what} is not header text"
            );
        }
        Ok(Lean {
            conns: Conns::new(connector, scheme, resends),
            authority,
            base_path: uri.path().trim_end_matches('/').to_owned(),
            path_style: config.path_style,
            host,
            signer: sign::Signer::new(&config.access_key, &config.secret_key, &config.region),
        })
    }

    /// Where `bucket/key` is on the store: the authority to connect to,
    /// and the path, written once.
    fn object_uri(
        &self,
        bucket: &str,
        key: &str,
    ) -> Result<(Authority, PathAndQuery), http::Error> {
        let mut path = String::with_capacity(self.base_path.len() + bucket.len() + key.len() + 16);
        path.push_str(&self.base_path);
        let authority = if self.path_style {
            path.push('/');
            path.push_str(bucket);
            // Shared, not copied.
            self.authority.clone()
        } else {
            http::uri::Authority::from_maybe_shared(bytes::Bytes::from(
                [bucket, ".", self.authority.as_str()].concat(),
            ))?
        };
        path.push('/');
        crate::sigv4::uri_encode(&mut path, key);
        let path = PathAndQuery::from_maybe_shared(bytes::Bytes::from(path))?;
        Ok((authority, path))
    }

    /// The parts of a PutObject to `bucket/key` that do not change between
    /// two sends of it: the object's URI, the client's object headers (from
    /// `client`), the length, the token.
    pub fn prepare(
        &self,
        (bucket, key): (&str, &str),
        client: &HeaderMap,
        length: u64,
        token: u64,
    ) -> S3Result<LeanPut> {
        let (authority, path) = self
            .object_uri(bucket, key)
            .map_err(|e| s3s::s3_error!(InvalidArgument, "cannot address the key: {e}"))?;
        let mut headers = HeaderMap::with_capacity(client.len() + 4);
        for (name, value) in client.iter().filter(|(n, _)| forwarded(n)) {
            headers.append(name.clone(), value.clone());
        }
        headers.insert(X_AMZ_META_FENCING_TOKEN, HeaderValue::from(token));
        headers.insert(CONTENT_LENGTH, HeaderValue::from(length));
        // The body's SHA-256 the client signed (checked as the body streams,
        // by the edge or by s3s): signed again for the store, which then
        // checks it too. `sign` ignores anything that is not a SHA-256.
        if let Some(sha256) = client.get(X_AMZ_CONTENT_SHA256) {
            headers.insert(X_AMZ_CONTENT_SHA256, sha256.clone());
        }
        Ok(LeanPut {
            authority,
            path,
            headers,
        })
    }

    /// Sends `put` with the conditions the gate's `Writer` chose, written
    /// in the store's `dialect`, and `body`.
    pub async fn send(
        &self,
        put: LeanPut,
        (if_match, if_none_match): (Option<ETagCondition>, Option<ETagCondition>),
        dialect: Dialect,
        body: Body,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let LeanPut {
            authority,
            path,
            mut headers,
        } = put;
        if let Some(v) = if_match
            .as_ref()
            .and_then(|c| dialect.if_match(crate::op::Op::PutObject, &condition(c)))
        {
            headers.insert(http::header::IF_MATCH, owned_value(v)?);
        }
        if let Some(c) = &if_none_match {
            let v = match c {
                ETagCondition::Any => HeaderValue::from_static("*"),
                ETagCondition::ETag(e) => owned_value(["\"", e.value(), "\""].concat())?,
            };
            headers.insert(http::header::IF_NONE_MATCH, v);
        }
        headers.insert(http::header::HOST, self.host(&authority)?);
        self.signer
            .sign(&Method::PUT, path.path(), &mut headers, crate::clock::now())
            .map_err(internal)?;
        let mut request = Request::new(body);
        *request.method_mut() = Method::PUT;
        *request.uri_mut() = Uri::from(path);
        *request.headers_mut() = headers;
        let (response, conn) =
            self.conns
                .send(&authority, request)
                .await
                .map_err(|e| match body_error(&*e) {
                    Some(cause) => s3s::s3_error!(
                        IncompleteBody,
                        "the request body could not be sent whole: {cause}"
                    ),
                    None => {
                        let mut failed = S3Error::with_message(
                            S3ErrorCode::InternalError,
                            format!("the backend cannot be reached: {e}"),
                        );
                        // Marked `no_answer::NoAnswer` if it may still land.
                        failed.set_source(e);
                        errors::from_backend(failed)
                    }
                })?;
        let (parts, body) = response.into_parts();
        if !parts.status.is_success() {
            let (error, read_whole) = store_error(parts.status, body).await;
            conn.put_back(read_whole, &parts.headers);
            return Err(error);
        }
        let output = put_output(&parts.headers);
        // Read what is left, so the connection can take the next request.
        let read_whole = body.collect().await.is_ok();
        conn.put_back(read_whole, &parts.headers);
        Ok(S3Response::new(output))
    }

    /// The `host` header of a request to `authority`: the store's own,
    /// kept, for a path-style store.
    fn host(&self, authority: &Authority) -> S3Result<HeaderValue> {
        if self.path_style {
            return Ok(self.host.clone());
        }
        HeaderValue::from_str(authority.as_str()).map_err(internal)
    }
}

/// A header value of text made here, without copying it.
fn owned_value(text: String) -> S3Result<HeaderValue> {
    HeaderValue::from_maybe_shared(bytes::Bytes::from(text)).map_err(internal)
}

/// What the client is told of a PutObject the store answered with
/// `headers`: one pass over them (a lookup per field would hash and parse
/// ten names), each field from its header's first value, as a lookup by
/// name reads it.
fn put_output(headers: &HeaderMap) -> PutObjectOutput {
    let mut output = PutObjectOutput::default();
    // (A name's values come one after the other.)
    let mut last = None;
    for (name, value) in headers {
        if last.replace(name) == Some(name) {
            continue;
        }
        if *name == http::header::ETAG {
            output.e_tag = ETag::parse_http_header(value.as_bytes()).ok();
            continue;
        }
        let field = match name.as_str() {
            "x-amz-version-id" => &mut output.version_id,
            "x-amz-checksum-crc32" => &mut output.checksum_crc32,
            "x-amz-checksum-crc32c" => &mut output.checksum_crc32c,
            "x-amz-checksum-crc64nvme" => &mut output.checksum_crc64nvme,
            "x-amz-checksum-sha1" => &mut output.checksum_sha1,
            "x-amz-checksum-sha256" => &mut output.checksum_sha256,
            "x-amz-server-side-encryption-aws-kms-key-id" => &mut output.ssekms_key_id,
            "x-amz-expiration" => &mut output.expiration,
            "x-amz-server-side-encryption" => {
                output.server_side_encryption = value.to_str().ok().map(|v| v.to_owned().into());
                continue;
            }
            _ => continue,
        };
        *field = value.to_str().ok().map(str::to_owned);
    }
    output
}

/// A condition as AWS writes it (the dialect may respell it): quoted, so
/// the value itself is never read as `*`, a weak mark or spaces.
fn condition(c: &ETagCondition) -> String {
    match c {
        ETagCondition::Any => "*".to_owned(),
        ETagCondition::ETag(e) => ["\"", e.value(), "\""].concat(),
    }
}

/// A streamed request body.
pub fn body_of(blob: Option<StreamingBlob>) -> Body {
    match blob {
        Some(b) => http_body_util::StreamBody::new(
            b.map_ok(http_body::Frame::data)
                .map_err(|e| -> Box<dyn std::error::Error + Send + Sync> { e }),
        )
        .boxed(),
        None => http_body_util::Empty::new()
            .map_err(|never| match never {})
            .boxed(),
    }
}

/// A request body held in memory (it can be sent again).
pub fn full(bytes: Bytes) -> Body {
    http_body_util::Full::new(bytes)
        .map_err(|never| match never {})
        .boxed()
}

/// The store's error answer as an S3 error: its code and message when the
/// body is S3's XML, else the status alone; and whether the body was read
/// whole (one over 64 KiB is not: its connection is closed).
async fn store_error(status: StatusCode, body: hyper::body::Incoming) -> (S3Error, bool) {
    const MAX: usize = 64 * 1024;
    let limited = http_body_util::Limited::new(body, MAX);
    let (text, read_whole) = match limited.collect().await {
        Ok(b) => (String::from_utf8_lossy(&b.to_bytes()).into_owned(), true),
        Err(_) => (String::new(), false),
    };
    let tag = |name: &str| {
        let open = format!("<{name}>");
        let start = text.find(&open)? + open.len();
        let end = text[start..].find(&format!("</{name}>"))? + start;
        Some(text[start..end].to_owned())
    };
    let code = tag("Code")
        .and_then(|c| S3ErrorCode::from_bytes(c.as_bytes()))
        .unwrap_or(match status {
            StatusCode::PRECONDITION_FAILED => S3ErrorCode::PreconditionFailed,
            _ => S3ErrorCode::InternalError,
        });
    let message = tag("Message").unwrap_or_else(|| format!("the backend answered {status}"));
    let mut e = S3Error::with_message(code, message);
    e.set_status_code(status);
    (errors::from_backend(e), read_whole)
}

fn internal(e: impl std::fmt::Display) -> S3Error {
    S3Error::with_message(S3ErrorCode::InternalError, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_etag_is_matched_as_a_value_never_as_a_wildcard() {
        let if_match =
            |c: ETagCondition| Dialect::AWS.if_match(crate::op::Op::PutObject, &condition(&c));
        let etag = |v: &str| ETagCondition::ETag(ETag::Strong(v.into()));
        assert_eq!(if_match(etag("abc")).as_deref(), Some("\"abc\""));
        // A store's odd ETags stay values: `*` is not "any object", a
        // leading `W/` or a space is part of the value.
        assert_eq!(if_match(etag("*")).as_deref(), Some("\"*\""));
        assert_eq!(if_match(etag("W/abc")).as_deref(), Some("\"W/abc\""));
        assert_eq!(if_match(etag(" abc ")).as_deref(), Some("\" abc \""));
        assert_eq!(if_match(ETagCondition::Any).as_deref(), Some("*"));
    }

    fn eligible(headers: &[(&str, &str)]) -> bool {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.append(
                HeaderName::from_bytes(k.as_bytes()).expect("name"),
                HeaderValue::from_str(v).expect("value"),
            );
        }
        eligible_headers(&map)
    }

    #[test]
    fn only_bodies_sent_as_is_take_the_lean_path() {
        assert!(eligible(&[("content-type", "text/plain")]));
        assert!(eligible(&[("x-amz-content-sha256", "UNSIGNED-PAYLOAD")]));
        assert!(!eligible(&[(
            "x-amz-content-sha256",
            "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
        )]));
        assert!(!eligible(&[("content-encoding", "gzip, aws-chunked")]));
        assert!(!eligible(&[("x-amz-trailer", "x-amz-checksum-crc32")]));
        assert!(!eligible(&[("x-amz-decoded-content-length", "3")]));
    }

    #[test]
    fn the_answer_is_read_from_the_first_value_of_each_header() {
        let mut h = HeaderMap::new();
        h.append(http::header::ETAG, HeaderValue::from_static("\"abc\""));
        h.append(http::header::ETAG, HeaderValue::from_static("\"def\""));
        h.append("x-amz-version-id", HeaderValue::from_static("v1"));
        h.append("x-amz-version-id", HeaderValue::from_static("v2"));
        h.append("x-amz-checksum-crc32", HeaderValue::from_static("AAAAAA=="));
        h.append(
            "x-amz-server-side-encryption",
            HeaderValue::from_static("AES256"),
        );
        h.append("x-amz-request-id", HeaderValue::from_static("r"));
        let out = put_output(&h);
        assert_eq!(out.e_tag.as_ref().map(ETag::value), Some("abc"));
        assert_eq!(out.version_id.as_deref(), Some("v1"));
        assert_eq!(out.checksum_crc32.as_deref(), Some("AAAAAA=="));
        assert_eq!(
            out.server_side_encryption.as_ref().map(|s| s.as_str()),
            Some("AES256")
        );
        assert_eq!(out.checksum_sha256, None);
    }

    #[test]
    fn the_token_header_of_the_client_is_never_forwarded() {
        assert!(!forwarded(&HeaderName::from_static(
            "x-amz-meta-fencing-token"
        )));
        assert!(forwarded(&HeaderName::from_static("x-amz-meta-owner")));
        assert!(!forwarded(&HeaderName::from_static("authorization")));
        assert!(!forwarded(&HeaderName::from_static("if-match")));
        assert!(!forwarded(&HeaderName::from_static("fencing-token")));
        assert!(forwarded(&HeaderName::from_static("content-type")));
    }

    /// A store (s3s-fs) behind a relay whose first connection closes on
    /// `close` (with a reset if so started); `closed` hears when it did.
    /// Served on a runtime of its own, off the caller's thread.
    struct ClosingStore {
        url: String,
        dir: tempfile::TempDir,
        close: tokio::sync::watch::Sender<bool>,
        closed: std::sync::mpsc::Receiver<()>,
        accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
        _runtime: tokio::runtime::Runtime,
    }

    const KEY: (&str, &str) = ("AKIDCONNS", "conns-secret");

    impl ClosingStore {
        fn start(reset: bool) -> ClosingStore {
            use std::sync::atomic::Ordering;
            use tokio::net::{TcpListener, TcpStream};
            let runtime = tokio::runtime::Runtime::new().expect("runtime");
            let dir = tempfile::tempdir().expect("dir");
            std::fs::create_dir(dir.path().join("bkt")).expect("bucket");
            let (close, to_close) = tokio::sync::watch::channel(false);
            let (closed_tx, closed) = std::sync::mpsc::channel();
            let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let counted = accepted.clone();
            let root = dir.path().to_owned();
            let url = runtime.block_on(async move {
                let mut builder = s3s::service::S3ServiceBuilder::new(
                    crate::devstore::DevStore::new(&root).expect("s3s-fs"),
                );
                builder.set_auth(s3s::auth::SimpleAuth::from_single(KEY.0, KEY.1));
                let store = TcpListener::bind("127.0.0.1:0").await.expect("bind");
                let store_addr = store.local_addr().expect("addr");
                tokio::spawn(crate::server::serve_service(
                    store,
                    builder.build(),
                    std::future::pending(),
                ));
                let relay = TcpListener::bind("127.0.0.1:0").await.expect("bind");
                let url = format!("http://{}", relay.local_addr().expect("addr"));
                tokio::spawn(async move {
                    while let Ok((mut client, _)) = relay.accept().await {
                        let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
                        let Ok(mut store) = TcpStream::connect(store_addr).await else {
                            return;
                        };
                        if !first {
                            tokio::spawn(async move {
                                let _ =
                                    tokio::io::copy_bidirectional(&mut client, &mut store).await;
                            });
                            continue;
                        }
                        let closed_tx = closed_tx.clone();
                        let mut to_close = to_close.clone();
                        tokio::spawn(async move {
                            tokio::select! {
                                _ = tokio::io::copy_bidirectional(&mut client, &mut store) => {}
                                _ = to_close.wait_for(|c| *c) => {}
                            }
                            if reset {
                                let _ = client.set_zero_linger();
                            }
                            drop(client);
                            let _ = closed_tx.send(());
                        });
                    }
                });
                url
            });
            ClosingStore {
                url,
                dir,
                close,
                closed,
                accepted,
                _runtime: runtime,
            }
        }
    }

    async fn put(lean: &Lean, key: &str, body: &'static [u8]) -> S3Result<()> {
        let prepared = lean.prepare(("bkt", key), &HeaderMap::new(), body.len() as u64, 7)?;
        lean.send(
            prepared,
            (None, None),
            Dialect::AWS,
            full(Bytes::from_static(body)),
        )
        .await
        .map(drop)
    }

    /// What the second of two writes met: the store closed the idle
    /// connection of the first (with a reset if `reset`) while the
    /// proxy's thread was busy, so the close had arrived but was not yet
    /// read when the second write took that connection. `turn`: the
    /// checkout's turn of the event loop is on. Returns the second
    /// write's outcome, the writes sent again, the connections the store
    /// accepted, and the second object if it landed.
    fn second_write_after_a_close(
        reset: bool,
        turn: bool,
    ) -> (S3Result<()>, u64, usize, Option<Vec<u8>>) {
        let store = ClosingStore::start(reset);
        let config = BackendConfig {
            endpoint: store.url.clone(),
            access_key: KEY.0.into(),
            secret_key: KEY.1.into(),
            ..BackendConfig::default()
        };
        let resends = prometheus_client::metrics::counter::Counter::default();
        // One thread, as the proxy's serving threads run.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let second = runtime.block_on(async {
            let mut lean = Lean::new(&config, None, resends.clone()).expect("lean");
            if !turn {
                lean.conns.never_turn();
            }
            put(&lean, "first", b"one").await.expect("first write");
            store.close.send_replace(true);
            store
                .closed
                .recv_timeout(Duration::from_secs(10))
                .expect("the store closed the connection");
            // The close reaches this side's socket while this thread (and
            // so the connection's task) does not run.
            std::thread::sleep(conns::TURN_AFTER * 2);
            put(&lean, "second", b"two").await
        });
        let accepted = store.accepted.load(std::sync::atomic::Ordering::SeqCst);
        let landed = std::fs::read(store.dir.path().join("bkt/second")).ok();
        (second, resends.get(), accepted, landed)
    }

    /// A close (or a reset) that arrived while the thread was busy is read
    /// in the checkout's turn, before the request is written: hyper hands
    /// the request back with no byte of it sent, and it goes out once, on
    /// a new connection, counted, and lands.
    #[test]
    fn a_write_meeting_a_close_that_arrived_meanwhile_goes_once_on_a_new_connection() {
        for reset in [false, true] {
            let (second, resends, accepted, landed) = second_write_after_a_close(reset, true);
            assert!(second.is_ok(), "reset {reset}: {second:?}");
            assert_eq!(resends, 1, "reset {reset}: handed back and sent again");
            assert_eq!(accepted, 2, "reset {reset}: on a new connection");
            assert_eq!(landed.as_deref(), Some(&b"two"[..]), "reset {reset}");
        }
    }

    /// Without the turn, hyper writes the request on the closed connection:
    /// nothing lands, and the client is told the write may still land (a
    /// retryable 503; raises of its lock wait). What the turn prevents.
    #[test]
    fn without_the_turn_a_close_that_arrived_meanwhile_makes_an_unknown_outcome() {
        for reset in [false, true] {
            let (second, resends, accepted, landed) = second_write_after_a_close(reset, false);
            let e = second.expect_err("written on a closed connection");
            assert_eq!(
                e.status_code(),
                Some(StatusCode::SERVICE_UNAVAILABLE),
                "reset {reset}: {e:?}"
            );
            assert!(
                crate::no_answer::may_have_landed(&e).is_some(),
                "reset {reset}: an unknown outcome: {e:?}"
            );
            assert_eq!((resends, accepted), (0, 1), "reset {reset}: not sent again");
            assert_eq!(landed, None, "reset {reset}");
        }
    }
}
