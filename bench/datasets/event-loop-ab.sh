#!/usr/bin/env bash
# bench/datasets/event-loop-ab.sh — the server's event-loop CPU per warm token batch over shm
# (micro_batch 8 × 4097 uint16 tokens, 64 KiB), for two checkouts in turn: the A/B of a change to
# the server's per-step work, whose few µs the batches/s of a 2-core box hide in its noise.
#
#   bash bench/datasets/event-loop-ab.sh [OTHER_CHECKOUT]
#
# Each round runs OTHER_CHECKOUT first, and running first was worth up to ~10 % on a 2-core box:
# for a small difference, run the script from the other tree too (order reversed).
# OTHER_CHECKOUT: a tree of another commit, e.g. `git worktree add /tmp/base HEAD~3` or
# `mkdir /tmp/base && git archive REV | tar -x -C /tmp/base` (it uses this checkout's node_modules
# and native/build when it has none). Without it, only this checkout is measured.
# Knobs (environment): ROUNDS=3 (interleaved rounds), PASSES=20 (timed passes of 1500 steps per
# run, each a new consumer), RUNTIME=node|deno (the server's), SERVER_FLAGS="" (more serve flags,
# e.g. "--native-gather-threads 4" for groups of steps copied on a thread), DTYPE=uint16|int32
# (the dataset: 64 or 128 KiB batches), FRESH=1 (one consumer
# over PASSES × 1500 distinct steps, as a trainer's epoch: every step planned once, where the
# passes over the same 1500 steps find many plans made before), PREFETCH=3 (the client's depth).
# Needs the uint16 dataset and plan of bench/datasets/warm-batches.ts (run that once first), and
# python3-numpy: each round starts with the baseline, numpy's memmap gather of the same batches
# (bench/datasets/numpy_gather.py, 2 timed passes, alone on the box).
# THREADS=1: each of the server's threads too (by name): CPU µs per batch, kernel share, context
# switches (/proc/PID/task/*).
# PROFILE_DIR=DIR (Node server): each run's server writes a V8 CPU profile there (--cpu-prof; its
# threads' too), sampling every PROFILE_INTERVAL_US=100 µs; `node bench/objects/cpuprof.mjs summary FILE`
# reads one.
#
# Per run: a fresh server on this dataset, warmed (every step over HTTP, then an untimed pass of
# the SDK's shm client, bench/shm/client.ts on Deno); then the main thread's CPU time
# (/proc/PID/task/PID/stat, user + system) over PASSES passes, divided by the batches served. One
# line per run: checkout, batches/s the client saw, server event loop µs per batch, the rate that
# alone allows over the round's numpy figure (the bound where client, copy threads and numpy have
# cores of their own), whole server process µs per batch (its copy threads included).
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
DTYPE=${DTYPE:-uint16}
case $DTYPE in uint16) DS=u16 ;; int32) DS=i32 ;; *) echo "DTYPE must be uint16 or int32, not $DTYPE" >&2; exit 2 ;; esac
PLAN=$HERE/bench/.out/datasets/$DS.plan
FRESH=${FRESH:-}
# Steps of the dataset, and the client's flags: passes over 1500 steps, or one consumer over all.
EPOCH_STEPS=$STEPS
CLIENT_MODE=()
# PREFETCH=N: the client's prefetch depth (its ring has N+1 slots; groups of steps need 4+).
[ -n "${PREFETCH:-}" ] && CLIENT_MODE+=("--prefetch=$PREFETCH")
if [ -n "$FRESH" ]; then
  EPOCH_STEPS=$((STEPS * PASSES))
  CLIENT_MODE+=(--continuous)
fi
if [ ! -f "$DATA/$DS.bin" ] || [ ! -f "$PLAN" ]; then
  echo "No $DATA/$DS.bin or $PLAN: run 'node --import tsx bench/datasets/warm-batches.ts' once first (it writes both)" >&2
  exit 2
fi
NUMPY=0
if [ -n "$OTHER" ]; then
  OTHER=$(cd "$OTHER" && pwd)
  [ -e "$OTHER/node_modules" ] || ln -s "$HERE/node_modules" "$OTHER/node_modules"
  [ -e "$OTHER/native/build" ] || { mkdir -p "$OTHER/native" && ln -s "$HERE/native/build" "$OTHER/native/build"; }
