//! A real ZooKeeper server for the tests: Debian's `zookeeper` 3.8
//! (`scripts/install-test-tools.sh` installs it), standalone, on a loopback
//! port, with a short tick so that sessions expire within seconds. It is
//! killed, and its directory removed, when dropped, and by a watchdog
//! process if the test binary exits without dropping it.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One standalone ZooKeeper server.
#[derive(Debug)]
pub struct ZooKeeperServer {
    /// `127.0.0.1:PORT`.
    pub hosts: String,
    child: Child,
    watchdog: Child,
    dir: tempfile::TempDir,
}

impl ZooKeeperServer {
    /// Starts a server (tickTime 200 ms: sessions of 0.4 s to 4 s) and
    /// waits until it answers `ruok`.
    pub fn start() -> ZooKeeperServer {
        let dir = super::tempdir();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let config = super::write_file(
            dir.path(),
            "zoo.cfg",
            format!(
                "tickTime=200\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
                 admin.enableServer=false\n4lw.commands.whitelist=ruok\n",
                dir.path().join("data").display()
            ),
        );
        let log = std::fs::File::create(dir.path().join("zookeeper.log")).expect("log");
        let child = Command::new("java")
            .args(["-Xmx256m", "-cp", "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar"])
            .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start ZooKeeper: {e} (scripts/install-test-tools.sh installs Debian's zookeeper)")
            });
        let watchdog = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "while kill -0 {} 2>/dev/null; do sleep 1; done; kill -9 {} 2>/dev/null",
                std::process::id(),
                child.id()
            ))
            .stdin(Stdio::null())
            .spawn()
            .expect("watchdog");
        let server = ZooKeeperServer {
            hosts: format!("127.0.0.1:{port}"),
            child,
            watchdog,
            dir,
        };
        server.wait_until_serving(Duration::from_secs(30));
        server
    }

    fn wait_until_serving(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if self.four_letters("ruok").as_deref() == Some("imok") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "ZooKeeper did not answer ruok within {within:?}: {}",
                std::fs::read_to_string(self.dir.path().join("zookeeper.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn four_letters(&self, word: &str) -> Option<String> {
        use std::io::{Read as _, Write as _};
        let mut s = std::net::TcpStream::connect(&self.hosts).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        s.write_all(word.as_bytes()).ok()?;
        let mut answer = String::new();
        s.read_to_string(&mut answer).ok()?;
        Some(answer)
    }

    /// Kills the server (SIGKILL): its clients' reads fail from now on.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ZooKeeperServer {
    fn drop(&mut self) {
        self.kill();
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
    }
}
