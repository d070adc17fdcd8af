//! Plain tokens checked with whoever issued them: the lease service, or
//! for a lock that follows an election (`[[elections]]`, see
//! [`crate::election`]), the election itself.
//!
//! A plain decimal token carries no signature, so the proxy cannot tell a
//! number the lease service issued from one a client made up. With
//! `locksvc_url` configured, it asks: a plain token `n` for lock `L` is
//! genuine if the lease service's current lease on `L` has token `n`. The
//! proxy asks only when `n` is at or above the scope's max (a lower token is
//! stale whoever issued it) and remembers the highest token confirmed per
//! lock, so a holder's steady stream of writes costs one question in all.
//!
//! Questions are a resource a client without the lease could take (a
//! flood of made-up numbers above the max, each a call to the lease
//! service), so there is at most one out per lock: whoever arrives while
//! it is out waits for it and reads the lock's current token from its
//! answer, the question's own or a later one. A flood costs the lease
//! service one call per lock at a time, and a holder's write waits for at
//! most the question out and its own.
//!
//! An election's answer is never remembered: each write at or above its
//! lock's max is checked against the election as it stands then, so a
//! leader that lost its key is refused at once, before its successor has
//! written anything. The lease service's "yes" is remembered (its tokens
//! are only ever superseded by higher ones, which the fence refuses).
//!
//! An `https://` lease service is reached with `locksvc_ca_file` (and a
//! client certificate if it requires one): the question names no secret,
//! but a forged "yes" would let a made-up number raise a scope's max.

use crate::election::{Election, Elections, Shows};
use fencegate_core::LockName;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// Locks whose last question is remembered; beyond, those with no question
/// out are forgotten.
const LOCKS_ASKED: usize = 4096;

/// Who the proxy asks about plain tokens: the lease service, and the
/// elections of the locks that follow one.
#[derive(Debug)]
pub struct Issuer {
    api: Option<fencegate_lease_api::Client>,
    elections: Elections,
    /// The highest token confirmed per lock.
    confirmed: Mutex<HashMap<String, u64>>,
    /// Per lock, the last question asked; its lock is held while one is
    /// out.
    asked: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Asked>>>>>,
}

/// A question about a lock and its answer: who holds it now.
#[derive(Debug, Clone)]
struct Asked {
    sent: Instant,
    current: Result<Shows, String>,
}

/// What the lease service said about a plain token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The token is (or was, when the proxy asked) the lock's current one.
    Issued(Issued),
    /// The lock's current token is another one (or none is held).
    NotIssued,
    /// The lock's election shows another holder, or none: why, naming the
    /// election and what it holds.
    NotElected(String),
}

/// The lease service's word that it issued a token: what makes a plain
/// number a [`crate::tokens::VerifiedToken`]. Only [`Issuer::check`] makes
/// one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Issued {
    token: u64,
}

impl Issued {
    /// The token the lease service issued.
    pub fn token(self) -> u64 {
        self.token
    }

    /// A confirmation for unit tests of its users.
    #[cfg(test)]
    pub fn for_tests(token: u64) -> Issued {
        Issued { token }
    }
}

impl Issuer {
    /// Asks the lease service `api` (its TLS and timeout are the
    /// client's), if given, and each lock's election in `elections`.
    pub fn new(api: Option<fencegate_lease_api::Client>, elections: Elections) -> Issuer {
        Issuer {
            api,
            elections,
            confirmed: Mutex::new(HashMap::new()),
            asked: Mutex::new(HashMap::new()),
        }
    }

    /// `lock`'s election, if the lock follows one.
    pub fn election_of(&self, lock: &LockName) -> Option<&Election> {
        self.elections.of(lock)
    }

    /// The elections of the locks that follow one.
    pub fn elections(&self) -> &Elections {
        &self.elections
    }

    /// Whether a plain token of `lock` can be checked here: the lock
    /// follows an election, or the lease service is configured.
    pub fn checks(&self, lock: &LockName) -> bool {
        self.api.is_some() || self.elections.of(lock).is_some()
    }

