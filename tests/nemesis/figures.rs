//! Availability as figures: per kind of fault, the share of operations
//! answered on its minority side (the nodes cut off, stopped or lossy)
//! and on the majority side, ours next to etcd's own; how long after a
//! heal writes are admitted again; how long a paused holder's successor
//! waits.

use crate::clients::{Attempt, Service};
use crate::cluster::{PROXIES, STORE};
use crate::faults::{Injected, KINDS, Kind};
use fencegate_testkit::history::{History, Violation};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

/// Answered out of asked.
#[derive(Debug, Clone, Copy, Default)]
struct Share {
    answered: usize,
    asked: usize,
}

impl Share {
    fn add(&mut self, answered: bool) {
        self.asked += 1;
        self.answered += usize::from(answered);
    }
}

impl std::fmt::Display for Share {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.asked == 0 {
            return write!(f, "–");
        }
        let pct = 100.0 * self.answered as f64 / self.asked as f64;
        write!(f, "{pct:.0} % of {}", self.asked)
    }
}

fn median_max(mut v: Vec<Duration>) -> String {
    if v.is_empty() {
        return "–".into();
    }
    v.sort();
    format!(
        "{:.2} s / {:.2} s",
        v[v.len() / 2].as_secs_f64(),
        v[v.len() - 1].as_secs_f64()
    )
}

/// For each proxy whose last probe write before the heal was not
/// admitted: how long after the heal its first one was (the probe writes
/// through each proxy every 0.1 s).
fn admitted_after(attempts: &[Attempt], healed: Duration) -> Vec<Duration> {
    let probes = || attempts.iter().filter(|a| a.service == Service::Probe);
    PROXIES
        .iter()
        .filter(|&&p| {
            probes()
                .filter(|a| a.via == p && a.at < healed)
                .max_by_key(|a| a.at)
                .is_some_and(|a| !a.admitted)
        })
        .filter_map(|&p| {
            probes()
                .filter(|a| a.via == p && a.at >= healed && a.admitted)
                .map(|a| a.at + a.took - healed)
                .min()
        })
        .collect()
}

/// How long each successor of a holder that did not release waited past
/// the end of that holder's lease (as the holder counted it).
pub fn successor_waits(history: &History) -> Vec<Duration> {
    let mut held = history.holdings();
    held.sort_by_key(|h| h.token);
    held.windows(2)
        .filter(|w| w[0].client != w[1].client && !w[0].released)
        .map(|w| w[1].from.saturating_sub(w[0].until))
        .collect()
}

