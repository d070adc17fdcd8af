//! The deployment files checked against the real binary, without Docker and
//! without a network:
//!
//! - every `config/*.toml` passes `--check` of the subcommand that reads it
//!   (secrets from the environment), shows every option the binary accepts,
//!   holds no secret, and stays valid with its commented-out options enabled;
//! - `docker-compose.yml` runs commands, flags, config files and environment
//!   the binary accepts, publishes the ports the services listen on, keeps
//!   MinIO unpublished, and health-checks endpoints that answer;
//! - the `Dockerfile` builds with the pinned toolchain, runs `fencegate` as a
//!   non-root user and ships every config file compose refers to.

mod support;

use serde_yaml::Value as Yaml;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use support::{SIGNING_KEY, Service, fencegate, succeeds, tempdir, write_file};

/// The secrets the example configs leave to the environment.
const SECRETS: [(&str, &str); 4] = [
    ("FENCEGATE_SIGNING_KEYS", SIGNING_KEY),
    ("FENCEGATE_BACKEND_ACCESS_KEY", "backend-key"),
    ("FENCEGATE_BACKEND_SECRET_KEY", "backend-secret-123"),
    ("FENCEGATE_CLIENT_KEYS", "client-key:client-secret-123"),
];

/// Where the image copies `config/` (see the Dockerfile).
const IMAGE_CONFIG_DIR: &str = "/etc/fencegate/";

// ---------------------------------------------------------------------------
// Running the binary

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn read_repo(rel: &str) -> String {
    read(&repo().join(rel))
}

/// `fencegate` without any `FENCEGATE_*` variable of whoever runs the tests.
/// (`fencegate()` already removes them.)
fn clean_fencegate() -> Command {
    let mut cmd = fencegate();
    cmd.env("FENCEGATE_LOG", "warn");
    cmd
}

/// `fencegate SERVICE --check --config FILE`.
fn check_cmd(service: &str, config: &Path) -> Command {
    let mut cmd = clean_fencegate();
    cmd.arg(service).arg("--check").arg("--config").arg(config);
    cmd
}

fn output(cmd: &mut Command) -> Output {
    cmd.output().expect("fencegate runs")
}

fn describe(cmd: &Command, out: &Output) -> String {
    format!(
        "{cmd:?}\nexit: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The environment of replica `name` (`svc` in a compose file) after
/// checking that it runs `fencegate <command>` (`locksvc` or `proxy`),
/// that its command and environment pass `--check`, and that the
/// variable that puts it on etcd lists exactly the members' `client_urls`.
fn valid_replica(
    name: &str,
    svc: &Yaml,
    command: &str,
    client_urls: &[String],
) -> BTreeMap<String, String> {
    let endpoints_var = match command {
        "locksvc" => "FENCEGATE_ETCD_ENDPOINTS",
        _ => "FENCEGATE_CLUSTER_ENDPOINTS",
    };
    let args = command_in_repo(name, svc);
    assert_eq!(args[0], command);
    let env = environment(svc);
    let mut cmd = clean_fencegate();
    cmd.args(&args).arg("--check").envs(&env);
    expect_valid(cmd);
    let endpoints: Vec<&str> = env
        .get(endpoints_var)
        .map(|e| e.split(',').collect())
        .unwrap_or_else(|| panic!("{name} is not on etcd (no {endpoints_var})"));
    assert_eq!(endpoints, client_urls, "{name}'s etcd endpoints");
    env
}

fn expect_valid(mut cmd: Command) {
    let out = output(&mut cmd);
    assert!(
        out.status.success()
            && String::from_utf8_lossy(&out.stdout).contains("configuration is valid"),
        "expected a valid configuration:\n{}",
        describe(&cmd, &out)
    );
}

/// Asserts `--check` fails (exit 1); returns stderr.
fn expect_invalid(mut cmd: Command) -> String {
    let out = output(&mut cmd);
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected the configuration to be refused:\n{}",
        describe(&cmd, &out)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

// ---------------------------------------------------------------------------
// config/*.toml

fn config_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("config"))
        .expect("config/ exists")
        .map(|e| e.expect("readable config/").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    for expected in [
        "locksvc.toml",
        "proxy-minio.toml",
        "proxy-aws.toml",
        "dev.toml",
    ] {
        assert!(
            files.iter().any(|f| f.ends_with(expected)),
            "config/{expected} is missing: {files:?}"
        );
    }
    files
}

/// The subcommand that reads a config file.
fn service_of(file: &Path) -> &'static str {
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    match name {
        "locksvc.toml" => "locksvc",
        "dev.toml" => "dev",
        n if n.starts_with("proxy") => "proxy",
        n => panic!("config/{n}: which `fencegate` subcommand reads it? Map it in service_of"),
    }
}

fn is_key(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// `name` if `line` is a `[name]` or `[[name]]` table header.
fn table_header(line: &str) -> Option<&str> {
    let inner = line
        .strip_prefix("[[")
        .and_then(|r| r.strip_suffix("]]"))
        .or_else(|| line.strip_prefix('[').and_then(|r| r.strip_suffix(']')))?;
    is_key(inner).then_some(inner)
}

/// Whether `line` (with its `# ` removed) is TOML: `key = value` or a header.
fn is_toml_line(line: &str) -> bool {
    table_header(line.trim()).is_some() || line.split_once(" = ").is_some_and(|(k, _)| is_key(k))
}

/// The keys an example config shows, set or commented out (`# key = ...`),
/// by section: "" for the top level, then one per `[name]`/`[[name]]` header
/// (commented out or not).
fn documented_keys(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut keys: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut section = String::new();
    for line in text.lines() {
        let line = line.strip_prefix("# ").unwrap_or(line).trim();
        if let Some(name) = table_header(line) {
            section = name.to_owned();
            keys.entry(section.clone()).or_default();
        } else if let Some((k, _)) = line.split_once(" = ")
            && is_key(k)
        {
            keys.entry(section.clone()).or_default().push(k.to_owned());
        }
    }
    keys
}

/// The options a config section accepts, as the binary reports them
/// (serde's "unknown field `x`, expected one of `a`, `b`, ...").
fn accepted_fields(service: &str, header: Option<&str>) -> Vec<String> {
    let dir = tempdir();
    let probe = "zz_not_an_option";
    let text = match header {
        Some(h) => format!("{h}\n{probe} = 1\n"),
        None => format!("{probe} = 1\n"),
    };
    let mut cmd = check_cmd(service, &write_file(dir.path(), "probe.toml", &text));
    cmd.envs(SECRETS);
    let err = expect_invalid(cmd);
    let marker = format!("unknown field `{probe}`");
    let rest = err
        .split(marker.as_str())
        .nth(1)
        .unwrap_or_else(|| panic!("no {marker:?} in:\n{err}"));
    let fields: Vec<String> = rest
        .lines()
        .next()
        .unwrap_or_default()
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    assert!(!fields.is_empty(), "no expected fields listed in:\n{err}");
    fields
}

/// Config keys whose values are secrets (or go with one).
fn find_secrets(value: &toml::Value, path: &str, found: &mut Vec<String>) {
    match value {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                let secret = matches!(
                    k.as_str(),
                    "signing_keys" | "api_keys" | "access_key" | "secret_key" | "clients"
                );
                let empty = match v {
                    toml::Value::String(s) => s.is_empty(),
                    toml::Value::Array(a) => a.is_empty(),
                    _ => false,
                };
                if secret && !empty {
                    found.push(p);
                } else {
                    find_secrets(v, &p, found);
                }
            }
        }
        toml::Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                find_secrets(v, &format!("{path}[{i}]"), found);
            }
        }
        _ => {}
    }
}

