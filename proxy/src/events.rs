//! Fence events: the recent fence decisions that refused something.
//!
//! When a backup job is fenced at 3 a.m., the operator asks which job was
//! the zombie, what it tried to write and who holds the lock now. Each
//! refusal of a write by the fence (a token below the max, a token the
//! proxy cannot verify, a key no scope fences, a write cut in flight by a
//! newer token) becomes one [`FenceEvent`]: kept in a bounded ring (the
//! newest [`FenceEvents::capacity`]; a burst of refusals replaces old events
//! and never grows memory), served as JSON at `/_fencegate/events` and on
//! the status page, and logged as one structured line (at most 100 lines a
//! second: a burst is summarised by one line saying how many were not).
//!
//! The rings and the log budgets are shared, bounded resources, so who may
//! take them is decided as for any other: a refusal whose token was
//! verified (a real holder's, stale or cut) goes to rings and a budget of
//! its own, which nothing unproven can take; every other refusal (a forged
//! or unverified token, an unscoped key) shares its kind's other ring, in
//! which one source (a client key, else a remote address) keeps at most a
//! tenth: a flood from one source replaces its own events, not others'.
//!
//! An event holds numbers and names only: the token number, never the
//! signed token; the access key id of a configured client, never a secret;
//! a lease-bound access key as its lock and token (`lease-bound:<lock>:<n>`).
//!
//! What a refusal site does not know (the request's key, its client, where
//! it came from) comes from the request's [`Attempt`], a task-local the
//! server opens around each request and the gate fills in as it learns.

use crate::op::Op;
use parking_lot::Mutex;
use serde::Serialize;
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;

/// Longest key kept in an event (longer ones are cut, marked with `…`).
const MAX_KEY_CHARS: usize = 1024;
/// Tokens per lock whose lease owner is remembered.
const OWNERS_PER_LOCK: usize = 16;
/// Locks whose owners are remembered.
const OWNER_LOCKS: usize = 4096;
/// An unverified refusal's source keeps at most this fraction of its ring.
const SHARES: usize = 10;
/// Event lines logged per second at most; beyond, the next line after the
/// second says how many were not (all are in the ring and the metrics).
const LOG_LINES_PER_SEC: u32 = 100;

/// What the fence refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A token below the lock's max, or below the key's stored token.
    Stale,
    /// A write admitted, then cut in flight by a newer token.
    Cut,
    /// A token the proxy cannot verify: bad signature, another lock's,
    /// unsigned where signed ones are required, not issued, malformed.
    Forged,
    /// A key no configured scope fences.
    Unscoped,
}

impl Kind {
    const COUNT: usize = 4;

    fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Stale => "stale",
            Kind::Cut => "cut",
            Kind::Forged => "forged",
            Kind::Unscoped => "unscoped",
        }
    }
}

/// One refusal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FenceEvent {
    /// Numbers the events of this run in order, from 1.
    pub seq: u64,
    /// When, in Unix milliseconds.
    pub at_ms: u64,
    pub kind: Kind,
    /// The S3 operation (`PutObject`, ...).
    pub op: String,
    pub bucket: String,
    pub key: String,
    /// The fence scope (`bucket` or `bucket/prefix`), if the key has one.
    pub scope: Option<String>,
    pub lock: Option<String>,
    /// The token number presented.
    pub token: Option<u64>,
    /// The max it was refused against (for stale and cut writes).
    pub max: Option<u64>,
    /// Who sent it: the access key id, or `lease-bound:<lock>:<token>`.
    pub client: Option<String>,
    /// The lease owner the presented token was issued to, when the proxy
    /// learned it from the lease service (never for a forged token: its
    /// number is only a claim).
    pub owner: Option<String>,
    /// The owner of the max's lease (who holds the lock now, or last did).
    pub holder: Option<String>,
    /// Where the request came from.
    pub remote: Option<String>,
    /// The refusal, as the client was told.
    pub reason: String,
    /// Whether the presented token was verified (then its owner may be
    /// filled in when learned later).
    #[serde(skip)]
    verified: bool,
    /// Who sent it, for the share of an unverified refusal: the client
    /// key, else the remote address (no port).
    #[serde(skip)]
    source: Option<String>,
}

