//! One builder for the environments tests run in: a store, proxies in front
//! of it (one, or replicas sharing an etcd cluster), lease services, and
//! the etcd cluster they use.
//!
//! ```ignore
//! let env = Harness::new(BackendKind::Moto).etcd(3).proxies(2).start().await;
//! env.proxies[1].client() ...
//! ```
//!
//! Every part is a real process on `127.0.0.1:0` (the store may be the
//! in-process s3s-fs), killed when the environment is dropped.

use super::Service;
use super::etcd::EtcdCluster;
use super::s3::{Backend, BackendKind, Proxy, proxy_toml};
use std::path::{Path, PathBuf};

/// The bucket every environment creates first.
pub const BUCKET: &str = "bkt";

/// What to start.
#[derive(Debug, Clone)]
pub struct Harness {
    kind: BackendKind,
    buckets: Vec<String>,
    proxy_extra: String,
    backend_options: String,
    cluster_options: String,
    /// The first proxy's own `[cluster]` timing lines, if it differs.
    first_cluster_options: Option<String>,
    etcd: usize,
    locksvc: usize,
    proxies: usize,
    relay: Option<String>,
    etcd_link: bool,
    /// The first proxy also lists the other members, after the link.
    etcd_link_then_others: bool,
    anonymous: bool,
    shared: Option<bool>,
}

/// What was started.
#[derive(Debug)]
pub struct Env {
    pub backend: Backend,
    /// Every proxy; [`Env::proxy`] is the first.
    pub proxies: Vec<Proxy>,
    pub locksvc: Vec<Service>,
    pub etcd: Option<EtcdCluster>,
    /// The first proxy's link to etcd, with [`Harness::first_proxy_etcd_link`].
    pub etcd_link: Option<super::relay::Link>,
    pub dir: tempfile::TempDir,
}

impl Harness {
    pub fn new(kind: BackendKind) -> Harness {
        Harness {
            kind,
            buckets: vec![BUCKET.to_owned()],
            proxy_extra: String::new(),
            backend_options: String::new(),
            cluster_options: String::new(),
            first_cluster_options: None,
            etcd: 0,
            locksvc: 0,
            proxies: 1,
            relay: None,
            etcd_link: false,
            etcd_link_then_others: false,
            anonymous: true,
            shared: None,
        }
    }

    /// Whether the proxies share their fences through etcd (default: when
    /// there is more than one). `false` starts proxies that each keep their
    /// own, side by side: what the README warns against, for the tests of
    /// what then still holds.
    pub fn shared(mut self, shared: bool) -> Harness {
        self.shared = Some(shared);
        self
    }

    fn is_shared(&self) -> bool {
        self.shared.unwrap_or(self.proxies > 1 || self.etcd > 0)
    }

    /// Whether the proxies accept unsigned requests (default: yes).
    pub fn anonymous(mut self, allowed: bool) -> Harness {
        self.anonymous = allowed;
        self
    }

    /// Another bucket to create.
    pub fn bucket(mut self, name: &str) -> Harness {
        self.buckets.push(name.to_owned());
        self
    }

    /// TOML lines added to every proxy's top-level config.
    pub fn proxy_config(mut self, extra: &str) -> Harness {
        add_lines(&mut self.proxy_extra, extra);
        self
    }

    /// Lines of every proxy's `[backend]` (such as `timeout_secs = 1`).
    pub fn backend_options(mut self, lines: &str) -> Harness {
        add_lines(&mut self.backend_options, lines);
        self
    }

    /// Lines of every proxy's `[cluster]`, over the harness's defaults.
    pub fn cluster_options(mut self, lines: &str) -> Harness {
        add_lines(&mut self.cluster_options, lines);
        self
    }

    /// The first proxy's `[cluster]` timing, in place of the others'
    /// (replicas whose settings differ, as in a rolling change).
    pub fn first_proxy_cluster_options(mut self, lines: &str) -> Harness {
        self.first_cluster_options = Some(lines.to_owned());
        self
    }

