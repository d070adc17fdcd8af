#!/usr/bin/env bash
# A throwaway single-node Ceph RGW (Debian's ceph 16.2 packages) on loopback,
# for one test binary. Installed by scripts/install-test-tools.sh.
#
#   ceph-rgw.sh DIR WATCH_PID
#       Starts one mon, one memstore OSD and radosgw, with everything (config,
#       data, logs, admin sockets, pid files) inside DIR, which it creates and
#       which must not hold another cluster. Creates the S3 user `backend`
#       (access key backend-key, secret backend-secret-123), then prints
#       exactly one line on stdout:
#           endpoint http://127.0.0.1:PORT
#       and stays in the foreground. When WATCH_PID is gone (polled every
#       0.5 s), or on SIGTERM/SIGINT/SIGHUP, it SIGKILLs the daemons and
#       removes DIR. If this script itself is SIGKILLed (Rust's Child::kill),
#       the daemons die with it (PR_SET_PDEATHSIG via setpriv) and a detached
#       watchdog removes DIR. Pids: DIR/mon.pid, DIR/osd.pid, DIR/rgw.pid.
#       Startup failure (60 s, override CEPH_RGW_TIMEOUT): log tails on
#       stderr, exit status 1.
#
#   ceph-rgw.sh user DIR TENANT ACCESS SECRET
#       Creates the user TENANT$TENANT (uid = tenant name) in tenant TENANT
#       with that S3 key pair, on the cluster running in DIR. Bucket names of
#       a tenanted user resolve inside its own tenant, so tests can use the
#       same bucket names under different tenants without colliding.
#       An empty TENANT creates a plain (untenanted) user with uid ACCESS.
#
# Ports: the mon and RGW ports are picked free on 127.0.0.1 by binding port
# 0 (up to 3 tries each if a daemon then fails to bind: costs ~3 s for the
# mon, ~2 s for radosgw). The OSD binds 4 ports from
# Ceph's default range 6800-7568 (msgr2 only), trying the next one when
# busy, so several clusters coexist; that range is below Linux's ephemeral
# range (32768+), so it does not race with port-0 listeners.
# Runs as root or as any user; the daemons keep the caller's uid.
set -uo pipefail

die() { echo "ceph-rgw.sh: $*" >&2; exit 1; }

# alive PID [STARTTIME]: PID exists, is not a zombie (a killed test process
# stays one until its parent reaps it, and kill -0 still succeeds on it) and,
# if given, started at STARTTIME (clock ticks since boot), so a reused pid
# does not count. Reads /proc, so it also works for another user's pid.
alive() {
  local s f
  { read -r s </proc/"$1"/stat; } 2>/dev/null || return 1
  read -r -a f <<<"${s##*) }"
  [ "${f[0]}" != Z ] && { [ -z "${2:-}" ] || [ "${f[19]}" = "$2" ]; }
}
starttime() {
  local s f
  { read -r s </proc/"$1"/stat; } 2>/dev/null || return 1
  read -r -a f <<<"${s##*) }"
  echo "${f[19]}"
}

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

create_user() { # DIR UID TENANT ACCESS SECRET DISPLAY
  local dir=$1 uid=$2 tenant=$3 access=$4 secret=$5 display=$6 out
  local args=(user create --uid "$uid" --access-key "$access" --secret "$secret" --display-name "$display")
  [ -n "$tenant" ] && args+=(--tenant "$tenant")
  out=$(timeout 30 radosgw-admin -c "$dir/ceph.conf" -n client.admin "${args[@]}" 2>&1) || {
    echo "$out" >&2
    return 1
  }
}

