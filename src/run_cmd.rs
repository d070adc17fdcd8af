//! `fencegate run --lock L -- CMD ...`: run a command under a lease.
//!
//! The lease is acquired first (waiting in line if `--wait` is given), then
//! CMD starts in its own process group with the token in its environment:
//!
//! - `FENCING_TOKEN`: the signed token, for the `Fencing-Token` header;
//! - `FENCING_TOKEN_NUMBER`: the numeric token;
//! - `FENCEGATE_LOCK`, `FENCEGATE_OWNER`: what is held, by whom;
//! - with `--s3-credentials`: `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`
//!   bound to the lease (and `AWS_ENDPOINT_URL` with `--s3-endpoint`).
//!
//! A role held for its lifetime (a database's primary) has processes that
//! are not CMD's children: with `--env-file`, `--aws-credentials-file` or
//! `--pgbackrest-file`, the lease's current credentials are written there
//! on the grant and on every renewal, and removed when the lease ends
//! (`role_files`); `fencegate credential-process` serves the env file to
//! the AWS SDKs.
//!
//! With `--fence URL` (default: `--s3-endpoint`), the new token is
//! admitted at the proxy before CMD starts (`POST /_fencegate/fence`), so
//! the old holder's writes are refused from the moment the lease is taken,
//! not from CMD's first write.
//!
//! The lease is renewed every third of its TTL, and released at the end,
//! each time proven by the signed token the acquire returned (the lease
//! service acts on nothing less). If the lease service says the
//! lease is gone, or no renewal has succeeded by the time the lease would
//! have expired (measured from when the last successful renewal was *sent*,
//! so the local estimate is never later than the service's), CMD's process
//! group gets the stop signal (SIGTERM unless `--stop-signal`), then SIGKILL after `--grace`, and `run` exits 4. A
//! stale write that still escapes in that window is what the fence stops;
//! stopping CMD is about not wasting work, not about safety.

use crate::client::{Client, LeaseTerms, LocksvcConn, default_owner};
use crate::failure::Failure;
use crate::role_files::RoleFiles;
use clap::Args;
use fencegate_core::FencingToken;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use std::os::unix::process::ExitStatusExt as _;
use std::process::ExitStatus;
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The lock to hold while CMD runs.
    #[arg(long)]
    pub lock: String,
    /// The lease's owner, TTL (renewed every third of it) and wait.
    #[command(flatten)]
    pub terms: LeaseTerms,
    /// Also export S3 credentials bound to the lease (AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY), for tools that cannot send a Fencing-Token
    /// header (restic, the aws CLI).
    #[arg(long)]
    pub s3_credentials: bool,
    /// The proxy's S3 endpoint: the fence is raised there before CMD
    /// starts (unless --no-fence or --fence names another), and with
    /// --s3-credentials or --env-file it is exported as AWS_ENDPOINT_URL
    /// (read by the aws CLI and the AWS SDKs).
    // Not `requires = "s3_credentials"`: clap counts a value from the
    // environment as given, so a FENCEGATE_S3_ENDPOINT exported for the
    // runs that use credentials made every other run a usage error (exit
    // 2). `usage_error` checks the command line alone.
    #[arg(long, env = "FENCEGATE_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
    /// Raise the lock's fence at this proxy (its S3 endpoint URL) as soon as
    /// the lease is taken, before CMD starts, so the old holder's writes are
    /// refused from then on. Default: --s3-endpoint, when given. TLS as for
    /// the lease service (--ca-file).
    #[arg(long, env = "FENCEGATE_FENCE_PROXY")]
    pub fence: Option<String>,
    /// Do not raise the fence before CMD starts (the proxy then learns of
    /// the new token from CMD's first write).
    #[arg(long)]
    pub no_fence: bool,
    #[command(flatten)]
    pub role: crate::role_files::RoleFiles,
    /// The signal that asks CMD to stop (TERM, INT or QUIT). PostgreSQL
    /// reads SIGTERM as a smart shutdown, which waits for every session to
    /// end; SIGINT is its fast shutdown.
    #[arg(long, default_value = "TERM", value_parser = stop_signal)]
    pub stop_signal: Signal,
    /// After the stop signal, how long CMD has to exit before SIGKILL. A database
    /// needs time to shut down cleanly: give it what its fast shutdown
    /// takes (PostgreSQL: `pg_ctl stop -m fast`, usually seconds; a
    /// checkpoint on a busy server may take a minute).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub grace: Duration,
    #[command(flatten)]
    pub conn: LocksvcConn,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

