//! The checker over a whole recorded history (issue 37's nemesis): every
//! lease call and every write with their answers and times, what the store
//! holds at the end, and the faults injected. Pure: the nemesis records,
//! this judges, and its own tests show each property can fail.
//!
//! The four properties:
//! 1. [`Property::TokensIncrease`]: a grant answered before another was
//!    asked for has the lower token, and no two grants share one;
//! 2. [`Property::NoStaleCommit`]: no write below a token already admitted
//!    (answered 200) when it was sent is admitted or found in the store;
//! 3. [`Property::NoLostWrite`]: every write answered 200 is in the store
//!    (or was overwritten by one at least as new), and nothing refused, or
//!    answered "nothing was written", is;
//! 4. [`Property::OneHolder`]: no two clients were told they hold one lock
//!    at overlapping times, beyond the clock-drift bound.
//!
//! A violation inside a fault that breaks a stated assumption (a replica
//! paused past its margin, a store that decides late) names it: the
//! guarantee does not cover it, and the report says so rather than hiding
//! it.

use std::collections::HashMap;
use std::time::Duration;

/// What a lease call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseCall {
    Acquire,
    Renew,
    Release,
}

/// One lease call: times are since the history's start, `ttl` what the
/// call asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseOp {
    pub client: usize,
    pub lock: String,
    pub call: LeaseCall,
    pub ttl: Duration,
    pub invoked: Duration,
    pub answered: Duration,
    /// The lease's token (the one granted, or the one renewed or released).
    pub token: Option<u64>,
    /// The HTTP status; None when no answer came (timeout, cut).
    pub status: Option<u16>,
}

/// One write through a proxy. Every write's payload is unique.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub client: usize,
    pub lock: String,
    pub key: String,
    pub token: u64,
    pub payload: String,
    pub sent: Duration,
    pub answered: Duration,
    pub status: Option<u16>,
    /// The answer said that nothing was written (a 4xx, or a 5xx whose
    /// message promises it): then nothing may be.
    pub nothing_written: bool,
}

/// An object as the store holds it at the end, read directly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub key: String,
    pub payload: String,
}

/// A fault the nemesis injected, and the stated assumption it breaks, if
/// any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub what: String,
    pub started: Duration,
    pub healed: Duration,
    pub breaks: Option<&'static str>,
}

/// Everything recorded.
#[derive(Debug, Clone, Default)]
pub struct History {
    pub leases: Vec<LeaseOp>,
    pub writes: Vec<Write>,
    pub store: Vec<Stored>,
    pub faults: Vec<Fault>,
    /// The clock-drift bound the lease promise allows (a share of the TTL).
    pub drift: f64,
}

/// A grant as its client believed it: held from `from` until `until`
/// (ended by a release if `released`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holding<'a> {
    pub client: usize,
    pub lock: &'a str,
    pub token: u64,
    pub from: Duration,
    pub until: Duration,
    pub released: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Property {
    TokensIncrease,
    NoStaleCommit,
    NoLostWrite,
    OneHolder,
}

/// A property broken, between `from` and `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub property: Property,
    pub detail: String,
    pub from: Duration,
    pub to: Duration,
    /// The assumption a fault broke while this happened: the guarantee
    /// does not cover it.
    pub rests_on: Option<String>,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} at {:?}..{:?}: {}",
            self.property, self.from, self.to, self.detail
        )?;
        match &self.rests_on {
            Some(a) => write!(f, " (rests on a broken assumption: {a})"),
            None => Ok(()),
        }
    }
}

fn refused(status: Option<u16>) -> bool {
    matches!(status, Some(400..=499))
}

impl History {
    /// Every violation of the four properties, each with the assumption it
    /// rests on if a fault broke one meanwhile.
    pub fn check(&self) -> Vec<Violation> {
        let mut found = Vec::new();
        self.tokens_increase(&mut found);
        self.no_stale_commit(&mut found);
        self.no_lost_write(&mut found);
        self.one_holder(&mut found);
        for v in &mut found {
            v.rests_on = self
                .faults
                .iter()
                .filter(|f| f.started <= v.to && v.from <= f.healed)
                .find_map(|f| f.breaks.map(|a| format!("{a} ({})", f.what)));
        }
        found
    }

    fn grants(&self) -> impl Iterator<Item = (&LeaseOp, u64)> {
        self.leases
            .iter()
            .filter(|o| o.call == LeaseCall::Acquire && o.status == Some(200))
            .filter_map(|o| o.token.map(|t| (o, t)))
    }

