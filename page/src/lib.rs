//! The frame both status pages share: the HTML document around a page's
//! sections, its one style sheet, durations and times as people read
//! them, and the HTTP Basic credentials a browser sends.
//!
//! Pages are server-rendered with [`maud`]: every value is escaped unless
//! marked otherwise, so an object key a zombie chose (`<script>...`) is
//! shown as text. Nothing is fetched: the style sheet is inline, and the
//! only script (a countdown of lease expiries) is inline too and optional;
//! without it the page shows the remaining time as rendered, and refreshes
//! itself every [`REFRESH_SECS`]. Readable without colour: every state is
//! a word (STALE, SAFE, HELD), colour only repeats it.

use base64::Engine as _;
pub use maud::{Markup, PreEscaped, html};

/// The page reloads itself this often.
pub const REFRESH_SECS: u32 = 10;

const STYLE: &str = r#"
:root { color-scheme: light dark; --line: #8884; --warn: #b3261e; --ok: #1e6b32; }
* { box-sizing: border-box; }
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0 auto; padding: 12px; max-width: 1100px; }
header { border-bottom: 2px solid var(--line); margin-bottom: 8px; }
h1 { font-size: 1.3em; margin: 4px 0; }
h2 { font-size: 1.1em; margin: 20px 0 6px; border-bottom: 1px solid var(--line); }
.meta, .empty { color: GrayText; font-size: .9em; }
code, .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: .92em; overflow-wrap: anywhere; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(300px, 1fr)); gap: 8px; }
.card { border: 1px solid var(--line); border-radius: 6px; padding: 8px 10px; }
.card dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 10px; margin: 6px 0 0; }
.card dt { font-weight: 600; }
.card dd { margin: 0; overflow-wrap: anywhere; }
.tag { display: inline-block; font-weight: 700; letter-spacing: .04em; border: 1.5px solid currentColor; border-radius: 4px; padding: 0 5px; }
.bad { color: var(--warn); }
.good { color: var(--ok); }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
.scroll { overflow-x: auto; }
@media (max-width: 600px) { body { font-size: 16px; padding: 8px; } .cards { grid-template-columns: 1fr; } }
"#;

/// Counts every `[data-expires-at-ms]` element down, once a second.
const COUNTDOWN: &str = r#"
(function () {
  function tick() {
    var now = Date.now();
    document.querySelectorAll("[data-expires-at-ms]").forEach(function (el) {
      var left = (Number(el.getAttribute("data-expires-at-ms")) - now) / 1000;
      el.textContent = left > 0 ? "in " + left.toFixed(1) + " s" : "expired";
    });
  }
  setInterval(tick, 1000);
})();
"#;

/// A whole page: `title`, a line under it, and the sections.
pub fn document(title: &str, subtitle: &str, body: Markup) -> Markup {
    html! {
        (maud::DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta http-equiv="refresh" content=(REFRESH_SECS);
                title { (title) }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header {
                    h1 { (title) }
                    p.meta { (subtitle) " · refreshes every " (REFRESH_SECS) " s · read-only" }
                }
                main { (body) }
                script { (PreEscaped(COUNTDOWN)) }
            }
        }
    }
}

/// A word in a box: the state, readable without colour; `good` picks the
/// colour that repeats it.
pub fn tag(word: &str, good: bool) -> Markup {
    html! { span.tag.(if good { "good" } else { "bad" }) { (word) } }
}

/// Unix milliseconds as UTC, `2026-12-04 03:12:07.250Z`.
pub fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

/// Days since 1970-01-01 as a proleptic Gregorian date (Howard Hinnant's
/// `civil_from_days`).
fn civil(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

/// The time left until `at_ms` from `now_ms`, counted down in the browser
/// when scripts run.
pub fn countdown(at_ms: u64, now_ms: u64) -> Markup {
    let left = at_ms.saturating_sub(now_ms);
    let text = if left == 0 {
        "expired".to_owned()
    } else {
        format!("in {:.1} s", left as f64 / 1000.0)
    };
    html! { span data-expires-at-ms=(at_ms) { (text) } }
}

/// The credentials of an `Authorization: Basic` header: (user, password).
pub fn basic_credentials(headers: &http::HeaderMap) -> Option<(String, String)> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, encoded) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

/// The headers of a page: HTML, never cached, and nothing but its own
/// inline style and script (no frames, no fetches, no referrer).
pub const HEADERS: &[(http::HeaderName, &str)] = &[
    (http::header::CONTENT_TYPE, "text/html; charset=utf-8"),
    (http::header::CACHE_CONTROL, "no-store"),
    (
        http::header::CONTENT_SECURITY_POLICY,
        "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    ),
    (http::header::X_FRAME_OPTIONS, "DENY"),
    (http::header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    (http::header::REFERRER_POLICY, "no-referrer"),
];

/// The `WWW-Authenticate` value that makes a browser ask for credentials.
pub const CHALLENGE: &str = "Basic realm=\"fencegate\", charset=\"UTF-8\"";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_escaped_and_times_read_as_utc() {
        let page = document("t", "s", html! { p { ("<script>alert(1)</script>") } }).into_string();
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(!page.contains("<script>alert(1)"));
        assert_eq!(utc(0), "1970-01-01 00:00:00.000Z");
        assert_eq!(utc(1_796_354_327_250), "2026-12-04 03:18:47.250Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00.000Z");
    }

    #[test]
    fn basic_credentials_are_read_and_other_schemes_are_not() {
        let mut h = http::HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            "Basic YWRtaW46czNjcjN0OjE=".parse().expect("value"),
        );
        assert_eq!(
            basic_credentials(&h),
            Some(("admin".into(), "s3cr3t:1".into()))
        );
        h.insert(
            http::header::AUTHORIZATION,
            "Bearer abc".parse().expect("value"),
        );
        assert_eq!(basic_credentials(&h), None);
    }

    #[test]
    fn a_countdown_shows_what_is_left() {
        let m = countdown(12_500, 10_000).into_string();
        assert!(m.contains("in 2.5 s") && m.contains("data-expires-at-ms=\"12500\""));
        assert!(countdown(1, 2).into_string().contains("expired"));
    }
}