#[test]
fn every_example_config_passes_check_with_secrets_from_the_environment() {
    for file in config_files() {
        let mut cmd = check_cmd(service_of(&file), &file);
        cmd.envs(SECRETS);
        expect_valid(cmd);
    }
}

#[test]
fn example_configs_hold_no_secrets() {
    for file in config_files() {
        let table: toml::Table = toml::from_str(&read(&file))
            .unwrap_or_else(|e| panic!("{} is not TOML: {e}", file.display()));
        let mut found = Vec::new();
        find_secrets(&toml::Value::Table(table), "", &mut found);
        assert!(
            found.is_empty(),
            "{}: secrets belong in the environment, not in the file: {found:?}",
            file.display()
        );
    }
    // Without the environment, the service configs are incomplete, and say
    // which variable to set.
    let cases = [
        ("locksvc", "locksvc.toml", "FENCEGATE_SIGNING_KEYS"),
        ("proxy", "proxy-minio.toml", "FENCEGATE_BACKEND_ACCESS_KEY"),
        ("proxy", "proxy-aws.toml", "FENCEGATE_BACKEND_ACCESS_KEY"),
    ];
    for (service, file, variable) in cases {
        let err = expect_invalid(check_cmd(service, &repo().join("config").join(file)));
        assert!(
            err.contains(variable),
            "config/{file}: {variable} not named in:\n{err}"
        );
    }
}

#[test]
fn example_configs_show_every_option() {
    for file in config_files() {
        let service = service_of(&file);
        let keys = documented_keys(&read(&file));
        let mut missing = Vec::new();
        for field in accepted_fields(service, None) {
            let shown =
                keys.get("").is_some_and(|k| k.contains(&field)) || keys.contains_key(&field);
            if !shown {
                missing.push(field);
            }
        }
        let sections: &[(&str, &str)] = match service {
            "proxy" => &[
                ("[backend]", "backend"),
                ("[[scopes]]", "scopes"),
                ("[[clients]]", "clients"),
                ("[[viewers]]", "viewers"),
                ("[cluster]", "cluster"),
                ("[[elections]]", "elections"),
            ],
            "locksvc" => &[("[[api_keys]]", "api_keys"), ("[etcd]", "etcd")],
            _ => &[],
        };
        for &(header, section) in sections {
            for field in accepted_fields(service, Some(header)) {
                if !keys.get(section).is_some_and(|k| k.contains(&field)) {
                    missing.push(format!("{section}.{field}"));
                }
            }
        }
        assert!(
            missing.is_empty(),
            "{}: options neither set nor shown commented out (`# name = default`): {missing:?}",
            file.display()
        );
    }
}

#[test]
fn commented_out_options_are_real_and_valid_when_enabled() {
    let dir = tempdir();
    for file in config_files() {
        let text = read(&file);
        let enabled: Vec<&str> = text
            .lines()
            .map(|line| match line.strip_prefix("# ") {
                Some(rest) if is_toml_line(rest) => rest,
                _ => line,
            })
            .collect();
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .expect("UTF-8 file name");
        let enabled = write_file(dir.path(), name, enabled.join("\n"));
        let mut cmd = check_cmd(service_of(&file), &enabled);
        cmd.envs(SECRETS);
        expect_valid(cmd);
    }
}

#[test]
fn a_typo_in_any_example_config_is_refused() {
    let dir = tempdir();
    for file in config_files() {
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .expect("UTF-8 file name");
        let text = format!("listne = \"127.0.0.1:1\"\n{}", read(&file));
        let mut cmd = check_cmd(service_of(&file), &write_file(dir.path(), name, &text));
        cmd.envs(SECRETS);
        let err = expect_invalid(cmd);
        assert!(
            err.contains("unknown field `listne`"),
            "config/{name}:\n{err}"
        );
    }
    // Command-line overrides are validated too.
    let mut cmd = check_cmd("proxy", &repo().join("config/proxy-minio.toml"));
    cmd.envs(SECRETS).args(["--backend", "minio:9000"]);
    let err = expect_invalid(cmd);
    fencegate_testkit::assert_mentions(&err, &["must start with http:// or https://"]);
}

#[test]
fn check_lists_every_problem_at_once() {
    let bad = "[backend]\nendpoint = \"\"\n\n[[scopes]]\nbucket = \"b\"\nlock = \"no spaces\"\n";
    let dir = tempdir();
    let proxy = write_file(dir.path(), "proxy.toml", bad);
    let mut cmd = check_cmd("proxy", &proxy);
    cmd.envs(SECRETS).env("FENCEGATE_SIGNING_KEYS", "short");
    let err = expect_invalid(cmd);
    fencegate_testkit::assert_mentions(
        &err,
        &[
            "backend.endpoint is empty",
            "signing_keys[0] is 5 bytes",
            "scopes[0].lock",
        ],
    );

    let locksvc = write_file(
        dir.path(),
        "locksvc.toml",
        "min_ttl = \"10m\"\nmax_ttl = \"1m\"\nmax_body_bytes = 10\nmax_waiters_per_lock = 0\n",
    );
    let mut cmd = check_cmd("locksvc", &locksvc);
    cmd.env("FENCEGATE_SIGNING_KEYS", "short");
    let err = expect_invalid(cmd);
    fencegate_testkit::assert_mentions(
        &err,
        &[
            "signing_keys[0] is 5 bytes",
            "min_ttl (10m) is above max_ttl (1m)",
            "default_ttl",
            "max_body_bytes",
            "max_waiters_per_lock",
        ],
    );
}

