//! SigV4's primitives, once for the proxy: the hex it writes hashes in,
//! the sink a canonical request is written to (its hash, not a text),
//! the URI encoding it signs (and S3 wants keys in), the HMAC chain that
//! derives a day's signing key. The edge checks clients' signatures with
//! them, `lean::sign` signs the store's requests with them, the copy path
//! and the integrity checks read the same forms. A leaf: it knows nothing
//! of requests.

use hmac::{Hmac, Mac};
use sha2::Sha256;

pub type HmacSha256 = Hmac<Sha256>;

fn hex_pair(b: u8) -> [u8; 2] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 0x0f)]]
}

/// A SHA-256 digest (or HMAC) in SigV4's lower-case hex, on the stack: the
/// form a request signs or checks three times, with no allocation (and
/// not `hex::encode`, which builds its `String` a `char` at a time).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Hex64([u8; 64]);

impl Hex64 {
    /// The hex of `digest`.
    pub fn of(digest: &[u8; 32]) -> Hex64 {
        let mut out = [b'0'; 64];
        for (pair, b) in out.chunks_exact_mut(2).zip(digest) {
            pair.copy_from_slice(&hex_pair(*b));
        }
        Hex64(out)
    }

    /// `text` if it is 64 lower-case hex digits (a SHA-256 as SigV4 writes
    /// it).
    pub fn parse(text: &[u8]) -> Option<Hex64> {
        is_sha256_hex(text).then(|| {
            let mut out = [0; 64];
            out.copy_from_slice(text);
            Hex64(out)
        })
    }

    pub fn as_str(&self) -> &str {
        // Hex digits are ASCII.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl std::fmt::Debug for Hex64 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a canonical request or a string to sign is written: straight into
/// the SHA-256 or the HMAC that reads it (no text is built on the request
/// path), or into a `String` where the text itself is wanted.
pub trait Sink {
    fn put(&mut self, text: &str);
}

impl Sink for String {
    fn put(&mut self, text: &str) {
        self.push_str(text);
    }
}

impl Sink for Sha256 {
    fn put(&mut self, text: &str) {
        sha2::Digest::update(self, text.as_bytes());
    }
}

impl Sink for HmacSha256 {
    fn put(&mut self, text: &str) {
        self.update(text.as_bytes());
    }
}

/// An HMAC-SHA256 under `key`, to be fed by pieces ([`Sink`]).
pub fn hmac_of(key: &[u8]) -> HmacSha256 {
    HmacSha256::new_from_slice(key).expect("HMAC takes a key of any length")
}

/// Whether `v` is `len` lower-case hex digits.
pub fn is_lower_hex(v: &[u8], len: usize) -> bool {
    // Every byte looked at, without an early exit: the compiler checks
    // them many at a time.
    v.len() == len
        && v.iter().fold(true, |ok, b| {
            ok & (b.is_ascii_digit() | (b'a'..=b'f').contains(b))
        })
}

/// The 32-byte digest (a SHA-256, or an HMAC's: a signature) that `hex`,
/// 64 lower-case hex digits, writes; `None` if it is not so written.
pub fn digest_of_hex(hex: &str) -> Option<[u8; 32]> {
    if !is_sha256_hex(hex.as_bytes()) {
        return None;
    }
    let nibble = |c: u8| if c <= b'9' { c - b'0' } else { c - b'a' + 10 };
    let mut out = [0u8; 32];
    for (o, pair) in out.iter_mut().zip(hex.as_bytes().chunks_exact(2)) {
        *o = nibble(pair[0]) << 4 | nibble(pair[1]);
    }
    Some(out)
}

/// Whether `v` is a SHA-256 as SigV4 writes it: 64 lower-case hex digits.
pub fn is_sha256_hex(v: &[u8]) -> bool {
    is_lower_hex(v, 64)
}

/// HMAC-SHA256 of `data` under `key`.
pub fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut mac = hmac_of(key);
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

/// Writes SigV4's URI encoding of `path` to `out`: every byte but the
/// unreserved ones and `/` percent-encoded, upper-case hex (as s3s and
/// S3 encode a path, once). Runs of bytes kept as they are go out whole.
pub fn uri_encode(out: &mut impl Sink, path: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let bytes = path.as_bytes();
    let mut kept = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if matches!(b, b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'~' | b'.' | b'/') {
            continue;
        }
        // `kept..i`, if not empty, is ASCII, so on character boundaries
        // (an empty one may sit inside a character, escaped a byte at a
        // time).
        if kept < i {
            out.put(&path[kept..i]);
        }
        let escaped = [b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]];
        out.put(std::str::from_utf8(&escaped).unwrap_or_default());
        kept = i + 1;
    }
    if kept < bytes.len() {
        out.put(&path[kept..]);
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
    fn a_canonical_text_hashes_as_the_same_text_whole() {
        let pieces = ["PUT\n", "/b/a%20b", "\n\n", "host:x\n"];
        let mut hashed = Sha256::default();
        let mut text = String::new();
        for p in pieces {
            hashed.put(p);
            text.put(p);
        }
        use sha2::Digest;
        assert_eq!(hashed.finalize(), Sha256::digest(text.as_bytes()));
    }

    #[test]
    fn keys_are_encoded_once_with_slashes_kept() {
        assert_eq!(encode_key("a/b c+d%e"), "a/b%20c%2Bd%25e");
        assert_eq!(encode_key("ü~x"), "%C3%BC~x");
        assert_eq!(encode_key("a b/ü+c"), "a%20b/%C3%BC%2Bc");
    }

    #[test]
    fn hex_forms() {
        let digest: [u8; 32] = std::array::from_fn(|i| u8::try_from(i * 8 + 3).unwrap_or(0));
        assert_eq!(Hex64::of(&digest).as_str(), hex::encode(digest));
        let text = hex::encode(digest);
        assert_eq!(Hex64::parse(text.as_bytes()), Some(Hex64::of(&digest)));
        assert_eq!(Hex64::parse(text.to_uppercase().as_bytes()), None);
        assert_eq!(Hex64::parse(&text.as_bytes()[1..]), None);
        assert_eq!(digest_of_hex(&text), Some(digest));
        assert_eq!(digest_of_hex(&text.to_uppercase()), None);
        assert_eq!(digest_of_hex(&text[1..]), None);
        assert_eq!(digest_of_hex(&format!("{}g", &text[1..])), None);
        assert!(is_sha256_hex(&[b'a'; 64]));
        assert!(!is_sha256_hex(&[b'A'; 64]));
        assert!(!is_sha256_hex(&[b'z'; 64]));
    }
}
