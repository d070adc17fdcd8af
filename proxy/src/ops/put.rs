//! PutObject: the common fenced write.

use crate::gate::{Gate, RequestToken, WriteOp};
use s3s::dto::{PutObjectInput, PutObjectOutput};
use s3s::{S3Request, S3Response, S3Result};

/// The largest body a PutObject may hold in memory to be sent twice.
const RESENDABLE_MAX_BYTES: i64 = 256 * 1024;

pub async fn put_object(
    gate: &Gate,
    req: S3Request<PutObjectInput>,
) -> S3Result<S3Response<PutObjectOutput>> {
    let scoped = gate.scope(WriteOp::Put.name(), &req.input.bucket, &req.input.key)?;
    let tokened = gate.required_token(scoped, RequestToken::of(&req)).await?;
    // A small body the lean path sends as is may be held in memory, so
    // that a key the proxy knows nothing of can be written without reading
    // it first (one round trip for a new key): only with room in the body
    // budget, and without client conditions (they need the key read).
    let len = req.input.content_length.unwrap_or(i64::MAX);
    let held = (len <= RESENDABLE_MAX_BYTES
        && req.input.if_match.is_none()
        && req.input.if_none_match.is_none()
        && crate::lean::eligible(&req))
    .then(|| {
        gate.body_budget()
            .try_hold(usize::try_from(len).unwrap_or(usize::MAX))
    })
    .flatten();
    let w = gate.begin_put(tokened, held.is_some()).await?;
    w.put(gate, req, held).await
}
