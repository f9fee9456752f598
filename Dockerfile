# rackfeed on Deno (the primary runtime). Deno and every package come from npm, so the build
# needs only the npm registry. Build: docker build -t rackfeed .
FROM node:20-bookworm-slim

WORKDIR /app
ENV DENO_NO_UPDATE_CHECK=1 NO_COLOR=1

COPY package.json package-lock.json ./
# npm install also builds the native gather (native/build/librackfeed.so, scripts/build-native.mjs):
# the compiler is installed for that step only.
COPY scripts/build-native.mjs ./scripts/
COPY native/gather.c native/tcp.c ./native/
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
 && npm install --no-audit --no-fund && node_modules/.bin/deno --version && test -f native/build/librackfeed.so \
 && apt-get purge -y gcc libc6-dev && apt-get autoremove -y && rm -rf /var/lib/apt/lists/*

COPY deno.json tsconfig.json ./
COPY src ./src
# Type-check and cache the module graph at build time, so start-up needs nothing from outside.
RUN node_modules/.bin/deno check src/main.ts && node_modules/.bin/deno cache src/main.ts

RUN useradd --system --home /app rackfeed && mkdir -p /cache /app/.rackfeed-demo && chown rackfeed /cache /app/.rackfeed-demo
USER rackfeed
VOLUME ["/cache"]
EXPOSE 8080

# FFI for the native gather only (batches copied with memcpy; without it, in JavaScript).
ENTRYPOINT ["node_modules/.bin/deno", "run", "--no-prompt", "--allow-net", "--allow-read", "--allow-write", "--allow-env", "--allow-sys", "--allow-ffi=/app/native/build/librackfeed.so", "src/main.ts"]
# The demo on all interfaces of the container; pass `serve --origin NAME=/path ...` to serve real data.
CMD ["demo", "--listen", "0.0.0.0:8080", "--cache-dir", "/cache"]
