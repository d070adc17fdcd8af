//! Lock names: what a lease is for, and what a fence scope is bound to.

use std::fmt;

/// Longest lock name accepted.
pub const MAX_LOCK_NAME_LEN: usize = 128;

/// A validated lock name: 1 to 128 characters of `A-Z a-z 0-9 . _ -`.
///
/// The charset excludes `:` (the signed-token separator), `/` and
/// whitespace, so a name can travel verbatim in an HTTP path, a header and a
/// signed token. Every S3 bucket name is a valid lock name, which is what lets
/// each bucket be fenced by the lock of the same name by default.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LockName(String);

/// Why a string is not a lock name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockNameError {
    #[error("lock name is empty")]
    Empty,
    #[error("lock name is {len} characters long; the limit is {MAX_LOCK_NAME_LEN}")]
    TooLong { len: usize },
    #[error("lock name contains {found:?}; allowed characters are A-Z, a-z, 0-9, '.', '_' and '-'")]
    BadChar { found: char },
}

impl LockName {
    /// Validates `s` as a lock name.
    pub fn new(s: &str) -> Result<LockName, LockNameError> {
        if s.is_empty() {
            return Err(LockNameError::Empty);
        }
        if s.len() > MAX_LOCK_NAME_LEN {
            return Err(LockNameError::TooLong { len: s.len() });
        }
        if let Some(found) = s
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(LockNameError::BadChar { found });
        }
        Ok(LockName(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for LockName {
    type Err = LockNameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        LockName::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_bucket_like_names() {
        for ok in ["a", "nightly", "my-bucket.backups", "A_b-9.x"] {
            assert_eq!(LockName::new(ok).map(|n| n.0), Ok(ok.to_owned()));
        }
    }

    #[test]
    fn rejects_empty_long_and_separators() {
        assert_eq!(LockName::new(""), Err(LockNameError::Empty));
        assert_eq!(
            LockName::new(&"x".repeat(129)),
            Err(LockNameError::TooLong { len: 129 })
        );
        assert_eq!(
            LockName::new("a:b"),
            Err(LockNameError::BadChar { found: ':' })
        );
        assert_eq!(
            LockName::new("a/b"),
            Err(LockNameError::BadChar { found: '/' })
        );
        assert_eq!(
            LockName::new("a b"),
            Err(LockNameError::BadChar { found: ' ' })
        );
    }
}
