//! The bindings of open multipart uploads, kept in the proxy database or,
//! with replicas, in etcd.

use super::*;

impl Gate {
    /// Records the token a new upload was created with, durably (in etcd
    /// with replicas, so that any replica can continue it).
    pub async fn bind_upload(&self, b: UploadBinding) -> S3Result<()> {
        if let Some(c) = self.fences.cluster() {
            return c.bind_upload(&b).await.map_err(|e| {
                errors::storage(format!(
                    "cannot record the upload's token in the cluster: {e}"
                ))
            });
        }
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || db.bind_upload(&b))
            .await
            .map_err(|e| errors::storage(e.to_string()))?
            .map_err(|e| errors::storage(format!("cannot record the upload's token: {e}")))
    }

    /// The token an upload was created with.
    pub async fn upload(&self, upload_id: &str) -> S3Result<UploadBinding> {
        let found = if let Some(c) = self.fences.cluster() {
            c.upload(upload_id).await.map_err(|e| {
                errors::storage(format!(
                    "cannot read the upload's token from the cluster: {e}"
                ))
            })?
        } else {
            let db = self.db.clone();
            let id = upload_id.to_owned();
            tokio::task::spawn_blocking(move || db.upload(&id))
                .await
                .map_err(|e| errors::storage(e.to_string()))?
                .map_err(|e| errors::storage(format!("cannot read the upload's token: {e}")))?
        };
        found.ok_or_else(|| errors::unknown_upload(upload_id))
    }

    pub async fn forget_upload(&self, upload_id: &str) {
        if let Some(c) = self.fences.cluster() {
            if let Err(e) = c.forget_upload(upload_id).await {
                tracing::warn!(upload_id, error = %e, "could not forget a finished upload's binding");
            }
            return;
        }
        let db = self.db.clone();
        let id = upload_id.to_owned();
        let r = tokio::task::spawn_blocking(move || db.forget_upload(&id)).await;
        if !matches!(r, Ok(Ok(()))) {
            tracing::warn!(upload_id, "could not forget a finished upload's binding");
        }
    }
}
