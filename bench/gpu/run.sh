#!/usr/bin/env bash
# Everything GPU-side in one run, under 6 minutes on one H200 (the device
# machine: Ubuntu 24.04, g++ 13, CMake 4, nvcc 13, PyTorch 2.11+cu130, no
# gRPC or abseil). It
#   1. builds the libtorch-only targets with KAPPA_CUDA=ON against the
#      machine's CUDA libtorch: model, learner/algo (with the CUDA kernels of
#      learner/algo/cuda), their tests and the benchmark harnesses;
#   2. runs the tests: on CUDA these include the fused token-terms kernels
#      against the torch-op path (fp32, bf16; V = 32000 and 151936), a CUDA
#      hybrid step against the CPU one (κ, K_DR exact vs brute force), the
#      model and the M3 guarantees;
#   3. runs the learner-step benchmark on a 12-layer, d=768 model, 16
#      sequences of 1024 tokens, V=32000, bf16 autocast and fp32: tokens/s,
#      model FLOP utilization against the 790 TFLOP/s dense bf16 rate
#      measured on that machine, and the κ / K_DR monitors' overhead;
#   4. runs the generation benchmark on CUDA (KV cache vs recomputing the
#      prefix, and all prompts in one decode vs one prompt per decode);
#   5. runs the eager-PyTorch reference of the same step beside ours;
#   6. loads a Qwen2.5-0.5B-shaped random HF checkpoint (bf16, ~1 GB) onto the
#      device in bf16 and runs one 512-token forward (load time against
#      reading the file, memory). The tests of stage 2 include the HF logit
#      parity test, which there also compares SDPA with the explicit path.
# Results land in $OUT (default /tmp/kappa-gpu-out); bench/README.md keeps them.
#
#   bash bench/gpu/prepare.sh                                   # here, once: .gpu_deps/
#   bash bench/gpu/run.sh                                       # on the GPU machine (carry .gpu_deps)
#   bash bench/gpu/run.sh --compile-check                       # here: nvcc compile check only
#   bash bench/gpu/run.sh --cpu-rehearsal                       # here: every stage on the CPU
#
# --cpu-rehearsal runs the same stages with the development machine's CPU
# libtorch (KAPPA_CUDA off, --device cpu, the demo model for gpt, two
# rounds, short generations, /usr/bin/python3 for the eager reference): it
# proves the libtorch-only build, the test list and every benchmark flag
# here, so the one GPU run is not spent on a typo. Numbers from it mean
# nothing.
#
# The nlohmann_json CMake package is header-only; the GPU machine has none,
# so it travels with the tree (run's `carry: [".gpu_deps"]`).
set -uo pipefail
cd "$(dirname "$0")/../.."

if [[ "${1:-}" == "--compile-check" ]]; then
  # No CUDA libtorch on the development machine: compile the CUDA sources
  # with /usr/local/cuda's nvcc and the wrapper against the headers.
  exec bash scripts/cuda_compile_check.sh
fi

rehearsal=0
if [[ "${1:-}" == "--cpu-rehearsal" ]]; then
  rehearsal=1
  shift
fi
out=${OUT:-/tmp/kappa-gpu-out}
build=${KAPPA_GPU_BUILD:-/tmp/kappa-gpu}
mkdir -p "$out"
json_dir=${1:-$PWD/.gpu_deps/share/cmake/nlohmann_json}
start=$(date +%s)
stage() { echo "== $1 ($(( $(date +%s) - start )) s)"; }

# What differs between the GPU run and the CPU rehearsal; the stages below
# are the same commands.
if (( rehearsal )); then
  device=cpu gpt=demo large=demo reps=2 gen_lengths=8,16 python=/usr/bin/python3
  build=${KAPPA_GPU_BUILD:-/tmp/kappa-gpu-rehearsal}
  configure_flags=(-DKAPPA_CUDA=OFF)
  [[ -x /usr/bin/ccache ]] && configure_flags+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
