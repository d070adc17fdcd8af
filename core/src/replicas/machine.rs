//! One replica's side of the protocol as a sans-IO state machine: the
//! proxy (`proxy/src/cluster`) and the simulation (`tests/replica_simulation.rs`)
//! drive this same type.
//!
//! Inputs are what happened: an etcd answer (including [`Answer::Unknown`],
//! a request that may or may not have been applied), a watch event, a
//! timer, a write begun or finished. Outputs are [`Request`]s to send to
//! etcd, [`Event`]s (cut the bodies in flight of a lock, notices to log),
//! and the answer to [`Replica::begin_write`]. Time is passed in as `now`
//! on the replica's monotonic clock.
//!
//! What it owns, per lock: the max (every write below it is refused), whether
//! the raise to the max is *confirmed* (complete on every member: only then
//! is the max itself admitted without a raise), the writes in flight by
//! token, the raise under way and the ack owed. And for the replica: its
//! incarnation, its standing, and the join (lease, registration, load,
//! watch, in that order; nothing is admitted before the watch runs).
//!
//! The max only goes up, across incarnations too. A raise sets it before
//! its transaction is sent, so a raise whose answer was lost leaves the
//! replica refusing below the new token, which its ack in etcd (written by
//! the same transaction, maybe) already promises.

use super::rules::{MemberView, Ms, Published, RaiseWait, Standing, Timing, ms};
use crate::fence;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

/// A request's handle: its answer comes back with it.
pub type ReqId = u64;

/// How often a raise reads the members while it waits: doubling from the
/// first to the last (acks come within milliseconds when all are up).
/// Reading every millisecond at first was measured no faster, and it loads
/// etcd while the other replicas put their acks (BENCHMARKS.md).
const POLL_FIRST: Ms = 1;
const POLL_LAST: Ms = 20;
/// How long a failed step waits before it is tried again.
const RETRY: Ms = 200;

/// A request for the driver to send to etcd. Every one is answered with
/// [`Replica::handle_answer`], under its [`ReqId`].
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// Revoke a lease (an earlier incarnation's, or an evicted member's).
    /// Best effort: its answer is not needed.
    Revoke { lease: i64 },
    /// Grant a lease of `ttl_secs`: [`Answer::Granted`].
    Grant { ttl_secs: i64 },
    /// Create the member record (`members/<id>`, no lease, with
    /// `published`) and the registration (`proxies/<id>`, on `lease`) in
    /// one transaction: [`Answer::Registered`].
    Register {
        id: String,
        lease: i64,
        published: Published,
    },
    /// Keep `lease` alive: [`Answer::Done`] if the lease is alive and
    /// `member`'s record and registration (on that lease) are both still
    /// there, read after the renewal; else its lease is revoked and the
    /// answer is [`Answer::LeaseGone`]. A member nobody waits for admits
    /// nothing.
    KeepAlive { lease: i64, member: String },
    /// Read every lock's max: [`Answer::Loaded`].
    Load,
    /// Open a watch of the maxes from `from_rev` for `incarnation`; the
    /// driver reports [`Replica::watch_opened`], [`Replica::watch_event`]
    /// and [`Replica::watch_broken`], not an answer.
    Watch { incarnation: u64, from_rev: i64 },
    /// If the lock's max is below `token` (or missing), put it; if it is
    /// then `token`, put this member's ack of it on `lease`; read it back:
    /// [`Answer::Raised`] or [`Answer::Higher`].
    Raise {
        lock: Arc<str>,
        token: u64,
        member: String,
        lease: i64,
    },
    /// Put this member's ack of `token` for `lock`, on `lease`.
    Ack {
        lock: Arc<str>,
        token: u64,
        member: String,
        lease: i64,
    },
    /// Say, on `lease`, that this member is draining `writes` writes below
    /// `token` (the oldest admitted `oldest_ms` ago): a raiser keeps
    /// waiting for it while it stays registered.
    Draining {
        lock: Arc<str>,
        token: u64,
        member: String,
        lease: i64,
        writes: u64,
        oldest_ms: Ms,
    },
    /// Read every member with its registration, ack and draining report
    /// for `lock`: [`Answer::Members`].
    Members { lock: Arc<str> },
    /// Remove a member record whose lock delay has passed.
    Retire { member: String },
}

/// What etcd answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Granted {
        lease: i64,
    },
    /// The revision of the registration.
    Registered {
        rev: i64,
    },
    /// Every lock's max, the revision read, and each max's mod revision;
    /// and the cluster's floor (`P/floor`, 0 if none): every lock's least
    /// max.
    Loaded {
        rev: i64,
        fences: Vec<(String, u64, i64)>,
        floor: u64,
    },
    /// The lock's max is `token` at mod revision `rev`, and this member's
    /// ack of it is written.
    Raised {
        rev: i64,
    },
    /// The lock's max is already above the token.
    Higher {
        max: u64,
    },
    Members(Vec<MemberView>),
    Done,
    /// etcd says the lease is not there (expired, revoked): the
    /// registration is gone.
    LeaseGone,
    /// No answer: the request may or may not have been applied.
    Unknown(String),
}

/// What the driver must do besides sending requests.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Cut every body in flight of this lock (its max went up).
    Cut(Arc<str>),
    /// Cut every body in flight (the standing is lost).
    CutAll,
    /// Log lines worth an operator's eye.
    Joined {
        id: String,
        rev: i64,
    },
    Lost {
        why: String,
    },
    Evicting {
        member: String,
        lock: Arc<str>,
        token: u64,
    },
    Retiring {
        member: String,
    },
}

/// The answer to [`Replica::begin_write`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit {
    /// Admitted: report [`Replica::write_done`] with this when the store
    /// answered, or can no longer commit it.
    Admitted(WriteId),
    /// Below the lock's max.
    Stale { max: u64 },
    /// A raise is under way for this token: ask again when the state
    /// changed.
    Wait,
    /// The replica has no standing; why.
    Unavailable(String),
}

/// An admitted write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteId {
    lock: Arc<str>,
    token: u64,
}

impl WriteId {
    pub fn token(&self) -> u64 {
        self.token
    }
}

/// Broken variants of the protocol, for the simulation to show that its
/// checker catches each one. Never set outside tests.
#[cfg(feature = "flaws")]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flaws {
    /// A raise is admitted as soon as its transaction is answered.
    pub no_ack_wait: bool,
    /// A max learned from another replica is acked before the writes
    /// below it drained.
    pub ack_before_drain: bool,
    /// A joining replica admits once registered, before load and watch.
    pub join_then_load: bool,
    /// A raise with no answer is taken as not applied: the old max comes
    /// back, confirmed.
    pub lost_as_not_applied: bool,
    /// A registered member that is draining is evicted at `ack_timeout`.
    pub evict_draining: bool,
    /// The cluster's floor is not kept from the load.
    pub ignore_floor: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Flags {
    no_ack_wait: bool,
    ack_before_drain: bool,
    join_then_load: bool,
    lost_as_not_applied: bool,
    evict_draining: bool,
    ignore_floor: bool,
}

