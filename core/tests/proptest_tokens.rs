//! Property tests of the core: the `Fencing-Token` wire format, lease-bound
//! credentials, the fence decision and the lease table.
//!
//! They run in the normal `cargo test` (stable, debug build) in a few
//! seconds. For a longer local run raise the case count, e.g.
//! `PROPTEST_CASES=20000 cargo test -p fencegate-core --test proptest_tokens`.
//! The libFuzzer targets in `fuzz/` cover the same ground on nightly.

use fencegate_core::credentials::{CredentialError, parse_access_key};
use fencegate_core::fence::decide;
use fencegate_core::token::{MAX_TOKEN, MAX_TOKEN_LEN, VerifyError};
use fencegate_core::{
    Fence, FencingToken, KeyDigest, LockName, LockTable, Timestamp, TokenError, TokenKeys, Verdict,
};
use fencegate_testkit::proptest::config;
use proptest::prelude::*;
use std::collections::HashMap;
use std::time::Duration;

fn lock_name() -> impl Strategy<Value = LockName> {
    "[A-Za-z0-9._-]{1,128}"
        .prop_map(|s| LockName::new(&s).expect("the regex only yields lock names"))
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 16..64)
}

fn keys_of(key: &[u8]) -> TokenKeys {
    TokenKeys::new(vec![key.to_vec()]).expect("keys of 16+ bytes are accepted")
}

/// Characters a mutation inserts or substitutes: everything that means
/// something in the format, plus whitespace and non-ASCII.
const MUTATION_CHARS: &str = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ\
                              -_.:=+/ \t\n\r!~%\u{a0}\u{3000}\u{e9}\u{1f600}";

