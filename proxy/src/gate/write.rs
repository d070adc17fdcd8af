//! The only way anything reaches the store's write API.
//!
//! An object write (Put, Copy, Delete, Complete) is sent by the [`Writer`]
//! for an [`Admitted`] write, which only admission makes: it holds the
//! scope's admission, the key's lock and what the proxy verified the store
//! holds. The write (`Write`, private here) sets the conditions
//! itself from that state (`If-None-Match: *` or `If-Match: <etag>`, the
//! client's own conditions checked first), tags the object with the token,
//! applies the one timeout policy of writes (`call_write`), ends the write
//! (`finish`: the outcome, what the store now holds, or [`linger`] while
//! an unanswered write may still commit) and, when the store refuses a
//! condition, re-decides (`redecide`). The ops never see the SDK or the
//! forwarder, so an unconditional write cannot be written in them. A PUT
//! reads, from the socket, `server`, `edge` (which makes its
//! `request::PutRequest`), `ops/put`, then `gate/scope`, `gate/token`,
//! `gate/admission` and this file, which hands it to `lean`.
//!
//! The other mutating calls (creating an upload, sending or copying a part,
//! aborting) change no object and carry no condition; each needs a witness
//! that the fence let it through: an [`Admission`] of the upload's scope,
//! or for an abort the upload's verified binding.

use super::admission::{Admitted, Inflight, Parts};
use super::call::Call;
use super::refusal::Refuser;
use super::store::Store;
use crate::body::{BodyWatch, Cancellable};
use crate::errors;
use crate::fences::{Admission, Fences};
use crate::keys::{KeyGuard, Known};
use crate::metrics::{Metrics, Outcome};
use crate::op::Op;
use crate::request::{PutRequest, Route};
use crate::scope::Scope;
use crate::tokens::VerifiedToken;
use crate::tokens::upload::UploadBinding;
use s3s::S3Error;
use s3s::dto::*;
use s3s::{S3, S3Request, S3Response, S3Result};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// What a CopyObject writes at its destination, besides the data.
#[derive(Debug, Default)]
pub struct CopySpec {
    /// `x-amz-copy-source`: `bucket/encoded-key[?versionId=...]`.
    pub source: String,
    pub storage_class: Option<String>,
    /// The client's source conditions (AWS's spelling), which the proxy
    /// checked against the source it read; sent again so that a store that
    /// reads them also checks them at the copy itself.
    pub source_if_match: Option<String>,
    pub source_if_none_match: Option<String>,
    pub source_if_modified_since: Option<aws_smithy_types::DateTime>,
    pub source_if_unmodified_since: Option<aws_smithy_types::DateTime>,
    pub content_type: Option<String>,
    pub cache_control: Option<String>,
    pub content_disposition: Option<String>,
    pub content_encoding: Option<String>,
    pub content_language: Option<String>,
    pub metadata: Option<Metadata>,
}

/// An admitted write being sent: its [`Parts`] and the client that writes
/// in its store's dialect.
#[derive(Debug)]
struct Write {
    a: Parts,
    client: aws_sdk_s3::Client,
}

/// The write stage's state: the store, the fences (a write is cut or
/// refused by them), and the timeouts of writes.
#[derive(Debug)]
pub struct Writer {
    store: Arc<Store>,
    fences: Fences,
    refuser: Refuser,
    metrics: Arc<Metrics>,
    /// How long the store may still commit a write after its connection
    /// closed (`backend.store_decision_secs`).
    store_decision: Duration,
    /// How long a client may send nothing in the middle of a body.
    client_idle: Duration,
    /// Large uploads read ahead of the store at once (see `read_ahead`).
    read_aheads: crate::read_ahead::ReadAheads,
}

impl Writer {
    pub fn new(
        store: Arc<Store>,
        fences: Fences,
        refuser: Refuser,
        metrics: Arc<Metrics>,
        store_decision: Duration,
        client_idle: Duration,
    ) -> Writer {
        Writer {
            store,
            fences,
            refuser,
            metrics,
            store_decision,
            client_idle,
            read_aheads: crate::read_ahead::ReadAheads::default(),
        }
    }

    /// How long a client may take over a body the proxy waits for.
    pub fn client_idle(&self) -> Duration {
        self.client_idle
    }

    fn write(&self, a: Admitted) -> Write {
        let a = a.parts();
        let client = self.store.backend().writes(a.dialect);
        Write { a, client }
    }

