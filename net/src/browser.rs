//! The rules that keep web pages out of fencegate's services (the lease
//! service's API and page, the proxy's pages and anonymous requests).
//!
//! A page the operator opens can make the browser send requests to a
//! service on the operator's machine or network, and with DNS rebinding
//! (the page's own name made to resolve to the service) it can also read
//! the answers. Browsers always say where a request comes from, so two
//! rules keep them out:
//!
//! - **Host.** A rebound page's requests carry the page's own name in
//!   `Host` (`attacker.example`). A service answers only to names it
//!   knows ([`AllowedHosts`]): IP literals (no DNS, so nothing to rebind),
//!   `localhost` and `*.localhost` (browsers resolve them to loopback
//!   themselves), and the names configured; `"*"` turns the check off.
//!   The port is not compared (a rebound page must use the service's port
//!   anyway, and port mappings change it). A request without `Host`
//!   (HTTP/1.0) is not a browser's and passes; every `Host` and the
//!   authority of an absolute request target are checked ([`check_host`]).
//! - **Shape.** On a JSON API, a request with an `Origin` header is
//!   refused: browsers send it with every cross-origin request and every
//!   POST, and no client of the API does. A request with a body must
//!   declare it `application/json` ([`check_shape`]): the only bodies a
//!   page can send without asking the service first (CORS) are
//!   `text/plain`, form data and untyped.

use http::{HeaderMap, Method, Uri, header};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Longest host or header value a refusal repeats.
const SHOWN: usize = 200;

/// The names the service answers to.
#[derive(Debug, Clone, Default)]
pub struct AllowedHosts {
    /// `"*"` was configured: every host.
    any: bool,
    /// Exact names, lower case, without a trailing dot.
    names: Vec<String>,
    /// `*.suffix` entries, as `.suffix`.
    suffixes: Vec<String>,
}

impl AllowedHosts {
    /// The built-in names plus `entries` (the `allowed_hosts` setting);
    /// fails with the first problem ([`entry_problem`] names them all at
    /// start).
    pub fn new(entries: &[String]) -> Result<AllowedHosts, String> {
        let mut hosts = AllowedHosts::default();
        for entry in entries {
            if let Some(why) = entry_problem(entry) {
                return Err(format!("allowed_hosts entry {entry:?}: {why}"));
            }
            let entry = entry.trim();
            if entry == "*" {
                hosts.any = true;
                continue;
            }
            let entry = normalize(entry);
            if let Some(suffix) = entry.strip_prefix('*') {
                hosts.suffixes.push(suffix.to_owned());
            } else {
                hosts.names.push(entry);
            }
        }
        Ok(hosts)
    }

    /// Whether the service answers to `host` (a `Host` value or an
    /// authority: the port, if any, is ignored).
    pub fn allows(&self, host: &str) -> bool {
        if self.any {
            return true;
        }
        let Some(host) = host_part(host) else {
            return false;
        };
        if is_ip_literal(&host) || host == "localhost" || host.ends_with(".localhost") {
            return true;
        }
        self.names.contains(&host)
            || self
                .suffixes
                .iter()
                .any(|s| host.ends_with(s.as_str()) && host.len() > s.len())
    }
}

/// Lower case, one trailing dot removed.
fn normalize(name: &str) -> String {
    let lower = name.trim().to_ascii_lowercase();
    match lower.strip_suffix('.') {
        Some(stripped) if !stripped.is_empty() => stripped.to_owned(),
        _ => lower,
    }
}

/// The host of a `Host` value (`name`, `name:port`, `1.2.3.4:port`,
/// `[::1]:port`), normalized; `None` if it is not one.
fn host_part(value: &str) -> Option<String> {
    let value = value.trim();
    if let Some(rest) = value.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        let port_ok = after.is_empty() || after.strip_prefix(':').is_some_and(is_port);
        return (port_ok && inside.parse::<Ipv6Addr>().is_ok())
            .then(|| format!("[{}]", inside.to_ascii_lowercase()));
    }
    let host = match value.rsplit_once(':') {
        Some((host, port)) if is_port(port) => host,
        Some(_) => return None,
        None => value,
    };
    let host = normalize(host);
    is_name(&host).then_some(host)
}

fn is_port(s: &str) -> bool {
    !s.is_empty() && s.len() <= 5 && s.bytes().all(|b| b.is_ascii_digit())
}

/// `1.2.3.4` or `[v6]`: an address no DNS answer stands behind.
fn is_ip_literal(host: &str) -> bool {
    host.parse::<Ipv4Addr>().is_ok()
        || host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .is_some_and(|h| h.parse::<Ipv6Addr>().is_ok())
}

