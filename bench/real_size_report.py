#!/usr/bin/env python3
"""Summarises bench/real_size_run.sh's work directory as Markdown tables.

  real_size_report.py WORK_DIR

Reads what the run left behind and measures nothing itself:
  * hwm_leg*.txt: "<process name> <pid> <VmHWM KiB>" samples (peak RSS of each process, also
    of the learner killed with SIGKILL, which logs nothing at exit);
  * runs/qwen-real/logs/*.log: each process's "peak_rss_bytes=" exit line, the learner's
    snapshot, checkpoint and resume lines, the workers' "loaded on" (publish -> in use),
    "group sent", "group stages" and "message bytes" lines;
  * runs/qwen-real/metrics.jsonl: per-step seconds and sizes.
"""
import json
import os
import re
import statistics
import sys


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def median(values):
    return statistics.median(values) if values else float("nan")


def fmt_range(values, unit="s", digits=1):
    if not values:
        return "n/a"
    return (f"{median(values):.{digits}f} {unit} (min {min(values):.{digits}f}, "
            f"max {max(values):.{digits}f}, n={len(values)})")


def sampled_peaks(work):
    """Largest VmHWM per process name over both legs, MiB."""
    peaks = {}
    for leg in ("hwm_leg1.txt", "hwm_leg2.txt"):
        for line in read(os.path.join(work, leg)).splitlines():
            parts = line.split()
            if len(parts) != 3:
                continue
            name, pid, kib = parts[0], parts[1], int(parts[2])
            key = (leg, name, pid)
            peaks[key] = max(peaks.get(key, 0), kib)
    by_name = {}
    for (leg, name, pid), kib in peaks.items():
        by_name.setdefault(name, []).append(kib / 1024.0)
    return by_name


def logged_peaks(logs):
    """peak_rss_bytes lines per log file, MiB."""
    out = {}
    for name in sorted(os.listdir(logs)):
        values = [int(v) / 2**20 for v in re.findall(r"peak_rss_bytes=(\d+)",
                                                      read(os.path.join(logs, name)))]
        if values:
            out[name[:-4]] = values
    return out


def main():
    work = sys.argv[1]
    run = os.path.join(work, "runs", "qwen-real")
    logs = os.path.join(run, "logs")
    records = [json.loads(line) for line in read(os.path.join(run, "metrics.jsonl")).splitlines()
               if line.strip().startswith("{")]
    steps = [r for r in records if "step_seconds" in r]

    print("### Peak resident memory per process\n")
    print("| process | sampled VmHWM, MiB (max over instances and legs) | logged at exit, MiB |")
    print("|---|---|---|")
    logged = logged_peaks(logs)
    names = {"kappa-learner": "learner", "kappa-teacher": "teacher",
             "kappa-verifier": "verifier", "kappa-rollout-w": "rollout"}
    for comm, values in sorted(sampled_peaks(work).items()):
        label = names.get(comm, comm)
        at_exit = [v for k, vs in logged.items() if k.startswith(label) for v in vs]
        print(f"| {label} | {max(values):.0f} | "
              f"{', '.join(f'{v:.0f}' for v in at_exit) or 'none (killed)'} |")

    learner = read(os.path.join(logs, "learner.log"))
    workers = "".join(read(os.path.join(logs, n)) for n in sorted(os.listdir(logs))
                      if n.startswith("rollout"))
    snapshot = [float(s) for s in re.findall(r"snapshot: \d+ MiB \w+ in ([\d.]+) s", learner)]
    checkpoint = [float(s) for s in re.findall(r"checkpoint \S+ written in ([\d.]+) s", learner)]
    loaded = [float(s) / 1000 for s in re.findall(r"loaded on \w+ \(.*?, ([\d.]+) ms\)", workers)]
    group = [float(s) for s in re.findall(r"group sent: .* ([\d.]+)s$", workers, re.M)]
    print("\n### Seconds per stage\n")
    print("| stage | seconds |")
    print("|---|---|")
    print(f"| learner step (metrics.jsonl step_seconds) | "
          f"{fmt_range([r['step_seconds'] for r in steps])} |")
    print(f"| step interval (interval between optimizer steps) | "
          f"{fmt_range([r['interval_seconds'] for r in steps if r.get('interval_seconds')])} |")
    print(f"| one group: decode + verify + teacher score (worker) | {fmt_range(group)} |")
    for stage in ("decode", "verify", "teacher_score"):
        seconds = [float(v) for v in re.findall(rf"group stages: .* {stage} ([\d.]+)s", workers)]
        if seconds:
            print(f"| ... of which {stage.replace('_', ' ')} | {fmt_range(seconds, digits=3)} |")
    print(f"| learner snapshot of a version (bf16 copy) | {fmt_range(snapshot, digits=2)} |")
    print(f"| version received and in use at a worker | {fmt_range(loaded, digits=2)} |")
    print(f"| checkpoint write (model + AdamW) | {fmt_range(checkpoint)} |")
    resumed = re.findall(r"resuming from (\S+)", learner)
    print(f"\nresumed from: {', '.join(resumed) or 'none'}")
    versions = [(r["step"], r["policy_version"]) for r in steps]
    print(f"(step, policy_version) in metrics.jsonl: {versions}")

    print("\n### Bytes per message kind\n")
    print("| message | bytes per message | messages |")
    print("|---|---|---|")
    totals = {}
    for m in re.finditer(r"message bytes: group sent (\d+) in (\d+); score sent (\d+) received "
                         r"(\d+) in (\d+) calls; verify sent (\d+) received (\d+) in (\d+) calls",
                         workers):
        g, gn, ss, sr, sn, vs, vr, vn = map(int, m.groups())
        for key, value in (("group", (g, gn)), ("score request", (ss, sn)),
                           ("score response", (sr, sn)), ("verify request", (vs, vn)),
                           ("verify response", (vr, vn))):
            total = totals.setdefault(key, [0, 0])
            total[0] += value[0]
            total[1] += value[1]
    for key, (total, count) in totals.items():
        print(f"| {key} | {total / max(count, 1):,.0f} | {count} |")
    policy = re.findall(r"loaded on \w+ \(\d+ parameters, (\d+) (\w+) bytes", workers)
    if policy:
        print(f"| policy version ({policy[0][1]}) | {int(policy[0][0]):,} | {len(policy)} |")
    if steps:
        print(f"| teacher rows per step in the learner (teacher_bytes) | "
              f"{median([r['teacher_bytes'] for r in steps]):,.0f} | {len(steps)} steps |")


if __name__ == "__main__":
    main()
