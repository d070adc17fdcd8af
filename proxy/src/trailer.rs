//! Every integrity value a request body comes with, checked by the proxy
//! before the last byte of the body goes on to the store: on every path
//! (the lean PutObject, the SDK's, parts; signed or anonymous), whatever
//! the store checks itself (RGW 16.2 ignores `x-amz-checksum-*`, and s3s
//! checks no anonymous `x-amz-content-sha256`).
//!
//! The values: `Content-MD5`, each `x-amz-checksum-*` header, the checksum
//! an `aws-chunked` trailer carries, and, on an anonymous request, a
//! SHA-256 `x-amz-content-sha256` (a signed request's is checked with its
//! signature, by s3s or the edge). A value of any other form is refused
//! before the body is read (`access`).
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

use crate::header_names as names;
use bytes::Bytes;
use futures::Stream;
use http::HeaderMap;
use parking_lot::Mutex;
use s3s::checksum::ChecksumHasher;
use s3s::crypto::Checksum as _;
use s3s::dto::StreamingBlob;
use s3s::stream::{ByteStream, RemainingLength};
use s3s::{StdError, TrailingHeaders};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// The checksums a trailer can carry, as `x-amz-trailer` names them.
pub const NAMES: [&str; 5] = [
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
        *self.0.lock() = Some((code, why));
    }

    /// The client's error, if the body failed its checksum (`BadDigest`) or
    /// its declared length (`IncompleteBody`).
    pub fn failed(&self) -> Option<s3s::S3Error> {
        self.0
            .lock()
            .clone()
            .map(|(code, why)| s3s::S3Error::with_message(code, why))
    }
}

/// Wraps `body` to be checked against every integrity value the request
/// carries (`headers`; `trailing`: the trailer s3s parses; `anonymous`:
/// no signature vouched for the payload hash), and, when s3s decoded it
/// from `aws-chunked`, held to its declared length. A body with nothing
/// to check is left as it is. The verdict says why a checked body failed,
/// if it does.
pub fn check(
    body: &mut Option<StreamingBlob>,
    headers: &HeaderMap,
    trailing: Option<&TrailingHeaders>,
    anonymous: bool,
) -> Verdict {
    let verdict = Verdict::default();
    let digests = Digests::wanted(headers, trailing, anonymous);
    let chunked = chunked(headers);
    if !chunked && digests.is_none() {
        return verdict;
    }
    let Some(inner) = body.take() else {
        return verdict;
    };
    let declared = chunked.then(|| inner.remaining_length().exact()).flatten();
    *body = Some(StreamingBlob::new(Checked {
        inner,
        declared,
        len: 0,
        digests,
        held: None,
        done: false,
        verdict: verdict.clone(),
    }));
    verdict
}

/// Checksums a presigned URL (or any request) carries in its query, where
/// the query allowlist accepts them: added to `headers`, so that [`check`]
/// verifies them with the rest (the proxy would otherwise accept a value
/// it neither checks nor forwards).
pub fn hoist_query_checksums(uri: &http::Uri, headers: &mut HeaderMap) {
    let Some(query) = uri.query() else {
        return;
    };
    for pair in query.split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = name.to_ascii_lowercase();
        if !NAMES.contains(&name.as_str()) {
            continue;
        }
        let value =
            urlencoding::decode(value).map_or_else(|_| value.to_owned(), |v| v.into_owned());
        if let (Ok(name), Ok(value)) = (
            http::header::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            headers.append(name, value);
        }
    }
}

/// Whether the request carries a value [`check`] verifies.
pub fn carries_digests(headers: &HeaderMap, anonymous: bool) -> bool {
    Digests::wanted(headers, None, anonymous).is_some()
}

/// The digests a body is checked against, and their hashers.
struct Digests {
    hasher: ChecksumHasher,
    md5: Option<s3s::crypto::Md5>,
    wanted: Vec<Wanted>,
}

/// One value the body must match.
enum Wanted {
    /// `x-amz-checksum-*` (by index in [`NAMES`]), sent as a header.
    Header { index: usize, value: String },
    /// The same, announced by `x-amz-trailer` and sent in the trailer.
    Trailer {
        index: usize,
        trailing: TrailingHeaders,
    },
    /// `Content-MD5`, base64.
    Md5(String),
    /// `x-amz-content-sha256`, lower-case hex: of an anonymous request,
    /// and of any body read whole (`check_whole`).
    PayloadSha256(String),
    /// A trailing value `x-amz-trailer` announces that the proxy cannot
    /// compute (an unknown `x-amz-checksum-*`, or any other name).
    Uncheckable(String),
    /// The trailer carries no `x-amz-checksum-*` but the announced ones.
    OnlyAnnounced {
        announced: Vec<String>,
        trailing: TrailingHeaders,
    },
}

