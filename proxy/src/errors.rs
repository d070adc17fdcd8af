//! Every S3 error the proxy itself answers with, in one place.
//!
//! Fence decisions use the contract's codes and statuses (design.md):
//! stale 409 `FencingTokenStale` with `Fencing-Max-Token`, missing 428
//! `FencingTokenRequired`, malformed 400 `InvalidFencingToken`, forged or
//! for another lock 403. Backend failures become retryable 503s so that a
//! client retries instead of giving up, and never a wrong accept.

use crate::tokens::Rejection;
use http::{HeaderMap, HeaderValue, StatusCode};
use s3s::{S3Error, S3ErrorCode};

pub const MAX_TOKEN_HEADER: &str = "fencing-max-token";

/// The proxy's own error codes (design.md's contract), each with its
/// status, as `fencegate_lease_api::ErrorCode` is for the lease service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// 409: below the scope's (or the object's) max.
    TokenStale,
    /// 428: a fenced write without a token.
    TokenRequired,
    /// 400: a token that cannot be read, or that contradicts another.
    InvalidToken,
    /// 403: a plain number where only signed tokens are accepted.
    TokenUnsigned,
    /// 403: a plain number the lease service did not issue.
    TokenNotIssued,
    /// 403: a token for another lock.
    TokenWrongLock,
    /// 403: a signature that does not verify.
    TokenSignatureInvalid,
    /// 403: a fence asked of a proxy that cannot verify tokens.
    TokenUnverifiable,
    /// 404: a fence for a lock no scope is fenced by.
    LockUnknown,
    /// 409: an upload whose key moved to another scope.
    ScopeChanged,
    /// 403: a write outside every scope.
    ScopeUndefined,
    /// 503: a store that does not enforce what fencing needs.
    BackendUnsafe,
}

impl Code {
    /// Every code (the tests check each is answered and read back).
    #[cfg(test)]
    pub const ALL: [Code; 12] = [
        Code::TokenStale,
        Code::TokenRequired,
        Code::InvalidToken,
        Code::TokenUnsigned,
        Code::TokenNotIssued,
        Code::TokenWrongLock,
        Code::TokenSignatureInvalid,
        Code::TokenUnverifiable,
        Code::LockUnknown,
        Code::ScopeChanged,
        Code::ScopeUndefined,
        Code::BackendUnsafe,
    ];

    /// The code on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::TokenStale => "FencingTokenStale",
            Code::TokenRequired => "FencingTokenRequired",
            Code::InvalidToken => "InvalidFencingToken",
            Code::TokenUnsigned => "FencingTokenUnsigned",
            Code::TokenNotIssued => "FencingTokenNotIssued",
            Code::TokenWrongLock => "FencingTokenWrongLock",
            Code::TokenSignatureInvalid => "FencingTokenSignatureInvalid",
            Code::TokenUnverifiable => "FencingTokenUnverifiable",
            Code::LockUnknown => "FencingLockUnknown",
            Code::ScopeChanged => "FencingScopeChanged",
            Code::ScopeUndefined => "FencingScopeUndefined",
            Code::BackendUnsafe => "FencingBackendUnsafe",
        }
    }

    /// The HTTP status it is answered with.
    pub fn status(self) -> StatusCode {
        match self {
            Code::TokenStale | Code::ScopeChanged => StatusCode::CONFLICT,
            Code::TokenRequired => StatusCode::PRECONDITION_REQUIRED,
            Code::InvalidToken => StatusCode::BAD_REQUEST,
            Code::TokenUnsigned
            | Code::TokenNotIssued
            | Code::TokenWrongLock
            | Code::TokenSignatureInvalid
            | Code::TokenUnverifiable
            | Code::ScopeUndefined => StatusCode::FORBIDDEN,
            Code::LockUnknown => StatusCode::NOT_FOUND,
            Code::BackendUnsafe => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The error with this code, its status and `msg`.
    fn error(self, msg: impl Into<String>) -> S3Error {
        standard(
            S3ErrorCode::Custom(self.as_str().into()),
            self.status(),
            msg,
        )
    }

    /// The proxy's code `e` carries, if it carries one.
    #[cfg(test)]
    pub fn of(e: &S3Error) -> Option<Code> {
        Code::ALL
            .into_iter()
            .find(|c| e.code().as_str() == c.as_str())
    }
}

/// An error with `code` and `status`.
fn standard(code: S3ErrorCode, status: StatusCode, msg: impl Into<String>) -> S3Error {
    let mut e = S3Error::with_message(code, msg.into());
    e.set_status_code(status);
    e
}

/// 409: the token is below the scope's (or the object's) max.
pub fn stale(token: u64, max: u64, detail: &str) -> S3Error {
    let mut e = Code::TokenStale.error(
        format!(
            "fencing token {token} is stale: token {max} has already been admitted{detail}; this writer lost its lease and must stop"
        ),
    );
    let mut h = HeaderMap::new();
    // s3s replaces the response headers with these: keep the content type.
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/xml"),
    );
    h.insert(MAX_TOKEN_HEADER, HeaderValue::from(max));
    e.set_headers(h);
    e
}

