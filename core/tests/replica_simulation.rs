//! Deterministic simulation of proxy replicas sharing fences: it drives the
//! production state machine [`Replica`] (`fencegate_core::replicas::machine`)
//! through its public API only, against a simulated etcd and a simulated
//! store, on a seeded, time-ordered event queue.
//!
//! Modelled:
//! - **etcd**: one linearizable KV with revisions, implementing what each
//!   [`Request`] variant documents (member records, registrations, acks and
//!   draining reports on leases, fences with mod revisions, watches). Leases
//!   expire by etcd's clock, and now and then are revoked early
//!   (etcd#15247). A request is delayed, lost before it is applied, or
//!   applied with its answer lost (the replica hears [`Answer::Unknown`] at
//!   the driver's timeout either way). Leader changes make etcd unavailable
//!   for a moment (and refresh every lease, as etcd does).
//! - **replicas**: 2-5 per schedule, each with its own clock (rate within
//!   `1 ± drift`, its own offset), paused (SIGSTOP: nothing runs, the clock
//!   goes on) between any two inputs and between a chunk's check and its
//!   send, partitioned from etcd, killed and restarted as a fresh
//!   [`Replica`] with a new salt.
//! - **watches**: deliver the fence puts from the asked revision, late (up to
//!   seconds), and break now and then.
//! - **writers**: per lock, token holders (new tokens over time, global and
//!   increasing; old holders go on as zombies) sending writes to random
//!   replicas. An admitted write streams its body in chunks, each checked
//!   against [`Replica::admits`] and the replica's cuts; a fully sent write
//!   is committed by the store within `store_decision` (sometimes later than
//!   `ack_timeout`: slow is not dead), and the store's answer ends it at the
//!   replica ([`Replica::write_done`]).
//! - **a store slower than `store_decision`** while its replica stays
//!   healthy (no faults touch that replica until the store answered): the
//!   protocol must then hold by waiting for the draining replica.
//!
//! Each seed also draws a profile (calm or stormy faults, clients that
//! stick to one replica or not, short client timeouts, raise answers and
//! loads lost often or rarely), so that different seeds stress different
//! paths. A pause between a chunk's check and its send is bounded by the
//! margin the standing keeps for it (the stated assumption); pauses
//! anywhere else are not.
//!
//! The checker takes the store as ground truth: per lock, once token `t` was
//! admitted anywhere, no write below `t` may be admitted or committed
//! afterwards, anywhere. It also flags a replica whose timer keeps asking
//! for a time already past without moving on (a busy loop in the proxy).
//!
//! Every broken variant of [`Flaws`] (and a lock delay of 0) is caught on
//! some seed, which is what makes the passes meaningful; a separate negative
//! control breaks the stated assumption (a store deciding later than
//! `store_decision` while its replica is cut off from etcd) and must be
//! caught too.
//!
//! Replay: a failing seed prints with its violation.
//! `FENCEGATE_SIM_SEED=<seed>` runs that one seed (in every test; pick one
//! by name), `FENCEGATE_SIM_TRACE=1` prints what happened, and
//! `FENCEGATE_SIM_SEEDS=<n>` sets how many schedules the protocol runs
//! (default 2,000; `scripts/soak.sh` runs a million in release mode).

use fencegate_core::replicas::machine::Flaws;
use fencegate_core::replicas::{
    Admit, Answer, Event, MemberView, Ms, Published, RaiseRead, Replica, ReqId, Request, Timing,
    WriteId,
};
use rand::{Rng, RngCore};
use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::time::Duration;

/// The highest floor a schedule's cluster starts with.
const FLOOR_MAX: u64 = 6;
const TTL_MS: u64 = 1_000;
const DRIFT: f64 = 0.01;
const STORE_DECISION_MS: u64 = 600;
const ACK_TIMEOUT_MS: u64 = 300;
/// The driver gives up on an etcd request after this long (real time) and
/// answers [`Answer::Unknown`].
const REQ_TIMEOUT_MS: u64 = 400;
/// New writes and faults stop here; the schedule then runs on for
/// `SETTLE_MS` so that every write sent is decided and checked.
const RUN_MS: u64 = 8_000;
const SETTLE_MS: u64 = 4_000;
const LOCKS: [&str; 3] = ["a", "b", "c"];
/// A writer waiting on [`Admit::Wait`] gives up after up to this long
/// (each its own time: a raise's answer may come when its writers left).
const WAIT_GIVE_UP_MS: u64 = 4_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Correct,
    NoAckWait,
    AckBeforeDrain,
    JoinThenLoad,
    LostAsNotApplied,
    EvictDraining,
    /// The cluster's floor is not kept from the load.
    IgnoreFloor,
    /// `lock_delay` 0. A raiser also waits the minimum for the TTL and store
    /// time a member *published*, so this variant's etcd serves member
    /// records as unreadable (`published: None`): otherwise the floor from
    /// the record would hide the flaw.
    NoLockDelay,
}

impl Variant {
    fn flaws(self) -> Flaws {
        Flaws {
            no_ack_wait: self == Variant::NoAckWait,
            ack_before_drain: self == Variant::AckBeforeDrain,
            join_then_load: self == Variant::JoinThenLoad,
            lost_as_not_applied: self == Variant::LostAsNotApplied,
            evict_draining: self == Variant::EvictDraining,
            ignore_floor: self == Variant::IgnoreFloor,
        }
    }

    fn timing(self) -> Timing {
        let ttl = Duration::from_millis(TTL_MS);
        let store_decision = Duration::from_millis(STORE_DECISION_MS);
        let t = Timing {
            ttl,
            drift: DRIFT,
            store_decision,
            ack_timeout: Duration::from_millis(ACK_TIMEOUT_MS),
            lock_delay: Timing::min_lock_delay(ttl, DRIFT, store_decision),
        };
        if self == Variant::NoLockDelay {
            // Deliberately unsafe: `checked` would refuse it.
            return Timing {
                lock_delay: Duration::ZERO,
                ..t
            };
        }
        t.checked().expect("the simulation's timing is safe")
    }
}

/// What a schedule may do beyond the common faults.
#[derive(Debug, Clone, Copy)]
struct Config {
    variant: Variant,
    /// Some fully sent writes take the store longer than `store_decision`,
    /// while their replica stays healthy.
    late_while_healthy: bool,
    /// Negative control of the assumption: a replica's fully sent writes
    /// are decided long after `store_decision` when it is partitioned.
    late_while_partitioned: bool,
    /// Negative control of issue 34: a renewal that does not read back the
    /// member's record and registration, and raisers that see only members
    /// with a record (main before it). Registry edits then let a member
    /// nobody waits for admit.
    blind_renewal: bool,
}

impl Config {
    fn of(variant: Variant) -> Config {
        Config {
            variant,
            late_while_healthy: true,
            late_while_partitioned: false,
            blind_renewal: false,
        }
    }
}

// ------------------------------------------------------------------ etcd --

#[derive(Debug, Clone)]
struct MemberRec {
    create_rev: i64,
    published: Published,
    lease: i64,
}

/// Keys on a lease, per member: the lease and one value per lock.
type PerLock = HashMap<String, (i64, [u64; LOCKS.len()])>;