/// Writes in flight with one token.
#[derive(Debug, Clone, Copy)]
struct Flight {
    count: u64,
    /// When the first of them was admitted (since the count was last 0).
    oldest: Ms,
}

#[derive(Debug)]
enum RaisePhase {
    /// Waiting for this replica's writes below the token to end.
    Draining,
    /// The transaction is out.
    Sending(ReqId),
    /// To be sent (again) at this time.
    Retry(Ms),
    /// Written at its revision: reading the members until each acked or is
    /// out.
    Waiting {
        wait: RaiseWait,
        reading: Option<ReqId>,
        next_read: Ms,
        poll: Ms,
        /// An ack moved while a read was out: read again at its answer.
        again: bool,
    },
}

#[derive(Debug)]
struct Raise {
    token: u64,
    phase: RaisePhase,
    /// For [`Flaws::lost_as_not_applied`]: what the max was.
    before: (u64, bool),
}

#[derive(Debug, Default)]
struct Lock {
    max: u64,
    confirmed: bool,
    flights: BTreeMap<u64, Flight>,
    raise: Option<Raise>,
    /// The highest token whose ack etcd has (this incarnation).
    acked: u64,
    /// The highest token this replica owes an ack (learned elsewhere).
    owed: u64,
    ack_sending: Option<(ReqId, u64)>,
    ack_retry_at: Ms,
    /// The highest token a draining report was sent for.
    reported: u64,
    /// When a draining report that failed is sent again.
    report_retry_at: Ms,
}

impl Lock {
    fn below(&self, token: u64) -> (u64, Option<Ms>) {
        self.flights
            .range(..token)
            .fold((0, None), |(n, o), (_, f)| {
                (
                    n + f.count,
                    Some(o.map_or(f.oldest, |o: Ms| o.min(f.oldest))),
                )
            })
    }

    fn drained_below(&self, token: u64) -> bool {
        self.flights.range(..token).next().is_none()
    }
}

/// One incarnation: a lease, a member record, a registration.
#[derive(Debug, Clone)]
struct Incarnation {
    number: u64,
    id: String,
    lease: i64,
    joined_rev: i64,
}

#[derive(Debug)]
enum Phase {
    /// Not joined; joins at this time.
    Out {
        at: Ms,
    },
    Granting {
        req: ReqId,
        sent: Ms,
    },
    Registering {
        req: ReqId,
        lease: i64,
        sent: Ms,
    },
    Loading {
        req: ReqId,
    },
    /// Loaded at `rev`; waiting for the watch to run.
    Watching {
        rev: i64,
        /// etcd confirmed the watch; what is left is the writes admitted
        /// before the standing was lost (see [`Replica::go_live`]).
        opened: bool,
    },
    Live {
        /// A reload after a broken watch, if one is out.
        reload: Option<ReqId>,
        reload_at: Option<Ms>,
    },
}

/// What a raise request was for.
#[derive(Debug, Clone)]
enum Purpose {
    Grant,
    Register,
    KeepAlive {
        sent: Ms,
    },
    Load,
    Raise {
        lock: Arc<str>,
    },
    Ack {
        lock: Arc<str>,
    },
    Draining {
        lock: Arc<str>,
    },
    Members {
        lock: Arc<str>,
    },
    /// Nothing depends on its answer.
    Ignored,
}

/// A raise waiting somewhere, for the status.
#[derive(Debug, Clone, PartialEq)]
pub struct RaiseStatus {
    pub lock: String,
    pub token: u64,
    pub phase: &'static str,
    pub holdups: Vec<(String, String)>,
}

/// One replica's protocol state.
#[derive(Debug)]
pub struct Replica {
    name: String,
    salt: u64,
    timing: Timing,
    phase: Phase,
    incarnations: u64,
    me: Option<Incarnation>,
    /// The last incarnation's lease, revoked at the next join.
    old_lease: Option<i64>,
    standing: Standing,
    keepalive: Option<ReqId>,
    next_renewal: Ms,
    locks: HashMap<Arc<str>, Lock>,
    /// The locks with a raise under way or an ack owed: the only ones
    /// timers look at (a replica may know many idle locks).
    busy: BTreeSet<Arc<str>>,
    next_req: ReqId,
    outstanding: HashMap<ReqId, (u64, Purpose)>,
    requests: VecDeque<(ReqId, Request)>,
    events: VecDeque<Event>,
    why_not: String,
    evictions: u64,
    raises_sent: u64,
    /// The longest lock delay a raise here had to wait by (members may
    /// publish longer settings than this replica's).
    longest_lock_delay: Duration,
    /// The cluster's floor, as last loaded: a token below it is stale on
    /// every lock, known or not. It never goes down.
    floor: u64,
    flags: Flags,
}

impl Replica {
    /// A replica named `name` (incarnation ids are `<name>.<salt><n>`:
    /// give each process a random salt), not joined yet: it joins at the
    /// first [`Replica::handle_timeout`].
    pub fn new(name: &str, salt: u64, timing: Timing, now: Ms) -> Replica {
        Replica {
            name: name.to_owned(),
            salt,
            timing,
            phase: Phase::Out { at: now },
            incarnations: 0,
            me: None,
            old_lease: None,
            standing: Standing::default(),
            keepalive: None,
            next_renewal: Ms::MAX,
            locks: HashMap::new(),
            busy: BTreeSet::new(),
            next_req: 1,
            outstanding: HashMap::new(),
            requests: VecDeque::new(),
            events: VecDeque::new(),
            why_not: "the replica has not joined the cluster yet".into(),
            evictions: 0,
            raises_sent: 0,
            longest_lock_delay: timing.lock_delay,
            floor: 0,
            flags: Flags::default(),
        }
    }

    /// Turns on broken variants (the simulation's negative controls).
    #[cfg(feature = "flaws")]
    pub fn with_flaws(mut self, f: Flaws) -> Replica {
        self.flags = Flags {
            no_ack_wait: f.no_ack_wait,
            ack_before_drain: f.ack_before_drain,
            join_then_load: f.join_then_load,
            lost_as_not_applied: f.lost_as_not_applied,
            evict_draining: f.evict_draining,
            ignore_floor: f.ignore_floor,
        };
        self
    }

    pub fn timing(&self) -> &Timing {
        &self.timing
    }

    // ------------------------------------------------------------ outputs

    /// The next request to send.
    pub fn poll_request(&mut self) -> Option<(ReqId, Request)> {
        self.requests.pop_front()
    }