/// A DNS name: dot-separated labels of letters, digits, `-` and `_`.
fn is_name(host: &str) -> bool {
    host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// What is wrong with one `allowed_hosts` entry, if anything.
pub fn entry_problem(entry: &str) -> Option<String> {
    let e = entry.trim();
    if e == "*" {
        return None;
    }
    if e.is_empty() {
        return Some("empty: name a host, or \"*\" for every host".into());
    }
    if e.contains("://") || e.contains('/') {
        return Some("a host name, not a URL: write only the name (\"locks.internal\")".into());
    }
    if e.parse::<IpAddr>().is_ok() || is_ip_literal(e) {
        // Allowed anyway; accepted so that a list may name them.
        return None;
    }
    if e.contains(':') {
        return Some("ports are not compared: write the name without one".into());
    }
    let e = normalize(e);
    let name = e.strip_prefix("*.").unwrap_or(&e);
    if !is_name(name) {
        return Some(
            "not a host name: letters, digits, '-', '_' and dots, or \"*.\" before a domain for its subdomains"
                .into(),
        );
    }
    None
}

/// Why a request was refused before it reached a handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// `Host` (or the request target's authority) names a host the service
    /// does not answer to: `host`, cut to [`SHOWN`] characters.
    Host { host: String },
    /// More than one `Host` header, or one that is not text.
    AmbiguousHost,
    /// The request carries `Origin`: a web page sent it.
    Origin { origin: String },
    /// A body not declared `application/json`: the type it had, if any.
    ContentType { found: Option<String> },
}

impl Refusal {
    /// The reason label of the refusal metric.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Host { .. } | Refusal::AmbiguousHost => "host_not_allowed",
            Refusal::Origin { .. } => "browser_origin",
            Refusal::ContentType { .. } => "content_type",
        }
    }
}

fn shown(s: &str) -> String {
    s.chars().take(SHOWN).collect()
}

/// The Host rule (see the module documentation).
pub fn check_host(headers: &HeaderMap, uri: &Uri, hosts: &AllowedHosts) -> Result<(), Refusal> {
    let mut values = headers.get_all(header::HOST).iter();
    let host = values.next();
    if values.next().is_some() {
        return Err(Refusal::AmbiguousHost);
    }
    if let Some(value) = host {
        let value = value.to_str().map_err(|_| Refusal::AmbiguousHost)?;
        if !hosts.allows(value) {
            return Err(Refusal::Host { host: shown(value) });
        }
    }
    if let Some(authority) = uri.authority()
        && !hosts.allows(authority.host())
    {
        return Err(Refusal::Host {
            host: shown(authority.host()),
        });
    }
    Ok(())
}

/// The shape rule of the JSON API: no `Origin`, and a body only as JSON.
/// `empty_body`: the request is known to carry no body.
pub fn check_shape(method: &Method, headers: &HeaderMap, empty_body: bool) -> Result<(), Refusal> {
    if let Some(origin) = headers.get(header::ORIGIN) {
        return Err(Refusal::Origin {
            origin: shown(&String::from_utf8_lossy(origin.as_bytes())),
        });
    }
    if matches!(*method, Method::GET | Method::HEAD) {
        return Ok(());
    }
    let mut types = headers.get_all(header::CONTENT_TYPE).iter();
    match (types.next(), types.next()) {
        (None, _) if empty_body => Ok(()),
        (Some(t), None) if is_json(t.as_bytes()) => Ok(()),
        (found, _) => Err(Refusal::ContentType {
            found: found.map(|t| shown(&String::from_utf8_lossy(t.as_bytes()))),
        }),
    }
}

