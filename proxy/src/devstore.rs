//! The embedded S3 backend of `fencegate dev` (and of the test suite):
//! s3s-fs on a local directory, with two fixes.
//!
//! - s3s-fs stores `a/b` as the file `a/b`, so after writing `n/r.txt` the
//!   key `n` is a directory, and HEAD/GET of `n` answers 500 instead of 404.
//!   rclone checks whether its destination path is a file with exactly that
//!   HEAD, and retries a 500 forever. This wrapper answers 404 `NoSuchKey`
//!   there, as S3 does.
//! - s3s-fs checks `Content-MD5` and `x-amz-checksum-*` only after it has
//!   moved the new data into place, so a PUT refused with `BadDigest` has
//!   already replaced the object. This wrapper checks the ones sent as
//!   headers while the body streams, and a mismatch fails the body before
//!   s3s-fs commits anything. (Checksums sent as aws-chunked trailers are
//!   still checked by s3s-fs alone, after the commit; the proxy sends none:
//!   it checks a client's trailer itself, before the last byte goes on,
//!   `crate::trailer`.)
//!
//! - s3s-fs resolves `.` and `..` in keys (`x/../../other/k` writes
//!   another bucket, or its own metadata files) and lets an absolute key
//!   escape its bucket. This wrapper refuses every key that
//!   [`crate::object_key`] refuses, as the proxy does: defence in depth,
//!   for a client that reaches the store directly or a proxy bug.
//!
//! Everything else is s3s-fs unchanged.

use base64::Engine as _;
use bytes::Bytes;
use futures::Stream;
use parking_lot::Mutex;
use s3s::checksum::ChecksumHasher;
use s3s::crypto::{Checksum as _, Md5};
use s3s::dto::*;
use s3s::stream::{ByteStream, RemainingLength};
use s3s::{S3, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, StdError};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// Wraps the body of an input that announces digests (PutObject,
/// UploadPart: the same field names) so it is checked as it streams; the
/// [`Verdict`] turns a failed check into `BadDigest`.
macro_rules! verify_body {
    ($input:expr) => {{
        let i = $input;
        let expected = Digests::of(
            i.content_md5.as_deref(),
            [
                i.checksum_crc32.clone(),
                i.checksum_crc32c.clone(),
                i.checksum_sha1.clone(),
                i.checksum_sha256.clone(),
                i.checksum_crc64nvme.clone(),
            ],
        )?;
        let verdict = Verdict::default();
        i.body = i.body.take().map(|b| Verified::wrap(b, expected, &verdict));
        verdict
    }};
}

/// s3s-fs with S3's answer for keys that are directories on disk.
#[derive(Debug)]
pub struct DevStore {
    fs: s3s_fs::FileSystem,
    root: PathBuf,
}

impl DevStore {
    pub fn new(root: &Path) -> anyhow::Result<DevStore> {
        let fs = s3s_fs::FileSystem::new(root).map_err(|e| {
            anyhow::anyhow!("cannot serve {} as an S3 store: {e:?}", root.display())
        })?;
        Ok(DevStore {
            fs,
            root: root.to_owned(),
        })
    }

    fn fs(&self) -> &s3s_fs::FileSystem {
        &self.fs
    }

    fn not_found_if_directory(&self, bucket: &str, key: &str, err: S3Error) -> S3Error {
        if self.root.join(bucket).join(key).is_dir() {
            S3Error::with_message(S3ErrorCode::NoSuchKey, "The specified key does not exist.")
        } else {
            err
        }
    }
}

#[async_trait::async_trait]
impl S3 for DevStore {
    forward_s3! { fs => std::convert::identity;
        create_bucket: CreateBucketInput => CreateBucketOutput;
        delete_bucket: DeleteBucketInput => DeleteBucketOutput;
        get_bucket_location: GetBucketLocationInput => GetBucketLocationOutput;
        head_bucket: HeadBucketInput => HeadBucketOutput;
        list_buckets: ListBucketsInput => ListBucketsOutput;
        list_objects: ListObjectsInput => ListObjectsOutput;
        list_objects_v2: ListObjectsV2Input => ListObjectsV2Output;
    }

    forward_s3! { fs => std::convert::identity; check = crate::object_key::require_all;
        delete_object: DeleteObjectInput => DeleteObjectOutput;
        create_multipart_upload: CreateMultipartUploadInput => CreateMultipartUploadOutput;
        list_parts: ListPartsInput => ListPartsOutput;
        complete_multipart_upload: CompleteMultipartUploadInput => CompleteMultipartUploadOutput;
        abort_multipart_upload: AbortMultipartUploadInput => AbortMultipartUploadOutput;
        copy_object: CopyObjectInput => CopyObjectOutput;
        upload_part_copy: UploadPartCopyInput => UploadPartCopyOutput;
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        for o in &req.input.delete.objects {
            crate::object_key::require(&o.key)?;
        }
        self.fs.delete_objects(req).await
    }

    async fn put_object(
        &self,
        mut req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        crate::object_key::require(&req.input.key)?;
        let verdict = verify_body!(&mut req.input);
        verdict.overrule(self.fs.put_object(req).await)
    }

