//! Request bodies that a newer epoch can cut.
//!
//! A write's body is streamed from the client to the backend. When a higher
//! token is admitted in the scope, the body of every older write still
//! streaming ends with an error instead of its remaining bytes, so the
//! backend sees a truncated request and never commits the object.

use bytes::Bytes;
use futures::Stream;
use s3s::StdError;
use s3s::dto::StreamingBlob;
use s3s::stream::{ByteStream, RemainingLength};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::Notify;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// The error a cut body ends with.
#[derive(Debug, thiserror::Error)]
#[error("upload cut: a newer fencing token was admitted in this scope")]
pub struct Cut;

/// A body that ends with [`Cut`] once `cancel` fires, and signals `sent`
/// when its last byte has been handed to the backend connection.
#[allow(
    missing_debug_implementations,
    reason = "holds a boxed future and a stream"
)]
pub struct Cancellable {
    inner: StreamingBlob,
    cancelled: Pin<Box<WaitForCancellationFutureOwned>>,
    remaining: Option<usize>,
    sent: Arc<Notify>,
}

impl Cancellable {
    /// Wraps `inner`; `sent` is notified at the end of the body (the
    /// backend's answer timeout counts from there, not from the start of a
    /// long upload).
    pub fn wrap(
        inner: StreamingBlob,
        cancel: CancellationToken,
        sent: Arc<Notify>,
    ) -> StreamingBlob {
        let remaining = inner.remaining_length().exact();
        StreamingBlob::new(Cancellable {
            inner,
            cancelled: Box::pin(cancel.cancelled_owned()),
            remaining,
            sent,
        })
    }
}

impl Stream for Cancellable {
    type Item = Result<Bytes, StdError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        // Checked before every chunk, and woken by the cancellation itself
        // while the client is silent (a paused writer sends nothing).
        if self.cancelled.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(Box::new(Cut))));
        }
        let polled = Pin::new(&mut self.inner).poll_next(cx);
        match &polled {
            Poll::Ready(Some(Ok(chunk))) => {
                if let Some(r) = self.remaining.as_mut() {
                    *r = r.saturating_sub(chunk.len());
                    // A client of a known length may stop polling after the
                    // last byte without asking for the end of the stream.
                    if *r == 0 {
                        self.sent.notify_one();
                    }
                }
            }
            Poll::Ready(None) => self.sent.notify_one(),
            _ => {}
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
