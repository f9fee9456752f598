#!/usr/bin/env bash
# bench/datasets/wrk-batches.sh — warm token batches (micro_batch 8 × 4097 uint16 = 64 KiB) over
# HTTP/1.1 at 4 requests in flight (`wrk -t1 -c4`, a C load generator, so the client is not the
# bound), one consumer stepping through 1500 steps in order, from rackfeed on Node and on Deno:
# requests/s and the server's CPU per request (/proc). Baseline in the same run: the bare runtime's
# own server sending one fixed body of a batch's size (65 552 bytes) (bench/transport/bare-servers.mjs), i.e. what HTTP
# alone costs there. Data: bench/.out/datasets/u16 (made by bench/datasets/common.ts if missing).
# Run from the repo root: bash bench/datasets/wrk-batches.sh [SECONDS=3]   (needs wrk; RTS="node deno" picks the runtimes)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. bench/transport/bare-servers.sh
secs=${1:-3}
data=bench/.out/datasets
node --import tsx -e 'import { DATASETS, ensureDataset } from "./bench/datasets/common.ts"; ensureDataset(process.argv[1], DATASETS[0]);' "$data"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
admin=wrk-batches-admin-token-0123456789
printf 'local i = 0\nrequest = function()\n  local p = "/v1/datasets/u16/batches/" .. i .. "?rank=0&world=1&micro_batch=8"\n  i = (i + 1) %% 1500\n  return wrk.format("GET", p)\nend\n' > "$work/steps.lua"
rate() { # wrk's requests/s; fails on any error (cheap error answers would inflate it)
  local out
  out=$(wrk -t1 -c4 -d"${secs}s" "$@")
  if grep -qE 'Non-2xx|Socket errors' <<< "$out"; then echo "wrk saw errors: $out" >&2; return 1; fi
  awk '/Requests\/sec/ { print $2 }' <<< "$out"
}
cpu() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
tck=$(getconf CLK_TCK)
us() { awk -v t="$1" -v r="$2" -v s="$secs" -v k="$tck" 'BEGIN { printf "%.0f", t / k * 1e6 / (r * s) }'; } # CPU ticks, requests/s -> µs each
echo "| server | requests/s | server CPU µs per request | × bare |"
echo "|---|---|---|---|"
for rt in ${RTS:-node deno}; do
  log="$work/$rt.log"
  start_bare_servers $rt 65552 "$log"
  bare=$BARE_PID
  rate "http://127.0.0.1:$BARE_H1/" > /dev/null
  c0=$(cpu $bare); bare_rps=$(rate "http://127.0.0.1:$BARE_H1/"); c1=$(cpu $bare)
  kill $bare; wait $bare 2>/dev/null || true
  flags=(serve --listen 127.0.0.1:0 --origin "bench=$data" --cache-dir "$work/c-$rt" --admin-token "$admin" --memory-bytes 2GiB --disk-bytes 4GiB --shm-dir off)
  if [ $rt = node ]; then node --import tsx src/main.node.ts "${flags[@]}" > "$log" 2>&1 & else node_modules/.bin/deno run -A src/main.ts "${flags[@]}" > "$log" 2>&1 & fi
  srv=$!
  for _ in $(seq 1 200); do grep -q 'listening on' "$log" && break; sleep 0.1; done
  url=$(sed -n 's/.*listening on \(http:\/\/[^ ]*\).*/\1/p' "$log" | head -1)
  curl -sf -X PUT -H "authorization: Bearer $admin" -H "content-type: application/json" "$url/v1/datasets/u16" \
    -d '{"sources":[{"prefix":"bench/u16"}],"seq_length":4096,"seed":1234,"split":"100,0,0","split_index":0,"num_samples":12000}' > /dev/null
  rate -s "$work/steps.lua" "$url" > /dev/null # every block into the memory tier
  c2=$(cpu $srv); rps=$(rate -s "$work/steps.lua" "$url"); c3=$(cpu $srv)
  kill $srv; wait $srv 2>/dev/null || true
  echo "| $rt bare server, fixed body of that size (baseline) | ${bare_rps%.*} | $(us $((c1 - c0)) "$bare_rps") | 1.00 |"
  echo "| rackfeed $rt, token batches | ${rps%.*} | $(us $((c3 - c2)) "$rps") | $(awk -v a="$rps" -v b="$bare_rps" 'BEGIN { printf "%.2f", a / b }') |"
done
