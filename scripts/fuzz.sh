#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/) with clang, ASan and UBSan in
# the build directory scripts/sanitize.sh also uses (build-asan, no libtorch,
# configured by scripts/configure_clang_asan.sh: after sanitize.sh, only the
# fuzz executables are left to compile and link), replays every seed
# corpus once through ctest (label `fuzz`), then fuzzes each target for a
# bounded time, two at a time (2 cores).
#
# The seed corpora in tests/fuzz/corpus/<target>/ are only read; what the
# fuzzer finds goes to a temporary directory. Fails if any target crashes,
# leaks, times out on an input or breaks one of its checks; the reproducer is
# kept in build-asan/fuzz-artifacts/<target>/ and the log tail is printed.
# Reproduce with: build-asan/tests/fuzz/<target> <reproducer>
#
#   bash scripts/fuzz.sh                 # every target, 30 s each
#   KAPPA_FUZZ_SECONDS=300 bash scripts/fuzz.sh config_fuzzer
#
# Environment: KAPPA_FUZZ_SECONDS (per target, default 30), KAPPA_FUZZ_JOBS
# (targets at once, default 2), KAPPA_JOBS (build jobs, default 2),
# KAPPA_FUZZ_BUILD_DIR (default build-asan).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${KAPPA_FUZZ_BUILD_DIR:-build-asan}
SECONDS_EACH=${KAPPA_FUZZ_SECONDS:-30}
PARALLEL=${KAPPA_FUZZ_JOBS:-2}
ALL_TARGETS=(tensor_codec_fuzzer tokenizer_fuzzer hf_tokenizer_fuzzer model_config_fuzzer answer_fuzzer config_fuzzer)
if (($# > 0)); then TARGETS=("$@"); else TARGETS=("${ALL_TARGETS[@]}"); fi

# Same ccache settings as scripts/build.sh, so CI reuses the objects.
export CCACHE_BASEDIR="$PWD"
export CCACHE_NOHASHDIR=1
bash scripts/configure_clang_asan.sh "$BUILD_DIR"
cmake --build "$BUILD_DIR" -j "${KAPPA_JOBS:-2}" --target "${TARGETS[@]}"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# 1. Every corpus input, regression inputs included, runs clean.
selected=$(printf '%s_corpus|' "${TARGETS[@]}")
ctest --test-dir "$BUILD_DIR" --output-on-failure -L fuzz -R "^(${selected%|})\$"

# 2. Bounded fuzzing.
work=$(mktemp -d -t kappa-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT
artifacts="$BUILD_DIR/fuzz-artifacts"

fuzz_one() {
  local target=$1
  local dir="$work/$target"
  mkdir -p "$dir/new"
  # The temporary corpus comes first: libFuzzer writes new inputs there and
  # only reads the seeds.
  if "$BUILD_DIR/tests/fuzz/$target" "$dir/new" "tests/fuzz/corpus/$target" \
      -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix="$dir/" -print_final_stats=1 >"$dir/log" 2>&1; then
    echo "fuzz: $target ok: $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$dir/log" |
      grep -o '[0-9]*$') runs in ${SECONDS_EACH}s, $(find "$dir/new" -type f | wc -l) new inputs"
  else
    echo "fuzz: $target FAILED; last lines of its log:"
    tail -n 60 "$dir/log"
    mkdir -p "$artifacts/$target"
    find "$dir" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' \
      -o -name 'oom-*' \) -exec cp {} "$artifacts/$target/" \;
    echo "fuzz: reproducer(s) in $artifacts/$target/: $(ls "$artifacts/$target")"
    touch "$work/$target.failed"
  fi
}

for target in "${TARGETS[@]}"; do
  while (($(jobs -rp | wc -l) >= PARALLEL)); do wait -n || true; done
  fuzz_one "$target" &
done
wait

failed=$(find "$work" -maxdepth 1 -name '*.failed' | wc -l)
if ((failed > 0)); then
  echo "fuzz: $failed target(s) failed" >&2
  exit 1
fi
echo "fuzz: all ${#TARGETS[@]} targets clean (${SECONDS_EACH}s each)"
