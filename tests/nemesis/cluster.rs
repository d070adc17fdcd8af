//! The system under the nemesis, every process in a network namespace of
//! its own (`support::netns`): 3 etcd members, 2 lease-service replicas
//! on them, 3 proxy replicas sharing their fences through them, and the
//! store. The clients are the test process, on the same bridge.

use crate::support;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::netns::Lab;

pub const BUCKET: &str = "backups";
/// The probe's bucket and lock (`clients::probe`).
pub const PROBE_BUCKET: &str = "probe";
pub const ETCD: [usize; 3] = [0, 1, 2];
pub const LOCKSVC: [usize; 2] = [3, 4];
pub const PROXIES: [usize; 3] = [5, 6, 7];
pub const STORE: usize = 8;
pub const NODES: usize = 9;
/// The store's keys (`fencegate dev`'s s3s-fs).
pub const STORE_KEY: (&str, &str) = ("fencegate-backend", "fencegate-backend-secret");

/// Waits up to 30 s until something listens at `addr`.
pub fn wait_listening(addr: SocketAddr, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(Instant::now() < deadline, "{what} never listened at {addr}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A process in a node's namespace, which the nemesis may stop, continue,
/// kill and start again as it was.
#[derive(Debug)]
pub struct Proc {
    pub name: String,
    netns: String,
    program: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
    listens: SocketAddr,
    child: Option<Child>,
}

impl Proc {
    /// Starts it (again, unless it runs) and waits until it listens.
    pub fn start(&mut self) {
        if self.child.is_some() {
            return;
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log");
        let child = Command::new("ip")
            .args(["netns", "exec", &self.netns, &self.program])
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("{} in a namespace: {e}", self.name));
        self.child = Some(child);
        wait_listening(self.listens, &self.name);
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        if let Some(c) = &self.child {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(c.id()).expect("pid"));
            let _ = nix::sys::signal::killpg(pid, sig);
        }
    }

    pub fn pause(&self) {
        self.signal(nix::sys::signal::Signal::SIGSTOP);
    }

    pub fn resume(&self) {
        self.signal(nix::sys::signal::Signal::SIGCONT);
    }

    /// kill -9, and reaps it.
    pub fn kill9(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGKILL);
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }

    /// Whether it died by itself (not killed by the nemesis).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.resume();
        self.kill9();
    }
}

/// The whole system; everything is stopped and removed on drop.
pub struct Cluster {
    /// Indexed by node (they are pushed in node order).
    pub procs: Vec<Proc>,
    pub lab: Lab,
    pub etcd: Vec<String>,
    pub locksvc: Vec<String>,
    pub proxies: Vec<String>,
    pub store: String,
    /// Data and logs, removed once the processes are gone.
    _dir: tempfile::TempDir,
}

