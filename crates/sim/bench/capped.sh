#!/usr/bin/env bash
# The "what would change it" table of BENCHMARKS.md: the default key, the
# capped-key experiment and the strongest peers, 8 replicas, two load levels.
set -euo pipefail
SIM=${SIM:-target/native/prefix-router-sim}
TRACES=${TRACES:-/work/shared/traces}
P=(--policy prefix-router --policy prefix-router:mode=capped,prefix_bytes=16384 --policy prefix-router:mode=prefix
   --policy sglang-cache-aware --policy gie --policy dynamo)
for w in "--trace $TRACES/mooncake_conversation_trace.jsonl" "--synthetic shared-prefix" "--synthetic long-context" \
         "--synthetic zipf" "--synthetic multi-turn" "--synthetic shared-prefix-long-q"; do
  # shellcheck disable=SC2086
  "$SIM" $w --replicas 8 --rate-scale 1,3 "${P[@]}"
done
