//! Shared helpers: latency statistics, machine description, child processes
//! (`fencegate`, `etcd`), /proc readings, a cheap PRNG.

use anyhow::Context as _;
use serde::Serialize;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The HMAC key the bench gives the proxy and the lease service, and signs
/// its own tokens with.
pub const SIGNING_KEY: &str = "bench-signing-key-0123456789abcdef";

/// Latency summary of a set of samples, in milliseconds.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Latency {
    pub samples: usize,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Latency {
    /// Summarizes latencies given in nanoseconds.
    pub fn of(mut ns: Vec<u64>) -> Latency {
        ns.sort_unstable();
        let ms = |v: u64| v as f64 / 1e6;
        let mean = if ns.is_empty() {
            0.0
        } else {
            ns.iter().map(|&v| v as f64).sum::<f64>() / ns.len() as f64 / 1e6
        };
        Latency {
            samples: ns.len(),
            p50_ms: ms(percentile(&ns, 50.0)),
            p90_ms: ms(percentile(&ns, 90.0)),
            p99_ms: ms(percentile(&ns, 99.0)),
            max_ms: ms(ns.last().copied().unwrap_or(0)),
            mean_ms: mean,
        }
    }
}

/// Median of a list of values (mean of the two middle ones when even).
pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// xorshift64*: cheap, deterministic pseudo-random numbers for key choice
/// and payloads (no cryptographic quality needed).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// What the run ran on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub nproc: usize,
    pub cpu_model: String,
    pub mem_total_kib: u64,
    pub kernel: String,
    pub rustc: String,
    pub tmp_dir: String,
    pub tmp_fs: String,
    /// 4 KiB write + fdatasync in the tmp dir, 200 times each way.
    pub fsync_4k: Option<FsyncProbe>,
    /// /proc/loadavg when the run started (the machine is shared).
    pub loadavg_start: String,
}

fn first_line_with(text: &str, prefix: &str) -> Option<String> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
}

/// The filesystem type of the mount holding `path` (longest mount prefix).
fn fs_type(path: &Path) -> String {
    let Ok(mounts) = std::fs::read_to_string("/proc/mounts") else {
        return "unknown".into();
    };
    let path = path.canonicalize().unwrap_or_else(|_| path.to_owned());
    let mut best: Option<(usize, String)> = None;
    for line in mounts.lines() {
        let mut f = line.split_whitespace();
        let (Some(_dev), Some(mnt), Some(ty)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if path.starts_with(mnt) && best.as_ref().is_none_or(|(len, _)| mnt.len() > *len) {
            best = Some((mnt.len(), ty.to_owned()));
        }
    }
    best.map_or_else(|| "unknown".into(), |(_, t)| t)
}

impl Machine {
    pub fn describe(tmp: &Path) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_total_kib = first_line_with(&meminfo, "MemTotal")
            .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
            .unwrap_or(0);
        let rustc = Command::new("rustc")
            .arg("--version")
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "unknown".into());
        Machine {
            nproc: std::thread::available_parallelism().map_or(0, usize::from),
            cpu_model: first_line_with(&cpuinfo, "model name").unwrap_or_else(|| "unknown".into()),
            mem_total_kib,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|_| "unknown".into()),
            rustc,
            tmp_dir: tmp.display().to_string(),
            tmp_fs: fs_type(tmp),
            fsync_4k: fsync_probe(tmp, 200).ok(),
            loadavg_start: loadavg(),
        }
    }
}

/// Memory figures of a process, from /proc/<pid>/status, in KiB.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Memory {
    pub rss_kib: u64,
    pub hwm_kib: u64,
}

pub fn memory_of(pid: u32) -> anyhow::Result<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("cannot read /proc/{pid}/status"))?;
    let kib = |field: &str| -> anyhow::Result<u64> {
        first_line_with(&status, field)
            .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
            .with_context(|| format!("no {field} in /proc/{pid}/status"))
    };
    Ok(Memory {
        rss_kib: kib("VmRSS")?,
        hwm_kib: kib("VmHWM")?,
    })
}

pub fn self_memory() -> anyhow::Result<Memory> {
    memory_of(std::process::id())
}

/// A child process killed when dropped.
#[derive(Debug)]
pub struct Proc {
    pub child: Child,
    pub url: String,
    pub log: PathBuf,
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn memory(&self) -> anyhow::Result<Memory> {
        memory_of(self.pid())
    }

