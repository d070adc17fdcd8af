//! The protocol's rules: its time constants, a member's standing, what a
//! raiser waits for, read off the members' records.

use std::collections::BTreeMap;
use std::time::Duration;

/// Milliseconds on one replica's monotonic clock.
pub type Ms = u64;

pub(super) fn ms(d: Duration) -> Ms {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What this replica publishes with its registration, so that a raiser
/// waits for it by its own settings (replicas may differ during a rolling
/// change of settings).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Published {
    pub ttl: Duration,
    pub drift: f64,
    pub store_decision: Duration,
    pub lock_delay: Duration,
}

impl Published {
    pub fn of(t: &Timing) -> Published {
        Published {
            ttl: t.ttl,
            drift: t.drift,
            store_decision: t.store_decision,
            lock_delay: t.lock_delay,
        }
    }
}

/// What one compare of a raise transaction found: the lock's max `found`
/// after it, and whether its compare held (`succeeded`: the max was put,
/// or was already the token and the ack was put).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RaiseRead {
    /// The max is the token and this member's ack of it is written, at
    /// the max's mod revision `rev`.
    Raised { rev: i64 },
    /// The max is above the token: the raise is stale.
    Higher { max: u64 },
    /// Neither: another raise moved the max between two compares (or
    /// this compare did not apply). Try the next compare, or again.
    Raced,
}

impl RaiseRead {
    /// Reads one answer of a raise of `token`.
    pub fn of(token: u64, found: u64, succeeded: bool, rev: i64) -> RaiseRead {
        match crate::fence::decide(found, token) {
            crate::fence::Verdict::Stale { max } => RaiseRead::Higher { max },
            crate::fence::Verdict::Admit { raises: false } if succeeded => {
                RaiseRead::Raised { rev }
            }
            crate::fence::Verdict::Admit { .. } => RaiseRead::Raced,
        }
    }
}

/// The protocol's time constants.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// The registration lease's TTL.
    pub ttl: Duration,
    /// Bound on clock rate error, both ways (0.01: clocks run at 99-101 %
    /// of real time).
    pub drift: f64,
    /// How long a store may take to decide a request it was fully sent, or
    /// whose connection closed.
    pub store_decision: Duration,
    /// How long a raiser waits for a registered member's ack before it
    /// evicts that member (revokes its registration).
    pub ack_timeout: Duration,
    /// How long a raiser waits after it saw a member without registration.
    pub lock_delay: Duration,
}

/// Why a [`Timing`] is unsafe.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TimingError {
    #[error("drift must be in [0, 0.5), got {0}")]
    Drift(f64),
    #[error("the registration TTL must be at least 1 s, got {0:?}")]
    Ttl(Duration),
    #[error(
        "lock_delay {got:?} is below ttl·(1+drift)/(1-drift) + store_decision = {min:?}: a replica that lost its registration could still admit or land writes after it"
    )]
    LockDelay { got: Duration, min: Duration },
}

impl Timing {
    /// The shortest safe lock delay, on the raiser's clock: a member whose
    /// registration is gone may believe it valid for up to `ttl` of its own
    /// clock after its last renewal (at most `ttl/(1-drift)` of real time),
    /// and a write it had fully sent is decided `store_decision` of real
    /// time after that; the raiser's clock may run `1+drift` fast over both.
    pub fn min_lock_delay(ttl: Duration, drift: f64, store_decision: Duration) -> Duration {
        (ttl.div_f64(1.0 - drift) + store_decision).mul_f64(1.0 + drift)
    }

    /// How long this raiser waits out `member` once it is seen without a
    /// registration: the longest of its own lock delay, the one the member
    /// published, and the minimum for the member's TTL and store decision
    /// time at the larger of the two drifts.
    pub fn lock_delay_for(&self, member: Option<&Published>) -> Duration {
        member.map_or(self.lock_delay, |p| {
            let drift = p.drift.max(self.drift).min(0.49);
            self.lock_delay
                .max(p.lock_delay)
                .max(Timing::min_lock_delay(p.ttl, drift, p.store_decision))
        })
    }

    /// `self`, or the first rule it breaks.
    pub fn checked(self) -> Result<Timing, TimingError> {
        if !(0.0..0.5).contains(&self.drift) {
            return Err(TimingError::Drift(self.drift));
        }
        if self.ttl < Duration::from_secs(1) {
            return Err(TimingError::Ttl(self.ttl));
        }
        let min = Timing::min_lock_delay(self.ttl, self.drift, self.store_decision);
        if self.lock_delay < min {
            return Err(TimingError::LockDelay {
                got: self.lock_delay,
                min,
            });
        }
        Ok(self)
    }

