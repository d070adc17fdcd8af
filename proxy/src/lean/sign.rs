//! SigV4 for the lean forwarder's requests to the store, with the signing
//! key kept for the day it is valid (AWS derives it from the secret, the
//! date, the region and the service: four HMACs that are the same for every
//! request of a day).
//!
//! It signs what the lean forwarder sends and nothing else: a request with
//! an empty query, a path already percent-encoded once (S3 signs the path
//! as sent, without normalising it), every header but the ones a hop may
//! change (`content-length` aside, which is fixed here and signed too), and
//! `UNSIGNED-PAYLOAD`, or the body's SHA-256 when the client signed one (the
//! store then checks the body too). The tests check it against `aws-sigv4`,
//! which it replaces on this path because it costs a sixth of the forward's
//! CPU (BENCHMARKS.md, "Where the time goes").

use crate::header_names::{X_AMZ_CONTENT_SHA256, X_AMZ_DATE};
use crate::sigv4::{Hex64, Sink, hmac_of, is_sha256_hex};
use hmac::Mac;
use http::{HeaderMap, HeaderValue, Method};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use smallvec::SmallVec;
use std::time::SystemTime;

/// What every request is signed as.
const SERVICE: &str = "s3";
/// The payload hash sent and signed: the body is not hashed.
pub const UNSIGNED_PAYLOAD: &str = "UNSIGNED-PAYLOAD";

/// A backend key pair and region, with the current day's signing key.
pub struct Signer {
    access_key: String,
    secret_key: String,
    region: String,
    /// The date (`YYYYMMDD`) and the signing key derived for it.
    day: Mutex<Option<(String, [u8; 32])>>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("access_key", &self.access_key)
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

/// Why a request cannot be signed.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    #[error("header {0} is not text and cannot be signed")]
    NotText(String),
}

impl Signer {
    pub fn new(access_key: &str, secret_key: &str, region: &str) -> Signer {
        Signer {
            access_key: access_key.to_owned(),
            secret_key: secret_key.to_owned(),
            region: region.to_owned(),
            day: Mutex::new(None),
        }
    }

    /// Adds `x-amz-date`, `x-amz-content-sha256` and `authorization` to
    /// `headers` (which must already hold `host`), for `method` on `path`
    /// (percent-encoded once, no query) at `now`. The payload is the
    /// `x-amz-content-sha256` SHA-256 already in `headers`, if any, else
    /// unsigned.
    ///
    /// The canonical request and the string to sign are written straight
    /// into their SHA-256 and HMAC, not built as text: the only memory it
    /// takes is the two header values it adds.
    pub fn sign(
        &self,
        method: &Method,
        path: &str,
        headers: &mut HeaderMap,
        now: SystemTime,
    ) -> Result<(), SignError> {
        let stamp = AmzDate::of(now);
        let (stamp, date) = (stamp.as_str(), stamp.date());
        headers.insert(X_AMZ_DATE, header_value(stamp.as_bytes().to_vec()));
        // A SHA-256 of the body the caller put there (checked against the
        // body before its last byte goes out) is signed, so the store
        // checks it too; otherwise the payload is unsigned.
        let payload = match headers.get(X_AMZ_CONTENT_SHA256) {
            Some(v) if is_sha256_hex(v.as_bytes()) => v.clone(),
            _ => HeaderValue::from_static(UNSIGNED_PAYLOAD),
        };
        headers.insert(X_AMZ_CONTENT_SHA256, payload.clone());
        let payload = payload.to_str().unwrap_or(UNSIGNED_PAYLOAD);
        headers.remove(http::header::AUTHORIZATION);

        // Canonical headers: lower-case names (HeaderMap's already are),
        // sorted, values trimmed with inner runs of spaces collapsed, the
        // values of a repeated header joined by commas in their order.
        // Read in one pass over the entries, sorted stably by name: no
        // lookup by name (each would parse and hash it).
        let mut entries: SmallVec<[(&str, &HeaderValue); 24]> = headers
            .iter()
            .map(|(name, value)| (name.as_str(), value))
            .collect();
        entries.sort_by(|a, b| a.0.cmp(b.0));
        let mut names: SmallVec<[&str; 24]> = SmallVec::new();
        let mut canonical = Sha256::new();
        for piece in [method.as_str(), "\n", path, "\n\n"] {
            canonical.put(piece);
        }
        for (name, value) in &entries {
            let text = value
                .to_str()
                .map_err(|_| SignError::NotText((*name).to_owned()))?;
            if names.last() == Some(name) {
                canonical.put(",");
            } else {
                if !names.is_empty() {
                    canonical.put("\n");
                }
                names.push(name);
                canonical.put(name);
                canonical.put(":");
            }
            put_trimmed(&mut canonical, text);
        }
        if !names.is_empty() {
            canonical.put("\n");
        }
        canonical.put("\n");
        put_signed_headers(&mut canonical, &names);
        canonical.put("\n");
        canonical.put(payload);

        let mut mac = hmac_of(&self.signing_key(date));
        for piece in ["AWS4-HMAC-SHA256\n", stamp, "\n"] {
            mac.put(piece);
        }
        self.put_scope(&mut mac, date);
        mac.put("\n");
        mac.put(Hex64::of(&canonical.finalize().into()).as_str());
        let signature = Hex64::of(&mac.finalize().into_bytes().into());

        // Of its exact length: the header value then takes the text as it
        // is, with no second allocation.
        let names_len: usize = names
            .iter()
            .map(|n| n.len() + 1)
            .sum::<usize>()
            .saturating_sub(1);
        let scope_len = date.len() + self.region.len() + SERVICE.len() + "///aws4_request".len();
        let mut authorization = String::with_capacity(
            "AWS4-HMAC-SHA256 Credential=/, SignedHeaders=, Signature=".len()
                + self.access_key.len()
                + scope_len
                + names_len
                + 64,
        );
        authorization.put("AWS4-HMAC-SHA256 Credential=");
        authorization.put(&self.access_key);
        authorization.put("/");
        self.put_scope(&mut authorization, date);
        authorization.put(", SignedHeaders=");
        put_signed_headers(&mut authorization, &names);
        authorization.put(", Signature=");
        authorization.put(signature.as_str());
        drop((names, entries));
        debug_assert_eq!(authorization.len(), authorization.capacity());
        headers.insert(
            http::header::AUTHORIZATION,
            header_value(authorization.into_bytes()),
        );
        Ok(())
    }

