//! Deterministic simulation of proxy replicas sharing one fence
//! (`fencegate_core::replicas`, issue 13).
//!
//! One millisecond of real time per step. Modelled:
//! - **etcd** as one linearizable store: revisions, leases that expire by the
//!   leader's clock (and, now and then, early: the 3.4 revocation bug),
//!   watches that deliver each change late (up to seconds), requests that
//!   take time to apply and to answer, and are lost during a partition;
//! - **replicas** with clocks running at `1 ± drift` of real time, that
//!   pause (SIGSTOP: nothing runs, the clock goes on), are partitioned from
//!   etcd, crash and restart as a new incarnation;
//! - **writers** holding tokens (a newer holder appears now and then; the
//!   older ones go on writing as zombies) sending writes to random replicas;
//! - **the store**: a body streams for a while (each chunk checked against
//!   the replica's standing and its epoch's cut), then the store commits a
//!   fully sent write up to `store_decision` later, whatever the replica
//!   does meanwhile.
//!
//! The checker: once token t has been admitted anywhere, no write below t
//! is admitted or committed afterwards, anywhere.
//!
//! The protocol passes on every seed; each broken variant (no ack wait,
//! no lock delay, watch-only propagation) is caught on some seed, which is
//! what makes the pass meaningful. A failing seed prints; replay it with
//! `FENCEGATE_SIM_SEED=<seed> cargo test -p fencegate-core --test replica_simulation`.
//! `FENCEGATE_SIM_SEEDS=<n>` sets how many schedules run (default 150).

use fencegate_core::replicas::{MemberView, Ms, RaiseWait, Standing, Timing};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

const REPLICAS: usize = 3;
const STEPS: u64 = 12_000;
const TTL_MS: u64 = 1_000;
const STORE_DECISION_MS: u64 = 150;
const ACK_TIMEOUT_MS: u64 = 300;

