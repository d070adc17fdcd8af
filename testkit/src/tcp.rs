//! Hand-written TCP servers that play a peer: a lease service that
//! answers late or never, a store that counts bytes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
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

/// [`server`] whose handler is given a counter (of requests, bytes or
/// connections: the handler decides what it counts); the address and the
/// counter.
pub async fn counting_server<F, Fut>(serve: F) -> (SocketAddr, Arc<AtomicUsize>)
where
    F: Fn(TcpStream, Arc<AtomicUsize>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let count = Arc::new(AtomicUsize::new(0));
    let counter = count.clone();
    let addr = server(move |conn| serve(conn, counter.clone())).await;
    (addr, count)
}