/// 404: a fence asked for a lock no scope of this proxy is fenced by.
pub fn unknown_lock(lock: &str) -> S3Error {
    Code::LockUnknown.error(format!(
        "no scope of this proxy is fenced by lock {lock}: nothing to fence here"
    ))
}

/// 403: a fence asked of a proxy without `signing_keys`, which cannot
/// tell a lease service's token from a made-up one.
pub fn fence_unverifiable() -> S3Error {
    Code::TokenUnverifiable.error(
        "this proxy has no signing_keys, so it cannot verify the token: fences are raised only by signed tokens it can verify (set signing_keys to the lease service's)",
    )
}

/// 428: a fenced write without a token.
pub fn missing(op: &str, scope: &str, lock: &str) -> S3Error {
    Code::TokenRequired.error(
        format!(
            "{op} in fence scope {scope:?} needs a Fencing-Token header: take a lease on lock {lock:?} and send its fencing_token"
        ),
    )
}

/// 400 RequestTimeout: the client stopped sending its body (S3's answer).
pub fn request_timeout(idle: std::time::Duration) -> S3Error {
    standard(
        S3ErrorCode::RequestTimeout,
        StatusCode::BAD_REQUEST,
        format!(
            "the request body stalled: nothing arrived for {}s; nothing was written, send the request again",
            idle.as_secs()
        ),
    )
}

/// 400 or 403 for a token the proxy does not accept.
pub fn rejected(r: &Rejection) -> S3Error {
    match r {
        Rejection::Malformed(_)
        | Rejection::Repeated
        | Rejection::NotText
        | Rejection::Disagree { .. } => Code::InvalidToken.error(r.to_string()),
        Rejection::Unsigned | Rejection::ElectionSigned { .. } => {
            Code::TokenUnsigned.error(r.to_string())
        }
        Rejection::NotIssued { .. }
        | Rejection::NotTheElections { .. }
        | Rejection::NotElected(_) => Code::TokenNotIssued.error(r.to_string()),
        Rejection::Verify(fencegate_core::token::VerifyError::WrongLock { .. }) => {
            Code::TokenWrongLock.error(r.to_string())
        }
        Rejection::Verify(_) => Code::TokenSignatureInvalid.error(r.to_string()),
    }
}

/// 400: a token that contradicts the one the upload was created with.
pub fn upload_token_mismatch(upload_id: &str, bound: u64, sent: u64) -> S3Error {
    Code::InvalidToken.error(format!(
        "upload {upload_id} was created with token {bound}, but this request carries token {sent}"
    ))
}

