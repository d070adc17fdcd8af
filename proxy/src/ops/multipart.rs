//! Multipart uploads.
//!
//! The token sent with CreateMultipartUpload binds to the upload id, durably
//! (some clients, s3cmd among them, send the header only there). UploadPart,
//! UploadPartCopy, Complete and Abort use the bound token; a header that
//! names a different token is refused. Every step passes the scope's fence
//! with the bound token, so once a newer holder is admitted, the old
//! upload's parts are cut and its Complete is refused: the object never
//! appears. Complete, the commit point, is also checked against the key's
//! stored token and sent conditionally.

use crate::db::UploadBinding;
use crate::errors;
use crate::gate::Gate;
use crate::keys::Known;
use crate::scope::Scope;
use s3s::dto::*;
use s3s::{S3, S3Request, S3Response, S3Result};

pub async fn create(
    gate: &Gate,
    mut req: S3Request<CreateMultipartUploadInput>,
) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
    const OP: &str = "CreateMultipartUpload";
    let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
    let scope = gate.scope(OP, &bucket, &key)?;
    let token = gate
        .required_token(OP, crate::gate::RequestToken::of(&req), &scope)
        .await?;
    let admission = gate.admit(OP, &bucket, &scope, token).await?;
    super::tag(&mut req.input.metadata, token);
    req.input.content_encoding = super::strip_aws_chunked(req.input.content_encoding.take());
    let resp = gate
        .call(gate.backend.forward.create_multipart_upload(req), None)
        .await
        .map_err(errors::from_backend)?;
    let upload_id = resp
        .output
        .upload_id
        .clone()
        .ok_or_else(|| errors::retry("the backend returned no upload id"))?;
    gate.bind_upload(UploadBinding {
        upload_id,
        bucket,
        key,
        scope: scope.id.clone(),
        token,
    })
    .await?;
    drop(admission);
    gate.metrics.write(OP, &scope.id, "accepted");
    Ok(resp)
}

/// The requests that name an existing upload.
trait UploadRequest {
    /// Upload id, bucket, key.
    fn upload(&self) -> (&str, &str, &str);
}

macro_rules! upload_request {
    ($($input:ty),*) => {
        $(impl UploadRequest for $input {
            fn upload(&self) -> (&str, &str, &str) {
                (&self.upload_id, &self.bucket, &self.key)
            }
        })*
    };
}

upload_request!(
    UploadPartInput,
    UploadPartCopyInput,
    CompleteMultipartUploadInput,
    AbortMultipartUploadInput
);

/// The bound token of the upload `req` names, checked against the
/// request's own.
async fn bound<T: UploadRequest>(
    gate: &Gate,
    op: &'static str,
    req: &S3Request<T>,
) -> S3Result<(UploadBinding, Scope)> {
    let (upload_id, bucket, key) = req.input.upload();
    let token = crate::gate::RequestToken::of(req);
    let binding = gate.upload(upload_id).await?;
    if binding.bucket != bucket || binding.key != key {
        return Err(errors::unknown_upload(upload_id));
    }
    let scope = gate.scope(op, bucket, key)?;
    if scope.id != binding.scope {
        // The scopes were reconfigured while the upload was open: its token
        // was issued for another lock, and must not enter this scope.
        return Err(errors::upload_scope_changed(
            upload_id,
            &binding.scope,
            &scope.id,
        ));
    }
    if let Some(sent) = gate.token(op, token, &scope).await?
        && sent != binding.token
    {
        gate.metrics.write(op, &scope.id, "invalid_token");
        return Err(errors::upload_token_mismatch(
            upload_id,
            binding.token,
            sent,
        ));
    }
    Ok((binding, scope))
}

pub async fn upload_part(
    gate: &Gate,
    mut req: S3Request<UploadPartInput>,
) -> S3Result<S3Response<UploadPartOutput>> {
    const OP: &str = "UploadPart";
    let (binding, scope) = bound(gate, OP, &req).await?;
    let admission = gate
        .admit(OP, &binding.bucket, &scope, binding.token)
        .await?;
    let watch = gate.watch_body(&mut req.input.body, &admission.cancel);
    let result = gate
        .call_watched(gate.backend.forward.upload_part(req), watch)
        .await;
    if admission.cancel.is_cancelled() {
        return Err(gate.cut(OP, &scope, binding.token, admission).await);
    }
    let resp = result.map_err(errors::from_backend)?;
    gate.metrics.write(OP, &scope.id, "accepted");
    Ok(resp)
}

pub async fn upload_part_copy(
    gate: &Gate,
    req: S3Request<UploadPartCopyInput>,
) -> S3Result<S3Response<UploadPartCopyOutput>> {
    const OP: &str = "UploadPartCopy";
    let (binding, scope) = bound(gate, OP, &req).await?;
    under_bound_token(
        gate,
        OP,
        &binding,
        &scope,
        gate.backend.forward.upload_part_copy(req),
    )
    .await
}

/// Forwards `call` while holding the scope's epoch with the upload's token
/// (so a newer holder waits for it, and it cannot start after one).
async fn under_bound_token<T>(
    gate: &Gate,
    op: &'static str,
    binding: &UploadBinding,
    scope: &Scope,
    call: impl std::future::Future<Output = S3Result<T>>,
) -> S3Result<T> {
    let admission = gate
        .admit(op, &binding.bucket, scope, binding.token)
        .await?;
    let result = gate.call(call, None).await;
    drop(admission);
    let resp = result.map_err(errors::from_backend)?;
    gate.metrics.write(op, &scope.id, "accepted");
    Ok(resp)
}

pub async fn complete(
    gate: &Gate,
    mut req: S3Request<CompleteMultipartUploadInput>,
) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
    const OP: &str = "CompleteMultipartUpload";
    let (binding, scope) = bound(gate, OP, &req).await?;
    let token = binding.token;
    let w = gate
        .begin(OP, &binding.bucket, &binding.key, scope, token)
        .await?;
    let input = &mut req.input;
    (input.if_match, input.if_none_match) =
        super::conditions(&w.known, input.if_match.take(), input.if_none_match.take())?;
    // Complete sends If-None-Match for a new key, If-Match otherwise.
    let new_key = input.if_none_match.is_some();
    let result = gate
        .call_conditional(
            &binding.bucket,
            |r| {
                if new_key {
                    r.complete_if_none_match
                } else {
                    r.complete_if_match
                }
            },
            gate.backend.forward.complete_multipart_upload(req),
        )
        .await;
    let ok = result.is_ok();
    let out = gate
        .finish(w, result, |out| {
            Some(Known::Present {
                etag: out.output.e_tag.as_ref()?.value().to_owned(),
                token,
            })
        })
        .await;
    if ok {
        gate.forget_upload(&binding.upload_id).await;
    }
    out
}

pub async fn abort(
    gate: &Gate,
    req: S3Request<AbortMultipartUploadInput>,
) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
    const OP: &str = "AbortMultipartUpload";
    let (binding, scope) = bound(gate, OP, &req).await?;
    let resp = under_bound_token(
        gate,
        OP,
        &binding,
        &scope,
        gate.backend.forward.abort_multipart_upload(req),
    )
    .await?;
    gate.forget_upload(&binding.upload_id).await;
    Ok(resp)
}
