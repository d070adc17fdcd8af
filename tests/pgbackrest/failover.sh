#!/usr/bin/env bash
# End-to-end: fencegate fences a PostgreSQL primary's pgBackRest repository
# across a failover. See README.md beside this file.
#
#   tests/pgbackrest/failover.sh FENCEGATE_BINARY WORKDIR
#
# Runs as root (it starts PostgreSQL and pgBackRest as the Debian `postgres`
# user), binds 127.0.0.1 only, leaves nothing running, exits 0 only if every
# assertion held. Needs postgresql-15, pgbackrest, openssl, curl, python3 and
# boto3 (the repository's .venv, or python3 with boto3).
set -Eeuo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
LOCK=pg-primary
# The pieces every end-to-end PostgreSQL test here shares: arguments,
# logging and failing, cleanup of what was started, the postgres user, TLS,
# the backend.
# shellcheck source=tests/pgbackrest/common.sh
. "$HERE/common.sh" 2 "FENCEGATE_BINARY WORKDIR" "$@"

[ "$(id -u)" -eq 0 ] || fail "run as root: PostgreSQL and pgBackRest are started as the postgres user"
require_tools

# ---------------------------------------------------------------- helpers



# Starts `fencegate run` holding the role for SIDE, as the postgres user.
start_holder() { # start_holder SIDE PORT [run options]
  local side=$1 port=$2; shift 2
  # Everything that differs between the sides is on PostgreSQL's command
  # line, so B can start from a plain copy of A's data directory.
  "${AS_PG[@]}" FENCEGATE_LOG=info "$WORK/bin/fencegate" run --lock "$LOCK" --ttl 10s \
    --owner "primary-$side" --locksvc "$LOCKSVC" --ca-file "$WORK/tls/ca.crt" \
    --s3-endpoint "$PROXY" --pgbackrest-file "$PGW/conf.d-$side/creds.conf" "$@" \
    -- "$PGBIN/postgres" -D "$PGW/$side" -c "port=$port" -c listen_addresses=127.0.0.1 \
    -c "unix_socket_directories=$PGW/sock-$side" -c archive_mode=on \
    -c "archive_command=pgbackrest --config=$PGW/pgbackrest.conf --config-include-path=$PGW/conf.d-$side --stanza=main archive-push %p" \
    -c shared_buffers=32MB -c max_wal_size=256MB \
    >"$LOGS/holder-$side.log" 2>&1 &
}

postmaster_pid() { head -n 1 "$PGW/$1/postmaster.pid"; }
# ---------------------------------------------------------------- 1. services
step "1. lease service, S3 backend and the TLS proxy"
prepare_work
make_tls
# The lease service and the proxy share the signing key (given to them
# only, not to the role's processes).
SIGNING_KEY=$(openssl rand -hex 32)
printf '[tls]\ncert_file = "%s"\nkey_file = "%s"\n' "$WORK/tls/server.crt" "$WORK/tls/server.key" \
  >"$WORK/svc/locksvc.toml"
FENCEGATE_SIGNING_KEYS=$SIGNING_KEY "$FG" locksvc --create-db --config "$WORK/svc/locksvc.toml" \
  --listen 127.0.0.1:0 --db "$WORK/svc/locksvc.db" \
  >"$LOGS/locksvc.out" 2>"$LOGS/locksvc.log" &
PIDS+=($!)
LOCKSVC=https://$(listen_addr "$LOGS/locksvc.out" locksvc)
note "lease service $LOCKSVC"

start_backend

# The proxy under test. No [[clients]]: pgBackRest signs with the lease-bound
# credentials (fgk2.*), which the proxy verifies with the signing key.
cat >"$WORK/svc/proxy.toml" <<EOF
listen = "127.0.0.1:0"
db = "$WORK/svc/proxy.db"
# Asked whose lease a token is, so that fence events name the zombie's owner.
locksvc_url = "$LOCKSVC"
locksvc_ca_file = "$WORK/tls/ca.crt"

[[scopes]]
bucket = "$BUCKET"
lock = "$LOCK"
EOF
proxy_tls_and_backend >>"$WORK/svc/proxy.toml"
FENCEGATE_SIGNING_KEYS=$SIGNING_KEY start_proxy
note "fencing proxy $PROXY (scope: bucket $BUCKET, lock $LOCK)"
# ---------------------------------------------------------------- 2. primary A
step "2. old primary A under fencegate run; stanza-create, check, full backup"
two_sides
chown -R postgres:postgres "$PGW"
chmod 0700 "$PGW"
"${AS_PG[@]}" initdb -D "$PGW/a" -U postgres --auth=trust --locale=C -E UTF8 --no-sync \
  >"$LOGS/initdb.log" 2>&1 || fail "initdb failed"

