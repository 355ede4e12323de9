#!/usr/bin/env python3
"""The collapse alarm judged against what each run's held-out accuracy did
afterwards (issue 39, item 7, the definition revised after round 4's E1),
from the runs' metrics.jsonl:

  borne out: the first collapse alarm at step s is followed, at some
             evaluation at or after s, by held-out accuracy >= DROP (0.1)
             below the best accuracy the run had reached by step s;
  unfounded: an alarm that is not borne out;
  missed:    a run that ends >= FALL (0.2) below its own peak with no
             collapse alarm before its final evaluation.

    /usr/bin/python3 scripts/alarm_outcomes.py EXP_DIR [EXP_DIR ...]
"""
import json
import os
import sys

DROP = 0.1
FALL = 0.2


def read_run(path):
    """(evaluations [(step, acc)], first collapse step or None), last record per step."""
    by_step = {}
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "step" in record:
                by_step[record["step"]] = record
    evaluations, first_alarm = [], None
    for step in sorted(by_step):
        record = by_step[step]
        if record.get("eval_accuracy") is not None:
            evaluations.append((step, record["eval_accuracy"]))
        for alarm in record.get("alarms") or []:
            if alarm.get("kind") == "collapse" and first_alarm is None:
                first_alarm = step
    return evaluations, first_alarm


def judge(evaluations, first_alarm):
    """'borne out' | 'unfounded' | 'missed' | 'quiet' (no alarm, no fall)."""
    if not evaluations:
        return None
    if first_alarm is not None:
        best_before = max([a for s, a in evaluations if s <= first_alarm] or [evaluations[0][1]])
        after = [a for s, a in evaluations if s >= first_alarm]
        return "borne out" if after and min(after) <= best_before - DROP else "unfounded"
    peak = max(a for _, a in evaluations)
    return "missed" if peak - evaluations[-1][1] >= FALL else "quiet"


def main(dirs):
    tally = {}
    for exp in dirs:
        runs_dir = os.path.join(exp, "runs")
        for name in sorted(os.listdir(runs_dir)):
            path = os.path.join(runs_dir, name, "metrics.jsonl")
            if not os.path.exists(path):
                continue
            evaluations, first_alarm = read_run(path)
            verdict = judge(evaluations, first_alarm)
            if verdict is None:
                continue
            tally.setdefault(verdict, []).append(f"{os.path.basename(exp.rstrip('/'))}/{name}"
                                                 + (f" (alarm @{first_alarm})" if first_alarm else ""))
    total = sum(len(v) for v in tally.values())
    raised = len(tally.get("borne out", [])) + len(tally.get("unfounded", []))
    print(f"runs {total}; collapse raised in {raised}: borne out {len(tally.get('borne out', []))}, "
          f"unfounded {len(tally.get('unfounded', []))}; missed falls {len(tally.get('missed', []))}")
    for verdict in ("unfounded", "missed", "borne out"):
        for run in tally.get(verdict, []):
            print(f"  {verdict}: {run}")


if __name__ == "__main__":
    main(sys.argv[1:])
