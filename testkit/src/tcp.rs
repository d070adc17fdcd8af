//! Hand-written TCP servers that play a peer: a lease service that
//! answers late or never, a store that counts bytes.

use std::net::SocketAddr;
use tokio::net::{TcpListener, TcpStream};

/// A server on an OS-chosen port of 127.0.0.1 that hands every
/// connection to `serve`, each on a task of its own, for as long as the
/// runtime runs. Its address.
pub async fn server<F, Fut>(serve: F) -> SocketAddr
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            tokio::spawn(serve(conn));
        }
    });
    addr
}
