# syntax=docker/dockerfile:1
#
# fencegate: one image, one binary. The same image runs the lease service and
# the proxy; pick the service with the command:
#
#   docker build -t fencegate .
#   docker run --rm -e FENCEGATE_SIGNING_KEYS=... -p 127.0.0.1:7070:7070 \
#     -v fencegate-locksvc:/var/lib/fencegate \
#     fencegate locksvc --config /etc/fencegate/locksvc.toml
#   docker run --rm -e FENCEGATE_SIGNING_KEYS=... -e FENCEGATE_BACKEND_ACCESS_KEY=... \
#     -e FENCEGATE_BACKEND_SECRET_KEY=... -e FENCEGATE_CLIENT_KEYS=AK:SECRET \
#     -p 127.0.0.1:9000:9000 -v fencegate-proxy:/var/lib/fencegate \
#     fencegate proxy --config /etc/fencegate/proxy-minio.toml
#
# docker-compose.yml wires both up with MinIO.

# ---- build ---------------------------------------------------------------
# The Rust version matches the channel pinned in rust-toolchain.toml (1.95.0),
# so rustup does not fetch another toolchain (it may still add the rustfmt
# and clippy components the file lists).
FROM rust:1.95.0-bookworm AS builder
WORKDIR /src

# etcd-client (the lease service's etcd backend) compiles etcd's protos at
# build time: protoc and the well-known protobuf includes.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       protobuf-compiler libprotobuf-dev \
    && rm -rf /var/lib/apt/lists/*

# Only what the build needs (see .dockerignore): the workspace manifests, the
# lock file (--locked: the image gets exactly the tested dependency versions),
# the toolchain pin and the crates' sources.
COPY rust-toolchain.toml Cargo.toml Cargo.lock ./
COPY core core
COPY durable durable
COPY net net
COPY page page
COPY etcd etcd
COPY lease-api lease-api
COPY locksvc locksvc
COPY proxy proxy
COPY bench bench
COPY testkit testkit
COPY zookeeper zookeeper
COPY elections elections
COPY src src

# The registry and target caches survive between builds (BuildKit); the
# binary is copied out of the cached target directory.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin fencegate \
 && install -D -m 0755 target/release/fencegate /out/fencegate

# ---- runtime -------------------------------------------------------------
FROM debian:bookworm-slim AS runtime

# CA certificates for https backends (AWS S3). Nothing else: no shell tools are
# needed, the health check is `fencegate health`.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*

# A fixed, non-root uid/gid so volume ownership is predictable across
# rebuilds and hosts (and runAsNonRoot-style policies can check it).
RUN groupadd --system --gid 10001 fencegate \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
      --home-dir /var/lib/fencegate --shell /usr/sbin/nologin fencegate \
 && mkdir -p /var/lib/fencegate \
 && chown 10001:10001 /var/lib/fencegate \
 && chmod 0750 /var/lib/fencegate

COPY --from=builder /out/fencegate /usr/local/bin/fencegate
# Example configurations (no secrets in them: those come from the environment).
# Mount your own over /etc/fencegate/ or a single file over one of them.
COPY config/ /etc/fencegate/

# The lease and fence databases live here (db = "/var/lib/fencegate/..." in
# the configs). Losing them lets fencing tokens go backwards: keep this on a
# persistent volume and back it up. A named volume starts out owned by
# fencegate (it copies this directory's ownership).
VOLUME ["/var/lib/fencegate"]
WORKDIR /var/lib/fencegate

USER 10001:10001

# 7070: lease service (GET /health); 9000: fencing S3 proxy (GET /_fencegate/health).
EXPOSE 7070 9000

# Healthy if whichever service runs here answers on its default port. Compose
# (or your orchestrator) should override this with the one URL that matters.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
  CMD fencegate health http://127.0.0.1:9000/_fencegate/health \
   || fencegate health http://127.0.0.1:7070/health \
   || exit 1

# fencegate handles SIGTERM itself (graceful shutdown, in-flight requests
# finish), so it can run as PID 1.
ENTRYPOINT ["fencegate"]
CMD ["--help"]
