//! Which query parameters the proxy accepts, per operation.
//!
//! s3s routes a request by the query parameters it knows and ignores the
//! rest, so `PUT /b/k?renameObject` arrives as a PutObject. A store that
//! knows the parameter would do something else than what the proxy fenced
//! (and a new S3 feature would slip past the fence the day the store learns
//! it). The proxy therefore decides operations by an allowlist: each
//! operation accepts exactly the parameters s3s parses into its input,
//! plus the SDKs' `x-id` (which must name the operation) and the
//! pre-signed-URL parameters; anything else is refused before a handler
//! runs.

use crate::op::Op;
use s3s::S3Result;

/// Parameters every operation accepts: the signature of a pre-signed URL.
const PRESIGNED: &[&str] = &[
    "X-Amz-Algorithm",
    "X-Amz-Credential",
    "X-Amz-Date",
    "X-Amz-Expires",
    "X-Amz-SignedHeaders",
    "X-Amz-Signature",
    "X-Amz-Security-Token",
    "X-Amz-Content-Sha256",
    "AWSAccessKeyId",
    "Signature",
    "Expires",
];

const RESPONSE_OVERRIDES: &[&str] = &[
    "response-cache-control",
    "response-content-disposition",
    "response-content-encoding",
    "response-content-language",
    "response-content-type",
    "response-expires",
];

/// Refuses a request to `op` whose query names a parameter `op` does not
/// accept (400 `InvalidArgument`, naming it).
pub fn require_known(op: Op, uri: &http::Uri) -> S3Result<()> {
    let Some(query) = uri.query() else {
        return Ok(());
    };
    let response_overrides = op.takes_response_overrides();
    let name_of_op = op.name();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (raw_name, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = percent_decode(raw_name);
        if name == "x-id" {
            if percent_decode(raw_value) != name_of_op {
                return Err(s3s::s3_error!(
                    InvalidArgument,
                    "query parameter x-id={} does not name this request's operation ({name_of_op})",
                    percent_decode(raw_value)
                ));
            }
            continue;
        }
        // Checksums some presigners move into the query (the SDK that
        // forwards rebuilds the request from parsed fields, so none of
        // these reaches the store as sent).
        // By bytes: the name may hold any character after decoding.
        let checksum = name
            .as_bytes()
            .get(.."x-amz-checksum-".len())
            .is_some_and(|b| b.eq_ignore_ascii_case(b"x-amz-checksum-"))
            || name.eq_ignore_ascii_case("x-amz-sdk-checksum-algorithm");
        let known = checksum
            || PRESIGNED.iter().any(|p| p.eq_ignore_ascii_case(&name))
            || op.accepted_query().contains(&&*name)
            || (response_overrides && RESPONSE_OVERRIDES.contains(&&*name));
        if !known {
            return Err(s3s::s3_error!(
                InvalidArgument,
                "query parameter {name:?} is not supported through the fencing proxy for {name_of_op}; \
                 it forwards only the operations and parameters it fences"
            ));
        }
    }
    Ok(())
}

fn percent_decode(s: &str) -> std::borrow::Cow<'_, str> {
    let bytes = s.as_bytes();
    if !bytes.iter().any(|b| matches!(b, b'%' | b'+')) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    std::borrow::Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(q: &str) -> http::Uri {
        format!("http://h/b/k?{q}").parse().expect("uri")
    }

    #[test]
    fn known_parameters_pass() {
        assert!(require_known(Op::PutObject, &uri("x-id=PutObject")).is_ok());
        assert!(require_known(Op::UploadPart, &uri("partNumber=1&uploadId=abc")).is_ok());
        assert!(require_known(Op::GetObject, &uri("response-content-type=text%2Fplain")).is_ok());
        assert!(
            require_known(
                Op::PutObject,
                &uri("X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=00")
            )
            .is_ok()
        );
        assert!(require_known(Op::ListObjectsV2, &uri("list-type=2&prefix=a%2F")).is_ok());
        assert!(
            require_known(Op::PutObject,
                &uri("X-Amz-Content-Sha256=UNSIGNED-PAYLOAD&x-amz-checksum-crc32=AAAAAA%3D%3D&x-amz-sdk-checksum-algorithm=CRC32")
            )
            .is_ok(),
            "presigned URLs of current SDKs"
        );
    }

    #[test]
    fn unknown_parameters_are_refused() {
        for (op, q) in [
            (Op::PutObject, "renameObject"),
            (Op::PutObject, "renameObject="),
            (Op::PutObject, "x-id=RenameObject"),
            (Op::DeleteObject, "tagging"),
            (Op::PutObject, "response-content-type=x"),
            (Op::CompleteMultipartUpload, "uploadId=1&append"),
            // Decoded to characters of several bytes, none of them ASCII.
            (
                Op::PutObject,
                "%C3%A9%C3%A9%C3%A9%C3%A9%C3%A9%C3%A9%C3%A9%C3%A9%C3%A9=1",
            ),
        ] {
            let e = require_known(op, &uri(q)).expect_err(q);
            assert_eq!(e.code(), &s3s::S3ErrorCode::InvalidArgument, "{op:?} {q}");
        }
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%2Fb+c%"), "a/b c%");
        assert_eq!(percent_decode("%4"), "%4");
        assert!(matches!(
            percent_decode("plain"),
            std::borrow::Cow::Borrowed("plain")
        ));
    }
}
