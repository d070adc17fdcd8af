//! Fault evidence: real processes, real pauses, real crashes, a backend that
//! goes away or slows down, and a checker over recorded histories.
//!
//! - `FENCEGATE_HISTORY_SEED=<n>` replays a history run (the seed is printed);
//! - `FENCEGATE_CRASH_CYCLES=<n>` sets the kill -9 cycles (3 here; the soak
//!   command `scripts/soak.sh` runs 20).

mod support;

use fencegate_core::FencingToken;
use fencegate_lease_api::{AcquireRequest, LeaseResponse, ReleaseRequest, RenewRequest};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::harness::Harness;
use support::s3::*;

const BUCKET: &str = "bkt";

/// A backend, a lease service and a proxy fencing `bkt` with lock `bkt`
/// (or several proxy replicas sharing an etcd cluster: the histories'
/// clients then spread over them). In an etcd pass, a second lease-service
/// replica on the same locks (`replica`): the clients spread over both.
struct System {
    backend: Backend,
    proxies: Vec<Proxy>,
    locksvc: support::Service,
    replica: Option<support::Service>,
    dir: tempfile::TempDir,
    _etcd: Option<support::etcd::EtcdCluster>,
    /// The first proxy's link to etcd, if the harness made one.
    link: Option<support::relay::Link>,
}

impl System {
    /// The lease service client `c` talks to.
    fn locksvc_for(&self, c: usize) -> &str {
        match &self.replica {
            Some(r) if c % 2 == 1 => &r.url,
            _ => &self.locksvc.url,
        }
    }

    /// The proxy client `c` writes through.
    fn proxy_for(&self, c: usize) -> &str {
        &self.proxies[c % self.proxies.len()].url
    }

    fn proxy(&self) -> &Proxy {
        &self.proxies[0]
    }
}

async fn system() -> System {
    system_of(Harness::new(BackendKind::S3Fs)).await
}

/// `n` proxy replicas on a 3-member etcd cluster.
async fn replicated_system(n: usize) -> System {
    system_of(Harness::new(BackendKind::S3Fs).etcd(3).proxies(n)).await
}

async fn system_of(harness: Harness) -> System {
    // The store is in this process and decides at once; a short decision
    // time keeps the raises after each kill -9 of the proxy (which wait it
    // out) within the test's cycles.
    let env = harness
        .backend_options("store_decision_secs = 1")
        .start()
        .await;
    let locksvc = start_locksvc(env.dir.path()).await;
    let replica = match support::lease_backend() {
        support::LeaseBackend::Etcd => Some(start_locksvc(env.dir.path()).await),
        support::LeaseBackend::Sqlite => None,
    };
    System {
        backend: env.backend,
        proxies: env.proxies,
        locksvc,
        replica,
        dir: env.dir,
        _etcd: env.etcd,
        link: env.etcd_link,
    }
}

async fn start_locksvc(dir: &std::path::Path) -> support::Service {
    let p = dir.to_owned();
    tokio::task::spawn_blocking(move || support::start_locksvc(&p))
        .await
        .expect("locksvc")
}

/// The signed token of a lease answer, as the wire's requests carry it.
fn signed_token(signed: &str) -> FencingToken {
    FencingToken::parse(signed).expect("the service's fencing_token parses")
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

/// The lease API's own client for the service at `locksvc`.
fn lease_api(http: &reqwest::Client, locksvc: &str) -> fencegate_lease_api::Client {
    fencegate_lease_api::Client::new(http.clone(), locksvc, None)
}

/// A lease from the real lease service, or None if refused/unreachable.
async fn acquire(
    http: &reqwest::Client,
    locksvc: &str,
    owner: &str,
    ttl_ms: u64,
    wait_ms: u64,
) -> Option<LeaseResponse> {
    let req = AcquireRequest {
        owner: owner.to_owned(),
        ttl_ms: Some(ttl_ms),
        wait_ms: Some(wait_ms),
        idempotency_key: None,
    };
    lease_api(http, locksvc)
        .acquire(BUCKET, &req, None)
        .await
        .ok()
}

/// PUT through the proxy, anonymous, with the token header; the status.
async fn put(
    http: &reqwest::Client,
    proxy: &str,
    key: &str,
    token: &str,
    body: &str,
) -> Option<u16> {
    http.put(format!("{proxy}/{BUCKET}/{key}"))
        .header("fencing-token", token)
        .body(body.to_owned())
        .send()
        .await
        .ok()
        .map(|r| r.status().as_u16())
}

/// One recorded write.
#[derive(Debug, Clone)]
struct Op {
    client: usize,
    key: String,
    token: u64,
    payload: String,
    sent: Duration,
    done: Duration,
    status: Option<u16>,
}

/// Checks a history: a lower-token write sent after a higher-token write
/// was acknowledged is never acknowledged; and the store ends with, per key,
/// an acknowledged write carrying the key's highest acknowledged token.
async fn check_history(ops: &[Op], backend: &Backend, keys: &[String]) -> Result<(), String> {
    let acked: Vec<&Op> = ops.iter().filter(|o| o.status == Some(200)).collect();
    for hi in &acked {
        for lo in &acked {
            if lo.token < hi.token && hi.done < lo.sent {
                return Err(format!(
                    "stale write acknowledged: {lo:?} was sent after {hi:?} (a higher token) was acknowledged"
                ));
            }
        }
    }
    for key in keys {
        let attempts: Vec<&Op> = ops.iter().filter(|o| &o.key == key).collect();
        let Some(max) = attempts
            .iter()
            .filter(|o| o.status == Some(200))
            .map(|o| o.token)
            .max()
        else {
            continue;
        };
        let (body, token) = stored(backend, BUCKET, key)
            .await
            .ok_or_else(|| format!("{key}: acknowledged writes, but the object is gone"))?;
        let body = String::from_utf8_lossy(&body).to_string();
        check_final_state(
            key,
            max,
            token,
            &body,
            attempts
                .iter()
                .map(|o| (o.token, o.payload.as_str(), o.status)),
        )?;
    }
    Ok(())
}

/// Where the history's clients send their writes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    /// Through the fencing proxy.
    Proxy,
    /// Straight to the store, tagging objects with the token themselves:
    /// what a system without the fence does.
    Unfenced,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Proxy => "through the proxy",
            Target::Unfenced => "unfenced",
        }
    }
}

/// Runs the seeded multi-client history against `target` and returns it.
/// With `fresh`, about a third of the writes go to a key of their own,
/// where no object's stored token or ETag stands behind the fence.
/// Steps each client of a history takes at least.
const HISTORY_STEPS: usize = 40;
/// Acknowledged writes a history goes on for, past `HISTORY_STEPS`.
const HISTORY_ACKS: usize = 24;
/// Steps a client takes at most, whatever was acknowledged.
const HISTORY_MAX_STEPS: usize = 200;

