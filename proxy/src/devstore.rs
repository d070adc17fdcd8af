//! The embedded S3 backend of `fencegate dev` (and of the test suite):
//! s3s-fs on a local directory, with one fix.
//!
//! s3s-fs stores `a/b` as the file `a/b`, so after writing `n/r.txt` the key
//! `n` is a directory, and HEAD/GET of `n` answers 500 instead of 404.
//! rclone checks whether its destination path is a file with exactly that
//! HEAD, and retries a 500 forever. This wrapper answers 404 `NoSuchKey`
//! there, as S3 does; everything else is s3s-fs unchanged.

use s3s::dto::*;
use s3s::{S3, S3Error, S3ErrorCode, S3Request, S3Response, S3Result};
use std::path::{Path, PathBuf};

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
        copy_object: CopyObjectInput => CopyObjectOutput;
        delete_bucket: DeleteBucketInput => DeleteBucketOutput;
        delete_object: DeleteObjectInput => DeleteObjectOutput;
        delete_objects: DeleteObjectsInput => DeleteObjectsOutput;
        get_bucket_location: GetBucketLocationInput => GetBucketLocationOutput;
        head_bucket: HeadBucketInput => HeadBucketOutput;
        list_buckets: ListBucketsInput => ListBucketsOutput;
        list_objects: ListObjectsInput => ListObjectsOutput;
        list_objects_v2: ListObjectsV2Input => ListObjectsV2Output;
        put_object: PutObjectInput => PutObjectOutput;
        create_multipart_upload: CreateMultipartUploadInput => CreateMultipartUploadOutput;
        upload_part: UploadPartInput => UploadPartOutput;
        upload_part_copy: UploadPartCopyInput => UploadPartCopyOutput;
        list_parts: ListPartsInput => ListPartsOutput;
        complete_multipart_upload: CompleteMultipartUploadInput => CompleteMultipartUploadOutput;
        abort_multipart_upload: AbortMultipartUploadInput => AbortMultipartUploadOutput;
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
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
        let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
        self.fs
            .get_object(req)
            .await
            .map_err(|e| self.not_found_if_directory(&bucket, &key, e))
    }
}