#[derive(Debug, Clone)]
enum Mutation {
    Replace(usize, char),
    Insert(usize, char),
    Delete(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let chars: Vec<char> = MUTATION_CHARS.chars().collect();
    let c = prop::sample::select(chars);
    prop_oneof![
        (any::<prop::sample::Index>(), c.clone())
            .prop_map(|(i, c)| Mutation::Replace(i.index(usize::MAX), c)),
        (any::<prop::sample::Index>(), c)
            .prop_map(|(i, c)| Mutation::Insert(i.index(usize::MAX), c)),
        any::<prop::sample::Index>().prop_map(|i| Mutation::Delete(i.index(usize::MAX))),
    ]
}

/// Applies `m` to `s` (positions taken modulo the length, in characters);
/// `None` when the result is `s` itself.
fn apply(s: &str, m: &Mutation) -> Option<String> {
    let mut chars: Vec<char> = s.chars().collect();
    match *m {
        Mutation::Replace(i, c) => {
            let i = i % chars.len();
            if chars[i] == c {
                return None;
            }
            chars[i] = c;
        }
        Mutation::Insert(i, c) => chars.insert(i % (chars.len() + 1), c),
        Mutation::Delete(i) => {
            chars.remove(i % chars.len());
        }
    }
    Some(chars.into_iter().collect())
}

/// Every single-character mutation of `s` over [`MUTATION_CHARS`].
fn all_mutations(s: &str) -> Vec<String> {
    let n = s.chars().count();
    let mut out = Vec::new();
    for i in 0..=n {
        for c in MUTATION_CHARS.chars() {
            if i < n {
                out.extend(apply(s, &Mutation::Replace(i, c)));
            }
            out.extend(apply(s, &Mutation::Insert(i, c)));
        }
        if i < n {
            out.extend(apply(s, &Mutation::Delete(i)));
        }
    }
    out
}

/// What a header value proves under `keys`: `Some((lock, n))` when it parses
/// as a signed token whose MAC verifies (for the lock it names).
fn accepted(keys: &TokenKeys, value: &str) -> Option<(LockName, u64)> {
    match FencingToken::parse(value) {
        Ok(FencingToken::Signed(t)) => keys.verify(&t, &t.lock).ok().map(|n| (t.lock, n)),
        _ => None,
    }
}

/// The only way a different string may carry the same signed token:
/// surrounding whitespace (documented: the header value is trimmed; a
/// leading zero in the number is refused). Returns the canonical form.
fn canonical(value: &str) -> String {
    value.trim().to_owned()
}

// ---------------------------------------------------------------------------
// Token wire format
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(2000))]

    #[test]
    fn parse_never_panics_on_arbitrary_strings(s in any::<String>()) {
        let _ = FencingToken::parse(&s);
    }

    #[test]
    fn parse_never_panics_on_token_like_strings(
        s in "[ \t]?(fgt1|fgt2|FGT1|)(:[A-Za-z0-9._:=/+ -]{0,140}){0,5}[ \t]?"
    ) {
        if let Ok(t) = FencingToken::parse(&s) {
            prop_assert!(s.trim().len() <= MAX_TOKEN_LEN);
            // Whatever parses re-formats to something that parses back equal.
            let again = match &t {
                FencingToken::Plain(n) => FencingToken::parse(&n.to_string()),
                FencingToken::Signed(st) => FencingToken::parse(&st.to_string()),
            };
            prop_assert_eq!(again, Ok(t));
        }
    }

    #[test]
    fn parse_of_lossy_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = FencingToken::parse(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn plain_numbers_round_trip(n in 1..=MAX_TOKEN, pad in "[ \t]{0,2}") {
        prop_assert_eq!(FencingToken::parse(&n.to_string()), Ok(FencingToken::Plain(n)));
        prop_assert_eq!(
            FencingToken::parse(&format!("{pad}{n}{pad}")),
            Ok(FencingToken::Plain(n))
        );
        prop_assert_eq!(FencingToken::parse(&n.to_string()).map(|t| t.number()), Ok(n));
    }

    #[test]
    fn out_of_range_numbers_are_refused(
        too_big in (u128::from(MAX_TOKEN) + 1)..(u128::from(u64::MAX) + 1000)
    ) {
        prop_assert_eq!(FencingToken::parse(&too_big.to_string()), Err(TokenError::Number));
    }

    #[test]
    fn sign_parse_verify_round_trips(lock in lock_name(), n in 1..=MAX_TOKEN, key in key()) {
        let keys = keys_of(&key);
        let s = keys.sign(&lock, n).to_string();
        prop_assert!(s.len() <= MAX_TOKEN_LEN, "every signed token fits the header limit");
        let parsed = FencingToken::parse(&s);
        let Ok(FencingToken::Signed(t)) = parsed else {
            return Err(TestCaseError::fail(format!("{s} did not parse as signed: {parsed:?}")));
        };
        prop_assert_eq!(&t.lock, &lock);
        prop_assert_eq!(t.token, n);
        prop_assert_eq!(t.to_string(), s.clone());
        prop_assert_eq!(keys.verify(&t, &lock), Ok(n));
        prop_assert_eq!(FencingToken::Signed(t).number(), n);
    }

    #[test]
    fn verify_with_a_different_key_fails(
        lock in lock_name(), n in 1..=MAX_TOKEN, k1 in key(), k2 in key()
    ) {
        prop_assume!(k1 != k2);
        let s = keys_of(&k1).sign(&lock, n).to_string();
        let Ok(FencingToken::Signed(t)) = FencingToken::parse(&s) else {
            return Err(TestCaseError::fail("a signed token parses"));
        };
        prop_assert_eq!(keys_of(&k2).verify(&t, &lock), Err(VerifyError::BadSignature));
        // Rotation: a key list holding the signing key anywhere verifies.
        let both = TokenKeys::new(vec![k2.clone(), k1.clone()]).expect("valid keys");
        prop_assert_eq!(both.verify(&t, &lock), Ok(n));
    }

    #[test]
    fn verify_for_another_lock_fails(
        lock in lock_name(), other in lock_name(), n in 1..=MAX_TOKEN, key in key()
    ) {
        prop_assume!(lock != other);
        let keys = keys_of(&key);
        let Ok(FencingToken::Signed(t)) = FencingToken::parse(&keys.sign(&lock, n).to_string())
        else {
            return Err(TestCaseError::fail("a signed token parses"));
        };
        let refused = matches!(keys.verify(&t, &other), Err(VerifyError::WrongLock { .. }));
        prop_assert!(refused);
        // And a token re-labelled for the other lock does not verify at all.
        let relabelled = keys.sign(&lock, n).to_string().replacen(
            &format!(":{lock}:"),
            &format!(":{other}:"),
            1,
        );
        prop_assert_eq!(accepted(&keys, &relabelled), None);
    }

    /// A single-character mutation of a signed token either fails to parse,
    /// fails to verify, or is the same token (same lock, same number) written
    /// in a non-canonical way (see [`canonical`]); never another token.
    #[test]
    fn a_mutated_signed_token_never_verifies_as_another_token(
        lock in lock_name(),
        n in prop_oneof![1u64..1000, 1..=MAX_TOKEN],
        key in key(),
        m in mutation(),
    ) {
        let keys = keys_of(&key);
        let original = keys.sign(&lock, n).to_string();
        let Some(mutated) = apply(&original, &m) else {
            return Ok(());
        };
        if let Some(got) = accepted(&keys, &mutated) {
            prop_assert_eq!(got, (lock.clone(), n), "{} verified as another token", mutated);
            prop_assert_eq!(canonical(&mutated), original);
        }
    }
}