/// What is known of the request being served, as the gate learns it.
#[derive(Debug, Default, Clone)]
pub struct Attempt {
    pub remote: Option<SocketAddr>,
    pub bucket: Option<String>,
    pub key: Option<String>,
    pub client: Option<String>,
    /// Whether the token presented was verified (signed, lease-bound,
    /// confirmed by the lease service, or trusted by the operator's
    /// `accept_unsigned_tokens`): only then does its number name an owner.
    pub verified: bool,
}

tokio::task_local! {
    static ATTEMPT: RefCell<Attempt>;
}

/// Runs `fut` (one request) with an [`Attempt`] that starts with its
/// remote address. The attempt's texts go back to this thread's spares
/// when the request ends, so the next request's notes take no memory.
pub async fn attempt<F: std::future::Future>(remote: Option<SocketAddr>, fut: F) -> F::Output {
    let mut scoped = std::pin::pin!(ATTEMPT.scope(
        RefCell::new(Attempt {
            remote,
            ..Attempt::default()
        }),
        fut,
    ));
    let out = scoped.as_mut().await;
    if let Some(a) = scoped.as_mut().take_value() {
        let a = a.into_inner();
        SPARE_TEXTS.with_borrow_mut(|spares| {
            for text in [a.bucket, a.key, a.client].into_iter().flatten() {
                if spares.len() < SPARES && text.capacity() <= SPARE_CAPACITY {
                    spares.push(text);
                }
            }
        });
    }
    out
}

/// Texts kept per serving thread for the next requests' notes, and the
/// largest kept (a key may be long; most are not).
const SPARES: usize = 8;
const SPARE_CAPACITY: usize = 1024;

thread_local! {
    static SPARE_TEXTS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// `slot` set to `text`, in a spare string if it has none.
fn note(slot: &mut Option<String>, text: &str) {
    if slot.as_deref() == Some(text) {
        return;
    }
    let out = slot.get_or_insert_with(|| SPARE_TEXTS.with_borrow_mut(Vec::pop).unwrap_or_default());
    out.clear();
    out.push_str(text);
}

/// Records what the request writes (outside a request: nothing).
pub fn note_target(bucket: &str, key: &str) {
    let _ = ATTEMPT.try_with(|a| {
        let mut a = a.borrow_mut();
        note(&mut a.bucket, bucket);
        note(&mut a.key, key);
    });
}

/// Records who sent the request: a configured access key id as it is, a
/// lease-bound one as its lock and token (see the module docs).
pub fn note_client(access_key: &str) {
    use fencegate_core::credentials::{is_lease_access_key, parse_access_key};
    if !is_lease_access_key(access_key) {
        let _ = ATTEMPT.try_with(|a| note(&mut a.borrow_mut().client, access_key));
        return;
    }
    let client = match parse_access_key(access_key) {
        Ok(k) => format!("lease-bound:{}:{}", k.lock, k.token),
        Err(_) => "lease-bound:(unreadable)".to_owned(),
    };
    let _ = ATTEMPT.try_with(|a| a.borrow_mut().client = Some(client));
}

/// Records that the request's token is genuine (see [`Attempt::verified`]).
pub fn note_verified() {
    let _ = ATTEMPT.try_with(|a| a.borrow_mut().verified = true);
}

fn current() -> Attempt {
    ATTEMPT.try_with(|a| a.borrow().clone()).unwrap_or_default()
}

/// What a refusal site knows.
#[derive(Debug, Clone)]
pub struct Refused<'a> {
    pub kind: Kind,
    pub op: Op,
    pub scope: Option<&'a crate::scope::Scope>,
    pub token: Option<u64>,
    pub max: Option<u64>,
    pub reason: String,
}

/// The rings of recent events (one per kind, so a flood of one kind,
/// forged tokens say, cannot push a zombie's stale write out of sight),
/// and the lease owners learned per token.
#[derive(Debug)]
pub struct FenceEvents {
    capacity: usize,
    ring: Mutex<Rings>,
    owners: Mutex<Owners>,
}

