//! The bindings of open multipart uploads, kept in the proxy database or,
//! with replicas, in etcd.

use crate::errors;
use crate::fences::Fences;
use crate::state::db::Db;
use crate::state_error::{StateError, blocking};
use crate::tokens::upload::UploadBinding;
use s3s::S3Result;

/// Where bindings are kept: the cluster's etcd with replicas, else the
/// proxy database.
#[derive(Debug)]
pub struct Uploads {
    fences: Fences,
    db: Db,
}

impl Uploads {
    pub fn new(fences: Fences, db: Db) -> Uploads {
        Uploads { fences, db }
    }

    /// Records the token a new upload was created with, durably (in etcd
    /// with replicas, so that any replica can continue it).
    pub async fn bind(&self, b: UploadBinding) -> S3Result<()> {
        let kept = match self.fences.cluster() {
            Some(c) => c.bind_upload(&b).await,
            None => {
                let db = self.db.clone();
                blocking(move || Ok(db.bind_upload(&b)?)).await
            }
        };
        kept.map_err(|e| errors::storage(format!("cannot record the upload's token: {e}")))
    }

    /// The token an upload was created with.
    pub async fn get(&self, upload_id: &str) -> S3Result<UploadBinding> {
        let found = match self.fences.cluster() {
            Some(c) => c.upload(upload_id).await,
            None => {
                let (db, id) = (self.db.clone(), upload_id.to_owned());
                blocking(move || db.upload(&id)).await
            }
        };
        found
            .map_err(|e| errors::storage(format!("cannot read the upload's token: {e}")))?
            .ok_or_else(|| errors::unknown_upload(upload_id))
    }

    /// Forgets a finished upload's binding (a failure is logged: the
    /// binding of a finished upload admits nothing).
    pub async fn forget(&self, upload_id: &str) {
        let forgotten: Result<(), StateError> = match self.fences.cluster() {
            Some(c) => c.forget_upload(upload_id).await,
            None => {
                let (db, id) = (self.db.clone(), upload_id.to_owned());
                blocking(move || Ok(db.forget_upload(&id)?)).await
            }
        };
        if let Err(e) = forgotten {
            tracing::warn!(upload_id, error = %e, "could not forget a finished upload's binding");
        }
    }
}