    /// How long after sending a renewal that succeeded a replica may go on
    /// admitting: `ttl·(1-drift)` less a margin of a tenth of it for the
    /// work between a check and the write it allows.
    pub fn standing(&self) -> Duration {
        self.ttl.mul_f64((1.0 - self.drift) * 0.9)
    }
}

/// Whether this replica may admit writes: until `standing` after the send
/// of its last renewal that the store answered as alive. Checked before
/// every admission and every body chunk forwarded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Standing {
    valid_until: Option<Ms>,
}

impl Standing {
    /// A registration renewed by a request sent at `sent_at` (not when its
    /// answer came: the store's lease runs from some moment after the send).
    pub fn renewed(&mut self, sent_at: Ms, timing: &Timing) {
        let until = sent_at.saturating_add(ms(timing.standing()));
        self.valid_until = Some(self.valid_until.map_or(until, |u| u.max(until)));
    }

    /// The registration is gone or was never made: nothing is admitted until
    /// the replica joins again.
    pub fn lost(&mut self) {
        self.valid_until = None;
    }

    pub fn admits(&self, now: Ms) -> bool {
        self.valid_until.is_some_and(|u| now < u)
    }

    /// Until when it admits, if at all.
    pub fn valid_until(&self) -> Option<Ms> {
        self.valid_until
    }
}

/// One member as the raiser read it from the store (one read, after its
/// raise was written).
#[derive(Debug, Clone, PartialEq)]
pub struct MemberView {
    /// The incarnation's name (`<replica>-<incarnation>`).
    pub id: String,
    /// Revision at which it joined (its member record was created).
    pub joined_rev: i64,
    /// Whether its registration exists.
    pub registered: bool,
    /// Its ack for the lock being raised (0: none).
    pub acked: u64,
    /// The token it says it is draining writes below (0: none).
    pub draining: u64,
    /// Its registration's lease (to evict it).
    pub lease: i64,
    /// The settings it published at join (`None`: unreadable record).
    pub published: Option<Published>,
}

/// What the raiser does next.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Next {
    /// Every member acked or is out: admit the raise.
    pub admit: bool,
    /// Members to evict (revoke their registration): no ack within
    /// `ack_timeout`.
    pub evict: Vec<String>,
    /// Members seen without a registration for the first time: their
    /// lease is revoked. A registration deleted by hand leaves its lease
    /// alive, and a member renewing that lease would go on admitting; once
    /// the lease is revoked its next renewal fails and it stops.
    pub revoke: Vec<String>,
    /// Members whose lock delay has passed: their record may be removed.
    pub retire: Vec<String>,
    /// When to look again, if not admitted (the earliest deadline; a new
    /// ack may come sooner).
    pub wake_at: Option<Ms>,
}

/// Why a member holds up a raise (what the status shows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holdup {
    /// Registered, no ack yet; evicted at `evict_at`.
    Ack { evict_at: Ms },
    /// Registered and draining writes below the token: waited for as long
    /// as it stays registered (slow is not dead).
    Draining,
    /// Gone since `since`; out at `since + lock_delay`.
    LockDelay { since: Ms, out_at: Ms },
}

impl Holdup {
    /// For the status and the logs.
    pub fn describe(&self, now: Ms) -> String {
        match self {
            Holdup::Ack { evict_at } => {
                format!("no ack yet; evicted in {} ms", evict_at.saturating_sub(now))
            }
            Holdup::Draining => "draining writes below the token".into(),
            Holdup::LockDelay { out_at, .. } => format!(
                "registration gone; lock delay ends in {} ms",
                out_at.saturating_sub(now)
            ),
        }
    }
}

/// One raise waiting for the other members.
#[derive(Debug, Clone)]
pub struct RaiseWait {
    token: u64,
    rev: i64,
    me: String,
    started: Ms,
    timing: Timing,
    /// When this raiser first saw each member without registration.
    gone: BTreeMap<String, Ms>,
    holdups: BTreeMap<String, Holdup>,
}

impl RaiseWait {
    /// A raise of `token`, written by member `me` at revision `rev`, at
    /// `now`.
    pub fn new(token: u64, rev: i64, me: &str, now: Ms, timing: Timing) -> RaiseWait {
        RaiseWait {
            token,
            rev,
            me: me.to_owned(),
            started: now,
            timing,
            gone: BTreeMap::new(),
            holdups: BTreeMap::new(),
        }
    }

