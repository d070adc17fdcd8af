//! The hot path: a plain signed PutObject served before s3s.
//!
//! s3s parses every request into its typed input, with a general SigV4
//! check; on a small PUT that is a sixth of the proxy's CPU
//! (BENCHMARKS.md). The common case needs little of it: one operation,
//! header-signed, with a body sent as is. This module recognises exactly
//! that case, checks it, and hands it, as the proxy's own
//! [`PutRequest`], to the handler the s3s door leads to (`ops::put::put`).
//!
//! **Invariant: the edge only ever accepts a request s3s would accept**,
//! and admits nothing the access rules would refuse. Everything it does
//! not recognise, and every check that fails, goes to s3s unchanged, which
//! then decides, and words the refusal, as it always did. So:
//!
//! - recognised: `PUT` of an object (path or virtual-hosted style, parsed
//!   by s3s's own path functions), no query but the SDKs' `x-id=PutObject`,
//!   no copy source, `Content-Length` without `Transfer-Encoding`, a payload
//!   hash that is `UNSIGNED-PAYLOAD` or a SHA-256 in hex (checked against
//!   the body as it streams, as s3s does), nothing `aws-chunked`, and one
//!   `Authorization: AWS4-HMAC-SHA256` header in its exact grammar;
//! - checked: the credential's date against `x-amz-date` and the clock
//!   (s3s's 15 minutes), the secret from the same [`ClientAuth`], the
//!   signature over the canonical request s3s builds (decoded path
//!   re-encoded, headers trimmed and whitespace-collapsed), compared in
//!   constant time; then the query allowlist and the key rule, as
//!   [`crate::access::Access`] applies them;
//! - and only then: the lean forwarder can send it as it came
//!   (`request::AsIs::check`), else s3s and the SDK path.
//!
//! `tests/edge_vs_s3s.rs` checks the invariant against s3s itself, request by
//! request, over valid and tampered signatures, paths and headers.

use crate::access::ClientAuth;
use crate::gate::Gate;
use crate::host::VirtualHosts;
use crate::recent::Recent;
use crate::request::{AsIs, PutRequest, Route};
use crate::sigv4::{Hex64, Sink};
use bytes::Bytes;
use hmac::Mac;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use s3s::auth::{Credentials, S3Auth, SecretKey};
use s3s::dto::{ETagCondition, PutObjectOutput, StreamingBlob};
use s3s::host::S3Host;
use s3s::path::S3Path;
use s3s::{Body, S3Error};
use sha2::{Digest, Sha256};
use smallvec::SmallVec;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

/// How far `x-amz-date` may be from the proxy's clock (s3s's default,
/// which the proxy keeps).
const MAX_SKEW: Duration = Duration::from_secs(900);

/// Recognises and serves plain signed PutObjects (see the module docs).
pub struct Edge {
    auth: Arc<ClientAuth>,
    hosts: Arc<VirtualHosts>,
}

impl std::fmt::Debug for Edge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Edge").finish_non_exhaustive()
    }
}

/// A request the edge recognised and verified, with what the handler needs.
#[derive(Debug)]
pub struct Verified {
    bucket: String,
    key: String,
    content_length: u64,
    payload: Payload,
    if_match: Option<ETagCondition>,
    if_none_match: Option<ETagCondition>,
    credentials: Credentials,
    region: String,
}

/// What `x-amz-content-sha256` promises about the body.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Payload {
    Unsigned,
    /// The body's SHA-256, lower-case hex.
    Sha256(Hex64),
}

impl Edge {
    pub fn new(auth: Arc<ClientAuth>, hosts: Arc<VirtualHosts>) -> Edge {
        Edge { auth, hosts }
    }