start_holder a "$PORT_A"
HOLDER_A=$!
PIDS+=("$HOLDER_A")
wait_until 30 "A's credentials file" test -s "$PGW/conf.d-a/creds.conf"
wait_until 30 "PostgreSQL A to accept connections" pg_ready a
PM_A=$(postmaster_pid a)
PGROUPS+=("$PM_A")
TOKEN_A=$(token_of a)
[ -n "$TOKEN_A" ] || fail "no token in $PGW/conf.d-a/creds.conf"
grep -q 'fence raised' "$LOGS/holder-a.log" || fail "A's fencegate run did not raise the fence at the proxy"
note "A holds $LOCK with token $TOKEN_A; postmaster $PM_A on port $PORT_A; holder $HOLDER_A"
[ "$(stat -c %U:%a "$PGW/conf.d-a/creds.conf")" = postgres:600 ] ||
  fail "creds.conf is $(stat -c %U:%a "$PGW/conf.d-a/creds.conf"), expected postgres:600"

first_backup a "$TOKEN_A" A
note "stanza-create, check and a full backup passed; the repo's objects carry token $TOKEN_A"

# ---------------------------------------------------------------- 3. freeze A
step "3. A mid-backup is frozen (SIGSTOP: a paused VM)"
# Some data of A's (~13 MB). The backup is in flight for long enough
# anyway: with process-max=1 a full backup stores its ~1000 files one by
# one, several seconds through the proxy.
psql_on a "CREATE TABLE orders AS SELECT g AS id, md5(g::text) || md5((g * 7)::text) AS note
           FROM generate_series(1, 100000) g" || fail "loading data into A failed"
# Archive every finished segment first, so B, a copy of A, inherits none to
# archive itself before step 5: from B's take to A's wake-up, no one but A
# may write.
psql_on a "SELECT pg_switch_wal()" >/dev/null
wait_until 60 "A to archive its WAL" sh -c "! ls '$PGW/a/pg_wal/archive_status' | grep -q '\.ready\$'"
LOG_A=$PGW/log-a/main-backup.log
before=$(grep -c 'backup file' "$LOG_A" || true)
# The backup runs in its own session (setsid) so the process group can be
# frozen and killed whole.
setsid "${AS_PG[@]}" pgbackrest --config="$PGW/pgbackrest.conf" --config-include-path="$PGW/conf.d-a" \
  --stanza=main backup --type=full >"$LOGS/a-backup-2.log" 2>&1 &
BACKUP_A=$!
JOBGROUPS+=("$BACKUP_A")
# "Has begun writing": pgBackRest logs each file it stored in the repo.
wait_until 60 "A's second backup to store files" \
  sh -c "[ \$(grep -c 'backup file' '$LOG_A') -ge $((before + 20)) ]"
kill -0 "$BACKUP_A" 2>/dev/null || fail "A's second backup ended before it could be frozen; make it bigger"
# Everything of A at once: its holder, PostgreSQL and the backup, each with
# whatever it forked.
FROZEN_A=$(tree "$HOLDER_A" "$PM_A" "$BACKUP_A" | tr '\n' ' ')
kill -STOP $FROZEN_A 2>/dev/null || true   # (a short-lived child may be gone)
FROZE_AT=$(date +%s)
sleep 0.2
for p in $(tree "$HOLDER_A" "$PM_A" "$BACKUP_A"); do   # anything forked meanwhile
  kill -STOP "$p" 2>/dev/null || true
done
stopped() { # every process of A stopped (T), or gone
  local p state
  for p in $(tree "$HOLDER_A" "$PM_A" "$BACKUP_A"); do
    state=$(ps -o stat= -p "$p" 2>/dev/null || true)
    case $state in T* | "") ;; *) return 1 ;; esac
  done
}
wait_until 5 "every process of A to be stopped" stopped
stored=$(($(grep -c 'backup file' "$LOG_A") - before))
note "froze A (pids $FROZEN_A) after its backup stored $stored files"
s3check snap "$WORK/snap-0.json" >/dev/null
LABEL_A2=$("$PY" -c 'import json,sys,re
keys = json.load(open(sys.argv[1]))
labels = {k.split("/")[3] for k in keys if re.match(r"repo/backup/main/\d{8}-\d{6}F/", k)}
done = {l for l in labels if "repo/backup/main/%s/backup.manifest" % l in keys}
print(" ".join(sorted(labels - done)))' "$WORK/snap-0.json")
[ -n "$LABEL_A2" ] || fail "no unfinished backup of A in the repo: the freeze did not catch it writing"
note "the repo holds A's unfinished backup $LABEL_A2 ($(grep -c "\"repo/backup/main/$LABEL_A2/" "$WORK/snap-0.json") objects)"

