//! The waiting line of each lock: acquires that asked to wait for a held
//! lock, served in arrival order, each until its own deadline.
//!
//! The rules, for a lock `L` at time `now`:
//! - a waiter joins the back of `L`'s line, unless the line already holds
//!   `max_per_lock` waiters, or its [`Party`] already holds its
//!   [`share`] of them ([`admit`], the rule both backends apply);
//! - when `L` is free, its first waiter still waiting is granted it (by the
//!   [`LockTable`], so with a new token); the others keep waiting behind the
//!   new holder;
//! - a waiter whose deadline passed while `L` was held is answered with the
//!   holder;
//! - a waiter whose client went away (the caller says which, see
//!   [`Lines::serve`]) leaves the line without an answer.
//!
//! Serving a line before any acquire of the same lock is decided is what
//! makes the line fair: a lock with waiters is never free when a newcomer
//! is decided (its first waiter holds it), so nobody jumps the line.
//!
//! The line carries each waiter's reply handle (`R`) without looking at it:
//! the engine owns the I/O, this module only the order and the deadlines.

use crate::lease::{Grant, KeyDigest, Lease, LockTable};
use crate::name::LockName;
use crate::time::Timestamp;
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

/// Who a waiter is, for the share of a line one caller may hold. Opaque
/// here: the service derives it from the caller's API key, or, without
/// keys, from the client's address (an owner name proves nothing: anyone
/// can send any).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Party(String);