/// The store's state: `fences/<lock>`, `members/<id>` (no lease),
/// `proxies/<id>`, `acks/<lock>/<id>` and `draining/<lock>/<id>` (on the
/// member's lease).
#[derive(Debug, Default)]
struct Etcd {
    rev: i64,
    /// Per lock: the max and its mod revision.
    fences: [Option<(u64, i64)>; LOCKS.len()],
    /// Every fence put (revision, lock, token), for watches from a revision.
    log: Vec<(i64, usize, u64)>,
    members: BTreeMap<String, MemberRec>,
    regs: HashMap<String, i64>,
    acks: PerLock,
    draining: PerLock,
    /// Lease → expiry (real ms; etcd's clock rate is folded in).
    leases: BTreeMap<i64, u64>,
    next_lease: i64,
    /// etcd's clock rate: a lease of `ttl` lasts `ttl / rate` of real time.
    rate: f64,
    /// Member records read as unreadable ([`Variant::NoLockDelay`]).
    unreadable: bool,
    /// The create revision of each registration, and the settings its
    /// value repeats.
    reg_info: HashMap<String, (i64, Published)>,
    /// `roster/<id>`: each member record's copy.
    roster: BTreeMap<String, MemberRec>,
    /// [`Config::blind_renewal`].
    blind_renewal: bool,
    /// `floor`: every lock's least max (`--token-floor` at a replica's
    /// start). Tokens below it are stale on every lock.
    floor: u64,
}

fn lock_ix(lock: &str) -> usize {
    LOCKS
        .iter()
        .position(|l| *l == lock)
        .expect("a simulated lock")
}

impl Etcd {
    fn ttl_real(&self, ttl_secs: i64) -> u64 {
        (ttl_secs.max(1) as f64 * 1_000.0 / self.rate) as u64
    }

    fn expire(&mut self, now: u64) {
        let due: Vec<i64> = self
            .leases
            .iter()
            .filter(|(_, e)| **e <= now)
            .map(|(l, _)| *l)
            .collect();
        for l in due {
            self.drop_lease(l);
        }
    }

    /// The lease and every key on it are gone (expiry, revocation).
    fn drop_lease(&mut self, lease: i64) {
        if self.leases.remove(&lease).is_some() {
            self.rev += 1;
            self.regs.retain(|_, l| *l != lease);
            let regs = &self.regs;
            self.reg_info.retain(|id, _| regs.contains_key(id));
            self.acks.retain(|_, (l, _)| *l != lease);
            self.draining.retain(|_, (l, _)| *l != lease);
        }
    }

    fn put_on_lease(map: &mut PerLock, member: &str, lease: i64, lock: usize, token: u64) {
        let e = map
            .entry(member.to_owned())
            .or_insert((lease, [0; LOCKS.len()]));
        e.0 = lease;
        e.1[lock] = token;
    }

    /// Applies one request at real time `now`; fence puts go to the log
    /// (the caller feeds them to the watches).
    fn apply(&mut self, req: &Request, now: u64) -> Answer {
        self.expire(now);
        match req {
            Request::Revoke { lease } => {
                self.drop_lease(*lease);
                Answer::Done
            }
            Request::Grant { ttl_secs } => {
                self.next_lease += 1;
                let lease = self.next_lease;
                self.leases.insert(lease, now + self.ttl_real(*ttl_secs));
                Answer::Granted { lease }
            }
            Request::Register {
                id,
                lease,
                published,
            } => {
                if !self.leases.contains_key(lease) {
                    return Answer::LeaseGone;
                }
                self.rev += 1;
                let rev = self.rev;
                // A put keeps the key's create revision.
                for map in [&mut self.members, &mut self.roster] {
                    map.entry(id.clone())
                        .or_insert(MemberRec {
                            create_rev: rev,
                            published: *published,
                            lease: *lease,
                        })
                        .lease = *lease;
                }
                self.regs.insert(id.clone(), *lease);
                self.reg_info.entry(id.clone()).or_insert((rev, *published));
                Answer::Registered { rev }
            }
            Request::KeepAlive { lease, member } => {
                let ttl = self.ttl_real((TTL_MS / 1_000) as i64);
                match self.leases.get_mut(lease) {
                    Some(e) => *e = now + ttl,
                    None => return Answer::LeaseGone,
                }
                // The read-back of the cluster's `keep_alive`.
                let listed =
                    self.members.contains_key(member) && self.regs.get(member) == Some(lease);
                if listed || self.blind_renewal {
                    Answer::Done
                } else {
                    self.drop_lease(*lease);
                    Answer::LeaseGone
                }
            }
            Request::Load => Answer::Loaded {
                rev: self.rev,
                fences: self
                    .fences
                    .iter()
                    .enumerate()
                    .filter_map(|(i, f)| f.map(|(t, r)| (LOCKS[i].to_owned(), t, r)))
                    .collect(),
                floor: self.floor,
            },
            Request::Watch { .. } => unreachable!("watches are opened by the simulation"),
            Request::Raise {
                lock,
                token,
                member,
                lease,
            } => {
                // One transaction: a put on a lease that is gone fails it all.
                if !self.leases.contains_key(lease) {
                    return Answer::LeaseGone;
                }
                let i = lock_ix(lock);
                let cur = self.fences[i].map_or(0, |f| f.0);
                // The transaction puts the max if below and the ack if the
                // max is then the token; its answer is read as the proxy
                // reads etcd's.
                let applies = cur <= *token;
                if applies {
                    self.rev += 1;
                    if cur < *token {
                        self.fences[i] = Some((*token, self.rev));
                        self.log.push((self.rev, i, *token));
                    }
                    Etcd::put_on_lease(&mut self.acks, member, *lease, i, *token);
                }
                let (found, rev) = self.fences[i].unwrap_or((0, 0));
                match RaiseRead::of(*token, found, applies, rev) {
                    RaiseRead::Raised { rev } => Answer::Raised { rev },
                    RaiseRead::Higher { max } => Answer::Higher { max },
                    RaiseRead::Raced => unreachable!("one transaction cannot race itself"),
                }
            }
            Request::Ack {
                lock,
                token,
                member,
                lease,
            } => {
                if !self.leases.contains_key(lease) {
                    return Answer::LeaseGone;
                }
                self.rev += 1;
                Etcd::put_on_lease(&mut self.acks, member, *lease, lock_ix(lock), *token);
                Answer::Done
            }
            Request::Draining {
                lock,
                token,
                member,
                lease,
                ..
            } => {
                if !self.leases.contains_key(lease) {
                    return Answer::LeaseGone;
                }
                self.rev += 1;
                Etcd::put_on_lease(&mut self.draining, member, *lease, lock_ix(lock), *token);
                Answer::Done
            }
            Request::Members { lock } => {
                let i = lock_ix(lock);
                let mut view: Vec<MemberView> = self
                    .members
                    .iter()
                    .map(|(id, m)| MemberView {
                        id: id.clone(),
                        joined_rev: m.create_rev,
                        registered: self.regs.contains_key(id),
                        acked: self.acks.get(id).map_or(0, |a| a.1[i]),
                        draining: self.draining.get(id).map_or(0, |a| a.1[i]),
                        lease: self.regs.get(id).copied().unwrap_or(m.lease),
                        published: (!self.unreadable).then_some(m.published),
                    })
                    .collect();
                // A member whose record was deleted is still one: by its
                // roster copy, or by its registration alone.
                if !self.blind_renewal {
                    let mut seen: std::collections::BTreeSet<String> =
                        view.iter().map(|m| m.id.clone()).collect();
                    let mut regs: Vec<(&String, &i64)> = self.regs.iter().collect();
                    // In a fixed order: a seed replays.
                    regs.sort();
                    let others = self
                        .roster
                        .iter()
                        .map(|(id, m)| (id, m.create_rev, m.published, m.lease))
                        .chain(regs.into_iter().map(|(id, lease)| {
                            let (rev, published) = self.reg_info[id];
                            (id, rev, published, *lease)
                        }));
                    for (id, joined_rev, published, lease) in others {
                        if seen.insert(id.clone()) {
                            view.push(MemberView {
                                id: id.clone(),
                                joined_rev,
                                registered: self.regs.contains_key(id),
                                acked: self.acks.get(id).map_or(0, |a| a.1[i]),
                                draining: self.draining.get(id).map_or(0, |a| a.1[i]),
                                lease: self.regs.get(id).copied().unwrap_or(lease),
                                published: (!self.unreadable).then_some(published),
                            });
                        }
                    }
                }
                Answer::Members(view)
            }
            Request::Retire { member } => {
                let record = self.members.remove(member).is_some();
                if self.roster.remove(member).is_some() || record {
                    self.rev += 1;
                }
                Answer::Done
            }
        }
    }
}

