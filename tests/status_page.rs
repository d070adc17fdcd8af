//! The fence at work, as an operator sees it at 3 a.m.: fence events (JSON
//! at `/_fencegate/events`, one structured log line each), the status
//! pages of the proxy and of the lease service read and photographed in a
//! real browser (Debian's chromium, headless, installed by the test
//! script), a burst of 100k refusals that leaves memory and the event list
//! bounded, and events that carry numbers and names, never secrets.
//!
//! Real processes throughout: the lease service, the proxy, s3s-fs.

mod support;

use aws_sdk_s3::primitives::ByteStream;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use support::harness::{BUCKET, Harness};
use support::s3::{BACKEND_KEY, BackendKind, CLIENT_KEY, error_of, proxy_cmd, signed};
use support::{SIGNING_KEY, Service, succeeds, write_file};

/// The lease service's API key in these tests.
const API_KEY: &str = "ops-api-key-0123456789";
/// The proxy's status-page reader.
const VIEWER: (&str, &str) = ("ops", "viewer-password-0123");
/// Lease owners: the job that will turn zombie, and the one after it.
const ZOMBIE: &str = "nightly-db-backup@host-a";
const HOLDER: &str = "nightly-db-backup@host-b";

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

/// A lease on `lock` for `owner`: (token number, signed token).
async fn acquire(locksvc: &str, lock: &str, owner: &str, ttl_ms: u64) -> (u64, String) {
    let resp = http()
        .post(format!("{locksvc}/v1/locks/{lock}/acquire"))
        .bearer_auth(API_KEY)
        .json(&json!({ "owner": owner, "ttl_ms": ttl_ms, "wait_ms": 10_000 }))
        .send()
        .await
        .expect("acquire sent");
    assert_eq!(resp.status(), 200, "acquire {lock} for {owner}");
    let v: Value = resp.json().await.expect("json");
    (
        v["token"].as_u64().expect("token"),
        v["fencing_token"]
            .as_str()
            .expect("fencing_token")
            .to_owned(),
    )
}

async fn put(
    proxy: &support::s3::Proxy,
    key: &str,
    token: &str,
) -> Result<(), (Option<u16>, String)> {
    let req = proxy
        .client()
        .put_object()
        .bucket(BUCKET)
        .key(key)
        .body(ByteStream::from_static(b"-- a database dump --"));
    fenced!(req, token)
        .send()
        .await
        .map(|_| ())
        .map_err(|e| error_of(&e))
}

fn start_locksvc(dir: &Path) -> Service {
    Service::start(support::locksvc_cmd(
        dir,
        &[("FENCEGATE_LOCKSVC_API_KEYS", API_KEY)],
    ))
}

/// Chromium, headless, on `url`: `args` are `--dump-dom` or
/// `--screenshot=...`; returns stdout.
fn chromium(url: &str, args: &[String]) -> String {
    let profile = tempfile::tempdir().expect("profile dir");
    let mut cmd = Command::new("chromium");
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--hide-scrollbars",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()))
    .args(args)
    .arg(url);
    let out = succeeds(
        &mut cmd,
        &format!("chromium on {url} (the test script installs Debian's chromium)"),
    );
    String::from_utf8(out.stdout).expect("utf-8 DOM")
}

/// `http://user:password@host:port/path` for a service at `base`.
fn with_credentials(base: &str, user: &str, password: &str, path: &str) -> String {
    let rest = base.strip_prefix("http://").expect("http URL");
    format!("http://{user}:{password}@{rest}{path}")
}

/// The text of the element carrying `data-field="<field>"` inside `html`.
fn field<'a>(html: &'a str, field: &str) -> Option<&'a str> {
    let at = html.find(&format!("data-field=\"{field}\""))?;
    let open = at + html[at..].find('>')? + 1;
    let close = open + html[open..].find("</")?;
    Some(html[open..close].trim())
}

