#!/usr/bin/env bash
# Lists the googletest cases that did not run (GTEST_SKIP: "<file>:<line>:
# Skipped", its reason, "[  SKIPPED ] Suite.Case"), read from ctest's log
# (default build/Testing/Temporary/LastTest.log), each with the ctest test it
# belongs to and the reason it gave. (ctest lists the tests it did not run
# itself, under "The following tests did not run".) A skip is not a pass: scripts/test.sh
# prints this at the end of every run.
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