    fn tokens_increase(&self, found: &mut Vec<Violation>) {
        let grants: Vec<(&LeaseOp, u64)> = self.grants().collect();
        let granted = Highest::of(
            grants
                .iter()
                .map(|&(g, t)| (g.lock.as_str(), g.answered, t, g)),
        );
        let mut owners: HashMap<(&str, u64), &LeaseOp> = HashMap::new();
        for &(g, token) in &grants {
            if let Some(other) = owners.insert((&g.lock, token), g) {
                found.push(Violation {
                    property: Property::TokensIncrease,
                    detail: format!("token {token} granted twice: {other:?} and {g:?}"),
                    from: other.invoked.min(g.invoked),
                    to: other.answered.max(g.answered),
                    rests_on: None,
                });
            }
            if let Some(before) = granted.before(&g.lock, g.invoked)
                && before.token >= Some(token)
            {
                found.push(Violation {
                    property: Property::TokensIncrease,
                    detail: format!("{g:?} got a token not above {before:?}'s, granted before it"),
                    from: before.invoked,
                    to: g.answered,
                    rests_on: None,
                });
            }
        }
    }

    fn no_stale_commit(&self, found: &mut Vec<Violation>) {
        let stored: HashMap<&str, &str> = self
            .store
            .iter()
            .map(|s| (s.payload.as_str(), s.key.as_str()))
            .collect();
        let admitted = Highest::of(
            self.writes
                .iter()
                .filter(|w| w.status == Some(200))
                .map(|w| (w.lock.as_str(), w.answered, w.token, w)),
        );
        for w in &self.writes {
            let committed = if w.status == Some(200) {
                "admitted"
            } else if stored.get(w.payload.as_str()) == Some(&w.key.as_str()) {
                "found in the store"
            } else {
                continue;
            };
            if let Some(newer) = admitted.before(&w.lock, w.sent)
                && newer.token > w.token
            {
                found.push(Violation {
                    property: Property::NoStaleCommit,
                    detail: format!(
                        "{w:?} was {committed} although token {} was admitted before it was sent ({newer:?})",
                        newer.token
                    ),
                    from: newer.answered,
                    to: w.answered,
                    rests_on: None,
                });
            }
        }
    }

    fn no_lost_write(&self, found: &mut Vec<Violation>) {
        let by_payload: HashMap<&str, &Write> = self
            .writes
            .iter()
            .map(|w| (w.payload.as_str(), w))
            .collect();
        let stored: HashMap<&str, &Stored> =
            self.store.iter().map(|s| (s.key.as_str(), s)).collect();
        let mut per_key: HashMap<&str, Vec<&Write>> = HashMap::new();
        for w in &self.writes {
            per_key.entry(&w.key).or_default().push(w);
        }
        let mut keys: Vec<&str> = per_key.keys().copied().collect();
        keys.sort_unstable();
        for key in keys {
            let acked = per_key[key]
                .iter()
                .filter(|w| w.status == Some(200))
                .max_by_key(|w| (w.token, w.answered));
            let holds = stored.get(key).map(|s| by_payload.get(s.payload.as_str()));
            let (from, to) =
                acked.map_or((Duration::ZERO, Duration::MAX), |w| (w.sent, w.answered));
            let detail = match (acked, holds) {
                (Some(w), None) => Some(format!(
                    "{w:?} was answered 200, but the store has no {key}"
                )),
                (_, Some(None)) => {
                    Some(format!("the store holds a payload no write sent at {key}"))
                }
                (_, Some(Some(s))) if refused(s.status) || s.nothing_written => Some(format!(
                    "{s:?} was answered that nothing was written, yet the store holds it"
                )),
                (Some(w), Some(Some(s))) if s.token < w.token => Some(format!(
                    "{w:?} was answered 200, but the store holds an older token's write {s:?}"
                )),
                _ => None,
            };
            if let Some(detail) = detail {
                found.push(Violation {
                    property: Property::NoLostWrite,
                    detail,
                    from,
                    to,
                    rests_on: None,
                });
            }
        }
    }