/// The report, in Markdown.
pub fn report(
    seed: u64,
    ran: Duration,
    history: &History,
    attempts: &[Attempt],
    injected: &[Injected],
    violations: &[Violation],
    refusals: &BTreeMap<(u16, String), (usize, String)>,
) -> String {
    let mut out = String::new();
    let writes = &history.writes;
    let count = |f: &dyn Fn(Option<u16>) -> bool| writes.iter().filter(|w| f(w.status)).count();
    let _ = writeln!(
        out,
        "Seed {seed}, {:.1} minutes: {} lease calls, {} writes ({} admitted, {} refused as stale, {} 503, {} without an answer), \
         {} faults injected, {} violations ({} resting on a broken assumption).\n",
        ran.as_secs_f64() / 60.0,
        history.leases.len(),
        writes.len(),
        count(&|s| s == Some(200)),
        count(&|s| s == Some(409)),
        count(&|s| s == Some(503)),
        count(&|s| s.is_none()),
        injected.len(),
        violations.len(),
        violations.iter().filter(|v| v.rests_on.is_some()).count(),
    );
    let _ = writeln!(
        out,
        "| fault | times | writes answered, minority side | majority side | lease calls answered, minority side | majority side | etcd writes answered, minority side | majority side | a cut-off proxy admits again after the heal (median / max) |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
    // The store is one node: a fault on it is everyone's, shown apart.
    for (kind, store) in KINDS.iter().flat_map(|&k| [(k, false), (k, true)]) {
        let of_kind: Vec<&Injected> = injected
            .iter()
            .filter(|i| i.kind == kind && i.nodes.contains(&STORE) == store)
            .collect();
        if of_kind.is_empty() {
            continue;
        }
        // Probe writes, lease calls, etcd writes; minority, majority side.
        let mut shares = [[Share::default(); 2]; 3];
        let mut after = Vec::new();
        for i in &of_kind {
            for a in attempts
                .iter()
                .filter(|a| a.at >= i.fault.started && a.at < i.fault.healed)
            {
                let row = match a.service {
                    Service::Probe => 0,
                    Service::Lease => 1,
                    Service::Etcd => 2,
                    Service::Write => continue,
                };
                let side = usize::from(!i.nodes.contains(&a.via));
                shares[row][side].add(a.answered);
            }
            after.extend(admitted_after(attempts, i.fault.healed));
        }
        let _ = writeln!(
            out,
            "| {}{} | {} | {} | {} | {} | {} | {} | {} | {} |",
            describe(kind),
            if store {
                ", the store on the cut-off side"
            } else {
                ""
            },
            of_kind.len(),
            shares[0][0],
            shares[0][1],
            shares[1][0],
            shares[1][1],
            shares[2][0],
            shares[2][1],
            median_max(after)
        );
    }
    let _ = writeln!(out, "\nRefusals (status, S3 code, count, first message):");
    for ((status, code), (n, message)) in refusals {
        let _ = writeln!(out, "- {status} {code} ×{n}: {message}");
    }
    let _ = writeln!(
        out,
        "\nA paused holder's successor got the lease {} (median / max) after the paused holder's lease ended.",
        median_max(successor_waits(history))
    );
    if !violations.is_empty() {
        let _ = writeln!(out, "\nViolations:");
        for v in violations {
            let _ = writeln!(out, "- {v}");
        }
    }
    out
}

fn describe(kind: Kind) -> &'static str {
    match kind {
        Kind::Isolated => "one node isolated",
        Kind::Minority => "an etcd member and some nodes cut off (minority)",
        Kind::Bridge => "a bridge (one etcd member sees two sides that do not see each other)",
        Kind::Asymmetric => "a node's answers dropped (asymmetric)",
        Kind::Loss => "random loss of 10–50 % into a node",
        Kind::LinkDown => "a node's link down",
        Kind::ClientsCut => "a proxy or lease service cut from the clients",
        Kind::Paused => "a process stopped (SIGSTOP)",
        Kind::Killed => "a process killed (kill -9), then restarted",
    }
}

/// The history as one line per event, in the order asked: lease calls,
/// writes, faults (for reading a run, or a failure).
pub fn timeline(history: &History) -> String {
    let s = |d: Duration| d.as_secs_f64();
    let status = |s: Option<u16>| s.map_or("none".into(), |s| s.to_string());
    let mut lines: Vec<(Duration, String)> = Vec::new();
    for o in &history.leases {
        lines.push((
            o.invoked,
            format!(
                "{:9.3} +{:.3} c{} {:?} ttl {:?} token {:?} -> {}",
                s(o.invoked),
                s(o.answered - o.invoked),
                o.client,
                o.call,
                o.ttl,
                o.token,
                status(o.status)
            ),
        ));
    }
    for w in &history.writes {
        lines.push((
            w.sent,
            format!(
                "{:9.3} +{:.3} c{} PUT {} token {} -> {}",
                s(w.sent),
                s(w.answered - w.sent),
                w.client,
                w.key,
                w.token,
                status(w.status)
            ),
        ));
    }
    for f in &history.faults {
        lines.push((
            f.started,
            format!(
                "{:9.3} FAULT {} (healed at {:.3})",
                s(f.started),
                f.what,
                s(f.healed)
            ),
        ));
        lines.push((f.healed, format!("{:9.3} HEALED {}", s(f.healed), f.what)));
    }
    lines.sort_by_key(|(at, _)| *at);
    lines.into_iter().map(|(_, l)| l + "\n").collect()
}
