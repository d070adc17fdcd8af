//! Where the proxy keeps what must outlive it: with one proxy a SQLite
//! database ([`db`]), with replicas etcd through the replica protocol
//! ([`cluster`]). Both keep each lock's max and every upload's binding.

pub mod cluster;
pub mod db;
