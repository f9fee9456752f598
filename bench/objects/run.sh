#!/usr/bin/env bash
# bench/objects — warm-cache object serving: rackfeed (Deno and Node) vs nginx, same run.
#
# What it measures: GET throughput and latency of whole objects (64 KiB, 1 MiB, 64 MiB; random
# bytes under bench/.out/objects-data/) once they are in rackfeed's cache. The baseline is
# nginx serving the same files from the page cache (1 worker, sendfile, tcp_nopush): about the
# best a single-process HTTP/1.1 file server does on this machine. The load is wrk, 16 keep-alive
# connections, rotating over several files of one size. Targets are INTERLEAVED per repetition
# (for rep: for size: nginx, deno, node) so that drift and neighbours' noise hit all alike.
#
# How to read the table it prints (also saved to bench/.out/objects-report.md):
#   req/s, GB/s (= req/s x body bytes / 1e9), p50/p99 latency: median over repetitions, (min–max).
#   ratio: rackfeed req/s ÷ nginx req/s within the same repetition, median (min–max). 1.00 = as
#   fast as nginx; the load generator shares the machine, so the ratio is the robust figure,
#   the absolute numbers are for this box only.
#   CPU columns: cores used during the run by the server (its whole process tree), by wrk, and
#   by everything else on the machine ("other": noise, should be ~0).
#   Any run with socket errors, non-2xx answers (wrk counts status >= 400), short bodies, a dead
#   server, or busy neighbours is flagged under the table, and the script exits 1 on errors.
#
# Run from the repo root:   bash bench/objects/run.sh
# Knobs (environment): BENCH_REPS=3 BENCH_DURATION=8 (s per target) BENCH_CONNECTIONS=16
#   BENCH_THREADS=2 BENCH_WARM_S=2 (unmeasured wrk warm-up per size and target).
#   BENCH_DENO_CMD / BENCH_NODE_CMD replace the server command (only to test the harness).
# Needs: root or sudo for apt-get (only if nginx/wrk are missing), node, curl.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD
HERE=$ROOT/bench/objects
OUT=$ROOT/bench/.out
DATA=$OUT/objects-data
RUN=$OUT/objects-run          # logs, nginx prefix, raw wrk output; wiped each run
REPS=${BENCH_REPS:-3}
DURATION=${BENCH_DURATION:-8}
CONNS=${BENCH_CONNECTIONS:-16}
THREADS=${BENCH_THREADS:-2}
WARM_S=${BENCH_WARM_S:-2}
SIZES=(64k 1m 64m)
declare -A BYTES=([64k]=65536 [1m]=1048576 [64m]=67108864)
declare -A COUNT=([64k]=16 [1m]=8 [64m]=4)
TARGETS=(nginx deno node)