/// The usage rule clap cannot state: `--s3-endpoint` typed on the command
/// line must be used for something (the fence raised there, the
/// credentials exported with `--s3-credentials`, the env file), or the
/// user meant something else; `FENCEGATE_S3_ENDPOINT` in the environment
/// is a default for the runs that use it.
pub fn usage_error(run: &clap::ArgMatches) -> Option<&'static str> {
    let typed = run.value_source("s3_endpoint") == Some(clap::parser::ValueSource::CommandLine);
    let used = run.get_flag("s3_credentials")
        || !run.get_flag("no_fence")
        || run.get_one::<std::path::PathBuf>("env").is_some();
    (typed && !used).then_some(
        "--s3-endpoint is used to raise the fence, with --s3-credentials or in --env-file; with --no-fence and neither, drop --s3-endpoint",
    )
}

/// Longest the fence may take to be raised at the proxy when the lease is
/// taken (the lease is renewed meanwhile).
const FENCE_PATIENCE: Duration = Duration::from_secs(120);

/// Shortest pause between renewal retries after a failure.
const MIN_RETRY: Duration = Duration::from_millis(200);

pub async fn run(args: RunArgs) -> Result<u8, Failure> {
    let client = Client::new(args.conn.clone())?;
    // The fence raise sends the signed token, and the role files point
    // clients (and their lease-bound credentials) at the S3 endpoint:
    // with TLS settings given, neither goes anywhere in clear.
    let tls = args.conn.tls.client_tls();
    for (what, url) in [
        ("--fence", &args.fence),
        ("--s3-endpoint", &args.s3_endpoint),
    ] {
        if let Some(url) = url {
            tls.require_https(what, url)
                .map_err(|e| Failure::Other(anyhow::anyhow!("{e}")))?;
        }
    }
    let files = RoleFiles {
        endpoint: args.s3_endpoint.clone(),
        ..args.role.clone()
    };
    // A file that cannot be written stops the role before it holds
    // anything.
    files.check()?;
    let fence_at = if args.no_fence {
        None
    } else {
        args.fence.clone().or_else(|| args.s3_endpoint.clone())
    };
    let owner = args.terms.owner.clone().unwrap_or_else(default_owner);
    // A secret of this run's acquire: sent again to another replica of the
    // lease service, it gets back the lease the first may have granted.
    let mut bytes = [0u8; 16];
    getrandom::getrandom(&mut bytes)
        .map_err(|e| Failure::Other(anyhow::anyhow!("no randomness for the acquire: {e}")))?;
    let idempotency_key: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let sent = Instant::now();
    let lease = client
        .acquire(
            &args.lock,
            &owner,
            Some(&idempotency_key),
            args.terms.ttl,
            args.terms.wait,
        )
        .await?;
    // What proves we hold the lease, to renew and release it.
    let proof = match FencingToken::parse(&lease.fencing_token) {
        Ok(t @ FencingToken::Signed(_)) => t,
        _ => {
            return Err(Failure::Other(anyhow::anyhow!(
                "the lease service returned fencing_token {:?}, which is not a signed token; the lease on {} (token {}) will expire on its own",
                lease.fencing_token,
                lease.lock,
                lease.token
            )));
        }
    };
    let ttl = Duration::from_millis(lease.ttl_ms);
    // The wait is over once granted: the lease runs from the grant, which
    // happened after `sent`, so `sent + ttl` may be early but never late…
    // except that waiting in line could take up to `wait`; measure again.
    let mut deadline = if args.terms.wait.is_zero() {
        sent + ttl
    } else {
        Instant::now() + ttl - ttl.min(Duration::from_millis(50))
    };
    // And never past what the service says was left when it answered (a
    // grant answered late, after a slow commit or a long line, has less
    // than its TTL).
    if let Some(left) = lease.remaining_ms {
        let left = Duration::from_millis(left).saturating_sub(Duration::from_millis(50));
        deadline = deadline.min(Instant::now() + left);
    }
    tracing::info!(lock = %lease.lock, token = lease.token, owner = %owner, "lease acquired");
    let renew_every = ttl / 3;
    let mut next_renew = Instant::now() + renew_every;
    let mut lease = lease;
    if let Some(proxy) = &fence_at {
        // A raise may wait at the proxy for older writes to drain (after
        // its unclean restart, or for a replica that stopped answering):
        // the lease is renewed meanwhile.
        let tls = args.conn.tls.client_tls();
        let token = lease.fencing_token.clone();
        let fence =
            crate::fence_client::raise(proxy, &tls, &token, None, Instant::now() + FENCE_PATIENCE);
        tokio::pin!(fence);
        let raised = loop {
            tokio::select! {
                r = &mut fence => break r,
                _ = tokio::time::sleep_until(next_renew.min(deadline)) => {
                    let sent = Instant::now();
                    match client.renew(&lease.lock, &proof, ttl, renew_every.max(MIN_RETRY)).await {
                        Ok(renewed) => {
                            deadline = sent + ttl;
                            next_renew = sent + renew_every;
                            lease = renewed;
                        }
                        Err(e) if matches!(e, Failure::LeaseLost(_)) || Instant::now() >= deadline => {
                            break Err(anyhow::anyhow!("the lease was lost while the fence was being raised ({e})"));
                        }
                        Err(_) => next_renew = Instant::now() + MIN_RETRY,
                    }
                }
            }
        };
        match raised {
            Ok(crate::fence_client::Raised::To(max)) => {
                tracing::info!(lock = %lease.lock, token = lease.token, max, proxy, "fence raised at the proxy")
            }
            Ok(crate::fence_client::Raised::NotFencedThere) => {
                tracing::warn!(lock = %lease.lock, proxy, "no scope of the proxy is fenced by this lock: nothing to fence there")
            }
            Err(e) => {
                let _ = client.release(&lease.lock, &proof).await;
                return Err(Failure::Other(anyhow::anyhow!(
                    "cannot raise the fence of {} to token {} at {proxy}: {e:#}; the lease was released and {:?} not started (--no-fence starts it without)",
                    lease.lock,
                    lease.token,
                    args.command[0]
                )));
            }
        }
    }
    if let Err(e) = files.write(&lease, ttl, wall_clock()) {
        files.remove(lease.token);
        let _ = client.release(&lease.lock, &proof).await;
        return Err(Failure::Other(e.context(format!(
            "the lease was released and {:?} not started",
            args.command[0]
        ))));
    }

    let s3 = args.s3_credentials.then_some(args.s3_endpoint.as_deref());
    let mut child = match start_command(&args.command, &lease, s3) {
        Ok(child) => child,
        Err(e) => {
            files.remove(lease.token);
            let _ = client.release(&lease.lock, &proof).await;
            return Err(e);
        }
    };

    let mut sigterm = signal(SignalKind::terminate()).map_err(anyhow::Error::from)?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(anyhow::Error::from)?;

    let mut holding = Holding {
        ttl,
        renew_every,
        deadline,
        next_renew,
    };
    let lost = loop {
        tokio::select! {
            status = child.wait() => {
                let status = status.map_err(anyhow::Error::from)?;
                files.remove(lease.token);
                release(&client, &lease.lock, &proof).await;
                return Ok(exit_code(status));
            }
            _ = sigterm.recv() => return forward_and_finish(&client, &lease.lock, &proof, &mut child, (args.stop_signal, args.grace), &files, holding).await,
            _ = sigint.recv() => return forward_and_finish(&client, &lease.lock, &proof, &mut child, (args.stop_signal, args.grace), &files, holding).await,
            _ = tokio::time::sleep_until(holding.next_renew) => {
                if let Err(why) = holding.renew(&client, &lease.lock, &proof, &files).await {
                    break why;
                }
            }
        }
    };

    // The role's other processes find no credentials from now on.
    files.remove(lease.token);
    eprintln!(
        "fencegate: lease on {} (token {}) lost: {lost}; stopping {:?}",
        lease.lock, lease.token, args.command[0]
    );
    stop(&mut child, (args.stop_signal, args.grace)).await;
    Err(Failure::LeaseLost(format!(
        "lease on {} (token {}) was lost while {:?} ran; it was stopped",
        lease.lock, lease.token, args.command[0]
    )))
}