    /// Serves `req` if it is a plain signed PutObject that passes every
    /// check; otherwise gives it back, untouched, for s3s.
    pub async fn put(
        &self,
        gate: &Gate,
        req: Request<Body>,
    ) -> Result<Response<Body>, Request<Body>> {
        let Some(verified) = self.verify(&req, crate::clock::now()).await else {
            return Err(req);
        };
        let length = i64::try_from(verified.content_length).ok();
        let Some(as_is) = AsIs::check(gate.store.has_lean_forwarder(), length, req.headers())
        else {
            return Err(req);
        };
        if let Err(e) = gate
            .write_headers()
            .check(crate::op::Op::PutObject, req.headers())
        {
            return Ok(error_response(e));
        }
        gate.metrics().edge_puts.inc();
        crate::events::note_client(&verified.credentials.access_key);
        Ok(
            match crate::ops::put::put(gate, verified.into_request(req, as_is)).await {
                Ok(resp) => ok_response(resp.output, resp.headers),
                Err(e) => error_response(e),
            },
        )
    }

    /// The request's fields, if it is one the edge recognises and its
    /// signature and access checks pass at `now`; `None` hands it to s3s.
    pub async fn verify<B>(&self, req: &Request<B>, now: SystemTime) -> Option<Verified> {
        if req.method() != Method::PUT
            || !matches!(
                req.version(),
                http::Version::HTTP_10 | http::Version::HTTP_11
            )
        {
            return None;
        }
        let query = match req.uri().query() {
            None => "",
            Some("x-id=PutObject") => "x-id=PutObject",
            Some(_) => return None,
        };
        let h = req.headers();
        let read = Read::of(h)?;
        let content_length: u64 = read.content_length?.parse().ok()?;
        // s3s reads it as an i64.
        i64::try_from(content_length).ok()?;
        let payload = match read.content_sha256? {
            "UNSIGNED-PAYLOAD" => Payload::Unsigned,
            hash => Payload::Sha256(Hex64::parse(hash.as_bytes())?),
        };
        let auth = Authorization::parse(read.authorization?)?;
        let stamp = read.amz_date?;
        let at = parse_amz_date(stamp)?;
        if &stamp[..8] != auth.date {
            return None;
        }
        let skew = now.duration_since(at).unwrap_or_else(|e| e.duration());
        if skew > MAX_SKEW {
            return None;
        }

        // The path, parsed as s3s parses it.
        let raw_path = req.uri().path();
        let decoded = urlencoding::decode(raw_path).ok()?;
        let host = read.host?;
        let validation = const { s3s::validation::AwsNameValidation::new() };
        let path = if host.parse::<std::net::SocketAddr>().is_ok()
            || host.parse::<std::net::IpAddr>().is_ok()
        {
            s3s::path::parse_path_style_with_validation_and_normalization(
                &decoded,
                &validation,
                false,
            )
        } else {
            let vh = self.hosts.parse_host_header(host).ok()?;
            s3s::path::parse_virtual_hosted_style_with_validation_and_normalization(
                vh.bucket(),
                &decoded,
                &validation,
                false,
            )
        };
        let S3Path::Object { bucket, key } = path.ok()? else {
            return None;
        };

        // The signature, over the canonical request s3s builds.
        let secret = self.auth.get_secret_key(auth.access_key).await.ok()?;
        // Written straight into its hash, and the string to sign into
        // its HMAC: no text is built.
        let mut canonical = Sha256::new();
        canonical.put("PUT\n");
        crate::sigv4::uri_encode(&mut canonical, &decoded);
        canonical.put("\n");
        canonical.put(query);
        canonical.put("\n");
        // Each signed name (sorted and unique: `Authorization::parse`)
        // found among the headers read, present once, with no lookup by
        // name (each would parse and hash it): a dozen comparisons of
        // short names, most ended by their lengths.
        for name in fencegate_core::fields::split(auth.signed_headers, b';') {
            let mut found = read.entries.iter().filter(|(n, _)| *n == name);
            let (Some((_, value)), None) = (found.next(), found.next()) else {
                return None;
            };
            canonical.put(name);
            canonical.put(":");
            put_normalized(&mut canonical, value.to_str().ok()?);
            canonical.put("\n");
        }
        canonical.put("\n");
        canonical.put(auth.signed_headers);
        canonical.put("\n");
        canonical.put(match &payload {
            Payload::Unsigned => "UNSIGNED-PAYLOAD",
            Payload::Sha256(hash) => hash.as_str(),
        });
        let mut mac = crate::sigv4::hmac_of(&signing_key(&secret, auth.date, auth.region));
        for piece in [
            "AWS4-HMAC-SHA256\n",
            stamp,
            "\n",
            auth.date,
            "/",
            auth.region,
            "/s3/aws4_request\n",
            Hex64::of(&canonical.finalize().into()).as_str(),
        ] {
            mac.put(piece);
        }
        let signature = crate::sigv4::digest_of_hex(auth.signature)?;
        mac.verify_slice(&signature).ok()?;

        // The access rules s3s would apply next (`access::Access`).
        crate::query::require_known(crate::op::Op::PutObject, req.uri()).ok()?;
        crate::object_key::require(&key).ok()?;

        let condition = |value: Option<&HeaderValue>| -> Option<Option<ETagCondition>> {
            match value {
                None => Some(None),
                // A repeated one went to s3s (`Read::of`).
                Some(v) => ETagCondition::parse_http_header(v.as_bytes())
                    .ok()
                    .map(Some),
            }
        };
        Some(Verified {
            bucket: bucket.into(),
            key: key.into(),
            content_length,
            payload,
            if_match: condition(read.if_match)?,
            if_none_match: condition(read.if_none_match)?,
            credentials: Credentials {
                access_key: auth.access_key.to_owned(),
                secret_key: secret,
            },
            region: auth.region.to_owned(),
        })
    }
}

