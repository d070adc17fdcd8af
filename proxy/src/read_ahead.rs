//! Read-ahead for a large upload's body: a task on the same serving thread
//! reads the client's body a frame or two ahead of the store's side, so that
//! reading from the client goes on while a write to the store waits for
//! room in its socket, as a plain forwarder's event loop does.
//!
//! Without it the two alternate: hyper's server reads the next frame only
//! once its client has taken the last one, and the client takes it only
//! once the store's socket took the one before (BENCHMARKS.md, large
//! PUTs).
//!
//! It must sit upstream of everything that can end a write early (the cut
//! of `body::Cancellable`, the trailer's check): those are polled by the
//! store's side, so however far ahead the client has been read, a raise
//! still stops a body whose last frame the store's side has not taken, as
//! without read-ahead. (Once it has taken it, the write is all sent, and a
//! raise waits for the store's answer instead.)
//!
//! The task starts when the store's side first asks for the body, so a
//! write refused before it is sent reads nothing of it.

use bytes::Bytes;
use futures::{Stream, StreamExt};
use s3s::StdError;
use s3s::dto::StreamingBlob;
use s3s::stream::{ByteStream, RemainingLength};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

/// Frames held ahead of the store's side: one in the channel and one
/// waiting to go in, each at most hyper's read buffer (about 400 KiB), so
/// an upload holds at most about 800 KiB more than without read-ahead.
const FRAMES: usize = 1;

/// A body at least this long is read ahead; a shorter one is sent in a
/// frame or two, and the task would cost more than it saves.
pub const MIN_LEN: u64 = 1024 * 1024;

/// Uploads read ahead at once, per proxy: at most about 50 MiB held
/// ahead in all. An upload past them streams as it would without.
const AT_ONCE: usize = 64;

/// The proxy's read-ahead slots.
#[derive(Debug, Clone)]
pub struct ReadAheads {
    slots: Arc<Semaphore>,
}

impl Default for ReadAheads {
    fn default() -> ReadAheads {
        ReadAheads {
            slots: Arc::new(Semaphore::new(AT_ONCE)),
        }
    }
}

impl ReadAheads {
    /// `body` of `length` bytes, read ahead when it is long enough and a
    /// slot is free; else `body` itself.
    pub fn wrap(&self, body: StreamingBlob, length: Option<i64>) -> StreamingBlob {
        let long = length.is_some_and(|l| u64::try_from(l).is_ok_and(|l| l >= MIN_LEN));
        if !long {
            return body;
        }
        match self.slots.clone().try_acquire_owned() {
            Ok(slot) => read_ahead(body, slot),
            Err(_) => body,
        }
    }
}

/// `body`, read ahead by a task of the current runtime once the store's
/// side first asks for it (so a write refused before it is sent reads
/// nothing, and a client that sent `Expect: 100-continue` is not asked for
/// its body). The task ends when the body does, fails, or is no longer
/// wanted (the returned body was dropped), and drops the client's body
/// and its `slot` then.
fn read_ahead(body: StreamingBlob, slot: OwnedSemaphorePermit) -> StreamingBlob {
    let remaining = body.remaining_length().exact();
    StreamingBlob::new(Ahead {
        state: State::Idle(Some((body, slot))),
        remaining,
    })
}

/// Reads `body` into `ahead` until it ends, fails, or `ahead` is closed.
async fn pump(
    mut body: StreamingBlob,
    ahead: mpsc::Sender<Result<Bytes, StdError>>,
    _slot: OwnedSemaphorePermit,
) {
    loop {
        let frame = tokio::select! {
            frame = body.next() => frame,
            () = ahead.closed() => return,
        };
        let Some(frame) = frame else { return };
        let failed = frame.is_err();
        if ahead.send(frame).await.is_err() || failed {
            return;
        }
    }
}

/// The store's side of a read-ahead body.
struct Ahead {
    state: State,
    remaining: Option<usize>,
}

enum State {
    /// Not asked for yet: the client's body, untouched, and its slot.
    Idle(Option<(StreamingBlob, OwnedSemaphorePermit)>),
    /// The task reads it.
    Reading(mpsc::Receiver<Result<Bytes, StdError>>),
    /// It failed: nothing follows its error.
    Failed,
}

/// The task ended before the body did (it panicked): the body is short.
#[derive(Debug, thiserror::Error)]
#[error("the request body's read-ahead ended {0} bytes before its end")]
struct EndedEarly(usize);

impl Stream for Ahead {
    type Item = Result<Bytes, StdError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let State::Idle(body) = &mut self.state {
            let Some((body, slot)) = body.take() else {
                return Poll::Ready(None);
            };
            let (ahead, rx) = mpsc::channel(FRAMES);
            tokio::spawn(pump(body, ahead, slot));
            self.state = State::Reading(rx);
        }
        let State::Reading(rx) = &mut self.state else {
            return Poll::Ready(None);
        };
        let polled = rx.poll_recv(cx);
        match (&polled, self.remaining.as_mut()) {
            (Poll::Ready(Some(Ok(frame))), Some(r)) => *r = r.saturating_sub(frame.len()),
            (Poll::Ready(None), Some(r)) if *r > 0 => {
                let short = *r;
                *r = 0;
                return Poll::Ready(Some(Err(Box::new(EndedEarly(short)))));
            }
            (Poll::Ready(Some(Err(_))), _) => self.state = State::Failed,
            _ => {}
        }
        polled
    }
}