    /// Sends a PutObject over the verified state. `held` is the body's
    /// share of the body budget when the write may hold the body in memory
    /// (see [`super::admission::Admitter::begin_put`]).
    pub async fn put(
        &self,
        a: Admitted,
        req: PutRequest,
        held: Option<crate::early::Held>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        self.write(a).put(self, req, held).await
    }

    /// Deletes the key with `If-Match` of the verified state (see
    /// `Write::delete`).
    pub async fn delete(
        &self,
        a: Admitted,
        version_id: Option<String>,
        client_if_match: Option<IfMatch>,
    ) -> S3Result<DeleteObjectOutput> {
        self.write(a)
            .delete(self, version_id, client_if_match)
            .await
    }

    /// Copies `spec.source` to the key (see `Write::copy`).
    pub async fn copy(&self, a: Admitted, spec: CopySpec) -> S3Result<CopyObjectOutput> {
        self.write(a).copy(self, spec).await
    }

    /// Completes a multipart upload over the verified state.
    pub async fn complete(
        &self,
        a: Admitted,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        self.write(a).complete(self, req).await
    }
}

impl Write {
    async fn put(
        mut self,
        writer: &Writer,
        mut req: PutRequest,
        held: Option<crate::early::Held>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let token = self.a.token;
        let trailing = match &req.route {
            Route::Sdk(rest) => rest.trailing_headers.as_ref(),
            Route::Lean(_) => None,
        };
        let anonymous = req.anonymous();
        // Upstream of the trailer's check and the cut, which the store's
        // side polls: a raise still stops the body before its end.
        if matches!(req.route, Route::Lean(_)) {
            let length = req.content_length;
            req.body = req.body.take().map(|b| writer.read_aheads.wrap(b, length));
        }
        let verdict = crate::trailer::check(&mut req.body, &req.headers, trailing, anonymous);
        let conds = conditions(&self.a.known, req.if_match.take(), req.if_none_match.take())?;
        let watch = writer.watch_body(&mut req.body, self.a.admission.cancel());
        if let Err(e) = crate::trailer::settle_empty(&mut req.body, &req.headers, &verdict).await {
            let e = crate::body::unless_stalled(watch.as_ref(), e);
            return writer
                .finish(self, Sent::Answered(Err(e)), put_holds(token))
                .await;
        }
        let lean = match (req.route, writer.store.backend().lean().cloned()) {
            (Route::Lean(_), Some(lean)) => lean,
            (Route::Sdk(mut rest), _) => {
                let input = &mut rest.input;
                (input.if_match, input.if_none_match) = conds;
                input.body = req.body;
                tag(&mut input.metadata, token);
                input.content_encoding = strip_aws_chunked(input.content_encoding.take());
                let forward = s3s_aws::Proxy::from(self.client.clone());
                let call = async move { forward.put_object(*rest).await };
                let sent = bad_digest(writer.call_write(Box::pin(call), watch).await, &verdict);
                return writer.finish(self, sent, put_holds(token)).await;
            }
            (Route::Lean(_), None) => {
                return Err(s3s::s3_error!(
                    InternalError,
                    "a PutObject routed to the lean forwarder, which this backend does not have"
                ));
            }
        };
        writer.metrics.lean_forwards.inc();
        let length = req.content_length.and_then(|l| u64::try_from(l).ok());
        let put = lean.prepare(
            (&req.bucket, &req.key),
            &req.headers,
            length.unwrap_or(0),
            token,
        )?;
        let dialect = self.a.dialect;
        let body = req.body;
        let (true, Some(held)) = (self.a.presumed, held) else {
            let body = crate::lean::body_of(body);
            let call = async move { lean.send(put, conds, dialect, body).await };
            let sent = bad_digest(writer.call_write(Box::pin(call), watch).await, &verdict);
            return writer.finish(self, sent, put_holds(token)).await;
        };

        // Presumed absent: the body is held in memory, so that if the key
        // exists after all (the store refuses `If-None-Match: *`), it can
        // be read and the body sent again over what it holds.
        let bytes = match collect(body).await {
            Ok(b) => b,
            Err(e) => {
                let e = crate::body::unless_stalled(
                    watch.as_ref(),
                    verdict.failed().unwrap_or_else(|| {
                        s3s::s3_error!(IncompleteBody, "the request body ended early: {e}")
                    }),
                );
                return writer
                    .finish(self, Sent::Answered(Err(e)), put_holds(token))
                    .await;
            }
        };
        let first = {
            let (lean, put, bytes) = (lean.clone(), put.clone(), bytes.clone());
            let call = async move {
                let body = crate::lean::full(bytes);
                lean.send(put, conds, dialect, body).await
            };
            writer.call_write(Box::pin(call), None).await
        };
        match &first {
            Sent::Answered(Err(e))
                if crate::errors::is_condition_failure(e)
                    && !self.a.admission.cancel().is_cancelled() => {}
            _ => return writer.finish(self, first, put_holds(token)).await,
        }
        let (bucket, key) = (self.a.key.bucket().to_owned(), self.a.key.key().to_owned());
        let stored = match writer.store.head(&bucket, &key).await {
            Ok(k) => k,
            Err(e) => {
                return writer
                    .finish(self, Sent::Answered(Err(e)), put_holds(token))
                    .await;
            }
        };
        self.a.key.remember(stored.clone());
        writer.refuser.refuse_if_overwritten(
            self.a.op.op(),
            &self.a.scope,
            token,
            &bucket,
            &key,
            &stored,
        )?;
        self.a.known = stored;
        let conds = conditions(&self.a.known, None, None)?;
        let call = async move {
            let _held = held;
            let body = crate::lean::full(bytes);
            lean.send(put, conds, dialect, body).await
        };
        let second = writer.call_write(Box::pin(call), None).await;
        writer.finish(self, second, put_holds(token)).await
    }

