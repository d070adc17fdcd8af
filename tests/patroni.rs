//! A Patroni cluster's backups fenced by Patroni's own leader key, end to
//! end: `tests/patroni/failover.sh` runs two PostgreSQL 15 nodes under
//! Patroni (Debian's 3.0.2) on a three-member etcd started here, with
//! pgBackRest archiving through a proxy whose lock follows the leader key
//! (`[[elections]]`) and a `fencegate election run` sidecar on each node.
//! It fails over twice (a leader frozen past its TTL, then `patronictl
//! switchover`) and checks that the old primary's writes are refused as
//! stale once its successor holds the key, that nothing of it lands, and
//! that the new primary's repository is clean. See tests/patroni/README.md.

mod support;

use support::etcd::EtcdCluster;

#[test]
fn a_patroni_clusters_backups_follow_its_leader_key() {
    let etcd = EtcdCluster::start(3);
    support::run_script("tests/patroni/failover.sh", &[etcd.endpoints()]);
}
