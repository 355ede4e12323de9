#!/usr/bin/env bash
# Everything GPU-side in one command, within 12 minutes on one H100 or H200
# (the device machine: Ubuntu 24.04, g++ 13, CMake 4, nvcc 13, PyTorch
# 2.11+cu130, no gRPC or abseil). It stops at the first stage that fails (a
# build error, a failed test, a benchmark that exits non-zero) with
# "run.sh: FAILED at <stage>" and exit status 1, so a broken stage does not
# spend the rest of the device time. It
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
#   6. the vocabulary head at V = 151,936 (issue 53): kappa's step against
#      the eager PyTorch step, like for like, at Qwen2.5-0.5B's shape (24
#      layers, 8 x 512 tokens, bf16 autocast), with
#      bench/eager_reference/vocab_compare.sh: top-64 + tail rows on both
#      sides, kappa's exact hidden-state rows (teacher.rows: hidden, the
#      teacher's head on the learner) against eager's full rows, and the
#      step that measures κ with the fused head and with the head that
#      recomputes each chunk (trainer.fused_head: false); GPU peak memory
#      (nvidia-smi, sampled) and median step time; $OUT/vocab_head.txt;
#   7. with two GPUs, two data-parallel ranks of that step under
#      learner.shard: gradients (NCCL; with one GPU it says so and skips);
#      then loads a Qwen2.5-0.5B-shaped random HF checkpoint (bf16, ~1 GB) onto the
#      device in bf16 and runs one 512-token forward (load time against
#      reading the file, memory). The tests of stage 2 include the HF logit
#      parity test, which there also compares SDPA with the explicit path.
#   8. the whole system: a second build, services included, against the
#      machine's CUDA libtorch and the bundle of Debian 12's gRPC, protobuf,
#      abseil, yaml-cpp, spdlog/fmt, pcre2, utf8proc that bench/gpu/prepare.sh
#      writes to .gpu_deps (configured in the background, at nice 19, while
#      stages 2-7 run); then `kappa run configs/qwen2.5-gsm8k.yaml` with the
#      learner, teacher and four workers on CUDA in bf16: a random
#      Qwen2.5-0.5B-shaped student, a random 1.5B-shaped teacher, the real
#      Qwen2.5 tokenizer and vocabulary, the GSM8K-layout test fixture, 20
#      steps; bench/gpu/system_report.py writes samples/s, the engine's
#      tokens/s, the learner's MFU (computed there) and weight-sync seconds
#      to $OUT/system_run.txt. The run gets what is left of a 9-minute
#      budget (KAPPA_GPU_BUDGET_S, 540: one device command runs at most 10).
# Results land in $OUT (default /tmp/kappa-gpu-out); bench/README.md keeps them.
#
#   bash bench/gpu/prepare.sh                                   # here, once: .gpu_deps/
#   bash bench/gpu/run.sh                                       # on the GPU machine (carry .gpu_deps)
#   bash bench/gpu/run.sh --system                              # on the GPU machine: stage 8 alone
#   bash bench/gpu/run.sh --compile-check                       # here: nvcc compile check only
#   bash bench/gpu/run.sh --cpu-rehearsal [--system]            # here: every stage (or 8) on the CPU
#   bash bench/gpu/run.sh --cpu-rehearsal --short               # in the test command (ctest gpu_run_rehearsal)
#
# --cpu-rehearsal runs the same stages with the development machine's CPU
# libtorch (KAPPA_CUDA off, --device cpu, the demo model for gpt, two
# rounds, short generations, /usr/bin/python3 for the eager reference): it
# proves the libtorch-only build, the test list and every benchmark flag
# here, so the one GPU run is not spent on a typo. Numbers from it mean
# nothing. Its stage 7 builds against .gpu_deps exactly as the GPU run does
# (a clean build directory, CMAKE_PREFIX_PATH = the bundle first; the checks
# after the build fail if any header of those packages was read from
# /usr/include or a binary resolves one of their libraries outside the
# bundle), then runs the same `kappa run` with tiny bodies (d 64 and 96, two
# layers) on the real 151,936-row vocabulary on the CPU. KAPPA_BUILD_LOCK=FILE
# runs each build step under `flock FILE` (the shared development machine).
#
# --short (with --cpu-rehearsal) is the rehearsal the test command runs
# (ctest gpu_run_rehearsal, about a minute): it builds nothing and uses the
# test build's binaries (KAPPA_GPU_BUILD, the ctest's build directory), skips
# stage 2 (it is the test command's own ctest) and stage 8 (its bundle,
# .gpu_deps, is prepare.sh's), and runs stages 3-7 with every flag the GPU
# run passes at toy sizes, so a flag, a script or a stage that no longer
# works fails a test here instead of the one GPU run.
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