/// A watch as etcd runs it: one ordered stream to one process.
#[derive(Debug)]
struct WatchRec {
    id: u64,
    slot: usize,
    proc: u64,
    incarnation: u64,
    alive: bool,
    /// When its last event is delivered (the stream stays in order).
    last_at: u64,
}

/// A sort key for a request that does not depend on the order it was made.
fn canonical(req: &Request) -> (u8, String, u64, i64) {
    match req {
        Request::Revoke { lease } => (0, String::new(), 0, *lease),
        Request::Grant { .. } => (1, String::new(), 0, 0),
        Request::Register { id, .. } => (2, id.clone(), 0, 0),
        Request::KeepAlive { lease, .. } => (3, String::new(), 0, *lease),
        Request::Load => (4, String::new(), 0, 0),
        Request::Watch { from_rev, .. } => (5, String::new(), 0, *from_rev),
        Request::Raise { lock, token, .. } => (6, lock.to_string(), *token, 0),
        Request::Ack { lock, token, .. } => (7, lock.to_string(), *token, 0),
        Request::Draining { lock, token, .. } => (8, lock.to_string(), *token, 0),
        Request::Members { lock } => (9, lock.to_string(), 0, 0),
        Request::Retire { member } => (10, member.clone(), 0, 0),
    }
}

// ------------------------------------------------------------ the queue --

#[derive(Debug)]
enum Ev {
    /// The replica's timer ([`Replica::poll_timeout`]), if still current.
    Timer {
        slot: usize,
        proc: u64,
        generation: u64,
    },
    /// A request reaches etcd.
    Apply {
        slot: usize,
        proc: u64,
        id: ReqId,
        req: Box<Request>,
        watch: u64,
    },
    Answer {
        slot: usize,
        proc: u64,
        id: ReqId,
        answer: Box<Answer>,
    },
    /// The driver's request timeout.
    Timeout {
        slot: usize,
        proc: u64,
        id: ReqId,
    },
    WatchOpened {
        slot: usize,
        proc: u64,
        watch: u64,
        incarnation: u64,
    },
    WatchEvent {
        slot: usize,
        proc: u64,
        watch: u64,
        incarnation: u64,
        lock: usize,
        token: u64,
    },
    WatchBroken {
        slot: usize,
        proc: u64,
        watch: u64,
        incarnation: u64,
    },
    /// A write reaches a replica (whichever process runs there).
    Arrive {
        slot: usize,
        write: usize,
    },
    /// The waiting writes ask again.
    Retry {
        slot: usize,
        proc: u64,
    },
    /// A write's next chunk is due.
    Chunk {
        slot: usize,
        proc: u64,
        write: usize,
    },
    /// The store answers a committed write.
    StoreAnswer {
        slot: usize,
        proc: u64,
        write: usize,
    },
    Resume {
        slot: usize,
        proc: u64,
    },
    /// The store decides a fully sent write (if `at` is still its time).
    Commit {
        write: usize,
        at: u64,
    },
    Restart {
        slot: usize,
    },
    /// A holder's next write; it mostly goes through its `home` replica.
    Writer {
        lock: usize,
        token: u64,
        home: usize,
    },
    Issue,
    Fault,
}

impl Ev {
    /// The process an input is for, if it is one.
    fn target(&self) -> Option<(usize, Option<u64>)> {
        match *self {
            Ev::Timer { slot, proc, .. }
            | Ev::Answer { slot, proc, .. }
            | Ev::Timeout { slot, proc, .. }
            | Ev::WatchOpened { slot, proc, .. }
            | Ev::WatchEvent { slot, proc, .. }
            | Ev::WatchBroken { slot, proc, .. }
            | Ev::Retry { slot, proc }
            | Ev::Chunk { slot, proc, .. }
            | Ev::StoreAnswer { slot, proc, .. } => Some((slot, Some(proc))),
            Ev::Arrive { slot, .. } => Some((slot, None)),
            _ => None,
        }
    }
}

#[derive(Debug)]
struct Queued {
    at: u64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    // Reversed: the heap pops the earliest, ties in the order queued.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

// ------------------------------------------------------ replicas, writes --

#[derive(Debug)]
struct Proc {
    generation: u64,
    replica: Replica,
    paused_until: u64,
    /// Inputs that came while paused, in order.
    held: VecDeque<Ev>,
    /// Chunks checked just before a pause: they go out first at resume,
    /// unchecked (the pause landed between the check and the send).
    send_after_pause: Vec<usize>,
    timer_gen: u64,
    timer_at: Option<u64>,
    /// Timers in a row that left the replica due at once again.
    spins: u32,
    /// Requests sent and not yet answered or timed out, and whether each
    /// is in trouble (lost, or stuck in a queue).
    pending: BTreeMap<ReqId, bool>,
    /// Writes told [`Admit::Wait`], asked again a moment later.
    waiting: Vec<usize>,
    /// When they are asked again (one wake-up at a time).
    retry_at: Option<u64>,
    /// Writes streaming their body.
    streaming: Vec<usize>,
    /// The current watch stream (0: none).
    watch: u64,
}

#[derive(Debug)]
struct Slot {
    name: String,
    rate: f64,
    offset: u64,
    proc: Option<Proc>,
    gens: u64,
    partitioned_until: u64,
    /// No fault touches this replica until then (a store slower than
    /// `store_decision` is answering it).
    protected_until: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WState {
    Arriving,
    Waiting { until: u64 },
    Streaming,
    Sent,
    Committed,
    Over,
}

#[derive(Debug)]
struct Write {
    slot: usize,
    proc: u64,
    lock: usize,
    token: u64,
    id: Option<WriteId>,
    chunks_left: u32,
    gap: (u64, u64),
    cut: bool,
    state: WState,
    commit_at: u64,
}

/// SplitMix64: a seeded generator cheap enough for a debug build (ChaCha
/// took a third of the run); `rand`'s `Rng` methods work on it.
#[derive(Debug)]
struct SimRng(u64);

impl RngCore for SimRng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        for chunk in dest.chunks_mut(8) {
            let b = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&b[..chunk.len()]);
        }
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

fn trace_on() -> bool {
    std::env::var_os("FENCEGATE_SIM_TRACE").is_some()
}

struct Sim {
    rng: SimRng,
    cfg: Config,
    timing: Timing,
    lock_delay_ms: u64,
    trace: bool,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Queued>,
    etcd: Etcd,
    etcd_down_until: u64,
    watches: Vec<WatchRec>,
    next_watch: u64,
    slots: Vec<Slot>,
    locks: usize,
    profile: Profile,
    writes: Vec<Write>,
    /// Per lock: the tokens whose holders still write (the oldest first).
    holders: Vec<Vec<u64>>,
    issued: u64,
    /// Per lock: the highest token admitted so far, when and where.
    top: Vec<(u64, u64, String)>,
    violation: Option<String>,
    stats: Stats,
}

/// How nasty one schedule is where it matters to some flaw.
#[derive(Debug, Clone, Copy)]
struct Profile {
    /// How often a holder writes through its home replica (clients keep a
    /// connection; the rest go anywhere).
    affinity: f64,
    /// How often a raise is applied and its answer lost (the costliest
    /// loss: the raiser's ack is in etcd, and it does not know).
    raise_answer_loss: f64,
    /// How many clients give up waiting within half a second.
    short_timeouts: f64,
    /// The mean gap between faults (ms): a calm schedule lets maxes stay
    /// confirmed, which is where a flaw in steady state does harm.
    fault_gap: u64,
    /// How often a load is lost (a rejoin whose load fails).
    load_loss: f64,
}

#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    commits: u64,
    /// Admissions of a token above every one admitted before on its lock.
    raises: u64,
    evictions: u64,
    late: u64,
    cut: u64,
    /// Member records and registrations deleted by hand.
    registry_edits: u64,
}

