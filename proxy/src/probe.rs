//! The probe: which conditions the store enforces, and how each must be
//! written for the store to read it.
//!
//! A store that accepts `If-Match` / `If-None-Match` and ignores them would
//! silently void the per-object half of the fence, and a store that reads a
//! condition only when it is spelled its own way (Ceph RGW before 2025
//! refuses the correct ETag when it is quoted, as AWS documents it, and
//! reads a copy's source condition only under its older name) would refuse
//! every overwrite. So the proxy finds out before serving fenced traffic,
//! in scratch keys of the bucket. Each ETag condition is tried in each
//! [`Spelling`], once with a wrong ETag and once with the right one:
//!
//! | check | request | enforced if |
//! |---|---|---|
//! | `put_if_none_match` | PUT an existing key, `If-None-Match: *`; and a new one | 412; 2xx |
//! | `put_if_match` | PUT with a wrong, then the right `If-Match` | 412, then 2xx |
//! | `complete_if_none_match` | Complete onto an existing key, `If-None-Match: *` | 412 |
//! | `complete_if_match` | Complete with a wrong, then the right `If-Match` | 412, then 2xx |
//! | `copy_if_none_match` | CopyObject onto an existing key, `If-None-Match: *` | 412 |
//! | `copy_if_match` | CopyObject with a wrong, then the right destination `If-Match` | 412, then 2xx |
//! | `delete_if_match` | DELETE with a wrong, then the right `If-Match` | 412, then 2xx |
//! | `copy_source_if_match` | CopyObject with a wrong, then the right `x-amz-copy-source-if-match` | 412, then 2xx |
//! | `copy_source_if_match_old_name` | the same with `x-amz-copy-if-match` | 412, then 2xx |
//!
//! A condition is [`Finding::Enforced`] in the first spelling (AWS's
//! quoted ETag first) whose right value passes, provided every spelling
//! refuses a wrong value. Answers that contradict each other (one spelling
//! accepts a wrong value that another refuses, or a spelling that accepts a
//! wrong value and refuses the right one) are [`Finding::Contradictory`]:
//! never guessed at. The report keeps every request and answer.
//!
//! What the proxy does with a report is [`Dialect`]: it sends a condition
//! only in the spelling the store was seen to enforce, and nothing where it
//! was not (a condition the store ignores changes nothing, and one it
//! refuses even when right would fail every write). The two PUT checks are
//! required (unless the operator accepts the weaker mode). Where another is
//! missing, that operation is fenced by the proxy alone (its epoch, the
//! key read afresh and its per-key lock), which holds for writers going
//! through one proxy, not across replicas; README "Stores" has the table.

use crate::backend::status_of;
use crate::dialect::{Dialect, SourceCondition, SourceNames, Spelling, strip_quotes};
use aws_sdk_s3::error::ProvideErrorMetadata as _;
use aws_sdk_s3::error::SdkError;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use serde::Serialize;
use std::time::Duration;

/// What the probe found for one condition.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Finding {
    /// A wrong value is refused in every spelling, and the right one
    /// passes in `spelling` (None for `If-None-Match: *`, which has none).
    Enforced { spelling: Option<Spelling> },
    /// A wrong value passes in every spelling.
    Ignored,
    /// A wrong value is refused, and so is the right one, in every
    /// spelling: sending it would fail every such write.
    RefusesCorrect,
    /// The answers contradict each other (see the module doc).
    Contradictory,
    /// The check could not be run, or its answers were neither a pass nor
    /// a condition failure.
    Untested { error: String },
}

/// One condition's finding and the exchanges it rests on.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Check {
    #[serde(flatten)]
    pub finding: Finding,
    /// Each request sent and the store's answer, in order.
    pub answers: Vec<String>,
}

impl Check {
    pub fn enforced(&self) -> bool {
        matches!(self.finding, Finding::Enforced { .. })
    }

