//! PostgreSQL 15 and pgBackRest 2.45 (Debian) fenced as a role, end to
//! end: `tests/pgbackrest/failover.sh` runs a primary under `fencegate
//! run`, freezes it mid-backup, starts a new primary on a copy of its
//! volume that takes the lease (fencing the old one as it does), wakes the
//! old one and checks that nothing it sends reaches the store and that the
//! new primary's repository is whole. The script asserts each step and
//! cleans up every process it started; see tests/pgbackrest/README.md.

use std::process::Command;

#[test]
fn a_frozen_primary_is_fenced_when_a_new_one_takes_the_role() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/pgbackrest/failover.sh");
    let work = tempfile::tempdir().expect("tempdir");
    let out = Command::new("bash")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_fencegate"))
        .arg(work.path())
        .env_remove("FENCEGATE_LOG")
        .output()
        .expect("the failover script runs");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{log}");
}
