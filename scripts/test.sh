#!/usr/bin/env bash
# The test command: installs what is missing (scripts/setup.sh test: the build
# set plus the test, fuzz and Node.js packages), builds, runs every test
# through ctest, then the format check (scripts/check_format.sh: the C++ lines
# committed since .clang-format was added), the sanitizer build's tests
# (scripts/sanitize.sh: ASan + UBSan, build-asan), the bounded fuzz runs
# (scripts/fuzz.sh, in the same build-asan) and, where /usr/local/cuda has nvcc, the CUDA
# kernels' compile check (scripts/cuda_compile_check.sh, build-cuda-check: no
# GPU needed).
# After the build it prints scripts/build_profile.sh's slowest steps, and at
# the end, passed or failed, the googletest cases that were skipped, with
# their reasons (scripts/skipped_tests.sh), and the seconds each stage took.
# Arguments go to the main ctest and select a subset: then the format,
# sanitizer and fuzz stages are skipped. KAPPA_SANITIZER_CHECKS=0 skips the
# sanitizer and fuzz stages, KAPPA_FORMAT_CHECK=0 the format check.
# Exit status: that of the first stage that fails, 0 when none does.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${KAPPA_BUILD_DIR:-build}

# ---- stage timing: a table at exit, also when a stage fails ----
now_us() {
  local t=${EPOCHREALTIME:-}
  if [[ -n $t ]]; then echo "${t//[!0-9]/}"; else echo $((SECONDS * 1000000)); fi
}
SCRIPT_START=$(now_us)
CTEST_RAN=0
STAGE="" STAGE_START=0
STAGE_NAMES=() STAGE_US=() STAGE_RESULTS=()
end_stage() { # RESULT: closes the running stage, if any
  if [[ -n $STAGE ]]; then
    STAGE_NAMES+=("$STAGE")
    STAGE_US+=("$(($(now_us) - STAGE_START))")
    STAGE_RESULTS+=("$1")
    STAGE=""
  fi
}
begin_stage() { # NAME
  end_stage ok
  STAGE=$1
  STAGE_START=$(now_us)
}
skip_stage() { # NAME WHY
  end_stage ok
  STAGE_NAMES+=("$1")
  STAGE_US+=(-1)
  STAGE_RESULTS+=("skipped: $2")
}
seconds() { # MICROSECONDS -> seconds with one decimal
  printf '%d.%d' $(($1 / 1000000)) $(($1 % 1000000 / 100000))
}
print_stage_table() {
  local rc=$?
  trap - EXIT
  if ((rc == 0)); then end_stage ok; else end_stage "FAILED (exit $rc)"; fi
  echo
  # A skipped test case is not a pass: name each one and its reason.
  if ((CTEST_RAN)); then
    bash scripts/skipped_tests.sh "$BUILD_DIR/Testing/Temporary/LastTest.log" || true
    echo
  fi
  echo "test: time per stage"
  printf '  %-20s %9s  %s\n' stage seconds result
  local i
  for i in "${!STAGE_NAMES[@]}"; do
    if ((STAGE_US[i] < 0)); then
      printf '  %-20s %9s  %s\n' "${STAGE_NAMES[i]}" - "${STAGE_RESULTS[i]}"
    else
      printf '  %-20s %9s  %s\n' "${STAGE_NAMES[i]}" "$(seconds "${STAGE_US[i]}")" "${STAGE_RESULTS[i]}"
    fi
  done
  local total=$(($(now_us) - SCRIPT_START))
  printf '  %-20s %9s  (%d min %d s)\n' total "$(seconds "$total")" \
    $((total / 60000000)) $((total / 1000000 % 60))
  exit "$rc"
}
trap print_stage_table EXIT

# ---- the stages ----
begin_stage setup
bash scripts/setup.sh test

begin_stage build
# A build directory that scripts/demo.sh configured before the test packages
# were here lacks the tests that configure-time checks leave out without them
# (node, python3, jinja2); configure it again once (cached results are kept,
# the missing ones are searched again).
if [[ -f $BUILD_DIR/build.ninja ]]; then
  if [[ ! -f $BUILD_DIR/.kappa-test-configured ]]; then
    echo "test: configuring $BUILD_DIR again, now that the test packages are installed"
    cmake -S . -B "$BUILD_DIR"
  fi
  touch "$BUILD_DIR/.kappa-test-configured"
fi
bash scripts/build.sh
touch "$BUILD_DIR/.kappa-test-configured"
end_stage ok

# Where the build's minutes went (cheap; never fails the run).
if [[ -f scripts/build_profile.sh ]]; then
  bash scripts/build_profile.sh "$BUILD_DIR" || echo "test: no build profile (ignored)"
fi

begin_stage ctest
CTEST_RAN=1
(cd "$BUILD_DIR" && ctest --output-on-failure --timeout 600 -j "${KAPPA_TEST_JOBS:-2}" "$@")

if (($# > 0)); then
  skip_stage format "ctest arguments given"
elif [[ ${KAPPA_FORMAT_CHECK:-1} == 0 ]]; then
  skip_stage format "KAPPA_FORMAT_CHECK=0"
else
  begin_stage format
  bash scripts/check_format.sh
fi

if (($# > 0)) || [[ ${KAPPA_SANITIZER_CHECKS:-1} == 0 ]]; then
  why="ctest arguments given"
  if (($# == 0)); then why="KAPPA_SANITIZER_CHECKS=0"; fi
  skip_stage sanitizer "$why"
  skip_stage fuzz "$why"
  skip_stage cuda-compile-check "$why"
else
  begin_stage sanitizer
  bash scripts/sanitize.sh
  begin_stage fuzz
  bash scripts/fuzz.sh
  if [[ -x ${CUDACXX:-/usr/local/cuda/bin/nvcc} ]]; then
    begin_stage cuda-compile-check
    bash scripts/cuda_compile_check.sh
  else
    skip_stage cuda-compile-check "no nvcc at ${CUDACXX:-/usr/local/cuda/bin/nvcc}"
  fi
fi
end_stage ok