    /// The spelling to send: where enforced, that one; where the store
    /// ignores the condition or refuses even the right value, none (it
    /// would change nothing, or fail every write); where the probe could
    /// not tell, AWS's, failing closed.
    fn sent(&self) -> Option<Spelling> {
        match self.finding {
            Finding::Enforced { spelling } => Some(spelling.unwrap_or(Spelling::Quoted)),
            Finding::Ignored | Finding::RefusesCorrect => None,
            Finding::Contradictory | Finding::Untested { .. } => Some(Spelling::Quoted),
        }
    }

    /// What the store does, in words.
    pub fn describe(&self) -> String {
        match &self.finding {
            Finding::Enforced { spelling: None } => "enforced".into(),
            Finding::Enforced { spelling: Some(s) } => {
                format!("enforced, ETag written {}", s.describe())
            }
            Finding::Ignored => "IGNORED (a wrong value passes)".into(),
            Finding::RefusesCorrect => "REFUSES THE CORRECT VALUE in every spelling".into(),
            Finding::Contradictory => "CONTRADICTORY answers".into(),
            Finding::Untested { error } => format!("untested ({error})"),
        }
    }
}

/// One check of a report, for people.
#[derive(Debug)]
pub struct CheckLine<'a> {
    /// The report's field.
    pub name: &'static str,
    /// The request tried.
    pub label: &'static str,
    pub check: &'a Check,
    /// What the proxy does about it.
    pub proxy: String,
}

impl CheckLine<'_> {
    /// As the status JSON carries it.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "check": self.name,
            "label": self.label,
            "enforced": self.check.enforced(),
            "store": self.check.describe(),
            "proxy": self.proxy,
        })
    }
}

/// What the probe found for one bucket.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ProbeReport {
    pub bucket: String,
    pub put_if_none_match: Check,
    pub put_if_match: Check,
    pub complete_if_none_match: Check,
    pub complete_if_match: Check,
    pub copy_if_none_match: Check,
    pub copy_if_match: Check,
    pub delete_if_match: Check,
    pub copy_source_if_match: Check,
    pub copy_source_if_match_old_name: Check,
}

impl ProbeReport {
    /// The backend enforces what fenced mode needs.
    pub fn safe(&self) -> bool {
        self.put_if_none_match.enforced() && self.put_if_match.enforced()
    }

    /// How the proxy writes conditions to this bucket.
    pub fn dialect(&self) -> Dialect {
        let source = [
            (SourceNames::Aws, &self.copy_source_if_match),
            (SourceNames::Old, &self.copy_source_if_match_old_name),
        ]
        .into_iter()
        .find_map(|(names, c)| c.sent().map(|s| (names, s)));
        Dialect {
            put_if_match: self.put_if_match.sent(),
            complete_if_match: self.complete_if_match.sent(),
            copy_if_match: self.copy_if_match.sent(),
            delete_if_match: self.delete_if_match.sent(),
            source,
        }
    }

