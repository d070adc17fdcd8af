# Shared by the end-to-end PostgreSQL tests (failover.sh here, and
# tests/patroni/failover.sh), sourced as
#
#   . common.sh N "FENCEGATE_BINARY WORKDIR ..." "$@"
#
# (N: how many arguments the script takes; the first two are always the
# binary under test and an empty work directory). Sets STARTED, FG_GIVEN,
# WORK, PGW, LOGS, PGBIN, BUCKET and the backend's keys. Every process
# started is recorded for cleanup; every wait is bounded.

want=$1 usage=$2
shift 2
if [ $# -ne "$want" ]; then
  echo "usage: $0 $usage" >&2
  exit 2
fi
STARTED=$(date +%s)
FG_GIVEN=$(realpath "$1")
WORK=$(realpath -m "$2")
PGW=$WORK/pg          # everything the postgres user owns
LOGS=$WORK/logs       # service and holder output (root)
PGBIN=/usr/lib/postgresql/15/bin
BUCKET=pgbackrest
# The unfenced backend: `fencegate dev`'s embedded s3s-fs, with the keys its
# banner prints. Only the proxy under test and the scripts' checks use it.
BACKEND_KEY=fencegate-backend
BACKEND_SECRET=fencegate-backend-secret

step() { printf '\n=== [%3ds] %s\n' "$(($(date +%s) - STARTED))" "$*"; }
note() { printf '    %s\n' "$*"; }

# What went wrong, and the logs that explain it.
context() {
  local f
  for f in "$LOGS"/*.log "$PGW"/log-*/*.log; do
    [ -s "$f" ] || continue
    echo "----- last lines of $f" >&2
    tail -n 25 "$f" >&2
  done
}
fail() {
  echo >&2
  echo "FAIL: $*" >&2
  # In a $(...) subshell, the main shell's ERR trap shows the logs.
  [ "$BASHPID" = "$$" ] && context
  exit 1
}
trap 'rc=$?; [ "$BASHPID" = "$$" ] || exit "$rc"
      echo "FAIL: command failed (exit $rc) at line $LINENO: $BASH_COMMAND" >&2; context; exit 1' ERR

# ---------------------------------------------------------------- cleanup
# Every process this script starts is recorded here, by PID. Process groups
# are recorded by their leader's PID: PostgreSQL servers (fencegate run
# starts its command in a group of its own) and A's second backup (setsid),
# so that what they forked goes with them.
PIDS=()      # plain processes
PGROUPS=()   # PostgreSQL servers: the postmaster's group
JOBGROUPS=() # other process groups (not GROUPS: bash owns that name)
cleanup() {
  local p g alive
  trap - ERR
  set +e
  # Frozen processes only act on signals once continued.
  for g in "${PGROUPS[@]}" "${JOBGROUPS[@]}"; do kill -CONT -- "-$g" 2>/dev/null; done
  for p in "${PIDS[@]}"; do kill -CONT "$p" 2>/dev/null; done
  # PostgreSQL: immediate shutdown (SIGQUIT to the postmaster). The rest: SIGTERM.
  for g in "${PGROUPS[@]}"; do kill -QUIT "$g" 2>/dev/null; done
  for g in "${JOBGROUPS[@]}"; do kill -TERM -- "-$g" 2>/dev/null; done
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for _ in $(seq 50); do
    alive=0
    for g in "${PGROUPS[@]}" "${JOBGROUPS[@]}"; do kill -0 -- "-$g" 2>/dev/null && alive=1; done
    for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" -eq 0 ] && break
    sleep 0.1
  done
  for g in "${PGROUPS[@]}" "${JOBGROUPS[@]}"; do kill -KILL -- "-$g" 2>/dev/null; done
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  wait 2>/dev/null
}
trap cleanup EXIT
trap 'exit 143' TERM INT   # so that cleanup runs when we are stopped too

# ---------------------------------------------------------------- helpers
# As the postgres user, exec'ing in place (so $! is the process itself):
# PostgreSQL refuses to run as root, and the role's holder runs as the
# database user so that the credentials file it writes (mode 0600) is the
# database user's own.
AS_PG=(setpriv --reuid=postgres --regid=postgres --init-groups
  env HOME="$PGW" USER=postgres LOGNAME=postgres PATH="$PGBIN:/usr/bin:/bin")

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_until SECONDS WHAT COMMAND...: polls COMMAND every 0.1 s.
wait_until() {
  local secs=$1 what=$2; shift 2
  local deadline=$(($(date +%s) + secs))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "timed out after ${secs}s waiting for $what"
    sleep 0.1
  done
}

# The first stdout line of a service: "... listening on http(s)://ADDR ...".
listen_addr() {
  local out=$1 what=$2
  wait_until 30 "$what to announce its address" grep -q 'listening on' "$out"
  sed -n '1s|.*listening on https\?://\([0-9.:]*\).*|\1|p' "$out"
}

# Descendants of the given PIDs (for freezing a side whole).
tree() {
  ps -e -o pid=,ppid= | awk -v roots="$*" '
    BEGIN { n = split(roots, r, " "); for (i = 1; i <= n; i++) keep[r[i]] = 1 }
    { parent[$1] = $2 }
    END { do { grew = 0; for (p in parent) if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; grew = 1 } } while (grew)
          for (p in keep) print p }'
}