/// What the handler acts on, as the edge read it (for comparing with what
/// s3s reads from the same request).
#[derive(Debug, Clone, PartialEq)]
pub struct Parts {
    pub bucket: String,
    pub key: String,
    pub content_length: Option<i64>,
    pub if_match: Option<ETagCondition>,
    pub if_none_match: Option<ETagCondition>,
    pub access_key: String,
    pub region: String,
}

impl Verified {
    /// What the handler will act on.
    pub fn parts(&self) -> Parts {
        Parts {
            bucket: self.bucket.clone(),
            key: self.key.clone(),
            content_length: i64::try_from(self.content_length).ok(),
            if_match: self.if_match.clone(),
            if_none_match: self.if_none_match.clone(),
            access_key: self.credentials.access_key.clone(),
            region: self.region.clone(),
        }
    }
    /// The request's body as the handler reads it: with a signed payload
    /// hash, checked against it (and the length) at its end, where a
    /// mismatch fails the body and so the write.
    pub fn body(&self, body: Body) -> Body {
        match &self.payload {
            Payload::Unsigned => body,
            Payload::Sha256(hash) => {
                Body::http_body_unsync(Checked::new(body, self.content_length, *hash))
            }
        }
    }

    /// The proxy's request, for the lean route `as_is` (which forwards the
    /// object's headers from `headers`).
    fn into_request(self, req: Request<Body>, as_is: AsIs) -> PutRequest {
        let (parts, body) = req.into_parts();
        let body = self.body(body);
        PutRequest {
            bucket: self.bucket,
            key: self.key,
            content_length: i64::try_from(self.content_length).ok(),
            if_match: self.if_match,
            if_none_match: self.if_none_match,
            headers: parts.headers,
            access_key: Some(self.credentials.access_key),
            body: Some(StreamingBlob::from(body)),
            route: Route::Lean(as_is),
        }
    }
}

/// `Authorization: AWS4-HMAC-SHA256 Credential=<key>/<date>/<region>/s3/aws4_request, SignedHeaders=<a;b>, Signature=<hex>`,
/// in exactly that grammar (anything else goes to s3s).
struct Authorization<'a> {
    access_key: &'a str,
    date: &'a str,
    region: &'a str,
    /// Sorted, unique, lower-case, without `authorization`.
    signed_headers: &'a str,
    signature: &'a str,
}

