#!/bin/sh
# make deb: BUILD/tupper_<version>_<arch>.deb from `cmake --install` into a
# staging dir (docs/install.md).  Usage: runtime/dist/mkdeb.sh [BUILD]
#
# Depends: the shared libraries tupper links (dpkg-shlibdeps), plus the
# ones it opens with dlopen at first use, which no tool can see: libcurl
# (image pulls), libcrypto (SHA-256), libarchive (layer tars), libedit
# (`tupper repl`'s line editing).
set -eu
build=$(cd "${1:-build}" && pwd)
dist=$(cd "$(dirname "$0")" && pwd)
DLOPENED="libcurl4, libssl3, libarchive13, libedit2"
TOOLS="passwd" # groupadd, in the postinst

version=$("$build/tupper" version | sed 's/^tupper //')
arch=$(dpkg --print-architecture)
deb="$build/tupper_${version}_${arch}.deb"
stage=$(mktemp -d "${TMPDIR:-/tmp}/tupper-deb.XXXXXX")
trap 'rm -rf "$stage"' EXIT INT TERM
pkg="$stage/tupper"

DESTDIR="$pkg" cmake --install "$build" --prefix /usr >/dev/null
strip --strip-unneeded "$pkg/usr/bin/tupper" "$pkg/usr/bin/tupper-core"
mkdir -p "$pkg/usr/share/doc/tupper"
cat >"$pkg/usr/share/doc/tupper/README.Debian" <<EOT
tupper $version, built from its source tree with make deb (docs/install.md there).

tupper.socket (enabled by the package) listens on /run/tupper/tupper.sock and
starts tupper.service on the first connection.  The socket is 0660 root:tupper:
whoever can use it controls every sandbox on this host, so add only trusted
users to the tupper group; a client that is not root sets
TUPPER_SOCKET=/run/tupper/tupper.sock.  State: /var/lib/tupper (kept on purge).
EOT

# dpkg-shlibdeps reads debian/control from its working directory
mkdir "$stage/debian"
printf 'Source: tupper\n\nPackage: tupper\nArchitecture: any\n' >"$stage/debian/control"
shlibs=$(cd "$stage" && dpkg-shlibdeps -O -e tupper/usr/bin/tupper -e tupper/usr/bin/tupper-core 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
[ -n "$shlibs" ] || { echo "mkdeb: dpkg-shlibdeps found no libraries for tupper" >&2; exit 1; }

mkdir "$pkg/DEBIAN"
size=$(du -sk "$pkg" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@SIZE@/$size/" \
  -e "s/@DEPENDS@/$shlibs, $DLOPENED, $TOOLS/" "$dist/debian/control.in" >"$pkg/DEBIAN/control"
for s in postinst prerm postrm; do
  install -m 755 "$dist/debian/$s" "$pkg/DEBIAN/$s"
done
dpkg-deb --root-owner-group -Zxz --build "$pkg" "$deb" >/dev/null
echo "$deb"