# ---------------------------------------------------------------- 4. primary B
step "4. new primary B takes the role (waits for A's lease to expire)"
# B is A's data directory as it is on disk now: what a failover to shared
# storage, or a promoted copy, starts from. Same system id and timeline as A.
cp -a "$PGW/a" "$PGW/b"
rm -f "$PGW/b/postmaster.pid"
start_holder b "$PORT_B" --wait 30s
HOLDER_B=$!
PIDS+=("$HOLDER_B")
wait_until 40 "B's credentials file (B holds the lease)" test -s "$PGW/conf.d-b/creds.conf"
TOOK_AT=$(date +%s)
wait_until 60 "PostgreSQL B to accept connections" pg_ready b
PM_B=$(postmaster_pid b)
PGROUPS+=("$PM_B")
TOKEN_B=$(token_of b)
[ -n "$TOKEN_B" ] && [ "$TOKEN_B" -gt "$TOKEN_A" ] || fail "B's token '$TOKEN_B' is not above A's $TOKEN_A"
# The default fencing on take: run raised the fence before starting B, so
# the proxy refuses A from now on though B has written nothing.
fence_line=$(grep -n -m1 'fence raised' "$LOGS/holder-b.log" | cut -d: -f1 || true)
start_line=$(grep -n -m1 'starting PostgreSQL' "$LOGS/holder-b.log" | cut -d: -f1 || true)
[ -n "$fence_line" ] || fail "B's fencegate run did not raise the fence"
[ "$fence_line" -lt "$start_line" ] || fail "B's fencegate run started PostgreSQL before it raised the fence"
[ "$(proxy_max "$LOCK")" = "$TOKEN_B" ] || fail "the proxy's max for $LOCK is $(proxy_max "$LOCK"), expected B's $TOKEN_B"
note "B took $LOCK with token $TOKEN_B $((TOOK_AT - FROZE_AT))s after A froze; the proxy's max is $TOKEN_B before B wrote anything"
s3check snap "$WORK/snap-1.json" >/dev/null

# ---------------------------------------------------------------- 5. A wakes
step "5. A wakes: its writes are refused"
# PostgreSQL and the backup first, A's holder last: the worst case, where the
# holder has not yet noticed the loss, so A's credentials file is still there
# and A's archive_command still finds it. Only the proxy stands in the way.
for p in $(tree "$PM_A" "$BACKUP_A"); do kill -CONT "$p" 2>/dev/null || true; done
wait_until 30 "PostgreSQL A to answer again" pg_ready a
test -s "$PGW/conf.d-a/creds.conf" || fail "A's credentials file is gone before A's holder woke"

# a) A's check: switches WAL and waits for archive-push, which is refused.
if pgbr a check --archive-timeout=3 >"$LOGS/a-check-zombie.log" 2>&1; then
  fail "pgbackrest check as the fenced A passed"
fi
note "A's check failed: $(grep -m1 -E 'ERROR' "$LOGS/a-check-zombie.log" | cut -c1-160 || true)"
# b) A's archive-push of the segment it just finished, as PostgreSQL runs it.
SEG=$(ls "$PGW/a/pg_wal/archive_status" | sed -n 's/\.ready$//p' | grep -E '^[0-9A-F]{24}$' | head -n 1 || true)
[ -n "$SEG" ] || fail "A has no WAL segment waiting to be archived"
if pgbr a archive-push "$PGW/a/pg_wal/$SEG" >"$LOGS/a-archive-push-zombie.log" 2>&1; then
  fail "archive-push of $SEG as the fenced A passed"
fi
fenced_in "$LOGS/a-archive-push-zombie.log" || fail "A's archive-push failed, but not on the fence"
note "A's archive-push of $SEG refused: $(refusal_in "$LOGS/a-archive-push-zombie.log")"
# c) The backup that was in flight fails: pgBackRest retries a job after 0 s
#    and 15 s, then gives up (error 039). Its process lingers a while longer
#    (its local worker tries the next file, and is refused too); we reap it
#    at the end of step 6.
wait_until 60 "A's in-flight backup to give up" grep -q 'backup command end' "$LOGS/a-backup-2.log"
grep -q 'backup command end: aborted' "$LOGS/a-backup-2.log" ||
  fail "A's in-flight backup completed after B took the role"
fenced_in "$LOGS/a-backup-2.log" || fail "A's in-flight backup failed, but not on the fence"
note "A's in-flight backup failed: $(refusal_in "$LOGS/a-backup-2.log")"
# d) Nothing of A's reached the store after B took the role: every object
#    new or changed since then carries B's token (B has written nothing yet,
#    so there should be none), and none is gone.
s3check snap "$WORK/snap-2.json" >/dev/null
s3check compare "$WORK/snap-1.json" "$WORK/snap-2.json" "$TOKEN_B" >"$LOGS/compare-1-2.log" ||
  fail "objects changed after B took the role without B's token: $(cat "$LOGS/compare-1-2.log")"
