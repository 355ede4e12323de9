#!/usr/bin/env bash
# Configures the one clang build directory that scripts/sanitize.sh (address
# mode: the torch-free unit tests under ASan + UBSan) and scripts/fuzz.sh (the
# libFuzzer targets) share, unless it is configured already: clang,
# KAPPA_TORCH=OFF, -fsanitize=address,undefined on every target and
# -fsanitize=fuzzer-no-link on the libraries (KAPPA_FUZZ=ON), so each
# library is compiled once for both stages instead of once per stage. The
# coverage hooks fuzzer-no-link adds are no-ops in a test binary: ASan's
# runtime defines them.
#
#   bash scripts/configure_clang_asan.sh [BUILD_DIR]   # default build-asan
#
# Also sets the ccache variables scripts/build.sh uses when sourced.
# Exit status: cmake's.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build-asan}
if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_COMPILER=clang++ -DKAPPA_TORCH=OFF -DKAPPA_SANITIZE=address,undefined \
    -DKAPPA_FUZZ=ON -DKAPPA_WERROR=OFF
fi