async fn record_history(
    s: &Arc<System>,
    seed: u64,
    target: Target,
    keys: &[String],
    fresh: bool,
) -> Vec<Op> {
    let ops: Arc<Mutex<Vec<Op>>> = Arc::default();
    // Acknowledged writes so far, over all clients: a loaded machine slows
    // every round trip, leases lapse more often and fewer writes land, so
    // the clients go on past their steps until the history holds enough
    // acknowledged writes to check (or a hard cap), rather than shrinking
    // the evidence the checks rest on.
    let acked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let monitor = TokenMonitor::start(&s.backend, BUCKET, keys);
    let clients: Vec<_> = (0..4usize)
        .map(|c| {
            let (s, keys, ops, acked) = (s.clone(), keys.to_vec(), ops.clone(), acked.clone());
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed ^ (c as u64 * 0x9e37_79b9));
                let http = http();
                let direct = s.backend.direct();
                let mut lease: Option<LeaseResponse> = None;
                for step in 0..HISTORY_MAX_STEPS {
                    if step >= HISTORY_STEPS && acked.load(Ordering::Acquire) >= HISTORY_ACKS {
                        break;
                    }
                    let Some(l) = &lease else {
                        let ttl = rng.gen_range(1000..1500);
                        lease = acquire(&http, s.locksvc_for(c), &format!("c{c}"), ttl, 3000).await;
                        continue;
                    };
                    let token = l.token;
                    let signed = l.fencing_token.clone();
                    match rng.gen_range(0..100) {
                        0..=69 => {
                            let key = if fresh && rng.gen_range(0..3) == 0 {
                                format!("fresh/c{c}-s{step}")
                            } else {
                                keys[rng.gen_range(0..keys.len())].clone()
                            };
                            let payload = format!("c{c}-s{step}-t{token}");
                            let sent = start.elapsed();
                            let status = match target {
                                Target::Proxy => {
                                    put(&http, s.proxy_for(c), &key, &signed, &payload).await
                                }
                                Target::Unfenced => direct
                                    .put_object()
                                    .bucket(BUCKET)
                                    .key(&key)
                                    .metadata("fencing-token", token.to_string())
                                    .body(aws_sdk_s3::primitives::ByteStream::from(
                                        payload.clone().into_bytes(),
                                    ))
                                    .send()
                                    .await
                                    .ok()
                                    .map(|_| 200),
                            };
                            let done = start.elapsed();
                            if status == Some(200) {
                                acked.fetch_add(1, Ordering::AcqRel);
                            }
                            ops.lock().expect("lock").push(Op {
                                client: c,
                                key,
                                token,
                                payload,
                                sent,
                                done,
                                status,
                            });
                        }
                        // A pause past the lease: the client keeps its token
                        // and writes on as if nothing happened.
                        70..=84 => {
                            tokio::time::sleep(Duration::from_millis(rng.gen_range(900..2200)))
                                .await
                        }
                        85..=94 => {
                            let req = ReleaseRequest {
                                token: signed_token(&signed),
                            };
                            let _ = lease_api(&http, s.locksvc_for(c + 1))
                                .release(BUCKET, &req, None)
                                .await;
                            lease = None;
                        }
                        _ => {
                            let req = RenewRequest {
                                token: signed_token(&signed),
                                ttl_ms: Some(1000),
                            };
                            let _ = lease_api(&http, s.locksvc_for(c + 1))
                                .renew(BUCKET, &req, None)
                                .await;
                        }
                    }
                }
            })
        })
        .collect();
    for c in clients {
        c.await.expect("client");
    }
    let ops = ops.lock().expect("lock").clone();
    // A key first written by the last steps is still watched a while.
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The monitor watched both runs: every acknowledged key several times,
    // without a failed read. The fenced store must never go back; the
    // unfenced one must be seen to (the monitor's negative control: it can
    // see the hazard it is there to catch).
    let seen = monitor.stop().await;
    let mut written: Vec<String> = ops
        .iter()
        .filter(|o| o.status == Some(200) && keys.contains(&o.key))
        .map(|o| o.key.clone())
        .collect();
    written.sort();
    written.dedup();
    let context = format!("seed {seed}, {}", target.name());
    seen.assert_watched(&context, &written, 5);
    let down = seen.decreases();
    match target {
        Target::Proxy => assert!(
            down.is_empty(),
            "{context}: stored tokens went down: {down:?}"
        ),
        Target::Unfenced => {
            assert!(
                !down.is_empty(),
                "{context}: the monitor never saw a stored token go down: it cannot see the hazard"
            );
            println!("{context}: stored tokens went down: {down:?}");
        }
    }
    ops
}