impl Sim {
    fn new(seed: u64, cfg: Config) -> Sim {
        let mut rng = SimRng(seed);
        let n = rng.gen_range(2..=5);
        let locks = rng.gen_range(2..=LOCKS.len());
        let timing = cfg.variant.timing();
        // Each seed stresses some paths more than others.
        let profile = Profile {
            affinity: if rng.gen_bool(0.5) { 0.8 } else { 0.0 },
            raise_answer_loss: if rng.gen_bool(0.3) { 0.35 } else { 0.05 },
            short_timeouts: rng.gen_range(0.0..=1.0),
            fault_gap: if rng.gen_bool(0.5) { 150 } else { 1_000 },
            load_loss: if rng.gen_bool(0.3) { 0.5 } else { 0.01 },
        };
        let slots = (0..n)
            .map(|i| Slot {
                name: format!("r{i}"),
                rate: rng.gen_range(1.0 - DRIFT..=1.0 + DRIFT),
                offset: rng.gen_range(0..1_000_000_000),
                proc: None,
                gens: 0,
                partitioned_until: 0,
                protected_until: 0,
            })
            .collect();
        // One schedule in four starts on a cluster whose floor is above
        // the first tokens issued (an operator's `--token-floor` after a
        // lost etcd): those tokens are stale on every lock.
        let floor = if rng.gen_bool(0.25) {
            rng.gen_range(2..=FLOOR_MAX)
        } else {
            0
        };
        let etcd = Etcd {
            floor,
            rate: rng.gen_range(1.0 - DRIFT..=1.0 + DRIFT),
            unreadable: cfg.variant == Variant::NoLockDelay,
            blind_renewal: cfg.blind_renewal,
            ..Etcd::default()
        };
        let mut sim = Sim {
            rng,
            cfg,
            timing,
            lock_delay_ms: timing.lock_delay.as_millis() as u64,
            trace: trace_on(),
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            etcd,
            etcd_down_until: 0,
            watches: Vec::new(),
            next_watch: 0,
            slots,
            locks,
            profile,
            writes: Vec::new(),
            holders: vec![Vec::new(); locks],
            issued: 0,
            top: vec![(floor, 0, "the cluster's floor".to_owned()); locks],
            violation: None,
            stats: Stats::default(),
        };
        for s in 0..n {
            sim.restart(s);
        }
        for lock in 0..locks {
            sim.issue_for(lock);
        }
        let first = sim.rng.gen_range(200..1_500);
        sim.at(first, Ev::Issue);
        let fault = sim.rng.gen_range(100..500);
        sim.at(fault, Ev::Fault);
        sim
    }

