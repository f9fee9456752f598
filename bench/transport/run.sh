#!/usr/bin/env bash
# bench/transport — HTTP/1.1 vs h2c vs the shared-memory ring, beside memcpy (see run.ts's header).
# Installs wrk and h2load (Debian: wrk, nghttp2-client) when missing and running as root.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
if ! command -v wrk >/dev/null || ! command -v h2load >/dev/null; then
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq wrk nghttp2-client >/dev/null
  else echo "bench/transport needs wrk and h2load (apt-get install wrk nghttp2-client)" >&2; exit 1; fi
fi
echo "## transport — $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(git rev-parse --short HEAD), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
exec node --import tsx bench/transport/run.ts
