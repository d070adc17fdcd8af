//! Property tests of the proxy's configuration parsing and validation
//! (`toml::from_str::<ProxyConfig>` + `problems()`, without the environment
//! overrides) and of fence scope resolution (`ScopeMap`).
//!
//! A few seconds in the normal `cargo test`; for a longer local run:
//! `PROPTEST_CASES=20000 cargo test -p fencegate-proxy --test proptest_config`.

use fencegate_core::LockName;
use fencegate_proxy::config::{ProxyConfig, ScopeConfig, UnscopedPolicy};
use fencegate_proxy::scope::ScopeMap;
use fencegate_testkit::proptest::config;
use proptest::prelude::*;

/// Parses, validates, builds the scope map and resolves a few keys: none of
/// it may panic, whatever the text.
fn exercise(text: &str, probes: &[(String, String)]) {
    if let Ok(c) = toml::from_str::<ProxyConfig>(text) {
        let _ = c.problems();
        let _ = c.unsigned_tokens_accepted();
        if let Ok(map) = ScopeMap::new(&c) {
            for (bucket, key) in probes {
                let _ = map.resolve(bucket, key);
            }
            for s in &c.scopes {
                let _ = map.resolve(&s.bucket, &s.prefix);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// TOML-ish text
// ---------------------------------------------------------------------------

/// A TOML value: mostly well-formed, sometimes not.
fn toml_value() -> impl Strategy<Value = String> {
    prop_oneof![
        "\"[a-zA-Z0-9:/._ -]{0,24}\"",
        "\"(http|https|ftp)://[a-z0-9.:]{0,16}\"",
        "\"[0-9.:]{0,21}\"",
        "-?[0-9]{1,22}",
        "[0-9]{1,3}\\.[0-9]{1,3}([eE][+-]?[0-9]{1,3})?",
        prop_oneof![Just("true"), Just("false"), Just("nan"), Just("inf")].prop_map(str::to_owned),
        "\\[(\"[a-zA-Z0-9-]{0,20}\", ?){0,3}\\]",
        "\\{ ?([a-z_]{1,10} ?= ?\"[a-z0-9]{0,8}\",? ?){0,3}\\}",
        "'[^'\n]{0,16}'",
        "\"\"\"[a-z\n]{0,12}\"\"\"",
        "[^\n]{0,12}",
    ]
}

const KEYS: &[&str] = &[
    "listen",
    "db",
    "allow_anonymous",
    "signing_keys",
    "accept_unsigned_tokens",
    "unscoped_writes",
    "probe_bucket",
    "accept_weak_backend",
    "etag_cache_entries",
    "max_xml_body_bytes",
    "endpoint",
    "region",
    "access_key",
    "secret_key",
    "path_style",
    "timeout_secs",
    "bucket",
    "prefix",
    "lock",
    "listne",
];

const TABLES: &[&str] = &[
    "[backend]",
    "[[scopes]]",
    "[[clients]]",
    "[backend.extra]",
    "[[backend]]",
    "[scopes]",
    "[clients]",
    "[",
];

fn toml_line() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (prop::sample::select(KEYS), toml_value()).prop_map(|(k, v)| format!("{k} = {v}")),
        1 => ("[a-z_.\"]{1,12}", toml_value()).prop_map(|(k, v)| format!("{k} = {v}")),
        1 => prop::sample::select(TABLES).prop_map(str::to_owned),
        1 => "#[^\n]{0,10}",
        1 => "[^\n]{0,20}",
    ]
}

fn toml_text() -> impl Strategy<Value = String> {
    prop::collection::vec(toml_line(), 0..16).prop_map(|lines| lines.join("\n"))
}

fn probe() -> impl Strategy<Value = (String, String)> {
    (
        prop_oneof!["[a-c]{1,2}", ".{0,10}"],
        prop_oneof!["[ab/]{0,6}", ".{0,10}"],
    )
}

proptest! {
    #![proptest_config(config(600))]

    #[test]
    fn arbitrary_text_never_panics(text in any::<String>(), probes in prop::collection::vec(probe(), 0..4)) {
        exercise(&text, &probes);
    }

    #[test]
    fn toml_ish_text_never_panics(text in toml_text(), probes in prop::collection::vec(probe(), 0..4)) {
        exercise(&text, &probes);
    }

    /// A config that parses and has no problems builds a scope map: the
    /// validation covers everything `ScopeMap::new` checks.
    #[test]
    fn a_valid_config_builds(
        scopes in prop::collection::vec(
            ("[a-c]{1,2}", "[ab/]{0,3}", prop_oneof![3 => "[a-z]{1,4}", 1 => ".{0,5}"]),
            0..5,
        ),
        noise in prop::collection::vec(toml_line(), 0..3),
    ) {
        let q = |s: &str| toml::Value::String(s.to_owned()).to_string();
        let mut text = String::from(
            "signing_keys = [\"0123456789abcdef0123\"]\n\
             [backend]\nendpoint = \"http://127.0.0.1:9100\"\naccess_key = \"ak\"\nsecret_key = \"sk\"\n",
        );
        for (bucket, prefix, lock) in &scopes {
            text.push_str(&format!(
                "[[scopes]]\nbucket = {}\nprefix = {}\nlock = {}\n",
                q(bucket),
                q(prefix),
                q(lock)
            ));
        }
        for line in &noise {
            text.push_str(line);
            text.push('\n');
        }
        if let Ok(c) = toml::from_str::<ProxyConfig>(&text) {
            let problems = c.problems();
            let built = ScopeMap::new(&c);
            if problems.is_empty() {
                prop_assert!(built.is_ok(), "{}", text);
            }
            if built.is_err() {
                prop_assert!(!problems.is_empty(), "{}", text);
            }
            if noise.is_empty() {
                let bad = scopes.iter().any(|(_, _, l)| LockName::new(l).is_err());
                let mut pairs: Vec<_> = scopes.iter().map(|(b, p, _)| (b, p)).collect();
                pairs.sort();
                pairs.dedup();
                let dup = pairs.len() != scopes.len();
                prop_assert_eq!(problems.is_empty(), !bad && !dup, "{}: {:?}", text, problems);
            }
        }
    }

    /// Scope ids are the database keys of max_token: distinct scopes must
    /// never share one. Holds for S3 bucket names (no `/`); see
    /// `scope_ids_collide_for_buckets_with_a_slash` for the config gap.
    #[test]
    fn distinct_scopes_have_distinct_ids(scopes in scope_set()) {
        let (_, map) = map_of(&scopes, UnscopedPolicy::Deny);
        let mut ids: Vec<&str> = map.configured().iter().map(|s| s.id.as_str()).collect();
        ids.sort_unstable();
        let n = ids.len();
        ids.dedup();
        prop_assert_eq!(ids.len(), n);
    }

    /// Every problem is reported, whatever the combination: a config with
    /// scopes whose locks are invalid always lists them.
    #[test]
    fn every_bad_scope_lock_is_listed(locks in prop::collection::vec(prop_oneof!["[a-z]{1,8}", ".{0,10}"], 0..6)) {
        let c = ProxyConfig {
            scopes: locks
                .iter()
                .enumerate()
                .map(|(i, l)| ScopeConfig { bucket: "b".into(), prefix: format!("p{i}/"), lock: l.clone() })
                .collect(),
            ..ProxyConfig::default()
        };
        let problems = c.problems();
        for (i, l) in locks.iter().enumerate() {
            let listed = problems.iter().any(|p| p.starts_with(&format!("scopes[{i}].lock")));
            prop_assert_eq!(listed, LockName::new(l).is_err(), "{:?}: {:?}", l, problems);
        }
        prop_assert_eq!(ScopeMap::new(&c).is_ok(), locks.iter().all(|l| LockName::new(l).is_ok()));
    }
}

// ---------------------------------------------------------------------------
// Scope resolution
// ---------------------------------------------------------------------------

/// Scopes over a small alphabet so that prefixes nest and collide often.
fn scope_set() -> impl Strategy<Value = Vec<ScopeConfig>> {
    prop::collection::vec(("[a-c]", "[ab/]{0,4}", "[a-z]{1,4}"), 0..8).prop_map(|v| {
        let mut seen = std::collections::HashSet::new();
        v.into_iter()
            // Duplicate bucket+prefix pairs are a configuration problem.
            .filter(|(b, p, _)| seen.insert((b.clone(), p.clone())))
            .map(|(bucket, prefix, lock)| ScopeConfig {
                bucket,
                prefix,
                lock,
            })
            .collect()
    })
}

fn policy() -> impl Strategy<Value = UnscopedPolicy> {
    prop_oneof![Just(UnscopedPolicy::Deny), Just(UnscopedPolicy::BucketLock)]
}

fn map_of(scopes: &[ScopeConfig], unscoped: UnscopedPolicy) -> (ProxyConfig, ScopeMap) {
    let c = ProxyConfig {
        scopes: scopes.to_vec(),
        unscoped_writes: unscoped,
        ..ProxyConfig::default()
    };
    let map = ScopeMap::new(&c).expect("scopes with valid locks build");
    (c, map)
}

proptest! {
    #![proptest_config(config(1500))]

    /// The longest configured prefix of the key in its bucket wins; outside
    /// every scope the policy decides (with no scopes at all, every bucket
    /// is fenced by its own lock).
    #[test]
    fn longest_prefix_wins(
        scopes in scope_set(),
        unscoped in policy(),
        bucket in prop_oneof!["[a-d]", "[a-c/:]{0,3}"],
        key in "[ab/c]{0,7}",
    ) {
        let (c, map) = map_of(&scopes, unscoped);
        prop_assert!(!c.problems().iter().any(|p| p.contains("scopes[")), "{:?}", c.problems());
        let expected = scopes
            .iter()
            .filter(|s| s.bucket == bucket && key.starts_with(&s.prefix))
            .max_by_key(|s| s.prefix.len());
        match (map.resolve(&bucket, &key), expected) {
            (Ok(got), Some(want)) => {
                prop_assert_eq!(&got.bucket, &want.bucket);
                prop_assert_eq!(&got.prefix, &want.prefix);
                prop_assert_eq!(got.lock.as_str(), want.lock.as_str());
                let id = if want.prefix.is_empty() {
                    want.bucket.clone()
                } else {
                    format!("{}/{}", want.bucket, want.prefix)
                };
                prop_assert_eq!(&got.id, &id);
            }
            (got, Some(want)) => prop_assert!(false, "expected {:?}, got {:?}", want, got),
            (got, None) => {
                let fallback = scopes.is_empty() || unscoped == UnscopedPolicy::BucketLock;
                match (got, LockName::new(&bucket)) {
                    (Ok(s), Ok(lock)) if fallback => {
                        prop_assert_eq!(&s.lock, &lock);
                        prop_assert_eq!(&s.id, &bucket);
                        prop_assert_eq!(s.prefix.as_str(), "");
                    }
                    (Err(u), lock) => {
                        prop_assert!(!fallback || lock.is_err(), "refused although the bucket lock applies");
                        prop_assert_eq!(u.bucket, bucket);
                        prop_assert_eq!(u.key, key);
                        let ids: Vec<String> = map.configured().iter().map(|s| s.id.clone()).collect();
                        prop_assert_eq!(u.configured, ids);
                    }
                    (Ok(s), _) => prop_assert!(false, "resolved to {:?} outside every scope", s),
                }
            }
        }
    }

    /// Adding a scope with a longer matching prefix takes the key over;
    /// adding one that does not match leaves the answer unchanged.
    #[test]
    fn adding_a_scope_only_changes_the_keys_it_covers(
        scopes in scope_set(),
        extra_prefix in "[ab/]{0,4}",
        key in "[ab/]{0,6}",
    ) {
        prop_assume!(!scopes.iter().any(|s| s.bucket == "a" && s.prefix == extra_prefix));
        let (_, before) = map_of(&scopes, UnscopedPolicy::Deny);
        let mut more = scopes.clone();
        more.push(ScopeConfig { bucket: "a".into(), prefix: extra_prefix.clone(), lock: "extra".into() });
        let (_, after) = map_of(&more, UnscopedPolicy::Deny);
        let old = before.resolve("a", &key).ok();
        let new = after.resolve("a", &key).ok();
        let covers = key.starts_with(&extra_prefix)
            && old.as_ref().is_none_or(|s| s.prefix.len() < extra_prefix.len());
        if covers {
            prop_assert_eq!(new.map(|s| s.lock.as_str().to_owned()), Some("extra".to_owned()));
        } else if !scopes.is_empty() {
            prop_assert_eq!(new, old);
        }
    }

    #[test]
    fn resolve_never_panics(
        scopes in prop::collection::vec((".{0,6}", ".{0,6}", prop_oneof!["[a-z]{1,4}", ".{0,6}"]), 0..6),
        unscoped in policy(),
        probes in prop::collection::vec((".{0,12}", ".{0,12}"), 0..8),
    ) {
        let c = ProxyConfig {
            scopes: scopes
                .into_iter()
                .map(|(bucket, prefix, lock)| ScopeConfig { bucket, prefix, lock })
                .collect(),
            unscoped_writes: unscoped,
            ..ProxyConfig::default()
        };
        let _ = c.problems();
        if let Ok(map) = ScopeMap::new(&c) {
            for (bucket, key) in &probes {
                if let Ok(s) = map.resolve(bucket, key) {
                    prop_assert!(key.starts_with(&s.prefix));
                    prop_assert_eq!(&s.bucket, bucket);
                }
            }
        }
    }
}

#[test]
fn the_documented_examples_resolve() {
    let scopes = [
        ("b", "", "whole"),
        ("b", "db/", "db"),
        ("b", "db/pg/", "pg"),
    ]
    .map(|(bucket, prefix, lock)| ScopeConfig {
        bucket: bucket.into(),
        prefix: prefix.into(),
        lock: lock.into(),
    });
    let (_, map) = map_of(&scopes, UnscopedPolicy::Deny);
    for (key, lock) in [
        ("db/pg/x", "pg"),
        ("db/pgx", "db"),
        ("db", "whole"),
        ("", "whole"),
    ] {
        let got = map.resolve("b", key).expect("scoped");
        assert_eq!(got.lock.as_str(), lock, "{key}");
    }
    assert!(map.resolve("c", "x").is_err());
}

/// Bucket `a/b` (whole bucket) and bucket `a` prefix `b` would both get the
/// scope id `a/b` and share one max_token under different locks; a bucket
/// name with `/` is therefore refused by the config check.
#[test]
fn a_scope_bucket_with_a_slash_is_refused() {
    let scopes =
        [("a/b", "", "one"), ("a", "b", "two")].map(|(bucket, prefix, lock)| ScopeConfig {
            bucket: bucket.into(),
            prefix: prefix.into(),
            lock: lock.into(),
        });
    let (c, _map) = map_of(&scopes, UnscopedPolicy::Deny);
    let problems = c.problems();
    assert!(
        problems
            .iter()
            .any(|p| p.contains("scopes[0].bucket") && p.contains("'/'")),
        "{problems:?}"
    );
    assert!(
        !problems.iter().any(|p| p.contains("scopes[1].bucket")),
        "{problems:?}"
    );
}
