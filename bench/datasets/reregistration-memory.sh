#!/usr/bin/env bash
# bench/datasets/reregistration-memory.sh — a server's memory while a dataset is registered again
# and again (a new seed each time) and short-lived consumers come and go (each reads two steps
# and is not seen again: jobs that end, evaluation passes). A replaced dataset version must not
# stay alive through consumers that last read it: the resident set should level off.
# Baseline, same run: the same consumers and requests with no re-registration (what the new
# consumers themselves cost).
#
#   bash bench/datasets/reregistration-memory.sh [N=125] [RUNTIME=node|deno]
#
# Data: bench/.out/datasets/u16 (made by bench/datasets/common.ts if missing; ~240 k samples of
# 4097 tokens, an .idx of a few MB). Prints VmRSS every 25 rounds and after 15 s idle.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
N=${1:-125}
RUNTIME=${2:-node}
DATA=bench/.out/datasets
node --import tsx -e 'import { DATASETS, ensureDataset } from "./bench/datasets/common.ts"; ensureDataset(process.argv[1], DATASETS[0]);' "$DATA"
ADMIN=rereg-memory-admin-token-0123456789abcdef
WORK=$(mktemp -d)
SERVER=
trap '[ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null; rm -rf "$WORK"' EXIT
reg() { # seed
  printf '{"sources":[{"prefix":"bench/u16"}],"seq_length":4096,"seed":%s,"split":"100,0,0","split_index":0,"num_samples":240000}' "$1"
}

run() { # label, reregister(0|1)
  local label=$1 rereg=$2 port=18745 log="$WORK/$1.log"
  rm -rf "$WORK/cache"
  local flags=(serve --listen "127.0.0.1:$port" --origin "bench=$DATA/data" --cache-dir "$WORK/cache" --admin-token "$ADMIN" --memory-bytes 2GiB --shm-dir off)
  if [ "$RUNTIME" = node ]; then node --import tsx src/main.node.ts "${flags[@]}" > "$log" 2>&1 & else node_modules/.bin/deno run -A src/main.ts "${flags[@]}" > "$log" 2>&1 & fi
  SERVER=$!
  for _ in $(seq 1 200); do grep -q 'listening on' "$log" && break; sleep 0.1; done
  local url=http://127.0.0.1:$port
  curl -sf -o /dev/null -X PUT -H "authorization: Bearer $ADMIN" -H "content-type: application/json" "$url/v1/datasets/u16" -d "$(reg 1234)"
  rss() { awk '/VmRSS/ { printf "%d", $2 / 1024 }' "/proc/$SERVER/status"; }
  local line="$label: start $(rss) MB"
  for i in $(seq 1 "$N"); do
    if [ "$rereg" = 1 ]; then
      curl -sf -o /dev/null -X PUT -H "authorization: Bearer $ADMIN" -H "content-type: application/json" "$url/v1/datasets/u16" -d "$(reg $((1000 + i)))"
    fi
    for w in 1 2 3 4; do # four new consumers (micro_batch i is new each round), two steps each
      for s in 3 4; do curl -sf -o /dev/null "$url/v1/datasets/u16/batches/$s?rank=0&world=$w&micro_batch=$i"; done
    done
    [ $((i % 25)) = 0 ] && line="$line, after $i: $(rss)"
  done
  sleep 15
  echo "$line, 15 s idle: $(rss) MB"
  kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
  SERVER=
}

echo "reregistration-memory: $RUNTIME server, $N rounds of 4 new consumers x 2 steps, $(date -u '+%Y-%m-%d %H:%M UTC')"
run "baseline, no re-registration" 0
run "a re-registration (new seed) per round" 1