fn timing(variant: Variant) -> Timing {
    let ttl = Duration::from_millis(TTL_MS);
    let store_decision = Duration::from_millis(STORE_DECISION_MS);
    let drift = 0.01;
    Timing {
        ttl,
        drift,
        store_decision,
        ack_timeout: Duration::from_millis(ACK_TIMEOUT_MS),
        lock_delay: if variant == Variant::NoLockDelay {
            Duration::ZERO
        } else {
            Timing::min_lock_delay(ttl, drift, store_decision)
        },
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// The protocol as built.
    Correct,
    /// A raise is admitted as soon as it is written to etcd.
    NoAckWait,
    /// Members without registration are out at once.
    NoLockDelay,
    /// No registrations, acks or standing: replicas learn raises from their
    /// watch only.
    WatchOnly,
}

// ---------------------------------------------------------------- etcd --

#[derive(Debug, Clone)]
struct Member {
    joined_rev: i64,
    lease: i64,
}

#[derive(Debug, Default)]
struct Etcd {
    rev: i64,
    fence: u64,
    /// The revision at which the fence got its value.
    fence_rev: i64,
    members: BTreeMap<String, Member>,
    /// Registration and ack (by incarnation), each on the incarnation's lease.
    regs: BTreeMap<String, i64>,
    acks: BTreeMap<String, (u64, i64)>,
    /// Lease id → expiry in real time.
    leases: BTreeMap<i64, u64>,
    next_lease: i64,
}

impl Etcd {
    fn expire(&mut self, lease: i64) {
        if self.leases.remove(&lease).is_some() {
            self.rev += 1;
            self.regs.retain(|_, l| *l != lease);
            self.acks.retain(|_, (_, l)| *l != lease);
        }
    }

    fn view(&self) -> Vec<MemberView> {
        self.members
            .iter()
            .map(|(id, m)| MemberView {
                id: id.clone(),
                joined_rev: m.joined_rev,
                registered: self.regs.contains_key(id),
                acked: self.acks.get(id).map_or(0, |a| a.0),
            })
            .collect()
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// Grant a lease, create the member record and the registration, read
    /// the fence: one transaction.
    Join,
    KeepAlive {
        lease: i64,
    },
    /// Put the fence and the raiser's ack if the fence is lower.
    Raise {
        token: u64,
        lease: i64,
    },
    Ack {
        token: u64,
        lease: i64,
    },
    Members,
    Revoke {
        member: String,
    },
    Retire {
        member: String,
    },
}

#[derive(Debug, Clone)]
enum Reply {
    Joined { lease: i64, fence: u64 },
    Alive(bool),
    Raised { rev: i64 },
    Higher(u64),
    LeaseGone,
    Members(Vec<MemberView>),
    Done,
    Failed,
}

impl Etcd {
    fn apply(&mut self, id: &str, op: &Op, now: u64, watches: &mut Vec<(u64, i64)>) -> Reply {
        match op {
            Op::Join => {
                self.next_lease += 1;
                let lease = self.next_lease;
                self.leases.insert(lease, now + TTL_MS);
                self.rev += 1;
                self.members.insert(
                    id.to_owned(),
                    Member {
                        joined_rev: self.rev,
                        lease,
                    },
                );
                self.regs.insert(id.to_owned(), lease);
                Reply::Joined {
                    lease,
                    fence: self.fence,
                }
            }
            Op::KeepAlive { lease } => match self.leases.get_mut(lease) {
                Some(exp) => {
                    *exp = now + TTL_MS;
                    Reply::Alive(true)
                }
                None => Reply::Alive(false),
            },
            Op::Raise { token, lease } => {
                if *lease != 0 && !self.leases.contains_key(lease) {
                    return Reply::LeaseGone;
                }
                if self.fence > *token {
                    return Reply::Higher(self.fence);
                }
                self.rev += 1;
                if self.fence < *token {
                    self.fence = *token;
                    self.fence_rev = self.rev;
                    watches.push((*token, self.rev));
                }
                // Equal: someone else's raise to the same token, maybe not
                // complete yet; this replica waits for it like its raiser.
                if *lease != 0 {
                    self.acks.insert(id.to_owned(), (*token, *lease));
                }
                Reply::Raised {
                    rev: self.fence_rev,
                }
            }
            Op::Ack { token, lease } => {
                if !self.leases.contains_key(lease) {
                    return Reply::LeaseGone;
                }
                self.rev += 1;
                self.acks.insert(id.to_owned(), (*token, *lease));
                Reply::Done
            }
            Op::Members => Reply::Members(self.view()),
            Op::Revoke { member } => {
                if let Some(lease) = self.members.get(member).map(|m| m.lease) {
                    self.expire(lease);
                }
                Reply::Done
            }
            Op::Retire { member } => {
                self.rev += 1;
                self.members.remove(member);
                Reply::Done
            }
        }
    }
}

// ------------------------------------------------------------ replicas --

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteState {
    Streaming { left: u64 },
    Sent { commit_at: u64 },
    Over,
}

#[derive(Debug, Clone)]
struct Write {
    replica: usize,
    incarnation: u32,
    token: u64,
    state: WriteState,
}

#[derive(Debug)]
enum Task {
    /// A raise to `token` draining the older epoch, then written, then
    /// waiting for the others.
    Draining {
        token: u64,
        pending: Pending,
    },
    Written {
        pending: Pending,
    },
    Waiting {
        wait: RaiseWait,
        next_read: Ms,
        pending: Pending,
    },
    /// A raise seen on the watch: drain, then ack.
    Applying {
        token: u64,
    },
}

/// The write that asked for a raise.
#[derive(Debug, Clone, Copy)]
struct Pending {
    token: u64,
    stream_ms: u64,
}

#[derive(Debug)]
struct Replica {
    incarnation: u32,
    rate: f64,
    offset: f64,
    paused_until: u64,
    partitioned_until: u64,
    joined: bool,
    joining: bool,
    lease: i64,
    standing: Standing,
    max: u64,
    /// Whether the raise to `max` is known complete (every member acked or
    /// is out): only then is a write of `max` admitted without waiting.
    confirmed: bool,
    next_keepalive: Ms,
    task: Option<Task>,
    /// Fence values from the watch, with their delivery time.
    watch: VecDeque<(u64, u64)>,
}

impl Replica {
    fn local(&self, now: u64) -> Ms {
        (self.offset + now as f64 * self.rate) as Ms
    }

    fn name(&self, i: usize) -> String {
        format!("r{i}-{}", self.incarnation)
    }
}

/// A request on its way: applied at `apply_at`, answered at `reply_at`.
#[derive(Debug)]
struct InFlight {
    replica: usize,
    incarnation: u32,
    sent_local: Ms,
    op: Op,
    apply_at: u64,
    reply_at: u64,
    reply: Option<Reply>,
}

fn trace(now: u64, what: &str) {
    if std::env::var_os("FENCEGATE_SIM_TRACE").is_some() {
        eprintln!("{now:>6} {what}");
    }
}

struct Sim {
    rng: StdRng,
    variant: Variant,
    timing: Timing,
    now: u64,
    etcd: Etcd,
    replicas: Vec<Replica>,
    inflight: Vec<InFlight>,
    writes: Vec<Write>,
    /// Tokens issued so far: writers hold 1..=issued, older ones are zombies.
    issued: u64,
    /// The highest token admitted anywhere so far.
    admitted: u64,
    violation: Option<String>,
    commits: u64,
    raises: u64,
}

impl Sim {
    fn new(seed: u64, variant: Variant) -> Sim {
        let mut rng = StdRng::seed_from_u64(seed);
        let replicas = (0..REPLICAS)
            .map(|_| Replica {
                incarnation: 1,
                rate: rng.gen_range(0.99..=1.01),
                offset: rng.gen_range(0.0..1e6),
                paused_until: 0,
                partitioned_until: 0,
                joined: false,
                joining: false,
                lease: 0,
                standing: Standing::default(),
                max: 0,
                confirmed: true,
                next_keepalive: 0,
                task: None,
                watch: VecDeque::new(),
            })
            .collect();
        Sim {
            rng,
            variant,
            timing: timing(variant),
            now: 0,
            etcd: Etcd::default(),
            replicas,
            inflight: Vec::new(),
            writes: Vec::new(),
            issued: 1,
            admitted: 0,
            violation: None,
            commits: 0,
            raises: 0,
        }
    }

    fn fail(&mut self, what: String) {
        if self.violation.is_none() {
            self.violation = Some(format!("t={} ms: {what}", self.now));
        }
    }

    fn send(&mut self, i: usize, op: Op) {
        let r = &self.replicas[i];
        let sent_local = r.local(self.now);
        let lost = self.now < r.partitioned_until;
        let apply_at = self.now + self.rng.gen_range(1..=4);
        let reply_at = apply_at + self.rng.gen_range(1..=4);
        self.inflight.push(InFlight {
            replica: i,
            incarnation: r.incarnation,
            sent_local,
            op,
            // A lost request is never applied; its caller hears of the
            // failure after a timeout.
            apply_at: if lost { u64::MAX } else { apply_at },
            reply_at: if lost { self.now + 50 } else { reply_at },
            reply: if lost { Some(Reply::Failed) } else { None },
        });
    }

    fn running(&self, i: usize) -> bool {
        self.now >= self.replicas[i].paused_until
    }

    /// Every write of replica `i` below `token` (all of them if `None`)
    /// still streaming is cut; whether any of them is still in flight.
    fn cut(&mut self, i: usize, below: Option<u64>) {
        let inc = self.replicas[i].incarnation;
        for w in &mut self.writes {
            if w.replica == i
                && w.incarnation == inc
                && below.is_none_or(|t| w.token < t)
                && matches!(w.state, WriteState::Streaming { .. })
            {
                w.state = WriteState::Over;
            }
        }
    }

    fn drained(&self, i: usize, below: u64) -> bool {
        let inc = self.replicas[i].incarnation;
        !self.writes.iter().any(|w| {
            w.replica == i && w.incarnation == inc && w.token < below && w.state != WriteState::Over
        })
    }

    fn admits(&self, i: usize) -> bool {
        let r = &self.replicas[i];
        if self.variant == Variant::WatchOnly {
            return r.joined;
        }
        r.joined && r.standing.admits(r.local(self.now))
    }

    /// The replica stops admitting and joins again as a new incarnation.
    fn self_fence(&mut self, i: usize) {
        self.cut(i, None);
        let r = &mut self.replicas[i];
        r.joined = false;
        r.joining = false;
        r.standing.lost();
        r.task = None;
        r.watch.clear();
        r.incarnation += 1;
    }

    fn admit(&mut self, i: usize, token: u64, stream_ms: u64) {
        trace(
            self.now,
            &format!("r{i} admits {token} (max {})", self.replicas[i].max),
        );
        if token < self.admitted {
            self.fail(format!(
                "replica {i} admitted token {token} after {} was admitted",
                self.admitted
            ));
        }
        self.admitted = self.admitted.max(token);
        let inc = self.replicas[i].incarnation;
        self.writes.push(Write {
            replica: i,
            incarnation: inc,
            token,
            state: WriteState::Streaming { left: stream_ms },
        });
    }

    fn reply(&mut self, f: InFlight) {
        let i = f.replica;
        trace(
            self.now,
            &format!("r{i}/{} {:?} -> {:?}", f.incarnation, f.op, f.reply),
        );
        if self.replicas[i].incarnation != f.incarnation {
            return; // for an incarnation that is gone
        }
        let reply = f.reply.unwrap_or(Reply::Failed);
        match (f.op, reply) {
            (Op::Join, Reply::Joined { lease, fence }) => {
                let timing = self.timing;
                let r = &mut self.replicas[i];
                r.joined = true;
                r.joining = false;
                r.lease = lease;
                r.standing.renewed(f.sent_local, &timing);
                if fence > r.max {
                    r.max = fence;
                    r.confirmed = false;
                }
                r.next_keepalive = f.sent_local + TTL_MS / 3;
            }
            (Op::Join, _) => self.replicas[i].joining = false,
            (Op::KeepAlive { .. }, Reply::Alive(true)) => {
                let timing = self.timing;
                self.replicas[i].standing.renewed(f.sent_local, &timing);
            }
            (Op::KeepAlive { .. }, Reply::Alive(false)) => self.self_fence(i),
            (Op::Raise { .. }, Reply::Raised { rev }) => {
                let Some(Task::Written { pending }) = self.replicas[i].task else {
                    return;
                };
                if matches!(self.variant, Variant::NoAckWait | Variant::WatchOnly) {
                    self.finish_raise(i, pending);
                    return;
                }
                let local = self.replicas[i].local(self.now);
                let me = self.replicas[i].name(i);
                self.replicas[i].task = Some(Task::Waiting {
                    wait: RaiseWait::new(pending.token, rev, &me, local, self.timing),
                    next_read: local,
                    pending,
                });
            }
            (Op::Raise { .. }, Reply::Higher(v)) => {
                let r = &mut self.replicas[i];
                r.task = None;
                if v > r.max {
                    r.max = v;
                    r.confirmed = false;
                }
                let lease = r.lease;
                if self.variant != Variant::WatchOnly {
                    self.send(i, Op::Ack { token: v, lease });
                }
            }
            (Op::Raise { .. }, _) => {
                self.replicas[i].task = None;
            }
            (Op::Members, Reply::Members(view)) => {
                let local = self.replicas[i].local(self.now);
                let Some(Task::Waiting {
                    wait,
                    next_read,
                    pending,
                }) = self.replicas[i].task.as_mut()
                else {
                    return;
                };
                let next = wait.next(&view, local);
                let pending = *pending;
                *next_read = next.wake_at.map_or(local + 5, |w| w.min(local + 5));
                for m in next.evict {
                    self.send(i, Op::Revoke { member: m });
                }
                for m in next.retire {
                    self.send(i, Op::Retire { member: m });
                }
                if next.admit {
                    self.finish_raise(i, pending);
                }
            }
            _ => {}
        }
    }

    fn finish_raise(&mut self, i: usize, pending: Pending) {
        self.raises += 1;
        let r = &mut self.replicas[i];
        r.task = None;
        if pending.token >= r.max {
            r.max = pending.token;
            r.confirmed = true;
        }
        if self.admits(i) {
            self.admit(i, pending.token, pending.stream_ms);
        }
    }

    fn step_replica(&mut self, i: usize) {
        if !self.running(i) {
            return;
        }
        let local = self.replicas[i].local(self.now);
        if !self.replicas[i].joined {
            if !self.replicas[i].joining {
                self.replicas[i].joining = true;
                self.send(i, Op::Join);
            }
            return;
        }
        if self.variant != Variant::WatchOnly {
            // The timer: standing over, fence self.
            if !self.replicas[i].standing.admits(local) {
                self.self_fence(i);
                return;
            }
            if local >= self.replicas[i].next_keepalive {
                self.replicas[i].next_keepalive = local + TTL_MS / 3;
                let lease = self.replicas[i].lease;
                self.send(i, Op::KeepAlive { lease });
            }
        }
        // Watch deliveries, when no task holds the fence.
        if self.replicas[i].task.is_none() {
            while let Some(&(v, at)) = self.replicas[i].watch.front() {
                if at > self.now {
                    break;
                }
                self.replicas[i].watch.pop_front();
                if v > self.replicas[i].max {
                    self.cut(i, Some(v));
                    self.replicas[i].task = Some(Task::Applying { token: v });
                    break;
                }
            }
        }
        match self.replicas[i].task {
            Some(Task::Draining { token, pending }) if self.drained(i, token) => {
                let lease = if self.variant == Variant::WatchOnly {
                    0
                } else {
                    self.replicas[i].lease
                };
                self.replicas[i].task = Some(Task::Written { pending });
                self.send(i, Op::Raise { token, lease });
            }
            Some(Task::Applying { token }) if self.drained(i, token) => {
                let r = &mut self.replicas[i];
                if token > r.max {
                    r.max = token;
                    r.confirmed = false;
                }
                r.task = None;
                let lease = r.lease;
                if self.variant != Variant::WatchOnly {
                    self.send(i, Op::Ack { token, lease });
                }
            }
            Some(Task::Waiting { next_read, .. }) if local >= next_read => {
                if let Some(Task::Waiting { next_read, .. }) = self.replicas[i].task.as_mut() {
                    *next_read = u64::MAX; // until this read is answered
                }
                self.send(i, Op::Members);
            }
            _ => {}
        }
    }

    /// A write with `token` arrives at replica `i`.
    fn request(&mut self, i: usize, token: u64) {
        if !self.running(i) || !self.admits(i) || self.replicas[i].task.is_some() {
            return; // refused: 503 or queued behind a raise; the client retries
        }
        let stream_ms = if self.rng.gen_bool(0.05) {
            self.rng.gen_range(200..2_000)
        } else {
            self.rng.gen_range(1..60)
        };
        let max = self.replicas[i].max;
        if token < max {
            return; // stale
        }
        if token == max && self.replicas[i].confirmed {
            self.admit(i, token, stream_ms);
            return;
        }
        self.cut(i, Some(token));
        self.replicas[i].task = Some(Task::Draining {
            token,
            pending: Pending { token, stream_ms },
        });
    }

    fn step(&mut self) {
        let now = self.now;
        // etcd: leases expire by the leader's clock, some early.
        let expired: Vec<i64> = self
            .etcd
            .leases
            .iter()
            .filter(|(_, exp)| **exp <= now)
            .map(|(l, _)| *l)
            .collect();
        for l in expired {
            self.etcd.expire(l);
        }
        if self.rng.gen_bool(1.0 / 3_000.0)
            && let Some(&l) = self.etcd.leases.keys().next()
        {
            self.etcd.expire(l);
        }
        // Requests applied, then answered.
        let mut watches = Vec::new();
        for k in 0..self.inflight.len() {
            if self.inflight[k].apply_at == now {
                let f = &self.inflight[k];
                let id = self.replicas[f.replica].name(f.replica);
                let id = if self.replicas[f.replica].incarnation == f.incarnation {
                    id
                } else {
                    format!("r{}-{}", f.replica, f.incarnation)
                };
                let op = f.op.clone();
                let reply = self.etcd.apply(&id, &op, now, &mut watches);
                self.inflight[k].reply = Some(reply);
            }
        }
        for (v, _rev) in watches {
            for r in 0..REPLICAS {
                let delay = if self.rng.gen_bool(0.05) {
                    self.rng.gen_range(100..3_000)
                } else {
                    self.rng.gen_range(1..20)
                };
                let at = (now + delay).max(self.replicas[r].partitioned_until);
                self.replicas[r].watch.push_back((v, at));
            }
        }
        let mut k = 0;
        while k < self.inflight.len() {
            let f = &self.inflight[k];
            if f.reply_at <= now && f.reply.is_some() && self.running(f.replica) {
                let f = self.inflight.swap_remove(k);
                self.reply(f);
            } else {
                k += 1;
            }
        }
        // The store: bodies stream (checked per chunk), sent writes commit.
        for w in 0..self.writes.len() {
            let Write {
                replica,
                incarnation,
                token,
                state,
            } = self.writes[w].clone();
            match state {
                WriteState::Streaming { left } => {
                    if self.replicas[replica].incarnation != incarnation {
                        self.writes[w].state = WriteState::Over; // crashed
                    } else if !self.running(replica) {
                    } else if self.variant != Variant::WatchOnly && !self.admits(replica) {
                        self.writes[w].state = WriteState::Over;
                    } else if left <= 1 {
                        let commit_at = now + self.rng.gen_range(0..=STORE_DECISION_MS);
                        self.writes[w].state = WriteState::Sent { commit_at };
                    } else {
                        self.writes[w].state = WriteState::Streaming { left: left - 1 };
                    }
                }
                WriteState::Sent { commit_at } if commit_at <= now => {
                    self.writes[w].state = WriteState::Over;
                    self.commits += 1;
                    if token < self.admitted {
                        self.fail(format!(
                            "a write of token {token} (replica {replica}) committed after {} was admitted",
                            self.admitted
                        ));
                    }
                }
                _ => {}
            }
        }
        self.writes.retain(|w| w.state != WriteState::Over);
        // Faults.
        for i in 0..REPLICAS {
            if self.rng.gen_bool(1.0 / 4_000.0) {
                let len = self.rng.gen_range(50..3 * TTL_MS);
                self.replicas[i].paused_until = now + len;
            }
            if self.rng.gen_bool(1.0 / 4_000.0) {
                let len = self.rng.gen_range(50..3 * TTL_MS);
                self.replicas[i].partitioned_until = now + len;
            }
            if self.rng.gen_bool(1.0 / 10_000.0) {
                // kill -9 and restart: streaming bodies end with the process.
                self.self_fence(i);
                self.replicas[i].max = 0;
                self.replicas[i].confirmed = true;
                self.replicas[i].paused_until = now + self.rng.gen_range(10..500);
            }
        }
        // Writers: a new holder now and then; everyone writes.
        if self.rng.gen_bool(1.0 / 700.0) {
            self.issued += 1;
        }
        for _ in 0..2 {
            if self.rng.gen_bool(0.3) {
                let zombie = self.rng.gen_bool(0.4);
                let token = if zombie && self.issued > 1 {
                    self.rng.gen_range(1..self.issued)
                } else {
                    self.issued
                };
                let i = self.rng.gen_range(0..REPLICAS);
                self.request(i, token);
            }
        }
        for i in 0..REPLICAS {
            self.step_replica(i);
        }
        self.now += 1;
    }
}

/// The outcome of one schedule.
struct Run {
    violation: Option<String>,
    commits: u64,
    raises: u64,
}

fn run(seed: u64, variant: Variant) -> Run {
    let mut sim = Sim::new(seed, variant);
    while sim.now < STEPS && sim.violation.is_none() {
        sim.step();
    }
    Run {
        violation: sim.violation,
        commits: sim.commits,
        raises: sim.raises,
    }
}

fn seeds() -> Vec<u64> {
    if let Some(seed) = std::env::var("FENCEGATE_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return vec![seed];
    }
    let n = std::env::var("FENCEGATE_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(150);
    (0..n).collect()
}

#[test]
fn the_protocol_holds_on_every_schedule() {
    let (mut commits, mut raises) = (0, 0);
    for seed in seeds() {
        let r = run(seed, Variant::Correct);
        if let Some(v) = r.violation {
            panic!("seed {seed}: {v}");
        }
        commits += r.commits;
        raises += r.raises;
    }
    // The schedules did something: writes landed and fences were raised.
    assert!(
        commits > 1_000 && raises > 20,
        "{commits} commits, {raises} raises"
    );
}

fn caught(variant: Variant) -> u64 {
    for seed in 0..400 {
        if let Some(v) = run(seed, variant).violation {
            eprintln!("{variant:?} caught on seed {seed}: {v}");
            return seed;
        }
    }
    panic!("the checker never caught {variant:?} in 400 seeds");
}

#[test]
fn the_checker_catches_a_raise_that_does_not_wait_for_acks() {
    caught(Variant::NoAckWait);
}

#[test]
fn the_checker_catches_a_raise_without_lock_delay() {
    caught(Variant::NoLockDelay);
}

#[test]
fn the_checker_catches_watch_only_propagation() {
    caught(Variant::WatchOnly);
}
