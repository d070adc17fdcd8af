//! Who may call the lease API, and on which locks.
//!
//! An API key names a caller; its lock patterns say which locks that caller
//! may acquire, renew, release and inspect (as etcd RBAC roles grant key
//! ranges and Consul ACL policies grant key prefixes). Without scopes, the
//! key of a job that backs up database A could take the lock of database B
//! and fence B's real writer out.
//!
//! Keys are compared in constant time: the presented key and every
//! configured key are hashed to 32 bytes first (so the comparison does not
//! stop early on a length difference), every configured key is compared,
//! and the match is selected without a branch.

use crate::config::ApiKey;
use fencegate_core::{KeyDigest, LockName, name::MAX_LOCK_NAME_LEN};
use std::sync::Arc;
use subtle::{ConditionallySelectable as _, ConstantTimeEq as _};

/// A lock-name pattern: lock-name characters (`A-Z a-z 0-9 . _ -`) and `*`,
/// which matches any run of characters, including none. `db-a` matches only
/// `db-a`; `backup-*` matches `backup-`, `backup-daily`, ...; `*` matches
/// every lock. Matching is case-sensitive, like lock names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockPattern(String);

/// Why a string is not a lock pattern.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("a lock pattern cannot be empty (\"*\" is every lock)")]
    Empty,
    #[error("a lock pattern is at most {MAX_LOCK_NAME_LEN} characters")]
    TooLong,
    #[error(
        "{found:?} cannot appear in a lock pattern: use lock-name characters (A-Z, a-z, 0-9, '.', '_', '-') and '*' for any run of them"
    )]
    BadChar { found: char },
}

impl LockPattern {
    pub fn parse(s: &str) -> Result<LockPattern, PatternError> {
        if s.is_empty() {
            return Err(PatternError::Empty);
        }
        if s.len() > MAX_LOCK_NAME_LEN {
            return Err(PatternError::TooLong);
        }
        if let Some(found) = s
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '*')))
        {
            return Err(PatternError::BadChar { found });
        }
        Ok(LockPattern(s.to_owned()))
    }

    /// Whether `lock` matches, `*` standing for any run of characters.
    pub fn matches(&self, lock: &LockName) -> bool {
        glob(self.0.as_bytes(), lock.as_str().as_bytes())
    }
}