// ---------------------------------------------------------------------------
// docker-compose.yml

fn compose() -> Yaml {
    serde_yaml::from_str(&read_repo("docker-compose.yml"))
        .unwrap_or_else(|e| panic!("docker-compose.yml is not valid YAML: {e}"))
}

fn service<'a>(doc: &'a Yaml, name: &str) -> &'a Yaml {
    let svc = &doc["services"][name];
    assert!(
        svc.is_mapping(),
        "docker-compose.yml has no service {name:?}"
    );
    svc
}

fn scalar(v: &Yaml) -> String {
    match v {
        Yaml::String(s) => s.clone(),
        Yaml::Number(n) => n.to_string(),
        Yaml::Bool(b) => b.to_string(),
        Yaml::Null => String::new(),
        other => panic!("expected a scalar, found {other:?}"),
    }
}

/// A command-like value: a list, or a string split on whitespace (each
/// element split too, so `CMD-SHELL` strings become words).
fn words(v: &Yaml) -> Vec<String> {
    let parts: Vec<String> = match v {
        Yaml::Sequence(s) => s.iter().map(scalar).collect(),
        Yaml::Null => Vec::new(),
        other => vec![scalar(other)],
    };
    parts
        .iter()
        .flat_map(|p| p.split_whitespace())
        .map(|w| w.trim_matches(|c: char| c == '"' || c == '\'').to_owned())
        .collect()
}

/// Compose interpolation with nothing set in the environment: `${VAR:-x}`
/// and `${VAR-x}` give `x`, `${VAR}` and `$VAR` give "", `$$` gives `$`.
fn interpolate(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(r) = after.strip_prefix('$') {
            out.push('$');
            rest = r;
        } else if let Some(r) = after.strip_prefix('{') {
            let end = r
                .find('}')
                .unwrap_or_else(|| panic!("unclosed ${{ in {s:?}"));
            let expr = &r[..end];
            match expr.split_once(":-").or_else(|| expr.split_once('-')) {
                Some((_, default)) => out.push_str(default),
                None => assert!(
                    !expr.contains('?'),
                    "{s:?} needs a variable set; give it a default so `docker compose up` works as is"
                ),
            }
            rest = &r[end + 1..];
        } else {
            let len = after
                .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
                .unwrap_or(after.len());
            rest = &after[len..];
        }
    }
    out.push_str(rest);
    out
}

/// A service's environment, interpolated.
fn environment(svc: &Yaml) -> BTreeMap<String, String> {
    match &svc["environment"] {
        Yaml::Mapping(m) => m
            .iter()
            .map(|(k, v)| (scalar(k), interpolate(&scalar(v))))
            .collect(),
        Yaml::Sequence(s) => s
            .iter()
            .map(|e| {
                let entry = scalar(e);
                let (k, v) = entry.split_once('=').unwrap_or((entry.as_str(), ""));
                (k.to_owned(), interpolate(v))
            })
            .collect(),
        Yaml::Null => BTreeMap::new(),
        other => panic!("unexpected environment {other:?}"),
    }
}

/// The files under /etc/fencegate/ a service's command names.
fn image_config_refs(args: &[String]) -> Vec<String> {
    args.iter()
        .filter_map(|a| {
            a.split_once(IMAGE_CONFIG_DIR)
                .map(|(_, rest)| rest.to_owned())
        })
        .collect()
}

/// A service's command with /etc/fencegate/X (the image's copy of config/)
/// mapped to config/X in this repository.
fn command_in_repo(name: &str, svc: &Yaml) -> Vec<String> {
    let args = words(&svc["command"]);
    assert!(!args.is_empty(), "compose service {name} has no command");
    for file in image_config_refs(&args) {
        assert!(
            repo().join("config").join(&file).is_file(),
            "compose service {name} uses {IMAGE_CONFIG_DIR}{file}, but config/{file} does not exist"
        );
    }
    let config_dir = format!("{}/", repo().join("config").display());
    args.iter()
        .map(|a| a.replace(IMAGE_CONFIG_DIR, &config_dir))
        .collect()
}

/// The value of `--flag VALUE` or `--flag=VALUE`.
fn flag_value(args: &[String], flag: &str) -> Option<String> {
    let prefix = format!("{flag}=");
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| {
            args.iter()
                .find_map(|a| a.strip_prefix(&prefix).map(str::to_owned))
        })
}

fn listen_addr(name: &str, svc: &Yaml) -> SocketAddr {
    let args = words(&svc["command"]);
    let value = flag_value(&args, "--listen")
        .unwrap_or_else(|| panic!("compose service {name} must pass --listen: {args:?}"));
    value
        .parse::<SocketAddr>()
        .unwrap_or_else(|e| panic!("{name}: --listen {value}: {e}"))
}

/// (host ip, host port, container port) of each published port.
fn published(name: &str, svc: &Yaml) -> Vec<(String, String, u16)> {
    let entries = match &svc["ports"] {
        Yaml::Sequence(s) => s.clone(),
        Yaml::Null => Vec::new(),
        other => panic!("{name}: unexpected ports {other:?}"),
    };
    entries
        .iter()
        .map(|p| {
            let (ip, host, container) = if p.is_mapping() {
                (
                    scalar(&p["host_ip"]),
                    scalar(&p["published"]),
                    scalar(&p["target"]),
                )
            } else {
                // [[ip:]host:]container[/protocol]
                let spec = scalar(p);
                let spec = spec.split('/').next().unwrap_or_default().to_owned();
                let (front, container) = spec.rsplit_once(':').unwrap_or(("", spec.as_str()));
                let (ip, host) = front.rsplit_once(':').unwrap_or(("", front));
                (ip.to_owned(), host.to_owned(), container.to_owned())
            };
            let container: u16 = container
                .parse()
                .unwrap_or_else(|e| panic!("{name}: container port {container:?}: {e}"));
            (ip, host, container)
        })
        .collect()
}

