//! Stage one of a fenced write: the fence scope a key is in.

use super::*;

impl Gate {
    /// The configured scopes in `bucket` (none in bucket-per-scope mode).
    pub fn scopes_in_bucket(&self, bucket: &str) -> Vec<Scope> {
        self.scopes
            .configured()
            .iter()
            .filter(|s| s.bucket == bucket)
            .cloned()
            .collect()
    }

    /// A scope in `bucket` fenced by `lock`, if there is one.
    pub fn scope_in_bucket(&self, bucket: &str, lock: &fencegate_core::LockName) -> Option<Scope> {
        self.scopes.in_bucket(bucket, lock)
    }

    /// The scope fencing `bucket/key`.
    pub fn scope(&self, op: &'static str, bucket: &str, key: &str) -> S3Result<Scope> {
        crate::events::note_target(bucket, key);
        self.scopes
            .resolve(bucket, key)
            .map_err(|u| self.refuse_unscoped(op, &u))
    }
}
