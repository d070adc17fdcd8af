//! Signed tokens built from arbitrary parts, forged MACs, and genuine tokens
//! with arbitrary edits: `verify` accepts a token only if it is what `sign`
//! produced for that lock and number (up to the spellings `parse` treats as
//! equal: surrounding whitespace and leading zeros), and an edited genuine
//! token never verifies as another lock or number.
#![no_main]

use arbitrary::Arbitrary;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use fencegate_core::{FencingToken, LockName, TokenKeys};
use fencegate_fuzz::{Edit, apply_edits, canonical_signed, lock_from};
use libfuzzer_sys::fuzz_target;
use std::sync::LazyLock;

static SIGNER: LazyLock<TokenKeys> = LazyLock::new(fencegate_fuzz::signer);
static ROTATED: LazyLock<TokenKeys> = LazyLock::new(fencegate_fuzz::rotated);
static OTHER: LazyLock<TokenKeys> = LazyLock::new(fencegate_fuzz::other);

#[derive(Debug, Arbitrary)]
enum Input {
    /// Arbitrary text in each field of `fgt1:<lock>:<number>:<mac>`.
    Fields {
        prefix: bool,
        lock: String,
        number: String,
        mac: String,
    },
    /// A well-formed token with an arbitrary MAC.
    Forged {
        lock: String,
        number: u64,
        mac: [u8; 32],
    },
    /// A genuine token, then arbitrary edits.
    Edited {
        lock: String,
        number: u64,
        edits: Vec<Edit>,
    },
}

fuzz_target!(|input: Input| {
    match input {
        Input::Fields {
            prefix,
            lock,
            number,
            mac,
        } => {
            let prefix = if prefix { "fgt1" } else { "fgt2" };
            check(&format!("{prefix}:{lock}:{number}:{mac}"), None);
        }
        Input::Forged { lock, number, mac } => {
            let lock = lock_from(&lock);
            let value = format!("fgt1:{lock}:{number}:{}", URL_SAFE_NO_PAD.encode(mac));
            let genuine = number >= 1 && SIGNER.sign(&lock, number).to_string() == value;
            let accepted = check(&value, None);
            assert_eq!(accepted.is_some(), genuine, "{value}");
        }
        Input::Edited {
            lock,
            number,
            edits,
        } => {
            let lock = lock_from(&lock);
            let number = number.max(1);
            let original = SIGNER.sign(&lock, number).to_string();
            assert_eq!(
                check(&original, Some((&lock, number))),
                Some((lock.clone(), number))
            );
            let edited = apply_edits(&original, &edits);
            check(&edited, Some((&lock, number)));
        }
    }
});

/// Parses and verifies `value` with every key set; returns what it proves.
/// With `expected`, anything that verifies must be exactly that token.
fn check(value: &str, expected: Option<(&LockName, u64)>) -> Option<(LockName, u64)> {
    let Ok(FencingToken::Signed(t)) = FencingToken::parse(value) else {
        return None;
    };
    assert!(
        OTHER.verify(&t, &t.lock).is_err(),
        "a key that signed nothing verified {value:?}"
    );
    let by_signer = SIGNER.verify(&t, &t.lock).ok();
    let by_rotated = ROTATED.verify(&t, &t.lock).ok();
    assert_eq!(
        by_signer, by_rotated,
        "rotation changed the verdict on {value:?}"
    );
    let n = by_signer?;
    assert_eq!(n, t.token);
    let genuine = SIGNER.sign(&t.lock, n).to_string();
    assert_eq!(t.to_string(), genuine);
    assert_eq!(
        canonical_signed(value),
        genuine,
        "{value:?} verified but is not what sign() produced"
    );
    if let Some((lock, number)) = expected {
        assert_eq!(
            (&t.lock, n),
            (lock, number),
            "{value:?} verified as another token"
        );
    }
    Some((t.lock, n))
}
