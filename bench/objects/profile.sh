#!/usr/bin/env bash
# bench/objects/profile.sh — how far rackfeed's 64 KiB serving path is from the bare runtime,
# and where its time goes. For each runtime (Deno, Node) it measures, one server at a time:
#   raw       the runtime's own HTTP server returning a 64 KiB body from memory (bare.ts raw)
#   stream    (Deno only) the same with the body in a one-chunk ReadableStream, which Deno does
#             not copy (it copies a Uint8Array body)
#   hono      a one-route Hono app on the same adapter rackfeed uses (bare.ts hono)
#   rackfeed  the real server, warm cache (src/main.ts / src/main.node.ts)
# with wrk (16 connections, rotating over 16 objects), and reports req/s and the server's CPU
# per request (µs of user+sys CPU of its process tree per answer): on a small shared machine the
# CPU cost per request is the robust figure, req/s depends on how much CPU wrk leaves over.
# Then the in-process cost of the handler alone (handler.ts), and it records a V8 CPU profile of each rackfeed (and hono) under the same load through the
# inspector and prints the top self-time buckets and functions (cpuprof.mjs).
#
# Run from the repo root:   bash bench/objects/profile.sh
# Knobs: PROF_DURATION=6 (s per measurement) PROF_CONNECTIONS=16 PROF_THREADS=2
#   PROF_PROFILE=1 (0 skips the CPU profiles) PROF_REPS=2 (interleaved reps of the measurement)
# Output: bench/.out/profile/ (summary.txt, *.cpuprofile — open them in Chrome DevTools).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD
HERE=$ROOT/bench/objects
OUT=$ROOT/bench/.out
DATA=$OUT/objects-data
P=$OUT/profile
DURATION=${PROF_DURATION:-6}
CONNS=${PROF_CONNECTIONS:-16}
THREADS=${PROF_THREADS:-2}
PROFILE=${PROF_PROFILE:-1}
REPS=${PROF_REPS:-2}
DENO=$ROOT/node_modules/.bin/deno
HZ=$(getconf CLK_TCK)

log() { printf '[profile %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
command -v wrk >/dev/null || die "wrk missing (apt-get install -y wrk, or run bench/objects/run.sh once)"

mkdir -p "$DATA"
for ((i = 0; i < 16; i++)); do
  f=$DATA/obj-64k-$i.bin
  [ -f "$f" ] && [ "$(stat -c %s "$f")" -eq 65536 ] || head -c 65536 /dev/urandom >"$f"
done
rm -rf "$P"; mkdir -p "$P"
PATHS=(); for ((i = 0; i < 16; i++)); do PATHS+=("/v1/objects/bench/obj-64k-$i.bin"); done

CUR=""   # session leader of the server now running
stop_server() {
  [ -n "$CUR" ] || return 0
  kill -TERM -- "-$CUR" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 -- "-$CUR" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- "-$CUR" 2>/dev/null || true
  CUR=""
}
trap 'stop_server' EXIT
trap 'exit 130' INT TERM

cmd_of() { # runtime variant [inspect-port] -> command line
  local rt=$1 v=$2 insp=${3:+--inspect=127.0.0.1:$3}
  local serve=(serve --listen 127.0.0.1:0 --origin "bench=$DATA" --cache-dir "$P/cache-$rt" --memory-bytes 2GiB --disk-bytes 4GiB)
  case "$rt/$v" in
    deno/raw | deno/hono | deno/stream) echo "$DENO run -A $insp $HERE/bare.ts $v 0" ;;
    node/raw | node/hono) echo "node $insp --import tsx $HERE/bare.ts $v 0" ;;
    deno/rackfeed) echo "$DENO run -A $insp src/main.ts ${serve[*]}" ;;
    node/rackfeed) echo "node $insp --import tsx src/main.node.ts ${serve[*]}" ;;
  esac
}

PORT=""
start_server() { # name command...
  local name=$1; shift
  local logf=$P/$name.log
  setsid "$@" >"$logf" 2>&1 </dev/null &
  CUR=$!
  PORT=""
  for _ in $(seq 1200); do
    PORT=$(sed -nE 's#.*listening on http://[^ ]*:([0-9]+).*#\1#p' "$logf" | head -1)
    [ -n "$PORT" ] && break
    kill -0 "$CUR" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$PORT" ] || { tail -20 "$logf" >&2; die "$name did not start"; }
  for p in "${PATHS[@]}"; do   # warm (fills rackfeed's cache) and check
    local code; code=$(curl -s --max-time 10 -o /dev/null -w '%{http_code} %{size_download}' "http://127.0.0.1:$PORT$p")
    [ "$code" = "200 65536" ] || die "$name: GET $p answered '$code'"
  done
}

tree_ticks() {
  local sum=0 p v
  for p in $(ps -s "$1" -o pid= 2>/dev/null); do
    v=$(sed -E 's/^.*\) //' "/proc/$p/stat" 2>/dev/null | awk '{print $12 + $13}') || continue
    sum=$((sum + ${v:-0}))
  done
  echo "$sum"
}