    /// Starts `fencegate <args>` and waits for its "listening on" line.
    pub fn start_fencegate(mut cmd: Command, log: PathBuf) -> anyhow::Result<Proc> {
        let stderr = std::fs::File::create(&log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .with_context(|| format!("cannot start {cmd:?}"))?;
        let stdout = child.stdout.take().context("stdout is piped")?;
        let mut lines = BufReader::new(stdout).lines();
        let first = match lines.next() {
            Some(Ok(l)) => l,
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                let err = std::fs::read_to_string(&log).unwrap_or_default();
                anyhow::bail!("{cmd:?} exited before listening:\n{err}");
            }
        };
        let url = first
            .split("listening on ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .with_context(|| format!("unexpected first line {first:?}"))?
            .to_owned();
        // Keep draining stdout so the service never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Ok(Proc { child, url, log })
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP port free right now on 127.0.0.1 (the OS may reuse it, but not
/// within the few milliseconds until the child binds it).
/// The first line `bin --version` prints (empty if it prints none).
pub fn version_of(bin: &Path) -> String {
    std::process::Command::new(bin)
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .to_owned()
        })
        .unwrap_or_default()
}

pub fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Waits until an HTTP GET of `url` answers 200.
pub async fn wait_http_ok(url: &str, patience: Duration) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let started = Instant::now();
    loop {
        if let Ok(r) = http.get(url).send().await
            && r.status().is_success()
        {
            return Ok(());
        }
        if started.elapsed() > patience {
            anyhow::bail!("{url} did not answer 200 within {patience:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs `body` on `workers` tasks until `dur` has passed; each call returns
/// one operation's outcome. Returns latencies (ns) of successful operations,
/// the error count and the wall time the round took.
pub async fn timed_round<F, Fut>(workers: usize, dur: Duration, body: F) -> RoundResult
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let started = Instant::now();
    let deadline = started + dur;
    let mut tasks = Vec::with_capacity(workers);
    for w in 0..workers {
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut errors = 0u64;
            let mut first_error = None;
            let mut i = 0u64;
            while Instant::now() < deadline {
                let t = Instant::now();
                match body(w, i).await {
                    Ok(()) => lat.push(t.elapsed().as_nanos() as u64),
                    Err(e) => {
                        errors += 1;
                        if first_error.is_none() {
                            first_error = Some(format!("{e:#}"));
                        }
                    }
                }
                i += 1;
            }
            (lat, errors, first_error)
        }));
    }
    let mut r = RoundResult::default();
    for t in tasks {
        match t.await {
            Ok((lat, errors, first_error)) => {
                r.latencies_ns.extend(lat);
                r.errors += errors;
                if r.first_error.is_none() {
                    r.first_error = first_error;
                }
            }
            Err(e) => {
                r.errors += 1;
                r.first_error
                    .get_or_insert_with(|| format!("worker panicked: {e}"));
            }
        }
    }
    r.elapsed = started.elapsed();
    r
}

/// The outcome of one [`timed_round`].
#[derive(Debug, Default)]
pub struct RoundResult {
    pub latencies_ns: Vec<u64>,
    pub errors: u64,
    pub first_error: Option<String>,
    pub elapsed: Duration,
}

impl RoundResult {
    pub fn ops_per_sec(&self) -> f64 {
        self.latencies_ns.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Per-variant accumulation over interleaved rounds.
#[derive(Debug, Default)]
pub struct Series {
    pub rounds_ops_per_sec: Vec<f64>,
    pub latencies_ns: Vec<u64>,
    pub errors: u64,
    pub first_error: Option<String>,
}

impl Series {
    pub fn add(&mut self, r: RoundResult) {
        self.rounds_ops_per_sec.push(r.ops_per_sec());
        self.latencies_ns.extend(r.latencies_ns);
        self.errors += r.errors;
        if self.first_error.is_none() {
            self.first_error = r.first_error;
        }
    }

    pub fn summary(self) -> SeriesSummary {
        SeriesSummary {
            median_ops_per_sec: median(&self.rounds_ops_per_sec),
            rounds_ops_per_sec: self.rounds_ops_per_sec,
            latency: Latency::of(self.latencies_ns),
            errors: self.errors,
            first_error: self.first_error,
        }
    }
}

/// What a [`Series`] reports.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct SeriesSummary {
    pub median_ops_per_sec: f64,
    pub rounds_ops_per_sec: Vec<f64>,
    pub latency: Latency,
    pub errors: u64,
    pub first_error: Option<String>,
}

impl SeriesSummary {
    /// Its table cells: median ops/s, p50 ms, p99 ms (`NaN` for a series
    /// that did not run).
    pub fn cells(s: Option<&SeriesSummary>) -> String {
        let (ops, p50, p99) = s.map_or((f64::NAN, f64::NAN, f64::NAN), |s| {
            (s.median_ops_per_sec, s.latency.p50_ms, s.latency.p99_ms)
        });
        format!("{ops:>10.1} {p50:>8.3} {p99:>8.3}")
    }
}

/// Formats a ratio for tables.
pub fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 { f64::NAN } else { a / b }
}

/// Locates the release `fencegate` binary.
pub fn default_fencegate() -> PathBuf {
    let from_manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/fencegate");
    if from_manifest.exists() {
        return from_manifest;
    }
    PathBuf::from("target/release/fencegate")
}

/// CPU time (ns) used so far by every thread of `pid`, from
/// /proc/<pid>/task/*/schedstat (threads that already exited are not
/// counted: the services under test keep their threads).
pub fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// The 1, 5 and 15 minute load averages (other work on the machine).
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Latency of a 4 KiB write + fdatasync in `dir`: appending (the file
/// grows, so the filesystem journal commits too) and overwriting one block
/// in place (what a reused SQLite WAL page costs).
pub fn fsync_probe(dir: &Path, n: usize) -> anyhow::Result<FsyncProbe> {
    use std::io::{Seek as _, SeekFrom, Write as _};
    let path = dir.join("fsync-probe");
    let mut f = std::fs::File::create(&path)?;
    let buf = [7u8; 4096];
    let mut append = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        f.write_all(&buf)?;
        f.sync_data()?;
        append.push(t.elapsed().as_nanos() as u64);
    }
    let mut overwrite = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        f.seek(SeekFrom::Start(0))?;
        f.write_all(&buf)?;
        f.sync_data()?;
        overwrite.push(t.elapsed().as_nanos() as u64);
    }
    drop(f);
    std::fs::remove_file(&path)?;
    Ok(FsyncProbe {
        append: Latency::of(append),
        overwrite: Latency::of(overwrite),
    })
}

