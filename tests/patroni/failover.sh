#!/usr/bin/env bash
# End-to-end: a Patroni cluster's pgBackRest repository fenced by Patroni's
# own leader key, with no lease service. See README.md beside this file.
#
#   tests/patroni/failover.sh FENCEGATE_BINARY WORKDIR ETCD_ENDPOINTS
#
# ETCD_ENDPOINTS: the client URLs of a running etcd cluster, comma
# separated (tests/patroni.rs starts three members). Runs as root (Patroni
# and PostgreSQL run as the Debian `postgres` user), binds 127.0.0.1 only,
# leaves nothing running, exits 0 only if every assertion held. Needs
# patroni, postgresql-15, pgbackrest, openssl, curl, python3 and boto3.
set -Eeuo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/pgbackrest/common.sh
. "$HERE/../pgbackrest/common.sh" 3 "FENCEGATE_BINARY WORKDIR ETCD_ENDPOINTS" "$@"
ETCD=$3
ETCD_FIRST=${ETCD%%,*}
LOCK=pg-backups
SCOPE=main
LEADER_KEY=/service/$SCOPE/leader

[ "$(id -u)" -eq 0 ] || fail "run as root: Patroni and PostgreSQL are started as the postgres user"
command -v patroni >/dev/null || fail "patroni missing: apt-get install -y patroni"
require_tools

# ---------------------------------------------------------------- helpers
is_replica() { [ "$(psql_on "$1" 'SELECT pg_is_in_recovery()' 2>/dev/null)" = t ]; }
is_primary() { [ "$(psql_on "$1" 'SELECT pg_is_in_recovery()' 2>/dev/null)" = f ]; }
orders_on() { psql_on "$1" 'SELECT count(*) FROM orders' 2>/dev/null; }
has_orders() { [ "$(orders_on "$1")" = "$2" ]; }

# Patroni's leader key as etcd holds it: "NAME MOD_REVISION", or "none 0".
leader() {
  "$PY" - "$ETCD_FIRST" "$LEADER_KEY" <<'PYEOF'
import base64, json, sys, urllib.request
url, key = sys.argv[1], sys.argv[2]
body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
r = json.load(urllib.request.urlopen(urllib.request.Request(url + "/v3/kv/range", data=body), timeout=5))
kvs = r.get("kvs") or []
print(f'{base64.b64decode(kvs[0]["value"]).decode()} {kvs[0]["mod_revision"]}' if kvs else "none 0")
PYEOF
}
leader_is() { [ "$(leader | cut -d' ' -f1)" = "$1" ]; }


# One Patroni member. The cluster's settings (bootstrap.dcs) are written by
# the member that bootstraps; archive_command is each member's own (its
# conf.d), so it is a local parameter.
patroni_yml() { # patroni_yml SIDE PG_PORT API_PORT
  local hosts
  hosts=$(echo "$ETCD" | sed 's|https\?://||g')
  cat <<EOF
scope: $SCOPE
namespace: /service/
name: node-$1
restapi:
  listen: 127.0.0.1:$3
  connect_address: 127.0.0.1:$3
etcd3:
  hosts: $hosts
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 2
    retry_timeout: 4
    maximum_lag_on_failover: 1073741824
    postgresql:
      use_pg_rewind: true
      parameters:
        wal_log_hints: "on"
        archive_mode: "on"
        wal_level: replica
        max_wal_senders: 5
  initdb:
    - encoding: UTF8
    - locale: C
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:$2
  connect_address: 127.0.0.1:$2
  data_dir: $PGW/$1
  bin_dir: $PGBIN
  pgpass: $PGW/pgpass-$1
  authentication:
    superuser: {username: postgres, password: unused-trust}
    replication: {username: postgres, password: unused-trust}
    rewind: {username: postgres, password: unused-trust}
  parameters:
    unix_socket_directories: $PGW/sock-$1
    shared_buffers: 32MB
    archive_command: pgbackrest --config=$PGW/pgbackrest.conf --config-include-path=$PGW/conf.d-$1 --stanza=main archive-push %p
  remove_data_directory_on_rewind_failure: true
  remove_data_directory_on_diverged_timelines: true
EOF
}

start_patroni() { # start_patroni SIDE; PATRONI_<SIDE> is its PID
  "${AS_PG[@]}" patroni "$PGW/patroni-$1.yml" >>"$LOGS/patroni-$1.log" 2>&1 &
  PIDS+=($!)
  eval "PATRONI_${1^^}=$!"
}

