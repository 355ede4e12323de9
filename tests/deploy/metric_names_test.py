#!/usr/bin/env python3
"""Tests of deploy/tools/metric_names.py on fixtures (ctest deploy_metric_names_tool).

Usage: metric_names_test.py PATH/TO/metric_names.py TESTDATA_DIR

testdata/rules_fixture.yml and testdata/dashboard_fixture.json hold every way
a metric name may appear in an expression (inline, quoted, block, folded and
plain multi-line scalars, annotation template queries, collapsed rows,
annotation targets) and the places a kappa_ word must not be taken from
(comments, label values, annotation prose, legends, titles, label names,
recording-rule outputs with and without a colon).
"""

import os
import subprocess
import sys

EXPECTED_RAW = """kappa_a_total
kappa_anno_a
kappa_anno_b_total
kappa_b_seconds_bucket
kappa_c
kappa_d_ratio
kappa_e
kappa_f_seconds_bucket
kappa_g_seconds_count
kappa_g_seconds_sum
kappa_h_bucket_count_total
kappa_i
kappa_j
kappa_k
kappa_p_total
kappa_q_seconds_bucket
kappa_row_child
"""

EXPECTED_FAMILIES = """kappa_a_total
kappa_anno_a
kappa_anno_b_total
kappa_b_seconds
kappa_c
kappa_d_ratio
kappa_e
kappa_f_seconds
kappa_g_seconds
kappa_h_bucket_count_total
kappa_i
kappa_j
kappa_k
kappa_p_total
kappa_q_seconds
kappa_row_child
"""


def run(tool, *args):
    return subprocess.run([sys.executable, tool, *args], capture_output=True, text=True)


def main(argv):
    tool, data = argv[1], argv[2]
    rules = os.path.join(data, "rules_fixture.yml")
    dash = os.path.join(data, "dashboard_fixture.json")
    failures = []

    def expect(name, result, stdout, code=0):
        if result.returncode != code:
            failures.append(f"{name}: exit {result.returncode}, want {code}; stderr: {result.stderr}")
        elif stdout is not None and result.stdout != stdout:
            want, got = set(stdout.split()), set(result.stdout.split())
            failures.append(f"{name}: missing {sorted(want - got)}, unexpected {sorted(got - want)}"
                            + ("" if want != got else f", order/format differs:\n{result.stdout}"))

    expect("raw names", run(tool, rules, dash), EXPECTED_RAW)
    expect("--families", run(tool, "--families", rules, dash), EXPECTED_FAMILIES)
    only_rules = "".join(l + "\n" for l in EXPECTED_FAMILIES.split()
                         if not l.startswith(("kappa_anno", "kappa_p", "kappa_q", "kappa_row")))
    expect("rules only", run(tool, "--families", rules), only_rules)
    expect("no such file", run(tool, os.path.join(data, "nope.yml")), None, code=2)
    expect("no arguments", run(tool), None, code=2)
    expect("file without expr", run(tool, os.path.join(data, "no_expr.yml")), None, code=2)

    for f in failures:
        print("FAIL: " + f)
    if not failures:
        print("OK")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
