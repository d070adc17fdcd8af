//! The files a role's processes read its current credentials from.
//!
//! `fencegate run` holds a role's lease for as long as the role lives (a
//! database's primary, say), and processes of the role that are not its
//! children (PostgreSQL's `archive_command`, a backup from cron, an
//! operator's command) need the lease's current credentials. The lease
//! service returns fresh credentials on every renewal; `run` writes them to
//! the files named here on the grant and on every renewal, and removes the
//! files when the lease is lost or released, so a process of the role
//! either reads credentials of the live lease or finds none:
//!
//! - `--aws-credentials-file`: AWS shared credentials (`[default]`), for
//!   `AWS_SHARED_CREDENTIALS_FILE`;
//! - `--env-file`: `KEY='value'` lines, for `. file` in a shell and for
//!   `fencegate credential-process`;
//! - `--pgbackrest-file`: pgBackRest's `repo1-s3-key` /
//!   `repo1-s3-key-secret` under `[global]`, for its `conf.d`.
//!
//! Each is written whole to a new temporary file in the same directory
//! (random name, created exclusively so nothing planted there is followed
//! or reused, mode 0600, synced), then renamed over the old one, so a
//! reader sees the old credentials or the new ones, never half of either.
//! Each file's first line names the lease's token; `remove` removes only a
//! file that still names it, so an old holder waking up late does not
//! delete the files of the holder after it.

use crate::client::LeaseInfo;
use anyhow::Context as _;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The env file's key for when the credentials in it should be fetched
/// again (RFC 3339), read by `credential-process`.
pub const REFRESH_BY: &str = "FENCEGATE_CREDENTIALS_REFRESH_BY";

/// Where a role's credentials go (the flags of `run` and `election run`),
/// and what else the env file names.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RoleFiles {
    /// Keep the current credentials in this file, AWS shared credentials
    /// format (`[default]`), for AWS_SHARED_CREDENTIALS_FILE.
    #[arg(long = "aws-credentials-file", value_name = "FILE")]
    pub aws_credentials: Option<PathBuf>,
    /// Keep the current credentials, token and lock in this file as
    /// `KEY='value'` lines, for `. FILE` in a shell and for
    /// `fencegate credential-process --env-file FILE`.
    #[arg(long = "env-file", value_name = "FILE")]
    pub env: Option<PathBuf>,
    /// Keep the current credentials in this pgBackRest config file
    /// (`repo1-s3-key`, `repo1-s3-key-secret` under `[global]`), e.g. in
    /// /etc/pgbackrest/conf.d/.
    #[arg(long = "pgbackrest-file", value_name = "FILE")]
    pub pgbackrest: Option<PathBuf>,
    /// The proxy's S3 endpoint, written to the env file as
    /// `AWS_ENDPOINT_URL` (from `--s3-endpoint`).
    #[arg(skip)]
    pub endpoint: Option<String>,
}

impl RoleFiles {
    fn paths(&self) -> impl Iterator<Item = &PathBuf> {
        [&self.aws_credentials, &self.env, &self.pgbackrest]
            .into_iter()
            .flatten()
    }

    /// Whether any file is named.
    pub fn any(&self) -> bool {
        self.paths().next().is_some()
    }