    /// The next event to act on.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`Replica::handle_timeout`] is due next.
    pub fn poll_timeout(&self) -> Option<Ms> {
        let mut t: Option<Ms> = None;
        let mut at = |x: Ms| t = Some(t.map_or(x, |t| t.min(x)));
        match &self.phase {
            Phase::Out { at: a } => at(*a),
            Phase::Live {
                reload_at: Some(r), ..
            } => at(*r),
            _ => {}
        }
        if self.me.is_some() {
            if self.keepalive.is_none() {
                at(self.next_renewal);
            }
            if let Some(u) = self.standing.valid_until() {
                at(u);
            }
        }
        for l in self.busy.iter().filter_map(|k| self.locks.get(k)) {
            match &l.raise {
                Some(Raise {
                    phase: RaisePhase::Retry(r),
                    ..
                }) => at(*r),
                Some(Raise {
                    phase:
                        RaisePhase::Waiting {
                            reading: None,
                            next_read,
                            ..
                        },
                    ..
                }) => at(*next_read),
                _ => {}
            }
            // An ack that failed is sent again (once its writes drained:
            // until then a write's end steps the lock). Not before the
            // join is live: `step_lock` sends nothing until then, and
            // `watch_opened` steps every lock.
            if self.acks_run()
                && l.owed > l.acked
                && l.ack_sending.is_none()
                && l.drained_below(l.owed)
            {
                at(l.ack_retry_at);
            }
            // So is a draining report that failed (`watch_opened` and each
            // write's end step the lock otherwise).
            if self.acks_run()
                && l.owed > l.acked
                && l.owed > l.reported
                && !l.drained_below(l.owed)
            {
                at(l.report_retry_at);
            }
        }
        t
    }

    // -------------------------------------------------------------- reads

    /// Whether a write may be admitted at all now: joined, loaded, watching,
    /// and the standing not run out. Checked again per body chunk.
    pub fn admits(&self, now: Ms) -> bool {
        self.live() && self.standing.admits(now)
    }

    /// Until when [`Replica::admits`] holds, if it does at all.
    pub fn admits_until(&self) -> Option<Ms> {
        if self.live() {
            self.standing.valid_until()
        } else {
            None
        }
    }

    fn live(&self) -> bool {
        match self.phase {
            Phase::Live { .. } => true,
            Phase::Loading { .. } | Phase::Watching { .. } => self.flags.join_then_load,
            _ => false,
        }
    }

    /// Whether acks, draining reports and raises go out: when live, and
    /// while a rejoined replica waits for its old writes (it may ack what
    /// it has drained; it admits nothing, so it starts no raise).
    fn acks_run(&self) -> bool {
        self.live() || matches!(self.phase, Phase::Watching { opened: true, .. })
    }

    /// Why it does not admit (for the 503).
    pub fn why_not(&self) -> &str {
        &self.why_not
    }

    /// The incarnation's id, once registered.
    pub fn incarnation(&self) -> Option<&str> {
        self.me.as_ref().map(|m| m.id.as_str())
    }

    /// The incarnation's number (what [`Request::Watch`] names), once
    /// registered.
    pub fn incarnation_number(&self) -> Option<u64> {
        self.me.as_ref().map(|m| m.number)
    }

    /// The max of `lock`: at least the cluster's floor (0 if neither was
    /// ever seen).
    pub fn max(&self, lock: &str) -> u64 {
        self.locks.get(lock).map_or(0, |l| l.max).max(self.floor)
    }

    /// The cluster's floor, as last loaded.
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// How long a write waits for its raise before it is answered
    /// unavailable: an eviction and a lock delay (the longest any member
    /// published), and a few calls of `call_timeout` each. A raise held up
    /// by a member still draining goes on; the next write joins it.
    pub fn raise_patience(&self, call_timeout: Duration) -> Duration {
        self.timing.ack_timeout + self.longest_lock_delay + 4 * call_timeout
    }

    /// A write that has waited for its raise of `lock` since `since` gives
    /// up at `now` if its patience is over: then what holds the raise up,
    /// for the answer.
    pub fn gives_up(
        &self,
        lock: &str,
        since: Ms,
        now: Ms,
        call_timeout: Duration,
    ) -> Option<String> {
        if now.saturating_sub(since) < ms(self.raise_patience(call_timeout)) {
            return None;
        }
        Some(
            self.raises(now)
                .into_iter()
                .find(|r| r.lock == lock)
                .map(|r| format!("{} ({:?})", r.phase, r.holdups))
                .unwrap_or_default(),
        )
    }

    /// Whether `lock` has a fence here.
    pub fn known(&self, lock: &str) -> bool {
        self.locks.contains_key(lock)
    }

    /// Every lock and its max.
    pub fn snapshot(&self) -> Vec<(String, u64)> {
        let mut v: Vec<_> = self
            .locks
            .iter()
            .map(|(k, l)| (k.to_string(), l.max))
            .collect();
        v.sort();
        v
    }

    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Raise transactions sent (steady-state writes send none).
    pub fn raises_sent(&self) -> u64 {
        self.raises_sent
    }

    /// Writes in flight, over all locks.
    pub fn writes_in_flight(&self) -> u64 {
        self.locks
            .values()
            .flat_map(|l| l.flights.values())
            .map(|f| f.count)
            .sum()
    }

    /// Raises under way and what holds each up.
    pub fn raises(&self, now: Ms) -> Vec<RaiseStatus> {
        let mut out = Vec::new();
        for (lock, l) in self
            .busy
            .iter()
            .filter_map(|k| Some((k, self.locks.get(k)?)))
        {
            let Some(r) = &l.raise else { continue };
            let (phase, holdups) = match &r.phase {
                RaisePhase::Draining => {
                    let (n, oldest) = l.below(r.token);
                    let h = vec![(
                        "this replica".to_owned(),
                        format!(
                            "draining {n} writes, oldest admitted {} ms ago",
                            oldest.map_or(0, |o| now.saturating_sub(o))
                        ),
                    )];
                    ("draining", h)
                }
                RaisePhase::Sending(_) | RaisePhase::Retry(_) => ("writing", Vec::new()),
                RaisePhase::Waiting { wait, .. } => (
                    "waiting",
                    wait.holdups()
                        .iter()
                        .map(|(id, h)| (id.clone(), h.describe(now)))
                        .collect(),
                ),
            };
            out.push(RaiseStatus {
                lock: lock.to_string(),
                token: r.token,
                phase,
                holdups,
            });
        }
        out.sort_by(|a, b| a.lock.cmp(&b.lock));
        out
    }

    // ------------------------------------------------------------- writes

