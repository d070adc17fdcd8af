//! Signing-key rotation, end to end, exactly as README.md ("Key rotation")
//! tells an operator to do it: a real lease service and two real proxies on
//! one store, restarted with each step's key lists.
//!
//! At every step, the signed tokens and lease-bound S3 credentials issued
//! before it and after it must keep working on every proxy; only removing
//! the old key ends what it signed.

mod support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use support::s3::*;

const OLD: &str = support::SIGNING_KEY;
const NEW: &str = "the-new-signing-key-0123456789";

/// What a lease gave its holder: a signed token and a key pair.
#[derive(Debug, Clone)]
struct Issued {
    what: String,
    lock: String,
    fencing_token: String,
    access_key: String,
    secret_key: String,
}

impl Issued {
    fn of(what: &str, lease: &Value) -> Issued {
        let s = |f: &str| {
            lease[f]
                .as_str()
                .unwrap_or_else(|| panic!("no {f} in {lease}"))
                .to_owned()
        };
        Issued {
            what: what.to_owned(),
            lock: s("lock"),
            fencing_token: s("fencing_token"),
            access_key: s("s3_access_key_id"),
            secret_key: s("s3_secret_access_key"),
        }
    }
}

struct Deployment {
    backend: Backend,
    dir: tempfile::TempDir,
    locksvc: Option<support::Service>,
    proxies: Vec<Proxy>,
    writes: u32,
}

/// Every bucket a lease of the test writes to; each is fenced by the lock of
/// its name, so the leases never fence each other out.
const LOCKS: [&str; 4] = ["lock-a", "lock-b", "lock-c", "lock-e"];

fn proxy_dir(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("proxy{i}"))
}

impl Deployment {
    async fn start() -> Deployment {
        let backend = Backend::start(BackendKind::S3Fs).await;
        for b in LOCKS {
            backend.create_bucket(b).await;
        }
        let dir = support::tempdir();
        let mut proxies = Vec::new();
        for i in 0..2 {
            let pdir = proxy_dir(dir.path(), i);
            std::fs::create_dir(&pdir).expect("proxy dir");
            proxies.push(Proxy::start(&proxy_config(&backend, &pdir, &[OLD]), &pdir).await);
        }
        let mut d = Deployment {
            backend,
            dir,
            locksvc: None,
            proxies,
            writes: 0,
        };
        d.restart_locksvc(&[OLD]).await;
        d
    }

    /// Stops the lease service and starts it on the same database with
    /// `keys`.
    async fn restart_locksvc(&mut self, keys: &[&str]) {
        drop(self.locksvc.take());
        let (dir, keys) = (self.dir.path().to_owned(), keys.join(","));
        self.locksvc = Some(
            tokio::task::spawn_blocking(move || {
                support::Service::start(support::locksvc_cmd(
                    &dir,
                    &[("FENCEGATE_SIGNING_KEYS", &keys)],
                ))
            })
            .await
            .expect("lease service started"),
        );
    }

    /// Restarts every proxy with `keys`.
    async fn restart_proxies(&mut self, keys: &[&str]) {
        for (i, p) in self.proxies.iter_mut().enumerate() {
            let toml = proxy_config(&self.backend, &proxy_dir(self.dir.path(), i), keys);
            std::fs::write(&p.config, toml).expect("write config");
            p.kill9();
            p.restart().await;
        }
    }

    /// The lease service's URL (its blocking client is made, and dropped,
    /// off the async runtime).
    fn url(&self) -> String {
        self.locksvc.as_ref().expect("running").url.clone()
    }

    async fn acquire(&self, what: &str, lock: &str) -> Issued {
        let (url, lock) = (self.url(), lock.to_owned());
        let (status, lease) = tokio::task::spawn_blocking(move || {
            support::Api::new(&url).acquire(&lock, "holder", 600_000)
        })
        .await
        .expect("acquired");
        assert_eq!(status, 200, "{what}: {lease}");
        Issued::of(what, &lease)
    }

    /// Renews `lease` with its signed token; the answer's status and body.
    async fn renew(&self, lease: &Issued) -> (u16, Value) {
        let (url, lock, token) = (self.url(), lease.lock.clone(), lease.fencing_token.clone());
        tokio::task::spawn_blocking(move || {
            support::Api::new(&url).renew(&lock, token.as_str(), 600_000)
        })
        .await
        .expect("renewed")
    }

