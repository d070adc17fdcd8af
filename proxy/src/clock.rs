//! The one place the proxy reads the wall clock: the expiry of lease-bound
//! credentials, the dates of SigV4 requests (checked by the edge, signed by
//! the lean forwarder), and the start time a replica records for the status
//! (the cluster protocol itself runs on the monotonic clock).

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
