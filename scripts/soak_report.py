#!/usr/bin/python3
"""The report of a scripts/soak.sh run (markdown on stdout).

    soak_report.py WORKDIR [--minutes N] [--seed S] [--warmup-s 120]

Reads WORKDIR/runs/soak/metrics.jsonl (every segment appends to it),
WORKDIR/events.jsonl (faults and segments), WORKDIR/rss.jsonl (memory samples)
and WORKDIR/kappa-run.*.out (what `kappa run` said). Exits 1 when a check
fails: a step missing or trained twice within a segment, a lease consumed
twice, or a process whose memory grew by 10 % or more after its warm-up.
"""
import argparse
import glob
import json
import os
import re
import sys
from collections import Counter, defaultdict

DROP_REASONS = ("stale", "duplicate", "unknown_lease")


def read_jsonl(path):
    records = []
    if not os.path.exists(path):
        return records
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{number}: not JSON ({e}); a torn line")
    return records


def learner_of(record):
    """The learner process that trained a step: its lease ids are "<random hex>-<serial>"."""
    leases = record.get("lease_ids") or [""]
    return leases[0].rsplit("-", 1)[0]


def split_segments(step_records):
    """Step records grouped by learner process (a resume starts a new one)."""
    segments, last = [[]], None
    for record in step_records:
        if learner_of(record) != last and segments[-1]:
            segments.append([])
        segments[-1].append(record)
        last = learner_of(record)
    return segments


def step_checks(segments):
    problems = []
    for i, segment in enumerate(segments, 1):
        counts = Counter(r["step"] for r in segment)
        twice = sorted(s for s, n in counts.items() if n > 1)
        if twice:
            problems.append(f"segment {i}: steps trained twice: {twice[:10]}")
    final = {}
    for segment in segments:  # a later segment's record wins: deduplicated by the last resume
        for record in segment:
            final[record["step"]] = record
    top = max(final) if final else 0
    missing = [s for s in range(1, top + 1) if s not in final]
    if missing:
        problems.append(f"steps missing after deduplication: {missing[:10]}")
    retrained = sum(len(s) for s in segments) - len(final)
    return final, top, retrained, problems


def lease_checks(step_records):
    counts = Counter(lease for r in step_records for lease in r.get("lease_ids", []))
    twice = [lease for lease, n in counts.items() if n > 1]
    return len(counts), twice


def dropped_by_reason(segments):
    """Coordinator counters are per learner process: the last record of each segment, summed."""
    totals = Counter()
    for segment in segments:
        if not segment:
            continue
        last = segment[-1]
        for reason in DROP_REASONS:
            totals[reason] += int(last.get(f"groups_dropped_{reason}", 0) or 0)
        totals["leases_reissued"] += int(last.get("leases_reissued", 0) or 0)
    return totals


def memory_growth(samples, warmup_s):
    """Per process name: its longest-lived pid's RSS after warm-up vs at the end."""
    by_pid = defaultdict(list)
    for s in samples:
        by_pid[(s["process"], s["pid"])].append((s["t"], s["rss_kb"]))
    rows = {}
    for (process, pid), points in by_pid.items():
        points.sort()
        born = points[0][0]
        after = [kb for t, kb in points if t - born >= warmup_s]
        if len(after) < 3:
            continue
        lifetime = points[-1][0] - born
        row = {
            "pid": pid,
            "lifetime_s": lifetime,
            "warm_kb": after[0],
            "last_kb": after[-1],
            "max_kb": max(after),
            "growth": (after[-1] - after[0]) / after[0],
            "pids": sum(1 for (p, _) in by_pid if p == process),
        }
        if process not in rows or lifetime > rows[process]["lifetime_s"]:
            rows[process] = row
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir")
    parser.add_argument("--minutes", type=float, default=0)
    parser.add_argument("--seed", default="?")
    parser.add_argument("--warmup-s", type=float, default=120)
    args = parser.parse_args()
    run_dir = os.path.join(args.workdir, "runs", "soak")

    records = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    step_records = [r for r in records if "lease_ids" in r]
    events = read_jsonl(os.path.join(args.workdir, "events.jsonl"))
    samples = read_jsonl(os.path.join(args.workdir, "rss.jsonl"))

    segments = split_segments(step_records)
    final, top, retrained, problems = step_checks(segments)
    leases, leases_twice = lease_checks(step_records)
    if leases_twice:
        problems.append(f"leases consumed twice: {leases_twice[:5]}")
    dropped = dropped_by_reason(segments)
    growth = memory_growth(samples, args.warmup_s)
    for process, row in growth.items():
        if row["growth"] >= 0.10:
            problems.append(f"{process} grew {100 * row['growth']:.1f} % after warm-up")

    faults = Counter((e["kind"], re.sub(r"-\d+$", "", e.get("process", "")))
                     for e in events if e["kind"] in ("sigkill", "sigstop"))
    restarts = 0
    for out in glob.glob(os.path.join(args.workdir, "kappa-run.*.out")):
        with open(out, errors="replace") as f:
            restarts += sum(1 for line in f if "restarting it" in line)
    resumes = sum(1 for e in events if e["kind"] == "segment" and e.get("resume"))
    elapsed = (events[-1]["t"] - events[0]["t"]) if events else 0
    if samples and not growth:
        problems.append("no process lived past its warm-up: memory growth not measured")

    print(f"# Soak report: {args.minutes:g} minutes, seed {args.seed}\n")
    print(f"- wall time {elapsed / 60:.1f} min; {len(segments)} learner segment(s), "
          f"{resumes} resume(s) after a learner SIGKILL")
    print(f"- steps trained: {top} (each once after deduplicating by the last resume; "
          f"{retrained} step(s) retrained after a resume, from the checkpoint before the kill)")
    print(f"- leases consumed: {leases}, none twice" if not leases_twice else
          f"- leases consumed: {leases}, {len(leases_twice)} TWICE")
    print("- faults: " + ", ".join(f"{kind} {process} ×{n}"
                                   for (kind, process), n in sorted(faults.items())))
    print(f"- processes restarted by kappa run: {restarts}")
    print("- groups dropped (summed over segments): " +
          ", ".join(f"{reason} {dropped[reason]}" for reason in DROP_REASONS) +
          f"; leases re-issued {dropped['leases_reissued']}")
    print(f"\n| process | pids seen | longest life (min) | RSS after {args.warmup_s:g} s warm-up (MiB) "
          "| max (MiB) | last (MiB) | growth |")
    print("|---|---|---|---|---|---|---|")
    for process in sorted(growth):
        row = growth[process]
        print(f"| {process} | {row['pids']} | {row['lifetime_s'] / 60:.1f} | "
              f"{row['warm_kb'] / 1024:.0f} | {row['max_kb'] / 1024:.0f} | "
              f"{row['last_kb'] / 1024:.0f} | {100 * row['growth']:+.1f} % |")
    print()
    if problems:
        print("**FAILED:**")
        for problem in problems:
            print(f"- {problem}")
        sys.exit(1)
    print("All checks passed: every step once, every lease at most once, memory growth < 10 %.")


if __name__ == "__main__":
    main()