    /// Each check, with what the store does and what the proxy does about
    /// it.
    pub fn checks(&self) -> [CheckLine<'_>; 9] {
        let alone = |op: &str| {
            format!(
                "not sent; {op} is fenced by the proxy alone (the key is read afresh and writes to it are serialized by this proxy; README \"Stores\")"
            )
        };
        let sent = |c: &Check, what: &str, otherwise: String| match c.sent() {
            Some(s) if c.enforced() => {
                format!("sent as {}", what.replace("<etag>", &s.write("<etag>")))
            }
            Some(s) => format!(
                "sent as AWS spells it, {}, since the probe could not tell; the key is also read afresh and writes to it are serialized by this proxy",
                what.replace("<etag>", &s.write("<etag>"))
            ),
            None => otherwise,
        };
        let required = |c: &Check, what: &str| {
            if c.enforced() {
                return sent(c, what, String::new());
            }
            let weak = match c.sent() {
                Some(s) => format!(
                    "sends {} as AWS spells it",
                    what.replace("<etag>", &s.write("<etag>"))
                ),
                None => "sends nothing the store would refuse".to_owned(),
            };
            format!(
                "REQUIRED: the proxy refuses fenced writes to this bucket (accept_weak_backend = true runs with the proxy as the only fence, and then {weak})"
            )
        };
        let source = match self.dialect().source {
            Some((names, s)) => format!(
                "a client's source conditions are checked by the proxy against the source it reads, and forwarded as {}: {}",
                names.header(SourceCondition::IfMatch),
                s.write("<etag>")
            ),
            None => "a client's source conditions are checked by the proxy alone, against the source it reads just before the copy".to_owned(),
        };
        let line = |name, label, check, proxy| CheckLine {
            name,
            label,
            check,
            proxy,
        };
        [
            line(
                "put_if_none_match",
                "PUT If-None-Match: *",
                &self.put_if_none_match,
                required(&self.put_if_none_match, "If-None-Match: * on new keys"),
            ),
            line(
                "put_if_match",
                "PUT If-Match",
                &self.put_if_match,
                required(&self.put_if_match, "If-Match: <etag> on overwrites"),
            ),
            line(
                "complete_if_none_match",
                "Complete If-None-Match: *",
                &self.complete_if_none_match,
                sent(
                    &self.complete_if_none_match,
                    "If-None-Match: *",
                    alone("a Complete onto a new key"),
                ),
            ),
            line(
                "complete_if_match",
                "Complete If-Match",
                &self.complete_if_match,
                sent(
                    &self.complete_if_match,
                    "If-Match: <etag>",
                    alone("a Complete over an existing key"),
                ),
            ),
            line(
                "copy_if_none_match",
                "Copy If-None-Match: *",
                &self.copy_if_none_match,
                sent(
                    &self.copy_if_none_match,
                    "If-None-Match: *",
                    alone("a copy onto a new key"),
                ),
            ),
            line(
                "copy_if_match",
                "Copy If-Match",
                &self.copy_if_match,
                sent(
                    &self.copy_if_match,
                    "If-Match: <etag>",
                    alone("a copy over an existing key"),
                ),
            ),
            line(
                "delete_if_match",
                "DELETE If-Match",
                &self.delete_if_match,
                sent(&self.delete_if_match, "If-Match: <etag>", alone("a DELETE")),
            ),
            line(
                "copy_source_if_match",
                "Copy x-amz-copy-source-if-match",
                &self.copy_source_if_match,
                source.clone(),
            ),
            line(
                "copy_source_if_match_old_name",
                "Copy x-amz-copy-if-match",
                &self.copy_source_if_match_old_name,
                source,
            ),
        ]
    }

    /// The requests and answers of each required check the store fails
    /// (empty when safe), for the refusal to run.
    pub fn failed_answers(&self) -> String {
        [&self.put_if_none_match, &self.put_if_match]
            .into_iter()
            .filter(|c| !c.enforced())
            .flat_map(|c| c.answers.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// One line for logs and errors.
    pub fn summary(&self) -> String {
        let checks: Vec<String> = self
            .checks()
            .iter()
            .map(|l| format!("{} {}", l.label, l.check.describe()))
            .collect();
        format!("bucket {}: {}", self.bucket, checks.join(", "))
    }
}

const WRONG_ETAG: &str = "00000000000000000000000000000000";

/// The probed bucket does not exist on the backend (a client's mistake,
/// not a backend failure: the client gets 404 NoSuchBucket).
#[derive(Debug, thiserror::Error)]
#[error("bucket {0} does not exist on the backend")]
pub struct NoSuchBucket(pub String);

/// Why a probe could not finish.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(transparent)]
    NoSuchBucket(#[from] NoSuchBucket),
    #[error("{0}")]
    Store(String),
}

/// Probes `bucket` on the store of `config`, as the proxy does at
/// start-up (`fencegate probe`).
pub async fn probe_store(
    config: &crate::config::BackendConfig,
    bucket: &str,
) -> Result<ProbeReport, ProbeError> {
    let backend = crate::backend::Backend::new(config, None, Default::default());
    probe(
        backend.unfenced(),
        bucket,
        Duration::from_secs(config.timeout_secs.max(1)),
    )
    .await
}

/// Runs the probe in scratch keys of `bucket`, cleaning up after itself;
/// each request may take `timeout`.
pub async fn probe(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    timeout: Duration,
) -> Result<ProbeReport, ProbeError> {
    let p = Prober {
        client,
        bucket,
        key: format!(".fencegate-probe/{}", scratch_suffix()),
        timeout,
    };
    // Some stores create a missing bucket on the first PUT into it (s3s-fs
    // makes the directory); asking first keeps the probe from doing that.
    if let Ok(Err(e)) = p.timed(client.head_bucket().bucket(bucket).send()).await
        && status_of(&e) == Some(404)
    {
        return Err(NoSuchBucket(bucket.to_owned()).into());
    }
    let result = p.run().await;
    p.remove(&p.key).await;
    p.remove(&p.other_key()).await;
    result
}

fn scratch_suffix() -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    #[allow(
        clippy::disallowed_methods,
        reason = "a unique scratch name, not a decision"
    )]
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{nanos}-{}", std::process::id())
}

