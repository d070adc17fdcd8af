//! Stage two: the token a request carries for its scope, as a
//! [`VerifiedToken`] or a refusal (a plain number the proxy cannot vouch
//! for is checked with the lease service). Its output, [`Tokened`], is
//! what admission ([`super::admission`]) takes.

use super::refusal::{Refusal, Refuser};
use super::scope::Scoped;
use crate::errors;
use crate::fences::Fences;
use crate::issuer::{Answer, Issuer};
use crate::op::Op;
use crate::scope::Scope;
use crate::tokens::upload::UploadBinding;
use crate::tokens::{Presented, Rejection, TokenPolicy, Unvouched, VerifiedToken};
use fencegate_core::TokenKeys;
use http::HeaderMap;
use s3s::S3Result;

/// Where a request's token can come from: its headers, and the access key
/// it was signed with (lease-bound credentials).
#[derive(Debug, Clone, Copy)]
pub struct RequestToken<'a> {
    pub headers: &'a HeaderMap,
    pub access_key: Option<&'a str>,
}

impl<'a> RequestToken<'a> {
    pub fn of<T>(req: &'a s3s::S3Request<T>) -> RequestToken<'a> {
        RequestToken {
            headers: &req.headers,
            access_key: req.credentials.as_ref().map(|c| c.access_key.as_str()),
        }
    }
}

/// A scoped request with the token it goes on with: what stage two hands
/// on. The token is a [`VerifiedToken`], so a `Tokened` cannot carry an
/// unverified number.
#[derive(Debug, Clone)]
pub struct Tokened {
    scoped: Scoped,
    token: VerifiedToken,
}

impl Tokened {
    /// `scoped` going on with the token its open upload was created with;
    /// `None` unless the binding is of the same bucket, key and scope (a
    /// token bound in one scope never enters another).
    pub fn bound(scoped: Scoped, binding: &UploadBinding) -> Option<Tokened> {
        (scoped.bucket() == binding.bucket()
            && scoped.key() == binding.key()
            && scoped.scope().id == binding.scope())
        .then(|| Tokened {
            token: binding.token(),
            scoped,
        })
    }

    pub fn scoped(&self) -> &Scoped {
        &self.scoped
    }
    pub fn scope(&self) -> &Scope {
        self.scoped.scope()
    }
    pub fn token(&self) -> VerifiedToken {
        self.token
    }
    pub fn op(&self) -> Op {
        self.scoped.op()
    }
    /// What it was scoped as, once its token has been admitted.
    pub(super) fn into_scoped(self) -> Scoped {
        self.scoped
    }
}

/// Stage two's state: how tokens are read and verified, who confirms a
/// plain number, and the fences (a token below its lock's max needs no
/// confirmation).
#[derive(Debug)]
pub struct TokenCheck {
    policy: TokenPolicy,
    /// Checks plain tokens with the lease service, when configured.
    issuer: Option<Issuer>,
    fences: Fences,
    refuser: Refuser,
}

impl TokenCheck {
    pub fn new(
        policy: TokenPolicy,
        issuer: Option<Issuer>,
        fences: Fences,
        refuser: Refuser,
    ) -> TokenCheck {
        TokenCheck {
            policy,
            issuer,
            fences,
            refuser,
        }
    }

    /// Whether `lock` follows an election (`[[elections]]`).
    pub fn follows_election(&self, lock: &fencegate_core::LockName) -> bool {
        self.issuer
            .as_ref()
            .is_some_and(|i| i.election_of(lock).is_some())
    }

    /// The signing keys of each lock that follows an election, for the
    /// credentials bound to it.
    pub fn election_keys(
        &self,
    ) -> std::collections::HashMap<fencegate_core::LockName, Option<TokenKeys>> {
        self.issuer
            .as_ref()
            .map(|i| i.elections().credential_keys())
            .unwrap_or_default()
    }

    /// The keys tokens and lease-bound credentials are verified with.
    pub fn keys(&self) -> Option<&TokenKeys> {
        self.policy.keys()
    }

    /// The token a request carries for its scope, or why it is refused. A
    /// plain token the proxy cannot vouch for is refused, unless the lease
    /// service (`locksvc_url`) confirms it issued it; below the scope's max
    /// it needs no confirmation, since admission answers it stale anyway.
    /// A lock that follows an election takes only a plain token, which the
    /// election must show as its holder's.
    pub async fn token(
        &self,
        scoped: &Scoped,
        req: RequestToken<'_>,
    ) -> S3Result<Option<VerifiedToken>> {
        let (op, scope) = (scoped.op(), scoped.scope());
        let refuse = |why: Rejection| {
            let presented = presented_number(&req);
            self.refuser.refuse(
                op,
                scope,
                Refusal::Token {
                    presented,
                    why: &why,
                },
            )
        };
        let election = self
            .issuer
            .as_ref()
            .and_then(|i| i.election_of(&scope.lock));
        let unvouched = match election {
            // A lock that follows an election: only the election vouches.
            Some(election) => {
                let presented = self
                    .policy
                    .elected(
                        (req.headers, req.access_key),
                        &scope.lock,
                        (&election.seat().to_string(), election.keys()),
                    )
                    .map_err(refuse)?;
                match presented {
                    None => return Ok(None),
                    Some(u) => u,
                }
            }
            None => {
                let presented = self
                    .policy
                    .in_request(req.headers, req.access_key, &scope.lock)
                    .map_err(refuse)?;
                match presented {
                    None => return Ok(None),
                    Some(Presented::Vouched(token)) => {
                        crate::events::note_verified();
                        return Ok(Some(token));
                    }
                    Some(Presented::Unvouched(u)) => u,
                }
            }
        };
        let Some(issuer) = self.issuer.as_ref().filter(|i| i.checks(&scope.lock)) else {
            return Err(refuse(Rejection::Unsigned));
        };
        if let Some(below) = unvouched.below(self.fences.max(scope.fence())) {
            return Ok(Some(below));
        }
        let token = unvouched.number();
        let asked = match election {
            Some(election) => election.seat().to_string(),
            None => "the lease service".to_owned(),
        };
        // Boxed: a call to another service, rare, and large (see `Call`).
        match Box::pin(issuer.check(&scope.lock, token)).await {
            Ok(Answer::Issued(proof)) => {
                let Some(verified) = unvouched.issued(proof) else {
                    return Err(errors::retry(format!(
                        "{asked} confirmed another token than {token}; retry"
                    )));
                };
                crate::events::note_verified();
                Ok(Some(verified))
            }
            // The lock's current token stays out of the answer: a client
            // that cannot present it should not learn it here.
            Ok(Answer::NotIssued) => Err(refuse(Rejection::NotIssued {
                token,
                lock: scope.lock.to_string(),
            })),
            Ok(Answer::NotElected(why)) => Err(refuse(Rejection::NotElected(why))),
            Err(e) if election.is_some() => Err(errors::retry(format!(
                "cannot check token {token} with {asked} ({e}); nothing is admitted until it answers; retry"
            ))),
            Err(e) => Err(errors::retry(format!(
                "cannot check plain token {token} with the lease service ({e}); retry, or send the signed fencing_token"
            ))),
        }
    }

