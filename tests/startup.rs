//! What a service says as it starts. With `FENCEGATE_LOG_FORMAT=json`
//! every line it writes, on stdout and stderr, is a JSON object, the
//! "listening on" banner too (which still reads the way scripts cut the
//! URL out of it). Under a low open-file limit, `fencegate dev` lowers its
//! connection caps to what fits and says so at WARN, naming the numbers and
//! the limit to set.

mod support;

use parking_lot::Mutex;
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Child, Command};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use support::*;

/// A running `fencegate`: its first stdout line, the rest of its output
/// collected as it comes.
struct Started {
    child: Child,
    first: String,
    stdout: Option<JoinHandle<Vec<String>>>,
    stderr: Arc<Mutex<String>>,
    stderr_done: Option<JoinHandle<()>>,
}

fn start(mut cmd: Command) -> Started {
    let mut child = spawn_piped(&mut cmd);
    let (stderr, stderr_done) = collect_stderr(&mut child);
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let Some(Ok(first)) = lines.next() else {
        let _ = child.wait();
        let _ = stderr_done.join();
        let log = stderr.lock().clone();
        panic!("exited before its first line:\n{log}");
    };
    let stdout = std::thread::spawn(move || lines.map_while(Result::ok).collect());
    Started {
        child,
        first,
        stdout: Some(stdout),
        stderr,
        stderr_done: Some(stderr_done),
    }
}

impl Started {
    /// The URL after "listening on ", cut at the first blank: how the test
    /// harness, the bench and scripts read it.
    fn url(&self) -> String {
        listening_url(&self.first)
    }

    /// The `http://host:port` after `label` in `fencegate dev`'s banner
    /// (`(locksvc http://..., backend http://...)`), read as the harness
    /// reads it.
    fn banner_url(&self, label: &str) -> String {
        labelled_url(&self.first, label)
    }

