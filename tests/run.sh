#!/bin/sh
# The test suite: C unit tests (ctest), Lua specs and integration specs
# against a real daemon (busted), then a check that nothing was left behind:
# processes, mounts, cgroups, network namespaces, files outside the suite's
# temp dir.  Slow suites (tests/slow/*_spec.lua) run last, in a bounded step.
set -u
BUILD=${BUILD:-build}
BUILD=$(cd "$BUILD" && pwd)
cd "$(dirname "$0")/.."
ROOT=$(pwd)

traces() {
  {
    grep -E 'tupper' /proc/self/mountinfo 2>/dev/null | awk '{print "mount " $5}'
    find /sys/fs/cgroup -maxdepth 5 -type d -path '*tupper*' 2>/dev/null | sed 's/^/cgroup /'
    ip netns list 2>/dev/null | grep -i tupper | sed 's/^/netns /'
    pgrep -a -f 'tupper-agent|tupper(-core)? daemon' 2>/dev/null | sed 's/^/process /'
    # any process running as a sandbox uid (the default range)
    ps -eo uid=,pid=,stat=,comm= 2>/dev/null | awk '$1 >= 100000000 && $1 < 100065536 && $3 !~ /^Z/ {print "process " $2 " " $4}'
    ls -d /tmp/tupper* /run/tupper-test* 2>/dev/null | sed 's/^/file /'
  } | sort
}

before=$(traces)
TMPDIR=$(mktemp -d /tmp/tupper-test.XXXXXX)
export TMPDIR
# a CLI call that finds no daemon starts one on the default state dir; in
# the suite that must never be the host's /var/lib/tupper
export TUPPER_STATE_DIR="$TMPDIR/default-state"
export TUPPER_BIN="$BUILD/tupper" TUPPER_AGENT="$BUILD/tupper-agent" TUPPER_ROOT="$ROOT"
export TUPPER_PROBE="$BUILD/tupper-probe"
export LUA_CPATH="$BUILD/lua/?.so;${LUA_CPATH:-;}" # tupper.recipe.jail_core, tupper.util.digest

passed=0
failed=0
# each suite's wall time is printed after it: the budget of make test is
# CI's (docs/testing.md), and this says where it goes
# Each suite's output also goes to a log, so that the last lines of the run
# name the suites that failed and their failing lines: a CI log that keeps
# only the tail still says what broke.  The suite runs in the foreground
# (an asynchronous one would get SIGINT and SIGQUIT ignored and stdin on
# /dev/null, which the tests would see); tail follows the log until a
# placeholder process ends after the suite, then prints what is left and
# stops.  It never waits for a process the suite left behind holding its
# output (the leak check reports that one).
failures=""
suite() {
  name=$1
  shift
  echo "=== $name"
  t0=$(date +%s)
  log="$TMPDIR/suite.log"
  : >"$log"
  sleep 100000 &
  spid=$!
  tail -n +1 -f --pid="$spid" "$log" &
  tpid=$!
  rc=0
  "$@" >>"$log" 2>&1 || rc=$?
  kill "$spid" 2>/dev/null
  wait "$spid" 2>/dev/null
  wait "$tpid" 2>/dev/null || true
  if [ "$rc" -eq 0 ]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "=== $name FAILED"
    failures="$failures
--- $name (exit $rc):
$(grep -E 'not ok|FAIL|[Ff]ail(ed|ure)|[Ee]rror|✗' "$log" | grep -v '^=== ' | tail -n 8 | cut -c1-300)"
  fi
  echo "=== $name: $(($(date +%s) - t0)) s"
}

suite "C unit tests" sh -c "cd '$BUILD' && ctest --output-on-failure"
# every fuzz target for a short, bounded time (a longer run: tests/fuzz/run.sh 600)
suite "fuzz targets" env FUZZ_BUILD="$BUILD/fuzz" tests/fuzz/run.sh "${FUZZ_SECONDS:-10}"
# --helper: after each spec file, what its tests started and left (a test
# that failed before its cleanup) is released and named on one line
suite "Lua specs" lua5.4 /usr/bin/busted --helper tests/spec/cleanup.lua \
  --lpath="$ROOT/lua/?.lua;$ROOT/tests/spec/?.lua" -o utfTerminal tests/spec
suite "sdk/js" sh -c "cd sdk/js && npm ci --no-audit --no-fund >/dev/null && npm test"
# the same files on Bun and on Deno from npm (1.5 to 2 minutes each);
# before the background test below, as it rebuilds dist
suite "sdk/js on bun and deno" sh sdk/js/test/runtimes.sh
# The MCP long-call test (sdk/js/test/slow/mcp-long.test.mjs, needs sdk/js
# built as the suite above leaves it): a 5-minute command under the official
# client's default 60 s timeout.  Five minutes of waiting and almost no CPU,
# so it runs in the background beside the suites that follow and is
# collected before the leak check; timeout(1) stops its whole process group.
(cd sdk/js && exec timeout -k 15 720 node --test test/slow/mcp-long.test.mjs) \
  >"$TMPDIR/mcp-long.log" 2>&1 &
mcp_long=$!
# the framework adapters (docs/adapters.md): each on its newest and its lowest supported framework
suite "sdk/adapters" sh sdk/adapters/test.sh
# Debian's python3 and python3-pytest (not a pyenv python first in PATH);
# pytest's exit 5 (no test ran) fails the suite like any other non-zero exit
suite "sdk/python" env PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 -m pytest -q -p no:cacheprovider sdk/python/tests
# slow suites (image builds, microVM boots): their own step with a bound, so
# a hang fails the suite instead of eating CI's 90 minutes; three lanes side
# by side (tests/slow/lanes.sh: the microVM specs, the code interpreter and
# node 18, the Debian builds)
if ls tests/slow/*_spec.lua >/dev/null 2>&1; then
  suite "slow specs" env ROOT="$ROOT" timeout "${SLOW_SECONDS:-2700}" tests/slow/lanes.sh
fi

mcp_long_rc=0
wait "$mcp_long" || mcp_long_rc=$?
suite "MCP long call (background)" sh -c 'cat "$1"; exit "$2"' sh "$TMPDIR/mcp-long.log" "$mcp_long_rc"

rm -rf "$TMPDIR"
# The "tupper" parent of every hierarchy is shared by all daemons: the last
# one to stop removes it if it is empty, but a daemon a test killed on
# purpose never does.  An empty parent that was not there before holds
# nothing: remove it (rmdir fails on one with children, which the check
# below then reports).
for p in $(find /sys/fs/cgroup -maxdepth 3 -type d -name tupper 2>/dev/null); do
  printf '%s\n' "$before" | grep -qx "cgroup $p" || rmdir "$p" 2>/dev/null || true
done
after=$(traces)
leaks=$(printf "%s\n" "$after" | BEFORE="$before" awk '
  BEGIN { n = split(ENVIRON["BEFORE"], b, "\n"); for (i = 1; i <= n; i++) seen[b[i]] = 1 }
  NF && !seen[$0]')
echo "=== leak check"
if [ -n "$leaks" ]; then
  echo "the suite left traces behind:"
  printf '%s\n' "$leaks"
  failed=$((failed + 1))
  failures="$failures
--- leak check:
$(printf '%s\n' "$leaks" | head -n 8)"
else
  echo "nothing left behind"
  passed=$((passed + 1))
fi
if [ -n "$failures" ]; then
  echo "=== what failed$failures"
fi
echo "suites: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
