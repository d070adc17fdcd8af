//! Network namespaces joined through a bridge, so that faults go through
//! the kernel: a partition is an nftables drop rule in a node's namespace,
//! and a connection across it stays half-open (no FIN, no RST), as on a
//! real network.
//!
//! A [`Lab`] makes one namespace per node and one for the bridge, each node
//! joined to the bridge by a veth pair, on a `10.77.K.0/24` of its own
//! (private to the lab's namespaces; `K` is one no other lab holds, of
//! this process or another, so that two at once never route into each
//! other). The test process
//! itself is a client on the same bridge, through one more veth pair at
//! `10.77.K.254`. Everything is
//! removed when the lab is dropped, and by a watchdog process if the test
//! binary exits without dropping it (killed, say): the processes left in
//! its namespaces are killed first, then the namespaces removed.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// One node of a lab: its namespace and address.
#[derive(Debug, Clone)]
pub struct Node {
    pub netns: String,
    pub ip: Ipv4Addr,
}

/// Namespaces, links and rules a test made; removed on drop.
#[derive(Debug)]
pub struct Lab {
    prefix: String,
    pub nodes: Vec<Node>,
    /// The test process's own address on the bridge.
    pub client: Ipv4Addr,
    watchdog: std::process::Child,
}

fn run(args: &[&str]) {
    super::succeeds(
        Command::new(args[0]).args(&args[1..]).stdin(Stdio::null()),
        &format!("{args:?}"),
    );
}

