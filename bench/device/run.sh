#!/usr/bin/env bash
# bench/device/run.sh — the issue-5 benchmarks on a lent GPU machine (16 cores, one H100/H200):
# bench/gpu (shm ring -> GPU), bench/transport (with TLS rows), the bare runtimes' HTTP/2 ÷ HTTP/1.1
# (bench/transport/bare.sh) and warm token batches vs numpy, each with its baseline in the same
# run. Unpacks .devkit/ (bench/device/make-kit.sh) first.
# Run there from the repo root: bash bench/device/run.sh [gpu] [transport] [bare] [wrk] [warm]  (default: all)
#   transport-js, warm-js: the same with --native-gather off (batches copied in JavaScript), for an A/B.
#   consumer-start: what starting a shm consumer costs, rings kept for the next or not
#   (bench/shm/consumer-start.sh, Node then Deno server); after warm (its dataset).
#   client: the SDK's own CPU per shm batch (bench/shm/client-cost.ts, both runtimes; after warm, beside numpy).
#   warm-2t: warm with --native-gather-threads 2 (each token batch copied on the event loop, no
#   groups of steps on a copy thread), for an A/B of the group copy.
#   event-loop: the servers' event-loop CPU per token batch over shm with every step new
#   (bench/datasets/event-loop-ab.sh FRESH=1, Node then Deno), beside numpy; after warm (its dataset).
#   profile: event-loop's FRESH run once on a Node server with V8 CPU profiles of its threads, each
#   summarized (bench/objects/cpuprof.mjs), the main thread's kept in $OUT; after warm (its dataset).
#   EVENT_LOOP_OTHER=DIR also runs the tree of another commit in each round (an A/B; carry it).
#   Carry native/build too (the device tool's carry), or the servers copy in JavaScript where no cc is there.
# Figures go to stdout and to $OUT (the device tool's folder), or bench/.out/device.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=${OUT:-bench/.out/device}
mkdir -p "$out"
parts=("$@"); [ ${#parts[@]} -eq 0 ] && parts=(gpu transport bare wrk warm)
rt=/tmp/rackfeed-rt
mkdir -p "$rt/bin" "$rt/root"
t0=$(date +%s)
[ -x "$rt/bin/node" ] || xz -dc .devkit/node.xz > "$rt/bin/node" &
[ -x node_modules/deno/deno ] || { mkdir -p node_modules/deno && xz -dc .devkit/deno.xz > node_modules/deno/deno.part && mv node_modules/deno/deno.part node_modules/deno/deno; } &
[ -d node_modules/tsx ] || xz -dc .devkit/nm.tar.xz | tar -xf - &
wait
chmod +x "$rt/bin/node" node_modules/deno/deno
for f in .devkit/debs/*.deb; do dpkg -x "$f" "$rt/root"; done
for t in wrk h2load; do
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$rt/root/usr/lib/x86_64-linux-gnu" "$rt/root/usr/bin/$t" > "$rt/bin/$t"
  chmod +x "$rt/bin/$t"
done
export PATH="$rt/bin:$PATH"
[ -f native/build/librackfeed.so ] || node scripts/build-native.mjs 2>&1 || true
echo "native gather: $(ls native/build/librackfeed.so 2>/dev/null || echo 'not built (no cc): servers copy in JavaScript')"
[ -d /dev/shm ] || { mkdir -p /dev/shm && mount -t tmpfs tmpfs /dev/shm; }
tls=0; command -v openssl >/dev/null && tls=1
py=$(command -v python3)
echo "unpacked in $(( $(date +%s) - t0 )) s; node $(node --version), $(node_modules/deno/deno --version | head -1), $py"
echo "$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(free -g | awk '/Mem:/{print $2}') GiB, kernel $(uname -r)"
nvidia-smi -L 2>&1 | head -2
df -h /dev/shm | tail -1
for t in wrk h2load; do LD_LIBRARY_PATH=$rt/root/usr/lib/x86_64-linux-gnu ldd "$rt/root/usr/bin/$t" | grep 'not found' && echo "$t is missing libraries"; done
"$py" -c 'import numpy, msgpack, torch; print("numpy", numpy.__version__, "torch", torch.__version__, "cuda", torch.cuda.is_available())'
part() { # name, seconds, command...
  local name=$1 secs=$2; shift 2
  echo; echo "## $name — $(date -u '+%H:%M:%S UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
  timeout "$secs" "$@" 2>&1 | tee "$out/$name.txt"
  echo "($name: exit ${PIPESTATUS[0]})"
  rm -rf /dev/shm/rackfeed-bench-* /dev/shm/rackfeed-gpu-bench-* # left behind when timeout stopped a bench
}
for p in "${parts[@]}"; do
  case $p in
    gpu) BENCH_PYTHON=$py part gpu "${BENCH_GPU_SECONDS:-150}" node --import tsx bench/gpu/run.ts ;;
    transport) BENCH_TLS=${BENCH_TLS:-$tls} part transport "${BENCH_TRANSPORT_SECONDS:-240}" node --import tsx bench/transport/run.ts ;;
    transport-js) BENCH_TLS=0 BENCH_ARGS="--native-gather off" part transport-js "${BENCH_TRANSPORT_SECONDS:-240}" node --import tsx bench/transport/run.ts ;;
    warm-js) BENCH_PYTHON=$py BENCH_REPS=${BENCH_REPS:-1} BENCH_EXTRA_FLAGS="--native-gather off" part warm-js "${BENCH_WARM_SECONDS:-240}" node --import tsx bench/datasets/warm-batches.ts ;;
    bare) part bare "${BENCH_BARE_SECONDS:-60}" bash bench/transport/bare.sh ;;
    wrk) part wrk "${BENCH_WRK_SECONDS:-90}" bash bench/datasets/wrk-batches.sh ;;
    warm-2t) BENCH_PYTHON=$py BENCH_REPS=${BENCH_REPS:-1} BENCH_EXTRA_FLAGS="--native-gather-threads 2" part warm-2t "${BENCH_WARM_SECONDS:-240}" node --import tsx bench/datasets/warm-batches.ts ;;
    warm) BENCH_PYTHON=$py BENCH_REPS=${BENCH_REPS:-1} part warm "${BENCH_WARM_SECONDS:-240}" node --import tsx bench/datasets/warm-batches.ts ;;
    event-loop) for r in node deno; do DENO=$PWD/node_modules/deno/deno FRESH=1 RUNTIME=$r ROUNDS=${BENCH_REPS:-2} part "event-loop-$r" 150 bash bench/datasets/event-loop-ab.sh ${EVENT_LOOP_OTHER:-}; done ;;
    profile) rm -rf /tmp/rackfeed-prof && mkdir -p /tmp/rackfeed-prof
      PROFILE_DIR=/tmp/rackfeed-prof FRESH=1 RUNTIME=node ROUNDS=1 part profile 150 bash bench/datasets/event-loop-ab.sh
      for f in $(ls -S /tmp/rackfeed-prof/*.cpuprofile); do node bench/objects/cpuprof.mjs summary "$f" 40 | tee -a "$out/profile.txt"; done
      cp /tmp/rackfeed-prof/CPU.*.*.*.0.*.cpuprofile "$out/main.cpuprofile" ;;
    consumer-start) for r in node deno; do DENO=$PWD/node_modules/deno/deno RUNTIME=$r ROUNDS=${BENCH_REPS:-2} part "consumer-start-$r" 120 bash bench/shm/consumer-start.sh; done ;;
    client) part client-node 60 node --import tsx bench/shm/client-cost.ts; part client-deno 60 node_modules/deno/deno run -A bench/shm/client-cost.ts ;;
    *) echo "unknown part $p (gpu|transport|transport-js|bare|wrk|warm|warm-js|warm-2t|event-loop|profile|consumer-start|client)" >&2; exit 2 ;;
  esac
done
