#!/usr/bin/env python3
"""Every metric the rules and dashboard query is documented (ctest deploy_metrics_documented).

Usage: check_metrics_documented.py METRICS_MD METRIC_NAMES_PY FILE...

Runs `metric_names.py --families FILE...` and checks that each family it
prints appears in METRICS_MD (docs/metrics.md) as `name` in backquotes, the
way the metric tables name them. A failure names each undocumented metric:
either a typo in a rule/panel, or a metric docs/metrics.md does not list yet.
"""

import re
import subprocess
import sys


def main(argv):
    if len(argv) < 4:
        sys.stderr.write(__doc__)
        return 2
    docs_path, tool, files = argv[1], argv[2], argv[3:]
    r = subprocess.run([sys.executable, tool, "--families", *files], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAIL: metric_names.py exited {r.returncode}: {r.stderr}")
        return 1
    names = r.stdout.split()
    if not names:
        print("FAIL: metric_names.py printed no metric")
        return 1
    with open(docs_path, encoding="utf-8") as f:
        documented = set(re.findall(r"`(kappa_[a-z0-9_]+)`", f.read()))
    missing = [n for n in names if n not in documented]
    for n in missing:
        print(f"FAIL: {n} is queried by {' '.join(files)} but not documented in {docs_path} (as `{n}`)")
    if not missing:
        print(f"OK: {len(names)} metric families, all documented")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