    /// A write of `token` to `lock` wants in.
    pub fn begin_write(&mut self, lock: &str, token: u64, now: Ms) -> Admit {
        if !self.admits(now) {
            return Admit::Unavailable(self.why_not.clone());
        }
        // Below the cluster's floor: stale on every lock, known or not
        // (and an unknown lock is not made known by it).
        if fence::is_stale(self.floor, token) {
            return Admit::Stale {
                max: self.max(lock),
            };
        }
        let key = self.lock_key(lock);
        let l = self.locks.get_mut(&key).expect("just made");
        if token < l.max {
            return Admit::Stale { max: l.max };
        }
        if token == l.max && l.confirmed {
            let f = l.flights.entry(token).or_insert(Flight {
                count: 0,
                oldest: now,
            });
            if f.count == 0 {
                f.oldest = now;
            }
            f.count += 1;
            return Admit::Admitted(WriteId { lock: key, token });
        }
        // Higher, or the max not confirmed yet: a raise to `token`, unless
        // one to at least it is under way.
        if l.raise.as_ref().is_some_and(|r| r.token >= token) {
            return Admit::Wait;
        }
        let before = (l.max, l.confirmed);
        if token > l.max {
            l.max = token;
            l.confirmed = false;
            if !l.flights.is_empty() {
                self.events.push_back(Event::Cut(key.clone()));
            }
        }
        l.raise = Some(Raise {
            token,
            phase: RaisePhase::Draining,
            before,
        });
        self.step_lock(&key, now);
        Admit::Wait
    }

    /// A write admitted by [`Replica::begin_write`] is over: answered, or
    /// it can no longer commit.
    pub fn write_done(&mut self, w: &WriteId, now: Ms) {
        let Some(l) = self.locks.get_mut(&w.lock) else {
            return;
        };
        if let Some(f) = l.flights.get_mut(&w.token) {
            f.count = f.count.saturating_sub(1);
            if f.count == 0 {
                l.flights.remove(&w.token);
                // Only a raise or an owed ack waits for a drain.
                if l.raise.is_some() || l.owed > l.acked {
                    let lock = w.lock.clone();
                    self.step_lock(&lock, now);
                }
            }
        }
        if matches!(self.phase, Phase::Watching { opened: true, .. }) {
            self.go_live(now);
        }
    }

    fn lock_key(&mut self, lock: &str) -> Arc<str> {
        if let Some((k, _)) = self.locks.get_key_value(lock) {
            return k.clone();
        }
        let k: Arc<str> = Arc::from(lock);
        self.locks.insert(k.clone(), Lock::default());
        k
    }

    // ------------------------------------------------------------- inputs

    /// Timers: joins, renewals, the standing's end, raise reads, retries.
    pub fn handle_timeout(&mut self, now: Ms) {
        if let Phase::Out { at } = self.phase
            && now >= at
        {
            self.join(now);
        }
        if let Some(u) = self.standing.valid_until()
            && now >= u
            && self.me.is_some()
        {
            self.lose(
                "the replica could not renew its cluster registration in time",
                now,
            );
        }
        if let Some(me) = &self.me
            && self.keepalive.is_none()
            && now >= self.next_renewal
        {
            let (lease, member) = (me.lease, me.id.clone());
            let id = self.send(
                Request::KeepAlive { lease, member },
                Purpose::KeepAlive { sent: now },
            );
            self.keepalive = Some(id);
        }
        if let Phase::Live {
            reload: None,
            reload_at: Some(at),
        } = self.phase
            && now >= at
        {
            let req = self.send(Request::Load, Purpose::Load);
            self.phase = Phase::Live {
                reload: Some(req),
                reload_at: None,
            };
        }
        let keys: Vec<Arc<str>> = self.busy.iter().cloned().collect();
        for k in keys {
            self.step_lock(&k, now);
        }
    }

    /// The answer to request `id`.
    pub fn handle_answer(&mut self, id: ReqId, answer: Answer, now: Ms) {
        let Some((incarnation, purpose)) = self.outstanding.remove(&id) else {
            return;
        };
        let current = self.me.as_ref().map_or(0, |m| m.number);
        // Any request on this incarnation's lease that etcd refused for
        // the lease: the registration is gone.
        if answer == Answer::LeaseGone && incarnation == current && self.me.is_some() {
            self.lose(
                "the replica's registration is gone (its lease expired or was revoked)",
                now,
            );
            return;
        }
        match purpose {
            Purpose::Ignored => {}
            Purpose::Grant => self.granted(id, answer, now),
            Purpose::Register => self.registered(id, answer, now),
            Purpose::KeepAlive { sent } => {
                if incarnation != current {
                    return;
                }
                self.keepalive = None;
                match answer {
                    Answer::Done => {
                        self.standing.renewed(sent, &self.timing);
                        self.next_renewal = sent + ms(self.timing.ttl / 3);
                    }
                    _ => self.next_renewal = now + RETRY,
                }
            }
            Purpose::Load => self.loaded(id, incarnation, answer, now),
            Purpose::Raise { lock } => self.raised(&lock, id, answer, now),
            Purpose::Ack { lock } => {
                let Some(l) = self.locks.get_mut(&lock) else {
                    return;
                };
                let Some((req, token)) = l.ack_sending else {
                    return;
                };
                if req != id {
                    return;
                }
                l.ack_sending = None;
                if incarnation != current {
                    return;
                }
                match answer {
                    Answer::Done => l.acked = l.acked.max(token),
                    // A lost ack is sent again (a put is idempotent).
                    _ => l.ack_retry_at = now + RETRY,
                }
                self.step_lock(&lock, now);
            }
            Purpose::Draining { lock } => {
                if let Some(l) = self.locks.get_mut(&lock)
                    && !matches!(answer, Answer::Done)
                {
                    // Said again soon: without it, a raiser evicts a
                    // replica that is only slow.
                    l.reported = 0;
                    l.report_retry_at = now + RETRY;
                }
            }
            Purpose::Members { lock } => self.members_read(&lock, id, answer, now),
        }
    }

    /// The watch asked for incarnation `incarnation` runs.
    pub fn watch_opened(&mut self, incarnation: u64, now: Ms) {
        if self.me.as_ref().is_none_or(|m| m.number != incarnation) {
            return;
        }
        if let Phase::Watching { rev, .. } = self.phase {
            self.phase = Phase::Watching { rev, opened: true };
            self.go_live(now);
        }
    }

    /// Live once the watch runs and no write admitted before the standing
    /// was lost is in flight: the check before each write's bytes asks
    /// [`Replica::admits`], and a new incarnation's standing must not let
    /// out an old one's write, which raisers may have waited out already.
    fn go_live(&mut self, now: Ms) {
        let Phase::Watching { rev, opened: true } = self.phase else {
            return;
        };
        let old = self.writes_in_flight();
        if old > 0 {
            self.why_not = format!(
                "the replica has rejoined the cluster and waits for {old} writes admitted before it lost its standing to end; it refuses fenced writes until then (retry, or send the request to another replica)"
            );
            return;
        }
        self.phase = Phase::Live {
            reload: None,
            reload_at: None,
        };
        let id = self.me.as_ref().map(|m| m.id.clone()).unwrap_or_default();
        self.events.push_back(Event::Joined { id, rev });
        let keys: Vec<Arc<str>> = self.busy.iter().cloned().collect();
        for k in keys {
            self.step_lock(&k, now);
        }
    }

    /// A max from the watch (another replica's raise, or this one's).
    pub fn watch_event(&mut self, incarnation: u64, lock: &str, token: u64, now: Ms) {
        if self.me.as_ref().is_none_or(|m| m.number != incarnation) {
            return;
        }
        self.learned(lock, token, true, now);
    }