rehearsal=0 system=1 only_system=0 short=0
while [[ "${1:-}" == --* ]]; do
  case $1 in
    --cpu-rehearsal) rehearsal=1 ;;
    --short) short=1 system=0 ;;
    --system) only_system=1 ;;
    --no-system) system=0 ;;
    *) echo "run.sh: unknown flag $1" >&2; exit 2 ;;
  esac
  shift
done
if (( short && ! rehearsal )); then echo "run.sh: --short is a --cpu-rehearsal mode" >&2; exit 2; fi
# Stage 8 needs the bundle prepare.sh writes here (the GPU machine has no
# package archive): say so now, not after stages 1-7.
if (( system )) && [[ ! -f .gpu_deps/cmake/kappa-deps.cmake ]]; then
  echo "run.sh: FAILED at start: no .gpu_deps for stage 8: run bash bench/gpu/prepare.sh on the" \
    "development machine and carry .gpu_deps, or pass --no-system" >&2
  exit 1
fi
lock=()
[[ -n ${KAPPA_BUILD_LOCK:-} ]] && lock=(flock "$KAPPA_BUILD_LOCK")
out=${OUT:-/tmp/kappa-gpu-out}
build=${KAPPA_GPU_BUILD:-/tmp/kappa-gpu}
mkdir -p "$out"
json_dir=${1:-$PWD/.gpu_deps/share/cmake/nlohmann_json}
start=$(date +%s)
budget=${KAPPA_GPU_BUDGET_S:-540}  # the whole script, seconds (the device tool's limit is 600)
current_stage="start"
stage() { current_stage=$1; echo "== $1 ($(( $(date +%s) - start )) s)"; }
# The first failure ends the run: what failed, where its log is.
die() { echo "run.sh: FAILED at $current_stage: $*" >&2; exit 1; }

# What differs between the GPU run and the CPU rehearsal; the stages below
# are the same commands.
if (( rehearsal )); then
  device=cpu gpt=demo large=demo reps=2 gen_lengths=8,16 python=/usr/bin/python3
  # The continuous engine on a ragged workload, at a toy size.
  engine_flags=(--hidden 64 --layers 2 --heads 4 --kv-heads 2 --ffn 128 --vocab 1000
                --prompts 4 --items 2 --max-new-tokens 16 --prompt-tokens 8,16)
  build=${KAPPA_GPU_BUILD:-/tmp/kappa-gpu-rehearsal}
  configure_flags=(-DKAPPA_CUDA=OFF)
  # The vocabulary head at toy sizes (one layer, V = 4,096, 2 x 24 tokens).
  vocab_rows=2 vocab_chunk=16 vocab_steps=2
  vocab_flags=(--layers 1 --vocab 4096 --group-size 2 --prompt 8 --response 16 --device cpu --precision bf16)
  [[ -x /usr/bin/ccache ]] && configure_flags+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