    /// Writes with `lease`'s credentials, then with its token in the header,
    /// through every proxy; the error of each write that failed.
    async fn writes_with(&mut self, lease: &Issued) -> Vec<(String, (Option<u16>, String))> {
        let mut failures = Vec::new();
        for (i, p) in self.proxies.iter().enumerate() {
            for how in ["credentials", "token"] {
                self.writes += 1;
                let key = format!("object-{}", self.writes);
                let client = match how {
                    "credentials" => sdk_client(
                        &p.url,
                        (lease.access_key.as_str(), lease.secret_key.as_str()),
                    ),
                    _ => p.client(),
                };
                let req = client
                    .put_object()
                    .bucket(&lease.lock)
                    .key(&key)
                    .body(aws_sdk_s3::primitives::ByteStream::from_static(b"x"));
                let sent = if how == "token" {
                    fenced!(req, lease.fencing_token.clone()).send().await
                } else {
                    req.send().await
                };
                match sent {
                    Ok(_) => assert!(
                        stored(&self.backend, &lease.lock, &key).await.is_some(),
                        "{}: a write answered 200 is stored",
                        lease.what
                    ),
                    Err(e) => failures.push((format!("{} via proxy {i}", how), error_of(&e))),
                }
            }
        }
        failures
    }

    /// Every write with each of `leases` succeeds on every proxy.
    async fn all_work(&mut self, step: &str, leases: &[&Issued]) {
        for lease in leases {
            let failures = self.writes_with(lease).await;
            assert!(
                failures.is_empty(),
                "{step}: {} ({}) refused: {failures:?}",
                lease.what,
                lease.access_key
            );
        }
    }
}

/// The harness's proxy config with `keys` as its signing keys, fencing
/// every bucket by the lock of its name.
fn proxy_config(backend: &Backend, dir: &Path, keys: &[&str]) -> String {
    let base = proxy_toml(backend, dir, LOCKS[0], "unscoped_writes = \"bucket-lock\"");
    let line = format!("signing_keys = [\"{OLD}\"]");
    assert!(base.contains(&line), "the harness config names its key");
    base.replace(&line, &format!("signing_keys = {keys:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_rotation_as_the_readme_describes_keeps_every_credential_working() {
    let mut d = Deployment::start().await;

    // Before: the old key everywhere.
    let a = d.acquire("lease A (old key)", LOCKS[0]).await;
    d.all_work("old key only", &[&a]).await;

    // Step 1: the new key second everywhere; the old key still signs.
    d.restart_proxies(&[OLD, NEW]).await;
    d.restart_locksvc(&[OLD, NEW]).await;
    let b = d
        .acquire("lease B (old key, new one known)", LOCKS[1])
        .await;
    d.all_work("new key added second", &[&a, &b]).await;

    // Step 2: the new key first on the lease service only. What it issues
    // now is signed with the new key, which the proxies verify second.
    d.restart_locksvc(&[NEW, OLD]).await;
    let c = d.acquire("lease C (new key)", LOCKS[2]).await;
    assert_ne!(
        c.access_key.split('.').nth(1),
        a.access_key.split('.').nth(1),
        "the new credentials name another key: {} vs {}",
        c.access_key,
        a.access_key
    );
    d.all_work("new key first on the lease service", &[&a, &b, &c])
        .await;
    // A lease granted under the old key renews under the new one.
    let (status, renewed) = d.renew(&a).await;
    assert_eq!(status, 200, "renewing lease A: {renewed}");
    let a2 = Issued::of("lease A renewed (new key)", &renewed);
    d.all_work("lease A renewed", &[&a, &a2]).await;

    // Step 3: once nothing signed with the old key is live, it is removed
    // everywhere. What the new key signed keeps working; what the old key
    // signed is refused, which is why the README says to wait.
    d.restart_proxies(&[NEW]).await;
    d.restart_locksvc(&[NEW]).await;
    let e = d.acquire("lease E (new key only)", LOCKS[3]).await;
    d.all_work("old key removed", &[&c, &a2, &e]).await;
    for old in [&a, &b] {
        let failures = d.writes_with(old).await;
        let codes: Vec<(Option<u16>, &str)> =
            failures.iter().map(|(_, e)| (e.0, e.1.as_str())).collect();
        assert_eq!(
            codes,
            [
                (Some(403), "InvalidAccessKeyId"),
                (Some(403), "FencingTokenSignatureInvalid"),
            ]
            .repeat(2),
            "{}: the old key's credentials and token are refused on every proxy: {failures:?}",
            old.what
        );
    }
    let (status, refused) = d.renew(&b).await;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (403, Some("FencingTokenSignatureInvalid")),
        "a lease signed with a removed key can no longer be renewed: {refused}"
    );
}
