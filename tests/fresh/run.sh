#!/bin/sh
# The fresh-machine check (make fresh-check): the README's two commands on a
# bare Debian 12, as a new user runs them.
#
# Builds a minimal bookworm root with mmdebstrap (minbase, plus git,
# ca-certificates and make: what a user needs to clone this repo), clones
# the repository's HEAD into it, and runs `make demo` and then `make test`
# as root in a private mount namespace pivoted into that root.  The host's
# /proc, /sys and /dev are bound in: the same kernel, cgroups and /dev/kvm.
# A pivot_root, not a chroot: a chrooted process may not create the user
# namespaces every box needs.  Each command's result is reported; the exit
# status is 0 only when all passed.  Not part of `make test`: it takes as
# long as the suite, plus the root and the packages (docs/testing.md).
#
# Then the packaged path (docs/install.md): `make deb` in that root, and the
# .deb installed with `apt-get install ./tupper_*.deb` in a second bare
# minbase root (apt resolves its Depends); there, with no systemd to start
# it, the daemon is run as tupper.service's ExecStart says and
# `tupper run -- true` must pass against it.
#
# Usage: tests/fresh/run.sh [demo|test|deb|both|all]   (default: all;
#   both: demo and test; deb: make deb and the install only)
#   FRESH_KEEP=1 keeps the root (its path is printed) for a look afterwards.
#   FRESH_MIRROR overrides mmdebstrap's mirror.
set -eu
what=${1:-all}
case "$what" in demo | test | deb | both | all) ;; *) echo "usage: $0 [demo|test|deb|both|all]" >&2; exit 2 ;; esac
[ "$(id -u)" = 0 ] || { echo "fresh-check: run as root (it builds a root and mounts)" >&2; exit 2; }
cd "$(dirname "$0")/../.."
repo=$(pwd)
if ! command -v mmdebstrap >/dev/null 2>&1; then
  echo "fresh-check: installing mmdebstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null
fi
[ -z "$(git status --porcelain)" ] || echo "fresh-check: note: uncommitted changes are not part of the check (it clones HEAD)"

# /var/tmp, not /tmp: the suite's leak check inside looks at /tmp/tupper*
work=$(mktemp -d /var/tmp/tupper-fresh.XXXXXX)
root="$work/root"
root2="$work/root2" # the .deb's: a bare minbase
log="$work/log"
mkdir -p "$log"
cleanup() {
  if [ "${FRESH_KEEP:-0}" = 1 ]; then
    echo "fresh-check: kept $work"
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT INT TERM

t0=$(date +%s)
echo "fresh-check: building a minimal Debian 12 root in $root"
# shellcheck disable=SC2086
mmdebstrap --quiet --variant=minbase --include=git,ca-certificates,make bookworm "$root" \
  ${FRESH_MIRROR:-} >"$log/mmdebstrap" 2>&1 || {
  tail -20 "$log/mmdebstrap"
  echo "fresh-check: mmdebstrap failed"
  exit 1
}
cp /etc/resolv.conf "$root/etc/resolv.conf"
# The network's trust, as for resolv.conf: where the host reaches the
# registries through a TLS proxy of its own CA, its CA bundle, and node's
# extra CA setting, go into the root (nothing of the project's does)
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt" 2>/dev/null || true
git clone --quiet --no-local "$repo" "$root/root/tupper"
echo "fresh-check: root ready in $(($(date +%s) - t0)) s, HEAD $(git rev-parse --short HEAD)"

# Runs "$@" (a command line for sh) in the root ($target, default $root),
# as root, in a private mount namespace pivoted into it, from /root/tupper
# if there is one, else /root; the output goes to $log/$name.
in_root() {
  name=$1
  shift
  unshare --mount --propagation private -- sh -eu -c '
    root=$1; cmd=$2
    mount --bind "$root" "$root"
    mount --rbind /proc "$root/proc"
    mount --rbind /sys "$root/sys"
    mount --rbind /dev "$root/dev"
    mkdir -p "$root/.host"
    cd "$root"
    pivot_root . .host
    umount -l /.host
    rmdir /.host
    cd /root/tupper 2>/dev/null || cd /root
    exec env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin TERM=dumb LANG=C.UTF-8 \
      ${NODE_EXTRA_CA_CERTS:+NODE_EXTRA_CA_CERTS=$NODE_EXTRA_CA_CERTS} \
      sh -c "$cmd"' fresh "${target:-$root}" "$*" >"$log/$name" 2>&1
}

failed=0
step() {
  name=$1
  shift
  s=$(date +%s)
  what_ran=${label:-$*}
  if in_root "$name" "$@"; then
    echo "fresh-check: $what_ran passed in $(($(date +%s) - s)) s"
  else
    echo "fresh-check: $what_ran FAILED after $(($(date +%s) - s)) s; the end of its output:"
    tail -40 "$log/$name" | sed 's/^/  /'
    # the whole output outlives the work dir: a failure far above the tail
    # (a slow lane's test) is read there
    cp "$log/$name" "/var/tmp/tupper-fresh-$name.log" &&
      echo "fresh-check: the whole output: /var/tmp/tupper-fresh-$name.log"
    failed=$((failed + 1))
  fi
}
case "$what" in demo | both | all) step demo make demo ;; esac
case "$what" in test | both | all)
  step test make test
  grep -E '^(=== |suites: )' "$log/test" | sed 's/^/  /' || true ;;
esac

# The packaged path: the .deb from the first root, into a second one that
# has only minbase.  The daemon runs as tupper.service's ExecStart says
# (default socket /run/tupper/tupper.sock and state /var/lib/tupper, both
# inside that root), until the check is done.
deb_install='
  set -eu
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ./tupper_*.deb
  getent group tupper
  unit=/usr/lib/systemd/system
  test -f $unit/tupper.socket
  test -f $unit/tupper.service
  exec_start=$(sed -n "s/^ExecStart=//p" $unit/tupper.service)
  echo "ExecStart: $exec_start"
  $exec_start &
  pid=$!
  trap "kill -TERM $pid 2>/dev/null; wait $pid" EXIT
  i=0
  while [ ! -S /run/tupper/tupper.sock ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
  tupper run -- true
  echo "tupper run -- true: passed"
'
case "$what" in deb | all)
  step deb make deb
  debs=$(ls "$root"/root/tupper/build/tupper_*.deb 2>/dev/null || true)
  if [ -n "$debs" ]; then
    # shellcheck disable=SC2086
    if mmdebstrap --quiet --variant=minbase bookworm "$root2" ${FRESH_MIRROR:-} >"$log/mmdebstrap2" 2>&1; then
      cp /etc/resolv.conf "$root2/etc/resolv.conf"
      cp /etc/ssl/certs/ca-certificates.crt "$root2/etc/ssl/certs/ca-certificates.crt" 2>/dev/null || true
      mkdir -p "$root2/root"
      cp $debs "$root2/root/"
      target=$root2
      label="apt-get install ./tupper_*.deb in a bare root; tupper run -- true"
      step deb-install "$deb_install"
      target="" label=""
    else
      tail -20 "$log/mmdebstrap2"
      echo "fresh-check: the second root (mmdebstrap) FAILED"
      failed=$((failed + 1))
    fi
  fi ;;
esac
if [ "$failed" -eq 0 ]; then
  echo "fresh-check: passed ($(($(date +%s) - t0)) s in all)"
else
  echo "fresh-check: $failed of the README's commands (and the packaged path) failed"
fi
[ "$failed" -eq 0 ]
