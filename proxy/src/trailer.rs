//! Checksums sent as `aws-chunked` trailers, checked before the last byte
//! of the body goes on to the store.
//!
//! A client that sends its body `aws-chunked` with a trailing checksum
//! (botocore's default: `x-amz-trailer: x-amz-checksum-crc32`, unsigned
//! chunks) protects the body with that checksum alone. s3s decodes the
//! chunks and reads the trailer only after it has handed on the last data
//! bytes, and the proxy sends the decoded body with its length: a sender
//! stops at the length, so nobody would read the trailer and the store
//! would get no checksum to check.
//!
//! [`Checked`] hashes the data as it streams and keeps one chunk back; at
//! the end of the data it reads on (s3s then parses the trailer, and
//! verifies its signature in signed mode), compares, and only then hands
//! on the chunk it kept, or fails the body. The store so never receives
//! the whole of a body unlike its checksum, and never commits it.

use bytes::Bytes;
use futures::Stream;
use http::HeaderMap;
use s3s::checksum::ChecksumHasher;
use s3s::crypto::Checksum as _;
use s3s::dto::StreamingBlob;
use s3s::stream::{ByteStream, RemainingLength};
use s3s::{StdError, TrailingHeaders};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

/// The checksums a trailer can carry, as `x-amz-trailer` names them.
const NAMES: [&str; 5] = [
    "x-amz-checksum-crc32",
    "x-amz-checksum-crc32c",
    "x-amz-checksum-sha1",
    "x-amz-checksum-sha256",
    "x-amz-checksum-crc64nvme",
];

/// Why a checked body failed, shared between the body and the write that
/// answers the client (a 400 `BadDigest`, the client's mistake, not the
/// backend error the truncated send becomes).
#[derive(Debug, Default, Clone)]
pub struct Verdict(Arc<Mutex<Option<String>>>);

impl Verdict {
    fn set(&self, why: String) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
    }

    /// What the body failed on, if it failed its checksum.
    pub fn failed(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Wraps `body` when the request announced a trailing checksum
/// (`x-amz-trailer` in `headers`) and s3s parsed the body `aws-chunked`
/// (`trailing`); otherwise leaves it as it is.
pub fn check(
    body: &mut Option<StreamingBlob>,
    headers: &HeaderMap,
    trailing: Option<&TrailingHeaders>,
    verdict: &Verdict,
) {
    let (Some(trailing), Some(announced)) = (trailing, headers.get("x-amz-trailer")) else {
        return;
    };
    let announced = String::from_utf8_lossy(announced.as_bytes()).to_ascii_lowercase();
    let Some(index) = NAMES
        .iter()
        .position(|n| announced.split(',').any(|a| a.trim() == *n))
    else {
        return;
    };
    let Some(inner) = body.take() else {
        return;
    };
    let mut hasher = ChecksumHasher::default();
    match index {
        0 => hasher.crc32 = Some(s3s::crypto::Crc32::new()),
        1 => hasher.crc32c = Some(s3s::crypto::Crc32c::new()),
        2 => hasher.sha1 = Some(s3s::crypto::Sha1::new()),
        3 => hasher.sha256 = Some(s3s::crypto::Sha256::new()),
        _ => hasher.crc64nvme = Some(s3s::crypto::Crc64Nvme::new()),
    }
    *body = Some(StreamingBlob::new(Checked {
        inner,
        index,
        hasher: Some(hasher),
        trailing: trailing.clone(),
        held: None,
        done: false,
        verdict: verdict.clone(),
    }));
}

/// The body of [`check`].
struct Checked {
    inner: StreamingBlob,
    /// Which of [`NAMES`] the trailer carries.
    index: usize,
    hasher: Option<ChecksumHasher>,
    trailing: TrailingHeaders,
    /// The chunk kept back until the next one (or the checked end) arrives.
    held: Option<Bytes>,
    done: bool,
    verdict: Verdict,
}

/// The error a body unlike its trailing checksum ends with.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Mismatch(String);

impl Checked {
    /// Whether the data matches the checksum the trailer carried.
    fn verify(&mut self) -> Result<(), String> {
        let name = NAMES[self.index];
        let sent = self
            .trailing
            .read(|h| h.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned))
            .flatten()
            .ok_or_else(|| {
                format!("x-amz-trailer announced {name}, but the trailer did not carry it")
            })?;
        let got = self.hasher.take().unwrap_or_default().finalize();
        let got = [
            got.checksum_crc32,
            got.checksum_crc32c,
            got.checksum_sha1,
            got.checksum_sha256,
            got.checksum_crc64nvme,
        ];
        if got[self.index].as_deref() != Some(sent.trim()) {
            return Err(format!("the body does not match its trailing {name}"));
        }
        Ok(())
    }
}

impl Stream for Checked {
    type Item = Result<Bytes, StdError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if this.done {
                return Poll::Ready(this.held.take().map(Ok));
            }
            match Pin::new(&mut this.inner).poll_next(cx) {
                Poll::Ready(Some(Ok(chunk))) => {
                    if let Some(h) = this.hasher.as_mut() {
                        h.update(&chunk);
                    }
                    if let Some(previous) = this.held.replace(chunk) {
                        return Poll::Ready(Some(Ok(previous)));
                    }
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => {
                    this.done = true;
                    if let Err(why) = this.verify() {
                        this.held = None;
                        this.verdict.set(why.clone());
                        return Poll::Ready(Some(Err(Box::new(Mismatch(why)))));
                    }
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl ByteStream for Checked {
    fn remaining_length(&self) -> RemainingLength {
        let held = self.held.as_ref().map_or(0, Bytes::len);
        match self.inner.remaining_length().exact() {
            Some(n) => RemainingLength::new_exact(n + held),
            None => RemainingLength::unknown(),
        }
    }
}
