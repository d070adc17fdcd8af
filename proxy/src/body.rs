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
use std::task::{Context, Poll};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// The error a cut body ends with.
#[derive(Debug, thiserror::Error)]
#[error("upload cut: a newer fencing token was admitted in this scope")]
pub struct Cut;

/// A body that ends with [`Cut`] once `cancel` fires.
#[allow(
    missing_debug_implementations,
    reason = "holds a boxed future and a stream"
)]
pub struct Cancellable {
    inner: StreamingBlob,
    cancelled: Pin<Box<WaitForCancellationFutureOwned>>,
    remaining: Option<usize>,
}

impl Cancellable {
    pub fn wrap(inner: StreamingBlob, cancel: CancellationToken) -> StreamingBlob {
        let remaining = inner.remaining_length().exact();
        StreamingBlob::new(Cancellable {
            inner,
            cancelled: Box::pin(cancel.cancelled_owned()),
            remaining,
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
        if let Poll::Ready(Some(Ok(chunk))) = &polled
            && let Some(r) = self.remaining.as_mut()
        {
            *r = r.saturating_sub(chunk.len());
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
