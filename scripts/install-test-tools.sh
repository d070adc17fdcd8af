#!/usr/bin/env bash
# Installs everything the test suite talks to, if it is missing:
#   - moto_server, boto3, the aws CLI and kazoo in ./.venv (PyPI)
#   - rclone, s3cmd, restic and curl (Debian)
#   - etcd (Debian etcd-server 3.4): the lease service's etcd backend runs
#     its tests on a 3-member cluster of it; etcdctl (Debian etcd-client)
#     holds etcd locks in tests/elections.rs as a real election client
#   - protoc and the protobuf include files (Debian protobuf-compiler and
#     libprotobuf-dev): the etcd-client crate compiles etcd's protos
#   - nftables (Debian nftables; iproute2's `ip netns`): tests/nemesis.rs
#     partitions real sockets in network namespaces with drop rules
#   - nginx (Debian nginx-light): the deployment test checks the load
#     balancer config of docker-compose.ha.yml with `nginx -t`
#   - chromium (Debian): the status pages are read and photographed in a
#     real browser, headless (tests/status_page.rs)
#   - Ceph 16.2 (Debian ceph-mon, ceph-osd, radosgw, ceph-common): a
#     throwaway single-node RGW on loopback is a test backend
#     (tests/support/ceph-rgw.sh); no system ceph daemon is left running
#   - PostgreSQL 15 and pgBackRest 2.45 (Debian postgresql-15, pgbackrest):
#     tests/pgbackrest/failover.sh fences a primary's backup repository
#     across a failover; it starts its own servers on free ports, so the
#     package's cluster (main, port 5432) is stopped
#   - ZooKeeper 3.8 (Debian zookeeper, with a Java runtime): tests/zookeeper.rs
#     fences writes by a kazoo lock; the tests start their own server
#   - Patroni 3.0.2 (Debian patroni): tests/patroni/failover.sh runs a
#     two-node Patroni cluster on the tests' etcd and fences its backups by
#     Patroni's own leader key; the package's service is never started
# Safe to run repeatedly; does nothing when all is present.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/moto_server ] || [ ! -x .venv/bin/aws ] || ! .venv/bin/python -c 'import boto3, kazoo' 2>/dev/null; then
  echo "==> installing moto[server], boto3, awscli and kazoo into .venv"
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check 'moto[server]' boto3 awscli kazoo
fi

missing=()
for tool in rclone s3cmd restic curl; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
[ -x /usr/bin/etcd ] || missing+=(etcd-server)
[ -x /usr/bin/etcdctl ] || missing+=(etcd-client)
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
command -v nft >/dev/null 2>&1 || missing+=(nftables)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
# protoc alone fails on google/protobuf/descriptor.proto.
[ -f /usr/include/google/protobuf/descriptor.proto ] || missing+=(libprotobuf-dev)
[ -x /usr/sbin/nginx ] || command -v nginx >/dev/null 2>&1 || missing+=(nginx-light)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
# ceph-rgw.sh also runs ceph, rados (ceph-common) and monmaptool (ceph-base,
# a dependency of ceph-mon).
ceph_missing=0
for b in ceph-mon ceph-osd radosgw radosgw-admin ceph rados monmaptool; do
  [ -x "/usr/bin/$b" ] || ceph_missing=1
done
[ "$ceph_missing" -eq 0 ] || missing+=(ceph-mon ceph-osd radosgw ceph-common)
[ -x /usr/lib/postgresql/15/bin/postgres ] || missing+=(postgresql-15)
command -v pgbackrest >/dev/null 2>&1 || missing+=(pgbackrest)
command -v patroni >/dev/null 2>&1 || missing+=(patroni)
{ [ -f /usr/share/java/zookeeper.jar ] && command -v java >/dev/null 2>&1; } || missing+=(zookeeper)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "==> installing ${missing[*]} from Debian"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Debian's etcd-server package starts a system etcd on 2379/2380; the tests
# start their own members on free ports and never use it. Stop it so it
# costs nothing (when systemd runs it; harmless otherwise).
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet etcd 2>/dev/null; then
  ${SUDO:-} systemctl stop etcd || true
fi
# The same for the nginx package's system server on port 80.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet nginx 2>/dev/null; then
  ${SUDO:-} systemctl stop nginx || true
fi
# The ceph packages enable ceph.target and its per-daemon targets; with no
# cluster configured in /etc/ceph they start nothing, and the tests never use
# one. Stop them anyway where systemd runs.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet ceph.target 2>/dev/null; then
  ${SUDO:-} systemctl stop ceph.target || true
fi
# The zookeeper package does not start a server by itself (Debian ships it
# without an enabled service); stop one if systemd runs it.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet zookeeper 2>/dev/null; then
  ${SUDO:-} systemctl stop zookeeper || true
fi
# The patroni package's service needs a config in /etc/patroni and starts
# nothing without one; stop it anyway where systemd runs.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet patroni 2>/dev/null; then
  ${SUDO:-} systemctl stop patroni || true
fi
# The postgresql package creates and starts a cluster "main" on 5432 (through
# systemd or its init script); the test starts its own. Stop it either way.
if command -v pg_lsclusters >/dev/null 2>&1 && pg_lsclusters -h 2>/dev/null | awk '$1 == 15 && $2 == "main" && $4 ~ /^online/' | grep -q .; then
  ${SUDO:-} pg_ctlcluster 15 main stop || true
fi