    /// An ack or a draining report of `lock` changed in etcd (from the
    /// watch): a raise waiting there reads the members now rather than at
    /// its next poll. Only a hint: the read decides.
    pub fn acks_moved(&mut self, incarnation: u64, lock: &str, now: Ms) {
        if self.me.as_ref().is_none_or(|m| m.number != incarnation) {
            return;
        }
        let Some(key) = self.locks.get_key_value(lock).map(|(k, _)| k.clone()) else {
            return;
        };
        let Some(Raise {
            phase:
                RaisePhase::Waiting {
                    reading,
                    next_read,
                    again,
                    ..
                },
            ..
        }) = self.locks.get_mut(&key).and_then(|l| l.raise.as_mut())
        else {
            return;
        };
        if reading.is_some() {
            *again = true;
        } else {
            *next_read = now;
        }
        self.step_lock(&key, now);
    }

    /// The watch broke (closed, compacted, silent): reload the maxes, then
    /// watch again. The standing is not lost: a raise this replica missed
    /// meanwhile evicts it, and waits out its standing.
    pub fn watch_broken(&mut self, incarnation: u64, now: Ms) {
        if self.me.as_ref().is_none_or(|m| m.number != incarnation) {
            return;
        }
        match self.phase {
            Phase::Watching { .. } => {
                let req = self.send(Request::Load, Purpose::Load);
                self.phase = Phase::Loading { req };
            }
            Phase::Live { reload: None, .. } => {
                self.phase = Phase::Live {
                    reload: None,
                    reload_at: Some(now),
                };
            }
            _ => {}
        }
    }

    // -------------------------------------------------------------- joins

    fn join(&mut self, now: Ms) {
        if let Some(lease) = self.old_lease.take() {
            // Its registration would make raises wait ack_timeout for an
            // ack that cannot come; its member record stays until a raiser
            // waited it out.
            self.send(Request::Revoke { lease }, Purpose::Ignored);
        }
        // Whole seconds, rounded up: the standing counts from the configured
        // TTL, and a longer lease only makes raisers wait longer.
        let ttl_secs =
            i64::try_from(self.timing.ttl.as_millis().div_ceil(1000)).unwrap_or(i64::MAX);
        let req = self.send(Request::Grant { ttl_secs }, Purpose::Grant);
        self.phase = Phase::Granting { req, sent: now };
    }

    fn granted(&mut self, id: ReqId, answer: Answer, now: Ms) {
        let Phase::Granting { req, sent } = self.phase else {
            return;
        };
        if req != id {
            return;
        }
        match answer {
            Answer::Granted { lease } => {
                self.incarnations += 1;
                let member = format!("{}.{:x}{:02x}", self.name, self.salt, self.incarnations);
                self.old_lease = Some(lease);
                let req = self.send(
                    Request::Register {
                        id: member,
                        lease,
                        published: Published::of(&self.timing),
                    },
                    Purpose::Register,
                );
                self.phase = Phase::Registering { req, lease, sent };
            }
            other => self.retry_join(&other, now),
        }
    }

    fn registered(&mut self, id: ReqId, answer: Answer, now: Ms) {
        let Phase::Registering { req, lease, sent } = self.phase else {
            return;
        };
        if req != id {
            return;
        }
        let Answer::Registered { rev } = answer else {
            return self.retry_join(&answer, now);
        };
        let number = self.incarnations;
        let member = format!("{}.{:x}{:02x}", self.name, self.salt, number);
        self.me = Some(Incarnation {
            number,
            id: member,
            lease,
            joined_rev: rev,
        });
        // The lease runs from its grant, after `sent`.
        self.standing = Standing::default();
        self.standing.renewed(sent, &self.timing);
        self.next_renewal = sent + ms(self.timing.ttl / 3);
        self.keepalive = None;
        // Acks of this incarnation start from none.
        for l in self.locks.values_mut() {
            l.acked = 0;
            l.ack_sending = None;
            l.reported = 0;
        }
        let req = self.send(Request::Load, Purpose::Load);
        self.phase = Phase::Loading { req };
    }

    fn retry_join(&mut self, answer: &Answer, now: Ms) {
        self.why_not = format!(
            "the replica cannot join the cluster ({}); it refuses fenced writes until it has joined (retry, or send the request to another replica)",
            describe(answer)
        );
        self.phase = Phase::Out { at: now + RETRY };
    }

    fn loaded(&mut self, id: ReqId, incarnation: u64, answer: Answer, now: Ms) {
        if self.me.as_ref().is_none_or(|m| m.number != incarnation) {
            return;
        }
        let joined_rev = self.me.as_ref().map_or(0, |m| m.joined_rev);
        let reloading = match self.phase {
            Phase::Loading { req } if req == id => false,
            Phase::Live {
                reload: Some(req), ..
            } if req == id => true,
            _ => return,
        };
        let Answer::Loaded { rev, fences, floor } = answer else {
            if reloading {
                self.phase = Phase::Live {
                    reload: None,
                    reload_at: Some(now + RETRY),
                };
            } else {
                // A join without a fresh view is no join.
                self.lose(
                    &format!(
                        "the replica could not load the fences ({})",
                        describe(&answer)
                    ),
                    now,
                );
            }
            return;
        };
        if !self.flags.ignore_floor {
            self.floor = self.floor.max(floor);
        }
        for (lock, token, mod_rev) in fences {
            // A raise after this incarnation joined waits for its ack.
            self.learned(&lock, token, mod_rev > joined_rev || reloading, now);
        }
        let number = incarnation;
        self.send(
            Request::Watch {
                incarnation: number,
                from_rev: rev + 1,
            },
            Purpose::Ignored,
        );
        self.phase = if reloading {
            Phase::Live {
                reload: None,
                reload_at: None,
            }
        } else {
            Phase::Watching { rev, opened: false }
        };
    }

    /// The standing is over: cut everything, forget the incarnation, join
    /// again. Maxes stay (they only go up); none is confirmed any more.
    fn lose(&mut self, why: &str, now: Ms) {
        self.events.push_back(Event::Lost {
            why: why.to_owned(),
        });
        self.events.push_back(Event::CutAll);
        self.why_not = format!(
            "{why}; it refuses fenced writes until it has rejoined (retry, or send the request to another replica)"
        );
        self.standing.lost();
        self.me = None;
        self.keepalive = None;
        let keep_confirmed = self.flags.join_then_load;
        for l in self.locks.values_mut() {
            l.confirmed &= keep_confirmed;
            l.raise = None;
            l.ack_sending = None;
            l.owed = 0;
            l.acked = 0;
            l.reported = 0;
        }
        self.busy.clear();
        self.phase = Phase::Out { at: now };
    }

    // ------------------------------------------------------- lock changes

