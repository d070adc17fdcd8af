//! The lease service on etcd when things fail: real `fencegate locksvc`
//! replicas on a real 3-member etcd cluster (Debian's etcd 3.4), members
//! paused with SIGSTOP, the quorum lost, a replica killed with kill -9, a
//! migration from SQLite, and replicas with an old epoch.
//!
//! Under load, every answer is recorded and two promises are checked:
//! - no token goes back: each client's successive grants rise, and no
//!   token is granted twice;
//! - no two live holders: on a shared lock, ordered by token, each grant
//!   is answered only after the previous holder sent its release.
//!
//! The tests run one at a time: they pause members, and two clusters
//! electing leaders at once on two cores would measure the machine.

mod support;

use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use support::etcd::EtcdCluster;
use support::*;

fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A lease service replica on `cluster` under `prefix`, configured by a
/// TOML file in `dir` (the `[etcd]` table, as an operator writes it).
fn replica_cmd(dir: &Path, cluster: &EtcdCluster, prefix: &str, epoch: u16) -> Command {
    replica_cmd_with(dir, cluster, prefix, epoch, "")
}

fn replica_cmd_with(
    dir: &Path,
    cluster: &EtcdCluster,
    prefix: &str,
    epoch: u16,
    extra: &str,
) -> Command {
    let endpoints: Vec<String> = cluster
        .members
        .iter()
        .map(|m| m.client_url.clone())
        .collect();
    replica_cmd_on(dir, &endpoints, prefix, epoch, extra)
}

/// A replica that reaches etcd on `endpoints`, tried in this order.
fn replica_cmd_on(
    dir: &Path,
    endpoints: &[String],
    prefix: &str,
    epoch: u16,
    extra: &str,
) -> Command {
    let endpoints: Vec<String> = endpoints.iter().map(|e| format!("{e:?}")).collect();
    let path = dir.join(format!("locksvc-{epoch}.toml"));
    std::fs::write(
        &path,
        format!(
            "[etcd]\nendpoints = [{}]\nprefix = {prefix:?}\nepoch = {epoch}\nrequest_timeout = \"2s\"\n{extra}\n",
            endpoints.join(", ")
        ),
    )
    .expect("config");
    let mut cmd = fencegate();
    cmd.args(["locksvc", "--listen", "127.0.0.1:0", "--config"])
        .arg(path)
        .env("FENCEGATE_SIGNING_KEYS", SIGNING_KEY)
        .env("FENCEGATE_LOG", "warn");
    cmd
}

fn replica(dir: &Path, cluster: &EtcdCluster) -> Service {
    Service::start(replica_cmd(dir, cluster, "/ha/", 0))
}

