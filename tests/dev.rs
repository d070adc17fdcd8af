//! `fencegate dev` and the README walkthrough, run verbatim.

mod support;

use std::process::Command;
use support::{Service, write_file};

/// The shell block between the walkthrough markers in README.md.
fn walkthrough() -> String {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README");
    let block = readme
        .split("<!-- walkthrough:begin -->")
        .nth(1)
        .and_then(|r| r.split("<!-- walkthrough:end -->").next())
        .expect("walkthrough markers");
    block
        .lines()
        .filter(|l| !l.starts_with("```"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_readme_walkthrough_works_verbatim_against_fencegate_dev() {
    let data = tempfile::tempdir().expect("tempdir");
    // The README's first command, on ports the OS chooses (the documented
    // defaults may be taken on a test machine); the walkthrough's default
    // addresses are pointed at them below.
    let mut cmd = support::fencegate();
    cmd.args(["dev", "--data-dir"])
        .arg(data.path().join("dev"))
        .args(["--proxy-listen", "127.0.0.1:0"])
        .args(["--locksvc-listen", "127.0.0.1:0"])
        .args(["--backend-listen", "127.0.0.1:0"])
        .env("FENCEGATE_LOG", "warn");
    let dev = Service::start(cmd);
    let locksvc = dev.banner_url("locksvc");
    let script = walkthrough();
    assert!(
        script.contains("http://127.0.0.1:9000/"),
        "the walkthrough uses the documented proxy address: {script}"
    );
    let script = script.replace("http://127.0.0.1:9000/", &format!("{}/", dev.url));

    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_fencegate"))
        .parent()
        .expect("dir")
        .to_owned();
    let mut bash = Command::new("bash");
    support::without_fencegate_env(&mut bash);
    let out = bash
        .arg("-euo")
        .arg("pipefail")
        .arg("-c")
        .arg(&script)
        // `$PWD/target/release` does not exist in the temp dir: the debug
        // build on PATH answers as `fencegate`.
        .current_dir(data.path())
        .env(
            "PATH",
            format!(
                "{}:{}",
                bin_dir.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        // The lease CLI's default (the dev lease service's documented
        // address) is where this run's lease service listens.
        .env("FENCEGATE_LOCKSVC", &locksvc)
        .output()
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "walkthrough failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    fencegate_testkit::assert_mentions(&stdout, &["HTTP/1.1 409 Conflict"]);
    fencegate_testkit::assert_mentions(&stdout, &["fencing-max-token: 2"]);
    fencegate_testkit::assert_mentions(&stdout, &["<Code>FencingTokenStale</Code>"]);
    assert!(
        stdout.trim_end().ends_with("from bob"),
        "the object is bob's: {stdout}"
    );
    // The page names them: alice's late write, with bob holding the lock
    // (the dev proxy asks the dev lease service who owns each token).
    let events = Command::new("curl")
        .args(["-sS", &format!("{}/_fencegate/events", dev.url)])
        .output()
        .expect("curl runs");
    let events: serde_json::Value =
        serde_json::from_slice(&events.stdout).expect("events are JSON");
    let late = &events["events"][0];
    assert_eq!(
        (
            late["kind"].as_str(),
            late["key"].as_str(),
            late["owner"].as_str(),
            late["holder"].as_str()
        ),
        (Some("stale"), Some("hello.txt"), Some("alice"), Some("bob")),
        "{events}"
    );

    // Plain numbers prove nothing (every refusal publishes the current
    // one): the dev proxy refuses them, even the lock's current number,
    // and takes the signed fencing_token the lease service returned.
    let put = |token: &str, body: &str| {
        let out = Command::new("curl")
            .args(["-sS", "-o", "-", "-w", "\n%{http_code}", "-X", "PUT"])
            .args([
                "-H",
                &format!("Fencing-Token: {token}"),
                "--data-binary",
                body,
            ])
            .arg(format!("{}/plain-demo/plain.txt", dev.url))
            .output()
            .expect("curl runs");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, code) = text.rsplit_once('\n').expect("status");
        (code.to_owned(), body.to_owned())
    };
    // Creating a bucket needs credentials (an anonymous client may change
    // nothing without a token).
    let (ak, sk) = ("fencegate", "fencegate-secret");
    let create = |signed: bool| {
        let mut c = Command::new("curl");
        c.args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", "PUT"]);
        if signed {
            c.args([
                "--aws-sigv4",
                "aws:amz:us-east-1:s3",
                "--user",
                &format!("{ak}:{sk}"),
            ])
            .args(["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"]);
        }
        let out = c
            .arg(format!("{}/plain-demo", dev.url))
            .output()
            .expect("curl runs");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    assert_eq!(create(false), "403", "anonymous CreateBucket is refused");
    assert_eq!(create(true), "200", "CreateBucket with the dev client key");
    let lease = {
        let out = support::fencegate()
            .args([
                "lease",
                "acquire",
                "plain-demo",
                "--owner",
                "carol",
                "--ttl",
                "60s",
            ])
            .args(["--format", "json", "--locksvc", &locksvc])
            .output()
            .expect("lease acquire runs");
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("lease json")
    };
    let carol_signed = lease["fencing_token"].as_str().expect("signed").to_owned();
    let carol = lease["token"].as_u64().expect("a token number");
    let (code, body) = put(&carol.to_string(), "plain current number");
    assert_eq!(code, "403", "{body}");
    fencegate_testkit::assert_mentions(&body, &["FencingTokenUnsigned"]);
    assert_eq!(put(&carol_signed, "from carol").0, "200");
    assert_eq!(put(&carol_signed, "carol again").0, "200");
    let forged = fencegate_core::TokenKeys::new(vec![b"not-the-dev-signing-key".to_vec()])
        .expect("key")
        .sign(
            &fencegate_core::LockName::new("plain-demo").expect("lock"),
            carol + 1,
        )
        .to_string();
    let (code, body) = put(&forged, "forged");
    assert_eq!(code, "403", "{body}");
    fencegate_testkit::assert_mentions(&body, &["FencingTokenSignatureInvalid"]);
    let got = Command::new("curl")
        .args(["-sS", &format!("{}/plain-demo/plain.txt", dev.url)])
        .output()
        .expect("curl runs");
    assert_eq!(String::from_utf8_lossy(&got.stdout), "carol again");
    drop(dev);
}

#[test]
fn dev_refuses_two_services_on_one_port() {
    // A port this test holds: nobody else can be on it, whatever `--check`
    // does with it.
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = held.local_addr().expect("addr").to_string();
    let out = support::fencegate()
        .args(["dev", "--check", "--proxy-listen", &addr])
        .args(["--backend-listen", &addr])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("used for two services"));
}

/// Like every service, `fencegate dev` lists every problem of its
/// configuration in one error, not just the first it meets.
#[test]
fn dev_lists_every_config_problem_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_file(
        dir.path(),
        "dev.toml",
        "data_dir = \"\"\nlocksvc_listen = \"127.0.0.1:7171\"\nproxy_listen = \"127.0.0.1:9100\"\nbackend_listen = \"127.0.0.1:9100\"\n",
    );
    let out = support::fencegate()
        .args(["dev", "--check", "--config"])
        .arg(&config)
        .args(["--locksvc-listen", "127.0.0.1:9100"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for problem in [
        "127.0.0.1:9100 is used for three services (locksvc_listen, proxy_listen, backend_listen)",
        "data_dir is empty",
    ] {
        assert!(stderr.contains(problem), "missing {problem:?} in {stderr}");
    }
    assert_eq!(
        stderr.matches("\n  - ").count(),
        2,
        "one line per problem: {stderr}"
    );
}

/// `accept_unsigned_tokens = true` in the dev config trusts every plain
/// number without asking the lease service (and the dev proxy starts: it
/// does not also set `locksvc_url`, which would contradict it).
#[test]
fn dev_can_trust_plain_numbers_when_configured() {
    let data = tempfile::tempdir().expect("tempdir");
    let config = data.path().join("dev.toml");
    std::fs::write(
        &config,
        format!(
            "accept_unsigned_tokens = true\ndata_dir = \"{}\"\nlocksvc_listen = \"127.0.0.1:0\"\nproxy_listen = \"127.0.0.1:0\"\nbackend_listen = \"127.0.0.1:0\"\n",
            data.path().join("dev").display()
        ),
    )
    .expect("write config");
    let mut cmd = support::fencegate();
    cmd.args(["dev", "--config"])
        .arg(&config)
        .env("FENCEGATE_LOG", "warn");
    let dev = Service::start(cmd);
    let code = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", "PUT"])
        .args(["-H", "Fencing-Token: 99", "--data-binary", "trusted"])
        .arg(format!("{}/backups/plain.txt", dev.url))
        .output()
        .expect("curl runs");
    assert_eq!(String::from_utf8_lossy(&code.stdout), "200");
}