    /// Decides on one read of the members (all of them: every member
    /// record, with its registration, its ack of this lock and its draining
    /// report). `evict_draining` is a broken variant for the simulation.
    pub fn next(&mut self, members: &[MemberView], now: Ms, evict_draining: bool) -> Next {
        let mut next = Next::default();
        let mut wake: Option<Ms> = None;
        let mut wake_at = |t: Ms| wake = Some(wake.map_or(t, |w: Ms| w.min(t)));
        self.holdups.clear();
        for m in members {
            if m.id == self.me || m.joined_rev > self.rev {
                continue;
            }
            if m.registered {
                if m.acked >= self.token {
                    continue;
                }
                if m.draining >= self.token && !evict_draining {
                    self.holdups.insert(m.id.clone(), Holdup::Draining);
                    continue;
                }
                let evict_at = self.started.saturating_add(ms(self.timing.ack_timeout));
                if now >= evict_at {
                    next.evict.push(m.id.clone());
                    // Gone from the moment it is revoked: the lock delay
                    // runs from the next read that shows it so.
                }
                wake_at(evict_at.max(now));
                self.holdups.insert(m.id.clone(), Holdup::Ack { evict_at });
                continue;
            }
            if !self.gone.contains_key(&m.id) {
                next.revoke.push(m.id.clone());
            }
            let since = *self.gone.entry(m.id.clone()).or_insert(now);
            let delay = self.timing.lock_delay_for(m.published.as_ref());
            let out_at = since.saturating_add(ms(delay));
            if now >= out_at {
                next.retire.push(m.id.clone());
                continue;
            }
            wake_at(out_at);
            self.holdups
                .insert(m.id.clone(), Holdup::LockDelay { since, out_at });
        }
        next.admit = self.holdups.is_empty();
        next.wake_at = if next.admit { None } else { wake };
        next
    }

    /// Who held the raise up at the last [`RaiseWait::next`], and why.
    pub fn holdups(&self) -> &BTreeMap<String, Holdup> {
        &self.holdups
    }

    pub fn token(&self) -> u64 {
        self.token
    }

