//! The API's paths, requests, answers and errors as they go on the wire.

use fencegate_core::FencingToken;
use serde::{Deserialize, Serialize};

/// The paths of the API.
pub mod path {
    pub fn acquire(lock: &str) -> String {
        format!("/v1/locks/{lock}/acquire")
    }

    pub fn renew(lock: &str) -> String {
        format!("/v1/locks/{lock}/renew")
    }

    pub fn release(lock: &str) -> String {
        format!("/v1/locks/{lock}/release")
    }

    pub fn status(lock: &str) -> String {
        format!("/v1/locks/{lock}")
    }

    pub const HEALTH: &str = "/health";
    pub const METRICS: &str = "/metrics";
}

/// The body of `POST /v1/locks/{lock}/acquire`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcquireRequest {
    /// Who is taking the lease (shown to others in status and refusals).
    pub owner: String,
    /// Lease TTL; the service's `default_ttl` if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// Wait in line up to this long if the lock is held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// A secret of the client's choosing (16 to 256 bytes): a retry of this
    /// acquire with the same owner and key gets the same lease back while it
    /// is live. Without it, an acquire never gets a live lease back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

impl std::fmt::Debug for AcquireRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The idempotency key is a secret: never print it.
        f.debug_struct("AcquireRequest")
            .field("owner", &self.owner)
            .field("ttl_ms", &self.ttl_ms)
            .field("wait_ms", &self.wait_ms)
            .field(
                "idempotency_key",
                &self.idempotency_key.as_ref().map(|_| ".."),
            )
            .finish()
    }
}

/// The body of `POST /v1/locks/{lock}/renew`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenewRequest {
    /// The signed `fencing_token` the acquire returned. (A plain number is
    /// decoded, so the handler can refuse it with a precise error.)
    #[serde(with = "token_field")]
    pub token: FencingToken,
    /// The lease then expires `ttl_ms` from now, shorter or longer than
    /// before; the service's `default_ttl` if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
}

/// The body of `POST /v1/locks/{lock}/release`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    /// The signed `fencing_token` the acquire returned.
    #[serde(with = "token_field")]
    pub token: FencingToken,
}

/// The `token` of renew and release on the wire: a string (the signed
/// `fencing_token`, or a number written as a string) or a JSON number. Both
/// plain forms decode, so that the handler, not serde, refuses them with
/// `SignedTokenRequired` and says what to send instead.
mod token_field {
    use fencegate_core::FencingToken;

