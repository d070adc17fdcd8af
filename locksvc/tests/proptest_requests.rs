//! Property tests of the lease service's request decoding
//! (`api::decode_request`, the same serde structs and owner check the
//! acquire/renew/release handlers use), and of its configuration parsing
//! (`toml::from_str::<LocksvcConfig>` + `problems()`).
//!
//! A few seconds in the normal `cargo test`; for a longer local run:
//! `PROPTEST_CASES=20000 cargo test -p fencegate-locksvc --test proptest_requests`.

use fencegate_core::FencingToken;
use fencegate_locksvc::LocksvcConfig;
use fencegate_locksvc::api::{DecodedRequest, MAX_OWNER_LEN, RequestKind, decode_request};
use fencegate_testkit::proptest::config;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

const KINDS: [RequestKind; 3] = [
    RequestKind::Acquire,
    RequestKind::Renew,
    RequestKind::Release,
];

fn kind() -> impl Strategy<Value = RequestKind> {
    prop::sample::select(KINDS.to_vec())
}

/// Every error names an API error code the handlers answer with 400.
fn check_error(e: &str) -> Result<(), TestCaseError> {
    prop_assert!(
        e.starts_with("InvalidRequest: ")
            || e.starts_with("InvalidOwner: ")
            || e.starts_with("InvalidIdempotencyKey: "),
        "unexpected error {:?}",
        e
    );
    Ok(())
}

/// Whatever decodes is a request the handlers could act on.
fn check_decoded(kind: RequestKind, d: &DecodedRequest) -> Result<(), TestCaseError> {
    match (kind, d) {
        (RequestKind::Acquire, DecodedRequest::Acquire { owner, .. }) => {
            prop_assert!(!owner.is_empty() && owner.len() <= MAX_OWNER_LEN);
            prop_assert!(!owner.chars().any(char::is_control));
        }
        (RequestKind::Renew, DecodedRequest::Renew { .. })
        | (RequestKind::Release, DecodedRequest::Release { .. }) => {}
        _ => prop_assert!(false, "{:?} decoded as {:?}", kind, d),
    }
    Ok(())
}

fn decode_checked(kind: RequestKind, body: &[u8]) -> Result<(), TestCaseError> {
    match decode_request(kind, body) {
        Ok(d) => check_decoded(kind, &d),
        Err(e) => check_error(&e),
    }
}

/// An owner the handlers accept: 1 to 256 bytes, no control characters.
fn valid_owner() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9@._ -]{1,64}",
        "[^\\p{Cc}]{1,64}",
        Just("x".repeat(MAX_OWNER_LEN)),
    ]
    .prop_filter("fits the owner limit", |o| o.len() <= MAX_OWNER_LEN)
}

/// An idempotency key the handlers accept: 16 to 256 bytes, no control
/// characters.
fn valid_key() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        Just(None),
        "[a-zA-Z0-9-]{16,64}".prop_map(Some),
        "[^\\p{Cc}]{16,40}"
            .prop_filter("fits the key limit", |k| (16..=256).contains(&k.len()))
            .prop_map(Some),
    ]
}

fn opt_u64() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![Just(None), any::<u64>().prop_map(Some)]
}

/// A JSON object with the fields set (absent `None`s are left out, or sent
/// as explicit `null`).
fn object(fields: &[(&str, Option<Value>)], nulls: bool) -> Map<String, Value> {
    let mut m = Map::new();
    for (k, v) in fields {
        match v {
            Some(v) => {
                m.insert((*k).to_owned(), v.clone());
            }
            None if nulls => {
                m.insert((*k).to_owned(), Value::Null);
            }
            None => {}
        }
    }
    m
}

fn body(m: Map<String, Value>) -> Vec<u8> {
    serde_json::to_vec(&Value::Object(m)).expect("a JSON object serializes")
}

