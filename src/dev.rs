//! `fencegate dev`: the whole system in one process, on loopback, with an
//! embedded S3 backend (s3s-fs) in a local directory. For trying fencegate
//! out and for local development; not for production.

use crate::open_files::Cap;
use crate::services::shutdown_signal;
use anyhow::Context as _;
use clap::Args;
use fencegate_locksvc::LocksvcConfig;
use fencegate_proxy::ProxyConfig;
use fencegate_proxy::config::{BackendConfig, ClientKey};
use s3s::service::S3ServiceBuilder;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use tokio::net::TcpListener;

/// The dev backend's credentials (the embedded s3s-fs).
pub const DEV_BACKEND_KEY: (&str, &str) = ("fencegate-backend", "fencegate-backend-secret");
/// The credentials S3 clients use with the dev proxy.
pub const DEV_CLIENT_KEY: (&str, &str) = ("fencegate", "fencegate-secret");
/// The bucket that exists from the start.
pub const DEV_BUCKET: &str = "backups";

#[derive(Debug, Args)]
pub struct DevArgs {
    /// TOML file with any of the options below (see config/dev.toml);
    /// flags given on the command line win.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Where the data lives (objects, lease and fence databases, signing key).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Lease service address.
    #[arg(long)]
    pub locksvc_listen: Option<SocketAddr>,
    /// Fencing S3 proxy address.
    #[arg(long)]
    pub proxy_listen: Option<SocketAddr>,
    /// Embedded S3 backend address (unfenced: for showing what fencing prevents).
    #[arg(long)]
    pub backend_listen: Option<SocketAddr>,
    /// Only validate the configuration, then exit.
    #[arg(long)]
    pub check: bool,
}

/// `fencegate dev` settings (config/dev.toml).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DevConfig {
    /// Where the data lives (objects, lease and fence databases, signing key).
    pub data_dir: PathBuf,
    /// Lease service address.
    pub locksvc_listen: SocketAddr,
    /// Fencing S3 proxy address.
    pub proxy_listen: SocketAddr,
    /// Embedded S3 backend address.
    pub backend_listen: SocketAddr,
    /// Accept plain decimal tokens (`Fencing-Token: 7`). Default false: the
    /// dev proxy accepts only the signed `fencing_token` the lease service
    /// returns (a plain number is public: refusals publish it).
    pub accept_unsigned_tokens: bool,
}

impl Default for DevConfig {
    fn default() -> Self {
        DevConfig {
            data_dir: PathBuf::from("fencegate-dev"),
            locksvc_listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            proxy_listen: SocketAddr::from(([127, 0, 0, 1], 9000)),
            backend_listen: SocketAddr::from(([127, 0, 0, 1], 9100)),
            accept_unsigned_tokens: false,
        }
    }
}

impl DevArgs {
    fn resolve(&self) -> anyhow::Result<DevConfig> {
        let text = crate::services::read_config_text(&self.config)?;
        let mut c: DevConfig = toml::from_str(&text).context("invalid dev config")?;
        if let Some(v) = &self.data_dir {
            c.data_dir = v.clone();
        }
        if let Some(v) = self.locksvc_listen {
            c.locksvc_listen = v;
        }
        if let Some(v) = self.proxy_listen {
            c.proxy_listen = v;
        }
        if let Some(v) = self.backend_listen {
            c.backend_listen = v;
        }
        Ok(c)
    }
}