wrk_run() { # seconds rawfile
  timeout $(($1 + 30)) wrk -t"$THREADS" -c"$CONNS" -d"$1s" --timeout 10s -s "$HERE/rotate.lua" \
    "http://127.0.0.1:$PORT" -- "${PATHS[@]}" >"$2" 2>&1 || true
}

RES=$P/results.tsv
: >"$RES"
measure() { # rep runtime variant
  local name=$2-$3
  start_server "$name" $(cmd_of "$2" "$3")
  wrk_run 2 "$P/warm-$name.txt"
  local s0 s1 raw=$P/r$1-$name.txt
  s0=$(tree_ticks "$CUR"); wrk_run "$DURATION" "$raw"; s1=$(tree_ticks "$CUR")
  local json; json=$(sed -n 's/^BENCHJSON //p' "$raw" | tail -1)
  [ -n "$json" ] || { cat "$raw" >&2; die "$name: no wrk result"; }
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$(((s1 - s0)))" "$json" >>"$RES"
  log "rep $1 $name: $(sed -n 's/^Requests\/sec: *//p' "$raw") req/s"
  stop_server
}

log "measuring: $REPS reps x {deno,node} x {raw,(deno) stream,hono,rackfeed} x ${DURATION}s, wrk -t$THREADS -c$CONNS, 64 KiB"
for ((rep = 1; rep <= REPS; rep++)); do
  for rt in deno node; do
    for v in raw stream hono rackfeed; do [ "$rt/$v" = node/stream ] || measure "$rep" "$rt" "$v"; done
  done
done

if ((PROFILE)); then
  for rt in deno node; do
    for v in hono rackfeed; do
      name=$rt-$v
      ip=$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
      start_server "prof-$name" $(cmd_of "$rt" "$v" "$ip")
      wrk_run 2 "$P/warm-prof-$name.txt"
      wrk_run $((DURATION + 2)) "$P/prof-$name.txt" &
      wpid=$!
      sleep 1
      timeout $((DURATION + 30)) node --experimental-websocket --no-warnings "$HERE/cpuprof.mjs" record "$ip" "$DURATION" "$P/$name.cpuprofile" ||
        log "WARN: profiling $name failed"
      wait "$wpid" || true
      log "profiled $name ($(sed -n 's/^Requests\/sec: *//p' "$P/prof-$name.txt") req/s with the profiler on)"
      stop_server
    done
  done
fi

{
  echo "64 KiB GETs, wrk -t$THREADS -c$CONNS -d${DURATION}s, $REPS interleaved reps, $(nproc) cores shared with wrk; $(date -u '+%Y-%m-%d %H:%M UTC')"
  node - "$RES" "$HZ" <<'EOF'
const fs = require("node:fs");
const [file, hz] = process.argv.slice(2);
const rows = fs.readFileSync(file, "utf8").trim().split("\n").map((l) => {
  const [rep, rt, v, ticks, json] = l.split("\t");
  const w = JSON.parse(json);
  const errs = Object.values(w.errors).reduce((a, b) => a + b, 0);
  return { rep: +rep, rt, v, rps: w.rps, p50: w.lat_us.p50 / 1000, p99: w.lat_us.p99 / 1000, cores: ticks / hz / w.duration_s, usPerReq: (1e6 * ticks / hz) / w.requests, errs };
});
const med = (xs) => { const s = [...xs].sort((a, b) => a - b), m = s.length >> 1; return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2; };
console.log("| runtime | server | req/s | p50 ms | p99 ms | server cores | server CPU µs/req | µs/req vs raw | errors |");
console.log("|---|---|---:|---:|---:|---:|---:|---:|---:|");
for (const rt of ["deno", "node"]) {
  const base = med(rows.filter((r) => r.rt === rt && r.v === "raw").map((r) => r.usPerReq));
  for (const v of ["raw", "stream", "hono", "rackfeed"]) {
    const rs = rows.filter((r) => r.rt === rt && r.v === v);
    if (!rs.length) continue;
    const m = (f) => med(rs.map(f));
    console.log(`| ${rt} | ${v} | ${m((r) => r.rps).toFixed(0)} | ${m((r) => r.p50).toFixed(2)} | ${m((r) => r.p99).toFixed(2)} | ${m((r) => r.cores).toFixed(2)} | ${m((r) => r.usPerReq).toFixed(1)} | ${(m((r) => r.usPerReq) / base).toFixed(2)}x | ${rs.reduce((a, r) => a + r.errs, 0)} |`);
  }
}
console.log(`(median of ${new Set(rows.map((r) => r.rep)).size} reps; µs/req = server process-tree user+sys CPU ÷ answers)`);
EOF
  echo
  echo "In-process handler cost (bench/objects/handler.ts, no sockets; subtract 'request only'):"
  timeout 300 "$DENO" run -A "$HERE/handler.ts" "$DATA" 50000 2>&1 || echo "(deno handler.ts failed)"
  timeout 300 node --import tsx "$HERE/handler.ts" "$DATA" 50000 2>&1 || echo "(node handler.ts failed)"
  if ((PROFILE)); then
    for f in "$P"/*.cpuprofile; do echo; node "$HERE/cpuprof.mjs" summary "$f" 20; done
  fi
} | tee "$P/summary.txt"
