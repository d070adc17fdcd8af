//! The fencing token on the wire: the value of the `Fencing-Token` header.
//!
//! Two forms are accepted:
//!
//! - **plain**: a decimal u64 such as `42` (no sign, no leading `+`, at most
//!   20 digits, not 0: tokens start at 1);
//! - **signed**: `fgt1:<lock>:<token>:<mac>`, where `<mac>` is the unpadded
//!   base64url HMAC-SHA256 of `fgt1:<lock>:<token>` under a key shared by the
//!   lease service and the proxy. `fgt1` versions the format; a future format
//!   gets a new prefix. The string is ASCII with no spaces, so it is safe in
//!   any HTTP header and in an environment variable.
//!
//! A signed token names its lock, so a proxy can refuse a token issued for a
//! different lock, and it cannot be forged without the key, so nobody can
//! raise a fence's maximum with a number no lease service issued.

use crate::name::{LockName, LockNameError};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt;

type HmacSha256 = Hmac<Sha256>;

/// The version prefix of signed tokens.
pub const SIGNED_PREFIX: &str = "fgt1";
/// Header values longer than this are refused before any parsing.
pub const MAX_TOKEN_LEN: usize = 256;

/// The largest token number: 2^63 - 1. Tokens are stored as SQLite
/// integers (i64) by the lease service and the proxy, and the token sources
/// one could use instead (etcd revisions, ZooKeeper zxids) are i64 as well.
/// A larger number could not be persisted as it was admitted, so the wire
/// format refuses it.
pub const MAX_TOKEN: u64 = i64::MAX as u64;

/// A parsed `Fencing-Token` header value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FencingToken {
    /// A bare number: trusted only where the operator allows unsigned tokens.
    Plain(u64),
    /// A signed token; its MAC is checked by [`TokenKeys::verify`].
    Signed(SignedToken),
}

impl FencingToken {
    /// The token number, whatever the form.
    pub fn number(&self) -> u64 {
        match self {
            FencingToken::Plain(n) => *n,
            FencingToken::Signed(s) => s.token,
        }
    }

    /// Parses a header value (surrounding whitespace is ignored).
    pub fn parse(value: &str) -> Result<FencingToken, TokenError> {
        let value = value.trim();
        if value.len() > MAX_TOKEN_LEN {
            return Err(TokenError::TooLong { len: value.len() });
        }
        if value.starts_with(|c: char| c.is_ascii_digit()) {
            return parse_number(value).map(FencingToken::Plain);
        }
        SignedToken::parse(value).map(FencingToken::Signed)
    }
}

/// A signed token as parsed; [`TokenKeys::verify`] says whether it is genuine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedToken {
    pub lock: LockName,
    pub token: u64,
    mac: Vec<u8>,
}

impl SignedToken {
    fn parse(value: &str) -> Result<SignedToken, TokenError> {
        let Some([prefix, lock, token, mac]) = crate::fields::exact(value, b':') else {
            return Err(TokenError::Shape);
        };
        if prefix != SIGNED_PREFIX {
            return Err(TokenError::Version {
                found: prefix.chars().take(16).collect(),
            });
        }
        let lock = LockName::new(lock).map_err(TokenError::Lock)?;
        let token = parse_number(token)?;
        let mac = URL_SAFE_NO_PAD
            .decode(mac)
            .map_err(|_| TokenError::MacEncoding)?;
        if mac.len() != 32 {
            return Err(TokenError::MacEncoding);
        }
        Ok(SignedToken { lock, token, mac })
    }
}

impl fmt::Display for SignedToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{SIGNED_PREFIX}:{}:{}:{}",
            self.lock,
            self.token,
            URL_SAFE_NO_PAD.encode(&self.mac)
        )
    }
}

fn parse_number(s: &str) -> Result<u64, TokenError> {
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(TokenError::Number);
    }
    // One spelling per number: `07` is not `7` on the wire.
    if s.len() > 1 && s.starts_with('0') {
        return Err(TokenError::LeadingZero);
    }
    match s.parse::<u64>() {
        Ok(0) => Err(TokenError::Zero),
        Ok(n) if n > MAX_TOKEN => Err(TokenError::Number),
        Ok(n) => Ok(n),
        Err(_) => Err(TokenError::Number),
    }
}

/// Why a header value is not a fencing token. The messages are written for
/// the client who sent it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("token is {len} bytes long; the limit is {MAX_TOKEN_LEN}")]
    TooLong { len: usize },
    #[error("token number must be a decimal integer between 1 and 9223372036854775807 (2^63-1)")]
    Number,
    #[error("token 0 is never issued; tokens start at 1")]
    Zero,
    #[error("token numbers are written without leading zeros")]
    LeadingZero,
    #[error("signed token must look like fgt1:<lock>:<number>:<mac>")]
    Shape,
    #[error("signed token version {found:?} is not supported; expected {SIGNED_PREFIX}")]
    Version { found: String },
    #[error("signed token names an invalid lock: {0}")]
    Lock(LockNameError),
    #[error("signed token MAC must be 43 characters of unpadded base64url")]
    MacEncoding,
}