impl ByteStream for Ahead {
    fn remaining_length(&self) -> RemainingLength {
        self.remaining
            .map_or_else(RemainingLength::unknown, RemainingLength::new_exact)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `body` read ahead, with a slot of its own.
    fn read_ahead(body: StreamingBlob) -> StreamingBlob {
        let slot = Arc::new(Semaphore::new(1))
            .try_acquire_owned()
            .expect("a slot");
        super::read_ahead(body, slot)
    }

    fn blob(frames: Vec<Result<&'static [u8], &'static str>>) -> StreamingBlob {
        let len = frames.iter().flatten().map(|f| f.len()).sum();
        let stream = futures::stream::iter(frames.into_iter().map(|f| {
            f.map(Bytes::from_static)
                .map_err(|e| -> StdError { e.into() })
        }));
        StreamingBlob::new(Exact { stream, len })
    }

    struct Exact<S> {
        stream: S,
        len: usize,
    }

    impl<S: Stream<Item = Result<Bytes, StdError>> + Unpin> Stream for Exact<S> {
        type Item = Result<Bytes, StdError>;
        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            Pin::new(&mut self.stream).poll_next(cx)
        }
    }

    impl<S: Stream<Item = Result<Bytes, StdError>> + Unpin> ByteStream for Exact<S> {
        fn remaining_length(&self) -> RemainingLength {
            RemainingLength::new_exact(self.len)
        }
    }

    #[tokio::test]
    async fn frames_pass_in_order_with_the_length_left() {
        let mut body = read_ahead(blob(vec![Ok(b"ab"), Ok(b"cde"), Ok(b"f")]));
        assert_eq!(body.remaining_length().exact(), Some(6));
        let mut seen = Vec::new();
        while let Some(frame) = body.next().await {
            seen.push(frame.expect("frame"));
            seen.push(Bytes::from(
                body.remaining_length().exact().expect("exact").to_string(),
            ));
        }
        assert_eq!(
            seen,
            ["ab", "4", "cde", "1", "f", "0"].map(|s| Bytes::from_static(s.as_bytes()))
        );
    }

    #[tokio::test]
    async fn an_error_ends_the_body_after_the_frames_before_it() {
        let mut body = read_ahead(blob(vec![Ok(b"ab"), Err("client went away"), Ok(b"x")]));
        assert_eq!(body.next().await.expect("a frame").expect("ok"), "ab");
        let e = body.next().await.expect("a frame").expect_err("the error");
        assert_eq!(e.to_string(), "client went away");
        assert!(body.next().await.is_none(), "nothing after the error");
    }

    #[tokio::test]
    async fn nothing_is_read_before_the_store_asks() {
        let (mut tx, rx) = futures::channel::mpsc::channel::<Result<Bytes, StdError>>(8);
        let polled = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = polled.clone();
        let client = rx.inspect(move |_| {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        tx.try_send(Ok(Bytes::from_static(b"abc"))).expect("queued");
        let mut body = read_ahead(StreamingBlob::new(Exact {
            stream: client,
            len: 3,
        }));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(polled.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert_eq!(body.next().await.expect("a frame").expect("ok"), "abc");
    }

    #[tokio::test]
    async fn only_long_bodies_are_read_ahead_and_only_while_a_slot_is_free() {
        let aheads = ReadAheads::default();
        let short = aheads.wrap(blob(vec![Ok(b"ab")]), Some(2));
        assert_eq!(aheads.slots.available_permits(), AT_ONCE, "{short:?}");
        let held: Vec<_> = (0..AT_ONCE)
            .map(|_| aheads.wrap(blob(vec![Ok(b"ab")]), Some(2 << 20)))
            .collect();
        assert_eq!(aheads.slots.available_permits(), 0);
        let past = aheads.wrap(blob(vec![Ok(b"ab")]), Some(2 << 20));
        assert_eq!(aheads.slots.available_permits(), 0, "{past:?}");
        drop(held);
        assert_eq!(
            aheads.slots.available_permits(),
            AT_ONCE,
            "a slot is freed with its body"
        );
    }

    #[tokio::test]
    async fn a_body_that_ends_short_fails() {
        let mut body = read_ahead(StreamingBlob::new(Exact {
            stream: futures::stream::iter([Ok(Bytes::from_static(b"ab"))]),
            len: 5,
        }));
        assert_eq!(body.next().await.expect("a frame").expect("ok"), "ab");
        let e = body.next().await.expect("an error").expect_err("short");
        assert!(e.to_string().contains("3 bytes before its end"), "{e}");
        assert!(body.next().await.is_none());
    }

    #[tokio::test]
    async fn dropping_the_body_lets_go_of_a_silent_client() {
        let (tx, rx) = futures::channel::mpsc::channel::<Result<Bytes, StdError>>(1);
        let dropped = std::sync::Arc::new(());
        let held = dropped.clone();
        let silent = rx.map(move |f| {
            let _ = &held;
            f
        });
        let mut body = read_ahead(StreamingBlob::new(Exact {
            stream: silent,
            len: 10,
        }));
        // Asked once, so the task runs and waits on the silent client.
        assert!(futures::poll!(body.next()).is_pending());
        assert_eq!(
            std::sync::Arc::strong_count(&dropped),
            2,
            "the task holds it"
        );
        drop(body);
        for _ in 0..100 {
            if std::sync::Arc::strong_count(&dropped) == 1 {
                drop(tx);
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the task still holds the client's body");
    }
}