    /// An etcd cluster of `n` members, for the proxies' `[cluster]`.
    pub fn etcd(mut self, n: usize) -> Harness {
        self.etcd = n;
        self
    }

    /// `n` lease services (on etcd when the harness has one, or as the
    /// test run's lease backend decides).
    pub fn locksvc(mut self, n: usize) -> Harness {
        self.locksvc = n;
        self
    }

    /// `n` proxies; more than one share their fences through etcd.
    pub fn proxies(mut self, n: usize) -> Harness {
        assert!(n >= 1, "at least one proxy");
        self.proxies = n;
        self
    }

    /// The first proxy reaches etcd (its first member only) through a
    /// [`super::relay::Link`] the test can slow down and cut
    /// ([`Env::etcd_link`]).
    pub fn first_proxy_etcd_link(mut self) -> Harness {
        self.etcd_link = true;
        self
    }

    /// As [`Harness::first_proxy_etcd_link`], and the first proxy also
    /// lists the other members after the link: a call the linked member
    /// leaves unanswered for its share of `request_timeout` is retried on
    /// the next.
    pub fn first_proxy_etcd_link_then_others(mut self) -> Harness {
        self.etcd_link = true;
        self.etcd_link_then_others = true;
        self
    }

    /// The first proxy reaches the store through `endpoint` (a relay).
    pub fn first_proxy_via(mut self, endpoint: &str) -> Harness {
        self.relay = Some(endpoint.to_owned());
        self
    }

    /// Starts the store and creates the buckets, without the rest: for a
    /// relay in front of it, then [`Harness::start_on`].
    pub async fn backend(&self) -> Backend {
        let backend = Backend::start(self.kind).await;
        for b in &self.buckets {
            backend.create_bucket(b).await;
        }
        backend
    }

    pub async fn start(self) -> Env {
        let backend = self.backend().await;
        self.start_on(backend).await
    }

    /// The config of proxy `i`.
    fn proxy_toml(&self, backend: &Backend, dir: &Path, i: usize, etcd: Option<&str>) -> String {
        let mut toml = proxy_toml(backend, dir, BUCKET, &self.proxy_extra);
        if !self.anonymous {
            toml = toml.replace("allow_anonymous = true", "allow_anonymous = false");
        }
        let endpoint = match (i, &self.relay) {
            (0, Some(relay)) => relay.clone(),
            _ => backend.endpoint.clone(),
        };
        toml = toml.replace(
            &format!("endpoint = \"{}\"", backend.endpoint),
            &format!("endpoint = \"{endpoint}\"\n{}", self.backend_options),
        );
        if let Some(endpoints) = etcd {
            let list: Vec<String> = endpoints.split(',').map(|e| format!("{e:?}")).collect();
            toml.push_str(&format!(
                "\n[cluster]\nendpoints = [{}]\nprefix = \"/fg-test/\"\nreplica_id = \"p{i}\"\n{}",
                list.join(", "),
                if let Some(own) = self.first_cluster_options.clone().filter(|_| i == 0) {
                    own
                } else if self.cluster_options.contains("registration_ttl") {
                    self.cluster_options.clone()
                } else {
                    // Short enough for quick tests; the ack timeout leaves a
                    // loaded 2-core host room to acknowledge a raise, so a
                    // test evicts a replica only when it means to.
                    format!(
                        "registration_ttl = \"3s\"\nack_timeout = \"2s\"\nrequest_timeout = \"1s\"\n{}",
                        self.cluster_options
                    )
                }
            ));
        }
        toml
    }