/// Starts `argv` in a process group of its own, with the token of
/// `lease` in its environment (`FENCING_TOKEN`, `FENCING_TOKEN_NUMBER`,
/// `FENCEGATE_LOCK`, `FENCEGATE_OWNER`) and, when `s3` is given, its bound
/// credentials as the AWS SDKs read them (and the endpoint, if any).
/// Cannot start: 127 if `argv[0]` does not exist, 126 otherwise.
pub(crate) fn start_command(
    argv: &[String],
    lease: &crate::client::LeaseInfo,
    s3: Option<Option<&str>>,
) -> Result<Child, Failure> {
    let mut command = Command::new(&argv[0]);
    command
        .args(&argv[1..])
        .env("FENCING_TOKEN", &lease.fencing_token)
        .env("FENCING_TOKEN_NUMBER", lease.token.to_string())
        .env("FENCEGATE_LOCK", &lease.lock)
        .env("FENCEGATE_OWNER", &lease.owner)
        .process_group(0);
    if let Some(endpoint) = s3 {
        command
            .env("AWS_ACCESS_KEY_ID", &lease.s3_access_key_id)
            .env("AWS_SECRET_ACCESS_KEY", &lease.s3_secret_access_key)
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("AWS_PROFILE");
        if std::env::var_os("AWS_DEFAULT_REGION").is_none()
            && std::env::var_os("AWS_REGION").is_none()
        {
            command.env("AWS_DEFAULT_REGION", "us-east-1");
        }
        if let Some(endpoint) = endpoint {
            command.env("AWS_ENDPOINT_URL", endpoint);
        }
    }
    command.spawn().map_err(|e| Failure::CannotStart {
        message: format!("cannot start {:?}: {e}", argv[0]),
        code: if e.kind() == std::io::ErrorKind::NotFound {
            127
        } else {
            126
        },
    })
}

