//! The lease service's HTTP JSON API on the wire: its paths, typed request
//! bodies, answers and errors. The service decodes and encodes exactly
//! these types, and every client (the `fencegate` CLI, the proxy's check of
//! plain tokens, the bench, the tests) builds its requests from them and
//! reads its answers into them, so the two ends cannot drift apart.
//!
//! | method | path ([`path`])              | body                     | answer                 |
//! |--------|------------------------------|--------------------------|------------------------|
//! | POST   | `/v1/locks/{lock}/acquire`   | [`AcquireRequest`]       | [`LeaseResponse`]      |
//! | POST   | `/v1/locks/{lock}/renew`     | [`RenewRequest`]         | [`LeaseResponse`]      |
//! | POST   | `/v1/locks/{lock}/release`   | [`ReleaseRequest`]       | [`ReleaseResponse`]    |
//! | GET    | `/v1/locks/{lock}`           |                          | [`LockStatusResponse`] |
//! | GET    | `/health`                    |                          | `{"status": "ok"}`     |
//!
//! Every refusal is an [`ErrorResponse`]: `{"error": {"code", "message",
//! ...}}`, its [`ErrorCode`] knowing its HTTP status.
//!
//! [`Client`] is the one client of the API: the CLI, the proxy's check of
//! plain tokens, the bench and the tests' async code all call it.

pub mod client;
mod wire;

pub use client::{Client, ClientError, Urls, UrlsError};
pub use wire::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_body_reads_back_as_written_and_omits_what_it_lacks() {
        let mut e = ErrorBody::new(ErrorCode::LockHeld, "held");
        e.holder = Some("A".into());
        e.expires_at_ms = Some(5);
        let text = serde_json::to_string(&ErrorResponse { error: e.clone() }).expect("encodes");
        assert_eq!(
            text,
            r#"{"error":{"code":"LockHeld","message":"held","holder":"A","expires_at_ms":5}}"#
        );
        let back: ErrorResponse = serde_json::from_str(&text).expect("decodes");
        assert_eq!(back.error, e);
        assert_eq!(back.error.code.status(), 409);
    }

    #[test]
    fn every_code_is_spelled_on_the_wire_as_its_name_and_is_a_refusal() {
        let mut names: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ErrorCode::ALL.len(), "codes are distinct");
        for code in ErrorCode::ALL {
            assert!((400..600).contains(&code.status()), "{}", code.as_str());
            let json = serde_json::to_string(&code).expect("encodes");
            assert_eq!(json, format!("\"{}\"", code.as_str()));
        }
    }

    #[test]
    fn a_renewal_carries_the_signed_token_as_a_string_and_a_plain_number_decodes_for_refusal() {
        let r: RenewRequest = serde_json::from_str(r#"{"token": 7}"#).expect("decodes");
        assert_eq!(r.token, FencingToken::Plain(7));
        let text = serde_json::to_string(&RenewRequest {
            token: FencingToken::Plain(7),
            ttl_ms: Some(10),
        })
        .expect("encodes");
        assert_eq!(text, r#"{"token":7,"ttl_ms":10}"#);
    }
}