/// Exhaustive version of the mutation property for a few tokens: lists every
/// single-character mutation that still verifies. The result is exactly the
/// same token with surrounding whitespace (the header value is trimmed, by
/// design); a leading `0` in the number (`fgt1:<lock>:07:<mac>`) no longer
/// parses, so every number has one spelling.
#[test]
fn every_single_character_mutation_of_a_signed_token() {
    let keys = keys_of(b"0123456789abcdef-mutation");
    for (lock, n) in [
        ("a", 1),
        ("nightly", 7),
        ("my-bucket.backups", 1234),
        ("x", MAX_TOKEN),
    ] {
        let lock = LockName::new(lock).expect("valid");
        let original = keys.sign(&lock, n).to_string();
        let mut same = Vec::new();
        for mutated in all_mutations(&original) {
            if let Some(got) = accepted(&keys, &mutated) {
                assert_eq!(
                    got,
                    (lock.clone(), n),
                    "{mutated:?} verified as another token"
                );
                assert_eq!(canonical(&mutated), original, "{mutated:?}");
                same.push(mutated);
            }
        }
        assert!(
            !same.is_empty(),
            "whitespace around the token is trimmed, so some mutation verifies"
        );
        for s in &same {
            assert_eq!(s.trim(), original, "unexpected accepted spelling {s:?}");
        }
    }
}

/// Regression case: a leading zero in a signed token's number is refused
/// (one spelling per number), so `007` never verifies, as 7 or otherwise.
#[test]
fn leading_zero_in_a_signed_token_is_refused() {
    let keys = keys_of(b"0123456789abcdef-mutation");
    let lock = LockName::new("nightly").expect("valid");
    let original = keys.sign(&lock, 7).to_string();
    let padded = original.replacen(":7:", ":007:", 1);
    assert_eq!(FencingToken::parse(&padded), Err(TokenError::LeadingZero));
    assert_eq!(accepted(&keys, &padded), None);
}