changed=$(wc -l <"$LOGS/compare-1-2.log")
note "nothing of A's reached the store after B's take ($changed objects new or changed since, all B's)"
# e) A's holder wakes, finds the lease lost, removes A's credentials and stops A.
kill -CONT "$HOLDER_A"
rc=0
for _ in $(seq 300); do kill -0 "$HOLDER_A" 2>/dev/null || break; sleep 0.1; done
kill -0 "$HOLDER_A" 2>/dev/null && fail "A's fencegate run still runs 30 s after waking"
wait "$HOLDER_A" || rc=$?
[ "$rc" -eq 4 ] || fail "A's fencegate run exited $rc, expected 4 (lease lost)"
[ ! -e "$PGW/conf.d-a/creds.conf" ] || fail "A's credentials file survived the lost lease"
wait_until 20 "PostgreSQL A to stop" sh -c "! kill -0 $PM_A"
note "A's holder exited 4 (lease lost), removed A's credentials and stopped PostgreSQL A"

# ---------------------------------------------------------------- 6. B works
step "6. B: check, backup, info, verify"
pgbr b check >"$LOGS/b-check.log" 2>&1 || fail "check as B failed"
# The segment A was refused is now B's. Had A's copy landed, B's archive-push
# of the same name would fail for good ("already exists in the repo1 archive
# with a different checksum", error 045) while B's check still passed, on
# finding A's segment: so the segment's token is what proves it.
B_SEG_TOKEN=$(s3check tokens "repo/archive/main/15-1/${SEG:0:16}/$SEG-" | awk '{print $2}' | sort -u)
[ "$B_SEG_TOKEN" = "$TOKEN_B" ] ||
  fail "segment $SEG in the repo carries token(s) '$B_SEG_TOKEN', expected B's $TOKEN_B"
if grep -q 'already exists in the repo1 archive with a different checksum' "$LOGS/holder-b.log"; then
  fail "B's archive-push found a different segment of the same name in the repo"
fi
note "B archived $SEG, the segment A was refused (token $TOKEN_B)"
pgbr b backup >"$LOGS/b-backup.log" 2>&1 || fail "backup as B failed"
pgbr b info >"$LOGS/b-info.log" 2>&1 || fail "info as B failed"
grep -q 'status: ok' "$LOGS/b-info.log" || fail "info as B does not say status: ok"
pgbr b verify >"$LOGS/b-verify.log" 2>&1 || fail "verify as B failed"
[ "$(psql_on b 'SELECT count(*) FROM orders')" = 100000 ] || fail "B does not have A's 100000 orders"
note "B's check, backup, info and verify passed; B has A's data"
# A's backup process is gone by now, or goes soon: its last attempts count.
for _ in $(seq 600); do kill -0 "$BACKUP_A" 2>/dev/null || break; sleep 0.1; done
kill -0 "$BACKUP_A" 2>/dev/null && fail "A's in-flight backup still runs a minute after it gave up"
rc=0
wait "$BACKUP_A" || rc=$?
[ "$rc" -ne 0 ] || fail "A's in-flight backup exited 0"
# (The log is colored even into a file: strip the escapes.)
refused=$(sed 's/\x1b\[[0-9;]*m//g' "$LOGS/proxy.log" | grep -c "fence refused a write kind=\"stale\".* token=$TOKEN_A max=$TOKEN_B .*owner=primary-a holder=primary-b" || true)
[ "$refused" -gt 0 ] || fail "the proxy logged no refused stale write of A's naming owner primary-a"
note "A's backup exited $rc; the proxy refused $refused stale writes of A's in all"
s3check snap "$WORK/snap-3.json" >/dev/null
# (B may delete: its backup removes A's unfinished one.)
s3check compare "$WORK/snap-1.json" "$WORK/snap-3.json" "$TOKEN_B" --allow-gone >"$LOGS/compare-1-3.log" ||
  fail "after B's backup, objects written since B's take without B's token: $(grep BAD "$LOGS/compare-1-3.log")"
note "everything written since B's take carries B's token ($(wc -l <"$LOGS/compare-1-3.log") objects)"

# B steps down: its holder stops PostgreSQL B and releases the lease.
kill -TERM "$HOLDER_B"
rc=0
wait "$HOLDER_B" || rc=$?
[ "$rc" -eq 0 ] || fail "B's fencegate run exited $rc on SIGTERM"
wait_until 20 "PostgreSQL B to stop" sh -c "! kill -0 $PM_B"

step "PASS in $(($(date +%s) - STARTED))s"
