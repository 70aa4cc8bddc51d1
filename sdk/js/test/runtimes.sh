#!/bin/sh
# The SDK's test suite (sdk/js/test/*.test.mjs, node:test files) on Bun and
# on Deno, each against real daemons as under node (docs/testing.md).
# Run from anywhere; tests/run.sh runs it right after the sdk/js suite.
#
# Both runtimes come from npm, whose `bun` and `deno` packages carry their
# binaries (a package per platform, picked by npm): pinned versions are
# installed into sdk/js/.runtimes (gitignored), once, and reused while they
# still run.  TUPPER_BUN_VERSION / TUPPER_DENO_VERSION pick others.
#
# "Can install": a runtime whose npm package has no binary for this
# machine (its platform packages name no linux-<arch> of ours) is SKIPPED
# with a line that says so, and the script still passes.  Anything else
# that keeps a runtime from running here fails the script: npm failing
# (offline, the registry down), the platform's binary missing after npm
# said it installed it, a binary that does not start.
#
# Each test file runs in its own `bun test` / `deno test`, bounded by
# FILE_SECONDS, as `node --test` runs each in its own process.  Before the
# suite a canary (test/runtimes-canary.mjs, a passing test and an after()
# hook that throws) must fail on the runtime: the suite's files check in
# their after() hooks that their daemons stopped cleanly, and a runner
# that let such a failure pass would prove nothing.
set -u
cd "$(dirname "$0")/.." || exit 1
PKG=$(pwd)
BUN_VERSION=${TUPPER_BUN_VERSION:-1.4.5}
DENO_VERSION=${TUPPER_DENO_VERSION:-2.9.6}
FILE_SECONDS=${FILE_SECONDS:-300}
CACHE=$PKG/.runtimes
export TUPPER_BIN="${TUPPER_BIN:-$PKG/../../build/tupper}"

[ -d node_modules ] || npm ci --no-audit --no-fund >/dev/null || exit 1
npm run build >/dev/null || exit 1

# install NAME VERSION: the runtime's binary into $CACHE/NAME-VERSION; sets
# $bin.  Returns 0 when it runs, 2 when npm has no binary for this
# platform (SKIPPED), 1 otherwise.
install() {
  dir=$CACHE/$1-$2
  bin=$dir/node_modules/.bin/$1
  "$bin" --version >/dev/null 2>&1 && return 0
  # a fresh install; other versions of the runtime go
  rm -rf "$CACHE/$1-"* && mkdir -p "$dir" || return 1
  if ! npm install --no-save --no-audit --no-fund --prefix "$dir" "$1@$2" >"$dir/npm.log" 2>&1; then
    echo "runtimes: npm cannot install $1@$2:"
    tail -n 20 "$dir/npm.log"
    return 1
  fi
  # bun's bin is a placeholder until its postinstall has copied the
  # platform's binary over it; an npm that skips install scripts leaves it
  if [ "$1" = bun ] && ! "$bin" --version >/dev/null 2>&1 && [ -f "$dir/node_modules/bun/install.js" ]; then
    (cd "$dir/node_modules/bun" && node install.js) >>"$dir/npm.log" 2>&1
  fi
  "$bin" --version >/dev/null 2>&1 && return 0
  # the platform packages npm picks from (optionalDependencies) and which
  # of them it installed here
  verdict=$(cd "$dir/node_modules/$1" && node -e '
    const fs = require("fs");
    const arch = { x64: ["x64"], arm64: ["arm64", "aarch64"] }[process.arch] || [process.arch];
    const names = Object.keys(require("./package.json").optionalDependencies || {});
    const ours = names.filter((n) => n.includes(process.platform) && arch.some((a) => n.includes(a)));
    const got = ours.filter((n) => fs.existsSync("../" + n)); // node_modules/@scope/name
    console.log(ours.length === 0 ? "none" : got.length === 0 ? "missing " + ours.join(" ") : "installed " + got.join(" "));
  ' 2>&1)
  case $verdict in
    none)
      echo "SKIPPED $1: npm's $1@$2 has no binary for $(uname -s) $(uname -m) (node says $(node -p 'process.platform + "-" + process.arch'))"
      return 2 ;;
    missing*)
      echo "runtimes: npm installed $1@$2 without its binary package for this platform (${verdict#missing }):"
      tail -n 20 "$dir/npm.log" ;;
    *)
      echo "runtimes: $1@$2's binary does not run here ($verdict):"
      "$bin" --version 2>&1 | tail -n 5 ;;
  esac
  return 1
}