# Proof of fencing in an output: the proxy's refusal of a stale writer.
# (Stale lease-bound credentials get what a stale token gets: 409
# FencingTokenStale; the other fence refusals are 403 FencingToken*.)
fenced_in() { grep -Eq '<Code>FencingToken[A-Za-z]+</Code>' "$1"; }
# The proxy's refusal in pgBackRest's error report: "PUT path: 409 Code: message".
refusal_in() {
  awk '/^ *PUT /{put=$1" "$2} /failed with [0-9]+/{match($0, /failed with [0-9]+/); st=substr($0, RSTART+12, RLENGTH-12)}
       /<Code>FencingToken/{match($0, /<Code>[^<]*<\/Code><Message>[^<]*/); m=substr($0, RSTART, RLENGTH)
         gsub(/<Code>/, "", m); sub(/<\/Code><Message>/, ": ", m); print put ": " st " " m; exit}' "$1"
}

# Makes WORK reachable and usable by the postgres user, and copies the
# binary under test to $WORK/bin/fencegate (FG).
prepare_work() {
  # The postgres user must reach WORK: give search (not read) permission on
  # the directories above it (a test's temporary directory is often 0700).
  local d
  chmod 0755 "$WORK"
  d=$(dirname "$WORK")
  while [ "$d" != / ]; do
    "${AS_PG[@]}" test -x "$d" || chmod o+x "$d"
    d=$(dirname "$d")
  done
  cd "$WORK"   # a working directory the postgres user can enter, for its processes
  mkdir -p "$WORK/bin" "$WORK/tls" "$WORK/svc" "$LOGS"
  # Our own copy: the binary we were given may be rebuilt under us.
  cp "$FG_GIVEN" "$WORK/bin/fencegate"
  chmod 0755 "$WORK/bin" "$WORK/bin/fencegate"
  FG=$WORK/bin/fencegate
}

# A CA and a server certificate for the services (tls/ca.crt,
# tls/server.{crt,key}).
make_tls() {
  # pgBackRest 2.45 needs a DNS name in the SAN, even for an address:
  # DNS:127.0.0.1.
  (
    cd "$WORK/tls"
    openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=fencegate-test-ca \
      -keyout ca.key -out ca.crt 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout server.key -out server.csr 2>/dev/null
    printf '%s\n' 'subjectAltName=DNS:127.0.0.1,DNS:localhost,IP:127.0.0.1' \
      'basicConstraints=CA:FALSE' 'extendedKeyUsage=serverAuth' >server.ext
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 \
      -extfile server.ext -out server.crt 2>/dev/null
    chmod 0644 ca.crt server.crt
    chmod 0755 .
  )
}

# Starts the unfenced S3 backend (BACKEND), writes $WORK/s3check.py (what
# the backend holds, read directly) and creates BUCKET on the backend.
start_backend() {
  # The backend: only the embedded s3s-fs of `fencegate dev` is used (its own
  # lease service and proxy are ignored).
  "$FG" dev --data-dir "$WORK/svc/dev" --locksvc-listen 127.0.0.1:0 \
    --proxy-listen 127.0.0.1:0 --backend-listen 127.0.0.1:0 \
    >"$LOGS/dev.out" 2>"$LOGS/dev.log" &
  PIDS+=($!)
  wait_until 30 "fencegate dev's banner" grep -q 'backend http' "$LOGS/dev.out"
  BACKEND=$(sed -n '1s|.*backend \(http://[0-9.:]*\).*|\1|p' "$LOGS/dev.out")
  note "S3 backend $BACKEND (unfenced; checks only)"

  cat >"$WORK/s3check.py" <<'PYEOF'
# The repository as the backend stores it (bypassing the proxy).
#   snap OUT.json        every object's size, modification time (and ETag)
#   compare OLD NEW TOKEN [--allow-gone]
#                        objects new, changed (overwritten, even with the
#                        same bytes) or gone between two snaps; exit 1 if one
#                        new or changed does not carry fencing token TOKEN,
#                        or one is gone (unless allowed)
#   tokens PREFIX        "key token" for each object under PREFIX
import json, sys
import boto3, botocore.config
endpoint, cmd, args = sys.argv[1], sys.argv[2], sys.argv[3:]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  aws_access_key_id="fencegate-backend", aws_secret_access_key="fencegate-backend-secret",
                  config=botocore.config.Config(s3={"addressing_style": "path"}))
