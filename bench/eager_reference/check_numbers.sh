#!/bin/bash
# Do kappa and the eager reference compute the same step? Builds
# kappa_step_numbers.cc against an existing kappa build directory (its static
# libraries; no CMake target, nothing else rebuilt) and prints its first-step
# numbers next to hybrid_step.py's; with REPS > 0 also both sides' median
# wall and process-CPU milliseconds per step (CPU time: the fair measure on a
# machine other jobs load; on THREADS = 1 it is the step's own work).
# Usage: bench/eager_reference/check_numbers.sh BUILD_DIR [demo|large] [REPS] [THREADS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?usage: $0 BUILD_DIR [demo|large] [REPS] [THREADS]}" && pwd)
# The headers of the sources that build was configured from.
root=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
model=${2:-demo} reps=${3:-0} threads=${4:-1}
exe=$(mktemp /tmp/kappa_step_numbers.XXXXXX)
trap 'rm -f "$exe"' EXIT
lib=/usr/lib/x86_64-linux-gnu
c++ -std=gnu++17 -O2 -D_GLIBCXX_USE_CXX11_ABI=1 -I"$root" -isystem /usr/include/torch/csrc/api/include \
  -o "$exe" "$here/kappa_step_numbers.cc" \
  "$build"/learner/algo/libkappa_learner_algo.a "$build"/model/libkappa_model.a \
  "$build"/model/libkappa_model_config.a "$build"/learner/algo/libkappa_learner_losses.a \
  -Wl,--no-as-needed "$lib"/libtorch.so.1.13 "$lib"/libtorch_cpu.so.1.13 -Wl,--as-needed \
  "$lib"/libc10.so -lpthread
echo "== kappa ($build)"
"$exe" "$model" "$reps" "$threads"
echo "== eager PyTorch"
/usr/bin/python3 "$here/hybrid_step.py" --model "$model" --reps "$((reps > 0 ? reps : 1))" \
  --threads "$threads" 2>/dev/null |
  if ((reps > 0)); then cat; else grep -E '^(eager|step1)'; fi
