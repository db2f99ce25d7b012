#!/usr/bin/env bash
# Every published benchmark figure, from scratch: the scenarios through a real Envoy (each
# policy, 3 rounds in alternating order: seed-table, slowdown, capacity, grpc, tower-76, pause,
# slowdown-6x), the calm fleets simulated (3 seeds), the overhead (5 rounds), the
# host calls' prices (3 rounds), the
# simulations (the same scenarios for the cross-check, the defaults turned back one at a time,
# the fleet, the fleet from 10 to 1,000 proxies), then the plots copied to docs/bench/ and the marked tables of README.md and
# bench/README.md rewritten from the results (`ewma-bench tables`).
#
# Takes about an hour on 2 cores, and wants a quiet machine: other work on the cores moves the
# latency figures. The load averages before and after are written to bench/out/run-all.log.
#
#   bench/run-all.sh            everything
#   bench/run-all.sh --smoke    every step in seconds, nothing published (checks the script)
set -euo pipefail
cd "$(dirname "$0")/.."

smoke=()
out=bench/out
if [ "${1:-}" = "--smoke" ]; then
  smoke=(--smoke)
  out=target/run-all-smoke
fi
mkdir -p "$out"
log="$out/run-all.log"
note() { printf '%s %s\n' "$(date -u +%FT%TZ)" "$*" | tee -a "$log"; }

note "start; load: $(cut -d' ' -f1-3 /proc/loadavg)"
./wasm-build.sh
cargo build --release -p ewma-bench
bench=target/release/ewma-bench

for s in seed-table slowdown capacity grpc tower-76 pause slowdown-6x host-down host-hung cold-return orca-capacity orca-capacity-3-envoys orca-slow-idle orca-failing; do
  note "compare $s"
  "$bench" compare "bench/scenarios/$s.toml" --out "$out/$s" "${smoke[@]}"
done
note "overhead"
"$bench" overhead --out "$out/overhead" "${smoke[@]}"
note "hostcalls"
"$bench" hostcalls --out "$out/hostcalls" "${smoke[@]}"
for s in seed-table slowdown capacity; do
  note "simulate $s"
  "$bench" simulate "bench/scenarios/$s.toml" --seeds 1,2,3,4,5 --out "$out/sim-$s" "${smoke[@]}"
done
for s in slowdown capacity; do
  note "simulate the defaults turned back one at a time on $s"
  "$bench" simulate "bench/scenarios/tuning/ablation-$s.toml" --seeds 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20 \
    --out "$out/sim-ablation-$s" "${smoke[@]}"
done
for s in calm/mixed-costs calm/three-envoys calm/cold-start-40 calm/failing-neighbour; do
  note "simulate $s"
  "$bench" simulate "bench/scenarios/$s.toml" --seeds 1,2,3 --no-plots --out "$out/sim-${s#calm/}" "${smoke[@]}"
done
note "simulate fleet"
"$bench" simulate bench/scenarios/fleet/fleet.toml --out "$out/sim-fleet" "${smoke[@]}"
note "simulate fleet at 10 to 1,000 proxies"
if [ ${#smoke[@]} -eq 0 ]; then
  "$bench" simulate bench/scenarios/fleet/fleet.toml --scale 10,30,100,300,1000 --out "$out/sim-fleet-scale"
else
  "$bench" simulate bench/scenarios/fleet/fleet.toml --smoke --scale 2,5 --out "$out/sim-fleet-scale"
fi
note "done; load: $(cut -d' ' -f1-3 /proc/loadavg)"

if [ ${#smoke[@]} -eq 0 ]; then
  for s in seed-table slowdown capacity; do
    cp "$out/$s/share-over-time.png" "docs/bench/$s-share-over-time.png"
  done
  cp "$out/seed-table/latency-cdf.png" docs/bench/seed-table-latency-cdf.png
  cp "$out/sim-fleet/share-over-time.png" docs/bench/fleet-share-over-time.png
  cp "$out/sim-fleet/utilisation.png" docs/bench/fleet-utilisation.png
  cp "$out/sim-fleet-scale/scale-p99.png" docs/bench/fleet-scale-p99.png
  cp "$out/sim-fleet-scale/scale-utilisation-spread.png" docs/bench/fleet-scale-utilisation-spread.png
  "$bench" tables
  note "tables and plots rewritten from $out"
fi
