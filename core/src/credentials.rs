//! Lease-bound S3 credentials: a fencing token carried in an access key.
//!
//! Tools that cannot add a header (restic, the aws CLI) can still carry a
//! token: in the S3 credentials they sign with. The lease service derives a
//! key pair from the lease; the proxy re-derives the secret from the access
//! key alone, so no database is shared:
//!
//! - access key: `fgk2.<key id>.<token>.<expires-unix-seconds>.<lock>`
//! - secret: base64url(HMAC-SHA256(key, `"fgk2-secret:" + access key`))
//!
//! The key id ([`TokenKeys::key_id`]) names the signing key that derived
//! the secret, so a proxy holding several keys (during a rotation) derives
//! the secret with exactly that one: one HMAC per request, whatever the
//! number of keys, and no guessing. A proxy without that key refuses the
//! access key and says which key id it lacks.
//!
//! The secret cannot be computed without the key, so the key id, token, lock
//! and expiry inside the access key cannot be changed: a tampered access key
//! signs with a secret the proxy does not derive, and SigV4 fails. The proxy
//! then treats the request exactly as if it carried `Fencing-Token: <token>`
//! for `<lock>`: a newer token admitted in the scope makes the credentials
//! useless for writing, and they are refused outright after their expiry.
//!
//! Access keys of the first format, `fgk1.<token>.<expiry>.<lock>` with the
//! secret HMAC(key, `"fgk1-secret:" + access key`), name no key: they were
//! always derived with the first key, so a proxy still accepts them with its
//! first key only, until they expire. New credentials are never `fgk1`.

use crate::name::LockName;
use crate::token::TokenKeys;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// Prefix of lease-bound access keys.
pub const ACCESS_KEY_PREFIX: &str = "fgk2.";
/// Prefix of the first format, still accepted (see the module docs).
pub const LEGACY_ACCESS_KEY_PREFIX: &str = "fgk1.";

/// Whether `access_key` is in the namespace of lease-bound keys, `fgk<n>.`
/// for any version `n`: such a key is never looked up among configured
/// client keys, and no client key may start so.
pub fn is_lease_access_key(access_key: &str) -> bool {
    access_key.strip_prefix("fgk").is_some_and(|rest| {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        digits > 0 && rest.as_bytes().get(digits) == Some(&b'.')
    })
}

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
    /// The id of the key that derived the secret; `None` for the first
    /// format (`fgk1`), whose secret the first key derived.
    pub key_id: Option<String>,
}

/// Why a lease-bound access key is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    #[error("access key is not a fencegate lease key (fgk2.<key id>.<token>.<expiry>.<lock>)")]
    Shape,
    #[error("lease credentials expired at unix time {0}; take a new lease")]
    Expired(u64),
    #[error(
        "lease credentials were derived with signing key {0}, which is not among this proxy's signing_keys: add the lease service's keys, or take a new lease"
    )]
    UnknownKey(String),
}

/// Length of a key id: 12 lowercase hex digits.
const KEY_ID_LEN: usize = 12;

/// Parses a lease-bound access key (without checking anything).
pub fn parse_access_key(access_key: &str) -> Result<BoundKey, CredentialError> {
    let (key_id, rest) = if let Some(rest) = access_key.strip_prefix(ACCESS_KEY_PREFIX) {
        let (id, rest) = rest.split_once('.').ok_or(CredentialError::Shape)?;
        let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
        if id.len() != KEY_ID_LEN || !id.bytes().all(hex) {
            return Err(CredentialError::Shape);
        }
        (Some(id.to_owned()), rest)
    } else if let Some(rest) = access_key.strip_prefix(LEGACY_ACCESS_KEY_PREFIX) {
        (None, rest)
    } else {
        return Err(CredentialError::Shape);
    };
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
        key_id,
    })
}

impl TokenKeys {
    /// The secret of `access_key` under key `index`; `legacy` for `fgk1`.
    fn derive_secret(&self, index: usize, access_key: &str, legacy: bool) -> String {
        let label = if legacy {
            "fgk1-secret:"
        } else {
            "fgk2-secret:"
        };
        URL_SAFE_NO_PAD.encode(self.mac_bytes(index, format!("{label}{access_key}").as_bytes()))
    }

    /// Credentials for `lock` at `token`, valid until `expires_at_secs`,
    /// derived with the signing (first) key.
    pub fn credentials(
        &self,
        lock: &LockName,
        token: u64,
        expires_at_secs: u64,
    ) -> LeaseCredentials {
        let access_key = format!(
            "{ACCESS_KEY_PREFIX}{}.{token}.{expires_at_secs}.{lock}",
            self.key_id()
        );
        LeaseCredentials {
            secret_key: self.derive_secret(0, &access_key, false),
            access_key,
        }
    }