#[derive(Debug, Default)]
struct Rings {
    /// Indexed by [`pool`].
    events: [VecDeque<FenceEvent>; POOLS],
    /// And a log budget per pool.
    log: [LogBudget; POOLS],
    recorded: u64,
}

/// A ring (and a log budget) per kind for refusals of verified tokens,
/// and another per kind for the rest.
const POOLS: usize = Kind::COUNT * 2;

fn pool(kind: Kind, verified: bool) -> usize {
    kind.index() * 2 + usize::from(verified)
}

/// Owners per lock, the locks in the order first seen (the oldest is
/// forgotten when there are too many).
#[derive(Debug, Default)]
struct Owners {
    by_lock: HashMap<String, VecDeque<(u64, String)>>,
    order: VecDeque<String>,
}

/// How many event lines this second may still log.
#[derive(Debug, Default)]
struct LogBudget {
    second: Option<std::time::Instant>,
    logged: u32,
    suppressed: u64,
}

impl LogBudget {
    /// Whether to log one more line now; `Some(n)` also when `n` lines
    /// were held back in the second that just ended.
    fn take(&mut self, now: std::time::Instant) -> (bool, u64) {
        let mut held_back = 0;
        if self
            .second
            .is_none_or(|s| now.duration_since(s) >= std::time::Duration::from_secs(1))
        {
            self.second = Some(now);
            self.logged = 0;
            held_back = std::mem::take(&mut self.suppressed);
        }
        if self.logged < LOG_LINES_PER_SEC {
            self.logged += 1;
            (true, held_back)
        } else {
            self.suppressed += 1;
            (false, held_back)
        }
    }
}

impl FenceEvents {
    pub fn new(capacity: usize) -> FenceEvents {
        FenceEvents {
            capacity: capacity.max(1),
            ring: Mutex::new(Rings::default()),
            owners: Mutex::new(Owners::default()),
        }
    }

    /// How many events of each kind are kept at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Records a refusal with what the request's [`Attempt`] knows, and
    /// logs it as one structured line.
    pub fn refused(&self, r: Refused<'_>) {
        let a = current();
        let mut key = a.key.unwrap_or_default();
        if key.chars().count() > MAX_KEY_CHARS {
            key = key.chars().take(MAX_KEY_CHARS).collect::<String>() + "…";
        }
        let mut event = FenceEvent {
            seq: 0,
            at_ms: crate::clock::unix_ms(),
            kind: r.kind,
            op: r.op.name().to_owned(),
            bucket: a
                .bucket
                .or_else(|| r.scope.map(|s| s.bucket.clone()))
                .unwrap_or_default(),
            key,
            scope: r.scope.map(|s| s.id.clone()),
            lock: r.scope.map(|s| s.lock.to_string()),
            token: r.token,
            max: r.max,
            client: a.client.clone(),
            owner: None,
            holder: None,
            remote: a.remote.map(|r| r.to_string()),
            reason: r.reason,
            verified: a.verified,
            source: a
                .client
                .clone()
                .or_else(|| a.remote.map(|r| r.ip().to_string())),
        };
        self.fill_owners(&mut event);
        let k = pool(event.kind, event.verified);
        let (log, held_back) = {
            let mut ring = self.ring.lock();
            let budget = ring.log[k].take(std::time::Instant::now());
            ring.recorded += 1;
            event.seq = ring.recorded;
            let kept = &mut ring.events[k];
            if !event.verified
                && let Some(source) = &event.source
            {
                let share = (self.capacity / SHARES).max(1);
                let mine = kept.iter().filter(|e| e.source.as_ref() == Some(source));
                if mine.count() >= share
                    && let Some(oldest) =
                        kept.iter().position(|e| e.source.as_ref() == Some(source))
                {
                    kept.remove(oldest);
                }
            }
            if kept.len() == self.capacity {
                kept.pop_front();
            }
            let log = budget.0.then(|| event.clone());
            kept.push_back(event);
            (log, budget.1)
        };
        // Logged outside the lock: a slow stderr holds up no refusal.
        if held_back > 0 {
            tracing::warn!(
                target: "fencegate::fence_event",
                not_logged = held_back,
                kind = r.kind.as_str(),
                "more than {LOG_LINES_PER_SEC} {} fence events in a second: {held_back} were not logged (each is in /_fencegate/events while kept, and in fencegate_proxy_writes)",
                r.kind.as_str()
            );
        }
        if let Some(event) = log {
            Self::log(&event);
        }
    }

