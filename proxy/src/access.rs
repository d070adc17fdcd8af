//! Who may call the proxy, and which operations it forwards at all.
//!
//! Client credentials are checked by s3s (SigV4, every chunked variant)
//! against [`ClientAuth`]; [`Access`] then refuses anonymous requests unless
//! the config allows them, and every operation [`crate::ops::classify`] does
//! not name, before any handler runs.

use crate::config::ClientKey;
use crate::errors;
use crate::ops::classify;
use s3s::access::{S3Access, S3AccessContext};
use s3s::auth::{S3Auth, SecretKey};
use s3s::{S3Result, s3_error};
use std::collections::HashMap;

/// The client keys from the config.
#[derive(Debug)]
pub struct ClientAuth {
    keys: HashMap<String, SecretKey>,
}

impl ClientAuth {
    pub fn new(clients: &[ClientKey]) -> ClientAuth {
        ClientAuth {
            keys: clients
                .iter()
                .map(|c| (c.access_key.clone(), SecretKey::from(c.secret_key.clone())))
                .collect(),
        }
    }
}

#[async_trait::async_trait]
impl S3Auth for ClientAuth {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        self.keys.get(access_key).cloned().ok_or_else(|| {
            s3_error!(
                InvalidAccessKeyId,
                "unknown access key; use a key from the proxy's [[clients]]"
            )
        })
    }
}

/// The access policy.
#[derive(Debug)]
pub struct Access {
    pub allow_anonymous: bool,
}

#[async_trait::async_trait]
impl S3Access for Access {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        let op = cx.s3_op().name();
        if classify(op).is_none() {
            return Err(errors::not_forwarded(op));
        }
        if cx.credentials().is_none() {
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
        }
        Ok(())
    }
}