    /// Fails, before anything is held, if a file could not be written:
    /// its directory is missing or not writable.
    pub fn check(&self) -> anyhow::Result<()> {
        for path in self.paths() {
            let dir = directory(path);
            let meta = std::fs::metadata(&dir).with_context(|| {
                format!(
                    "cannot write {}: its directory {} does not exist",
                    path.display(),
                    dir.display()
                )
            })?;
            anyhow::ensure!(
                meta.is_dir(),
                "cannot write {}: {} is not a directory",
                path.display(),
                dir.display()
            );
            // Proven by doing: a probe file created and removed.
            let probe = dir.join(format!(".fencegate-check-{}", std::process::id()));
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&probe)
                .with_context(|| {
                    format!(
                        "cannot write {}: its directory {} is not writable",
                        path.display(),
                        dir.display()
                    )
                })?;
            let _ = std::fs::remove_file(&probe);
        }
        Ok(())
    }

    /// Writes every file for `lease`, which is good until about `ttl` from
    /// `now` unless renewed.
    pub fn write(&self, lease: &LeaseInfo, ttl: Duration, now: SystemTime) -> anyhow::Result<()> {
        // Each file says whose it is, so that `remove` can tell.
        let header = format!(
            "# Written by fencegate run for lock {} (token {}); rewritten on every renewal, removed when the lease ends.\n",
            lease.lock, lease.token
        );
        if let Some(p) = &self.aws_credentials {
            replace(
                p,
                &format!(
                    "{header}[default]\naws_access_key_id = {}\naws_secret_access_key = {}\n",
                    lease.s3_access_key_id, lease.s3_secret_access_key
                ),
            )?;
        }
        if let Some(p) = &self.env {
            let expires =
                SystemTime::UNIX_EPOCH + Duration::from_millis(lease.s3_credentials_expire_at_ms);
            let refresh_by = humantime::format_rfc3339_seconds((now + ttl).min(expires));
            let mut text = format!(
                "{header}AWS_ACCESS_KEY_ID={}\nAWS_SECRET_ACCESS_KEY={}\nFENCING_TOKEN={}\nFENCING_TOKEN_NUMBER={}\nFENCEGATE_LOCK={}\n{REFRESH_BY}={}\n",
                quoted(&lease.s3_access_key_id),
                quoted(&lease.s3_secret_access_key),
                quoted(&lease.fencing_token),
                lease.token,
                quoted(&lease.lock),
                refresh_by,
            );
            if let Some(e) = &self.endpoint {
                text.push_str(&format!("AWS_ENDPOINT_URL={}\n", quoted(e)));
            }
            replace(p, &text)?;
        }
        if let Some(p) = &self.pgbackrest {
            replace(
                p,
                &format!(
                    "{header}[global]\nrepo1-s3-key={}\nrepo1-s3-key-secret={}\n",
                    lease.s3_access_key_id, lease.s3_secret_access_key
                ),
            )?;
        }
        Ok(())
    }

    /// Removes every file that still holds the lease of `token`: the
    /// lease is lost or released. A file a later holder has written since
    /// is left alone.
    pub fn remove(&self, token: u64) {
        let ours = format!("(token {token})");
        for p in self.paths() {
            let first = std::fs::read_to_string(p)
                .ok()
                .and_then(|t| t.lines().next().map(str::to_owned));
            if !first.is_some_and(|l| l.contains(&ours)) {
                continue;
            }
            match std::fs::remove_file(p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(path = %p.display(), error = %e, "cannot remove a credentials file of a lease that ended")
                }
            }
        }
    }
}

/// The directory `path` is in.
fn directory(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    }
}

/// `value` in single quotes for a shell (`'` written as `'\''`).
fn quoted(value: &str) -> String {
    format!("'{}'", value.replace('\'', "'\\''"))
}

/// Writes `text` to a temporary file beside `path` (0600, synced) and
/// renames it over `path`, then syncs the directory.
fn replace(path: &Path, text: &str) -> anyhow::Result<()> {
    let dir = directory(path);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut random = [0u8; 8];
    getrandom::getrandom(&mut random)
        .map_err(|e| anyhow::anyhow!("no randomness for a temporary file name: {e}"))?;
    let suffix: String = random.iter().map(|b| format!("{b:02x}")).collect();
    let tmp = dir.join(format!(".{name}.fencegate-{suffix}"));
    let written = (|| -> std::io::Result<()> {
        // Exclusive: a name someone planted (a symlink, a file they can
        // read) fails instead of being followed or reused.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(&dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.with_context(|| format!("cannot write the credentials file {}", path.display()))
}

/// The env file as `credential-process` reads it: `KEY='value'` lines.
pub fn read_env(path: &Path) -> anyhow::Result<std::collections::HashMap<String, String>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => anyhow::bail!(
            "{} does not exist: no lease holds this role now (it was lost or released, or fencegate run has not taken it yet)",
            path.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    Ok(text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), unquoted(v.trim())))
        .collect())
}

/// The inverse of [`quoted`].
fn unquoted(v: &str) -> String {
    match v.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')) {
        Some(inner) => inner.replace("'\\''", "'"),
        None => v.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_round_trips() {
        for v in ["plain", "with space", "it's", "a'b'c", "", "$HOME `x`"] {
            assert_eq!(unquoted(&quoted(v)), v);
        }
    }
}
