//! The proxy configuration the tests and the bench start from.

use std::path::Path;

/// A proxy config: its database, the key it verifies signed tokens with,
/// the probe's bucket, one store and one client key, and `extra`
/// top-level lines.
#[derive(Debug, Clone, Copy)]
pub struct ProxyToml<'a> {
    pub db: &'a Path,
    pub signing_key: &'a str,
    pub probe_bucket: &'a str,
    pub endpoint: &'a str,
    pub backend_key: (&'a str, &'a str),
    pub client_key: (&'a str, &'a str),
    pub extra: &'a str,
}

impl ProxyToml<'_> {
    /// The TOML text.
    pub fn text(&self) -> String {
        format!(
            r#"
db = "{db}"
signing_keys = ["{signing_key}"]
probe_bucket = "{probe_bucket}"
{extra}

[backend]
endpoint = "{endpoint}"
access_key = "{bk}"
secret_key = "{bs}"

[[clients]]
access_key = "{ck}"
secret_key = "{cs}"
"#,
            db = self.db.display(),
            signing_key = self.signing_key,
            probe_bucket = self.probe_bucket,
            extra = self.extra,
            endpoint = self.endpoint,
            bk = self.backend_key.0,
            bs = self.backend_key.1,
            ck = self.client_key.0,
            cs = self.client_key.1,
        )
    }
}

/// `cmd` (the `fencegate` binary) made to run a proxy on an OS-chosen port
/// of 127.0.0.1 with `config`, creating its database, logging warnings.
pub fn proxy_command(mut cmd: std::process::Command, config: &Path) -> std::process::Command {
    cmd.args([
        "proxy",
        "--create-db",
        "--listen",
        "127.0.0.1:0",
        "--config",
    ])
    .arg(config)
    .env("FENCEGATE_LOG", "warn");
    cmd
}
