//! Who may call the proxy, and which operations it forwards at all.
//!
//! Client credentials are checked by s3s (SigV4, every chunked variant)
//! against [`ClientAuth`]; [`Access`] then refuses anonymous requests unless
//! the config allows them, every operation [`crate::op::Op`] does
//! not name, query parameters the proxy does not know
//! ([`crate::query`]) and keys that could escape their bucket
//! ([`crate::object_key`]), before any handler runs.

use crate::config::ClientKey;
use crate::errors;
use crate::op::{Class, Op};
use fencegate_core::credentials::{CredentialError, is_lease_access_key};
use fencegate_core::{LockName, TokenKeys};
use s3s::access::{S3Access, S3AccessContext};
use s3s::auth::{S3Auth, SecretKey};
use s3s::{S3Error, S3Result, s3_error};
use std::collections::HashMap;

/// The client keys from the config, and lease-bound keys derived from the
/// signing keys (see `fencegate_core::credentials`): the lease service's,
/// or, for a lock that follows an election, that election's own.
#[derive(Debug)]
pub struct ClientAuth {
    keys: HashMap<String, SecretKey>,
    lease_keys: Option<TokenKeys>,
    election_keys: HashMap<LockName, Option<TokenKeys>>,
}

impl ClientAuth {
    pub fn new(
        clients: &[ClientKey],
        lease_keys: Option<TokenKeys>,
        election_keys: HashMap<LockName, Option<TokenKeys>>,
    ) -> ClientAuth {
        ClientAuth {
            keys: clients
                .iter()
                .map(|c| (c.access_key.clone(), SecretKey::from(c.secret_key.clone())))
                .collect(),
            lease_keys,
            election_keys,
        }
    }

    /// The keys that derive the secret of credentials bound to `lock`: a
    /// lock that follows an election takes only its election's (the lease
    /// service issues nothing for it), others the lease service's.
    fn keys_for(&self, lock: Option<&LockName>) -> Result<&TokenKeys, S3Error> {
        match lock.and_then(|l| self.election_keys.get(l).map(|k| (l, k))) {
            Some((_, Some(keys))) => Ok(keys),
            Some((lock, None)) => Err(s3_error!(
                InvalidAccessKeyId,
                "lock {lock} follows an election without signing_keys: send the holder's plain Fencing-Token, or give the election signing_keys for credentials"
            )),
            None => self.lease_keys.as_ref().ok_or_else(|| {
                s3_error!(
                    InvalidAccessKeyId,
                    "lease-bound credentials need the proxy to have signing_keys"
                )
            }),
        }
    }
}

#[async_trait::async_trait]
impl S3Auth for ClientAuth {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        if let Some(k) = self.keys.get(access_key) {
            return Ok(k.clone());
        }
        if is_lease_access_key(access_key) {
            let bound = fencegate_core::credentials::parse_access_key(access_key).ok();
            let keys = self.keys_for(bound.as_ref().map(|b| &b.lock))?;
            // The secret is re-derived from the access key, with the
            // configured key its key id names (any of them, so credentials
            // keep working through a key rotation); if the client signed
            // with anything else (forged or tampered key), the signature
            // check that follows fails.
            return match keys.secret_for(access_key, crate::clock::unix_secs()) {
                Ok((_, secret)) => Ok(SecretKey::from(secret)),
                Err(CredentialError::Expired(at)) => Err(s3_error!(
                    AccessDenied,
                    "lease credentials expired at unix time {at}; take a new lease"
                )),
                Err(e @ CredentialError::UnknownKey(_)) => {
                    Err(s3_error!(InvalidAccessKeyId, "{e}"))
                }
                Err(CredentialError::Shape) => Err(s3_error!(
                    InvalidAccessKeyId,
                    "malformed lease access key; use the s3_access_key_id the lease service returned"
                )),
            };
        }
        Err(s3_error!(
            InvalidAccessKeyId,
            "unknown access key; use a key from the proxy's [[clients]] or lease-bound credentials"
        ))
    }
}