/// The first `<article ...data-kind="<kind>"...>...</article>` of a page.
fn event_card<'a>(dom: &'a str, kind: &str) -> &'a str {
    let at = dom
        .find(&format!("data-kind=\"{kind}\""))
        .unwrap_or_else(|| panic!("no {kind} event on the page:\n{dom}"));
    let end = at + dom[at..].find("</article>").expect("card ends");
    &dom[at..end]
}

/// Width and height of a PNG, from its IHDR chunk.
fn png_size(png: &[u8]) -> (u32, u32) {
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "a PNG");
    let be = |i: usize| u32::from_be_bytes([png[i], png[i + 1], png[i + 2], png[i + 3]]);
    (be(16), be(20))
}

/// Screenshots go to the test's directory, and to
/// `FENCEGATE_SCREENSHOT_DIR` when set (how README's image is made).
fn screenshot(url: &str, name: &str, width: u32, height: u32, dir: &Path) -> PathBuf {
    let path = dir.join(name);
    chromium(
        url,
        &[
            format!("--screenshot={}", path.display()),
            format!("--window-size={width},{height}"),
        ],
    );
    let png = std::fs::read(&path).expect("chromium wrote the screenshot");
    assert_eq!(png_size(&png), (width, height), "{name}");
    // A blank page compresses to a few hundred bytes; text does not.
    assert!(png.len() > 10_000, "{name} is {} bytes: blank?", png.len());
    if let Ok(out) = std::env::var("FENCEGATE_SCREENSHOT_DIR") {
        std::fs::copy(&path, Path::new(&out).join(name)).expect("copy screenshot");
    }
    path
}

/// GET `url`, signed in as `who` (user, password) if given.
async fn get_as(url: &str, who: Option<(&str, &str)>) -> reqwest::Response {
    let mut req = http().get(url);
    if let Some((user, password)) = who {
        req = req.basic_auth(user, Some(password));
    }
    req.send().await.expect("sent")
}

async fn events(proxy: &str) -> Value {
    let resp = get_as(
        &format!("{proxy}/_fencegate/events"),
        Some((VIEWER.0, VIEWER.1)),
    )
    .await;
    assert_eq!(resp.status(), 200);
    resp.json().await.expect("json")
}

