//! What the proxy refuses before anything reads a request body.
//!
//! s3s reads some bodies whole before any handler runs: a browser-form
//! POST upload (up to 5 GiB, to find its signature fields) and the XML
//! bodies of DeleteObjects, CompleteMultipartUpload and CreateBucket.
//! Left alone, one anonymous 1 GiB POST grows the proxy by 1 GiB. So, on
//! the request line and headers alone:
//!
//! - a POST is forwarded only for the operations the proxy serves
//!   (`?delete`, `?uploads`, `?uploadId=`); anything else (a form upload)
//!   is refused with 501 and the connection closed, its body unread;
//! - a body that will be read whole must announce its length: at most
//!   `max_xml_body_bytes` for DeleteObjects and Complete, at most
//!   [`MAX_BUCKET_BODY`] for a PUT to a bucket (CreateBucket's
//!   configuration is a few hundred bytes), which the connection cap
//!   then bounds in all.
//!
//! The bytes of DeleteObjects and Complete bodies held at once are bounded
//! by a budget shared by all requests (`max_buffered_body_bytes`, a
//! [`BodyBudget`]). A request takes its share only once it has shown it
//! may write (`access`: a token the fence admits, or the upload's own
//! client), never from its head: otherwise clients without the lease
//! could announce large bodies, send none, and hold the whole budget
//! while the holder's Complete waits.

use crate::host::VirtualHosts;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use s3s::Body;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The bytes of whole-read bodies the proxy may hold at once.
#[derive(Debug, Clone)]
pub struct BodyBudget {
    available: Arc<Semaphore>,
    max_one: usize,
}

impl BodyBudget {
    pub fn new(total: usize, max_one: usize) -> BodyBudget {
        BodyBudget {
            available: Arc::new(Semaphore::new(total.min(Semaphore::MAX_PERMITS))),
            max_one,
        }
    }

    /// A share of `bytes`, or None when the budget has no room (nothing
    /// waits for room).
    pub fn try_hold(&self, bytes: usize) -> Option<Held> {
        let n = u32::try_from(bytes).ok()?;
        self.available
            .clone()
            .try_acquire_many_owned(n)
            .ok()
            .map(Held)
    }

    /// The largest share one body may take (`max_xml_body_bytes`).
    pub fn max_one(&self) -> usize {
        self.max_one
    }
}

/// A request's share of the budget; released when dropped.
#[derive(Debug)]
pub struct Held(#[allow(dead_code, reason = "held for its drop")] OwnedSemaphorePermit);

/// The largest body a PUT to a bucket (CreateBucket) may have.
pub const MAX_BUCKET_BODY: usize = 4096;

/// What the head of a request that passed says about its body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyRead {
    /// Streamed, or none.
    Streamed,
    /// Read whole before any handler runs (its length announced and
    /// within its bound).
    Whole,
}