    /// Deletes the key (the version `version_id`, if given) with
    /// `If-Match` of the verified state. A key verified absent is not sent
    /// at all: the store would answer 204 to it, and there is no condition
    /// that could make a DELETE of an absent key safe.
    async fn delete(
        self,
        writer: &Writer,
        version_id: Option<String>,
        client_if_match: Option<IfMatch>,
    ) -> S3Result<DeleteObjectOutput> {
        let (if_match, _) = conditions(&self.a.known, client_if_match, None)?;
        let Some(ETagCondition::ETag(etag)) = if_match else {
            let out = Sent::Answered(Ok(DeleteObjectOutput::default()));
            return writer.finish(self, out, |_| Some(Known::Absent)).await;
        };
        // In AWS's spelling; the store's dialect rewrites it (`Respell`).
        let call = self
            .client
            .delete_object()
            .bucket(self.a.key.bucket())
            .key(self.a.key.key())
            .set_version_id(version_id)
            .if_match(format!("\"{}\"", etag.value()))
            .send();
        let sent = writer
            .call_write(
                Box::pin(async move {
                    call.await
                        .map_err(crate::backend::sdk_error)
                        .map(|out| DeleteObjectOutput {
                            delete_marker: out.delete_marker(),
                            version_id: out.version_id().map(str::to_owned),
                            ..Default::default()
                        })
                }),
                None,
            )
            .await;
        writer.finish(self, sent, |_| Some(Known::Absent)).await
    }

    /// Copies `spec.source` to the key, replacing its metadata with
    /// `spec.metadata` plus the token.
    async fn copy(self, writer: &Writer, spec: CopySpec) -> S3Result<CopyObjectOutput> {
        let token = self.a.token;
        let (if_match, if_none_match) = conditions(&self.a.known, None, None)?;
        let spec_conditioned = spec.source_if_match.is_some()
            || spec.source_if_none_match.is_some()
            || spec.source_if_modified_since.is_some()
            || spec.source_if_unmodified_since.is_some();
        let mut metadata = spec.metadata;
        tag(&mut metadata, token);
        // Conditions in AWS's spelling and names; the store's dialect
        // rewrites them (`Respell`).
        let mut b = self
            .client
            .copy_object()
            .bucket(self.a.key.bucket())
            .key(self.a.key.key())
            .copy_source(spec.source)
            .metadata_directive(aws_sdk_s3::types::MetadataDirective::Replace)
            .set_storage_class(spec.storage_class.as_deref().map(Into::into))
            .set_copy_source_if_match(spec.source_if_match)
            .set_copy_source_if_none_match(spec.source_if_none_match)
            .set_copy_source_if_modified_since(spec.source_if_modified_since)
            .set_copy_source_if_unmodified_since(spec.source_if_unmodified_since)
            .set_content_type(spec.content_type)
            .set_cache_control(spec.cache_control)
            .set_content_disposition(spec.content_disposition)
            .set_content_encoding(spec.content_encoding)
            .set_content_language(spec.content_language)
            .set_metadata(metadata);
        if let Some(ETagCondition::ETag(e)) = if_match {
            b = b.if_match(format!("\"{}\"", e.value()));
        }
        if if_none_match.is_some() {
            b = b.if_none_match("*");
        }
        let sent = writer
            .call_write(
                Box::pin(async move {
                    b.send()
                        .await
                        .map_err(|e| source_changed(crate::backend::sdk_error(e)))
                        .map(copied)
                }),
                None,
            )
            .await;
        // The store refused a copy that carried the client's source
        // conditions: if the destination is as the proxy verified it, the
        // refusal was the source condition's, and the client's 412 (a
        // re-decision would answer 503, and the retry meet the same 412).
        if spec_conditioned
            && let Sent::Answered(Err(e)) = &sent
            && crate::errors::is_condition_failure(e)
        {
            let (bucket, key) = (self.a.key.bucket().to_owned(), self.a.key.key().to_owned());
            if let Ok(now) = writer.store.head(&bucket, &key).await
                && now == self.a.known
            {
                return Err(s3s::s3_error!(
                    PreconditionFailed,
                    "the copy source's condition (x-amz-copy-source-if-*) does not hold at the store"
                ));
            }
        }
        writer
            .finish(self, sent, |out| {
                Some(Known::Present {
                    etag: out
                        .copy_object_result
                        .as_ref()?
                        .e_tag
                        .as_ref()?
                        .value()
                        .to_owned(),
                    token,
                })
            })
            .await
    }