/// Waits (up to 10 s) until `lock`'s line, as `api`'s replica reports it,
/// holds `n` waiters.
fn wait_for_line(api: &Api, lock: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while api.status(lock).1["waiting"] != n {
        assert!(
            Instant::now() < deadline,
            "{lock}: {n} waiters never queued"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What one client saw of one grant.
#[derive(Debug, Clone)]
struct Grant {
    lock: String,
    token: u64,
    answered: Instant,
    release_sent: Option<Instant>,
}

/// Clients taking and releasing leases until stopped, recording every
/// grant and every answer that was not a success.
struct Load {
    stop: Arc<AtomicBool>,
    grants: Arc<Mutex<Vec<Grant>>>,
    failures: Arc<Mutex<Vec<String>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    /// `clients` threads, client `c` talking to `urls[c % len]`. Each
    /// takes `lock_of(c)` with a wait (contended locks queue), holds it
    /// briefly and releases it.
    fn start(urls: &[String], clients: usize, lock_of: fn(usize) -> String) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let grants: Arc<Mutex<Vec<Grant>>> = Arc::default();
        let failures: Arc<Mutex<Vec<String>>> = Arc::default();
        let threads = (0..clients)
            .map(|c| {
                let (stop, grants, failures) = (stop.clone(), grants.clone(), failures.clone());
                let api = Api::new(&urls[c % urls.len()]);
                let lock = lock_of(c);
                std::thread::spawn(move || {
                    let mut last = 0;
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        i += 1;
                        let (s, v) = api.acquire_wait(&lock, &format!("c{c}-{i}"), 10_000, 5000);
                        if s != 200 {
                            failures
                                .lock()
                                .expect("lock")
                                .push(format!("acquire {s}: {v}"));
                            std::thread::sleep(Duration::from_millis(50));
                            continue;
                        }
                        let token = token_of(&v);
                        assert!(token > last, "client {c}: token {token} after {last}");
                        last = token;
                        let answered = Instant::now();
                        std::thread::sleep(Duration::from_millis(5));
                        let release_sent = Instant::now();
                        let (s, r) = api.release(&lock, signed_of(&v));
                        if s != 200 {
                            failures
                                .lock()
                                .expect("lock")
                                .push(format!("release {s}: {r}"));
                        }
                        grants.lock().expect("lock").push(Grant {
                            lock: lock.clone(),
                            token,
                            answered,
                            release_sent: (s == 200).then_some(release_sent),
                        });
                    }
                })
            })
            .collect();
        Load {
            stop,
            grants,
            failures,
            threads,
        }
    }

    fn grants(&self) -> usize {
        self.grants.lock().expect("lock").len()
    }

    /// Waits until `n` more grants than now were recorded.
    fn wait_for(&self, n: usize, within: Duration) {
        let target = self.grants() + n;
        let deadline = Instant::now() + within;
        while self.grants() < target {
            assert!(
                Instant::now() < deadline,
                "only {} of {target} grants within {within:?}; failures: {:?}",
                self.grants(),
                self.failures.lock().expect("lock")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the clients; checks both promises; returns the grants and
    /// the failures.
    fn finish(self) -> (Vec<Grant>, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().expect("a client panicked");
        }
        let grants = self.grants.lock().expect("lock").clone();
        let failures = self.failures.lock().expect("lock").clone();
        let mut tokens: Vec<u64> = grants.iter().map(|g| g.token).collect();
        tokens.sort_unstable();
        let n = tokens.len();
        tokens.dedup();
        assert_eq!(tokens.len(), n, "a token was granted twice");
        let mut by_lock = grants.clone();
        by_lock.sort_by_key(|g| (g.lock.clone(), g.token));
        for pair in by_lock.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            if a.lock != b.lock {
                continue;
            }
            if let Some(sent) = a.release_sent {
                assert!(
                    b.answered > sent,
                    "two live holders of {}: token {} was granted before token {} was released",
                    a.lock,
                    b.token,
                    a.token
                );
            }
        }
        (grants, failures)
    }
}

#[test]
fn two_replicas_serve_the_same_locks_and_the_same_line() {
    let _one = one_at_a_time();
    let dir = tempdir();
    let cluster = EtcdCluster::start(3);
    let (r1, r2) = (replica(dir.path(), &cluster), replica(dir.path(), &cluster));
    let (a1, a2) = (Api::new(&r1.url), Api::new(&r2.url));

    let (s, a) = a1.acquire("shared", "A", 10_000);
    assert_eq!(s, 200, "{a}");
    let (s, refused) = a2.acquire("shared", "B", 10_000);
    assert_eq!(
        (s, &refused["error"]["holder"]),
        (409, &json!("A")),
        "{refused}"
    );
    let (s, renewed) = a2.renew("shared", signed_of(&a), 10_000);
    assert_eq!((s, token_of(&renewed)), (200, token_of(&a)), "{renewed}");

    // W1 waits on replica 1, then W2 on replica 2: the line is one line.
    let w1 = {
        let a1 = a1.clone();
        std::thread::spawn(move || a1.acquire_wait("shared", "W1", 10_000, 20_000))
    };
    wait_for_line(&a2, "shared", 1);
    let w2 = {
        let a2 = a2.clone();
        std::thread::spawn(move || a2.acquire_wait("shared", "W2", 10_000, 20_000))
    };
    wait_for_line(&a1, "shared", 2);
    // The release on replica 1 goes to the first in line, W1.
    assert_eq!(a1.release("shared", signed_of(&a)).0, 200);
    let (s, w1) = w1.join().expect("W1");
    assert_eq!((s, w1["owner"].as_str()), (200, Some("W1")), "{w1}");
    assert!(token_of(&w1) > token_of(&a));
    // A newcomer is refused while W1 holds it and W2 waits.
    let (s, late) = a2.acquire("shared", "late", 10_000);
    assert_eq!(s, 409, "{late}");
    assert_eq!(a2.release("shared", signed_of(&w1)).0, 200);
    let (s, w2) = w2.join().expect("W2");
    assert_eq!((s, w2["owner"].as_str()), (200, Some("W2")), "{w2}");
    assert!(token_of(&w2) > token_of(&w1));
}

#[test]
fn a_paused_follower_costs_no_request() {
    let _one = one_at_a_time();
    let dir = tempdir();
    let cluster = EtcdCluster::start(3);
    let replicas = [replica(dir.path(), &cluster), replica(dir.path(), &cluster)];
    let urls: Vec<String> = replicas.iter().map(|r| r.url.clone()).collect();
    let load = Load::start(&urls, 4, |c| format!("own-{c}"));
    load.wait_for(20, Duration::from_secs(30));

    let leader = cluster.leader().expect("a leader");
    let follower = (leader + 1) % 3;
    cluster.members[follower].pause();
    let before = load.grants();
    std::thread::sleep(Duration::from_secs(3));
    let during = load.grants() - before;
    cluster.members[follower].resume();
    load.wait_for(20, Duration::from_secs(30));
    let (grants, failures) = load.finish();
    assert!(
        failures.is_empty(),
        "a paused follower cost {} requests: {failures:?}",
        failures.len()
    );
    assert!(
        during > 10,
        "only {during} grants while the follower was paused"
    );
    println!(
        "{} grants, {during} while a follower was paused",
        grants.len()
    );
}

/// A grant's first attempt reaches etcd only after its retry on another
/// member was answered and the lease released, as from a member paused
/// with the request in its socket (the paused-follower test above met
/// this by chance). Applied then, it would create a lease nobody holds and
/// keep the lock from the next owner for its TTL: the grant transaction
/// holds only against the lock's last grant its replica had seen, so the
/// late attempt fails.
/// A replica whose first etcd member is reached through a [`Link`] that a
/// test can slow down: with 2 s per call, that member's share is 666 ms,
/// then the call is retried on the next member.
///
/// [`Link`]: support::relay::Link
struct SlowFirstMember {
    link: support::relay::Link,
    api: Api,
    _replica: Service,
    _cluster: EtcdCluster,
    _runtime: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

impl SlowFirstMember {
    fn start() -> SlowFirstMember {
        let dir = tempdir();
        let cluster = EtcdCluster::start(3);
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let target = cluster.members[0]
            .client_url
            .trim_start_matches("http://")
            .to_owned();
        let link = runtime.block_on(support::relay::Link::start(target));
        let endpoints = [
            link.endpoint.clone(),
            cluster.members[1].client_url.clone(),
            cluster.members[2].client_url.clone(),
        ];
        let replica = Service::start(replica_cmd_on(dir.path(), &endpoints, "/ha/", 0, ""));
        let api = Api::new(&replica.url);
        // Connected to the first member, which answers first from now on.
        let (s, warm) = api.acquire("warm", "warm", 10_000);
        assert_eq!(s, 200, "{warm}");
        assert_eq!(api.release("warm", signed_of(&warm)).0, 200);
        SlowFirstMember {
            link,
            api,
            _replica: replica,
            _cluster: cluster,
            _runtime: runtime,
            _dir: dir,
        }
    }

    /// Requests reach the first member 1.2 s late from now on: a call is
    /// answered by the second member at 666 ms, and its first attempt
    /// still lands at 1.2 s.
    fn slow_down(&self) {
        self.link.delay_requests(Duration::from_millis(1_200));
    }

    /// Waits until the late attempts (and the client's cancels after
    /// them) have landed.
    fn let_late_attempts_land(&self) {
        std::thread::sleep(Duration::from_millis(2_500));
        self.link.delay_requests(Duration::ZERO);
    }
}

/// A grant's first attempt reaches etcd only after its retry on another
/// member was answered and the lease released, as from a member paused
/// with the request in its socket (the paused-follower test above met
/// this by chance). Applied then, it would create a lease nobody holds and
/// keep the lock from the next owner for its TTL: the grant transaction
/// holds only against the lock's last grant its replica had seen, so the
/// late attempt fails.
#[test]
fn a_grant_that_reaches_etcd_after_its_retry_takes_nothing() {
    let _one = one_at_a_time();
    let env = SlowFirstMember::start();
    let api = &env.api;
    env.slow_down();
    let started = Instant::now();
    let (s, first) = api.acquire("late", "first", 10_000);
    assert_eq!(s, 200, "{first}");
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "the grant did not go through the slow member first ({:?})",
        started.elapsed()
    );
    assert_eq!(api.release("late", signed_of(&first)).0, 200);
    env.let_late_attempts_land();

    let (s, status) = api.status("late");
    assert_eq!(s, 200, "{status}");
    assert_eq!(
        status["held"], false,
        "the released lock is held again: {status}"
    );
    let (s, next) = api.acquire("late", "next", 10_000);
    assert_eq!(s, 200, "the next owner was refused: {next}");
    assert!(token_of(&next) > token_of(&first));
}

/// A renewal's first attempt lands after a later renewal was answered: it
/// must not take back the time the holder was told it has (else another
/// owner is granted the lock while the holder still believes it holds
/// it). A renewal to a shorter ttl still shortens the lease.
#[test]
fn a_renewal_that_reaches_etcd_late_takes_back_no_time() {
    let _one = one_at_a_time();
    let env = SlowFirstMember::start();
    let api = &env.api;
    let (s, lease) = api.acquire("renewed", "holder", 10_000);
    assert_eq!(s, 200, "{lease}");
    env.slow_down();
    let (s, first) = api.renew("renewed", signed_of(&lease), 30_000);
    assert_eq!(s, 200, "{first}");
    let (s, second) = api.renew("renewed", signed_of(&lease), 60_000);
    assert_eq!(s, 200, "{second}");
    let promised = second["expires_at_ms"].as_u64().expect("expires_at_ms");
    env.let_late_attempts_land();

    let (s, status) = api.status("renewed");
    assert_eq!(s, 200, "{status}");
    assert_eq!(
        status["expires_at_ms"].as_u64(),
        Some(promised),
        "the lease's expiry moved after the holder was told {promised}: {status}"
    );
    // Shortening is still the holder's to ask for.
    let (s, shorter) = api.renew("renewed", signed_of(&lease), 5_000);
    assert_eq!(s, 200, "{shorter}");
    let (_, status) = api.status("renewed");
    assert_eq!(
        status["expires_at_ms"], shorter["expires_at_ms"],
        "{status}"
    );
    assert!(shorter["expires_at_ms"].as_u64() < Some(promised));
}

#[test]
fn a_paused_leader_costs_a_few_requests_and_nothing_else() {
    let _one = one_at_a_time();
    let dir = tempdir();
    let cluster = EtcdCluster::start(3);
    let replicas = [replica(dir.path(), &cluster), replica(dir.path(), &cluster)];
    let urls: Vec<String> = replicas.iter().map(|r| r.url.clone()).collect();
    // Four clients on one lock: the mutual exclusion is checked too.
    let load = Load::start(&urls, 4, |_| "contended".into());
    load.wait_for(20, Duration::from_secs(30));

    // A holder renewing through the pause, on its own lock.
    let api = Api::new(&urls[0]);
    let (s, held) = api.acquire("renewed", "R", 3000);
    assert_eq!(s, 200, "{held}");

    let leader = cluster.leader().expect("a leader");
    cluster.members[leader].pause();
    let paused = Instant::now();
    let mut renew_failures = Vec::new();
    while paused.elapsed() < Duration::from_secs(4) {
        let (s, v) = api.renew("renewed", signed_of(&held), 3000);
        if s != 200 {
            renew_failures.push(format!("renew {s}: {v}"));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    cluster.members[leader].resume();
    cluster.wait_for_leader(Duration::from_secs(30));
    load.wait_for(20, Duration::from_secs(30));
    let (grants, failures) = load.finish();
    println!(
        "{} grants; {} failed requests during the leader's pause: {failures:?}; renewals: {renew_failures:?}",
        grants.len(),
        failures.len()
    );
    assert!(
        failures.len() <= 8,
        "a paused leader cost {} requests: {failures:?}",
        failures.len()
    );
    for f in failures.iter().chain(&renew_failures) {
        assert!(
            f.split_whitespace().nth(1) == Some("503:") && f.contains("StorageUnavailable"),
            "a failure other than a retryable 503: {f}"
        );
    }
    // etcd 3.4.23 may revoke the renewed lease early once the old leader
    // is back (etcd-io/etcd#15247): the holder loses it (liveness), and
    // whoever takes the lock next gets a higher token (safety).
    let (s, v) = api.renew("renewed", signed_of(&held), 3000);
    if s != 200 {
        assert_eq!(v["error"]["code"], "LeaseLost", "{v}");
        let (s, next) = api.acquire("renewed", "next", 3000);
        assert_eq!(s, 200, "{next}");
        assert!(token_of(&next) > token_of(&held));
    } else {
        assert_eq!(token_of(&v), token_of(&held));
    }
}

#[test]
fn without_a_quorum_requests_fail_fast_and_recover_by_themselves() {
    let _one = one_at_a_time();
    let dir = tempdir();
    let cluster = EtcdCluster::start(3);
    let r = replica(dir.path(), &cluster);
    let api = Api::new(&r.url);
    let (s, before) = api.acquire("q", "A", 60_000);
    assert_eq!(s, 200, "{before}");

    let leader = cluster.leader().expect("a leader");
    let lost: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    for i in &lost {
        cluster.members[*i].pause();
    }
    for (what, call) in [
        (
            "acquire",
            Box::new(|| api.acquire("q2", "B", 1000)) as Box<dyn Fn() -> (u16, Value)>,
        ),
        (
            "renew",
            Box::new(|| api.renew("q", signed_of(&before), 60_000)),
        ),
        ("status", Box::new(|| api.status("q"))),
    ] {
        let t = Instant::now();
        let (s, v) = call();
        let took = t.elapsed();
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (503, Some("StorageUnavailable")),
            "{what} without a quorum: {v}"
        );
        assert!(
            took < Duration::from_secs(4),
            "{what} took {took:?} (request_timeout is 2s)"
        );
    }
    for i in &lost {
        cluster.members[*i].resume();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let after = loop {
        let (s, v) = api.acquire("q3", "C", 1000);
        if s == 200 {
            break v;
        }
        assert!(Instant::now() < deadline, "no recovery: {s} {v}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(token_of(&after) > token_of(&before));
    let (s, v) = api.renew("q", signed_of(&before), 60_000);
    assert_eq!((s, token_of(&v)), (200, token_of(&before)), "{v}");
}

#[test]
fn kill_9_of_a_replica_under_load_leaves_the_others_serving() {
    let _one = one_at_a_time();
    let dir = tempdir();
    let cluster = EtcdCluster::start(3);
    let mut doomed = replica(dir.path(), &cluster);
    let survivor = replica(dir.path(), &cluster);
    let (on_doomed, on_survivor) = (Api::new(&doomed.url), Api::new(&survivor.url));

    // A holder, a waiter on the doomed replica, then one on the survivor.
    let (s, h) = on_survivor.acquire("line", "H", 30_000);
    assert_eq!(s, 200, "{h}");
    let w1 = std::thread::spawn(move || {
        let t = Instant::now();
        let r = reqwest::blocking::Client::new()
            .post(format!(
                "{}{}",
                on_doomed.url,
                fencegate_lease_api::path::acquire("line")
            ))
            .json(&fencegate_lease_api::AcquireRequest {
                owner: "W1".into(),
                ttl_ms: Some(10_000),
                wait_ms: Some(30_000),
                idempotency_key: None,
            })
            .send();
        (r.is_err(), t.elapsed())
    });
    wait_for_line(&on_survivor, "line", 1);
    let w2 = {
        let a = on_survivor.clone();
        std::thread::spawn(move || a.acquire_wait("line", "W2", 10_000, 30_000))
    };
    wait_for_line(&on_survivor, "line", 2);
    let load = Load::start(std::slice::from_ref(&survivor.url), 2, |c| {
        format!("load-{c}")
    });
    load.wait_for(10, Duration::from_secs(30));

    doomed.kill9();
    // W1's connection ends with the process: it has its answer at once.
    let (cut, waited) = w1.join().expect("W1");
    assert!(cut, "W1's request must fail when its replica dies");
    assert!(waited < Duration::from_secs(25), "W1 waited {waited:?}");
    // Its place in line goes with its etcd lease, so W2 is next.
    assert_eq!(on_survivor.release("line", signed_of(&h)).0, 200);
    let released = Instant::now();
    let (s, w2) = w2.join().expect("W2");
    assert_eq!((s, w2["owner"].as_str()), (200, Some("W2")), "{w2}");
    assert!(
        released.elapsed() < Duration::from_secs(8),
        "W2 got the lock {:?} after the release (a dead waiter's place lasts 4 s)",
        released.elapsed()
    );
    load.wait_for(10, Duration::from_secs(30));
    let (_, failures) = load.finish();
    assert!(failures.is_empty(), "the survivor failed: {failures:?}");
}

/// `fencegate run --locksvc A,B`: when replica A is killed under a running
/// command, its renewals go on through B, the command finishes, and the
/// lease is released through B; the next run, with A still first in the
/// list, is granted by B.
#[test]
fn fencegate_run_given_both_replicas_outlives_the_first() {
    let _one = one_at_a_time();
    let dir = tempdir();
    let cluster = EtcdCluster::start(3);
    let mut doomed = replica(dir.path(), &cluster);
    let survivor = replica(dir.path(), &cluster);
    let both = format!("{},{}", doomed.url, survivor.url);
    let run = |script: &str| {
        let mut cmd = fencegate();
        cmd.args([
            "run", "--lock", "nightly", "--ttl", "2s", "--grace", "1s", "--",
        ])
        .args(["sh", "-c", script])
        .env("FENCEGATE_LOCKSVC", &both)
        .env("FENCEGATE_LOG", "warn")
        .stderr(std::process::Stdio::piped());
        cmd
    };
    let started = dir.path().join("started");
    let done = dir.path().join("done");
    let script = format!(
        "echo \"$FENCING_TOKEN_NUMBER\" > {}; sleep 7; echo ok > {}",
        started.display(),
        done.display()
    );
    let child = run(&script).spawn().expect("runs");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !started.exists() {
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    doomed.kill9();
    // 7 s is three and a half ttls: every renewal after the kill is B's.
    let out = child.wait_with_output().expect("run exits");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(done.exists(), "the command was stopped before it finished");
    let on_survivor = Api::new(&survivor.url);
    let (s, st) = on_survivor.status("nightly");
    assert_eq!((s, &st["held"]), (200, &json!(false)), "released: {st}");

    // A (dead) is still first in the list: the acquire moves on to B.
    let first: u64 = std::fs::read_to_string(&started)
        .expect("token")
        .trim()
        .parse()
        .expect("number");
    let out = run(&format!(
        "echo \"$FENCING_TOKEN_NUMBER\" > {}",
        started.display()
    ))
    .output()
    .expect("runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let second: u64 = std::fs::read_to_string(&started)
        .expect("token")
        .trim()
        .parse()
        .expect("number");
    assert!(second > first, "{second} after {first}");
}

#[test]
fn migrate_moves_the_counter_and_the_live_leases_to_etcd() {
    let _one = one_at_a_time();
    let dir = tempdir();
    // The SQLite service issues some tokens; one lease stays live.
    let mut sqlite = Service::start({
        let mut cmd = fencegate();
        cmd.args(["locksvc", "--create-db", "--listen", "127.0.0.1:0", "--db"])
            .arg(dir.path().join("old.db"))
            .env("FENCEGATE_SIGNING_KEYS", SIGNING_KEY)
            .env("FENCEGATE_LOG", "warn");
        cmd
    });
    let old = Api::new(&sqlite.url);
    for i in 0..5 {
        let (_, v) = old.acquire(&format!("gone-{i}"), "x", 10);
        assert!(token_of(&v) > 0);
    }
    let (s, kept) = old.acquire("kept", "K", 60_000);
    assert_eq!(s, 200, "{kept}");
    sqlite.terminate();

    let cluster = EtcdCluster::start(3);
    let migrate = |epoch: u16| {
        let out = replica_cmd(dir.path(), &cluster, "/mig/", epoch)
            .args(["migrate", "--from-db"])
            .arg(dir.path().join("old.db"))
            .output()
            .expect("runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // The prefix already knows the lock "kept": granted and released
    // there before, so its `granted/kept` key exists. The import is still
    // a first grant of the lock, and must not be refused for it.
    {
        let before = Service::start(replica_cmd(dir.path(), &cluster, "/mig/", 0));
        let api = Api::new(&before.url);
        let (s, v) = api.acquire("kept", "earlier", 1000);
        assert_eq!(s, 200, "{v}");
        assert_eq!(api.release("kept", signed_of(&v)).0, 200);
    }
    let (ok, _, err) = migrate(0);
    assert!(!ok, "epoch 0 cannot clear SQLite's tokens");
    fencegate_testkit::assert_mentions(&err, &["at least 1"]);
    let (ok, out, err) = migrate(1);
    assert!(ok, "{err}");
    assert!(out.contains("1 live lease(s) copied"), "{out}");

    // A replica still configured with epoch 0 refuses to start.
    let out = replica_cmd(dir.path(), &cluster, "/mig/", 0)
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("at least 1"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let r = Service::start(replica_cmd(dir.path(), &cluster, "/mig/", 1));
    let api = Api::new(&r.url);
    // The migrated lease: same holder, same token, renewable and
    // releasable with the proof SQLite's service handed out.
    let (_, st) = api.status("kept");
    assert_eq!(
        (&st["owner"], st["token"].as_u64()),
        (&json!("K"), Some(token_of(&kept))),
        "{st}"
    );
    let (s, v) = api.acquire("kept", "other", 1000);
    assert_eq!(s, 409, "{v}");
    let (s, v) = api.renew("kept", signed_of(&kept), 60_000);
    assert_eq!((s, token_of(&v)), (200, token_of(&kept)), "{v}");
    // New grants are above every token SQLite issued.
    let (_, fresh) = api.acquire("gone-0", "y", 1000);
    assert!(token_of(&fresh) > 1 << 47, "{fresh}");
    assert_eq!(api.release("kept", signed_of(&kept)).0, 200);
    let (_, next) = api.acquire("kept", "next", 1000);
    assert!(token_of(&next) > token_of(&fresh));
}

#[test]
fn a_replica_left_on_an_older_epoch_can_no_longer_grant() {
    let _one = one_at_a_time();
    let dir = tempdir();
    let cluster = EtcdCluster::start(3);
    let stale = Service::start(replica_cmd(dir.path(), &cluster, "/ep/", 0));
    let (s, a) = Api::new(&stale.url).acquire("e", "A", 1000);
    assert_eq!(s, 200, "{a}");
    let newer = Service::start(replica_cmd(dir.path(), &cluster, "/ep/", 1));
    // It serves once it has registered its epoch with the cluster.
    let (s, st) = Api::new(&newer.url).status("e");
    assert_eq!((s, st["token"].as_u64()), (200, Some(token_of(&a))), "{st}");
    let (s, v) = Api::new(&stale.url).acquire("e2", "B", 1000);
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("StorageUnavailable")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("epoch 1")),
        "{v}"
    );
    let (s, v) = Api::new(&newer.url).acquire("e2", "B", 1000);
    assert_eq!(s, 200, "{v}");
    assert!(token_of(&v) > 1 << 47 && token_of(&v) > token_of(&a));
}

#[test]
fn a_lease_that_expires_unreleased_is_swept_from_etcd() {
    let _one = one_at_a_time();
    let dir = tempdir();
    let cluster = EtcdCluster::start(3);
    let r = Service::start(replica_cmd_with(
        dir.path(),
        &cluster,
        "/gc/",
        0,
        "sweep_interval = \"200ms\"",
    ));
    let api = Api::new(&r.url);
    let (s, v) = api.acquire("abandoned", "crashed-job", 100);
    assert_eq!(s, 200, "{v}");
    let (s, kept) = api.acquire("kept", "live-job", 60_000);
    assert_eq!(s, 200, "{kept}");
    // What etcd holds under the prefix, through its JSON gateway.
    let keys = || -> Vec<String> {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let v: Value = reqwest::blocking::Client::new()
            .post(format!("{}/v3/kv/range", cluster.members[0].client_url))
            .json(&json!({"key": b64.encode("/gc/locks/"), "range_end": b64.encode("/gc/locks0"), "keys_only": true}))
            .send()
            .and_then(|r| r.json())
            .expect("etcd range");
        v["kvs"]
            .as_array()
            .map(|kvs| {
                kvs.iter()
                    .filter_map(|kv| kv["key"].as_str())
                    .filter_map(|k| b64.decode(k).ok())
                    .map(|k| String::from_utf8_lossy(&k).into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(
        keys(),
        ["/gc/locks/abandoned/owner", "/gc/locks/kept/owner"]
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while keys().len() != 1 {
        assert!(Instant::now() < deadline, "never swept: {:?}", keys());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        keys(),
        ["/gc/locks/kept/owner"],
        "only the live lease is left"
    );
    let m = Metrics::fetch(&format!("{}/metrics", r.url));
    assert_eq!(m.count("fencegate_locksvc_expiries_total", &[]), 1);
    let (_, st) = api.status("kept");
    assert_eq!(st["held"], true, "{st}");
}

/// Turns on etcd's authentication with a `root` user (the JSON gateway).
fn enable_auth(cluster: &EtcdCluster, password: &str) {
    let http = reqwest::blocking::Client::new();
    let url = |p: &str| format!("{}/v3/auth/{p}", cluster.members[0].client_url);
    for (path, body) in [
        ("user/add", json!({"name": "root", "password": password})),
        ("role/add", json!({"name": "root"})),
        ("user/grant", json!({"user": "root", "role": "root"})),
        ("enable", json!({})),
    ] {
        let resp = http
            .post(url(path))
            .json(&body)
            .send()
            .expect("etcd answers");
        assert!(resp.status().is_success(), "{path}: {:?}", resp.text());
    }
}

#[test]
fn with_etcd_authentication_the_replica_needs_the_password_and_says_so() {
    let _one = one_at_a_time();
    let dir = tempdir();
    let cluster = EtcdCluster::start(3);
    enable_auth(&cluster, "etcd-root-pw");
    let with = |password: &str| {
        let mut cmd = replica_cmd_with(dir.path(), &cluster, "/auth/", 0, "username = \"root\"");
        cmd.env("FENCEGATE_ETCD_PASSWORD", password);
        cmd
    };
    let out = with("wrong-password").output().expect("runs");
    assert!(
        !out.status.success(),
        "a wrong password must stop the start"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("etcd"), "the error names etcd: {err}");
    let r = Service::start(with("etcd-root-pw"));
    let api = Api::new(&r.url);
    let (s, a) = api.acquire("a", "A", 10_000);
    assert_eq!(s, 200, "{a}");
    let (s, v) = api.renew("a", signed_of(&a), 10_000);
    assert_eq!(s, 200, "{v}");
    assert_eq!(api.release("a", signed_of(&a)).0, 200);
}

#[test]
fn a_replica_starts_and_serves_while_a_member_is_down() {
    let _one = one_at_a_time();
    let dir = tempdir();
    let cluster = EtcdCluster::start(3);
    enable_auth(&cluster, "etcd-root-pw");
    // The first member listed, the one a replica tries first, is paused.
    cluster.members[0].pause();
    let mut cmd = replica_cmd_with(dir.path(), &cluster, "/down/", 0, "username = \"root\"");
    cmd.env("FENCEGATE_ETCD_PASSWORD", "etcd-root-pw");
    let r = Service::start(cmd);
    let api = Api::new(&r.url);
    let (s, a) = api.acquire("a", "A", 10_000);
    cluster.members[0].resume();
    assert_eq!(s, 200, "{a}");
    let (s, v) = api.renew("a", signed_of(&a), 10_000);
    assert_eq!(s, 200, "{v}");
}

#[test]
fn a_replica_reaches_etcd_over_tls_with_a_client_certificate() {
    let _one = one_at_a_time();
    let dir = tempdir();
    let ca = fencegate_net::test_pki::TestCa::new("etcd test CA");
    let ca_file = ca.write(dir.path(), "ca.crt");
    let server = ca.server(dir.path(), "etcd");
    let client = ca.client(dir.path(), "fencegate", "fencegate");
    let cluster = EtcdCluster::start_tls(&support::etcd::EtcdTls {
        cert: server.cert,
        key: server.key,
        ca: ca_file.clone(),
    });
    let endpoint = cluster.members[0].client_url.clone();
    assert!(endpoint.starts_with("https://"), "{endpoint}");
    let config = |with_cert: bool| {
        let mut text = format!(
            "[etcd]\nendpoints = [{endpoint:?}]\nprefix = \"/tls/\"\nca_file = {:?}\n",
            ca_file.display().to_string()
        );
        if with_cert {
            text.push_str(&format!(
                "cert_file = {:?}\nkey_file = {:?}\n",
                client.cert.display().to_string(),
                client.key.display().to_string()
            ));
        }
        let path = dir.path().join(format!("tls-{with_cert}.toml"));
        std::fs::write(&path, text).expect("config");
        let mut cmd = fencegate();
        cmd.args(["locksvc", "--listen", "127.0.0.1:0", "--config"])
            .arg(path)
            .env("FENCEGATE_SIGNING_KEYS", SIGNING_KEY)
            .env("FENCEGATE_LOG", "warn");
        cmd
    };
    let r = Service::start(config(true));
    let api = Api::new(&r.url);
    let (s, a) = api.acquire("t", "A", 10_000);
    assert_eq!(s, 200, "{a}");
    let (s, v) = api.renew("t", signed_of(&a), 10_000);
    assert_eq!(s, 200, "{v}");
    assert_eq!(api.release("t", signed_of(&a)).0, 200);
    // Without a client certificate etcd refuses the connection: the replica
    // does not start (after its start-up retries), and says why.
    let mut without = config(false);
    let out = without.output().expect("runs");
    assert!(
        !out.status.success(),
        "a replica without a client certificate must not start"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    fencegate_testkit::assert_mentions(&err, &["etcd"]);
}

/// etcd restored from an older backup while a replica runs: its revision,
/// and the tokens made of it, go back. The replica notices at its next
/// transaction, grants nothing from then on, and says which epoch to set.
#[test]
fn etcd_restored_from_an_older_backup_stops_the_replica_granting() {
    let _one = one_at_a_time();
    let dir = tempdir();
    let mut cluster = EtcdCluster::start(1);
    let svc = Service::start(replica_cmd(dir.path(), &cluster, "/rw/", 0));
    let api = Api::new(&svc.url);
    let (s, first) = api.acquire("r", "A", 60_000);
    assert_eq!(s, 200, "{first}");
    let backup = dir.path().join("etcd-backup");
    cluster.restart(0, |data| support::etcd::copy_dir(data, &backup));
    let mut last = token_of(&first);
    for i in 0..5 {
        let (s, v) = api.acquire(&format!("r{i}"), "B", 60_000);
        assert_eq!(s, 200, "{v}");
        last = last.max(token_of(&v));
    }
    cluster.restart(0, |data| {
        std::fs::remove_dir_all(data).expect("remove the data dir");
        support::etcd::copy_dir(&backup, data);
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let refusal = loop {
        let (s, v) = api.acquire("after", "C", 60_000);
        assert_ne!(
            s,
            200,
            "granted token {} after etcd went back; {last} was granted before",
            token_of(&v)
        );
        let message = v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if message.contains("went back") {
            break message;
        }
        assert!(
            Instant::now() < deadline,
            "never told the revision went back: {s} {v}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        refusal.contains("etcd.epoch") && refusal.contains(" 1 "),
        "{refusal}"
    );
    // And it stays refused: not one token below those already issued.
    let (s, v) = api.acquire("later", "D", 60_000);
    assert_eq!(s, 503, "{v}");
}
