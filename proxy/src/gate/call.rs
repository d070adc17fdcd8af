//! The answer timeout of the backend calls that change no object (a read,
//! creating an upload, a part): the leaf every stage that calls the store
//! uses. Object writes have their own policy (`write`), which does not let
//! go of a write the store may still commit.

use crate::errors;
use s3s::S3Result;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// A backend call, boxed by its caller: the SDK's futures are kilobytes,
/// and a call held inline would make every request's future (the hot
/// PutObject's too, which mostly never makes such a call) that big, copied
/// whole when the request starts.
pub type Call<'a, T> = std::pin::Pin<Box<dyn Future<Output = S3Result<T>> + Send + 'a>>;

/// Awaits `fut`, giving the backend `timeout` to answer once the request
/// is sent (for a streamed body: once `body_sent` is notified). A backend
/// that does not answer in time gets the client a retryable 503 and the
/// request is dropped: whatever the store does with it later changes no
/// object.
pub async fn within<T>(
    timeout: Duration,
    fut: Call<'_, T>,
    body_sent: Option<Arc<Notify>>,
) -> S3Result<T> {
    let deadline = async {
        if let Some(sent) = body_sent {
            sent.notified().await;
        }
        tokio::time::sleep(timeout).await;
    };
    tokio::select! {
        r = fut => r,
        () = deadline => Err(errors::backend_timeout(timeout, false)),
    }
}