    /// The credential scope, `date/region/s3/aws4_request`.
    fn put_scope(&self, out: &mut impl Sink, date: &str) {
        for piece in [date, "/", &self.region, "/", SERVICE, "/aws4_request"] {
            out.put(piece);
        }
    }

    /// The signing key for `date`, derived once per day.
    fn signing_key(&self, date: &str) -> [u8; 32] {
        let mut day = self.day.lock();
        if let Some((d, key)) = day.as_ref()
            && d == date
        {
            return *key;
        }
        let key = crate::sigv4::signing_key(&self.secret_key, date, &self.region);
        *day = Some((date.to_owned(), key));
        key
    }
}

/// The signed headers' names, `;`-separated.
fn put_signed_headers(out: &mut impl Sink, names: &[&str]) {
    for (i, name) in names.iter().enumerate() {
        if i > 0 {
            out.put(";");
        }
        out.put(name);
    }
}

/// `text` with leading and trailing spaces removed and inner runs of
/// spaces collapsed to one, as SigV4 canonicalises header values.
fn put_trimmed(out: &mut impl Sink, text: &str) {
    // Most values have no space to remove: written whole. (Every byte
    // looked at, without an early exit: checked many at a time.)
    let b = text.as_bytes();
    if b.iter().fold(true, |none, c| none & (*c != b' ')) {
        out.put(text);
        return;
    }
    let double = b
        .windows(2)
        .fold(false, |d, w| d | ((w[0] == b' ') & (w[1] == b' ')));
    if b.first() != Some(&b' ') && b.last() != Some(&b' ') && !double {
        out.put(text);
        return;
    }
    for (i, word) in text.split(' ').filter(|w| !w.is_empty()).enumerate() {
        if i > 0 {
            out.put(" ");
        }
        out.put(word);
    }
}

/// `now` as SigV4's `YYYYMMDDTHHMMSSZ`, on the stack.
struct AmzDate([u8; 16]);

impl AmzDate {
    fn of(now: SystemTime) -> AmzDate {
        use std::io::Write;
        // `2026-12-03T10:26:18Z`, then without its separators.
        let mut rfc3339 = [0u8; 20];
        let written = write!(
            &mut rfc3339[..],
            "{}",
            humantime::format_rfc3339_seconds(now)
        );
        let mut out = [b'0'; 16];
        if written.is_ok() {
            for (o, c) in out
                .iter_mut()
                .zip(rfc3339.iter().filter(|c| !matches!(c, b'-' | b':')))
            {
                *o = *c;
            }
        }
        AmzDate(out)
    }