impl Digests {
    fn wanted(
        headers: &HeaderMap,
        trailing: Option<&TrailingHeaders>,
        anonymous: bool,
    ) -> Option<Digests> {
        // One pass first: most requests carry none of them, and each
        // lookup by name below hashes it.
        let any = headers.keys().any(|n| {
            let n = n.as_str();
            n.starts_with("x-amz-checksum-")
                || matches!(n, "content-md5" | "x-amz-trailer")
                || (anonymous && n == "x-amz-content-sha256")
        });
        if !any {
            return None;
        }
        let mut wanted = Vec::new();
        for (index, name) in names::X_AMZ_CHECKSUMS.iter().enumerate() {
            for v in headers.get_all(name) {
                wanted.push(Wanted::Header {
                    index,
                    value: String::from_utf8_lossy(v.as_bytes()).trim().to_owned(),
                });
            }
        }
        let announced = headers
            .get(names::X_AMZ_TRAILER)
            .map(|a| String::from_utf8_lossy(a.as_bytes()).to_ascii_lowercase());
        // Every name the trailer announces is checked, not the first
        // only; a checksum the proxy cannot compute is refused, and so is
        // one the trailer carries without announcing it.
        if let Some((trailing, announced)) = trailing.zip(announced) {
            let mut names: Vec<&str> = announced
                .split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .collect();
            names.sort_unstable();
            names.dedup();
            for name in &names {
                wanted.push(match NAMES.iter().position(|n| n == name) {
                    Some(index) => Wanted::Trailer {
                        index,
                        trailing: trailing.clone(),
                    },
                    None => Wanted::Uncheckable((*name).to_owned()),
                });
            }
            wanted.push(Wanted::OnlyAnnounced {
                announced: names.iter().map(|n| (*n).to_owned()).collect(),
                trailing: trailing.clone(),
            });
        }
        if let Some(v) = headers.get(names::CONTENT_MD5) {
            wanted.push(Wanted::Md5(
                String::from_utf8_lossy(v.as_bytes()).trim().to_owned(),
            ));
        }
        if anonymous
            && let Some(v) = headers.get(names::X_AMZ_CONTENT_SHA256)
            && crate::sigv4::is_sha256_hex(v.as_bytes())
        {
            wanted.push(Wanted::PayloadSha256(
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            ));
        }
        if wanted.is_empty() {
            return None;
        }
        let mut hasher = ChecksumHasher::default();
        let mut md5 = None;
        for w in &wanted {
            match w {
                Wanted::Header { index, .. } | Wanted::Trailer { index, .. } => match index {
                    0 => hasher.crc32 = Some(s3s::crypto::Crc32::new()),
                    1 => hasher.crc32c = Some(s3s::crypto::Crc32c::new()),
                    2 => hasher.sha1 = Some(s3s::crypto::Sha1::new()),
                    3 => hasher.sha256 = Some(s3s::crypto::Sha256::new()),
                    _ => hasher.crc64nvme = Some(s3s::crypto::Crc64Nvme::new()),
                },
                Wanted::Md5(_) => md5 = Some(s3s::crypto::Md5::new()),
                Wanted::PayloadSha256(_) => hasher.sha256 = Some(s3s::crypto::Sha256::new()),
                Wanted::Uncheckable(_) | Wanted::OnlyAnnounced { .. } => {}
            }
        }
        Some(Digests {
            hasher,
            md5,
            wanted,
        })
    }

    fn update(&mut self, data: &[u8]) {
        self.hasher.update(data);
        if let Some(m) = self.md5.as_mut() {
            m.update(data);
        }
    }