/// The URLs a health check passes to `fencegate health`.
fn health_urls(words: &[String]) -> Vec<String> {
    words
        .windows(3)
        .filter(|w| (w[0] == "fencegate" || w[0].ends_with("/fencegate")) && w[1] == "health")
        .map(|w| w[2].clone())
        .collect()
}

/// (host, port, path) of an http:// URL.
fn split_url(url: &str) -> (String, u16, String) {
    let rest = url
        .strip_prefix("http://")
        .unwrap_or_else(|| panic!("health URL {url} must be plain http"));
    let (authority, path) = match rest.split_once('/') {
        Some((a, p)) => (a, format!("/{p}")),
        None => (rest, "/".to_owned()),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse::<u16>()
                .unwrap_or_else(|e| panic!("port of {url}: {e}")),
        ),
        None => (authority, 80),
    };
    (host.to_owned(), port, path)
}

fn depends_on_condition(svc: &Yaml, on: &str) -> String {
    scalar(&svc["depends_on"][on]["condition"])
}

/// The config file a compose service passes with --config, in this repository.
fn config_in_repo(name: &str, svc: &Yaml) -> toml::Table {
    let args = command_in_repo(name, svc);
    let path = flag_value(&args, "--config")
        .unwrap_or_else(|| panic!("compose service {name} passes no --config"));
    toml::from_str(&read(Path::new(&path))).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn compose_services_pass_check_with_their_command_config_and_environment() {
    let doc = compose();
    for name in ["locksvc", "proxy"] {
        let svc = service(&doc, name);
        assert!(
            svc["build"].is_string() || svc["build"].is_mapping(),
            "compose service {name} must be built from this repository's Dockerfile"
        );
        assert!(
            svc["entrypoint"].is_null(),
            "compose service {name} must keep the image's ENTRYPOINT (fencegate)"
        );
        let args = command_in_repo(name, svc);
        assert_eq!(
            args[0], name,
            "compose service {name} runs `fencegate {}`",
            args[0]
        );
        let mut cmd = clean_fencegate();
        cmd.args(args).arg("--check").envs(environment(svc));
        expect_valid(cmd);
    }
}

#[test]
fn compose_publishes_what_the_services_listen_on_and_wires_them_together() {
    let doc = compose();
    for (name, health_path) in [("locksvc", "/health"), ("proxy", "/_fencegate/health")] {
        let svc = service(&doc, name);
        let listen = listen_addr(name, svc);
        assert!(
            listen.ip().is_unspecified(),
            "{name} listens on {listen}: in a container only 0.0.0.0 is reachable through a published port"
        );
        let ports = published(name, svc);
        assert!(
            ports.iter().any(|(_, _, c)| *c == listen.port()),
            "{name} listens on port {} but publishes {ports:?}",
            listen.port()
        );
        for (ip, host, container) in &ports {
            assert_eq!(
                *container,
                listen.port(),
                "{name} publishes port {container}, where nothing listens"
            );
            assert_eq!(
                ip, "127.0.0.1",
                "{name} publishes {host}:{container} beyond the host's loopback"
            );
        }
        let test = &svc["healthcheck"]["test"];
        let urls = health_urls(&words(test));
        assert_eq!(
            urls.len(),
            1,
            "{name}'s healthcheck must run `fencegate health URL`: {test:?}"
        );
        let (host, port, path) = split_url(&urls[0]);
        assert!(
            host == "127.0.0.1" || host == "localhost",
            "{name}'s healthcheck runs inside the container: use 127.0.0.1, not {host}"
        );
        assert_eq!(port, listen.port(), "{name}'s healthcheck port");
        assert_eq!(path, health_path, "{name}'s health endpoint");
    }

    let locksvc_env = environment(service(&doc, "locksvc"));
    let proxy = service(&doc, "proxy");
    let proxy_env = environment(proxy);
    let key = |env: &BTreeMap<String, String>, who: &str| {
        env.get("FENCEGATE_SIGNING_KEYS")
            .cloned()
            .unwrap_or_else(|| panic!("{who} gets no FENCEGATE_SIGNING_KEYS"))
    };
    assert_eq!(
        key(&locksvc_env, "locksvc"),
        key(&proxy_env, "proxy"),
        "the proxy must verify tokens with the keys the lease service signs them with"
    );

    // MinIO is reachable only through the proxy.
    let minio = service(&doc, "minio");
    let minio_ports = published("minio", minio);
    assert!(
        minio_ports.iter().all(|(_, _, c)| *c != 9000),
        "MinIO's S3 port must not be published (writes must go through the proxy): {minio_ports:?}"
    );
    assert_ne!(
        minio["network_mode"].as_str(),
        Some("host"),
        "MinIO must not share the host's network"
    );

    // The proxy's backend is that MinIO, with its credentials.
    let minio_env = environment(minio);
    for (proxy_var, minio_var) in [
        ("FENCEGATE_BACKEND_ACCESS_KEY", "MINIO_ROOT_USER"),
        ("FENCEGATE_BACKEND_SECRET_KEY", "MINIO_ROOT_PASSWORD"),
    ] {
        assert!(
            minio_env.contains_key(minio_var),
            "minio gets no {minio_var}"
        );
        assert_eq!(
            proxy_env.get(proxy_var),
            minio_env.get(minio_var),
            "proxy {proxy_var} vs minio {minio_var}"
        );
    }
    let proxy_config = config_in_repo("proxy", proxy);
    let endpoint = proxy_env
        .get("FENCEGATE_BACKEND_ENDPOINT")
        .cloned()
        .unwrap_or_else(|| {
            proxy_config
                .get("backend")
                .and_then(|b| b.get("endpoint"))
                .and_then(toml::Value::as_str)
                .unwrap_or_default()
                .to_owned()
        });
    let (backend_host, backend_port, _) = split_url(&endpoint);
    assert_eq!(
        (backend_host.as_str(), backend_port),
        ("minio", 9000),
        "the proxy's backend {endpoint} must be the minio service (`server /data` listens on 9000)"
    );

    // It asks that file's lease service who holds a token.
    let locksvc_url = proxy_env
        .get("FENCEGATE_LOCKSVC_URL")
        .cloned()
        .or_else(|| {
            proxy_config
                .get("locksvc_url")
                .and_then(toml::Value::as_str)
                .map(str::to_owned)
        })
        .expect("the proxy names its lease service (locksvc_url)");
    let port = listen_addr("locksvc", service(&doc, "locksvc")).port();
    assert_eq!(locksvc_url, format!("http://locksvc:{port}"));

    // The proxy starts once its bucket exists (its start-up probe needs it)
    // and the lease service is up.
    assert_eq!(
        depends_on_condition(proxy, "createbucket"),
        "service_completed_successfully"
    );
    assert_eq!(depends_on_condition(proxy, "locksvc"), "service_healthy");
    assert_eq!(
        depends_on_condition(service(&doc, "createbucket"), "minio"),
        "service_healthy"
    );
    if let Some(bucket) = proxy_config
        .get("probe_bucket")
        .and_then(toml::Value::as_str)
    {
        let create = words(&service(&doc, "createbucket")["command"]).join(" ");
        assert!(
            create.contains(&format!("/{bucket}")),
            "the proxy probes bucket {bucket:?} at start-up but createbucket does not create it: {create}"
        );
    }
}

#[test]
fn health_checks_of_compose_and_dockerfile_hit_real_endpoints() {
    let dir = tempdir();
    let locksvc = support::start_locksvc(dir.path());
    // No probe bucket and no scopes: the proxy starts without its backend.
    let mut proxy_cmd = clean_fencegate();
    proxy_cmd
        .args([
            "proxy",
            "--create-db",
            "--listen",
            "127.0.0.1:0",
            "--backend",
            "http://127.0.0.1:9",
        ])
        .arg("--db")
        .arg(dir.path().join("proxy.db"))
        .envs(SECRETS);
    let proxy = Service::start(proxy_cmd);

    let doc = compose();
    let mut live: BTreeMap<u16, &Service> = BTreeMap::new();
    let mut checks = Vec::new();
    for (name, running) in [("locksvc", &locksvc), ("proxy", &proxy)] {
        let svc = service(&doc, name);
        live.insert(listen_addr(name, svc).port(), running);
        for url in health_urls(&words(&svc["healthcheck"]["test"])) {
            let (_, _, path) = split_url(&url);
            checks.push((
                format!("compose {name}: {url}"),
                format!("{}{path}", running.url),
            ));
        }
    }
    let healthcheck = dockerfile_stages()
        .last()
        .and_then(|s| s.first("HEALTHCHECK"))
        .expect("the Dockerfile has a HEALTHCHECK");
    for url in health_urls(&split_words(&healthcheck)) {
        let (_, port, path) = split_url(&url);
        let running = live
            .get(&port)
            .unwrap_or_else(|| panic!("the Dockerfile HEALTHCHECK checks port {port}, where neither compose service listens"));
        checks.push((
            format!("Dockerfile: {url}"),
            format!("{}{path}", running.url),
        ));
    }
    assert!(checks.len() >= 3, "{checks:?}");
    for (what, url) in checks {
        let mut cmd = clean_fencegate();
        cmd.arg("health").arg(url);
        let out = output(&mut cmd);
        assert!(out.status.success(), "{what}:\n{}", describe(&cmd, &out));
    }
    // And a wrong path would have been caught.
    let mut cmd = clean_fencegate();
    cmd.arg("health").arg(format!("{}/health", proxy.url));
    let out = output(&mut cmd);
    assert!(!out.status.success(), "{}", describe(&cmd, &out));
}

// ---------------------------------------------------------------------------
// Dockerfile and .dockerignore

#[derive(Debug)]
struct Stage {
    /// Arguments of FROM ("" for instructions before the first FROM).
    from: String,
    /// (INSTRUCTION, arguments), continuations joined, comments dropped.
    instructions: Vec<(String, String)>,
}

impl Stage {
    fn all(&self, op: &str) -> impl Iterator<Item = &str> {
        self.instructions
            .iter()
            .filter(move |(o, _)| o == op)
            .map(|(_, a)| a.as_str())
    }

    fn first(&self, op: &str) -> Option<String> {
        self.all(op).next().map(str::to_owned)
    }

    fn last(&self, op: &str) -> Option<String> {
        self.all(op).last().map(str::to_owned)
    }

    /// The base image (FROM without --platform and AS).
    fn image(&self) -> &str {
        self.from
            .split_whitespace()
            .find(|w| !w.starts_with("--"))
            .unwrap_or_default()
    }

    /// (--from value, sources, destination) of each COPY/ADD.
    fn copies(&self) -> Vec<(Option<String>, Vec<String>, String)> {
        self.instructions
            .iter()
            .filter(|(o, _)| o == "COPY" || o == "ADD")
            .map(|(_, args)| {
                let mut from = None;
                let mut paths: Vec<String> = Vec::new();
                for w in args.split_whitespace() {
                    if let Some(f) = w.strip_prefix("--from=") {
                        from = Some(f.to_owned());
                    } else if !w.starts_with("--") {
                        paths.push(w.to_owned());
                    }
                }
                if paths.first().is_some_and(|p| p.starts_with('[')) {
                    let json = paths.join(" ");
                    paths =
                        serde_json::from_str(&json).unwrap_or_else(|e| panic!("COPY {json}: {e}"));
                }
                let dest = paths.pop().unwrap_or_default();
                (from, paths, dest)
            })
            .collect()
    }
}

fn dockerfile_stages() -> Vec<Stage> {
    let text = read_repo("Dockerfile");
    let mut stages = vec![Stage {
        from: String::new(),
        instructions: Vec::new(),
    }];
    let mut current = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') {
            continue;
        }
        if let Some(body) = t.strip_suffix('\\') {
            current.push_str(body);
            current.push(' ');
            continue;
        }
        current.push_str(t);
        let instruction = std::mem::take(&mut current);
        let instruction = instruction.trim();
        if instruction.is_empty() {
            continue;
        }
        let (op, args) = instruction
            .split_once(char::is_whitespace)
            .unwrap_or((instruction, ""));
        let (op, args) = (op.to_ascii_uppercase(), args.trim().to_owned());
        if op == "FROM" {
            stages.push(Stage {
                from: args,
                instructions: Vec::new(),
            });
        } else if let Some(stage) = stages.last_mut() {
            stage.instructions.push((op, args));
        }
    }
    assert!(
        stages.len() >= 3,
        "the Dockerfile must be multi-stage: {stages:?}"
    );
    stages
}

