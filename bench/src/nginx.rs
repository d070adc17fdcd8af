//! nginx as the cost anchor of the `small` section: a plain reverse proxy
//! in front of the same backend, so the proxy's overhead can be read next
//! to what the leanest usual forwarder costs on the same machine, in the
//! same minutes.
//!
//! The bench writes the whole configuration (nothing of the system's
//! `/etc/nginx` is read) and runs nginx in the foreground (`daemon off`)
//! with a master and `worker_processes auto` workers, so it is this
//! process's child and dies with it.

use anyhow::Context as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where Debian's `nginx-light` / `nginx` put the binary.
pub const DEFAULT_NGINX: &str = "/usr/sbin/nginx";

/// The configuration: a plain reverse proxy, nothing more. Upstream
/// keepalive (so nginx does not open a connection per request, as the
/// proxy's pooled client does not), no request buffering (the body streams
/// through, as it does through the proxy), no access log (the proxy logs
/// nothing per request either), bound to 127.0.0.1. The client's `Host`
/// header is passed on, so its SigV4 signature, made for the backend's
/// key, stays valid and the backend verifies it.
pub fn config(dir: &Path, port: u16, upstream: &str) -> String {
    let d = dir.display();
    format!(
        r#"daemon off;
master_process on;
worker_processes auto;
pid {d}/nginx.pid;
error_log {d}/error.log warn;

events {{
    worker_connections 4096;
}}

http {{
    access_log off;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy_temp;
    fastcgi_temp_path {d}/fastcgi_temp;
    uwsgi_temp_path {d}/uwsgi_temp;
    scgi_temp_path {d}/scgi_temp;
    client_max_body_size 0;
    keepalive_requests 1000000;

    upstream store {{
        server {upstream};
        keepalive 128;
        keepalive_requests 1000000;
    }}

    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://store;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_request_buffering off;
        }}
    }}
}}
"#
    )
}

/// nginx in front of `backend_endpoint` for a bench section, if `nginx` (a
/// binary) was asked for and starts; otherwise why not, also printed under
/// `section`'s name.
pub async fn anchor(
    section: &str,
    nginx: Option<&Path>,
    backend_endpoint: &str,
    tmp: &Path,
) -> anyhow::Result<Result<NginxProc, String>> {
    let started = match nginx {
        None => Err("not requested (--no-nginx)".to_owned()),
        Some(bin) if !bin.exists() => Err(format!(
            "{} not found (Debian: apt-get install nginx-light; scripts/bench.sh installs it)",
            bin.display()
        )),
        Some(bin) => {
            let (bin, endpoint, tmp) =
                (bin.to_owned(), backend_endpoint.to_owned(), tmp.to_owned());
            tokio::task::spawn_blocking(move || NginxProc::start(&bin, &endpoint, &tmp))
                .await?
                .map_err(|e| format!("nginx did not start: {e:#}"))
        }
    };
    if let Err(why) = &started {
        eprintln!("{section}: no nginx variant: {why}");
    }
    Ok(started)
}

/// A running nginx; stopped (master and workers) when dropped.
#[derive(Debug)]
pub struct NginxProc {
    child: Child,
    pub url: String,
    pub version: String,
    /// Holds the configuration, pid file, temp paths and error log.
    _dir: tempfile::TempDir,
}

impl NginxProc {
    /// Starts `nginx` in front of `backend_endpoint` (`http://host:port`).
    /// nginx needs its port in the configuration, so a free port is picked
    /// and, should another process take it first, a new one (3 tries).
    pub fn start(nginx: &Path, backend_endpoint: &str, tmp: &Path) -> anyhow::Result<NginxProc> {
        let upstream = backend_endpoint
            .strip_prefix("http://")
            .with_context(|| format!("backend endpoint {backend_endpoint} is not http://"))?
            .trim_end_matches('/');
        let version = Command::new(nginx)
            .arg("-v")
            .output()
            .with_context(|| format!("cannot run {} -v", nginx.display()))?;
        // `nginx -v` prints on stderr: "nginx version: nginx/1.22.1".
        let version = String::from_utf8_lossy(&version.stderr)
            .trim()
            .trim_start_matches("nginx version: ")
            .to_owned();
        let mut last_err = None;
        for _ in 0..3 {
            let dir = tempfile::Builder::new().prefix("nginx-").tempdir_in(tmp)?;
            let port = crate::util::free_port()?;
            let conf = dir.path().join("nginx.conf");
            std::fs::write(&conf, config(dir.path(), port, upstream))?;
            let child = Command::new(nginx)
                .arg("-p")
                .arg(dir.path())
                .arg("-c")
                .arg(&conf)
                // Before the configuration is read, nginx logs to its
                // compiled-in path (/var/log/nginx) unless told otherwise.
                .arg("-e")
                .arg(dir.path().join("error.log"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .with_context(|| format!("cannot start {}", nginx.display()))?;
            let mut proc = NginxProc {
                child,
                url: format!("http://127.0.0.1:{port}"),
                version: version.clone(),
                _dir: dir,
            };
            match proc.wait_listening(port, Duration::from_secs(10)) {
                Ok(()) => return Ok(proc),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("nginx did not start")))
    }

    /// Waits until nginx accepts connections on `port` and its workers are
    /// up, or fails with its error log.
    fn wait_listening(&mut self, port: u16, patience: Duration) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                let log =
                    std::fs::read_to_string(self._dir.path().join("error.log")).unwrap_or_default();
                anyhow::bail!("nginx exited ({status}) before listening:\n{log}");
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
                && !self.workers().is_empty()
            {
                return Ok(());
            }
            if started.elapsed() > patience {
                anyhow::bail!("nginx did not listen on 127.0.0.1:{port} within {patience:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The worker processes (children of the master), found in /proc.
    pub fn workers(&self) -> Vec<u32> {
        children_of(self.child.id())
    }

    /// Master and workers: what the nginx variant's CPU is summed over.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids = vec![self.child.id()];
        pids.extend(self.workers());
        pids
    }
}

impl Drop for NginxProc {
    fn drop(&mut self) {
        // SIGTERM makes the master end its workers and exit; SIGKILL would
        // leave the workers running (and listening) without it.
        let workers = self.workers();
        let _ = kill("-TERM", self.child.id());
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(3) {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        for w in workers {
            // Only a worker still running (its pid not yet reused).
            let comm = std::fs::read_to_string(format!("/proc/{w}/comm")).unwrap_or_default();
            if comm.starts_with("nginx") {
                let _ = kill("-KILL", w);
            }
        }
    }
}

/// Sends a signal with kill(1) (this crate has no libc binding).
fn kill(signal: &str, pid: u32) -> std::io::Result<std::process::ExitStatus> {
    Command::new("kill")
        .args([signal, &pid.to_string()])
        .stderr(Stdio::null())
        .status()
}

/// Processes whose parent is `pid` (field 4 of /proc/<p>/stat).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    // The command name is in parentheses and may hold spaces.
                    let after = s.rsplit_once(')')?.1;
                    after.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}
