//! The one place the lease service reads the wall clock.
//!
//! Lease expiries are persisted, so they are wall-clock milliseconds; the
//! core itself never reads a clock (see `fencegate_core::time`).

use fencegate_core::Timestamp;

/// Now, as the core's [`Timestamp`].
#[allow(clippy::disallowed_methods, reason = "the single wall-clock read")]
pub fn now() -> Timestamp {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp(u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX))
}