    /// The event's structured line.
    fn log(event: &FenceEvent) {
        tracing::warn!(
            target: "fencegate::fence_event",
            kind = event.kind.as_str(),
            op = %event.op,
            bucket = %line_safe(&event.bucket),
            key = %line_safe(&event.key),
            scope = %line_safe(event.scope.as_deref().unwrap_or("")),
            lock = event.lock.as_deref().unwrap_or(""),
            token = event.token,
            max = event.max,
            client = %line_safe(event.client.as_deref().unwrap_or("")),
            owner = %line_safe(event.owner.as_deref().unwrap_or("")),
            holder = %line_safe(event.holder.as_deref().unwrap_or("")),
            remote = event.remote.as_deref().unwrap_or(""),
            reason = %line_safe(&event.reason),
            "fence refused a write"
        );
    }

    /// The newest `limit` kept events of every kind, newest first, and
    /// how many were recorded in all.
    pub fn recent(&self, limit: usize) -> (Vec<FenceEvent>, u64) {
        let ring = self.ring.lock();
        let ring_recorded = ring.recorded;
        let mut newest: Vec<&FenceEvent> = ring
            .events
            .iter()
            .flat_map(|kind| kind.iter().rev().take(limit))
            .collect();
        newest.sort_unstable_by_key(|e| std::cmp::Reverse(e.seq));
        newest.truncate(limit);
        let mut out: Vec<FenceEvent> = newest.into_iter().cloned().collect();
        drop(ring);
        for e in &mut out {
            self.fill_owners(e);
        }
        (out, ring_recorded)
    }

    /// Names the owner of the presented token (only if the token was
    /// verified: an unverified number names somebody else's lease) and the
    /// holder of the max, as far as they are known. Owners are learned off
    /// the write path, so one may arrive after its event; a token's owner
    /// never changes, so this runs again when the events are read.
    fn fill_owners(&self, e: &mut FenceEvent) {
        let Some(lock) = e.lock.as_deref() else {
            return;
        };
        if e.holder.is_none()
            && let Some(max) = e.max
        {
            e.holder = self.owner_of(lock, max);
        }
        if e.owner.is_none()
            && e.verified
            && matches!(e.kind, Kind::Stale | Kind::Cut)
            && let Some(token) = e.token
        {
            e.owner = self.owner_of(lock, token);
        }
    }

    /// The events as `/_fencegate/events` serves them.
    pub fn to_json(&self) -> serde_json::Value {
        let (events, recorded) = self.recent(self.capacity * POOLS);
        serde_json::json!({
            "capacity": self.capacity,
            "recorded": recorded,
            "kept": events.len(),
            "events": events,
        })
    }

    /// Remembers that `token` of `lock` was issued to `owner` (learned from
    /// the lease service). Bounded: a few tokens per lock, a few thousand
    /// locks.
    pub fn learn_owner(&self, lock: &str, token: u64, owner: String) {
        let mut owners = self.owners.lock();
        let Owners { by_lock, order } = &mut *owners;
        if !by_lock.contains_key(lock) {
            if by_lock.len() >= OWNER_LOCKS
                && let Some(oldest) = order.pop_front()
            {
                by_lock.remove(&oldest);
            }
            order.push_back(lock.to_owned());
        }
        let tokens = by_lock.entry(lock.to_owned()).or_default();
        if tokens.iter().any(|(t, _)| *t == token) {
            return;
        }
        if tokens.len() == OWNERS_PER_LOCK {
            tokens.pop_front();
        }
        tokens.push_back((token, owner));
    }