fi
DENO=${DENO:-$HERE/node_modules/.bin/deno}
WORK=$(mktemp -d)
# The rings on tmpfs, as in production (/dev/shm): on a disk file system they are page cache
# with writeback, and a new ring allocates disk blocks.
SHM=$(mktemp -d -p /dev/shm rackfeed-event-loop-ab-XXXXXX)
SERVER=
cleanup() {
  [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null || true
  rm -rf "$WORK" "$SHM"
}
trap cleanup EXIT
TICK=$(getconf CLK_TCK)

cpu_ticks() { awk '{print $14 + $15}' "$1"; }
sys_ticks() { awk '{print $15}' "$1"; }
# Context switches of a thread: the times it slept (voluntary) and was preempted, together.
switches() { awk '/ctxt_switches/ { n += $2 } END { print n }' "$1"; }
# Every thread of process $1: tid, name, user ticks, kernel ticks, context switches (THREADS=1).
thread_ticks() {
  for t in /proc/"$1"/task/*; do
    [ -r "$t/stat" ] || continue
    printf '%s %s %s\n' "${t##*/}" "$(sed 's/.*) //' "$t/stat" | awk '{print $12, $13}')" "$(switches "$t/status")" | paste -d' ' - <(tr ' ' '_' < "$t/comm")
  done 2>/dev/null
}