    async fn upload_part(
        &self,
        mut req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        crate::object_key::require(&req.input.key)?;
        let verdict = verify_body!(&mut req.input);
        verdict.overrule(self.fs.upload_part(req).await)
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        crate::object_key::require(&req.input.key)?;
        let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
        self.fs
            .head_object(req)
            .await
            .map_err(|e| self.not_found_if_directory(&bucket, &key, e))
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        crate::object_key::require(&req.input.key)?;
        let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
        self.fs
            .get_object(req)
            .await
            .map_err(|e| self.not_found_if_directory(&bucket, &key, e))
    }
}

/// The digests a request announced in its headers: Content-MD5, and the
/// `x-amz-checksum-*` values in the order crc32, crc32c, sha1, sha256,
/// crc64nvme.
#[derive(Debug, Default)]
struct Digests {
    md5: Option<[u8; 16]>,
    checksums: [Option<String>; 5],
}

impl Digests {
    fn of(content_md5: Option<&str>, checksums: [Option<String>; 5]) -> S3Result<Digests> {
        let md5 = match content_md5 {
            None => None,
            Some(b64) => Some(
                base64::engine::general_purpose::STANDARD
                    .decode(b64.trim())
                    .ok()
                    .and_then(|v| <[u8; 16]>::try_from(v).ok())
                    .ok_or_else(|| {
                        S3Error::with_message(
                            S3ErrorCode::InvalidDigest,
                            "Content-MD5 is not the base64 of a 16-byte MD5",
                        )
                    })?,
            ),
        };
        Ok(Digests { md5, checksums })
    }

    fn is_empty(&self) -> bool {
        self.md5.is_none() && self.checksums.iter().all(Option::is_none)
    }

    fn hasher(&self) -> ChecksumHasher {
        let mut h = ChecksumHasher::default();
        let [crc32, crc32c, sha1, sha256, crc64nvme] = &self.checksums;
        h.crc32 = crc32.as_ref().map(|_| s3s::crypto::Crc32::new());
        h.crc32c = crc32c.as_ref().map(|_| s3s::crypto::Crc32c::new());
        h.sha1 = sha1.as_ref().map(|_| s3s::crypto::Sha1::new());
        h.sha256 = sha256.as_ref().map(|_| s3s::crypto::Sha256::new());
        h.crc64nvme = crc64nvme.as_ref().map(|_| s3s::crypto::Crc64Nvme::new());
        h
    }

    /// What does not match, if anything.
    fn mismatch(&self, md5: Md5, hasher: ChecksumHasher) -> Option<String> {
        if let Some(want) = self.md5
            && md5.finalize() != want
        {
            return Some("the body does not match its Content-MD5".into());
        }
        let got = crate::trailer::by_name(hasher.finalize());
        let names = ["crc32", "crc32c", "sha1", "sha256", "crc64nvme"];
        self.checksums
            .iter()
            .zip(got)
            .zip(names)
            .find(|((want, got), _)| want.is_some() && *want != got)
            .map(|(_, name)| format!("the body does not match its x-amz-checksum-{name}"))
    }
}

/// Why a verified body failed, shared between the body and the request.
#[derive(Debug, Default, Clone)]
struct Verdict(Arc<Mutex<Option<String>>>);

impl Verdict {
    fn set(&self, why: String) {
        *self.0.lock() = Some(why);
    }

    /// s3s-fs answers a failed body with a 500; the client sent a body that
    /// does not match its digest, which is its mistake: 400 BadDigest.
    fn overrule<T>(&self, r: S3Result<T>) -> S3Result<T> {
        let why = self.0.lock().take();
        match (r, why) {
            (Err(_), Some(why)) => Err(S3Error::with_message(S3ErrorCode::BadDigest, why)),
            (r, _) => r,
        }
    }
}

/// A body that hashes itself as it streams and ends with an error instead
/// of its end when it does not match the announced digests.
struct Verified {
    inner: StreamingBlob,
    expected: Digests,
    md5: Option<Md5>,
    hasher: Option<ChecksumHasher>,
    verdict: Verdict,
}

impl Verified {
    fn wrap(inner: StreamingBlob, expected: Digests, verdict: &Verdict) -> StreamingBlob {
        if expected.is_empty() {
            return inner;
        }
        StreamingBlob::new(Verified {
            inner,
            md5: expected.md5.map(|_| Md5::new()),
            hasher: Some(expected.hasher()),
            expected,
            verdict: verdict.clone(),
        })
    }
}

/// The error a body that failed its digest ends with.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct DigestMismatch(String);

impl Stream for Verified {
    type Item = Result<Bytes, StdError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = Pin::new(&mut self.inner).poll_next(cx);
        match &polled {
            Poll::Ready(Some(Ok(chunk))) => {
                let this = &mut *self;
                if let Some(m) = this.md5.as_mut() {
                    m.update(chunk);
                }
                if let Some(h) = this.hasher.as_mut() {
                    h.update(chunk);
                }
            }
            Poll::Ready(None) => {
                let this = &mut *self;
                let md5 = this.md5.take().unwrap_or_default();
                let hasher = this.hasher.take().unwrap_or_default();
                if let Some(why) = this.expected.mismatch(md5, hasher) {
                    this.verdict.set(why.clone());
                    return Poll::Ready(Some(Err(Box::new(DigestMismatch(why)))));
                }
            }
            _ => {}
        }
        polled
    }
}

impl ByteStream for Verified {
    fn remaining_length(&self) -> RemainingLength {
        self.inner.remaining_length()
    }
}