impl DevConfig {
    /// Every problem with these settings, at once: addresses shared by two
    /// services, an empty data directory, and whatever the lease service
    /// and the proxy built from them would refuse.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        let services = [
            ("locksvc_listen", self.locksvc_listen),
            ("proxy_listen", self.proxy_listen),
            ("backend_listen", self.backend_listen),
        ];
        for (i, (_, a)) in services.iter().enumerate() {
            // Port 0 picks a free port for each; report an address once,
            // at its first service.
            if a.port() == 0 || services[..i].iter().any(|(_, b)| b == a) {
                continue;
            }
            let names: Vec<&str> = services
                .iter()
                .filter(|(_, b)| b == a)
                .map(|(n, _)| *n)
                .collect();
            if names.len() > 1 {
                p.push(format!(
                    "{a} is used for {} services ({}): give each service its own address",
                    if names.len() == 2 { "two" } else { "three" },
                    names.join(", ")
                ));
            }
        }
        if self.data_dir.as_os_str().is_empty() {
            p.push(
                "data_dir is empty: set the directory for the objects, the databases and the signing key".into(),
            );
        }
        // A key of the generated shape: its own value cannot be a problem.
        let key = "0".repeat(48);
        let backend = SocketAddr::from(([127, 0, 0, 1], 1));
        p.extend(
            self.locksvc_config(self.locksvc_listen, key.clone())
                .problems()
                .into_iter()
                .map(|e| format!("lease service: {e}")),
        );
        p.extend(
            self.proxy_config(self.proxy_listen, backend, key)
                .problems()
                .into_iter()
                .map(|e| format!("proxy: {e}")),
        );
        p
    }

    /// The settings, or one error listing every problem.
    pub fn validated(self) -> anyhow::Result<DevConfig> {
        fencegate_net::problems::none("dev", self.problems())?;
        Ok(self)
    }

    /// The embedded lease service's config.
    fn locksvc_config(&self, listen: SocketAddr, key: String) -> LocksvcConfig {
        LocksvcConfig {
            listen,
            db: self.data_dir.join("locksvc.db"),
            // dev keeps its state in its data directory and makes it on
            // a first start.
            create_db: true,
            signing_keys: vec![key],
            ..LocksvcConfig::default()
        }
    }

    /// The proxy's config, in front of the embedded backend at `backend`.
    fn proxy_config(&self, listen: SocketAddr, backend: SocketAddr, key: String) -> ProxyConfig {
        ProxyConfig {
            listen,
            db: self.data_dir.join("proxy.db"),
            create_db: true,
            backend: BackendConfig {
                endpoint: format!("http://{backend}"),
                access_key: DEV_BACKEND_KEY.0.into(),
                secret_key: DEV_BACKEND_KEY.1.into(),
                ..BackendConfig::default()
            },
            clients: vec![ClientKey {
                access_key: DEV_CLIENT_KEY.0.into(),
                secret_key: DEV_CLIENT_KEY.1.into(),
            }],
            allow_anonymous: true,
            signing_keys: vec![key],
            // Signed tokens only, unless the dev config trusts plain numbers.
            accept_unsigned_tokens: Some(self.accept_unsigned_tokens),
            probe_bucket: Some(DEV_BUCKET.into()),
            ..ProxyConfig::default()
        }
    }
}

/// The dev signing key: made once per data directory and kept there, so
/// tokens stay verifiable across restarts.
fn signing_key(dir: &std::path::Path) -> anyhow::Result<String> {
    let path = dir.join("signing.key");
    if let Ok(k) = std::fs::read_to_string(&path)
        && k.trim().len() >= 16
    {
        return Ok(k.trim().to_owned());
    }
    let mut bytes = [0u8; 24];
    getrandom::getrandom(&mut bytes)
        .map_err(|e| anyhow::anyhow!("no randomness for a signing key: {e}"))?;
    let key: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(&path, &key).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(key)
}

pub async fn dev(args: DevArgs) -> anyhow::Result<()> {
    let check = args.check;
    let args = args.resolve()?.validated()?;
    if check {
        println!("configuration is valid");
        return Ok(());
    }
    let data = &args.data_dir;
    let objects = data.join("s3");
    std::fs::create_dir_all(objects.join(DEV_BUCKET))
        .with_context(|| format!("cannot create {}", objects.display()))?;
    let key = signing_key(data)?;

    // 1. The embedded backend.
    let backend_listener = TcpListener::bind(args.backend_listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (is another fencegate dev running?)",
                args.backend_listen
            )
        })?;
    let backend_addr = backend_listener.local_addr()?;
    let store = fencegate_proxy::devstore::DevStore::new(&objects)?;
    let mut b = S3ServiceBuilder::new(store);
    b.set_auth(s3s::auth::SimpleAuth::from_single(
        DEV_BACKEND_KEY.0,
        DEV_BACKEND_KEY.1,
    ));
    let backend_service = b.build();

    // 2. The lease service.
    let locksvc_listener = TcpListener::bind(args.locksvc_listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.locksvc_listen))?;
    let locksvc_addr = locksvc_listener.local_addr()?;
    let mut locksvc_config = args.locksvc_config(locksvc_addr, key.clone());

    // 3. The proxy, in front of the backend.
    let proxy_listener = TcpListener::bind(args.proxy_listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.proxy_listen))?;
    let proxy_addr = proxy_listener.local_addr()?;
    let mut proxy_config = args.proxy_config(proxy_addr, backend_addr, key);
    // All three serve from one process, so from one open-file limit. A
    // proxy connection holds three descriptors here: the client's, and
    // both ends of its connection to the embedded backend. (The backend's
    // own clients, rare in dev, are not counted.)
    if let [locksvc, proxy] = crate::open_files::fit_caps(&[
        Cap {
            server: "the lease service",
            max_connections: locksvc_config.max_connections,
            files_per_connection: 1,
        },
        Cap {
            server: "the proxy",
            max_connections: proxy_config.max_connections,
            files_per_connection: 3,
        },
    ])[..]
    {
        locksvc_config.max_connections = locksvc;
        proxy_config.max_connections = proxy;
    }
    // The proxy asks the lease service who owns each new token, so the
    // status page (/_fencegate/) names the zombie and the holder. Not when
    // the dev config trusts plain numbers: with locksvc_url, the proxy
    // would check each plain number with the lease service instead.
    if !args.accept_unsigned_tokens {
        proxy_config.locksvc_url = Some(format!("http://{locksvc_addr}"));
    }

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let backend_task = tokio::spawn(fencegate_proxy::server::serve_service(
        backend_listener,
        backend_service,
        stopped(stop_rx.clone()),
    ));
    let locksvc_task = tokio::spawn(fencegate_locksvc::run(
        locksvc_listener,
        locksvc_config,
        stopped(stop_rx.clone()),
    ));
    let proxy = fencegate_proxy::Proxy::build(proxy_config).await?;
    banner(
        proxy_addr,
        locksvc_addr,
        backend_addr,
        data,
        args.accept_unsigned_tokens,
    );
    let proxy_task = tokio::spawn(proxy.serve(proxy_listener, stopped(stop_rx)));

    shutdown_signal().await;
    let _ = stop_tx.send(true);
    for task in [proxy_task, locksvc_task, backend_task] {
        task.await??;
    }
    Ok(())
}