impl Cluster {
    pub fn start() -> Cluster {
        let lab = Lab::new(NODES);
        let dir = support::tempdir();
        let ip = |i: usize| lab.nodes[i].ip;
        let proc = |i: usize, name: String, program: &str, args: Vec<String>, port: u16| Proc {
            name,
            netns: lab.nodes[i].netns.clone(),
            program: program.to_owned(),
            args,
            env: vec![
                ("FENCEGATE_LOG".into(), "warn".into()),
                ("FENCEGATE_SIGNING_KEYS".into(), support::SIGNING_KEY.into()),
            ],
            log: dir.path().join(format!("node{i}.log")),
            listens: SocketAddr::new(ip(i).into(), port),
            child: None,
        };
        let url = |i: usize, port: u16| format!("http://{}:{port}", ip(i));
        let etcd: Vec<String> = ETCD.iter().map(|&i| url(i, 2379)).collect();
        let initial: Vec<String> = ETCD
            .iter()
            .map(|&i| format!("e{i}=http://{}:2380", ip(i)))
            .collect();
        let mut procs: Vec<Proc> = ETCD
            .iter()
            .map(|&i| {
                proc(
                    i,
                    format!("etcd member e{i}"),
                    "/usr/bin/etcd",
                    vec![
                        format!("--name=e{i}"),
                        format!(
                            "--data-dir={}",
                            dir.path().join(format!("etcd{i}")).display()
                        ),
                        format!("--listen-client-urls={}", url(i, 2379)),
                        format!("--advertise-client-urls={}", url(i, 2379)),
                        format!("--listen-peer-urls={}", url(i, 2380)),
                        format!("--initial-advertise-peer-urls={}", url(i, 2380)),
                        format!("--initial-cluster={}", initial.join(",")),
                        "--heartbeat-interval=100".into(),
                        "--election-timeout=1000".into(),
                        // etcd 3.4's default is off (3.5's is on): a
                        // member back from a partition then bumps the
                        // term and unseats the leader, an election
                        // every heal (README, "Following ... etcd").
                        "--pre-vote=true".into(),
                    ],
                    2379,
                )
            })
            .collect();
        // A long run may name a copy of the binary, so that a rebuild
        // meanwhile does not change what a restarted process runs.
        let fencegate = std::env::var("FENCEGATE_NEMESIS_BINARY")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_fencegate").to_owned());
        let fencegate = fencegate.as_str();
        for &i in &LOCKSVC {
            let config = support::write_file(
                dir.path(),
                &format!("locksvc{i}.toml"),
                format!(
                    "[etcd]\nendpoints = {etcd:?}\nprefix = \"/fg-leases/\"\nrequest_timeout = \"2s\"\n"
                ),
            );
            procs.push(proc(
                i,
                format!("lease service {i}"),
                fencegate,
                vec![
                    "locksvc".into(),
                    "--listen".into(),
                    format!("{}:7070", ip(i)),
                    "--config".into(),
                    config.display().to_string(),
                ],
                7070,
            ));
        }
        let store = url(STORE, 9000);
        for &i in &PROXIES {
            let config = support::write_file(
                dir.path(),
                &format!("proxy{i}.toml"),
                proxy_toml(i, &store, &etcd, ip(i), dir.path()),
            );
            procs.push(proc(
                i,
                format!("proxy {i}"),
                fencegate,
                vec![
                    "proxy".into(),
                    "--create-db".into(),
                    "--config".into(),
                    config.display().to_string(),
                ],
                9000,
            ));
        }
        procs.push(proc(
            STORE,
            "the store".into(),
            fencegate,
            vec![
                "dev".into(),
                format!("--data-dir={}", dir.path().join("store").display()),
                format!("--backend-listen={}:9000", ip(STORE)),
                "--locksvc-listen=127.0.0.1:0".into(),
                "--proxy-listen=127.0.0.1:0".into(),
            ],
            9000,
        ));
        // etcd members wait for each other: start them all, then wait.
        let (first, rest) = procs.split_at_mut(3);
        std::thread::scope(|s| {
            for p in first {
                s.spawn(|| p.start());
            }
        });
        // The store before the proxies (they probe it at start).
        rest.last_mut().expect("the store").start();
        for p in rest.iter_mut().filter(|p| p.child.is_none()) {
            p.start();
        }
        Cluster {
            procs,
            etcd,
            locksvc: LOCKSVC.iter().map(|&i| url(i, 7070)).collect(),
            proxies: PROXIES.iter().map(|&i| url(i, 9000)).collect(),
            store,
            lab,
            _dir: dir,
        }
    }

    /// The process of node `i`.
    pub fn proc(&mut self, i: usize) -> &mut Proc {
        &mut self.procs[i]
    }

    /// Every process's log, for a failure message.
    pub fn logs(&self) -> String {
        self.procs
            .iter()
            .map(|p| format!("==> {}\n{}", p.name, tail(&p.log(), 40)))
            .collect()
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n") + "\n"
}

/// Proxy `i`'s config: a replica of the cluster on `etcd`, in front of
/// `store`, with the default cluster timings (a 10 s registration, a
/// 21 s lock delay): the figures are those an operator gets.
fn proxy_toml(
    i: usize,
    store: &str,
    etcd: &[String],
    ip: std::net::Ipv4Addr,
    dir: &Path,
) -> String {
    let toml = fencegate_testkit::config::ProxyToml {
        db: &dir.join(format!("proxy{i}.db")),
        signing_key: support::SIGNING_KEY,
        probe_bucket: BUCKET,
        endpoint: store,
        backend_key: STORE_KEY,
        client_key: support::s3::CLIENT_KEY,
        extra: &format!("listen = \"{ip}:9000\"\nallow_anonymous = true"),
    }
    .text()
    .replace(
        &format!("endpoint = \"{store}\""),
        &format!("endpoint = \"{store}\"\nregion = \"us-east-1\"\npath_style = true"),
    );
    format!(
        "{toml}\n[cluster]\nendpoints = {etcd:?}\nprefix = \"/fg-nemesis/\"\nreplica_id = \"p{i}\"\n"
    )
}