// ---------------------------------------------------------------------------
// Lease-bound credentials
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(1000))]

    #[test]
    fn access_key_parsing_never_panics(s in any::<String>(), now in any::<u64>(), key in key()) {
        let _ = parse_access_key(&s);
        let _ = keys_of(&key).secret_for(&s, now);
    }

    #[test]
    fn access_key_like_strings_never_panic(
        s in "(fgk1|fgk2|)(\\.[0-9a-z.:_-]{0,25}){0,4}",
        now in any::<u64>(),
    ) {
        let keys = keys_of(b"0123456789abcdef-credentials");
        let parsed = parse_access_key(&s);
        match keys.secret_for(&s, now) {
            Ok((bound, _)) => {
                prop_assert!(now < bound.expires_at_secs);
                prop_assert_eq!(Ok(bound), parsed);
            }
            Err(CredentialError::Expired(at)) => {
                let p = parsed.expect("an expired key parsed");
                prop_assert!(now >= p.expires_at_secs);
                prop_assert_eq!(at, p.expires_at_secs);
            }
            Err(CredentialError::Shape) => prop_assert_eq!(parsed, Err(CredentialError::Shape)),
            Err(CredentialError::UnknownKey(id)) => {
                prop_assert_ne!(&id, keys.key_id());
                prop_assert_eq!(parsed.expect("parsed").key_id, Some(id));
            }
        }
    }

    #[test]
    fn credentials_round_trip(
        lock in lock_name(),
        token in 1..=MAX_TOKEN,
        expires in any::<u64>(),
        now in any::<u64>(),
        key in key(),
    ) {
        let keys = keys_of(&key);
        let c = keys.credentials(&lock, token, expires);
        let bound = parse_access_key(&c.access_key).expect("credentials() makes parsable keys");
        prop_assert_eq!(&bound.lock, &lock);
        prop_assert_eq!(bound.token, token);
        prop_assert_eq!(bound.expires_at_secs, expires);
        match keys.secret_for(&c.access_key, now) {
            Ok((b, secret)) => {
                prop_assert!(now < expires);
                prop_assert_eq!(b, bound);
                prop_assert_eq!(secret, c.secret_key.clone());
            }
            Err(e) => {
                prop_assert!(now >= expires);
                prop_assert_eq!(e, CredentialError::Expired(expires));
            }
        }
        // Another key derives another secret.
        let other = keys_of(&[key.as_slice(), b"!"].concat());
        if let Ok((_, secret)) = other.secret_for(&c.access_key, 0) {
            prop_assert_ne!(secret, c.secret_key);
        }
    }

    /// Changing the access key in any way changes the secret the proxy
    /// derives for it (or makes it unparsable): the token, lock and expiry
    /// inside cannot be edited without the signing key.
    #[test]
    fn a_mutated_access_key_gets_another_secret(
        lock in lock_name(),
        token in 1u64..100_000,
        expires in 1u64..10_000_000_000,
        m in mutation(),
    ) {
        let keys = keys_of(b"0123456789abcdef-credentials");
        let c = keys.credentials(&lock, token, expires);
        let Some(mutated) = apply(&c.access_key, &m) else {
            return Ok(());
        };
        match keys.secret_for(&mutated, 0) {
            Ok((_, secret)) => prop_assert_ne!(secret, c.secret_key, "{}", mutated),
            Err(CredentialError::Shape) => prop_assert!(parse_access_key(&mutated).is_err()),
            // Only an expiry edited down to 0 is already past at `now` = 0.
            Err(CredentialError::Expired(at)) => prop_assert_eq!(at, 0),
            // An edited key id names no key here.
            Err(CredentialError::UnknownKey(id)) => prop_assert_ne!(&id, keys.key_id()),
        }
    }
}

// ---------------------------------------------------------------------------
// The fence decision
// ---------------------------------------------------------------------------

fn token_value() -> impl Strategy<Value = u64> {
    prop_oneof![4 => 0u64..16, 1 => any::<u64>()]
}

proptest! {
    #![proptest_config(config(2000))]

    #[test]
    fn decide_lower_rejects_equal_admits_higher_raises(max in token_value(), token in token_value()) {
        let verdict = decide(max, token);
        let expected = match token.cmp(&max) {
            std::cmp::Ordering::Less => Verdict::Stale { max },
            std::cmp::Ordering::Equal => Verdict::Admit { raises: false },
            std::cmp::Ordering::Greater => Verdict::Admit { raises: true },
        };
        prop_assert_eq!(verdict, expected);
        prop_assert_eq!(Fence::with_max(max).admit(token), verdict);
    }

    #[test]
    fn a_fence_over_any_sequence(start in token_value(), tokens in prop::collection::vec(token_value(), 0..64)) {
        let mut fence = Fence::with_max(start);
        let mut max = start;
        for t in tokens {
            let before = fence.max();
            let verdict = fence.admit(t);
            if t < max {
                prop_assert_eq!(verdict, Verdict::Stale { max });
                prop_assert_eq!(fence.max(), before, "a stale token never moves the max");
            } else if t == max {
                prop_assert_eq!(verdict, Verdict::Admit { raises: false });
                prop_assert_eq!(fence.max(), before);
            } else {
                prop_assert_eq!(verdict, Verdict::Admit { raises: true });
                prop_assert_eq!(fence.max(), t);
                max = t;
            }
            prop_assert!(fence.max() >= before, "the max never goes down");
            prop_assert_eq!(fence.max(), max, "the max is the highest token seen");
        }
    }
}

