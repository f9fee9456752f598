#!/usr/bin/env bash
# bench/shm/consumer-start.sh — what starting a shm consumer costs: 200 consumers of 1 token batch
# (8 × 4097 uint16) and 200 of 100, one after the other (bench/shm/consumer-start.ts, Deno SDK),
# against a Node server with its ended consumers' rings kept for the next (--shm-spare-rings 4,
# the default) and, as the baseline, with a new ring per consumer (--shm-spare-rings 0). Prints,
# per row, the client's milliseconds per consumer and the server's event-loop CPU per consumer
# (its main thread, /proc/PID/task/PID/stat).
#   bash bench/shm/consumer-start.sh      (RUNTIME=deno for a Deno server; ROUNDS=2)
# Needs the uint16 dataset of bench/datasets/warm-batches.ts (run that once first).
set -euo pipefail
HERE=$(cd "$(dirname "$0")/../.." && pwd)
DATA=$HERE/bench/.out/datasets/data
RUNTIME=${RUNTIME:-node}
ROUNDS=${ROUNDS:-2}
PORT=18563
ADMIN=consumer-start-admin-token-0123456789
DENO=${DENO:-$HERE/node_modules/.bin/deno}
[ -f "$DATA/u16.bin" ] || { echo "No $DATA/u16.bin: run 'node --import tsx bench/datasets/warm-batches.ts' once first" >&2; exit 2; }
WORK=$(mktemp -d -p /dev/shm rackfeed-consumer-start-XXXXXX)
SERVER=
cleanup() { [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
TICK=$(getconf CLK_TCK)
cd "$HERE"
echo "consumer-start: $RUNTIME server, $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC')"
for _ in $(seq 1 "$ROUNDS"); do
  for spares in 0 4; do
    rm -rf "$WORK/cache" "$WORK/shm"; mkdir -p "$WORK/shm"
    args=(serve --listen 127.0.0.1:$PORT --origin "bench=$DATA" --cache-dir "$WORK/cache" --admin-token $ADMIN --memory-bytes 2GiB --disk-bytes 4GiB --shm-dir "$WORK/shm" --shm-spare-rings $spares)
    if [ "$RUNTIME" = deno ]; then "$DENO" run -A src/main.ts "${args[@]}" > "$WORK/server.log" 2>&1 &
    else node --import tsx src/main.node.ts "${args[@]}" > "$WORK/server.log" 2>&1 & fi
    SERVER=$!
    base=http://127.0.0.1:$PORT
    for _ in $(seq 1 80); do curl -sf -o /dev/null "$base/metrics" && break; sleep 0.25; done
    curl -sf -o /dev/null -X PUT -H "authorization: Bearer $ADMIN" -H "content-type: application/json" "$base/v1/datasets/u16" \
      -d '{"sources":[{"prefix":"bench/u16"}],"seq_length":4096,"seed":1234,"split":"100,0,0","split_index":0,"num_samples":100000}'
    # Warm: every block of the steps read below in memory, the code compiled.
    "$DENO" run -A bench/shm/consumer-start.ts "$base" u16 100 100 > /dev/null
    for steps in 1 100; do
      a=$(awk '{print $14 + $15}' "/proc/$SERVER/task/$SERVER/stat")
      line=$("$DENO" run -A bench/shm/consumer-start.ts "$base" u16 200 $steps)
      b=$(awk '{print $14 + $15}' "/proc/$SERVER/task/$SERVER/stat")
      node -e '
        const [line, ticks, tick, spares] = process.argv.slice(1);
        const j = JSON.parse(line);
        const loop = (Number(ticks) / Number(tick)) * 1e6 / j.consumers;
        console.log(`spare rings ${spares}${spares === "0" ? " (baseline: a new ring each)" : "                          "}  ${String(j.steps).padStart(3)} steps each: ${(j.ms / j.consumers).toFixed(2).padStart(6)} ms per consumer, server event loop ${loop.toFixed(0).padStart(5)} µs per consumer`);
      ' "$line" $((b - a)) "$TICK" $spares
    done
    kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
    SERVER=
  done
done