    async fn complete(
        self,
        writer: &Writer,
        mut req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let token = self.a.token;
        let input = &mut req.input;
        (input.if_match, input.if_none_match) = conditions(
            &self.a.known,
            input.if_match.take(),
            input.if_none_match.take(),
        )?;
        let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
        let call = send_complete(self.client.clone(), req.input);
        let sent = match writer.call_write(Box::pin(call), None).await {
            // The store said it committed but gave no ETag (see
            // `send_complete`): read back what it holds.
            Sent::Answered(Ok(out)) if out.output.e_tag.is_none() => Sent::Answered(
                read_back(writer, bucket, key, token)
                    .await
                    .ok_or_else(|| {
                        s3s::s3_error!(
                            InternalError,
                            "the store completed the upload without an ETag, and the key does not hold it now"
                        )
                    }),
            ),
            other => other,
        };
        writer
            .finish(self, sent, |out| {
                Some(Known::Present {
                    etag: out.output.e_tag.as_ref()?.value().to_owned(),
                    token,
                })
            })
            .await
    }
}

impl Writer {
    /// Creates a multipart upload in a scope that admitted it.
    pub async fn create_upload(
        &self,
        admitted: &Admission,
        mut req: S3Request<CreateMultipartUploadInput>,
        token: VerifiedToken,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        tag(&mut req.input.metadata, token.number());
        req.input.content_encoding = strip_aws_chunked(req.input.content_encoding.take());
        self.store
            .call(
                Box::pin(self.store.backend().create_upload(admitted, req)),
                None,
            )
            .await
    }

    /// Sends a part of an upload whose token the scope admitted.
    pub async fn upload_part(
        &self,
        admitted: &Admission,
        mut req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        crate::trailer::hoist_query_checksums(&req.uri, &mut req.headers);
        let verdict = crate::trailer::check(
            &mut req.input.body,
            &req.headers,
            req.trailing_headers.as_ref(),
            req.credentials.is_none(),
        );
        let watch = self.watch_body(&mut req.input.body, admitted.cancel());
        if let Err(e) =
            crate::trailer::settle_empty(&mut req.input.body, &req.headers, &verdict).await
        {
            return Err(crate::body::unless_stalled(watch.as_ref(), e));
        }
        self.call_watched(
            Box::pin(self.store.backend().upload_part(admitted, req)),
            watch,
        )
        .await
        .map_err(|e| verdict.failed().unwrap_or(e))
    }

    /// Copies a part of an upload whose token the scope admitted, its
    /// source conditions written as the store reads them.
    pub async fn upload_part_copy(
        &self,
        _admitted: &Admission,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let forward = s3s_aws::Proxy::from(self.store.writes_to(&req.input.bucket));
        self.store
            .call(
                Box::pin(
                    async move { forward.upload_part_copy(req).await.map_err(source_changed) },
                ),
                None,
            )
            .await
    }

    /// Aborts an upload. It changes no object, so the upload's own client
    /// may abort it even after a newer token was admitted (a stale writer
    /// cleaning up its parts); `_bound` is the verified binding.
    pub async fn abort_upload(
        &self,
        bound: &UploadBinding,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        self.store
            .call(
                Box::pin(self.store.backend().abort_upload(bound, req)),
                None,
            )
            .await
    }
}

