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
//!
//! An upload also binds to the identity that created it ([`Identity`]):
//! only that client may send parts, complete or abort it. An anonymous
//! upload has no identity but its token, so each of its requests must
//! present that token. Abort changes no object: the upload's own client
//! may abort it even when its token went stale, to clean up its parts.

use crate::errors;
use crate::fences::Admission;
use crate::gate::refusal::Refusal;
use crate::gate::token::Tokened;
use crate::gate::{Gate, RequestToken, WriteOp};
use crate::metrics::Outcome;
use crate::op::Op;
use crate::tokens::upload::{Identity, UploadBinding};
use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result};

pub async fn create(
    gate: &Gate,
    req: S3Request<CreateMultipartUploadInput>,
) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
    const OP: Op = Op::CreateMultipartUpload;
    let scoped = gate.scoping.scope(OP, &req.input.bucket, &req.input.key)?;
    let tokened = gate.tokens.required(scoped, RequestToken::of(&req)).await?;
    let owner = Identity::signed_by(req.credentials.as_ref().map(|c| c.access_key.as_str()));
    let admission = gate.admitter.admit(&tokened).await?;
    let resp = gate
        .writer
        .create_upload(&admission, req, tokened.token())
        .await
        .map_err(errors::from_backend)?;
    let upload_id = resp
        .output
        .upload_id
        .clone()
        .ok_or_else(|| errors::retry("the backend returned no upload id"))?;
    let (scoped, scope) = (tokened.scoped(), tokened.scope());
    gate.uploads
        .bind(UploadBinding::new(
            upload_id,
            scoped.bucket().to_owned(),
            scoped.key().to_owned(),
            scope.id.clone(),
            tokened.token(),
            owner,
        ))
        .await?;
    drop(admission);
    gate.refuser.count(OP, scope, Outcome::Accepted);
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
    op: Op,
    req: &S3Request<T>,
) -> S3Result<(UploadBinding, Tokened)> {
    let (upload_id, bucket, key) = req.input.upload();
    let call = UploadCall {
        upload_id,
        bucket,
        key,
        token: RequestToken::of(req),
        credentials: req.credentials.as_ref(),
    };
    call.bound(gate, op).await
}

/// A request that names an open upload, as its head tells it (before
/// s3s read its body).
pub struct UploadCall<'a> {
    pub upload_id: &'a str,
    pub bucket: &'a str,
    pub key: &'a str,
    pub token: RequestToken<'a>,
    /// What the request was signed with (s3s checked the signature).
    pub credentials: Option<&'a s3s::auth::Credentials>,
}

impl UploadCall<'_> {
    /// Whether this Complete may have its body read: the upload is its
    /// client's, and its token is not below the lock's max. Answers what
    /// the Complete itself would be answered otherwise.
    pub async fn may_complete(&self, gate: &Gate) -> S3Result<()> {
        let (_, tokened) = self.bound(gate, WriteOp::Complete.op()).await?;
        gate.tokens.refuse_if_stale(&tokened)
    }

    /// The upload's binding, checked against this request, and the request
    /// scoped with the upload's token.
    async fn bound(&self, gate: &Gate, op: Op) -> S3Result<(UploadBinding, Tokened)> {
        let (upload_id, bucket, key) = (self.upload_id, self.bucket, self.key);
        let binding = gate.uploads.get(upload_id).await?;
        if binding.bucket() != bucket || binding.key() != key {
            return Err(errors::unknown_upload(upload_id));
        }
        let scoped = gate.scoping.scope(op, bucket, key)?;
        let scope = scoped.scope();
        if scope.id != binding.scope() {
            // The scopes were reconfigured while the upload was open: its
            // token was issued for another lock, and must not enter this
            // scope.
            return Err(errors::upload_scope_changed(
                upload_id,
                binding.scope(),
                &scope.id,
            ));
        }
        let bound = binding.token();
        let sent = gate.tokens.token(&scoped, self.token).await?;
        if let Some(sent) = sent
            && sent != bound
        {
            return Err(gate.refuser.refuse(
                op,
                scope,
                Refusal::UploadToken {
                    upload_id,
                    bound: bound.number(),
                    sent: sent.number(),
                },
            ));
        }
        // Only the upload's creator may touch it; an upload whose creator
        // had no identity (anonymous, or bound before identities were
        // recorded) answers only to its token.
        let who = Identity::signed_by(self.credentials.map(|c| c.access_key.as_str()));
        let tokenless_owner = *binding.owner() == Identity::Anonymous;
        let allowed = if tokenless_owner {
            sent == Some(bound)
        } else {
            who == *binding.owner()
        };
        if !allowed {
            return Err(gate.refuser.refuse(
                op,
                scope,
                Refusal::NotOwner {
                    upload_id,
                    by_token: tokenless_owner,
                },
            ));
        }
        // An abort changes no object: its owner may always free the parts.
        if op != Op::AbortMultipartUpload {
            gate.tokens.still_elected(&scoped, bound).await?;
        }
        // Checked above, so that its refusal comes first; `bound` holds
        // the rule as well.
        let tokened =
            Tokened::bound(scoped, &binding).ok_or_else(|| errors::unknown_upload(upload_id))?;
        Ok((binding, tokened))
    }
}

