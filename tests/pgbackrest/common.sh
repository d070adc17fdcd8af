# Shared by the end-to-end PostgreSQL tests (failover.sh here, and
# tests/patroni/failover.sh): sourced after the caller sets STARTED, WORK,
# LOGS, PGW, PGBIN, FG_GIVEN, PY, BUCKET, BACKEND_KEY and BACKEND_SECRET.
# Every process started is recorded for cleanup; every wait is bounded.

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