BUCKET = "pgbackrest"

def listing(prefix=""):
    # (s3s-fs lists no ETag; an overwrite changes the modification time.)
    return {o["Key"]: {"etag": o.get("ETag"), "size": o["Size"], "modified": o["LastModified"].isoformat()}
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
            for o in page.get("Contents", []) if not o["Key"].startswith(".fencegate-probe/")}

def token(key):
    return s3.head_object(Bucket=BUCKET, Key=key).get("Metadata", {}).get("fencing-token")

if cmd == "snap":
    json.dump(listing(), open(args[0], "w"), indent=0, sort_keys=True)
elif cmd == "compare":
    old, new, want = json.load(open(args[0])), json.load(open(args[1])), args[2]
    bad = 0
    for k in sorted(set(old) | set(new)):
        if old.get(k) == new.get(k):
            continue
        if k not in new:
            ok, what, t = "--allow-gone" in args, "gone", "-"
        else:
            t = token(k)
            ok, what = t == want, "new" if k not in old else "changed"
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {what:7} {k} token {t}")
    sys.exit(1 if bad else 0)
elif cmd == "tokens":
    for k in sorted(listing(args[0])):
        print(k, token(k))
PYEOF

  # The bucket exists on the backend before the proxy probes it.
  AWS_ACCESS_KEY_ID=$BACKEND_KEY AWS_SECRET_ACCESS_KEY=$BACKEND_SECRET AWS_DEFAULT_REGION=us-east-1 \
    "$PY" -c 'import boto3,sys; boto3.client("s3", endpoint_url=sys.argv[1]).create_bucket(Bucket=sys.argv[2])' \
    "$BACKEND" "$BUCKET"
}

# The proxy's max for lock $1, from its status (PROXY, over TLS).
proxy_max() {
  curl -fsS --cacert "$WORK/tls/ca.crt" "$PROXY/_fencegate/status" |
    "$PY" -c 'import json,sys
def find(v):
    if isinstance(v, dict):
        if v.get("lock") == sys.argv[1] and "max_token" in v: return v["max_token"]
        for x in v.values():
            r = find(x)
            if r is not None: return r
    if isinstance(v, list):
        for x in v:
            r = find(x)
            if r is not None: return r
print(find(json.load(sys.stdin)))' "$1"
}


# Checks that the tools are here and WORK is empty; PY is the python
# with boto3.
require_tools() {
  id postgres >/dev/null 2>&1 || fail "no postgres user: apt-get install -y postgresql-15"
  [ -x "$PGBIN/postgres" ] || fail "$PGBIN/postgres missing: apt-get install -y postgresql-15"
  command -v pgbackrest >/dev/null || fail "pgbackrest missing: apt-get install -y pgbackrest"
  PY=$HERE/../../.venv/bin/python
  [ -x "$PY" ] || PY=python3
  "$PY" -c 'import boto3' 2>/dev/null || fail "no boto3 for $PY (scripts/install-test-tools.sh installs it in .venv)"
  mkdir -p "$WORK"
  [ -z "$(ls -A "$WORK")" ] || fail "$WORK is not empty"
}

# The [tls] and [backend] tables of the proxy under test.
proxy_tls_and_backend() {
  cat <<EOF
[tls]
cert_file = "$WORK/tls/server.crt"
key_file = "$WORK/tls/server.key"

[backend]
endpoint = "$BACKEND"
region = "us-east-1"
path_style = true
EOF
}

