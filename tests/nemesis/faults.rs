//! The nemesis: faults through the kernel and on processes, drawn from a
//! seed that replays, applied alone or two at once, each for a bounded
//! time, then healed.

use crate::cluster::{Cluster, ETCD, LOCKSVC, NODES, PROXIES, STORE};
use fencegate_testkit::history::Fault;
use rand::rngs::StdRng;
use rand::seq::SliceRandom as _;
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

/// The kinds of fault, as the report names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// One node cut from every other, both ways.
    Isolated,
    /// One etcd member and some other nodes cut from the rest.
    Minority,
    /// Two sides that do not see each other, and one etcd member that
    /// sees both.
    Bridge,
    /// A node's packets out dropped: requests reach it, answers do not.
    Asymmetric,
    /// A share of the packets a node receives dropped at random.
    Loss,
    /// A node's link down.
    LinkDown,
    /// A proxy or a lease service cut from the clients (both ways), the
    /// rest of the system untouched: requests in flight stall half-open.
    ClientsCut,
    /// SIGSTOP, then SIGCONT.
    Paused,
    /// kill -9, then started again.
    Killed,
}

pub const KINDS: [Kind; 9] = [
    Kind::Isolated,
    Kind::Minority,
    Kind::Bridge,
    Kind::Asymmetric,
    Kind::Loss,
    Kind::LinkDown,
    Kind::ClientsCut,
    Kind::Paused,
    Kind::Killed,
];

/// The stated assumptions a fault can break (README, "The assumptions").
pub const PAUSE_MARGIN: &str = "a proxy replica is not paused inside the write that checked its standing for longer than the margin (0.89 s)";
pub const STORE_DECIDES: &str =
    "a store decides a request it was fully sent within store_decision_secs (10 s)";
/// `backend.store_decision_secs`, the default.
const STORE_DECISION: Duration = Duration::from_secs(10);
/// The margin of a replica's standing with the default registration.
const MARGIN: Duration = Duration::from_millis(890);

/// One fault injected: its kind, the nodes on its minority side (those
/// cut off, stopped or lossy), and the record for the checker.
#[derive(Debug, Clone)]
pub struct Injected {
    pub kind: Kind,
    pub nodes: Vec<usize>,
    pub fault: Fault,
}

/// The nemesis's state: its random source and the process faults to undo.
pub struct Nemesis {
    rng: StdRng,
    paused: Vec<usize>,
    killed: Vec<usize>,
}

fn node_name(i: usize) -> String {
    match i {
        _ if ETCD.contains(&i) => format!("etcd e{i}"),
        _ if PROXIES.contains(&i) => format!("proxy {i}"),
        STORE => "the store".into(),
        _ => format!("lease service {i}"),
    }
}

