//! The last check before a write's bytes leave for the store.
//!
//! With replicas, a write may go out only while the replica's standing
//! lasts. Checking before the request is handed to a client leaves the
//! connect (a SYN retransmit alone is a second) and the client's own work
//! between the check and the bytes. So the store's connections are made
//! through [`CheckedConnector`]: every write of bytes on them asks the
//! check first, and a refused one fails the request before anything of it
//! is sent (or cuts it mid-body, which the store does not commit).
//!
//! [`SdkClient`] is the AWS SDK's HTTP client built on it, for the writes
//! the SDK sends (delete, copy, complete, multipart); `lean` builds its
//! pools on it too.

use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector as SmithyConnector, HttpConnectorFuture, HttpConnectorSettings,
    SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::body::SdkBody;
use http::Uri;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioExecutor;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// Whether bytes of a write may go out now.
pub type Check = Arc<dyn Fn() -> bool + Send + Sync>;

pin_project_lite::pin_project! {
    /// A connection whose every write asks the check first.
    pub struct CheckedIo<T> {
        #[pin]
        inner: T,
        check: Option<Check>,
    }
}

impl<T> CheckedIo<T> {
    fn refused(&self) -> bool {
        self.check.as_ref().is_some_and(|c| !c())
    }
}

impl<T: hyper::rt::Read> hyper::rt::Read for CheckedIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_read(cx, buf)
    }
}

impl<T: hyper::rt::Write> hyper::rt::Write for CheckedIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.refused() {
            return Poll::Ready(Err(crate::no_answer::refusal()));
        }
        self.project().inner.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        if self.refused() {
            return Poll::Ready(Err(crate::no_answer::refusal()));
        }
        self.project().inner.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

impl<T: Connection> Connection for CheckedIo<T> {
    fn connected(&self) -> Connected {
        self.inner.connected()
    }
}

/// A connector whose connections are [`CheckedIo`], opened (TCP and TLS)
/// within a time limit.
#[derive(Clone)]
pub struct CheckedConnector<C> {
    inner: C,
    check: Option<Check>,
    timeout: Duration,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<C> std::fmt::Debug for CheckedConnector<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckedConnector")
            .field("checked", &self.check.is_some())
            .finish_non_exhaustive()
    }
}

impl<C> CheckedConnector<C> {
    /// `inner`'s connections, checked by `check` (none: unchecked), each
    /// opened within `timeout` (a TLS handshake included: a connection
    /// stuck in it would hold a write past the standing it was checked in).
    pub fn new(inner: C, check: Option<Check>, timeout: Duration) -> CheckedConnector<C> {
        CheckedConnector {
            inner,
            check,
            timeout,
        }
    }
}

type Connecting<T> = Pin<Box<dyn Future<Output = Result<CheckedIo<T>, BoxError>> + Send>>;

impl<C> tower::Service<Uri> for CheckedConnector<C>
where
    C: tower::Service<Uri>,
    C::Future: Send + 'static,
    C::Response: 'static,
    C::Error: Into<BoxError>,
{
    type Response = CheckedIo<C::Response>;
    type Error = BoxError;
    type Future = Connecting<C::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let (check, timeout) = (self.check.clone(), self.timeout);
        Box::pin(async move {
            match tokio::time::timeout(timeout, connecting).await {
                Ok(Ok(inner)) => Ok(CheckedIo { inner, check }),
                Ok(Err(e)) => Err(e.into()),
                Err(_) => Err(format!(
                    "no connection to the store within {timeout:?} (connect and TLS handshake)"
                )
                .into()),
            }
        })
    }
}

/// The store's TLS (or plain) connector, with the proxy's one policy:
/// system roots for `https://`, nothing loaded for `http://`.
pub fn store_connector(
    https: bool,
    connect_timeout: Duration,
) -> anyhow::Result<hyper_rustls::HttpsConnector<HttpConnector>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = hyper_rustls::HttpsConnectorBuilder::new();
    let tls = if https {
        tls.with_provider_and_native_roots(provider)?
    } else {
        // Plain http: no certificate is ever checked, so none is loaded.
        tls.with_tls_config(
            rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()?
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
        )
    };
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    // No TCP keepalive and no user timeout here, unlike fencegate's other
    // connections (fencegate_net::liveness): a kernel abort of a write's
    // connection would be an answered error, and let a raise through at
    // once, while the store, cut off but alive, may still commit what it
    // was sent. A silent store is `backend.timeout_secs`' business: an
    // unanswered write, held until it can no longer land.
    Ok(tls.https_or_http().enable_http1().wrap_connector(http))
}