/// `application/json`, in any case, with or without parameters.
fn is_json(value: &[u8]) -> bool {
    let Ok(value) = std::str::from_utf8(value) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("application/json")
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn hosts(entries: &[&str]) -> AllowedHosts {
        AllowedHosts::new(&entries.iter().map(|e| (*e).to_owned()).collect::<Vec<_>>())
            .expect("valid entries")
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(*name, HeaderValue::from_str(value).expect("header value"));
        }
        h
    }

    #[test]
    fn by_default_ip_literals_and_localhost_only_any_port_any_case() {
        let h = AllowedHosts::default();
        for ok in [
            "127.0.0.1",
            "127.0.0.1:7070",
            "10.1.2.3:7070",
            "[::1]",
            "[::1]:7070",
            "[2001:DB8::1]:1",
            "localhost",
            "LocalHost:7070",
            "localhost.",
            "locks.localhost:7070",
        ] {
            assert!(h.allows(ok), "{ok} must be allowed");
        }
        for refused in [
            "attacker.example",
            "attacker.example:7070",
            "127.0.0.1.nip.io",
            "localhost.attacker.example",
            "notlocalhost",
            "locksvc:7070",
            "2130706433",
            "::1",
            "[::1",
            "127.0.0.1:port",
            "a b",
            "",
        ] {
            assert!(!h.allows(refused), "{refused:?} must be refused");
        }
    }

    #[test]
    fn configured_names_and_subdomains_extend_the_list_and_star_allows_any() {
        let h = hosts(&["Locks.Internal.", "*.svc.cluster.local", "locksvc"]);
        for ok in [
            "locks.internal",
            "LOCKS.INTERNAL:7070",
            "locks.internal.",
            "locksvc:7070",
            "locksvc.ns.svc.cluster.local:7070",
        ] {
            assert!(h.allows(ok), "{ok}");
        }
        for refused in ["svc.cluster.local", "x.locks.internal", "attacker.example"] {
            assert!(!h.allows(refused), "{refused}");
        }
        assert!(hosts(&["*"]).allows("attacker.example"));
    }

    #[test]
    fn bad_entries_say_what_to_write() {
        for (entry, needle) in [
            ("", "empty"),
            ("http://locks.internal", "not a URL"),
            ("locks.internal:7070", "without one"),
            ("locks internal", "not a host name"),
            ("*.", "not a host name"),
            ("a.*.b", "not a host name"),
        ] {
            let why = entry_problem(entry).unwrap_or_else(|| panic!("{entry:?} accepted"));
            assert!(why.contains(needle), "{entry:?}: {why}");
        }
        for ok in [
            "*",
            "locks.internal",
            "*.example.com",
            "10.0.0.5",
            "::1",
            "[::1]",
            "LOCKSVC",
        ] {
            assert_eq!(entry_problem(ok), None, "{ok}");
        }
        assert!(AllowedHosts::new(&["http://x".to_owned()]).is_err());
    }

    #[test]
    fn every_host_header_and_the_target_authority_are_checked() {
        let h = AllowedHosts::default();
        let origin_form: Uri = "/v1/locks/a/acquire".parse().expect("uri");
        assert_eq!(
            check_host(&headers(&[("host", "127.0.0.1:7070")]), &origin_form, &h),
            Ok(())
        );
        // HTTP/1.0 without Host: not a browser.
        assert_eq!(check_host(&HeaderMap::new(), &origin_form, &h), Ok(()));
        assert_eq!(
            check_host(&headers(&[("host", "attacker.example")]), &origin_form, &h),
            Err(Refusal::Host {
                host: "attacker.example".into()
            })
        );
        assert_eq!(
            check_host(
                &headers(&[("host", "127.0.0.1"), ("host", "attacker.example")]),
                &origin_form,
                &h
            ),
            Err(Refusal::AmbiguousHost)
        );
        let absolute: Uri = "http://attacker.example/v1/locks/a/acquire"
            .parse()
            .expect("uri");
        assert_eq!(
            check_host(&headers(&[("host", "127.0.0.1")]), &absolute, &h),
            Err(Refusal::Host {
                host: "attacker.example".into()
            })
        );
        let long = format!("{}.example", "a".repeat(1000));
        match check_host(&headers(&[("host", &long)]), &origin_form, &h) {
            Err(Refusal::Host { host }) => assert_eq!(host.len(), SHOWN),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_api_refuses_origin_and_bodies_not_declared_json() {
        let post = Method::POST;
        let json = [("content-type", "application/json")];
        assert_eq!(check_shape(&post, &headers(&json), false), Ok(()));
        for ok in [
            "application/json; charset=utf-8",
            "Application/JSON ;charset=UTF-8",
        ] {
            assert_eq!(
                check_shape(&post, &headers(&[("content-type", ok)]), false),
                Ok(()),
                "{ok}"
            );
        }
        // No body, no type: the handler says which body is missing.
        assert_eq!(check_shape(&post, &HeaderMap::new(), true), Ok(()));
        assert_eq!(check_shape(&Method::GET, &HeaderMap::new(), false), Ok(()));
        for found in [
            "text/plain",
            "text/plain;charset=UTF-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonx",
            "application/json-patch+json",
        ] {
            assert_eq!(
                check_shape(&post, &headers(&[("content-type", found)]), false),
                Err(Refusal::ContentType {
                    found: Some(found.into())
                }),
                "{found}"
            );
        }
        // An untyped body (a page's Blob), and a typed empty one.
        assert_eq!(
            check_shape(&post, &HeaderMap::new(), false),
            Err(Refusal::ContentType { found: None })
        );
        assert!(check_shape(&post, &headers(&[("content-type", "text/plain")]), true).is_err());
        assert!(
            check_shape(
                &post,
                &headers(&[
                    ("content-type", "application/json"),
                    ("content-type", "text/plain")
                ]),
                false
            )
            .is_err()
        );
        // Origin, whatever else the request is: JSON, a GET, "null".
        for (method, origin) in [
            (Method::POST, "http://attacker.example"),
            (Method::GET, "http://127.0.0.1:7070"),
            (Method::POST, "null"),
        ] {
            let mut h = headers(&json);
            h.insert("origin", HeaderValue::from_str(origin).expect("value"));
            assert_eq!(
                check_shape(&method, &h, false),
                Err(Refusal::Origin {
                    origin: origin.into()
                }),
                "{method} {origin}"
            );
        }
    }
}
