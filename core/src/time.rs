//! Time as the core sees it: a point passed in by the caller.

use std::time::Duration;

/// Milliseconds since the Unix epoch.
///
/// The lease service persists lease expiries across restarts, so the core
/// uses wall-clock milliseconds rather than a monotonic instant; the caller
/// decides where `now` comes from (the system clock in the service, a manual
/// clock in the simulation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// Milliseconds since the Unix epoch.
    pub fn as_millis(self) -> u64 {
        self.0
    }

    /// This point moved `d` later, saturating instead of overflowing.
    pub fn saturating_add(self, d: Duration) -> Timestamp {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Timestamp(self.0.saturating_add(ms))
    }

    /// How long from `self` until `later` (zero if `later` is not later).
    pub fn until(self, later: Timestamp) -> Duration {
        Duration::from_millis(later.0.saturating_sub(self.0))
    }
}
