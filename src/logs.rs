//! How fencegate writes its log lines: text or JSON
//! (`FENCEGATE_LOG_FORMAT`), the banner, and the error a command ends with.

use std::sync::atomic::{AtomicBool, Ordering};

/// The target of the line that announces a service's address. In JSON
/// mode it is a log line on stdout (where scripts and the tests read the
/// address), whatever `FENCEGATE_LOG` says; in text mode the plain banner
/// is printed instead.
pub const BANNER: &str = "fencegate::banner";
/// The target of the error a command ends with in JSON mode: never
/// filtered out, as the plain text one is never silenced.
pub const EXIT: &str = "fencegate::exit";

/// Whether log lines are JSON (`FENCEGATE_LOG_FORMAT=json`).
static JSON_LOGS: AtomicBool = AtomicBool::new(false);

/// Whether log lines are JSON: then every line fencegate writes on stdout
/// and stderr is a JSON object, the banner too.
pub fn json_logs() -> bool {
    JSON_LOGS.load(Ordering::Relaxed)
}

pub fn init_tracing() {
    // s3s logs every client error at ERROR; the proxy logs what matters
    // itself, so s3s stays quiet unless FENCEGATE_LOG names it.
    let wanted = std::env::var("FENCEGATE_LOG").unwrap_or_else(|_| "info".into());
    let mut directives = if wanted.contains("s3s") {
        wanted.clone()
    } else {
        format!("{wanted},s3s=off,s3s_aws=off,s3s_fs=off")
    };
    // rustls warns on every connection of a client that sends an IP
    // address as SNI (pgBackRest does), which the server ignores anyway.
    if !wanted.contains("rustls") {
        directives.push_str(",rustls=error");
    }
    let filter = |extra: &str| {
        tracing_subscriber::EnvFilter::try_new(format!("{directives}{extra}")).unwrap_or_else(
            |_| {
                tracing_subscriber::EnvFilter::new(format!(
                    "info,s3s=off,s3s_aws=off,s3s_fs=off{extra}"
                ))
            },
        )
    };
    // FENCEGATE_LOG_FORMAT=json: one JSON object per line (fields flattened
    // beside "message", "level", "target" and "timestamp"), for log
    // pipelines; the banner is one too, on stdout. Any other value logs as
    // text, with a warning first.
    match log_format() {
        Ok(LogFormat::Json) => {
            use tracing_subscriber::Layer as _;
            use tracing_subscriber::layer::SubscriberExt as _;
            use tracing_subscriber::util::SubscriberInitExt as _;
            JSON_LOGS.store(true, Ordering::Relaxed);
            let logs = tracing_subscriber::fmt::layer()
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_writer(std::io::stderr)
                .with_filter(filter(&format!(",{BANNER}=off,{EXIT}=error")));
            let banner = tracing_subscriber::fmt::layer()
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_writer(std::io::stdout)
                .with_filter(tracing_subscriber::filter::filter_fn(|m| {
                    m.target() == BANNER
                }));
            tracing_subscriber::registry()
                .with(logs)
                .with(banner)
                .init();
        }
        format => {
            // Colours only on a terminal, not in a log file or a pipe.
            tracing_subscriber::fmt()
                .with_env_filter(filter(""))
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_writer(std::io::stderr)
                .init();
            if let Err(bad) = format {
                tracing::warn!(
                    "FENCEGATE_LOG_FORMAT={bad:?} is neither \"text\" nor \"json\"; logging as text"
                );
            }
        }
    }
}

/// How log lines are written (`FENCEGATE_LOG_FORMAT`).
enum LogFormat {
    Text,
    Json,
}

fn log_format() -> Result<LogFormat, String> {
    match std::env::var("FENCEGATE_LOG_FORMAT") {
        Err(_) => Ok(LogFormat::Text),
        Ok(v) if v.is_empty() || v.eq_ignore_ascii_case("text") => Ok(LogFormat::Text),
        Ok(v) if v.eq_ignore_ascii_case("json") => Ok(LogFormat::Json),
        Ok(v) => Err(v),
    }
}
