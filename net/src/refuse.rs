//! Connections over the connection cap: answered `503` (through TLS on a
//! TLS port) and closed.

use crate::answer::answer_and_close;
use bytes::Bytes;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

/// Longest a refusal may take: TLS handshake, answer, and waiting for the
/// client to close.
pub const REFUSAL_TIME: Duration = Duration::from_secs(3);

/// Answers a connection over the cap with `response` (through TLS on a TLS
/// port) and closes it, within [`REFUSAL_TIME`].
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
    let _ = tokio::time::timeout(REFUSAL_TIME, answer).await;
}
