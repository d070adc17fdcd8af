//! The clients: holders that take the lease, write through any proxy,
//! renew, release, and pause past their lease (a stale writer), and a
//! probe writing to etcd itself (the floor to compare with). Everything
//! they do is recorded with its answer and times.

use crate::cluster::{BUCKET, ETCD, LOCKSVC, PROBE_BUCKET, PROXIES};

/// The probe's client number in the history.
pub const PROBE_CLIENT: usize = 99;
use fencegate_testkit::history::{LeaseCall, LeaseOp, Write};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::seq::SliceRandom as _;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// What an attempt asked of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// A lease call, of a holder or of the probe.
    Lease,
    /// A holder's write.
    Write,
    /// The probe's write, through one proxy.
    Probe,
    /// A write to etcd itself.
    Etcd,
}

/// One attempt for the availability figures: the node it went to, when,
/// and whether it got an answer that is not a failure (a 2xx or a 4xx
/// that decides, such as 409 stale; not a 5xx, not silence).
#[derive(Debug, Clone, Copy)]
pub struct Attempt {
    pub service: Service,
    pub via: usize,
    pub at: Duration,
    pub took: Duration,
    pub answered: bool,
    /// Answered 200.
    pub admitted: bool,
}

/// Everything the clients did.
pub struct Recorder {
    pub start: Instant,
    pub leases: Mutex<Vec<LeaseOp>>,
    pub writes: Mutex<Vec<Write>>,
    pub attempts: Mutex<Vec<Attempt>>,
    /// Each refusal's status and S3 error code: how many, and the first
    /// message.
    pub refusals: Mutex<BTreeMap<(u16, String), (usize, String)>>,
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder {
            start: Instant::now(),
            leases: Mutex::default(),
            writes: Mutex::default(),
            attempts: Mutex::default(),
            refusals: Mutex::default(),
        }
    }

    pub fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn attempt(&self, service: Service, via: usize, at: Duration, status: Option<u16>) {
        let took = self.now() - at;
        self.attempts.lock().push(Attempt {
            service,
            via,
            at,
            took,
            answered: status.is_some_and(|s| s < 500),
            admitted: status == Some(200),
        });
    }
}

/// A lease a holder believes it has.
struct Held {
    token: u64,
    signed: String,
    ttl: Duration,
}

/// Sends one lease call: its status (None: no answer) and body.
async fn call(
    http: &reqwest::Client,
    url: String,
    body: Value,
    timeout: Duration,
) -> (Option<u16>, Value) {
    match http.post(url).json(&body).timeout(timeout).send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            (Some(status), r.json().await.unwrap_or(Value::Null))
        }
        Err(_) => (None, Value::Null),
    }
}

/// PUTs `payload` to `url` with `token`: the status (None: no answer
/// within 30 s, more than a raise that waits out an unreachable replica:
/// `ack_timeout` and `lock_delay`, 26 s), and whether the answer said
/// nothing was written. A refusal's S3 code is counted in `rec`.
async fn put(
    http: &reqwest::Client,
    url: String,
    token: &str,
    payload: &str,
    rec: &Recorder,
) -> (Option<u16>, bool) {
    match http
        .put(url)
        .header("fencing-token", token)
        .body(payload.to_owned())
        .timeout(Duration::from_secs(30))
        .send()
        .await
    {
        Ok(r) if r.status().is_success() => (Some(r.status().as_u16()), false),
        Ok(r) => {
            let status = r.status().as_u16();
            let text = r.text().await.unwrap_or_default();
            let code = crate::support::xml_value(&text, "Code").unwrap_or_default();
            let message = crate::support::xml_value(&text, "Message").unwrap_or_default();
            let nothing = status < 500 || message.contains("nothing was written");
            rec.refusals
                .lock()
                .entry((status, code))
                .or_insert((0, message))
                .0 += 1;
            (Some(status), nothing)
        }
        Err(_) => (None, false),
    }
}

