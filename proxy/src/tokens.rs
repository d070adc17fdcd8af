//! Which token a request carries, and whether the proxy believes it.
//!
//! A signed token (or lease-bound credentials) is *vouched for*: the lease
//! service issued it. A plain decimal token is vouched for only where the
//! operator trusts plain numbers (`accept_unsigned_tokens`). Otherwise the
//! gate refuses it, or, with `locksvc_url`, asks the lease service whether
//! it issued it (see [`crate::issuer`]), so a made-up high number cannot
//! raise a scope's max and lock every real holder out.

use crate::scope::Scope;
use fencegate_core::token::VerifyError;
use fencegate_core::{FencingToken, TokenError, TokenKeys};
use http::HeaderMap;

/// The object metadata key holding the writer's token
/// (`x-amz-meta-fencing-token` on the wire).
pub const TOKEN_METADATA_KEY: &str = "fencing-token";

/// The request header carrying the token.
pub const FENCING_TOKEN_HEADER: &str = "fencing-token";

/// The lock a request's token names, if it names one: its lease-bound
/// credentials' lock, else its signed `Fencing-Token`'s (unverified: this
/// only picks the scope the token is then verified against).
pub fn named_lock(
    headers: &HeaderMap,
    access_key: Option<&str>,
) -> Option<fencegate_core::LockName> {
    if let Some(Ok(bound)) = access_key.map(fencegate_core::credentials::parse_access_key) {
        return Some(bound.lock);
    }
    let text = headers.get(FENCING_TOKEN_HEADER)?.to_str().ok()?;
    match FencingToken::parse(text.trim()).ok()? {
        FencingToken::Signed(s) => Some(s.lock),
        FencingToken::Plain(_) => None,
    }
}

/// A token read from a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Presented {
    token: u64,
    /// Signed by a lease service key (or bound to signed credentials), or
    /// trusted because the proxy accepts plain numbers: it may raise a max.
    /// Private: only this module's checks make one, so a `Presented` that
    /// says "vouched" was vouched for.
    vouched: bool,
}

impl Presented {
    /// The token number.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// Whether the proxy can vouch for it (see the field).
    pub fn vouched(&self) -> bool {
        self.vouched
    }
}

/// How the proxy treats tokens.
#[derive(Debug, Clone)]
pub struct TokenPolicy {
    keys: Option<TokenKeys>,
    accept_unsigned: bool,
}

/// Why a token is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("Fencing-Token header is malformed: {0}")]
    Malformed(TokenError),
    #[error("Fencing-Token is sent more than once")]
    Repeated,
    #[error("Fencing-Token is not valid UTF-8/ASCII")]
    NotText,
    #[error(
        "plain tokens are not accepted here: send the signed fencing_token the lease service returned"
    )]
    Unsigned,
    #[error(
        "token {token} is not the current token of lock {lock} at the lease service: take a lease and send the fencing_token it returns"
    )]
    NotIssued { token: u64, lock: String },
    #[error("{0}")]
    Verify(VerifyError),
    #[error(
        "the Fencing-Token header names token {header}, but the lease credentials are bound to token {credentials}"
    )]
    Disagree { header: u64, credentials: u64 },
}

impl TokenPolicy {
    pub fn new(keys: Option<TokenKeys>, accept_unsigned: bool) -> TokenPolicy {
        TokenPolicy {
            keys,
            accept_unsigned,
        }
    }

