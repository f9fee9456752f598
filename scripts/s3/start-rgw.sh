#!/usr/bin/env bash
# start-rgw.sh [BUCKET] - single-node Ceph RADOS Gateway (S3) on 127.0.0.1, for tests.
# Installs Debian's ceph packages if missing, starts 1 mon + 1 OSD (memstore) + radosgw
# in the background, creates a user with fixed keys and BUCKET (default test-bucket),
# then prints KEY=VALUE lines on stdout (progress goes to stderr) and saves them in $RGW_DIR/env:
#   bash start-rgw.sh my-bucket >/tmp/s3.env && set -a && . /tmp/s3.env && set +a
# Idempotent: if the gateway recorded in $RGW_DIR still answers, it is reused.
# Env: RGW_DIR (/tmp/rackfeed-rgw) S3_PORT (17480) MON_PORT (13300) RGW_STORE (memstore|bluestore)
#      S3_ACCESS_KEY S3_SECRET_KEY RGW_MEM_BYTES (memstore cap, 8 GiB)
set -Eeuo pipefail

BUCKET="${1:-test-bucket}"
RGW_DIR="${RGW_DIR:-/tmp/rackfeed-rgw}"
S3_PORT="${S3_PORT:-17480}"
MON_PORT="${MON_PORT:-13300}"
RGW_STORE="${RGW_STORE:-memstore}"
RGW_MEM_BYTES="${RGW_MEM_BYTES:-8589934592}"
ACCESS_KEY="${S3_ACCESS_KEY:-RGWTESTACCESSKEY0001}"
SECRET_KEY="${S3_SECRET_KEY:-rgwtestsecretkey00000000000000000000001}"
REGION=us-east-1
ENDPOINT="http://127.0.0.1:${S3_PORT}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CONF="$RGW_DIR/ceph.conf"
T0=$(date +%s%N)
STARTED=0   # set once this run launches daemons; only then does die() stop them