else
  device=cuda gpt=gpt large=large reps=10 gen_lengths=32,128,512 python=python3
  # d 1024, 16 layers, V 32k in bf16; 64 prompts × G = 8, 128 rows per step.
  engine_flags=(--hidden 1024 --layers 16 --heads 16 --kv-heads 4 --ffn 2816 --vocab 32000
                --dtype bf16 --prompts 64 --items 16 --max-new-tokens 256 --prompt-tokens 64,256)
  torch_prefix=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
  export CUDACXX=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
  configure_flags=(-DKAPPA_CUDA=ON -DCMAKE_PREFIX_PATH="$torch_prefix"
                   -Dnlohmann_json_DIR="$json_dir")
  vocab_rows=8 vocab_chunk=1024 vocab_steps=4
  vocab_flags=(--layers 24 --device cuda --precision bf16)
fi
checkpoint_shape=(--shape qwen2.5-0.5b) checkpoint_dir=$build/qwen2.5-0.5b-random checkpoint_tokens=512
if (( short )); then
  # The test build's binaries; toy sizes everywhere.
  build=${KAPPA_GPU_BUILD:-build}
  reps=1 gen_lengths=8
  engine_flags=(--hidden 32 --layers 1 --heads 2 --kv-heads 1 --ffn 64 --vocab 100
                --prompts 2 --items 1 --max-new-tokens 4 --prompt-tokens 4,8)
  checkpoint_shape=(--only qwen2_tied_bf16) checkpoint_dir=$out/qwen2_tied_bf16 checkpoint_tokens=16
fi


# --- stage 7's pieces: the services build against .gpu_deps, and the run.
if (( rehearsal )); then
  sys_build=${KAPPA_GPU_SYSTEM_BUILD:-/tmp/kappa-gpu-rehearsal-services}
  # Debian's libtorch lives in /usr, so /usr stays searchable; the bundle is
  # first on CMAKE_PREFIX_PATH and the checks below catch anything from /usr.
  sys_prefix="$PWD/.gpu_deps"
  sys_flags=(-DKAPPA_CUDA=OFF -DTorch_DIR=/usr/lib/x86_64-linux-gnu/cmake/Torch)
  [[ -x /usr/bin/ccache ]] && sys_flags+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  sys_jobs=2 sys_shapes=student=tiny-student,teacher=tiny-teacher
  # The test's CPU settings (tests/integration/qwen_gsm8k_run_test.cc), 20 steps.
  sys_overrides=(learner.device=cpu teacher.device=cpu rollout.device=cpu workers=2
    threads_per_process=1 teacher.threads=1 learner.buffer_groups=4 rollout.max_outstanding=1
    rollout.max_new_tokens=16 trainer.groups_per_step=2 trainer.micro_batch_sequences=8
    trainer.distill_topk=8 trainer.vocab_chunk_positions=64)
else
  sys_build=${KAPPA_GPU_SYSTEM_BUILD:-/tmp/kappa-gpu-services}
  sys_prefix="$PWD/.gpu_deps;$torch_prefix"
  sys_flags=(-DKAPPA_CUDA=ON)
  sys_jobs=$(( $(nproc) > 4 ? $(nproc) - 2 : 2 )) sys_shapes=student=qwen2.5-0.5b,teacher=qwen2.5-1.5b
  # The file's GPU settings (four workers, 16 groups of G = 8, top-64 rows,
  # chunked head, checkpointing, bf16 autocast) with a 128-token budget: with
  # random weights every response runs to it (20 x 128 x 128 = 328k tokens).
  sys_overrides=(student.dtype=bfloat16 teacher.dtype=bfloat16 rollout.weights_dtype=bfloat16
    rollout.max_new_tokens=128)
fi
sys_targets=(kappa-verifier kappa-teacher kappa-rollout-worker kappa-learner kappa)
sys_nice=()