# Starts the proxy under test with $WORK/svc/proxy.toml (backend keys from
# the environment, and whatever else the caller exports): PROXY_ADDR,
# PROXY_PORT, PROXY (https://127.0.0.1:PORT, for pgBackRest's certificate).
start_proxy() {
  FENCEGATE_BACKEND_ACCESS_KEY=$BACKEND_KEY FENCEGATE_BACKEND_SECRET_KEY=$BACKEND_SECRET \
    "$FG" proxy --create-db --config "$WORK/svc/proxy.toml" >"$LOGS/proxy.out" 2>"$LOGS/proxy.log" &
  PIDS+=($!)
  PROXY_ADDR=$(listen_addr "$LOGS/proxy.out" proxy)
  PROXY_PORT=${PROXY_ADDR##*:}
  PROXY=https://127.0.0.1:$PROXY_PORT
  wait_until 30 "the proxy's health over TLS" curl -fsS --cacert "$WORK/tls/ca.crt" "$PROXY/_fencegate/health"
}

# ---------------------------------------------------------------- two sides
# Two PostgreSQL servers, a and b, on this host: PORT_A, PORT_B.
port_of() { if [ "$1" = a ]; then echo "$PORT_A"; else echo "$PORT_B"; fi; }
psql_on() { # psql_on SIDE SQL
  "${AS_PG[@]}" psql -X -q -At -v ON_ERROR_STOP=1 -h "$PGW/sock-$1" -p "$(port_of "$1")" -d postgres -c "$2"
}
pg_ready() { "${AS_PG[@]}" pg_isready -q -h "$PGW/sock-$1" -p "$(port_of "$1")"; }

# pgBackRest as one side: the shared config plus that side's conf.d (its
# pg1-* options and the credentials fencegate keeps there).
pgbr() {
  local side=$1; shift
  "${AS_PG[@]}" pgbackrest --config="$PGW/pgbackrest.conf" \
    --config-include-path="$PGW/conf.d-$side" --stanza=main "$@"
}

# The repository as the backend stores it, bypassing the proxy.
s3check() { "$PY" "$WORK/s3check.py" "$BACKEND" "$@"; }
# The token in the credentials file fencegate keeps for the side.
token_of() { sed -n 's/.*(token \([0-9]*\)).*/\1/p' "$PGW/conf.d-$1/creds.conf"; }

# One side's own pgBackRest options, in its conf.d: its PostgreSQL, and
# lock and log paths of its own (both sides share this host, and A's frozen
# backup keeps holding its lock). (config-include-path itself cannot be set
# in a config file: every command, archive_command too, passes it.)
node_conf() { # node_conf SIDE PORT
  cat <<EOF
[global]
log-path=$PGW/log-$1
lock-path=$PGW/lock-$1
spool-path=$PGW/spool-$1

[main]
pg1-path=$PGW/$1
pg1-port=$2
pg1-socket-path=$PGW/sock-$1
EOF
}

# The sides' directories and ports, the shared pgBackRest config (plus any
# `option=value` given) and each side's conf.d/node.conf.
two_sides() {
  mkdir -p "$PGW"/{conf.d-a,conf.d-b,log-a,log-b,lock-a,lock-b,spool-a,spool-b,sock-a,sock-b}
  PORT_A=$(free_port)
  PORT_B=$(free_port)
  # The repository goes through the proxy. pgBackRest speaks only HTTPS to S3,
  # checks the certificate against repo1-s3-endpoint, and (2.45) ignores IP
  # SANs: hence the certificate's DNS:127.0.0.1. The keys are not here: each
  # side's conf.d/creds.conf holds its lease's, kept by fencegate run.
  cat >"$PGW/pgbackrest.conf" <<EOF
[global]
repo1-type=s3
repo1-path=/repo
repo1-s3-bucket=$BUCKET
repo1-s3-endpoint=127.0.0.1
repo1-s3-region=us-east-1
repo1-s3-uri-style=path
repo1-storage-host=127.0.0.1
repo1-storage-port=$PROXY_PORT
repo1-storage-ca-file=$WORK/tls/ca.crt
repo1-retention-full=10
start-fast=y
process-max=1
log-level-console=info
log-level-file=detail
EOF
  printf '%s\n' "$@" >>"$PGW/pgbackrest.conf"
  node_conf a "$PORT_A" >"$PGW/conf.d-a/node.conf"
  node_conf b "$PORT_B" >"$PGW/conf.d-b/node.conf"
}

# stanza-create, check and a full backup as SIDE (WHO in messages); fails
# unless the repository's backup.info then carries TOKEN.
first_backup() { # first_backup SIDE TOKEN WHO
  pgbr "$1" stanza-create >"$LOGS/$1-stanza-create.log" 2>&1 || fail "stanza-create as $3 failed"
  pgbr "$1" check >"$LOGS/$1-check-1.log" 2>&1 || fail "check as $3 failed"
  pgbr "$1" backup --type=full >"$LOGS/$1-backup-1.log" 2>&1 || fail "the first full backup as $3 failed"
  local info_token
  info_token=$(s3check tokens repo/backup/main/backup.info | awk '$1 == "repo/backup/main/backup.info" {print $2}')
  [ "$info_token" = "$2" ] || fail "backup.info carries token '$info_token', not $3's $2"
}