impl<'a> Authorization<'a> {
    fn parse(text: &'a str) -> Option<Authorization<'a>> {
        // (Cut at bytes: a `&str` pattern builds a substring searcher per
        // call, a `char` one a searcher that costs more than these short
        // texts.)
        let rest = text.strip_prefix("AWS4-HMAC-SHA256 Credential=")?;
        let (credential, rest) = cut(rest, b',')?;
        let rest = rest.strip_prefix(' ').unwrap_or(rest);
        let rest = rest.strip_prefix("SignedHeaders=")?;
        let (signed_headers, rest) = cut(rest, b',')?;
        let rest = rest.strip_prefix(' ').unwrap_or(rest);
        let signature = rest.strip_prefix("Signature=")?;
        let Some([access_key, date, region, "s3", "aws4_request"]) =
            fencegate_core::fields::exact(credential, b'/')
        else {
            return None;
        };
        let plain = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        };
        (plain(access_key)
            && date.len() == 8
            && date.bytes().all(|b| b.is_ascii_digit())
            && plain(region)
            && is_region(region)
            && signed_names_ok(signed_headers)
            && crate::sigv4::is_sha256_hex(signature.as_bytes()))
        .then_some(Authorization {
            access_key,
            date,
            region,
            signed_headers,
            signature,
        })
    }
}

/// Whether `names` is `;`-separated header names, each `[a-z0-9-]+` and
/// not `authorization`, each after the one before it (so sorted and
/// unique).
fn signed_names_ok(names: &str) -> bool {
    // Every byte looked at, without an early exit: checked many at a time.
    let charset = names.bytes().fold(true, |ok, c| {
        ok & (c.is_ascii_lowercase() | c.is_ascii_digit() | (c == b'-') | (c == b';'))
    });
    let mut before = "";
    charset
        && fencegate_core::fields::split(names, b';').all(|name| {
            let ok = !name.is_empty() && before < name && name != "authorization";
            before = name;
            ok
        })
}

/// `text` cut at its first `sep` (ASCII), without it.
fn cut(text: &str, sep: u8) -> Option<(&str, &str)> {
    let at = text.bytes().position(|b| b == sep)?;
    Some((text.get(..at)?, text.get(at + 1..)?))
}

/// Whether s3s takes `text` as a region (`s3s::region::Region::new`, which
/// copies it first): `[a-z0-9-]+`.
fn is_region(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The headers the edge reads, from one pass over the request's: no
/// lookup by name (each would parse and hash it).
struct Read<'a> {
    /// Each: its one value as text; `None` if it is missing, repeated or
    /// not text.
    content_length: Option<&'a str>,
    content_sha256: Option<&'a str>,
    authorization: Option<&'a str>,
    amz_date: Option<&'a str>,
    host: Option<&'a str>,
    /// Present at most once (a repeated one refuses the request).
    if_match: Option<&'a HeaderValue>,
    if_none_match: Option<&'a HeaderValue>,
    /// Every header, in the request's order, for the canonical request.
    entries: SmallVec<[(&'a str, &'a HeaderValue); 24]>,
}