/// The access policy.
pub struct Access {
    pub allow_anonymous: bool,
    /// For the right to a share of the body budget.
    pub gate: std::sync::Arc<crate::gate::Gate>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("allow_anonymous", &self.allow_anonymous)
            .finish_non_exhaustive()
    }
}

/// A request's share of the body budget, held until its handler is done.
#[derive(Debug, Clone)]
pub struct BodyShare(
    #[allow(dead_code, reason = "held for its drop")] std::sync::Arc<crate::early::Held>,
);

impl Access {
    /// For DeleteObjects and Complete, whose XML bodies s3s reads whole
    /// right after this check: the proof that the request may write
    /// (see [`crate::early`]), then its share of the body budget.
    async fn body_share(&self, cx: &S3AccessContext<'_>, op: Op) -> S3Result<Option<BodyShare>> {
        let Some(length) = crate::early::announced_length(cx.headers()).filter(|n| *n > 0) else {
            return Ok(None);
        };
        let token = crate::gate::RequestToken {
            headers: cx.headers(),
            access_key: cx.credentials().map(|c| c.access_key.as_str()),
        };
        match (op, cx.s3_path()) {
            (Op::DeleteObjects, s3s::path::S3Path::Bucket { bucket }) => {
                crate::ops::delete::may_delete_batch(&self.gate, bucket, token).await?;
            }
            (Op::CompleteMultipartUpload, s3s::path::S3Path::Object { bucket, key }) => {
                let upload_id = upload_id(cx.uri()).ok_or_else(|| {
                    s3_error!(InvalidRequest, "CompleteMultipartUpload needs ?uploadId=")
                })?;
                crate::ops::multipart::UploadCall {
                    upload_id: &upload_id,
                    bucket,
                    key,
                    token,
                    credentials: cx.credentials(),
                }
                .may_complete(&self.gate)
                .await?;
            }
            _ => return Ok(None),
        }
        let held = self.gate.body_budget().try_hold(length).ok_or_else(|| {
            s3_error!(
                SlowDown,
                "too many large XML request bodies at once (max_buffered_body_bytes); retry"
            )
        })?;
        Ok(Some(BodyShare(std::sync::Arc::new(held))))
    }
}

/// The `uploadId` a request's query names.
fn upload_id(uri: &http::Uri) -> Option<String> {
    uri.query()?.split('&').find_map(|p| {
        let (name, value) = p.split_once('=')?;
        (name == "uploadId")
            .then(|| urlencoding::decode(value).ok().map(|v| v.into_owned()))
            .flatten()
    })
}

