//! Where the proxy keeps what must outlive it: with one proxy a SQLite
//! database ([`db`]), with replicas etcd through the replica protocol
//! ([`cluster`]). Both keep each lock's max and every upload's binding.
//!
//! An upload binding read back from either is a witness (its token was
//! verified when the upload was created), so it is made only from a
//! [`ReadBack`], which only the two stores under this module can make.

pub mod cluster;
pub mod db;

/// Proof that an upload record was read from the proxy's own durable
/// state. Its field is private to this module and the stores under it.
#[derive(Debug, Clone, Copy)]
pub struct ReadBack(());

#[cfg(test)]
impl ReadBack {
    /// For unit tests that need a binding as if read back.
    pub(crate) fn for_tests() -> ReadBack {
        ReadBack(())
    }
}