impl<'a> Read<'a> {
    /// `h` read, or `None` (to s3s) if it has a header the edge does not
    /// take: a copy source, a trailer, a decoded length, a
    /// `Transfer-Encoding`, an `aws-chunked` content encoding, or one
    /// [`plain_object_header`] refuses.
    fn of(h: &'a HeaderMap) -> Option<Read<'a>> {
        let mut read = Read {
            content_length: None,
            content_sha256: None,
            authorization: None,
            amz_date: None,
            host: None,
            if_match: None,
            if_none_match: None,
            entries: SmallVec::new(),
        };
        // A name's values come one after the other.
        let mut last: Option<&http::HeaderName> = None;
        for (name, value) in h {
            let repeated = last.replace(name) == Some(name);
            if !plain_object_header(name, value, repeated) {
                return None;
            }
            let n = name.as_str();
            read.entries.push((n, value));
            let once = match n {
                "content-length" => &mut read.content_length,
                "x-amz-content-sha256" => &mut read.content_sha256,
                "authorization" => &mut read.authorization,
                "x-amz-date" => &mut read.amz_date,
                "host" => &mut read.host,
                // Read once (`plain_object_header`).
                "if-match" => {
                    read.if_match = Some(value);
                    continue;
                }
                "if-none-match" => {
                    read.if_none_match = Some(value);
                    continue;
                }
                "x-amz-copy-source"
                | "x-amz-trailer"
                | "x-amz-decoded-content-length"
                | "transfer-encoding" => return None,
                "content-encoding" => {
                    if String::from_utf8_lossy(value.as_bytes())
                        .to_ascii_lowercase()
                        .contains("aws-chunked")
                    {
                        return None;
                    }
                    continue;
                }
                _ => continue,
            };
            // A second value (they come together) undoes the first.
            *once = if repeated { None } else { value.to_str().ok() };
        }
        Some(read)
    }
}

/// Whether one header s3s's PutObject parser reads is read as text and
/// present at most once (`repeated`: the value before it had its name): s3s
/// refuses a repeated one, and a malformed date, flag or number, with 400
/// (and `x-amz-write-offset-bytes` is an append the lean path does not
/// send); metadata with an RFC 2047 encoded word is decoded by s3s. Any of
/// these goes to s3s.
fn plain_object_header(name: &http::HeaderName, value: &HeaderValue, repeated: bool) -> bool {
    let n = name.as_str();
    let typed = matches!(
        n,
        "expires"
            | "x-amz-object-lock-retain-until-date"
            | "x-amz-server-side-encryption-bucket-key-enabled"
            | "x-amz-write-offset-bytes"
    );
    let meta = n.starts_with("x-amz-meta-");
    let read_once = meta
        || crate::lean::forwarded(name)
        || matches!(n, "if-match" | "if-none-match" | "x-amz-checksum-algorithm");
    // s3s decodes the first value of a metadata header (a repeated one is
    // refused above).
    let encoded_word = meta && !repeated && value.as_bytes().windows(2).any(|w| w == b"=?");
    !(typed || (read_once && repeated) || encoded_word)
}

/// `YYYYMMDDTHHMMSSZ` as a time.
fn parse_amz_date(stamp: &str) -> Option<SystemTime> {
    let b = stamp.as_bytes();
    if b.len() != 16
        || b[8] != b'T'
        || b[15] != b'Z'
        || !b[..8].iter().chain(&b[9..15]).all(u8::is_ascii_digit)
    {
        return None;
    }
    let two = |i: usize| u32::from(b[i] - b'0') * 10 + u32::from(b[i + 1] - b'0');
    // humantime reads second 60 (a leap second) as 59; s3s refuses it.
    if two(9) > 23 || two(11) > 59 || two(13) > 59 {
        return None;
    }
    // `YYYY-MM-DDTHH:MM:SSZ`, on the stack.
    let mut rfc3339 = *b"0000-00-00T00:00:00Z";
    for (to, from) in [
        (0, 0..4),
        (5, 4..6),
        (8, 6..8),
        (11, 9..11),
        (14, 11..13),
        (17, 13..15),
    ] {
        rfc3339[to..to + from.len()].copy_from_slice(&b[from]);
    }
    humantime::parse_rfc3339(std::str::from_utf8(&rfc3339).ok()?).ok()
}

/// A header value trimmed, with inner runs of whitespace made one space
/// (as s3s canonicalises it: any Unicode whitespace).
fn put_normalized(out: &mut impl Sink, value: &str) {
    // Most have no whitespace and are ASCII: every byte looked at, without
    // an early exit (the compiler checks them many at a time).
    if value
        .bytes()
        .fold(true, |plain, c| plain & (c > b' ') & (c < 0x80))
    {
        out.put(value);
        return;
    }
    // Many others are already so too (ASCII, single spaces inside, no
    // other whitespace): copied whole. (Checked without an early exit.)
    let b = value.as_bytes();
    let odd = b.iter().fold(false, |odd, &c| {
        odd | (c >= 0x80) | matches!(c, b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r')
    });
    let double = b
        .windows(2)
        .fold(false, |d, w| d | ((w[0] == b' ') & (w[1] == b' ')));
    if !odd && !double && b.first() != Some(&b' ') && b.last() != Some(&b' ') {
        out.put(value);
        return;
    }
    for (i, word) in value.split_whitespace().enumerate() {
        if i > 0 {
            out.put(" ");
        }
        out.put(word);
    }
}

/// The SigV4 signing key of `secret` for `date` and `region`, kept per
/// serving thread for the few keys it last used (four HMACs per request
/// saved; the key only ever signs what the secret could).
fn signing_key(secret: &SecretKey, date: &str, region: &str) -> [u8; 32] {
    type Entry = (String, String, String, [u8; 32]);
    thread_local! {
        static KEYS: std::cell::RefCell<Recent<Entry>> = const { std::cell::RefCell::new(Recent::new(8)) };
    }
    let secret = secret.expose();
    KEYS.with_borrow_mut(|keys| {
        keys.get_or_insert_with(
            |(s, d, r, _)| s == secret && d == date && r == region,
            || {
                let key = crate::sigv4::signing_key(secret, date, region);
                (secret.to_owned(), date.to_owned(), region.to_owned(), key)
            },
        )
        .3
    })
}

/// A body checked against its declared length and SHA-256, as it streams:
/// the chunk that completes the length is held back until the hash is
/// checked, and a mismatch (or a byte too many) fails the body instead of
/// yielding it. A sender that stops at `Content-Length` (hyper's length
/// encoder does, without asking for the end) so never sends the last bytes
/// of a body unlike its signature, and the store never commits it; the same
/// order as s3s's own check.
struct Checked {
    inner: Body,
    expected_len: u64,
    expected_hash: Hex64,
    len: u64,
    hash: Sha256,
    /// Set once the whole declared length arrived and matched its hash.
    verified: bool,
}

impl Checked {
    fn new(inner: Body, expected_len: u64, expected_hash: Hex64) -> Checked {
        Checked {
            inner,
            expected_len,
            expected_hash,
            len: 0,
            hash: Sha256::new(),
            verified: false,
        }
    }

    /// Whether what arrived so far is the whole body it was signed as.
    fn complete(&mut self) -> Result<(), s3s::StdError> {
        let hash = Hex64::of(&std::mem::take(&mut self.hash).finalize().into());
        if hash != self.expected_hash {
            return Err(
                "the body's SHA-256 is not the x-amz-content-sha256 it was signed with".into(),
            );
        }
        self.verified = true;
        Ok(())
    }
}

impl http_body::Body for Checked {
    type Data = Bytes;
    type Error = s3s::StdError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.expected_len == 0
            && !this.verified
            && let Err(e) = this.complete()
        {
            return Poll::Ready(Some(Err(e)));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let Some(data) = frame.data_ref() else {
                    return Poll::Ready(Some(Ok(frame)));
                };
                let len = this.len + data.len() as u64;
                if len > this.expected_len {
                    return Poll::Ready(Some(Err(format!(
                        "the body is longer than the {} bytes of Content-Length",
                        this.expected_len
                    )
                    .into())));
                }
                this.len = len;
                this.hash.update(data);
                if len == this.expected_len
                    && !this.verified
                    && let Err(e) = this.complete()
                {
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) if this.len != this.expected_len => Poll::Ready(Some(Err(format!(
                "the body has {} bytes, not the {} of Content-Length",
                this.len, this.expected_len
            )
            .into()))),
            other => other,
        }
    }

    /// At its end once the declared length arrived and was checked (more
    /// bytes would be an error, and a sender stops at the length anyway).
    fn is_end_stream(&self) -> bool {
        self.verified
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::Body::size_hint(&self.inner)
    }
}

/// The answer to a PutObject, with the headers s3s sets from its output.
fn ok_response(out: PutObjectOutput, extra: HeaderMap) -> Response<Body> {
    let mut r = Response::new(Body::empty());
    let h = r.headers_mut();
    if let Some(etag) = out.e_tag.as_ref().and_then(|e| e.to_http_header().ok()) {
        h.insert(http::header::ETAG, etag);
    }
    let mut set = |name: &'static str, value: Option<String>| {
        if let Some(v) = value.and_then(|v| HeaderValue::try_from(v).ok()) {
            h.insert(name, v);
        }
    };
    set("x-amz-version-id", out.version_id);
    set("x-amz-checksum-crc32", out.checksum_crc32);
    set("x-amz-checksum-crc32c", out.checksum_crc32c);
    set("x-amz-checksum-crc64nvme", out.checksum_crc64nvme);
    set("x-amz-checksum-sha1", out.checksum_sha1);
    set("x-amz-checksum-sha256", out.checksum_sha256);
    set("x-amz-expiration", out.expiration);
    set(
        "x-amz-server-side-encryption",
        out.server_side_encryption.map(|s| s.as_str().to_owned()),
    );
    set(
        "x-amz-server-side-encryption-aws-kms-key-id",
        out.ssekms_key_id,
    );
    r.headers_mut().extend(extra);
    r
}

