//! Deterministic simulation of the fencing core.
//!
//! A seeded RNG drives clients that acquire, renew, write, pause past their
//! expiry and release; a lease service that crashes and restarts from its
//! durable state; and two stores receiving the clients' writes in arbitrary,
//! delayed order: one fenced by [`Fence`], one not. Time is a manual clock.
//!
//! Invariants checked on every step:
//! - a grant that issues a new token issues one higher than every token
//!   issued before, across crashes;
//! - a renewal (and a re-acquire by the live holder with its idempotency
//!   key) never changes the token;
//! - an acquire naming the live holder without its key gets nothing;
//! - the fenced store never accepts a token lower than one it accepted.
//!
//! And the negative test: over all schedules, the unfenced store does accept
//! a lower token after a higher one (it gets corrupted), which is what makes
//! the fenced store's invariant meaningful.
//!
//! A failing seed is printed; replay it with
//! `FENCEGATE_SIM_SEED=<seed> cargo test -p fencegate-core --test simulation`.
//! `FENCEGATE_SIM_SEEDS=<n>` sets how many schedules run (default 3000).

use fencegate_core::{Fence, KeyDigest, Lease, LockName, LockTable, Timestamp, Verdict};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::time::Duration;

const TTL: Duration = Duration::from_millis(1_000);
const STEPS: usize = 400;

#[derive(Debug, Clone, Copy)]
enum ClientState {
    Idle,
    /// Believes it holds `token` until `until` by its own reckoning.
    Holding {
        token: u64,
        until: Timestamp,
    },
}

/// A write on its way to the stores.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    deliver_at: Timestamp,
    token: u64,
}

/// The durable part of the lease service: what a restart reads back. Grants
/// are made durable before they are answered; renewals are written but not
/// fsync'd, so a crash may lose some of them (the lease then ends earlier
/// than its holder thinks, which fencing makes harmless).
#[derive(Debug, Clone, Default)]
struct Durable {
    counter: u64,
    leases: Vec<Lease>,
}

#[derive(Debug, Default)]
struct Outcome {
    unfenced_corrupted: bool,
    fenced_accepts: usize,
    fenced_rejects: usize,
    crashes: usize,
}

fn run(seed: u64) -> Result<Outcome, String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let lock = LockName::new("sim").expect("valid name");
    let n_clients = rng.gen_range(2..=5);
    let mut clients = vec![ClientState::Idle; n_clients];
    let mut service = LockTable::new();
    let mut durable = Durable::default();
    let mut now = Timestamp(0);
    let mut max_issued = 0u64;
    let mut in_flight: Vec<InFlight> = Vec::new();
    let mut fenced = Fence::default();
    let mut fenced_accepted: Vec<u64> = Vec::new();
    let mut unfenced_accepted: Vec<u64> = Vec::new();
    let mut out = Outcome::default();

    for step in 0..STEPS {
        now = now.saturating_add(Duration::from_millis(rng.gen_range(0..300)));
        let t = now.0;
        let ctx = |what: &str| format!("seed {seed} step {step} t={t}: {what}");
        let c = rng.gen_range(0..n_clients);
        match rng.gen_range(0..100) {
            0..=1 => {
                // An impostor names client c without c's key: whatever c
                // holds, the impostor must not get it.
                let owner = format!("client-{c}");
                if let Ok(grant) = service.acquire(&lock, &owner, None, TTL, now) {
                    if !grant.new_token {
                        return Err(ctx("an acquire without the holder's key got its lease"));
                    }
                    if grant.lease.token <= max_issued {
                        return Err(ctx("an impostor's grant reused a token"));
                    }
                    // The lock was free: the impostor now holds a lease of
                    // its own, under c's name; it lets it lapse.
                    max_issued = grant.lease.token;
                    durable.counter = service.counter();
                    durable.leases = current_leases(&service, &lock);
                }
            }
            2..=19 => {
                let owner = format!("client-{c}");
                let key = KeyDigest::of(owner.as_bytes());
                match service.acquire(&lock, &owner, Some(key), TTL, now) {
                    Ok(grant) => {
                        if grant.new_token {
                            if grant.lease.token <= max_issued {
                                return Err(ctx(&format!(
                                    "new token {} not above every issued token {max_issued}",
                                    grant.lease.token
                                )));
                            }
                            max_issued = grant.lease.token;
                            // Durable before the answer.
                            durable.counter = service.counter();
                        } else if let ClientState::Holding { token, .. } = clients[c]
                            && token != grant.lease.token
                        {
                            return Err(ctx("re-acquire by the live holder changed the token"));
                        }
                        durable.leases = current_leases(&service, &lock);
                        clients[c] = ClientState::Holding {
                            token: grant.lease.token,
                            until: grant.lease.expires_at,
                        };
                    }
                    Err(held) => {
                        if held.holder.owner == owner && held.holder.idempotency == Some(key) {
                            return Err(ctx("refused the live holder itself"));
                        }
                    }
                }
            }
            20..=34 => {
                if let ClientState::Holding { token, .. } = clients[c] {
                    match service.renew(&lock, token, TTL, now) {
                        Ok(lease) => {
                            if lease.token != token {
                                return Err(ctx("renewal changed the token"));
                            }
                            // Written without fsync: usually survives.
                            if rng.gen_bool(0.7) {
                                durable.leases = current_leases(&service, &lock);
                            }
                            clients[c] = ClientState::Holding {
                                token,
                                until: lease.expires_at,
                            };
                        }
                        Err(_) => clients[c] = ClientState::Idle,
                    }
                }
            }
            35..=69 => {
                // The client checked its lease, then may pause for a long
                // time (GC, VM stall) before the write reaches the stores.
                if let ClientState::Holding { token, until } = clients[c]
                    && now < until
                {
                    let pause = if rng.gen_bool(0.15) {
                        rng.gen_range(1_000..5_000)
                    } else {
                        rng.gen_range(0..50)
                    };
                    in_flight.push(InFlight {
                        deliver_at: now.saturating_add(Duration::from_millis(pause)),
                        token,
                    });
                }
            }
            70..=77 => {
                if let ClientState::Holding { token, .. } = clients[c] {
                    let _ = service.release(&lock, token, now);
                    durable.leases = current_leases(&service, &lock);
                    clients[c] = ClientState::Idle;
                }
            }
            78..=80 => {
                // The lease service crashes and restarts from durable state.
                out.crashes += 1;
                service = LockTable::restore(durable.counter, durable.leases.clone());
            }
            _ => {}
        }

        // Deliver every write that is due, in arbitrary order.
        let (mut due, rest): (Vec<_>, Vec<_>) =
            in_flight.drain(..).partition(|w| w.deliver_at <= now);
        in_flight = rest;
        due.shuffle(&mut rng);
        for w in due {
            unfenced_accepted.push(w.token);
            match fenced.admit(w.token) {
                Verdict::Admit { .. } => {
                    if fenced_accepted.last().is_some_and(|&last| w.token < last) {
                        return Err(ctx(&format!(
                            "fenced store accepted token {} after {:?}",
                            w.token,
                            fenced_accepted.last()
                        )));
                    }
                    fenced_accepted.push(w.token);
                    out.fenced_accepts += 1;
                }
                Verdict::Stale { max } => {
                    if max <= w.token {
                        return Err(ctx("stale verdict with a max not above the token"));
                    }
                    out.fenced_rejects += 1;
                }
            }
        }
    }
    out.unfenced_corrupted = unfenced_accepted.windows(2).any(|w| w[1] < w[0]);
    Ok(out)
}

