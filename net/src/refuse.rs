//! Connections over the connection cap: answered `503` (through TLS on a
//! TLS port) and closed.

use crate::answer::answer_and_close;
use bytes::Bytes;
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

/// Answers a connection over the cap with `response` (through TLS on a TLS
/// port) and closes it, within [`crate::REFUSAL_TIME`].
pub(crate) async fn refuse(
    tcp: TcpStream,
    tls: Option<tokio_rustls::TlsAcceptor>,
    response: Bytes,
    _permit: OwnedSemaphorePermit,
) {
    let answer = async {
        match tls {
            None => answer_and_close(tcp, &response).await,
            Some(acceptor) => match crate::tls::accept(tcp, &acceptor).await {
                Ok(tls) => answer_and_close(tls, &response).await,
                Err(e) => {
                    tracing::debug!(error = %e, "TLS handshake of a refused connection failed")
                }
            },
        }
    };
    let _ = tokio::time::timeout(crate::REFUSAL_TIME, answer).await;
}
