#!/usr/bin/env bash
# stop-rgw.sh - stop the daemons start-rgw.sh recorded in $RGW_DIR/pids (radosgw, OSD, mon,
# in that order, by PID only; a PID is signalled only if its command line names
# $RGW_DIR/ceph.conf), then delete $RGW_DIR. Safe to run repeatedly.
set -uo pipefail
RGW_DIR="${RGW_DIR:-/tmp/rackfeed-rgw}"
CONF="$RGW_DIR/ceph.conf"
case "$RGW_DIR" in /tmp/?*|/var/tmp/?*|/run/?*) ;; *) echo "RGW_DIR must be under /tmp, /var/tmp or /run" >&2; exit 1;; esac

ours() { # pid -> running (not zombie) and started with our conf
  local pid=$1 st
  [ -r "/proc/$pid/stat" ] || return 1
  st=$(sed 's/^.*) //' "/proc/$pid/stat" | cut -d' ' -f1)
  [ "$st" != Z ] && [ "$st" != X ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$CONF"
}
stop_pid() { # name pid
  local name=$1 pid=$2
  ours "$pid" || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 50); do ours "$pid" || { echo "stopped $name ($pid)"; return 0; }; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null && echo "killed $name ($pid) after 5s"
  for _ in $(seq 1 20); do ours "$pid" || return 0; sleep 0.1; done
}
if [ -f "$RGW_DIR/pids" ]; then
  for name in rgw osd mon; do
    while read -r n pid; do [ "$n" = "$name" ] && stop_pid "$n" "$pid"; done <"$RGW_DIR/pids"
  done
fi
if [ -e "$RGW_DIR" ]; then
  if [ -e "$RGW_DIR/.start-rgw-state" ] || [ -z "$(ls -A "$RGW_DIR")" ]; then
    rm -rf "$RGW_DIR" && echo "removed $RGW_DIR"
  else
    echo "not removing $RGW_DIR: not created by start-rgw.sh" >&2; exit 1
  fi
fi
exit 0
