//! Helpers shared by the fuzz targets in `fuzz_targets/`.

use arbitrary::Arbitrary;
use fencegate_core::{LockName, TokenKeys};

/// The key every target signs with.
pub const SIGNING_KEY: &[u8] = b"fencegate-fuzz-signing-key-0123456789";
/// A key that never signed anything the targets build.
pub const OTHER_KEY: &[u8] = b"fencegate-fuzz-other-key-9876543210";

/// Keys signing with [`SIGNING_KEY`].
pub fn signer() -> TokenKeys {
    TokenKeys::new(vec![SIGNING_KEY.to_vec()]).expect("a 16+ byte key is accepted")
}

/// Keys after a rotation: a new key signs, [`SIGNING_KEY`] still verifies.
pub fn rotated() -> TokenKeys {
    TokenKeys::new(vec![OTHER_KEY.to_vec(), SIGNING_KEY.to_vec()])
        .expect("16+ byte keys are accepted")
}

/// Keys that must refuse everything [`signer`] signed.
pub fn other() -> TokenKeys {
    TokenKeys::new(vec![OTHER_KEY.to_vec()]).expect("a 16+ byte key is accepted")
}

/// A valid lock name made from arbitrary text: disallowed characters are
/// dropped, the length is capped, and an empty result becomes `l`.
pub fn lock_from(s: &str) -> LockName {
    let name: String = s
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        .take(fencegate_core::name::MAX_LOCK_NAME_LEN)
        .collect();
    LockName::new(if name.is_empty() { "l" } else { &name }).expect("filtered to the lock charset")
}

/// One edit of a string, positions taken modulo its length (in characters).
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Edit {
    Replace(u16, char),
    Insert(u16, char),
    Delete(u16),
}

/// Applies `edits` in order.
pub fn apply_edits(s: &str, edits: &[Edit]) -> String {
    let mut chars: Vec<char> = s.chars().collect();
    for e in edits {
        match *e {
            Edit::Replace(i, c) if !chars.is_empty() => {
                let i = usize::from(i) % chars.len();
                chars[i] = c;
            }
            Edit::Insert(i, c) => {
                let i = usize::from(i) % (chars.len() + 1);
                chars.insert(i, c);
            }
            Edit::Delete(i) if !chars.is_empty() => {
                let i = usize::from(i) % chars.len();
                chars.remove(i);
            }
            _ => {}
        }
    }
    chars.into_iter().collect()
}

/// The canonical spelling of a signed-token header value: surrounding
/// whitespace dropped (parse trims it) and leading zeros of the number
/// dropped (parse reads `07` as 7, and the MAC covers the number, not its
/// spelling). Two values with the same canonical spelling are the same
/// token.
pub fn canonical_signed(value: &str) -> String {
    let value = value.trim();
    let parts: Vec<&str> = value.split(':').collect();
    match parts.as_slice() {
        [prefix, lock, number, mac] => {
            format!("{prefix}:{lock}:{}:{mac}", number.trim_start_matches('0'))
        }
        _ => value.to_owned(),
    }
}