    /// A max learned from etcd (watch or load). `owe` when a raiser may be
    /// waiting for this replica's ack of it.
    fn learned(&mut self, lock: &str, token: u64, owe: bool, now: Ms) {
        let key = self.lock_key(lock);
        let l = self.locks.get_mut(&key).expect("just made");
        if token > l.max {
            l.max = token;
            l.confirmed = false;
            if !l.flights.is_empty() {
                self.events.push_back(Event::Cut(key.clone()));
            }
        }
        if token > 0 && owe {
            l.owed = l.owed.max(token);
        }
        if l.raise.as_ref().is_some_and(|r| r.token < l.max) {
            // Overtaken: its waiters see the new max and are refused.
            l.raise = None;
        }
        self.step_lock(&key, now);
    }

    /// Moves a lock's raise and ack on as far as they can go now.
    fn step_lock(&mut self, key: &Arc<str>, now: Ms) {
        self.advance(key, now);
        let busy = self
            .locks
            .get(key)
            .is_some_and(|l| l.raise.is_some() || l.owed > l.acked);
        if busy {
            if !self.busy.contains(key) {
                self.busy.insert(key.clone());
            }
        } else {
            self.busy.remove(key);
        }
    }

    fn advance(&mut self, key: &Arc<str>, now: Ms) {
        let Some(me) = self.me.clone() else { return };
        if !self.acks_run() {
            return;
        }
        let flags = self.flags;
        let mut out: Vec<(Request, Purpose)> = Vec::new();
        let mut sending_raise = false;
        let mut sending_ack: Option<u64> = None;
        {
            let Some(l) = self.locks.get_mut(key) else {
                return;
            };
            // The ack owed, once the writes below it have drained.
            if l.owed > l.acked
                && l.ack_sending.is_none()
                && now >= l.ack_retry_at
                && (flags.ack_before_drain || l.drained_below(l.owed))
            {
                out.push((
                    Request::Ack {
                        lock: key.clone(),
                        token: l.owed,
                        member: me.id.clone(),
                        lease: me.lease,
                    },
                    Purpose::Ack { lock: key.clone() },
                ));
                sending_ack = Some(l.owed);
            } else if l.owed > l.acked
                && l.owed > l.reported
                && now >= l.report_retry_at
                && !l.drained_below(l.owed)
            {
                // Slow is not dead: say so, and the raiser keeps waiting.
                let (writes, oldest) = l.below(l.owed);
                out.push((
                    Request::Draining {
                        lock: key.clone(),
                        token: l.owed,
                        member: me.id.clone(),
                        lease: me.lease,
                        writes,
                        oldest_ms: oldest.map_or(0, |o| now.saturating_sub(o)),
                    },
                    Purpose::Draining { lock: key.clone() },
                ));
                l.reported = l.owed;
            }
            if let Some(r) = &mut l.raise {
                match &mut r.phase {
                    RaisePhase::Draining if l.flights.range(..r.token).next().is_none() => {
                        sending_raise = true;
                    }
                    RaisePhase::Retry(at) if now >= *at => sending_raise = true,
                    RaisePhase::Waiting {
                        reading: None,
                        next_read,
                        ..
                    } if now >= *next_read => {
                        out.push((
                            Request::Members { lock: key.clone() },
                            Purpose::Members { lock: key.clone() },
                        ));
                    }
                    _ => {}
                }
                if sending_raise {
                    out.push((
                        Request::Raise {
                            lock: key.clone(),
                            token: r.token,
                            member: me.id.clone(),
                            lease: me.lease,
                        },
                        Purpose::Raise { lock: key.clone() },
                    ));
                }
            }
        }
        for (req, purpose) in out {
            let is_members = matches!(purpose, Purpose::Members { .. });
            let is_raise = matches!(purpose, Purpose::Raise { .. });
            let is_ack = matches!(purpose, Purpose::Ack { .. });
            let id = self.send(req, purpose);
            let l = self.locks.get_mut(key).expect("present");
            if is_raise {
                self.raises_sent += 1;
                if let Some(r) = &mut l.raise {
                    r.phase = RaisePhase::Sending(id);
                }
            } else if is_members {
                if let Some(Raise {
                    phase: RaisePhase::Waiting { reading, .. },
                    ..
                }) = &mut l.raise
                {
                    *reading = Some(id);
                }
            } else if is_ack && let Some(t) = sending_ack {
                l.ack_sending = Some((id, t));
            }
        }
    }

    fn raised(&mut self, lock: &Arc<str>, id: ReqId, answer: Answer, now: Ms) {
        let flags = self.flags;
        let timing = self.timing;
        let Some(me) = self.me.clone() else { return };
        let Some(l) = self.locks.get_mut(lock) else {
            return;
        };
        let Some(r) = &mut l.raise else { return };
        if r.phase_req() != Some(id) {
            return;
        }
        match answer {
            Answer::Raised { rev } => {
                l.acked = l.acked.max(r.token);
                if flags.no_ack_wait {
                    l.confirmed = l.max == r.token;
                    l.raise = None;
                } else {
                    r.phase = RaisePhase::Waiting {
                        wait: RaiseWait::new(r.token, rev, &me.id, now, timing),
                        reading: None,
                        next_read: now,
                        poll: POLL_FIRST,
                        again: false,
                    };
                }
            }
            Answer::Higher { max } => {
                l.raise = None;
                self.learned(lock, max, true, now);
                return;
            }
            Answer::Unknown(_) if flags.lost_as_not_applied => {
                (l.max, l.confirmed) = r.before;
                l.raise = None;
            }
            // Outcome unknown: the max stays at the token (this replica
            // refuses below it, as its ack may already say) and the
            // transaction is sent again; it is idempotent.
            _ => r.phase = RaisePhase::Retry(now + RETRY),
        }
        let lock = lock.clone();
        self.step_lock(&lock, now);
    }

    fn members_read(&mut self, lock: &Arc<str>, id: ReqId, answer: Answer, now: Ms) {
        let flags = self.flags;
        let Some(l) = self.locks.get_mut(lock) else {
            return;
        };
        let Some(r) = &mut l.raise else { return };
        let token = r.token;
        let RaisePhase::Waiting {
            wait,
            reading,
            next_read,
            poll,
            again,
        } = &mut r.phase
        else {
            return;
        };
        if *reading != Some(id) {
            return;
        }
        *reading = None;
        let Answer::Members(view) = answer else {
            *next_read = now + RETRY;
            return;
        };
        let next = wait.next(&view, now, flags.evict_draining);
        let longest = view
            .iter()
            .map(|m| self.timing.lock_delay_for(m.published.as_ref()))
            .fold(self.longest_lock_delay, Duration::max);
        if next.admit {
            if l.max == token {
                l.confirmed = true;
            }
            l.raise = None;
        } else {
            *next_read = if std::mem::take(again) {
                now
            } else {
                next.wake_at.map_or(now + *poll, |w| w.min(now + *poll))
            };
            *poll = (*poll * 2).min(POLL_LAST);
        }
        self.longest_lock_delay = longest;
        for m in &view {
            if next.evict.contains(&m.id) {
                self.evictions += 1;
                self.events.push_back(Event::Evicting {
                    member: m.id.clone(),
                    lock: lock.clone(),
                    token,
                });
                self.send(Request::Revoke { lease: m.lease }, Purpose::Ignored);
            }
        }
        for m in view
            .iter()
            .filter(|m| next.revoke.contains(&m.id) && m.lease != 0)
        {
            self.send(Request::Revoke { lease: m.lease }, Purpose::Ignored);
        }
        for member in next.retire {
            self.events.push_back(Event::Retiring {
                member: member.clone(),
            });
            self.send(Request::Retire { member }, Purpose::Ignored);
        }
        let lock = lock.clone();
        self.step_lock(&lock, now);
    }

