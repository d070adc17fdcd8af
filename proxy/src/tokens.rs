//! Which token a request carries, and whether the proxy believes it.
//!
//! A signed token (or lease-bound credentials) is *vouched for*: the lease
//! service issued it. A plain decimal token is vouched for only where the
//! operator trusts plain numbers (`accept_unsigned_tokens`). Otherwise the
//! gate refuses it, or, with `locksvc_url`, asks the lease service whether
//! it issued it (see [`crate::issuer`]), so a made-up high number cannot
//! raise a scope's max and lock every real holder out.
//!
//! **The rule as a type.** Every write is admitted and sent with a
//! [`VerifiedToken`], and only this module makes one: by vouching
//! ([`TokenPolicy`]), from the lease service's confirmation
//! ([`Unvouched::issued`]), for a number below the scope's max, which can
//! only be refused as stale ([`Unvouched::below`]), or, in [`upload`], from
//! the proxy's own record of a token it verified when the upload was
//! created. A number from anywhere else cannot reach the fence.

pub mod upload;

use fencegate_core::token::VerifyError;
use fencegate_core::{FencingToken, LockName, TokenError, TokenKeys};
use http::HeaderMap;

/// The object metadata key holding the writer's token
/// (`x-amz-meta-fencing-token` on the wire).
pub const TOKEN_METADATA_KEY: &str = "fencing-token";

/// The request header carrying the token.
pub const FENCING_TOKEN_HEADER: &str = "fencing-token";

/// The lock a request's token names, if it names one: its lease-bound
/// credentials' lock, else its signed `Fencing-Token`'s (unverified: this
/// only picks the scope the token is then verified against).
pub fn named_lock(headers: &HeaderMap, access_key: Option<&str>) -> Option<LockName> {
    if let Some(Ok(bound)) = access_key.map(fencegate_core::credentials::parse_access_key) {
        return Some(bound.lock);
    }
    let text = headers
        .get(crate::header_names::FENCING_TOKEN)?
        .to_str()
        .ok()?;
    match FencingToken::parse(text.trim()).ok()? {
        FencingToken::Signed(s) => Some(s.lock),
        FencingToken::Plain(_) => None,
    }
}

/// The one `Fencing-Token` header's text, if the request has one.
fn header_text(headers: &HeaderMap) -> Result<Option<&str>, Rejection> {
    let mut values = headers.get_all(crate::header_names::FENCING_TOKEN).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Rejection::Repeated);
    }
    value.to_str().map(Some).map_err(|_| Rejection::NotText)
}

/// A token the proxy may admit and write with. Its field is private: only
/// this module makes one (see the module docs), so holding one is proof.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifiedToken {
    number: u64,
}

impl VerifiedToken {
    /// The token number.
    pub fn number(self) -> u64 {
        self.number
    }
}

/// A token read from a request, as far as the request itself proves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presented {
    /// Signed by a lease service key (or bound to signed credentials), or
    /// a plain number where the proxy trusts plain numbers: it may raise a
    /// max.
    Vouched(VerifiedToken),
    /// A number nothing in the request vouches for.
    Unvouched(Unvouched),
}

impl Presented {
    /// The token number.
    pub fn number(self) -> u64 {
        match self {
            Presented::Vouched(t) => t.number,
            Presented::Unvouched(u) => u.number,
        }
    }
}

/// A token number the request does not prove: it becomes a
/// [`VerifiedToken`] only by the lease service's word, or by being too low
/// to raise anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unvouched {
    number: u64,
}

impl Unvouched {
    /// The token number.
    pub fn number(self) -> u64 {
        self.number
    }

    /// A number nothing vouches for yet (the proxy's own reading of an
    /// election, say): it proves nothing until [`Unvouched::issued`].
    pub fn claimed(number: u64) -> Unvouched {
        Unvouched { number }
    }

    /// Verified by the lease service saying it issued this number.
    pub fn issued(self, proof: crate::issuer::Issued) -> Option<VerifiedToken> {
        (proof.token() == self.number).then_some(VerifiedToken {
            number: self.number,
        })
    }

