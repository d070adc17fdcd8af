//! The non-standard header names the proxy reads or writes on every
//! request, as `HeaderName` constants. A lookup by `&str` first parses the
//! text into a name (a third of what a lookup costs), and an insert by
//! `&str` copies it into a new allocation; a constant does neither. The
//! standard names are `http::header`'s.

use http::HeaderName;

pub const X_AMZ_DATE: HeaderName = HeaderName::from_static("x-amz-date");
pub const X_AMZ_CONTENT_SHA256: HeaderName = HeaderName::from_static("x-amz-content-sha256");
pub const X_AMZ_TRAILER: HeaderName = HeaderName::from_static("x-amz-trailer");
pub const CONTENT_MD5: HeaderName = HeaderName::from_static("content-md5");
/// The request header carrying the token (`tokens::FENCING_TOKEN_HEADER`).
pub const FENCING_TOKEN: HeaderName = HeaderName::from_static("fencing-token");
/// The object metadata the token is stored in (`tokens::TOKEN_METADATA_KEY`).
pub const X_AMZ_META_FENCING_TOKEN: HeaderName =
    HeaderName::from_static("x-amz-meta-fencing-token");
/// The integrity values S3 defines, in the order of `trailer::NAMES`.
pub const X_AMZ_CHECKSUMS: [HeaderName; 5] = [
    HeaderName::from_static("x-amz-checksum-crc32"),
    HeaderName::from_static("x-amz-checksum-crc32c"),
    HeaderName::from_static("x-amz-checksum-sha1"),
    HeaderName::from_static("x-amz-checksum-sha256"),
    HeaderName::from_static("x-amz-checksum-crc64nvme"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_constants_name_what_the_rest_of_the_proxy_spells() {
        assert_eq!(FENCING_TOKEN.as_str(), crate::tokens::FENCING_TOKEN_HEADER);
        assert_eq!(
            X_AMZ_META_FENCING_TOKEN.as_str(),
            format!("x-amz-meta-{}", crate::tokens::TOKEN_METADATA_KEY)
        );
        let checksums = X_AMZ_CHECKSUMS;
        let names: Vec<&str> = checksums.iter().map(HeaderName::as_str).collect();
        assert_eq!(names, crate::trailer::NAMES);
    }
}