/// How the store answered a conditional request.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    /// 2xx (a body the SDK could not read still means it was applied);
    /// the status where the SDK gave it.
    Passed(Option<u16>),
    /// 412 (or 409, a conflict).
    ConditionFailed(u16),
    /// Anything else the store answered.
    Other(String),
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::Passed(Some(s)) => write!(f, "{s} (passed)"),
            Answer::Passed(None) => write!(f, "2xx (passed)"),
            Answer::ConditionFailed(s) => write!(f, "{s} (refused)"),
            Answer::Other(s) => write!(f, "{s}"),
        }
    }
}

/// The store's answer to a request, or an error if it did not answer.
fn answer<T, E: aws_sdk_s3::error::ProvideErrorMetadata + std::error::Error + 'static>(
    r: Result<T, SdkError<E, aws_smithy_runtime_api::http::Response>>,
) -> Result<Answer, ProbeError> {
    match r {
        Ok(_) => Ok(Answer::Passed(None)),
        Err(e) => match status_of(&e) {
            Some(s @ 200..=299) => Ok(Answer::Passed(Some(s))),
            Some(s @ (409 | 412)) => Ok(Answer::ConditionFailed(s)),
            Some(s) => Ok(Answer::Other(format!(
                "{s} {}",
                e.code().unwrap_or("(no code)")
            ))),
            None => Err(ProbeError::Store(format!(
                "the store did not answer: {}",
                aws_smithy_types::error::display::DisplayErrorContext(&e)
            ))),
        },
    }
}

/// Which value a trial sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Value {
    Wrong,
    Right,
}

/// The `If-Match` conditions tried in each spelling, by request.
#[derive(Debug, Clone, Copy)]
enum Trial {
    Put,
    Complete,
    Copy,
    Delete,
    Source(SourceNames),
}

impl Trial {
    fn describe(self) -> &'static str {
        match self {
            Trial::Put => "PUT If-Match",
            Trial::Complete => "Complete If-Match",
            Trial::Copy => "CopyObject If-Match",
            Trial::Delete => "DELETE If-Match",
            Trial::Source(SourceNames::Aws) => "CopyObject x-amz-copy-source-if-match",
            Trial::Source(SourceNames::Old) => "CopyObject x-amz-copy-if-match",
        }
    }
}

/// What one spelling's two trials showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    Honours,
    Ignores,
    RefusesCorrect,
    /// Passes a wrong value and refuses the right one.
    Inverted,
    Unclear,
}

