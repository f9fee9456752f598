# bench/transport/bare-servers.sh — sourced by bench scripts: start_bare_servers RUNTIME BYTES LOG
# starts bench/transport/bare-servers.mjs on node or deno (from the repo root) and waits until it
# listens; then BARE_PID is its process, BARE_H1 and BARE_H2C its HTTP/1.1 and h2c ports.
start_bare_servers() {
  local rt=$1 bytes=$2 log=$3
  if [ "$rt" = node ]; then node bench/transport/bare-servers.mjs "$bytes" > "$log" &
  else node_modules/.bin/deno run -A bench/transport/bare-servers.mjs "$bytes" > "$log" & fi
  BARE_PID=$!
  for _ in $(seq 1 100); do grep -q '^h1 ' "$log" && grep -q '^h2c ' "$log" && break; sleep 0.1; done
  BARE_H1=$(awk '$1 == "h1" { print $2 }' "$log")
  BARE_H2C=$(awk '$1 == "h2c" { print $2 }' "$log")
}
