//! Locks whose tokens an etcd election issues (`[[elections]]`): Patroni's
//! leader key and etcd's election recipe, on a real etcd and a real
//! proxy process. The token is the revision the holder's term began at
//! (a leader key's `mod_revision`, a prefix's lowest `create_revision`); the
//! proxy reads the election itself and admits nothing on a client's word.

#[macro_use]
mod support;

use std::os::unix::process::CommandExt as _;
use std::process::Command;
use support::etcd::EtcdCluster;
use support::harness::BUCKET;
use support::s3::*;

/// One etcd member, a store with the bucket, and a proxy whose bucket's
/// lock follows the election at `seat` (a TOML line) on that etcd.
struct Setup {
    etcd: EtcdCluster,
    backend: Backend,
    proxy: Proxy,
    _dir: tempfile::TempDir,
}

impl Setup {
    async fn start(seat: &str) -> Setup {
        let etcd = blocking(|| EtcdCluster::start(1));
        let backend = Backend::start(BackendKind::S3Fs).await;
        backend.create_bucket(BUCKET).await;
        let dir = support::tempdir();
        let proxy = proxy_following(&backend, dir.path(), &etcd.endpoints(), seat).await;
        Setup {
            etcd,
            backend,
            proxy,
            _dir: dir,
        }
    }

    /// A proxy whose lock follows the leader key `leader`, with the
    /// election's own `signing_keys`.
    async fn signed(leader: &str) -> Setup {
        Setup::start(&format!(
            "etcd_key = \"{leader}\"\nsigning_keys = [\"{ELECTION_KEY}\"]"
        ))
        .await
    }

    /// The body a PUT with `token` writes.
    async fn assert_written_with(&self, key: &str, token: u64) {
        let body = format!("written with {token}");
        assert_stored(&self.backend, BUCKET, key, body.as_bytes(), token).await;
    }
}

/// A proxy whose bucket's lock follows the election at `seat` (a TOML
/// line: `etcd_key = "..."` or `etcd_prefix = "..."`) on `endpoints`.
async fn proxy_following(
    backend: &Backend,
    dir: &std::path::Path,
    endpoints: &str,
    seat: &str,
) -> Proxy {
    let endpoints: Vec<&str> = endpoints.split(',').collect();
    let elections = format!(
        "[[elections]]\nlock = \"{BUCKET}\"\n{seat}\nendpoints = {endpoints:?}\nrequest_timeout = \"1s\"\n"
    );
    Proxy::start(&proxy_toml(backend, dir, BUCKET, &elections), dir).await
}

/// `f`, which blocks (etcd's JSON gateway is asked with a blocking
/// client), off the runtime's async work.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// An anonymous PUT of `key` with `Fencing-Token: token`: the status, the
/// body and `Fencing-Max-Token`.
async fn put(proxy: &Proxy, key: &str, token: &str) -> (u16, String, Option<String>) {
    anonymous_put(proxy, (BUCKET, key), token, format!("written with {token}")).await
}

/// A PUT with `token` the proxy admits.
async fn admitted(proxy: &Proxy, key: &str, token: &str) {
    let (status, text, _) = put(proxy, key, token).await;
    assert_eq!(status, 200, "{key} with {token}: {text}");
}

/// A PUT with `token` the proxy refuses as stale (409), naming `max`.
async fn stale(proxy: &Proxy, key: &str, token: impl ToString, max: u64) {
    let token = token.to_string();
    let (status, text, named) = put(proxy, key, &token).await;
    assert_eq!(status, 409, "{key} with {token}: {text}");
    assert_eq!(named, Some(max.to_string()));
}