// ---------------------------------------------------------------------------
// The lease table, against a model
// ---------------------------------------------------------------------------

const LOCKS: [&str; 3] = ["a", "b", "c"];
const OWNERS: [&str; 3] = ["alice", "bob", "carol"];

#[derive(Debug, Clone)]
enum Op {
    /// `key`: which idempotency key the acquire presents: none (0), its
    /// owner's (1), or the next owner's (2: someone else's secret).
    Acquire {
        lock: usize,
        owner: usize,
        key: usize,
        ttl_ms: u64,
    },
    /// `token`: an index into the tokens issued so far, or (past the end) a
    /// made-up one.
    Renew {
        lock: usize,
        token: usize,
        ttl_ms: u64,
    },
    Release {
        lock: usize,
        token: usize,
    },
    Advance {
        ms: u64,
    },
    Purge,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..LOCKS.len(), 0..OWNERS.len(), 0usize..3, 1u64..100)
            .prop_map(|(lock, owner, key, ttl_ms)| Op::Acquire { lock, owner, key, ttl_ms }),
        3 => (0..LOCKS.len(), 0usize..24, 1u64..100)
            .prop_map(|(lock, token, ttl_ms)| Op::Renew { lock, token, ttl_ms }),
        2 => (0..LOCKS.len(), 0usize..24).prop_map(|(lock, token)| Op::Release { lock, token }),
        3 => (0u64..120).prop_map(|ms| Op::Advance { ms }),
        1 => Just(Op::Purge),
    ]
}

/// The model: the latest recorded lease per lock and the counter.
#[derive(Debug, Default)]
struct Model {
    counter: u64,
    /// lock -> (owner, token, expires_at, index of the key it was granted with)
    leases: HashMap<usize, (usize, u64, u64, Option<usize>)>,
}

impl Model {
    fn live(&self, lock: usize, now: u64) -> Option<(usize, u64, u64, Option<usize>)> {
        self.leases.get(&lock).copied().filter(|l| now < l.2)
    }
}

/// The idempotency key an acquire presents, as an index into [`KEYS`].
fn presented_key(owner: usize, key: usize) -> Option<usize> {
    match key {
        0 => None,
        1 => Some(owner),
        _ => Some((owner + 1) % OWNERS.len()),
    }
}

const KEYS: [&[u8]; 3] = [
    b"alice-key-0123456789",
    b"bob-key-0123456789ab",
    b"carol-key-0123456789",
];

