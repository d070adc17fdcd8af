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
