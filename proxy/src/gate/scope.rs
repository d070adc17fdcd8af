//! Stage one of a fenced write: the fence scope a key is in. Its output,
//! [`Scoped`], is what stage two ([`super::token`]) takes.

use super::refusal::{Refusal, Refuser};
use crate::op::Op;
use crate::scope::{Scope, ScopeMap};
use s3s::S3Result;

/// A request's target and the scope that fences it: what stage one hands
/// on. Made only here, by resolving a key (or a bucket) against the
/// configured scopes.
#[derive(Debug, Clone)]
pub struct Scoped {
    op: Op,
    bucket: String,
    /// Empty for a check of a whole bucket (DeleteObjects before its body
    /// is read).
    key: String,
    scope: Scope,
}

impl Scoped {
    /// The S3 operation name (metrics, events, errors).
    pub fn op(&self) -> Op {
        self.op
    }
    pub fn bucket(&self) -> &str {
        &self.bucket
    }
    pub fn key(&self) -> &str {
        &self.key
    }
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The bucket, the key and the scope, for the stage that takes them
    /// over.
    pub(super) fn into_parts(self) -> (String, String, Scope) {
        (self.bucket, self.key, self.scope)
    }

    /// `scope`, for `op` on the whole of its bucket.
    fn bucket_of(op: Op, scope: Scope) -> Scoped {
        Scoped {
            op,
            bucket: scope.bucket.clone(),
            key: String::new(),
            scope,
        }
    }
}

/// Stage one's state: the configured scopes, and the refuser of a key in
/// none.
#[derive(Debug)]
pub struct Scoping {
    scopes: ScopeMap,
    refuser: Refuser,
}

impl Scoping {
    pub fn new(scopes: ScopeMap, refuser: Refuser) -> Scoping {
        Scoping { scopes, refuser }
    }

    /// The scopes the configuration names.
    pub fn configured(&self) -> &[Scope] {
        self.scopes.configured()
    }

    /// The configured scopes `lock` fences.
    pub fn of_lock(&self, lock: &fencegate_core::LockName) -> &[Scope] {
        self.scopes.of_lock(lock)
    }

    /// The configured scopes in `bucket`, for `op` on the bucket (none in
    /// bucket-per-scope mode), each made when it is reached.
    pub fn scopes_in_bucket<'a>(
        &'a self,
        op: Op,
        bucket: &'a str,
    ) -> impl Iterator<Item = Scoped> + 'a {
        self.scopes
            .configured()
            .iter()
            .filter(move |s| s.bucket == bucket)
            .map(move |s| Scoped::bucket_of(op, s.clone()))
    }

    /// The scope in `bucket` fenced by `lock`, if there is one.
    pub fn scope_in_bucket(
        &self,
        op: Op,
        bucket: &str,
        lock: &fencegate_core::LockName,
    ) -> Option<Scoped> {
        self.scopes
            .in_bucket(bucket, lock)
            .map(|s| Scoped::bucket_of(op, s))
    }

    /// The scope fencing `lock`'s writes, for `op` on its bucket (the
    /// acquisition fence names a lock, not a key).
    pub fn scope_of_lock(&self, op: Op, lock: &fencegate_core::LockName) -> Option<Scoped> {
        self.scopes.for_lock(lock).map(|s| Scoped::bucket_of(op, s))
    }

    /// The scope fencing `bucket/key`, or the refusal of a key in none.
    pub fn scope(&self, op: Op, bucket: &str, key: &str) -> S3Result<Scoped> {
        crate::events::note_target(bucket, key);
        match self.scopes.resolve(bucket, key) {
            Ok(scope) => Ok(Scoped {
                op,
                bucket: bucket.to_owned(),
                key: key.to_owned(),
                scope,
            }),
            Err(u) => Err(self.refuser.refused(op, None, Refusal::Unscoped(&u))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::upload::{UploadBinding, UploadRecord};

    #[test]
    fn an_upload_token_goes_on_only_in_its_own_bucket_key_and_scope() {
        let scope = |id: &str| {
            Scope::new(crate::scope::ScopeDef {
                id: id.into(),
                bucket: "b".into(),
                prefix: String::new(),
                lock: fencegate_core::LockName::new("l").expect("lock"),
            })
        };
        let scoped = |key: &str, id: &str| Scoped {
            op: Op::UploadPart,
            bucket: "b".into(),
            key: key.into(),
            scope: scope(id),
        };
        let binding = UploadBinding::for_tests(UploadRecord {
            upload_id: "u".into(),
            bucket: "b".into(),
            key: "k".into(),
            scope: "b".into(),
            token: 7,
            owner: "key:c".into(),
        });
        let t = super::super::token::Tokened::bound(scoped("k", "b"), &binding).expect("same");
        assert_eq!(t.token().number(), 7);
        assert!(super::super::token::Tokened::bound(scoped("other", "b"), &binding).is_none());
        assert!(super::super::token::Tokened::bound(scoped("k", "b/p"), &binding).is_none());
    }
}