fn names(nodes: &[usize]) -> String {
    nodes
        .iter()
        .map(|&i| node_name(i))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Nemesis {
    pub fn new(seed: u64) -> Nemesis {
        Nemesis {
            rng: StdRng::seed_from_u64(seed),
            paused: Vec::new(),
            killed: Vec::new(),
        }
    }

    /// Draws the next round: how long to wait before it, the faults (one,
    /// or two at once about a quarter of the time) and how long they last.
    pub fn next_round(&mut self) -> (Duration, Vec<Kind>, Duration) {
        let quiet = Duration::from_millis(self.rng.gen_range(1000..3000));
        let mut kinds = vec![*KINDS.choose(&mut self.rng).expect("kinds")];
        if self.rng.gen_range(0..4) == 0 {
            kinds.push(*KINDS.choose(&mut self.rng).expect("kinds"));
        }
        let lasts = Duration::from_millis(self.rng.gen_range(2000..8000));
        (quiet, kinds, lasts)
    }

    /// Applies a fault of `kind` that will last `lasts`; `now` is the
    /// history's clock.
    pub fn inject(
        &mut self,
        cluster: &mut Cluster,
        kind: Kind,
        lasts: Duration,
        now: Duration,
    ) -> Injected {
        let lab = &cluster.lab;
        let node = self.rng.gen_range(0..NODES);
        let all: Vec<usize> = (0..NODES).collect();
        let (what, nodes, cut): (String, Vec<usize>, Vec<(usize, usize)>) = match kind {
            Kind::Isolated => {
                let cut = all
                    .iter()
                    .filter(|&&o| o != node)
                    .map(|&o| (node, o))
                    .collect();
                (format!("{} isolated", node_name(node)), vec![node], cut)
            }
            Kind::Minority => {
                let member = *ETCD.choose(&mut self.rng).expect("etcd");
                let mut minority = vec![member];
                minority.extend(
                    all.iter()
                        .filter(|&&o| !ETCD.contains(&o) && self.rng.gen_bool(0.4)),
                );
                let cut = minority
                    .iter()
                    .flat_map(|&m| {
                        all.iter()
                            .filter(|o| !minority.contains(o))
                            .map(move |&o| (m, o))
                    })
                    .collect();
                (
                    format!("minority {{{}}} cut from the rest", names(&minority)),
                    minority,
                    cut,
                )
            }
            Kind::Bridge => {
                let mut members = ETCD.to_vec();
                members.shuffle(&mut self.rng);
                let (bridge, a0, b0) = (members[0], members[1], members[2]);
                let (mut a, mut b) = (vec![a0], vec![b0]);
                for o in all.iter().filter(|o| !ETCD.contains(o)) {
                    match self.rng.gen_range(0..3) {
                        0 => a.push(*o),
                        1 => b.push(*o),
                        _ => {}
                    }
                }
                let cut = a
                    .iter()
                    .flat_map(|&x| b.iter().map(move |&y| (x, y)))
                    .collect();
                let what = format!(
                    "bridge: {} sees {{{}}} and {{{}}}, which do not see each other",
                    node_name(bridge),
                    names(&a),
                    names(&b)
                );
                (what, b.clone(), cut)
            }
            Kind::Asymmetric => {
                for o in all.iter().filter(|&&o| o != node) {
                    lab.block(node, *o);
                }
                (
                    format!("{}'s packets out dropped (answers lost)", node_name(node)),
                    vec![node],
                    Vec::new(),
                )
            }
            Kind::Loss => {
                let percent = self.rng.gen_range(10..50);
                lab.lose(node, percent);
                (
                    format!("{percent} % of {}'s packets in lost", node_name(node)),
                    vec![node],
                    Vec::new(),
                )
            }
            Kind::LinkDown => {
                lab.set_link(node, false);
                (
                    format!("{}'s link down", node_name(node)),
                    vec![node],
                    Vec::new(),
                )
            }
            Kind::ClientsCut => {
                let node = *[LOCKSVC.as_slice(), PROXIES.as_slice()]
                    .concat()
                    .choose(&mut self.rng)
                    .expect("nodes");
                lab.cut_client(node);
                (
                    format!("{} cut from the clients", node_name(node)),
                    vec![node],
                    Vec::new(),
                )
            }
            Kind::Paused => {
                cluster.proc(node).pause();
                self.paused.push(node);
                (
                    format!("{} stopped (SIGSTOP)", node_name(node)),
                    vec![node],
                    Vec::new(),
                )
            }
            Kind::Killed => {
                cluster.proc(node).kill9();
                self.killed.push(node);
                (
                    format!("{} killed (kill -9)", node_name(node)),
                    vec![node],
                    Vec::new(),
                )
            }
        };
        for &(x, y) in &cut {
            cluster.lab.partition(x, y);
        }
        let proxy_stopped = kind == Kind::Paused && PROXIES.contains(&node);
        let store_late = nodes.contains(&STORE)
            || cut.iter().any(|&(x, y)| x == STORE || y == STORE)
            || (kind == Kind::Asymmetric && PROXIES.contains(&node));
        let breaks = if proxy_stopped && lasts > MARGIN {
            Some(PAUSE_MARGIN)
        } else if store_late && kind != Kind::Killed && lasts > STORE_DECISION {
            Some(STORE_DECIDES)
        } else {
            None
        };
        Injected {
            kind,
            nodes,
            fault: Fault {
                what,
                started: now,
                healed: now,
                breaks,
            },
        }
    }

    /// Undoes every fault: rules and links, stopped processes continued,
    /// killed ones started again (each waits until it listens).
    pub fn heal(&mut self, cluster: &mut Cluster) {
        cluster.lab.heal();
        for node in self.paused.drain(..) {
            cluster.proc(node).resume();
        }
        // What others need at their start first: etcd, then the store
        // (a proxy probes it), then the lease services and proxies.
        self.killed.sort_by_key(|&n| match n {
            STORE => 3,
            _ if ETCD.contains(&n) => 0,
            _ => n + 10,
        });
        self.killed.dedup();
        for node in self.killed.drain(..) {
            cluster.proc(node).start();
        }
    }
}

/// Runs rounds of faults until `until`, then heals; returns every fault
/// injected. Fails if a process died by itself (a crash is a finding).
pub fn run(
    cluster: &mut Cluster,
    seed: u64,
    clock: impl Fn() -> Duration,
    until: Instant,
) -> Vec<Injected> {
    let mut nemesis = Nemesis::new(seed);
    let mut injected = Vec::new();
    loop {
        let (quiet, kinds, lasts) = nemesis.next_round();
        if Instant::now() + quiet + lasts >= until {
            break;
        }
        std::thread::sleep(quiet);
        let mut round: Vec<Injected> = kinds
            .iter()
            .map(|&k| nemesis.inject(cluster, k, lasts, clock()))
            .collect();
        for i in &round {
            eprintln!("nemesis {:?}: {} for {lasts:?}", clock(), i.fault.what);
        }
        std::thread::sleep(lasts);
        nemesis.heal(cluster);
        let healed = clock();
        for i in &mut round {
            i.fault.healed = healed;
        }
        injected.extend(round);
        for p in &mut cluster.procs {
            if let Some(status) = p.exited() {
                panic!("{} exited by itself ({status}):\n{}", p.name, p.log());
            }
        }
    }
    injected
}