impl Party {
    pub fn new(id: impl Into<String>) -> Party {
        Party(id.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Most places in one lock's line that one [`Party`] may hold: a quarter
/// of the line, rounded up, and at least one. A caller that is not the
/// holder can then fill at most a quarter of the line; it takes four
/// parties to shut the rightful next holder out.
pub fn share(max_per_lock: usize) -> usize {
    max_per_lock.div_ceil(4).max(1)
}

/// Why a waiter may not join a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineFull {
    /// The line holds `max` waiters.
    Line { max: usize },
    /// The waiter's party already holds `share` places in it.
    Share { share: usize },
}

/// Whether a waiter may join a line in which `ahead` waiters are before
/// it, `ahead_of_party` of them its own party's. Both backends decide
/// with this, so the bounds mean the same on SQLite and on etcd: with
/// `max_per_lock = 2`, two waiters wait and a third is refused.
pub fn admit(ahead: usize, ahead_of_party: usize, max_per_lock: usize) -> Result<(), LineFull> {
    if ahead >= max_per_lock {
        return Err(LineFull::Line { max: max_per_lock });
    }
    let share = share(max_per_lock);
    if ahead_of_party >= share {
        return Err(LineFull::Share { share });
    }
    Ok(())
}

/// An acquire waiting in line.
#[derive(Debug)]
pub struct Waiter<R> {
    pub owner: String,
    /// Who asked, for its [`share`] of the line.
    pub party: Party,
    pub key: Option<KeyDigest>,
    pub ttl: Duration,
    /// Answered with the holder when this passes with the lock still held.
    pub deadline: Timestamp,
    /// How the waiter is answered (opaque here).
    pub reply: R,
}

/// What serving a line decided for one waiter.
#[derive(Debug)]
pub enum Served<R> {
    /// Granted the lock.
    Granted(R, Grant),
    /// Its deadline passed with the lock held by `holder`.
    TimedOut { reply: R, holder: Lease },
}

/// The lines of every lock that has waiters.
#[derive(Debug)]
pub struct Lines<R> {
    lines: HashMap<LockName, VecDeque<Waiter<R>>>,
    max_per_lock: usize,
    waiting: usize,
}

impl<R> Lines<R> {
    /// No waiters; at most `max_per_lock` per lock.
    pub fn new(max_per_lock: usize) -> Lines<R> {
        Lines {
            lines: HashMap::new(),
            max_per_lock,
            waiting: 0,
        }
    }

    /// Waiters in `lock`'s line.
    pub fn len(&self, lock: &LockName) -> usize {
        self.lines.get(lock).map_or(0, VecDeque::len)
    }

    /// Waiters in every line.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// Puts `waiter` at the back of `lock`'s line; gives it back if the
    /// line is full or its party holds its share of it ([`admit`]).
    pub fn join(&mut self, lock: LockName, waiter: Waiter<R>) -> Result<(), (LineFull, Waiter<R>)> {
        let line = self.lines.entry(lock.clone()).or_default();
        let of_party = line.iter().filter(|w| w.party == waiter.party).count();
        if let Err(full) = admit(line.len(), of_party, self.max_per_lock) {
            if line.is_empty() {
                self.lines.remove(&lock);
            }
            return Err((full, waiter));
        }
        line.push_back(waiter);
        self.waiting += 1;
        Ok(())
    }

    /// The locks that have a line.
    pub fn locks(&self) -> Vec<LockName> {
        self.lines.keys().cloned().collect()
    }

    /// Serves `lock`'s line at `now`: grants the lock (through `table`) to
    /// the first waiter if it is free, answers the waiters whose deadline
    /// passed, and drops those `gone` says left. Returns the decisions in
    /// line order.
    pub fn serve(
        &mut self,
        lock: &LockName,
        table: &mut LockTable,
        now: Timestamp,
        gone: impl Fn(&R) -> bool,
    ) -> Vec<Served<R>> {
        let Some(mut line) = self.lines.remove(lock) else {
            return Vec::new();
        };
        let before = line.len();
        let mut served = Vec::new();
        let mut kept = VecDeque::with_capacity(line.len());
        while let Some(w) = line.pop_front() {
            if gone(&w.reply) {
                continue;
            }
            match table.live(lock, now) {
                None => match table.acquire(lock, &w.owner, w.key, w.ttl, now) {
                    Ok(grant) => served.push(Served::Granted(w.reply, grant)),
                    // The lock is free, so acquire cannot refuse; were it to,
                    // the waiter is answered with the holder it names.
                    Err(held) => served.push(Served::TimedOut {
                        reply: w.reply,
                        holder: held.holder,
                    }),
                },
                Some(holder) if now >= w.deadline => {
                    served.push(Served::TimedOut {
                        reply: w.reply,
                        holder,
                    });
                }
                Some(_) => kept.push_back(w),
            }
        }
        self.waiting = self.waiting - before + kept.len();
        if !kept.is_empty() {
            self.lines.insert(lock.clone(), kept);
        }
        served
    }

    /// When serving must happen even if no request arrives: the expiry of
    /// a lease somebody waits for, or a waiter's deadline.
    pub fn next_wake(&self, table: &LockTable, now: Timestamp) -> Option<Timestamp> {
        self.lines
            .iter()
            .flat_map(|(lock, line)| {
                let expiry = table.live(lock, now).map(|l| l.expires_at);
                let deadline = line.iter().map(|w| w.deadline).min();
                expiry.into_iter().chain(deadline)
            })
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Timestamp = Timestamp(1_000_000);

    fn lock() -> LockName {
        LockName::new("l").expect("name")
    }

    fn waiter(owner: &str, wait_ms: u64) -> Waiter<&'static str> {
        Waiter {
            owner: owner.to_owned(),
            // Each owner its own party, unless a test says otherwise.
            party: Party::new(owner),
            key: None,
            ttl: Duration::from_millis(1000),
            deadline: T0.saturating_add(Duration::from_millis(wait_ms)),
            reply: "reply",
        }
    }

    fn owners(served: &[Served<&str>]) -> Vec<String> {
        served
            .iter()
            .map(|s| match s {
                Served::Granted(_, g) => format!("granted {}", g.lease.owner),
                Served::TimedOut { holder, .. } => format!("timed out behind {}", holder.owner),
            })
            .collect()
    }

    #[test]
    fn a_freed_lock_goes_to_the_first_in_line_and_the_rest_wait_behind_it() {
        let mut table = LockTable::new();
        let a = table
            .acquire(&lock(), "A", None, Duration::from_millis(100), T0)
            .expect("free");
        let mut lines = Lines::new(8);
        for w in ["W1", "W2", "W3"] {
            lines.join(lock(), waiter(w, 60_000)).expect("room");
        }
        assert!(lines.serve(&lock(), &mut table, T0, |_| false).is_empty());
        let later = T0.saturating_add(Duration::from_millis(100));
        assert_eq!(
            lines.next_wake(&table, T0),
            Some(later),
            "A's expiry is when to serve again"
        );
        let served = lines.serve(&lock(), &mut table, later, |_| false);
        assert_eq!(owners(&served), ["granted W1"]);
        match &served[0] {
            Served::Granted(_, g) => assert!(g.lease.token > a.lease.token),
            other => panic!("{other:?}"),
        }
        assert_eq!((lines.len(&lock()), lines.waiting()), (2, 2));
    }

    #[test]
    fn deadlines_and_departures_are_answered_in_line_order() {
        let mut table = LockTable::new();
        table
            .acquire(&lock(), "A", None, Duration::from_secs(60), T0)
            .expect("free");
        let mut lines = Lines::new(8);
        lines.join(lock(), waiter("short", 10)).expect("room");
        lines
            .join(
                lock(),
                Waiter {
                    reply: "gone",
                    ..waiter("left", 10)
                },
            )
            .expect("room");
        lines.join(lock(), waiter("long", 60_000)).expect("room");
        let t = T0.saturating_add(Duration::from_millis(10));
        let served = lines.serve(&lock(), &mut table, t, |r| *r == "gone");
        assert_eq!(owners(&served), ["timed out behind A"]);
        assert_eq!(lines.len(&lock()), 1, "only the long waiter is left");
    }

    #[test]
    fn a_full_line_gives_the_waiter_back() {
        let mut lines: Lines<&str> = Lines::new(1);
        lines.join(lock(), waiter("a", 10)).expect("room");
        let (full, back) = lines.join(lock(), waiter("b", 10)).expect_err("full");
        assert_eq!(
            (full, back.owner.as_str()),
            (LineFull::Line { max: 1 }, "b")
        );
        assert_eq!(lines.waiting(), 1);
    }

    #[test]
    fn max_per_lock_waiters_wait_and_the_next_is_refused() {
        let mut lines: Lines<&str> = Lines::new(2);
        lines.join(lock(), waiter("a", 10)).expect("first waits");
        lines.join(lock(), waiter("b", 10)).expect("second waits");
        let (full, _) = lines.join(lock(), waiter("c", 10)).expect_err("third");
        assert_eq!(full, LineFull::Line { max: 2 });
        assert_eq!(lines.len(&lock()), 2);
    }

    #[test]
    fn one_party_holds_at_most_its_share_and_others_still_get_in() {
        assert_eq!([1, 2, 3, 4, 5, 8, 1024].map(share), [1, 1, 1, 1, 2, 2, 256]);
        let mut lines: Lines<&str> = Lines::new(8);
        let filler = |n: usize| Waiter {
            party: Party::new("filler"),
            ..waiter(&format!("f{n}"), 10)
        };
        lines.join(lock(), filler(1)).expect("within its share");
        lines.join(lock(), filler(2)).expect("within its share");
        let (full, back) = lines.join(lock(), filler(3)).expect_err("share used");
        assert_eq!(
            (full, back.owner.as_str()),
            (LineFull::Share { share: 2 }, "f3")
        );
        // The rightful next holder, another party, still joins.
        lines
            .join(lock(), waiter("next", 10))
            .expect("room for others");
        assert_eq!(lines.len(&lock()), 3);
        // A refused join on a lock without a line leaves no empty line.
        let mut none: Lines<&str> = Lines::new(0);
        assert!(none.join(lock(), waiter("a", 10)).is_err());
        assert!(none.locks().is_empty());
    }

    #[test]
    fn admit_counts_only_the_waiters_ahead() {
        assert_eq!(admit(0, 0, 2), Ok(()));
        assert_eq!(admit(1, 0, 2), Ok(()));
        assert_eq!(admit(2, 0, 2), Err(LineFull::Line { max: 2 }));
        assert_eq!(admit(1, 1, 2), Err(LineFull::Share { share: 1 }));
        assert_eq!(admit(5, 1, 8), Ok(()));
        assert_eq!(admit(5, 2, 8), Err(LineFull::Share { share: 2 }));
    }
}
