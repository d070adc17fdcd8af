//! Request bodies that a newer epoch can cut.
//!
//! A write's body is streamed from the client to the backend. When a higher
//! token is admitted in the scope, the body of every older write still
//! streaming ends with an error instead of its remaining bytes, so the
//! backend sees a truncated request and never commits the object.
//!
//! A body whose client sends nothing for `client_idle_timeout_secs` ends the
//! same way (S3 answers such a client 400 `RequestTimeout` too): a client
//! that vanished without closing its connection would otherwise hold its
//! key, and the holder's retry of the same key would wait behind it.

use bytes::Bytes;
use futures::Stream;
use s3s::StdError;
use s3s::dto::StreamingBlob;
use s3s::stream::{ByteStream, RemainingLength};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// The error a cut body ends with.
#[derive(Debug, thiserror::Error)]
#[error("upload cut: a newer fencing token was admitted in this scope")]
pub struct Cut;

/// The error a body ends with when its client went silent.
#[derive(Debug, thiserror::Error)]
#[error("upload cut: the client sent nothing for {0:?}")]
pub struct Idle(Duration);

/// What a write learns about its body as it streams: when the last byte was
/// handed to the backend, and whether the client went silent.
#[derive(Debug, Clone)]
pub struct BodyWatch {
    /// Notified when the last byte has been handed to the backend (the
    /// backend's answer timeout counts from there).
    pub sent: Arc<Notify>,
    stalled: Arc<AtomicBool>,
    idle: Duration,
}

impl BodyWatch {
    pub fn new(idle: Duration) -> BodyWatch {
        BodyWatch {
            sent: Arc::new(Notify::new()),
            stalled: Arc::new(AtomicBool::new(false)),
            idle,
        }
    }

    /// The body was cut because the client sent nothing for too long.
    pub fn stalled(&self) -> Option<Duration> {
        self.stalled.load(Ordering::Acquire).then_some(self.idle)
    }
}

/// The client's error for a write that failed with `e`: 400
/// `RequestTimeout` if its body (watched by `watch`) was cut because the
/// client went silent, else `e`.
pub fn unless_stalled(watch: Option<&BodyWatch>, e: s3s::S3Error) -> s3s::S3Error {
    match watch.and_then(BodyWatch::stalled) {
        Some(idle) => crate::errors::request_timeout(idle),
        None => e,
    }
}

pin_project_lite::pin_project! {
    /// A body that ends with [`Cut`] once `cancel` fires, and signals `sent`
    /// when its last byte has been handed to the backend connection. Its
    /// two timers live in it, so the body takes one allocation (its box).
    #[allow(
        missing_debug_implementations,
        reason = "holds a future and a stream"
    )]
    pub struct Cancellable {
        inner: StreamingBlob,
        #[pin]
        cancelled: WaitForCancellationFutureOwned,
        // With replicas: the replica's standing, checked before every
        // chunk (a replica resumed after a pause may poll the body before
        // its own standing check has run and cut it).
        standing: Option<crate::state::cluster::Cluster>,
        remaining: Option<usize>,
        watch: BodyWatch,
        #[pin]
        idle: Sleep,
        // Since when the proxy has been waiting for the client (from the
        // first `Pending` after a chunk): the idle clock runs only then, so
        // a backend slow to take the bytes is not blamed on the client. The
        // timer is re-armed lazily, when it fires, not on every chunk.
        waiting_since: Option<Instant>,
    }
}

impl Cancellable {
    /// Wraps `inner`, reporting to `watch`.
    pub fn wrap(
        inner: StreamingBlob,
        cancel: CancellationToken,
        standing: Option<crate::state::cluster::Cluster>,
        watch: &BodyWatch,
    ) -> StreamingBlob {
        let remaining = inner.remaining_length().exact();
        // An empty body is never polled (a sender of a known length has
        // nothing to ask for): it is all sent from the start, and the
        // backend's answer timeout runs from now.
        if remaining == Some(0) {
            watch.sent.notify_one();
        }
        StreamingBlob::new(Cancellable {
            inner,
            cancelled: cancel.cancelled_owned(),
            standing,
            remaining,
            idle: tokio::time::sleep(watch.idle),
            waiting_since: None,
            watch: watch.clone(),
        })
    }
}

impl Stream for Cancellable {
    type Item = Result<Bytes, StdError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut this = self.project();
        // Checked before every chunk, and woken by the cancellation itself
        // while the client is silent (a paused writer sends nothing).
        if this.cancelled.as_mut().poll(cx).is_ready()
            || this.standing.as_ref().is_some_and(|c| !c.admits())
        {
            return Poll::Ready(Some(Err(Box::new(Cut))));
        }
        let polled = Pin::new(&mut *this.inner).poll_next(cx);
        match &polled {
            Poll::Ready(Some(Ok(chunk))) => {
                *this.waiting_since = None;
                if let Some(r) = this.remaining.as_mut() {
                    *r = r.saturating_sub(chunk.len());
                    // A client of a known length may stop polling after the
                    // last byte without asking for the end of the stream.
                    if *r == 0 {
                        this.watch.sent.notify_one();
                    }
                }
            }
            Poll::Ready(None) => this.watch.sent.notify_one(),
            Poll::Pending => {
                let since = *this.waiting_since.get_or_insert_with(Instant::now);
                if this.idle.as_mut().poll(cx).is_ready() {
                    // The timer may be from an earlier wait: judge this one.
                    let deadline = since + this.watch.idle;
                    if Instant::now() >= deadline {
                        this.watch.stalled.store(true, Ordering::Release);
                        return Poll::Ready(Some(Err(Box::new(Idle(this.watch.idle)))));
                    }
                    this.idle.as_mut().reset(deadline);
                    // Registers the wake-up at the new deadline.
                    let _ = this.idle.as_mut().poll(cx);
                }
            }
            Poll::Ready(Some(Err(_))) => {}
        }
        polled
    }
}

impl ByteStream for Cancellable {
    fn remaining_length(&self) -> RemainingLength {
        self.remaining
            .map_or_else(RemainingLength::unknown, RemainingLength::new_exact)
    }
}
