#!/usr/bin/env bash
# Builds the libraries that do not link libtorch (proto, services, tasks,
# verifier, tokenizer) and their unit tests with sanitizers, in a build
# directory of their own, and runs those tests through ctest. libtorch is left
# out (KAPPA_TORCH=OFF): it is not instrumented, and the model code is covered
# by the normal build's tests.
#
#   bash scripts/sanitize.sh            # ASan + UBSan in build-asan (CI runs this;
#                                       # scripts/fuzz.sh reuses the directory)
#   bash scripts/sanitize.sh thread     # TSan in build-tsan, the gRPC service tests only
#   bash scripts/sanitize.sh torch-address   # ASan over the threaded libtorch code
#   bash scripts/sanitize.sh torch-thread    # TSan over the same
#
# The torch modes build, with g++ and KAPPA_TORCH=ON (build-asan-torch,
# build-tsan-torch), only the tests of the threaded code that links libtorch:
# the coordinator and learner service (learner_coordinator_test,
# learner_bad_input_test), weight sync (rollout_weight_group_test), the
# rollout worker (rollout_worker_test), the teacher's batcher and service
# (teacher_dynamic_batcher_test, teacher_service_test) and the decode engine
# (model_test, its DecodeEngine and Sample cases). libtorch, OpenBLAS and
# gRPC stay uninstrumented: ASan still sees every access our code makes;
# TSan sees our threads and the pthread calls made anywhere, and its
# suppressions (tests/sanitize/tsan-torch.supp) name the libraries whose own
# atomics it cannot see. About 40 minutes of building on 2 cores, so not in
# CI (docs/reliability.md records the last result).
#
# The address mode first runs scripts/thread_safety_check.sh: clang's
# -Wthread-safety over the main build's absl::Mutex users (libtorch ones
# included, from build/compile_commands.json, so run scripts/build.sh first;
# without it the check is skipped with a warning). KAPPA_THREAD_SAFETY_CHECK=0
# skips it.
#
# Extra arguments after the mode go to ctest (e.g. -R config). Environment:
# KAPPA_JOBS (build jobs, default 2), KAPPA_TEST_JOBS (ctest jobs, default 2).
# Suppressions, each with the reason it is there: tests/sanitize/.
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=${1:-address}
shift || true
SUPPRESSIONS="$PWD/tests/sanitize"
case "$MODE" in
  address)
    BUILD_DIR=build-asan
    SANITIZE=address,undefined
    # detect_leaks: LeakSanitizer too. halt_on_error for UBSan matches
    # -fno-sanitize-recover (cmake/sanitizers.cmake): a finding fails the test.
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1:check_initialization_order=1:detect_stack_use_after_return=1}
    export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$SUPPRESSIONS/lsan.supp:print_suppressions=0}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
    # The fuzz targets' corpus replays (label fuzz) are scripts/fuzz.sh's.
    TEST_FILTER=(-LE fuzz)
    ;;
  thread)
    BUILD_DIR=build-tsan
    SANITIZE=thread
    export TSAN_OPTIONS=${TSAN_OPTIONS:-suppressions=$SUPPRESSIONS/tsan.supp:halt_on_error=0:second_deadlock_stack=1}
    # The tests whose threads are the project's own (servers, streams,
    # metrics); Debian's gRPC itself is not TSan-instrumented.
    TEST_FILTER=(-R '^(services_grpc_test|services_metrics_test|verifier_service_test)$')
    ;;
  torch-address | torch-thread)
    TORCH_TARGETS=(learner_coordinator_test learner_bad_input_test rollout_weight_group_test
                   rollout_worker_test teacher_dynamic_batcher_test teacher_service_test model_test)
    TEST_FILTER=(-R "^($(IFS='|'; echo "${TORCH_TARGETS[*]}"))\$")
    if [[ $MODE == torch-address ]]; then
      BUILD_DIR=build-asan-torch
      SANITIZE=address
      # No leak check: libtorch and gRPC keep process-lifetime caches that
      # LeakSanitizer reports as leaks; use-after-free, overflows and
      # use-after-return are what this run is for.
      export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:detect_odr_violation=0:strict_string_checks=1:detect_stack_use_after_return=1}
    else
      BUILD_DIR=build-tsan-torch
      SANITIZE=thread
      export TSAN_OPTIONS=${TSAN_OPTIONS:-suppressions=$SUPPRESSIONS/tsan-torch.supp:halt_on_error=0:second_deadlock_stack=1}
    fi
    ;;
  *)
    echo "usage: $0 [address|thread|torch-address|torch-thread] [ctest args...]" >&2
    exit 2
    ;;
esac

if [[ $MODE == address && ${KAPPA_THREAD_SAFETY_CHECK:-1} != 0 ]]; then
  if [[ -f ${KAPPA_BUILD_DIR:-build}/compile_commands.json ]]; then
    bash scripts/thread_safety_check.sh
  else
    echo "sanitize: no ${KAPPA_BUILD_DIR:-build}/compile_commands.json, so no thread-safety" \
      "check (scripts/build.sh makes it)" >&2
  fi
fi

# Same ccache settings as scripts/build.sh, so CI reuses the objects.
export CCACHE_BASEDIR="$PWD"
export CCACHE_NOHASHDIR=1
if [[ $MODE == address ]]; then
  # Shared with scripts/fuzz.sh: one clang build for both stages.
  bash scripts/configure_clang_asan.sh "$BUILD_DIR"
elif [[ $MODE == torch-* ]]; then
  if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
    cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKAPPA_TORCH=ON \
      -DKAPPA_SANITIZE="$SANITIZE" -DKAPPA_WERROR=OFF
  fi
  cmake --build "$BUILD_DIR" -j "${KAPPA_JOBS:-2}" --target "${TORCH_TARGETS[@]}"
  ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout 1200 -j "${KAPPA_TEST_JOBS:-2}" \
    "${TEST_FILTER[@]}" "$@"
  exit
elif [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_COMPILER=clang++ -DKAPPA_TORCH=OFF -DKAPPA_SANITIZE="$SANITIZE" \
    -DKAPPA_WERROR=OFF
fi
cmake --build "$BUILD_DIR" -j "${KAPPA_JOBS:-2}"

ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout 600 -j "${KAPPA_TEST_JOBS:-2}" \
  "${TEST_FILTER[@]}" "$@"