log() { printf '[start-rgw %5.1fs] %s\n' "$(( ($(date +%s%N) - T0) / 1000000 ))e-3" "$*" >&2; }
die() { # print the error and log tails, stop whatever this run started, keep logs in $RGW_DIR.failed-logs
  trap - ERR
  [ "${BASH_SUBSHELL:-0}" -gt 0 ] && exit 1   # failed inside $(...): the parent shell reports
  log "ERROR: $*"
  if [ -d "$RGW_DIR/log" ]; then
    for f in "$RGW_DIR"/log/*; do [ -s "$f" ] && { echo "--- tail $f" >&2; tail -n 15 "$f" >&2; }; done
    rm -rf "$RGW_DIR.failed-logs"; cp -r "$RGW_DIR/log" "$RGW_DIR.failed-logs" 2>/dev/null || true
    log "logs kept in $RGW_DIR.failed-logs"
  fi
  if [ "$STARTED" = 1 ] && [ -f "$RGW_DIR/pids" ]; then RGW_DIR="$RGW_DIR" bash "$HERE/stop-rgw.sh" >&2; fi
  exit 1
}
trap 'die "command failed at line $LINENO: $BASH_COMMAND"' ERR
[ "$(id -u)" = 0 ] || { echo "start-rgw.sh: must run as root" >&2; exit 1; }
case "$RGW_DIR" in /tmp/?*|/var/tmp/?*|/run/?*) ;; *) echo "RGW_DIR must be under /tmp, /var/tmp or /run" >&2; exit 1;; esac
case "$RGW_STORE" in memstore|bluestore) ;; *) echo "RGW_STORE must be memstore or bluestore" >&2; exit 1;; esac
[[ "$BUCKET" =~ ^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$ ]] || { echo "start-rgw.sh: invalid bucket name '$BUCKET'" >&2; exit 1; }

print_env() {
  cat <<EOF
S3_ENDPOINT=$ENDPOINT
AWS_ACCESS_KEY_ID=$ACCESS_KEY
AWS_SECRET_ACCESS_KEY=$SECRET_KEY
AWS_REGION=$REGION
S3_BUCKET=$BUCKET
EOF
}

# signed S3 request with curl (SigV4). RGW needs x-amz-content-sha256 to be sent.
s3curl() { # METHOD PATH -> prints http status
  local m=(-X "$1"); [ "$1" = HEAD ] && m=(--head)
  curl -s -m 30 -o "$RGW_DIR/run/curl.out" -w '%{http_code}' "${m[@]}" \
    -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' \
    --aws-sigv4 "aws:amz:${REGION}:s3" --user "${ACCESS_KEY}:${SECRET_KEY}" "${ENDPOINT}$2"
}

ensure_user_and_bucket() {
  local info
  if ! info=$(timeout 30 radosgw-admin -c "$CONF" -n client.admin user info --uid=test 2>/dev/null); then
    timeout 30 radosgw-admin -c "$CONF" -n client.admin user create --uid=test --display-name="test user" \
      --access-key="$ACCESS_KEY" --secret-key="$SECRET_KEY" >/dev/null || die "user create failed"
  elif ! grep -qF "\"secret_key\": \"$SECRET_KEY\"" <<<"$info" || ! grep -qF "\"$ACCESS_KEY\"" <<<"$info"; then
    timeout 30 radosgw-admin -c "$CONF" -n client.admin key create --uid=test --key-type=s3 \
      --access-key="$ACCESS_KEY" --secret-key="$SECRET_KEY" >/dev/null || die "key create failed"
  fi
  local code
  code=$(s3curl HEAD "/$BUCKET")
  if [ "$code" != 200 ]; then
    code=$(s3curl PUT "/$BUCKET")
    case "$code" in 200|409) ;; *) die "create bucket $BUCKET: HTTP $code $(cat "$RGW_DIR/run/curl.out" 2>/dev/null)";; esac
    code=$(s3curl HEAD "/$BUCKET")
    [ "$code" = 200 ] || die "bucket $BUCKET not usable: HTTP $code"
  fi
  log "user 'test' and bucket '$BUCKET' ready"
}

# ---- reuse a running instance -------------------------------------------------
alive() { # pid -> true if running (not zombie) and started with our conf
  local pid=$1 st
  [ -r "/proc/$pid/stat" ] || return 1
  st=$(sed 's/^.*) //' "/proc/$pid/stat" | cut -d' ' -f1)
  [ "$st" != Z ] && [ "$st" != X ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$CONF"
}
if [ -f "$RGW_DIR/pids" ]; then
  all=1
  while read -r _ pid; do alive "$pid" || all=0; done <"$RGW_DIR/pids"
  if [ "$all" = 1 ] && [ "$(wc -l <"$RGW_DIR/pids")" = 3 ] && curl -sf -o /dev/null "$ENDPOINT/"; then
    log "reusing running gateway in $RGW_DIR"
    ensure_user_and_bucket
    print_env
    exit 0
  fi
  log "stale/partial state in $RGW_DIR: stopping it"
  RGW_DIR="$RGW_DIR" bash "$HERE/stop-rgw.sh" >&2
fi

# ---- install ------------------------------------------------------------------
need=()
for b in ceph-mon:ceph-mon ceph-osd:ceph-osd radosgw:radosgw radosgw-admin:radosgw \
         ceph:ceph-common ceph-authtool:ceph-common monmaptool:ceph-common curl:curl uuidgen:uuid-runtime; do
  command -v "${b%%:*}" >/dev/null 2>&1 || need+=("${b##*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
  log "apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt_inst() { apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "${need[@]}" >>/tmp/start-rgw-apt.log 2>&1; }
  : >/tmp/start-rgw-apt.log
  apt_inst || { apt-get -o DPkg::Lock::Timeout=300 update -q >>/tmp/start-rgw-apt.log 2>&1 && apt_inst; } \
    || { tail -20 /tmp/start-rgw-apt.log >&2; die "apt-get install failed (log: /tmp/start-rgw-apt.log)"; }
  log "installed"
fi

# ---- ports must be free ------------------------------------------------------------
for p in "$S3_PORT" "$MON_PORT"; do
  if ss -Hltn "sport = :$p" | grep -q .; then die "port $p already in use (set S3_PORT / MON_PORT)"; fi
done

# ---- configure --------------------------------------------------------------
rm -rf "$RGW_DIR"
mkdir -p "$RGW_DIR"/{mon,osd,rgw,run,log,crash}
touch "$RGW_DIR/.start-rgw-state"
FSID=$(uuidgen)
cat >"$CONF" <<EOF
[global]
fsid = $FSID
mon host = v2:127.0.0.1:$MON_PORT
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind msgr1 = false
ms bind ipv6 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
auth allow insecure global id reclaim = false
keyring = $RGW_DIR/keyring
run dir = $RGW_DIR/run
admin socket = $RGW_DIR/run/\$name.asok
log file = $RGW_DIR/log/\$name.log
pid file = $RGW_DIR/run/\$name.pid
crash dir = $RGW_DIR/crash
log to stderr = false
err to stderr = false
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon data avail warn = 1
mon data avail crit = 0
# commit map changes every 10 ms instead of every 1 s (pool creation dominates startup)
paxos propose interval = 0.01
paxos min wait = 0.01
[mon]
mon data = $RGW_DIR/mon
mon initial members = a
[osd]
osd data = $RGW_DIR/osd
osd objectstore = $RGW_STORE
memstore device bytes = $RGW_MEM_BYTES
bluestore block path = $RGW_DIR/osd-block.img
bluestore block create = true
bluestore block size = 21474836480
osd memory target = 1073741824
osd fast shutdown = true
osd mon shutdown timeout = 1
[client.rgw.a]
rgw frontends = beast endpoint=127.0.0.1:$S3_PORT tcp_nodelay=1
rgw data = $RGW_DIR/rgw
rgw thread pool size = 128
EOF
K="$RGW_DIR/keyring"
ceph-authtool "$K" --create-keyring --gen-key -n mon. --cap mon 'allow *' >/dev/null
ceph-authtool "$K" --gen-key -n client.admin --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' >/dev/null
ceph-authtool "$K" --gen-key -n osd.0 --cap mon 'allow profile osd' --cap osd 'allow *' --cap mgr 'allow profile osd' >/dev/null
ceph-authtool "$K" --gen-key -n client.rgw.a --cap mon 'allow rw' --cap osd 'allow rwx' --cap mgr 'allow rw' >/dev/null
monmaptool --create --fsid "$FSID" --addv a "[v2:127.0.0.1:$MON_PORT]" "$RGW_DIR/monmap" >/dev/null
ceph-mon -c "$CONF" --mkfs -i a --monmap "$RGW_DIR/monmap" --keyring "$K" >"$RGW_DIR/log/mon-mkfs.out" 2>&1 \
  || { cat "$RGW_DIR/log/mon-mkfs.out" >&2; die "mon mkfs failed"; }

# ---- start daemons (foreground mode, detached with setsid; PIDs recorded) ----------
launch() { # name cmd...
  local name=$1; shift
  STARTED=1
  setsid "$@" -f </dev/null >"$RGW_DIR/log/$name.out" 2>&1 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&- &
  echo "$name $!" >>"$RGW_DIR/pids"
}
wait_for() { # seconds description cmd...
  local secs=$1 what=$2; shift 2
  local end=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$end" ] || die "timed out after ${secs}s waiting for $what"
    while read -r n pid; do alive "$pid" || die "$n (pid $pid) exited"; done <"$RGW_DIR/pids"
    sleep 0.2
  done
}
launch mon ceph-mon -c "$CONF" -i a
wait_for 30 "mon" timeout 10 ceph -c "$CONF" --connect-timeout 3 mon stat
log "mon up"
OSD_UUID=$(uuidgen)
timeout 30 ceph -c "$CONF" osd new "$OSD_UUID" 0 >/dev/null
ceph-osd -c "$CONF" -i 0 --mkfs --osd-uuid "$OSD_UUID" >"$RGW_DIR/log/osd-mkfs.out" 2>&1 \
  || { cat "$RGW_DIR/log/osd-mkfs.out" >&2; die "osd mkfs failed"; }
launch osd ceph-osd -c "$CONF" -i 0
osd_up() { timeout 10 ceph -c "$CONF" --connect-timeout 3 osd dump 2>/dev/null | grep -q '^osd.0 up '; }
wait_for 60 "osd.0 up" osd_up
log "osd up ($RGW_STORE)"
launch rgw radosgw -c "$CONF" -n client.rgw.a
wait_for 90 "radosgw on $ENDPOINT" curl -sf -o /dev/null "$ENDPOINT/"
log "radosgw answering on $ENDPOINT"
ensure_user_and_bucket
print_env | tee "$RGW_DIR/env"
log "done"
