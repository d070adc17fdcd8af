//! `fencegate election run --key K --identity I --lock L -- CMD ...`: run
//! a command for as long as this node holds an election the cluster
//! already runs (Patroni's leader key, etcd's election and lock recipes,
//! ZooKeeper locks),
//! with no second election of fencegate's own.
//!
//! 1. **Wait to hold.** The election is read (linearizably); until it names
//!    `--identity`, `run` waits on a watch of its keys and reads again at
//!    each change.
//! 2. **Fence.** With `--fence URL` (default `--s3-endpoint`), the lock's
//!    fence is raised at the proxy to the revision its term began at
//!    before CMD starts, so the old holder's writes are refused from then
//!    on. The proxy checks that revision with the election itself.
//! 3. **Run.** CMD gets `FENCING_TOKEN` (signed with `--signing-key-file`
//!    if given, else the plain number), `FENCING_TOKEN_NUMBER`,
//!    `FENCEGATE_LOCK` and, with `--s3-credentials`, S3 credentials bound
//!    to the token. The role files (`--env-file`, `--aws-credentials-file`,
//!    `--pgbackrest-file`, as for `fencegate run`) hold the same, minted
//!    again every third of `--credential-ttl`.
//! 4. **Stop when the election moves on.** A watch of the election's keys
//!    wakes `run` on every change; it reads the election again, and if the
//!    holder key is gone or another's, the role files are removed first and
//!    CMD gets `--stop-signal`, then SIGKILL after `--grace`; `run` exits
//!    4. With no successful read for `--lost-after`, the same: a node that
//!    cannot see its election does not act as its holder.
//!
//! **Without a command** `run` is a sidecar beside the node's own
//! election client (Patroni): it does 1, 2 and the role files of 3 for
//! every term this node holds, removing the files between terms, until
//! it is stopped (exit 0).
//!
//! Credentials need the election's signing key, which the proxy's
//! `[[elections]]` table shares. Nothing here is trusted by the proxy on
//! its own: every write is checked against the election when it arrives,
//! so stopping CMD is about not wasting work, as for `fencegate run`.

use crate::election::{ElectionArgs, not_held, token_text};
use crate::failure::Failure;
use crate::role_files::RoleFiles;
use crate::run_cmd::{exit_code, start_command, stop, stop_signal, wall_clock};
use clap::Args;
use fencegate_core::{LockName, TokenKeys};
use fencegate_elections::Election;
use nix::sys::signal::Signal;
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

#[derive(Debug, Args)]
pub struct ElectionRunArgs {
    #[command(flatten)]
    pub election: ElectionArgs,
    /// The lock that follows this election in the proxy's `[[elections]]`.
    #[arg(long)]
    pub lock: String,
    /// Raise the lock's fence at this proxy (its S3 endpoint URL) once
    /// this node holds the election, before CMD starts. Default:
    /// --s3-endpoint, when given.
    #[arg(long)]
    pub fence: Option<String>,
    /// Do not raise the fence before CMD starts.
    #[arg(long)]
    pub no_fence: bool,
    /// The proxy's S3 endpoint, exported as AWS_ENDPOINT_URL with
    /// --s3-credentials and written to --env-file.
    #[arg(long)]
    pub s3_endpoint: Option<String>,
    /// PEM CA certificate(s) of an https:// proxy.
    #[arg(long)]
    pub proxy_ca_file: Option<std::path::PathBuf>,
    /// Export S3 credentials bound to the token (needs --signing-key-file).
    #[arg(long)]
    pub s3_credentials: bool,
    /// How long minted credentials work; they are minted again every
    /// third of it while this node holds the election.
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    pub credential_ttl: Duration,
    #[command(flatten)]
    pub role: crate::role_files::RoleFiles,
    /// With no successful read of the election for this long, act as if
    /// it were lost (Patroni's default TTL is 30 s).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub lost_after: Duration,
    /// The signal that asks CMD to stop (TERM, INT or QUIT).
    #[arg(long, default_value = "TERM", value_parser = stop_signal)]
    pub stop_signal: Signal,
    /// After the stop signal, how long CMD has to exit before SIGKILL.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub grace: Duration,
    /// The command and its arguments. Without one, `run` is a sidecar:
    /// it keeps the role files (and raises the fence) for every term this
    /// node holds, until it is stopped.
    #[arg(last = true, num_args = 0..)]
    pub command: Vec<String>,
}

/// Longest a quiet watch is trusted before the election is read again (a
/// half-open connection says nothing).
const WATCH_PATIENCE: Duration = Duration::from_secs(5);

/// Pause after a failed read or watch.
const RETRY: Duration = Duration::from_millis(500);

/// Longest the fence may take to be raised.
const FENCE_PATIENCE: Duration = Duration::from_secs(120);