/// Sends a CompleteMultipartUpload with the SDK: not through s3s-aws,
/// whose conversion of the answer fails on an empty ETag.
async fn send_complete(
    client: aws_sdk_s3::Client,
    input: CompleteMultipartUploadInput,
) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
    use s3s_aws::conv::{try_from_aws, try_into_aws};
    let b = client
        .complete_multipart_upload()
        .set_bucket(Some(input.bucket))
        .set_key(Some(input.key))
        .set_upload_id(Some(input.upload_id))
        .set_checksum_crc32(input.checksum_crc32)
        .set_checksum_crc32_c(input.checksum_crc32c)
        .set_checksum_crc64_nvme(input.checksum_crc64nvme)
        .set_checksum_sha1(input.checksum_sha1)
        .set_checksum_sha256(input.checksum_sha256)
        .set_checksum_type(try_into_aws(input.checksum_type)?)
        .set_expected_bucket_owner(input.expected_bucket_owner)
        .set_if_match(try_into_aws(input.if_match)?)
        .set_if_none_match(try_into_aws(input.if_none_match)?)
        .set_mpu_object_size(input.mpu_object_size)
        .set_multipart_upload(try_into_aws(input.multipart_upload)?)
        .set_request_payer(try_into_aws(input.request_payer)?)
        .set_sse_customer_algorithm(input.sse_customer_algorithm)
        .set_sse_customer_key(input.sse_customer_key)
        .set_sse_customer_key_md5(input.sse_customer_key_md5);
    let mut out = match b.send().await {
        Ok(out) => out,
        // A 200 whose body is no `<Error>` but that the SDK cannot read
        // (moto names the root element of a conditional Complete's answer
        // `CompleteMultipartUploadResponse`): the store committed.
        Err(e) if crate::backend::status_of(&e) == Some(200)
            && aws_sdk_s3::error::ProvideErrorMetadata::code(&e).is_none() =>
        {
            aws_sdk_s3::operation::complete_multipart_upload::CompleteMultipartUploadOutput::builder()
                .build()
        }
        // AWS may answer 200 with an `<Error>` body: not committed, and
        // not a success to pass on either.
        Err(e) => {
            let mut err = crate::backend::sdk_error(e);
            if err.status_code().is_some_and(|s| s.is_success()) {
                err.set_status_code(http::StatusCode::SERVICE_UNAVAILABLE);
                err = crate::errors::from_backend(err);
            }
            return Err(err);
        }
    };
    // Ceph RGW 16.2 answers every Complete with an empty `<ETag>`.
    if out.e_tag.as_deref().is_some_and(|e| e.trim().is_empty()) {
        out.e_tag = None;
    }
    Ok(S3Response::new(try_from_aws(out)?))
}

/// The answer to a Complete the store said it committed without saying
/// its ETag: what the key holds, if it holds this write's token.
async fn read_back(
    writer: &Writer,
    bucket: String,
    key: String,
    token: u64,
) -> Option<S3Response<CompleteMultipartUploadOutput>> {
    match writer.store.head(&bucket, &key).await {
        Ok(Known::Present { etag, token: t }) if t == token => {
            Some(S3Response::new(CompleteMultipartUploadOutput {
                bucket: Some(bucket),
                key: Some(key),
                e_tag: Some(ETag::Strong(etag)),
                ..Default::default()
            }))
        }
        _ => None,
    }
}

/// A write's backend call, which can outlive the request.
type Pending<T> = Call<'static, T>;

/// What a write's backend call came to within the answer timeout.
enum Sent<T> {
    Answered(S3Result<T>),
    /// No answer in time: the request is still out, and the store may
    /// still commit it.
    Unanswered(Pending<T>),
    /// No answer at all: the connection ended after the request may have
    /// left whole (`no_answer`), and the store may still commit it; what
    /// ended it.
    Lost(String),
}

/// Keeps a write the store did not answer from letting go of its
/// admission and key while the store may still commit it; runs on its own
/// task, after the client got its 503.
///
/// It lets go when the store answers (a `pending` call), or else once the
/// request's backend connection is closed (dropping the call closes it; a
/// lost call's is closed already) and `decision` has passed: a store that
/// has not committed a request by then, with its client gone, is assumed
/// never to. A pending call's connection is closed as soon as a raise
/// wants in (the epoch is cut), or after waiting `decision` for an answer,
/// so a raise waits at most about `decision` for a write that timed out,
/// and about twice that in all.
async fn linger<T>(
    pending: Option<Pending<T>>,
    hold: (Admission, KeyGuard, Inflight),
    decision: Duration,
    metrics: Arc<Metrics>,
) {
    // Counted by the caller before this task was spawned, and not on
    // drop: a linger cut short (the runtime stopping) leaves the count up,
    // and the stop unclean.
    let answered = match pending {
        Some(mut pending) => {
            let cut = hold.0.cancel().clone();
            tokio::select! {
                _ = &mut pending => true,
                () = cut.cancelled() => false,
                () = tokio::time::sleep(decision) => false,
            }
        }
        None => false,
    };
    if !answered {
        tokio::time::sleep(decision).await;
    }
    drop(hold);
    metrics.lingering_writes.dec();
}