/// Why a well-formed signed token is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("token signature does not verify with any configured key")]
    BadSignature,
    #[error(
        "token was issued for lock {found:?}, but this resource is fenced by lock {expected:?}"
    )]
    WrongLock { expected: String, found: String },
}

/// The HMAC keys shared between the lease service and the proxy.
///
/// The first key signs; every key verifies. Rotation: add the new key second
/// everywhere, then move it first on the lease service, then drop the old one
/// once no lease signed with it can still be live.
///
/// Each key has a public id (see [`TokenKeys::key_id`]), which lease-bound
/// credentials carry so that a proxy knows which of its keys derives their
/// secret (`crate::credentials`).
#[derive(Clone)]
pub struct TokenKeys {
    keys: Vec<Vec<u8>>,
    /// `ids[i]` is the id of `keys[i]`.
    ids: Vec<String>,
}

impl fmt::Debug for TokenKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print key material.
        write!(f, "TokenKeys({} keys)", self.keys.len())
    }
}

/// Shortest key accepted, in bytes.
pub const MIN_KEY_LEN: usize = 16;

impl TokenKeys {
    /// Keys in order of preference; `None` if the list is empty or a key is
    /// shorter than [`MIN_KEY_LEN`] bytes.
    ///
    /// Two different keys with the same id are refused too (a chance of
    /// 2^-48 per pair), so an id always names exactly one key; the same key
    /// listed twice is harmless.
    pub fn new(keys: Vec<Vec<u8>>) -> Option<TokenKeys> {
        if keys.is_empty() || keys.iter().any(|k| k.len() < MIN_KEY_LEN) {
            return None;
        }
        let ids: Vec<String> = keys.iter().map(|k| TokenKeys::id_of(k)).collect();
        for (i, id) in ids.iter().enumerate() {
            if ids[..i]
                .iter()
                .zip(&keys)
                .any(|(other, key)| other == id && key != &keys[i])
            {
                return None;
            }
        }
        Some(TokenKeys { keys, ids })
    }

