"""A ZooKeeper lock holder, as an application using kazoo's Lock writes.

    kazoo_holder.py HOSTS LOCK_PATH IDENTITY PROXY_URL BUCKET SESSION_SECONDS

Acquires the lock (waiting in line), then prints `TOKEN <czxid>`: the
fencing token of its term, the czxid of its own lock znode, which is what
the proxy's `[[elections]]` table with `zookeeper_lock` checks. Then, for
each line `put KEY` on stdin, PUTs KEY through the proxy with
`Fencing-Token: <czxid>` and prints `STATUS <code> <body>`. It keeps the
token it was given, as a holder that does not notice its session expired
would.
"""
import sys
import urllib.error
import urllib.request

from kazoo.client import KazooClient

hosts, path, identity, proxy, bucket, session = sys.argv[1:7]
zk = KazooClient(hosts=hosts, timeout=float(session))
zk.start(timeout=10)
lock = zk.Lock(path, identity)
lock.acquire(timeout=60)
token = zk.exists(f"{path}/{lock.node}").czxid
print(f"TOKEN {token}", flush=True)
for line in sys.stdin:
    verb, _, key = line.strip().partition(" ")
    if verb != "put":
        continue
    request = urllib.request.Request(
        f"{proxy}/{bucket}/{key}", data=f"written by {identity} with {token}".encode(),
        method="PUT", headers={"Fencing-Token": str(token)})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            print(f"STATUS {answer.status} ", flush=True)
    except urllib.error.HTTPError as e:
        body = e.read().decode(errors="replace").replace("\n", " ")
        print(f"STATUS {e.code} {body}", flush=True)
