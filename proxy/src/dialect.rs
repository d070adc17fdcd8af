//! How a store reads conditions: the spelling of an ETag in a condition
//! header and the names of a copy's source conditions, which stores do not
//! agree on (Ceph RGW before 2025 refuses a quoted `If-Match` and reads a
//! copy's source conditions only under their older names). The probe
//! (`probe`) learns a store's [`Dialect`]; the write paths (`backend`'s SDK
//! interceptor, `lean`) write conditions in it.

use crate::op::Op;
use serde::Serialize;

/// How an ETag is written in a condition header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Spelling {
    /// `"<etag>"`, as AWS documents it and clients send it.
    Quoted,
    /// `<etag>`, the only form Ceph RGW before 2025 reads in `If-Match`.
    Bare,
}

impl Spelling {
    /// In the order the probe prefers them: AWS's first.
    pub(crate) const ALL: [Spelling; 2] = [Spelling::Quoted, Spelling::Bare];

    /// `etag` (quoted or not) written this way; `*` (any) stays as it is.
    pub fn write(self, etag: &str) -> String {
        if etag.trim() == "*" {
            return "*".to_owned();
        }
        let bare = bare(etag);
        match self {
            Spelling::Quoted => ["\"", bare, "\""].concat(),
            Spelling::Bare => bare.to_owned(),
        }
    }

    pub(crate) fn describe(self) -> &'static str {
        match self {
            Spelling::Quoted => "quoted",
            Spelling::Bare => "bare",
        }
    }
}

/// The header names a store reads a copy's source conditions under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceNames {
    /// `x-amz-copy-source-if-match` and its siblings, as AWS names them.
    Aws,
    /// `x-amz-copy-if-match` and its siblings (Ceph RGW before 2025).
    Old,
}

/// A copy's source condition, named as S3 names its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(clippy::enum_variant_names)]
pub enum SourceCondition {
    IfMatch,
    IfNoneMatch,
    IfModifiedSince,
    IfUnmodifiedSince,
}

impl SourceCondition {
    pub const ALL: [SourceCondition; 4] = [
        SourceCondition::IfMatch,
        SourceCondition::IfNoneMatch,
        SourceCondition::IfModifiedSince,
        SourceCondition::IfUnmodifiedSince,
    ];

    /// Whether its value is an ETag (else a date).
    pub fn is_etag(self) -> bool {
        matches!(
            self,
            SourceCondition::IfMatch | SourceCondition::IfNoneMatch
        )
    }
}

impl SourceNames {
    /// The header `condition` is read under.
    pub fn header(self, condition: SourceCondition) -> &'static str {
        use SourceCondition::*;
        match (self, condition) {
            (SourceNames::Aws, IfMatch) => "x-amz-copy-source-if-match",
            (SourceNames::Aws, IfNoneMatch) => "x-amz-copy-source-if-none-match",
            (SourceNames::Aws, IfModifiedSince) => "x-amz-copy-source-if-modified-since",
            (SourceNames::Aws, IfUnmodifiedSince) => "x-amz-copy-source-if-unmodified-since",
            (SourceNames::Old, IfMatch) => "x-amz-copy-if-match",
            (SourceNames::Old, IfNoneMatch) => "x-amz-copy-if-none-match",
            (SourceNames::Old, IfModifiedSince) => "x-amz-copy-if-modified-since",
            (SourceNames::Old, IfUnmodifiedSince) => "x-amz-copy-if-unmodified-since",
        }
    }
}

/// How the proxy writes each condition to one store, from its probe: a
/// condition is sent only in the spelling the store was seen to enforce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Dialect {
    pub(crate) put_if_match: Option<Spelling>,
    pub(crate) complete_if_match: Option<Spelling>,
    pub(crate) copy_if_match: Option<Spelling>,
    pub(crate) delete_if_match: Option<Spelling>,
    /// Where a copy's source conditions are read, if anywhere.
    pub(crate) source: Option<(SourceNames, Spelling)>,
}

impl Dialect {
    /// What AWS documents, for a store not probed.
    pub const AWS: Dialect = Dialect {
        put_if_match: Some(Spelling::Quoted),
        complete_if_match: Some(Spelling::Quoted),
        copy_if_match: Some(Spelling::Quoted),
        delete_if_match: Some(Spelling::Quoted),
        source: Some((SourceNames::Aws, Spelling::Quoted)),
    };

    /// The `If-Match` operation `op` sends for `etag`, or None where the
    /// store was not seen to enforce it.
    pub fn if_match(&self, op: Op, etag: &str) -> Option<String> {
        if etag.trim() == "*" {
            return Some("*".to_owned());
        }
        let spelling = match op {
            Op::PutObject => self.put_if_match,
            Op::CompleteMultipartUpload => self.complete_if_match,
            Op::CopyObject => self.copy_if_match,
            Op::DeleteObject => self.delete_if_match,
            _ => Some(Spelling::Quoted),
        }?;
        Some(spelling.write(etag))
    }

    /// Where a copy's source conditions go, and how their ETags are
    /// written; None: the store enforces none, and the proxy alone checks
    /// them (against the source it reads before the copy).
    pub fn source(&self) -> Option<(SourceNames, Spelling)> {
        self.source
    }
}

/// ETags travel quoted; the proxy keeps the bare value.
pub fn strip_quotes(s: &str) -> String {
    bare(s).to_owned()
}

/// `s` without its quotes (and weak mark).
fn bare(s: &str) -> &str {
    s.trim().trim_start_matches("W/").trim_matches('"')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_and_dialects() {
        assert_eq!(Spelling::Quoted.write("abc"), "\"abc\"");
        assert_eq!(Spelling::Quoted.write("\"abc\""), "\"abc\"");
        assert_eq!(Spelling::Bare.write("\"abc\""), "abc");
        assert_eq!(Spelling::Quoted.write("*"), "*");
        let d = Dialect {
            put_if_match: Some(Spelling::Bare),
            complete_if_match: None,
            ..Dialect::AWS
        };
        assert_eq!(d.if_match(Op::PutObject, "\"e\"").as_deref(), Some("e"));
        assert_eq!(d.if_match(Op::CompleteMultipartUpload, "\"e\""), None);
        assert_eq!(d.if_match(Op::CopyObject, "e").as_deref(), Some("\"e\""));
        assert_eq!(d.if_match(Op::PutObject, "*").as_deref(), Some("*"));
    }
}
