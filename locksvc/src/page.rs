//! The lease service's status page, `GET /`: every lock the caller's API
//! key may inspect, with its holder, token, expiry (counting down) and
//! the acquires waiting in line. Read-only, behind the API's auth (a
//! browser sends the API key as the Basic password); the frame is
//! `fencegate_page`'s.

use crate::leases::LockStatus;
use fencegate_core::LockName;
use fencegate_page::{Markup, countdown, document, html, tag, utc};

/// Renders the page for `listed` (already filtered to what the caller
/// may see), from a backend of `kind`, which lists at most `limit`.
pub fn render(listed: &[(LockName, LockStatus)], kind: &str, limit: usize) -> Markup {
    let now = crate::clock::now().as_millis();
    let last_token = listed.iter().map(|(_, s)| s.last_token).max();
    let held = listed.iter().filter(|(_, s)| s.lease.is_some()).count();
    let waiting: usize = listed.iter().map(|(_, s)| s.waiting).sum();
    document(
        "fencegate lease service",
        &format!("{kind} backend · rendered {}", utc(now)),
        html! {
            section #locks {
                h2 { "Locks" }
                p.meta {
                    (held) " held, " (waiting) " acquires waiting"
                    @if let Some(t) = last_token { " · last token issued " (t) }
                    @if listed.len() >= limit { " · the first " (limit) " locks by name are shown" }
                }
                @if listed.is_empty() {
                    p.empty { "No lock is held or waited for." }
                } @else {
                    div.cards {
                        @for (lock, s) in listed {
                            article.card.lock data-lock=(lock.as_str()) {
                                div {
                                    @if s.lease.is_some() { (tag("HELD", true)) } @else { (tag("FREE", true)) }
                                    " " strong { (lock.as_str()) }
                                }
                                dl {
                                    @if let Some(l) = &s.lease {
                                        dt { "holder" } dd data-field="owner" { (l.owner) }
                                        dt { "token" } dd data-field="token" { (l.token) }
                                        dt { "expires" } dd data-field="expires" {
                                            (countdown(l.expires_at.as_millis(), now))
                                            span.meta { " (" (utc(l.expires_at.as_millis())) ")" }
                                        }
                                    }
                                    dt { "waiting" } dd data-field="waiting" { (s.waiting) }
                                }
                            }
                        }
                    }
                }
            }
        },
    )
}
