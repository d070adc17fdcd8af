#!/usr/bin/env bash
# Runs the benchmark suite (see BENCHMARKS.md).
#
#   scripts/bench.sh                 # everything, full sizes (~10 min on 2 cores)
#   scripts/bench.sh --quick         # smoke test: small counts, no 1 GiB object
#   scripts/bench.sh --out my.json   # any fencegate-bench option is passed on
#   scripts/bench.sh small           # one section: small | large | roundtrips | locksvc | etcd | growth | ha | replicas | scale | all
#   scripts/bench.sh report A.json B.json
#                                    # renders today's tables from results files into
#                                    # BENCHMARKS.md, between its "today" markers; runs nothing
#   scripts/bench.sh small --baseline-rev 4c198a5
#                                    # before/after (small and large): the fencegate of commit
#                                    # 4c198a5 runs as one more variant in the same rounds as
#                                    # direct, nginx and the working tree's fencegate
#
# Installs etcd-server and nginx-light (Debian) if they are missing, builds
# the release `fencegate` binary under test and the release bench, then
# runs `fencegate-bench SECTION "$@"` (SECTION defaults to all), which
# prints tables, writes the JSON results (bench-results.json unless --out
# says otherwise) and the small section's SVG chart (next to the JSON).
#
# --baseline-rev REV builds REV's `fencegate` once, in a git worktree under
# target/bench-baseline/ with its own target dir (a full release build, about
# 15 minutes on 2 cores the first time; reused after), and passes it on as
# `--baseline PATH --baseline-label REV`.
set -euo pipefail

cd "$(dirname "$0")/.."

missing=()
if ! command -v etcd >/dev/null 2>&1 && [ ! -x /usr/bin/etcd ]; then
    missing+=(etcd-server)
fi
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
    missing+=(nginx-light)
fi
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "bench.sh: installing ${missing[*]} (Debian): etcd for the lease service comparison," \
             "nginx as the plain reverse proxy anchor of the small section" >&2
        apt-get update
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
    else
        echo "bench.sh: ${missing[*]} missing and cannot be installed here (needs root and apt-get);" \
             "what needs them will be reported as not measured" >&2
    fi
fi
# The Debian packages may start a system etcd or nginx on their default
# ports; the bench starts its own, with its own configuration, on ephemeral
# ports and does not use them.

if [ "${1:-}" = report ]; then
    shift
    [ "$#" -gt 0 ] || { echo "bench.sh report: name the results files (JSON)" >&2; exit 2; }
    cargo build --release -p fencegate-bench
    tables=$(mktemp)
    trap 'rm -f "$tables"' EXIT
    "${CARGO_TARGET_DIR:-target}/release/fencegate-bench" report "$@" > "$tables"
    python3 - "$tables" BENCHMARKS.md <<'PY'
import sys
tables, doc = open(sys.argv[1]).read(), sys.argv[2]
text = open(doc).read()
begin, end = "<!-- today:begin -->", "<!-- today:end -->"
if begin not in text or end not in text:
    sys.exit(f"{doc} has no {begin} ... {end} markers")
head, rest = text.split(begin, 1)
_, tail = rest.split(end, 1)
open(doc, "w").write(head + begin + "\n" + tables + end + tail)
PY
    echo "bench.sh: wrote today's tables into BENCHMARKS.md from $*" >&2
    exit 0
fi

section=all
case "${1:-}" in
    small | large | roundtrips | locksvc | etcd | growth | ha | replicas | scale | all)
        section=$1
        shift
        ;;
esac

args=()
baseline_rev=
while [ "$#" -gt 0 ]; do
    case "$1" in
        --baseline-rev)
            baseline_rev=${2:?--baseline-rev needs a commit}
            shift 2
            ;;
        --baseline-rev=*)
            baseline_rev=${1#--baseline-rev=}
            shift
            ;;
        *)
            args+=("$1")
            shift
            ;;
    esac
done

if [ -n "$baseline_rev" ]; then
    sha=$(git rev-parse --verify "$baseline_rev^{commit}")
    short=$(git rev-parse --short "$sha")
    dir="$PWD/target/bench-baseline/$short"
    if [ ! -x "$dir/target/release/fencegate" ]; then
        if [ ! -e "$dir/.git" ]; then
            git worktree prune
            git worktree add --detach "$dir" "$sha"
        fi
        echo "bench.sh: building the baseline fencegate of $short in $dir" >&2
        (cd "$dir" && env -u CARGO_TARGET_DIR cargo build --release --locked -p fencegate --bin fencegate)
    fi
    args+=(--baseline "$dir/target/release/fencegate" --baseline-label "$baseline_rev")
fi

cargo build --release -p fencegate --bin fencegate
cargo build --release -p fencegate-bench

bin="${CARGO_TARGET_DIR:-target}/release"
# The results name the tree they were measured at.
FENCEGATE_BENCH_COMMIT=$(git describe --always --dirty 2>/dev/null || echo unknown)
export FENCEGATE_BENCH_COMMIT
exec "$bin/fencegate-bench" "$section" --fencegate "$bin/fencegate" "${args[@]}"
