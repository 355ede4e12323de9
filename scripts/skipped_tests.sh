#!/usr/bin/env bash
# Lists what did not run, read from ctest's log (default
# build/Testing/Temporary/LastTest.log): the googletest cases that skipped
# (GTEST_SKIP: "<file>:<line>: Skipped", its reason, "[  SKIPPED ]
# Suite.Case"), each with the ctest test it belongs to and its reason, and
# the script tests that skipped whole (they print "SKIPPED: <reason>" and
# exit with their SKIP_RETURN_CODE, which ctest shows as ***Skipped). A skip
# is not a pass: scripts/test.sh prints this at the end of every run.
# Usage: bash scripts/skipped_tests.sh [LOG]   (exit 0; 2 when LOG is absent)
set -euo pipefail
log=${1:-build/Testing/Temporary/LastTest.log}
if [[ ! -f $log ]]; then
  echo "skipped tests: no ctest log at $log" >&2
  exit 2
fi
awk '
  /^[0-9]+\/[0-9]+ Test: / { test = $3; next }
  /: Skipped$/ { want_reason = 1; reason = ""; next }
  want_reason { reason = $0; want_reason = 0; next }
  /^SKIPPED: / {
    count++
    lines[count] = sprintf("  %s: (the whole test): %s", test, substr($0, 10))
    next
  }
  /^\[  SKIPPED \] [^ ]+ \([0-9]+ ms\)$/ {
    count++
    lines[count] = sprintf("  %s: %s: %s", test, $4, reason == "" ? "(no reason given)" : reason)
    reason = ""
  }
  END {
    if (count == 0) { print "skipped tests: none (every test case ran)"; exit }
    printf "skipped tests: %d test case%s did not run:\n", count, count == 1 ? "" : "s"
    for (i = 1; i <= count; i++) print lines[i]
  }
' "$log"
