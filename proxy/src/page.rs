//! The proxy's status page, `/_fencegate/` (HTML for people; the same
//! facts as `/_fencegate/status` and `/_fencegate/events`, which it is
//! rendered from): the recent fence events first (what a zombie tried,
//! against which max, who holds the lock), then each lock's max and
//! holder, the probe's findings per bucket, writes in flight, and the
//! cluster view when replicas share fences.
//!
//! Read-only and behind the proxy's `viewers` (see `access::Viewers` and
//! [`crate::server`]); the frame is `fencegate_page`'s.

use crate::events::{FenceEvent, Kind};
use fencegate_page::{Markup, document, html, tag, utc};
use serde_json::Value;

/// Events shown on the page (the JSON has every kept one).
pub const EVENTS_SHOWN: usize = 100;
/// Locks shown on the page, by name (`/_fencegate/status` has them all).
pub const LOCKS_SHOWN: usize = 500;
/// Configured scopes named on the page, in all and per lock (the viewers'
/// status the page is rendered from carries no more).
pub const SCOPES_SHOWN: usize = 50;
pub const SCOPES_SHOWN_PER_LOCK: usize = 10;

/// Renders the page from the status JSON, the newest events and how many
/// were recorded in all.
pub fn render(status: &Value, events: &[FenceEvent], recorded: u64, kept_max: usize) -> Markup {
    let now = crate::clock::unix_ms();
    let subtitle = format!("rendered {}", utc(now));
    let title = match status["cluster"]["replica"].as_str() {
        Some(r) => format!("fencegate proxy · replica {r}"),
        None => "fencegate proxy".to_owned(),
    };
    document(
        &title,
        &subtitle,
        html! {
            (fence_events(events, recorded, kept_max))
            (locks(status))
            (probes(status))
            (writes(status))
            @if !status["cluster"].is_null() {
                (cluster(&status["cluster"]))
            }
        },
    )
}

