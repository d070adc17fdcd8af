//! How fencegate notices a peer that vanished without a FIN or an RST (a
//! partition, a host that lost power, a stopped VM, a NAT that forgot the
//! flow): such a connection stays "open" to the kernel for as long as
//! nothing is sent, and a sent segment is retransmitted for about 15
//! minutes before the kernel gives up. One policy for the connections
//! fencegate accepts and those its HTTP clients open:
//!
//! - **TCP keepalive**: after [`IDLE`] without traffic, a probe every
//!   [`INTERVAL`], and the connection is dropped after [`RETRIES`]
//!   unanswered ones: an idle connection to a dead peer is gone within
//!   `IDLE + RETRIES × INTERVAL` (11 s), so the next request opens a new
//!   one instead of waiting on the dead one;
//! - **TCP user timeout** on the HTTP clients' connections (lease and fence
//!   clients): data sent and not acknowledged for [`USER_TIMEOUT`] drops
//!   the connection (a request sent into a partition fails in 15 s at
//!   most, whatever the application's own timeout).
//!
//! Application timeouts still bound each request (etcd's
//! `request_timeout`, the lease client's); these bound what no request is
//! waiting on: idle pooled connections, watch streams, an acquire waiting
//! in line for a client that is gone.
//!
//! Not the proxy's connections to the store: there a kernel abort of a
//! write's connection would read as an answered error, while the store,
//! cut off but alive, may still commit what it was sent. Those stay with
//! `backend.timeout_secs` and the unanswered-write path
//! (`proxy/src/send_check.rs`).

use std::time::Duration;

pub const IDLE: Duration = Duration::from_secs(5);
pub const INTERVAL: Duration = Duration::from_secs(2);
pub const RETRIES: u32 = 3;
pub const USER_TIMEOUT: Duration = Duration::from_secs(15);

fn keepalive() -> socket2::TcpKeepalive {
    socket2::TcpKeepalive::new()
        .with_time(IDLE)
        .with_interval(INTERVAL)
        .with_retries(RETRIES)
}

/// Sets the policy on an accepted connection: keepalive probes, so that a
/// client gone silent (an acquire waiting in line, a slow upload) is
/// noticed by the kernel. A socket that refuses the options is served
/// as it is.
pub fn accepted(tcp: &tokio::net::TcpStream) {
    let sock = socket2::SockRef::from(tcp);
    let _ = sock.set_tcp_keepalive(&keepalive());
}

/// The policy on an HTTP client (the lease client, the fence client).
pub fn client(builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
    builder
        .tcp_keepalive(IDLE)
        .tcp_keepalive_interval(INTERVAL)
        .tcp_keepalive_retries(RETRIES)
        .tcp_user_timeout(USER_TIMEOUT)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The options reach the socket (read back from the kernel).
    #[tokio::test]
    async fn an_accepted_connection_gets_keepalive_probes() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let _client = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (tcp, _) = listener.accept().await.expect("accept");
        accepted(&tcp);
        let sock = socket2::SockRef::from(&tcp);
        assert!(sock.keepalive().expect("SO_KEEPALIVE"));
        assert_eq!(sock.tcp_keepalive_time().expect("TCP_KEEPIDLE"), IDLE);
        assert_eq!(
            sock.tcp_keepalive_interval().expect("TCP_KEEPINTVL"),
            INTERVAL
        );
        assert_eq!(sock.tcp_keepalive_retries().expect("TCP_KEEPCNT"), RETRIES);
    }
}
