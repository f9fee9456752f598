#!/usr/bin/env bash
# bench/transport/bare.sh — HTTP/2 (h2c) ÷ HTTP/1.1 of the bare runtimes (bench/transport/bare-servers.mjs),
# 1 MiB and 8 MiB bodies, with the load generators and settings of bench/transport/run.ts
# (wrk -t1 -c4, h2load -c1 -m4, 3 s each): the ratio rackfeed's own rows are read against. h2c is
# measured twice: with h2load's default SETTINGS_MAX_FRAME_SIZE (16 KiB, as curl, Deno's fetch and
# undici advertise) and allowing 1 MiB frames (-f): Deno's server then sends frames that large,
# Node's sends 16 KiB frames either way.
# Run from the repo root: bash bench/transport/bare.sh   (needs wrk, h2load, node, node_modules/.bin/deno)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. bench/transport/bare-servers.sh
gbs() { # value unit -> GB/s
  awk -v v="$1" -v u="$2" 'BEGIN { m = (u == "GB") ? 1024^3 : (u == "MB") ? 1024^2 : (u == "KB") ? 1024 : 1; printf "%.2f", v * m / 1e9 }'
}
echo "| runtime | body | HTTP/1.1 GB/s | h2c GB/s | h2c ÷ HTTP/1.1 | h2c, 1 MiB frames allowed, GB/s | ÷ HTTP/1.1 |"
echo "|---|---|---|---|---|---|---|"
for rt in node deno; do
  for mib in 1 8; do
    log=$(mktemp)
    start_bare_servers $rt $((mib << 20)) "$log"
    pid=$BARE_PID
    o1=$(wrk -t1 -c4 -d3s "http://127.0.0.1:$BARE_H1/")
    o2=$(h2load -c1 -m4 -D 3 "http://127.0.0.1:$BARE_H2C/")
    o3=$(h2load -c1 -m4 -D 3 -f $((1 << 20)) "http://127.0.0.1:$BARE_H2C/")
    # Error answers are cheap: a run with any would overstate the rate.
    if grep -qE 'Non-2xx|Socket errors' <<< "$o1" || ! grep -qE ' 0 failed, 0 errored' <<< "$o2" || ! grep -qE ' 0 failed, 0 errored' <<< "$o3"; then
      echo "load generator saw errors ($rt, $mib MiB):" >&2; echo "$o1" "$o2" "$o3" >&2; kill $pid; exit 1
    fi
    read -r v1 u1 < <(sed -n 's/^Transfer\/sec: *\([0-9.]*\)\([KMG]*B\).*/\1 \2/p' <<< "$o1")
    read -r v2 u2 < <(sed -n 's/^finished in .*, \([0-9.]*\)\([KMG]*B\)\/s.*/\1 \2/p' <<< "$o2")
    read -r v3 u3 < <(sed -n 's/^finished in .*, \([0-9.]*\)\([KMG]*B\)\/s.*/\1 \2/p' <<< "$o3")
    kill $pid 2>/dev/null; wait $pid 2>/dev/null || true; rm -f "$log"
    g1=$(gbs "$v1" "$u1"); g2=$(gbs "$v2" "$u2"); g3=$(gbs "$v3" "$u3")
    r() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
    echo "| $rt | $mib MiB | $g1 | $g2 | $(r "$g2" "$g1")× | $g3 | $(r "$g3" "$g1")× |"
  done
done