fn split_words(s: &str) -> Vec<String> {
    s.split_whitespace()
        .map(|w| w.trim_matches(|c: char| c == '"' || c == '\'').to_owned())
        .collect()
}

#[test]
fn dockerfile_builds_with_the_pinned_toolchain_and_runs_fencegate_unprivileged() {
    let stages = dockerfile_stages();

    // The builder: the toolchain of rust-toolchain.toml, the locked deps.
    let builder = stages
        .iter()
        .find(|s| s.all("RUN").any(|r| r.contains("cargo build")))
        .expect("a stage runs cargo build");
    let build = builder
        .all("RUN")
        .find(|r| r.contains("cargo build"))
        .unwrap_or_default();
    // Cargo loads every workspace member's manifest, even to build one bin.
    let manifest: toml::Value = toml::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
            .expect("Cargo.toml"),
    )
    .expect("Cargo.toml parses");
    let copies: Vec<String> = builder.all("COPY").map(str::to_owned).collect();
    for member in manifest["workspace"]["members"]
        .as_array()
        .expect("members")
    {
        let member = member.as_str().expect("member path");
        if member == "." {
            continue;
        }
        assert!(
            copies
                .iter()
                .any(|c| c.split_whitespace().next() == Some(member)),
            "the builder stage does not COPY workspace member {member}: {copies:?}"
        );
    }
    for flag in ["--release", "--locked", "--bin fencegate"] {
        assert!(build.contains(flag), "cargo build without {flag}: {build}");
    }
    let image = builder.image();
    let tag = image
        .strip_prefix("rust:")
        .unwrap_or_else(|| panic!("the builder should be an official rust image, not {image}"));
    let version: Vec<&str> = tag
        .split('-')
        .next()
        .unwrap_or_default()
        .split('.')
        .collect();
    let toolchain: toml::Table =
        toml::from_str(&read_repo("rust-toolchain.toml")).expect("rust-toolchain.toml parses");
    let channel = toolchain
        .get("toolchain")
        .and_then(|t| t.get("channel"))
        .and_then(toml::Value::as_str)
        .expect("rust-toolchain.toml names a channel");
    let pinned: Vec<&str> = channel.split('.').collect();
    assert!(
        version.len() >= 2 && pinned.starts_with(&version),
        "builder image {image} does not match the pinned toolchain {channel}"
    );
    assert!(
        builder.copies().iter().any(|(from, src, _)| from.is_none()
            && src.iter().any(|s| s == "rust-toolchain.toml" || s == ".")),
        "the builder must get rust-toolchain.toml (so cargo uses the pinned toolchain)"
    );

    // The runtime image.
    let runtime = stages.last().expect("a final stage");
    assert!(
        !runtime.image().starts_with("rust:"),
        "the runtime image should be slim, not {}",
        runtime.image()
    );
    let user = runtime.last("USER").expect("the image sets a USER");
    let user_name = user.split(':').next().unwrap_or_default();
    assert!(
        user_name != "root" && user_name != "0" && !user_name.is_empty(),
        "USER {user} is root"
    );
    let healthcheck = runtime
        .first("HEALTHCHECK")
        .expect("the image has a HEALTHCHECK");
    assert!(
        !health_urls(&split_words(&healthcheck)).is_empty(),
        "the HEALTHCHECK must use `fencegate health URL` (there is no curl in the image): {healthcheck}"
    );
    let entrypoint = runtime
        .last("ENTRYPOINT")
        .expect("the image sets an ENTRYPOINT");
    let entrypoint: Vec<String> = serde_json::from_str(&entrypoint).unwrap_or_else(|e| {
        panic!("ENTRYPOINT must use the exec form, so signals reach fencegate: {entrypoint}: {e}")
    });
    assert!(
        entrypoint
            .first()
            .is_some_and(|e| e == "fencegate" || e.ends_with("/fencegate")),
        "ENTRYPOINT {entrypoint:?}"
    );
    let exposed: Vec<String> = runtime
        .all("EXPOSE")
        .flat_map(str::split_whitespace)
        .map(|p| p.split('/').next().unwrap_or_default().to_owned())
        .collect();
    for port in ["7070", "9000"] {
        assert!(
            exposed.iter().any(|p| p == port),
            "EXPOSE lacks {port}: {exposed:?}"
        );
    }
    let copies = runtime.copies();
    assert!(
        copies.iter().any(|(from, _, dest)| from.is_some()
            && (dest == "/usr/local/bin/fencegate" || dest == "/usr/local/bin/")),
        "the binary must land in /usr/local/bin/fencegate: {copies:?}"
    );

    // Every config file compose refers to is in the image.
    let doc = compose();
    let dir = IMAGE_CONFIG_DIR.trim_end_matches('/');
    for name in ["locksvc", "proxy"] {
        for file in image_config_refs(&words(&service(&doc, name)["command"])) {
            let copied = copies.iter().any(|(from, sources, dest)| {
                from.is_none()
                    && sources.iter().any(|s| {
                        let s = s.trim_start_matches("./").trim_end_matches('/');
                        (s == "config" && dest.trim_end_matches('/') == dir)
                            || (s == format!("config/{file}")
                                && (dest.as_str() == format!("{dir}/{file}")
                                    || dest.as_str() == format!("{dir}/")))
                    })
            });
            assert!(
                copied,
                "compose service {name} uses {dir}/{file}, which the Dockerfile does not COPY: {copies:?}"
            );
        }
    }
}