    fn send(&mut self, req: Request, purpose: Purpose) -> ReqId {
        let id = self.next_req;
        self.next_req += 1;
        let incarnation = self.me.as_ref().map_or(0, |m| m.number);
        if !matches!(purpose, Purpose::Ignored) {
            self.outstanding.insert(id, (incarnation, purpose));
        }
        self.requests.push_back((id, req));
        id
    }
}

impl Raise {
    fn phase_req(&self) -> Option<ReqId> {
        match self.phase {
            RaisePhase::Sending(id) => Some(id),
            _ => None,
        }
    }
}

fn describe(a: &Answer) -> String {
    match a {
        Answer::Unknown(why) => why.clone(),
        Answer::LeaseGone => "its lease is gone".into(),
        other => format!("unexpected answer {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing() -> Timing {
        Timing {
            ttl: Duration::from_secs(3),
            drift: 0.01,
            store_decision: Duration::from_secs(1),
            ack_timeout: Duration::from_secs(1),
            lock_delay: Duration::from_millis(4_100),
        }
    }

    /// Every request the machine asks for now.
    fn drain(r: &mut Replica) -> Vec<(ReqId, Request)> {
        std::iter::from_fn(|| r.poll_request()).collect()
    }

    fn find(reqs: &[(ReqId, Request)], f: impl Fn(&Request) -> bool) -> ReqId {
        reqs.iter()
            .find(|(_, q)| f(q))
            .map(|(id, _)| *id)
            .unwrap_or_else(|| panic!("no such request in {reqs:?}"))
    }

    /// Registered at revision 10, the lease 7; the load answer not given.
    fn registered(r: &mut Replica) -> ReqId {
        registered_at(r, 0)
    }

    fn registered_at(r: &mut Replica, now: Ms) -> ReqId {
        r.handle_timeout(now);
        let reqs = drain(r);
        let grant = find(&reqs, |q| matches!(q, Request::Grant { .. }));
        r.handle_answer(grant, Answer::Granted { lease: 7 }, now + 1);
        let reqs = drain(r);
        let reg = find(&reqs, |q| matches!(q, Request::Register { .. }));
        r.handle_answer(reg, Answer::Registered { rev: 10 }, now + 2);
        let reqs = drain(r);
        find(&reqs, |q| matches!(q, Request::Load))
    }

    /// Joined: registered, `fences` and `floor` loaded, its watch open.
    fn joined(fences: Vec<(String, u64, i64)>, floor: u64) -> Replica {
        let mut r = Replica::new("a", 1, timing(), 0);
        let load = registered(&mut r);
        r.handle_answer(
            load,
            Answer::Loaded {
                rev: 20,
                fences,
                floor,
            },
            3,
        );
        let number = r.incarnation_number().expect("registered");
        r.watch_opened(number, 4);
        drain(&mut r);
        r
    }

    /// Joined with lock L at max `max` (confirmed when `max > 0`).
    fn live(max: u64) -> Replica {
        let fences = if max > 0 {
            vec![("L".to_owned(), max, 5)]
        } else {
            vec![]
        };
        let mut r = joined(fences, 0);
        if max > 0 {
            assert_eq!(r.begin_write("L", max, 5), Admit::Wait);
            confirm(&mut r, max, 6);
        }
        assert!(r.admits(7));
        while r.poll_event().is_some() {}
        r
    }

    /// Answers the raise under way as written, and every member as acked.
    fn confirm(r: &mut Replica, token: u64, now: Ms) {
        let reqs = drain(r);
        let raise = find(&reqs, |q| matches!(q, Request::Raise { .. }));
        r.handle_answer(raise, Answer::Raised { rev: 30 }, now);
        let reqs = drain(r);
        let read = find(&reqs, |q| matches!(q, Request::Members { .. }));
        r.handle_answer(read, Answer::Members(vec![]), now);
        let Admit::Admitted(w) = r.begin_write("L", token, now) else {
            panic!("{token} confirmed")
        };
        r.write_done(&w, now);
    }

    #[test]
    fn below_the_loaded_floor_every_lock_is_stale_and_stays_unknown() {
        let mut r = joined(vec![("L".to_owned(), 3, 5)], 100);
        assert!(r.admits(5));
        assert_eq!(r.floor(), 100);
        assert_eq!(r.max("L"), 100, "a known lock's max is at least the floor");
        assert_eq!(r.max("M"), 100, "so is an unknown one's");
        assert_eq!(r.begin_write("L", 99, 5), Admit::Stale { max: 100 });
        assert_eq!(r.begin_write("M", 4, 5), Admit::Stale { max: 100 });
        assert!(!r.known("M"), "a stale write makes no fence");
        // At the floor or above: raised as any higher token.
        assert_eq!(r.begin_write("M", 100, 6), Admit::Wait);
        assert!(r.known("M"));
    }

    #[test]
    fn a_write_gives_up_on_its_raise_only_when_its_patience_is_over() {
        let mut r = live(0);
        let calls = Duration::from_millis(500);
        assert_eq!(r.begin_write("L", 5, 10), Admit::Wait);
        let patience = ms(r.raise_patience(calls));
        assert_eq!(
            patience,
            ms(timing().ack_timeout + timing().lock_delay + 4 * calls)
        );
        assert_eq!(r.gives_up("L", 10, 10 + patience - 1, calls), None);
        let held = r.gives_up("L", 10, 10 + patience, calls).expect("over");
        assert!(
            held.starts_with("draining") || held.starts_with("writing"),
            "{held}"
        );
    }

    #[test]
    fn nothing_is_admitted_between_join_and_the_running_watch() {
        let mut r = Replica::new("a", 1, timing(), 0);
        let load = registered(&mut r);
        assert!(matches!(r.begin_write("L", 1, 3), Admit::Unavailable(_)));
        r.handle_answer(
            load,
            Answer::Loaded {
                rev: 20,
                fences: vec![],
                floor: 0,
            },
            3,
        );
        assert!(
            matches!(r.begin_write("L", 1, 4), Admit::Unavailable(_)),
            "loaded, but the watch does not run yet"
        );
        let number = r.incarnation_number().expect("registered");
        r.watch_opened(number, 5);
        assert!(r.admits(5));
    }

    #[test]
    fn a_failed_load_is_a_failed_join() {
        let mut r = Replica::new("a", 1, timing(), 0);
        let load = registered(&mut r);
        r.handle_answer(load, Answer::Unknown("link cut".into()), 3);
        assert!(matches!(r.begin_write("L", 1, 4), Admit::Unavailable(_)));
        assert!(r.why_not().contains("could not load"), "{}", r.why_not());
        assert_eq!(r.events.iter().filter(|e| **e == Event::CutAll).count(), 1);
        r.handle_timeout(3 + RETRY);
        let reqs = drain(&mut r);
        assert!(reqs.iter().any(|(_, q)| matches!(q, Request::Grant { .. })));
        assert!(
            reqs.iter()
                .any(|(_, q)| matches!(q, Request::Revoke { lease: 7 })),
            "the lost incarnation's lease is revoked"
        );
    }

    #[test]
    fn a_raise_whose_answer_was_lost_keeps_refusing_below_it_and_is_sent_again() {
        let mut r = live(1);
        assert_eq!(r.begin_write("L", 2, 10), Admit::Wait);
        assert_eq!(
            r.begin_write("L", 1, 10),
            Admit::Stale { max: 2 },
            "refused before the raise is sent"
        );
        let reqs = drain(&mut r);
        let raise = find(&reqs, |q| matches!(q, Request::Raise { token: 2, .. }));
        r.handle_answer(raise, Answer::Unknown("no answer".into()), 20);
        assert_eq!(r.begin_write("L", 1, 21), Admit::Stale { max: 2 });
        r.handle_timeout(20 + RETRY);
        let reqs = drain(&mut r);
        find(&reqs, |q| matches!(q, Request::Raise { token: 2, .. }));
    }

    #[test]
    fn read_as_not_applied_a_lost_raise_answer_admits_the_old_token() {
        // The broken variant the simulation must catch, shown directly.
        let mut r = live(1).with_flaws(Flaws {
            lost_as_not_applied: true,
            ..Flaws::default()
        });
        assert_eq!(r.begin_write("L", 2, 10), Admit::Wait);
        let reqs = drain(&mut r);
        let raise = find(&reqs, |q| matches!(q, Request::Raise { .. }));
        r.handle_answer(raise, Answer::Unknown("no answer".into()), 20);
        assert!(matches!(r.begin_write("L", 1, 21), Admit::Admitted(_)));
    }

    #[test]
    fn a_raise_learned_from_the_watch_is_acked_only_after_the_drain() {
        let mut r = live(1);
        let Admit::Admitted(w) = r.begin_write("L", 1, 10) else {
            panic!("admitted")
        };
        let number = r.incarnation_number().expect("joined");
        r.watch_event(number, "L", 2, 11);
        assert_eq!(r.poll_event(), Some(Event::Cut("L".into())));
        let reqs = drain(&mut r);
        assert!(
            reqs.iter().all(|(_, q)| !matches!(q, Request::Ack { .. })),
            "no ack while a write below it is in flight: {reqs:?}"
        );
        find(&reqs, |q| {
            matches!(
                q,
                Request::Draining {
                    token: 2,
                    writes: 1,
                    ..
                }
            )
        });
        assert_eq!(r.begin_write("L", 1, 12), Admit::Stale { max: 2 });
        r.write_done(&w, 13);
        let reqs = drain(&mut r);
        find(&reqs, |q| matches!(q, Request::Ack { token: 2, .. }));
    }

    /// A write of token 1 to `L` is admitted at 10; at 1,000 the renewal
    /// is due and finds the registration gone. The write, still in flight.
    fn write_then_lose_registration(r: &mut Replica) -> WriteId {
        let Admit::Admitted(w) = r.begin_write("L", 1, 10) else {
            panic!("admitted")
        };
        r.handle_timeout(1_000);
        let reqs = drain(r);
        let renew = find(&reqs, |q| matches!(q, Request::KeepAlive { .. }));
        r.handle_answer(renew, Answer::LeaseGone, 1_001);
        w
    }

    #[test]
    fn a_lost_registration_cuts_everything_and_unconfirms_every_max() {
        let mut r = live(1);
        let _in_flight = write_then_lose_registration(&mut r);
        let events: Vec<_> = std::iter::from_fn(|| r.poll_event()).collect();
        assert!(events.contains(&Event::CutAll), "{events:?}");
        assert!(matches!(
            r.begin_write("L", 1, 1_002),
            Admit::Unavailable(_)
        ));
        assert_eq!(r.max("L"), 1, "the max stays");
    }

    #[test]
    fn a_rejoined_replica_admits_nothing_while_an_old_write_is_in_flight() {
        let mut r = live(1);
        let old = write_then_lose_registration(&mut r);
        // Rejoin: grant, register, load, watch.
        let load = registered_at(&mut r, 1_001);
        r.handle_answer(
            load,
            Answer::Loaded {
                rev: 40,
                fences: vec![],
                floor: 0,
            },
            1_010,
        );
        let number = r.incarnation_number().expect("registered");
        r.watch_opened(number, 1_011);
        assert!(
            !r.admits(1_012),
            "the old incarnation's write could still go out under the new standing"
        );
        assert!(
            r.why_not().contains("waits for 1 writes"),
            "{}",
            r.why_not()
        );
        r.write_done(&old, 1_020);
        assert!(r.admits(1_021));
    }

    #[test]
    fn an_ack_seen_on_the_watch_reads_the_members_at_once() {
        let mut r = live(1);
        assert_eq!(r.begin_write("L", 2, 10), Admit::Wait);
        let reqs = drain(&mut r);
        let raise = find(&reqs, |q| matches!(q, Request::Raise { .. }));
        r.handle_answer(raise, Answer::Raised { rev: 50 }, 11);
        let reqs = drain(&mut r);
        let read = find(&reqs, |q| matches!(q, Request::Members { .. }));
        let other = MemberView {
            id: "b.1".into(),
            joined_rev: 5,
            registered: true,
            acked: 1,
            draining: 0,
            lease: 9,
            published: None,
        };
        let number = r.incarnation_number().expect("joined");
        // The other's ack lands while the read is out: read again at its
        // answer, not a poll later.
        r.acks_moved(number, "L", 12);
        r.handle_answer(read, Answer::Members(vec![other.clone()]), 13);
        let reqs = drain(&mut r);
        let again = find(&reqs, |q| matches!(q, Request::Members { .. }));
        r.handle_answer(
            again,
            Answer::Members(vec![MemberView { acked: 2, ..other }]),
            14,
        );
        assert!(matches!(r.begin_write("L", 2, 15), Admit::Admitted(_)));
    }

    #[test]
    fn the_standing_ends_on_the_clock_without_a_renewal() {
        let mut r = live(0);
        let until = r.admits_until().expect("standing");
        assert!(r.admits(until - 1) && !r.admits(until));
        r.handle_timeout(until);
        assert!(r.why_not().contains("could not renew"), "{}", r.why_not());
    }
}
