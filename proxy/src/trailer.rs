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
//! the whole of a body unlike its checksum, and never commits it. A body
//! of length 0, which no sender reads, is read to its end first
//! ([`settle_empty`]).
//!
//! Every `aws-chunked` body is held to its declared length the same way
//! (`x-amz-decoded-content-length`, which s3s does not enforce): a byte
//! beyond it fails the body at once, and the chunk that reaches it waits
//! for the end. Otherwise a sender that stops at the length would deliver
//! the first bytes of a longer body, and the store commit that prefix.

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

/// The values of `c`, in the order of [`NAMES`].
pub fn by_name(c: s3s::dto::Checksum) -> [Option<String>; 5] {
    [
        c.checksum_crc32,
        c.checksum_crc32c,
        c.checksum_sha1,
        c.checksum_sha256,
        c.checksum_crc64nvme,
    ]
}

/// Why a checked body failed, shared between the body and the write that
/// answers the client (a 400, the client's mistake, not the backend error
/// the cut-short send becomes).
#[derive(Debug, Default, Clone)]
pub struct Verdict(Arc<Mutex<Option<(s3s::S3ErrorCode, String)>>>);

impl Verdict {
    fn set(&self, code: s3s::S3ErrorCode, why: String) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some((code, why));
    }

    /// The client's error, if the body failed its checksum (`BadDigest`) or
    /// its declared length (`IncompleteBody`).
    pub fn failed(&self) -> Option<s3s::S3Error> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .map(|(code, why)| s3s::S3Error::with_message(code, why))
    }
}

/// Wraps `body` when s3s decoded it from `aws-chunked` (`headers`): held
/// to its declared length, and to the checksum its trailer carries when
/// `x-amz-trailer` announced one (`trailing`: the trailer s3s parses).
/// Other bodies are left as they are. The verdict says why a checked body
/// failed, if it does.
pub fn check(
    body: &mut Option<StreamingBlob>,
    headers: &HeaderMap,
    trailing: Option<&TrailingHeaders>,
) -> Verdict {
    let verdict = Verdict::default();
    if !chunked(headers) {
        return verdict;
    }
    let Some(inner) = body.take() else {
        return verdict;
    };
    let announced = headers
        .get("x-amz-trailer")
        .map(|a| String::from_utf8_lossy(a.as_bytes()).to_ascii_lowercase());
    let checksum = trailing.zip(announced).and_then(|(trailing, announced)| {
        let index = NAMES
            .iter()
            .position(|n| announced.split(',').any(|a| a.trim() == *n))?;
        let mut hasher = ChecksumHasher::default();
        match index {
            0 => hasher.crc32 = Some(s3s::crypto::Crc32::new()),
            1 => hasher.crc32c = Some(s3s::crypto::Crc32c::new()),
            2 => hasher.sha1 = Some(s3s::crypto::Sha1::new()),
            3 => hasher.sha256 = Some(s3s::crypto::Sha256::new()),
            _ => hasher.crc64nvme = Some(s3s::crypto::Crc64Nvme::new()),
        }
        Some(Trailer {
            index,
            hasher,
            trailing: trailing.clone(),
        })
    });
    let declared = inner.remaining_length().exact();
    *body = Some(StreamingBlob::new(Checked {
        inner,
        declared,
        len: 0,
        checksum,
        held: None,
        done: false,
        verdict: verdict.clone(),
    }));
    verdict
}

/// Whether s3s decoded the request's body from `aws-chunked`.
fn chunked(headers: &HeaderMap) -> bool {
    headers
        .get("x-amz-content-sha256")
        .is_some_and(|v| v.as_bytes().starts_with(b"STREAMING-"))
        || headers
            .get_all(http::header::CONTENT_ENCODING)
            .iter()
            .any(|v| {
                String::from_utf8_lossy(v.as_bytes())
                    .to_ascii_lowercase()
                    .contains("aws-chunked")
            })
}

