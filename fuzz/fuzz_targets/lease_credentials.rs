//! Lease-bound S3 credentials: `parse_access_key` and `secret_for` never
//! panic and agree with each other; `credentials()` round-trips; an edited
//! access key never derives the original secret.
#![no_main]

use arbitrary::Arbitrary;
use fencegate_core::TokenKeys;
use fencegate_core::credentials::{CredentialError, parse_access_key};
use fencegate_fuzz::{Edit, apply_edits, lock_from};
use libfuzzer_sys::fuzz_target;
use std::sync::LazyLock;

static KEYS: LazyLock<TokenKeys> = LazyLock::new(fencegate_fuzz::signer);
static OTHER: LazyLock<TokenKeys> = LazyLock::new(fencegate_fuzz::other);

#[derive(Debug, Arbitrary)]
enum Input {
    Raw {
        access_key: String,
        now: u64,
    },
    RoundTrip {
        lock: String,
        token: u64,
        expires: u64,
        now: u64,
    },
    Edited {
        lock: String,
        token: u64,
        expires: u64,
        edits: Vec<Edit>,
    },
}

fuzz_target!(|input: Input| {
    match input {
        Input::Raw { access_key, now } => raw(&access_key, now),
        Input::RoundTrip {
            lock,
            token,
            expires,
            now,
        } => {
            let lock = lock_from(&lock);
            let c = KEYS.credentials(&lock, token, expires);
            let bound = parse_access_key(&c.access_key).expect("credentials() keys parse");
            assert_eq!(
                (&bound.lock, bound.token, bound.expires_at_secs),
                (&lock, token, expires)
            );
            match KEYS.secret_for(&c.access_key, now) {
                Ok((b, secret)) => {
                    assert!(now < expires);
                    assert_eq!(b, bound);
                    assert_eq!(secret, c.secret_key);
                }
                Err(e) => {
                    assert!(now >= expires);
                    assert_eq!(e, CredentialError::Expired(expires));
                }
            }
            if let Ok((_, secret)) = OTHER.secret_for(&c.access_key, 0) {
                assert_ne!(secret, c.secret_key, "another key derived the same secret");
            }
            raw(&c.access_key, now);
        }
        Input::Edited {
            lock,
            token,
            expires,
            edits,
        } => {
            let lock = lock_from(&lock);
            let c = KEYS.credentials(&lock, token, expires);
            let edited = apply_edits(&c.access_key, &edits);
            if edited == c.access_key {
                return;
            }
            raw(&edited, 0);
            if let Ok((_, secret)) = KEYS.secret_for(&edited, 0) {
                assert_ne!(
                    secret, c.secret_key,
                    "{edited:?} derives the secret of {:?}",
                    c.access_key
                );
            }
        }
    }
});

/// `parse_access_key` and `secret_for` agree on any string.
fn raw(access_key: &str, now: u64) {
    let parsed = parse_access_key(access_key);
    match KEYS.secret_for(access_key, now) {
        Ok((bound, secret)) => {
            assert!(now < bound.expires_at_secs);
            assert!(!secret.is_empty());
            assert_eq!(Ok(bound.clone()), parsed);
            // A key in canonical form is exactly what credentials() makes.
            let again = KEYS.credentials(&bound.lock, bound.token, bound.expires_at_secs);
            if again.access_key == access_key {
                assert_eq!(again.secret_key, secret);
            }
        }
        Err(CredentialError::Expired(at)) => {
            let p = parsed.expect("an expired key parsed");
            assert!(now >= p.expires_at_secs);
            assert_eq!(at, p.expires_at_secs);
        }
        Err(CredentialError::Shape) => assert_eq!(parsed, Err(CredentialError::Shape)),
        Err(CredentialError::UnknownKey(id)) => {
            let p = parsed.expect("a key naming an unknown key id parsed");
            assert_eq!(p.key_id.as_deref(), Some(id.as_str()));
            assert_ne!(id, KEYS.key_id());
        }
    }
}