    fn at(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Queued {
            at,
            seq: self.seq,
            ev,
        });
    }

    fn after(&mut self, delay: u64, ev: Ev) {
        self.at(self.now + delay, ev);
    }

    fn tr(&self, what: impl FnOnce() -> String) {
        if self.trace {
            eprintln!("{:>6} {}", self.now, what());
        }
    }

    fn fail(&mut self, what: String) {
        if self.violation.is_none() {
            self.tr(|| format!("VIOLATION {what}"));
            self.violation = Some(format!("at {} ms: {what}", self.now));
        }
    }

    // -------------------------------------------------------------- clocks

    fn local(&self, slot: usize) -> Ms {
        let s = &self.slots[slot];
        s.offset + (self.now as f64 * s.rate) as u64
    }

    /// The first real time at which `slot`'s clock reads `local`.
    fn to_real(&self, slot: usize, local: Ms) -> u64 {
        let s = &self.slots[slot];
        if local <= s.offset {
            return 0;
        }
        let mut r = ((local - s.offset) as f64 / s.rate).ceil() as u64;
        while s.offset + (r as f64 * s.rate) as u64 > local && r > 0 {
            r -= 1;
        }
        while s.offset + (((r as f64) * s.rate) as u64) < local {
            r += 1;
        }
        r
    }

    fn partitioned(&self, slot: usize) -> bool {
        self.now < self.slots[slot].partitioned_until
    }

    fn protected(&self, slot: usize) -> bool {
        self.now < self.slots[slot].protected_until
    }

    fn proc(&mut self, slot: usize) -> &mut Proc {
        self.slots[slot].proc.as_mut().expect("a running process")
    }

    // ------------------------------------------------------------ the loop

    fn run(&mut self) {
        while let Some(q) = self.queue.pop() {
            if q.at > RUN_MS + SETTLE_MS || self.violation.is_some() {
                break;
            }
            self.now = q.at;
            self.dispatch(q.ev);
        }
    }

    fn dispatch(&mut self, ev: Ev) {
        if let Some((slot, generation)) = ev.target() {
            let Some(p) = self.slots[slot].proc.as_mut() else {
                if let Ev::Arrive { write, .. } = ev {
                    self.writes[write].state = WState::Over; // nobody listens
                }
                return;
            };
            if generation.is_some_and(|g| g != p.generation) {
                return; // for a process that died
            }
            if self.now < p.paused_until {
                p.held.push_back(ev);
                return;
            }
            self.input(slot, ev);
            self.after_input(slot);
            return;
        }
        match ev {
            Ev::Apply {
                slot,
                proc,
                id,
                req,
                watch,
            } => self.apply(slot, proc, id, *req, watch),
            Ev::Commit { write, at } => self.commit(write, at),
            Ev::Resume { slot, proc } => self.resume(slot, proc),
            Ev::Restart { slot } => self.restart(slot),
            Ev::Writer { lock, token, home } => self.writer(lock, token, home),
            Ev::Issue => {
                if self.now < RUN_MS {
                    let lock = self.rng.gen_range(0..self.locks);
                    self.issue_for(lock);
                    let next = self.rng.gen_range(200..1_500);
                    self.after(next, Ev::Issue);
                }
            }
            Ev::Fault => {
                if self.now < RUN_MS {
                    self.fault();
                    let gap = self.profile.fault_gap;
                    let next = self.rng.gen_range(gap / 5..gap * 9 / 5);
                    self.after(next, Ev::Fault);
                }
            }
            _ => unreachable!("inputs are routed above"),
        }
    }

    /// One input to a running process.
    fn input(&mut self, slot: usize, ev: Ev) {
        let now = self.local(slot);
        let p = self.proc(slot);
        match ev {
            Ev::Timer { generation, .. } => {
                if generation != p.timer_gen {
                    return;
                }
                p.timer_at = None;
                p.replica.handle_timeout(now);
                // A timer that leaves the replica due at once again, over
                // and over, is a busy loop in the proxy.
                if p.replica.poll_timeout().is_some_and(|t| t <= now) {
                    p.spins += 1;
                    if p.spins > 100 {
                        let why = format!(
                            "liveness: replica {slot}'s poll_timeout stays at {:?} <= now {now} after handle_timeout ({:?})",
                            p.replica.poll_timeout(),
                            p.replica.raises(now)
                        );
                        self.fail(why);
                    }
                } else {
                    p.spins = 0;
                }
            }
            Ev::Answer { id, answer, .. } => {
                if p.pending.remove(&id).is_some() {
                    self.tr(|| format!("r{slot} <- #{id} {answer:?}"));
                    self.proc(slot).replica.handle_answer(id, *answer, now);
                }
            }
            Ev::Timeout { id, .. } => {
                if p.pending.remove(&id).is_some() {
                    self.tr(|| format!("r{slot} <- #{id} timed out"));
                    self.proc(slot).replica.handle_answer(
                        id,
                        Answer::Unknown("timed out".into()),
                        now,
                    );
                }
            }
            Ev::WatchOpened {
                watch, incarnation, ..
            } => {
                if p.watch == watch {
                    p.replica.watch_opened(incarnation, now);
                }
            }
            Ev::WatchEvent {
                watch,
                incarnation,
                lock,
                token,
                ..
            } => {
                if p.watch == watch {
                    self.tr(|| format!("r{slot} watch {}={token}", LOCKS[lock]));
                    self.proc(slot)
                        .replica
                        .watch_event(incarnation, LOCKS[lock], token, now);
                }
            }
            Ev::WatchBroken {
                watch, incarnation, ..
            } => {
                if p.watch == watch {
                    p.watch = 0;
                    self.tr(|| format!("r{slot} watch broken"));
                    self.proc(slot).replica.watch_broken(incarnation, now);
                }
            }
            Ev::Arrive { write, .. } => {
                let generation = p.generation;
                self.writes[write].proc = generation;
                self.try_admit(slot, write);
            }
            Ev::Chunk { write, .. } => self.chunk(slot, write),
            Ev::Retry { .. } => self.retry(slot),
            Ev::StoreAnswer { write, .. } => {
                if let Some(id) = self.writes[write].id.clone() {
                    self.proc(slot).replica.write_done(&id, now);
                }
                self.writes[write].state = WState::Over;
            }
            _ => unreachable!("not an input"),
        }
    }

    /// What the driver does after every input: act on events, send
    /// requests, wake the waiting writes a moment later, set the timer.
    fn after_input(&mut self, slot: usize) {
        self.drain(slot);
        let now = self.now;
        let p = self.proc(slot);
        if !p.waiting.is_empty() && p.retry_at.is_none() {
            // Not at once: a proxy's waiters wake a moment after the state
            // changed, and what the replica does meanwhile counts.
            let proc = p.generation;
            let at = now + self.rng.gen_range(1..=30);
            self.proc(slot).retry_at = Some(at);
            self.at(at, Ev::Retry { slot, proc });
        }
        let Some(p) = self.slots[slot].proc.as_ref() else {
            return;
        };
        let due = p
            .replica
            .poll_timeout()
            .map(|t| self.to_real(slot, t).max(now));
        let p = self.proc(slot);
        if due != p.timer_at {
            p.timer_gen += 1;
            p.timer_at = due;
            let (proc, generation) = (p.generation, p.timer_gen);
            if let Some(at) = due {
                self.at(
                    at,
                    Ev::Timer {
                        slot,
                        proc,
                        generation,
                    },
                );
            }
        }
    }

    /// Asks every waiting write again.
    fn retry(&mut self, slot: usize) {
        let now = self.now;
        self.proc(slot).retry_at = None;
        let waiting = std::mem::take(&mut self.proc(slot).waiting);
        // Writes of one lock and token get the same answer: once one is told
        // to wait again, the others wait without asking.
        let mut still: Vec<(usize, u64)> = Vec::new();
        for w in waiting {
            let key = (self.writes[w].lock, self.writes[w].token);
            match self.writes[w].state {
                WState::Waiting { until } if now >= until => {
                    self.writes[w].state = WState::Over;
                }
                WState::Waiting { .. } if still.contains(&key) => self.proc(slot).waiting.push(w),
                WState::Waiting { .. } => {
                    self.try_admit(slot, w);
                    if matches!(self.writes[w].state, WState::Waiting { .. }) {
                        still.push(key);
                    }
                }
                _ => {}
            }
        }
    }

    fn drain(&mut self, slot: usize) {
        while let Some(e) = self.proc(slot).replica.poll_event() {
            self.tr(|| format!("r{slot} event {e:?}"));
            match e {
                Event::Cut(lock) => self.cut(slot, Some(lock_ix(&lock))),
                Event::CutAll => self.cut(slot, None),
                Event::Evicting { .. } => self.stats.evictions += 1,
                _ => {}
            }
        }
        let mut batch = Vec::new();
        while let Some(r) = self.proc(slot).replica.poll_request() {
            batch.push(r);
        }
        // The replica walks its locks in a HashMap's order: send each batch
        // in an order of its own so that a seed replays exactly.
        if batch.len() > 1 {
            batch.sort_by_cached_key(|(_, req)| canonical(req));
        }
        for (id, req) in batch {
            self.send(slot, id, req);
        }
    }

    /// Marks the streaming writes of `lock` (or all) cut: their next chunk
    /// ends them and tells the replica. A fully sent write cannot be cut.
    fn cut(&mut self, slot: usize, lock: Option<usize>) {
        let streaming = std::mem::take(&mut self.proc(slot).streaming);
        let mut keep = Vec::new();
        for w in streaming {
            if self.writes[w].state != WState::Streaming {
                continue;
            }
            if lock.is_none_or(|l| l == self.writes[w].lock) {
                self.writes[w].cut = true;
            }
            keep.push(w);
        }
        self.proc(slot).streaming = keep;
    }

    fn resume(&mut self, slot: usize, generation: u64) {
        let now = self.now;
        let Some(p) = self.slots[slot].proc.as_mut() else {
            return;
        };
        if p.generation != generation || now < p.paused_until {
            return;
        }
        let sends = std::mem::take(&mut p.send_after_pause);
        self.tr(|| format!("r{slot} resumes"));
        for w in sends {
            self.send_chunk(slot, w);
        }
        loop {
            let p = self.proc(slot);
            if now < p.paused_until {
                break; // paused again (between a check and its send)
            }
            let Some(ev) = p.held.pop_front() else { break };
            // A held input for an older process cannot be here: a crash
            // drops the process with its queue.
            self.input(slot, ev);
            self.after_input(slot);
        }
        self.after_input(slot);
    }

    fn pause(&mut self, slot: usize, len: u64) {
        let until = self.now + len;
        let p = self.proc(slot);
        p.paused_until = p.paused_until.max(until);
        let generation = p.generation;
        self.tr(|| format!("r{slot} paused for {len} ms"));
        self.at(
            until,
            Ev::Resume {
                slot,
                proc: generation,
            },
        );
    }

    fn restart(&mut self, slot: usize) {
        let salt = self.rng.r#gen::<u32>() as u64;
        let local = self.local(slot);
        let mut replica = Replica::new(&self.slots[slot].name, salt, self.timing, local);
        if self.cfg.variant != Variant::Correct {
            replica = replica.with_flaws(self.cfg.variant.flaws());
        }
        let s = &mut self.slots[slot];
        s.gens += 1;
        s.proc = Some(Proc {
            generation: s.gens,
            replica,
            paused_until: 0,
            held: VecDeque::new(),
            send_after_pause: Vec::new(),
            timer_gen: 0,
            timer_at: None,
            spins: 0,
            pending: BTreeMap::new(),
            waiting: Vec::new(),
            retry_at: None,
            streaming: Vec::new(),
            watch: 0,
        });
        self.tr(|| format!("r{slot} starts (salt {salt:x})"));
        self.after_input(slot);
    }

    // ---------------------------------------------------------------- etcd

    fn send(&mut self, slot: usize, id: ReqId, req: Request) {
        self.tr(|| format!("r{slot} -> #{id} {req:?}"));
        let protected = self.protected(slot);
        let p_lost = if matches!(req, Request::Load) {
            self.profile.load_loss
        } else {
            0.01
        };
        let lost = !protected && (self.partitioned(slot) || self.rng.gen_bool(p_lost));
        let p = self.proc(slot);
        let proc = p.generation;
        let mut watch = 0;
        if let Request::Watch { incarnation, .. } = req {
            // The driver replaces its watch stream.
            let old = p.watch;
            self.next_watch += 1;
            watch = self.next_watch;
            self.proc(slot).watch = watch;
            if let Some(w) = self.watches.iter_mut().find(|w| w.id == old) {
                w.alive = false;
            }
            if lost {
                self.after(
                    REQ_TIMEOUT_MS,
                    Ev::WatchBroken {
                        slot,
                        proc,
                        watch,
                        incarnation,
                    },
                );
                return;
            }
        } else {
            p.pending.insert(id, lost);
            self.after(REQ_TIMEOUT_MS, Ev::Timeout { slot, proc, id });
            if lost {
                return;
            }
        }
        let delay = if protected || !self.rng.gen_bool(0.03) {
            self.rng.gen_range(1..=5)
        } else {
            // Stuck in a queue: maybe applied after the driver gave up.
            self.trouble(slot, proc, id);
            self.rng.gen_range(50..=600)
        };
        let delay = if watch != 0 {
            delay.min(REQ_TIMEOUT_MS - 50)
        } else {
            delay
        };
        self.after(
            delay,
            Ev::Apply {
                slot,
                proc,
                id,
                req: Box::new(req),
                watch,
            },
        );
    }

    /// Marks a request that will not be answered in time.
    fn trouble(&mut self, slot: usize, proc: u64, id: ReqId) {
        if let Some(p) = self.slots[slot].proc.as_mut()
            && p.generation == proc
            && let Some(t) = p.pending.get_mut(&id)
        {
            *t = true;
        }
    }

    fn apply(&mut self, slot: usize, proc: u64, id: ReqId, req: Request, watch: u64) {
        let protected = self.protected(slot);
        if !protected && (self.now < self.etcd_down_until || self.partitioned(slot)) {
            self.tr(|| format!("etcd: #{id} of r{slot} lost before apply"));
            self.trouble(slot, proc, id);
            if let Request::Watch { incarnation, .. } = req {
                self.after(
                    REQ_TIMEOUT_MS / 2,
                    Ev::WatchBroken {
                        slot,
                        proc,
                        watch,
                        incarnation,
                    },
                );
            }
            return;
        }
        if let Request::Watch {
            incarnation,
            from_rev,
        } = req
        {
            self.open_watch(slot, proc, watch, incarnation, from_rev);
            return;
        }
        let before = self.etcd.log.len();
        let answer = self.etcd.apply(&req, self.now);
        self.tr(|| format!("etcd: #{id} of r{slot} applied: {answer:?}"));
        for k in before..self.etcd.log.len() {
            let (_, lock, token) = self.etcd.log[k];
            self.notify(lock, token);
        }
        // A raise's answer is lost more often: the nastiest loss.
        let p_lost = if matches!(req, Request::Raise { .. }) {
            self.profile.raise_answer_loss
        } else {
            0.02
        };
        if !protected && self.rng.gen_bool(p_lost) {
            self.tr(|| format!("etcd: answer to #{id} of r{slot} lost"));
            self.trouble(slot, proc, id);
            return;
        }
        let delay = self.rng.gen_range(1..=5);
        self.after(
            delay,
            Ev::Answer {
                slot,
                proc,
                id,
                answer: Box::new(answer),
            },
        );
    }

    fn open_watch(&mut self, slot: usize, proc: u64, watch: u64, incarnation: u64, from: i64) {
        let current = self.slots[slot]
            .proc
            .as_ref()
            .is_some_and(|p| p.generation == proc && p.watch == watch);
        if !current {
            return;
        }
        self.watches.retain(|w| w.alive);
        self.watches.push(WatchRec {
            id: watch,
            slot,
            proc,
            incarnation,
            alive: true,
            last_at: self.now,
        });
        let k = self.watches.len() - 1;
        let opened = Ev::WatchOpened {
            slot,
            proc,
            watch,
            incarnation,
        };
        self.deliver(k, opened);
        let replay: Vec<(usize, u64)> = self
            .etcd
            .log
            .iter()
            .filter(|(rev, _, _)| *rev >= from)
            .map(|(_, l, t)| (*l, *t))
            .collect();
        for (lock, token) in replay {
            let ev = Ev::WatchEvent {
                slot,
                proc,
                watch,
                incarnation,
                lock,
                token,
            };
            self.deliver(k, ev);
        }
    }

    /// A fence put goes to every watch; now and then one breaks.
    fn notify(&mut self, lock: usize, token: u64) {
        for k in 0..self.watches.len() {
            let w = &self.watches[k];
            if !w.alive {
                continue;
            }
            let (slot, proc, watch, incarnation) = (w.slot, w.proc, w.id, w.incarnation);
            let ev = Ev::WatchEvent {
                slot,
                proc,
                watch,
                incarnation,
                lock,
                token,
            };
            self.deliver(k, ev);
            let p_break = if self.partitioned(slot) { 0.5 } else { 0.02 };
            if !self.protected(slot) && self.rng.gen_bool(p_break) {
                self.watches[k].alive = false;
                let ev = Ev::WatchBroken {
                    slot,
                    proc,
                    watch,
                    incarnation,
                };
                self.deliver(k, ev);
            }
        }
    }

    /// Queues `ev` on watch `k`'s stream: late, in order, and not before a
    /// partition of its replica ends.
    fn deliver(&mut self, k: usize, ev: Ev) {
        let slot = self.watches[k].slot;
        let delay = if self.protected(slot) || !self.rng.gen_bool(0.05) {
            self.rng.gen_range(1..=8)
        } else {
            self.rng.gen_range(100..=2_000)
        };
        let mut at = (self.now + delay).max(self.watches[k].last_at);
        if self.partitioned(slot) {
            at = at.max(self.slots[slot].partitioned_until + self.rng.gen_range(1..=20));
        }
        self.watches[k].last_at = at;
        self.at(at, ev);
    }

    // -------------------------------------------------------------- writes

    fn issue_for(&mut self, lock: usize) {
        self.issued += 1;
        let token = self.issued;
        self.tr(|| format!("token {token} issued for {}", LOCKS[lock]));
        self.holders[lock].push(token);
        if self.holders[lock].len() > 3 {
            self.holders[lock].remove(0);
        }
        let home = self.rng.gen_range(0..self.slots.len());
        self.after(0, Ev::Writer { lock, token, home });
    }

    /// A holder sends a write to a replica (mostly the one it keeps a
    /// connection to), then its next one later.
    fn writer(&mut self, lock: usize, token: u64, home: usize) {
        if self.now >= RUN_MS || !self.holders[lock].contains(&token) {
            return;
        }
        let slot = if self.rng.gen_bool(self.profile.affinity) {
            home
        } else {
            self.rng.gen_range(0..self.slots.len())
        };
        let (chunks, gap) = if self.rng.gen_bool(0.05) {
            (self.rng.gen_range(3..=8), (50, 300))
        } else {
            (self.rng.gen_range(1..=4), (1, 20))
        };
        self.writes.push(Write {
            slot,
            proc: 0,
            lock,
            token,
            id: None,
            chunks_left: chunks,
            gap,
            cut: false,
            state: WState::Arriving,
            commit_at: 0,
        });
        let write = self.writes.len() - 1;
        let d = self.rng.gen_range(0..=3);
        self.after(d, Ev::Arrive { slot, write });
        let next = self.rng.gen_range(5..=80);
        self.after(next, Ev::Writer { lock, token, home });
    }

    fn try_admit(&mut self, slot: usize, w: usize) {
        let now = self.local(slot);
        let (lock, token) = (self.writes[w].lock, self.writes[w].token);
        let a = self.proc(slot).replica.begin_write(LOCKS[lock], token, now);
        match a {
            Admit::Admitted(id) => {
                self.tr(|| format!("r{slot} admits {}@{token}", LOCKS[lock]));
                self.check_admitted(slot, lock, token);
                let w_ = &mut self.writes[w];
                w_.id = Some(id);
                w_.state = WState::Streaming;
                let (proc, gap) = (w_.proc, w_.gap);
                self.proc(slot).streaming.push(w);
                let d = self.rng.gen_range(gap.0..=gap.1);
                self.after(
                    d,
                    Ev::Chunk {
                        slot,
                        proc,
                        write: w,
                    },
                );
            }
            Admit::Wait => {
                if !matches!(self.writes[w].state, WState::Waiting { .. }) {
                    let give_up = if self.rng.gen_bool(self.profile.short_timeouts) {
                        self.rng.gen_range(50..=500)
                    } else {
                        self.rng.gen_range(500..=WAIT_GIVE_UP_MS)
                    };
                    let until = self.now + give_up;
                    self.writes[w].state = WState::Waiting { until };
                }
                self.proc(slot).waiting.push(w);
            }
            Admit::Stale { .. } | Admit::Unavailable(_) => self.writes[w].state = WState::Over,
        }
    }

    fn chunk(&mut self, slot: usize, w: usize) {
        if self.writes[w].state != WState::Streaming {
            return;
        }
        let now = self.local(slot);
        let admits = self.proc(slot).replica.admits(now);
        if self.writes[w].cut || !admits {
            // The body is cut: the store never commits it.
            self.tr(|| format!("r{slot} cuts a write of {}", self.writes[w].token));
            self.stats.cut += 1;
            self.writes[w].state = WState::Over;
            if let Some(id) = self.writes[w].id.clone() {
                self.proc(slot).replica.write_done(&id, now);
            }
            return;
        }
        if !self.protected(slot) && self.rng.gen_bool(0.01) {
            // SIGSTOP between the check and the send, no longer than the
            // margin the standing keeps for it (a tenth of the TTL, less
            // drift): the stated bound on the work between a check and the
            // write it allows.
            let margin = (TTL_MS as f64 * (1.0 - DRIFT) * 0.1 * (1.0 - DRIFT)) as u64;
            let len = self.rng.gen_range(1..=margin);
            self.proc(slot).send_after_pause.push(w);
            self.pause(slot, len);
            return;
        }
        self.send_chunk(slot, w);
    }

    fn send_chunk(&mut self, slot: usize, w: usize) {
        if self.writes[w].state != WState::Streaming {
            return;
        }
        self.writes[w].chunks_left -= 1;
        let proc = self.writes[w].proc;
        if self.writes[w].chunks_left > 0 {
            let (lo, hi) = self.writes[w].gap;
            let d = self.rng.gen_range(lo..=hi);
            self.after(
                d,
                Ev::Chunk {
                    slot,
                    proc,
                    write: w,
                },
            );
            return;
        }
        // Fully sent: the store decides it whatever the replica does now.
        self.writes[w].state = WState::Sent;
        let delay = self.store_delay(slot, w);
        let at = self.now + delay;
        self.writes[w].commit_at = at;
        self.at(at, Ev::Commit { write: w, at });
    }

    fn store_delay(&mut self, slot: usize, w: usize) -> u64 {
        if self.cfg.late_while_partitioned && self.partitioned(slot) {
            return self.late_after_partition(slot);
        }
        if self.cfg.late_while_healthy && self.rng.gen_bool(0.05) && self.healthy(slot, w) {
            // Slower than store_decision: safe only because the replica
            // stays registered and says it is draining. Nothing touches it
            // until the store has answered.
            let d = self
                .rng
                .gen_range(STORE_DECISION_MS..ACK_TIMEOUT_MS + 2 * self.lock_delay_ms.max(1_000));
            let s = &mut self.slots[slot];
            s.protected_until = s.protected_until.max(self.now + d + 50);
            self.stats.late += 1;
            self.tr(|| format!("r{slot}: the store is late on this write ({d} ms)"));
            return d;
        }
        if self.rng.gen_bool(0.1) {
            // Slower than a raiser's ack timeout, within store_decision.
            return self.rng.gen_range(ACK_TIMEOUT_MS..=STORE_DECISION_MS);
        }
        self.rng.gen_range(0..=30)
    }

    /// Whether nothing stands between `slot` and a raiser's wait for it:
    /// not partitioned, no request in trouble, its standing well within
    /// its renewals, registered, its watch stream current, and its max of
    /// the write's lock the one etcd has (so it learns any later raise at
    /// once).
    fn healthy(&self, slot: usize, w: usize) -> bool {
        let Some(p) = self.slots[slot].proc.as_ref() else {
            return false;
        };
        let lock = self.writes[w].lock;
        let local = self.local(slot);
        !self.partitioned(slot)
            && self.now >= self.etcd_down_until
            && !p.pending.values().any(|t| *t)
            && p.replica.admits(local)
            && p.replica
                .admits_until()
                .is_some_and(|u| u >= local + 4 * TTL_MS / 10)
            && p.replica
                .incarnation()
                .is_some_and(|id| self.etcd.regs.contains_key(id))
            && self.watches.iter().any(|x| {
                x.alive
                    && x.id == p.watch
                    && x.proc == p.generation
                    && x.slot == slot
                    && x.last_at <= self.now + 10
            })
            && p.replica.max(LOCKS[lock]) == self.etcd.fences[lock].map_or(0, |f| f.0)
    }

    fn late_after_partition(&mut self, slot: usize) -> u64 {
        let end = self.slots[slot].partitioned_until;
        end + self.rng.gen_range(0..=2 * self.lock_delay_ms.max(1_000)) - self.now
    }

    fn commit(&mut self, w: usize, at: u64) {
        if self.writes[w].commit_at != at || self.writes[w].state != WState::Sent {
            return;
        }
        let (slot, proc, lock, token) = {
            let x = &self.writes[w];
            (x.slot, x.proc, x.lock, x.token)
        };
        self.writes[w].state = WState::Committed;
        self.stats.commits += 1;
        self.tr(|| format!("store commits {}@{token} (from r{slot})", LOCKS[lock]));
        let (top, when, who) = self.top[lock].clone();
        if token < top {
            self.fail(format!(
                "the store committed a write of {}@{token} (sent by replica {slot}) after {top} was admitted (at {when} ms by {who})",
                LOCKS[lock]
            ));
        }
        let d = self.rng.gen_range(1..=5);
        self.after(
            d,
            Ev::StoreAnswer {
                slot,
                proc,
                write: w,
            },
        );
    }

    fn check_admitted(&mut self, slot: usize, lock: usize, token: u64) {
        let (top, when, who) = self.top[lock].clone();
        if token < top {
            self.fail(format!(
                "replica {slot} admitted {}@{token} after {top} was admitted (at {when} ms by {who})",
                LOCKS[lock]
            ));
        } else if token > top {
            self.stats.raises += 1;
            self.top[lock] = (token, self.now, format!("replica {slot}"));
        }
    }

    // -------------------------------------------------------------- faults

    fn fault(&mut self) {
        let slot = self.rng.gen_range(0..self.slots.len());
        let calm = !self.protected(slot) && self.slots[slot].proc.is_some();
        let roll = self.rng.gen_range(0..100);
        match roll {
            0..=34 if calm => {
                let len = if self.rng.gen_bool(0.7) {
                    self.rng.gen_range(5..300)
                } else {
                    self.rng.gen_range(300..3 * TTL_MS)
                };
                self.pause(slot, len);
            }
            35..=59 if calm || self.slots[slot].proc.is_none() => {
                let len = if self.rng.gen_bool(0.5) {
                    self.rng.gen_range(50..500)
                } else {
                    self.rng.gen_range(500..3 * TTL_MS + 500)
                };
                let until = self.now + len;
                let s = &mut self.slots[slot];
                s.partitioned_until = s.partitioned_until.max(until);
                self.tr(|| format!("r{slot} partitioned for {len} ms"));
                if self.cfg.late_while_partitioned {
                    // The assumption broken: what it had fully sent is
                    // decided only long after it is cut off.
                    for w in 0..self.writes.len() {
                        let x = &self.writes[w];
                        if x.slot == slot && x.state == WState::Sent {
                            let at = self.now + self.late_after_partition(slot);
                            self.writes[w].commit_at = at;
                            self.at(at, Ev::Commit { write: w, at });
                        }
                    }
                }
            }
            60..=69 if calm => {
                // kill -9: streaming bodies end with the process (never
                // committed); what it had fully sent the store still decides.
                self.tr(|| format!("r{slot} killed"));
                self.slots[slot].proc = None;
                let d = self.rng.gen_range(10..1_000);
                self.after(d, Ev::Restart { slot });
            }
            80..=84 => {
                // An operator deletes a member record or a registration by
                // hand under the prefix; its lease stays alive.
                let ids: Vec<String> = (0..self.slots.len())
                    .filter(|s| !self.protected(*s))
                    .filter_map(|s| self.slots[s].proc.as_ref())
                    .filter_map(|p| p.replica.incarnation().map(str::to_owned))
                    .collect();
                if !ids.is_empty() {
                    let id = ids[self.rng.gen_range(0..ids.len())].clone();
                    let which = self.rng.gen_range(0..3);
                    self.tr(|| {
                        let key = ["member record", "roster copy", "registration"][which];
                        format!("etcd: {key} of {id} deleted by hand")
                    });
                    let gone = match which {
                        0 => self.etcd.members.remove(&id).is_some(),
                        1 => self.etcd.roster.remove(&id).is_some(),
                        _ => {
                            self.etcd.reg_info.remove(&id);
                            self.etcd.regs.remove(&id).is_some()
                        }
                    };
                    if gone {
                        self.etcd.rev += 1;
                        self.stats.registry_edits += 1;
                    }
                }
            }
            70..=84 => {
                // etcd#15247: a lease revoked early.
                let spared: Vec<i64> = (0..self.slots.len())
                    .filter(|s| self.protected(*s))
                    .filter_map(|s| self.slots[s].proc.as_ref())
                    .filter_map(|p| p.replica.incarnation())
                    .filter_map(|id| self.etcd.regs.get(id).copied())
                    .collect();
                let leases: Vec<i64> = self
                    .etcd
                    .leases
                    .keys()
                    .copied()
                    .filter(|l| !spared.contains(l))
                    .collect();
                if !leases.is_empty() {
                    let l = leases[self.rng.gen_range(0..leases.len())];
                    self.tr(|| format!("etcd: lease {l} revoked early"));
                    self.etcd.expire(self.now);
                    self.etcd.drop_lease(l);
                }
            }
            85..=99 if (0..self.slots.len()).all(|s| !self.protected(s)) => {
                // A leader change: unavailable a moment; the new leader
                // gives every lease its full TTL again.
                let len = self.rng.gen_range(20..400);
                self.etcd_down_until = self.now + len;
                self.etcd.expire(self.now);
                let ttl = self.etcd.ttl_real((TTL_MS / 1_000) as i64);
                let until = self.etcd_down_until + ttl;
                for e in self.etcd.leases.values_mut() {
                    *e = (*e).max(until);
                }
                self.tr(|| format!("etcd: leader change, down {len} ms"));
            }
            _ => {}
        }
    }
}