log() { printf '[objects %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# ---- cleanup: every server runs in its own session (setsid), so we stop the whole tree ----
STARTED=()   # session leader pids
# shellcheck disable=SC2317  # invoked by trap
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for pid in "${STARTED[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  for _ in $(seq 50); do   # up to 5 s for a graceful exit
    local alive=0
    for pid in "${STARTED[@]}"; do kill -0 -- "-$pid" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  for pid in "${STARTED[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- 1. tools ----
need=()
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
command -v wrk >/dev/null || need+=(wrk)
command -v curl >/dev/null || need+=(curl)
command -v ps >/dev/null || need+=(procps)
if ((${#need[@]})); then
  SUDO=(); [ "$(id -u)" -eq 0 ] || SUDO=(sudo)
  log "installing ${need[*]} (apt-get)"
  timeout 300 "${SUDO[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive timeout 600 "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
command -v node >/dev/null || die "node is required"

read -ra DENO_CMD <<<"${BENCH_DENO_CMD:-node_modules/.bin/deno run -A src/main.ts}"
read -ra NODE_CMD <<<"${BENCH_NODE_CMD:-node_modules/.bin/tsx src/main.node.ts}"
if [ -z "${BENCH_DENO_CMD:-}" ]; then
  [ -f src/main.ts ] || die "src/main.ts not found (is the server written yet?)"
  [ -f src/main.node.ts ] || die "src/main.node.ts not found"
fi

# ---- 2. test objects (kept between runs; remade if a size is off) ----
mkdir -p "$DATA"
for s in "${SIZES[@]}"; do
  for ((i = 0; i < COUNT[$s]; i++)); do
    f=$DATA/obj-$s-$i.bin
    if [ ! -f "$f" ] || [ "$(stat -c %s "$f")" -ne "${BYTES[$s]}" ]; then
      head -c "${BYTES[$s]}" /dev/urandom >"$f.tmp" && mv "$f.tmp" "$f"
    fi
  done
done
(cd "$DATA" && sha256sum obj-*.bin >"$OUT/objects-data.sha256")
rm -rf "$RUN" "$OUT/cache-deno" "$OUT/cache-node"
mkdir -p "$RUN/wrk" "$RUN/nginx/tmp"

free_port() {
  node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'
}

# ---- 3. nginx ----
NGINX_PORT=$(free_port)
USER_LINE=""; [ "$(id -u)" -eq 0 ] && USER_LINE="user root;"
cat >"$RUN/nginx/nginx.conf" <<EOF
$USER_LINE
worker_processes 1;
daemon off;
pid $RUN/nginx/nginx.pid;
error_log $RUN/nginx/error.log warn;
events { worker_connections 1024; }
http {
  sendfile on;
  tcp_nopush on;
  tcp_nodelay on;
  access_log off;
  keepalive_timeout 120s;
  keepalive_requests 1000000;
  default_type application/octet-stream;
  client_body_temp_path $RUN/nginx/tmp/body;
  proxy_temp_path $RUN/nginx/tmp/proxy;
  fastcgi_temp_path $RUN/nginx/tmp/fastcgi;
  uwsgi_temp_path $RUN/nginx/tmp/uwsgi;
  scgi_temp_path $RUN/nginx/tmp/scgi;
  server {
    listen 127.0.0.1:$NGINX_PORT;
    location /v1/objects/bench/ { alias $DATA/; }
  }
}
EOF

declare -A PORT PID
start_nginx() {
  setsid "$NGINX" -p "$RUN/nginx" -e "$RUN/nginx/error.log" -c "$RUN/nginx/nginx.conf" \
    >"$RUN/nginx.log" 2>&1 </dev/null &
  PID[nginx]=$!; STARTED+=("$!")
  for _ in $(seq 100); do   # up to 10 s
    curl -sf -o /dev/null "http://127.0.0.1:$NGINX_PORT/v1/objects/bench/obj-64k-0.bin" && break
    kill -0 "${PID[nginx]}" 2>/dev/null || break
    sleep 0.1
  done
  curl -sf -o /dev/null "http://127.0.0.1:$NGINX_PORT/v1/objects/bench/obj-64k-0.bin" ||
    { cat "$RUN/nginx.log" "$RUN/nginx/error.log" >&2 || true; die "nginx did not come up"; }
  PORT[nginx]=$NGINX_PORT
  log "nginx $("$NGINX" -v 2>&1 | sed 's/.*\///') on 127.0.0.1:$NGINX_PORT (pid ${PID[nginx]})"
}

# ---- 4. rackfeed, one runtime after the other ----
start_rackfeed() { # name, command...
  local name=$1; shift
  local logf=$RUN/rackfeed-$name.log
  setsid "$@" serve --listen 127.0.0.1:0 --origin "bench=$DATA" --cache-dir "$OUT/cache-$name" \
    --memory-bytes 2GiB --disk-bytes 4GiB >"$logf" 2>&1 </dev/null &
  PID[$name]=$!; STARTED+=("$!")
  local port=""
  for _ in $(seq 1200); do   # up to 120 s (first start compiles TypeScript)
    port=$(sed -nE 's#.*listening on http://[^ ]*:([0-9]+).*#\1#p' "$logf" | head -1)
    [ -n "$port" ] && break
    kill -0 "${PID[$name]}" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$port" ] || { tail -40 "$logf" >&2; die "rackfeed-$name did not print 'listening on http://HOST:PORT'"; }
  PORT[$name]=$port
  log "rackfeed-$name on 127.0.0.1:$port (pid ${PID[$name]}): $*"
}

start_nginx
start_rackfeed deno "${DENO_CMD[@]}"
start_rackfeed node "${NODE_CMD[@]}"

# ---- 5a. warm the caches, and check every body against the file's sha256 ----
BAD=0
for t in "${TARGETS[@]}"; do
  curl -sS --max-time 10 -D - -o /dev/null "http://127.0.0.1:${PORT[$t]}/v1/objects/bench/obj-1m-0.bin" \
    >"$RUN/headers-$t.txt" 2>&1 || true
  while read -r sum name; do
    url="http://127.0.0.1:${PORT[$t]}/v1/objects/bench/$name"
    for pass in 1 2 3; do
      w=$(curl -sS --max-time 120 -o "$RUN/fetch.tmp" -w '%{http_code} %{size_download} %{time_total}' "$url" 2>&1) || true
      got=$(sha256sum "$RUN/fetch.tmp" 2>/dev/null | cut -d' ' -f1)
      echo "$t $name pass=$pass $w" >>"$RUN/warm.log"
      if [ "${w%% *}" != 200 ] || [ "$got" != "$sum" ]; then
        log "BAD BODY: $t $name pass $pass: $w sha256=${got:0:16}… want ${sum:0:16}…"
        BAD=$((BAD + 1))
      fi
    done
  done <"$OUT/objects-data.sha256"
done
rm -f "$RUN/fetch.tmp"
log "warm-up fetches done ($BAD bad); first-vs-third fetch times in $RUN/warm.log"

# ---- 5b. measure ----
paths_of() { for ((i = 0; i < COUNT[$1]; i++)); do echo "/v1/objects/bench/obj-$1-$i.bin"; done; }
tree_ticks() { # utime+stime (clock ticks) of all live processes in the session $1
  local sum=0 p v
  for p in $(ps -s "$1" -o pid= 2>/dev/null); do
    v=$(sed -E 's/^.*\) //' "/proc/$p/stat" 2>/dev/null | awk '{print $12 + $13}') || continue
    sum=$((sum + ${v:-0}))
  done
  echo "$sum"
}
# busy ticks of the whole machine, then the softirq (loopback TCP work) and steal parts of them,
# reported for information (steal = the hypervisor's neighbours).
busy_ticks() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $8, $9}' /proc/stat; }
HZ=$(getconf CLK_TCK)
RESULTS=$RUN/results.jsonl
: >"$RESULTS"

run_wrk() { # rep size target seconds -> appends one JSON line (rep 0 = warm-up, not recorded)
  local rep=$1 s=$2 t=$3 secs=$4
  local raw=$RUN/wrk/r$rep-$s-$t.txt
  local b0 s0 b1 s1 t0 t1 wrkcpu q0 q1 st0 st1
  mapfile -t paths < <(paths_of "$s")
  s0=$(tree_ticks "${PID[$t]}"); read -r b0 q0 st0 < <(busy_ticks); t0=$(date +%s.%N)
  local TIMEFORMAT='%U %S'
  { time timeout $((secs + 60)) wrk -t"$THREADS" -c"$CONNS" -d"${secs}s" --timeout 30s \
      -s "$HERE/rotate.lua" "http://127.0.0.1:${PORT[$t]}" -- "${paths[@]}" >"$raw" 2>&1 ; } 2>"$raw.time" || true
  t1=$(date +%s.%N); read -r b1 q1 st1 < <(busy_ticks); s1=$(tree_ticks "${PID[$t]}")  # (helpers run outside [b0,b1])
  ((rep > 0)) || return 0
  wrkcpu=$(awk '{print $1 + $2}' "$raw.time" | tail -1)
  local alive=true; kill -0 "${PID[$t]}" 2>/dev/null || alive=false
  local json; json=$(sed -n 's/^BENCHJSON //p' "$raw" | tail -1)
  [ -n "$json" ] || json=null
  node -e '
    const [rep,size,body,target,t0,t1,sTicks,wrkCpu,bTicks,qTicks,stTicks,hz,alive,json]=process.argv.slice(1);
    console.log(JSON.stringify({rep:+rep,size,body_bytes:+body,target,wall_s:t1-t0,
      server_cpu_s:sTicks/hz,wrk_cpu_s:+wrkCpu,busy_cpu_s:bTicks/hz,softirq_cpu_s:qTicks/hz,
      steal_cpu_s:stTicks/hz,server_alive:alive==="true",
      wrk:json==="null"?null:JSON.parse(json)}));' \
    "$rep" "$s" "${BYTES[$s]}" "$t" "$t0" "$t1" "$((s1 - s0))" "${wrkcpu:-0}" \
    "$((b1 - b0))" "$((q1 - q0))" "$((st1 - st0))" "$HZ" "$alive" "$json" >>"$RESULTS"
  log "rep $rep $s $t: $(sed -n 's/^Requests\/sec: *//p' "$raw") req/s"
}

if ((WARM_S > 0)); then
  log "unmeasured warm-up: ${WARM_S}s of wrk per size and target"
  for s in "${SIZES[@]}"; do for t in "${TARGETS[@]}"; do run_wrk 0 "$s" "$t" "$WARM_S"; done; done
fi
log "measuring: $REPS reps x ${#SIZES[@]} sizes x ${#TARGETS[@]} targets x ${DURATION}s, wrk -t$THREADS -c$CONNS"
for ((rep = 1; rep <= REPS; rep++)); do
  for s in "${SIZES[@]}"; do
    for t in "${TARGETS[@]}"; do run_wrk "$rep" "$s" "$t" "$DURATION"; done
  done
done

# ---- 6. report ----
{
  echo "Run $(date -u '+%Y-%m-%d %H:%M UTC') on $(nproc) cores ($(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)); load generator and servers share them."
  echo "nginx $("$NGINX" -v 2>&1 | sed 's/.*\///'), wrk $(wrk -v 2>&1 | head -1 | cut -d' ' -f2), node $(node --version), deno $(node_modules/.bin/deno --version 2>/dev/null | head -1 | cut -d' ' -f2)."
  echo "wrk -t$THREADS -c$CONNS -d${DURATION}s, $REPS interleaved reps, files rotated per size: 64k x${COUNT[64k]}, 1m x${COUNT[1m]}, 64m x${COUNT[64m]}."
  echo
  node "$HERE/report.mjs" "$RESULTS" "$BAD"
} | tee "$OUT/objects-report.md"
status=${PIPESTATUS[0]}
log "raw wrk output: $RUN/wrk/, server logs: $RUN/rackfeed-*.log, report: $OUT/objects-report.md"
exit "$status"
