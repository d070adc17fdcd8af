//! SigV4's primitives, once for the proxy: the hex it writes hashes in,
//! the URI encoding it signs (and S3 wants keys in), the HMAC chain that
//! derives a day's signing key. The edge checks clients' signatures with
//! them, `lean::sign` signs the store's requests with them, the copy path
//! and the integrity checks read the same forms. A leaf: it knows nothing
//! of requests.

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Lower-case hex of `bytes`, as SigV4 writes hashes and signatures.
/// `hex::encode` builds its `String` a `char` at a time through an
/// iterator; a request signs or checks three or four digests, so this
/// writes the digits straight into a buffer of the final size.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = Vec::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.extend_from_slice(&[DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 0x0f)]]);
    }
    // Hex digits are ASCII.
    String::from_utf8(out).unwrap_or_default()
}

/// Whether `v` is `len` lower-case hex digits.
pub fn is_lower_hex(v: &[u8], len: usize) -> bool {
    v.len() == len && v.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether `v` is a SHA-256 as SigV4 writes it: 64 lower-case hex digits.
pub fn is_sha256_hex(v: &[u8]) -> bool {
    is_lower_hex(v, 64)
}

/// HMAC-SHA256 of `data` under `key`.
pub fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// The signing key of `secret` for `date` (`YYYYMMDD`), `region` and S3:
/// four HMACs, the same for every request of a day (callers keep it).
pub fn signing_key(secret: &str, date: &str, region: &str) -> [u8; 32] {
    let k_date = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let k_region = hmac(&k_date, region.as_bytes());
    let k_service = hmac(&k_region, b"s3");
    hmac(&k_service, b"aws4_request")
}

/// Appends SigV4's URI encoding of `path` to `out`: every byte but the
/// unreserved ones and `/` percent-encoded, upper-case hex (as s3s and
/// S3 encode a path, once).
pub fn uri_encode(out: &mut String, path: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in path.as_bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'~' | b'.' | b'/' => {
                out.push(char::from(b));
            }
            _ => {
                out.push('%');
                out.push(char::from(HEX[usize::from(b >> 4)]));
                out.push(char::from(HEX[usize::from(b & 15)]));
            }
        }
    }
}

/// A key as S3 wants it in a path or an `x-amz-copy-source` (see
/// [`uri_encode`]).
pub fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 8);
    uri_encode(&mut out, key);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_encoded_once_with_slashes_kept() {
        assert_eq!(encode_key("a/b c+d%e"), "a/b%20c%2Bd%25e");
        assert_eq!(encode_key("ü~x"), "%C3%BC~x");
        assert_eq!(encode_key("a b/ü+c"), "a%20b/%C3%BC%2Bc");
    }

    #[test]
    fn hex_forms() {
        assert_eq!(hex(&[0, 0xab, 0x10]), "00ab10");
        assert!(is_sha256_hex(&[b'a'; 64]));
        assert!(!is_sha256_hex(&[b'A'; 64]));
        assert!(!is_sha256_hex(&[b'z'; 64]));
    }
}