    /// The public id of `key`: 12 hex digits of HMAC-SHA256(key,
    /// `"fencegate-key-id"`). It names a key without revealing it (the
    /// secrets derived from a key are HMACs of known strings already), and
    /// it is what an operator compares to see which key a credential needs.
    fn id_of(key: &[u8]) -> String {
        let mut mac = HmacSha256::new_from_slice(key).expect("HMAC accepts keys of any length");
        mac.update(b"fencegate-key-id");
        mac.finalize().into_bytes()[..6]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The id of the signing (first) key.
    pub fn key_id(&self) -> &str {
        &self.ids[0]
    }

    /// The index of the key with id `id`, if this list has it.
    pub(crate) fn index_of(&self, id: &str) -> Option<usize> {
        self.ids.iter().position(|k| k == id)
    }

    fn mac(key: &[u8], lock: &LockName, token: u64) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(key).expect("HMAC accepts keys of any length");
        // `fgt1:<lock>:<token>`, in pieces (the MAC is of their bytes in
        // order): a verification on every write allocates nothing here.
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        let mut n = token;
        loop {
            at -= 1;
            digits[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        for part in [
            SIGNED_PREFIX.as_bytes(),
            b":",
            lock.as_str().as_bytes(),
            b":",
            &digits[at..],
        ] {
            mac.update(part);
        }
        mac
    }

    /// HMAC-SHA256 of `msg` under key `index` (0 is the signing key).
    pub(crate) fn mac_bytes(&self, index: usize, msg: &[u8]) -> Vec<u8> {
        let mut mac =
            HmacSha256::new_from_slice(&self.keys[index]).expect("HMAC accepts keys of any length");
        mac.update(msg);
        mac.finalize().into_bytes().to_vec()
    }

    /// Signs `token` for `lock` with the first key.
    pub fn sign(&self, lock: &LockName, token: u64) -> SignedToken {
        let mac = TokenKeys::mac(&self.keys[0], lock, token)
            .finalize()
            .into_bytes()
            .to_vec();
        SignedToken {
            lock: lock.clone(),
            token,
            mac,
        }
    }

    /// Checks the MAC (in constant time) and that the token is for `lock`.
    pub fn verify(&self, signed: &SignedToken, lock: &LockName) -> Result<u64, VerifyError> {
        let genuine = self.keys.iter().any(|key| {
            TokenKeys::mac(key, &signed.lock, signed.token)
                .verify_slice(&signed.mac)
                .is_ok()
        });
        if !genuine {
            return Err(VerifyError::BadSignature);
        }
        if &signed.lock != lock {
            return Err(VerifyError::WrongLock {
                expected: lock.to_string(),
                found: signed.lock.to_string(),
            });
        }
        Ok(signed.token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(k: &str) -> TokenKeys {
        TokenKeys::new(vec![k.as_bytes().to_vec()]).expect("long enough")
    }
    fn lock(s: &str) -> LockName {
        LockName::new(s).expect("valid")
    }

    #[test]
    fn plain_numbers() {
        assert_eq!(FencingToken::parse(" 42 "), Ok(FencingToken::Plain(42)));
        assert_eq!(
            FencingToken::parse("9223372036854775807"),
            Ok(FencingToken::Plain(MAX_TOKEN))
        );
        for (text, error) in [
            ("9223372036854775808", TokenError::Number),
            ("18446744073709551615", TokenError::Number),
            ("0", TokenError::Zero),
            ("1e3", TokenError::Number),
            ("07", TokenError::LeadingZero),
            ("-1", TokenError::Shape),
        ] {
            assert_eq!(FencingToken::parse(text), Err(error), "{text}");
        }
        assert_eq!(FencingToken::parse(""), Err(TokenError::Shape));
    }

    #[test]
    fn signed_round_trip_and_verify() {
        let k = keys("0123456789abcdef0123");
        let s = k.sign(&lock("nightly"), 7).to_string();
        assert!(s.starts_with("fgt1:nightly:7:"));
        assert_eq!(s.len(), "fgt1:nightly:7:".len() + 43);
        let FencingToken::Signed(parsed) = FencingToken::parse(&s).expect("parses") else {
            panic!("expected a signed token");
        };
        assert_eq!(k.verify(&parsed, &lock("nightly")), Ok(7));
    }

    #[test]
    fn the_mac_is_of_the_documented_text() {
        // HMAC-SHA256(key, "fgt1:<lock>:<token>"), computed here apart from
        // the signer, for numbers of every width.
        let k = keys("0123456789abcdef0123");
        for token in [1, 7, 10, 99, 4_294_967_296, MAX_TOKEN] {
            let mut mac = HmacSha256::new_from_slice(b"0123456789abcdef0123").expect("key");
            mac.update(format!("fgt1:nightly:{token}").as_bytes());
            let expected = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
            let signed = k.sign(&lock("nightly"), token).to_string();
            assert_eq!(signed, format!("fgt1:nightly:{token}:{expected}"));
        }
    }

    #[test]
    fn tampered_wrong_key_and_other_lock_are_refused() {
        let k = keys("0123456789abcdef0123");
        let s = k.sign(&lock("nightly"), 7).to_string();
        let tampered = s.replace(":7:", ":8:");
        let FencingToken::Signed(t) = FencingToken::parse(&tampered).expect("parses") else {
            panic!("signed");
        };
        assert_eq!(
            k.verify(&t, &lock("nightly")),
            Err(VerifyError::BadSignature)
        );

        let FencingToken::Signed(genuine) = FencingToken::parse(&s).expect("parses") else {
            panic!("signed");
        };
        let other = keys("another-key-entirely!");
        assert_eq!(
            other.verify(&genuine, &lock("nightly")),
            Err(VerifyError::BadSignature)
        );
        assert!(matches!(
            k.verify(&genuine, &lock("weekly")),
            Err(VerifyError::WrongLock { .. })
        ));
    }

    #[test]
    fn rotation_verifies_with_any_key() {
        let old = keys("old-key-0123456789");
        let both = TokenKeys::new(vec![
            b"new-key-0123456789".to_vec(),
            b"old-key-0123456789".to_vec(),
        ])
        .expect("valid");
        let FencingToken::Signed(t) =
            FencingToken::parse(&old.sign(&lock("x"), 3).to_string()).expect("parses")
        else {
            panic!("signed");
        };
        assert_eq!(both.verify(&t, &lock("x")), Ok(3));
    }

    #[test]
    fn malformed_signed_tokens() {
        assert!(matches!(
            FencingToken::parse("fgt9:a:1:xx"),
            Err(TokenError::Version { .. })
        ));
        assert!(matches!(
            FencingToken::parse("fgt1:a b:1:xx"),
            Err(TokenError::Lock(_))
        ));
        for (text, error) in [
            ("fgt1:a:1".to_owned(), TokenError::Shape),
            ("fgt1:a:1:!!".to_owned(), TokenError::MacEncoding),
            ("9".repeat(300), TokenError::TooLong { len: 300 }),
        ] {
            assert_eq!(FencingToken::parse(&text), Err(error), "{text}");
        }
    }

    #[test]
    fn short_keys_are_refused() {
        assert!(TokenKeys::new(vec![b"short".to_vec()]).is_none());
        assert!(TokenKeys::new(vec![]).is_none());
    }
}