# Configure and build the services against the bundle; check that its
# headers and libraries are the ones used. Output in $out/services_*.txt|log.
services_build() {
  (
    source bench/gpu/deps_env.sh || exit 1
    export LD_LIBRARY_PATH=$kappa_deps_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export PKG_CONFIG_LIBDIR=$kappa_deps_lib/pkgconfig
    rm -rf "$sys_build"
    "${sys_nice[@]}" "${lock[@]}" cmake -S . -B "$sys_build" -G Ninja -C "$kappa_deps/cmake/kappa-deps.cmake" \
      -DCMAKE_PREFIX_PATH="$sys_prefix" -DCMAKE_BUILD_TYPE=Release -DKAPPA_BUILD_TESTS=OFF \
      -DKAPPA_WERROR=OFF -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DCMAKE_CXX_FLAGS="-include cstdint" \
      "${sys_flags[@]}" > "$out/services_cmake.log" 2>&1 || { tail -30 "$out/services_cmake.log"; exit 1; }
    # One target per step: each holds the lock (rehearsal) under 12 minutes.
    for t in "${sys_targets[@]}"; do
      "${sys_nice[@]}" "${lock[@]}" ninja -C "$sys_build" -j "$sys_jobs" "$t" >> "$out/services_build.log" 2>&1 \
        || { grep -E "error|Error" -A3 "$out/services_build.log" | head -60; exit 1; }
    done
    {
      echo "# what the services build used (bench/gpu/run.sh stage 7)"
      grep -E "^(gRPC|absl|yaml-cpp|spdlog|fmt|c-ares|re2|nlohmann_json)_DIR:|^Protobuf_(INCLUDE_DIR|LIBRARY_RELEASE|PROTOC_EXECUTABLE):|^pkgcfg_lib_" \
        "$sys_build/CMakeCache.txt"
      # Headers of the bundled packages read from anywhere but the bundle
      # (/usr/include here; torch/include's fmt or protobuf copies there).
      bad_headers=$(ninja -C "$sys_build" -t deps 2>/dev/null | grep -E '^ +/' |
        grep -E '/(grpc|grpcpp|grpc\+\+|google/protobuf|absl|yaml-cpp|spdlog|fmt|nlohmann)/|/(pcre2|utf8proc)\.h$' |
        grep -v -e "^ *$kappa_deps/" -e "^ *$sys_build/" | sort -u)
      echo "headers of bundled packages read from outside .gpu_deps: $(grep -c . <<< "$bad_headers")"
      head -5 <<< "$bad_headers"
      bad_libs=0
      for t in "${sys_targets[@]}"; do
        bin=$(find "$sys_build" -name "$t" -type f -perm -u+x | head -1)
        resolved=$(ldd "$bin")
        outside=$(grep -E "lib(grpc|gpr|upb|address_sorting|re2|cares|protobuf|absl|yaml-cpp|spdlog|fmt|pcre2-8|utf8proc)[^ ]* => " <<< "$resolved" |
          grep -v "=> $kappa_deps_lib/" || true)
        # Not found: a failure for a bundled library's name, a warning for
        # another (libtorch's own dependencies resolve when it loads them).
        missing=$(grep "not found" <<< "$resolved" || true)
        echo "$t: $(grep -c "=> $kappa_deps_lib/" <<< "$resolved") libraries from .gpu_deps, outside: ${outside:-none}, not found: ${missing:-none}"
        bundled_missing=$(grep -E "lib(grpc|gpr|upb|address_sorting|re2|cares|protobuf|absl|yaml-cpp|spdlog|fmt|pcre2-8|utf8proc)" <<< "$missing" || true)
        [[ -z $outside$bundled_missing ]] || bad_libs=1
      done
      [[ -z $bad_headers && $bad_libs == 0 ]] && echo "bundle check: OK" || { echo "bundle check: FAILED"; exit 1; }
    } > "$out/services_check.txt" 2>&1
    rc=$?
    cat "$out/services_check.txt"
    exit $rc
  )
}