/// A PUT with `token` the proxy refuses (403), its message naming each of
/// `needles`.
async fn refused(proxy: &Proxy, key: &str, token: &str, needles: &[&str]) {
    let (status, text, _) = put(proxy, key, token).await;
    assert_eq!(status, 403, "{key} with {token}: {text}");
    fencegate_testkit::assert_mentions(&text, needles);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_key_issues_the_tokens_and_a_deposed_leader_is_refused() {
    let leader = "/service/pg/leader";
    let setup = Setup::start(&format!("etcd_key = \"{leader}\"")).await;
    let Setup {
        etcd,
        backend,
        proxy,
        ..
    } = &setup;

    // No leader: nothing is admitted, and the refusal says why.
    refused(proxy, "wal/1", "5", &[leader, "no holder"]).await;
    assert_eq!(stored(backend, BUCKET, "wal/1").await, None);

    // node-a leads: the revision its key was written at is its token.
    let a = blocking(|| etcd.put(leader, "node-a"));
    admitted(proxy, "wal/1", &a.to_string()).await;
    setup.assert_written_with("wal/1", a).await;

    // A number above the holder's is not the holder's: refused, naming
    // what the election shows.
    let forged = (a + 50).to_string();
    refused(proxy, "wal/2", &forged, &[leader, "node-a"]).await;
    assert_eq!(stored(backend, BUCKET, "wal/2").await, None);
    // The current token of another election (another cluster's leader
    // key, in the same etcd) is not this lock's.
    let other = blocking(|| etcd.put("/service/other/leader", "node-a"));
    refused(proxy, "wal/2", &other.to_string(), &[leader, "node-a"]).await;

    // A signed token of the lease service is not this lock's.
    refused(proxy, "wal/2", &signed(BUCKET, a + 1), &[leader]).await;

    // node-a's key is gone (its lease expired): node-a is refused at once,
    // each write checked with the election, and cannot raise the fence.
    blocking(|| etcd.delete(leader));
    refused(proxy, "wal/2", &a.to_string(), &[leader, "no holder"]).await;
    let (status, text) = raise_fence(proxy, &a.to_string()).await;
    assert_eq!(status, 403, "{text}");
    // node-b's key is created: the proxy, watching the election, raises
    // the fence to its term though node-b has written nothing, and node-a
    // is stale from then on.
    let b = blocking(|| etcd.put(leader, "node-b"));
    assert!(b > a, "a new leader key has a higher revision");
    proxy.wait_for_max(BUCKET, b).await;
    stale(proxy, "wal/2", a, b).await;
    // node-b's on_role_change raises it too (Patroni's callback, for a
    // proxy that cannot watch etcd), with the token the CLI reads for its
    // identity.
    let endpoints = etcd.endpoints();
    let fenced = blocking(|| {
        support::fencegate()
            .args([
                "election",
                "token",
                "--endpoints",
                &endpoints,
                "--key",
                leader,
            ])
            .args([
                "--identity",
                "node-b",
                "--fence",
                &proxy.url,
                "--lock",
                BUCKET,
            ])
            .output()
            .expect("runs")
    });
    assert_eq!(exits(&fenced, 0).trim(), b.to_string());
    stale(proxy, "wal/3", a, b).await;
    admitted(proxy, "wal/2", &b.to_string()).await;
    assert_eq!(stored(backend, BUCKET, "wal/3").await, None);
    setup.assert_written_with("wal/1", a).await;
}

/// `POST /_fencegate/fence?lock=BUCKET` with `token`: the status and body.
async fn raise_fence(proxy: &Proxy, token: &str) -> (u16, String) {
    let r = reqwest::Client::new()
        .post(format!("{}/_fencegate/fence?lock={BUCKET}", proxy.url))
        .header("fencing-token", token)
        .send()
        .await
        .expect("the proxy answers");
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

/// Patroni 3.0.2's leader, frozen past its TTL, wakes and puts its name
/// into the key its successor created, without creating it again: a new
/// holder, so a new term with a higher token; the successor it displaced
/// is refused from then on, and the old term's token is stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_key_taken_over_in_place_is_a_new_term() {
    let leader = "/service/inplace/leader";
    let setup = Setup::start(&format!("etcd_key = \"{leader}\"")).await;
    let Setup { etcd, proxy, .. } = &setup;
    let a = blocking(|| etcd.put(leader, "node-a"));
    admitted(proxy, "wal/1", &a.to_string()).await;
    blocking(|| etcd.delete(leader));
    let b = blocking(|| etcd.put(leader, "node-b"));
    admitted(proxy, "wal/1", &b.to_string()).await;
    // node-a writes its name over node-b's key: one key, two holders.
    let a2 = blocking(|| etcd.put(leader, "node-a"));
    assert!(a2 > b, "the overwrite is a later revision");
    // A new term: the proxy's watch raises the fence to it, and node-b,
    // whose key it was, is stale.
    proxy.wait_for_max(BUCKET, a2).await;
    admitted(proxy, "wal/2", &a2.to_string()).await;
    for old in [a, b] {
        stale(proxy, "wal/3", old, a2).await;
    }
    setup.assert_written_with("wal/2", a2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_prefix_the_lowest_create_revision_holds() {
    let setup = Setup::start("etcd_prefix = \"/elect/pg/\"").await;
    let Setup { etcd, proxy, .. } = &setup;
    let first = blocking(|| etcd.put("/elect/pg/694d8a", "first"));
    let second = blocking(|| etcd.put("/elect/pg/694d8b", "second"));
    // The second candidate waits: its token is not the holder's.
    refused(proxy, "k", &second.to_string(), &["first"]).await;
    admitted(proxy, "k", &first.to_string()).await;
    // The first resigns: the second holds, and the first is stale.
    blocking(|| etcd.delete("/elect/pg/694d8a"));
    admitted(proxy, "k", &second.to_string()).await;
    stale(proxy, "k", first, second).await;
    setup.assert_written_with("k", second).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_that_cannot_be_read_admits_nothing() {
    let backend = Backend::start(BackendKind::S3Fs).await;
    backend.create_bucket(BUCKET).await;
    let dir = support::tempdir();
    // A port nothing answers on.
    let (_held, dead) = support::unserved();
    let proxy = proxy_following(
        &backend,
        dir.path(),
        &dead,
        "etcd_key = \"/service/pg/leader\"",
    )
    .await;
    let (status, text, _) = put(&proxy, "k", "7").await;
    assert_eq!(status, 503, "{text}");
    fencegate_testkit::assert_mentions(&text, &["/service/pg/leader"]);
    assert_eq!(stored(&backend, BUCKET, "k").await, None);
}

/// Fails unless `out` exited with `code`; its stdout and stderr.
fn exits(out: &std::process::Output, code: i32) -> String {
    let text = support::output_text(out);
    assert_eq!(out.status.code(), Some(code), "{text}");
    text
}

/// `fencegate election token` prints the holder's token for the holder's
/// identity, and fails with exit 3 for anyone else or when nobody holds.
#[test]
fn the_cli_prints_the_token_only_to_the_holder() {
    let etcd = EtcdCluster::start(1);
    let leader = "/service/cli/leader";
    let token = |identity: &str| {
        support::fencegate()
            .args(["election", "token", "--endpoints", &etcd.endpoints()])
            .args(["--key", leader, "--identity", identity])
            .output()
            .expect("runs")
    };
    let vacant = token("node-a");
    fencegate_testkit::assert_mentions(&exits(&vacant, 3), &["no holder"]);
    let a = etcd.put(leader, "node-a");
    let held = token("node-a");
    exits(&held, 0);
    assert_eq!(String::from_utf8_lossy(&held.stdout).trim(), a.to_string());
    let other = token("node-b");
    fencegate_testkit::assert_mentions(&exits(&other, 3), &["node-a", leader]);
}

/// An upload opened by a leader that is then deposed: its parts and its
/// Complete are refused, with the token or without it (tools such as
/// s3cmd send it on the Create only), though the new leader has written
/// nothing; the upload's owner may still abort it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_of_a_deposed_leader_lands_nothing() {
    let leader = "/service/mp/leader";
    let setup = Setup::start(&format!("etcd_key = \"{leader}\"")).await;
    let (etcd, c) = (&setup.etcd, setup.proxy.client());
    let a = blocking(|| etcd.put(leader, "node-a")).to_string();
    let id = create_upload(&c, "big", &a).await;
    let part = |n: i32| part_of(&c, "big", &id, n).body(vec![b'p'; 1024].into());
    let first = part(1).send().await.expect("a part while node-a leads");
    // node-a's key goes: its parts are refused, each checked with the
    // election.
    blocking(|| etcd.delete(leader));
    let late = part(2).send().await.expect_err("a part after node-a lost");
    assert_eq!(error_of(&late).0, Some(403), "{late:?}");
    // node-b's term: the proxy raises the fence to it; node-a's Complete,
    // with its token or without, is stale.
    let b = blocking(|| etcd.put(leader, "node-b"));
    setup.proxy.wait_for_max(BUCKET, b).await;
    let e_tag = first.e_tag().expect("etag");
    let done = c
        .complete_multipart_upload()
        .bucket(BUCKET)
        .key("big")
        .upload_id(&id)
        .multipart_upload(fencegate_testkit::s3::completed_parts([Some(e_tag)]))
        .send()
        .await
        .expect_err("no Complete after node-a lost");
    assert_eq!(error_of(&done).0, Some(409), "{done:?}");
    let with_token = complete_upload(&c, "big", &id, &[e_tag], &a).await;
    assert_eq!(error_of(&with_token.expect_err("refused")).0, Some(409));
    assert_eq!(stored(&setup.backend, BUCKET, "big").await, None);
    c.abort_multipart_upload()
        .bucket(BUCKET)
        .key("big")
        .upload_id(&id)
        .send()
        .await
        .expect("its owner may abort it");
}

/// The election's own key in the proxy's `[[elections]]` table, shared
/// with the cluster's nodes (and not the lease service's test key).
const ELECTION_KEY: &str = "the-pg-cluster-election-key";

fn election_keys() -> fencegate_core::TokenKeys {
    fencegate_core::TokenKeys::new(vec![ELECTION_KEY.as_bytes().to_vec()]).expect("keys")
}

/// `token` for the bucket's lock, signed with the election's key.
fn election_signed(token: u64) -> String {
    let lock = fencegate_core::LockName::new(BUCKET).expect("lock");
    election_keys().sign(&lock, token).to_string()
}

/// A client signing with credentials bound to `token` by `keys`.
fn bound_client(proxy: &Proxy, keys: &fencegate_core::TokenKeys, token: u64) -> aws_sdk_s3::Client {
    let lock = fencegate_core::LockName::new(BUCKET).expect("lock");
    let c = keys.credentials(&lock, token, 4_000_000_000);
    sdk_client(&proxy.url, (&c.access_key, &c.secret_key))
}

/// A PUT of `key` by `client` lands `body`, tagged with `token`.
async fn writes(
    client: &aws_sdk_s3::Client,
    backend: &Backend,
    (key, body): (&str, &[u8]),
    token: u64,
) {
    client
        .put_object()
        .bucket(BUCKET)
        .key(key)
        .body(body.to_vec().into())
        .send()
        .await
        .unwrap_or_else(|e| panic!("{key}: {e:?}"));
    assert_stored(backend, BUCKET, key, body, token).await;
}

/// A PUT of `key` by `client` is refused with `status`.
async fn assert_put_refused(client: &aws_sdk_s3::Client, key: &str, status: u16) {
    let e = client
        .put_object()
        .bucket(BUCKET)
        .key(key)
        .body(b"refused".to_vec().into())
        .send()
        .await
        .expect_err("refused");
    assert_eq!(error_of(&e).0, Some(status), "{e:?}");
}

/// With `signing_keys`, a plain number proves nothing (anyone who can read
/// etcd, or guess, knows it): only a token or credentials signed with the
/// election's key are taken, and still only while the election shows
/// their number. The lease service's key signs nothing for this lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_signing_keys_only_signed_tokens_of_the_holder_write() {
    let leader = "/service/signed/leader";
    let setup = Setup::signed(leader).await;
    let (etcd, backend, proxy) = (&setup.etcd, &setup.backend, &setup.proxy);
    let a = blocking(|| etcd.put(leader, "node-a"));

    // The holder's number, plain: refused, naming what to send.
    let (status, text, _) = put(proxy, "wal/1", &a.to_string()).await;
    assert_eq!(status, 403, "{text}");
    fencegate_testkit::assert_mentions(&text, &["FencingTokenUnsigned", "signing_keys", leader]);
    // Signed with the lease service's key: the signature does not verify.
    let (status, text, _) = put(proxy, "wal/1", &signed(BUCKET, a)).await;
    assert_eq!(status, 403, "{text}");
    // Signed with the election's key: admitted.
    let (status, text, _) = put(proxy, "wal/1", &election_signed(a)).await;
    assert_eq!(status, 200, "{text}");
    let body = format!("written with {}", election_signed(a));
    assert_stored(backend, BUCKET, "wal/1", body.as_bytes(), a).await;
    // A signed number the election does not show: refused. The holder's
    // number signed for another lock: refused as that lock's.
    refused(proxy, "wal/2", &election_signed(a + 9), &[leader, "node-a"]).await;
    let other = fencegate_core::LockName::new("other-cluster").expect("lock");
    let elsewhere = election_keys().sign(&other, a).to_string();
    refused(proxy, "wal/2", &elsewhere, &["other-cluster"]).await;

    // Credentials bound to the holder's token with the election's key
    // write; the same made with the lease service's key do not.
    let holder = bound_client(proxy, &election_keys(), a);
    writes(&holder, backend, ("wal/2", b"by credentials"), a).await;
    let lease_keyed = bound_client(proxy, &support::test_keys(), a);
    assert_put_refused(&lease_keyed, "wal/3", 403).await;

    // node-a's key goes: its credentials and signed token stop at once.
    blocking(|| etcd.delete(leader));
    assert_put_refused(&holder, "wal/3", 403).await;
    refused(proxy, "wal/3", &election_signed(a), &["no holder"]).await;
    // node-b's term: node-a is stale. node-b may raise the fence with a
    // signed token too (the proxy's watch may have done it already).
    let b = blocking(|| etcd.put(leader, "node-b"));
    let (status, text) = raise_fence(proxy, &election_signed(b)).await;
    assert_eq!(status, 200, "{text}");
    stale(proxy, "wal/3", election_signed(a), b).await;
    assert_put_refused(&holder, "wal/3", 409).await;
    assert_eq!(stored(backend, BUCKET, "wal/3").await, None);
}

/// `fencegate election run`: waits until its identity holds, raises the
/// fence, gives the command (and the role files) a token and credentials
/// signed with the election's key, and stops the command, exiting 4 and
/// removing the files, as soon as the election moves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_run_holds_the_role_while_the_election_names_it() {
    let leader = "/service/run/leader";
    let setup = Setup::signed(leader).await;
    let (etcd, backend, proxy) = (&setup.etcd, &setup.backend, &setup.proxy);
    let dir = support::tempdir();
    let key_file = support::write_file(dir.path(), "election.key", format!("{ELECTION_KEY}\n"));
    let env_file = dir.path().join("role.env");
    let started = dir.path().join("started");
    let mut run = support::spawn_piped(
        support::fencegate()
            .args(["election", "run", "--endpoints", &etcd.endpoints()])
            .args(["--key", leader, "--identity", "node-a", "--lock", BUCKET])
            .arg("--signing-key-file")
            .arg(&key_file)
            .arg("--env-file")
            .arg(&env_file)
            .args(["--s3-endpoint", &proxy.url, "--grace", "2s", "--"])
            .args([
                "sh",
                "-c",
                "echo \"$FENCING_TOKEN\" > \"$0\"; exec sleep 600",
            ])
            .arg(&started),
    );

    // Nobody holds, then node-b does: run waits, starting nothing.
    blocking(|| etcd.put(leader, "node-b"));
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert!(!started.exists(), "the command started before node-a held");
    assert!(!env_file.exists(), "role files before node-a held");
    assert!(
        run.try_wait().expect("wait").is_none(),
        "run gave up waiting"
    );

    // node-a takes over: the fence is raised to its token before the
    // command starts, and the command gets the signed token.
    blocking(|| etcd.delete(leader));
    let a = blocking(|| etcd.put(leader, "node-a"));
    support::wait_for_file(&started).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let token = std::fs::read_to_string(&started).expect("the command's token");
    assert_eq!(token.trim(), election_signed(a));
    assert_eq!(proxy.max_token(BUCKET).await, Some(a));
    let role = support::role_env(&env_file);
    assert_eq!(role["FENCING_TOKEN"], election_signed(a));
    let c = sdk_client(
        &proxy.url,
        (&role["AWS_ACCESS_KEY_ID"], &role["AWS_SECRET_ACCESS_KEY"]),
    );
    writes(&c, backend, ("wal/1", b"from the role"), a).await;

    // The election moves on: run stops the command and exits 4, the role
    // files gone first.
    blocking(|| etcd.delete(leader));
    let (stderr, done) = support::collect_stderr(&mut run);
    let status = blocking(|| support::exits_within(&mut run, std::time::Duration::from_secs(20)));
    let _ = done.join();
    assert_eq!(status.code(), Some(4), "{}", stderr.lock());
    assert!(!env_file.exists(), "the role files outlived the role");
}

/// The proxy watches the election itself: each new term raises the fence
/// to its token at once, with no sidecar and before the holder writes, so
/// the old leader's write in flight is cut and its later writes are stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_fences_each_new_term_itself_and_cuts_the_old_leaders_write() {
    let leader = "/service/watch/leader";
    let setup = Setup::start(&format!("etcd_key = \"{leader}\"")).await;
    let (etcd, backend, proxy) = (&setup.etcd, &setup.backend, &setup.proxy);
    let a = blocking(|| etcd.put(leader, "node-a"));
    proxy.wait_for_max(BUCKET, a).await;

    // node-a's upload is under way when it loses the key.
    let upload = proxy
        .stalled_put((BUCKET, "base.tar"), &a.to_string())
        .await;
    blocking(|| etcd.delete(leader));
    let b = blocking(|| etcd.put(leader, "node-b"));
    // node-b has written nothing; the proxy raised the fence on its own.
    proxy.wait_for_max(BUCKET, b).await;
    let _ = upload.rest.send(());
    let code = upload.answer.await.expect("joined");
    assert!(
        matches!(code, 409 | 503 | 0),
        "the old leader's upload got {code}"
    );
    assert_eq!(stored(backend, BUCKET, "base.tar").await, None);
    stale(proxy, "wal/1", a, b).await;
    admitted(proxy, "wal/1", &b.to_string()).await;
}

