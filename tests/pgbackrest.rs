//! PostgreSQL 15 and pgBackRest 2.45 (Debian) fenced as a role, end to
//! end: `tests/pgbackrest/failover.sh` runs a primary under `fencegate
//! run`, freezes it mid-backup, starts a new primary on a copy of its
//! volume that takes the lease (fencing the old one as it does), wakes the
//! old one and checks that nothing it sends reaches the store and that the
//! new primary's repository is whole. The script asserts each step and
//! cleans up every process it started; see tests/pgbackrest/README.md.

mod support;

#[test]
fn a_frozen_primary_is_fenced_when_a_new_one_takes_the_role() {
    support::run_script("tests/pgbackrest/failover.sh", &[]);
}
