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
# status is 0 only when both passed.  Not part of `make test`: it takes as
# long as the suite, plus the root and the packages (docs/testing.md).
#
# Usage: tests/fresh/run.sh [demo|test|both]   (default: both)
#   FRESH_KEEP=1 keeps the root (its path is printed) for a look afterwards.
#   FRESH_MIRROR overrides mmdebstrap's mirror.
set -eu
what=${1:-both}
case "$what" in demo | test | both) ;; *) echo "usage: $0 [demo|test|both]" >&2; exit 2 ;; esac
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

# Runs "$@" (a command line for sh) in the root, as root, in a private
# mount namespace pivoted into it; the output goes to $log/$name.
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
    cd /root/tupper
    exec env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin TERM=dumb LANG=C.UTF-8 \
      ${NODE_EXTRA_CA_CERTS:+NODE_EXTRA_CA_CERTS=$NODE_EXTRA_CA_CERTS} \
      sh -c "$cmd"' fresh "$root" "$*" >"$log/$name" 2>&1
}

failed=0
step() {
  name=$1
  shift
  s=$(date +%s)
  if in_root "$name" "$@"; then
    echo "fresh-check: $* passed in $(($(date +%s) - s)) s"
  else
    echo "fresh-check: $* FAILED after $(($(date +%s) - s)) s; the end of its output:"
    tail -40 "$log/$name" | sed 's/^/  /'
    failed=$((failed + 1))
  fi
}
[ "$what" = test ] || step demo make demo
[ "$what" = demo ] || step test make test
[ "$what" = demo ] || grep -E '^(=== |suites: )' "$log/test" | sed 's/^/  /' || true
if [ "$failed" -eq 0 ]; then
  echo "fresh-check: passed ($(($(date +%s) - t0)) s in all)"
else
  echo "fresh-check: $failed of the README's commands failed"
fi
[ "$failed" -eq 0 ]