impl Writer {
    /// Awaits an object write's backend call with the same answer timeout
    /// as the calls that change no object (`call`), counted from the body's last byte (a body cut for
    /// a silent client answers 400 RequestTimeout). A call not answered in
    /// time is handed back [`Sent::Unanswered`], still running: the store
    /// may yet commit it, so [`Writer::finish`] keeps its admission and key
    /// until it can no longer commit (see [`linger`]).
    async fn call_write<T>(&self, mut fut: Pending<T>, watch: Option<BodyWatch>) -> Sent<T> {
        if let Some(c) = self.fences.cluster()
            && !c.admits()
        {
            // Checked again just before the request goes out (a held body
            // is sent in one piece, after its chunks were checked).
            return Sent::Answered(Err(errors::storage(format!(
                "{}; nothing was sent to the store",
                c.why_not()
            ))));
        }
        let timeout = self.store.timeout();
        let sent = watch.as_ref().map(|w| w.sent.clone());
        let deadline = async {
            if let Some(sent) = sent {
                sent.notified().await;
            }
            tokio::time::sleep(timeout).await;
        };
        tokio::select! {
            r = &mut fut => match r {
                Err(e) => match crate::no_answer::may_have_landed(&e) {
                    Some(lost) => Sent::Lost(lost.cause()),
                    None => Sent::Answered(Err(crate::body::unless_stalled(watch.as_ref(), e))),
                },
                Ok(out) => Sent::Answered(Ok(out)),
            },
            () = deadline => Sent::Unanswered(fut),
        }
    }

    /// Wraps a write's request body so that a newer epoch (`cancel`) or a
    /// silent client cuts it; `None` for a request without a body.
    fn watch_body(
        &self,
        body: &mut Option<StreamingBlob>,
        cancel: &CancellationToken,
    ) -> Option<BodyWatch> {
        let watch = BodyWatch::new(self.client_idle);
        *body = Some(Cancellable::wrap(
            body.take()?,
            cancel.clone(),
            self.fences.standing_check(),
            &watch,
        ));
        Some(watch)
    }

    /// A call that changes no object, whose body [`Writer::watch_body`] wrapped:
    /// the answer timeout counts from the body's last byte, and a body cut
    /// for a silent client answers 400 RequestTimeout.
    async fn call_watched<T>(&self, fut: Call<'_, T>, watch: Option<BodyWatch>) -> S3Result<T> {
        let sent = watch.as_ref().map(|w| w.sent.clone());
        self.store
            .call(fut, sent)
            .await
            .map_err(|e| crate::body::unless_stalled(watch.as_ref(), e))
    }

