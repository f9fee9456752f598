#!/usr/bin/env bash
# bench/objects/cpu-ab.sh — server CPU per warm object GET, this checkout against another, in
# turn: the A/B of a change to the object route's per-request work, which req/s on 2 cores hide
# in their noise (neighbours, wrk on the same cores). Not a comparison with nginx: run.sh is.
#
#   bash bench/objects/cpu-ab.sh OTHER_CHECKOUT
#
# OTHER_CHECKOUT: a tree of another commit (`mkdir /tmp/base && git archive REV | tar -x -C
# /tmp/base`; it uses this checkout's node_modules and native/build when it has none).
# Knobs (environment): RT=node|deno (the server's runtime), ROUNDS=3, DUR=5 (s of wrk per run,
# after 2 s unmeasured), SIZES="s m" (64 KiB and 1 MiB objects, 8 of each, whole-object GETs at 16
# connections). Rounds alternate which checkout runs first.
# Per run: a fresh server and cache, warmed; then the server process's CPU time (/proc/PID/stat,
# user + system, all threads) over the timed wrk run, divided by the requests it answered.
set -euo pipefail
HERE=$(cd "$(dirname "$0")/../.." && pwd)
OTHER=${1:?usage: bash bench/objects/cpu-ab.sh OTHER_CHECKOUT}
OTHER=$(cd "$OTHER" && pwd)
[ -e "$OTHER/node_modules" ] || ln -s "$HERE/node_modules" "$OTHER/node_modules"
[ -e "$OTHER/native/build" ] || { mkdir -p "$OTHER/native" && ln -s "$HERE/native/build" "$OTHER/native/build"; }
RT=${RT:-node}; ROUNDS=${ROUNDS:-3}; DUR=${DUR:-5}
PORT=18571
DENO=${DENO:-$HERE/node_modules/.bin/deno}
D=$(mktemp -d)
SERVER=
cleanup() { [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null || true; rm -rf "$D"; }
trap cleanup EXIT
mkdir -p "$D/o"
for i in $(seq 0 7); do head -c 65536 /dev/urandom > "$D/o/s$i.bin"; head -c 1048576 /dev/urandom > "$D/o/m$i.bin"; done
for sz in s m; do printf 'local i = 0\nrequest = function()\n  i = (i + 1) %% 8\n  return wrk.format("GET", "/v1/objects/data/%s" .. i .. ".bin")\nend\n' $sz > "$D/$sz.lua"; done
TICK=$(getconf CLK_TCK)
run() { # checkout, size
  local tree=$1 sz=$2 url=http://127.0.0.1:$PORT
  rm -rf "$D/c"
  local args=(serve --listen 127.0.0.1:$PORT --origin "data=$D/o" --cache-dir "$D/c" --shm-dir off)
  if [ "$RT" = node ]; then (cd "$tree" && exec node --import tsx src/main.node.ts "${args[@]}") > "$D/log" 2>&1 &
  else (cd "$tree" && exec "$DENO" run -A src/main.ts "${args[@]}") > "$D/log" 2>&1 &
  fi
  SERVER=$!
  for _ in $(seq 1 100); do curl -sf -o /dev/null "$url/metrics" && break; sleep 0.1; done
  wrk -t1 -c16 -d2s -s "$D/$sz.lua" "$url" > /dev/null
  local c0 c1 out
  c0=$(awk '{print $14 + $15}' "/proc/$SERVER/stat")
  out=$(wrk -t1 -c16 -d"${DUR}s" -s "$D/$sz.lua" "$url")
  c1=$(awk '{print $14 + $15}' "/proc/$SERVER/stat")
  kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
  SERVER=
  echo "$out" | grep -q "Non-2xx" && { echo "non-2xx answers from $tree" >&2; exit 1; }
  awk -v c=$((c1 - c0)) -v t="$TICK" -v rps="$(echo "$out" | awk '/Requests\/sec/ {print $2}')" -v n="$(echo "$out" | awk '/requests in/ {print $1}')" \
    'BEGIN { printf "%6.0f req/s %6.1f µs/req", rps, c / t * 1e6 / n }'
}
echo "objects cpu-ab: $RT server, $ROUNDS rounds × ${DUR}s per run, $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC')"
for r in $(seq 1 "$ROUNDS"); do
  for sz in ${SIZES:-s m}; do
    if [ $((r % 2)) = 0 ]; then a=$(run "$OTHER" $sz); b=$(run "$HERE" $sz); else b=$(run "$HERE" $sz); a=$(run "$OTHER" $sz); fi
    echo "round $r, $([ $sz = s ] && echo 64KiB || echo 1MiB): $(basename "$OTHER") $a   this $b"
  done
done