fn banner(
    proxy: SocketAddr,
    locksvc: SocketAddr,
    backend: SocketAddr,
    data: &std::path::Path,
    plain_tokens: bool,
) {
    let (ak, sk) = DEV_CLIENT_KEY;
    let first = format!(
        "fencegate dev listening on http://{proxy} (locksvc http://{locksvc}, backend http://{backend})"
    );
    if crate::logs::json_logs() {
        // One JSON line, the addresses also in fields; the walkthrough
        // below is for a person at a terminal.
        tracing::info!(
            target: crate::logs::BANNER,
            service = "dev",
            url = %format_args!("http://{proxy}"),
            locksvc = %format_args!("http://{locksvc}"),
            backend = %format_args!("http://{backend}"),
            bucket = DEV_BUCKET,
            access_key = ak,
            data_dir = %data.display(),
            accept_unsigned_tokens = plain_tokens,
            "{first}"
        );
        return;
    }
    let tokens = if plain_tokens {
        "signed, or any plain number (accept_unsigned_tokens)"
    } else {
        "the signed fencing_token only (plain numbers are refused)"
    };
    let text = format!(
        r#"{first}

  fencing S3 proxy   http://{proxy}      bucket "{DEV_BUCKET}"; S3 keys {ak} / {sk}
                                         (anonymous requests with a Fencing-Token header are allowed)
                                         Fencing-Token: {tokens}
  lease service      http://{locksvc}
  unfenced backend   http://{backend}      keys {bk} / {bs} (what the proxy protects)
  data               {data}

Try it (in another terminal; the README walks through it):

  export FENCEGATE_LOCKSVC=http://{locksvc}
  # 1. alice takes a 5-second lease on lock "{DEV_BUCKET}" (it fences bucket "{DEV_BUCKET}")
  A=$(fencegate lease acquire {DEV_BUCKET} --owner alice --ttl 5s --format token)
  # 2. alice writes through the proxy with her token
  curl -sS -X PUT -H "Fencing-Token: $A" --data-binary 'from alice' http://{proxy}/{DEV_BUCKET}/hello.txt
  # 3. alice stalls past her lease; bob takes over and writes; alice's late write is refused (409)
  sleep 6; B=$(fencegate lease acquire {DEV_BUCKET} --owner bob --ttl 60s --format token)
  curl -sS -X PUT -H "Fencing-Token: $B" --data-binary 'from bob' http://{proxy}/{DEV_BUCKET}/hello.txt
  curl -sS -i -X PUT -H "Fencing-Token: $A" --data-binary 'late alice' http://{proxy}/{DEV_BUCKET}/hello.txt

Ctrl-C stops everything.
"#,
        bk = DEV_BACKEND_KEY.0,
        bs = DEV_BACKEND_KEY.1,
        data = data.display(),
    );
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}