/// Holder `c`: until `until`, takes the lease (waiting in line), writes
/// to a key of its own or to one of the shared keys, renews, releases, or
/// pauses past its lease and writes on with its old token.
pub async fn holder(
    c: usize,
    seed: u64,
    locksvc: Vec<String>,
    proxies: Vec<String>,
    rec: &Recorder,
    until: Instant,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ (c as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let http = reqwest::Client::new();
    let mut held: Option<Held> = None;
    let mut n = 0u64;
    while Instant::now() < until {
        n += 1;
        let svc = rng.gen_range(0..locksvc.len());
        let lease_url = |what: &str| format!("{}/v1/locks/{BUCKET}/{what}", locksvc[svc]);
        let Some(h) = &held else {
            let ttl = Duration::from_millis(rng.gen_range(1500..4000));
            let invoked = rec.now();
            let (status, body) = call(
                &http,
                lease_url("acquire"),
                json!({"owner": format!("c{c}"), "ttl_ms": ttl.as_millis() as u64, "wait_ms": 3000}),
                Duration::from_secs(8),
            )
            .await;
            let answered = rec.now();
            let token = body["token"].as_u64();
            rec.attempt(Service::Lease, LOCKSVC[svc], invoked, status);
            rec.leases.lock().push(LeaseOp {
                client: c,
                lock: BUCKET.into(),
                call: LeaseCall::Acquire,
                ttl,
                invoked,
                answered,
                token,
                status,
            });
            match (status, token, body["fencing_token"].as_str()) {
                (Some(200), Some(token), Some(signed)) => {
                    held = Some(Held {
                        token,
                        signed: signed.to_owned(),
                        ttl,
                    });
                }
                _ => tokio::time::sleep(Duration::from_millis(rng.gen_range(100..400))).await,
            }
            continue;
        };
        match rng.gen_range(0..100) {
            0..=69 => {
                let via = rng.gen_range(0..proxies.len());
                let key = if rng.gen_range(0..3) == 0 {
                    format!("shared/k{}", rng.gen_range(0..4))
                } else {
                    format!("c{c}/{n}")
                };
                let payload = format!("c{c} n{n} t{}", h.token);
                let sent = rec.now();
                let url = format!("{}/{BUCKET}/{key}", proxies[via]);
                let (status, nothing_written) = put(&http, url, &h.signed, &payload, rec).await;
                rec.attempt(Service::Write, PROXIES[via], sent, status);
                rec.writes.lock().push(Write {
                    client: c,
                    lock: BUCKET.into(),
                    key,
                    token: h.token,
                    payload,
                    sent,
                    answered: rec.now(),
                    status,
                    nothing_written,
                });
                // A holder told it is stale stops writing and takes the
                // lease again.
                if status == Some(409) {
                    held = None;
                }
            }
            70..=87 => {
                let release = rng.gen_range(0..3) == 0;
                let (what, call_kind, body) = if release {
                    ("release", LeaseCall::Release, json!({"token": h.signed}))
                } else {
                    (
                        "renew",
                        LeaseCall::Renew,
                        json!({"token": h.signed, "ttl_ms": h.ttl.as_millis() as u64}),
                    )
                };
                let invoked = rec.now();
                let (status, _) = call(&http, lease_url(what), body, Duration::from_secs(5)).await;
                rec.attempt(Service::Lease, LOCKSVC[svc], invoked, status);
                rec.leases.lock().push(LeaseOp {
                    client: c,
                    lock: BUCKET.into(),
                    call: call_kind,
                    ttl: h.ttl,
                    invoked,
                    answered: rec.now(),
                    token: Some(h.token),
                    status,
                });
                if release || status == Some(409) {
                    held = None;
                }
            }
            _ => {
                // A pause past the lease (a GC, a stalled VM): the holder
                // then writes on with the token it has.
                tokio::time::sleep(h.ttl.mul_f64(rng.gen_range(0.5..1.6))).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(50..200))).await;
    }
}

/// Writes a key to a random etcd member (its JSON gateway) every 100 ms
/// until `until`: etcd's own availability under the same faults.
pub async fn etcd_probe(seed: u64, etcd: Vec<String>, rec: &Recorder, until: Instant) {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut rng = StdRng::seed_from_u64(seed);
    let http = reqwest::Client::new();
    while Instant::now() < until {
        let member = *[0usize, 1, 2].choose(&mut rng).expect("members");
        let at = rec.now();
        let (status, body) = call(
            &http,
            format!("{}/v3/kv/put", etcd[member]),
            json!({"key": b64.encode("nemesis-probe"), "value": b64.encode(format!("{at:?}"))}),
            Duration::from_secs(2),
        )
        .await;
        // The gateway answers 200 with an error body when etcd refuses.
        let status = status.map(|s| {
            if s == 200 && body["header"].is_null() {
                503
            } else {
                s
            }
        });
        rec.attempt(Service::Etcd, ETCD[member], at, status);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The probe's lease on its own lock: its token, signed.
type ProbeLease = parking_lot::Mutex<Option<(u64, String)>>;

/// The probe: one lease on a lock of its own (`PROBE_BUCKET`), kept alive
/// through either lease service, and a write through each proxy every
/// 100 ms with it, until `until`. Nothing contends for it, so what it
/// sees is what the faults do: availability, not contention.
pub async fn probe(locksvc: Vec<String>, proxies: Vec<String>, rec: &Recorder, until: Instant) {
    let lease: ProbeLease = parking_lot::Mutex::new(None);
    let keeper = async {
        let http = reqwest::Client::new();
        let mut n = 0usize;
        while Instant::now() < until {
            n += 1;
            let svc = n % locksvc.len();
            let held = lease.lock().clone();
            let url = |what: &str| format!("{}/v1/locks/{PROBE_BUCKET}/{what}", locksvc[svc]);
            let (call_kind, url, body) = match &held {
                None => (
                    LeaseCall::Acquire,
                    url("acquire"),
                    json!({"owner": "probe", "ttl_ms": 30_000, "wait_ms": 10_000}),
                ),
                Some((_, signed)) => (
                    LeaseCall::Renew,
                    url("renew"),
                    json!({"token": signed, "ttl_ms": 30_000}),
                ),
            };
            let invoked = rec.now();
            let (status, body) = call(&http, url, body, Duration::from_secs(12)).await;
            rec.attempt(Service::Lease, LOCKSVC[svc], invoked, status);
            let token = held.as_ref().map(|(t, _)| *t).or(body["token"].as_u64());
            rec.leases.lock().push(LeaseOp {
                client: PROBE_CLIENT,
                lock: PROBE_BUCKET.into(),
                call: call_kind,
                ttl: Duration::from_secs(30),
                invoked,
                answered: rec.now(),
                token,
                status,
            });
            match (status, call_kind) {
                (Some(200), LeaseCall::Acquire) => {
                    *lease.lock() = token.zip(body["fencing_token"].as_str().map(str::to_owned));
                }
                (Some(409), LeaseCall::Renew) => *lease.lock() = None,
                (Some(200), _) => {}
                // Another lease service at once.
                _ => continue,
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    };
    let writers = futures::future::join_all(proxies.iter().enumerate().map(|(p, url)| {
        let lease = &lease;
        async move {
            let http = reqwest::Client::new();
            let mut n = 0u64;
            while Instant::now() < until {
                n += 1;
                let held = lease.lock().clone();
                if let Some((token, signed)) = held {
                    let key = format!("p{p}/{n}");
                    let payload = format!("probe p{p} n{n} t{token}");
                    let sent = rec.now();
                    let url = format!("{url}/{PROBE_BUCKET}/{key}");
                    let (status, nothing_written) = put(&http, url, &signed, &payload, rec).await;
                    rec.attempt(Service::Probe, PROXIES[p], sent, status);
                    rec.writes.lock().push(Write {
                        client: PROBE_CLIENT,
                        lock: PROBE_BUCKET.into(),
                        key,
                        token,
                        payload,
                        sent,
                        answered: rec.now(),
                        status,
                        nothing_written,
                    });
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }));
    futures::join!(keeper, writers);
}
