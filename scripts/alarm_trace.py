#!/usr/bin/env python3
"""Reduces a run's metrics.jsonl to what the learner's alarms observe, one
CSV row per step, for tests/algo/alarms_test.cc to replay through
AlarmMonitor (learner/step_record.cc ObservationOf is the mapping):

  step, reward_mean, loss_distill (empty: nothing distilled), entropy,
  (a first row for step 0 carries only the evaluation before training),
  kappa_effective, kdr_negative_weighted_fraction, mismatch_abs_mean
  (each empty when the step did not measure it), eval_accuracy (empty
  between evaluations; the tests read it to say what happened, the
  alarms never do).

    /usr/bin/python3 scripts/alarm_trace.py RUN_DIR/metrics.jsonl OUT.csv
"""
import json
import sys


def cell(value, fmt="%.6g"):
    return "" if value is None else fmt % value


def main(source, target):
    by_step = {}
    evals = {}
    for line in open(source):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "eval_accuracy" in record:
            evals[record["step"]] = record["eval_accuracy"]
        if record.get("step", 0) >= 1 and "reward_mean" in record:
            by_step[record["step"]] = record  # a resumed step: its later record
    with open(target, "w") as out:
        out.write("step,reward_mean,loss_distill,entropy,kappa_effective,"
                  "kdr_negative_weighted_fraction,mismatch_abs_mean,eval_accuracy\n")
        if 0 in evals:
            out.write("0,,,,,,,%s\n" % cell(evals[0], "%.4g"))
        for step in sorted(by_step):
            r = by_step[step]
            distilled = r.get("distill_positions", 0) > 0
            out.write(",".join([
                str(step), cell(r["reward_mean"]),
                cell(r.get("loss_distill") if distilled else None), cell(r["entropy"]),
                cell(r.get("kappa_effective")), cell(r.get("kdr_negative_weighted_fraction")),
                cell(r.get("mismatch_abs_mean")), cell(evals.get(step), "%.4g")]) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
