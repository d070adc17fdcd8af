//! What the proxy refuses before anything reads a request body.
//!
//! s3s reads some bodies whole before any handler (or even the access
//! check) runs: a browser-form POST upload (up to 5 GiB, to find its
//! signature fields) and the XML bodies of DeleteObjects,
//! CompleteMultipartUpload and CreateBucket. Left alone, one anonymous
//! 1 GiB POST grows the proxy by 1 GiB. So, on the request line and
//! headers alone:
//!
//! - a POST is forwarded only for the operations the proxy serves
//!   (`?delete`, `?uploads`, `?uploadId=`); anything else (a form upload)
//!   is refused with 501 and the connection closed, its body unread;
//! - a body that will be read whole must announce its length, at most
//!   `max_xml_body_bytes`, and fit in a budget shared by all requests
//!   (`max_buffered_body_bytes`); a request that does not fit is answered
//!   503 SlowDown (retryable) at once, its body unread. Its share of the
//!   budget is held until its answer is ready.

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

    /// A share of `bytes` for a body the proxy chooses to hold (it has a
    /// way on without: nothing waits), or None when the budget has no room.
    pub fn try_hold(&self, bytes: usize) -> Option<Held> {
        let n = u32::try_from(bytes).ok()?;
        self.available
            .clone()
            .try_acquire_many_owned(n)
            .ok()
            .map(|p| Held(Some(p)))
    }
}

/// A request's share of the budget; released when dropped.
#[derive(Debug)]
pub struct Held(Option<OwnedSemaphorePermit>);

impl Held {
    /// Whether the request's body is read whole under the budget.
    pub fn is_budgeted(&self) -> bool {
        self.0.is_some()
    }
}

/// Refuses `req` on its head alone, or lets it pass with its share of the
/// body budget.
pub fn check<B>(
    req: &Request<B>,
    hosts: &VirtualHosts,
    budget: &BodyBudget,
) -> Result<Held, Box<Response<Body>>> {
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
    let whole_body = match *req.method() {
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
                false
            } else {
                true
            }
        }
        // Any PUT to a bucket is CreateBucket or a bucket configuration
        // write (refused later, after s3s read its body): count it.
        Method::PUT => is_bucket_path(req, hosts),
        _ => false,
    };
    if !whole_body {
        return Ok(Held(None));
    }
    let length = req
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
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
        return Ok(Held(None));
    }
    let Some(n) = usize::try_from(length)
        .ok()
        .filter(|n| *n <= budget.max_one)
    else {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "MaxMessageLengthExceeded",
            &format!(
                "the XML body is {length} bytes; at most {} are accepted (max_xml_body_bytes)",
                budget.max_one
            ),
        ));
    };
    let permits = u32::try_from(n).unwrap_or(u32::MAX);
    match budget.available.clone().try_acquire_many_owned(permits) {
        Ok(p) => Ok(Held(Some(p))),
        Err(_) => Err(refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "SlowDown",
            "too many large XML request bodies at once (max_buffered_body_bytes); retry",
        )),
    }
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
fn refuse(status: StatusCode, code: &str, message: &str) -> Box<Response<Body>> {
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
        let budget = BodyBudget::new(1000, 100);
        let r = check(&req("POST", "/b", &[]), &hosts(), &budget).expect_err("form POST");
        assert_eq!(r.status(), StatusCode::NOT_IMPLEMENTED);
        let r = check(&req("POST", "/b/k?restore", &[]), &hosts(), &budget).expect_err("restore");
        assert_eq!(r.status(), StatusCode::NOT_IMPLEMENTED);
        assert!(check(&req("POST", "/b/k?uploads", &[]), &hosts(), &budget).is_ok());
        // A form POST is refused whatever its query (s3s would route it to
        // PostObject and read it whole), and Create takes no body.
        let form = [("content-type", "multipart/form-data; boundary=x")];
        let r = check(&req("POST", "/b?uploads", &form), &hosts(), &budget).expect_err("form");
        assert_eq!(r.status(), StatusCode::NOT_IMPLEMENTED);
        let chunked = [("transfer-encoding", "chunked")];
        let r = check(&req("POST", "/b/k?uploads", &chunked), &hosts(), &budget)
            .expect_err("a Create with a body");
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        assert!(
            check(
                &req("POST", "/b?delete", &[("content-length", "50")]),
                &hosts(),
                &budget
            )
            .is_ok()
        );
    }

    #[test]
    fn whole_bodies_are_bounded_one_by_one_and_together() {
        let budget = BodyBudget::new(150, 100);
        let big = req("POST", "/b?delete", &[("content-length", "101")]);
        assert_eq!(
            check(&big, &hosts(), &budget)
                .expect_err("too big")
                .status(),
            StatusCode::BAD_REQUEST
        );
        let chunked = req("POST", "/b?delete", &[("transfer-encoding", "chunked")]);
        assert_eq!(
            check(&chunked, &hosts(), &budget)
                .expect_err("no length")
                .status(),
            StatusCode::LENGTH_REQUIRED
        );
        let one = req("POST", "/b/k?uploadId=1", &[("content-length", "100")]);
        let held = check(&one, &hosts(), &budget).expect("fits");
        assert_eq!(
            check(&one, &hosts(), &budget)
                .expect_err("over budget")
                .status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        drop(held);
        assert!(check(&one, &hosts(), &budget).is_ok(), "budget returns");
        // CreateBucket's body counts; an object PUT streams and does not.
        let create = req("PUT", "/b", &[("content-length", "101")]);
        assert!(check(&create, &hosts(), &budget).is_err());
        let create = req("PUT", "/b?x-id=CreateBucket", &[("content-length", "101")]);
        assert!(
            check(&create, &hosts(), &budget).is_err(),
            "a query does not escape the budget"
        );
        let put = req("PUT", "/b/k", &[("content-length", "1000000")]);
        assert!(check(&put, &hosts(), &budget).is_ok());
    }
}
