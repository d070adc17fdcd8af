//! The proptest configuration of every property test.

use proptest::test_runner::Config;

/// `cases` cases unless `PROPTEST_CASES` asks for more (longer local runs);
/// no regression files are written into the tree (a failure prints the
/// minimal input, which then becomes an explicit `#[test]`).
pub fn config(cases: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}
