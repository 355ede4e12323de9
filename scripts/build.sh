#!/usr/bin/env bash
# Configures and builds kappa into ./build (Ninja, ccache when present).
# Extra arguments go to cmake's configure step. KAPPA_BUILD_TARGETS (space
# separated, e.g. "kappa_suite") builds only those targets; unset, everything
# (the libraries, binaries, test binaries and benchmarks).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${KAPPA_BUILD_DIR:-build}
# Paths relative to the checkout and no cwd in the hash: a fresh clone (CI) or
# a second build directory reuses the objects ccache already holds.
export CCACHE_BASEDIR="$PWD"
export CCACHE_NOHASHDIR=1
if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
fi
targets=()
for target in ${KAPPA_BUILD_TARGETS:-}; do
  targets+=(--target "$target")
done
# libtorch translation units need ~1 GiB each; two jobs fit 2 cores / 24 GiB.
cmake --build "$BUILD_DIR" -j "${KAPPA_JOBS:-$(nproc)}" "${targets[@]}"