fn current_leases(service: &LockTable, lock: &LockName) -> Vec<Lease> {
    service.recorded(lock).cloned().into_iter().collect()
}

#[test]
fn fencing_holds_over_random_schedules() {
    let seeds: Vec<u64> = match std::env::var("FENCEGATE_SIM_SEED") {
        Ok(s) => vec![s.parse().expect("FENCEGATE_SIM_SEED is a u64")],
        Err(_) => {
            let n = std::env::var("FENCEGATE_SIM_SEEDS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(3000u64);
            (0..n).collect()
        }
    };
    let mut corrupted = 0usize;
    let mut totals = Outcome::default();
    for &seed in &seeds {
        match run(seed) {
            Ok(o) => {
                corrupted += usize::from(o.unfenced_corrupted);
                totals.fenced_accepts += o.fenced_accepts;
                totals.fenced_rejects += o.fenced_rejects;
                totals.crashes += o.crashes;
            }
            Err(e) => panic!(
                "invariant violated: {e}\nreplay: FENCEGATE_SIM_SEED={seed} cargo test -p fencegate-core --test simulation"
            ),
        }
    }
    println!(
        "{} schedules: {} fenced accepts, {} stale rejects, {} crashes, unfenced store corrupted in {corrupted}",
        seeds.len(),
        totals.fenced_accepts,
        totals.fenced_rejects,
        totals.crashes
    );
    // The schedules must actually exercise the hazard.
    assert!(
        totals.fenced_rejects > 0,
        "no schedule produced a stale write"
    );
    assert!(totals.crashes > 0, "no schedule crashed the lease service");
    if seeds.len() > 100 {
        assert!(
            corrupted * 10 > seeds.len(),
            "the unfenced store was corrupted in only {corrupted} of {} schedules: the simulation no longer produces stale writes",
            seeds.len()
        );
    }
}

#[test]
fn a_known_seed_corrupts_the_unfenced_store_and_not_the_fenced_one() {
    // The negative test on one schedule: find the first seed where the
    // unfenced store went backwards, and check the fenced one did not.
    let seed = (0..1000u64)
        .find(|&s| run(s).map(|o| o.unfenced_corrupted).unwrap_or(false))
        .expect("some schedule corrupts an unfenced store");
    let o = run(seed).expect("fenced invariants hold");
    assert!(o.fenced_rejects > 0);
}