    /// Whether the data matches every value wanted; the first it does not
    /// match, said.
    fn verify(self) -> Result<(), String> {
        use base64::Engine as _;
        let md5 = self
            .md5
            .map(|m| base64::engine::general_purpose::STANDARD.encode(m.finalize()));
        let got = by_name(self.hasher.finalize());
        for w in self.wanted {
            match w {
                Wanted::Header { index, value } => {
                    if got[index].as_deref() != Some(value.as_str()) {
                        return Err(format!(
                            "the body does not match its {} header",
                            NAMES[index]
                        ));
                    }
                }
                Wanted::Trailer { index, trailing } => {
                    let name = NAMES[index];
                    let sent = trailing
                        .read(|h| h.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned))
                        .flatten()
                        .ok_or_else(|| {
                            format!(
                                "x-amz-trailer announced {name}, but the trailer did not carry it"
                            )
                        })?;
                    if got[index].as_deref() != Some(sent.trim()) {
                        return Err(format!("the body does not match its trailing {name}"));
                    }
                }
                Wanted::Uncheckable(name) => {
                    return Err(format!(
                        "x-amz-trailer announces {name:?}, which the proxy cannot check: send a trailing checksum among {}",
                        NAMES.join(", ")
                    ));
                }
                Wanted::OnlyAnnounced {
                    announced,
                    trailing,
                } => {
                    let extra = trailing
                        .read(|h| {
                            h.keys().map(|n| n.as_str().to_owned()).find(|n| {
                                n.starts_with("x-amz-checksum-") && !announced.contains(n)
                            })
                        })
                        .flatten();
                    if let Some(name) = extra {
                        return Err(format!(
                            "the trailer carries {name}, which x-amz-trailer did not announce"
                        ));
                    }
                }
                Wanted::Md5(value) => {
                    if md5.as_deref() != Some(value.as_str()) {
                        return Err("the body does not match its Content-MD5".into());
                    }
                }
                Wanted::PayloadSha256(hex) => {
                    let sha = got[3]
                        .as_deref()
                        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                        .map(hex::encode);
                    if sha.as_deref() != Some(hex.as_str()) {
                        return Err("the body's SHA-256 is not its x-amz-content-sha256".into());
                    }
                }
            }
        }
        Ok(())
    }
}

pin_project_lite::pin_project! {
    /// A body s3s reads whole (the XML of DeleteObjects and Complete),
    /// checked against the integrity values its request carries: at its
    /// end, a mismatch fails it, and the verdict says why (s3s would
    /// answer a failed read 500; the server answers the verdict's 400).
    pub struct WholeChecked<B> {
        #[pin]
        inner: B,
        digests: Option<Digests>,
        verdict: Verdict,
    }
}

/// Wraps a body read whole; see [`WholeChecked`]. Its payload hash is
/// checked here whether or not the request is signed. `complete`:
/// the body is a CompleteMultipartUpload's, whose `x-amz-checksum-*`
/// headers are the whole object's (the store checks them), not the XML's.
pub fn check_whole<B>(inner: B, headers: &HeaderMap, complete: bool) -> (WholeChecked<B>, Verdict) {
    let verdict = Verdict::default();
    let mut digests = Digests::wanted(headers, None, true);
    if complete && let Some(d) = digests.as_mut() {
        d.wanted
            .retain(|w| matches!(w, Wanted::Md5(_) | Wanted::PayloadSha256(_)));
    }
    let body = WholeChecked {
        inner,
        digests: digests.filter(|d| !d.wanted.is_empty()),
        verdict: verdict.clone(),
    };
    (body, verdict)
}

impl<B> http_body::Body for WholeChecked<B>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<StdError>,
{
    type Data = Bytes;
    type Error = StdError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, StdError>>> {
        let this = self.project();
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(data), Some(d)) = (frame.data_ref(), this.digests.as_mut()) {
                    d.update(data);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => match this.digests.take().map(Digests::verify) {
                Some(Err(why)) => {
                    this.verdict.set(s3s::S3ErrorCode::BadDigest, why.clone());
                    Poll::Ready(Some(Err(Box::new(Mismatch(why)))))
                }
                _ => Poll::Ready(None),
            },
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.digests.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Whether s3s decoded the request's body from `aws-chunked`.
fn chunked(headers: &HeaderMap) -> bool {
    headers
        .get(names::X_AMZ_CONTENT_SHA256)
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

/// Reads a checked body (`aws-chunked`, or with a value to match) that
/// declares no data to its end before anything is sent, so that its
/// values are checked: a sender never polls a body of length 0, and the
/// store would commit the empty object whatever they said. Call it on the
/// watched body (`Writer::watch_body`), which a raise or a silent client
/// cuts. Other bodies are left alone.
pub async fn settle_empty(
    body: &mut Option<StreamingBlob>,
    headers: &HeaderMap,
    verdict: &Verdict,
) -> Result<(), s3s::S3Error> {
    let Some(inner) = body.as_mut() else {
        return Ok(());
    };
    // The length first: it is known and not 0 on nearly every body, and
    // the headers' check builds what it would verify.
    if inner.remaining_length().exact() != Some(0)
        || !(chunked(headers) || carries_digests(headers, true))
    {
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

/// The body of [`check`].
struct Checked {
    inner: StreamingBlob,
    /// The decoded length the request declared, and how much arrived.
    declared: Option<usize>,
    len: usize,
    digests: Option<Digests>,
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
                    if let Some(d) = this.digests.as_mut() {
                        d.update(&chunk);
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
                    if let Some(Err(why)) = this.digests.take().map(Digests::verify) {
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