    pub async fn start_on(self, backend: Backend) -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let etcd = if self.etcd > 0 || self.is_shared() {
            let n = self.etcd.max(1);
            Some(
                tokio::task::spawn_blocking(move || EtcdCluster::start(n))
                    .await
                    .expect("etcd"),
            )
        } else {
            None
        };
        let endpoints = etcd.as_ref().map(EtcdCluster::endpoints);
        let etcd_link = match (&endpoints, self.etcd_link) {
            (Some(e), true) => {
                let first = e.split(',').next().unwrap_or_default();
                Some(
                    super::relay::Link::start(first.trim_start_matches("http://").to_owned()).await,
                )
            }
            _ => None,
        };
        let mut proxies = Vec::new();
        for i in 0..self.proxies {
            let pdir: PathBuf = dir.path().join(format!("proxy{i}"));
            std::fs::create_dir_all(&pdir).expect("proxy dir");
            let linked = etcd_link.as_ref().filter(|_| i == 0).map(|l| {
                let others = endpoints.as_deref().unwrap_or_default().split(',').skip(1);
                if self.etcd_link_then_others {
                    std::iter::once(l.endpoint.as_str())
                        .chain(others)
                        .collect::<Vec<_>>()
                        .join(",")
                } else {
                    l.endpoint.clone()
                }
            });
            let shared = self
                .is_shared()
                .then_some(linked.as_deref().or(endpoints.as_deref()))
                .flatten();
            let toml = self.proxy_toml(&backend, &pdir, i, shared);
            proxies.push(Proxy::start(&toml, &pdir).await);
        }
        let mut locksvc = Vec::new();
        for i in 0..self.locksvc {
            let ldir = dir.path().join(format!("locksvc{i}"));
            std::fs::create_dir_all(&ldir).expect("locksvc dir");
            let env: Vec<(String, String)> = match &endpoints {
                Some(e) => vec![
                    ("FENCEGATE_ETCD_ENDPOINTS".into(), e.clone()),
                    ("FENCEGATE_ETCD_PREFIX".into(), "/fg-test-leases/".into()),
                ],
                None => Vec::new(),
            };
            locksvc.push(
                tokio::task::spawn_blocking(move || {
                    let env: Vec<(&str, &str)> =
                        env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                    Service::start(super::locksvc_cmd(&ldir, &env))
                })
                .await
                .expect("locksvc"),
            );
        }
        Env {
            backend,
            proxies,
            locksvc,
            etcd,
            etcd_link,
            dir,
        }
    }
}

impl Env {
    /// PUTs `body` to `key` in [`BUCKET`] through the first proxy with
    /// `Fencing-Token: token`; a refusal is its status, its S3 code and its
    /// `Fencing-Max-Token`.
    pub async fn put(
        &self,
        key: &str,
        token: &str,
        body: &str,
    ) -> Result<(), (Option<u16>, String, Option<String>)> {
        let req = self
            .proxy()
            .client()
            .put_object()
            .bucket(BUCKET)
            .key(key)
            .body(body.as_bytes().to_vec().into());
        fenced!(req, token).send().await.map(|_| ()).map_err(|e| {
            let max = e
                .raw_response()
                .and_then(|r| r.headers().get("fencing-max-token"))
                .map(str::to_owned);
            let (status, code) = super::s3::error_of(&e);
            (status, code, max)
        })
    }

    /// The first proxy (the only one unless `proxies(n)` asked for more).
    pub fn proxy(&self) -> &Proxy {
        &self.proxies[0]
    }

    /// The directory of proxy `i`'s config and database.
    pub fn proxy_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("proxy{i}"))
    }

    /// The first lease service.
    pub fn locksvc(&self) -> &Service {
        self.locksvc
            .first()
            .expect("the harness has no lease service")
    }

    pub fn etcd(&self) -> &EtcdCluster {
        self.etcd.as_ref().expect("the harness has no etcd cluster")
    }
}

/// Appends `lines` to a TOML fragment, ending the line.
fn add_lines(toml: &mut String, lines: &str) {
    toml.push_str(lines);
    toml.push('\n');
}