proptest! {
    #![proptest_config(config(500))]

    /// Over arbitrary acquire/renew/release/advance sequences: new grants
    /// get strictly increasing tokens (above every token issued before),
    /// renewals and re-acquires by the live holder (same owner and same
    /// idempotency key) never change the token and set the expiry to exactly
    /// now + ttl, only live leases can be renewed, and a live lease is never
    /// given to anyone else: not to another owner, and not to its own owner's
    /// name without its key.
    #[test]
    fn lock_table_matches_the_model(start in 0u64..1_000_000, ops in prop::collection::vec(op(), 1..80)) {
        let locks: Vec<LockName> = LOCKS.iter().map(|l| LockName::new(l).expect("valid")).collect();
        let mut table = LockTable::new();
        let mut model = Model::default();
        let mut issued: Vec<u64> = Vec::new();
        let mut now = start;
        let pick = |issued: &[u64], i: usize| issued.get(i).copied().unwrap_or(i as u64 + 1000);
        for op in ops {
            let ts = Timestamp(now);
            match op {
                Op::Acquire { lock, owner, key, ttl_ms } => {
                    let key = presented_key(owner, key);
                    let digest = key.map(|k| KeyDigest::of(KEYS[k]));
                    let got = table.acquire(&locks[lock], OWNERS[owner], digest, Duration::from_millis(ttl_ms), ts);
                    match model.live(lock, now) {
                        Some((o, t, _, k)) if o == owner && k.is_some() && k == key => {
                            let g = got.expect("the live holder re-acquires with its key");
                            prop_assert!(!g.new_token);
                            prop_assert_eq!(g.lease.token, t, "re-acquire keeps the token");
                            prop_assert_eq!(g.lease.expires_at, Timestamp(now + ttl_ms));
                            model.leases.insert(lock, (o, t, now + ttl_ms, k));
                        }
                        Some((o, t, exp, _)) => {
                            let held = got.expect_err("a live lease is never given to another client");
                            prop_assert_eq!(held.holder.token, t);
                            prop_assert_eq!(held.holder.owner.as_str(), OWNERS[o]);
                            prop_assert_eq!(held.holder.expires_at, Timestamp(exp));
                        }
                        None => {
                            let g = got.expect("a free lock is granted");
                            prop_assert!(g.new_token);
                            prop_assert_eq!(g.lease.token, model.counter + 1);
                            prop_assert!(issued.iter().all(|&t| g.lease.token > t), "new tokens strictly increase");
                            prop_assert_eq!(g.lease.expires_at, Timestamp(now + ttl_ms));
                            model.counter += 1;
                            issued.push(g.lease.token);
                            model.leases.insert(lock, (owner, g.lease.token, now + ttl_ms, key));
                        }
                    }
                }
                Op::Renew { lock, token, ttl_ms } => {
                    let token = pick(&issued, token);
                    let got = table.renew(&locks[lock], token, Duration::from_millis(ttl_ms), ts);
                    match model.live(lock, now) {
                        Some((o, t, _, k)) if t == token => {
                            let l = got.expect("the live holder renews");
                            prop_assert_eq!(l.token, token, "renewal never changes the token");
                            prop_assert_eq!(l.expires_at, Timestamp(now + ttl_ms), "the expiry is now + ttl, shorter or not");
                            model.leases.insert(lock, (o, t, now + ttl_ms, k));
                        }
                        live => {
                            let e = got.expect_err("only the live lease's token renews");
                            prop_assert_eq!(e.current.map(|c| c.token), live.map(|l| l.1));
                        }
                    }
                }
                Op::Release { lock, token } => {
                    let token = pick(&issued, token);
                    let got = table.release(&locks[lock], token, ts);
                    match model.leases.get(&lock).copied() {
                        Some((_, t, _, _)) if t == token => {
                            prop_assert!(got.is_ok(), "the holder releases");
                            model.leases.remove(&lock);
                        }
                        Some((_, t, exp, _)) if t > token || now < exp => {
                            prop_assert!(got.is_err(), "someone else's lease is not released");
                        }
                        _ => prop_assert_eq!(got.is_ok(), token <= model.counter),
                    }
                }
                Op::Advance { ms } => now += ms,
                Op::Purge => {
                    // Exactly the expired leases, earliest expiry first
                    // (ties in grant order, i.e. by token).
                    let mut want: Vec<_> = model.leases.iter()
                        .filter(|(_, l)| now >= l.2)
                        .map(|(&i, l)| (l.2, l.1, i))
                        .collect();
                    want.sort();
                    let want: Vec<_> = want.into_iter().map(|(_, _, i)| locks[i].clone()).collect();
                    prop_assert_eq!(table.purge_expired(ts), want);
                    model.leases.retain(|_, l| now < l.2);
                }
            }
            // The observable state agrees with the model after every step.
            prop_assert_eq!(table.counter(), model.counter);
            for (i, l) in locks.iter().enumerate() {
                let live = table.live(l, Timestamp(now)).map(|x| (x.token, x.expires_at.0));
                prop_assert_eq!(live, model.live(i, now).map(|m| (m.1, m.2)));
            }
            let next = (0..LOCKS.len()).filter_map(|i| model.live(i, now).map(|l| l.2)).min();
            prop_assert_eq!(table.next_expiry(Timestamp(now)), next.map(Timestamp));
        }
        // A restart from the persisted state keeps every later token higher.
        let recorded: Vec<_> = locks.iter().filter_map(|l| table.recorded(l).cloned()).collect();
        let mut restored = LockTable::restore(table.counter(), recorded);
        let fresh = LockName::new("fresh").expect("valid");
        let g = restored.acquire(&fresh, "z", None, Duration::from_millis(1), Timestamp(now)).expect("free");
        prop_assert!(issued.iter().all(|&t| g.lease.token > t));
    }
}
