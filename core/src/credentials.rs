//! Lease-bound S3 credentials: a fencing token carried in an access key.
//!
//! Tools that cannot add a header (restic, the aws CLI) can still carry a
//! token: in the S3 credentials they sign with. The lease service derives a
//! key pair from the lease; the proxy re-derives the secret from the access
//! key alone, so no database is shared:
//!
//! - access key: `fgk1.<token>.<expires-unix-seconds>.<lock>`
//! - secret: base64url(HMAC-SHA256(key, `"fgk1-secret:" + access key`))
//!
//! The secret cannot be computed without the key, so the token, lock and
//! expiry inside the access key cannot be changed: a tampered access key
//! signs with a secret the proxy does not derive, and SigV4 fails. The proxy
//! then treats the request exactly as if it carried `Fencing-Token: <token>`
//! for `<lock>`: a newer token admitted in the scope makes the credentials
//! useless for writing, and they are refused outright after their expiry.

use crate::name::LockName;
use crate::token::TokenKeys;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// Prefix of lease-bound access keys.
pub const ACCESS_KEY_PREFIX: &str = "fgk1.";

/// An S3 key pair bound to a lease.
#[derive(Clone, PartialEq, Eq)]
pub struct LeaseCredentials {
    pub access_key: String,
    pub secret_key: String,
}

impl std::fmt::Debug for LeaseCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseCredentials")
            .field("access_key", &self.access_key)
            .finish_non_exhaustive()
    }
}

/// What a lease-bound access key says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundKey {
    pub lock: LockName,
    pub token: u64,
    /// Unix seconds after which the credentials are refused.
    pub expires_at_secs: u64,
}

/// Why a lease-bound access key is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    #[error("access key is not a fencegate lease key (fgk1.<token>.<expiry>.<lock>)")]
    Shape,
    #[error("lease credentials expired at unix time {0}; take a new lease")]
    Expired(u64),
}

/// Parses a lease-bound access key (without checking anything).
pub fn parse_access_key(access_key: &str) -> Result<BoundKey, CredentialError> {
    let rest = access_key
        .strip_prefix(ACCESS_KEY_PREFIX)
        .ok_or(CredentialError::Shape)?;
    let mut parts = rest.splitn(3, '.');
    let (Some(token), Some(expiry), Some(lock)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(CredentialError::Shape);
    };
    let digits = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(token) || !digits(expiry) {
        return Err(CredentialError::Shape);
    }
    Ok(BoundKey {
        lock: LockName::new(lock).map_err(|_| CredentialError::Shape)?,
        token: token
            .parse()
            .ok()
            .filter(|t| (1..=crate::token::MAX_TOKEN).contains(t))
            .ok_or(CredentialError::Shape)?,
        expires_at_secs: expiry.parse().map_err(|_| CredentialError::Shape)?,
    })
}

impl TokenKeys {
    fn derive_secret(&self, access_key: &str) -> String {
        URL_SAFE_NO_PAD.encode(self.mac_bytes(format!("fgk1-secret:{access_key}").as_bytes()))
    }

    /// Credentials for `lock` at `token`, valid until `expires_at_secs`.
    pub fn credentials(
        &self,
        lock: &LockName,
        token: u64,
        expires_at_secs: u64,
    ) -> LeaseCredentials {
        let access_key = format!("{ACCESS_KEY_PREFIX}{token}.{expires_at_secs}.{lock}");
        LeaseCredentials {
            secret_key: self.derive_secret(&access_key),
            access_key,
        }
    }

    /// The secret the holder of `access_key` must sign with, if the key is a
    /// well-formed, unexpired lease key at `now_secs`. (Whether the client
    /// really knows the secret is what the signature check then decides.)
    pub fn secret_for(
        &self,
        access_key: &str,
        now_secs: u64,
    ) -> Result<(BoundKey, String), CredentialError> {
        let bound = parse_access_key(access_key)?;
        if now_secs >= bound.expires_at_secs {
            return Err(CredentialError::Expired(bound.expires_at_secs));
        }
        Ok((bound, self.derive_secret(access_key)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> TokenKeys {
        TokenKeys::new(vec![b"0123456789abcdef-key".to_vec()]).expect("valid")
    }

    #[test]
    fn round_trip() {
        let lock = LockName::new("my.bucket").expect("valid");
        let c = keys().credentials(&lock, 42, 2_000);
        assert_eq!(c.access_key, "fgk1.42.2000.my.bucket");
        let (bound, secret) = keys().secret_for(&c.access_key, 1_999).expect("valid");
        assert_eq!((bound.lock, bound.token, secret), (lock, 42, c.secret_key));
    }

    #[test]
    fn tampering_changes_the_secret_and_expiry_is_enforced() {
        let lock = LockName::new("b").expect("valid");
        let c = keys().credentials(&lock, 42, 2_000);
        let (_, other) = keys().secret_for("fgk1.43.2000.b", 0).expect("well formed");
        assert_ne!(other, c.secret_key, "another token needs another secret");
        let (_, other) = keys().secret_for("fgk1.42.2000.c", 0).expect("well formed");
        assert_ne!(other, c.secret_key, "another lock needs another secret");
        assert_eq!(
            keys().secret_for(&c.access_key, 2_000),
            Err(CredentialError::Expired(2_000))
        );
        for bad in [
            "AKIA123",
            "fgk1.x.1.b",
            "fgk1.1.1",
            "fgk1.1.1.a:b",
            "fgk1..1.b",
        ] {
            assert_eq!(parse_access_key(bad), Err(CredentialError::Shape), "{bad}");
        }
    }
}
