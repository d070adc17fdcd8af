//! TCP relays between a proxy and its store, to put the store's timing in
//! a test's hands.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A TCP relay in front of a store that holds back the request whose head
/// contains `marker` for `hold` before passing it on, as a store does that
/// has received a request and not yet committed it. The store still gets
/// (and commits) the request if the client closes its connection meanwhile;
/// `closed` is set when the client closed a connection that carried the
/// marker.
pub async fn holding_relay(
    target: String,
    marker: &'static str,
    hold: Duration,
    closed: Arc<AtomicBool>,
) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let target = target.clone();
            let closed = closed.clone();
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(&target).await else {
                    return;
                };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let (seen_tx, seen_rx) = tokio::sync::watch::channel(false);
                // Client → store: every byte is delivered, after the hold
                // when the marker passes, even once the client is gone.
                let (to_store, mut queue) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
                tokio::spawn(async move {
                    while let Some(chunk) = queue.recv().await {
                        if String::from_utf8_lossy(&chunk).contains(marker) {
                            tokio::time::sleep(hold).await;
                        }
                        if sw.write_all(&chunk).await.is_err() {
                            return;
                        }
                    }
                });
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        match cr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                if String::from_utf8_lossy(&buf[..n]).contains(marker) {
                                    let _ = seen_tx.send(true);
                                }
                                if to_store.send(buf[..n].to_vec()).is_err() {
                                    return;
                                }
                            }
                        }
                    }
                    if *seen_tx.borrow() {
                        closed.store(true, Ordering::Release);
                    }
                });
                // Store → client: answers pass through; the store's side is
                // read to the end even when the client is gone.
                let mut buf = vec![0u8; 64 * 1024];
                let mut client_gone = false;
                while let Ok(n) = sr.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    if !client_gone && cw.write_all(&buf[..n]).await.is_err() {
                        client_gone = true;
                    }
                }
                drop(seen_rx);
            });
        }
    });
    format!("http://{addr}")
}