else
  device=cuda gpt=gpt large=large reps=10 gen_lengths=32,128,512 python=python3
  torch_prefix=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
  export CUDACXX=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
  configure_flags=(-DKAPPA_CUDA=ON -DCMAKE_PREFIX_PATH="$torch_prefix"
                   -Dnlohmann_json_DIR="$json_dir")
fi

stage "configure"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKAPPA_BUILD_SERVICES=OFF \
  -DKAPPA_WERROR=OFF -DKAPPA_REFERENCE_PYTHON="$(command -v "$python")" "${configure_flags[@]}" > "$out/cmake.log" 2>&1 \
  || { tail -30 "$out/cmake.log"; exit 1; }

stage "build"
ninja -C "$build" -k 0 > "$out/build.log" 2>&1 \
  || { grep -E "error|Error" -A3 "$out/build.log" | head -80; exit 1; }

stage "tests"
(cd "$build" && timeout 150 ctest --output-on-failure -j 8 --timeout 120) > "$out/ctest.log" 2>&1
grep -E "tests passed|tests failed|Failed|SEGFAULT|\*\*\*" "$out/ctest.log" | head -30
# The CUDA-only cases, by name, so a skip is visible.
for t in "$build"/tests/algo/algo_*test; do
  "$t" --gtest_filter='*Cuda*:*CUDA*' 2>&1 | grep -E "^\[  (PASSED|FAILED|SKIPPED) " | sed "s|^|$(basename "$t"): |"
done | tee "$out/cuda_tests.txt"
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
fi

stage "learner-step benchmark"
for precision in bf16 fp32; do
  timeout 100 "$build"/bench/kappa_bench_learner_step --model "$gpt" --device "$device" \
    --reps "$reps" --precision "$precision" --modes plain,kappa,kappa_kdr,kappa4_kdr \
    --exact-positions 0 --peak-tflops 790 2>/dev/null \
    | tee "$out/learner_step_${gpt}_${precision}.txt"
done
timeout 60 "$build"/bench/kappa_bench_learner_step --model "$gpt" --device "$device" \
  --reps "$reps" --precision bf16 --ragged 1 --micro-batch 4 --modes plain --exact-positions 0 \
  --peak-tflops 790 2>/dev/null | tee "$out/learner_step_${gpt}_bf16_ragged_micro4.txt"
timeout 60 "$build"/bench/kappa_bench_learner_step --model "$large" --device "$device" \
  --reps $(( 2 * reps )) --exact-positions 8 --peak-tflops 790 2>/dev/null \
  | tee "$out/learner_step_${large}_fp32.txt"

stage "generation benchmark"
timeout 120 "$build"/bench/kappa_bench_generation --device "$device" --lengths "$gen_lengths" \
  --prompts 8 --group-size 8 --reps 3 --modes nocache,per_prompt 2>/dev/null \
  | tee "$out/generation_${device}.txt"

stage "eager PyTorch reference"
# The machine's own PyTorch runs the eager step; rounds alternate who goes first.
eager() {
  timeout 60 "$python" bench/eager_reference/hybrid_step.py --model "$gpt" --device "$device" \
    --modes plain,kappa --reps "$reps" 2>/dev/null | tee -a "$out/eager_${gpt}_fp32.txt"
}
ours() {
  timeout 60 "$build"/bench/kappa_bench_learner_step --model "$gpt" --device "$device" \
    --reps "$reps" --modes plain,kappa --exact-positions 0 --peak-tflops 790 2>/dev/null \
    | tee -a "$out/kappa_${gpt}_fp32_vs_eager.txt"
}
if [[ -f bench/eager_reference/hybrid_step.py ]]; then
  eager; ours
  ours; eager
fi
stage "HF checkpoint load"
if [[ ! -d "$build/qwen2.5-0.5b-random" ]]; then
  "$python" tests/model/reference/make_checkpoints.py "$build" --shape qwen2.5-0.5b > /dev/null
fi
timeout 120 "$build"/bench/kappa_bench_checkpoint_load "$build/qwen2.5-0.5b-random" --device "$device" \
  --dtype bfloat16 --tokens 512 2>/dev/null | tee "$out/checkpoint_load_${device}_bf16.txt"
stage "done"
