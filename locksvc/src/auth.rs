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
//!
//! The caller is also who waits in line: its [`Party`], whose share of a
//! lock's line is bounded (`fencegate_core::line::share`), is its API key,
//! or without keys the address it connects from (an owner name is not an
//! identity: anyone may send any).

use fencegate_core::line::Party;
use fencegate_core::{KeyDigest, LockName, name::MAX_LOCK_NAME_LEN};
use serde::{Deserialize, Deserializer};
use std::net::{IpAddr, SocketAddr};
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
    Key(Arc<KeyEntry>),
}

/// What a configured key grants: its locks, and the party it waits as.
#[derive(Debug)]
pub struct KeyEntry {
    scope: Scope,
    party: Party,
}

impl Caller {
    pub fn allows(&self, lock: &LockName) -> bool {
        match self {
            Caller::Open => true,
            Caller::Key(entry) => entry.scope.allows(lock),
        }
    }

    /// Who this caller is in a lock's line: its API key's party, or
    /// without keys its address `peer` ([`peer_party`]).
    pub fn party(&self, peer: Option<SocketAddr>) -> Party {
        match self {
            Caller::Key(entry) => entry.party.clone(),
            Caller::Open => peer_party(peer),
        }
    }
}

/// The party of a caller known only by its address: one per IPv4 address,
/// one per IPv6 /64 (what one host is usually given; a host can pick any
/// address in it), the port ignored (a client opens many connections).
/// Clients behind one reverse proxy or NAT are one party; give them API
/// keys to tell them apart.
pub fn peer_party(peer: Option<SocketAddr>) -> Party {
    match peer.map(|p| p.ip().to_canonical()) {
        Some(IpAddr::V4(v4)) => Party::new(format!("addr:{v4}")),
        Some(IpAddr::V6(v6)) => {
            let s = v6.segments();
            Party::new(format!(
                "addr:{:x}:{:x}:{:x}:{:x}::/64",
                s[0], s[1], s[2], s[3]
            ))
        }
        // Not served through `fencegate_net` (in-process tests): one party.
        None => Party::new("addr:unknown"),
    }
}

/// The party of an API key: a digest of the key keyed with a secret of the
/// service (the first signing key), so that the same key is the same party
/// on every replica, and a reader of etcd (where waiters' parties are
/// stored) learns nothing it could test guessed keys against.
fn key_party(secret: &[u8], key: &str) -> Party {
    let mut input = b"fencegate waiter party\0".to_vec();
    input.extend_from_slice(secret);
    input.push(0);
    input.extend_from_slice(key.as_bytes());
    let digest = KeyDigest::of(&input);
    Party::new(format!("key:{}", hex::encode(&digest.as_bytes()[..16])))
}

/// The configured API keys, as digests with their scopes.
#[derive(Debug, Clone, Default)]
pub struct Keyring {
    entries: Vec<(KeyDigest, Arc<KeyEntry>)>,
}

impl Keyring {
    /// Builds the keyring; `secret` keys the parties of the keys (see
    /// [`key_party`]). Fails on a pattern that does not parse (a validated
    /// configuration has none).
    pub fn new(keys: &[ApiKey], secret: &[u8]) -> Result<Keyring, PatternError> {
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
                    Arc::new(KeyEntry {
                        scope: Scope { patterns },
                        party: key_party(secret, &k.key),
                    }),
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
            .map(|(_, entry)| Caller::Key(entry.clone()))
    }
}

/// One entry of `api_keys`: a bearer key and the lock-name patterns it may
/// use.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey {
    /// The key clients send as `Authorization: Bearer <key>`.
    pub key: String,
    /// Lock-name patterns (see [`LockPattern`]); `["*"]` is every lock.
    pub locks: Vec<String>,
}

impl ApiKey {
    /// A key that may use every lock (the plain-string form).
    pub fn every_lock(key: impl Into<String>) -> ApiKey {
        ApiKey {
            key: key.into(),
            locks: vec!["*".to_owned()],
        }
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key itself.
        f.debug_struct("ApiKey")
            .field("locks", &self.locks)
            .finish_non_exhaustive()
    }
}

/// `"KEY"` or `{ key = "KEY", locks = [...] }`. Written by hand rather than
/// `#[serde(untagged)]` so a mistake in the table form (a typo, a missing
/// `locks`) is reported as such instead of "did not match any variant".
impl<'de> Deserialize<'de> for ApiKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ApiKey, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Scoped {
            key: String,
            locks: Vec<String>,
        }
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = ApiKey;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "an API key string (it may use every lock), or a table { key = \"...\", locks = [\"pattern\", ...] }",
                )
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<ApiKey, E> {
                Ok(ApiKey::every_lock(s))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<ApiKey, A::Error> {
                let Scoped { key, locks } =
                    Scoped::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(ApiKey { key, locks })
            }
        }
        d.deserialize_any(Visitor)
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
        let ring = Keyring::new(
            &[
                ApiKey::every_lock("admin-key-123"),
                ApiKey {
                    key: "db-a-key-123".into(),
                    locks: vec!["db-a".into(), "backup-*".into()],
                },
            ],
            b"secret",
        )
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

    #[test]
    fn a_party_is_the_key_or_else_the_address_without_its_port() {
        let keys = [
            ApiKey::every_lock("admin-key-123"),
            ApiKey::every_lock("other-key-123"),
        ];
        let ring = Keyring::new(&keys, b"secret").expect("valid");
        let peer = |s: &str| Some(s.parse::<SocketAddr>().expect("address"));
        let admin = ring.identify("admin-key-123").expect("known");
        let other = ring.identify("other-key-123").expect("known");
        // A key is one party wherever it connects from, on every replica
        // with the same secret, and never shows the key.
        assert_eq!(
            admin.party(peer("10.0.0.1:1")),
            admin.party(peer("10.0.0.2:2"))
        );
        assert_ne!(admin.party(None), other.party(None));
        let again = Keyring::new(&keys, b"secret").expect("valid");
        assert_eq!(
            again.identify("admin-key-123").expect("known").party(None),
            admin.party(None)
        );
        assert_ne!(
            Keyring::new(&keys, b"other secret")
                .expect("valid")
                .identify("admin-key-123")
                .expect("known")
                .party(None),
            admin.party(None)
        );
        assert!(!admin.party(None).as_str().contains("admin"));

        // Without keys: the address, not the port; IPv6 by /64.
        let open = Caller::Open;
        for (a, b, same) in [
            ("10.0.0.1:1", "10.0.0.1:2", true),
            ("10.0.0.1:1", "10.0.0.2:1", false),
            ("[::ffff:10.0.0.1]:1", "10.0.0.1:1", true),
            ("[2001:db8:1:2::5]:1", "[2001:db8:1:2:ffff::9]:1", true),
            ("[2001:db8:1:2::5]:1", "[2001:db8:1:3::5]:1", false),
        ] {
            assert_eq!(
                open.party(peer(a)) == open.party(peer(b)),
                same,
                "{a} and {b} are one party: {same}"
            );
        }
        assert_eq!(open.party(peer("10.0.0.1:1")).as_str(), "addr:10.0.0.1");
    }
}
