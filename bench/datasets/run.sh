#!/usr/bin/env bash
# bench/datasets — the issue-4 dataset benchmarks, each printing its figures beside a baseline
# measured in the same run (see the header of each script for what is measured and how):
#   1. warm-batches.ts  warm batches/s, p50/p99 over HTTP/1.1 (Deno, Node) vs a numpy memmap gather
#   2. cold-trainer.ts  t_wait of a 20 ms-step trainer on a cold +20 ms origin, read-ahead on vs off
#   3. index-build.ts   index build time and memory for ~10 G tokens vs the raw array sizes (Node, Deno)
#   4. eviction.ts      memory-tier hit rate, --memory-eviction belady vs lru, two epochs
#   5. registration-stall.ts  trainer batch latency while a ~10 G-token dataset registers: worker vs event loop
# Run from the repo root:   bash bench/datasets/run.sh [warm|cold|index|evict|stall ...]   (default: all)
# Data (synthetic, ~1.5 GiB) and scratch go to bench/.out/datasets/ (git-ignored); everything is
# loopback; every loop is bounded in count and each script in time. Output also goes to
# bench/.out/datasets/report.txt.
# Needs: node (deps installed), node_modules/.bin/deno, /usr/bin/python3 with python3-numpy
# (installed with apt-get when missing and running as root).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=bench/.out/datasets
mkdir -p "$OUT"
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(warm cold index evict)

if ! /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq python3-numpy >/dev/null; else echo "need python3-numpy" >&2; exit 1; fi
fi

header() {
  echo
  echo "## $1 — $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo ' + uncommitted src changes'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "\$ $2"
}
run() { # title, command...
  local title=$1; shift
  header "$title" "$*"
  "$@" 2> >(grep -v 'npm warn' >&2)
}

{
  for p in "${parts[@]}"; do
    case $p in
      warm) run "warm batches" node --import tsx bench/datasets/warm-batches.ts ;;
      cold) run "cold trainer" node --import tsx bench/datasets/cold-trainer.ts ;;
      index)
        run "index build (Node)" node --expose-gc --import tsx bench/datasets/index-build.ts
        run "index build (Deno)" node_modules/.bin/deno run -A --v8-flags=--expose-gc bench/datasets/index-build.ts
        BENCH_EPOCHS=3 run "index build, 3 epochs (Node)" node --expose-gc --import tsx bench/datasets/index-build.ts ;;
      evict)
        run "eviction" node --import tsx bench/datasets/eviction.ts
        # The same with read-ahead's horizon below the memory budget (8 steps x ~25 blocks x 64 KiB = 12.5 MiB).
        BENCH_MEMORY=32MiB BENCH_EXTRA_FLAGS="--read-ahead-max-steps 8" run "eviction, --read-ahead-max-steps 8" node --import tsx bench/datasets/eviction.ts ;;
      stall) run "trainer batches during a large registration" node --import tsx bench/datasets/registration-stall.ts ;;
      *) echo "unknown part $p (warm|cold|index|evict|stall)" >&2; exit 2 ;;
    esac
  done
} | tee "$OUT/report.txt"
