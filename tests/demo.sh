#!/bin/sh
# make demo: a private daemon, one sandbox on the embedded default image
# showing what it sees from inside, then nothing is left behind.
set -eu
BUILD=${BUILD:-build}
tupper=$(cd "$BUILD" && pwd)/tupper
tmp=$(mktemp -d /tmp/tupper-demo.XXXXXX)
export TUPPER_SOCKET="$tmp/tupper.sock"
"$tupper" daemon --socket "$TUPPER_SOCKET" --state-dir "$tmp/state" --log "$tmp/daemon.log" &
daemon=$!
cleanup() {
  kill -TERM "$daemon" 2>/dev/null || true
  wait "$daemon" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM
i=0
until [ -S "$TUPPER_SOCKET" ] || [ $i -ge 500 ]; do sleep 0.01; i=$((i + 1)); done

echo "host:    $(hostname), uid $(id -u), $(ls /proc | grep -c '^[0-9]') processes"
echo "\$ tupper run -- sh -c '...'   (a fresh box from the embedded busybox image)"
"$tupper" run -- sh -c '
  echo "hostname: $(hostname)"
  echo "id:       $(id)"
  echo "uid_map:  $(cat /proc/self/uid_map | tr -s " ")"
  echo "network:  $(ls /sys/class/net | tr "\n" " ")"
  echo "ls /:     $(ls / | tr "\n" " ")"
  echo "processes:"; ps
  echo hi from the box; exit 3' || code=$?
echo "exit code: ${code:-0} (propagated from the box)"
[ "${code:-0}" = 3 ]
