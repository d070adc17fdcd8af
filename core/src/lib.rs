//! The pure fencing core of fencegate.
//!
//! This crate owns the three decisions the whole system rests on, and nothing
//! else:
//!
//! - [`lease`]: who holds a lock and which fencing token they hold (the lease
//!   state machine of design rules 1 and 2);
//! - [`line`]: who waits for a held lock, in which order, until when;
//! - [`fence`]: whether a write carrying a token is admitted (rule 3);
//! - [`replicas`]: how proxy replicas share one fence: when a replica may
//!   admit at all, and when a raise written to the shared store may be
//!   admitted (acks, evictions, the lock delay);
//! - [`fields`]: how the wire formats are cut into their fields;
//! - [`token`]: how a token travels in the `Fencing-Token` header, plain or
//!   signed with HMAC-SHA256;
//! - [`credentials`]: how it travels in S3 credentials, for tools that
//!   cannot send a header;
//! - [`election`]: what an election the cluster already runs shows (its
//!   holder and the token of its term).
//!
//! **Architecture invariant:** nothing here performs I/O, spawns, sleeps or
//! reads a clock. Every function that depends on time takes `now` as an
//! argument, so the state machine can be driven by a manual clock in the
//! deterministic simulation (`tests/simulation.rs`) and by the wall clock in
//! the lease service, with the same code.

pub mod credentials;
pub mod election;
pub mod fence;
pub mod fields;
pub mod lease;
pub mod line;
pub mod name;
pub mod replicas;
pub mod time;
pub mod token;

pub use fence::{Fence, Verdict};
pub use lease::{AcquireStep, Grant, Held, KeyDigest, Lease, LockTable, NotHolder};
pub use name::{LockName, LockNameError};
pub use time::Timestamp;
pub use token::{FencingToken, SignedToken, TokenError, TokenKeys, VerifyError};
