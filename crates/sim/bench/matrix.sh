#!/usr/bin/env bash
# Regenerates every table of BENCHMARKS.md: workloads x replica counts 4/8/16 x
# two load levels. The load levels scale with the fleet (rate scale n/8 and
# 3n/8) so every fleet size sees the same offered load per replica.
#
#   cargo build --profile native -p prefix-router-sim
#   crates/sim/bench/matrix.sh > /tmp/matrix.md      # ~10 minutes on 2 cores
#
# SIM and TRACES can be overridden; each command is printed before its table.
set -euo pipefail
SIM=${SIM:-target/native/prefix-router-sim}
TRACES=${TRACES:-/work/shared/traces}
run() {
  echo
  echo '```text'
  echo "\$ ${*}" | sed "s|$SIM|prefix-router-sim|; s|$TRACES|\$TRACES|g"
  "$@" 2>/dev/null
  echo '```'
}
scale() { awk -v n="$1" -v k="$2" 'BEGIN { printf "%g", n * k / 8 }'; }
for n in ${REPLICAS:-4 8 16}; do
  lo=$(scale "$n" 1); hi=$(scale "$n" 3)
  echo
  echo "### $n replicas (rate scale $lo and $hi)"
  run "$SIM" --trace "$TRACES/mooncake_conversation_trace.jsonl" --replicas "$n" --rate-scale "$lo,$hi"
  run "$SIM" --trace "$TRACES/AzureLLMInferenceTrace_conv_2023.csv" --replicas "$n" --rate-scale "$lo,$hi"
  for w in shared-prefix shared-prefix-long-q zipf long-context multi-turn; do
    run "$SIM" --synthetic "$w" --replicas "$n" --rate-scale "$lo,$hi"
  done
done