#[async_trait::async_trait]
impl S3Access for Access {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        let op = cx.s3_op().name();
        let Some(known) = Op::parse(op) else {
            return Err(errors::not_forwarded(op));
        };
        match known.class() {
            // CreateBucket has a rule of its own: plain creates only
            // (`ops::bucket`).
            Class::Fenced => self.gate.write_headers().check(known, cx.headers())?,
            Class::Read | Class::CreateBucket => {}
        }
        crate::query::require_known(known, cx.uri())?;
        if let s3s::path::S3Path::Object { key, .. } = cx.s3_path() {
            crate::object_key::require(key)?;
        }
        // The router let the request past its Host rule on its reading of
        // the credentials (`presented`); s3s has now verified them. A
        // request the router read as signed is signed here, or nothing
        // that rule skipped is served.
        let presented = cx
            .extensions_mut()
            .get::<crate::presented::Presented>()
            .copied();
        if presented != Some(crate::presented::Presented::Anonymous) && cx.credentials().is_none() {
            return Err(s3_error!(
                AuthorizationHeaderMalformed,
                "the request's credentials were not verified: send one SigV4 Authorization header (or a presigned URL), or none"
            ));
        }
        // Who is asking, for the fence event of any refusal that follows.
        if let Some(c) = cx.credentials() {
            crate::events::note_client(&c.access_key);
        }
        if cx.credentials().is_none() {
            if known == Op::CreateBucket {
                return Err(s3_error!(
                    AccessDenied,
                    "CreateBucket needs credentials: sign the request with a client key"
                ));
            }
            if !self.allow_anonymous {
                return Err(s3_error!(
                    AccessDenied,
                    "anonymous requests are not allowed here: sign them with a client key"
                ));
            }
            let h = cx.headers();
            let chunked = h
                .get("x-amz-content-sha256")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("STREAMING-"))
                || h.get_all(http::header::CONTENT_ENCODING)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .any(|v| v.contains("aws-chunked"));
            if chunked {
                return Err(s3_error!(
                    InvalidRequest,
                    "anonymous uploads must send a plain body with Content-Length, not aws-chunked"
                ));
            }
            // No signature vouches for it, and the proxy checks it only
            // in the one form it can (`trailer`).
            if let Some(v) = h.get("x-amz-content-sha256")
                && v != "UNSIGNED-PAYLOAD"
                && !crate::sigv4::is_sha256_hex(v.as_bytes())
            {
                return Err(s3_error!(
                    InvalidArgument,
                    "x-amz-content-sha256 must be the body's SHA-256 in lower-case hex, or UNSIGNED-PAYLOAD: {:?} cannot be checked",
                    String::from_utf8_lossy(v.as_bytes())
                ));
            }
        }
        if let Some(v) = cx.headers().get("content-md5") {
            use base64::Engine as _;
            let digest = base64::engine::general_purpose::STANDARD.decode(v.as_bytes());
            if digest.map_or(true, |d| d.len() != 16) {
                return Err(s3_error!(
                    InvalidDigest,
                    "Content-MD5 must be the base64 of the body's 16-byte MD5"
                ));
            }
        }
        if let Some(share) = self.body_share(cx, known).await? {
            cx.extensions_mut().insert(share);
        }
        Ok(())
    }
}

/// Who may read the status page and the fence events (`/_fencegate/` and
/// `/_fencegate/events`): the configured `viewers`, by HTTP Basic with
/// their name and password, compared in constant time over every viewer.
/// S3 credentials never open it (a browser would send the secret with
/// every reload; SigV4 never sends it at all). Without viewers, anyone if
/// the proxy serves anonymous requests, nobody otherwise.
pub struct Viewers {
    open: bool,
    viewers: Vec<([u8; 32], [u8; 32])>,
}

impl std::fmt::Debug for Viewers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Viewers")
            .field("open", &self.open)
            .field("viewers", &self.viewers.len())
            .finish()
    }
}

impl Viewers {
    pub fn new(viewers: &[crate::config::Viewer], allow_anonymous: bool) -> Viewers {
        Viewers {
            open: allow_anonymous && viewers.is_empty(),
            viewers: viewers
                .iter()
                .map(|v| (digest(&v.name), digest(&v.password)))
                .collect(),
        }
    }

    /// Whether a request with `headers` may read the page.
    pub fn admit(&self, headers: &http::HeaderMap) -> Result<(), &'static str> {
        if self.open {
            return Ok(());
        }
        if self.viewers.is_empty() {
            return Err(
                "the status page needs a viewer: add [[viewers]] (or FENCEGATE_VIEWERS) to the proxy's config",
            );
        }
        let Some((user, password)) = fencegate_page::basic_credentials(headers) else {
            return Err("sign in with a viewer's name and password ([[viewers]])");
        };
        let (user, password) = (digest(&user), digest(&password));
        let mut found = subtle::Choice::from(0);
        for (u, p) in &self.viewers {
            use subtle::ConstantTimeEq as _;
            found |= u.ct_eq(&user) & p.ct_eq(&password);
        }
        if bool::from(found) {
            Ok(())
        } else {
            Err("unknown viewer or wrong password")
        }
    }
}

fn digest(s: &str) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(s.as_bytes()).into()
}