/// An S3 error as s3s words it (its own serialisation).
fn error_response(e: S3Error) -> Response<Body> {
    e.to_http_response().unwrap_or_else(|_| {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        r
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_is_what_s3s_takes_as_one() {
        let mut texts: Vec<String> = (0u8..=127).map(|b| char::from(b).to_string()).collect();
        texts.extend(
            [
                "",
                "us-east-1",
                "eu-west-3",
                "US-EAST-1",
                "us_east_1",
                "us east",
                "é",
                "-",
                "a-",
            ]
            .map(str::to_owned),
        );
        for t in texts {
            assert_eq!(
                is_region(&t),
                s3s::region::Region::new(t.clone().into()).is_ok(),
                "{t:?}"
            );
        }
    }

    #[test]
    fn values_are_normalized_as_s3s_normalizes_them() {
        for v in [
            "",
            "a",
            "a b",
            " a",
            "a ",
            "a  b",
            "a\tb",
            "a\x0bb",
            "\x0c",
            "  ",
            "a\u{a0}b",
            "é  è",
            "AWS4-HMAC-SHA256 Credential=x/y",
            "\x01a",
            "a\x1fb",
            "\x7f",
            "a\u{85}b",
            "a\u{2028} b",
            "plain-value/with=signs",
        ] {
            let mut got = String::new();
            put_normalized(&mut got, v);
            let want = v.split_whitespace().collect::<Vec<_>>().join(" ");
            assert_eq!(got, want, "{v:?}");
        }
        // And every text of up to four characters from these.
        let texts = every_text(&['a', ' ', '\t', '\u{a0}', '\x1f', '\r'], 4);
        assert_eq!(texts.len(), 6 + 36 + 216 + 1296);
        for v in &texts {
            let mut got = String::new();
            put_normalized(&mut got, v);
            let want = v.split_whitespace().collect::<Vec<_>>().join(" ");
            assert_eq!(got, want, "{v:?}");
        }
    }

    /// Every non-empty text of up to `longest` characters from `alphabet`.
    fn every_text(alphabet: &[char], longest: usize) -> Vec<String> {
        let mut all = Vec::new();
        let mut texts = vec![String::new()];
        for _ in 0..longest {
            texts = texts
                .iter()
                .flat_map(|t| alphabet.iter().map(move |c| format!("{t}{c}")))
                .collect();
            all.extend(texts.iter().cloned());
        }
        all
    }
    use http_body_util::BodyExt as _;

    /// A body arriving in `chunks`, checked as declared.
    fn checked(chunks: &[&'static [u8]], declared_len: u64, signed: &[u8]) -> Checked {
        let frames: Vec<Result<http_body::Frame<Bytes>, std::convert::Infallible>> = chunks
            .iter()
            .map(|c| Ok(http_body::Frame::data(Bytes::from_static(c))))
            .collect();
        let body = Body::http_body_unsync(http_body_util::StreamBody::new(futures::stream::iter(
            frames,
        )));
        Checked::new(
            body,
            declared_len,
            Hex64::of(&Sha256::digest(signed).into()),
        )
    }

    /// Frame by frame, as a sender that stops at `Content-Length` reads it.
    async fn frames(mut body: Checked) -> Vec<Result<Bytes, String>> {
        let mut out = Vec::new();
        while let Some(f) = body.frame().await {
            match f {
                Ok(f) => out.push(Ok(f.into_data().expect("data"))),
                Err(e) => {
                    out.push(Err(e.to_string()));
                    break;
                }
            }
        }
        out
    }

    #[tokio::test]
    async fn the_last_bytes_of_a_body_unlike_its_signature_are_never_yielded() {
        // Right: every byte, then the end.
        let right = checked(&[b"hel", b"lo"], 5, b"hello");
        let got = frames(right).await;
        assert_eq!(got, vec![Ok(Bytes::from("hel")), Ok(Bytes::from("lo"))]);
        let mut right = checked(&[b"hel", b"lo"], 5, b"hello");
        let _ = right.frame().await;
        assert!(
            !http_body::Body::is_end_stream(&right),
            "not before the last byte"
        );
        let _ = right.frame().await;
        assert!(
            http_body::Body::is_end_stream(&right),
            "checked at the last byte"
        );
        // Same length, other bytes: the chunk that completes the length
        // is an error instead.
        let got = frames(checked(&[b"hel", b"lO"], 5, b"hello")).await;
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0], Ok(Bytes::from("hel")));
        assert!(
            got[1].as_ref().is_err_and(|e| e.contains("SHA-256")),
            "{got:?}"
        );
        // More than declared, or less: an error, never the extra bytes.
        let got = frames(checked(&[b"hel", b"lo!"], 5, b"hello")).await;
        assert!(
            got[1].as_ref().is_err_and(|e| e.contains("longer")),
            "{got:?}"
        );
        let got = frames(checked(&[b"hel"], 5, b"hello")).await;
        assert!(
            got[1].as_ref().is_err_and(|e| e.contains("3 bytes")),
            "{got:?}"
        );
        // Empty, signed as something else.
        let got = frames(checked(&[], 0, b"x")).await;
        assert!(got[0].is_err(), "{got:?}");
        assert_eq!(frames(checked(&[], 0, b"")).await, vec![]);
    }

    #[test]
    fn amz_dates_are_read_as_s3s_reads_them() {
        assert!(parse_amz_date("20261203T134910Z").is_some());
        for bad in [
            "20261203T134960Z",
            "20261203T136010Z",
            "20261203T244910Z",
            "20261303T134910Z",
            "20261203 134910Z",
            "2026120T1349100Z",
            "20261203T134910",
        ] {
            assert!(parse_amz_date(bad).is_none(), "{bad}");
        }
    }

    /// Every text of up to five characters from `ab-;A_`: the one-pass
    /// check agrees with the names split and compared one by one.
    #[test]
    fn signed_names_are_checked_as_split_names_are() {
        fn split_check(names: &str) -> bool {
            let mut before: Option<&str> = None;
            names.split(';').all(|n| {
                let ok = !n.is_empty()
                    && n != "authorization"
                    && n.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && before.is_none_or(|b| b < n);
                before = Some(n);
                ok
            })
        }
        let texts = every_text(&['a', 'b', '-', ';', 'A', '_'], 5);
        assert_eq!(texts.len(), 6 + 36 + 216 + 1296 + 7776);
        for t in &texts {
            assert_eq!(signed_names_ok(t), split_check(t), "{t:?}");
        }
        for t in ["", "authorization", "a;authorization", "host;x-amz-date"] {
            assert_eq!(signed_names_ok(t), split_check(t), "{t:?}");
        }
        assert!(signed_names_ok("host;x-amz-date"));
    }

    #[test]
    fn authorization_is_taken_only_in_its_exact_grammar() {
        let sig = "a".repeat(64);
        let ok = format!(
            "AWS4-HMAC-SHA256 Credential=AK/20261203/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-date, Signature={sig}"
        );
        assert!(Authorization::parse(&ok).is_some());
        for bad in [
            ok.replace("us-east-1", "US-EAST-1"),
            ok.replace("us-east-1", "eu.west"),
            ok.replace("/s3/", "/sts/"),
            ok.replace("host;x-amz-date", "x-amz-date;host"),
            ok.replace("host;x-amz-date", "authorization;host"),
            ok.replace("host;x-amz-date", "host;host"),
            ok.replace("host;x-amz-date", ";host;x-amz-date"),
            ok.replace("host;x-amz-date", "host;x-amz-date;"),
            ok.replace("host;x-amz-date", "host;;x-amz-date"),
            ok.replace("host;x-amz-date", ""),
            ok.replace("host;x-amz-date", "Host;x-amz-date"),
            ok.replace("host;x-amz-date", "host;x_amz_date"),
            ok.replace("Credential=AK/", "Credential=/"),
            format!("{ok}, Extra=1"),
            ok.to_uppercase(),
        ] {
            assert!(Authorization::parse(&bad).is_none(), "{bad}");
        }
    }
}