    /// Each grant as the client believed it: from its answer until its ask
    /// plus the TTL, pushed on by each renewal answered 200 (from that
    /// renewal's ask), cut at the release's ask.
    pub fn holdings(&self) -> Vec<Holding<'_>> {
        let mut held = Vec::new();
        for (g, token) in self.grants() {
            let mut until = g.invoked + g.ttl;
            let mut released = false;
            for o in self.leases.iter().filter(|o| {
                o.client == g.client
                    && o.lock == g.lock
                    && o.token == Some(token)
                    && o.invoked > g.invoked
            }) {
                match o.call {
                    LeaseCall::Renew if o.status == Some(200) => {
                        until = until.max(o.invoked + o.ttl)
                    }
                    LeaseCall::Release => {
                        until = until.min(o.invoked);
                        released = true;
                    }
                    _ => {}
                }
            }
            held.push(Holding {
                client: g.client,
                lock: &g.lock,
                token,
                from: g.answered,
                until,
                released,
            });
        }
        held
    }

    fn one_holder(&self, found: &mut Vec<Violation>) {
        let held = self.holdings();
        for (i, a) in held.iter().enumerate() {
            for b in &held[i + 1..] {
                if a.client == b.client || a.lock != b.lock {
                    continue;
                }
                let (start, end) = (a.from.max(b.from), a.until.min(b.until));
                let longest = a
                    .until
                    .saturating_sub(a.from)
                    .max(b.until.saturating_sub(b.from));
                if end > start && end - start > longest.mul_f64(self.drift) {
                    found.push(Violation {
                        property: Property::OneHolder,
                        detail: format!(
                            "client {} (token {}) and client {} (token {}) both held {} for {:?}",
                            a.client,
                            a.token,
                            b.client,
                            b.token,
                            a.lock,
                            end - start
                        ),
                        from: start,
                        to: end,
                        rests_on: None,
                    });
                }
            }
        }
    }
}

/// Per lock, the record with the highest token among those answered
/// before a time: sorted by answer, with a running maximum.
struct Highest<'a, T> {
    per_lock: HashMap<&'a str, Vec<(Duration, &'a T)>>,
}