/// `etcdctl lock NAME -- CMD` (etcd's own lock recipe, the real client)
/// tells CMD its key under `NAME/` as `ETCD_LOCK_KEY`; `fencegate election
/// token --prefix NAME/ --identity "$ETCD_LOCK_KEY"` prints the term's
/// token, the key's create_revision. (Not `ETCD_LOCK_REV`: that is the
/// revision at which that etcdctl saw the lock acquired, which etcd does not
/// keep, so no proxy can check it.) A holder paused past its session's TTL
/// loses the lock to the one waiting; the proxy fences the new term itself,
/// and the old holder's token is stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_holders_write_with_their_keys_create_revision() {
    let setup = Setup::start("etcd_prefix = \"/locks/nightly/\"").await;
    let (etcd, proxy) = (&setup.etcd, &setup.proxy);
    let dir = support::tempdir();
    let holder = |name: &str| {
        let rev_file = dir.path().join(name);
        let child = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &etcd.endpoints(), "lock", "--ttl", "2"])
            .args(["/locks/nightly", "--", "sh", "-c"])
            .arg(
                "\"$1\" election token --endpoints \"$2\" --prefix /locks/nightly/ \
                 --identity \"$ETCD_LOCK_KEY\" > \"$0.new\" && mv \"$0.new\" \"$0\"; exec sleep 600",
            )
            .arg(&rev_file)
            .arg(env!("CARGO_BIN_EXE_fencegate"))
            .arg(etcd.endpoints())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .expect("etcdctl runs (scripts/install-test-tools.sh installs Debian's etcd-client)");
        (support::KillOnDrop(child), rev_file)
    };
    let revision_in = |file: &std::path::Path| -> u64 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            if let Some(rev) = std::fs::read_to_string(file)
                .ok()
                .and_then(|t| t.trim().parse().ok())
            {
                return rev;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{} never held the lock",
                file.display()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    let (a, a_rev) = holder("a");
    let rev_a = blocking(|| revision_in(&a_rev));
    proxy.wait_for_max(BUCKET, rev_a).await;
    admitted(proxy, "nightly/1", &rev_a.to_string()).await;

    // B waits in line; A's etcdctl pauses past its TTL, its key expires,
    // and B's command starts with its own revision.
    let (_b, b_rev) = holder("b");
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(!b_rev.exists(), "B's command started while A held the lock");
    a.signal(nix::sys::signal::Signal::SIGSTOP);
    let rev_b = blocking(|| revision_in(&b_rev));
    assert!(
        rev_b > rev_a,
        "B's revision {rev_b} is not above A's {rev_a}"
    );
    proxy.wait_for_max(BUCKET, rev_b).await;
    stale(proxy, "nightly/2", rev_a, rev_b).await;
    admitted(proxy, "nightly/2", &rev_b.to_string()).await;
    assert_eq!(
        stored_token(&setup.backend, BUCKET, "nightly/2").await,
        Some(rev_b)
    );
}

/// An operator compacts etcd past where the proxy's watch started: the
/// watch is refused, the proxy reads the election again and watches from
/// there, and the next term is fenced as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_follows_the_election_through_a_compaction() {
    let leader = "/service/compacted/leader";
    let setup = Setup::start(&format!("etcd_key = \"{leader}\"")).await;
    let (etcd, proxy) = (&setup.etcd, &setup.proxy);
    let a = blocking(|| etcd.put(leader, "node-a"));
    proxy.wait_for_max(BUCKET, a).await;
    blocking(|| {
        for i in 0..20 {
            etcd.put(&format!("/unrelated/{i}"), "x");
        }
        etcd.compact();
    });
    // The proxy's watch is opened again from the revision it last read,
    // now compacted, within its 2 s patience.
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    blocking(|| etcd.delete(leader));
    let b = blocking(|| etcd.put(leader, "node-b"));
    proxy.wait_for_max(BUCKET, b).await;
    stale(proxy, "wal/1", a, b).await;
}
