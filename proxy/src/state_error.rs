//! Why the proxy's own durable state could not be read or written: its
//! SQLite database with one proxy, etcd with replicas. That state is the
//! fence's memory (every scope's max) and the bindings of open uploads.
//!
//! Every kind answers the client 503 with "nothing was written": the write
//! that needed the state was not sent. The kinds say to the operator what
//! failed; no caller decides by reading a message.

use fencegate_etcd::CallError;

/// Why the proxy's database or etcd did not do what a request needed.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// SQLite refused or failed the statement (a full or read-only disk, a
    /// database that is no longer this proxy's).
    #[error("the proxy database: {0}")]
    Database(#[from] rusqlite::Error),
    /// The blocking task that ran the statement did not finish (it
    /// panicked, or the runtime is shutting down).
    #[error("the proxy database's task did not finish: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// No etcd member answered in time, or etcd refused the request.
    #[error("etcd: {0}")]
    Etcd(#[from] CallError),
    /// A record is in no form this proxy writes (an upload's binding: its
    /// JSON, or an owner it cannot read).
    #[error("an unreadable record: {0}")]
    Unreadable(String),
    /// A record could not be encoded to be kept.
    #[error("cannot encode a record: {0}")]
    Encode(String),
}

/// Runs `f`, a blocking call on the proxy's database, off the serving
/// threads.
pub async fn blocking<T, F>(f: F) -> Result<T, StateError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, StateError> + Send + 'static,
{
    tokio::task::spawn_blocking(f).await?
}