# The node's fencegate sidecar: no command, so it keeps the node's
# pgBackRest credentials for every term the node holds Patroni's leader
# key, raising the fence at the proxy as each term begins.
start_sidecar() { # start_sidecar SIDE; SIDECAR_<SIDE> is its PID
  "${AS_PG[@]}" FENCEGATE_LOG=info "$FG" election run --endpoints "$ETCD" --key "$LEADER_KEY" \
    --identity "node-$1" --lock "$LOCK" --signing-key-file "$PGW/election.key" \
    --pgbackrest-file "$PGW/conf.d-$1/creds.conf" \
    --s3-endpoint "$PROXY" --proxy-ca-file "$WORK/tls/ca.crt" \
    >>"$LOGS/sidecar-$1.log" 2>&1 &
  PIDS+=($!)
  eval "SIDECAR_${1^^}=$!"
}

# Every new or changed object since snap OLD carries TOKEN (nothing of
# another term landed), none gone unless allowed.
only_token_since() { # only_token_since OLD NEW TOKEN WHAT [--allow-gone]
  s3check snap "$2" >/dev/null
  s3check compare "$1" "$2" "$3" ${5:-} >"$LOGS/compare-$(basename "$2" .json).log" ||
    fail "$4: objects without token $3: $(grep BAD "$LOGS/compare-$(basename "$2" .json).log")"
}

# ---------------------------------------------------------------- 1. services
step "1. S3 backend and the TLS proxy, its lock following Patroni's leader key"
prepare_work
make_tls
start_backend
mkdir -p "$PGW"
# The election's key: the proxy's [[elections]] table and each node's
# sidecar share it (the nodes' postgres user only).
openssl rand -hex 32 >"$PGW/election.key"
chmod 0600 "$PGW/election.key"
chown postgres:postgres "$PGW/election.key"
endpoints_toml=$(echo "$ETCD" | sed 's/[^,]*/"&"/g; s/,/, /g')
cat >"$WORK/svc/proxy.toml" <<EOF
listen = "127.0.0.1:0"
db = "$WORK/svc/proxy.db"

[[scopes]]
bucket = "$BUCKET"
lock = "$LOCK"

[[elections]]
lock = "$LOCK"
etcd_key = "$LEADER_KEY"
endpoints = [$endpoints_toml]
signing_keys = ["$(cat "$PGW/election.key")"]
EOF
proxy_tls_and_backend >>"$WORK/svc/proxy.toml"
start_proxy
note "fencing proxy $PROXY: bucket $BUCKET, lock $LOCK following $LEADER_KEY on $ETCD"

# ---------------------------------------------------------------- 2. cluster
step "2. Patroni: node-a bootstraps and leads, node-b replicates; sidecars on both"
two_sides archive-timeout=20
patroni_yml a "$PORT_A" "$(free_port)" >"$PGW/patroni-a.yml"
patroni_yml b "$PORT_B" "$(free_port)" >"$PGW/patroni-b.yml"
chown -R postgres:postgres "$PGW"
chmod 0700 "$PGW"
[ "$(leader)" = "none 0" ] || fail "etcd already has a leader key at $LEADER_KEY: $(leader); the test needs a fresh etcd"

start_sidecar a
start_sidecar b
start_patroni a
wait_until 60 "node-a to take Patroni's leader key" leader_is node-a
wait_until 60 "PostgreSQL on node-a" pg_ready a
start_patroni b
wait_until 90 "node-b to replicate from node-a" is_replica b
wait_until 30 "node-a's sidecar to keep its credentials" test -s "$PGW/conf.d-a/creds.conf"
TOKEN_A=$(token_of a)
[ "$TOKEN_A" = "$(leader | cut -d' ' -f2)" ] ||
  fail "node-a's token $TOKEN_A is not its leader key's revision ($(leader))"
[ "$(proxy_max "$LOCK")" = "$TOKEN_A" ] || fail "the proxy's max is $(proxy_max "$LOCK"), not node-a's $TOKEN_A"
[ ! -e "$PGW/conf.d-b/creds.conf" ] || fail "node-b, a replica, has credentials"
grep -q 'fence raised' "$LOGS/sidecar-a.log" || fail "node-a's sidecar did not raise the fence"
note "node-a leads with token $TOKEN_A (its leader key's revision); the fence is at $TOKEN_A; node-b is a replica"

first_backup a "$TOKEN_A" node-a
note "stanza-create, check and a full backup on node-a: the repo's objects carry token $TOKEN_A"