# The run: checkpoints, prompts, `kappa run` under the remaining budget, report.
system_run() {
  local models=$sys_build/models run_root=$sys_build/runs
  if [[ ! -f $models/teacher/model.safetensors ]]; then
    "$python" bench/gpu/write_qwen_checkpoints.py "$models" --shapes "$sys_shapes" --guesser \
      --tokenizer .gpu_deps/share/tokenizers/qwen2_5 > "$out/system_checkpoints.txt" || return 1
  fi
  (
    source bench/gpu/deps_env.sh || exit 1
    export LD_LIBRARY_PATH=$kappa_deps_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    local kappa=$sys_build/cli/kappa config=configs/qwen2.5-gsm8k.yaml
    local train=tests/integration/fixtures/gsm8k_tiny_train.jsonl
    local heldout=tests/integration/fixtures/gsm8k_tiny_heldout.jsonl
    # Mean prompt length in tokens, as the learner renders them (for the MFU).
    local system_prompt  # the YAML line's double-quoted string, as JSON
    system_prompt=$(grep -m1 '^  system_prompt:' "$config" | sed 's/^  system_prompt: //')
    local prompt_tokens
    prompt_tokens=$("$python" -c '
import json, sys
try:
    sp = json.loads(sys.argv[2])
except ValueError:
    sp = ""
for line in open(sys.argv[1]):
    m = ([{"role": "system", "content": sp}] if sp else []) + [{"role": "user", "content": json.loads(line)["question"]}]
    print(json.dumps(m))' "$train" "$system_prompt" | "$kappa" render-prompt "$models/student" |
      "$kappa" tokenize "$models/student" | "$python" -c '
import json, sys
n = [len(json.loads(l)) for l in sys.stdin if l.strip()]
print(sum(n) / len(n))')
    echo "mean prompt: $prompt_tokens tokens"
    local left=$(( budget - ($(date +%s) - start) - 40 ))
    (( left < 150 )) && left=150
    rm -rf "$run_root"
    mkdir -p "$run_root"
    "$python" bench/gpu/system_report.py scrape "$run_root/system" "$out/system_scrape" &
    local scraper=$!
    echo "kappa run: 20 steps, at most $left s"
    local run_start=$(date +%s)
    timeout -s INT -k 20 "$left" "$kappa" run "$config" name=system runs_dir="$run_root" \
      data_dir="$sys_build/cache" student.checkpoint="$models/student" \
      teacher.checkpoint="$models/teacher" task.train_path="$PWD/$train" \
      task.heldout_path="$PWD/$heldout" trainer.steps=20 trainer.eval_every=0 \
      trainer.eval_examples=4 trainer.checkpoint_every=0 "${sys_overrides[@]}" --no-progress \
      > "$out/system_kappa_run.log" 2>&1
    local rc=$?
    kill "$scraper" 2> /dev/null
    wait "$scraper" 2> /dev/null
    {
      echo "# bench/gpu/run.sh stage 7: kappa run $config on $device ($( ((rehearsal)) && echo 'CPU REHEARSAL: numbers mean nothing for speed' || echo GPU))"
      echo "kappa run: exit $rc after $(( $(date +%s) - run_start )) s (limit $left s)"
      echo "overrides: ${sys_overrides[*]} trainer.steps=20"
      cat "$out/system_checkpoints.txt" 2> /dev/null
      "$python" bench/gpu/system_report.py report "$run_root/system" "$out/system_scrape" \
        --student "$models/student" --prompt-tokens "$prompt_tokens" --peak-tflops 790
      if [[ -n ${torch_prefix:-} ]]; then
        torch_lib=$(dirname "$(dirname "$(dirname "$torch_prefix")")")/torch/lib
        echo "protobuf symbols exported by libtorch_cpu.so: $(nm -D --defined-only "$torch_lib/libtorch_cpu.so" 2>/dev/null | grep -c '_ZN6google8protobuf')"
      fi
    } > "$out/system_run.txt" 2>&1
    cat "$out/system_run.txt"
    if (( rc != 0 )); then
      tail -20 "$out/system_kappa_run.log"
      cp -r "$run_root/system/logs" "$out/system_logs" 2> /dev/null
    fi
    exit $rc
  )
}

if (( ! only_system )); then
if (( ! short )); then
stage "configure"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKAPPA_BUILD_SERVICES=OFF \
  -DKAPPA_WERROR=OFF -DKAPPA_REFERENCE_PYTHON="$(command -v "$python")" "${configure_flags[@]}" > "$out/cmake.log" 2>&1 \
  || { tail -30 "$out/cmake.log"; die "cmake ($out/cmake.log)"; }

stage "build"
"${lock[@]}" ninja -C "$build" -k 0 > "$out/build.log" 2>&1 \
  || { grep -E "error|Error" -A3 "$out/build.log" | head -80; die "ninja ($out/build.log)"; }
# On the GPU machine stage 8's build runs beside stages 2-7, at the lowest
# priority (their benchmarks use the GPU and a core or two).
if (( system && ! rehearsal )); then
  sys_nice=(nice -n 19)
  services_build > "$out/services_background.txt" 2>&1 &
  services_pid=$!
fi

stage "tests"
(cd "$build" && timeout 150 ctest --output-on-failure -j 8 --timeout 120) > "$out/ctest.log" 2>&1
ctest_rc=$?
grep -E "tests passed|tests failed|Failed|SEGFAULT|\*\*\*" "$out/ctest.log" | head -30
(( ctest_rc == 0 )) || die "ctest exit $ctest_rc ($out/ctest.log)"
# The CUDA-only cases, by name, so a skip is visible.
for t in "$build"/tests/algo/algo_*test; do
  "$t" --gtest_filter='*Cuda*:*CUDA*' 2>&1 | grep -E "^\[  (PASSED|FAILED|SKIPPED) " | sed "s|^|$(basename "$t"): |"
done | tee "$out/cuda_tests.txt"
grep -q FAILED "$out/cuda_tests.txt" && die "a CUDA test ($out/cuda_tests.txt)"
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
fi
fi  # configure, build, tests

stage "learner-step benchmark"
for precision in bf16 fp32; do
  timeout 100 "$build"/bench/kappa_bench_learner_step --model "$gpt" --device "$device" \
    --reps "$reps" --precision "$precision" --modes plain,kappa,kappa_kdr,kappa4_kdr \
    --exact-positions 0 --peak-tflops 790 2>/dev/null \
    | tee "$out/learner_step_${gpt}_${precision}.txt" || die "learner step, $precision"
done
timeout 60 "$build"/bench/kappa_bench_learner_step --model "$gpt" --device "$device" \
  --reps "$reps" --precision bf16 --ragged 1 --micro-batch 4 --modes plain --exact-positions 0 \
  --peak-tflops 790 2>/dev/null | tee "$out/learner_step_${gpt}_bf16_ragged_micro4.txt" \
  || die "learner step, ragged"
timeout 60 "$build"/bench/kappa_bench_learner_step --model "$large" --device "$device" \
  --reps $(( 2 * reps )) --exact-positions 8 --peak-tflops 790 2>/dev/null \
  | tee "$out/learner_step_${large}_fp32.txt" || die "learner step, $large"

stage "generation benchmark"
timeout 120 "$build"/bench/kappa_bench_generation --device "$device" --lengths "$gen_lengths" \
  --prompts 8 --group-size 8 --reps 3 --modes nocache,per_prompt 2>/dev/null \
  | tee "$out/generation_${device}.txt" || die "generation"
# Ragged responses: the engine's tokens/s and its decode step as a fraction
# of the copy-bandwidth roofline (its `roofline:` line). The worker always
# decodes through this engine; the retired static path's numbers are
# records in bench/README.md (`--modes static` is refused by name).
timeout 150 "$build"/bench/kappa_bench_generation --device "$device" --modes engine \
  --ragged 1 "${engine_flags[@]}" 2>/dev/null | tee "$out/generation_engine_${device}.txt" \
  || die "generation engine"

stage "eager PyTorch reference"
# The machine's own PyTorch runs the eager step; rounds alternate who goes first.
eager() {
  timeout 60 "$python" bench/eager_reference/hybrid_step.py --model "$gpt" --device "$device" \
    --modes plain,kappa --reps "$reps" 2>/dev/null | tee -a "$out/eager_${gpt}_fp32.txt" \
    || die "eager hybrid_step.py"
}
ours() {
  timeout 60 "$build"/bench/kappa_bench_learner_step --model "$gpt" --device "$device" \
    --reps "$reps" --modes plain,kappa --exact-positions 0 --peak-tflops 790 2>/dev/null \
    | tee -a "$out/kappa_${gpt}_fp32_vs_eager.txt" || die "learner step beside eager"
}
eager; ours
ours; eager

stage "vocabulary head: kappa against eager at V = 151,936"
# One process per row (peak memory is per process); no address-space cap;
# no checkpointing rows (seven processes, each building its 0.5B model and
# rows on the host: the stage's time is mostly that).
KAPPA_COMPARE_ROWS=$vocab_rows KAPPA_COMPARE_CHUNK=$vocab_chunk KAPPA_COMPARE_STEPS=$vocab_steps \
  KAPPA_COMPARE_CKPT=0 \
  KAPPA_COMPARE_PYTHON=$(command -v "$python") KAPPA_BENCH_MEM_GIB=0 \
  KAPPA_COMPARE_OUT="$out/vocab_head.jsonl" \
  timeout 240 bash bench/eager_reference/vocab_compare.sh "$build" "${vocab_flags[@]}" \
  > "$out/vocab_head.txt" 2> "$out/vocab_head.log" || { tail -20 "$out/vocab_head.log"; die "vocab_compare.sh ($out/vocab_head.log)"; }
cat "$out/vocab_head.txt"

stage "sharded learner step: 2 ranks, learner.shard: gradients"
# Two data-parallel ranks of the vocabulary-head step (NCCL, GPU r for rank
# r; Gloo in the rehearsal), AdamW's state and the summed gradients split
# between them (issue 54). Needs two GPUs: with one it says so and goes on.
sharded_step() {
  local port r pids=() failed=0
  port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  for r in 0 1; do
    timeout 240 "$build"/bench/kappa_bench_vocab_scale "${vocab_flags[@]}" --teacher topk \
      --rows "$vocab_rows" --chunk "$vocab_chunk" --steps "$vocab_steps" --kappa 1 --kdr 0 \
      --world-size 2 --rank "$r" --dist-store "tcp://127.0.0.1:$port" --shard gradients \
      > "$out/sharded_step_rank$r.json" 2> "$out/sharded_step_rank$r.log" &
    pids+=($!)
  done
  for r in 0 1; do wait "${pids[$r]}" || failed=1; done
  (( failed == 0 )) || { tail -5 "$out"/sharded_step_rank*.log; return 1; }
  cat "$out/sharded_step_rank0.json" "$out/sharded_step_rank1.json"
}
gpus=$( (( rehearsal )) && echo 2 || nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if (( gpus >= 2 )); then
  sharded_step || die "2-rank sharded step ($out/sharded_step_rank*.log)"
else
  echo "this machine has $gpus GPU(s): the 2-rank sharded step needs two; skipped" \
    | tee "$out/sharded_step.txt"
fi

stage "HF checkpoint load"
if [[ ! -d $checkpoint_dir ]]; then
  "$python" tests/model/reference/make_checkpoints.py "$(dirname "$checkpoint_dir")" "${checkpoint_shape[@]}" > /dev/null \
    || die "make_checkpoints.py"
fi
timeout 120 "$build"/bench/kappa_bench_checkpoint_load "$checkpoint_dir" --device "$device" \
  --dtype bfloat16 --tokens "$checkpoint_tokens" 2>/dev/null | tee "$out/checkpoint_load_${device}_bf16.txt" \
  || die "checkpoint load"
fi  # stages 1-7

if (( system )); then
  stage "whole system: services build against .gpu_deps"
  if [[ -n ${services_pid:-} ]]; then
    wait "$services_pid"; rc=$?
    cat "$out/services_background.txt"
  else
    services_build; rc=$?
  fi
  (( rc == 0 )) || die "services build ($out/services_build.log)"
  stage "whole system: kappa run"
  system_run || die "kappa run ($out/system_kappa_run.log)"
fi
stage "done"
