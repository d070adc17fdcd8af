//! PutObject: the common fenced write.

use crate::gate::Gate;
use crate::keys::Known;
use s3s::dto::{PutObjectInput, PutObjectOutput};
use s3s::{S3, S3Request, S3Response, S3Result};

const OP: &str = "PutObject";

pub async fn put_object(
    gate: &Gate,
    mut req: S3Request<PutObjectInput>,
) -> S3Result<S3Response<PutObjectOutput>> {
    let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
    let scope = gate.scope(OP, &bucket, &key)?;
    let token = gate
        .required_token(OP, crate::gate::RequestToken::of(&req), &scope)
        .await?;
    let w = gate.begin(OP, &bucket, &key, scope, token).await?;

    let input = &mut req.input;
    (input.if_match, input.if_none_match) =
        super::conditions(&w.known, input.if_match.take(), input.if_none_match.take())?;
    super::tag(&mut input.metadata, token);
    input.content_encoding = super::strip_aws_chunked(input.content_encoding.take());
    let watch = gate.watch_body(&mut input.body, &w.admission.cancel);
    let result = gate
        .call_watched(gate.backend.forward.put_object(req), watch)
        .await;
    gate.finish(w, result, |out| {
        Some(Known::Present {
            etag: out.output.e_tag.as_ref()?.value().to_owned(),
            token,
        })
    })
    .await
}