/// Refuses `req` on its head alone, or says how its body will be read.
pub fn check<B>(
    req: &Request<B>,
    hosts: &VirtualHosts,
    max_xml_body: usize,
) -> Result<BodyRead, Box<Response<Body>>> {
    // One reading of a body's length for every request (see
    // `strict_length`).
    if strict_length(req.headers()).is_err() {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "InvalidArgument",
            "send one Content-Length, a plain number",
        ));
    }
    let names: Vec<&str> = req
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .map(|p| p.split_once('=').map_or(p, |(n, _)| n))
        .collect();
    let names_any = |wanted: &[&str]| names.iter().any(|n| wanted.contains(n));
    let form = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("multipart/form-data")
        });
    let post_refused = || {
        refuse(
            StatusCode::NOT_IMPLEMENTED,
            "NotImplemented",
            "the fencing proxy does not forward POST object (browser form uploads) or other POST operations; use PUT with a Fencing-Token",
        )
    };
    let max_one = match *req.method() {
        Method::POST => {
            // s3s routes every multipart/form-data POST to a bucket to
            // PostObject, whatever its query, and reads the form first.
            if form || !names_any(&["delete", "uploads", "uploadId"]) {
                return Err(post_refused());
            }
            if names_any(&["uploads"]) {
                // CreateMultipartUpload has no body.
                if has_body(req) {
                    return Err(refuse(
                        StatusCode::BAD_REQUEST,
                        "InvalidRequest",
                        "CreateMultipartUpload takes no request body",
                    ));
                }
                return Ok(BodyRead::Streamed);
            }
            max_xml_body
        }
        // Any PUT to a bucket is CreateBucket or a bucket configuration
        // write (refused by `access` before its body is read).
        Method::PUT if is_bucket_path(req, hosts) => MAX_BUCKET_BODY,
        _ => return Ok(BodyRead::Streamed),
    };
    let length = match strict_length(req.headers()) {
        Ok(n) => n,
        Err(()) => {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                "InvalidArgument",
                "send one Content-Length, a plain number",
            ));
        }
    };
    let chunked = req.headers().contains_key(http::header::TRANSFER_ENCODING);
    let length = match (length, chunked) {
        (Some(n), false) => n,
        (None, false) => 0,
        _ => {
            return Err(refuse(
                StatusCode::LENGTH_REQUIRED,
                "MissingContentLength",
                "this request's XML body must be sent with Content-Length",
            ));
        }
    };
    if length == 0 {
        return Ok(BodyRead::Streamed);
    }
    if usize::try_from(length).map_or(true, |n| n > max_one) {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "MaxMessageLengthExceeded",
            &format!(
                "the XML body is {length} bytes; at most {max_one} are accepted here{}",
                if max_one == max_xml_body {
                    " (max_xml_body_bytes)"
                } else {
                    ""
                }
            ),
        ));
    }
    Ok(BodyRead::Whole)
}

/// The length a request announces, if it announces one in the only form
/// accepted here (see [`strict_length`]).
pub fn announced_length(headers: &http::HeaderMap) -> Option<usize> {
    strict_length(headers)
        .ok()
        .flatten()
        .and_then(|n| usize::try_from(n).ok())
}

/// `Content-Length` as one header of digits only: hyper also takes a
/// comma list of equal values (`8, 8`), which a plain parse reads as no
/// length at all, and s3s as the number. Anything but one plain number
/// is an error, so that no two readers disagree on a body's length.
fn strict_length(headers: &http::HeaderMap) -> Result<Option<u64>, ()> {
    let mut values = headers.get_all(http::header::CONTENT_LENGTH).iter();
    let Some(v) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(());
    }
    let v = v.as_bytes();
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return Err(());
    }
    std::str::from_utf8(v)
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Some)
        .ok_or(())
}

/// Whether `req` announces a body.
fn has_body<B>(req: &Request<B>) -> bool {
    req.headers().contains_key(http::header::TRANSFER_ENCODING)
        || req
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0")
}

/// Whether `req` addresses a bucket rather than an object.
fn is_bucket_path<B>(req: &Request<B>, hosts: &VirtualHosts) -> bool {
    let path = req.uri().path().trim_start_matches('/');
    let virtual_hosted = req
        .headers()
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .is_some_and(|h| hosts.bucket(h).is_some());
    if virtual_hosted {
        path.is_empty()
    } else {
        !path.trim_end_matches('/').contains('/')
    }
}