/// A random JSON value, for fields of the wrong type and unknown fields.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(config(1500))]

    #[test]
    fn arbitrary_bytes_never_panic(k in kind(), bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        decode_checked(k, &bytes)?;
    }

    #[test]
    fn json_ish_strings_never_panic(
        k in kind(),
        s in "[{}\\[\\]\":,0-9a-z_ .+eE\\\\-]{0,80}",
    ) {
        decode_checked(k, s.as_bytes())?;
    }

    #[test]
    fn request_like_strings_never_panic(
        k in kind(),
        fields in prop::collection::vec(
            (
                prop_oneof![
                    Just("owner"), Just("ttl_ms"), Just("wait_ms"), Just("token"), Just("Owner"),
                    Just("idempotency_key"),
                    Just("token "), Just("x"),
                ],
                prop_oneof![
                    "-?[0-9]{1,25}(\\.[0-9]{1,3})?([eE][+-]?[0-9]{1,3})?",
                    "\"[^\"\\\\]{0,10}\"",
                    "\"(\\\\u[0-9a-fA-F]{4}|\\\\[nrt\"\\\\/]|[a-z]){0,6}\"",
                    Just("null".to_owned()), Just("true".to_owned()), Just("[]".to_owned()),
                    Just("{}".to_owned()),
                ],
            ),
            0..5,
        ),
        ws in "[ \t\r\n]{0,2}",
    ) {
        let inner: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\"{ws}:{ws}{v}")).collect();
        let text = format!("{ws}{{{}}}{ws}", inner.join(","));
        decode_checked(k, text.as_bytes())?;
    }

    #[test]
    fn arbitrary_json_objects_never_panic(k in kind(), v in json_value()) {
        decode_checked(k, &serde_json::to_vec(&v).expect("serializes"))?;
    }

    #[test]
    fn valid_acquires_decode(
        owner in valid_owner(), ttl_ms in opt_u64(), wait_ms in opt_u64(), idempotency_key in valid_key(),
        nulls in any::<bool>(),
    ) {
        let m = object(
            &[
                ("owner", Some(json!(owner))),
                ("ttl_ms", ttl_ms.map(|v| json!(v))),
                ("wait_ms", wait_ms.map(|v| json!(v))),
                ("idempotency_key", idempotency_key.as_ref().map(|v| json!(v))),
            ],
            nulls,
        );
        prop_assert_eq!(
            decode_request(RequestKind::Acquire, &body(m)),
            Ok(DecodedRequest::Acquire { owner, ttl_ms, wait_ms, idempotency_key })
        );
    }

    #[test]
    fn invalid_idempotency_keys_are_rejected(
        owner in valid_owner(),
        key in prop_oneof![
            "[a-z]{0,15}",
            "[a-z]{257,300}",
            "[a-z]{8,20}[\\x00-\\x1f\\x7f][a-z]{8,20}",
        ],
    ) {
        let m = object(&[("owner", Some(json!(owner))), ("idempotency_key", Some(json!(key)))], false);
        let err = decode_request(RequestKind::Acquire, &body(m)).expect_err("key is invalid");
        prop_assert!(err.starts_with("InvalidIdempotencyKey: "), "{}", err);
        prop_assert!(key.len() < 16 || !err.contains(&key), "the key is never echoed: {}", err);
    }

    /// Renew and release decode a plain number too (JSON or string), so the
    /// handler can refuse it with `SignedTokenRequired`; what they decode to
    /// is `FencingToken::Plain`, which proves nothing.
    #[test]
    fn renews_and_releases_decode_plain_numbers_as_plain(token in any::<u64>(), ttl_ms in opt_u64(), nulls in any::<bool>()) {
        let m = object(&[("token", Some(json!(token))), ("ttl_ms", ttl_ms.map(|v| json!(v)))], nulls);
        prop_assert_eq!(
            decode_request(RequestKind::Renew, &body(m)),
            Ok(DecodedRequest::Renew { token: FencingToken::Plain(token), ttl_ms })
        );
        let m = object(&[("token", Some(json!(token)))], nulls);
        prop_assert_eq!(
            decode_request(RequestKind::Release, &body(m)),
            Ok(DecodedRequest::Release { token: FencingToken::Plain(token) })
        );
    }

    #[test]
    fn positional_arrays_are_refused(
        owner in valid_owner(), token in any::<u64>(), ttl_ms in opt_u64(), wait_ms in opt_u64(),
    ) {
        let cases = [
            (
                RequestKind::Acquire,
                json!([owner, ttl_ms, wait_ms]),
                DecodedRequest::Acquire { owner: owner.clone(), ttl_ms, wait_ms, idempotency_key: None },
            ),
            (
                RequestKind::Renew,
                json!([token, ttl_ms]),
                DecodedRequest::Renew { token: FencingToken::Plain(token), ttl_ms },
            ),
            (RequestKind::Release, json!([token]), DecodedRequest::Release { token: FencingToken::Plain(token) }),
        ];
        for (k, array, _object_form) in cases {
            let got = decode_request(k, &serde_json::to_vec(&array).expect("serializes"));
            prop_assert_eq!(got, Err("InvalidRequest: request body must be a JSON object".to_owned()));
        }
    }

    #[test]
    fn unknown_fields_are_rejected(
        k in kind(),
        extra in "[a-zA-Z_]{1,12}",
        value in json_value(),
        owner in valid_owner(),
        token in any::<u64>(),
    ) {
        let known: &[&str] = match k {
            RequestKind::Acquire => &["owner", "ttl_ms", "wait_ms", "idempotency_key"],
            RequestKind::Renew => &["token", "ttl_ms"],
            RequestKind::Release => &["token"],
        };
        prop_assume!(!known.contains(&extra.as_str()));
        let mut m = match k {
            RequestKind::Acquire => object(&[("owner", Some(json!(owner)))], false),
            RequestKind::Renew | RequestKind::Release => object(&[("token", Some(json!(token)))], false),
        };
        m.insert(extra.clone(), value);
        let err = decode_request(k, &body(m)).expect_err("an unknown field is refused");
        prop_assert!(err.starts_with("InvalidRequest: "), "{}", err);
        prop_assert!(err.contains("unknown field"), "{}", err);
    }

    #[test]
    fn fields_of_another_request_are_rejected(token in any::<u64>(), owner in valid_owner()) {
        // A renew body sent to acquire and the other way round.
        let renew = body(object(&[("token", Some(json!(token)))], false));
        prop_assert!(decode_request(RequestKind::Acquire, &renew).is_err());
        let acquire = body(object(&[("owner", Some(json!(owner)))], false));
        prop_assert!(decode_request(RequestKind::Renew, &acquire).is_err());
        prop_assert!(decode_request(RequestKind::Release, &acquire).is_err());
        // wait_ms belongs to acquire only.
        let renew_wait = body(object(
            &[("token", Some(json!(token))), ("wait_ms", Some(json!(1)))],
            false,
        ));
        prop_assert!(decode_request(RequestKind::Renew, &renew_wait).is_err());
    }

    #[test]
    fn wrong_types_are_rejected(k in kind(), value in json_value()) {
        let ok = match (&k, &value) {
            (RequestKind::Acquire, Value::String(s)) => !s.is_empty() && !s.chars().any(char::is_control),
            (RequestKind::Renew | RequestKind::Release, Value::Number(n)) => n.is_u64(),
            // The token as the service handed it out: a decimal string or
            // the signed fencing_token.
            (RequestKind::Renew | RequestKind::Release, Value::String(s)) => {
                fencegate_core::FencingToken::parse(s).is_ok()
            }
            _ => false,
        };
        let field = if k == RequestKind::Acquire { "owner" } else { "token" };
        let got = decode_request(k, &body(object(&[(field, Some(value.clone()))], false)));
        prop_assert_eq!(got.is_ok(), ok, "{:?} = {:?}: {:?}", field, value, got);
    }

    #[test]
    fn invalid_owners_are_rejected(
        owner in prop_oneof![
            Just(String::new()),
            "[a-z]{0,8}[\\x00-\\x1f\\x7f\\u{80}-\\u{9f}][a-z]{0,8}",
            "[a-z]{257,300}",
            "\u{e9}{129,140}",
        ],
    ) {
        let err = decode_request(RequestKind::Acquire, &body(object(&[("owner", Some(json!(owner)))], false)))
            .expect_err("owner is invalid");
        prop_assert!(err.starts_with("InvalidOwner: "), "{}", err);
    }
}