/// A lease `run` holds, and when it must be renewed.
#[derive(Debug, Clone, Copy)]
struct Holding {
    ttl: Duration,
    renew_every: Duration,
    /// When the lease runs out unless a renewal succeeds.
    deadline: Instant,
    next_renew: Instant,
}

impl Holding {
    /// Renews the lease once and rewrites the role files with the
    /// renewal's fresh credentials; a failure that leaves time is retried
    /// soon. Err: why the lease is lost (the service says so, or no
    /// renewal succeeded before the deadline).
    async fn renew(
        &mut self,
        client: &Client,
        lock: &str,
        proof: &FencingToken,
        files: &RoleFiles,
    ) -> Result<(), String> {
        let sent = Instant::now();
        let timeout = self
            .deadline
            .saturating_duration_since(sent)
            .clamp(MIN_RETRY, self.renew_every.max(MIN_RETRY));
        match client.renew(lock, proof, self.ttl, timeout).await {
            Ok(renewed) => {
                self.deadline = sent + self.ttl;
                self.next_renew = sent + self.renew_every;
                // For the role's other processes; a failed write is retried
                // at the next renewal, while the files still hold valid ones.
                if let Err(e) = files.write(&renewed, self.ttl, wall_clock()) {
                    tracing::warn!(
                        error = format!("{e:#}"),
                        "cannot write the renewed credentials; the files keep the previous ones"
                    );
                }
                tracing::debug!(lock, token = proof.number(), "lease renewed");
                Ok(())
            }
            Err(Failure::LeaseLost(msg)) => {
                Err(format!("the lease service says the lease is gone: {msg}"))
            }
            Err(e) => {
                let now = Instant::now();
                if now >= self.deadline {
                    return Err(format!(
                        "no renewal succeeded before the lease expired (last error: {e})"
                    ));
                }
                tracing::warn!(
                    error = format!("{e:#}"),
                    "renewal failed; retrying until the lease would expire"
                );
                self.next_renew = (now + (self.ttl / 10).max(MIN_RETRY)).min(self.deadline);
                Ok(())
            }
        }
    }
}