/// See [`fsync_probe`].
#[derive(Debug, Clone, Serialize)]
pub struct FsyncProbe {
    pub append: Latency,
    pub overwrite: Latency,
}

/// CPU time (ns) so far of the processes in a measurement: the proxy
/// process (if any), and this process split into the in-process backend's
/// threads (named `backend*`) and everything else (the client).
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu {
    pub proxy: u64,
    pub client: u64,
    pub backend: u64,
}

impl Cpu {
    /// CPU time so far of this process's client and backend threads, and of
    /// the server processes `proxy_pids` summed (the proxy; nginx: the
    /// master and its workers).
    pub fn read_pids(proxy_pids: &[u32]) -> Cpu {
        let (mut client, mut backend) = (0, 0);
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", std::process::id())) {
            for t in tasks.flatten() {
                let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
                let ns = std::fs::read_to_string(t.path().join("schedstat"))
                    .ok()
                    .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                    .unwrap_or(0);
                if comm.starts_with("backend") {
                    backend += ns;
                } else {
                    client += ns;
                }
            }
        }
        Cpu {
            proxy: proxy_pids.iter().map(|p| cpu_ns(*p)).sum(),
            client,
            backend,
        }
    }

    /// Adds what was used between `before` and `after`.
    pub fn add_delta(&mut self, before: Cpu, after: Cpu) {
        self.proxy += after.proxy.saturating_sub(before.proxy);
        self.client += after.client.saturating_sub(before.client);
        self.backend += after.backend.saturating_sub(before.backend);
    }

    /// Per operation, in microseconds (`per` = how many operations).
    pub fn per_op_us(self, per: f64) -> CpuPerOp {
        let f = |ns: u64| ns as f64 / 1e3 / per.max(1.0);
        CpuPerOp {
            proxy: f(self.proxy),
            client: f(self.client),
            backend: f(self.backend),
        }
    }
}

/// CPU per operation by process part (unit given where it is used).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CpuPerOp {
    pub proxy: f64,
    pub client: f64,
    pub backend: f64,
}

/// The wall clock in Unix milliseconds (the lease service's expiries are
/// wall clock; the raw etcd renewal writes one).
#[allow(
    clippy::disallowed_methods,
    reason = "an expiry value to write, as the lease service does"
)]
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
