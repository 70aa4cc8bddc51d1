#!/bin/sh
# The slow specs (tests/slow/*_spec.lua) in two lanes side by side: the
# microVM specs (TCG emulation: CPU) in one, the rest (Debian builds with
# mmdebstrap, Debian's node 18, the code interpreter's image: mostly
# downloads and unpacking) in the other.  Each lane is one busted run with
# the cleanup helper; the second lane's output follows the first's.  Exits
# non-zero when either lane fails.  Run from the repository's root with the
# environment tests/run.sh sets; ROOT is the root.
set -u
ROOT=${ROOT:-$(pwd)}
vm=""
rest=""
for f in tests/slow/*_spec.lua; do
  case $f in
    *microvm*|*backend_matrix*) vm="$vm $f" ;;
    *) rest="$rest $f" ;;
  esac
done
lane() {
  # shellcheck disable=SC2086 # the file lists are words on purpose
  lua5.4 /usr/bin/busted --helper tests/spec/cleanup.lua \
    --lpath="$ROOT/lua/?.lua;$ROOT/tests/spec/?.lua" -o utfTerminal "$@"
}
log=$(mktemp "${TMPDIR:-/tmp}/tupper-slow-lane.XXXXXX") || exit 1
r2=0
if [ -n "$rest" ]; then
  # shellcheck disable=SC2086
  lane $rest >"$log" 2>&1 &
  other=$!
fi
r1=0
if [ -n "$vm" ]; then
  # shellcheck disable=SC2086
  lane $vm || r1=$?
fi
if [ -n "$rest" ]; then
  wait "$other" || r2=$?
  echo
  echo "--- the other lane:$rest"
  cat "$log"
fi
rm -f "$log"
[ "$r1" -eq 0 ] && [ "$r2" -eq 0 ]
