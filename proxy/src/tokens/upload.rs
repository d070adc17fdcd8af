//! An open multipart upload's binding: the token it was created with and
//! who created it.
//!
//! A binding is made when CreateMultipartUpload passed the fence, from that
//! request's [`VerifiedToken`], and kept durably (the proxy's database, or
//! etcd with replicas) as an [`UploadRecord`]. Reading it back is the one
//! way besides verification that a [`VerifiedToken`] comes to be: the
//! proxy's own record of a token it verified. Nothing else builds a
//! binding.

use super::VerifiedToken;
use crate::state_error::StateError;
use fencegate_core::credentials::{is_lease_access_key, parse_access_key};

/// Who sent a request, as recorded on an upload: only they may continue,
/// complete or abort it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// A configured client key (its access key id).
    Key(String),
    /// Lease-bound credentials of one lease: any of them, since they change
    /// with the expiry.
    Lease { lock: String, token: u64 },
    /// An unsigned request (or an upload bound before identities were
    /// recorded): the upload answers only to its token.
    Anonymous,
}

impl Identity {
    /// The identity of a request signed with `access_key` (`None`:
    /// unsigned).
    pub fn signed_by(access_key: Option<&str>) -> Identity {
        match access_key {
            None => Identity::Anonymous,
            Some(k) if is_lease_access_key(k) => match parse_access_key(k) {
                Ok(bound) => Identity::Lease {
                    lock: bound.lock.to_string(),
                    token: bound.token,
                },
                Err(_) => Identity::Key(k.to_owned()),
            },
            Some(k) => Identity::Key(k.to_owned()),
        }
    }

    /// As kept in a record: `key:<access key>`, `lease:<lock>:<token>`,
    /// `anonymous`.
    fn record(&self) -> String {
        match self {
            Identity::Key(k) => format!("key:{k}"),
            Identity::Lease { lock, token } => format!("lease:{lock}:{token}"),
            Identity::Anonymous => ANONYMOUS.to_owned(),
        }
    }

    /// Reads [`Identity::record`]'s form back; an empty owner is an upload
    /// bound before identities were recorded.
    fn from_record(text: &str) -> Option<Identity> {
        if text.is_empty() || text == ANONYMOUS {
            return Some(Identity::Anonymous);
        }
        if let Some(k) = text.strip_prefix("key:") {
            return Some(Identity::Key(k.to_owned()));
        }
        let (lock, token) = text.strip_prefix("lease:")?.rsplit_once(':')?;
        Some(Identity::Lease {
            lock: lock.to_owned(),
            token: token.parse().ok()?,
        })
    }
}

const ANONYMOUS: &str = "anonymous";

/// A multipart upload created through the proxy. Fields are private: a
/// binding is made from a verified token ([`UploadBinding::new`]) or read
/// back from the proxy's own record ([`UploadBinding::read_row`],
/// [`UploadBinding::read_kv`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadBinding {
    upload_id: String,
    bucket: String,
    key: String,
    scope: String,
    token: VerifiedToken,
    owner: Identity,
}

/// An upload binding as it is stored: the database's columns, the JSON kept
/// in etcd.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UploadRecord {
    pub upload_id: String,
    pub bucket: String,
    pub key: String,
    pub scope: String,
    pub token: u64,
    pub owner: String,
}

impl UploadBinding {
    /// The binding of a new upload `upload_id` of `bucket/key` in scope
    /// `scope`, created with `token` by `owner`.
    pub fn new(
        upload_id: String,
        bucket: String,
        key: String,
        scope: String,
        token: VerifiedToken,
        owner: Identity,
    ) -> UploadBinding {
        UploadBinding {
            upload_id,
            bucket,
            key,
            scope,
            token,
            owner,
        }
    }

    /// A binding read back from a row of the proxy database's `uploads`
    /// table, selected as `upload_id, bucket, key, scope, token, owner`:
    /// its token was verified when the upload was created. Only a query
    /// makes a `Row`, so nothing but the database's own record becomes a
    /// binding this way.
    pub fn read_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Result<UploadBinding, StateError>> {
        let token: i64 = r.get(4)?;
        Ok(UploadBinding::from_record(UploadRecord {
            upload_id: r.get(0)?,
            bucket: r.get(1)?,
            key: r.get(2)?,
            scope: r.get(3)?,
            token: u64::try_from(token).unwrap_or(0),
            owner: r.get(5)?,
        }))
    }

    /// A binding read back from the etcd key the cluster keeps it in (its
    /// JSON record): only etcd's answer makes a `KeyValue`.
    pub fn read_kv(
        kv: &fencegate_etcd::etcd_client::KeyValue,
    ) -> Result<UploadBinding, StateError> {
        let record: UploadRecord = serde_json::from_slice(kv.value()).map_err(|e| {
            StateError::Unreadable(format!(
                "upload binding {}: {e}",
                String::from_utf8_lossy(kv.key())
            ))
        })?;
        UploadBinding::from_record(record)
    }

    /// A binding made in a unit test as if read back.
    #[cfg(test)]
    pub(crate) fn for_tests(r: UploadRecord) -> UploadBinding {
        UploadBinding::from_record(r).expect("a readable record")
    }

    /// A binding from its stored record. Fails on an owner in no form the
    /// proxy writes.
    fn from_record(r: UploadRecord) -> Result<UploadBinding, StateError> {
        let owner = Identity::from_record(&r.owner).ok_or_else(|| {
            StateError::Unreadable(format!(
                "upload {} has an owner the proxy cannot read: {:?}",
                r.upload_id, r.owner
            ))
        })?;
        Ok(UploadBinding {
            upload_id: r.upload_id,
            bucket: r.bucket,
            key: r.key,
            scope: r.scope,
            token: VerifiedToken { number: r.token },
            owner,
        })
    }

    /// What is kept durably.
    pub fn record(&self) -> UploadRecord {
        UploadRecord {
            upload_id: self.upload_id.clone(),
            bucket: self.bucket.clone(),
            key: self.key.clone(),
            scope: self.scope.clone(),
            token: self.token.number,
            owner: self.owner.record(),
        }
    }

    pub fn upload_id(&self) -> &str {
        &self.upload_id
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    /// The id of the scope the upload was created in.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The token the upload was created with.
    pub fn token(&self) -> VerifiedToken {
        self.token
    }

    /// Who created it.
    pub fn owner(&self) -> &Identity {
        &self.owner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_read_back_as_they_were_recorded() {
        for id in [
            Identity::Key("AKIDEXAMPLE".into()),
            Identity::Lease {
                lock: "db:primary".into(),
                token: 42,
            },
            Identity::Anonymous,
        ] {
            assert_eq!(Identity::from_record(&id.record()), Some(id.clone()));
        }
        assert_eq!(Identity::from_record(""), Some(Identity::Anonymous));
        assert_eq!(Identity::from_record("lease:db:x"), None);
        assert_eq!(Identity::from_record("someone"), None);
    }

    #[test]
    fn a_record_with_an_unreadable_owner_is_refused() {
        let r = UploadRecord {
            upload_id: "u".into(),
            bucket: "b".into(),
            key: "k".into(),
            scope: "b".into(),
            token: 3,
            owner: "nobody-knows".into(),
        };
        assert!(UploadBinding::from_record(r.clone()).is_err());
        let ok = UploadRecord {
            owner: "key:AK".into(),
            ..r
        };
        let b = UploadBinding::from_record(ok.clone()).expect("readable");
        assert_eq!(b.token().number(), 3);
        assert_eq!(b.record(), ok);
    }
}
