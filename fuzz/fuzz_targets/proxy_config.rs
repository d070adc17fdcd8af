//! Configuration text and fence scopes: `ProxyConfig` and `LocksvcConfig`
//! from arbitrary TOML (`toml::from_str` + `problems()`, no environment)
//! never panic; a proxy config without problems builds its `ScopeMap`; and
//! `ScopeMap::new` + `resolve` on arbitrary scopes, buckets and keys never
//! panic and pick the longest matching prefix.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use fencegate_core::LockName;
use fencegate_locksvc::LocksvcConfig;
use fencegate_proxy::config::{ProxyConfig, ScopeConfig, UnscopedPolicy};
use fencegate_proxy::scope::ScopeMap;
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Scopes {
    scopes: Vec<(String, String, String)>,
    bucket_lock: bool,
    probes: Vec<(String, String)>,
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    match selector % 3 {
        0 => proxy_toml(&String::from_utf8_lossy(rest)),
        1 => {
            if let Ok(c) = toml::from_str::<LocksvcConfig>(&String::from_utf8_lossy(rest)) {
                // Every problem is listed at once, in the one error.
                let problems = c.problems();
                match c.validated() {
                    Ok(_) => assert!(problems.is_empty(), "accepted with {problems:?}"),
                    Err(e) => {
                        let e = e.to_string();
                        assert!(!problems.is_empty(), "refused without a problem: {e}");
                        for p in &problems {
                            assert!(e.contains(p.as_str()), "{p:?} not listed in {e}");
                        }
                    }
                }
            }
        }
        _ => {
            if let Ok(s) = Scopes::arbitrary_take_rest(Unstructured::new(rest)) {
                scopes(s);
            }
        }
    }
});

fn proxy_toml(text: &str) {
    let Ok(c) = toml::from_str::<ProxyConfig>(text) else {
        return;
    };
    let problems = c.problems();
    let _ = c.unsigned_tokens_accepted();
    match ScopeMap::new(&c) {
        Ok(map) => {
            for s in &c.scopes {
                let _ = map.resolve(&s.bucket, &s.prefix);
                let _ = map.resolve(&s.bucket, "");
            }
            let _ = map.resolve("", "");
            let _ = map.resolve("backups", "a/b");
        }
        Err(e) => assert!(
            !problems.is_empty(),
            "ScopeMap::new failed ({e}) on a config without problems"
        ),
    }
}

fn scopes(input: Scopes) {
    let c = ProxyConfig {
        scopes: input
            .scopes
            .into_iter()
            .map(|(bucket, prefix, lock)| ScopeConfig {
                bucket,
                prefix,
                lock,
            })
            .collect(),
        unscoped_writes: if input.bucket_lock {
            UnscopedPolicy::BucketLock
        } else {
            UnscopedPolicy::Deny
        },
        ..ProxyConfig::default()
    };
    let _ = c.problems();
    let Ok(map) = ScopeMap::new(&c) else {
        return;
    };
    for (bucket, key) in &input.probes {
        let longest = c
            .scopes
            .iter()
            .filter(|s| &s.bucket == bucket && key.starts_with(&s.prefix))
            .map(|s| s.prefix.len())
            .max();
        match (map.resolve(bucket, key), longest) {
            (Ok(s), Some(len)) => {
                assert_eq!(&s.bucket, bucket);
                assert_eq!(s.prefix.len(), len, "not the longest prefix");
                assert!(key.starts_with(&s.prefix));
            }
            (Err(_), Some(_)) => panic!("{bucket:?}/{key:?} is in a scope but was refused"),
            (Ok(s), None) => {
                let fallback = c.scopes.is_empty() || input.bucket_lock;
                assert!(
                    fallback,
                    "resolved outside every scope without the fallback"
                );
                assert_eq!(
                    s.lock,
                    LockName::new(bucket).expect("the fallback needs a lock name")
                );
                assert!(s.prefix.is_empty());
            }
            (Err(u), None) => {
                let fallback = c.scopes.is_empty() || input.bucket_lock;
                assert!(!fallback || LockName::new(bucket).is_err());
                assert_eq!(u.configured.len(), c.scopes.len());
            }
        }
    }
}