impl Lab {
    /// A lab of `n` nodes, `10.77.K.1` to `10.77.K.n`.
    pub fn new(n: usize) -> Lab {
        static LABS: AtomicU32 = AtomicU32::new(0);
        let number = LABS.fetch_add(1, Ordering::Relaxed);
        // Interface names are at most 15 bytes: keep the prefix short.
        let prefix = format!("fg{}x{number}", std::process::id() % 100_000);
        let bridge = format!("{prefix}b");
        let mut lab = Lab {
            prefix: prefix.clone(),
            nodes: Vec::new(),
            client: Ipv4Addr::UNSPECIFIED,
            watchdog: Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "while kill -0 {} 2>/dev/null; do sleep 1; done; \
                     for ns in $(ip netns list | awk '{{print $1}}' | grep '^{prefix}'); do \
                       ip netns pids $ns | xargs -r kill -9; ip netns del $ns; done; \
                     ip link del {prefix}c 2>/dev/null",
                    std::process::id()
                ))
                .stdin(Stdio::null())
                .spawn()
                .expect("watchdog"),
        };
        // The subnet: the first 10.77.K.0/24 no lab of any process holds,
        // taken (the test's own address on it) under a lock that every
        // test process takes, so that two never pick the same one.
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(std::env::temp_dir().join("fencegate-netns.lock"))
            .expect("the labs' lock file");
        let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| e)
            .expect("the labs' lock");
        let taken = String::from_utf8(
            Command::new("ip")
                .args(["-o", "-4", "addr"])
                .output()
                .expect("ip addr")
                .stdout,
        )
        .expect("utf-8");
        let subnet = (1..=250u8)
            .find(|k| !taken.contains(&format!("10.77.{k}.")))
            .expect("a free 10.77.K.0/24");
        run(&["ip", "netns", "add", &bridge]);
        run(&["ip", "-n", &bridge, "link", "add", "br0", "type", "bridge"]);
        run(&["ip", "-n", &bridge, "link", "set", "br0", "up"]);
        for i in 0..n {
            let ip = Ipv4Addr::new(10, 77, subnet, u8::try_from(i + 1).expect("a small lab"));
            let netns = format!("{prefix}n{i}");
            run(&["ip", "netns", "add", &netns]);
            run(&["ip", "-n", &netns, "link", "set", "lo", "up"]);
            lab.join(Some(&netns), &format!("{prefix}v{i}"), ip);
            lab.nodes.push(Node { netns, ip });
        }
        // The test process, on the bridge too.
        lab.client = Ipv4Addr::new(10, 77, subnet, 254);
        lab.join(None, &format!("{prefix}c"), lab.client);
        lab
    }

    /// A veth pair from `netns` (the test's own namespace if `None`) to the
    /// bridge, the near end at `ip`.
    fn join(&self, netns: Option<&str>, name: &str, ip: Ipv4Addr) {
        let bridge = format!("{}b", self.prefix);
        let peer = format!("{name}p");
        run(&[
            "ip", "link", "add", name, "type", "veth", "peer", "name", &peer,
        ]);
        run(&["ip", "link", "set", &peer, "netns", &bridge]);
        run(&[
            "ip", "-n", &bridge, "link", "set", &peer, "master", "br0", "up",
        ]);
        let addr = format!("{ip}/24");
        match netns {
            Some(ns) => {
                run(&["ip", "link", "set", name, "netns", ns]);
                run(&["ip", "-n", ns, "addr", "add", &addr, "dev", name]);
                run(&["ip", "-n", ns, "link", "set", name, "up"]);
            }
            None => {
                run(&["ip", "addr", "add", &addr, "dev", name]);
                run(&["ip", "link", "set", name, "up"]);
            }
        }
    }

    /// `program` run inside node `i`'s namespace.
    pub fn command(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.nodes[i].netns]).arg(program);
        c
    }

    /// Runs the nftables `script` in node `i`'s namespace, after making
    /// sure its `nemesis` table and chains exist.
    fn nft(&self, i: usize, script: &str) {
        use std::io::Write as _;
        let full = format!(
            "add table inet nemesis\n\
             add chain inet nemesis in {{ type filter hook input priority 0; }}\n\
             add chain inet nemesis out {{ type filter hook output priority 0; }}\n\
             {script}\n"
        );
        let mut nft = Command::new("ip")
            .args(["netns", "exec", &self.nodes[i].netns, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .spawn()
            .expect("nft runs");
        nft.stdin
            .take()
            .expect("stdin")
            .write_all(full.as_bytes())
            .expect("nft script written");
        let status = nft.wait().expect("nft ends");
        assert!(status.success(), "nft in node {i}: {full}");
    }

    /// Drops every packet node `from` sends to node `to` (one way: `to`'s
    /// packets still reach `from`).
    pub fn block(&self, from: usize, to: usize) {
        self.nft(
            from,
            &format!(
                "add rule inet nemesis out ip daddr {} drop",
                self.nodes[to].ip
            ),
        );
    }

    /// Drops every packet between node `i` and the test process, both
    /// ways (rules in the node's namespace: the test's own is left alone).
    pub fn cut_client(&self, i: usize) {
        self.nft(
            i,
            &format!(
                "add rule inet nemesis out ip daddr {c} drop\nadd rule inet nemesis in ip saddr {c} drop",
                c = self.client
            ),
        );
    }

    /// Drops every packet between nodes `a` and `b`, both ways (an
    /// nftables rule; connections stay open, silent).
    pub fn partition(&self, a: usize, b: usize) {
        self.block(a, b);
        self.block(b, a);
    }

    /// Drops `percent` % of the packets node `i` receives, at random
    /// (`numgen random`).
    pub fn lose(&self, i: usize, percent: u32) {
        self.nft(
            i,
            &format!("add rule inet nemesis in numgen random mod 100 < {percent} drop"),
        );
    }

    /// Takes node `i`'s link to the bridge down (or up again).
    pub fn set_link(&self, i: usize, up: bool) {
        run(&[
            "ip",
            "-n",
            &self.nodes[i].netns,
            "link",
            "set",
            &format!("{}v{i}", self.prefix),
            if up { "up" } else { "down" },
        ]);
    }

    /// Removes every fault: each node's nftables rules, and every link up.
    pub fn heal(&self) {
        for (i, node) in self.nodes.iter().enumerate() {
            let _ = Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &node.netns,
                    "nft",
                    "delete",
                    "table",
                    "inet",
                    "nemesis",
                ])
                .stderr(Stdio::null())
                .status();
            self.set_link(i, true);
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &format!("{}c", self.prefix)])
            .status();
        for node in &self.nodes {
            let _ = Command::new("ip")
                .args(["netns", "del", &node.netns])
                .status();
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &format!("{}b", self.prefix)])
            .status();
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
    }
}
