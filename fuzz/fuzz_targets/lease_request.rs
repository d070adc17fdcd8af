//! The lease service's request decoding (`api::decode_request`, the serde
//! structs and checks the acquire/renew/release handlers use) on arbitrary
//! bytes: never panics, errors are `Err` with an API error code, and what
//! decodes re-encodes to a body that decodes the same.
#![no_main]

use fencegate_locksvc::api::{DecodedRequest, MAX_OWNER_LEN, RequestKind, decode_request};
use libfuzzer_sys::fuzz_target;
use fencegate_core::FencingToken;
use serde_json::{Value, json};

/// The token as a client would send it back: the number, or the string.
fn token_json(t: &FencingToken) -> Value {
    match t {
        FencingToken::Plain(n) => json!(n),
        FencingToken::Signed(s) => json!(s.to_string()),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let kind = match selector % 3 {
        0 => RequestKind::Acquire,
        1 => RequestKind::Renew,
        _ => RequestKind::Release,
    };
    let decoded = match decode_request(kind, body) {
        Ok(d) => d,
        Err(e) => {
            assert!(
                e.starts_with("InvalidRequest: ")
                    || e.starts_with("InvalidOwner: ")
                    || e.starts_with("InvalidIdempotencyKey: "),
                "{e}"
            );
            return;
        }
    };
    let again = match &decoded {
        DecodedRequest::Acquire {
            owner,
            ttl_ms,
            wait_ms,
            idempotency_key,
        } => {
            assert_eq!(kind, RequestKind::Acquire);
            assert!(!owner.is_empty() && owner.len() <= MAX_OWNER_LEN);
            assert!(!owner.chars().any(char::is_control));
            if let Some(k) = idempotency_key {
                assert!((16..=256).contains(&k.len()) && !k.chars().any(char::is_control));
            }
            json!({ "owner": owner, "ttl_ms": ttl_ms, "wait_ms": wait_ms, "idempotency_key": idempotency_key })
        }
        DecodedRequest::Renew { token, ttl_ms } => {
            assert_eq!(kind, RequestKind::Renew);
            json!({ "token": token_json(token), "ttl_ms": ttl_ms })
        }
        DecodedRequest::Release { token } => {
            assert_eq!(kind, RequestKind::Release);
            json!({ "token": token_json(token) })
        }
    };
    let bytes = serde_json::to_vec(&again).expect("a JSON value serializes");
    assert_eq!(decode_request(kind, &bytes), Ok(decoded));
});