pub async fn run(a: ElectionRunArgs) -> Result<u8, Failure> {
    let keys = a.election.keys()?;
    let lock = LockName::new(&a.lock).map_err(|e| anyhow::anyhow!("--lock {:?}: {e}", a.lock))?;
    let files = RoleFiles {
        endpoint: a.s3_endpoint.clone(),
        ..a.role.clone()
    };
    let wants_credentials = a.s3_credentials || files.any();
    if wants_credentials && keys.is_none() {
        return Err(anyhow::anyhow!(
            "credentials (--s3-credentials and the role files) are signed with the election's key: give --signing-key-file"
        )
        .into());
    }
    if a.command.is_empty() && a.s3_credentials {
        return Err(anyhow::anyhow!(
            "--s3-credentials exports credentials to a command: name one after --, or keep them in role files"
        )
        .into());
    }
    if a.credential_ttl < Duration::from_secs(3) {
        return Err(anyhow::anyhow!("--credential-ttl must be at least 3s").into());
    }
    files.check()?;
    let mut node = Node {
        election: a.election.election()?,
        lock,
        keys,
        files,
        sigterm: signal(SignalKind::terminate()).map_err(anyhow::Error::from)?,
        sigint: signal(SignalKind::interrupt()).map_err(anyhow::Error::from)?,
    };
    if !a.command.is_empty() {
        return match node.term(&a, true).await? {
            Ended::Exited(code) => Ok(code),
            Ended::Lost(why) => Err(Failure::LeaseLost(why)),
        };
    }
    // No command: a sidecar that keeps the role files for each term this
    // node holds, until it is stopped.
    loop {
        match node.term(&a, false).await? {
            Ended::Exited(code) => return Ok(code),
            Ended::Lost(why) => eprintln!("fencegate: {why}; waiting to hold again"),
        }
    }
}

/// How one term ended.
enum Ended {
    /// The command exited (or `run` was stopped): this exit status.
    Exited(u8),
    /// The election moved on.
    Lost(String),
}

/// This node in the election, and what it keeps while it holds.
struct Node {
    election: Election,
    lock: LockName,
    keys: Option<TokenKeys>,
    files: RoleFiles,
    sigterm: tokio::signal::unix::Signal,
    sigint: tokio::signal::unix::Signal,
}

impl Node {
    /// One term: waits until this node holds, raises the fence, keeps the
    /// role files (and runs the command, when `with_command`) until the
    /// election moves on or `run` is stopped.
    async fn term(&mut self, a: &ElectionRunArgs, with_command: bool) -> Result<Ended, Failure> {
        let identity = a.election.identity.as_str();
        let (revision, mut seen) = tokio::select! {
            held = wait_to_hold(&self.election, identity) => held,
            _ = self.sigterm.recv() => return Ok(Ended::Exited(0)),
            _ = self.sigint.recv() => return Ok(Ended::Exited(0)),
        };
        tracing::info!(seat = %self.election.seat(), identity, token = revision, "this node holds the election");
        let token = token_text(self.keys.as_ref(), &a.lock, revision)?;
        let what = a.command.first().map_or("the role files", String::as_str);
        self.fence(a, &token, revision).await.map_err(|e| {
            anyhow::anyhow!("{e:#}; {what:?} not started (--no-fence starts it without)")
        })?;
        let held = Held {
            lock: self.lock.clone(),
            token,
            revision,
            identity: identity.to_owned(),
            keys: self.keys.clone(),
            credential_ttl: a.credential_ttl,
        };
        let minted = held.mint();
        if let Err(e) = self
            .files
            .write(&minted, held.refresh_every(), wall_clock())
        {
            self.files.remove(revision);
            return Err(e.context(format!("{what:?} not started")).into());
        }
        let mut child = if with_command {
            let s3 = a.s3_credentials.then_some(a.s3_endpoint.as_deref());
            match start_command(&a.command, &minted, s3) {
                Ok(child) => Some(child),
                Err(e) => {
                    self.files.remove(revision);
                    return Err(e);
                }
            }
        } else {
            None
        };
        let how = (a.stop_signal, a.grace);
        let mut last_read = Instant::now();
        let mut next_mint = Instant::now() + held.refresh_every();
        let lost = loop {
            tokio::select! {
                status = async { child.as_mut()?.wait().await.ok() }, if child.is_some() => {
                    self.files.remove(revision);
                    return Ok(Ended::Exited(status.map_or(1, exit_code)));
                }
                _ = self.sigterm.recv() => break None,
                _ = self.sigint.recv() => break None,
                () = tokio::time::sleep_until(next_mint) => {
                    next_mint = Instant::now() + held.refresh_every();
                    if let Err(e) = self.files.write(&held.mint(), held.refresh_every(), wall_clock()) {
                        tracing::warn!(error = format!("{e:#}"), "cannot write fresh credentials; the files keep the previous ones");
                    }
                }
                changed = self.election.changed(seen, WATCH_PATIENCE.min(a.lost_after)) => {
                    if let Err(e) = changed {
                        tracing::warn!(error = %e, seat = %self.election.seat(), "the watch of the election ended; reading it again");
                        tokio::time::sleep(RETRY).await;
                    }
                    match self.election.read().await {
                        Ok((shows, now_seen)) if shows.held_by(identity) == Some(revision) => {
                            seen = now_seen;
                            last_read = Instant::now();
                        }
                        Ok((shows, _)) => break Some(not_held(self.election.seat(), &shows, identity).to_string()),
                        Err(e) if last_read.elapsed() >= a.lost_after => {
                            break Some(format!("no read of {} succeeded for {:?} (last error: {e})", self.election.seat(), a.lost_after));
                        }
                        Err(e) => tracing::warn!(error = %e, seat = %self.election.seat(), "cannot read the election; still holding until --lost-after"),
                    }
                }
            }
        };
        // The role's other processes find no credentials from now on.
        self.files.remove(revision);
        let status = match child.as_mut() {
            Some(child) => {
                if let Some(why) = &lost {
                    eprintln!(
                        "fencegate: {} (token {revision}) no longer held by {identity:?}: {why}; stopping {what:?}",
                        a.lock
                    );
                }
                stop(child, how).await.map_or(1, exit_code)
            }
            None => 0,
        };
        Ok(match lost {
            None => Ended::Exited(status),
            Some(why) => Ended::Lost(format!(
                "{} moved on from {identity:?} (token {revision}): {why}",
                self.election.seat()
            )),
        })
    }

