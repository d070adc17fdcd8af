//! The proxy's own request type for a PutObject, the common fenced write.
//!
//! A PutObject comes in by one of two doors: the edge (a plain signed
//! request, verified without s3s) or s3s. Either way it becomes one
//! [`PutRequest`], parsed once: the fields the fence and the [`Writer`]
//! read, the headers, the body, and the [`Route`] it takes to the store.
//! Nothing after the door reads s3s's typed input, except the SDK route,
//! which needs it whole and keeps it boxed.
//!
//! The route is decided once, at the door: the lean forwarder sends a
//! request as it came, so it may take only a request whose body is sent as
//! is, with a known length and text headers. [`Route::Lean`] holds an
//! [`AsIs`], which only [`AsIs::check`] makes, from a length and headers;
//! both doors check the very headers and length they put in the request
//! (`PutRequest::from_s3s`, `edge::Verified::into_request`), and nothing
//! after the door changes them.
//!
//! [`Writer`]: crate::gate::Writer

use http::HeaderMap;
use s3s::S3Request;
use s3s::dto::{ETagCondition, PutObjectInput, StreamingBlob};

/// A PutObject on its way to the store.
#[derive(Debug)]
pub struct PutRequest {
    pub bucket: String,
    pub key: String,
    /// `Content-Length`, if the request declared it.
    pub content_length: Option<i64>,
    /// The client's own conditions, checked against what the store holds.
    pub if_match: Option<ETagCondition>,
    pub if_none_match: Option<ETagCondition>,
    /// As the client sent them (query checksums moved in): the token, the
    /// integrity values, and on the lean route the object's headers.
    pub headers: HeaderMap,
    /// The access key it was signed with; `None`: anonymous.
    pub access_key: Option<String>,
    pub body: Option<StreamingBlob>,
    pub route: Route,
}

/// How a PutObject goes to the store.
#[derive(Debug)]
pub enum Route {
    /// By the lean forwarder, as it came (`crate::lean`).
    Lean(AsIs),
    /// By the SDK, from s3s's typed input. Its body and conditions were
    /// moved into the [`PutRequest`]; the `Writer` puts back what it sends.
    Sdk(Box<S3Request<PutObjectInput>>),
}

/// Proof that a request can be sent as it came: a known length, nothing
/// `aws-chunked`, no trailer, every forwarded header text
/// (`lean::eligible_headers`), and a lean forwarder to send it.
#[derive(Debug, Clone, Copy)]
pub struct AsIs(());

impl AsIs {
    /// Whether a PutObject with this length and these headers can be sent
    /// as it came, where `forwarder` says the proxy has a lean forwarder.
    pub fn check(
        forwarder: bool,
        content_length: Option<i64>,
        headers: &HeaderMap,
    ) -> Option<AsIs> {
        (forwarder && content_length.is_some() && crate::lean::eligible_headers(headers))
            .then_some(AsIs(()))
    }
}

impl PutRequest {
    /// A PutObject s3s parsed. `forwarder`: whether the proxy has a lean
    /// forwarder. Checksums sent in the query move into the headers first,
    /// where the integrity check and the forwarder read them.
    pub fn from_s3s(mut req: S3Request<PutObjectInput>, forwarder: bool) -> PutRequest {
        crate::trailer::hoist_query_checksums(&req.uri, &mut req.headers);
        let input = &mut req.input;
        let content_length = input.content_length;
        let (if_match, if_none_match) = (input.if_match.take(), input.if_none_match.take());
        let body = input.body.take();
        let access_key = req.credentials.as_ref().map(|c| c.access_key.clone());
        // The SDK route sends the typed input only, never these.
        let headers = std::mem::take(&mut req.headers);
        let (bucket, key, route) = match AsIs::check(forwarder, content_length, &headers) {
            // The typed input is dropped: its names move over.
            Some(as_is) => (
                std::mem::take(&mut req.input.bucket),
                std::mem::take(&mut req.input.key),
                Route::Lean(as_is),
            ),
            None => (
                req.input.bucket.clone(),
                req.input.key.clone(),
                Route::Sdk(Box::new(req)),
            ),
        };
        PutRequest {
            bucket,
            key,
            content_length,
            if_match,
            if_none_match,
            headers,
            access_key,
            body,
            route,
        }
    }

    /// Whether it goes by the lean forwarder.
    pub fn is_lean(&self) -> bool {
        matches!(self.route, Route::Lean(_))
    }

    /// Whether it was sent without credentials.
    pub fn anonymous(&self) -> bool {
        self.access_key.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(headers: &[(&str, &str)], length: Option<i64>) -> S3Request<PutObjectInput> {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                v.parse().expect("value"),
            );
        }
        S3Request {
            input: PutObjectInput {
                bucket: "b".into(),
                key: "k".into(),
                content_length: length,
                if_none_match: Some(ETagCondition::Any),
                ..Default::default()
            },
            method: http::Method::PUT,
            uri: "/b/k?x-amz-checksum-crc32=AAAAAA%3D%3D"
                .parse()
                .expect("uri"),
            headers: h,
            extensions: http::Extensions::new(),
            credentials: None,
            region: None,
            service: None,
            trailing_headers: None,
        }
    }

    #[test]
    fn the_route_is_decided_once_from_the_request() {
        let plain = PutRequest::from_s3s(put(&[], Some(3)), true);
        assert!(plain.is_lean());
        assert!(plain.anonymous());
        assert_eq!(plain.if_none_match, Some(ETagCondition::Any));
        assert_eq!(
            plain
                .headers
                .get("x-amz-checksum-crc32")
                .map(|v| v.as_bytes()),
            Some(&b"AAAAAA=="[..]),
            "the query checksum moved into the headers"
        );
        for (headers, length, forwarder) in [
            (&[("content-encoding", "aws-chunked")][..], Some(3), true),
            (
                &[("x-amz-trailer", "x-amz-checksum-crc32")][..],
                Some(3),
                true,
            ),
            (&[][..], None, true),
            (&[][..], Some(3), false),
        ] {
            let r = PutRequest::from_s3s(put(headers, length), forwarder);
            let Route::Sdk(rest) = &r.route else {
                panic!("{headers:?} {length:?} {forwarder} must go by the SDK");
            };
            assert!(
                rest.input.if_none_match.is_none() && rest.input.body.is_none(),
                "the conditions and the body live in the PutRequest, once"
            );
            assert_eq!(r.if_none_match, Some(ETagCondition::Any));
        }
    }
}
