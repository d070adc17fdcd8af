//! `fencegate credential-process --env-file FILE`: an AWS
//! `credential_process` command. It prints the role's current lease-bound
//! credentials from the env file `fencegate run --env-file FILE` keeps
//! fresh, with an `Expiration` of when they should be fetched again, so the
//! AWS CLI, boto3 and the AWS SDKs refresh them by themselves. When no
//! lease holds the role (the file is gone), it fails, and so does the tool.

use crate::role_files::{REFRESH_BY, read_env};
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct CredentialProcessArgs {
    /// The env file `fencegate run --env-file` writes.
    #[arg(long)]
    pub env_file: PathBuf,
}

pub fn credential_process(args: &CredentialProcessArgs) -> anyhow::Result<()> {
    let env = read_env(&args.env_file)?;
    let get = |k: &str| {
        env.get(k).cloned().ok_or_else(|| {
            anyhow::anyhow!(
                "{} has no {k}: is it the env file of fencegate run --env-file?",
                args.env_file.display()
            )
        })
    };
    let refresh_by = get(REFRESH_BY)?;
    let due = humantime::parse_rfc3339(&refresh_by)
        .map_err(|e| anyhow::anyhow!("{} has a bad {REFRESH_BY} ({e})", args.env_file.display()))?;
    #[allow(
        clippy::disallowed_methods,
        reason = "whether the holder stopped renewing is a question about the wall clock"
    )]
    let now = std::time::SystemTime::now();
    anyhow::ensure!(
        due > now,
        "the credentials in {} were due to be renewed by {refresh_by} and were not: no fencegate run holds this role's lease now",
        args.env_file.display()
    );
    let out = serde_json::json!({
        "Version": 1,
        "AccessKeyId": get("AWS_ACCESS_KEY_ID")?,
        "SecretAccessKey": get("AWS_SECRET_ACCESS_KEY")?,
        "Expiration": refresh_by,
    });
    println!("{out}");
    Ok(())
}
