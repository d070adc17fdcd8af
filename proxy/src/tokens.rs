//! Which token a request carries, and whether the proxy believes it.

use crate::scope::Scope;
use fencegate_core::token::VerifyError;
use fencegate_core::{FencingToken, TokenError, TokenKeys};
use http::HeaderMap;

/// The request header carrying the token.
pub const FENCING_TOKEN_HEADER: &str = "fencing-token";

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
        "unsigned tokens are not accepted here: send the signed fencing_token the lease service returned"
    )]
    Unsigned,
    #[error("{0}")]
    Verify(VerifyError),
    #[error("signed tokens cannot be checked: the proxy has no signing_keys")]
    NoKeys,
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
    ) -> Result<Option<u64>, Rejection> {
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
    ) -> Result<Option<u64>, Rejection> {
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
            (Some(h), Some(c)) if h != c => Err(Rejection::Disagree {
                header: h,
                credentials: c,
            }),
            (h, c) => Ok(h.or(c)),
        }
    }

    /// The keys, when configured (lease-bound credentials need them).
    pub fn keys(&self) -> Option<&TokenKeys> {
        self.keys.as_ref()
    }

    /// Checks a header value against `scope`'s lock.
    pub fn verify(&self, text: &str, scope: &Scope) -> Result<u64, Rejection> {
        match FencingToken::parse(text).map_err(Rejection::Malformed)? {
            FencingToken::Plain(n) if self.accept_unsigned => Ok(n),
            FencingToken::Plain(_) => Err(Rejection::Unsigned),
            FencingToken::Signed(signed) => match &self.keys {
                Some(keys) => keys.verify(&signed, &scope.lock).map_err(Rejection::Verify),
                // Without keys the proxy trusts plain numbers anyway; it can
                // still hold the token to its lock.
                None if self.accept_unsigned => {
                    if signed.lock == scope.lock {
                        Ok(signed.token)
                    } else {
                        Err(Rejection::Verify(VerifyError::WrongLock {
                            expected: scope.lock.to_string(),
                            found: signed.lock.to_string(),
                        }))
                    }
                }
                None => Err(Rejection::NoKeys),
            },
        }
    }
}
