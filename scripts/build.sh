#!/usr/bin/env bash
# Configures and builds kappa into ./build (Ninja, clang++, ccache when present).
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
# clang++ unless CXX names another compiler: with its precompiled
# <torch/torch.h> (-fpch-instantiate-templates, cmake/torch_pch.cmake) a
# libtorch translation unit costs ~7 s of CPU against ~29 s with g++'s PCH
# and ~51 s with neither (docs/running.md, "Build time"). g++ still builds
# the tree (the GPU machine uses it).
if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_COMPILER="${CXX:-clang++}" "$@"
fi
targets=()
for target in ${KAPPA_BUILD_TARGETS:-}; do
  targets+=(--target "$target")
done
# libtorch translation units need ~1 GiB each; two jobs fit 2 cores / 24 GiB.
cmake --build "$BUILD_DIR" -j "${KAPPA_JOBS:-$(nproc)}" "${targets[@]}"
