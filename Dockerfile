# rackfeed on Deno (the primary runtime). Deno and every package come from npm, so the build
# needs only the npm registry. Build: docker build -t rackfeed .
FROM node:20-bookworm-slim

WORKDIR /app
ENV DENO_NO_UPDATE_CHECK=1 NO_COLOR=1

COPY package.json package-lock.json ./
RUN npm install --no-audit --no-fund && node_modules/.bin/deno --version

COPY deno.json tsconfig.json ./
COPY src ./src
# Type-check and cache the module graph at build time, so start-up needs nothing from outside.
RUN node_modules/.bin/deno check src/main.ts && node_modules/.bin/deno cache src/main.ts

RUN useradd --system --home /app rackfeed && mkdir -p /cache /app/.rackfeed-demo && chown rackfeed /cache /app/.rackfeed-demo
USER rackfeed
VOLUME ["/cache"]
EXPOSE 8080

ENTRYPOINT ["node_modules/.bin/deno", "run", "--allow-net", "--allow-read", "--allow-write", "--allow-env", "--allow-sys", "src/main.ts"]
# The demo on all interfaces of the container; pass `serve --origin NAME=/path ...` to serve real data.
CMD ["demo", "--listen", "0.0.0.0:8080", "--cache-dir", "/cache"]