/// We were asked to stop: pass SIGTERM on, wait for CMD, release, and exit
/// with CMD's status.
async fn forward_and_finish(
    client: &Client,
    lock: &str,
    token: &FencingToken,
    child: &mut Child,
    how: (Signal, Duration),
    files: &RoleFiles,
    mut holding: Holding,
) -> Result<u8, Failure> {
    // A clean shutdown (a database's checkpoint) may outlast the lease: it
    // is renewed until the command is gone, so nobody takes the role over
    // while the command still writes. The role files follow the lease as
    // while the command ran: refreshed at each renewal, removed the moment
    // the lease is lost or runs out.
    holding.next_renew = Instant::now();
    let mut held = true;
    let stopping = stop(child, how);
    tokio::pin!(stopping);
    let status = loop {
        tokio::select! {
            s = &mut stopping => break s,
            () = tokio::time::sleep_until(holding.next_renew), if held => {
                if let Err(why) = holding.renew(client, lock, token, files).await {
                    held = false;
                    files.remove(token.number());
                    eprintln!("fencegate: lease on {lock} (token {}) lost while the command stops ({why}); its role files are removed", token.number());
                }
            }
        }
    };
    files.remove(token.number());
    if held {
        release(client, lock, token).await;
    }
    Ok(status.map_or(1, exit_code))
}

/// The stop signal to CMD's process group, SIGKILL after `grace`.
pub(crate) async fn stop(
    child: &mut Child,
    (signal, grace): (Signal, Duration),
) -> Option<ExitStatus> {
    let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) else {
        return child.wait().await.ok();
    };
    let group = Pid::from_raw(pid);
    let _ = killpg(group, signal);
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => {
            // CMD is gone; anything it left in its group goes too.
            let _ = killpg(group, Signal::SIGKILL);
            status.ok()
        }
        Err(_) => {
            eprintln!(
                "fencegate: command did not exit within {grace:?} of SIGTERM; sending SIGKILL"
            );
            let _ = killpg(group, Signal::SIGKILL);
            child.wait().await.ok()
        }
    }
}

async fn release(client: &Client, lock: &str, token: &FencingToken) {
    if let Err(e) = client.release(lock, token).await {
        tracing::warn!(error = %e, "could not release the lease; it will expire on its own");
    }
}

/// `--stop-signal`: TERM, INT or QUIT, with or without `SIG`.
pub(crate) fn stop_signal(s: &str) -> Result<Signal, String> {
    match s.trim_start_matches("SIG").to_ascii_uppercase().as_str() {
        "TERM" => Ok(Signal::SIGTERM),
        "INT" => Ok(Signal::SIGINT),
        "QUIT" => Ok(Signal::SIGQUIT),
        other => Err(format!("{other:?} is not TERM, INT or QUIT")),
    }
}

/// The wall clock, for the expiry written to the role's env file.
pub(crate) fn wall_clock() -> std::time::SystemTime {
    #[allow(
        clippy::disallowed_methods,
        reason = "an expiry other processes compare with their own clocks"
    )]
    std::time::SystemTime::now()
}

pub(crate) fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(1),
        (None, None) => 1,
    }
}
