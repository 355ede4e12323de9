#!/usr/bin/env python3
"""Structural checks of the Grafana dashboard (ctest deploy_dashboard_*).

Usage:
  check_dashboard.py DASHBOARD.json DATASOURCE_PROVISIONING.yml [--promtool PROMTOOL]

Checks, each failure printed on its own line (exit status 1 if any):
  * the dashboard is valid JSON, with a uid, a title and panels;
  * the datasource uid is the one provisioned (the `uid:` of the datasource
    provisioning file): on every non-row panel, every target, every
    annotation query;
  * every target and annotation has a non-empty expr; panel ids are unique;
    panels carry a gridPos and do not overlap; no legacy `graph` panels;
  * the required panels exist by title, the K_DR heatmap is a heatmap of
    kappa_learner_kdr_bucket in heatmap format, the κ panel draws its
    threshold (10, alarms.kappa_threshold) as a line, the gradient-norm
    panel has a log axis;
  * an annotation query exists for each learner alarm kind;
  * with --promtool: every expr parses as PromQL (Grafana's $__ variables
    replaced by a duration), via `promtool check rules` on a generated rule
    file.
"""

import json
import os
import re
import subprocess
import sys
import tempfile

REQUIRED_TITLES = [
    "κ = ‖∇L_R‖ / ‖∇L_D‖",
    "Gradient norms ‖∇L_R‖ and ‖∇L_D‖",
    "Losses L_R / L_D / L_SFT",
    "Reward mean and held-out accuracy",
    "K_DR negative ratio",
    "K_DR distribution",
    "Alarms active",
    "Throughput: tokens/s",
    "Throughput: groups/s and samples/s",
    "Staleness (policy versions)",
    "Queue depths",
    "Learner step seconds",
    "Worker generation seconds",
    "Teacher score seconds",
    "Verifier verify seconds",
]
ALARM_KINDS = ["magnitude_drowning", "directional_conflict", "collapse", "inference_mismatch"]
KAPPA_THRESHOLD = 10  # alarms.kappa_threshold default (services/config.h)