    /// Its stderr so far, once it contains `needle` (panics after 10 s).
    fn stderr_with(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.stderr.lock().clone();
            if log.contains(needle) {
                return log;
            }
            assert!(Instant::now() < deadline, "no {needle:?} in:\n{log}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM (a graceful stop); every line it wrote on stdout (the first
    /// included) and on stderr.
    fn stop(mut self) -> (Vec<String>, Vec<String>) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("pid"));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("signal");
        let deadline = Instant::now() + Duration::from_secs(40);
        while self.child.try_wait().expect("wait").is_none() {
            assert!(Instant::now() < deadline, "no exit 40 s after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut stdout = vec![self.first.clone()];
        stdout.extend(self.stdout.take().expect("once").join().expect("stdout"));
        self.stderr_done
            .take()
            .expect("once")
            .join()
            .expect("stderr");
        let stderr = self.stderr.lock().lines().map(str::to_owned).collect();
        (stdout, stderr)
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn assert_all_json(lines: &[String], which: &str) {
    for line in lines {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("a line on {which} is not JSON ({e}): {line}"));
        assert!(v.is_object(), "{which}: {line}");
    }
}

/// The banner as JSON: a log line at INFO whose `url` is the URL the
/// harness reads from its message.
fn json_banner(started: &Started) -> Value {
    let banner: Value = serde_json::from_str(&started.first)
        .unwrap_or_else(|e| panic!("the banner is not JSON ({e}): {}", started.first));
    let url = started.url();
    assert_eq!(banner["url"], url.as_str(), "{banner}");
    assert_eq!(banner["level"], "INFO", "{banner}");
    assert!(banner["timestamp"].is_string(), "{banner}");
    let message = banner["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("listening on {url} ")),
        "{banner}"
    );
    banner
}

/// Stops `svc`: its stdout held the banner only, and its log (stderr) had
/// lines, each of them JSON.
fn assert_stopped_with_json_logs(svc: Started) {
    let (stdout, stderr) = svc.stop();
    assert_eq!(stdout.len(), 1, "stdout holds the banner only: {stdout:?}");
    assert!(
        !stderr.is_empty(),
        "no log line at INFO: nothing was checked"
    );
    assert_all_json(&stderr, "stderr");
}

fn health(url: &str) -> u16 {
    reqwest::blocking::get(format!("{url}/health"))
        .expect("an answer")
        .status()
        .as_u16()
}

#[test]
fn with_json_logs_every_line_of_the_lease_service_is_json_the_banner_too() {
    let dir = tempdir();
    let svc = start(locksvc_cmd(
        dir.path(),
        &[("FENCEGATE_LOG_FORMAT", "json"), ("FENCEGATE_LOG", "info")],
    ));
    let banner = json_banner(&svc);
    assert_eq!(banner["service"], "locksvc", "{banner}");
    assert_eq!(health(&svc.url()), 200);
    assert_stopped_with_json_logs(svc);
}

#[test]
fn with_json_logs_every_line_of_fencegate_dev_is_json_the_banner_too() {
    let data = tempdir();
    let mut cmd = fencegate();
    cmd.args(["dev", "--data-dir"])
        .arg(data.path().join("dev"))
        .args(["--proxy-listen", "127.0.0.1:0"])
        .args(["--locksvc-listen", "127.0.0.1:0"])
        .args(["--backend-listen", "127.0.0.1:0"])
        .env("FENCEGATE_LOG_FORMAT", "json")
        .env("FENCEGATE_LOG", "info");
    let dev = start(cmd);
    let banner = json_banner(&dev);
    // The other addresses, in fields and where the harness reads them.
    let locksvc = dev.banner_url("locksvc");
    assert_eq!(banner["locksvc"], locksvc.as_str(), "{banner}");
    assert_eq!(banner["backend"], dev.banner_url("backend").as_str());
    assert_eq!(health(&locksvc), 200);
    assert_stopped_with_json_logs(dev);
}

#[test]
fn under_a_low_open_file_limit_dev_lowers_its_caps_and_says_so() {
    let data = tempdir();
    let mut cmd = Command::new("sh");
    without_fencegate_env(&mut cmd);
    cmd.args(["-c", "ulimit -n 256 && exec \"$0\" \"$@\""])
        .arg(env!("CARGO_BIN_EXE_fencegate"))
        .args(["dev", "--data-dir"])
        .arg(data.path().join("dev"))
        .args(["--proxy-listen", "127.0.0.1:0"])
        .args(["--locksvc-listen", "127.0.0.1:0"])
        .args(["--backend-listen", "127.0.0.1:0"])
        .env("FENCEGATE_LOG", "warn");
    let dev = start(cmd);
    let log = dev.stderr_with("open-file limit");
    // 1024 each needs 64 + 2 * 64 (refusals) + 1024 + 3 * 1024 files; 256
    // leaves 64 for connections: 16 + 3 * 16.
    fencegate_testkit::assert_mentions(
        &log,
        &[
            "WARN",
            "the open-file limit is 256",
            "max_connections = 1024 on the lease service and 1024 on the proxy",
            "about 4288 open files",
            "serving at most 16 connections on the lease service and 16 on the proxy",
            "ulimit -n 4288",
        ],
    );

    // The lowered cap is the one in force: clients over it get the cap's
    // 503, long before the 1024 configured.
    let locksvc = dev.banner_url("locksvc");
    let addr = locksvc.trim_start_matches("http://").to_owned();
    let mut held = Vec::new();
    let refusal = loop {
        let mut s = TcpStream::connect(&addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        write!(s, "GET /health HTTP/1.1\r\nhost: {addr}\r\n\r\n").expect("write");
        let (status, body) = read_response(&mut s).expect("an answer, not a hang");
        if status == 503 {
            break body;
        }
        assert_eq!(status, 200, "{body}");
        held.push(s);
        assert!(
            held.len() <= 16,
            "{} connections served at once: the lowered cap is not in force",
            held.len()
        );
    };
    fencegate_testkit::assert_mentions(&refusal, &["TooManyConnections"]);
    drop(held);
}