    /// Ends a write: records the outcome and what the store now holds.
    ///
    /// A write the store did not answer, in time or at all, is not over: it
    /// may still commit. It keeps its admission (so no raise is admitted
    /// over it) and its key (so no write of this proxy decides on a state
    /// it may still change) in [`linger`], and the client gets a retryable
    /// 503.
    async fn finish<T: 'static>(
        &self,
        w: Write,
        sent: Sent<T>,
        now_holds: impl FnOnce(&T) -> Option<Known>,
    ) -> S3Result<T> {
        self.metrics
            .backend_seconds
            .get_or_create(&crate::metrics::OpLabels { op: w.a.op.op() })
            .observe(w.a.started.elapsed().as_secs_f64());
        let result = match sent {
            Sent::Answered(r) => r,
            Sent::Unanswered(pending) => {
                let answer = errors::backend_timeout(self.store.timeout(), true);
                return Err(self.hold_unanswered(w, Some(pending), answer));
            }
            Sent::Lost(cause) => {
                let answer = errors::backend_lost(&cause);
                return Err(self.hold_unanswered::<T>(w, None, answer));
            }
        };
        match result {
            Ok(out) => {
                match now_holds(&out) {
                    Some(k) => w.a.key.remember(k),
                    None => w.a.key.forget(),
                }
                self.refuser
                    .count(w.a.op.op(), &w.a.scope, Outcome::Accepted);
                Ok(out)
            }
            Err(e) => {
                // Whatever happened, the proxy no longer knows the key.
                w.a.key.forget();
                if w.a.admission.cancel().is_cancelled()
                    || self.fences.cluster().is_some_and(|c| !c.admits())
                {
                    let Parts {
                        op,
                        scope,
                        token,
                        admission,
                        key,
                        ..
                    } = w.a;
                    drop(key);
                    return Err(self.refuser.cut(op.op(), &scope, token, admission).await);
                }
                if errors::is_condition_failure(&e) {
                    self.refuser
                        .count(w.a.op.op(), &w.a.scope, Outcome::Conflict);
                    let (bucket, key) = (w.a.key.bucket().to_owned(), w.a.key.key().to_owned());
                    return Err(self
                        .redecide(w.a.op.op(), &bucket, &key, &w.a.scope, w.a.token)
                        .await);
                }
                self.refuser
                    .count(w.a.op.op(), &w.a.scope, Outcome::BackendError);
                Err(errors::from_backend(e))
            }
        }
    }

    /// Holds a write the store did not answer (its call still `pending`,
    /// or lost with its connection) in [`linger`], and gives back `answer`
    /// for its client.
    fn hold_unanswered<T: 'static>(
        &self,
        w: Write,
        pending: Option<Pending<T>>,
        answer: S3Error,
    ) -> S3Error {
        w.a.key.forget();
        self.refuser
            .count(w.a.op.op(), &w.a.scope, Outcome::Timeout);
        tracing::warn!(
            op = w.a.op.name(),
            bucket = w.a.key.bucket(),
            key = w.a.key.key(),
            token = w.a.token,
            answer = answer.message().unwrap_or_default(),
            "the backend did not answer a write; holding its key and epoch until it can no longer commit"
        );
        let hold = (w.a.admission, w.a.key, w.a.inflight);
        // Before the 503 goes out: a stop must see it (`end_run`).
        self.metrics.lingering_writes.inc();
        tokio::spawn(linger(
            pending,
            hold,
            self.store_decision,
            self.metrics.clone(),
        ));
        answer
    }

    /// Re-reads a key after the store refused a condition and decides
    /// again: stale if a higher token is stored now, retry otherwise.
    async fn redecide(
        &self,
        op: Op,
        bucket: &str,
        key: &str,
        scope: &Scope,
        token: u64,
    ) -> S3Error {
        match self.store.head(bucket, key).await {
            Ok(k) => match self
                .refuser
                .refuse_if_overwritten(op, scope, token, bucket, key, &k)
            {
                Err(stale) => stale,
                Ok(()) => errors::retry(format!(
                    "s3://{bucket}/{key} changed in the store while this write was decided; retry"
                )),
            },
            Err(e) => e,
        }
    }
}

/// A write that failed because its body failed its trailing checksum or
/// its declared length is the client's 400 (`BadDigest`, `IncompleteBody`),
/// not the backend error the cut-short send became.
fn bad_digest<T>(sent: Sent<T>, verdict: &crate::trailer::Verdict) -> Sent<T> {
    match (sent, verdict.failed()) {
        (Sent::Answered(Err(_)), Some(refused)) => Sent::Answered(Err(refused)),
        (sent, _) => sent,
    }
}

/// What the store holds after a PutObject with `token` it answered.
fn put_holds(token: u64) -> impl FnOnce(&S3Response<PutObjectOutput>) -> Option<Known> {
    move |out| {
        Some(Known::Present {
            etag: out.output.e_tag.as_ref()?.value().to_owned(),
            token,
        })
    }
}

/// A request body read whole (the caller bounded its length).
async fn collect(body: Option<StreamingBlob>) -> Result<bytes::Bytes, s3s::StdError> {
    use futures::TryStreamExt as _;
    let Some(body) = body else {
        return Ok(bytes::Bytes::new());
    };
    let parts: Vec<bytes::Bytes> = body.try_collect().await?;
    Ok(parts.concat().into())
}

/// A copy the store refused because its source condition no longer held
/// when it copied (the proxy checked it just before): Ceph RGW answers 304
/// to a failed `if-none-match` or `if-modified-since` source condition
/// where AWS answers 412, and a 304 is no answer to a copy.
fn source_changed(e: s3s::S3Error) -> s3s::S3Error {
    if e.status_code() == Some(http::StatusCode::NOT_MODIFIED) {
        s3s::s3_error!(
            PreconditionFailed,
            "the copy source's condition (x-amz-copy-source-if-*) no longer holds: the source changed while the copy was sent"
        )
    } else {
        e
    }
}