/// Wildcard match with `*` only: the classic linear scan that, on a
/// mismatch, lets the last `*` absorb one more character. Patterns and names
/// are at most 128 bytes, so even the worst case is cheap.
fn glob(pattern: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    let mut last_star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pattern.get(p) {
            Some(b'*') => {
                last_star = Some((p, n));
                p += 1;
            }
            Some(&c) if c == name[n] => {
                p += 1;
                n += 1;
            }
            _ => match last_star {
                Some((sp, sn)) => {
                    p = sp + 1;
                    n = sn + 1;
                    last_star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// The locks one API key may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    patterns: Vec<LockPattern>,
}

impl Scope {
    pub fn allows(&self, lock: &LockName) -> bool {
        self.patterns.iter().any(|p| p.matches(lock))
    }
}

/// Who is calling, as the authentication step found: put in the request's
/// extensions for the handlers.
#[derive(Debug, Clone)]
pub enum Caller {
    /// No API keys are configured: anyone who reaches the port may use any
    /// lock (holding a lease still needs its proof).
    Open,
    /// A caller with a valid key, limited to its scope.
    Key(Arc<Scope>),
}

impl Caller {
    pub fn allows(&self, lock: &LockName) -> bool {
        match self {
            Caller::Open => true,
            Caller::Key(scope) => scope.allows(lock),
        }
    }
}

/// The configured API keys, as digests with their scopes.
#[derive(Debug, Clone, Default)]
pub struct Keyring {
    entries: Vec<(KeyDigest, Arc<Scope>)>,
}

impl Keyring {
    /// Builds the keyring; fails on a pattern that does not parse (a
    /// validated configuration has none).
    pub fn new(keys: &[ApiKey]) -> Result<Keyring, PatternError> {
        let entries = keys
            .iter()
            .map(|k| {
                let patterns = k
                    .locks
                    .iter()
                    .map(|p| LockPattern::parse(p))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok((
                    KeyDigest::of(k.key.as_bytes()),
                    Arc::new(Scope { patterns }),
                ))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Keyring { entries })
    }

    /// True when no keys are configured (no authentication).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The caller `presented` identifies, if it is a configured key. Every
    /// entry is compared, whatever matches, in constant time.
    pub fn identify(&self, presented: &str) -> Option<Caller> {
        if self.entries.is_empty() {
            return Some(Caller::Open);
        }
        let presented = KeyDigest::of(presented.as_bytes());
        let mut found = u32::MAX;
        for (i, (digest, _)) in self.entries.iter().enumerate() {
            let i = u32::try_from(i).unwrap_or(u32::MAX);
            let same = digest.as_bytes().ct_eq(presented.as_bytes());
            found = u32::conditional_select(&found, &i, same);
        }
        let index = usize::try_from(found).ok()?;
        self.entries
            .get(index)
            .map(|(_, scope)| Caller::Key(scope.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(s: &str) -> LockName {
        LockName::new(s).expect("valid")
    }
    fn pattern(s: &str) -> LockPattern {
        LockPattern::parse(s).expect("valid pattern")
    }

    #[test]
    fn patterns_match_exactly_or_with_stars() {
        let cases = [
            ("db-a", "db-a", true),
            ("db-a", "db-a2", false),
            ("db-a", "xdb-a", false),
            ("db-a", "DB-A", false),
            ("backup-*", "backup-", true),
            ("backup-*", "backup-daily", true),
            ("backup-*", "backup", false),
            ("backup-*", "my-backup-daily", false),
            ("*", "anything.at_all-1", true),
            ("*-prod", "db-prod", true),
            ("*-prod", "db-prod-2", false),
            ("a*b*c", "aXXbYYc", true),
            ("a*b*c", "abcabc", true),
            ("a*b*c", "acb", false),
            ("**", "x", true),
            ("a*a*a*a*a*b", &"a".repeat(100), false),
        ];
        for (p, name, expected) in cases {
            assert_eq!(pattern(p).matches(&lock(name)), expected, "{p} vs {name}");
        }
    }

    #[test]
    fn bad_patterns_are_refused() {
        assert_eq!(LockPattern::parse(""), Err(PatternError::Empty));
        assert_eq!(
            LockPattern::parse(&"a".repeat(129)),
            Err(PatternError::TooLong)
        );
        for (bad, c) in [("db?", '?'), ("a:b", ':'), ("db a", ' '), ("[ab]", '[')] {
            assert_eq!(
                LockPattern::parse(bad),
                Err(PatternError::BadChar { found: c })
            );
        }
    }

    #[test]
    fn a_key_is_limited_to_its_scope() {
        let ring = Keyring::new(&[
            ApiKey::every_lock("admin-key-123"),
            ApiKey {
                key: "db-a-key-123".into(),
                locks: vec!["db-a".into(), "backup-*".into()],
            },
        ])
        .expect("valid");
        let admin = ring.identify("admin-key-123").expect("known");
        let scoped = ring.identify("db-a-key-123").expect("known");
        assert!(admin.allows(&lock("db-b")));
        assert!(scoped.allows(&lock("db-a")));
        assert!(scoped.allows(&lock("backup-x")));
        assert!(!scoped.allows(&lock("db-b")));
        assert!(ring.identify("db-a-key-12").is_none());
        assert!(ring.identify("").is_none());
        assert!(
            Keyring::default()
                .identify("whatever")
                .is_some_and(|c| c.allows(&lock("x")))
        );
    }
}