if [ "${1:-}" = user ]; then
  [ $# -eq 5 ] || die "usage: $0 user DIR TENANT ACCESS SECRET"
  dir=$2 tenant=$3 access=$4 secret=$5
  [ -f "$dir/ceph.conf" ] || die "no cluster in $dir"
  uid=${tenant:-$access}
  create_user "$dir" "$uid" "$tenant" "$access" "$secret" "$uid" || die "user create failed"
  exit 0
fi

[ $# -eq 2 ] || die "usage: $0 DIR WATCH_PID | $0 user DIR TENANT ACCESS SECRET"
DIR=$1
WATCH_PID=$2
TIMEOUT=${CEPH_RGW_TIMEOUT:-60}
for b in ceph-mon ceph-osd radosgw radosgw-admin ceph rados monmaptool setpriv curl; do
  command -v "$b" >/dev/null 2>&1 || die "$b is missing: run scripts/install-test-tools.sh"
done
WATCH_START=$(starttime "$WATCH_PID") && alive "$WATCH_PID" || die "WATCH_PID $WATCH_PID is not running"
SELF_START=$(starttime $$)
mkdir -p "$DIR" || die "cannot create $DIR"
DIR=$(cd "$DIR" && pwd)
[ -e "$DIR/ceph.conf" ] && die "$DIR already holds a cluster"
mkdir -p "$DIR/log" "$DIR/run" "$DIR/mon.a" "$DIR/osd.0" "$DIR/tmp" "$DIR/crash"
CONF=$DIR/ceph.conf
C=(-c "$CONF")
START=$(date +%s)
MON_PID="" OSD_PID="" RGW_PID=""

cleanup() {
  trap - EXIT INT TERM HUP
  local p
  for p in $RGW_PID $OSD_PID $MON_PID; do kill -9 "$p" 2>/dev/null; done
  for p in $RGW_PID $OSD_PID $MON_PID; do wait "$p" 2>/dev/null; done
  [ -n "${WATCHDOG_PID:-}" ] && kill -9 "$WATCHDOG_PID" 2>/dev/null
  rm -rf "$DIR"
}
trap 'cleanup; exit 0' INT TERM HUP
trap cleanup EXIT

# If this script is SIGKILLed, the daemons die with it (pdeathsig), but
# nothing would remove DIR: a watchdog in its own session does, and also
# kills the daemons by pid file, should one have survived.
setsid bash -c "$(declare -f alive)"'
  self=$1 self_start=$2 watch=$3 watch_start=$4 dir=$5
  trap "" INT TERM HUP
  while alive "$self" "$self_start" && alive "$watch" "$watch_start"; do sleep 0.5; done
  sleep 0.5
  alive "$self" "$self_start" && exit 0
  for f in "$dir"/rgw.pid "$dir"/osd.pid "$dir"/mon.pid; do
    p=$(cat "$f" 2>/dev/null) || continue
    # only if that pid is still our daemon, not a reused pid
    grep -qaF "$dir/ceph.conf" /proc/"$p"/cmdline 2>/dev/null && kill -9 "$p"
  done
  sleep 0.2
  rm -rf "$dir"
' ceph-rgw-watchdog $$ "$SELF_START" "$WATCH_PID" "$WATCH_START" "$DIR" </dev/null >/dev/null 2>&1 &
WATCHDOG_PID=$!
disown "$WATCHDOG_PID"

fail() {
  echo "ceph-rgw.sh: $*" >&2
  local f
  for f in "$DIR"/log/*; do
    [ -s "$f" ] || continue
    echo "---- tail of ${f##*/} ----" >&2
    tail -n 25 "$f" >&2
  done
  exit 1
}

left() { echo $((TIMEOUT - ($(date +%s) - START))); }

check_watch() {
  alive "$WATCH_PID" "$WATCH_START" || exit 0
}

# Runs a daemon in the foreground of a background job that dies with this
# shell (SIGKILL on parent death).
spawn() { # NAME CMD...
  local name=$1; shift
  setpriv --pdeathsig KILL "$@" -f "${C[@]}" </dev/null >"$DIR/log/$name.out" 2>&1 &
}

MON_PORT=$(free_port) || die "python3 port pick failed"
RGW_PORT=$(free_port) || die "python3 port pick failed"
FSID=$(cat /proc/sys/kernel/random/uuid)
ASOK="$DIR/run/\$name.asok"
# sun_path is 108 bytes; skip admin sockets rather than fail on long DIRs.
[ ${#DIR} -gt 80 ] && ASOK=""

# mon data avail crit = -1: by default the mon exits when the filesystem
# holding DIR has 1 % or less free (2.5 GB of a 252 GB disk), which a
# machine whose disk is nearly full from builds meets (seen in CI: every RGW
# test failed with "ceph-mon exited"); 0 still exits at 0 %. The mon's store
# here is a few MB, and the OSD keeps its data in memory.
write_conf() {
  cat >"$CONF" <<EOF
[global]
fsid = $FSID
mon host = v2:127.0.0.1:$MON_PORT
mon initial members = a
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind msgr1 = false
ms bind ipv4 = true
ms bind ipv6 = false
ms bind retry delay = 1
auth cluster required = none
auth service required = none
auth client required = none
ms mon client mode = crc
ms client mode = crc
ms service mode = crc
ms cluster mode = crc
keyring = $DIR/keyring
run dir = $DIR/run
admin socket = $ASOK
pid file =
log file = $DIR/log/\$name.log
log to stderr = false
mon cluster log file = $DIR/log/cluster.log
err to stderr = true
debug rocksdb = 0/0
crash dir = $DIR/crash
tmp dir = $DIR/tmp
mon data = $DIR/mon.\$id
osd data = $DIR/osd.\$id
osd objectstore = memstore
memstore device bytes = ${CEPH_RGW_MEMSTORE_BYTES:-2147483648}
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon max pg per osd = 1000
paxos propose interval = 0.01
paxos min wait = 0.01
mon data avail warn = 0
mon data avail crit = -1
mon osd full ratio = .99
mon osd nearfull ratio = .99
mon osd backfillfull ratio = .99
osd failsafe full ratio = .99
mon osd down out interval = 0
osd max object name len = 460
osd max object namespace len = 64
osd heartbeat grace = 3600
osd op num shards = 1
osd op num threads per shard = 2
rgw frontends = beast endpoint=127.0.0.1:$RGW_PORT
rgw data = $DIR/rgw
rgw dynamic resharding = false
rgw enable usage log = false
rgw thread pool size = 64
EOF
}
write_conf

# ---- mon
monmaptool --create --fsid "$FSID" --add a "v2:127.0.0.1:$MON_PORT" "$DIR/monmap" >/dev/null 2>"$DIR/log/monmaptool.out" ||
  fail "monmaptool failed"
ceph-mon "${C[@]}" -i a --mkfs --monmap "$DIR/monmap" >"$DIR/log/mon-mkfs.out" 2>&1 || fail "ceph-mon --mkfs failed"

start_mon() {
  spawn mon.a ceph-mon -i a
  MON_PID=$!
  echo "$MON_PID" >"$DIR/mon.pid"
}
start_mon

wait_mon() {
  while [ "$(left)" -gt 0 ]; do
    check_watch
    alive "$MON_PID" || return 1
    timeout 5 ceph "${C[@]}" --connect-timeout 3 mon stat >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  fail "mon did not answer within ${TIMEOUT}s"
}
tries=0
until wait_mon; do
  tries=$((tries + 1))
  [ $tries -lt 3 ] || fail "ceph-mon exited"
  # Most likely the mon port was taken between pick and bind: new port,
  # new monmap, new mon store.
  wait "$MON_PID" 2>/dev/null
  MON_PORT=$(free_port)
  write_conf
  rm -rf "$DIR/mon.a" "$DIR/monmap" && mkdir -p "$DIR/mon.a"
  monmaptool --create --fsid "$FSID" --add a "v2:127.0.0.1:$MON_PORT" "$DIR/monmap" >/dev/null 2>&1 || fail "monmaptool failed"
  ceph-mon "${C[@]}" -i a --mkfs --monmap "$DIR/monmap" >"$DIR/log/mon-mkfs.out" 2>&1 || fail "ceph-mon --mkfs failed"
  start_mon
done

# ---- osd
OSD_UUID=$(cat /proc/sys/kernel/random/uuid)
OSD_ID=$(timeout 20 ceph "${C[@]}" osd new "$OSD_UUID" 2>"$DIR/log/osd-new.out") || fail "ceph osd new failed"
[ "$OSD_ID" = 0 ] || fail "ceph osd new gave id '$OSD_ID', expected 0"
ceph-osd "${C[@]}" -i 0 --mkfs --osd-uuid "$OSD_UUID" >"$DIR/log/osd-mkfs.out" 2>&1 || fail "ceph-osd --mkfs failed"
spawn osd.0 ceph-osd -i 0
OSD_PID=$!
echo "$OSD_PID" >"$DIR/osd.pid"

until timeout 5 ceph "${C[@]}" osd dump 2>/dev/null | grep -q '^osd\.0 up '; do
  check_watch
  [ "$(left)" -gt 0 ] || fail "osd.0 not up within ${TIMEOUT}s"
  alive "$OSD_PID" || fail "ceph-osd exited"
  sleep 0.2
done

# ---- rgw
# A radosgw that dies leaves its watches on the control objects until the OSD
# times them out (30 s); until then every radosgw-admin write waits for it to
# acknowledge cache notifications. With no radosgw running, every watcher
# there is dead: blocklisting them drops the watches at once.
drop_dead_watchers() {
  local i a
  for i in 0 1 2 3 4 5 6 7; do
    timeout 10 rados "${C[@]}" -p default.rgw.control listwatchers "notify.$i" 2>/dev/null
  done | sed -n 's/^watcher=\([^ ]*\) .*/\1/p' | sort -u | while read -r a; do
    timeout 10 ceph "${C[@]}" osd blocklist add "$a" >/dev/null 2>&1
  done
}
start_rgw() {
  spawn client.rgw radosgw -n client.rgw
  RGW_PID=$!
  echo "$RGW_PID" >"$DIR/rgw.pid"
}
start_rgw
tries=0
while :; do
  check_watch
  [ "$(left)" -gt 0 ] || fail "radosgw not answering on 127.0.0.1:$RGW_PORT within ${TIMEOUT}s"
  if curl -s -m 2 "http://127.0.0.1:$RGW_PORT/" 2>/dev/null | grep -q '<ListAllMyBucketsResult\|<Error'; then
    break
  fi
  if ! alive "$RGW_PID" || grep -q 'failed to bind\|Address already in use' "$DIR/log/client.rgw.log" 2>/dev/null; then
    tries=$((tries + 1))
    [ $tries -lt 3 ] || fail "radosgw could not start"
    kill -9 "$RGW_PID" 2>/dev/null; wait "$RGW_PID" 2>/dev/null
    mv "$DIR/log/client.rgw.log" "$DIR/log/client.rgw.log.$tries" 2>/dev/null
    drop_dead_watchers
    RGW_PORT=$(free_port)
    sed -i "s|^rgw frontends = .*|rgw frontends = beast endpoint=127.0.0.1:$RGW_PORT|" "$CONF"
    start_rgw
  fi
  sleep 0.2
done

create_user "$DIR" backend "" backend-key backend-secret-123 backend 2>"$DIR/log/user-create.out" ||
  fail "radosgw-admin user create failed: $(cat "$DIR/log/user-create.out")"

echo "endpoint http://127.0.0.1:$RGW_PORT"

while alive "$WATCH_PID" "$WATCH_START"; do
  if ! alive "$RGW_PID" || ! alive "$OSD_PID" || ! alive "$MON_PID"; then
    echo "ceph-rgw.sh: a daemon died; log tails follow" >&2
    fail "cluster in $DIR is down"
  fi
  sleep 0.5 &
  wait $! # so SIGTERM is handled at once
done
exit 0
