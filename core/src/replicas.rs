//! How proxy replicas share one fence (Chubby-style invalidation): when a
//! replica may admit writes at all, and when a raise one replica wrote to
//! the shared store may be admitted.
//!
//! The shared store (etcd, in the proxy) holds, per lock, the max token;
//! per replica *incarnation* (one run of one replica), a permanent member
//! record written before it admits anything, a registration on a lease of
//! TTL `ttl`, and its acknowledgements (the max it applied per lock, on the
//! same lease). A raise to `t` writes the max and the raiser's own ack in one
//! transaction at revision `rev`, and is admitted only when every member
//! that joined before `rev`:
//!
//! - acknowledged `t` (it cut and drained its own writes below `t` first);
//! - or has been seen without a registration for `lock_delay` on the
//!   raiser's clock (its registration expired, was revoked early, or was
//!   evicted by a raiser after `ack_timeout`): by then it has fenced itself
//!   ([`Standing`]) and whatever it had sent the store has been decided.
//!
//! A member that joined after `rev` read the max after `rev`, so it holds
//! `t` already. A member that learned `t` (from its watch, or at join)
//! refuses writes below it at once, but admits `t` itself only after it
//! waited for the raise as its raiser does: its own ack says it has drained,
//! not that the others have. A member record is removed (retired) only by a raiser that
//! waited its lock delay, so a replica that died is waited for once, by
//! whichever raise comes first, however long ago it died.
//!
//! Times are milliseconds of the caller's monotonic clock ([`Ms`]); no
//! synchronized clocks are assumed, only rates within `1 ± drift`.

pub mod machine;
mod rules;

pub use machine::{Admit, Answer, Event, RaiseStatus, Replica, ReqId, Request, WriteId};
pub use rules::*;

#[cfg(test)]
mod tests {
    use super::*;

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