impl Form {
    fn of(wrong: &Answer, right: &Answer) -> Form {
        match (wrong, right) {
            (Answer::ConditionFailed(_), Answer::Passed(_)) => Form::Honours,
            (Answer::ConditionFailed(_), Answer::ConditionFailed(_)) => Form::RefusesCorrect,
            (Answer::Passed(_), Answer::ConditionFailed(_)) => Form::Inverted,
            // A wrong value passed: accepted, whatever the right one got.
            (Answer::Passed(_), _) => Form::Ignores,
            _ => Form::Unclear,
        }
    }

    fn refuses_wrong(self) -> bool {
        matches!(self, Form::Honours | Form::RefusesCorrect)
    }
}

/// The finding over every spelling's form (see the module doc).
fn judge(forms: &[(Spelling, Form)]) -> Finding {
    let ignoring = forms.iter().filter(|(_, f)| *f == Form::Ignores).count();
    let refusing = forms.iter().any(|(_, f)| f.refuses_wrong());
    if forms.iter().any(|(_, f)| *f == Form::Inverted) || (ignoring > 0 && refusing) {
        return Finding::Contradictory;
    }
    if ignoring == forms.len() {
        return Finding::Ignored;
    }
    if let Some((s, _)) = forms.iter().find(|(_, f)| *f == Form::Honours) {
        return Finding::Enforced { spelling: Some(*s) };
    }
    if forms.iter().any(|(_, f)| *f == Form::RefusesCorrect) {
        return Finding::RefusesCorrect;
    }
    Finding::Untested {
        error: "the store answered neither a pass nor a condition failure".into(),
    }
}

/// One probe of one bucket.
struct Prober<'a> {
    client: &'a aws_sdk_s3::Client,
    bucket: &'a str,
    key: String,
    timeout: Duration,
}