    /// Below the scope's current max: it can only be refused as stale
    /// (a max never goes down), so the lease service need not be asked.
    pub fn below(self, max: u64) -> Option<VerifiedToken> {
        fencegate_core::fence::is_stale(max, self.number).then_some(VerifiedToken {
            number: self.number,
        })
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
        "lock {lock} follows {seat}: send the holder's term (its key's revision) as a plain Fencing-Token (what `fencegate election token` prints), not a lease service's token or credentials"
    )]
    NotTheElections { lock: String, seat: String },
    #[error(
        "lock {lock} follows {seat} and takes only tokens signed with its signing_keys: send what `fencegate election run` or `fencegate election token --signing-key-file` gives, not a plain number"
    )]
    ElectionSigned { lock: String, seat: String },
    #[error("{0}")]
    NotElected(String),
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

    /// The token in `headers` for a write under `lock`; `Ok(None)` if
    /// the request carries no token.
    pub fn in_headers(
        &self,
        headers: &HeaderMap,
        lock: &LockName,
    ) -> Result<Option<Presented>, Rejection> {
        match header_text(headers)? {
            Some(text) => self.verify(text, lock).map(Some),
            None => Ok(None),
        }
    }

    /// The token of a request: from the `Fencing-Token` header and/or the
    /// lease-bound credentials it was signed with (`access_key`); they must
    /// agree when both are present.
    pub fn in_request(
        &self,
        headers: &HeaderMap,
        access_key: Option<&str>,
        lock: &LockName,
    ) -> Result<Option<Presented>, Rejection> {
        let header = self.in_headers(headers, lock)?;
        let bound = match access_key.map(fencegate_core::credentials::parse_access_key) {
            // The signature already proved the key pair came from a lease
            // service holding our key (see access::ClientAuth).
            Some(Ok(bound)) => {
                if bound.lock != *lock {
                    return Err(Rejection::Verify(VerifyError::WrongLock {
                        expected: lock.to_string(),
                        found: bound.lock.to_string(),
                    }));
                }
                Some(bound.token)
            }
            _ => None,
        };
        match (header, bound) {
            (Some(h), Some(c)) if h.number() != c => Err(Rejection::Disagree {
                header: h.number(),
                credentials: c,
            }),
            // The credentials vouch for the number the header repeats.
            (_, Some(c)) => Ok(Some(Presented::Vouched(VerifiedToken { number: c }))),
            (h, None) => Ok(h),
        }
    }

    /// The token of a write to a lock that follows an election, as far as
    /// the request proves it: only the election, asked then and there,
    /// can vouch that the number is its holder's. Without `keys` the token
    /// is a plain number, the revision the holder's term began at; with them, it
    /// must be signed with them, in the header or as credentials bound to
    /// it (whose signature `access::ClientAuth` checked with the same
    /// keys). A lease service's token or credentials name no election's
    /// holder: refused.
    pub fn elected(
        &self,
        (headers, access_key): (&HeaderMap, Option<&str>),
        lock: &LockName,
        (seat, keys): (&str, Option<&TokenKeys>),
    ) -> Result<Option<Unvouched>, Rejection> {
        let not_its = || Rejection::NotTheElections {
            lock: lock.to_string(),
            seat: seat.to_owned(),
        };
        let bound = match access_key.map(fencegate_core::credentials::parse_access_key) {
            Some(Ok(_)) if keys.is_none() => return Err(not_its()),
            Some(Ok(bound)) if bound.lock != *lock => {
                return Err(Rejection::Verify(VerifyError::WrongLock {
                    expected: lock.to_string(),
                    found: bound.lock.to_string(),
                }));
            }
            Some(Ok(bound)) => Some(bound.token),
            _ => None,
        };
        let header = match header_text(headers)? {
            None => None,
            Some(text) => match (
                FencingToken::parse(text.trim()).map_err(Rejection::Malformed)?,
                keys,
            ) {
                (FencingToken::Plain(number), None) => Some(number),
                (FencingToken::Plain(_), Some(_)) => {
                    return Err(Rejection::ElectionSigned {
                        lock: lock.to_string(),
                        seat: seat.to_owned(),
                    });
                }
                (FencingToken::Signed(_), None) => return Err(not_its()),
                (FencingToken::Signed(signed), Some(keys)) => {
                    Some(keys.verify(&signed, lock).map_err(Rejection::Verify)?)
                }
            },
        };
        match (header, bound) {
            (Some(h), Some(c)) if h != c => Err(Rejection::Disagree {
                header: h,
                credentials: c,
            }),
            (h, c) => Ok(c.or(h).map(|number| Unvouched { number })),
        }
    }

    /// The keys, when configured (lease-bound credentials need them).
    pub fn keys(&self) -> Option<&TokenKeys> {
        self.keys.as_ref()
    }

    /// Checks a header value against `lock`.
    pub fn verify(&self, text: &str, lock: &LockName) -> Result<Presented, Rejection> {
        match FencingToken::parse(text).map_err(Rejection::Malformed)? {
            FencingToken::Plain(token) => Ok(self.plain(token)),
            FencingToken::Signed(signed) => self.verify_signed(signed, lock),
        }
    }

    /// A number worth only itself: vouched for where plain numbers are
    /// trusted.
    fn plain(&self, number: u64) -> Presented {
        if self.accept_unsigned {
            Presented::Vouched(VerifiedToken { number })
        } else {
            Presented::Unvouched(Unvouched { number })
        }
    }

    fn verify_signed(
        &self,
        signed: fencegate_core::SignedToken,
        lock: &LockName,
    ) -> Result<Presented, Rejection> {
        match &self.keys {
            Some(keys) => keys
                .verify(&signed, lock)
                .map(|number| Presented::Vouched(VerifiedToken { number }))
                .map_err(Rejection::Verify),
            // Without keys the signature cannot be checked: the token is
            // worth its number (trusted, or checked with the lease service,
            // like a plain one), still held to its lock.
            None if signed.lock == *lock => Ok(self.plain(signed.token)),
            None => Err(Rejection::Verify(VerifyError::WrongLock {
                expected: lock.to_string(),
                found: signed.lock.to_string(),
            })),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock() -> LockName {
        LockName::new("bkt").expect("lock")
    }

    fn keys() -> TokenKeys {
        TokenKeys::new(vec![b"a-signing-key-for-tests".to_vec()]).expect("keys")
    }

    /// The number and whether the request vouched for it.
    fn read(p: Presented) -> (u64, bool) {
        (p.number(), matches!(p, Presented::Vouched(_)))
    }

    #[test]
    fn only_signed_tokens_are_vouched_for_unless_plain_ones_are_trusted() {
        let signed = keys().sign(&lock(), 7).to_string();
        let strict = TokenPolicy::new(Some(keys()), false);
        let trusting = TokenPolicy::new(Some(keys()), true);
        for (policy, text, want) in [
            (&strict, "7", (7, false)),
            (&strict, signed.as_str(), (7, true)),
            (&trusting, "7", (7, true)),
            (&trusting, signed.as_str(), (7, true)),
        ] {
            let p = policy.verify(text, &lock()).expect("accepted");
            assert_eq!(read(p), want, "{text}");
        }
    }

    #[test]
    fn an_unvouched_number_is_verified_only_below_the_max_or_by_the_issuer() {
        let Ok(Presented::Unvouched(u)) = TokenPolicy::new(None, false).verify("7", &lock()) else {
            panic!("a plain number is not vouched for");
        };
        assert_eq!(u.below(7), None, "at the max it could raise it");
        assert_eq!(u.below(8).map(VerifiedToken::number), Some(7));
        assert_eq!(
            u.issued(crate::issuer::Issued::for_tests(6)),
            None,
            "another number was issued"
        );
        assert_eq!(
            u.issued(crate::issuer::Issued::for_tests(7))
                .map(VerifiedToken::number),
            Some(7)
        );
    }

    #[test]
    fn lease_credentials_vouch_and_must_agree_with_the_header() {
        let policy = TokenPolicy::new(Some(keys()), false);
        let access = keys().credentials(&lock(), 5, 1_000).access_key;
        let mut headers = HeaderMap::new();
        let p = policy
            .in_request(&headers, Some(&access), &lock())
            .expect("accepted")
            .expect("a token");
        assert_eq!(read(p), (5, true));
        headers.insert(FENCING_TOKEN_HEADER, "5".parse().expect("value"));
        let p = policy
            .in_request(&headers, Some(&access), &lock())
            .expect("accepted")
            .expect("a token");
        assert_eq!(read(p), (5, true), "the plain header repeats it");
        headers.insert(FENCING_TOKEN_HEADER, "6".parse().expect("value"));
        assert_eq!(
            policy.in_request(&headers, Some(&access), &lock()),
            Err(Rejection::Disagree {
                header: 6,
                credentials: 5
            })
        );
    }
}
