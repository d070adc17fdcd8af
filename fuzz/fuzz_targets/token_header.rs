//! `FencingToken::parse` on arbitrary header values: never panics; every
//! token that parses re-formats to a string that parses back equal; `verify`
//! never panics on anything that parses.
#![no_main]

use fencegate_core::{FencingToken, LockName, TokenKeys};
use libfuzzer_sys::fuzz_target;
use std::sync::LazyLock;

static KEYS: LazyLock<[TokenKeys; 3]> = LazyLock::new(|| {
    [
        fencegate_fuzz::signer(),
        fencegate_fuzz::rotated(),
        fencegate_fuzz::other(),
    ]
});
static OTHER_LOCK: LazyLock<LockName> =
    LazyLock::new(|| LockName::new("fuzz-other-lock").expect("valid"));

fuzz_target!(|data: &[u8]| {
    match std::str::from_utf8(data) {
        Ok(s) => check(s),
        Err(_) => check(&String::from_utf8_lossy(data)),
    }
});

fn check(value: &str) {
    let Ok(token) = FencingToken::parse(value) else {
        return;
    };
    assert!(value.trim().len() <= fencegate_core::token::MAX_TOKEN_LEN);
    assert!(token.number() >= 1, "token 0 is never accepted");
    match &token {
        FencingToken::Plain(n) => {
            assert_eq!(
                FencingToken::parse(&n.to_string()),
                Ok(FencingToken::Plain(*n))
            );
        }
        FencingToken::Signed(signed) => {
            for keys in KEYS.iter() {
                if let Ok(n) = keys.verify(signed, &signed.lock) {
                    // Only a token the signing key made can verify.
                    assert_eq!(n, signed.token);
                    let genuine = fencegate_fuzz::signer().sign(&signed.lock, n);
                    assert_eq!(signed.to_string(), genuine.to_string());
                }
                let _ = keys.verify(signed, &OTHER_LOCK);
            }
            let formatted = signed.to_string();
            assert_eq!(FencingToken::parse(&formatted), Ok(token.clone()));
        }
    }
}
