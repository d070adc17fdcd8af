//! Real etcd clusters for the tests: Debian's `etcd` 3.4 binary
//! (`scripts/install-test-tools.sh` installs it), members on loopback
//! ports, flags as in `ha-design.md`.
//!
//! A cluster's members are killed and its directory removed when it is
//! dropped, and by a watchdog process when the test binary exits without
//! dropping it (the shared cluster of the etcd pass lives in a static):
//! each cluster's data is some 370 MB, and a directory left per test binary
//! and run filled the disk of the machine the suite runs on.
//!
//! **The lease backend of a test run.** `FENCEGATE_TEST_LEASE_BACKEND=etcd`
//! makes [`super::locksvc_cmd`] start every lease service on the shared
//! 3-member cluster of this test binary, each service dir under its own key
//! prefix (a restart in the same dir finds its locks again): the same
//! lease-service tests then run on etcd, not a copy of them.

use serde_json::Value;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Which lease store the lease services of this test run use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseBackend {
    Sqlite,
    Etcd,
}

/// `FENCEGATE_TEST_LEASE_BACKEND`: `etcd`, or SQLite (unset or `sqlite`).
pub fn lease_backend() -> LeaseBackend {
    match std::env::var("FENCEGATE_TEST_LEASE_BACKEND").as_deref() {
        Ok("etcd") => LeaseBackend::Etcd,
        Ok("sqlite") | Err(_) => LeaseBackend::Sqlite,
        Ok(other) => panic!("FENCEGATE_TEST_LEASE_BACKEND={other:?}: use etcd or sqlite"),
    }
}

/// The cluster every lease service of an etcd pass uses.
pub fn shared_cluster() -> &'static EtcdCluster {
    static CLUSTER: OnceLock<EtcdCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| EtcdCluster::start(3))
}

/// The `FENCEGATE_ETCD_*` settings that put a lease service whose state
/// lives in `dir` on the shared cluster.
pub fn shared_env(dir: &Path) -> Vec<(String, String)> {
    let name: String = dir
        .to_string_lossy()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    vec![
        (
            "FENCEGATE_ETCD_ENDPOINTS".into(),
            shared_cluster().endpoints(),
        ),
        ("FENCEGATE_ETCD_PREFIX".into(), format!("/t/{name}/")),
    ]
}

/// The etcd binary: `FENCEGATE_ETCD` or Debian's.
fn etcd_bin() -> String {
    std::env::var("FENCEGATE_ETCD").unwrap_or_else(|_| "/usr/bin/etcd".into())
}

/// `n` distinct free ports (all bound at once, so none is handed out twice).
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("a free port"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("bound").port())
        .collect()
}

/// The PEM files of an etcd member that serves TLS: its certificate and
/// key, and the CA its clients' certificates must be signed by.
#[derive(Debug, Clone)]
pub struct EtcdTls {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    pub ca: std::path::PathBuf,
}

/// One member process.
#[derive(Debug)]
pub struct Member {
    pub name: String,
    pub client_url: String,
    child: Child,
    /// How it was started, to start it again ([`EtcdCluster::restart`]).
    args: Vec<std::ffi::OsString>,
    data_dir: std::path::PathBuf,
    log: std::path::PathBuf,
}

impl Member {
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pid fits")
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig)
            .expect("signal delivered");
    }

    /// SIGSTOP: the member is paused, its sockets stay open.
    pub fn pause(&self) {
        self.signal(nix::sys::signal::Signal::SIGSTOP);
    }

    pub fn resume(&self) {
        self.signal(nix::sys::signal::Signal::SIGCONT);
    }

    /// `maintenance/status` through the JSON gateway: (member id, leader id).
    pub fn status(&self) -> Option<(String, String)> {
        let resp = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(1))
            .build()
            .ok()?
            .post(format!("{}/v3/maintenance/status", self.client_url))
            .body("{}")
            .send()
            .ok()?;
        let v: Value = resp.json().ok()?;
        Some((
            v["header"]["member_id"].as_str()?.to_owned(),
            v["leader"].as_str()?.to_owned(),
        ))
    }
}

fn spawn_member(args: &[std::ffi::OsString], log: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log file");
    Command::new(etcd_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start {}: {e} (scripts/install-test-tools.sh installs Debian's etcd-server)",
                etcd_bin()
            )
        })
}

