#!/usr/bin/env bash
# bench/datasets/event-loop-ab.sh — the server's event-loop CPU per warm token batch over shm
# (micro_batch 8 × 4097 uint16 tokens, 64 KiB), for two checkouts in turn: the A/B of a change to
# the server's per-step work, whose few µs the batches/s of a 2-core box hide in its noise.
#
#   bash bench/datasets/event-loop-ab.sh [OTHER_CHECKOUT]
#
# OTHER_CHECKOUT: a tree of another commit, e.g. `git worktree add /tmp/base HEAD~3` or
# `mkdir /tmp/base && git archive REV | tar -x -C /tmp/base` (it uses this checkout's node_modules
# and native/build when it has none). Without it, only this checkout is measured.
# Knobs (environment): ROUNDS=3 (interleaved rounds), PASSES=20 (timed passes of 1500 steps per
# run, each a new consumer), RUNTIME=node|deno (the server's), SERVER_FLAGS="" (more serve flags,
# e.g. "--native-gather-threads 4" for groups of steps copied on a thread).
# Needs the uint16 dataset of bench/datasets/warm-batches.ts (run that once first).
#
# Per run: a fresh server on this dataset, warmed (every step over HTTP, then an untimed pass of
# the SDK's shm client, bench/shm/client.ts on Deno); then the main thread's CPU time
# (/proc/PID/task/PID/stat, user + system) over PASSES passes, divided by the batches served. One
# line per run: checkout, batches/s the client saw, server event loop µs per batch, whole server
# process µs per batch (its copy threads included).
set -euo pipefail
HERE=$(cd "$(dirname "$0")/../.." && pwd)
OTHER=${1:-}
DATA=$HERE/bench/.out/datasets/data
ROUNDS=${ROUNDS:-3}
PASSES=${PASSES:-20}
RUNTIME=${RUNTIME:-node}
STEPS=1500
PORT=18557
ADMIN=event-loop-ab-admin-token-0123456789
if [ ! -f "$DATA/u16.bin" ]; then
  echo "No $DATA/u16.bin: run 'node --import tsx bench/datasets/warm-batches.ts' once first (it writes the dataset)" >&2
  exit 2
fi
if [ -n "$OTHER" ]; then
  OTHER=$(cd "$OTHER" && pwd)
  [ -e "$OTHER/node_modules" ] || ln -s "$HERE/node_modules" "$OTHER/node_modules"
  [ -e "$OTHER/native/build" ] || { mkdir -p "$OTHER/native" && ln -s "$HERE/native/build" "$OTHER/native/build"; }
fi
DENO=$HERE/node_modules/.bin/deno
WORK=$(mktemp -d)
SERVER=
cleanup() {
  [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
TICK=$(getconf CLK_TCK)

cpu_ticks() { awk '{print $14 + $15}' "$1"; }

run_one() { # $1 = checkout
  local root=$1
  rm -rf "$WORK/cache" "$WORK/shm"
  mkdir -p "$WORK/shm"
  local args=(serve --listen 127.0.0.1:$PORT --origin "bench=$DATA" --cache-dir "$WORK/cache" --admin-token $ADMIN
    --memory-bytes 2GiB --disk-bytes 4GiB --shm-dir "$WORK/shm" ${SERVER_FLAGS:-})
  if [ "$RUNTIME" = deno ]; then
    (cd "$root" && exec "$DENO" run -A src/main.ts "${args[@]}") > "$WORK/server.log" 2>&1 &
  else
    (cd "$root" && exec node --import tsx src/main.node.ts "${args[@]}") > "$WORK/server.log" 2>&1 &
  fi
  SERVER=$!
  local base=http://127.0.0.1:$PORT
  for _ in $(seq 1 80); do curl -sf -o /dev/null "$base/metrics" && break; sleep 0.25; done
  curl -sf -o /dev/null -X PUT -H "authorization: Bearer $ADMIN" -H "content-type: application/json" "$base/v1/datasets/u16" \
    -d "{\"sources\":[{\"prefix\":\"bench/u16\"}],\"seq_length\":4096,\"seed\":1234,\"split\":\"100,0,0\",\"split_index\":0,\"num_samples\":$((STEPS * 8))}"
  for s in $(seq 0 $((STEPS - 1))); do echo "url = \"$base/v1/datasets/u16/batches/$s?rank=0&world=1&micro_batch=8\""; echo "output = /dev/null"; done > "$WORK/urls"
  curl -sf -K "$WORK/urls"
  (cd "$root" && "$DENO" run -A bench/shm/client.ts "$base" u16 8 $STEPS 2 > /dev/null)
  local main=/proc/$SERVER/task/$SERVER/stat proc=/proc/$SERVER/stat
  local m0 p0 m1 p1 line
  m0=$(cpu_ticks "$main"); p0=$(cpu_ticks "$proc")
  line=$(cd "$root" && "$DENO" run -A bench/shm/client.ts "$base" u16 8 $STEPS "$PASSES" | tail -1)
  m1=$(cpu_ticks "$main"); p1=$(cpu_ticks "$proc")
  kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
  SERVER=
  # The client's first pass is untimed: it is served too.
  node -e '
    const [line, m, p, tick, steps, name] = process.argv.slice(1);
    const j = JSON.parse(line);
    const served = j.batches + Number(steps);
    const us = (t) => ((Number(t) / Number(tick)) * 1e6 / served).toFixed(1);
    console.log(`${name.padEnd(24)} ${(j.batches / j.seconds).toFixed(0).padStart(6)} batches/s   event loop ${us(m).padStart(5)} µs/batch   process ${us(p).padStart(5)} µs/batch`);
  ' "$line" $((m1 - m0)) $((p1 - p0)) "$TICK" $STEPS "$(basename "$root")"
}

echo "event-loop-ab: $RUNTIME server ${SERVER_FLAGS:-}, $ROUNDS rounds × $PASSES passes of $STEPS steps, $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC')"
for _ in $(seq 1 "$ROUNDS"); do
  [ -n "$OTHER" ] && run_one "$OTHER"
  run_one "$HERE"
done