fn history_seed() -> u64 {
    let seed = std::env::var("FENCEGATE_HISTORY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261202);
    println!("history seed {seed} (replay: FENCEGATE_HISTORY_SEED={seed})");
    seed
}

/// What a key may hold at the end: an acknowledged write was never lost or
/// overwritten by a lower token (stored token >= the highest acknowledged),
/// and what is stored was acknowledged, or was in flight with an unknown
/// outcome (a crash or a timeout between the store's commit and the answer).
/// A refused (409) write is never stored.
fn check_final_state<'a>(
    key: &str,
    max_acked: u64,
    token: Option<u64>,
    body: &str,
    attempts: impl Iterator<Item = (u64, &'a str, Option<u16>)>,
) -> Result<(), String> {
    let stored_token = token.ok_or_else(|| format!("{key}: the stored object has no token"))?;
    if stored_token < max_acked {
        return Err(format!(
            "{key}: stored token {stored_token} is below the highest acknowledged {max_acked}"
        ));
    }
    let origin: Vec<Option<u16>> = attempts
        .filter(|(t, p, _)| *t == stored_token && *p == body)
        .map(|(_, _, status)| status)
        .collect();
    match origin.first() {
        None => Err(format!(
            "{key}: stored {body:?} (token {stored_token}) was never written"
        )),
        Some(Some(409)) => Err(format!(
            "{key}: stored {body:?} was refused as stale, yet it landed"
        )),
        Some(_) => Ok(()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_random_multi_client_history_checks_out() {
    let seed = history_seed();
    let s = Arc::new(system().await);
    let keys: Vec<String> = (0..5).map(|i| format!("h/k{i}")).collect();
    let ops = record_history(&s, seed, Target::Proxy, &keys, false).await;

    let acks = ops.iter().filter(|o| o.status == Some(200)).count();
    let stale = ops.iter().filter(|o| o.status == Some(409)).count();
    println!(
        "{} writes: {acks} acknowledged, {stale} refused as stale",
        ops.len()
    );
    assert!(
        acks > 10,
        "too few acknowledged writes ({acks}) for the history to mean anything"
    );
    assert!(
        stale > 0,
        "no stale write happened: the schedule did not exercise the fence"
    );
    if let Some(bad) = ops
        .iter()
        .find(|o| !matches!(o.status, Some(200 | 409 | 503)))
    {
        panic!(
            "seed {seed}: unexpected answer {bad:?} (client {})",
            bad.client
        );
    }
    if let Err(e) = check_history(&ops, &s.backend, &keys).await {
        panic!("seed {seed}: {e}");
    }
}

/// The same history with its writers spread over two proxy replicas that
/// share their fences through etcd (issue 13): one proxy's guarantee.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_random_multi_client_history_over_proxy_replicas_checks_out() {
    let seed = history_seed();
    let s = Arc::new(replicated_system(2).await);
    let keys: Vec<String> = (0..5).map(|i| format!("r/k{i}")).collect();
    let ops = record_history(&s, seed, Target::Proxy, &keys, false).await;
    let acks = ops.iter().filter(|o| o.status == Some(200)).count();
    let stale = ops.iter().filter(|o| o.status == Some(409)).count();
    println!(
        "{} writes over 2 replicas: {acks} acknowledged, {stale} stale",
        ops.len()
    );
    assert!(acks > 10, "too few acknowledged writes ({acks})");
    assert!(
        stale > 0,
        "no stale write: the schedule did not exercise the fence"
    );
    for r in 0..2 {
        let through = ops
            .iter()
            .filter(|o| o.client % 2 == r && o.status == Some(200))
            .count();
        assert!(through > 0, "no write was acknowledged through replica {r}");
    }
    if let Some(bad) = ops
        .iter()
        .find(|o| !matches!(o.status, Some(200 | 409 | 503)))
    {
        panic!("seed {seed}: unexpected answer {bad:?}");
    }
    if let Err(e) = check_history(&ops, &s.backend, &keys).await {
        panic!("seed {seed}: {e}");
    }
}

/// Slows and cuts `link` at random until `stop`: answers come late, and
/// requests sent just before a cut are applied with their answers lost.
/// How many cuts it made.
async fn disturb(
    link: support::relay::Link,
    seed: u64,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> usize {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x00d1_5c0f);
    let mut cuts = 0;
    while !stop.load(Ordering::Acquire) {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(500..2500))).await;
        match rng.gen_range(0..4) {
            0 | 3 => link.delay(Duration::from_millis(rng.gen_range(100..600))),
            1 => {
                cuts += 1;
                link.cut();
                tokio::time::sleep(Duration::from_millis(rng.gen_range(200..1500))).await;
                link.restore();
            }
            _ => link.delay(Duration::ZERO),
        }
    }
    link.delay(Duration::ZERO);
    link.restore();
    cuts
}

/// Issue 21: the history over two replicas while the first one's link to
/// etcd is slowed and cut at random, with a third of the writes to keys of
/// their own, where only the fence stands in the way. The store is the
/// ground truth: no object may carry a token below one acknowledged before
/// its write was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_history_over_replicas_with_a_faulty_link_to_etcd_checks_out() {
    let seed = history_seed();
    let s = Arc::new(
        system_of(
            Harness::new(BackendKind::S3Fs)
                .etcd(3)
                .proxies(2)
                .first_proxy_etcd_link(),
        )
        .await,
    );
    let keys: Vec<String> = (0..5).map(|i| format!("f/k{i}")).collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let faults = tokio::spawn(disturb(
        s.link.clone().expect("a link to etcd"),
        seed,
        stop.clone(),
    ));
    let ops = record_history(&s, seed, Target::Proxy, &keys, true).await;
    stop.store(true, Ordering::Release);
    let cuts = faults.await.expect("faults");
    assert!(cuts > 0, "seed {seed}: the link was never cut");
    let acks = ops.iter().filter(|o| o.status == Some(200)).count();
    let refused = ops.iter().filter(|o| o.status == Some(503)).count();
    println!(
        "seed {seed}: {} writes over 2 replicas, one on a faulty link ({cuts} cuts): {acks} acknowledged, {refused} refused 503",
        ops.len()
    );
    assert!(acks > 10, "too few acknowledged writes ({acks})");
    if let Some(bad) = ops
        .iter()
        .find(|o| !matches!(o.status, Some(200 | 409 | 503)))
    {
        panic!("seed {seed}: unexpected answer {bad:?}");
    }
    if let Err(e) = check_history(&ops, &s.backend, &keys).await {
        panic!("seed {seed}: {e}");
    }
    let acked: Vec<&Op> = ops.iter().filter(|o| o.status == Some(200)).collect();
    let mut landed = 0;
    for o in ops.iter().filter(|o| o.key.starts_with("fresh/")) {
        let Some(t) = stored_token(&s.backend, BUCKET, &o.key).await else {
            assert_ne!(
                o.status,
                Some(200),
                "seed {seed}: {o:?} acknowledged, not stored"
            );
            continue;
        };
        landed += 1;
        assert_eq!(
            t, o.token,
            "seed {seed}: {} holds another write's token",
            o.key
        );
        if let Some(hi) = acked.iter().find(|hi| hi.token > t && hi.done < o.sent) {
            panic!(
                "seed {seed}: {o:?} landed, sent after {hi:?} (a higher token) was acknowledged"
            );
        }
    }
    assert!(
        landed > 0,
        "seed {seed}: no write to a key of its own landed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_history_checker_catches_an_unfenced_store() {
    // The same clients and schedule, writing straight to the store: the
    // checker must find the stale writes the fence would have refused.
    let seed = history_seed();
    let s = Arc::new(system().await);
    let keys: Vec<String> = (0..5).map(|i| format!("u/k{i}")).collect();
    let ops = record_history(&s, seed, Target::Unfenced, &keys, false).await;
    let verdict = check_history(&ops, &s.backend, &keys).await;
    let found = verdict
        .expect_err("an unfenced store passed the checker: the checker cannot see the hazard");
    // The hazard itself, not a broken setup (a missing object, no token).
    assert!(
        found.contains("stale write acknowledged")
            || found.contains("is below the highest acknowledged")
            || found.contains("was refused as stale, yet it landed"),
        "the checker failed for another reason: {found}"
    );
    println!("unfenced store: {found}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigstopped_upload_is_cut_and_the_new_holder_wins() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let s = system().await;
    let http = http();
    let a = acquire(&http, &s.locksvc.url, "A", 1500, 0)
        .await
        .expect("A's lease");
    let file = s.dir.path().join("upload.bin");
    std::fs::write(&file, vec![b'A'; 3 * 1024 * 1024]).expect("file");

    // A real writer process: curl, rate-limited so it is mid-upload when stopped.
    let curl = std::process::Command::new("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--limit-rate",
            "300k",
            "-X",
            "PUT",
            "-T",
        ])
        .arg(&file)
        .args(["-H", &format!("Fencing-Token: {}", &a.fencing_token)])
        .arg(format!("{}/{BUCKET}/paused.bin", s.proxy().url))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("curl");
    let pid = Pid::from_raw(i32::try_from(curl.id()).expect("pid"));
    s.proxy().wait_for_inflight_writes(1).await;
    kill(pid, Signal::SIGSTOP).expect("SIGSTOP");

    // A's lease runs out while it is stopped; B takes over and writes.
    let expires = a.expires_at_ms;
    tokio::time::sleep(Duration::from_millis(
        expires.saturating_sub(support::unix_ms()) + 100,
    ))
    .await;
    let b = acquire(&http, &s.locksvc.url, "B", 30_000, 0)
        .await
        .expect("B's lease");
    let started = Instant::now();
    let status = put(
        &http,
        &s.proxy().url,
        "paused.bin",
        &b.fencing_token,
        "from B",
    )
    .await;
    assert_eq!(status, Some(200), "B is admitted");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "B was not held up by the stopped upload"
    );

    kill(pid, Signal::SIGCONT).expect("SIGCONT");
    let out = tokio::task::spawn_blocking(move || curl.wait_with_output().expect("curl exits"))
        .await
        .expect("joined");
    let code = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        code, "409",
        "the stale upload is answered FencingTokenStale (curl {:?})",
        out.status
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_stored_as(
        &s.backend,
        BUCKET,
        "paused.bin",
        b"from B",
        b.token,
        "the object is B's",
    )
    .await;
}

