//! The one place the proxy reads the wall clock: the expiry of lease-bound
//! credentials, and the dates of SigV4 requests (checked by the edge,
//! signed by the lean forwarder).

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