# run_file LOG CMD... FILE: runs the runtime's test command on FILE,
# bounded, its output in LOG; prints one line and returns its status
run_file() {
  log=$1
  shift
  started=$(date +%s)
  NO_COLOR=1 timeout -k 15 "$FILE_SECONDS" "$@" >"$log" 2>&1
  rc=$?
  echo "  $(basename "$log" .log): exit $rc, $(($(date +%s) - started)) s"
  return $rc
}

# passed LOG: how many tests the runner says passed (bun: " 11 pass",
# deno: "ok | 11 passed | 0 failed")
passed() {
  sed -n -e 's/^ *\([0-9][0-9]*\) pass$/\1/p' -e 's/^ok | \([0-9][0-9]*\) passed .*/\1/p' "$1" | tail -n 1
}

# suite NAME CMD...: the canary, then every test file, with CMD FILE
suite() {
  name=$1
  shift
  logs=$(mktemp -d "${TMPDIR:-/tmp}/tupper-runtimes.XXXXXX") || return 1
  ok=0
  if run_file "$logs/canary.log" "$@" ./test/runtimes-canary.mjs; then
    echo "runtimes: $name: the canary passed, so a failing after() hook would go unseen:"
    tail -n 30 "$logs/canary.log"
    ok=1
  elif ! grep -q 'runtimes-canary: this after() hook fails on purpose' "$logs/canary.log"; then
    echo "runtimes: $name: the canary failed, but not for its after() hook:"
    tail -n 30 "$logs/canary.log"
    ok=1
  fi
  for f in test/*.test.mjs; do
    b=$(basename "$f" .test.mjs)
    if ! run_file "$logs/$b.log" "$@" "./$f"; then
      tail -n 60 "$logs/$b.log"
      ok=1
      continue
    fi
    # every top-level test() of the file ran and passed: a runner that
    # skipped some (or the whole file) fails here.  Runners count tests in
    # a describe() differently (bun each, deno the describe as one, a
    # skipped one not at all): a file with describe() blocks, or with
    # tests made in a top-level loop, must have passed at least one and at
    # least its literal top-level ones (test(), or a file's own shorthand
    # for it such as ttest()).
    want=$(grep -cE '^t?test\(' "$f")
    got=$(passed "$logs/$b.log")
    if grep -qE '^(describe|for) ?\(' "$f"; then
      [ "${got:-0}" -ge 1 ] && [ "${got:-0}" -ge "$want" ]
    else
      [ "${got:-0}" -eq "$want" ]
    fi || {
      echo "runtimes: $name: $f has $want top-level tests, the runner says ${got:-none} passed:"
      tail -n 30 "$logs/$b.log"
      ok=1
    }
  done
  rm -rf "$logs"
  return $ok
}

status=0
t0=$(date +%s)
install bun "$BUN_VERSION"
case $? in
  0)
    echo "runtimes: bun $("$bin" --version)"
    # bun test's default per-test timeout is 5 s, and on a timeout it kills
    # the processes the file started (its daemon): node's runner has none
    suite bun "$bin" test --timeout 120000 || status=1
    echo "runtimes: bun: $(($(date +%s) - t0)) s" ;;
  2) ;;
  *) status=1 ;;
esac

t0=$(date +%s)
install deno "$DENO_VERSION"
case $? in
  0)
    echo "runtimes: $("$bin" --version | head -n 1)"
    # -A: the suite starts daemons, reads and writes temp dirs, listens on
    # loopback.  --no-check: the files are JavaScript; tsc checks the SDK.
    # The import map gives the files test/deno/node-test.mjs for node:test
    # (it reports after() hooks that throw, which Deno's ignores).
    suite deno "$bin" test -A --no-check --no-lock --import-map test/deno/import-map.json || status=1
    echo "runtimes: deno: $(($(date +%s) - t0)) s" ;;
  2) ;;
  *) status=1 ;;
esac
exit $status
