#!/usr/bin/env python3
"""The collapse alarm's precision over experiments (issue 39, item 7), from
the results.csv files `kappa experiment` writes:

  false alarm: the run raised collapse, and its final or peak held-out
               accuracy is within 0.05 of the best run of its arm;
  true alarm:  the run raised collapse and ended >= 0.2 below its own peak;
  missed:      the run ended >= 0.2 below its own peak and raised nothing.

    /usr/bin/python3 scripts/alarm_precision.py EXP_DIR/results.csv [...]
"""
import csv
import sys


def number(text):
    return float(text) if text not in ("", None) else None


def main(paths):
    runs = []
    for path in paths:
        with open(path) as f:
            for row in csv.DictReader(f):
                if row["status"] != "ok":
                    continue
                runs.append({
                    "file": path, "arm": row["arm"], "name": row["name"],
                    "final": number(row["final_eval_accuracy"]),
                    "peak": number(row["peak_eval_accuracy"]),
                    "alarms": int(row["alarms_collapse"] or 0)})
    best = {}
    for r in runs:
        key = (r["file"], r["arm"])
        for field in ("final", "peak"):
            if r[field] is not None:
                best[key, field] = max(best.get((key, field), r[field]), r[field])
    fired = [r for r in runs if r["alarms"] > 0]
    fell = [r for r in runs if r["peak"] is not None and r["final"] is not None
            and r["peak"] - r["final"] >= 0.2]
    false_alarms = [r for r in fired if any(
        r[f] is not None and best[(r["file"], r["arm"]), f] - r[f] <= 0.05
        for f in ("final", "peak"))]
    true_alarms = [r for r in fired if r in fell]
    missed = [r for r in fell if r["alarms"] == 0]
    print(f"runs {len(runs)}; collapse raised in {len(fired)}; fell >= 0.2 from their peak: "
          f"{len(fell)}")
    print(f"false alarms {len(false_alarms)} (rate {len(false_alarms) / max(1, len(runs)):.3f} "
          f"of runs); true alarms {len(true_alarms)} of {len(fell)} falls; missed {len(missed)}")
    for label, rows in (("false", false_alarms), ("missed", missed)):
        for r in rows:
            print(f"  {label}: {r['name']} ({r['file']}): final {r['final']}, peak {r['peak']}")


if __name__ == "__main__":
    main(sys.argv[1:])
