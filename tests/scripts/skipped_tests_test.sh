#!/usr/bin/env bash
# scripts/skipped_tests.sh on a recorded ctest log: every GTEST_SKIP case is
# listed with its ctest test and reason (none given: said so), a script test
# that skipped whole (SKIPPED: line, SKIP_RETURN_CODE) with its reason, the
# summary lines are not counted twice, and a log without skips says none.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
got=$(bash "$root/scripts/skipped_tests.sh" "$root/tests/scripts/skipped_tests_fixture.log")
want="skipped tests: 3 test cases did not run:
  algo_dynamics_test: CudaStep.MatchesTheCpuStep: no CUDA device
  sandbox_test: Sandbox.NoNetwork: (no reason given)
  deploy_k8s_structure: (the whole test): kubectl >= 1.27 is not on PATH (not a Debian package: https://kubernetes.io/docs/tasks/tools/)"
if [[ $got != "$want" ]]; then
  printf 'got:\n%s\nwant:\n%s\n' "$got" "$want" >&2
  exit 1
fi
none=$(mktemp)
trap 'rm -f "$none"' EXIT
grep -v "SKIPPED\|Skipped" "$root/tests/scripts/skipped_tests_fixture.log" > "$none"
got=$(bash "$root/scripts/skipped_tests.sh" "$none")
[[ $got == "skipped tests: none (every test case ran)" ]] || { echo "got: $got" >&2; exit 1; }
echo "skipped_tests.sh: ok"