#[test]
fn duplicate_and_missing_fields_are_rejected() {
    for (kind, text) in [
        (RequestKind::Acquire, r#"{"owner":"a","owner":"b"}"#),
        (RequestKind::Renew, r#"{"token":1,"token":2}"#),
        (RequestKind::Release, r#"{"token":1,"token":1}"#),
        (RequestKind::Acquire, r#"{}"#),
        (RequestKind::Acquire, r#"{"ttl_ms":1}"#),
        (RequestKind::Renew, r#"{"ttl_ms":1}"#),
        (RequestKind::Release, r#"{}"#),
        (RequestKind::Release, r#"null"#),
        (RequestKind::Release, r#"{"token":-1}"#),
        (RequestKind::Release, r#"{"token":1.0}"#),
        (RequestKind::Release, r#"{"token":"01"}"#),
        (RequestKind::Release, r#"{"token":"one"}"#),
        (RequestKind::Release, r#"{"token":""}"#),
        (RequestKind::Release, r#"{"token":"fgt1:lock:1"}"#),
        (RequestKind::Release, r#"{"token":18446744073709551616}"#),
        (RequestKind::Release, r#"{"token":1} trailing"#),
        (RequestKind::Release, ""),
    ] {
        let got = decode_request(kind, text.as_bytes());
        assert!(
            got.as_ref()
                .is_err_and(|e| e.starts_with("InvalidRequest: ")),
            "{kind:?} {text:?}: {got:?}"
        );
    }
}

#[test]
fn a_token_decodes_as_signed_only_from_the_fencing_token_string() {
    let keys =
        fencegate_core::TokenKeys::new(vec![b"0123456789abcdef-api".to_vec()]).expect("keys");
    let signed = keys.sign(&fencegate_core::LockName::new("nightly").expect("lock"), 42);
    assert_eq!(
        decode_request(
            RequestKind::Release,
            format!(r#"{{"token":"{signed}"}}"#).as_bytes()
        ),
        Ok(DecodedRequest::Release {
            token: FencingToken::Signed(signed)
        })
    );
    // The number, either way it is written, decodes as plain (and the
    // handler refuses it with SignedTokenRequired).
    for text in [r#"{"token":"42"}"#, r#"{"token":42}"#] {
        assert_eq!(
            decode_request(RequestKind::Release, text.as_bytes()),
            Ok(DecodedRequest::Release {
                token: FencingToken::Plain(42)
            }),
            "{text}"
        );
    }
}

/// serde's derived decoding would take a struct as a positional array
/// (`[1]` as a release body); the API takes JSON objects only.
#[test]
fn positional_array_bodies_are_refused() {
    for (kind, array) in [
        (RequestKind::Release, "[1]"),
        (RequestKind::Renew, "[7, 2000]"),
        (RequestKind::Acquire, r#"["alice", 5000, null]"#),
        (RequestKind::Acquire, "  [\"alice\"]"),
    ] {
        assert_eq!(
            decode_request(kind, array.as_bytes()),
            Err("InvalidRequest: request body must be a JSON object".to_owned()),
            "{kind:?} {array}"
        );
    }
}

#[test]
fn deeply_nested_json_is_an_error_not_a_crash() {
    // serde_json's recursion limit (128) turns this into an error instead of
    // a stack overflow.
    for depth in [200, 10_000] {
        let text = format!("{{\"owner\":{}1{}}}", "[".repeat(depth), "]".repeat(depth));
        for kind in KINDS {
            assert!(decode_request(kind, text.as_bytes()).is_err());
        }
    }
}

// ---------------------------------------------------------------------------
// Configuration text
// ---------------------------------------------------------------------------

/// A humantime duration, mostly plausible, sometimes absurd.
fn duration_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{1,4}(ms|s|m|h|d)",
        "[0-9]{1,25}(ns|us|ms|s|m|h|d|w|M|y|years)",
        "([0-9]{1,3}[a-z]{1,2} ?){1,4}",
        ".{0,8}",
    ]
}

fn locksvc_line() -> impl Strategy<Value = String> {
    let durations = prop::sample::select(vec![
        "default_ttl",
        "min_ttl",
        "max_ttl",
        "max_wait",
        "credential_ttl",
    ]);
    let numbers = prop::sample::select(vec!["max_waiters_per_lock", "max_body_bytes"]);
    prop_oneof![
        (durations, duration_text()).prop_map(|(k, v)| format!("{k} = {}", toml_string(&v))),
        (numbers, "-?[0-9]{1,22}").prop_map(|(k, v)| format!("{k} = {v}")),
        "listen = \"[0-9.:\\[\\]a-z]{0,24}\"",
        "db = \"[a-z/.]{0,12}\"",
        "(signing_keys|api_keys) = \\[(\"[a-z0-9]{0,20}\", ?){0,3}\\]",
        "[a-z_]{1,12} = [^\n]{0,12}",
        "[^\n]{0,16}",
    ]
}

/// The start of every problem `c` must have, from the rules the README and
/// the config docs state, for the fields `locksvc_line` sets (the others
/// keep their valid defaults).
fn expected_problems(c: &LocksvcConfig) -> Vec<String> {
    let mut e = Vec::new();
    if c.signing_keys.is_empty() {
        e.push("signing_keys is empty".to_owned());
    }
    for (i, k) in c.signing_keys.iter().enumerate() {
        if k.len() < 16 {
            e.push(format!("signing_keys[{i}] is {} bytes", k.len()));
        }
    }
    if c.min_ttl.is_zero() {
        e.push("min_ttl must be above zero".to_owned());
    }
    if c.min_ttl > c.max_ttl {
        e.push("min_ttl (".to_owned());
    }
    if !(c.min_ttl..=c.max_ttl).contains(&c.default_ttl) {
        e.push("default_ttl must lie between".to_owned());
    }
    if c.max_body_bytes < 256 {
        e.push("max_body_bytes must be at least 256".to_owned());
    }
    if c.max_waiters_per_lock == 0 {
        e.push("max_waiters_per_lock must be at least 1".to_owned());
    }
    if c.credential_ttl < std::time::Duration::from_secs(60) {
        e.push("credential_ttl must be at least 1m".to_owned());
    }
    for (i, k) in c.api_keys.iter().enumerate() {
        if k.key.chars().count() < 8 {
            e.push(format!("api_keys[{i}] is shorter than 8 characters"));
        }
        if k.key.trim() != k.key {
            e.push(format!("api_keys[{i}] starts or ends with whitespace"));
        }
        if let Some(j) = c.api_keys[..i].iter().position(|o| o.key == k.key) {
            e.push(format!("api_keys[{i}] is the same key as api_keys[{j}]"));
        }
    }
    let ms100 = std::time::Duration::from_millis(100);
    if c.header_read_timeout < ms100 {
        e.push("header_read_timeout must be at least 100ms".to_owned());
    }
    if c.idle_timeout < ms100 {
        e.push("idle_timeout must be at least 100ms".to_owned());
    }
    if c.max_connections == 0 {
        e.push("max_connections must be at least 1".to_owned());
    }
    e
}

fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

proptest! {
    #![proptest_config(config(800))]

    #[test]
    fn locksvc_config_text_never_panics(
        lines in prop::collection::vec(locksvc_line(), 0..10),
        raw in any::<String>(),
    ) {
        let text = lines.join("\n");
        if let Ok(c) = toml::from_str::<LocksvcConfig>(&text) {
            // Each field the lines can set, judged here on its own: every
            // fault yields its own problem, and nothing else is reported.
            let expected = expected_problems(&c);
            let problems = c.problems();
            for want in &expected {
                prop_assert!(
                    problems.iter().any(|p| p.starts_with(want.as_str())),
                    "{}: expected {:?} in {:?}", text, want, problems
                );
            }
            prop_assert_eq!(problems.len(), expected.len(), "{}: {:?} vs {:?}", text, problems, expected);
            match c.clone().validated() {
                Ok(_) => prop_assert!(expected.is_empty(), "{}: accepted with {:?}", text, expected),
                Err(e) => {
                    let e = e.to_string();
                    for p in &problems {
                        prop_assert!(e.contains(p.as_str()), "{} not listed in {}", p, e);
                    }
                }
            }
        }
        if let Ok(c) = toml::from_str::<LocksvcConfig>(&raw) {
            let _ = c.problems();
        }
    }

    #[test]
    fn ttl_bounds_are_checked(min in 0u64..5000, max in 0u64..5000, default in 0u64..5000) {
        let text = format!("signing_keys = [\"0123456789abcdef\"]\nmin_ttl = \"{min}ms\"\nmax_ttl = \"{max}ms\"\ndefault_ttl = \"{default}ms\"\n");
        let c: LocksvcConfig = toml::from_str(&text).expect("well-formed");
        let ok = min > 0 && min <= max && (min..=max).contains(&default);
        prop_assert_eq!(c.problems().is_empty(), ok, "{:?}", c.problems());
    }
}