/// 403: a request for an upload another client created.
pub fn upload_not_yours(upload_id: &str, by_token: bool) -> S3Error {
    let how = if by_token {
        "it was created without credentials, so every request for it must carry the Fencing-Token it was created with"
    } else {
        "only the credentials that created it may send parts, complete or abort it"
    };
    standard(
        S3ErrorCode::AccessDenied,
        StatusCode::FORBIDDEN,
        format!("upload {upload_id} belongs to another client: {how}"),
    )
}

/// 409: an upload created in one fence scope, continued after a
/// reconfiguration put its key in another.
pub fn upload_scope_changed(upload_id: &str, was: &str, now: &str) -> S3Error {
    Code::ScopeChanged.error(
        format!(
            "upload {upload_id} was created in fence scope {was:?}, but its key is now in scope {now:?}; abort it on the backend and start a new upload"
        ),
    )
}

/// 404: an upload the proxy did not create (so has no token for).
pub fn unknown_upload(upload_id: &str) -> S3Error {
    standard(
        S3ErrorCode::NoSuchUpload,
        StatusCode::NOT_FOUND,
        format!(
            "upload {upload_id} was not created through this proxy (or was completed or aborted); start a new one with a Fencing-Token"
        ),
    )
}

/// 403: a write outside every configured scope.
pub fn unscoped(bucket: &str, key: &str, configured: &[String], more: usize) -> S3Error {
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    Code::ScopeUndefined.error(
        format!(
            "s3://{bucket}/{key} is in no fence scope, and writes outside the scopes are denied; configured scopes: {}{more}",
            configured.join(", ")
        ),
    )
}

/// 503 for a backend that did not answer in `timeout`; `write` says the
/// request was an object write, which may still land.
pub fn backend_timeout(timeout: std::time::Duration, write: bool) -> S3Error {
    let mut msg = format!(
        "the backend did not answer within {}s",
        timeout.as_secs_f64()
    );
    if write {
        msg.push_str(
            "; the write may still land, and no newer token is admitted until it no longer can; retry",
        );
    } else {
        msg.push_str("; retry");
    }
    standard(
        S3ErrorCode::ServiceUnavailable,
        StatusCode::SERVICE_UNAVAILABLE,
        msg,
    )
}

/// 503 for a write whose request may have left whole and whose answer
/// could not be read (`cause`: its connection ended first, or the answer
/// was not HTTP). It may still land, like a write not answered in time.
pub fn backend_lost(cause: &str) -> S3Error {
    standard(
        S3ErrorCode::ServiceUnavailable,
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "no answer could be read from the backend ({cause}): the write may have reached it whole and may still land, and no newer token is admitted until it no longer can; retry"
        ),
    )
}

/// 503 SlowDown: nothing was done; the client should retry.
pub fn retry(msg: impl Into<String>) -> S3Error {
    standard(
        S3ErrorCode::SlowDown,
        StatusCode::SERVICE_UNAVAILABLE,
        msg.into(),
    )
}

/// 503: the backend is not safe to write to in fenced mode.
pub fn unsafe_backend(bucket: &str, why: &str) -> S3Error {
    Code::BackendUnsafe.error(format!("writes to bucket {bucket} are refused: {why}"))
}

/// 501: an operation fencegate does not forward.
pub fn not_forwarded(op: &str) -> S3Error {
    standard(
        S3ErrorCode::NotImplemented,
        StatusCode::NOT_IMPLEMENTED,
        format!(
            "fencegate does not forward {op}: it would change the bucket without a fence; do it on the backend directly"
        ),
    )
}

/// 503 for our own storage (the proxy database) failing: the write was not
/// forwarded, and the client should retry.
pub fn storage(msg: impl Into<String>) -> S3Error {
    standard(
        S3ErrorCode::ServiceUnavailable,
        StatusCode::SERVICE_UNAVAILABLE,
        msg.into(),
    )
}

/// How [`from_backend`]'s message starts.
const BACKEND_FAILED: &str = "the backend S3 server failed or is unreachable";

