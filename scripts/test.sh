#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test through
# ctest, then the format check (scripts/check_format.sh: the C++ lines
# committed since .clang-format was added), the sanitizer build's tests
# (scripts/sanitize.sh: ASan + UBSan, build-asan), the bounded fuzz runs
# (scripts/fuzz.sh, build-fuzz) and, where /usr/local/cuda has nvcc, the CUDA
# kernels' compile check (scripts/cuda_compile_check.sh, build-cuda-check: no
# GPU needed).
# Arguments go to the main ctest and select a subset: then the format,
# sanitizer and fuzz stages are skipped. KAPPA_SANITIZER_CHECKS=0 skips the
# sanitizer and fuzz stages, KAPPA_FORMAT_CHECK=0 the format check.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
BUILD_DIR=${KAPPA_BUILD_DIR:-build}
(cd "$BUILD_DIR" && ctest --output-on-failure --timeout 600 -j "${KAPPA_TEST_JOBS:-2}" "$@")
if (($# == 0)) && [[ ${KAPPA_FORMAT_CHECK:-1} != 0 ]]; then
  bash scripts/check_format.sh
fi
if (($# == 0)) && [[ ${KAPPA_SANITIZER_CHECKS:-1} != 0 ]]; then
  bash scripts/sanitize.sh
  bash scripts/fuzz.sh
  if [[ -x ${CUDACXX:-/usr/local/cuda/bin/nvcc} ]]; then
    bash scripts/cuda_compile_check.sh
  fi
fi
