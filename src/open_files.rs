//! The open-file limit against the connection caps.
//!
//! A served connection holds descriptors (a proxy connection one more to
//! the backend), so under a limit below what `max_connections` needs,
//! `accept` fails with EMFILE before the cap is reached and clients hang in
//! the backlog instead of getting the cap's 503. At start the limit is
//! raised as far as allowed; a cap that still does not fit is lowered to
//! one that does, with a warning naming both numbers and the limit to set.

use fencegate_net::MAX_REFUSING;

/// Descriptors kept for everything but connections: standard streams,
/// listeners, databases, event loops, the lease service's clients (as
/// `fencegate_net::open_file_limit_warning` counts them).
const OTHER_FILES: u64 = 64;

/// One server's cap, as configured, and what each of its connections holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap {
    /// How the warning names the server ("the lease service").
    pub server: &'static str,
    pub max_connections: usize,
    /// Descriptors a served connection holds (a refused one holds one:
    /// it is answered 503 and closed, and never reaches a backend).
    pub files_per_connection: u64,
}

/// What the limit allows.
#[derive(Debug, PartialEq, Eq)]
enum Fit {
    /// Every cap fits.
    All,
    /// These caps (in the same order) fit: each lowered by one factor.
    Lowered(Vec<usize>),
    /// Not even one connection each fits beside the refusals and the rest.
    None,
}

/// Open files `caps` need whatever their caps: refusals and the rest.
fn fixed_files(caps: &[Cap]) -> u64 {
    OTHER_FILES + MAX_REFUSING as u64 * caps.len() as u64
}

/// Open files `caps` need at their `max_connections` (saturating).
fn files_needed(caps: &[Cap]) -> u64 {
    caps.iter().fold(fixed_files(caps), |sum, c| {
        (c.max_connections as u64)
            .saturating_mul(c.files_per_connection)
            .saturating_add(sum)
    })
}

fn fit(limit: u64, caps: &[Cap]) -> Fit {
    if files_needed(caps) <= limit {
        return Fit::All;
    }
    let available = u128::from(limit.saturating_sub(fixed_files(caps)));
    let wanted: u128 = caps
        .iter()
        .map(|c| c.max_connections as u128 * u128::from(c.files_per_connection))
        .sum();
    // Each cap times available / wanted: together they hold at most
    // `available` descriptors.
    let lowered: Vec<usize> = caps
        .iter()
        .map(|c| usize::try_from(c.max_connections as u128 * available / wanted).unwrap_or(0))
        .collect();
    if lowered.contains(&0) {
        Fit::None
    } else {
        Fit::Lowered(lowered)
    }
}

/// `numbers`, one per cap: "16 connections on the lease service and 16
/// on the proxy" (`unit` " connections"), or "16 connections" for one.
fn each(numbers: &[usize], caps: &[Cap], unit: &str) -> String {
    let parts: Vec<String> = numbers
        .iter()
        .zip(caps)
        .enumerate()
        .map(|(i, (n, c))| {
            let unit = if i == 0 { unit } else { "" };
            if caps.len() == 1 {
                format!("{n}{unit}")
            } else {
                format!("{n}{unit} on {}", c.server)
            }
        })
        .collect();
    match parts.as_slice() {
        [init @ .., last] if !init.is_empty() => format!("{} and {last}", init.join(", ")),
        _ => parts.concat(),
    }
}

/// What to tell the operator under `limit`, and the caps to serve with.
fn decide(limit: u64, caps: &[Cap]) -> (Option<String>, Vec<usize>) {
    let configured: Vec<usize> = caps.iter().map(|c| c.max_connections).collect();
    let needed = files_needed(caps);
    let wanted = format!("max_connections = {}", each(&configured, caps, ""));
    let raise = format!(
        "Raise the limit to at least {needed} (ulimit -n {needed} before starting; LimitNOFILE={needed} under systemd; --ulimit nofile={needed} in Docker)"
    );
    match fit(limit, caps) {
        Fit::All => (None, configured),
        Fit::Lowered(lowered) => {
            let warning = format!(
                "the open-file limit is {limit}, too low for {wanted} (about {needed} open files); \
                 serving at most {} instead, so clients over the cap get its 503 rather than hang. {raise}",
                each(&lowered, caps, " connections")
            );
            (Some(warning), lowered)
        }
        Fit::None => {
            let warning = format!(
                "the open-file limit is {limit}, too low for even one connection beside the {} files kept for refusals and the rest; \
                 keeping {wanted} (about {needed} open files): clients will wait while accept fails (EMFILE). {raise}",
                fixed_files(caps)
            );
            (Some(warning), configured)
        }
    }
}

/// Raises the open-file limit as far as allowed; returns the
/// `max_connections` to serve with, one per cap, each lowered (with a
/// warning) if the limit still cannot hold it.
pub fn fit_caps(caps: &[Cap]) -> Vec<usize> {
    let Some(limit) = fencegate_net::raise_open_file_limit() else {
        return caps.iter().map(|c| c.max_connections).collect();
    };
    let (warning, serve) = decide(limit, caps);
    if let Some(w) = warning {
        tracing::warn!(
            open_file_limit = limit,
            max_connections = ?serve,
            "{w}"
        );
    }
    serve
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCKSVC: Cap = Cap {
        server: "the lease service",
        max_connections: 1024,
        files_per_connection: 1,
    };
    const DEV_PROXY: Cap = Cap {
        server: "the proxy",
        max_connections: 1024,
        files_per_connection: 3,
    };

    #[test]
    fn caps_that_fit_are_kept() {
        assert_eq!(files_needed(&[LOCKSVC]), 1024 + 64 + 64);
        assert_eq!(decide(1152, &[LOCKSVC]), (None, vec![1024]));
        assert_eq!(
            decide(20_000, &[LOCKSVC, DEV_PROXY]),
            (None, vec![1024, 1024])
        );
    }

    #[test]
    fn caps_that_do_not_fit_are_lowered_together_and_both_numbers_named() {
        let (warning, serve) = decide(256, &[LOCKSVC, DEV_PROXY]);
        assert_eq!(serve, [16, 16]);
        // 64 + 2 * 64 for refusals and the rest, 16 + 3 * 16 for connections.
        let lowered = [
            Cap {
                max_connections: 16,
                ..LOCKSVC
            },
            Cap {
                max_connections: 16,
                ..DEV_PROXY
            },
        ];
        assert_eq!(files_needed(&lowered), 256);
        let warning = warning.expect("a warning");
        fencegate_testkit::assert_mentions(
            &warning,
            &[
                "the open-file limit is 256",
                "max_connections = 1024 on the lease service and 1024 on the proxy",
                "about 4288 open files",
                "serving at most 16 connections on the lease service and 16 on the proxy instead",
                "ulimit -n 4288",
            ],
        );
        let (warning, serve) = decide(256, &[LOCKSVC]);
        assert_eq!(serve, [128]);
        let warning = warning.expect("a warning");
        assert!(
            warning.contains("too low for max_connections = 1024 (about 1152 open files); serving at most 128 connections"),
            "{warning}"
        );
    }

    #[test]
    fn a_limit_too_low_for_one_connection_keeps_the_cap_and_says_so() {
        let (warning, serve) = decide(64, &[LOCKSVC]);
        assert_eq!(serve, [1024]);
        let warning = warning.expect("a warning");
        fencegate_testkit::assert_mentions(
            &warning,
            &["too low for even one connection beside the 128 files"],
        );
        fencegate_testkit::assert_mentions(&warning, &["ulimit -n 1152"]);
    }
}