    /// The owner `token` of `lock` was issued to, if learned.
    pub fn owner_of(&self, lock: &str, token: u64) -> Option<String> {
        let owners = self.owners.lock();
        owners
            .by_lock
            .get(lock)?
            .iter()
            .find(|(t, _)| *t == token)
            .map(|(_, o)| o.clone())
    }
}

/// `s` with control characters escaped, for a text log line: a key may
/// hold a newline, which would otherwise start a forged line.
fn line_safe(s: &str) -> std::borrow::Cow<'_, str> {
    if s.chars().any(char::is_control) {
        std::borrow::Cow::Owned(s.escape_debug().to_string())
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope() -> crate::scope::Scope {
        crate::scope::Scope::new(crate::scope::ScopeDef {
            id: "b/p".into(),
            bucket: "b".into(),
            prefix: "p".into(),
            lock: fencegate_core::LockName::new("db").expect("lock"),
        })
    }

    fn stale(events: &FenceEvents, token: u64) {
        events.refused(Refused {
            kind: Kind::Stale,
            op: crate::op::Op::PutObject,
            scope: Some(&scope()),
            token: Some(token),
            max: Some(token + 1),
            reason: "stale".into(),
        });
    }

    #[tokio::test]
    async fn a_request_sees_only_its_own_notes_in_reused_texts() {
        attempt(None, async {
            note_target("bucket-one", "key-one");
            note_client("AKIDONE");
        })
        .await;
        assert_eq!(
            SPARE_TEXTS.with_borrow(Vec::len),
            3,
            "the first request's texts are kept for reuse"
        );
        let second = attempt(None, async {
            let before = current();
            note_target("b2", "k2");
            (before, current())
        })
        .await;
        let (before, after) = second;
        assert_eq!(
            (before.bucket, before.key, before.client),
            (None, None, None),
            "nothing of the first request shows in the second"
        );
        assert_eq!(after.bucket.as_deref(), Some("b2"));
        assert_eq!(after.key.as_deref(), Some("k2"));
        assert_eq!(after.client, None);
    }

    #[tokio::test]
    async fn the_ring_keeps_the_newest_and_counts_all() {
        let events = FenceEvents::new(3);
        for t in 1..=10 {
            stale(&events, t);
        }
        let (kept, recorded) = events.recent(100);
        assert_eq!(recorded, 10);
        assert_eq!(
            kept.iter().map(|e| e.token).collect::<Vec<_>>(),
            vec![Some(10), Some(9), Some(8)]
        );
        assert_eq!(kept[0].seq, 10);
    }

    #[tokio::test]
    async fn an_event_takes_the_request_attempt_and_the_learned_owners() {
        let events = FenceEvents::new(10);
        events.learn_owner("db", 4, "job-a".into());
        events.learn_owner("db", 5, "job-b".into());
        let remote: SocketAddr = "127.0.0.1:4000".parse().expect("addr");
        attempt(Some(remote), async {
            note_target("b", "p/x");
            note_client("AKIDJOB");
            note_verified();
            stale(&events, 4);
        })
        .await;
        let (kept, _) = events.recent(1);
        let e = &kept[0];
        assert_eq!(e.key, "p/x");
        assert_eq!(e.client.as_deref(), Some("AKIDJOB"));
        assert_eq!(e.owner.as_deref(), Some("job-a"));
        assert_eq!(e.holder.as_deref(), Some("job-b"));
        assert_eq!(e.remote.as_deref(), Some("127.0.0.1:4000"));
        assert_eq!(e.lock.as_deref(), Some("db"));
    }

    #[tokio::test]
    async fn a_flood_of_forged_tokens_does_not_push_a_stale_write_out() {
        let events = FenceEvents::new(5);
        stale(&events, 1);
        for _ in 0..100 {
            forged(&events);
        }
        let (kept, recorded) = events.recent(100);
        assert_eq!(recorded, 101);
        assert_eq!(kept.len(), 6, "five forged and the stale one");
        assert_eq!(kept.last().map(|e| e.kind), Some(Kind::Stale));
        assert!(kept.windows(2).all(|w| w[0].seq > w[1].seq), "newest first");
    }

    fn forged(events: &FenceEvents) {
        events.refused(Refused {
            kind: Kind::Forged,
            op: crate::op::Op::PutObject,
            scope: Some(&scope()),
            token: Some(9),
            max: None,
            reason: "bad signature".into(),
        });
    }

    fn from(ip: &str) -> Option<SocketAddr> {
        Some(SocketAddr::new(ip.parse().expect("ip"), 4000))
    }

    #[tokio::test]
    async fn one_source_floods_only_its_own_share_of_a_ring() {
        let events = FenceEvents::new(100);
        attempt(from("10.0.0.2"), async { forged(&events) }).await;
        for _ in 0..1000 {
            attempt(from("10.0.0.1"), async { forged(&events) }).await;
        }
        let (kept, recorded) = events.recent(1000);
        assert_eq!(recorded, 1001);
        let flooder = kept
            .iter()
            .filter(|e| e.remote.as_deref() == Some("10.0.0.1:4000"))
            .count();
        assert_eq!(flooder, 10, "a tenth of the ring");
        assert!(
            kept.iter()
                .any(|e| e.remote.as_deref() == Some("10.0.0.2:4000")),
            "the other source's event is kept"
        );
    }

    #[tokio::test]
    async fn unverified_stale_numbers_do_not_push_a_verified_stale_write_out() {
        let events = FenceEvents::new(5);
        attempt(from("10.0.0.2"), async {
            note_verified();
            stale(&events, 3);
        })
        .await;
        for i in 0..100 {
            let ip = format!("10.1.{}.{}", i / 200, i % 200);
            attempt(from(&ip), async { stale(&events, 1) }).await;
        }
        let (kept, _) = events.recent(100);
        assert!(
            kept.iter().any(|e| e.token == Some(3) && e.verified),
            "the verified stale write is kept: {kept:?}"
        );
    }

    #[tokio::test]
    async fn an_unverified_number_names_no_owner() {
        let events = FenceEvents::new(10);
        events.learn_owner("db", 4, "job-a".into());
        attempt(None, async { stale(&events, 4) }).await;
        assert_eq!(
            events.recent(1).0[0].owner,
            None,
            "a claimed 4 is not job-a's"
        );
    }

    #[test]
    fn control_characters_are_escaped_for_a_log_line() {
        assert_eq!(line_safe("a/b"), "a/b");
        assert_eq!(line_safe("a\nWARN forged"), "a\\nWARN forged");
    }

    #[test]
    fn log_lines_are_limited_per_second_and_the_rest_counted() {
        let mut budget = LogBudget::default();
        let t0 = std::time::Instant::now();
        let logged = (0..250).filter(|_| budget.take(t0).0).count();
        assert_eq!(logged, LOG_LINES_PER_SEC as usize);
        let (log, held_back) = budget.take(t0 + std::time::Duration::from_secs(1));
        assert!(log);
        assert_eq!(held_back, 150);
    }

    #[tokio::test]
    async fn an_owner_learned_after_the_event_is_filled_in() {
        let events = FenceEvents::new(10);
        attempt(None, async {
            note_verified();
            stale(&events, 4);
        })
        .await;
        assert_eq!(events.recent(1).0[0].holder, None);
        events.learn_owner("db", 4, "job-a".into());
        events.learn_owner("db", 5, "job-b".into());
        let e = &events.recent(1).0[0];
        assert_eq!(
            (e.owner.as_deref(), e.holder.as_deref()),
            (Some("job-a"), Some("job-b"))
        );
    }

    #[test]
    fn owners_are_bounded_per_lock() {
        let events = FenceEvents::new(1);
        for t in 0..100 {
            events.learn_owner("db", t, format!("o{t}"));
        }
        assert_eq!(events.owner_of("db", 0), None);
        assert_eq!(events.owner_of("db", 99).as_deref(), Some("o99"));
        let n = events.owners.lock().by_lock.get("db").map(VecDeque::len);
        assert_eq!(n, Some(OWNERS_PER_LOCK));
    }
}
