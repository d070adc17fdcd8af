//! DeleteObject and DeleteObjects.
//!
//! A delete is a write: it needs a token that passes the scope's fence and
//! the key's stored token, and it is sent with `If-Match: <etag>` of the
//! version the proxy checked (where the store enforces it; see the probe).
//! DeleteObjects is decided key by key the same way, each key an individual
//! conditional delete, and answered in one DeleteObjects result.

use crate::gate::Gate;
use crate::keys::Known;
use s3s::dto::{
    DeleteObjectInput, DeleteObjectOutput, DeleteObjectsInput, DeleteObjectsOutput, DeletedObject,
    ETag, ETagCondition, Error as KeyError,
};
use s3s::{S3, S3Request, S3Response, S3Result};

const OP: &str = "DeleteObject";
const OP_MANY: &str = "DeleteObjects";

pub async fn delete_object(
    gate: &Gate,
    mut req: S3Request<DeleteObjectInput>,
) -> S3Result<S3Response<DeleteObjectOutput>> {
    let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
    let scope = gate.scope(OP, &bucket, &key)?;
    let token = gate
        .required_token(OP, crate::gate::RequestToken::of(&req), &scope)
        .await?;
    let w = gate.begin(OP, &bucket, &key, scope, token).await?;
    let (if_match, _) = super::conditions(&w.known, req.input.if_match.take(), None)?;
    // Deleting an absent key is a no-op the store answers 204 to; no
    // condition is needed (and If-None-Match is not defined for DELETE).
    req.input.if_match = if_match;
    let result = gate
        .call_conditional(
            &bucket,
            |r| r.delete_if_match,
            gate.backend.forward.delete_object(req),
        )
        .await;
    gate.finish(w, result, |_| Some(Known::Absent)).await
}

pub async fn delete_objects(
    gate: &Gate,
    req: S3Request<DeleteObjectsInput>,
) -> S3Result<S3Response<DeleteObjectsOutput>> {
    let bucket = req.input.bucket.clone();
    let quiet = req.input.delete.quiet.unwrap_or(false);
    let objects = req.input.delete.objects.clone();
    if objects.is_empty() {
        return Err(s3s::s3_error!(MalformedXML, "DeleteObjects names no keys"));
    }
    // Decide the whole request's token against every scope first: a stale
    // or missing token refuses the request before any key is touched.
    let mut decided = Vec::with_capacity(objects.len());
    for obj in &objects {
        let scope = gate.scope(OP_MANY, &bucket, &obj.key)?;
        let token = gate
            .required_token(OP_MANY, crate::gate::RequestToken::of(&req), &scope)
            .await?;
        let max = gate.fences.max(&scope.id);
        if token < max {
            gate.metrics.write(OP_MANY, &scope.id, "stale");
            return Err(crate::errors::stale(
                token,
                max,
                &format!(" in fence scope {}", scope.id),
            ));
        }
        decided.push((obj, scope, token));
    }
    let mut deleted = Vec::new();
    let mut errors = Vec::new();
    for (obj, scope, token) in decided {
        match delete_one(
            gate,
            &bucket,
            &obj.key,
            obj.version_id.clone(),
            scope,
            token,
        )
        .await
        {
            Ok(()) => deleted.push(DeletedObject {
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

async fn delete_one(
    gate: &Gate,
    bucket: &str,
    key: &str,
    version_id: Option<String>,
    scope: crate::scope::Scope,
    token: u64,
) -> S3Result<()> {
    let w = gate.begin(OP_MANY, bucket, key, scope, token).await?;
    let mut b = gate
        .backend
        .client
        .delete_object()
        .bucket(bucket)
        .key(key)
        .set_version_id(version_id);
    if let Some(ETagCondition::ETag(ETag::Strong(etag))) =
        super::conditions(&w.known, None, None)?.0
    {
        b = b.if_match(format!("\"{etag}\""));
    }
    let result = b
        .send()
        .await
        .map(|_| ())
        .map_err(crate::backend::sdk_error);
    gate.finish(w, result, |_| Some(Known::Absent)).await
}
