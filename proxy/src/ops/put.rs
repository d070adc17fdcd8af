//! PutObject: the common fenced write, from either door (the edge, or
//! s3s) as one [`PutRequest`], through the gate's stages to the `Writer`.

use crate::gate::{Gate, RequestToken, WriteOp};
use crate::request::PutRequest;
use s3s::dto::{PutObjectInput, PutObjectOutput};
use s3s::{S3Request, S3Response, S3Result};

/// The largest body a PutObject may hold in memory to be sent twice.
const RESENDABLE_MAX_BYTES: i64 = 256 * 1024;

/// A PutObject s3s parsed.
pub async fn put_object(
    gate: &Gate,
    req: S3Request<PutObjectInput>,
) -> S3Result<S3Response<PutObjectOutput>> {
    put(
        gate,
        PutRequest::from_s3s(req, gate.store.has_lean_forwarder()),
    )
    .await
}

/// Scope, token, admission, then the write.
pub async fn put(gate: &Gate, req: PutRequest) -> S3Result<S3Response<PutObjectOutput>> {
    let scoped = gate
        .scoping
        .scope(WriteOp::Put.op(), &req.bucket, &req.key)?;
    let who = RequestToken {
        headers: &req.headers,
        access_key: req.access_key.as_deref(),
    };
    let tokened = gate.tokens.required(scoped, who).await?;
    // A small body the lean path sends as is may be held in memory, so
    // that a key the proxy knows nothing of can be written without reading
    // it first (one round trip for a new key): only with room in the body
    // budget, and without client conditions (they need the key read).
    let len = req.content_length.unwrap_or(i64::MAX);
    let held = (len <= RESENDABLE_MAX_BYTES
        && req.if_match.is_none()
        && req.if_none_match.is_none()
        && req.is_lean())
    .then(|| {
        gate.body_budget()
            .try_hold(usize::try_from(len).unwrap_or(usize::MAX))
    })
    .flatten();
    let w = gate.admitter.begin_put(tokened, held.is_some()).await?;
    gate.writer.put(w, req, held).await
}
