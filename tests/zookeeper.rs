//! Locks that follow a ZooKeeper election (`[[elections]]` with
//! `zookeeper_lock`): a real ZooKeeper 3.8, kazoo `Lock` holders as real
//! processes, a real proxy process. The token is the czxid of the holder's
//! lock znode; the proxy reads the lock itself (after a `sync`) and admits
//! nothing on a client's word.

mod support;

use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::process::CommandExt as _;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;
use support::harness::BUCKET;
use support::s3::*;
use support::zookeeper::ZooKeeperServer;

const LOCK_PATH: &str = "/locks/backups";

/// A kazoo client holding (or waiting for) the lock, run as its own
/// process (tests/clients/kazoo_holder.py).
struct Holder {
    child: support::KillOnDrop,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl Holder {
    fn start(zk: &ZooKeeperServer, identity: &str, proxy: &Proxy) -> Holder {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/kazoo_holder.py");
        let mut child = Command::new(venv_bin("python"))
            .arg(script)
            .args([&zk.hosts, LOCK_PATH, identity, &proxy.url, BUCKET, "1.0"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()
            .expect(
                "the kazoo holder starts (scripts/install-test-tools.sh installs kazoo in .venv)",
            );
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Holder {
            child: support::KillOnDrop(child),
            stdin,
            lines,
        }
    }

    /// The next line it prints, within `limit`.
    fn line(&self, limit: Duration) -> Option<String> {
        self.lines.recv_timeout(limit).ok()
    }

    /// Its token, once it holds the lock (within `limit`).
    fn token(&self, limit: Duration) -> u64 {
        let line = self.line(limit).expect("the holder took the lock in time");
        line.strip_prefix("TOKEN ")
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("not a token line: {line}"))
    }

    /// PUTs `key` with its token: the status and the body.
    fn put(&mut self, key: &str) -> (u16, String) {
        writeln!(self.stdin, "put {key}").expect("the holder reads");
        let line = self
            .line(Duration::from_secs(20))
            .expect("the holder answers");
        let rest = line.strip_prefix("STATUS ").expect("a status line");
        let (code, body) = rest.split_once(' ').unwrap_or((rest, ""));
        (code.parse().expect("a status code"), body.to_owned())
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        self.child.signal(sig);
    }
}

/// `key` holds what `who`'s holder wrote with `token`.
async fn assert_written_by(backend: &Backend, key: &str, who: &str, token: u64) {
    let body = format!("written by {who} with {token}");
    assert_stored(backend, BUCKET, key, body.as_bytes(), token).await;
}

/// A store with the bucket, and a proxy whose bucket's lock follows the
/// ZooKeeper lock at `LOCK_PATH`.
async fn proxy_following(zk: &ZooKeeperServer, dir: &std::path::Path) -> (Backend, Proxy) {
    let backend = Backend::start(BackendKind::S3Fs).await;
    backend.create_bucket(BUCKET).await;
    let elections = format!(
        "[[elections]]\nlock = \"{BUCKET}\"\nzookeeper_lock = \"{LOCK_PATH}\"\nendpoints = [\"{}\"]\nrequest_timeout = \"2s\"\n",
        zk.hosts
    );
    let proxy = Proxy::start(&proxy_toml(&backend, dir, BUCKET, &elections), dir).await;
    (backend, proxy)
}

/// The lock's holders as ZooKeeper has them now (its children's data).
fn holders(zk: &ZooKeeperServer) -> Vec<String> {
    let out = Command::new(venv_bin("python"))
        .arg("-c")
        .arg(format!(
            "from kazoo.client import KazooClient\nzk=KazooClient(hosts='{}'); zk.start(timeout=10)\n\
             print(' '.join(zk.get('{LOCK_PATH}/'+c)[0].decode() for c in sorted(zk.get_children('{LOCK_PATH}'))))",
            zk.hosts
        ))
        .output()
        .expect("kazoo runs");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// Waits up to 20 s until ZooKeeper shows exactly `expected` in line.
fn wait_for_holders(zk: &ZooKeeperServer, expected: &[&str]) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let now = holders(zk);
        if now == expected {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the lock never showed {expected:?}: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// kazoo holder A pauses past its session, and ZooKeeper deletes its lock
/// znode: A's writes are refused when it wakes (nobody holds). B takes the
/// lock: the proxy, watching the lock, raises the fence to B's token before
/// B writes, and A is stale from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_session_expired_is_refused() {
    let zk = tokio::task::block_in_place(ZooKeeperServer::start);
    let dir = support::tempdir();
    let (backend, proxy) = proxy_following(&zk, dir.path()).await;

    // No holder: nothing is admitted.
    let (status, text, _) = plain_put(&proxy, "wal/0", "4").await;
    assert_eq!(status, 403, "{text}");
    fencegate_testkit::assert_mentions(&text, &[LOCK_PATH, "no holder"]);

    let mut a = tokio::task::block_in_place(|| Holder::start(&zk, "node-a", &proxy));
    let token_a = tokio::task::block_in_place(|| a.token(Duration::from_secs(30)));
    let (status, body) = tokio::task::block_in_place(|| a.put("wal/1"));
    assert_eq!(status, 200, "{body}");
    assert_written_by(&backend, "wal/1", "node-a", token_a).await;

    // The CLI reads the same lock: the token for A's identifier, exit 3
    // for anyone else.
    let token = |identity: &str| {
        support::fencegate()
            .args(["election", "token", "--endpoints", &zk.hosts])
            .args(["--zookeeper-lock", LOCK_PATH, "--identity", identity])
            .output()
            .expect("runs")
    };
    let held = tokio::task::block_in_place(|| token("node-a"));
    assert!(held.status.success(), "{}", support::output_text(&held));
    assert_eq!(
        String::from_utf8_lossy(&held.stdout).trim(),
        token_a.to_string()
    );
    let other = tokio::task::block_in_place(|| token("node-b"));
    assert_eq!(
        other.status.code(),
        Some(3),
        "{}",
        support::output_text(&other)
    );
    fencegate_testkit::assert_mentions(&support::output_text(&other), &["node-a", LOCK_PATH]);

    // A pauses (a GC, a VM stall) past its 1 s session: ZooKeeper expires
    // it and deletes its znode. A wakes and writes: refused, nobody holds.
    a.signal(nix::sys::signal::Signal::SIGSTOP);
    tokio::task::block_in_place(|| wait_for_holders(&zk, &[]));
    a.signal(nix::sys::signal::Signal::SIGCONT);
    let (status, body) = tokio::task::block_in_place(|| a.put("wal/2"));
    assert_eq!(status, 403, "{body}");
    fencegate_testkit::assert_mentions(&body, &[LOCK_PATH, "no holder"]);

    // B takes the lock: the proxy raises the fence to B's term itself,
    // before B writes; A is stale.
    let mut b = tokio::task::block_in_place(|| Holder::start(&zk, "node-b", &proxy));
    let token_b = tokio::task::block_in_place(|| b.token(Duration::from_secs(30)));
    assert!(
        token_b > token_a,
        "B's token {token_b} is not above A's {token_a}"
    );
    proxy.wait_for_max(BUCKET, token_b).await;
    let (status, body) = tokio::task::block_in_place(|| a.put("wal/2"));
    assert_eq!(status, 409, "{body}");
    assert_eq!(stored(&backend, BUCKET, "wal/2").await, None);
    let (status, body) = tokio::task::block_in_place(|| b.put("wal/2"));
    assert_eq!(status, 200, "{body}");
    assert_written_by(&backend, "wal/2", "node-b", token_b).await;

    // A number above B's, made up: not the holder's.
    let (status, text, _) = plain_put(&proxy, "wal/4", &(token_b + 1000).to_string()).await;
    assert_eq!(status, 403, "{text}");
    fencegate_testkit::assert_mentions(&text, &["node-b"]);
    assert_eq!(stored(&backend, BUCKET, "wal/4").await, None);
}

/// A's upload is in flight when its session expires and B takes the lock:
/// the proxy's raise to B's term cuts it; nothing of it lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_in_flight_when_the_session_expires_is_cut() {
    let zk = tokio::task::block_in_place(ZooKeeperServer::start);
    let dir = support::tempdir();
    let (backend, proxy) = proxy_following(&zk, dir.path()).await;
    let a = tokio::task::block_in_place(|| Holder::start(&zk, "node-a", &proxy));
    let token_a = tokio::task::block_in_place(|| a.token(Duration::from_secs(30)));
    proxy.wait_for_max(BUCKET, token_a).await;
    let upload = proxy
        .stalled_put((BUCKET, "segment"), &token_a.to_string())
        .await;
    a.signal(nix::sys::signal::Signal::SIGSTOP);
    let b = tokio::task::block_in_place(|| Holder::start(&zk, "node-b", &proxy));
    let token_b = tokio::task::block_in_place(|| b.token(Duration::from_secs(30)));
    proxy.wait_for_max(BUCKET, token_b).await;
    let _ = upload.rest.send(());
    let code = upload.answer.await.expect("joined");
    assert!(matches!(code, 409 | 503 | 0), "A's upload got {code}");
    assert_eq!(stored(&backend, BUCKET, "segment").await, None);
}

/// The lock's znodes deleted by hand: no holder, nothing admitted. The
/// ensemble gone: 503, nothing admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_deleted_by_hand_or_zookeeper_gone_admits_nothing() {
    let mut zk = tokio::task::block_in_place(ZooKeeperServer::start);
    let dir = support::tempdir();
    let (backend, proxy) = proxy_following(&zk, dir.path()).await;
    let a = tokio::task::block_in_place(|| Holder::start(&zk, "node-a", &proxy));
    let token = tokio::task::block_in_place(|| a.token(Duration::from_secs(30)));
    let (status, text, _) = plain_put(&proxy, "k", &token.to_string()).await;
    assert_eq!(status, 200, "{text}");

    // An operator removes the lock's children (zkCli `deleteall`).
    let deleted = Command::new(venv_bin("python"))
        .arg("-c")
        .arg(format!(
            "from kazoo.client import KazooClient\nzk=KazooClient(hosts='{}'); zk.start(timeout=10)\n\
             [zk.delete('{LOCK_PATH}/'+c) for c in zk.get_children('{LOCK_PATH}')]",
            zk.hosts
        ))
        .status()
        .expect("kazoo runs");
    assert!(deleted.success());
    let (status, text, _) = plain_put(&proxy, "k", &token.to_string()).await;
    assert_eq!(status, 403, "{text}");
    fencegate_testkit::assert_mentions(&text, &["no holder"]);

    tokio::task::block_in_place(|| zk.kill());
    let (status, text, _) = plain_put(&proxy, "k2", &token.to_string()).await;
    assert_eq!(status, 503, "{text}");
    fencegate_testkit::assert_mentions(&text, &[LOCK_PATH]);
    assert_eq!(stored(&backend, BUCKET, "k2").await, None);
}

/// An anonymous PUT with `Fencing-Token: token`: status, body, max.
async fn plain_put(proxy: &Proxy, key: &str, token: &str) -> (u16, String, Option<String>) {
    anonymous_put(proxy, (BUCKET, key), token, "x".to_owned()).await
}