/// The client's answer to a CopyObject the store answered.
fn copied(out: aws_sdk_s3::operation::copy_object::CopyObjectOutput) -> CopyObjectOutput {
    let r = out.copy_object_result();
    CopyObjectOutput {
        copy_object_result: Some(CopyObjectResult {
            e_tag: r
                .and_then(|r| r.e_tag())
                .map(|e| ETag::Strong(crate::dialect::strip_quotes(e))),
            last_modified: r
                .and_then(|r| r.last_modified())
                .and_then(|t| s3s_aws::conv::try_from_aws::<Timestamp>(*t).ok()),
            ..Default::default()
        }),
        version_id: out.version_id().map(str::to_owned),
        copy_source_version_id: out.copy_source_version_id().map(str::to_owned),
        ..Default::default()
    }
}

/// Replaces any client-supplied fencing-token metadata with `token`.
pub(crate) fn tag(metadata: &mut Option<Metadata>, token: u64) {
    let m = metadata.get_or_insert_with(Default::default);
    m.retain(|k, _| !k.eq_ignore_ascii_case(crate::tokens::TOKEN_METADATA_KEY));
    m.insert(
        crate::tokens::TOKEN_METADATA_KEY.to_owned(),
        token.to_string(),
    );
}

/// Drops the `aws-chunked` content coding s3s already decoded; the SDK
/// would otherwise send it twice and the backend reject the request.
pub(crate) fn strip_aws_chunked(encoding: Option<String>) -> Option<String> {
    let rest: Vec<&str> = encoding
        .as_deref()?
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case("aws-chunked"))
        .collect();
    (!rest.is_empty()).then(|| rest.join(","))
}

/// The conditions to send to the store for a write over `known`, after
/// checking the client's own conditions against it.
pub(crate) fn conditions(
    known: &Known,
    client_if_match: Option<IfMatch>,
    client_if_none_match: Option<IfNoneMatch>,
) -> S3Result<(Option<IfMatch>, Option<IfNoneMatch>)> {
    let current = match known {
        Known::Absent => None,
        Known::Present { etag, .. } => Some(etag.as_str()),
    };
    let matches = |c: &ETagCondition| match (c, current) {
        (ETagCondition::Any, cur) => cur.is_some(),
        (ETagCondition::ETag(e), Some(cur)) => e.value() == cur,
        (ETagCondition::ETag(_), None) => false,
    };
    if client_if_match.as_ref().is_some_and(|c| !matches(c))
        || client_if_none_match.as_ref().is_some_and(matches)
    {
        return Err(s3s::s3_error!(
            PreconditionFailed,
            "the client's If-Match / If-None-Match condition does not hold"
        ));
    }
    Ok(match current {
        None => (None, Some(ETagCondition::Any)),
        Some(etag) => (
            Some(ETagCondition::ETag(ETag::Strong(etag.to_owned()))),
            None,
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_follow_what_the_store_holds() {
        let present = Known::Present {
            etag: "abc".into(),
            token: 1,
        };
        let (m, n) = conditions(&Known::Absent, None, None).expect("ok");
        assert_eq!((m, n), (None, Some(ETagCondition::Any)));
        let (m, n) = conditions(&present, None, None).expect("ok");
        assert_eq!(
            (m, n),
            (Some(ETagCondition::ETag(ETag::Strong("abc".into()))), None)
        );
        assert!(conditions(&present, None, Some(ETagCondition::Any)).is_err());
        assert!(conditions(&Known::Absent, Some(ETagCondition::Any), None).is_err());
        assert!(
            conditions(
                &present,
                Some(ETagCondition::ETag(ETag::Strong("x".into()))),
                None
            )
            .is_err()
        );
    }

    #[test]
    fn client_token_metadata_is_replaced() {
        let mut m = Some(Metadata::from([(
            "Fencing-Token".to_owned(),
            "999".to_owned(),
        )]));
        tag(&mut m, 7);
        let m = m.expect("metadata");
        assert_eq!(m.len(), 1);
        assert_eq!(m.get("fencing-token").map(String::as_str), Some("7"));
    }

    #[test]
    fn aws_chunked_is_stripped() {
        assert_eq!(strip_aws_chunked(Some("aws-chunked".into())), None);
        assert_eq!(
            strip_aws_chunked(Some("aws-chunked,gzip".into())),
            Some("gzip".into())
        );
        assert_eq!(strip_aws_chunked(None), None);
    }
}