fn fence_events(events: &[FenceEvent], recorded: u64, kept_max: usize) -> Markup {
    html! {
        section #events {
            h2 { "Fence events" }
            p.meta {
                (recorded) " refused since start; the newest " (events.len().min(EVENTS_SHOWN))
                " shown, " (kept_max) " of each kind kept (all kept ones: " code { "/_fencegate/events" } ")"
            }
            @if events.is_empty() {
                p.empty { "No write has been refused since the proxy started." }
            } @else {
                div.cards {
                    @for e in events.iter().take(EVENTS_SHOWN) {
                        article.card.event data-kind=(e.kind.as_str()) data-seq=(e.seq) {
                            div {
                                (tag(&e.kind.as_str().to_uppercase(), false)) " "
                                strong { (e.op) } " "
                                span.meta { (utc(e.at_ms)) }
                            }
                            dl {
                                dt { "key" } dd.mono data-field="key" { "s3://" (e.bucket) "/" (e.key) }
                                @if let Some(lock) = &e.lock {
                                    dt { "lock" } dd data-field="lock" { (lock) @if let Some(s) = &e.scope { " (scope " code { (s) } ")" } }
                                }
                                @if let Some(t) = e.token {
                                    dt { "token" } dd data-field="token" { (t) }
                                }
                                @if let Some(m) = e.max {
                                    dt { "max" } dd data-field="max" { (m) }
                                }
                                @if e.kind == Kind::Forged {
                                    dt { "owner" } dd data-field="owner" { "not verified (the token is not genuine)" }
                                } @else {
                                    dt { "owner" } dd data-field="owner" { (e.owner.as_deref().unwrap_or("unknown")) }
                                }
                                @if let Some(h) = &e.holder {
                                    dt { "holder" } dd data-field="holder" { (h) }
                                }
                                dt { "client" } dd.mono data-field="client" { (e.client.as_deref().unwrap_or("anonymous")) }
                                @if let Some(r) = &e.remote {
                                    dt { "from" } dd.mono data-field="remote" { (r) }
                                }
                                dt { "why" } dd data-field="reason" { (e.reason) }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn locks(status: &Value) -> Markup {
    let mut locks = status["locks"].as_array().cloned().unwrap_or_default();
    let total = locks.len();
    locks.sort_by(|a, b| a["lock"].as_str().cmp(&b["lock"].as_str()));
    locks.truncate(LOCKS_SHOWN);
    let no_scopes = Vec::new();
    let scopes = status["configured_scopes"].as_array().unwrap_or(&no_scopes);
    let scopes_total = status["configured_scopes_total"]
        .as_u64()
        .map_or(scopes.len(), |n| usize::try_from(n).unwrap_or(usize::MAX));
    html! {
        section #locks {
            h2 { "Locks" }
            @if total > locks.len() {
                p.meta { "the first " (locks.len()) " of " (total) " locks by name (all: " code { "/_fencegate/status" } ")" }
            }
            @if locks.is_empty() {
                p.empty { "No fenced write has been admitted yet." }
            } @else {
                div.scroll { table {
                    thead { tr { th { "lock" } th { "max token" } th { "holder of the max" } th { "scopes" } } }
                    tbody {
                        @for l in &locks {
                            @let name = l["lock"].as_str().unwrap_or("");
                            tr data-lock=(name) {
                                td { (name) }
                                td data-field="max" { (l["max_token"]) }
                                td { (l["holder"].as_str().unwrap_or("unknown")) }
                                td.mono {
                                    @let mine = l["scopes"].as_array().map(Vec::as_slice).unwrap_or_default();
                                    @let total = l["scopes_total"].as_u64().unwrap_or(0);
                                    @if mine.is_empty() { "bucket " (name) } @else {
                                        @for s in mine { (s.as_str().unwrap_or("")) " " }
                                        @if total > mine.len() as u64 { "and " (total - mine.len() as u64) " more" }
                                    }
                                }
                            }
                        }
                    }
                } }
            }
            @if !scopes.is_empty() {
                p.meta { "Configured scopes: "
                    @for s in scopes.iter().take(SCOPES_SHOWN) {
                        code { (s["scope"].as_str().unwrap_or("")) } " → " (s["lock"].as_str().unwrap_or("")) "; "
                    }
                    @if scopes_total > scopes.len().min(SCOPES_SHOWN) {
                        "and " (scopes_total - scopes.len().min(SCOPES_SHOWN)) " more (all: " code { "/_fencegate/status" } ")"
                    }
                }
            }
        }
    }
}

fn probes(status: &Value) -> Markup {
    let probes = status["probe"].as_array().cloned().unwrap_or_default();
    html! {
        section #probe {
            h2 { "Store probe" }
            @if probes.is_empty() {
                p.empty { "No bucket probed yet (each is probed before its first fenced write)." }
            }
            div.cards {
                @for p in &probes {
                    @let safe = p["safe"].as_bool().unwrap_or(false);
                    article.card data-bucket=(p["report"]["bucket"].as_str().unwrap_or("")) {
                        div { (tag(if safe { "SAFE" } else { "UNSAFE" }, safe)) " bucket " strong { (p["report"]["bucket"].as_str().unwrap_or("")) } }
                        dl {
                            @for c in p["checks"].as_array().into_iter().flatten() {
                                @let enforced = c["enforced"].as_bool().unwrap_or(false);
                                @let store = c["store"].as_str().unwrap_or("");
                                dt { (c["label"].as_str().unwrap_or("")) }
                                dd {
                                    @if enforced { (store) } @else { (tag(store, false)) }
                                    br; small { (c["proxy"].as_str().unwrap_or("")) }
                                }
                            }
                        }
                    }
                }
            }
            @if status["accept_weak_backend"].as_bool() == Some(true) {
                p { (tag("WEAK BACKEND ACCEPTED", false)) " accept_weak_backend is set: only this proxy enforces the fence." }
            }
        }
    }
}

fn writes(status: &Value) -> Markup {
    html! {
        section #writes {
            h2 { "Writes" }
            dl.card {
                dt { "in flight" } dd data-field="inflight" { (status["inflight_writes"]) }
                dt { "keys being written" } dd {
                    @let shown = status["busy_keys"]["shown"].as_array().cloned().unwrap_or_default();
                    @if shown.is_empty() { "none" }
                    @for k in &shown { code { (k.as_str().unwrap_or("")) } br; }
                    @if status["busy_keys"]["total"].as_u64().unwrap_or(0) > shown.len() as u64 {
                        span.meta { "(" (status["busy_keys"]["total"]) " in all)" }
                    }
                }
                dt { "lingering" } dd { (status["lingering_writes"]) " (sent, unanswered in time, held until the store can no longer commit them)" }
                dt { "ETag cache" } dd { (status["etag_cache_entries"]) " keys" }
            }
        }
    }
}

fn cluster(c: &Value) -> Markup {
    let admitting = c["admitting"].as_bool().unwrap_or(false);
    html! {
        section #cluster {
            h2 { "Cluster" }
            p {
                (tag(if admitting { "ADMITTING" } else { "FENCED OFF" }, admitting))
                " replica " strong { (c["replica"].as_str().unwrap_or("")) }
                " (incarnation " code { (c["incarnation"].as_str().unwrap_or("none")) } ")"
                @if let Some(left) = c["standing_ms_left"].as_u64() { " · standing for " (format!("{:.1}", left as f64 / 1000.0)) " s more without etcd" }
                @if let Some(why) = c["why_not"].as_str() { " · " (why) }
            }
            (generic(c, &["replica", "incarnation", "admitting", "standing_ms_left", "why_not"]))
        }
    }
}

/// Everything else of a JSON object: scalars as a list, arrays of objects
/// as tables, so the cluster view shows whatever `status` reports.
fn generic(v: &Value, skip: &[&str]) -> Markup {
    let Some(o) = v.as_object() else {
        return html! { code { (v) } };
    };
    html! {
        dl.card {
            @for (k, v) in o.iter().filter(|(k, _)| !skip.contains(&k.as_str())) {
                dt { (k) }
                dd {
                    @match v {
                        Value::Array(items) if items.iter().all(Value::is_object) && !items.is_empty() => {
                            @let cols: Vec<String> = items[0].as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default();
                            div.scroll { table {
                                thead { tr { @for c in &cols { th { (c) } } } }
                                tbody { @for i in items { tr { @for c in &cols { td.mono { (scalar(&i[c])) } } } } }
                            } }
                        }
                        Value::Object(_) => (generic(v, &[])),
                        _ => span.mono { (scalar(v)) },
                    }
                }
            }
        }
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::Null => "—".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