/// Reads an `aws-chunked` body that declares no data to its end before
/// anything is sent, so that its trailer is checked: a sender never polls
/// a body of length 0, and the store would commit the empty object
/// whatever checksum the trailer carried. Call it on the watched body
/// (`Gate::watch_body`), which a raise or a silent client cuts. Other
/// bodies are left alone.
pub async fn settle_empty(
    body: &mut Option<StreamingBlob>,
    headers: &HeaderMap,
    verdict: &Verdict,
) -> Result<(), s3s::S3Error> {
    let Some(inner) = body.as_mut() else {
        return Ok(());
    };
    if !chunked(headers) || inner.remaining_length().exact() != Some(0) {
        return Ok(());
    }
    while let Some(chunk) = futures::StreamExt::next(inner).await {
        if let Err(e) = chunk {
            return Err(verdict.failed().unwrap_or_else(|| {
                s3s::s3_error!(IncompleteBody, "the request body ended early: {e}")
            }));
        }
    }
    Ok(())
}

/// The checksum a trailer announced: which of [`NAMES`], the data's hash
/// so far, and the trailer s3s fills in at the end.
struct Trailer {
    index: usize,
    hasher: ChecksumHasher,
    trailing: TrailingHeaders,
}

impl Trailer {
    /// Whether the data matches the checksum the trailer carried.
    fn verify(self) -> Result<(), String> {
        let name = NAMES[self.index];
        let sent = self
            .trailing
            .read(|h| h.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned))
            .flatten()
            .ok_or_else(|| {
                format!("x-amz-trailer announced {name}, but the trailer did not carry it")
            })?;
        let got = by_name(self.hasher.finalize());
        if got[self.index].as_deref() != Some(sent.trim()) {
            return Err(format!("the body does not match its trailing {name}"));
        }
        Ok(())
    }
}

/// The body of [`check`].
struct Checked {
    inner: StreamingBlob,
    /// The decoded length the request declared, and how much arrived.
    declared: Option<usize>,
    len: usize,
    checksum: Option<Trailer>,
    /// The chunk kept back until the next one (or the checked end) arrives.
    held: Option<Bytes>,
    done: bool,
    verdict: Verdict,
}

/// The error a body unlike its trailing checksum or declared length ends
/// with.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Mismatch(String);

impl Checked {
    /// Ends the body with `why`, the kept chunk dropped.
    fn fail(&mut self, code: s3s::S3ErrorCode, why: String) -> StdError {
        self.done = true;
        self.held = None;
        self.verdict.set(code, why.clone());
        Box::new(Mismatch(why))
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
                Poll::Ready(Some(Ok(chunk))) if chunk.is_empty() => {}
                Poll::Ready(Some(Ok(chunk))) => {
                    this.len += chunk.len();
                    if let Some(declared) = this.declared
                        && this.len > declared
                    {
                        let why = format!(
                            "the body is longer than the {declared} bytes of x-amz-decoded-content-length"
                        );
                        return Poll::Ready(Some(Err(
                            this.fail(s3s::S3ErrorCode::IncompleteBody, why)
                        )));
                    }
                    if let Some(t) = this.checksum.as_mut() {
                        t.hasher.update(&chunk);
                    }
                    if let Some(previous) = this.held.replace(chunk) {
                        return Poll::Ready(Some(Ok(previous)));
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    this.done = true;
                    this.held = None;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    if let Some(declared) = this.declared
                        && this.len != declared
                    {
                        let why = format!(
                            "the body has {} bytes, not the {declared} of x-amz-decoded-content-length",
                            this.len
                        );
                        return Poll::Ready(Some(Err(
                            this.fail(s3s::S3ErrorCode::IncompleteBody, why)
                        )));
                    }
                    this.done = true;
                    if let Some(Err(why)) = this.checksum.take().map(Trailer::verify) {
                        return Poll::Ready(Some(Err(this.fail(s3s::S3ErrorCode::BadDigest, why))));
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