/// A running cluster of real etcd members.
#[derive(Debug)]
pub struct EtcdCluster {
    pub members: Vec<Member>,
    watchdog: Child,
    _dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts `n` members and waits until the cluster has a leader.
    pub fn start(n: usize) -> EtcdCluster {
        let cluster = EtcdCluster::start_with(n, None);
        cluster.wait_for_leader(Duration::from_secs(30));
        cluster
    }

    /// One member serving its clients over TLS only, requiring a client
    /// certificate signed by `tls.ca` (`--client-cert-auth`). Not waited
    /// for: the harness's status reads are plain HTTP (a replica retries
    /// until etcd answers).
    pub fn start_tls(tls: &EtcdTls) -> EtcdCluster {
        EtcdCluster::start_with(1, Some(tls))
    }

    fn start_with(n: usize, tls: Option<&EtcdTls>) -> EtcdCluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let free = free_ports(2 * n);
        let ports: Vec<(u16, u16)> = free.chunks(2).map(|p| (p[0], p[1])).collect();
        let token = format!(
            "fg-{}-{}",
            std::process::id(),
            dir.path().file_name().expect("name").to_string_lossy()
        );
        let initial: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, p))| format!("m{i}=http://127.0.0.1:{p}"))
            .collect();
        let members: Vec<Member> = ports
            .iter()
            .enumerate()
            .map(|(i, (c, p))| {
                let name = format!("m{i}");
                let scheme = if tls.is_some() { "https" } else { "http" };
                let client_url = format!("{scheme}://127.0.0.1:{c}");
                let peer_url = format!("http://127.0.0.1:{p}");
                let log = dir.path().join(format!("{name}.log"));
                let data_dir = dir.path().join(&name);
                let mut args: Vec<std::ffi::OsString> = Vec::new();
                if let Some(t) = tls {
                    args.extend([
                        "--cert-file".into(),
                        t.cert.clone().into_os_string(),
                        "--key-file".into(),
                        t.key.clone().into_os_string(),
                        "--trusted-ca-file".into(),
                        t.ca.clone().into_os_string(),
                        "--client-cert-auth".into(),
                    ]);
                }
                args.extend(["--name".into(), name.clone().into(), "--data-dir".into()]);
                args.push(data_dir.clone().into_os_string());
                for (flag, value) in [
                    ("--listen-client-urls", client_url.as_str()),
                    ("--advertise-client-urls", client_url.as_str()),
                    ("--listen-peer-urls", peer_url.as_str()),
                    ("--initial-advertise-peer-urls", peer_url.as_str()),
                    ("--initial-cluster", initial.join(",").as_str()),
                    ("--initial-cluster-token", token.as_str()),
                    ("--initial-cluster-state", "new"),
                    ("--heartbeat-interval", "50"),
                    ("--election-timeout", "500"),
                    ("--log-level", "warn"),
                ] {
                    args.push(flag.into());
                    args.push(value.into());
                }
                let child = spawn_member(&args, &log);
                Member {
                    name,
                    client_url,
                    child,
                    args,
                    data_dir,
                    log,
                }
            })
            .collect();
        let pids: Vec<String> = members.iter().map(|m| m.pid().to_string()).collect();
        let watchdog = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "while kill -0 {} 2>/dev/null; do sleep 1; done; kill -9 {} 2>/dev/null; rm -rf '{}'",
                std::process::id(),
                pids.join(" "),
                dir.path().display()
            ))
            .stdin(Stdio::null())
            .spawn()
            .expect("watchdog");
        EtcdCluster {
            members,
            watchdog,
            _dir: dir,
        }
    }

    /// Every member's client URL, comma separated.
    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(|m| m.client_url.clone())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A call of the first member's JSON gateway on `key` (`range`,
    /// `deleterange`): its answer.
    fn gateway(&self, call: &str, key: &str) -> serde_json::Value {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        reqwest::blocking::Client::new()
            .post(format!("{}/v3/kv/{call}", self.members[0].client_url))
            .json(&serde_json::json!({ "key": b64.encode(key) }))
            .send()
            .and_then(|r| r.json())
            .unwrap_or_else(|e| panic!("etcd {call}: {e}"))
    }

    /// Compacts the history up to the current revision (as an operator's
    /// `etcdctl compact`): a watch from an older revision is refused.
    pub fn compact(&self) {
        let now = self.gateway("range", "/")["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse::<u64>().ok())
            .expect("a revision");
        let answer: serde_json::Value = reqwest::blocking::Client::new()
            .post(format!("{}/v3/kv/compaction", self.members[0].client_url))
            .json(&serde_json::json!({ "revision": now.to_string(), "physical": true }))
            .send()
            .and_then(|r| r.json())
            .unwrap_or_else(|e| panic!("etcd compaction: {e}"));
        assert!(answer["header"].is_object(), "etcd compaction: {answer}");
    }

    /// The value of `key`, read through the first member's JSON gateway.
    pub fn value(&self, key: &str) -> Option<String> {
        use base64::Engine as _;
        let v = self.gateway("range", key);
        let value = v["kvs"][0]["value"].as_str()?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(value)
            .expect("base64");
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Puts `value` at `key` (as `etcdctl put` would) through the first
    /// member's JSON gateway; the revision of this write (the key's
    /// `mod_revision`).
    pub fn put(&self, key: &str, value: &str) -> u64 {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let put: serde_json::Value = reqwest::blocking::Client::new()
            .post(format!("{}/v3/kv/put", self.members[0].client_url))
            .json(&serde_json::json!({ "key": b64.encode(key), "value": b64.encode(value) }))
            .send()
            .and_then(|r| r.json())
            .unwrap_or_else(|e| panic!("etcd put: {e}"));
        assert!(put["header"]["revision"].is_string(), "etcd put: {put}");
        let read = self.gateway("range", key);
        read["kvs"][0]["mod_revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| panic!("{key} after a put: {read}"))
    }

    /// Deletes `key` (as an operator would with `etcdctl del`), through
    /// the first member's JSON gateway.
    pub fn delete(&self, key: &str) {
        let v = self.gateway("deleterange", key);
        assert_eq!(v["deleted"].as_str(), Some("1"), "{key} was there: {v}");
    }

    /// The index of the member that leads now, as the members not paused
    /// agree on it.
    pub fn leader(&self) -> Option<usize> {
        let statuses: Vec<_> = self.members.iter().map(Member::status).collect();
        let leader = statuses.iter().flatten().map(|(_, l)| l.clone()).next()?;
        statuses
            .iter()
            .position(|s| s.as_ref().is_some_and(|(id, _)| *id == leader))
    }

    /// Waits until a leader is elected and every member answers.
    pub fn wait_for_leader(&self, within: Duration) -> usize {
        let deadline = Instant::now() + within;
        loop {
            if let Some(l) = self.leader()
                && self.members.iter().all(|m| m.status().is_some())
            {
                return l;
            }
            if Instant::now() >= deadline {
                let logs: Vec<String> = self
                    .members
                    .iter()
                    .map(|m| {
                        let log = std::fs::read_to_string(
                            self._dir.path().join(format!("{}.log", m.name)),
                        )
                        .unwrap_or_default();
                        let tail: Vec<&str> = log.lines().rev().take(10).collect();
                        format!("{} ({}):\n{}", m.name, m.client_url, tail.join("\n"))
                    })
                    .collect();
                panic!(
                    "the etcd cluster elected no leader within {within:?}; statuses {:?}; logs:\n{}",
                    self.members.iter().map(Member::status).collect::<Vec<_>>(),
                    logs.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl EtcdCluster {
    /// Kills member `i` (kill -9), lets `between` act on its data
    /// directory while it is down, and starts it again on the same ports
    /// and directory; waits until the cluster answers. With one member,
    /// `between` copying the directory away takes a backup, and copying
    /// one back restores it.
    pub fn restart(&mut self, i: usize, between: impl FnOnce(&Path)) {
        let m = &mut self.members[i];
        let _ = m.child.kill();
        let _ = m.child.wait();
        between(&m.data_dir);
        m.child = spawn_member(&m.args, &m.log);
        let pid = m.child.id();
        // The watchdog knows the first pids only: this one gets its own.
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "while kill -0 {} 2>/dev/null; do sleep 1; done; kill -9 {pid} 2>/dev/null",
                std::process::id()
            ))
            .stdin(Stdio::null())
            .spawn();
        self.wait_for_leader(Duration::from_secs(30));
    }
}

/// `cp -a from to`: a directory copied whole, as a backup tool would.
pub fn copy_dir(from: &Path, to: &Path) {
    let ok = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("cp");
    assert!(ok.success(), "cp -a {} {}", from.display(), to.display());
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
        for m in &mut self.members {
            let _ = m.child.kill();
            let _ = m.child.wait();
        }
    }
}