run_one() { # $1 = checkout
  local root=$1
  rm -rf "$WORK/cache" "$SHM/shm"
  mkdir -p "$SHM/shm"
  local args=(serve --listen 127.0.0.1:$PORT --origin "bench=$DATA" --cache-dir "$WORK/cache" --admin-token $ADMIN
    --memory-bytes 2GiB --disk-bytes 4GiB --shm-dir "$SHM/shm" ${SERVER_FLAGS:-})
  if [ "$RUNTIME" = deno ]; then
    (cd "$root" && exec "$DENO" run -A src/main.ts "${args[@]}") > "$WORK/server.log" 2>&1 &
  else
    local prof=()
    [ -n "${PROFILE_DIR:-}" ] && prof=(--cpu-prof "--cpu-prof-dir=$PROFILE_DIR" --cpu-prof-interval "${PROFILE_INTERVAL_US:-100}")
    (cd "$root" && exec node "${prof[@]}" --import tsx src/main.node.ts "${args[@]}") > "$WORK/server.log" 2>&1 &
  fi
  SERVER=$!
  local base=http://127.0.0.1:$PORT
  for _ in $(seq 1 80); do curl -sf -o /dev/null "$base/metrics" && break; sleep 0.25; done
  curl -sf -o /dev/null -X PUT -H "authorization: Bearer $ADMIN" -H "content-type: application/json" "$base/v1/datasets/$DS" \
    -d "{\"sources\":[{\"prefix\":\"bench/$DS\"}],\"seq_length\":4096,\"seed\":1234,\"split\":\"100,0,0\",\"split_index\":0,\"num_samples\":$((EPOCH_STEPS * 8))}"
  for s in $(seq 0 $((STEPS - 1))); do echo "url = \"$base/v1/datasets/$DS/batches/$s?rank=0&world=1&micro_batch=8\""; echo "output = /dev/null"; done > "$WORK/urls"
  curl -sf -K "$WORK/urls"
  (cd "$root" && "$DENO" run -A bench/shm/client.ts "$base" $DS 8 $STEPS 2 > /dev/null)
  local main=/proc/$SERVER/task/$SERVER/stat proc=/proc/$SERVER/stat
  local m0 p0 m1 p1 line
  [ -n "${THREADS:-}" ] && thread_ticks "$SERVER" > "$WORK/threads0"
  m0=$(cpu_ticks "$main"); p0=$(cpu_ticks "$proc"); s0=$(sys_ticks "$main"); w0=$(switches "/proc/$SERVER/task/$SERVER/status")
  line=$(cd "$root" && "$DENO" run -A bench/shm/client.ts "$base" $DS 8 $STEPS "$PASSES" "${CLIENT_MODE[@]}" | tail -1)
  m1=$(cpu_ticks "$main"); p1=$(cpu_ticks "$proc"); s1=$(sys_ticks "$main"); w1=$(switches "/proc/$SERVER/task/$SERVER/status")
  [ -n "${THREADS:-}" ] && thread_ticks "$SERVER" > "$WORK/threads1"
  # Plans made on the planning thread (--planning-thread), per step read-ahead warmed.
  local ahead
  ahead=$(curl -sf "$base/metrics" | awk '/^rackfeed_readahead_steps_total/ { n = $2 } /^rackfeed_plans_made_ahead_total/ { a = $2 } END { if (a > 0) printf "   planned ahead %.0f %%", 100 * a / n }')
  kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
  local SERVER_PID=$SERVER
  SERVER=
  # The client's first pass is untimed: it is served too (with FRESH, over every step).
  node -e '
    const [line, m, p, tick, steps, name, numpy, ahead, sys, sw] = process.argv.slice(1);
    const j = JSON.parse(line);
    const served = j.batches + Number(steps);
    const us = (t) => (Number(t) / Number(tick)) * 1e6 / served;
    const bound = 1e6 / us(m) / Number(numpy);
    console.log(`${name.padEnd(24)} ${(j.batches / j.seconds).toFixed(0).padStart(6)} batches/s   event loop ${us(m).toFixed(1).padStart(5)} µs/batch (bound ${bound.toFixed(2)}× numpy; ${(100 * Number(sys) / Math.max(1, Number(m))).toFixed(0)} % in the kernel, ${(Number(sw) / served * 100).toFixed(1)} context switches per 100 batches)   process ${us(p).toFixed(1).padStart(5)} µs/batch${ahead}`);
    // THREADS=1: the server threads, busiest first (Node names them all "node"; Deno names its own).
    const [t0, t1, pid] = process.argv.slice(11);
    if (t0) {
      const read = (f) => new Map(require("fs").readFileSync(f, "utf8").trim().split("\n").map((l) => l.split(" ")).map(([tid, u, k, w, comm]) => [tid, { u: +u, k: +k, w: +w, comm }]));
      const a = read(t0);
      const rows = [...read(t1)].map(([tid, e]) => {
        const b = a.get(tid) ?? { u: 0, k: 0, w: 0 };
        return { name: `${e.comm}${tid === pid ? " (main)" : ""}`, u: e.u - b.u, k: e.k - b.k, w: e.w - b.w };
      }).filter((r) => r.u + r.k > 0 || r.w > 0).sort((x, y) => y.u + y.k - x.u - x.k);
      for (const r of rows.slice(0, 12)) {
        console.log(`    ${r.name.padEnd(20)} ${us(r.u + r.k).toFixed(1).padStart(5)} µs/batch, ${(100 * r.k / Math.max(1, r.u + r.k)).toFixed(0).padStart(3)} % in the kernel, ${(r.w / served * 100).toFixed(1).padStart(5)} context switches per 100 batches`);
      }
    }
  ' "$line" $((m1 - m0)) $((p1 - p0)) "$TICK" $EPOCH_STEPS "$(basename "$root")" "$NUMPY" "$ahead" $((s1 - s0)) $((w1 - w0)) ${THREADS:+"$WORK/threads0" "$WORK/threads1" "$SERVER_PID"}
}

echo "event-loop-ab: $DTYPE, $RUNTIME server ${SERVER_FLAGS:-}, $ROUNDS rounds × $PASSES passes of $STEPS steps${FRESH:+ (one consumer over all, every step new)}, $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC')"
numpy_round() {
  python3 "$HERE/bench/datasets/numpy_gather.py" "$DATA/$DS.bin" $DTYPE "$PLAN" $STEPS 8 4097 2 "$WORK/numpy.json" > /dev/null
  NUMPY=$(node -e 'const j = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")); console.log((j.batches / j.seconds).toFixed(0))' "$WORK/numpy.json")
  echo "numpy memmap gather (baseline)  $NUMPY batches/s"
}

for _ in $(seq 1 "$ROUNDS"); do
  numpy_round
  [ -n "$OTHER" ] && run_one "$OTHER"
  run_one "$HERE"
done
