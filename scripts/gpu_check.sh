#!/usr/bin/env bash
# The GPU-side check, run on the device machine (Ubuntu, CUDA libtorch, no
# gRPC/abseil): builds the libtorch-only targets (model, learner/algo, their
# tests, the benchmark harness), runs the tests (CudaStep compares a CUDA
# step with the CPU one) and the learner-step benchmark on CUDA.
# Needs nlohmann_json: pass its CMake dir as $1 (header-only, carried).
set -uo pipefail
out=${OUT:-/tmp/kappa-gpu-out}
mkdir -p "$out"
torch_prefix=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
cmake -S . -B /tmp/kappa-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKAPPA_BUILD_SERVICES=OFF \
  -DKAPPA_WERROR=OFF -DCMAKE_PREFIX_PATH="$torch_prefix" -Dnlohmann_json_DIR="$1" \
  > "$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; exit 1; }
ninja -C /tmp/kappa-gpu -k 0 > "$out/build.log" 2>&1 || { grep -E "error|Error" -A3 "$out/build.log" | head -80; exit 1; }
(cd /tmp/kappa-gpu && ctest --output-on-failure -j 8) > "$out/ctest.log" 2>&1
grep -E "tests passed|Passed|Failed|SEGFAULT" "$out/ctest.log"
# A crash seen once in model_test on this toolchain: where exactly.
if grep -q "model_test.*SEGFAULT" "$out/ctest.log"; then
  if command -v gdb >/dev/null; then
    gdb -batch -ex run -ex bt --args /tmp/kappa-gpu/tests/model/model_test \
      --gtest_filter='CheckpointTest.*' 2>&1 | grep -vE "^\[New Thread|^\[Thread" | tail -40
  else
    model_test=/tmp/kappa-gpu/tests/model/model_test
    for t in $($model_test --gtest_list_tests --gtest_filter='CheckpointTest.*' | grep '^  '); do
      $model_test --gtest_filter="CheckpointTest.$t" > /dev/null 2>&1
      echo "CheckpointTest.$t rc=$?"
    done
  fi
fi
/tmp/kappa-gpu/tests/algo/algo_dynamics_test --gtest_filter='CudaStep.*' 2>&1 | tail -5
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for model in demo large; do
  /tmp/kappa-gpu/bench/kappa_bench_learner_step --model "$model" --device cuda --reps 40 \
    --exact-positions 8 2>/dev/null | tee "$out/bench_${model}_cuda.txt"
done
