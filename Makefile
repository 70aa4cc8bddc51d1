# A thin front over CMake (the way neovim does it).  `make demo` and
# `make test` work on a fresh Debian 12 machine as root: both install what
# they need first (bootstrap.sh).
BUILD ?= build
CMAKE_FLAGS ?=
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
MAKEFLAGS += --no-print-directory

.PHONY: all build demo test fresh-check bench install deb clean

all: build

$(BUILD)/Makefile: CMakeLists.txt
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null

build:
	@./bootstrap.sh build
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# The main job on the embedded default image: a private daemon in a temp
# dir, one sandbox that shows what it sees, then everything is torn down.
demo: build
	@BUILD=$(BUILD) tests/demo.sh

test:
	@./bootstrap.sh test
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)
	@BUILD=$(BUILD) tests/run.sh

# The README's two commands on a bare Debian 12 root (mmdebstrap), in a
# private mount namespace: not part of `make test` (docs/testing.md).
fresh-check:
	@tests/fresh/run.sh

# PREFIX/bin/tupper (and tupper-core) and the systemd units in PREFIX/lib/systemd/system,
# below DESTDIR when given (docs/install.md).  Uninstall: the files
# install_manifest.txt in the build dir lists, e.g.
# xargs rm -f < build/install_manifest.txt
PREFIX ?= /usr/local
install: build
	@DESTDIR="$(DESTDIR)" cmake --install $(BUILD) --prefix "$(PREFIX)"

# $(BUILD)/tupper_<version>_<arch>.deb: the binaries, the units, man pages and
# completion, for `apt install ./build/tupper_*.deb` (runtime/dist/mkdeb.sh)
deb: build
	@./bootstrap.sh deb
	@runtime/dist/mkdeb.sh $(BUILD)

bench: build
	@./bootstrap.sh bench
	@BUILD=$(BUILD) bench/startup
	@BUILD=$(BUILD) bench/pull
	@BUILD=$(BUILD) bench/recipe
	@BUILD=$(BUILD) bench/network
	@BUILD=$(BUILD) bench/bytes
	@BUILD=$(BUILD) bench/loop
	@BUILD=$(BUILD) bench/fork
	@BUILD=$(BUILD) /usr/bin/python3 bench/sdk-python

clean:
	rm -rf $(BUILD)
