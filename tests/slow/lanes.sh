#!/bin/sh
# The slow specs (tests/slow/*_spec.lua) in three lanes side by side: the
# microVM specs (TCG emulation: CPU) in one, the code interpreter's image
# and Debian's node 18 in another, the Debian builds with mmdebstrap in the
# third (those two are mostly downloads and unpacking), with the backend
# matrix (microVMs again) after them.  A lane runs its
# files one after another, each in a busted run of its own with the
# cleanup helper, and prints each file's wall time; the other lanes' output
# follows the first's.  Exits non-zero when any file fails.  Run from the
# repository's root with the environment tests/run.sh sets; ROOT is the root.
set -u
ROOT=${ROOT:-$(pwd)}
vm=""
pkg=""
deb=""
for f in tests/slow/*_spec.lua; do
  case $f in
    *microvm*) vm="$vm $f" ;;
    *code_interpreter*|*node18*) pkg="$pkg $f" ;;
    *) deb="$deb $f" ;; # the Debian builds, and backend_matrix (microVMs) in their downloads' idle time
  esac
done
lane() {
  rc=0
  for f in "$@"; do
    t0=$(date +%s)
    lua5.4 /usr/bin/busted --helper tests/spec/cleanup.lua \
      --lpath="$ROOT/lua/?.lua;$ROOT/tests/spec/?.lua" -o utfTerminal "$f" || { rc=1; echo "--- $f FAILED"; }
    echo "--- $f: $(($(date +%s) - t0)) s"
  done
  return $rc
}
logs=$(mktemp -d "${TMPDIR:-/tmp}/tupper-slow-lanes.XXXXXX") || exit 1
pids=""
for name in pkg deb; do
  eval "files=\$$name"
  [ -n "$files" ] || continue
  # shellcheck disable=SC2086,SC2154 # the file lists are words on purpose
  (lane $files >"$logs/$name" 2>&1; echo $? >"$logs/$name.rc") &
  pids="$pids $!"
done
r=0
if [ -n "$vm" ]; then
  # shellcheck disable=SC2086
  lane $vm || r=1
fi
for p in $pids; do wait "$p"; done
for name in pkg deb; do
  [ -f "$logs/$name.rc" ] || continue
  eval "files=\$$name"
  echo
  echo "--- the $name lane:$files"
  cat "$logs/$name"
  [ "$(cat "$logs/$name.rc")" = 0 ] || r=1
done
rm -rf "$logs"
exit $r