#[test]
fn dockerignore_keeps_local_state_out_and_what_the_build_copies_in() {
    let text = read_repo(".dockerignore");
    let patterns: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('!'))
        .map(|l| l.trim_start_matches('/').trim_end_matches('/'))
        .collect();
    for local in ["target", ".git", ".venv"] {
        assert!(
            patterns.contains(&local),
            ".dockerignore should exclude {local}/: {patterns:?}"
        );
    }
    for stage in dockerfile_stages() {
        for (from, sources, _) in stage.copies() {
            if from.is_some() {
                continue;
            }
            for src in sources {
                let s = src.trim_start_matches("./").trim_end_matches('/');
                for p in &patterns {
                    assert!(
                        s != *p && !s.starts_with(&format!("{p}/")),
                        ".dockerignore pattern {p:?} hides {src}, which the Dockerfile copies"
                    );
                }
            }
        }
    }
}

#[test]
fn compose_scrapes_both_services_and_grafana_shows_the_dashboard() {
    let doc = compose();
    // Prometheus scrapes each service where it listens, on its metrics path.
    let prom = service(&doc, "prometheus");
    assert!(
        scalar(&prom["image"]).starts_with("prom/prometheus:v"),
        "the official image, a pinned version"
    );
    let mounts: Vec<String> = words(&prom["volumes"]);
    assert!(
        mounts.contains(&"./config/prometheus.yml:/etc/prometheus/prometheus.yml:ro".to_owned()),
        "{mounts:?}"
    );
    assert!(
        words(&prom["command"])
            .contains(&"--config.file=/etc/prometheus/prometheus.yml".to_owned())
    );
    let config: Yaml = serde_yaml::from_str(&read_repo("config/prometheus.yml"))
        .unwrap_or_else(|e| panic!("config/prometheus.yml is not YAML: {e}"));
    let jobs = config["scrape_configs"]
        .as_sequence()
        .expect("scrape_configs");
    for (name, path) in [("proxy", "/_fencegate/metrics"), ("locksvc", "/metrics")] {
        let port = listen_addr(name, service(&doc, name)).port();
        let target = format!("{name}:{port}");
        let job = jobs
            .iter()
            .find(|j| {
                j["static_configs"]
                    .as_sequence()
                    .into_iter()
                    .flatten()
                    .any(|c| words(&c["targets"]).contains(&target))
            })
            .unwrap_or_else(|| panic!("Prometheus does not scrape {target}"));
        assert_eq!(scalar(&job["metrics_path"]), path, "{name}'s metrics path");
    }
    for (ip, _, _) in published("prometheus", prom) {
        assert_eq!(ip, "127.0.0.1", "Prometheus is published on loopback only");
    }
    // Grafana: provisioning and dashboards from config/grafana, the data
    // source the dashboard names, and no default open door.
    let grafana = service(&doc, "grafana");
    assert!(scalar(&grafana["image"]).starts_with("grafana/grafana:1"));
    for (ip, _, _) in published("grafana", grafana) {
        assert_eq!(ip, "127.0.0.1", "Grafana is published on loopback only");
    }
    let env = environment(grafana);
    assert_eq!(
        env.get("GF_AUTH_ANONYMOUS_ENABLED").map(String::as_str),
        Some("false")
    );
    let volumes = words(&grafana["volumes"]);
    let mounted = |dir: &str| {
        volumes
            .iter()
            .find_map(|v| {
                v.strip_prefix("./")
                    .and_then(|v| v.split_once(':'))
                    .filter(|(_, c)| c.starts_with(dir))
                    .map(|(h, _)| h.to_owned())
            })
            .unwrap_or_else(|| panic!("grafana mounts nothing at {dir}: {volumes:?}"))
    };
    let provisioning = mounted("/etc/grafana/provisioning");
    let dashboards = mounted("/var/lib/grafana/dashboards");
    let datasources: Yaml = serde_yaml::from_str(&read_repo(&format!(
        "{provisioning}/datasources/prometheus.yml"
    )))
    .expect("datasource YAML");
    let source = &datasources["datasources"][0];
    assert_eq!(scalar(&source["url"]), "http://prometheus:9090");
    let providers: Yaml = serde_yaml::from_str(&read_repo(&format!(
        "{provisioning}/dashboards/fencegate.yml"
    )))
    .expect("dashboard provider YAML");
    assert_eq!(
        scalar(&providers["providers"][0]["options"]["path"]),
        "/var/lib/grafana/dashboards"
    );
    let dashboard: serde_json::Value =
        serde_json::from_str(&read_repo(&format!("{dashboards}/fencegate.json")))
            .expect("the dashboard is JSON");
    let home = env
        .get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
        .expect("a home dashboard");
    assert_eq!(home, "/var/lib/grafana/dashboards/fencegate.json");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "{} panels", panels.len());
    for p in panels.iter().filter(|p| p["type"] != "row") {
        assert_eq!(
            p["datasource"]["uid"].as_str(),
            Some(scalar(&source["uid"]).as_str()),
            "panel {:?} names another data source",
            p["title"]
        );
        assert!(
            p["targets"].as_array().is_some_and(|t| !t.is_empty()),
            "panel {:?} plots nothing",
            p["title"]
        );
    }
    // Which series exist is checked against the running services in
    // tests/status_page.rs.
}