    pub fn started(&self) -> Ms {
        self.started
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raise_answer_is_read_by_the_fence_rule() {
        // Put or acked at the token: raised, at the max's revision.
        assert_eq!(RaiseRead::of(7, 7, true, 42), RaiseRead::Raised { rev: 42 });
        // Above it, whatever the compare did: stale.
        assert_eq!(RaiseRead::of(7, 9, false, 42), RaiseRead::Higher { max: 9 });
        assert_eq!(RaiseRead::of(7, 9, true, 42), RaiseRead::Higher { max: 9 });
        // At the token but this compare did not apply, or still below:
        // another raise moved it between two compares.
        assert_eq!(RaiseRead::of(7, 7, false, 42), RaiseRead::Raced);
        assert_eq!(RaiseRead::of(7, 5, false, 42), RaiseRead::Raced);
    }

    fn timing() -> Timing {
        Timing {
            ttl: Duration::from_secs(10),
            drift: 0.01,
            store_decision: Duration::from_secs(10),
            ack_timeout: Duration::from_secs(5),
            lock_delay: Duration::from_millis(20_400),
        }
    }

    fn member(id: &str, rev: i64, registered: bool, acked: u64) -> MemberView {
        MemberView {
            id: id.into(),
            joined_rev: rev,
            registered,
            acked,
            draining: 0,
            lease: 1,
            published: None,
        }
    }

    #[test]
    fn the_lock_delay_covers_a_full_standing_and_the_store() {
        let min = Timing::min_lock_delay(Duration::from_secs(10), 0.01, Duration::from_secs(10));
        assert!(min > Duration::from_millis(20_300) && min < Duration::from_millis(20_310));
        assert!(timing().checked().is_ok());
        let short = Timing {
            lock_delay: Duration::from_millis(20_300),
            ..timing()
        };
        assert!(matches!(
            short.checked(),
            Err(TimingError::LockDelay { .. })
        ));
        let wild = Timing {
            drift: 0.7,
            ..timing()
        };
        assert_eq!(wild.checked(), Err(TimingError::Drift(0.7)));
        // Standing ends before the store's lease can, on any clock within
        // the drift: 9 s of local clock is at most 9.09 s of real time.
        assert_eq!(timing().standing(), Duration::from_millis(8_910));
    }

    #[test]
    fn standing_runs_from_the_send_and_never_shrinks() {
        let t = timing();
        let mut s = Standing::default();
        assert!(!s.admits(0), "not before joining");
        s.renewed(1_000, &t);
        assert!(s.admits(9_909) && !s.admits(9_910));
        s.renewed(500, &t); // a late answer to an older renewal
        assert_eq!(s.valid_until(), Some(9_910));
        s.lost();
        assert!(!s.admits(1_001));
    }

    #[test]
    fn a_raise_waits_for_every_earlier_members_ack() {
        let mut w = RaiseWait::new(7, 100, "me-1", 0, timing());
        let view = [
            member("me-1", 10, true, 7),
            member("a-1", 20, true, 6),
            member("b-1", 150, true, 0), // joined after the raise
        ];
        let n = w.next(&view, 10, false);
        assert!(!n.admit);
        assert_eq!(n.wake_at, Some(5_000));
        assert!(matches!(
            w.holdups().get("a-1"),
            Some(Holdup::Ack { evict_at: 5_000 })
        ));
        let view = [member("me-1", 10, true, 7), member("a-1", 20, true, 7)];
        assert!(w.next(&view, 20, false).admit);
    }

    #[test]
    fn a_silent_member_is_evicted_then_waited_out() {
        let t = timing();
        let mut w = RaiseWait::new(7, 100, "me-1", 0, t);
        let registered = [member("a-1", 20, true, 0)];
        assert!(w.next(&registered, 4_999, false).evict.is_empty());
        let n = w.next(&registered, 5_000, false);
        assert_eq!(n.evict, vec!["a-1".to_owned()]);
        assert!(!n.admit);
        let gone = [member("a-1", 20, false, 0)];
        let n = w.next(&gone, 5_010, false);
        assert!(!n.admit);
        assert_eq!(n.wake_at, Some(5_010 + 20_400));
        assert!(!w.next(&gone, 25_409, false).admit);
        let n = w.next(&gone, 25_410, false);
        assert!(n.admit);
        assert_eq!(n.retire, vec!["a-1".to_owned()]);
    }

    #[test]
    fn a_draining_member_is_waited_for_not_evicted() {
        let mut w = RaiseWait::new(7, 100, "me-1", 0, timing());
        let draining = [MemberView {
            draining: 7,
            ..member("a-1", 20, true, 6)
        }];
        let n = w.next(&draining, 60_000, false);
        assert!(!n.admit && n.evict.is_empty(), "{n:?}");
        assert_eq!(w.holdups().get("a-1"), Some(&Holdup::Draining));
        // Its ack, once drained, lets the raise through.
        assert!(w.next(&[member("a-1", 20, true, 7)], 60_001, false).admit);
        // The broken variant evicts it.
        let mut w = RaiseWait::new(7, 100, "me-1", 0, timing());
        assert_eq!(w.next(&draining, 5_000, true).evict, vec!["a-1".to_owned()]);
    }

    #[test]
    fn a_member_with_longer_settings_is_waited_out_by_its_own() {
        let t = timing();
        let slow = Published {
            ttl: Duration::from_secs(30),
            drift: 0.05,
            store_decision: Duration::from_secs(60),
            lock_delay: Duration::from_secs(5),
        };
        let need = Timing::min_lock_delay(slow.ttl, 0.05, slow.store_decision);
        assert_eq!(t.lock_delay_for(Some(&slow)), need);
        assert!(need > t.lock_delay);
        // A member with shorter settings does not shorten the raiser's own.
        let quick = Published {
            ttl: Duration::from_secs(1),
            drift: 0.0,
            store_decision: Duration::ZERO,
            lock_delay: Duration::from_secs(2),
        };
        assert_eq!(t.lock_delay_for(Some(&quick)), t.lock_delay);
        let mut w = RaiseWait::new(7, 100, "me-1", 0, t);
        let gone = [MemberView {
            published: Some(slow),
            ..member("a-1", 20, false, 0)
        }];
        let n = w.next(&gone, 1_000, false);
        assert_eq!(n.wake_at, Some(1_000 + ms(need)));
    }

    #[test]
    fn a_member_seen_without_registration_has_its_lease_revoked_once() {
        let mut w = RaiseWait::new(3, 100, "me-1", 0, timing());
        let gone = [member("a-1", 5, false, 0)];
        assert_eq!(w.next(&gone, 10, false).revoke, vec!["a-1".to_owned()]);
        assert!(w.next(&gone, 20, false).revoke.is_empty(), "once a raise");
    }

    #[test]
    fn a_member_gone_before_the_raise_is_waited_out_once_and_a_retired_one_not_at_all() {
        let mut w = RaiseWait::new(3, 100, "me-1", 1_000, timing());
        let n = w.next(&[member("dead-1", 5, false, 0)], 1_000, false);
        assert!(!n.admit);
        assert!(matches!(
            w.holdups().get("dead-1"),
            Some(Holdup::LockDelay { since: 1_000, .. })
        ));
        // Retired by another raiser meanwhile: nothing left to wait for.
        assert!(w.next(&[], 2_000, false).admit);
    }
}