    /// The token number in `headers` for a write in `scope`; `Ok(None)` if
    /// the request carries no token.
    pub fn from_headers(
        &self,
        headers: &HeaderMap,
        scope: &Scope,
    ) -> Result<Option<Presented>, Rejection> {
        let mut values = headers.get_all(FENCING_TOKEN_HEADER).iter();
        let Some(value) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(Rejection::Repeated);
        }
        let text = value.to_str().map_err(|_| Rejection::NotText)?;
        self.verify(text, scope).map(Some)
    }

    /// The token of a request: from the `Fencing-Token` header and/or the
    /// lease-bound credentials it was signed with (`access_key`); they must
    /// agree when both are present.
    pub fn from_request(
        &self,
        headers: &HeaderMap,
        access_key: Option<&str>,
        scope: &Scope,
    ) -> Result<Option<Presented>, Rejection> {
        let header = self.from_headers(headers, scope)?;
        let bound = match access_key.map(fencegate_core::credentials::parse_access_key) {
            // The signature already proved the key pair came from a lease
            // service holding our key (see access::ClientAuth).
            Some(Ok(bound)) => {
                if bound.lock != scope.lock {
                    return Err(Rejection::Verify(VerifyError::WrongLock {
                        expected: scope.lock.to_string(),
                        found: bound.lock.to_string(),
                    }));
                }
                Some(bound.token)
            }
            _ => None,
        };
        match (header, bound) {
            (Some(h), Some(c)) if h.token != c => Err(Rejection::Disagree {
                header: h.token,
                credentials: c,
            }),
            // The credentials vouch for the number the header repeats.
            (_, Some(c)) => Ok(Some(Presented {
                token: c,
                vouched: true,
            })),
            (h, None) => Ok(h),
        }
    }

    /// The keys, when configured (lease-bound credentials need them).
    pub fn keys(&self) -> Option<&TokenKeys> {
        self.keys.as_ref()
    }

    /// Checks a header value against `scope`'s lock.
    pub fn verify(&self, text: &str, scope: &Scope) -> Result<Presented, Rejection> {
        match FencingToken::parse(text).map_err(Rejection::Malformed)? {
            FencingToken::Plain(token) => Ok(Presented {
                token,
                vouched: self.accept_unsigned,
            }),
            FencingToken::Signed(signed) => self.verify_signed(signed, scope),
        }
    }

    fn verify_signed(
        &self,
        signed: fencegate_core::SignedToken,
        scope: &Scope,
    ) -> Result<Presented, Rejection> {
        match &self.keys {
            Some(keys) => keys
                .verify(&signed, &scope.lock)
                .map(|token| Presented {
                    token,
                    vouched: true,
                })
                .map_err(Rejection::Verify),
            // Without keys the signature cannot be checked: the token is
            // worth its number (trusted, or checked with the lease service,
            // like a plain one), still held to its lock.
            None if signed.lock == scope.lock => Ok(Presented {
                token: signed.token,
                vouched: self.accept_unsigned,
            }),
            None => Err(Rejection::Verify(VerifyError::WrongLock {
                expected: scope.lock.to_string(),
                found: signed.lock.to_string(),
            })),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencegate_core::LockName;

    fn scope() -> Scope {
        Scope {
            id: "bkt".into(),
            bucket: "bkt".into(),
            prefix: String::new(),
            lock: LockName::new("bkt").expect("lock"),
        }
    }

    fn keys() -> TokenKeys {
        TokenKeys::new(vec![b"a-signing-key-for-tests".to_vec()]).expect("keys")
    }

    #[test]
    fn only_signed_tokens_are_vouched_for_unless_plain_ones_are_trusted() {
        let signed = keys().sign(&scope().lock, 7).to_string();
        let strict = TokenPolicy::new(Some(keys()), false);
        let trusting = TokenPolicy::new(Some(keys()), true);
        for (policy, text, want) in [
            (&strict, "7", (7, false)),
            (&strict, signed.as_str(), (7, true)),
            (&trusting, "7", (7, true)),
            (&trusting, signed.as_str(), (7, true)),
        ] {
            let p = policy.verify(text, &scope()).expect("accepted");
            assert_eq!((p.token, p.vouched), want, "{text}");
        }
    }

    #[test]
    fn lease_credentials_vouch_and_must_agree_with_the_header() {
        let policy = TokenPolicy::new(Some(keys()), false);
        let access = keys().credentials(&scope().lock, 5, 1_000).access_key;
        let mut headers = HeaderMap::new();
        let p = policy
            .from_request(&headers, Some(&access), &scope())
            .expect("accepted")
            .expect("a token");
        assert_eq!((p.token, p.vouched), (5, true));
        headers.insert(FENCING_TOKEN_HEADER, "5".parse().expect("value"));
        let p = policy
            .from_request(&headers, Some(&access), &scope())
            .expect("accepted")
            .expect("a token");
        assert_eq!(
            (p.token, p.vouched),
            (5, true),
            "the plain header repeats it"
        );
        headers.insert(FENCING_TOKEN_HEADER, "6".parse().expect("value"));
        assert_eq!(
            policy.from_request(&headers, Some(&access), &scope()),
            Err(Rejection::Disagree {
                header: 6,
                credentials: 5
            })
        );
    }
}