    /// Whether `token` is `lock`'s current token: issued by the lease
    /// service (asked unless already confirmed) or shown by the lock's
    /// election (always asked). An error means it could not be asked.
    pub async fn check(&self, lock: &LockName, token: u64) -> Result<Answer, String> {
        let election = self.elections.of(lock);
        let lock = lock.as_str();
        if election.is_none() && self.already_confirmed(lock, token) {
            return Ok(Answer::Issued(Issued { token }));
        }
        let arrived = Instant::now();
        let slot = self.slot(lock);
        let mut last = slot.lock().await;
        let current = match &*last {
            // Asked after this check began: its answer is as fresh as one
            // of our own.
            Some(a) if a.sent >= arrived => a.current.clone(),
            _ => {
                let sent = Instant::now();
                let current = match election {
                    Some(e) => e.shows().await,
                    None => self.ask(lock).await,
                };
                *last = Some(Asked {
                    sent,
                    current: current.clone(),
                });
                current
            }
        };
        drop(last);
        // The caller names who could not be asked.
        let shows = current?;
        match (&shows, election) {
            (Shows::Held { revision, .. }, _) if *revision == token => {}
            (_, None) => return Ok(Answer::NotIssued),
            (Shows::Vacant, Some(e)) => {
                return Ok(Answer::NotElected(format!(
                    "{} has no holder: nobody leads lock {lock} now, so no token {token} is admitted",
                    e.seat()
                )));
            }
            (
                Shows::Held {
                    key,
                    holder,
                    revision,
                },
                Some(e),
            ) => {
                return Ok(Answer::NotElected(format!(
                    "token {token} is not the holder's: {} shows {holder:?} holding lock {lock} with the key {key}, in the term that began at revision {revision}",
                    e.seat()
                )));
            }
        }
        if election.is_some() {
            return Ok(Answer::Issued(Issued { token }));
        }
        let mut confirmed = self.confirmed.lock();
        let best = confirmed.entry(lock.to_owned()).or_insert(token);
        *best = (*best).max(token);
        Ok(Answer::Issued(Issued { token }))
    }

    /// The question slot of `lock`.
    fn slot(&self, lock: &str) -> Arc<tokio::sync::Mutex<Option<Asked>>> {
        let mut asked = self.asked.lock();
        if asked.len() >= LOCKS_ASKED && !asked.contains_key(lock) {
            asked.retain(|_, s| Arc::strong_count(s) > 1);
        }
        asked.entry(lock.to_owned()).or_default().clone()
    }

    /// Who holds `lock` now, from the lease service.
    async fn ask(&self, lock: &str) -> Result<Shows, String> {
        let Some(api) = &self.api else {
            return Err("no lease service is configured (locksvc_url)".into());
        };
        let body = api.status(lock, None).await.map_err(|e| match e {
            fencegate_lease_api::ClientError::Refused { status, error } => format!(
                "the lease service at {} answered {status} {}: {}",
                api.base(),
                error.code.as_str(),
                error.message
            ),
            other => other.to_string(),
        })?;
        Ok(match body.token {
            Some(revision) => Shows::Held {
                key: String::new(),
                holder: body.owner.unwrap_or_default(),
                revision,
            },
            None => Shows::Vacant,
        })
    }

    /// Whether `token` is the last token confirmed for `lock`. (Tokens are
    /// global, so a lower number than the confirmed one may belong to
    /// another lock; only the exact number counts.)
    fn already_confirmed(&self, lock: &str, token: u64) -> bool {
        self.confirmed.lock().get(lock) == Some(&token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// A lease service that answers every status question after 50 ms
    /// with token 7 held, counting the questions.
    async fn slow_lease_service() -> (String, Arc<AtomicUsize>) {
        let (addr, asked) = fencegate_testkit::tcp::counting_server(|mut c, count| {
            async move {
                let mut buf = vec![0u8; 4096];
                let mut head = Vec::new();
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                count.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                let body = r#"{"lock":"db","held":true,"owner":"a","token":7,"expires_at_ms":1,"waiting":0,"last_token":7}"#;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = c.write_all(answer.as_bytes()).await;
            }
        })
        .await;
        (format!("http://{addr}"), asked)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flood_of_made_up_numbers_asks_one_question_at_a_time() {
        let (url, asked) = slow_lease_service().await;
        let issuer = Arc::new(Issuer::new(
            Some(fencegate_lease_api::Client::new(
                reqwest::Client::new(),
                &url,
                None,
            )),
            Elections::default(),
        ));
        let db = LockName::new("db").expect("lock");
        let flood: Vec<_> = (0..200u64)
            .map(|n| {
                let issuer = issuer.clone();
                let db = db.clone();
                tokio::spawn(async move { issuer.check(&db, 1000 + n).await })
            })
            .collect();
        for f in flood {
            assert_eq!(f.await.expect("joined"), Ok(Answer::NotIssued));
        }
        // 200 checks at once share a few questions: one out, then one for
        // everyone who arrived while it was.
        let questions = asked.load(Ordering::SeqCst);
        assert!(questions <= 3, "{questions} questions for one lock");
        // The holder's own number is still confirmed, with a question of
        // its own.
        assert_eq!(
            issuer.check(&db, 7).await,
            Ok(Answer::Issued(Issued { token: 7 }))
        );
    }
}
