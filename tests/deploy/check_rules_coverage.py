#!/usr/bin/env python3
"""Every alert has a firing and a non-firing unit test (ctest deploy_rules_coverage).

Usage: check_rules_coverage.py RULES_YML RULES_TEST_YML

`promtool test rules` only runs the cases written; this checks that they
cover every `alert:` of RULES_YML with at least one alert_rule_test case
whose exp_alerts is non-empty (it fires) and one whose exp_alerts is empty
(`exp_alerts: []` or absent: it does not fire), that no case names an alert
RULES_YML lacks, and that RULES_TEST_YML loads RULES_YML.
"""

import os
import re
import sys


def main(argv):
    if len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    rules_path, tests_path = argv[1], argv[2]
    with open(rules_path, encoding="utf-8") as f:
        alerts = re.findall(r"^\s*-\s+alert:\s*['\"]?([A-Za-z0-9_]+)", f.read(), re.M)
    with open(tests_path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    errors = []
    if not alerts:
        errors.append(f"no alert in {rules_path}")
    if len(set(alerts)) != len(alerts):
        errors.append(f"duplicate alert names in {rules_path}")

    rule_files = []
    firing, quiet = set(), set()
    i = 0
    while i < len(lines):
        line = lines[i]
        if re.match(r"^rule_files:", line):
            j = i + 1
            while j < len(lines) and re.match(r"^\s+-\s+", lines[j]):
                rule_files.append(lines[j].split("-", 1)[1].strip().strip("'\""))
                j += 1
        m = re.match(r"^(\s*)(?:-\s+)?alertname:\s*['\"]?([A-Za-z0-9_]+)", line)
        if m:
            name = m.group(2)
            # This case's exp_alerts: before the next case or test.
            fires = False
            j = i + 1
            while j < len(lines) and not re.match(r"^\s*-\s+(eval_time|alertname|interval|name|input_series|series):", lines[j]) \
                    and not re.match(r"^\s*(alert_rule_test|promql_expr_test|input_series):", lines[j]):
                e = re.match(r"^\s*exp_alerts:\s*(.*?)\s*$", lines[j])
                if e:
                    value = e.group(1)
                    if value and value not in ("[]", "null", "~"):
                        fires = True
                    elif not value:
                        k = j + 1
                        while k < len(lines) and (not lines[k].strip() or lines[k].strip().startswith("#")):
                            k += 1
                        fires = k < len(lines) and lines[k].strip().startswith("- exp_")
                    break
                j += 1
            (firing if fires else quiet).add(name)
        i += 1

    if os.path.basename(rules_path) not in [os.path.basename(r) for r in rule_files]:
        errors.append(f"{tests_path} does not load {os.path.basename(rules_path)} (rule_files: {rule_files})")
    for name in alerts:
        if name not in firing:
            errors.append(f"alert {name}: no test case where it fires")
        if name not in quiet:
            errors.append(f"alert {name}: no test case where it does not fire (exp_alerts: [])")
    for name in sorted((firing | quiet) - set(alerts)):
        errors.append(f"test case for unknown alert {name}")
    for e in errors:
        print("FAIL: " + e)
    if not errors:
        print(f"OK: {len(alerts)} alerts, each with firing and non-firing cases")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