/// A client that hangs up once its whole body is sent (it was killed, or it
/// does not wait for answers) still gets its write landed whole: the proxy
/// and the store finish a write they have every byte of, so the object and
/// its token never come apart and the proxy's view of the key stays right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_client_hangs_up_after_the_body_lands_whole() {
    use tokio::io::AsyncWriteExt;
    let s = system().await;
    let http = http();
    let lease = acquire(&http, &s.locksvc.url, "hangup", 30_000, 0)
        .await
        .expect("lease");
    let token = lease.token;
    let signed = lease.fencing_token.as_str();
    let body: Vec<u8> = (0..4 << 20).map(|i: u32| (i % 251) as u8).collect();

    let addr = s.proxy().url.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "PUT /{BUCKET}/hangup.bin HTTP/1.1\r\nHost: {addr}\r\nFencing-Token: {signed}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.expect("head");
    conn.write_all(&body).await.expect("body");
    conn.shutdown().await.expect("hang up");
    drop(conn);

    let deadline = Instant::now() + Duration::from_secs(10);
    // s3s-fs moves the data into place before it writes the metadata: a
    // read in between sees the object without its token, so wait for both.
    let landed = loop {
        if let Some(found) = stored(&s.backend, BUCKET, "hangup.bin").await
            && found.1.is_some()
        {
            break found;
        }
        assert!(
            Instant::now() < deadline,
            "the write of a client that hung up after its body never landed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(landed.0 == body, "the stored object is not the whole body");
    assert_eq!(
        landed.1,
        Some(token),
        "the object carries the writer's token"
    );
    // The proxy recorded the write: the holder's next write goes straight
    // through (a stale view of the key would cost it a 503 first).
    assert_eq!(
        put(&http, &s.proxy().url, "hangup.bin", signed, "again").await,
        Some(200)
    );
}

/// A client that goes silent in the middle of its body (its network went
/// away, it did not close the connection) is answered 400 RequestTimeout
/// after `client_idle_timeout_secs`, nothing is stored, and the key is free:
/// the holder's retry goes through at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_silent_mid_body_times_out_and_frees_its_key() {
    use tokio::io::AsyncWriteExt;
    let backend = Backend::start(BackendKind::S3Fs).await;
    backend.create_bucket(BUCKET).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let proxy = Proxy::start(
        &proxy_toml(&backend, dir.path(), BUCKET, "client_idle_timeout_secs = 1"),
        dir.path(),
    )
    .await;
    let token = signed(BUCKET, 3);
    let addr = proxy.url.trim_start_matches("http://").to_owned();
    let mut conn = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let head = format!(
        "PUT /{BUCKET}/silent.bin HTTP/1.1\r\nHost: {addr}\r\nFencing-Token: {token}\r\nContent-Length: 1000\r\n\r\nonly the first bytes"
    );
    conn.write_all(head.as_bytes()).await.expect("send");
    let started = Instant::now();
    let answer = support::read_answer(&mut conn, Duration::from_secs(15))
        .await
        .unwrap_or_else(|e| panic!("the proxy answers a silent client: {e}"));
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    fencegate_testkit::assert_mentions(&answer, &["RequestTimeout"]);
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "answered only after the idle timeout: {:?}",
        started.elapsed()
    );
    assert_eq!(stored(&backend, BUCKET, "silent.bin").await, None);
    // The silent client still has its connection open; the retry is not
    // held up by it.
    let http = http();
    assert_eq!(
        put(&http, &proxy.url, "silent.bin", &token, "the retry").await,
        Some(200)
    );
    assert_stored(&backend, BUCKET, "silent.bin", b"the retry", 3).await;
    drop(conn);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_of_locksvc_and_proxy_under_load_loses_nothing() {
    let cycles: usize = std::env::var("FENCEGATE_CRASH_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let mut s = system().await;
    let keys: Vec<String> = (0..4).map(|i| format!("crash/k{i}")).collect();
    let mut attempts: Vec<Attempt> = Vec::new();
    let mut max_token_returned = 0u64;
    for cycle in 0..cycles {
        let results: Arc<Mutex<Vec<Attempt>>> = Arc::default();
        let returned = Arc::new(AtomicU64::new(0));
        let writers: Vec<_> = (0..3usize)
            .map(|w| {
                let (locksvc, proxy, keys) =
                    (s.locksvc.url.clone(), s.proxy().url.clone(), keys.clone());
                let (results, returned) = (results.clone(), returned.clone());
                tokio::spawn(async move {
                    let http = http();
                    for i in 0.. {
                        // Each round a fresh holder: a new, higher token.
                        let Some(l) =
                            acquire(&http, &locksvc, &format!("w{w}-{cycle}-{i}"), 1000, 0).await
                        else {
                            // Held by another writer, or the service is down.
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            if i > 400 {
                                return;
                            }
                            continue;
                        };
                        let token = l.token;
                        returned.fetch_max(token, Ordering::AcqRel);
                        let signed = l.fencing_token.as_str();
                        for (j, key) in keys.iter().enumerate() {
                            let payload = format!("w{w}-c{cycle}-i{i}-{j}-t{token}");
                            let status = put(&http, &proxy, key, signed, &payload).await;
                            results.lock().expect("lock").push((
                                key.clone(),
                                token,
                                payload,
                                status,
                            ));
                            match status {
                                Some(200 | 409 | 503) => {}
                                Some(other) => panic!("unexpected status {other}"),
                                None => return, // the proxy is gone
                            }
                        }
                        let req = ReleaseRequest {
                            token: signed_token(signed),
                        };
                        let _ = lease_api(&http, &locksvc).release(BUCKET, &req, None).await;
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(400)).await;
        if let Some(p) = s.proxies[0].service.as_mut() {
            p.kill9();
        }
        s.locksvc.kill9();
        for w in writers {
            w.await.expect("writer");
        }
        attempts.extend(results.lock().expect("lock").iter().cloned());
        max_token_returned = max_token_returned.max(returned.load(Ordering::Acquire));

        s.locksvc = start_locksvc(s.dir.path()).await;
        s.proxies[0].restart().await;
        // Another lock: the writers' leases may still be live after the
        // crash (they keep their remaining time). Tokens are global.
        let req = AcquireRequest {
            owner: "probe".into(),
            ttl_ms: Some(1000),
            wait_ms: None,
            idempotency_key: None,
        };
        let next = lease_api(&http(), &s.locksvc.url)
            .acquire(&format!("probe-{cycle}"), &req, None)
            .await
            .expect("locksvc is back");
        let next_token = next.token;
        assert!(
            next_token > max_token_returned,
            "cycle {cycle}: token {next_token} after restart is not above {max_token_returned}"
        );
        let acked_max = attempts
            .iter()
            .filter(|a| a.3 == Some(200))
            .map(|a| a.1)
            .max()
            .unwrap_or(0);
        // Unlisted means nothing admitted: right only if nothing was acked.
        let max = s.proxy().max_token(BUCKET).await;
        assert!(
            max.unwrap_or(0) >= acked_max,
            "cycle {cycle}: the proxy's max {max:?} went below an acknowledged token {acked_max}"
        );
        max_token_returned = max_token_returned.max(next_token);
    }
    let acked = attempts.iter().filter(|a| a.3 == Some(200)).count();
    assert!(
        acked > cycles,
        "the load did not get through: {acked} writes"
    );
    for key in &keys {
        let mine: Vec<_> = attempts.iter().filter(|a| &a.0 == key).collect();
        let Some(max) = mine.iter().filter(|a| a.3 == Some(200)).map(|a| a.1).max() else {
            continue;
        };
        let (body, token) = stored(&s.backend, BUCKET, key)
            .await
            .expect("acknowledged key exists");
        let body = String::from_utf8_lossy(&body).to_string();
        if let Err(e) = check_final_state(
            key,
            max,
            token,
            &body,
            mine.iter().map(|a| (a.1, a.2.as_str(), a.3)),
        ) {
            panic!("{e}");
        }
    }
}

/// A write under load: key, token, payload, answer (None: no answer).
type Attempt = (String, u64, String, Option<u16>);

/// An s3s-fs store with [`BUCKET`] behind a holding relay
/// ([`support::relay::holding_relay`]: the request whose bytes contain
/// `marker` is held for `hold`; `held` says when it reached the relay and
/// when the proxy closed a connection that carried it), and a proxy config that reaches the store
/// through the relay with `backend_options`; the directory is the proxy's.
async fn held_store(
    marker: &'static str,
    hold: Duration,
    held: Arc<support::relay::Held>,
    backend_options: &str,
) -> (Backend, tempfile::TempDir, String) {
    let backend = Backend::start(BackendKind::S3Fs).await;
    backend.create_bucket(BUCKET).await;
    let relay = support::relay::holding_relay(
        backend.endpoint.trim_start_matches("http://").to_owned(),
        marker,
        hold,
        held,
    )
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let toml = proxy_toml_to(&backend, dir.path(), BUCKET, &relay, backend_options);
    (backend, dir, toml)
}

/// A TCP relay that can hold back the backend's answers.
async fn delaying_relay(target: String, delay_ms: Arc<AtomicU64>) -> String {
    use support::relay::relayed;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    relayed(target, move |(mut cr, mut cw, mut sr, mut sw)| {
        let delay_ms = delay_ms.clone();
        async move {
            let up = tokio::spawn(async move {
                let _ = tokio::io::copy(&mut cr, &mut sw).await;
                let _ = sw.shutdown().await;
            });
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match sr.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let d = delay_ms.load(Ordering::Acquire);
                if d > 0 {
                    tokio::time::sleep(Duration::from_millis(d)).await;
                }
                if cw.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            up.abort();
        }
    })
    .await
}

/// An empty body is never asked for by the sender (it has nothing to
/// send), so it counts as sent from the start: the backend's answer
/// timeout runs for an empty write too, instead of waiting for a body that
/// never moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_write_the_store_holds_times_out() {
    const HOLD: Duration = Duration::from_secs(4);
    let (_backend, dir, toml) = held_store(
        "hold-this-one",
        HOLD,
        Arc::default(),
        "timeout_secs = 1\nstore_decision_secs = 1",
    )
    .await;
    let proxy = Proxy::start(&toml, dir.path()).await;
    let http = http();
    // The key is known, so the next write streams its body.
    assert_eq!(
        put(&http, &proxy.url, "empty", &signed(BUCKET, 1), "x").await,
        Some(200)
    );
    let started = Instant::now();
    let held = http
        .put(format!("{}/{BUCKET}/empty", proxy.url))
        .header("fencing-token", signed(BUCKET, 1))
        .header("x-amz-meta-note", "hold-this-one")
        .body("")
        .send()
        .await
        .expect("answered");
    assert_eq!(held.status().as_u16(), 503, "the timeout answers");
    assert!(
        started.elapsed() < HOLD,
        "answered by the proxy's timeout, not the store: {:?}",
        started.elapsed()
    );
}

/// Guarantee 3 under a backend timeout: a new-key PUT the store holds past
/// `timeout_secs` may still land, so the raise that comes next waits until
/// it no longer can (its connection closed and `store_decision_secs`
/// passed); the stale object never appears after the raise was answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_timed_out_holds_back_a_raise_until_it_can_no_longer_land() {
    const HOLD: Duration = Duration::from_secs(3);
    let held = Arc::new(support::relay::Held::default());
    let (backend, dir, toml) = held_store(
        "PUT /bkt/late-new-key",
        HOLD,
        held.clone(),
        "timeout_secs = 1\nstore_decision_secs = 5",
    )
    .await;
    let proxy = Proxy::start(&toml, dir.path()).await;
    let http = http();
    assert_eq!(
        put(&http, &proxy.url, "warm", &signed(BUCKET, 1), "w").await,
        Some(200)
    );

    let started = Instant::now();
    let late = http
        .put(format!("{}/{BUCKET}/late-new-key", proxy.url))
        .header("fencing-token", signed(BUCKET, 1))
        .body("stale")
        .send()
        .await
        .expect("answered");
    assert_eq!(
        late.status().as_u16(),
        503,
        "the timeout answers a retryable 503"
    );
    let text = late.text().await.expect("body");
    assert!(
        text.contains("<Code>ServiceUnavailable</Code>") && text.contains("may still land"),
        "{text}"
    );
    assert!(started.elapsed() < HOLD, "answered by the proxy's timeout");
    assert_eq!(
        proxy.metric("fencegate_proxy_lingering_writes", &[]).await,
        Some(1.0),
        "the timed-out write is still held"
    );

    let raise_sent = Instant::now();
    let raise = put(&http, &proxy.url, "other-key", &signed(BUCKET, 2), "new").await;
    let raise_waited = raise_sent.elapsed();
    let late_at_answer = stored(&backend, BUCKET, "late-new-key").await;
    assert_eq!(raise, Some(200), "the raise is admitted in the end");
    // Long after the hold, the store holds what it held when the raise was
    // answered: the stale object did not appear after it.
    tokio::time::sleep_until((started + HOLD + Duration::from_secs(2)).into()).await;
    let late_after = stored(&backend, BUCKET, "late-new-key").await;
    assert_eq!(
        late_after, late_at_answer,
        "the store changed after the raise was answered"
    );
    assert_eq!(
        late_at_answer,
        Some((b"stale".to_vec(), Some(1))),
        "the held request landed (before the raise, as the store decided)"
    );
    assert!(
        held.closed(),
        "the proxy closed the timed-out write's connection (when the raise cut it)"
    );
    assert!(
        raise_waited >= Duration::from_secs(4),
        "the raise waited for the store decision time after the cut: {raise_waited:?}"
    );
    assert_eq!(
        proxy.metric("fencegate_proxy_lingering_writes", &[]).await,
        Some(0.0)
    );
    assert_eq!(
        proxy
            .metric(
                "fencegate_proxy_raise_wait_seconds_count",
                &[("lock", "bkt")]
            )
            .await,
        Some(2.0),
        "both raises (token 1, token 2) are measured"
    );
    assert_eq!(
        put(&http, &proxy.url, "late-new-key", &signed(BUCKET, 1), "x").await,
        Some(409)
    );
}

/// The same across a crash: a write the store holds when the proxy is
/// killed may still land after the proxy is back (its connection closed
/// with the process, and the store decides within `store_decision_secs`).
/// The restarted proxy knows nothing of it, so for `store_decision_secs`
/// after it starts, a raise waits; the stale object never appears after
/// the raise was answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_in_flight_when_the_proxy_died_holds_back_a_raise_after_its_restart() {
    const HOLD: Duration = Duration::from_secs(4);
    const DECISION: Duration = Duration::from_secs(5);
    let held = Arc::new(support::relay::Held::default());
    let (backend, dir, toml) = held_store(
        "PUT /bkt/in-flight",
        HOLD,
        held.clone(),
        &format!(
            "timeout_secs = 30\nstore_decision_secs = {}",
            DECISION.as_secs()
        ),
    )
    .await;
    let mut proxy = Proxy::start(&toml, dir.path()).await;
    let http = http();
    assert_eq!(
        put(&http, &proxy.url, "warm", &signed(BUCKET, 1), "w").await,
        Some(200)
    );

    let started = Instant::now();
    let url = proxy.url.clone();
    let in_flight = tokio::spawn({
        let http = http.clone();
        async move {
            http.put(format!("{url}/{BUCKET}/in-flight"))
                .header("fencing-token", signed(BUCKET, 1))
                .body("stale")
                .send()
                .await
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    // In flight means past admission and held by the store: the proxy counts
    // a write from its admission, before its bytes leave.
    while !(held.reached()
        && proxy.metric("fencegate_proxy_inflight_writes", &[]).await == Some(1.0))
    {
        assert!(Instant::now() < deadline, "the write never went out");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.kill9();
    assert!(
        in_flight.await.expect("joined").is_err(),
        "the client lost its connection with the proxy"
    );
    let restarted = Instant::now();
    proxy.restart().await;

    let raise = put(&http, &proxy.url, "other-key", &signed(BUCKET, 2), "new").await;
    let raise_waited = restarted.elapsed();
    let at_answer = stored(&backend, BUCKET, "in-flight").await;
    assert_eq!(raise, Some(200), "the raise is admitted in the end");
    tokio::time::sleep_until((started + HOLD + Duration::from_secs(2)).into()).await;
    assert!(
        held.closed(),
        "the dead proxy's connection to the store closed"
    );
    assert_eq!(
        stored(&backend, BUCKET, "in-flight").await,
        at_answer,
        "the store changed after the raise was answered"
    );
    assert_eq!(
        at_answer,
        Some((b"stale".to_vec(), Some(1))),
        "the held request landed (before the raise, as the store decided)"
    );
    assert!(
        raise_waited >= DECISION,
        "the raise waited for the store decision time after the restart: {raise_waited:?}"
    );
}

/// Only a clean stop lets the next start raise at once: after a graceful
/// stop with nothing in flight, the raise is immediate; after a kill -9 it
/// waits `store_decision_secs`, and so it does again after a graceful stop
/// that came within that wait (the killed run's writes could still land).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_after_an_unclean_stop_waits_and_a_clean_stop_does_not() {
    const DECISION: Duration = Duration::from_secs(4);
    let backend = Backend::start(BackendKind::S3Fs).await;
    backend.create_bucket(BUCKET).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let toml = proxy_toml_to(
        &backend,
        dir.path(),
        BUCKET,
        &backend.endpoint,
        &format!("store_decision_secs = {}", DECISION.as_secs()),
    );
    let mut proxy = Proxy::start(&toml, dir.path()).await;
    let http = http();
    let raise = |proxy: &Proxy, token: u64| {
        let (http, url) = (http.clone(), proxy.url.clone());
        async move {
            let sent = Instant::now();
            let status = put(&http, &url, "k", &signed(BUCKET, token), "v").await;
            (status, sent.elapsed())
        }
    };
    assert_eq!(raise(&proxy, 1).await.0, Some(200));

    proxy.terminate();
    proxy.restart().await;
    let (status, took) = raise(&proxy, 2).await;
    assert_eq!(status, Some(200));
    assert!(took < DECISION / 2, "after a clean stop: {took:?}");

    proxy.kill9();
    let started = Instant::now();
    proxy.restart().await;
    // Stopped cleanly, but before the killed run's writes could be ruled out.
    proxy.terminate();
    assert!(
        started.elapsed() < DECISION,
        "the stop came within the wait"
    );
    let started = Instant::now();
    proxy.restart().await;
    let (status, _) = raise(&proxy, 3).await;
    assert_eq!(status, Some(200));
    assert!(
        started.elapsed() >= DECISION,
        "the raise after a stop inside the wait waited again: {:?}",
        started.elapsed()
    );

    // That run waited its wait out: its clean stop counts.
    proxy.terminate();
    proxy.restart().await;
    let (status, took) = raise(&proxy, 4).await;
    assert_eq!(status, Some(200));
    assert!(took < DECISION / 2, "after a clean stop: {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_backend_gets_retryable_errors_and_the_proxy_recovers() {
    let backend = Backend::start(BackendKind::S3Fs).await;
    backend.create_bucket(BUCKET).await;
    let delay = Arc::new(AtomicU64::new(0));
    let relay = delaying_relay(
        backend.endpoint.trim_start_matches("http://").to_owned(),
        delay.clone(),
    )
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let toml = proxy_toml_to(&backend, dir.path(), BUCKET, &relay, "timeout_secs = 1");
    let proxy = Proxy::start(&toml, dir.path()).await;
    let http = http();
    let t = signed(BUCKET, 1);
    assert_eq!(
        put(&http, &proxy.url, "slow", &t, "before").await,
        Some(200)
    );

    delay.store(3000, Ordering::Release);
    for key in ["slow", "slow-new"] {
        let started = Instant::now();
        let status = put(&http, &proxy.url, key, &t, "during").await;
        assert_eq!(
            status,
            Some(503),
            "{key}: a retryable error while the backend is slow"
        );
        assert!(
            started.elapsed() < Duration::from_millis(2900),
            "{key}: answered by the proxy's timeout, not the backend"
        );
    }

    delay.store(0, Ordering::Release);
    tokio::time::sleep(Duration::from_secs(4)).await; // let the held-back answers drain
    assert_eq!(
        put(&http, &proxy.url, "slow", &t, "after").await,
        Some(200),
        "the proxy recovered without a restart"
    );
    assert_eq!(
        put(&http, &proxy.url, "slow", &signed(BUCKET, 2), "newer").await,
        Some(200)
    );
    assert_eq!(put(&http, &proxy.url, "slow", &t, "stale").await, Some(409));
    assert_stored(&backend, BUCKET, "slow", b"newer", 2).await;
}

/// A large upload is read ahead of a slow store: its client sends fast,
/// the store takes 2.5 MB/s, so the proxy holds frames the store has not
/// taken. A raise while the store is still taking it cuts it before its
/// end: the raise is answered, the stale upload is refused, and the stale
/// object never appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raise_cuts_an_upload_read_ahead_of_a_slow_store_before_its_end() {
    use tokio::io::AsyncWriteExt;
    let backend = Backend::start(BackendKind::S3Fs).await;
    backend.create_bucket(BUCKET).await;
    let (relay, passed) = support::relay::throttled_relay(
        backend.endpoint.trim_start_matches("http://").to_owned(),
        256 * 1024,
    )
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let toml = proxy_toml_to(&backend, dir.path(), BUCKET, &relay, "timeout_secs = 60");
    let proxy = Proxy::start(&toml, dir.path()).await;
    let http = http();
    assert_eq!(
        put(&http, &proxy.url, "warm", &signed(BUCKET, 1), "w").await,
        Some(200)
    );
    let lean_before = proxy
        .metric("fencegate_proxy_lean_forwards_total", &[])
        .await
        .unwrap_or(0.0);

    // 32 MiB: at 2.5 MB/s the store needs 13 s for it, far more than the
    // socket buffers and the read-ahead between them hold.
    let total: u64 = 32 * 1024 * 1024;
    let addr = proxy.url.trim_start_matches("http://").to_owned();
    let mut stale = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let head = format!(
        "PUT /{BUCKET}/read-ahead HTTP/1.1\r\nHost: {addr}\r\nFencing-Token: {}\r\nContent-Length: {total}\r\n\r\n",
        signed(BUCKET, 1)
    );
    stale.write_all(head.as_bytes()).await.expect("head");
    let (mut answer, mut body) = stale.into_split();
    let sending = tokio::spawn(async move {
        let chunk = vec![b'1'; 1024 * 1024];
        for _ in 0..total / chunk.len() as u64 {
            if body.write_all(&chunk).await.is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while passed.load(Ordering::Acquire) < 2 * 1024 * 1024 {
        assert!(
            Instant::now() < deadline,
            "the upload never reached the store"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        proxy
            .metric("fencegate_proxy_lean_forwards_total", &[])
            .await,
        Some(lean_before + 1.0),
        "the upload took the lean route, where bodies are read ahead"
    );

    assert_eq!(
        put(&http, &proxy.url, "other", &signed(BUCKET, 2), "new holder").await,
        Some(200),
        "the raise is admitted"
    );
    let at_raise = passed.load(Ordering::Acquire);
    assert!(
        at_raise < total,
        "the store had the whole stale body before the raise ({at_raise} bytes)"
    );
    let text = support::read_answer(&mut answer, Duration::from_secs(20))
        .await
        .unwrap_or_else(|e| panic!("the stale upload gets a whole answer: {e}"));
    assert!(
        text.starts_with("HTTP/1.1 409") && text.contains("<Code>FencingTokenStale</Code>"),
        "the stale upload was not answered stale: {text}"
    );
    sending.abort();
    // What the relay still held reaches the store, then the end of a body
    // short of its length.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        passed.load(Ordering::Acquire) < total,
        "the whole stale body reached the store"
    );
    assert_eq!(
        stored(&backend, BUCKET, "read-ahead").await,
        None,
        "the stale object never appears"
    );
    assert_stored(&backend, BUCKET, "other", b"new holder", 2).await;
}

/// A client that ends its sending side once its request is out (a
/// half-close, as `nc -N` does and as a client dropping its write half
/// does) gets its answer even when the store takes a while: the proxy does
/// not take the end of the client's sending for the client leaving. Before,
/// the connection closed unanswered whenever that end came before the
/// answer, and a writer could not tell a write that landed (or a stale
/// refusal) from a network fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_half_closes_after_its_request_gets_its_answer() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const HOLD: Duration = Duration::from_secs(1);
    let (backend, dir, toml) =
        held_store("half-close-me", HOLD, Arc::default(), "timeout_secs = 10").await;
    let proxy = Proxy::start(&toml, dir.path()).await;
    let addr = proxy.url.trim_start_matches("http://").to_owned();
    let body = "sent, then half-closed";
    let mut conn = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let request = format!(
        "PUT /{BUCKET}/half HTTP/1.1\r\nHost: {addr}\r\nFencing-Token: {}\r\nx-amz-meta-note: half-close-me\r\nContent-Length: {}\r\n\r\n{body}",
        signed(BUCKET, 1),
        body.len()
    );
    let started = Instant::now();
    conn.write_all(request.as_bytes()).await.expect("request");
    conn.shutdown().await.expect("half-close");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), conn.read_to_end(&mut answer))
        .await
        .expect("answered or closed, no hang")
        .expect("readable");
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "the half-closed client was not answered 200 after {:?}: {answer:?}",
        started.elapsed()
    );
    assert!(
        started.elapsed() >= HOLD,
        "the store held the write, so the answer came after its hold (the client's end came first): {:?}",
        started.elapsed()
    );
    assert_stored(&backend, BUCKET, "half", body.as_bytes(), 1).await;
}

/// A DELETE the store holds past the timeout keeps its key until the store
/// answers: the next write of the key decides on what the store holds after
/// the delete, not before (s3s-fs ignores DELETE If-Match, so a write
/// decided before would be deleted by the late DELETE).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_that_timed_out_keeps_its_key_until_the_store_answers() {
    let (backend, dir, toml) = held_store(
        "DELETE /bkt/gone",
        Duration::from_millis(1500),
        Arc::default(),
        "timeout_secs = 1\nstore_decision_secs = 5",
    )
    .await;
    let proxy = Proxy::start(&toml, dir.path()).await;
    let http = http();
    let t = signed(BUCKET, 1);
    assert_eq!(
        put(&http, &proxy.url, "gone", &t, "before").await,
        Some(200)
    );

    let started = Instant::now();
    let status = http
        .delete(format!("{}/{BUCKET}/gone", proxy.url))
        .header("fencing-token", &t)
        .send()
        .await
        .map(|r| r.status().as_u16())
        .ok();
    assert_eq!(status, Some(503), "the held DELETE times out");
    assert!(started.elapsed() < Duration::from_millis(1450));
    assert_eq!(put(&http, &proxy.url, "gone", &t, "again").await, Some(200));
    assert!(
        started.elapsed() >= Duration::from_millis(1450),
        "the next write of the key waited for the DELETE's answer: {:?}",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_stored_as(
        &backend,
        BUCKET,
        "gone",
        b"again",
        1,
        "the write after the delete stands",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_restart_gives_retryable_errors_and_the_proxy_recovers() {
    use fencegate_dev_keys::*;
    // The backend is the s3s-fs of a `fencegate dev` process: it can be
    // killed and restarted on the same port and data directory. The first
    // start takes a port the OS chooses; the restart binds that port again
    // (the proxy is configured with it).
    let data = tempfile::tempdir().expect("tempdir");
    let data_path = data.path().to_owned();
    let start_backend = move |port: u16| {
        let mut cmd = support::fencegate();
        cmd.args([
            "dev",
            "--locksvc-listen",
            "127.0.0.1:0",
            "--proxy-listen",
            "127.0.0.1:0",
        ])
        .args([
            "--backend-listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
        ])
        .arg(&data_path)
        .env("FENCEGATE_LOG", "warn");
        support::Service::start(cmd)
    };
    let mut dev = tokio::task::spawn_blocking({
        let start_backend = start_backend.clone();
        move || start_backend(0)
    })
    .await
    .expect("dev");
    let port: u16 = dev
        .banner_url("backend")
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("backend port");
    let dir = tempfile::tempdir().expect("tempdir");
    let toml = format!(
        r#"
db = "{db}"
allow_anonymous = true
signing_keys = ["{key}"]
probe_bucket = "backups"

[backend]
endpoint = "http://127.0.0.1:{port}"
access_key = "{BACKEND_AK}"
secret_key = "{BACKEND_SK}"
timeout_secs = 2
"#,
        db = dir.path().join("proxy.db").display(),
        key = support::SIGNING_KEY,
    );
    let proxy = Proxy::start(&toml, dir.path()).await;
    let http = http();
    let url = |k: &str| format!("{}/backups/{k}", proxy.url);
    let t = signed("backups", 1);
    let put_b = |key: &'static str, token: String, body: &'static str| {
        let http = http.clone();
        let u = url(key);
        async move {
            http.put(u)
                .header("fencing-token", token)
                .body(body)
                .send()
                .await
                .map(|r| r.status().as_u16())
                .ok()
        }
    };
    assert_eq!(put_b("r", t.clone(), "before").await, Some(200));

    dev.kill9();
    let status = put_b("r", t.clone(), "while down").await;
    assert_eq!(
        status,
        Some(503),
        "a retryable error while the backend is down"
    );

    let _dev = tokio::task::spawn_blocking(move || start_backend(port))
        .await
        .expect("dev again");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match put_b("r", t.clone(), "after").await {
            Some(200) => break,
            Some(503) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            other => panic!("the proxy did not recover: {other:?}"),
        }
    }
    assert_eq!(put_b("r", signed("backups", 2), "newer").await, Some(200));
    assert_eq!(put_b("r", t, "stale").await, Some(409));
    let got = http.get(url("r")).send().await.expect("get");
    assert_eq!(got.text().await.expect("body"), "newer");
}

/// The dev backend's keys (see src/dev.rs).
mod fencegate_dev_keys {
    pub const BACKEND_AK: &str = "fencegate-backend";
    pub const BACKEND_SK: &str = "fencegate-backend-secret";
}

/// The lean forwarder's own connections to the store, against a store
/// that misbehaves at the HTTP level ([`support::relay::quirky_store`] in
/// front of a real s3s-fs): each case is answered as the store meant, and
/// no PUT goes to the store twice.
mod store_connections {
    use super::*;
    use support::relay::{QUIRKY, Quirk, QuirkLog, quirky_store};

    /// Between two writes: time for a close to arrive.
    const PAUSE: Duration = Duration::from_millis(50);

    /// A proxy in front of the store behind `quirk`, and the store.
    async fn quirky(quirk: Quirk) -> (Backend, Proxy, Arc<QuirkLog>, tempfile::TempDir) {
        quirky_with(quirk, "").await
    }

    /// [`quirky`], the proxy's `[backend]` given `backend_options`.
    async fn quirky_with(
        quirk: Quirk,
        backend_options: &str,
    ) -> (Backend, Proxy, Arc<QuirkLog>, tempfile::TempDir) {
        let backend = Backend::start(BackendKind::S3Fs).await;
        backend.create_bucket(BUCKET).await;
        let (relay, log) = quirky_store(
            backend.endpoint.trim_start_matches("http://").to_owned(),
            quirk,
        )
        .await;
        let dir = tempfile::tempdir().expect("tempdir");
        let toml = proxy_toml_to(&backend, dir.path(), BUCKET, &relay, backend_options);
        let proxy = Proxy::start(&toml, dir.path()).await;
        log.turn_on();
        // Time for the proxy to see its earlier connections close.
        tokio::time::sleep(PAUSE).await;
        (backend, proxy, log, dir)
    }

    /// The status and body of a PUT through the proxy.
    async fn put_answer(proxy: &Proxy, key: &str, body: Vec<u8>) -> (u16, String) {
        let r = http()
            .put(format!("{}/{BUCKET}/{key}", proxy.url))
            .header("fencing-token", signed(BUCKET, 1))
            .body(body)
            .send()
            .await
            .expect("the proxy answers");
        (r.status().as_u16(), r.text().await.unwrap_or_default())
    }

    async fn lean_forwards(proxy: &Proxy) -> f64 {
        proxy
            .metric("fencegate_proxy_lean_forwards_total", &[])
            .await
            .unwrap_or(0.0)
    }

    /// Writes `n` keys one after the other, `pause` between them, each
    /// answered 200 and stored once; the connection of each.
    async fn writes_land_once(
        quirk: Quirk,
        n: usize,
        pause: Duration,
    ) -> (Arc<QuirkLog>, Vec<u64>) {
        let (backend, proxy, log, _dir) = quirky(quirk).await;
        let mut connections = Vec::new();
        for i in 0..n {
            let key = format!("{QUIRKY}k{i}");
            let body = format!("body {i}");
            let (status, text) = put_answer(&proxy, &key, body.clone().into_bytes()).await;
            assert_eq!(status, 200, "{quirk:?}: write {i} answered {text}");
            assert_stored(&backend, BUCKET, &key, body.as_bytes(), 1).await;
            let puts = log.puts_of(&format!("/{BUCKET}/{key}"));
            assert_eq!(puts.len(), 1, "{quirk:?}: write {i} reached the store once");
            connections.extend(puts);
            tokio::time::sleep(pause).await;
        }
        assert!(
            lean_forwards(&proxy).await >= n as f64,
            "{quirk:?}: the writes took the lean path"
        );
        (log, connections)
    }

    /// Writes 3 keys the store refuses, each answered `status` with a body
    /// saying `says`, nothing landing, each reaching the store once; the
    /// connection of each.
    async fn writes_refused_once(quirk: Quirk, status: u16, says: &str) -> Vec<u64> {
        let (backend, proxy, log, _dir) = quirky(quirk).await;
        let mut connections = Vec::new();
        for i in 0..3 {
            let key = format!("{QUIRKY}k{i}");
            let (got, text) = put_answer(&proxy, &key, b"refused".to_vec()).await;
            assert_eq!(got, status, "{quirk:?}: {text}");
            assert!(text.contains(says), "{quirk:?}: the store's word: {text}");
            assert_eq!(stored(&backend, BUCKET, &key).await, None, "nothing landed");
            let puts = log.puts_of(&format!("/{BUCKET}/{key}"));
            assert_eq!(puts.len(), 1, "{quirk:?}: write {i} reached the store once");
            connections.extend(puts);
        }
        assert!(
            lean_forwards(&proxy).await >= 3.0,
            "{quirk:?}: the writes took the lean path"
        );
        connections
    }

    /// Every write came on a connection of its own.
    fn each_on_its_own_connection(connections: &[u64]) {
        let distinct: std::collections::HashSet<_> = connections.iter().collect();
        assert_eq!(
            distinct.len(),
            connections.len(),
            "each write on a new connection: {connections:?}"
        );
    }

    /// A connection took the next write after one.
    fn a_connection_reused(connections: &[u64]) {
        assert!(
            connections.windows(2).any(|w| w[0] == w[1]),
            "a connection takes more than one write: {connections:?}"
        );
    }

    /// A store that closes connections while they are idle: each write goes
    /// out on a connection that is open, once, whether the close arrived
    /// long before the next write (50 ms) or just before it (no pause).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_store_closing_idle_connections_gets_each_write_once() {
        for pause in [PAUSE, Duration::ZERO] {
            let (_, connections) = writes_land_once(Quirk::ClosesWhenIdle, 30, pause).await;
            each_on_its_own_connection(&connections);
        }
    }

    /// `Connection: close`: the connection is not used again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_answer_saying_close_ends_its_connection() {
        let (_, connections) = writes_land_once(Quirk::SaysClose, 6, PAUSE).await;
        each_on_its_own_connection(&connections);
    }

    /// A `100 Continue` before the answer is not the answer, and the
    /// connection is kept.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_continue_before_the_answer_is_passed_over() {
        let (_, connections) = writes_land_once(Quirk::Continues, 6, PAUSE).await;
        a_connection_reused(&connections);
    }

    /// An answer whose body ends early: its status was the store's word
    /// (the write landed), and its connection is not used again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_answer_that_ends_early_is_the_stores_word_and_ends_its_connection() {
        let (_, connections) = writes_land_once(Quirk::EndsEarly, 4, PAUSE).await;
        each_on_its_own_connection(&connections);
    }

    /// A chunked error body is read whole: the store's message reaches the
    /// client, and the connection takes the next write.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_chunked_error_is_read_and_its_connection_kept() {
        let connections = writes_refused_once(Quirk::ChunkedError, 503, "chunked slow down").await;
        a_connection_reused(&connections);
    }

    /// An error body too large to keep (1 MiB) is a retryable 503 naming
    /// the store's status, and its connection is not used again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_oversized_error_body_is_a_503_and_ends_its_connection() {
        let connections = writes_refused_once(Quirk::HugeError, 503, "500").await;
        each_on_its_own_connection(&connections);
    }

    /// A store that answers before the body ends (a 4 MiB body refused on
    /// its head): the client gets the store's answer, not a failure of the
    /// send, and the next write is answered the same way.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_store_answering_before_the_body_ends_is_heard() {
        let (backend, proxy, log, _dir) = quirky(Quirk::AnswersEarly).await;
        for i in 0..2 {
            let key = format!("{QUIRKY}big{i}");
            let (status, text) = put_answer(&proxy, &key, vec![b'x'; 4 << 20]).await;
            assert_eq!(status, 403, "{text}");
            assert!(text.contains("AccessDenied"), "the store's code: {text}");
            assert_eq!(stored(&backend, BUCKET, &key).await, None, "nothing landed");
            assert_eq!(log.puts_of(&format!("/{BUCKET}/{key}")).len(), 1);
        }
        assert!(
            lean_forwards(&proxy).await >= 2.0,
            "the writes took the lean path"
        );
    }

    /// How long the proxy gives a store to commit a request it may hold
    /// (`store_decision_secs`) in the tests of lost answers.
    const DECISION: Duration = Duration::from_secs(4);

    /// Guarantee 3 when the store's connection ends after the whole
    /// request left and before its answer: `send` (a write of `key` with
    /// token 1) is answered a retryable 503 saying the write may still
    /// land, and the raise that comes next (token 2) waits until it can no
    /// longer land; the store, which commits the request [`LATE`] after
    /// closing, never changes after the raise was answered.
    async fn a_lost_answer_holds_back_a_raise<F, Fut>(quirk: Quirk, key: &str, send: F)
    where
        F: FnOnce(Proxy) -> Fut,
        Fut: std::future::Future<Output = (Proxy, u16, String)>,
    {
        use support::relay::LATE;
        let (backend, proxy, log, _dir) = quirky_with(
            quirk,
            &format!("store_decision_secs = {}", DECISION.as_secs()),
        )
        .await;
        assert_eq!(
            put(&http(), &proxy.url, "warm", &signed(BUCKET, 1), "w").await,
            Some(200)
        );
        let started = Instant::now();
        let (proxy, status, text) = send(proxy).await;
        assert_eq!(status, 503, "a retryable answer: {text}");
        assert!(
            text.contains("<Code>ServiceUnavailable</Code>") && text.contains("may still land"),
            "{text}"
        );
        assert!(
            started.elapsed() < LATE,
            "answered when the connection ended"
        );
        assert_eq!(
            log.puts_of(&format!("/{BUCKET}/{key}")).len(),
            1,
            "sent once"
        );
        assert_eq!(
            proxy.metric("fencegate_proxy_lingering_writes", &[]).await,
            Some(1.0),
            "the write whose answer was lost is held"
        );

        let raise_sent = Instant::now();
        let raise = put(&http(), &proxy.url, "other", &signed(BUCKET, 2), "new").await;
        let raise_waited = raise_sent.elapsed();
        let at_answer = stored(&backend, BUCKET, key).await;
        assert_eq!(raise, Some(200), "the raise is admitted in the end");
        tokio::time::sleep_until((started + LATE + Duration::from_secs(2)).into()).await;
        assert_eq!(
            stored(&backend, BUCKET, key).await,
            at_answer,
            "the store changed after the raise was answered"
        );
        assert_eq!(
            at_answer.map(|(_, token)| token),
            Some(Some(1)),
            "the write landed late, before the raise was answered"
        );
        assert!(
            raise_waited >= DECISION - Duration::from_secs(1),
            "the raise waited out the store's decision time: {raise_waited:?}"
        );
        assert_eq!(
            proxy.metric("fencegate_proxy_lingering_writes", &[]).await,
            Some(0.0)
        );
    }

    /// A PutObject on the lean path whose answer is lost.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_put_whose_answer_is_lost_holds_back_a_raise() {
        a_lean_put_holds_back_a_raise(Quirk::CommitsUnanswered).await;
    }

    /// A PutObject on the lean path answered with what no client can read:
    /// the store may have committed it as well.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_put_answered_unreadably_holds_back_a_raise() {
        a_lean_put_holds_back_a_raise(Quirk::CommitsGarbled).await;
    }

    async fn a_lean_put_holds_back_a_raise(quirk: Quirk) {
        let key = format!("{QUIRKY}late");
        let path = key.clone();
        a_lost_answer_holds_back_a_raise(quirk, &key, |proxy| async move {
            let before = lean_forwards(&proxy).await;
            let (status, text) = put_answer(&proxy, &path, b"stale".to_vec()).await;
            assert_eq!(lean_forwards(&proxy).await, before + 1.0, "the lean path");
            (proxy, status, text)
        })
        .await;
    }

    /// A CopyObject, which the SDK's client sends, whose answer is lost.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_copy_whose_answer_is_lost_holds_back_a_raise() {
        let key = format!("{QUIRKY}copy");
        let path = key.clone();
        a_lost_answer_holds_back_a_raise(Quirk::CommitsUnanswered, &key, |proxy| async move {
            let before = lean_forwards(&proxy).await;
            let r = http()
                .put(format!("{}/{BUCKET}/{path}", proxy.url))
                .header("fencing-token", signed(BUCKET, 1))
                .header("x-amz-copy-source", format!("/{BUCKET}/warm"))
                .send()
                .await
                .expect("the proxy answers");
            let status = r.status().as_u16();
            let text = r.text().await.unwrap_or_default();
            assert_eq!(lean_forwards(&proxy).await, before, "not the lean path");
            (proxy, status, text)
        })
        .await;
    }
}
