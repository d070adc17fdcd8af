//! DeleteObject and DeleteObjects.
//!
//! A delete is a write: it needs a token that passes the scope's fence and
//! the key's stored token, and it goes out only through
//! [`crate::gate::Writer::delete`], with `If-Match: <etag>` of the version
//! the proxy verified (a key verified absent is not sent at all).
//! DeleteObjects is decided key by key the same way, each key an individual
//! conditional delete, and answered in one DeleteObjects result.

use crate::errors;
use crate::gate::{Gate, RequestToken, WriteOp};
use s3s::dto::{
    DeleteObjectInput, DeleteObjectOutput, DeleteObjectsInput, DeleteObjectsOutput, DeletedObject,
    Error as KeyError,
};
use s3s::{S3Request, S3Response, S3Result};

/// S3's limit on the keys of one DeleteObjects request.
pub const MAX_KEYS_PER_DELETE: usize = 1000;

pub async fn delete_object(
    gate: &Gate,
    mut req: S3Request<DeleteObjectInput>,
) -> S3Result<S3Response<DeleteObjectOutput>> {
    let op = WriteOp::Delete;
    let scoped = gate
        .scoping
        .scope(op.op(), &req.input.bucket, &req.input.key)?;
    let tokened = gate.tokens.required(scoped, RequestToken::of(&req)).await?;
    let w = gate.admitter.begin(op, tokened).await?;
    let version_id = req.input.version_id.take();
    let out = gate
        .writer
        .delete(w, version_id, req.input.if_match.take())
        .await?;
    Ok(S3Response::new(out))
}

/// Whether a DeleteObjects to `bucket` may have its body read: its token
/// (header or lease-bound credentials) is genuine for the lock fencing
/// the bucket (or the part of it that lock fences) and not below that
/// lock's max. The keys are in the body, so each is decided again there;
/// this answers what the request would be answered if it named a key of
/// the lock its token names.
pub async fn may_delete_batch(gate: &Gate, bucket: &str, token: RequestToken<'_>) -> S3Result<()> {
    let op = WriteOp::DeleteMany.op();
    if let Some(scoped) = crate::tokens::named_lock(token.headers, token.access_key)
        .and_then(|lock| gate.scoping.scope_in_bucket(op, bucket, &lock))
    {
        return gate
            .tokens
            .refuse_if_stale(&gate.tokens.required(scoped, token).await?);
    }
    // A plain number names no lock: it proves its right if it passes the
    // fence of one of the bucket's scopes (the handler then decides each
    // key), and is refused as the first of them would refuse it.
    let mut candidates = gate.scoping.scopes_in_bucket(op, bucket).peekable();
    if candidates.peek().is_none() {
        let scoped = gate.scoping.scope(op, bucket, "")?;
        return gate
            .tokens
            .refuse_if_stale(&gate.tokens.required(scoped, token).await?);
    }
    let mut refusal = None;
    for (i, scoped) in candidates.enumerate() {
        let checked = match gate.tokens.required(scoped, token).await {
            Ok(t) => gate.tokens.refuse_if_stale(&t),
            Err(e) => Err(e),
        };
        match checked {
            Ok(()) => return Ok(()),
            Err(e) if i == 0 => refusal = Some(e),
            Err(_) => {}
        }
    }
    Err(refusal.unwrap_or_else(|| errors::unscoped(bucket, "", &[], 0)))
}

pub async fn delete_objects(
    gate: &Gate,
    req: S3Request<DeleteObjectsInput>,
) -> S3Result<S3Response<DeleteObjectsOutput>> {
    let op = WriteOp::DeleteMany;
    let bucket = req.input.bucket.clone();
    let quiet = req.input.delete.quiet.unwrap_or(false);
    let objects = req.input.delete.objects.clone();
    if objects.is_empty() {
        return Err(s3s::s3_error!(MalformedXML, "DeleteObjects names no keys"));
    }
    if objects.len() > MAX_KEYS_PER_DELETE {
        return Err(s3s::s3_error!(
            MalformedXML,
            "DeleteObjects names {} keys; S3 allows at most {MAX_KEYS_PER_DELETE} per request",
            objects.len()
        ));
    }
    // Every key must be one the proxy accepts, and the request's token
    // must pass every key's scope, before any key is touched.
    for obj in &objects {
        crate::object_key::require(&obj.key)?;
    }
    let mut decided = Vec::with_capacity(objects.len());
    for obj in &objects {
        let scoped = gate.scoping.scope(op.op(), &bucket, &obj.key)?;
        let tokened = gate.tokens.required(scoped, RequestToken::of(&req)).await?;
        gate.tokens.refuse_if_stale(&tokened)?;
        decided.push((obj, tokened));
    }
    let mut deleted = Vec::new();
    let mut errors = Vec::new();
    for (obj, tokened) in decided {
        let one = async {
            let w = gate.admitter.begin(op, tokened).await?;
            gate.writer.delete(w, obj.version_id.clone(), None).await
        };
        match one.await {
            Ok(_) => deleted.push(DeletedObject {
                key: Some(obj.key.clone()),
                version_id: obj.version_id.clone(),
                ..Default::default()
            }),
            Err(e) => errors.push(KeyError {
                code: Some(e.code().as_str().to_owned()),
                key: Some(obj.key.clone()),
                message: e.message().map(str::to_owned),
                version_id: obj.version_id.clone(),
            }),
        }
    }
    let output = DeleteObjectsOutput {
        deleted: (!quiet && !deleted.is_empty()).then_some(deleted),
        errors: (!errors.is_empty()).then_some(errors),
        ..Default::default()
    };
    Ok(S3Response::new(output))
}
