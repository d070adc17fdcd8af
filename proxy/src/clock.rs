//! The one place the proxy reads the wall clock: the expiry of lease-bound
//! credentials.

/// Now, in Unix seconds.
#[allow(clippy::disallowed_methods, reason = "the single wall-clock read")]
pub fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