/// Makes a backend error safe to return: a failure to reach the backend
/// and the backend's own 5xx become 503 so clients retry (the SDK adapter
/// reports transport failures as 500 InternalError); 4xx, and 501
/// NotImplemented for an operation the backend lacks, pass through. An
/// error it already made passes through too: a path that maps twice does
/// not say it twice.
pub fn from_backend(mut e: S3Error) -> S3Error {
    match e.status_code() {
        Some(s) if !s.is_server_error() => e,
        // The backend does not have the operation: retrying will not help.
        Some(StatusCode::NOT_IMPLEMENTED) if e.code() == &S3ErrorCode::NotImplemented => e,
        Some(StatusCode::SERVICE_UNAVAILABLE)
            if e.message().is_some_and(|m| m.starts_with(BACKEND_FAILED)) =>
        {
            e
        }
        _ => {
            let msg = format!(
                "{BACKEND_FAILED} ({}); retry",
                e.message().unwrap_or(e.code().as_str())
            );
            e.set_code(S3ErrorCode::ServiceUnavailable);
            e.set_message(msg);
            e.set_status_code(StatusCode::SERVICE_UNAVAILABLE);
            e
        }
    }
}

/// A forwarded request's result, with backend failures made retryable.
pub fn forwarded<T>(r: s3s::S3Result<T>) -> s3s::S3Result<T> {
    r.map_err(from_backend)
}

/// True for the store's "your condition failed" answers.
pub fn is_condition_failure(e: &S3Error) -> bool {
    matches!(
        e.status_code(),
        Some(StatusCode::PRECONDITION_FAILED) | Some(StatusCode::CONFLICT)
    ) || matches!(
        e.code(),
        S3ErrorCode::PreconditionFailed | S3ErrorCode::NoSuchKey
    ) || e.code().as_str() == "ConditionalRequestConflict"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_failure_mapped_twice_says_it_once() {
        let once = || {
            from_backend(S3Error::with_message(
                S3ErrorCode::InternalError,
                "the backend cannot be reached: client error (Connect)",
            ))
        };
        let twice = from_backend(once());
        let once = once();
        assert_eq!(twice.message(), once.message());
        assert_eq!(
            once.message(),
            Some(
                "the backend S3 server failed or is unreachable (the backend cannot be reached: client error (Connect)); retry"
            )
        );
    }

    /// What the comment on [`storage`] says: a retryable 503, not a 500.
    #[test]
    fn each_code_is_its_own_and_answers_the_contracts_status() {
        let names: std::collections::HashSet<&str> = Code::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(names.len(), Code::ALL.len(), "two codes share a name");
        for c in Code::ALL {
            let e = c.error("m");
            assert_eq!(Code::of(&e), Some(c));
            assert_eq!(e.status_code(), Some(c.status()));
        }
        // design.md: stale 409, missing 428, malformed 400, forged 403.
        let stale = stale(3, 4, "");
        assert_eq!(
            (Code::of(&stale), stale.status_code()),
            (Some(Code::TokenStale), Some(StatusCode::CONFLICT))
        );
        assert_eq!(
            missing("PutObject", "b", "l").status_code(),
            Some(StatusCode::PRECONDITION_REQUIRED)
        );
        assert_eq!(
            rejected(&Rejection::Repeated).status_code(),
            Some(StatusCode::BAD_REQUEST)
        );
        assert_eq!(
            rejected(&Rejection::Unsigned).status_code(),
            Some(StatusCode::FORBIDDEN)
        );
        assert_eq!(Code::of(&retry("x")), None);
    }

    #[test]
    fn own_storage_failure_is_a_retryable_503() {
        let e = storage("disk full");
        assert_eq!(e.status_code(), Some(StatusCode::SERVICE_UNAVAILABLE));
        assert_eq!(e.code(), &S3ErrorCode::ServiceUnavailable);
    }
}