    pub fn serialize<S: serde::Serializer>(t: &FencingToken, s: S) -> Result<S::Ok, S::Error> {
        match t {
            FencingToken::Plain(n) => s.serialize_u64(*n),
            FencingToken::Signed(signed) => s.serialize_str(&signed.to_string()),
        }
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<FencingToken, D::Error> {
        struct TokenVisitor;
        impl serde::de::Visitor<'_> for TokenVisitor {
            type Value = FencingToken;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("the fencing_token string the acquire returned (fgt1:...)")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<FencingToken, E> {
                Ok(FencingToken::Plain(n))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<FencingToken, E> {
                FencingToken::parse(s).map_err(|e| E::custom(format!("token {s:?}: {e}")))
            }
        }
        d.deserialize_any(TokenVisitor)
    }
}

/// What acquire and renew return: the lease and its proofs of holding. Sent
/// only to the holder (see the module documentation).
#[derive(Debug, Serialize, Deserialize, Clone, PartialEq, Eq)]
pub struct LeaseResponse {
    /// The lock held.
    pub lock: String,
    /// Who holds it, as the acquire named itself.
    pub owner: String,
    /// The numeric token (public: status and refusals show it).
    pub token: u64,
    /// The signed token; send it verbatim in the `Fencing-Token` header, and
    /// as `token` to renew and release. Proof of holding: keep it secret.
    pub fencing_token: String,
    /// The TTL in force: the lease expires `ttl_ms` after the service
    /// applied this request, at `expires_at_ms`.
    pub ttl_ms: u64,
    /// When the lease expires, in Unix milliseconds (the same value status
    /// shows).
    pub expires_at_ms: u64,
    /// How long the lease had left when the service answered, on its own
    /// clock: a holder's deadline is when it got the answer plus this
    /// (less the answer's way), whatever the clocks say. Less than
    /// `ttl_ms` when the answer came late (a long line, a slow disk).
    /// Absent from services older than it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining_ms: Option<u64>,
    /// S3 access key bound to this lease (for tools that cannot send the
    /// `Fencing-Token` header); sign with `s3_secret_access_key`.
    pub s3_access_key_id: String,
    /// The secret of `s3_access_key_id`. Proof of holding: keep it secret.
    pub s3_secret_access_key: String,
    /// When those credentials stop working, in Unix milliseconds.
    pub s3_credentials_expire_at_ms: u64,
}

/// What release returns.
#[derive(Debug, Serialize, Deserialize, Clone, PartialEq, Eq)]
pub struct ReleaseResponse {
    pub lock: String,
    /// Always true: no lease with the presented token holds the lock now.
    pub released: bool,
}

/// What `GET /v1/locks/{lock}` returns: public facts only, no proofs.
#[derive(Debug, Serialize, Deserialize, Clone, PartialEq, Eq)]
pub struct LockStatusResponse {
    pub lock: String,
    /// Whether a live lease holds the lock.
    pub held: bool,
    /// The holder's owner name, if held.
    pub owner: Option<String>,
    /// The holder's token number, if held.
    pub token: Option<u64>,
    /// When the live lease expires, in Unix milliseconds, if held.
    pub expires_at_ms: Option<u64>,
    /// Acquires waiting in line for this lock.
    pub waiting: usize,
    /// The last token issued by the service, for any lock.
    pub last_token: u64,
}

/// Declares [`ErrorCode`] from one list: each code with the HTTP status of
/// every answer that carries it. A code's name is its stable string.
macro_rules! error_codes {
    ($($(#[$doc:meta])* $code:ident = $status:literal,)*) => {
        /// Every error code the API answers with; each knows its status.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
        pub enum ErrorCode {
            $($(#[$doc])* $code,)*
        }

        impl ErrorCode {
            /// Every code, in declaration order.
            pub const ALL: [ErrorCode; [$(stringify!($code)),*].len()] = [$(ErrorCode::$code),*];

            /// The HTTP status every answer with this code has.
            pub fn status(self) -> u16 {
                match self {
                    $(ErrorCode::$code => $status,)*
                }
            }

            /// The stable code in the JSON body.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$code => stringify!($code),)*
                }
            }
        }
    };
}

error_codes! {
    InvalidRequest = 400,
    InvalidLockName = 400,
    InvalidOwner = 400,
    InvalidTtl = 400,
    InvalidWait = 400,
    InvalidIdempotencyKey = 400,
    SignedTokenRequired = 400,
    Unauthorized = 401,
    LockNotAllowed = 403,
    FencingTokenSignatureInvalid = 403,
    FencingTokenWrongLock = 403,
    NotFound = 404,
    MethodNotAllowed = 405,
    LockHeld = 409,
    LeaseLost = 409,
    BodyTooLarge = 413,
    TooManyWaiters = 429,
    StorageUnavailable = 503,
    ShuttingDown = 503,
    /// The request's `Host` is not a name the service answers to (a web
    /// page reached through DNS rebinding carries its own name there).
    HostNotAllowed = 421,
    /// The request carries an `Origin` header: a web page sent it.
    BrowserRequestRefused = 403,
    /// A request body that is not declared `application/json`.
    UnsupportedMediaType = 415,
}

/// The body of every refusal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorResponse {
    pub error: ErrorBody,
}

/// What a refusal says: its code, what to do, and the facts it may carry
/// (numbers and owner names only, never a proof of holding).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub message: String,
    /// `LockHeld`: the holder's owner name and its lease's expiry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    /// `LeaseLost`: the lease that is live now, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_token: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_owner: Option<String>,
    /// `LockHeld` on etcd, the lock free but others in line: how many.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<usize>,
    /// `LockNotAllowed`: the lock the API key may not use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock: Option<String>,
    /// `FencingTokenWrongLock`: the lock the presented token is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_lock: Option<String>,
}

impl ErrorBody {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ErrorBody {
        ErrorBody {
            code,
            message: message.into(),
            holder: None,
            expires_at_ms: None,
            current_token: None,
            current_owner: None,
            waiting: None,
            lock: None,
            token_lock: None,
        }
    }
}

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