    /// For a lock that follows an election, refuses a token an open
    /// upload was bound to unless the election still shows it (or it is
    /// below the max, which admission refuses as stale): a leader deposed
    /// while its upload was open sends no more parts and completes nothing,
    /// whether or not it repeats the token.
    pub async fn still_elected(&self, scoped: &Scoped, token: VerifiedToken) -> S3Result<()> {
        let (op, scope) = (scoped.op(), scoped.scope());
        let Some(issuer) = self.issuer.as_ref() else {
            return Ok(());
        };
        let Some(seat) = issuer.election_of(&scope.lock).map(|e| e.seat()) else {
            return Ok(());
        };
        let number = token.number();
        if fencegate_core::fence::is_stale(self.fences.max(scope.fence()), number) {
            return Ok(());
        }
        match Box::pin(issuer.check(&scope.lock, number)).await {
            Ok(Answer::Issued(_)) => Ok(()),
            Ok(Answer::NotElected(why)) => Err(self.refuser.refuse(
                op,
                scope,
                Refusal::Token {
                    presented: Some(number),
                    why: &Rejection::NotElected(why),
                },
            )),
            Ok(Answer::NotIssued) => Err(errors::retry(format!(
                "{seat} gave no answer about token {number}; retry"
            ))),
            Err(e) => Err(errors::retry(format!(
                "cannot check token {number} with {seat} ({e}); nothing is admitted until it answers; retry"
            ))),
        }
    }

    /// `number` for `scoped`'s lock, if its election shows it as the
    /// current term's now (read then and there, as for a write) and it is
    /// not below the max: what the proxy's own watch of the election
    /// raises the fence with. `None`: nothing to raise.
    pub async fn elected_now(
        &self,
        scoped: Scoped,
        number: u64,
    ) -> Result<Option<Tokened>, String> {
        let Some(issuer) = self.issuer.as_ref() else {
            return Ok(None);
        };
        let lock = scoped.scope().lock.clone();
        if issuer.election_of(&lock).is_none()
            || fencegate_core::fence::is_stale(self.fences.max(scoped.scope().fence()), number)
        {
            return Ok(None);
        }
        match Box::pin(issuer.check(&lock, number)).await? {
            Answer::Issued(proof) => Ok(Unvouched::claimed(number)
                .issued(proof)
                .map(|token| Tokened { scoped, token })),
            Answer::NotIssued | Answer::NotElected(_) => Ok(None),
        }
    }

    /// The elections of the locks that follow one.
    pub fn elections(&self) -> Option<&crate::election::Elections> {
        self.issuer.as_ref().map(Issuer::elections)
    }

    /// Refuses the token if it is below its scope's max (a check before
    /// any key of a many-key request is touched; each key is then admitted
    /// on its own).
    pub fn refuse_if_stale(&self, tokened: &Tokened) -> S3Result<()> {
        let (token, scope) = (tokened.token().number(), tokened.scope());
        let max = self.fences.max(scope.fence());
        if fencegate_core::fence::is_stale(max, token) {
            return Err(self.refuser.refuse(
                tokened.op(),
                scope,
                Refusal::below_max(token, max, scope),
            ));
        }
        Ok(())
    }

    /// Like [`TokenCheck::token`], but a missing token is an error (428):
    /// a write goes on only with one.
    pub async fn required(&self, scoped: Scoped, req: RequestToken<'_>) -> S3Result<Tokened> {
        match self.token(&scoped, req).await? {
            Some(token) => Ok(Tokened { scoped, token }),
            None => {
                let scope = scoped.scope();
                Err(self
                    .refuser
                    .refuse(scoped.op(), scope, Refusal::Missing { scope }))
            }
        }
    }
}

/// The token number a request presents, if it can be read (for fence
/// events of refused tokens): its header's, or its lease-bound access key's.
fn presented_number(req: &RequestToken<'_>) -> Option<u64> {
    req.headers
        .get(crate::tokens::FENCING_TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| fencegate_core::FencingToken::parse(v).ok())
        .map(|t| t.number())
        .or_else(|| {
            req.access_key
                .and_then(|k| fencegate_core::credentials::parse_access_key(k).ok())
                .map(|k| k.token)
        })
}