// ------------------------------------------------------------ the tests --

/// One schedule's outcome.
#[derive(Debug)]
struct Run {
    violation: Option<String>,
    stats: Stats,
}

fn run(seed: u64, cfg: Config) -> Run {
    let mut sim = Sim::new(seed, cfg);
    sim.run();
    Run {
        violation: sim.violation,
        stats: sim.stats,
    }
}

fn one_seed() -> Option<u64> {
    std::env::var("FENCEGATE_SIM_SEED")
        .ok()
        .map(|s| s.parse().expect("FENCEGATE_SIM_SEED is a number"))
}

fn seeds() -> u64 {
    std::env::var("FENCEGATE_SIM_SEEDS")
        .ok()
        .map_or(2_000, |s| {
            s.parse().expect("FENCEGATE_SIM_SEEDS is a number")
        })
}

#[test]
fn the_protocol_holds_on_every_schedule() {
    let list: Vec<u64> = match one_seed() {
        Some(s) => vec![s],
        None => (0..seeds()).collect(),
    };
    let mut total = Stats::default();
    for &seed in &list {
        let r = run(seed, Config::of(Variant::Correct));
        if let Some(v) = r.violation {
            panic!(
                "seed {seed}: {v}\nreplay: FENCEGATE_SIM_SEED={seed} FENCEGATE_SIM_TRACE=1 cargo test -p fencegate-core --test replica_simulation the_protocol_holds"
            );
        }
        total.commits += r.stats.commits;
        total.raises += r.stats.raises;
        total.evictions += r.stats.evictions;
        total.late += r.stats.late;
        total.cut += r.stats.cut;
        total.registry_edits += r.stats.registry_edits;
    }
    eprintln!("{} schedules: {total:?}", list.len());
    // The schedules did something: writes landed, fences went up, members
    // were evicted, bodies were cut, stores were late.
    let n = list.len() as u64;
    if n >= 100 {
        assert!(
            total.commits > 40 * n
                && total.raises > 2 * n
                && total.evictions > n
                && total.late > n
                && total.cut > 2 * n
                && total.registry_edits > n / 2,
            "{total:?}"
        );
    }
}

