#!/usr/bin/env bash
# Issue 18's end-to-end check in one command (bench/README.md, "Tuning from the access log"):
#   1. a real Envoy runs the scenario's own plugin configuration (`ewma_lb`) once and keeps its
#      access log;
#   2. ewma-lb-tune reads that log and recommends settings, with the gain to expect (the floor);
#   3. the same world runs `ewma_lb` against the recommendation (`tuned`), ROUNDS rounds in
#      alternating order, and the median p99's gain is set against the floor.
# Each cycle starts from a fresh log. One line per cycle goes to OUT/cycles.md; the files of each
# step stay in OUT/cycle-N/.
#
#   bench/tune-cycle.sh [--cycles N] [--rounds N] [--out DIR] [SCENARIO]
#   bench/tune-cycle.sh --smoke        every step in seconds (checks the script, measures nothing)
#
# Defaults: 1 cycle, 5 rounds, bench/scenarios/tuning/alternating.toml, bench/out/tune-cycle.
# A cycle takes about 6.5 minutes on 2 cores with the defaults; like every latency figure here
# it wants a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."

cycles=1
rounds=5
out=bench/out/tune-cycle
scenario=bench/scenarios/tuning/alternating.toml
smoke=()
tune_smoke=()
profile=release
while [ $# -gt 0 ]; do
  case "$1" in
    --cycles) cycles="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --smoke)
      smoke=(--smoke)
      # A 3-s log (the scenario's [smoke]): no warm-up to leave out, one seed, the smoother alone.
      tune_smoke=(--quick --seeds 1 --warmup 0)
      rounds=1
      out=target/tune-cycle-smoke
      # Measures nothing, so the build ./test.sh already made will do.
      profile=debug
      shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) scenario="$1"; shift ;;
  esac
done
command -v jq >/dev/null || { echo "jq is needed (apt-get install jq)" >&2; exit 1; }

if [ "$profile" = release ]; then
  cargo build --quiet --release -p ewma-bench --bins
else
  cargo build --quiet -p ewma-bench --bins
fi
bench=target/$profile/ewma-bench
tune=target/$profile/ewma-lb-tune
[ -f dist/ewma_lb.wasm ] || ./wasm-build.sh
[ ${#smoke[@]} -eq 0 ] || rm -rf "$out"
mkdir -p "$out"
summary="$out/cycles.md"
if [ ! -s "$summary" ]; then
  {
    echo "| cycle | log p99 ms | recommendation | predicted gain % | floor % | ewma_lb p99 ms | tuned p99 ms | gain % | each round's gain % | floor held |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
  } > "$summary"
fi

# The median of the numbers on stdin, one a line.
median() { sort -g | awk '{v[NR] = $1} END {printf "%.1f\n", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

kept=""
cleanup() { if [ -n "$kept" ] && [ -d "$kept" ]; then rm -rf "$kept"; fi; }
trap cleanup EXIT

first=$(( $(grep -c '^| [0-9]' "$summary" || true) + 1 ))
for (( n = first; n < first + cycles; n++ )); do
  dir="$out/cycle-$n"
  rm -rf "$dir"
  mkdir -p "$dir"
  echo "== cycle $n: the log ($dir)"
  # 1. The log. The harness names the Envoy directory it keeps on stderr.
  EWMA_BENCH_KEEP_ENVOY=1 "$bench" compare "$scenario" --policies ewma_lb --rounds 1 --no-plots \
    "${smoke[@]}" --out "$dir/log-run" 2> "$dir/log-run.stderr" ||
    { cat "$dir/log-run.stderr" >&2; exit 1; }
  kept=$(grep -o "envoy files kept in [^ ]*" "$dir/log-run.stderr" | tail -n 1 | cut -d" " -f5)
  [ -n "$kept" ] && [ -s "$kept/stdout.txt" ] || { echo "no access log kept (see $dir/log-run.stderr)" >&2; exit 1; }
  gzip -c "$kept/stdout.txt" > "$dir/access.log.gz"
  rm -rf "$kept"
  kept=""
  results="$dir/log-run/results.json"
  config=$(jq -c '.settings.plugin_config' "$results")
  log_p99=$(jq -r '.results[0].rounds[0].p99_ms * 10 | round / 10' "$results")

  # 2. Tune from it, with the settings that wrote it.
  echo "== cycle $n: ewma-lb-tune"
  "$tune" "$dir/access.log.gz" --config "$config" --no-progress "${tune_smoke[@]}" \
    --workers "$(jq -r '.settings.envoy_concurrency' "$results")" \
    --route-timeout "$(jq -r '.settings.route_timeout_s' "$results")" \
    --out "$dir/tuned.json" --report "$dir/report.md" --summary "$dir/tune-summary.json" > "$dir/tune.txt"
  s="$dir/tune-summary.json"
  recommendation=$(jq -c .recommended "$s")
  if [ "$(jq .changed "$s")" != true ] && [ ${#smoke[@]} -eq 0 ]; then
    # No change recommended (or the model does not reproduce the log): nothing to run back. The
    # smoke runs step 3 anyway (with the settings the tool wrote), to check it.
    verdict=$(grep -m1 -o '^\*\*\(No recommendation\|Recommendation\)[^*]*\*\*' "$dir/report.md" | tr -d '*')
    echo "| $n | $log_p99 | $verdict | - | - | - | - | - | - | - |" >> "$summary"
    continue
  fi
  predicted=$(jq -r 'if .gain_pct then (.gain_pct | "\(.median * 10 | round / 10) (\(.min * 10 | round / 10)-\(.max * 10 | round / 10))") else "-" end' "$s")
  # The report states no floor when it is not above zero ("none for certain").
  floor=$(jq -r 'if (.gain_floor_pct // 0) > 0 then (.gain_floor_pct * 10 | round / 10) else "none" end' "$s")

  # 3. The recommendation against the settings that wrote the log, in alternating order.
  echo "== cycle $n: ewma_lb against the recommendation, $rounds rounds"
  "$bench" compare "$scenario" --variant "tuned=@$dir/tuned.json" --policies ewma_lb,tuned \
    --rounds "$rounds" --no-plots "${smoke[@]}" --out "$dir/check"
  check="$dir/check/results.json"
  base=$(jq -r '.results[] | select(.policy == "ewma_lb") | .rounds[].p99_ms' "$check" | median)
  tuned=$(jq -r '.results[] | select(.policy == "tuned") | .rounds[].p99_ms' "$check" | median)
  gain=$(awk -v b="$base" -v t="$tuned" 'BEGIN {printf "%.1f", 100 * (1 - t / b)}')
  each=$(paste -d' ' \
    <(jq -r '.results[] | select(.policy == "ewma_lb") | .rounds[].p99_ms' "$check") \
    <(jq -r '.results[] | select(.policy == "tuned") | .rounds[].p99_ms' "$check") |
    awk '{printf "%s%.1f", (NR > 1 ? ", " : ""), 100 * (1 - $2 / $1)}')
  held=$(awk -v g="$gain" -v f="$floor" 'BEGIN {if (f == "none") print "no floor"; else print (g + 0 >= f + 0 ? "yes" : "**no**")}')
  echo "| $n | $log_p99 | \`$recommendation\` | $predicted | $floor | $base | $tuned | $gain | $each | $held |" >> "$summary"
done
echo
cat "$summary"