/// An S3 XML error answered without reading the body; the connection is
/// closed, since the unread body would otherwise be read as the next
/// request.
pub(crate) fn refuse(status: StatusCode, code: &str, message: &str) -> Box<Response<Body>> {
    let xml = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{}</Message></Error>",
        escape(message)
    );
    let mut r = Response::new(Body::from(xml));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/xml"),
    );
    h.insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    Box::new(r)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, uri: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut b = Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).expect("request")
    }

    fn hosts() -> VirtualHosts {
        VirtualHosts::new(&["localhost".to_owned()])
    }

    #[test]
    fn form_posts_are_refused_and_served_posts_pass() {
        let r = check(&req("POST", "/b", &[]), &hosts(), 100).expect_err("form POST");
        assert_eq!(r.status(), StatusCode::NOT_IMPLEMENTED);
        let r = check(&req("POST", "/b/k?restore", &[]), &hosts(), 100).expect_err("restore");
        assert_eq!(r.status(), StatusCode::NOT_IMPLEMENTED);
        assert_eq!(
            check(&req("POST", "/b/k?uploads", &[]), &hosts(), 100).ok(),
            Some(BodyRead::Streamed)
        );
        // A form POST is refused whatever its query (s3s would route it to
        // PostObject and read it whole), and Create takes no body.
        let form = [("content-type", "multipart/form-data; boundary=x")];
        let r = check(&req("POST", "/b?uploads", &form), &hosts(), 100).expect_err("form");
        assert_eq!(r.status(), StatusCode::NOT_IMPLEMENTED);
        let chunked = [("transfer-encoding", "chunked")];
        let r = check(&req("POST", "/b/k?uploads", &chunked), &hosts(), 100)
            .expect_err("a Create with a body");
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            check(
                &req("POST", "/b?delete", &[("content-length", "50")]),
                &hosts(),
                100
            )
            .ok(),
            Some(BodyRead::Whole)
        );
    }

    #[test]
    fn whole_bodies_announce_a_length_within_their_bound() {
        let big = req("POST", "/b?delete", &[("content-length", "101")]);
        assert_eq!(
            check(&big, &hosts(), 100).expect_err("too big").status(),
            StatusCode::BAD_REQUEST
        );
        let chunked = req("POST", "/b?delete", &[("transfer-encoding", "chunked")]);
        assert_eq!(
            check(&chunked, &hosts(), 100)
                .expect_err("no length")
                .status(),
            StatusCode::LENGTH_REQUIRED
        );
        let one = req("POST", "/b/k?uploadId=1", &[("content-length", "100")]);
        assert_eq!(check(&one, &hosts(), 100).ok(), Some(BodyRead::Whole));
        // The head takes nothing: the same head passes any number of times
        // (the budget is taken once the request proved it may write).
        assert_eq!(check(&one, &hosts(), 100).ok(), Some(BodyRead::Whole));
        // CreateBucket's body has its own small bound, whatever the query;
        // an object PUT streams.
        let len = (MAX_BUCKET_BODY + 1).to_string();
        let create = req("PUT", "/b", &[("content-length", &len)]);
        assert!(check(&create, &hosts(), 1 << 20).is_err());
        let create = req("PUT", "/b?x-id=CreateBucket", &[("content-length", &len)]);
        assert!(
            check(&create, &hosts(), 1 << 20).is_err(),
            "a query does not escape the bound"
        );
        let put = req("PUT", "/b/k", &[("content-length", "1000000")]);
        assert_eq!(check(&put, &hosts(), 100).ok(), Some(BodyRead::Streamed));
    }

    #[test]
    fn a_length_is_one_plain_number() {
        for bad in ["8388608, 8388608", "+5", " 5", "0x10", ""] {
            let r = req("POST", "/b?delete", &[("content-length", bad)]);
            assert_eq!(
                check(&r, &hosts(), 100).expect_err(bad).status(),
                StatusCode::BAD_REQUEST,
                "{bad:?}"
            );
        }
        let mut two = req("PUT", "/b/k", &[("content-length", "5")]);
        two.headers_mut()
            .append("content-length", http::HeaderValue::from_static("5"));
        assert!(check(&two, &hosts(), 100).is_err(), "two headers");
    }

    #[test]
    fn the_budget_is_bounded_and_returns() {
        let budget = BodyBudget::new(150, 100);
        let held = budget.try_hold(100).expect("fits");
        assert!(budget.try_hold(100).is_none(), "over budget");
        drop(held);
        assert!(budget.try_hold(100).is_some(), "budget returns");
    }
}
