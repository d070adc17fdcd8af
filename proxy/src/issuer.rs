//! Plain tokens checked with the lease service that issued them.
//!
//! A plain decimal token carries no signature, so the proxy cannot tell a
//! number the lease service issued from one a client made up. With
//! `locksvc_url` configured, it asks: a plain token `n` for lock `L` is
//! genuine if the lease service's current lease on `L` has token `n`. The
//! proxy asks only when `n` is at or above the scope's max (a lower token is
//! stale whoever issued it) and remembers the highest token confirmed per
//! lock, so a holder's steady stream of writes costs one question in all.
//!
//! An `https://` lease service is reached with `locksvc_ca_file` (and a
//! client certificate if it requires one): the question names no secret,
//! but a forged "yes" would let a made-up number raise a scope's max.

use std::collections::HashMap;
use std::sync::Mutex;

/// The lease service, as the proxy asks it about plain tokens.
#[derive(Debug)]
pub struct Issuer {
    api: fencegate_lease_api::Client,
    /// The highest token confirmed per lock.
    confirmed: Mutex<HashMap<String, u64>>,
}

/// What the lease service said about a plain token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// `n` is (or was, when the proxy asked) the lock's current token.
    Issued,
    /// The lock's current token is another one (or none is held).
    NotIssued,
}

impl Issuer {
    /// Asks the lease service `api` (its TLS and timeout are the
    /// client's).
    pub fn new(api: fencegate_lease_api::Client) -> Issuer {
        Issuer {
            api,
            confirmed: Mutex::new(HashMap::new()),
        }
    }

    /// Whether the lease service issued `token` for `lock` (asked unless
    /// already confirmed). An error means it could not be asked.
    pub async fn check(&self, lock: &str, token: u64) -> Result<Answer, String> {
        if self.already_confirmed(lock, token) {
            return Ok(Answer::Issued);
        }
        let body = self.api.status(lock, None).await.map_err(|e| match e {
            fencegate_lease_api::ClientError::Refused { status, error } => format!(
                "the lease service at {} answered {status} {}: {}",
                self.api.base(),
                error.code.as_str(),
                error.message
            ),
            other => other.to_string(),
        })?;
        if body.token != Some(token) {
            return Ok(Answer::NotIssued);
        }
        let mut confirmed = self.confirmed.lock().unwrap_or_else(|p| p.into_inner());
        let best = confirmed.entry(lock.to_owned()).or_insert(token);
        *best = (*best).max(token);
        Ok(Answer::Issued)
    }

    /// Whether `token` is the last token confirmed for `lock`. (Tokens are
    /// global, so a lower number than the confirmed one may belong to
    /// another lock; only the exact number counts.)
    fn already_confirmed(&self, lock: &str, token: u64) -> bool {
        self.confirmed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(lock)
            == Some(&token)
    }
}