def main(argv):
    args = argv[1:]
    promtool = None
    if "--promtool" in args:
        i = args.index("--promtool")
        promtool = args[i + 1]
        del args[i:i + 2]
    if len(args) != 2:
        sys.stderr.write(__doc__)
        return 2
    dashboard_path, datasource_path = args
    errors = []

    with open(datasource_path, encoding="utf-8") as f:
        uids = re.findall(r"^\s*uid:\s*['\"]?([A-Za-z0-9_-]+)", f.read(), re.M)
    if len(uids) != 1:
        print(f"FAIL: expected one datasource uid in {datasource_path}, found {uids}")
        return 1
    uid = uids[0]

    try:
        with open(dashboard_path, encoding="utf-8") as f:
            dash = json.load(f)
    except ValueError as e:
        print(f"FAIL: {dashboard_path} is not valid JSON: {e}")
        return 1

    for key in ("uid", "title", "panels"):
        if not dash.get(key):
            errors.append(f"dashboard has no {key}")
    panels = []
    for p in dash.get("panels", []):
        panels.append(p)
        panels.extend(p.get("panels", []))  # collapsed rows hold their panels

    exprs = []
    ids = set()
    cells = {}
    for p in panels:
        title = p.get("title", "<untitled>")
        if p.get("id") in ids:
            errors.append(f"panel {title!r}: duplicate id {p.get('id')}")
        ids.add(p.get("id"))
        g = p.get("gridPos")
        if not g or any(k not in g for k in "hwxy"):
            errors.append(f"panel {title!r}: no complete gridPos")
        else:
            for yy in range(g["y"], g["y"] + g["h"]):
                for xx in range(g["x"], g["x"] + g["w"]):
                    if (xx, yy) in cells:
                        errors.append(f"panel {title!r} overlaps {cells[(xx, yy)]!r}")
                        break
                    cells[(xx, yy)] = title
                else:
                    continue
                break
            if g["x"] + g["w"] > 24:
                errors.append(f"panel {title!r}: wider than the 24-column grid")
        if p.get("type") == "row":
            continue
        if p.get("type") == "graph":
            errors.append(f"panel {title!r}: legacy graph panel, use timeseries")
        if (p.get("datasource") or {}).get("uid") != uid:
            errors.append(f"panel {title!r}: datasource uid {(p.get('datasource') or {}).get('uid')!r}, want {uid!r}")
        targets = p.get("targets") or []
        if not targets:
            errors.append(f"panel {title!r}: no targets")
        for t in targets:
            if (t.get("datasource") or {}).get("uid") != uid:
                errors.append(f"panel {title!r} target {t.get('refId')}: datasource uid, want {uid!r}")
            if not str(t.get("expr", "")).strip():
                errors.append(f"panel {title!r} target {t.get('refId')}: no expr")
            else:
                exprs.append((f"panel {title!r} target {t.get('refId')}", t["expr"]))

    by_title = {p.get("title"): p for p in panels}
    for title in REQUIRED_TITLES:
        if title not in by_title:
            errors.append(f"required panel {title!r} missing")

    heatmaps = [p for p in panels if p.get("type") == "heatmap"]
    if not any(any("kappa_learner_kdr_bucket" in t.get("expr", "") and t.get("format") == "heatmap"
                   for t in p.get("targets", [])) for p in heatmaps):
        errors.append("no heatmap panel of kappa_learner_kdr_bucket with format heatmap")

    kappa = by_title.get(REQUIRED_TITLES[0])
    if kappa:
        d = kappa.get("fieldConfig", {}).get("defaults", {})
        steps = [s.get("value") for s in d.get("thresholds", {}).get("steps", [])]
        if KAPPA_THRESHOLD not in steps:
            errors.append(f"κ panel: no threshold step at {KAPPA_THRESHOLD}")
        if d.get("custom", {}).get("thresholdsStyle", {}).get("mode") not in ("line", "line+area", "dashed"):
            errors.append("κ panel: threshold not drawn (thresholdsStyle.mode)")
        if not any(t.get("expr", "").strip() == "kappa_learner_grad_norm_ratio" for t in kappa.get("targets", [])):
            errors.append("κ panel: does not plot kappa_learner_grad_norm_ratio")
    norms = by_title.get(REQUIRED_TITLES[1])
    if norms and norms.get("fieldConfig", {}).get("defaults", {}).get("custom", {}).get(
            "scaleDistribution", {}).get("type") != "log":
        errors.append("gradient-norm panel: axis is not log")

    annotations = dash.get("annotations", {}).get("list", [])
    for a in annotations:
        name = a.get("name", "<unnamed>")
        if (a.get("datasource") or {}).get("uid") != uid:
            errors.append(f"annotation {name!r}: datasource uid, want {uid!r}")
        expr = a.get("expr") or (a.get("target") or {}).get("expr") or ""
        if not expr.strip():
            errors.append(f"annotation {name!r}: no expr")
        else:
            exprs.append((f"annotation {name!r}", expr))
        target = a.get("target")
        if target and target.get("expr") not in (None, a.get("expr")) and a.get("expr"):
            errors.append(f"annotation {name!r}: expr and target.expr differ")
    for kind in ALARM_KINDS:
        if not any(kind in (a.get("expr") or (a.get("target") or {}).get("expr") or "") for a in annotations):
            errors.append(f"no annotation query for alarm kind {kind}")

    if promtool:
        errors += check_promql(promtool, exprs)

    for e in errors:
        print("FAIL: " + e)
    if not errors:
        print(f"OK: {len(panels)} panels, {len(exprs)} queries, datasource {uid}")
    return 1 if errors else 0


def check_promql(promtool, exprs):
    """Every expression parses: one recording rule each, `promtool check rules`."""
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    for i, (_, expr) in enumerate(exprs):
        e = re.sub(r"\$__(rate_interval|interval|range)", "1m", expr)
        e = re.sub(r"\$__\w+", "60", e)
        lines.append(f"      - record: dashboard:expr{i}")
        lines.append(f"        expr: {json.dumps(e, ensure_ascii=False)}")
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False, encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
        path = f.name
    try:
        r = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True)
    finally:
        os.unlink(path)
    if r.returncode == 0:
        return []
    out = r.stdout + r.stderr
    errs = []
    for m in re.finditer(r"dashboard:expr(\d+)", out):
        where, expr = exprs[int(m.group(1))]
        errs.append(f"{where}: PromQL does not parse: {expr}")
    return errs or [f"promtool check rules on the dashboard queries failed:\n{out}"]


if __name__ == "__main__":
    sys.exit(main(sys.argv))
