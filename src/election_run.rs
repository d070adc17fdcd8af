//! `fencegate election run --key K --identity I --lock L -- CMD ...`: run
//! a command for as long as this node holds an election the cluster
//! already runs (Patroni's leader key, etcd's election and lock recipes),
//! with no second election of fencegate's own.
//!
//! 1. **Wait to hold.** The election is read (linearizably); until it names
//!    `--identity`, `run` waits on a watch of its keys and reads again at
//!    each change.
//! 2. **Fence.** With `--fence URL` (default `--s3-endpoint`), the lock's
//!    fence is raised at the proxy to the holder key's `create_revision`
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
//! Credentials need the election's signing key, which the proxy's
//! `[[elections]]` table shares. Nothing here is trusted by the proxy on
//! its own: every write is checked against the election when it arrives,
//! so stopping CMD is about not wasting work, as for `fencegate run`.

use crate::election::{ElectionArgs, not_held, token_text};
use crate::failure::Failure;
use crate::role_files::RoleFiles;
use crate::run_cmd::{exit_code, stop, stop_signal, wall_clock};
use clap::Args;
use fencegate_core::{LockName, TokenKeys};
use fencegate_etcd::Etcd;
use fencegate_etcd::election::{Seat, Shows};
use nix::sys::signal::Signal;
use std::time::Duration;
use tokio::process::Command;
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
    /// Keep the credentials in this AWS shared credentials file.
    #[arg(long)]
    pub aws_credentials_file: Option<std::path::PathBuf>,
    /// Keep the credentials, token and lock in this `KEY='value'` file.
    #[arg(long)]
    pub env_file: Option<std::path::PathBuf>,
    /// Keep the credentials in this pgBackRest config file.
    #[arg(long)]
    pub pgbackrest_file: Option<std::path::PathBuf>,
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
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
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
    let seat = a.election.seat()?;
    let keys = a.election.keys()?;
    let lock = LockName::new(&a.lock).map_err(|e| anyhow::anyhow!("--lock {:?}: {e}", a.lock))?;
    let files = RoleFiles {
        aws_credentials: a.aws_credentials_file.clone(),
        env: a.env_file.clone(),
        pgbackrest: a.pgbackrest_file.clone(),
        endpoint: a.s3_endpoint.clone(),
    };
    let wants_credentials = a.s3_credentials
        || a.aws_credentials_file.is_some()
        || a.pgbackrest_file.is_some()
        || a.env_file.is_some();
    if wants_credentials && keys.is_none() {
        return Err(anyhow::anyhow!(
            "credentials (--s3-credentials and the role files) are signed with the election's key: give --signing-key-file"
        )
        .into());
    }
    if a.credential_ttl < Duration::from_secs(3) {
        return Err(anyhow::anyhow!("--credential-ttl must be at least 3s").into());
    }
    files.check()?;
    let etcd = a.election.etcd()?;
    let identity = a.election.identity.clone();

    let (revision, mut seen) = wait_to_hold(&etcd, &seat, &identity).await;
    tracing::info!(%seat, %identity, token = revision, "this node holds the election");
    let token = token_text(keys.as_ref(), &a.lock, revision)?;

    let fence_at = if a.no_fence {
        None
    } else {
        a.fence.clone().or_else(|| a.s3_endpoint.clone())
    };
    if let Some(proxy) = &fence_at {
        let tls = fencegate_net::tls::ClientTls {
            ca_file: a.proxy_ca_file.clone(),
            ..Default::default()
        };
        let until = Instant::now() + FENCE_PATIENCE;
        match crate::fence_client::raise(proxy, &tls, &token, Some(&a.lock), until).await {
            Ok(crate::fence_client::Raised::To(max)) => {
                tracing::info!(lock = %a.lock, token = revision, max, proxy, "fence raised at the proxy");
            }
            Ok(crate::fence_client::Raised::NotFencedThere) => {
                tracing::warn!(lock = %a.lock, proxy, "no scope of the proxy is fenced by this lock: nothing to fence there");
            }
            Err(e) => {
                return Err(anyhow::anyhow!(
                    "cannot raise the fence of {} to token {revision} at {proxy}: {e:#}; {:?} not started (--no-fence starts it without)",
                    a.lock,
                    a.command[0]
                )
                .into());
            }
        }
    }

    let held = Held {
        lock,
        token,
        revision,
        identity: identity.clone(),
        keys,
        credential_ttl: a.credential_ttl,
    };
    let minted = held.mint();
    if let Err(e) = files.write(&minted, held.refresh_every(), wall_clock()) {
        files.remove(revision);
        return Err(e.context(format!("{:?} not started", a.command[0])).into());
    }
    let mut command = Command::new(&a.command[0]);
    command
        .args(&a.command[1..])
        .env("FENCING_TOKEN", &held.token)
        .env("FENCING_TOKEN_NUMBER", revision.to_string())
        .env("FENCEGATE_LOCK", &a.lock)
        .env("FENCEGATE_OWNER", &identity)
        .process_group(0);
    if a.s3_credentials {
        command
            .env("AWS_ACCESS_KEY_ID", &minted.s3_access_key_id)
            .env("AWS_SECRET_ACCESS_KEY", &minted.s3_secret_access_key)
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("AWS_PROFILE");
        if let Some(endpoint) = &a.s3_endpoint {
            command.env("AWS_ENDPOINT_URL", endpoint);
        }
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            files.remove(revision);
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            return Err(Failure::CannotStart {
                message: format!("cannot start {:?}: {e}", a.command[0]),
                code,
            });
        }
    };
    let mut sigterm = signal(SignalKind::terminate()).map_err(anyhow::Error::from)?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(anyhow::Error::from)?;
    let how = (a.stop_signal, a.grace);
    let mut last_read = Instant::now();
    let mut next_mint = Instant::now() + held.refresh_every();
    let lost = loop {
        tokio::select! {
            status = child.wait() => {
                let status = status.map_err(anyhow::Error::from)?;
                files.remove(revision);
                return Ok(exit_code(status));
            }
            _ = sigterm.recv() => break None,
            _ = sigint.recv() => break None,
            () = tokio::time::sleep_until(next_mint) => {
                next_mint = Instant::now() + held.refresh_every();
                if let Err(e) = files.write(&held.mint(), held.refresh_every(), wall_clock()) {
                    tracing::warn!(error = format!("{e:#}"), "cannot write fresh credentials; the files keep the previous ones");
                }
            }
            changed = fencegate_etcd::election::changed(&etcd, &seat, seen, WATCH_PATIENCE.min(a.lost_after)) => {
                if let Err(e) = changed {
                    tracing::warn!(error = %e, %seat, "the watch of the election ended; reading it again");
                    tokio::time::sleep(RETRY).await;
                }
                match fencegate_etcd::election::read(&etcd, &seat).await {
                    Ok((Shows::Held { holder, revision: r, .. }, now_seen)) if holder == identity && r == revision => {
                        seen = now_seen;
                        last_read = Instant::now();
                    }
                    Ok((shows, _)) => break Some(not_held(&seat, &shows, &identity).to_string()),
                    Err(e) if last_read.elapsed() >= a.lost_after => {
                        break Some(format!("no read of {seat} succeeded for {:?} (last error: {e})", a.lost_after));
                    }
                    Err(e) => tracing::warn!(error = %e, %seat, "cannot read the election; still holding until --lost-after"),
                }
            }
        }
    };
    // The role's other processes find no credentials from now on.
    files.remove(revision);
    let Some(why) = lost else {
        return Ok(stop(&mut child, how).await.map_or(1, exit_code));
    };
    eprintln!(
        "fencegate: {} (token {revision}) no longer held by {identity:?}: {why}; stopping {:?}",
        a.lock, a.command[0]
    );
    stop(&mut child, how).await;
    Err(Failure::LeaseLost(format!(
        "{seat} moved on from {identity:?} (token {revision}) while {:?} ran; it was stopped",
        a.command[0]
    )))
}

/// Reads the election until it names `identity`, waiting on a watch
/// between reads: its holder key's `create_revision`, and the revision
/// the read saw.
async fn wait_to_hold(etcd: &Etcd, seat: &Seat, identity: &str) -> (u64, i64) {
    let mut said = None;
    loop {
        match fencegate_etcd::election::read(etcd, seat).await {
            Ok((
                Shows::Held {
                    holder, revision, ..
                },
                seen,
            )) if holder == identity => {
                return (revision, seen);
            }
            Ok((shows, seen)) => {
                let now = not_held(seat, &shows, identity).to_string();
                if said.as_ref() != Some(&now) {
                    eprintln!("fencegate: waiting: {now}");
                    said = Some(now);
                }
                if let Err(e) =
                    fencegate_etcd::election::changed(etcd, seat, seen, WATCH_PATIENCE).await
                {
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
