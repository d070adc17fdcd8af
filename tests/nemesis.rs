//! Faults through the kernel (issue 37's first slice): etcd, a proxy and
//! the store each in a network namespace of their own, joined by a bridge
//! (`support::netns`), and partitions made of nftables drop rules, so a
//! connection across one stays half-open, as on a real network.

mod support;

use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::process::Stdio;
use std::time::{Duration, Instant};
use support::KillOnDrop;
use support::netns::Lab;

const BUCKET: &str = "backups";
const LEADER: &str = "/service/nemesis/leader";
const ETCD: usize = 0;
const PROXY: usize = 1;
const STORE: usize = 2;

/// Waits up to 30 s until something listens at `addr`.
fn wait_listening(addr: SocketAddr, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(Instant::now() < deadline, "{what} never listened at {addr}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A process in node `i`'s namespace, in a group of its own, its output
/// in `log`.
fn spawn_in(
    lab: &Lab,
    i: usize,
    program: &str,
    args: &[String],
    log: &std::path::Path,
) -> KillOnDrop {
    let log = std::fs::File::create(log).expect("log");
    KillOnDrop(
        lab.command(i, program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("{program} in a namespace: {e}")),
    )
}

/// etcd members on `nodes` of `lab`, one per node, forming one cluster:
/// their processes, and their client URLs.
fn etcd_cluster(
    lab: &Lab,
    nodes: &[usize],
    dir: &std::path::Path,
) -> (Vec<KillOnDrop>, Vec<String>) {
    let ip = |i: usize| lab.nodes[i].ip;
    let initial: Vec<String> = nodes
        .iter()
        .map(|&i| format!("e{i}=http://{}:2380", ip(i)))
        .collect();
    let members = nodes
        .iter()
        .map(|&i| {
            let url = format!("http://{}:2379", ip(i));
            spawn_in(
                lab,
                i,
                "/usr/bin/etcd",
                &[
                    format!("--name=e{i}"),
                    format!("--data-dir={}", dir.join(format!("etcd{i}")).display()),
                    format!("--listen-client-urls={url}"),
                    format!("--advertise-client-urls={url}"),
                    format!("--listen-peer-urls=http://{}:2380", ip(i)),
                    format!("--initial-advertise-peer-urls=http://{}:2380", ip(i)),
                    format!("--initial-cluster={}", initial.join(",")),
                    "--heartbeat-interval=100".into(),
                    "--election-timeout=1000".into(),
                ],
                &dir.join(format!("etcd{i}.log")),
            )
        })
        .collect();
    let urls: Vec<String> = nodes
        .iter()
        .map(|&i| format!("http://{}:2379", ip(i)))
        .collect();
    for &i in nodes {
        wait_listening(SocketAddr::new(ip(i).into(), 2379), "an etcd member");
    }
    (members, urls)
}

/// The store (`fencegate dev`'s s3s-fs, bucket `backups`) on `node`.
fn store_on(lab: &Lab, node: usize, dir: &std::path::Path) -> (KillOnDrop, String) {
    let ip = lab.nodes[node].ip;
    let store = spawn_in(
        lab,
        node,
        env!("CARGO_BIN_EXE_fencegate"),
        &[
            "dev".into(),
            format!("--data-dir={}", dir.join("store").display()),
            format!("--backend-listen={ip}:9000"),
            "--locksvc-listen=127.0.0.1:0".into(),
            "--proxy-listen=127.0.0.1:0".into(),
        ],
        &dir.join("store.log"),
    );
    wait_listening(SocketAddr::new(ip.into(), 9000), "the store");
    (store, format!("http://{ip}:9000"))
}

/// A proxy on `node` whose bucket's lock follows `LEADER` on `etcd`.
fn proxy_on(
    lab: &Lab,
    node: usize,
    etcd: &[String],
    store: &str,
    dir: &std::path::Path,
) -> (KillOnDrop, String) {
    let ip = lab.nodes[node].ip;
    let config = support::write_file(
        dir,
        "proxy.toml",
        format!(
            "listen = \"{ip}:9000\"\ndb = \"{}\"\nallow_anonymous = true\n\n\
             [[elections]]\nlock = \"{BUCKET}\"\netcd_key = \"{LEADER}\"\nendpoints = {etcd:?}\nrequest_timeout = \"2s\"\n\n\
             [backend]\nendpoint = \"{store}\"\nregion = \"us-east-1\"\npath_style = true\n\
             access_key = \"fencegate-backend\"\nsecret_key = \"fencegate-backend-secret\"\n",
            dir.join("proxy.db").display(),
        ),
    );
    let proxy = spawn_in(
        lab,
        node,
        env!("CARGO_BIN_EXE_fencegate"),
        &[
            "proxy".into(),
            "--create-db".into(),
            "--config".into(),
            config.display().to_string(),
        ],
        &dir.join("proxy.log"),
    );
    wait_listening(SocketAddr::new(ip.into(), 9000), "the proxy");
    (proxy, format!("http://{ip}:9000"))
}

/// `key = value` through etcd's JSON gateway: the revision of the write.
fn etcd_put(etcd: &str, key: &str, value: &str) -> u64 {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let put: serde_json::Value = reqwest::blocking::Client::new()
        .post(format!("{etcd}/v3/kv/put"))
        .json(&serde_json::json!({ "key": b64.encode(key), "value": b64.encode(value) }))
        .send()
        .and_then(|r| r.json())
        .expect("etcd put");
    put["header"]["revision"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("etcd put: {put}"))
}

/// An anonymous PUT through the proxy with `token`: its status (0 when no
/// answer came within 20 s) and how long it took.
fn put(proxy: &str, key: &str, token: u64) -> (u16, Duration) {
    let sent = Instant::now();
    let status = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client")
        .put(format!("{proxy}/{BUCKET}/{key}"))
        .header("fencing-token", token.to_string())
        .body(format!("written with {token}"))
        .send()
        .map_or(0, |r| r.status().as_u16());
    (status, sent.elapsed())
}

/// The proxy follows an election on an etcd it is then cut off from by a
/// real partition: every write is answered 503 within its bound (nothing
/// admitted, no hang on the half-open connection), a failover during the
/// partition is fenced once it heals, and writes are admitted again.
#[test]
fn a_proxy_partitioned_from_its_election_admits_nothing_and_recovers_after_the_heal() {
    let lab = Lab::new(3);
    let dir = support::tempdir();
    let (_etcd, etcd) = etcd_cluster(&lab, &[ETCD], dir.path());
    let etcd_url = etcd[0].clone();
    let (_store, store) = store_on(&lab, STORE, dir.path());
    let (_proxy, proxy) = proxy_on(&lab, PROXY, &etcd, &store, dir.path());
    let proxy_log = || std::fs::read_to_string(dir.path().join("proxy.log")).unwrap_or_default();

    let a = etcd_put(&etcd_url, LEADER, "node-a");
    assert_eq!(put(&proxy, "wal/1", a).0, 200, "{}", proxy_log());

    // The proxy and etcd are cut apart: packets dropped, connections left
    // open. Every write gets 503 within the read's bound, none hangs.
    lab.partition(PROXY, ETCD);
    for key in ["wal/2", "wal/3"] {
        let (status, took) = put(&proxy, key, a);
        assert_eq!(status, 503, "{key} during the partition: {}", proxy_log());
        assert!(
            took < Duration::from_secs(10),
            "{key} took {took:?} to be refused"
        );
        eprintln!("nemesis: {key} during the proxy-etcd partition: 503 after {took:?}");
    }
    // Meanwhile the election moves on (etcd's side of the partition).
    let b = etcd_put(&etcd_url, LEADER, "node-b");

    // Healed: the proxy reaches etcd again, fences the new term, and
    // admits its holder; node-a is stale.
    lab.heal();
    let healed = Instant::now();
    let recovered = loop {
        let (status, _) = put(&proxy, "wal/4", b);
        if status == 200 {
            break healed.elapsed();
        }
        assert!(
            healed.elapsed() < Duration::from_secs(60),
            "writes were not admitted within 60 s of the heal (last {status}): {}",
            proxy_log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("nemesis: proxy-etcd partition healed; writes admitted again after {recovered:?}");
    assert_eq!(put(&proxy, "wal/5", a).0, 409, "{}", proxy_log());
    for key in ["wal/2", "wal/3", "wal/5"] {
        let (status, _) = get_direct(&store, key);
        assert_eq!(status, 404, "{key} reached the store");
    }
}

/// A GET of `key` from the store itself (signed with its keys): status.
fn get_direct(store: &str, key: &str) -> (u16, ()) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let c = support::s3::sdk_client(store, ("fencegate-backend", "fencegate-backend-secret"));
        match c.get_object().bucket(BUCKET).key(key).send().await {
            Ok(_) => (200, ()),
            Err(e) => (support::s3::error_of(&e).0.unwrap_or(0), ()),
        }
    })
}

/// Which of `urls` is the etcd leader now (waits up to 30 s for one).
fn etcd_leader(urls: &[String]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for (i, url) in urls.iter().enumerate() {
            let status: Option<serde_json::Value> = reqwest::blocking::Client::new()
                .post(format!("{url}/v3/maintenance/status"))
                .body("{}")
                .timeout(Duration::from_secs(1))
                .send()
                .and_then(|r| r.json())
                .ok();
            if let Some(s) = status
                && s["leader"].is_string()
                && s["leader"] == s["header"]["member_id"]
            {
                return i;
            }
        }
        assert!(Instant::now() < deadline, "no etcd leader within 30 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Three etcd members; a follower, the first the proxy asks, is cut off
/// from the other two (a minority of one: it cannot answer a linearizable
/// read) but not from the proxy. The proxy's reads fail over to the
/// majority, which keeps its leader: every write is still admitted,
/// within the read's bound; the figures say how fast.
#[test]
fn a_minority_etcd_member_is_failed_over_and_writes_go_on() {
    let lab = Lab::new(5);
    let dir = support::tempdir();
    let (_etcd, urls) = etcd_cluster(&lab, &[0, 1, 2], dir.path());
    let leader = etcd_leader(&urls);
    let victim = (leader + 1) % 3;
    let others: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    // The victim first: the proxy's reads go to it until it fails.
    let ordered: Vec<String> = std::iter::once(victim)
        .chain(others.iter().copied())
        .map(|i| urls[i].clone())
        .collect();
    let (_store, store) = store_on(&lab, 4, dir.path());
    let (_proxy, proxy) = proxy_on(&lab, 3, &ordered, &store, dir.path());
    let proxy_log = || std::fs::read_to_string(dir.path().join("proxy.log")).unwrap_or_default();
    let a = etcd_put(&urls[leader], LEADER, "node-a");
    assert_eq!(put(&proxy, "warm", a).0, 200, "{}", proxy_log());

    for &other in &others {
        lab.partition(victim, other);
    }
    let mut slowest = Duration::ZERO;
    let started = Instant::now();
    for i in 0..20 {
        let (status, took) = put(&proxy, &format!("during/{i}"), a);
        assert_eq!(status, 200, "during/{i}: {}", proxy_log());
        assert!(took < Duration::from_secs(10), "during/{i} took {took:?}");
        slowest = slowest.max(took);
    }
    eprintln!(
        "nemesis: a follower isolated from its peers: 20/20 writes admitted in {:?}, slowest {slowest:?}",
        started.elapsed()
    );
    // A failover on the majority side is fenced as ever.
    let b = etcd_put(&urls[leader], LEADER, "node-b");
    let deadline = Instant::now() + Duration::from_secs(30);
    while put(&proxy, "after", b).0 != 200 {
        assert!(
            Instant::now() < deadline,
            "node-b never admitted: {}",
            proxy_log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(put(&proxy, "stale", a).0, 409);
    lab.heal();
}
