//! Proof of holding a lease (design rule 7).
//!
//! A token's number is public: status answers show it, and a `LeaseLost`
//! refusal tells a stale holder the current one (rule 4). So a number proves
//! nothing, and renew and release act only for a caller that shows what the
//! lease service gave the holder alone: the signed `fencing_token`, whose
//! MAC verifies with the service's keys and whose lock is the request's
//! lock. [`HeldToken`] is the result of that check, and the only way to
//! ask the engine to renew or release.
//!
//! An acquire proves it comes from the client that already holds the lease
//! with the idempotency key it sent first ([`IdempotencyKey`]); the key is
//! checked in the core's `LockTable::acquire`, against its stored digest.

use fencegate_core::{FencingToken, KeyDigest, LockName, TokenKeys, VerifyError};

/// A token number for a lock, proven by a genuine signed token for that
/// lock. Constructed only by [`verify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldToken {
    lock: LockName,
    token: u64,
}

impl HeldToken {
    pub fn lock(&self) -> &LockName {
        &self.lock
    }

    pub fn token(&self) -> u64 {
        self.token
    }
}

/// Why a presented token does not prove holding.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    /// A bare number: anyone can know it.
    #[error("token {0} is a plain number")]
    Plain(u64),
    /// The MAC does not verify with any configured key.
    #[error("the token's signature does not verify")]
    BadSignature,
    /// A genuine token, of another lock.
    #[error("the token is for lock {found:?}, not {expected:?}")]
    WrongLock { expected: String, found: String },
}

/// Checks that `presented` is a genuine signed token for `lock`.
pub fn verify(
    keys: &TokenKeys,
    presented: &FencingToken,
    lock: &LockName,
) -> Result<HeldToken, ProofError> {
    match presented {
        FencingToken::Plain(n) => Err(ProofError::Plain(*n)),
        FencingToken::Signed(signed) => match keys.verify(signed, lock) {
            Ok(token) => Ok(HeldToken {
                lock: lock.clone(),
                token,
            }),
            Err(VerifyError::BadSignature) => Err(ProofError::BadSignature),
            Err(VerifyError::WrongLock { expected, found }) => {
                Err(ProofError::WrongLock { expected, found })
            }
        },
    }
}

/// Shortest idempotency key accepted, in bytes: short enough for a UUID
/// without dashes or 16 random bytes in hex, long enough that it cannot be
/// guessed.
pub const MIN_IDEMPOTENCY_KEY_LEN: usize = 16;
/// Longest idempotency key accepted, in bytes.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 256;

/// A client-chosen secret sent with an acquire, so that a retry of the same
/// acquire (its answer was lost) gets the same lease back, and nobody else
/// does.
#[derive(Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

impl std::fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // It is a secret: never print it.
        f.write_str("IdempotencyKey(..)")
    }
}

impl IdempotencyKey {
    /// Validates `key`: [`MIN_IDEMPOTENCY_KEY_LEN`] to
    /// [`MAX_IDEMPOTENCY_KEY_LEN`] bytes, no control characters.
    pub fn new(key: String) -> Result<IdempotencyKey, String> {
        if key.len() < MIN_IDEMPOTENCY_KEY_LEN
            || key.len() > MAX_IDEMPOTENCY_KEY_LEN
            || key.chars().any(char::is_control)
        {
            return Err(format!(
                "idempotency_key must be {MIN_IDEMPOTENCY_KEY_LEN} to {MAX_IDEMPOTENCY_KEY_LEN} bytes without control characters: a secret only this client knows (e.g. 32 random hex digits), sent again with a retry of the same acquire"
            ));
        }
        Ok(IdempotencyKey(key))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// What the service keeps of it.
    pub fn digest(&self) -> KeyDigest {
        KeyDigest::of(self.0.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(s: &str) -> LockName {
        LockName::new(s).expect("valid")
    }

    #[test]
    fn only_a_genuine_signed_token_of_the_lock_proves_holding() {
        let k = TokenKeys::new(vec![b"service-key-0123456789".to_vec()]).expect("long enough");
        let genuine = FencingToken::Signed(k.sign(&lock("db"), 7));
        assert_eq!(
            verify(&k, &genuine, &lock("db")).map(|h| (h.lock().clone(), h.token())),
            Ok((lock("db"), 7))
        );
        assert_eq!(
            verify(&k, &FencingToken::Plain(7), &lock("db")),
            Err(ProofError::Plain(7))
        );
        assert!(matches!(
            verify(&k, &genuine, &lock("other")),
            Err(ProofError::WrongLock { .. })
        ));
        let forged = FencingToken::Signed(
            TokenKeys::new(vec![b"attacker-key-0123456789".to_vec()])
                .expect("long enough")
                .sign(&lock("db"), 7),
        );
        assert_eq!(
            verify(&k, &forged, &lock("db")),
            Err(ProofError::BadSignature)
        );
    }

    #[test]
    fn idempotency_keys_must_be_long_enough_to_be_secret() {
        assert!(IdempotencyKey::new("short".into()).is_err());
        assert!(IdempotencyKey::new("x".repeat(257)).is_err());
        assert!(IdempotencyKey::new("0123456789abcde\n".into()).is_err());
        let k = IdempotencyKey::new("0123456789abcdef".into()).expect("16 bytes");
        assert_eq!(k.digest(), KeyDigest::of(b"0123456789abcdef"));
        assert_eq!(format!("{k:?}"), "IdempotencyKey(..)");
    }
}
