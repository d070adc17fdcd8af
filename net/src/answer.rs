//! A connection answered with one canned response and closed: over the
//! connection cap (`503`, `refuse`), or plain HTTP sent to a TLS port
//! (`400`, `tls`). A leaf: both use it.

use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

/// How long a closing connection keeps reading what the client still sends.
const LINGER: Duration = Duration::from_secs(1);
/// How long a refused connection waits for the request head it answers.
const HEAD_WAIT: Duration = Duration::from_secs(1);
/// Most bytes of a request head read before answering anyway.
const HEAD_LIMIT: usize = 16 * 1024;

/// Waits for the request head (up to [`HEAD_WAIT`] and [`HEAD_LIMIT`]
/// bytes), writes `response`, closes the sending side, and reads
/// (discarding) what the client still sends until it closes or [`LINGER`]
/// passes.
///
/// An answer that arrives before its request is sent is, to an HTTP client,
/// a message out of nowhere (hyper's client fails with "unexpected
/// message"), hence the wait. And closing a socket with unread data in it
/// resets the connection, which can destroy the answer before the client
/// read it; reading until the client's own close (it closes on
/// `Connection: close`) avoids that.
pub(crate) async fn answer_and_close<S>(mut stream: S, response: &[u8])
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let head = async {
        let mut seen = Vec::new();
        let mut buf = [0u8; 1024];
        while seen.len() < HEAD_LIMIT {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
            if seen.windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
        true
    };
    if let Ok(false) = tokio::time::timeout(HEAD_WAIT, head).await {
        return;
    }
    if stream.write_all(response).await.is_err() || stream.shutdown().await.is_err() {
        return;
    }
    let drain = async {
        let mut buf = [0u8; 4096];
        while let Ok(1..) = stream.read(&mut buf).await {}
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}