/// The first seed on which `cfg` is caught (or panics if none in `limit`).
fn caught(cfg: Config, limit: u64) -> u64 {
    let list: Vec<u64> = match one_seed() {
        Some(s) => vec![s],
        None => (0..limit).collect(),
    };
    for &seed in &list {
        if let Some(v) = run(seed, cfg).violation {
            eprintln!("{cfg:?} caught on seed {seed}: {v}");
            return seed;
        }
    }
    panic!("the checker never caught {cfg:?} in {} seeds", list.len());
}

#[test]
fn the_checker_catches_a_raise_that_does_not_wait_for_acks() {
    caught(Config::of(Variant::NoAckWait), 1_500);
}

#[test]
fn the_checker_catches_an_ack_before_the_drain() {
    caught(Config::of(Variant::AckBeforeDrain), 1_500);
}

#[test]
fn the_checker_catches_admitting_before_the_load() {
    caught(Config::of(Variant::JoinThenLoad), 1_500);
}

#[test]
fn the_checker_catches_a_lost_raise_taken_as_not_applied() {
    caught(Config::of(Variant::LostAsNotApplied), 1_500);
}

#[test]
fn the_checker_catches_evicting_a_draining_member() {
    caught(Config::of(Variant::EvictDraining), 1_500);
}

#[test]
fn the_checker_catches_a_floor_not_kept() {
    caught(Config::of(Variant::IgnoreFloor), 1_500);
}

#[test]
fn the_checker_catches_no_lock_delay() {
    caught(Config::of(Variant::NoLockDelay), 1_500);
}

/// Issue 34's negative control: without the read-back at renewal (and
/// raisers that see only recorded members), a member record or
/// registration deleted by hand lets its member admit stale writes.
#[test]
fn the_checker_catches_a_renewal_blind_to_registry_edits() {
    caught(
        Config {
            blind_renewal: true,
            ..Config::of(Variant::Correct)
        },
        3_000,
    );
}

/// Negative control of the assumption: a store that decides a fully sent
/// write after `store_decision`, while its replica is cut off from etcd (so
/// raisers evict it or wait its registration out), lets a stale write land
/// after a higher token was admitted. Nothing else stands in the way.
#[test]
fn a_store_later_than_store_decision_breaks_it() {
    caught(
        Config {
            variant: Variant::Correct,
            late_while_healthy: false,
            late_while_partitioned: true,
            blind_renewal: false,
        },
        1_000,
    );
}
