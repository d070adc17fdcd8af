//! `floor`: the least a forwarder built on hyper costs per request, as a
//! measuring stick for the proxy, never a product.
//!
//! It is the proxy's own layout with nothing in between: one single-threaded
//! tokio runtime per core (the proxy's `fencegate_net::Workers`), hyper's
//! HTTP/1 server on the client side, and hyper's connection-level HTTP/1
//! client (`hyper::client::conn::http1`) with the store connections kept in
//! a list per thread (the proxy's `lean::conns`). A request is passed on as
//! it came, as nginx passes it (its `Host`, so the client's signature for
//! the store stays valid); the answer's body is read whole before the
//! connection goes back to the list and the answer to the client, as the
//! proxy's lean path reads it. No signature, fence, condition, token,
//! metric, log, limit or timeout.
//!
//! What the proxy costs above this is the product's own work; what this
//! costs above nginx is what any design on hyper and tokio starts from.
//!
//! Run by `small --floor` as `fencegate-bench floor --upstream HOST:PORT`:
//! it prints `listening on http://127.0.0.1:PORT` and serves until killed.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response};
use std::cell::RefCell;
use std::net::SocketAddr;
use tokio::net::{TcpListener, TcpStream};

thread_local! {
    /// This thread's idle connections to the store.
    static IDLE: RefCell<Vec<SendRequest<Incoming>>> = const { RefCell::new(Vec::new()) };
}

/// Serves on an ephemeral port of 127.0.0.1 with one thread per core, each
/// accepting on the port (`SO_REUSEPORT`), until the process is killed.
pub fn serve(upstream: SocketAddr) -> anyhow::Result<()> {
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let first = listener(SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let addr = first.local_addr()?;
    let mut listeners = vec![first];
    for _ in 1..threads {
        listeners.push(listener(addr)?);
    }
    let mut joins = Vec::new();
    for (i, l) in listeners.into_iter().enumerate() {
        joins.push(
            std::thread::Builder::new()
                .name(format!("floor-{i}"))
                .spawn(move || run_thread(l, upstream))?,
        );
    }
    println!("listening on http://{addr}");
    for j in joins {
        j.join()
            .map_err(|_| anyhow::anyhow!("a serving thread panicked"))??;
    }
    Ok(())
}

fn listener(addr: SocketAddr) -> anyhow::Result<std::net::TcpListener> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    Ok(s.into())
}

fn run_thread(l: std::net::TcpListener, upstream: SocketAddr) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let l = TcpListener::from_std(l)?;
        loop {
            let (conn, _) = l.accept().await?;
            conn.set_nodelay(true)?;
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| forward(req, upstream));
                // A client that goes away ends its connection; nothing to report.
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(conn), service)
                    .await;
            });
        }
    })
}

/// Passes `req` on to the store on one of this thread's connections.
async fn forward(
    req: Request<Incoming>,
    upstream: SocketAddr,
) -> Result<Response<Full<Bytes>>, Box<dyn std::error::Error + Send + Sync>> {
    let mut sender = match IDLE.with(|idle| idle.borrow_mut().pop()) {
        Some(s) if !s.is_closed() => s,
        _ => connect(upstream).await?,
    };
    sender.ready().await?;
    let (mut parts, body) = sender.send_request(req).await?.into_parts();
    let body = body.collect().await?.to_bytes();
    // Answered with the length of what was read.
    parts.headers.remove(hyper::header::TRANSFER_ENCODING);
    IDLE.with(|idle| idle.borrow_mut().push(sender));
    Ok(Response::from_parts(parts, Full::new(body)))
}

async fn connect(upstream: SocketAddr) -> anyhow::Result<SendRequest<Incoming>> {
    let tcp = TcpStream::connect(upstream).await?;
    tcp.set_nodelay(true)?;
    let (sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
    tokio::spawn(async move {
        // Ends when the store closes it or the sender is dropped.
        let _ = conn.await;
    });
    Ok(sender)
}