    fn as_str(&self) -> &str {
        // Digits, `T` and `Z`.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }

    /// `YYYYMMDD`.
    fn date(&self) -> &str {
        &self.as_str()[..8]
    }
}

fn header_value(text: Vec<u8>) -> HeaderValue {
    // Made here of ASCII alone (the access key and region are checked as
    // header text when the signer is built).
    HeaderValue::from_maybe_shared(bytes::Bytes::from(text))
        .unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn values_are_trimmed_and_their_runs_of_spaces_made_one() {
        for (v, want) in [
            ("", ""),
            ("a", "a"),
            ("a b", "a b"),
            (" a", "a"),
            ("a ", "a"),
            ("a   b  c", "a b c"),
            ("a\tb", "a\tb"),
            ("   ", ""),
        ] {
            let mut got = String::new();
            put_trimmed(&mut got, v);
            assert_eq!(got, want, "{v:?}");
        }
    }

    /// The same request signed by `aws-sigv4` (the SDK's signer), with the
    /// lean forwarder's settings before this module replaced it.
    fn reference(
        method: &Method,
        uri: &str,
        headers: &HeaderMap,
        now: SystemTime,
        sha256: Option<&str>,
    ) -> HeaderValue {
        use aws_sigv4::http_request::{
            PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest,
            SigningSettings, UriPathNormalizationMode, sign,
        };
        let mut settings = SigningSettings::default();
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        let identity: aws_smithy_runtime_api::client::identity::Identity =
            aws_credential_types::Credentials::new("AKIDEXAMPLE", "secret/key+x", None, None, "t")
                .into();
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&identity)
            .region("eu-west-3")
            .name("s3")
            .time(now)
            .settings(settings)
            .build()
            .expect("params")
            .into();
        let list: Vec<(&str, &str)> = headers
            .iter()
            .filter(|(n, _)| *n != http::header::HOST && *n != "x-amz-content-sha256")
            .map(|(n, v)| (n.as_str(), v.to_str().expect("text")))
            .collect();
        let signable = SignableRequest::new(
            method.as_str(),
            uri,
            list.into_iter(),
            match sha256 {
                Some(h) => SignableBody::Precomputed(h.to_owned()),
                None => SignableBody::UnsignedPayload,
            },
        )
        .expect("signable");
        let (instructions, _) = sign(signable, &params).expect("sign").into_parts();
        let mut req = http::Request::builder()
            .method(method.clone())
            .uri(uri)
            .body(())
            .expect("request");
        instructions.apply_to_request_http1x(&mut req);
        req.headers()
            .get(http::header::AUTHORIZATION)
            .expect("signed")
            .clone()
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(
                http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                HeaderValue::from_str(v).expect("value"),
            );
        }
        map
    }

    #[test]
    fn signatures_are_the_sdk_signers() {
        let signer = Signer::new("AKIDEXAMPLE", "secret/key+x", "eu-west-3");
        let cases: &[(&str, &[(&str, &str)])] = &[
            ("/bucket/key", &[("content-length", "4096")]),
            (
                "/bucket/dir/a%20b%2Bc%25d~e",
                &[
                    ("content-length", "3"),
                    ("content-type", "text/plain;  charset=utf-8 "),
                    ("x-amz-meta-fencing-token", "17"),
                    ("x-amz-meta-note", "  two   spaces  "),
                    ("if-none-match", "*"),
                    ("content-md5", "1B2M2Y8AsgTpgAmY7PhCfg=="),
                ],
            ),
            (
                "/b/k",
                &[
                    ("content-length", "0"),
                    ("if-match", "\"0123456789abcdef\""),
                    ("x-amz-meta-a", "1"),
                    ("x-amz-meta-a", "2"),
                    ("x-amz-tagging", "k=v&k2=v2"),
                ],
            ),
            (
                "/b/%E2%9C%93",
                &[
                    ("content-length", "1"),
                    ("x-amz-meta-tab", "a\tb  c"),
                    ("content-disposition", "attachment; filename=\"x y.txt\""),
                ],
            ),
        ];
        for day in [0u64, 1, 400] {
            let now = UNIX_EPOCH + Duration::from_secs(1_780_000_000 + day * 86_400 + 3_723);
            for (path, pairs) in cases {
                // Unsigned, a body's SHA-256, and something that is not one
                // (signed as unsigned).
                let hash = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";
                for (sent, signed) in [
                    (None, None),
                    (Some(hash), Some(hash)),
                    (Some("UNSIGNED-PAYLOAD"), None),
                    (Some("2CF24DBA"), None),
                ] {
                    let mut ours = headers(pairs);
                    ours.insert("host", HeaderValue::from_static("127.0.0.1:9000"));
                    if let Some(sent) = sent {
                        ours.insert("x-amz-content-sha256", HeaderValue::from_static(sent));
                    }
                    signer
                        .sign(&Method::PUT, path, &mut ours, now)
                        .expect("sign");
                    let uri = format!("http://127.0.0.1:9000{path}");
                    let theirs = reference(&Method::PUT, &uri, &headers(pairs), now, signed);
                    assert_eq!(
                        ours.get(http::header::AUTHORIZATION),
                        Some(&theirs),
                        "{path} {pairs:?} day {day} {sent:?}"
                    );
                    assert_eq!(
                        ours["x-amz-content-sha256"],
                        signed.unwrap_or("UNSIGNED-PAYLOAD"),
                    );
                }
            }
        }
    }

    #[test]
    fn dates_are_sigv4s() {
        let now = UNIX_EPOCH + Duration::from_secs(1_780_000_000);
        let stamp = AmzDate::of(now);
        assert_eq!(stamp.as_str(), "20260528T202640Z");
        assert_eq!(stamp.date(), "20260528");
    }

    #[test]
    fn values_are_trimmed_and_runs_of_spaces_collapsed() {
        let mut out = String::new();
        put_trimmed(&mut out, "  a   b c  ");
        assert_eq!(out, "a b c");
    }
}