pub async fn upload_part(
    gate: &Gate,
    req: S3Request<UploadPartInput>,
) -> S3Result<S3Response<UploadPartOutput>> {
    const OP: Op = Op::UploadPart;
    let (_, tokened) = bound(gate, OP, &req).await?;
    admitted(gate, OP, &tokened, async |admission| {
        gate.writer.upload_part(admission, req).await
    })
    .await
}

/// Sends a call that changes no object while the scope's epoch holds the
/// upload's token (so a newer holder waits for it, and it cannot start
/// after one): cut if a newer token came meanwhile, else counted.
async fn admitted<T>(
    gate: &Gate,
    op: Op,
    tokened: &Tokened,
    call: impl AsyncFnOnce(&Admission) -> S3Result<T>,
) -> S3Result<T> {
    let admission = gate.admitter.admit(tokened).await?;
    let result = call(&admission).await;
    let scope = tokened.scope();
    if admission.cancel().is_cancelled() {
        return Err(gate
            .refuser
            .cut(op, scope, tokened.token().number(), admission)
            .await);
    }
    drop(admission);
    let resp = result.map_err(errors::from_backend)?;
    gate.refuser.count(op, scope, Outcome::Accepted);
    Ok(resp)
}

pub async fn upload_part_copy(
    gate: &Gate,
    req: S3Request<UploadPartCopyInput>,
) -> S3Result<S3Response<UploadPartCopyOutput>> {
    const OP: Op = Op::UploadPartCopy;
    if let CopySource::Bucket { key, .. } = &req.input.copy_source {
        crate::object_key::require(key)?;
    }
    let (_, tokened) = bound(gate, OP, &req).await?;
    let input = &req.input;
    let conditions = crate::ops::copy::SourceConditions {
        if_match: input.copy_source_if_match.clone(),
        if_none_match: input.copy_source_if_none_match.clone(),
        if_modified_since: input.copy_source_if_modified_since.clone(),
        if_unmodified_since: input.copy_source_if_unmodified_since.clone(),
    };
    crate::ops::copy::checked_source(gate, &input.copy_source, &conditions).await?;
    admitted(gate, OP, &tokened, async |admission| {
        gate.writer.upload_part_copy(admission, req).await
    })
    .await
}

pub async fn complete(
    gate: &Gate,
    req: S3Request<CompleteMultipartUploadInput>,
) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
    let op = WriteOp::Complete;
    let (binding, tokened) = bound(gate, op.op(), &req).await?;
    let w = gate.admitter.begin(op, tokened).await?;
    let out = gate.writer.complete(w, req).await;
    if out.is_ok() {
        gate.uploads.forget(binding.upload_id()).await;
    }
    out
}

pub async fn abort(
    gate: &Gate,
    req: S3Request<AbortMultipartUploadInput>,
) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
    const OP: Op = Op::AbortMultipartUpload;
    let (binding, tokened) = bound(gate, OP, &req).await?;
    let resp = gate
        .writer
        .abort_upload(&binding, req)
        .await
        .map_err(errors::from_backend)?;
    gate.uploads.forget(binding.upload_id()).await;
    gate.refuser.count(OP, tokened.scope(), Outcome::Accepted);
    Ok(resp)
}