type Pool = Client<CheckedConnector<hyper_rustls::HttpsConnector<HttpConnector>>, SdkBody>;

/// The AWS SDK's HTTP client over checked connections.
#[derive(Clone)]
pub struct SdkClient {
    pool: Pool,
}

impl std::fmt::Debug for SdkClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SdkClient").finish_non_exhaustive()
    }
}

impl SdkClient {
    pub fn new(
        connector: hyper_rustls::HttpsConnector<HttpConnector>,
        check: Option<Check>,
        connect_timeout: Duration,
    ) -> SdkClient {
        SdkClient {
            pool: Client::builder(TokioExecutor::new())
                .pool_timer(hyper_util::rt::TokioTimer::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .build(CheckedConnector::new(connector, check, connect_timeout)),
        }
    }
}

impl SmithyConnector for SdkClient {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let pool = self.pool.clone();
        HttpConnectorFuture::new(async move {
            let request = request
                .try_into_http1x()
                .map_err(|e| ConnectorError::other(e.into(), None))?;
            let response = pool.request(request).await.map_err(|e| {
                if e.is_connect() {
                    ConnectorError::io(e.into())
                } else {
                    ConnectorError::other(crate::no_answer::NoAnswer::mark(e.into()), None)
                }
            })?;
            let (parts, body) = response.into_parts();
            HttpResponse::try_from(http::Response::from_parts(
                parts,
                SdkBody::from_body_1_x(body),
            ))
            .map_err(|e| ConnectorError::other(e.into(), None))
        })
    }
}

impl HttpClient for SdkClient {
    fn http_connector(
        &self,
        _settings: &HttpConnectorSettings,
        _components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server answering every request head with an empty 200, counting
    /// the bytes it received.
    async fn server() -> (String, Arc<AtomicUsize>) {
        let (addr, received) = fencegate_testkit::tcp::counting_server(|mut s, seen| async move {
            let mut buf = vec![0u8; 4096];
            while let Ok(n) = s.read(&mut buf).await {
                if n == 0 {
                    return;
                }
                seen.fetch_add(n, Ordering::AcqRel);
                let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                if s.write_all(ok).await.is_err() {
                    return;
                }
            }
        })
        .await;
        (format!("http://{addr}/bkt/key"), received)
    }

    #[tokio::test]
    async fn no_byte_leaves_once_the_check_refuses() {
        let (url, received) = server().await;
        let open = Arc::new(AtomicBool::new(true));
        let flag = open.clone();
        let check: Check = Arc::new(move || flag.load(Ordering::Acquire));
        let connector = store_connector(false, Duration::from_secs(1)).expect("connector");
        let client: Client<_, http_body_util::Empty<bytes::Bytes>> =
            Client::builder(TokioExecutor::new()).build(CheckedConnector::new(
                connector,
                Some(check),
                Duration::from_secs(1),
            ));
        let req = || {
            http::Request::delete(url.as_str())
                .body(http_body_util::Empty::new())
                .expect("request")
        };
        let first = client
            .request(req())
            .await
            .expect("sent while the check passes");
        assert_eq!(first.status(), 200);
        let before = received.load(Ordering::Acquire);
        assert!(before > 0);
        // The standing ends between the caller's own check and the send:
        // the pooled connection is there, and the request still does not
        // go out.
        open.store(false, Ordering::Release);
        let refused = client.request(req()).await;
        let e = refused.expect_err("refused at the last moment");
        let refused_by_check =
            std::iter::successors(Some(&e as &(dyn std::error::Error + 'static)), |c| {
                c.source()
            })
            .any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(crate::no_answer::refused_here)
            });
        assert!(refused_by_check, "{e:?}");
        assert!(
            !crate::no_answer::NoAnswer::mark(e.into()).is::<crate::no_answer::NoAnswer>(),
            "a refused write is not one the store may commit"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            received.load(Ordering::Acquire),
            before,
            "bytes of the refused request reached the store"
        );
    }
}