// ---------------------------------------------------------------------------
// docker-compose.ha.yml

fn compose_ha() -> Yaml {
    serde_yaml::from_str(&read_repo("docker-compose.ha.yml"))
        .unwrap_or_else(|e| panic!("docker-compose.ha.yml is not valid YAML: {e}"))
}

/// `--name=value` or `--name value` of an etcd command.
fn etcd_flag(args: &[String], name: &str) -> String {
    flag_value(args, name).unwrap_or_else(|| panic!("etcd command without {name}: {args:?}"))
}

#[test]
fn ha_compose_runs_three_etcd_members_two_lease_replicas_and_two_proxy_replicas_behind_nginx() {
    let doc = compose_ha();
    let etcd_names = ["etcd1", "etcd2", "etcd3"];
    // The members: consistent names and URLs, one cluster, flags that the
    // etcd binary knows (Debian's 3.4 here; the image runs 3.5, whose
    // flags for this are the same).
    let help = Command::new("/usr/bin/etcd")
        .arg("--help")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
        })
        .expect("etcd --help runs (scripts/install-test-tools.sh installs etcd-server)");
    let mut clusters = Vec::new();
    let mut client_urls = Vec::new();
    for name in etcd_names {
        let svc = service(&doc, name);
        let args = words(&svc["command"]);
        for a in args.iter().filter(|a| a.starts_with("--")) {
            let flag = a.split('=').next().unwrap_or(a);
            assert!(help.contains(flag), "{name}: etcd has no flag {flag}");
        }
        assert_eq!(etcd_flag(&args, "--name"), name);
        let peer = etcd_flag(&args, "--initial-advertise-peer-urls");
        assert_eq!(peer, format!("http://{name}:2380"), "{name}'s peer URL");
        let client = etcd_flag(&args, "--advertise-client-urls");
        assert_eq!(client, format!("http://{name}:2379"), "{name}'s client URL");
        let cluster = etcd_flag(&args, "--initial-cluster");
        assert!(
            cluster.split(',').any(|m| m == format!("{name}={peer}")),
            "{name} is not in its own --initial-cluster {cluster}"
        );
        clusters.push(cluster);
        client_urls.push(client);
        assert!(
            published(name, svc).is_empty(),
            "{name} publishes etcd's ports: only the lease service may write its keys"
        );
        assert!(
            !words(&svc["volumes"]).is_empty(),
            "{name} keeps the token counter: it needs a volume"
        );
    }
    assert!(
        clusters.windows(2).all(|w| w[0] == w[1]),
        "the members disagree on --initial-cluster: {clusters:?}"
    );
    assert_eq!(clusters[0].split(',').count(), 3, "{}", clusters[0]);

    // The replicas: valid with their command and environment, on every
    // member, started after them, on distinct loopback ports.
    let mut ports = Vec::new();
    let proxy_env = environment(service(&doc, "proxy1"));
    for name in ["locksvc1", "locksvc2"] {
        let svc = service(&doc, name);
        let env = valid_replica(name, svc, "locksvc", &client_urls);
        assert_eq!(
            env.get("FENCEGATE_SIGNING_KEYS"),
            proxy_env.get("FENCEGATE_SIGNING_KEYS"),
            "{name} must sign with the keys the proxy verifies with"
        );
        for member in etcd_names {
            assert_eq!(depends_on_condition(svc, member), "service_healthy");
        }
        let listen = listen_addr(name, svc);
        for (ip, host, container) in published(name, svc) {
            assert_eq!(ip, "127.0.0.1", "{name} publishes beyond loopback");
            assert_eq!(container, listen.port());
            ports.push(host);
        }
    }
    ports.sort();
    ports.dedup();
    assert_eq!(
        ports.len(),
        2,
        "the replicas need a host port each: {ports:?}"
    );

    // The rest is the single-host file's: MinIO unpublished.
    let minio = service(&doc, "minio");
    assert!(published("minio", minio).iter().all(|(_, _, c)| *c != 9000));

    // The proxy replicas: valid with their environment, sharing the etcd
    // members, each with its own id, verifying what the lease service
    // signs, reached only through the load balancer.
    let locksvc_keys = environment(service(&doc, "locksvc1"))
        .get("FENCEGATE_SIGNING_KEYS")
        .cloned();
    let mut ids = Vec::new();
    let mut upstreams = Vec::new();
    for name in ["proxy1", "proxy2"] {
        let svc = service(&doc, name);
        let env = valid_replica(name, svc, "proxy", &client_urls);
        ids.push(env.get("FENCEGATE_REPLICA_ID").cloned().unwrap_or_default());
        // It asks the lease service through both of its replicas (the
        // file's services, on the ports they listen on), so one replica's
        // death leaves its owner questions answered.
        let urls = env
            .get("FENCEGATE_LOCKSVC_URL")
            .cloned()
            .or_else(|| {
                config_in_repo(name, svc)
                    .get("locksvc_url")
                    .and_then(|v| v.as_str())
                    .map(str::to_owned)
            })
            .unwrap_or_else(|| panic!("{name} has no lease service (locksvc_url)"));
        let urls: Vec<String> = urls.split(',').map(|u| u.trim().to_owned()).collect();
        let replicas: Vec<String> = ["locksvc1", "locksvc2"]
            .iter()
            .map(|r| {
                let port = listen_addr(r, service(&doc, r)).port();
                format!("http://{r}:{port}")
            })
            .collect();
        assert_eq!(urls, replicas, "{name}'s lease service URLs");
        assert_eq!(
            env.get("FENCEGATE_SIGNING_KEYS").cloned(),
            locksvc_keys,
            "{name}'s keys"
        );
        for member in etcd_names {
            assert_eq!(depends_on_condition(svc, member), "service_healthy");
        }
        assert!(
            published(name, svc).is_empty(),
            "{name} is reached through the load balancer only"
        );
        upstreams.push(format!("{name}:{}", listen_addr(name, svc).port()));
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 2, "the replicas need distinct ids: {ids:?}");

    // The load balancer: publishes the S3 port on loopback, its config is
    // the repository's, lists exactly the replicas, streams bodies, and
    // nginx accepts it.
    let lb = service(&doc, "loadbalancer");
    let ports = published("loadbalancer", lb);
    assert_eq!(ports.len(), 1, "{ports:?}");
    assert_eq!(ports[0].0, "127.0.0.1");
    let mount = words(&lb["volumes"])
        .into_iter()
        .find(|v| v.ends_with(":/etc/nginx/nginx.conf:ro"))
        .expect("the load balancer mounts its nginx.conf");
    let conf_path = mount
        .split(':')
        .next()
        .expect("source")
        .trim_start_matches("./");
    let conf = read_repo(conf_path);
    let servers: Vec<String> = conf
        .lines()
        .filter_map(|l| l.trim().strip_prefix("server "))
        .filter(|l| l.ends_with(';'))
        .filter_map(|l| l.split_whitespace().next())
        .map(|s| s.trim_end_matches(';').to_owned())
        .collect();
    assert_eq!(servers, upstreams, "the upstream servers are the replicas");
    fencegate_testkit::assert_mentions(
        &conf,
        &[
            "proxy_request_buffering off;",
            "client_max_body_size 0;",
            "proxy_set_header Host $http_host;",
        ],
    );
    let dir = tempdir();
    let mut local = conf.clone();
    for u in &upstreams {
        local = local.replace(u.as_str(), "127.0.0.1:9");
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let local = local.replace("listen 9000;", &format!("listen 127.0.0.1:{port};"));
    let file = write_file(dir.path(), "nginx.conf", &local);
    let mut cmd = Command::new("nginx");
    cmd.arg("-t")
        .arg("-p")
        .arg(dir.path())
        .arg("-e")
        .arg(dir.path().join("error.log"))
        .arg("-c")
        .arg(&file)
        .arg("-g")
        .arg(format!("pid {};", dir.path().join("nginx.pid").display()));
    succeeds(
        &mut cmd,
        &format!("nginx -t on {conf_path} (scripts/install-test-tools.sh installs nginx-light)"),
    );
}
