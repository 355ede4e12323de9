#!/usr/bin/env bash
# Compile-check the CUDA sources on a machine without a CUDA libtorch (the
# Debian libtorch here is a CPU build that ships the c10/cuda headers): nvcc
# compiles learner/algo/cuda/*.cu and the wrapper fused_token_terms.cc is
# compiled with KAPPA_CUDA against the c10/cuda and CUDA runtime headers.
# Object libraries only: nothing is linked or run (the GPU machine does that
# with a CUDA libtorch: -DKAPPA_CUDA=ON without the compile-check flag).
# No precompiled <torch/torch.h> (KAPPA_PCH=OFF): building it would cost
# more than the one C++ file it would serve.
#
#   scripts/cuda_compile_check.sh            # build dir: build-cuda-check
#   BUILD_DIR=/tmp/x CUDA_FLAGS=-allow-unsupported-compiler scripts/cuda_compile_check.sh
#
# nvcc 13.0 accepts Debian 12's g++ 12 as host compiler; CUDA_FLAGS is for a
# host compiler it does not (-allow-unsupported-compiler) or other flags.
set -euo pipefail
cd "$(dirname "$0")/.."

export CUDACXX="${CUDACXX:-/usr/local/cuda/bin/nvcc}"
build_dir="${BUILD_DIR:-build-cuda-check}"
if [[ ! -x "$CUDACXX" ]]; then
  echo "cuda_compile_check: no nvcc at $CUDACXX (set CUDACXX)" >&2
  exit 1
fi
"$CUDACXX" --version | tail -n 2

cmake -S . -B "$build_dir" -G Ninja \
  -DKAPPA_BUILD_SERVICES=OFF -DKAPPA_BUILD_TESTS=OFF \
  -DKAPPA_CUDA=ON -DKAPPA_CUDA_COMPILE_CHECK=ON -DKAPPA_PCH=OFF \
  ${CUDA_FLAGS:+"-DCMAKE_CUDA_FLAGS=${CUDA_FLAGS}"}
ninja -C "$build_dir" kappa_cuda_compile_check
echo "cuda_compile_check: CUDA objects compiled in $build_dir"