# ---------------------------------------------------------------- 3. freeze
step "3. failover 1: node-a frozen past Patroni's TTL (SIGSTOP: a paused VM)"
psql_on a "CREATE TABLE orders AS SELECT g AS id, md5(g::text) AS note FROM generate_series(1, 50000) g"
psql_on a "SELECT pg_switch_wal()" >/dev/null
wait_until 60 "node-a to archive its WAL" sh -c "! ls '$PGW/a/pg_wal/archive_status' | grep -q '\.ready\$'"
wait_until 30 "node-b to replay node-a's orders" has_orders b 50000
PM_A=$(head -n 1 "$PGW/a/postmaster.pid")
FROZEN_A=$(tree "$PATRONI_A" "$SIDECAR_A" "$PM_A" | tr '\n' ' ')
kill -STOP $FROZEN_A 2>/dev/null || true
FROZE_AT=$(date +%s)
wait_until 60 "node-b to take the leader key" leader_is node-b
wait_until 60 "node-b to be promoted" is_primary b
wait_until 60 "node-b's sidecar to keep its credentials" test -s "$PGW/conf.d-b/creds.conf"
TOKEN_B=$(token_of b)
[ "$TOKEN_B" -gt "$TOKEN_A" ] || fail "node-b's token $TOKEN_B is not above node-a's $TOKEN_A"
[ "$TOKEN_B" = "$(leader | cut -d' ' -f2)" ] || fail "node-b's token $TOKEN_B is not the leader key's revision ($(leader))"
[ "$(proxy_max "$LOCK")" = "$TOKEN_B" ] || fail "the proxy's max is $(proxy_max "$LOCK"), not node-b's $TOKEN_B"
note "node-b took the leader key $(($(date +%s) - FROZE_AT))s after node-a froze; token $TOKEN_B; fence raised before node-b wrote"
s3check snap "$WORK/snap-b.json" >/dev/null

# ---------------------------------------------------------------- 4. stale
step "4. node-a's PostgreSQL wakes as a primary: its archive-push and backup are refused"
# Only PostgreSQL wakes: its Patroni and sidecar stay frozen, so its
# credentials file is still there and nothing demotes it. Only the proxy
# stands in the way.
for p in $(tree "$PM_A"); do kill -CONT "$p" 2>/dev/null || true; done
wait_until 30 "PostgreSQL on node-a to answer" pg_ready a
is_primary a || fail "node-a is not a primary any more"
test -s "$PGW/conf.d-a/creds.conf" || fail "node-a's credentials file is gone"
psql_on a "INSERT INTO orders SELECT g, 'after the failover' FROM generate_series(50001, 60000) g"
psql_on a "SELECT pg_switch_wal()" >/dev/null
SEG=$(ls "$PGW/a/pg_wal/archive_status" | sed -n 's/\.ready$//p' | grep -E '^[0-9A-F]{24}$' | head -n 1 || true)
[ -n "$SEG" ] || fail "node-a has no WAL segment waiting to be archived"
if pgbr a archive-push "$PGW/a/pg_wal/$SEG" >"$LOGS/a-archive-push-stale.log" 2>&1; then
  fail "archive-push of $SEG by the deposed node-a passed"
fi
grep -q '<Code>FencingTokenStale</Code>' "$LOGS/a-archive-push-stale.log" ||
  fail "node-a's archive-push failed, but not as stale (409): $(refusal_in "$LOGS/a-archive-push-stale.log")"
note "node-a's archive-push of $SEG: $(refusal_in "$LOGS/a-archive-push-stale.log")"
# (Without --archive-check=n the backup would wait for the WAL its start
# needs, which node-a cannot archive: it would fail on the fence too, but
# on a timeout, before sending anything itself.)
if pgbr a backup --type=full --archive-check=n >"$LOGS/a-backup-stale.log" 2>&1; then
  fail "a backup by the deposed node-a passed"
fi
grep -q '<Code>FencingTokenStale</Code>' "$LOGS/a-backup-stale.log" ||
  fail "node-a's backup failed, but not as stale (409): $(grep -m1 ERROR "$LOGS/a-backup-stale.log")"
note "node-a's backup: $(refusal_in "$LOGS/a-backup-stale.log")"
only_token_since "$WORK/snap-b.json" "$WORK/snap-a-stale.json" "$TOKEN_B" "after node-b took the key"
note "nothing of node-a's landed after node-b took the key"

# node-a's node is gone for good: Patroni and sidecar killed, PostgreSQL stopped.
kill -KILL "$PATRONI_A" "$SIDECAR_A" 2>/dev/null || true
kill -QUIT "$PM_A" 2>/dev/null || true
wait_until 30 "PostgreSQL on node-a to stop" sh -c "! kill -0 $PM_A"