impl Prober<'_> {
    /// `f` within the per-request timeout.
    async fn timed<T>(&self, f: impl std::future::Future<Output = T>) -> Result<T, ProbeError> {
        tokio::time::timeout(self.timeout, f).await.map_err(|_| {
            ProbeError::Store(format!(
                "the store did not answer a probe request within {:?}",
                self.timeout
            ))
        })
    }

    /// Deletes a scratch key, best effort.
    async fn remove(&self, key: &str) {
        let _ = self
            .timed(
                self.client
                    .delete_object()
                    .bucket(self.bucket)
                    .key(key)
                    .send(),
            )
            .await;
    }

    /// The scratch key copies are made to.
    fn other_key(&self) -> String {
        format!("{}.copy", self.key)
    }

    async fn put(
        &self,
        key: &str,
        if_match: Option<String>,
        if_none_match: bool,
    ) -> Result<Answer, ProbeError> {
        let req = self
            .client
            .put_object()
            .bucket(self.bucket)
            .key(key)
            .body(ByteStream::from_static(b"fencegate probe"))
            .set_if_match(if_match)
            .set_if_none_match(if_none_match.then(|| "*".to_owned()));
        answer(self.timed(req.send()).await?)
    }

    /// Writes the scratch key, which must work.
    async fn reset(&self) -> Result<(), ProbeError> {
        match self.put(&self.key, None, false).await? {
            Answer::Passed(_) => Ok(()),
            other => Err(ProbeError::Store(format!(
                "cannot write the probe key s3://{}/{}: {other}",
                self.bucket, self.key
            ))),
        }
    }

    /// The current ETag of `key`.
    async fn etag(&self, key: &str) -> Result<String, ProbeError> {
        let head = self
            .timed(
                self.client
                    .head_object()
                    .bucket(self.bucket)
                    .key(key)
                    .send(),
            )
            .await?
            .map_err(|e| {
                ProbeError::Store(format!(
                    "cannot read the probe key: {}",
                    crate::backend::sdk_error(e)
                ))
            })?;
        Ok(head.e_tag().map(strip_quotes).unwrap_or_default())
    }

    async fn run(&self) -> Result<ProbeReport, ProbeError> {
        self.reset().await?;
        let put_if_none_match = {
            let existing = self.put(&self.key, None, true).await?;
            let fresh = self.put(&self.other_key(), None, true).await?;
            self.remove(&self.other_key()).await;
            let finding = match (&existing, &fresh) {
                (Answer::ConditionFailed(_), Answer::Passed(_)) => {
                    Finding::Enforced { spelling: None }
                }
                (Answer::Passed(_), Answer::Passed(_)) => Finding::Ignored,
                (Answer::ConditionFailed(_), Answer::ConditionFailed(_)) => Finding::RefusesCorrect,
                (Answer::Passed(_), Answer::ConditionFailed(_)) => Finding::Contradictory,
                _ => Finding::Untested {
                    error: "the store answered neither a pass nor a condition failure".into(),
                },
            };
            Check {
                finding,
                answers: vec![
                    format!("PUT If-None-Match: * on an existing key: {existing}"),
                    format!("PUT If-None-Match: * on a new key: {fresh}"),
                ],
            }
        };
        let put_if_match = self.by_spelling(Trial::Put).await?;

        // Multipart checks: a store whose multipart calls fail here (or
        // that has none) is reported as not enforcing them.
        self.reset().await?;
        let complete_if_none_match = self
            .optional(async {
                let a = self.complete(Some("*"), None).await?;
                Ok(single("Complete If-None-Match: * onto an existing key", a))
            })
            .await;
        let complete_if_match = self.optional(self.by_spelling(Trial::Complete)).await;

        self.reset().await?;
        let copy_if_none_match = {
            let a = self.copy(None, Some("*")).await?;
            single("CopyObject If-None-Match: * onto an existing key", a)
        };
        let copy_if_match = self.by_spelling(Trial::Copy).await?;
        let delete_if_match = self.by_spelling(Trial::Delete).await?;
        let copy_source_if_match = self.by_spelling(Trial::Source(SourceNames::Aws)).await?;
        let copy_source_if_match_old_name =
            self.by_spelling(Trial::Source(SourceNames::Old)).await?;
        Ok(ProbeReport {
            bucket: self.bucket.to_owned(),
            put_if_none_match,
            put_if_match,
            complete_if_none_match,
            complete_if_match,
            copy_if_none_match,
            copy_if_match,
            delete_if_match,
            copy_source_if_match,
            copy_source_if_match_old_name,
        })
    }

    /// A check that may fail without failing the probe.
    async fn optional(
        &self,
        check: impl std::future::Future<Output = Result<Check, ProbeError>>,
    ) -> Check {
        check.await.unwrap_or_else(|e| {
            tracing::warn!(bucket = self.bucket, error = %e, "backend probe: a multipart check failed; reported as not enforced");
            Check {
                finding: Finding::Untested {
                    error: e.to_string(),
                },
                answers: Vec::new(),
            }
        })
    }

    /// Tries `trial` in each spelling, a wrong value then the right one.
    async fn by_spelling(&self, trial: Trial) -> Result<Check, ProbeError> {
        let mut answers = Vec::new();
        let mut forms = Vec::new();
        for spelling in Spelling::ALL {
            let mut seen = Vec::new();
            for value in [Value::Wrong, Value::Right] {
                let a = self.try_once(trial, spelling, value).await?;
                answers.push(format!(
                    "{} with the {} ETag written {}: {a}",
                    trial.describe(),
                    if value == Value::Wrong {
                        "wrong"
                    } else {
                        "right"
                    },
                    spelling.describe()
                ));
                seen.push(a);
            }
            forms.push((spelling, Form::of(&seen[0], &seen[1])));
        }
        Ok(Check {
            finding: judge(&forms),
            answers,
        })
    }

    /// One trial; the scratch key exists before and after it.
    async fn try_once(
        &self,
        trial: Trial,
        spelling: Spelling,
        value: Value,
    ) -> Result<Answer, ProbeError> {
        // The right value is the ETag of the key the condition is about:
        // the destination, or for a source condition the source.
        let etag = match value {
            Value::Wrong => WRONG_ETAG.to_owned(),
            Value::Right => self.etag(&self.key).await?,
        };
        let written = spelling.write(&etag);
        match trial {
            Trial::Put => self.put(&self.key, Some(written), false).await,
            Trial::Complete => self.complete(None, Some(&written)).await,
            Trial::Copy => self.copy(Some(written), None).await,
            Trial::Delete => {
                let req = self
                    .client
                    .delete_object()
                    .bucket(self.bucket)
                    .key(&self.key)
                    .if_match(written);
                let a = answer(self.timed(req.send()).await?)?;
                if matches!(a, Answer::Passed(_)) {
                    self.reset().await?;
                }
                Ok(a)
            }
            Trial::Source(names) => {
                let a = self
                    .copy_to_other(names.header(SourceCondition::IfMatch), written)
                    .await;
                self.remove(&self.other_key()).await;
                a
            }
        }
    }

    /// Copies the scratch key onto itself with destination conditions.
    async fn copy(
        &self,
        if_match: Option<String>,
        if_none_match: Option<&str>,
    ) -> Result<Answer, ProbeError> {
        let req = self
            .client
            .copy_object()
            .bucket(self.bucket)
            .key(&self.key)
            .copy_source(format!("{}/{}", self.bucket, self.key))
            .metadata_directive(aws_sdk_s3::types::MetadataDirective::Replace)
            .set_if_match(if_match)
            .set_if_none_match(if_none_match.map(str::to_owned));
        answer(self.timed(req.send()).await?)
    }

    /// Copies the scratch key to the other one with one source condition
    /// header, sent as is.
    async fn copy_to_other(
        &self,
        header: &'static str,
        value: String,
    ) -> Result<Answer, ProbeError> {
        let req = self
            .client
            .copy_object()
            .bucket(self.bucket)
            .key(self.other_key())
            .copy_source(format!("{}/{}", self.bucket, self.key))
            .customize()
            .mutate_request(move |r| {
                // A value that is not a header value is sent without it.
                let _ = r.headers_mut().try_insert(header, value.clone());
            });
        answer(self.timed(req.send()).await?)
    }

    /// Creates a one-part upload onto the (existing) scratch key and
    /// completes it with the given condition.
    async fn complete(
        &self,
        if_none_match: Option<&str>,
        if_match: Option<&str>,
    ) -> Result<Answer, ProbeError> {
        let (bucket, key) = (self.bucket, self.key.as_str());
        let created = self
            .timed(
                self.client
                    .create_multipart_upload()
                    .bucket(bucket)
                    .key(key)
                    .send(),
            )
            .await?
            .map_err(|e| store_failed("CreateMultipartUpload", crate::backend::sdk_error(e)))?;
        let upload_id = created.upload_id().unwrap_or_default().to_owned();
        let a = self
            .complete_upload(&upload_id, if_none_match, if_match)
            .await;
        // Whatever happened, an upload that did not complete is aborted,
        // so the probe leaves no parts behind (a store bills them).
        if !matches!(a, Ok(Answer::Passed(_))) {
            let _ = self
                .timed(
                    self.client
                        .abort_multipart_upload()
                        .bucket(bucket)
                        .key(key)
                        .upload_id(&upload_id)
                        .send(),
                )
                .await;
        }
        a
    }

    /// Sends the one part of upload `upload_id` and completes it.
    async fn complete_upload(
        &self,
        upload_id: &str,
        if_none_match: Option<&str>,
        if_match: Option<&str>,
    ) -> Result<Answer, ProbeError> {
        let (bucket, key) = (self.bucket, self.key.as_str());
        let part = self
            .timed(
                self.client
                    .upload_part()
                    .bucket(bucket)
                    .key(key)
                    .upload_id(upload_id)
                    .part_number(1)
                    .body(ByteStream::from_static(b"fencegate probe part"))
                    .send(),
            )
            .await?
            .map_err(|e| store_failed("UploadPart", crate::backend::sdk_error(e)))?;
        let parts = CompletedMultipartUpload::builder()
            .parts(
                CompletedPart::builder()
                    .part_number(1)
                    .set_e_tag(part.e_tag().map(str::to_owned))
                    .build(),
            )
            .build();
        let req = self
            .client
            .complete_multipart_upload()
            .bucket(bucket)
            .key(key)
            .upload_id(upload_id)
            .multipart_upload(parts)
            .set_if_none_match(if_none_match.map(str::to_owned))
            .set_if_match(if_match.map(str::to_owned));
        answer(self.timed(req.send()).await?)
    }
}

