//! Every key the proxy accepts stays inside its bucket and its fence
//! scope's prefix under s3s-fs's path rules (`path_absolutize`'s
//! `absolutize_virtually`, exactly as `s3s_fs::FileSystem` resolves
//! `bucket/key`), and the key its scope is resolved on is the key that is
//! forwarded.

use fencegate_proxy::ProxyConfig;
use fencegate_proxy::config::{ScopeConfig, UnscopedPolicy};
use fencegate_proxy::object_key;
use fencegate_proxy::scope::ScopeMap;
use path_absolutize::Absolutize;
use proptest::prelude::*;
use std::path::{Path, PathBuf};

fn scopes() -> ScopeMap {
    let config = ProxyConfig {
        scopes: [
            ("b", "db/", "db"),
            ("b", "logs/", "logs"),
            ("b", "", "whole"),
        ]
        .iter()
        .map(|&(b, p, l)| ScopeConfig::new(b, p, l))
        .collect(),
        unscoped_writes: UnscopedPolicy::Deny,
        ..ProxyConfig::default()
    };
    ScopeMap::new(&config).expect("valid scopes")
}

/// Where s3s-fs would put `bucket/key` under `root` (its
/// `get_object_path`), or None when it refuses the path.
fn s3s_fs_path(root: &Path, bucket: &str, key: &str) -> Option<PathBuf> {
    Path::new(bucket)
        .join(key)
        .absolutize_virtually(root)
        .ok()
        .map(|p| p.into_owned())
}

fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("db".to_owned()),
        Just("logs".to_owned()),
        Just("x".to_owned()),
        Just(".".to_owned()),
        Just("..".to_owned()),
        Just(String::new()),
        Just("...".to_owned()),
        Just("..x".to_owned()),
        Just("%2E%2E".to_owned()),
        Just("a\\..".to_owned()),
        Just(".bucket-Yg.object-eA.metadata.json".to_owned()),
        "[a-z.]{1,4}",
    ]
}

fn key() -> impl Strategy<Value = String> {
    (prop::collection::vec(segment(), 1..6), any::<bool>()).prop_map(|(segs, lead)| {
        let k = segs.join("/");
        if lead { format!("/{k}") } else { k }
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn accepted_keys_stay_in_their_bucket_and_scope(key in key()) {
        let root = Path::new("/srv/s3");
        let map = scopes();
        if object_key::check(&key).is_err() {
            return Ok(());
        }
        let scope = map.resolve("b", &key).expect("every key of b has a scope");
        let path = s3s_fs_path(root, "b", &key);
        let inside = root.join("b").join(&scope.prefix);
        prop_assert!(
            path.as_ref().is_some_and(|p| p.starts_with(&inside) && p != &root.join("b")),
            "key {key:?} (scope {}) resolves to {path:?}, outside {}",
            scope.id,
            inside.display()
        );
    }
}

#[test]
fn the_reviewed_escapes_are_refused() {
    let root = Path::new("/srv/s3");
    for key in [
        "../other/victim.txt",
        "x/../../other/victim.txt",
        "./",
        "../emptytwo/",
        "logs/../db/x",
        "/srv/s3/other/victim.txt",
        "../.bucket-b3RoZXI.object-dmljdGlt.metadata.json",
    ] {
        assert!(object_key::check(key).is_err(), "{key:?} must be refused");
        // ...and each of them does escape under s3s-fs's rules: the
        // property above is not vacuous.
        let p = s3s_fs_path(root, "b", key);
        let scope = scopes().resolve("b", key).expect("scope");
        let inside = root.join("b").join(&scope.prefix);
        assert!(
            p.as_ref()
                .is_none_or(|p| !p.starts_with(&inside) || p == &root.join("b")),
            "{key:?} -> {p:?} would not escape {}",
            inside.display()
        );
    }
}
