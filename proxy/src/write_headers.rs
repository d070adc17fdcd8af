//! Headers that do what refused operations do.
//!
//! The proxy refuses PutObjectAcl, PutObjectRetention, PutObjectLegalHold,
//! PutObjectTagging and every bucket configuration write (501, see
//! [`crate::op::Op`]). A write can carry headers that make the
//! same changes: `x-amz-acl` on a PutObject sets the ACL PutObjectAcl
//! would. One policy covers both: a header that changes what a refused
//! operation would change is refused the same way (501 NotImplemented,
//! naming the header and its family) on every fenced write, unless the
//! operator allows its family (`allow_write_headers`). CreateBucket has
//! a stricter rule of its own: plain creates only (`ops::bucket`).
//!
//! | family | headers | what it changes |
//! |---|---|---|
//! | `acl` | `x-amz-acl` (but `private`), `x-amz-grant-*`, `x-amz-object-ownership` | who may read or change the object (PutObjectAcl, PutBucketOwnershipControls) |
//! | `object_lock` | `x-amz-object-lock-*`, `x-amz-bypass-governance-retention`, `x-amz-bucket-object-lock-enabled` | retention and legal hold (PutObjectRetention, PutObjectLegalHold, PutObjectLockConfiguration) |
//! | `tagging` | `x-amz-tagging`, `x-amz-tagging-directive: REPLACE` | the object's tags (PutObjectTagging) |
//! | `website_redirect` | `x-amz-website-redirect-location` | where the website endpoint sends a reader (PutBucketWebsite) |
//! | `encryption` | `x-amz-server-side-encryption`, `-aws-kms-key-id`, `-context`, `-bucket-key-enabled` | how the store encrypts it, and whose KMS key can read it (PutBucketEncryption) |
//! | `request_payer` | `x-amz-request-payer` | who pays for the request (PutBucketRequestPayment) |
//! | `expected_bucket_owner` | `x-amz-expected-bucket-owner`, `x-amz-source-expected-bucket-owner` | nothing; a check the proxy does not make itself |
//!
//! Customer-provided encryption keys (SSE-C: `x-amz-server-side-encryption-customer-*`,
//! `x-amz-copy-source-server-side-encryption-customer-*`) are refused
//! whatever is allowed: the store refuses to show an SSE-C object to
//! anyone without its key, the proxy included, and the proxy reads the
//! token stored on every object it fences.
//!
//! `x-amz-acl: private` passes: it is the ACL every new object gets anyway.

use crate::op::Op;
use http::HeaderMap;
use s3s::{S3Error, S3ErrorCode};

/// A family of headers the operator may allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    Acl,
    ObjectLock,
    Tagging,
    WebsiteRedirect,
    Encryption,
    RequestPayer,
    ExpectedBucketOwner,
}

impl Family {
    /// Its name in the config.
    pub fn name(self) -> &'static str {
        match self {
            Family::Acl => "acl",
            Family::ObjectLock => "object_lock",
            Family::Tagging => "tagging",
            Family::WebsiteRedirect => "website_redirect",
            Family::Encryption => "encryption",
            Family::RequestPayer => "request_payer",
            Family::ExpectedBucketOwner => "expected_bucket_owner",
        }
    }

    /// What the family changes, for the refusal.
    fn changes(self) -> &'static str {
        match self {
            Family::Acl => "the object's ACL, as PutObjectAcl would",
            Family::ObjectLock => {
                "retention or legal hold, as PutObjectRetention and PutObjectLegalHold would"
            }
            Family::Tagging => "the object's tags, as PutObjectTagging would",
            Family::WebsiteRedirect => "where the bucket's website sends readers",
            Family::Encryption => "how the store encrypts the object and whose key can read it",
            Family::RequestPayer => "who pays for the request",
            Family::ExpectedBucketOwner => {
                "nothing the proxy checks: the store alone would check the bucket's owner"
            }
        }
    }
}

/// What a header is, to the policy.
enum Kind {
    /// Passes.
    Plain,
    /// Passes only where its family is allowed.
    In(Family),
    /// Never passes.
    CustomerKey,
}

fn kind(name: &str, value: &[u8]) -> Kind {
    let n = name;
    if n.starts_with("x-amz-server-side-encryption-customer-")
        || n.starts_with("x-amz-copy-source-server-side-encryption-customer-")
    {
        return Kind::CustomerKey;
    }
    match n {
        "x-amz-acl" if value.eq_ignore_ascii_case(b"private") => Kind::Plain,
        "x-amz-acl" | "x-amz-object-ownership" => Kind::In(Family::Acl),
        _ if n.starts_with("x-amz-grant-") => Kind::In(Family::Acl),
        "x-amz-bypass-governance-retention" | "x-amz-bucket-object-lock-enabled" => {
            Kind::In(Family::ObjectLock)
        }
        _ if n.starts_with("x-amz-object-lock-") => Kind::In(Family::ObjectLock),
        "x-amz-tagging" => Kind::In(Family::Tagging),
        "x-amz-tagging-directive" if !value.eq_ignore_ascii_case(b"COPY") => {
            Kind::In(Family::Tagging)
        }
        "x-amz-website-redirect-location" => Kind::In(Family::WebsiteRedirect),
        "x-amz-server-side-encryption"
        | "x-amz-server-side-encryption-aws-kms-key-id"
        | "x-amz-server-side-encryption-context"
        | "x-amz-server-side-encryption-bucket-key-enabled" => Kind::In(Family::Encryption),
        "x-amz-request-payer" => Kind::In(Family::RequestPayer),
        "x-amz-expected-bucket-owner" | "x-amz-source-expected-bucket-owner" => {
            Kind::In(Family::ExpectedBucketOwner)
        }
        _ => Kind::Plain,
    }
}