/// A store call `what` that failed with `e`.
fn store_failed(what: &str, e: s3s::S3Error) -> ProbeError {
    ProbeError::Store(format!("{what}: {e}"))
}

/// A check of one request that the store should refuse.
fn single(what: &str, a: Answer) -> Check {
    let finding = match &a {
        Answer::ConditionFailed(_) => Finding::Enforced { spelling: None },
        Answer::Passed(_) => Finding::Ignored,
        Answer::Other(s) => Finding::Untested {
            error: format!("answered {s}"),
        },
    };
    Check {
        finding,
        answers: vec![format!("{what}: {a}")],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn findings_follow_the_forms() {
        use Form::*;
        use Spelling::*;
        let f = |forms: &[(Spelling, Form)]| judge(forms);
        assert_eq!(
            f(&[(Quoted, Honours), (Bare, Honours)]),
            Finding::Enforced {
                spelling: Some(Quoted)
            }
        );
        // Ceph RGW 16.2: quoted refused even when right, bare honoured.
        assert_eq!(
            f(&[(Quoted, RefusesCorrect), (Bare, Honours)]),
            Finding::Enforced {
                spelling: Some(Bare)
            }
        );
        assert_eq!(f(&[(Quoted, Ignores), (Bare, Ignores)]), Finding::Ignored);
        assert_eq!(
            f(&[(Quoted, Ignores), (Bare, Honours)]),
            Finding::Contradictory
        );
        assert_eq!(
            f(&[(Quoted, Inverted), (Bare, Unclear)]),
            Finding::Contradictory
        );
        assert_eq!(
            f(&[(Quoted, RefusesCorrect), (Bare, RefusesCorrect)]),
            Finding::RefusesCorrect
        );
        // A spelling the store rejects outright (400) does not stop another.
        assert_eq!(
            f(&[(Quoted, Honours), (Bare, Unclear)]),
            Finding::Enforced {
                spelling: Some(Quoted)
            }
        );
        assert!(matches!(
            f(&[(Quoted, Unclear), (Bare, Unclear)]),
            Finding::Untested { .. }
        ));
    }

    #[test]
    fn only_a_clear_verdict_stops_a_condition_being_sent() {
        let check = |finding: Finding| Check {
            finding,
            answers: Vec::new(),
        };
        let enforced = || {
            check(Finding::Enforced {
                spelling: Some(Spelling::Bare),
            })
        };
        let report = ProbeReport {
            bucket: "b".into(),
            put_if_none_match: check(Finding::Enforced { spelling: None }),
            put_if_match: enforced(),
            complete_if_none_match: check(Finding::Ignored),
            complete_if_match: check(Finding::Untested {
                error: "timed out".into(),
            }),
            copy_if_none_match: check(Finding::Ignored),
            copy_if_match: check(Finding::Contradictory),
            delete_if_match: check(Finding::RefusesCorrect),
            copy_source_if_match: check(Finding::Ignored),
            copy_source_if_match_old_name: enforced(),
        };
        let d = report.dialect();
        assert_eq!(d.put_if_match, Some(Spelling::Bare));
        // The probe could not tell: sent as AWS spells it (fail closed).
        assert_eq!(d.complete_if_match, Some(Spelling::Quoted));
        assert_eq!(d.copy_if_match, Some(Spelling::Quoted));
        // Refused even when right: sending it would fail every delete.
        assert_eq!(d.delete_if_match, None);
        assert_eq!(d.source, Some((SourceNames::Old, Spelling::Bare)));
    }
}
