//! Which object keys the proxy accepts: the one rule that keeps a key inside
//! its bucket and its fence scope's prefix, on every store.
//!
//! S3 itself treats a key as an opaque string, but stores built on a file
//! system do not: s3s-fs joins `bucket/key` into a path and resolves `.` and
//! `..` (`path_absolutize`), MinIO cleans paths, and a store on Windows
//! treats `\` as a separator. A key such as `../other/victim.txt` would then
//! be fenced by the scope of its literal prefix while the store writes
//! another bucket (or s3s-fs's own metadata files, or removes a bucket).
//! Scope resolution and forwarding therefore use the same string, and that
//! string must mean the same thing to every store. A key is accepted when,
//! split on `/`:
//!
//! - no segment is `.` or `..`;
//! - no segment is empty, except the last (a trailing `/` names a
//!   "directory marker" such as `photos/`): so no leading `/` (an absolute
//!   path on a file-system store) and no `//` (which MinIO and s3s's
//!   `normalize_forward_slash_path` collapse into another key);
//! - it contains no `\` (a separator on Windows stores) and no NUL;
//! - it is 1 to 1024 bytes long (S3's limit).
//!
//! s3s has already percent-decoded the key once, as S3 does; a store does
//! not decode it again, so `%2E%2E` in the decoded key is three literal
//! characters and harmless. Everything else S3 allows is allowed.
//!
//! The proxy applies the rule to every request that names a key (reads
//! too: `GET ../other/x` is a read of another bucket on s3s-fs), to copy
//! sources and to every key of a DeleteObjects body, before any scope or
//! backend work. The dev store applies it again on its own.

use std::fmt;

/// S3's longest key, in bytes.
pub const MAX_KEY_BYTES: usize = 1024;

/// Why a key is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRefusal {
    Empty,
    TooLong,
    DotSegment,
    EmptySegment,
    Backslash,
    Nul,
}

impl fmt::Display for KeyRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyRefusal::Empty => "the key is empty",
            KeyRefusal::TooLong => "the key is longer than 1024 bytes",
            KeyRefusal::DotSegment => {
                "the key has a '.' or '..' path segment, which a file-system store resolves into another key or bucket"
            }
            KeyRefusal::EmptySegment => {
                "the key starts with '/' or has '//', which stores resolve or collapse into another key"
            }
            KeyRefusal::Backslash => "the key contains '\\', a path separator on some stores",
            KeyRefusal::Nul => "the key contains a NUL character",
        })
    }
}

/// Checks `key` against the rule in the module docs.
pub fn check(key: &str) -> Result<(), KeyRefusal> {
    if key.is_empty() {
        return Err(KeyRefusal::Empty);
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(KeyRefusal::TooLong);
    }
    // Bytes, not chars: both are ASCII, and a byte scan is cheaper than a
    // `char` searcher on keys this short.
    if key.bytes().any(|b| b == b'\\') {
        return Err(KeyRefusal::Backslash);
    }
    if key.bytes().any(|b| b == 0) {
        return Err(KeyRefusal::Nul);
    }
    let mut segments = fencegate_core::fields::split(key, b'/').peekable();
    while let Some(s) = segments.next() {
        match s {
            "." | ".." => return Err(KeyRefusal::DotSegment),
            "" if segments.peek().is_some() => return Err(KeyRefusal::EmptySegment),
            _ => {}
        }
    }
    Ok(())
}

/// [`check`] as the S3 error the client gets: 400 `InvalidArgument` (the
/// code AWS uses for an unusable key), naming the key and the rule.
pub fn require(key: &str) -> s3s::S3Result<()> {
    check(key).map_err(|r| {
        s3s::s3_error!(
            InvalidArgument,
            "object key {key:?} is refused: {r}; use a key without '.', '..' or empty path segments, '\\' or NUL"
        )
    })
}

/// A request input that names object keys: its own key and, for a copy,
/// the source's.
pub trait NamesKeys {
    /// Every object key the request names.
    fn keys(&self) -> impl Iterator<Item = &str>;
}

/// Every key `input` names passes [`require`].
pub fn require_all(input: &impl NamesKeys) -> s3s::S3Result<()> {
    input.keys().try_for_each(require)
}

/// For requests that name no key, or are not checked here.
pub fn unchecked<T>(_: &T) -> s3s::S3Result<()> {
    Ok(())
}

macro_rules! names_its_key {
    ($($input:ty),*) => {$(
        impl NamesKeys for $input {
            fn keys(&self) -> impl Iterator<Item = &str> {
                std::iter::once(self.key.as_str())
            }
        }
    )*};
}

names_its_key!(
    s3s::dto::DeleteObjectInput,
    s3s::dto::CreateMultipartUploadInput,
    s3s::dto::ListPartsInput,
    s3s::dto::CompleteMultipartUploadInput,
    s3s::dto::AbortMultipartUploadInput
);

macro_rules! names_its_key_and_source {
    ($($input:ty),*) => {$(
        impl NamesKeys for $input {
            fn keys(&self) -> impl Iterator<Item = &str> {
                let source = match &self.copy_source {
                    s3s::dto::CopySource::Bucket { key, .. } => Some(&**key),
                    _ => None,
                };
                std::iter::once(self.key.as_str()).chain(source)
            }
        }
    )*};
}

names_its_key_and_source!(s3s::dto::CopyObjectInput, s3s::dto::UploadPartCopyInput);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_names_its_key_and_its_source() {
        let copy = |key: &str, source: &str| {
            s3s::dto::CopyObjectInput::builder()
                .bucket("b".into())
                .key(key.into())
                .copy_source(s3s::dto::CopySource::Bucket {
                    bucket: "b".into(),
                    key: source.into(),
                    version_id: None,
                })
                .build()
                .expect("input")
        };
        assert!(require_all(&copy("a", "b")).is_ok());
        assert!(require_all(&copy("../x", "b")).is_err(), "its key");
        assert!(require_all(&copy("a", "../x")).is_err(), "its source");
    }

    #[test]
    fn ordinary_keys_pass() {
        for k in [
            "a",
            "a/b/c.txt",
            "dir/",
            ".hidden",
            "a/.b/..c/...",
            "%2E%2E/x",
            "a b+c",
            "ü/ñ",
            "x..y/z.",
        ] {
            assert_eq!(check(k), Ok(()), "{k}");
        }
    }

    #[test]
    fn escaping_keys_are_refused() {
        let refused: [(KeyRefusal, &[&str]); 5] = [
            (KeyRefusal::Empty, &[""]),
            (
                KeyRefusal::DotSegment,
                &[
                    "..",
                    "../other/victim.txt",
                    "x/../../other/v",
                    "./",
                    "a/./b",
                    "a/..",
                ],
            ),
            (KeyRefusal::EmptySegment, &["/etc/passwd", "a//b", "/"]),
            (KeyRefusal::Backslash, &["a\\..\\b"]),
            (KeyRefusal::Nul, &["a\0b"]),
        ];
        for (why, keys) in refused {
            for k in keys {
                assert_eq!(check(k), Err(why), "{k:?}");
            }
        }
        assert_eq!(check(&"k".repeat(1025)), Err(KeyRefusal::TooLong));
        assert_eq!(check(&"k".repeat(1024)), Ok(()));
    }
}
