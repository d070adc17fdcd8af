//! The one place the proxy reads the wall clock: the expiry of lease-bound
//! credentials, the dates of SigV4 requests (checked by the edge, signed by
//! the lean forwarder), and the start time a replica records for the status;
//! and the clock the cluster protocol runs on ([`boot_ms`]).

/// Now.
#[allow(clippy::disallowed_methods, reason = "the single wall-clock read")]
pub fn now() -> std::time::SystemTime {
    std::time::SystemTime::now()
}

/// Now, in Unix seconds.
pub fn unix_secs() -> u64 {
    now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Now, in Unix milliseconds.
pub fn unix_ms() -> u64 {
    now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Milliseconds of `CLOCK_BOOTTIME`: monotonic, and unlike
/// `CLOCK_MONOTONIC` (`std::time::Instant`) it goes on counting while the
/// machine is suspended. A replica's standing is measured on it, so a
/// replica whose machine slept past its registration does not wake up
/// believing it still admits.
pub fn boot_ms() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).map_or(0, |t| {
        u64::try_from(t.tv_sec())
            .unwrap_or(0)
            .saturating_mul(1000)
            .saturating_add(u64::try_from(t.tv_nsec()).unwrap_or(0) / 1_000_000)
    })
}
