//! What a request presents as its credentials, read exactly as s3s will
//! read it, and refused when it cannot be read.
//!
//! Two decisions are made on the request head before any signature is
//! checked: the Host rule (an anonymous request's only credential is where
//! it comes from) and whether a body read whole must match its payload
//! hash. Both rest on one claim: "s3s (or the edge) will verify a signature
//! on this request, or refuse it". That holds only if the proxy and s3s
//! agree on which requests carry one. s3s drops every header value that is
//! not UTF-8 and reads `Authorization` only when there is exactly one; a
//! request the proxy counted as signed for its `Authorization` header
//! alone was served by s3s as anonymous. So a credential that cannot be
//! read one way is refused here with 400, never counted either way.
//!
//! [`Presented::Signed`] therefore means: a signature that s3s or the edge
//! verifies before any handler runs, or a refusal. The access hook checks
//! that agreement after the verification (`access`), so a future
//! difference between the two readings refuses instead of serving.

use http::Request;

/// How a request claims to be authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presented {
    /// No credential at all.
    Anonymous,
    /// One readable `Authorization` header, or a presigned query: s3s
    /// verifies it or refuses the request.
    Signed,
}

/// Why a request's credentials cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unreadable {
    #[error(
        "the request has {0} Authorization headers: send exactly one (the signature of the request)"
    )]
    Repeated(usize),
    #[error(
        "the Authorization header is not text (it holds bytes outside ASCII): send the SigV4 Authorization your client computes, or none for an anonymous request"
    )]
    NotText,
    #[error("the query's {0} parameter is not valid percent-encoded UTF-8")]
    Query(String),
}

impl Presented {
    /// Reads `req`'s credentials as s3s does (`OrderedHeaders`: one UTF-8
    /// `Authorization`; `OrderedQs`: the query's decoded parameter names).
    pub fn of<B>(req: &Request<B>) -> Result<Presented, Unreadable> {
        let auth = req.headers().get_all(http::header::AUTHORIZATION);
        let header = match auth.iter().count() {
            0 => None,
            1 => auth.iter().next(),
            n => return Err(Unreadable::Repeated(n)),
        };
        if let Some(v) = header {
            // Visible ASCII and tabs (what `to_str` takes) is stricter than
            // s3s's UTF-8: a UTF-8 value that is not ASCII is no SigV4
            // header either, and refusing it cannot serve one as anonymous.
            if v.to_str().is_err() {
                return Err(Unreadable::NotText);
            }
            return Ok(Presented::Signed);
        }
        if let Some(query) = req.uri().query() {
            for pair in query.split('&') {
                let raw = pair.split_once('=').map_or(pair, |(n, _)| n);
                let name = urlencoding::decode(raw)
                    .map_err(|_| Unreadable::Query(raw.chars().take(64).collect()))?;
                if matches!(name.as_ref(), "X-Amz-Signature" | "Signature") {
                    return Ok(Presented::Signed);
                }
            }
        }
        Ok(Presented::Anonymous)
    }

    pub fn is_anonymous(self) -> bool {
        self == Presented::Anonymous
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(uri: &str, auth: &[&[u8]]) -> Request<()> {
        let mut r = Request::builder().uri(uri).body(()).expect("request");
        for a in auth {
            r.headers_mut().append(
                http::header::AUTHORIZATION,
                http::HeaderValue::from_bytes(a).expect("value"),
            );
        }
        r
    }

    #[test]
    fn only_a_credential_s3s_reads_counts_as_one() {
        assert_eq!(Presented::of(&req("/b/k", &[])), Ok(Presented::Anonymous));
        assert_eq!(
            Presented::of(&req("/b/k", &[b"AWS4-HMAC-SHA256 Credential=x"])),
            Ok(Presented::Signed)
        );
        // s3s drops a value that is not UTF-8 and serves the request as
        // anonymous: neither signed nor anonymous here.
        assert_eq!(
            Presented::of(&req("/b/k", &[b"\xff"])),
            Err(Unreadable::NotText)
        );
        assert_eq!(
            Presented::of(&req("/b/k", &[b"AWS4-HMAC-SHA256 \xc3\xa9"])),
            Err(Unreadable::NotText)
        );
        // s3s reads none of two.
        assert_eq!(
            Presented::of(&req("/b/k", &[b"a", b"b"])),
            Err(Unreadable::Repeated(2))
        );
        for signed in [
            "/b/k?X-Amz-Signature=ab",
            "/b/k?Signature=ab&AWSAccessKeyId=x",
            "/b/k?X-Amz-Signatur%65=ab",
        ] {
            assert_eq!(
                Presented::of(&req(signed, &[])),
                Ok(Presented::Signed),
                "{signed}"
            );
        }
        assert!(Presented::of(&req("/b/k?%ff=1", &[])).is_err());
        assert_eq!(
            Presented::of(&req("/b/k?x-amz-signature=ab", &[])),
            Ok(Presented::Anonymous),
            "s3s's names are case-sensitive"
        );
    }
}
