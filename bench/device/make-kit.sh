#!/usr/bin/env bash
# bench/device/make-kit.sh — packs what bench/device/run.sh needs on a lent GPU machine, where
# nothing can be installed: node and deno (xz), node_modules without dev-only packages and without
# other platforms' koffi builds, and wrk + h2load with the libraries Ubuntu lacks (Debian debs).
# Writes .devkit/ (git-ignored through .git/info/exclude; under the device tool's 64 MiB limit).
# Run here, as root, after `npm install`: bash bench/device/make-kit.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
mkdir -p .git/info && { grep -qx '/.devkit/' .git/info/exclude 2>/dev/null || echo '/.devkit/' >> .git/info/exclude; }
mkdir -p .devkit/debs
[ -s .devkit/node.xz ] || xz -T0 -9 -c "$(command -v node)" > .devkit/node.xz
[ -s .devkit/deno.xz ] || xz -T0 -9 -c node_modules/deno/deno > .devkit/deno.xz
excl=()
for d in node_modules/koffi/build/koffi/*; do [ "$(basename "$d")" = linux_x64 ] || excl+=("--exclude=$d"); done
tar --exclude='node_modules/@deno' --exclude='node_modules/deno/deno' --exclude='node_modules/typescript' \
  --exclude='node_modules/@rolldown' --exclude='node_modules/rolldown' --exclude='node_modules/playwright-core' \
  --exclude='node_modules/vitest' --exclude='node_modules/@vitest' --exclude='node_modules/vite' \
  --exclude='node_modules/lightningcss*' --exclude='node_modules/fast-check' --exclude='node_modules/@types' \
  --exclude='node_modules/koffi/src' --exclude='node_modules/koffi/vendor' --exclude='node_modules/koffi/doc' \
  --exclude='node_modules/.cache' "${excl[@]}" -cf - node_modules | xz -T0 -9 > .devkit/nm.tar.xz
(cd .devkit/debs && apt-get download wrk nghttp2-client libnghttp2-14 libev4 libjansson4 libjemalloc2 libluajit-5.1-2 2>&1 | grep -v '^W:' || true)
du -cb .devkit/* .devkit/debs/* | tail -1
