//! What the test suites and the bench share, so that each is written once:
//! the proptest configuration (`proptest`), the S3 client every test and
//! benchmark starts from, and the SigV4 signing setup of hand-made
//! requests (`s3`); hand-written servers that play a peer (`tcp`); the proxy config they
//! start from (`config`); the checker over a nemesis run's whole history
//! (`history`). Never a dependency of a product crate.

pub mod config;
pub mod history;
#[cfg(feature = "proptest")]
pub mod proptest;
#[cfg(feature = "s3")]
pub mod s3;
#[cfg(feature = "tcp")]
pub mod tcp;

/// Fails unless `text` contains every one of `needles`, naming the first
/// missing one and showing `text`.
#[track_caller]
pub fn assert_mentions(text: &str, needles: &[&str]) {
    for needle in needles {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
}

/// A new temporary directory and the path of `name` in it (not created):
/// keep the directory while the path is used.
pub fn temp_path(name: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(name);
    (dir, path)
}