impl<'a, T> Highest<'a, T> {
    fn of(records: impl Iterator<Item = (&'a str, Duration, u64, &'a T)>) -> Highest<'a, T> {
        let mut sorted: HashMap<&str, Vec<(Duration, u64, &T)>> = HashMap::new();
        for (lock, at, token, r) in records {
            sorted.entry(lock).or_default().push((at, token, r));
        }
        let per_lock = sorted
            .into_iter()
            .map(|(lock, mut v)| {
                v.sort_by_key(|&(at, _, _)| at);
                let mut best: Option<(u64, &T)> = None;
                let running = v
                    .into_iter()
                    .map(|(at, token, r)| {
                        if best.is_none_or(|(t, _)| token > t) {
                            best = Some((token, r));
                        }
                        (at, best.map_or(r, |(_, r)| r))
                    })
                    .collect();
                (lock, running)
            })
            .collect();
        Highest { per_lock }
    }

    /// The highest-token record on `lock` answered strictly before `at`.
    fn before(&self, lock: &str, at: Duration) -> Option<&'a T> {
        let v = self.per_lock.get(lock)?;
        let n = v.partition_point(|&(t, _)| t < at);
        n.checked_sub(1).map(|i| v[i].1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn grant(client: usize, token: u64, invoked: u64, answered: u64) -> LeaseOp {
        LeaseOp {
            client,
            lock: "l".into(),
            call: LeaseCall::Acquire,
            ttl: ms(1000),
            invoked: ms(invoked),
            answered: ms(answered),
            token: Some(token),
            status: Some(200),
        }
    }

    fn write(key: &str, token: u64, sent: u64, status: Option<u16>) -> Write {
        Write {
            client: 0,
            lock: "l".into(),
            key: key.into(),
            token,
            payload: format!("{key}@{token}@{sent}"),
            sent: ms(sent),
            answered: ms(sent + 5),
            status,
            nothing_written: matches!(status, Some(400..=499)),
        }
    }

    fn stored(w: &Write) -> Stored {
        Stored {
            key: w.key.clone(),
            payload: w.payload.clone(),
        }
    }

    fn properties(h: &History) -> Vec<Property> {
        h.check().iter().map(|v| v.property).collect()
    }

    #[test]
    fn a_clean_history_passes() {
        let w1 = write("a", 1, 10, Some(200));
        let w2 = write("a", 2, 1200, Some(200));
        let stale = write("b", 1, 1300, Some(409));
        let h = History {
            leases: vec![grant(0, 1, 0, 5), grant(1, 2, 1100, 1110)],
            store: vec![stored(&w2)],
            writes: vec![w1, w2, stale],
            ..History::default()
        };
        assert_eq!(h.check(), vec![]);
    }

    #[test]
    fn a_token_that_goes_back_or_repeats_is_caught() {
        let back = History {
            leases: vec![grant(0, 5, 0, 5), grant(1, 4, 1100, 1110)],
            ..History::default()
        };
        assert_eq!(properties(&back), vec![Property::TokensIncrease]);
        let twice = History {
            leases: vec![grant(0, 5, 0, 5), grant(1, 5, 1100, 1110)],
            ..History::default()
        };
        assert!(properties(&twice).contains(&Property::TokensIncrease));
    }

    #[test]
    fn a_stale_write_admitted_or_stored_is_caught() {
        let new = write("a", 2, 0, Some(200));
        let admitted = write("b", 1, 100, Some(200));
        let h = History {
            store: vec![stored(&new), stored(&admitted)],
            writes: vec![new.clone(), admitted],
            ..History::default()
        };
        assert_eq!(properties(&h), vec![Property::NoStaleCommit]);
        // No answer, but it landed.
        let landed = write("c", 1, 100, None);
        let h = History {
            store: vec![stored(&new), stored(&landed)],
            writes: vec![new, landed],
            ..History::default()
        };
        assert_eq!(properties(&h), vec![Property::NoStaleCommit]);
    }

    #[test]
    fn a_lost_or_refused_write_in_the_store_is_caught() {
        let acked = write("a", 2, 0, Some(200));
        let lost = History {
            writes: vec![acked.clone()],
            ..History::default()
        };
        assert_eq!(properties(&lost), vec![Property::NoLostWrite]);
        let older = write("a", 1, 100, None);
        let overwritten = History {
            store: vec![stored(&older)],
            writes: vec![acked, older],
            ..History::default()
        };
        assert!(properties(&overwritten).contains(&Property::NoLostWrite));
        let refused = write("r", 3, 0, Some(409));
        let h = History {
            store: vec![stored(&refused)],
            writes: vec![refused],
            ..History::default()
        };
        assert_eq!(properties(&h), vec![Property::NoLostWrite]);
        // A 503 may have written (its outcome is unknown), unless it said
        // it did not.
        let mut unknown = write("u", 3, 0, Some(503));
        let h = History {
            store: vec![stored(&unknown)],
            writes: vec![unknown.clone()],
            ..History::default()
        };
        assert_eq!(properties(&h), vec![]);
        unknown.nothing_written = true;
        let h = History {
            store: vec![stored(&unknown)],
            writes: vec![unknown],
            ..History::default()
        };
        assert_eq!(properties(&h), vec![Property::NoLostWrite]);
    }

    #[test]
    fn two_holders_at_once_are_caught_beyond_the_drift_only() {
        // Client 0 believes it holds until 1000 ms; client 1 is granted at
        // 905 ms (answered): 95 ms of overlap.
        let mut h = History {
            leases: vec![grant(0, 1, 0, 5), grant(1, 2, 900, 905)],
            drift: 0.01,
            ..History::default()
        };
        assert_eq!(properties(&h), vec![Property::OneHolder]);
        h.drift = 0.1;
        assert_eq!(properties(&h), vec![]);
        // A renewal answered 200 extends the belief; a release cuts it.
        let mut renew = grant(0, 1, 500, 505);
        renew.call = LeaseCall::Renew;
        let mut release = grant(0, 1, 1200, 1205);
        release.call = LeaseCall::Release;
        let h = History {
            leases: vec![grant(0, 1, 0, 5), renew, release, grant(1, 2, 1300, 1305)],
            drift: 0.01,
            ..History::default()
        };
        assert_eq!(properties(&h), vec![]);
    }

    #[test]
    fn a_violation_during_a_fault_that_breaks_an_assumption_names_it() {
        let new = write("a", 2, 0, Some(200));
        let admitted = write("b", 1, 100, Some(200));
        let h = History {
            store: vec![stored(&new), stored(&admitted)],
            writes: vec![new, admitted],
            faults: vec![
                Fault {
                    what: "a partition".into(),
                    started: ms(0),
                    healed: ms(500),
                    breaks: None,
                },
                Fault {
                    what: "SIGSTOP proxy 1 for 3 s".into(),
                    started: ms(50),
                    healed: ms(3050),
                    breaks: Some("a replica is not paused past its margin"),
                },
            ],
            ..History::default()
        };
        let v = h.check();
        assert_eq!(v.len(), 1);
        assert_eq!(
            v[0].rests_on.as_deref(),
            Some("a replica is not paused past its margin (SIGSTOP proxy 1 for 3 s)")
        );
    }
}
