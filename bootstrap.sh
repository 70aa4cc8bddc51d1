#!/bin/sh
# Installs what tupper needs to build and test, from Debian's archive only.
# Idempotent: packages already present are left alone, and apt is not even
# consulted when nothing is missing.  Usage: ./bootstrap.sh [build|test|bench|deb]
set -eu

what=${1:-build}

pkgs="gcc make cmake pkg-config lua5.4 liblua5.4-dev libuv1-dev lua-luv lua-luv-dev
lua-cjson lua-cjson-dev busybox-static libseccomp-dev e2fsprogs libedit-dev"
# the btrfs pool of box upper dirs: O(1) snapshots and forks (docs/limits.md)
pkgs="$pkgs btrfs-progs"
# the registry client (tupper pull): libcurl, and libcrypto for SHA-256
pkgs="$pkgs libcurl4-openssl-dev libssl-dev"
pkgs="$pkgs libarchive-dev" # the image store: layer tars (gzip, zstd)
pkgs="$pkgs libjansson-dev" # the C client of exec and run: its JSON (linked statically)
# musl's headers, start files and libc.a: tupper and tupper-agent are built
# against it, whose static start-up skips glibc's 0.3 ms of CPU
# identification (without it, both are built with glibc)
pkgs="$pkgs musl-dev"
# microvm backend: QEMU's microvm machine runs the VMs; the guest kernel is
# fetched with apt-get download and unpacked with dpkg-deb (docs/microvm.md)
pkgs="$pkgs qemu-system-x86"
pkgs="$pkgs scdoc" # the man pages (docs/man), made in the default build
case "$what" in
  test) pkgs="$pkgs lua-busted iproute2 procps clang libclang-rt-14-dev tmux"
    # image pull specs: a real registry, skopeo to push to it, htpasswd (bcrypt), openssl (a test CA)
    pkgs="$pkgs docker-registry skopeo apache2-utils openssl python3"
    # test_seccomp runs real programs under the box's filter: pip and curl
    # among them (a machine that happens to have them must not hide it)
    pkgs="$pkgs python3-pip curl"
    pkgs="$pkgs python3-pytest" # the sdk/python suite
    # Debian images (tests/slow/debian_spec.lua): mmdebstrap builds them, gpg
    # checks the keyring it picks
    pkgs="$pkgs mmdebstrap gpg"
    # the service specs: systemd-analyze verify on the units,
    # systemd-socket-activate; dpkg-shlibdeps for make deb
    pkgs="$pkgs systemd dpkg-dev"
    # the CLI spec checks the man pages (man -l, lexgrog) and the zsh completion
    pkgs="$pkgs man-db zsh" ;;
  deb) pkgs="$pkgs dpkg-dev" ;; # make deb: dpkg-shlibdeps computes Depends
  bench) pkgs="$pkgs hyperfine bubblewrap crun podman"
    pkgs="$pkgs docker-registry skopeo umoci curl python3" ;; # bench/pull
esac

# The sdk/js suite needs node >= 18.20 (sdk/js/package.json "engines") and
# npm.  A node that is new enough is used as it is (NodeSource's nodejs
# brings its own npm, and Debian's npm package conflicts with it); otherwise
# Debian's nodejs (18.20) and npm.  An older nodejs package (NodeSource's 16,
# say) counts as installed below, so it is named to apt to be upgraded.
node_ok() {
  node -e 'const [a, b] = process.versions.node.split(".").map(Number);
    process.exit(a > 18 || (a === 18 && b >= 20) ? 0 : 1)' 2>/dev/null
}
upgrade=""
if [ "$what" = test ] || [ "$what" = bench ]; then # bench/loop, bench/sdk: node
  v="" # the installed nodejs package's version
  if dpkg-query -W -f='${Status}' nodejs 2>/dev/null | grep -q 'install ok installed'; then
    v=$(dpkg-query -W -f='${Version}' nodejs)
  fi
  if ! node_ok; then
    # a nodejs package new enough with an old node first in PATH is not
    # apt's to fix: the check at the end says so
    if [ -z "$v" ]; then
      pkgs="$pkgs nodejs npm"
    elif dpkg --compare-versions "$v" lt 18.20; then
      pkgs="$pkgs nodejs npm"
      upgrade=nodejs
    fi
  elif ! command -v npm >/dev/null 2>&1; then
    if printf '%s' "$v" | grep -q nodesource; then
      echo "bootstrap: node has no npm: reinstall NodeSource's nodejs, which brings it" >&2
      exit 1
    fi
    pkgs="$pkgs npm"
  fi
fi

missing="${upgrade:+ $upgrade}"
for p in $pkgs; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing="$missing $p"
  fi
done

if [ -n "$missing" ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "bootstrap: missing packages:$missing (run as root, or install them with apt-get)" >&2
    exit 1
  fi
  echo "bootstrap: installing$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# a node from elsewhere (nvm, /usr/local) first in PATH hides Debian's
if [ "$what" = test ] && ! node_ok; then
  if command -v node >/dev/null 2>&1; then
    msg="the node in PATH, $(command -v node), is $(node --version 2>/dev/null || echo 'broken')"
  else
    msg="no node in PATH"
  fi
  echo "bootstrap: $msg; the sdk/js suite needs node >= 18.20 (Debian's is /usr/bin/node)" >&2
  exit 1
fi