/// The families the operator allowed.
#[derive(Debug, Clone, Default)]
pub struct WriteHeaders {
    allowed: Vec<Family>,
}

impl WriteHeaders {
    pub fn new(allowed: &[Family]) -> WriteHeaders {
        WriteHeaders {
            allowed: allowed.to_vec(),
        }
    }

    /// Refuses `op`'s request if one of its headers is in a family not
    /// allowed, or names a customer key.
    pub fn check(&self, op: Op, headers: &HeaderMap) -> Result<(), S3Error> {
        let op = op.name();
        for (name, value) in headers {
            match kind(name.as_str(), value.as_bytes()) {
                Kind::Plain => {}
                Kind::In(family) if self.allowed.contains(&family) => {}
                Kind::In(family) => {
                    return Err(refused(format!(
                        "fencegate does not forward {name} on {op}: it changes {}, which the proxy does not do without a fence. \
                         Remove the header, or allow the family with allow_write_headers = [\"{}\"] in the proxy config",
                        family.changes(),
                        family.name()
                    )));
                }
                Kind::CustomerKey => {
                    return Err(refused(format!(
                        "fencegate does not forward {name} on {op}: an object encrypted with a customer-provided key \
                         (SSE-C) cannot be read without it, and the proxy reads the fencing token stored on every \
                         object it fences. Use SSE-S3 or SSE-KMS (allow_write_headers = [\"encryption\"])"
                    )));
                }
            }
        }
        Ok(())
    }
}

fn refused(message: String) -> S3Error {
    let mut e = S3Error::with_message(S3ErrorCode::NotImplemented, message);
    e.set_status_code(http::StatusCode::NOT_IMPLEMENTED);
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                v.parse().expect("value"),
            );
        }
        h
    }

    #[test]
    fn every_family_is_refused_unless_allowed() {
        let none = WriteHeaders::default();
        for (header, value, family) in [
            ("x-amz-acl", "public-read", Family::Acl),
            ("x-amz-grant-read", "uri=x", Family::Acl),
            ("x-amz-object-ownership", "ObjectWriter", Family::Acl),
            ("x-amz-object-lock-mode", "COMPLIANCE", Family::ObjectLock),
            (
                "x-amz-object-lock-retain-until-date",
                "2030-01-01T00:00:00Z",
                Family::ObjectLock,
            ),
            ("x-amz-object-lock-legal-hold", "ON", Family::ObjectLock),
            (
                "x-amz-bucket-object-lock-enabled",
                "true",
                Family::ObjectLock,
            ),
            (
                "x-amz-bypass-governance-retention",
                "true",
                Family::ObjectLock,
            ),
            ("x-amz-tagging", "a=b", Family::Tagging),
            ("x-amz-tagging-directive", "REPLACE", Family::Tagging),
            (
                "x-amz-website-redirect-location",
                "/x",
                Family::WebsiteRedirect,
            ),
            (
                "x-amz-server-side-encryption",
                "aws:kms",
                Family::Encryption,
            ),
            (
                "x-amz-server-side-encryption-aws-kms-key-id",
                "k",
                Family::Encryption,
            ),
            ("x-amz-request-payer", "requester", Family::RequestPayer),
            (
                "x-amz-expected-bucket-owner",
                "1",
                Family::ExpectedBucketOwner,
            ),
        ] {
            let h = headers(&[(header, value)]);
            let e = none.check(Op::PutObject, &h).expect_err(header);
            assert_eq!(e.status_code(), Some(http::StatusCode::NOT_IMPLEMENTED));
            let msg = e.message().unwrap_or_default();
            assert!(msg.contains(header) && msg.contains(family.name()), "{msg}");
            WriteHeaders::new(&[family])
                .check(Op::PutObject, &h)
                .unwrap_or_else(|e| panic!("{header} with {} allowed: {e:?}", family.name()));
        }
    }

    #[test]
    fn customer_keys_are_refused_whatever_is_allowed_and_plain_headers_pass() {
        let all = WriteHeaders::new(&[
            Family::Acl,
            Family::ObjectLock,
            Family::Tagging,
            Family::WebsiteRedirect,
            Family::Encryption,
            Family::RequestPayer,
            Family::ExpectedBucketOwner,
        ]);
        for header in [
            "x-amz-server-side-encryption-customer-algorithm",
            "x-amz-copy-source-server-side-encryption-customer-key",
        ] {
            let e = all
                .check(Op::CopyObject, &headers(&[(header, "AES256")]))
                .expect_err(header);
            assert!(e.message().unwrap_or_default().contains("SSE-C"));
        }
        let plain = headers(&[
            ("content-type", "text/plain"),
            ("x-amz-meta-a", "b"),
            ("x-amz-storage-class", "STANDARD"),
            ("x-amz-acl", "private"),
            ("x-amz-tagging-directive", "COPY"),
            ("x-amz-checksum-sha256", "x"),
        ]);
        WriteHeaders::default()
            .check(Op::PutObject, &plain)
            .expect("plain headers pass");
    }
}