    /// Raises the lock's fence at the proxy to this term's token, unless
    /// told not to.
    async fn fence(&self, a: &ElectionRunArgs, token: &str, revision: u64) -> anyhow::Result<()> {
        let fence_at = if a.no_fence {
            None
        } else {
            a.fence.clone().or_else(|| a.s3_endpoint.clone())
        };
        let Some(proxy) = fence_at else {
            return Ok(());
        };
        let tls = fencegate_net::tls::ClientTls {
            ca_file: a.proxy_ca_file.clone(),
            ..Default::default()
        };
        let until = Instant::now() + FENCE_PATIENCE;
        match crate::fence_client::raise(&proxy, &tls, token, Some(&a.lock), until).await {
            Ok(crate::fence_client::Raised::To(max)) => {
                tracing::info!(lock = %a.lock, token = revision, max, proxy, "fence raised at the proxy");
                Ok(())
            }
            Ok(crate::fence_client::Raised::NotFencedThere) => {
                tracing::warn!(lock = %a.lock, proxy, "no scope of the proxy is fenced by this lock: nothing to fence there");
                Ok(())
            }
            Err(e) => Err(e.context(format!(
                "cannot raise the fence of {} to token {revision} at {proxy}",
                a.lock
            ))),
        }
    }
}

/// Reads the election until it names `identity`, waiting on a watch
/// between reads: the revision its term began at, and the revision
/// the read saw.
async fn wait_to_hold(election: &Election, identity: &str) -> (u64, i64) {
    let seat = election.seat();
    let mut said = None;
    loop {
        match election.read().await {
            Ok((shows, seen)) => {
                if let Some(revision) = shows.held_by(identity) {
                    return (revision, seen);
                }
                let now = not_held(seat, &shows, identity).to_string();
                if said.as_ref() != Some(&now) {
                    eprintln!("fencegate: waiting: {now}");
                    said = Some(now);
                }
                if let Err(e) = election.changed(seen, WATCH_PATIENCE).await {
                    tracing::warn!(error = %e, %seat, "the watch of the election ended");
                    tokio::time::sleep(RETRY).await;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, %seat, "cannot read the election; trying again");
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

/// What this node holds, and how it mints the role's credentials.
struct Held {
    lock: LockName,
    token: String,
    revision: u64,
    identity: String,
    keys: Option<TokenKeys>,
    credential_ttl: Duration,
}

impl Held {
    fn refresh_every(&self) -> Duration {
        self.credential_ttl / 3
    }

    /// The role files' content now: fresh credentials when there is a key.
    fn mint(&self) -> crate::client::LeaseInfo {
        let now = wall_clock()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let expires = now + self.credential_ttl;
        let credentials = self
            .keys
            .as_ref()
            .map(|k| k.credentials(&self.lock, self.revision, expires.as_secs()));
        let (access, secret) = credentials
            .map(|c| (c.access_key, c.secret_key))
            .unwrap_or_default();
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        crate::client::LeaseInfo {
            lock: self.lock.to_string(),
            owner: self.identity.clone(),
            token: self.revision,
            fencing_token: self.token.clone(),
            ttl_ms: ms(self.credential_ttl),
            expires_at_ms: ms(expires),
            remaining_ms: None,
            s3_access_key_id: access,
            s3_secret_access_key: secret,
            s3_credentials_expire_at_ms: ms(expires),
        }
    }
}