    /// The secret the holder of `access_key` must sign with, if the key is a
    /// well-formed, unexpired lease key at `now_secs` derived with one of
    /// these keys (any of them: the one its key id names). Whether the
    /// client really knows the secret is what the signature check then
    /// decides.
    pub fn secret_for(
        &self,
        access_key: &str,
        now_secs: u64,
    ) -> Result<(BoundKey, String), CredentialError> {
        let bound = parse_access_key(access_key)?;
        if now_secs >= bound.expires_at_secs {
            return Err(CredentialError::Expired(bound.expires_at_secs));
        }
        let secret = match &bound.key_id {
            Some(id) => {
                let index = self
                    .index_of(id)
                    .ok_or_else(|| CredentialError::UnknownKey(id.clone()))?;
                self.derive_secret(index, access_key, false)
            }
            None => self.derive_secret(0, access_key, true),
        };
        Ok((bound, secret))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> TokenKeys {
        TokenKeys::new(vec![b"0123456789abcdef-key".to_vec()]).expect("valid")
    }

    fn lock(s: &str) -> LockName {
        LockName::new(s).expect("valid")
    }

    #[test]
    fn round_trip() {
        let c = keys().credentials(&lock("my.bucket"), 42, 2_000);
        let id = keys().key_id().to_owned();
        assert_eq!(id.len(), 12);
        assert_eq!(c.access_key, format!("fgk2.{id}.42.2000.my.bucket"));
        let (bound, secret) = keys().secret_for(&c.access_key, 1_999).expect("valid");
        assert_eq!(
            (bound.lock, bound.token, bound.key_id, secret),
            (lock("my.bucket"), 42, Some(id), c.secret_key)
        );
    }

    #[test]
    fn tampering_changes_the_secret_and_expiry_is_enforced() {
        let c = keys().credentials(&lock("b"), 42, 2_000);
        let id = keys().key_id().to_owned();
        let (_, other) = keys()
            .secret_for(&format!("fgk2.{id}.43.2000.b"), 0)
            .expect("well formed");
        assert_ne!(other, c.secret_key, "another token needs another secret");
        let (_, other) = keys()
            .secret_for(&format!("fgk2.{id}.42.2000.c"), 0)
            .expect("well formed");
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
            "fgk2.1.1.b",
            "fgk2.0123456789AB.1.1.b",
            "fgk2.0123456789a.1.1.b",
            "fgk2.0123456789abc.1.1.b",
            "fgk2.0123456789ab.1.1",
            "fgk3.0123456789ab.1.1.b",
        ] {
            assert_eq!(parse_access_key(bad), Err(CredentialError::Shape), "{bad}");
        }
    }

    /// The README's rotation: every list that has the key that derived a
    /// credential verifies it, in any position, with that key only.
    #[test]
    fn credentials_verify_with_whichever_configured_key_derived_them() {
        let old = b"old-key-0123456789".to_vec();
        let new = b"new-key-0123456789".to_vec();
        let list = |ks: &[&Vec<u8>]| TokenKeys::new(ks.iter().map(|k| k.to_vec()).collect());
        let before = list(&[&old]).expect("valid");
        let added = list(&[&old, &new]).expect("valid");
        let switched = list(&[&new, &old]).expect("valid");
        let after = list(&[&new]).expect("valid");
        assert_ne!(before.key_id(), after.key_id());
        for (issuer, verifiers) in [
            (&before, [&before, &added, &switched]),
            (&switched, [&added, &switched, &after]),
        ] {
            let c = issuer.credentials(&lock("b"), 7, 2_000);
            for v in verifiers {
                let (_, secret) = v.secret_for(&c.access_key, 0).expect("known key");
                assert_eq!(secret, c.secret_key, "{v:?} verifies {}", c.access_key);
            }
        }
        let c = before.credentials(&lock("b"), 7, 2_000);
        assert_eq!(
            after.secret_for(&c.access_key, 0),
            Err(CredentialError::UnknownKey(before.key_id().to_owned())),
            "a removed key's credentials are refused, naming the key"
        );
    }

    /// `fgk1` keys (issued before key ids) still verify, with the first key.
    #[test]
    fn legacy_access_keys_use_the_first_key() {
        let access_key = "fgk1.42.2000.b";
        let (bound, secret) = keys().secret_for(access_key, 0).expect("legacy key");
        assert_eq!((bound.token, bound.key_id), (42, None));
        let expected = URL_SAFE_NO_PAD
            .encode(keys().mac_bytes(0, format!("fgk1-secret:{access_key}").as_bytes()));
        assert_eq!(secret, expected);
    }

    #[test]
    fn the_lease_key_namespace() {
        for yes in ["fgk1.", "fgk2.x", "fgk10.a"] {
            assert!(is_lease_access_key(yes), "{yes}");
        }
        for no in ["fgk.", "fgk1", "fgkx.", "AKIA", "xfgk1."] {
            assert!(!is_lease_access_key(no), "{no}");
        }
    }
}