/// Waits until the proxy learned from the lease service who holds the
/// lock (the page names the holder of each lock's max).
async fn wait_for_holder(proxy: &support::s3::Proxy, owner: &str) {
    for _ in 0..200 {
        let page = get_as(
            &format!("{}/_fencegate/", proxy.url),
            Some((VIEWER.0, VIEWER.1)),
        )
        .await
        .text()
        .await
        .expect("html");
        if page.contains(&format!("<td>{owner}</td>")) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the proxy never learned that {owner} holds the lock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_write_is_an_event_on_the_status_page_in_a_real_browser() {
    let dir = tempfile::tempdir().expect("dir");
    let locksvc = tokio::task::spawn_blocking({
        let d = dir.path().to_owned();
        move || start_locksvc(&d)
    })
    .await
    .expect("locksvc");
    let env = Harness::new(BackendKind::S3Fs)
        .anonymous(false)
        .proxy_config(&format!(
            "locksvc_url = \"{}\"\nlocksvc_api_key = \"{API_KEY}\"\n[[viewers]]\nname = \"{}\"\npassword = \"{}\"",
            locksvc.url, VIEWER.0, VIEWER.1
        ))
        .start()
        .await;
    let proxy = env.proxy();

    // The zombie's lease, and a write under it; its lease runs out, the
    // next job takes the lock and writes; the zombie wakes and writes.
    let (zombie, zombie_signed) = acquire(&locksvc.url, BUCKET, ZOMBIE, 1_000).await;
    put(proxy, "db/monday.sql", &zombie_signed)
        .await
        .expect("first write");
    let (holder, holder_signed) = acquire(&locksvc.url, BUCKET, HOLDER, 120_000).await;
    assert!(holder > zombie);
    put(proxy, "db/tuesday.sql", &holder_signed)
        .await
        .expect("holder's write");
    wait_for_holder(proxy, HOLDER).await;
    let refused = put(proxy, "db/monday.sql", &zombie_signed).await;
    assert_eq!(
        refused.expect_err("the zombie is fenced").0,
        Some(409),
        "stale"
    );
    // A key a zombie chose is text on the page, never markup.
    let hostile = "x<script>document.title='owned'</script>";
    assert_eq!(
        put(proxy, hostile, &zombie_signed)
            .await
            .expect_err("stale")
            .0,
        Some(409)
    );
    // A forged token: the holder's, with its MAC changed.
    let mut forged = holder_signed.clone();
    let last = forged.pop().expect("non-empty");
    forged.push(if last == 'A' { 'B' } else { 'A' });
    assert_eq!(
        put(proxy, "db/forged.sql", &forged)
            .await
            .expect_err("forged")
            .0,
        Some(403)
    );

    // The events, as JSON: only with a client's credentials.
    let anonymous = get_as(&format!("{}/_fencegate/events", proxy.url), None).await;
    assert_eq!(anonymous.status(), 401);
    assert!(
        anonymous
            .headers()
            .get("www-authenticate")
            .is_some_and(|v| v.to_str().unwrap_or("").starts_with("Basic")),
        "a browser is asked for credentials"
    );
    // A wrong password, and S3 credentials (a browser would send the
    // secret with every reload), do not open the page.
    for (user, password) in [(VIEWER.0, "not-the-password"), CLIENT_KEY] {
        let refused = get_as(
            &format!("{}/_fencegate/", proxy.url),
            Some((user, password)),
        )
        .await;
        assert_eq!(refused.status(), 401, "{user}");
    }
    // The open status names no owner and no key being written.
    let open = proxy.status().await;
    assert!(
        open["locks"][0].get("holder").is_none() && open.get("busy_keys").is_none(),
        "{open}"
    );
    let doc = events(&proxy.url).await;
    let list = doc["events"].as_array().expect("events");
    assert_eq!(doc["recorded"], 3, "{doc:#}");
    let forged_event = &list[0];
    assert_eq!(forged_event["kind"], "forged");
    assert_eq!(forged_event["token"], holder, "the number it claimed");
    assert_eq!(forged_event["key"], "db/forged.sql");
    assert!(
        forged_event["owner"].is_null(),
        "a forged number names nobody's lease: {forged_event}"
    );
    let stale = &list[2];
    assert_eq!(stale["kind"], "stale", "{doc:#}");
    assert_eq!(stale["op"], "PutObject");
    assert_eq!(stale["bucket"], BUCKET);
    assert_eq!(stale["key"], "db/monday.sql");
    assert_eq!(stale["lock"], BUCKET);
    assert_eq!(stale["token"], zombie);
    assert_eq!(stale["max"], holder);
    assert_eq!(stale["owner"], ZOMBIE, "which job was the zombie");
    assert_eq!(stale["holder"], HOLDER, "who holds the lock now");
    assert_eq!(stale["client"], CLIENT_KEY.0);
    assert!(
        stale["remote"]
            .as_str()
            .is_some_and(|r| r.starts_with("127.0.0.1:")),
        "{stale}"
    );
    assert_eq!(list[1]["key"], hostile);

    // No secret in an event: numbers and names only.
    let text = doc.to_string();
    for secret in [
        zombie_signed.as_str(),
        holder_signed.as_str(),
        forged.as_str(),
        CLIENT_KEY.1,
        BACKEND_KEY.1,
        SIGNING_KEY,
        API_KEY,
    ] {
        assert!(!text.contains(secret), "an event shows a secret: {secret}");
    }
    let mac = holder_signed.rsplit(':').next().expect("mac");
    assert!(!text.contains(mac), "an event shows a token's MAC");

    // The page, in a real browser: the DOM after chromium has run it.
    let page_url = with_credentials(&proxy.url, VIEWER.0, VIEWER.1, "/_fencegate/");
    let head = get_as(
        &format!("{}/_fencegate/", proxy.url),
        Some((VIEWER.0, VIEWER.1)),
    )
    .await;
    assert!(
        head.headers()
            .get("content-security-policy")
            .is_some_and(|v| v.to_str().unwrap_or("").starts_with("default-src 'none'")),
        "{:?}",
        head.headers()
    );
    let dom = chromium(&page_url, &["--dump-dom".to_owned()]);
    fencegate_testkit::assert_mentions(&dom, &["<title>fencegate proxy</title>"]);
    let card = event_card(&dom, "stale");
    assert_eq!(field(card, "token"), Some(zombie.to_string().as_str()));
    assert_eq!(field(card, "max"), Some(holder.to_string().as_str()));
    assert_eq!(field(card, "owner"), Some(ZOMBIE));
    assert_eq!(field(card, "holder"), Some(HOLDER));
    // The newest stale card is the hostile key's; the zombie's first
    // stale write is the next one.
    assert!(
        card.contains("&lt;script&gt;"),
        "the hostile key is escaped text: {card}"
    );
    let after = &dom[dom.find(card).expect("card") + card.len()..];
    let monday = event_card(after, "stale");
    assert_eq!(field(monday, "key"), Some("s3://bkt/db/monday.sql"));
    assert_eq!(field(monday, "token"), Some(zombie.to_string().as_str()));
    assert!(
        !dom.contains("<script>document.title"),
        "a key became markup"
    );
    assert!(
        dom.contains("SAFE"),
        "the probe's finding is shown in words"
    );
    for secret in [
        zombie_signed.as_str(),
        holder_signed.as_str(),
        forged.as_str(),
        mac,
        CLIENT_KEY.1,
        BACKEND_KEY.1,
        SIGNING_KEY,
        API_KEY,
        VIEWER.1,
    ] {
        assert!(!dom.contains(secret), "the page shows a secret: {secret}");
    }
    let shots = tempfile::tempdir().expect("screenshots");
    screenshot(&page_url, "status-page-phone.png", 412, 1400, shots.path());
    screenshot(&page_url, "status-page.png", 1100, 1000, shots.path());

    // The lease service's page: holder, token, expiry, waiters; behind its
    // API key (a browser sends it as the password).
    let bare = get_as(&format!("{}/", locksvc.url), None).await;
    assert_eq!(bare.status(), 401);
    assert!(bare.headers().contains_key("www-authenticate"));
    let wrong = get_as(&format!("{}/", locksvc.url), Some(("ops", "not-the-key"))).await;
    assert_eq!(wrong.status(), 401);
    // The API takes Bearer only: a browser's saved Basic credentials, sent
    // by a hostile site's form, acquire nothing.
    let forged_by_a_site = http()
        .post(format!("{}/v1/locks/{BUCKET}/acquire", locksvc.url))
        .basic_auth("ops", Some(API_KEY))
        .header("content-type", "text/plain")
        .body(r#"{"owner":"a-hostile-site"}"#)
        .send()
        .await
        .expect("acquire");
    assert_eq!(forged_by_a_site.status(), 401);
    let lease_url = with_credentials(&locksvc.url, "ops", API_KEY, "/");
    let dom = chromium(&lease_url, &["--dump-dom".to_owned()]);
    let at = dom
        .find(&format!("data-lock=\"{BUCKET}\""))
        .unwrap_or_else(|| panic!("no lock {BUCKET} on the lease service's page:\n{dom}"));
    let card = &dom[at..];
    assert_eq!(field(card, "owner"), Some(HOLDER));
    assert_eq!(field(card, "token"), Some(holder.to_string().as_str()));
    assert_eq!(field(card, "waiting"), Some("0"));
    let expires = card
        .split("data-expires-at-ms=")
        .nth(1)
        .expect("the expiry counts down");
    let shown = &expires[expires.find('>').expect("tag") + 1..expires.find('<').expect("text")];
    assert!(
        shown.starts_with("in ") && shown.ends_with(" s"),
        "the expiry reads {shown:?}"
    );
    screenshot(&lease_url, "lease-service-page.png", 412, 700, shots.path());

    // Every series the Grafana dashboard plots is one the services export.
    let exported = format!(
        "{}{}",
        fetch_text(&format!("{}/_fencegate/metrics", proxy.url)).await,
        fetch_text(&format!("{}/metrics", locksvc.url)).await
    );
    let families: Vec<&str> = exported
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string("config/grafana/dashboards/fencegate.json").expect("dashboard"),
    )
    .expect("the dashboard is JSON");
    let mut plotted = 0;
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("expr");
            for name in metric_names(expr) {
                let family = ["_total", "_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s))
                    .unwrap_or(&name);
                assert!(
                    families.contains(&family),
                    "panel {:?} plots {name}, which neither service exports",
                    panel["title"]
                );
                plotted += 1;
            }
        }
    }
    assert!(plotted > 15, "the dashboard plots {plotted} series");
}

async fn fetch_text(url: &str) -> String {
    let resp = http().get(url).send().await.expect("sent");
    assert!(resp.status().is_success(), "{url}: {}", resp.status());
    resp.text().await.expect("text")
}

/// The `fencegate_*` metric names in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("fencegate_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

/// A proxy configured by `toml`, its log written to `log`.
async fn proxy_logging(
    toml: String,
    dir: &Path,
    env: &'static [(&'static str, &'static str)],
    log: &Path,
) -> Service {
    let (dir, log) = (dir.to_owned(), log.to_owned());
    tokio::task::spawn_blocking(move || {
        let config = write_file(&dir, "proxy.toml", toml);
        let mut cmd = proxy_cmd(&config);
        cmd.envs(env.iter().copied());
        Service::start_logging(cmd, std::fs::File::create(&log).expect("log file"))
    })
    .await
    .expect("proxy")
}

/// An anonymous PutObject of `key` with `token`: the status.
async fn raw_put(client: &reqwest::Client, proxy: &str, key: &str, token: &str) -> u16 {
    client
        .put(format!("{proxy}/{BUCKET}/{key}"))
        .header("fencing-token", token)
        .header("content-type", "application/octet-stream")
        .body("zombie bytes")
        .send()
        .await
        .expect("put sent")
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_events_are_json_log_lines_with_format_json() {
    let dir = tempfile::tempdir().expect("dir");
    let backend = Harness::new(BackendKind::S3Fs).backend().await;
    let log = dir.path().join("proxy.log");
    // One scope, `db/`: a key outside it is refused (unscoped_writes deny).
    let scopes =
        format!("[[scopes]]\nbucket = \"{BUCKET}\"\nprefix = \"db/\"\nlock = \"{BUCKET}\"");
    let toml = support::s3::proxy_toml(&backend, dir.path(), BUCKET, &scopes);
    let json_logs = &[("FENCEGATE_LOG_FORMAT", "json"), ("FENCEGATE_LOG", "info")];
    let proxy = proxy_logging(toml, dir.path(), json_logs, &log).await;
    let client = http();
    assert_eq!(
        raw_put(&client, &proxy.url, "db/k", &signed(BUCKET, 2)).await,
        200
    );
    assert_eq!(
        raw_put(&client, &proxy.url, "db/k", &signed(BUCKET, 1)).await,
        409
    );
    assert_eq!(
        raw_put(&client, &proxy.url, "tmp/k", &signed(BUCKET, 2)).await,
        403
    );
    let doc = events(&proxy.url).await;
    let unscoped = &doc["events"][0];
    assert_eq!(unscoped["kind"], "unscoped", "{doc}");
    assert_eq!(
        (unscoped["bucket"].as_str(), unscoped["key"].as_str()),
        (Some(BUCKET), Some("tmp/k"))
    );
    assert!(unscoped["lock"].is_null(), "no scope, no lock: {unscoped}");
    let mut found = None;
    for _ in 0..100 {
        let text = std::fs::read_to_string(&log).expect("log");
        found = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["target"] == "fencegate::fence_event");
        if found.is_some() {
            for line in text.lines() {
                serde_json::from_str::<Value>(line)
                    .unwrap_or_else(|e| panic!("a log line is not JSON ({e}): {line}"));
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let line = found.expect("the refusal was logged as a JSON line");
    assert_eq!(line["level"], "WARN");
    assert_eq!(line["kind"], "stale");
    assert_eq!(line["token"], 1);
    assert_eq!(line["max"], 2);
    assert_eq!(line["key"], "db/k");
    assert_eq!(line["scope"], format!("{BUCKET}/db/"));
    assert_eq!(line["lock"], BUCKET);
    assert_eq!(line["client"], "", "anonymous");
    assert!(
        line["remote"]
            .as_str()
            .is_some_and(|r| r.starts_with("127.0.0.1:"))
    );
    assert!(!line.to_string().contains(&signed(BUCKET, 1)));
}

/// The resident memory of `pid`, in KiB.
fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("proc status")
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_100k_refusals_keeps_memory_and_the_event_list_bounded() {
    const BURST: usize = 100_000;
    const WARM: usize = 10_000;
    let dir = tempfile::tempdir().expect("dir");
    let backend = Harness::new(BackendKind::S3Fs).backend().await;
    let log = dir.path().join("proxy.log");
    let toml = support::s3::proxy_toml(&backend, dir.path(), BUCKET, "");
    let proxy = proxy_logging(toml, dir.path(), &[], &log).await;
    let client = http();
    assert_eq!(
        raw_put(&client, &proxy.url, "k", &signed(BUCKET, 2)).await,
        200
    );
    let stale = signed(BUCKET, 1);
    // Distinct long keys: kept unbounded, 100k events of them would hold
    // about 100 MiB.
    let pad = "z".repeat(900);
    let send = |from: usize, to: usize| {
        let (client, url, stale, pad) = (
            client.clone(),
            proxy.url.clone(),
            stale.clone(),
            pad.clone(),
        );
        async move {
            use futures::StreamExt as _;
            let statuses: Vec<u16> = futures::stream::iter(from..to)
                .map(|i| {
                    let (client, url, stale, key) = (
                        client.clone(),
                        url.clone(),
                        stale.clone(),
                        format!("burst/{i}/{pad}"),
                    );
                    async move { raw_put(&client, &url, &key, &stale).await }
                })
                .buffer_unordered(32)
                .collect()
                .await;
            assert!(
                statuses.iter().all(|s| *s == 409),
                "every stale write is refused"
            );
        }
    };
    let started = std::time::Instant::now();
    send(0, WARM).await;
    let warm = rss_kib(proxy.pid());
    send(WARM, BURST).await;
    let seconds = started.elapsed().as_secs() as usize;
    let after = rss_kib(proxy.pid());
    let doc = events(&proxy.url).await;
    assert_eq!(doc["recorded"], BURST as u64);
    let capacity = doc["capacity"].as_u64().expect("capacity");
    assert_eq!(capacity, 1000, "the default");
    assert_eq!(
        doc["kept"], capacity,
        "the list holds the newest {capacity}"
    );
    assert_eq!(doc["events"].as_array().map(Vec::len), Some(1000));
    let newest = &doc["events"][0];
    assert_eq!(newest["seq"], BURST as u64, "newest first");
    assert!(
        newest["key"]
            .as_str()
            .is_some_and(|k| k.starts_with("burst/") && k.ends_with(&pad)),
        "{newest}"
    );
    let growth_mib = after.saturating_sub(warm) / 1024;
    println!("RSS after {WARM} refusals {warm} KiB, after {BURST} {after} KiB");
    assert!(
        growth_mib < 24,
        "{} more refusals grew the proxy by {growth_mib} MiB",
        BURST - WARM
    );
    // One log line per event, at most 100 a second; the rest summarised.
    let text = std::fs::read_to_string(&log).expect("log");
    let lines = text
        .lines()
        .filter(|l| l.contains("fence refused a write"))
        .count();
    assert!(
        lines > 0 && lines <= 100 * (seconds + 2),
        "{lines} event lines for {BURST} events in {seconds} s: more than 100 a second"
    );
    assert!(
        text.contains("were not logged"),
        "the held-back lines are counted"
    );
}