# ---------------------------------------------------------------- 5. node-b
step "5. node-b: check, backup, info clean; node-a rejoins as a replica"
pgbr b check >"$LOGS/b-check.log" 2>&1 || fail "check on node-b failed"
pgbr b backup >"$LOGS/b-backup.log" 2>&1 || fail "backup on node-b failed"
pgbr b info >"$LOGS/b-info.log" 2>&1 || fail "info on node-b failed"
grep -q 'status: ok' "$LOGS/b-info.log" || fail "info on node-b does not say status: ok"
only_token_since "$WORK/snap-b.json" "$WORK/snap-b-done.json" "$TOKEN_B" "node-b's own work" --allow-gone
note "node-b's check, backup and info are clean; everything since its take carries $TOKEN_B"
start_sidecar a
start_patroni a
wait_until 120 "node-a to rejoin as a replica (pg_rewind)" is_replica a
note "node-a rejoined as node-b's replica"

# ---------------------------------------------------------------- 6. switchover
step "6. failover 2: patronictl switchover to node-a"
cp "$PGW/conf.d-b/creds.conf" "$WORK/b-creds-before-switchover.conf"
"${AS_PG[@]}" patronictl -c "$PGW/patroni-b.yml" switchover --leader node-b --candidate node-a --force "$SCOPE" \
  >"$LOGS/switchover.log" 2>&1 || fail "patronictl switchover failed: $(tail -n 3 "$LOGS/switchover.log")"
wait_until 60 "node-a to take the leader key" leader_is node-a
wait_until 60 "node-a's sidecar to keep its new credentials" \
  sh -c "[ -s '$PGW/conf.d-a/creds.conf' ] && [ \"\$(sed -n 's/.*(token \([0-9]*\)).*/\1/p' '$PGW/conf.d-a/creds.conf')\" -gt $TOKEN_B ]"
TOKEN_A2=$(token_of a)
[ "$TOKEN_A2" = "$(leader | cut -d' ' -f2)" ] || fail "node-a's token $TOKEN_A2 is not the leader key's revision ($(leader))"
wait_until 30 "node-b's sidecar to remove its credentials" sh -c "[ ! -e '$PGW/conf.d-b/creds.conf' ]"
[ "$(proxy_max "$LOCK")" = "$TOKEN_A2" ] || fail "the proxy's max is $(proxy_max "$LOCK"), not node-a's $TOKEN_A2"
note "node-a leads again with token $TOKEN_A2; node-b's sidecar removed its credentials"
# From here on, nothing of node-b's may land. (Until node-a's key existed,
# node-b was the primary: it archives its last segment as it steps down.)
s3check snap "$WORK/snap-switched.json" >/dev/null
# node-b's credentials from before the switchover, used anyway (a process
# that read them before they were removed): a write is refused as stale.
"$PY" - "$PROXY" "$WORK/tls/ca.crt" "$WORK/b-creds-before-switchover.conf" "$BUCKET" \
  >"$LOGS/b-stale-put.log" 2>&1 <<'PYEOF' || fail "node-b's old credentials: $(cat "$LOGS/b-stale-put.log")"
import sys, boto3, botocore.config, botocore.exceptions
proxy, ca, creds, bucket = sys.argv[1:]
conf = dict(l.strip().split("=", 1) for l in open(creds) if "=" in l and not l.startswith("#"))
s3 = boto3.client("s3", endpoint_url=proxy, verify=ca, region_name="us-east-1",
                  aws_access_key_id=conf["repo1-s3-key"], aws_secret_access_key=conf["repo1-s3-key-secret"],
                  config=botocore.config.Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
try:
    s3.put_object(Bucket=bucket, Key="repo/archive/main/stale-by-node-b", Body=b"late")
    sys.exit("node-b's old credentials wrote after the switchover")
except botocore.exceptions.ClientError as e:
    status, code = e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"]["Code"]
    print(status, code, e.response["Error"].get("Message", ""))
    sys.exit(0 if (status, code) == (409, "FencingTokenStale") else 1)
PYEOF
note "node-b's old credentials after the switchover: $(cat "$LOGS/b-stale-put.log")"
pgbr a check >"$LOGS/a-check-2.log" 2>&1 || fail "check on node-a after the switchover failed"
pgbr a backup >"$LOGS/a-backup-2.log" 2>&1 || fail "backup on node-a after the switchover failed"
pgbr a info >"$LOGS/a-info.log" 2>&1 || fail "info on node-a failed"
grep -q 'status: ok' "$LOGS/a-info.log" || fail "info on node-a does not say status: ok"
only_token_since "$WORK/snap-switched.json" "$WORK/snap-after-switch.json" "$TOKEN_A2" "after the switchover" --allow-gone
[ "$(psql_on a 'SELECT count(*) FROM orders')" = 50000 ] || fail "node-a does not have the 50000 orders"
refused=$(sed 's/\x1b\[[0-9;]*m//g' "$LOGS/proxy.log" | grep -c 'fence refused a write kind="stale"' || true)
note "node-a's check, backup and info are clean; the proxy refused $refused stale writes in all"

step "PASS in $(($(date +%s) - STARTED))s"
