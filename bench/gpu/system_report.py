#!/usr/bin/env python3
"""bench/gpu/run.sh's whole-system stage: scrape a `kappa run` while it runs, then summarise it.

  system_report.py scrape RUN_DIR OUT_DIR [--interval 2]
      polls every process's Prometheus /metrics (RUN_DIR/prometheus.yml, written by `kappa run`)
      until killed; appends one JSON line per scrape to OUT_DIR/<process>.jsonl:
      {"t": unix seconds, "samples": {"name{labels}": value}} (kappa_* samples only).
  system_report.py report RUN_DIR SCRAPE_DIR --student DIR --prompt-tokens N --peak-tflops F
      prints the summary (system_run.txt):
        * samples/s: the learner's metrics.jsonl samples_per_second (samples over the time
          between steps), median over the steps after the first, and overall;
        * rollout engine tokens/s: Σ over workers of the rate of
          kappa_worker_engine_busy_slot_steps_total (one token per busy slot per engine step)
          between a worker's first and last scrape with engine steps; plus the sent-token rate
          (kappa_worker_tokens_total) and slot occupancy;
        * learner MFU: computed HERE (the learner reports none): model FLOPs of the plain step,
          6 · N · T (N the student's parameters without the embedding; T = samples · prompt
          tokens + response tokens, every position of the forward) + 6 · V · d · response tokens
          (the chunked head runs on response positions only) + causal attention
          6 · n_layers · d · Σ S², over step_seconds (the learner's step: batch, forward,
          backward, optimizer, policy snapshot), against F TFLOP/s;
        * weight sync: the workers' "policy version N loaded ... (X ms)" log lines (first chunk
          received to the version in use), and the learner's policy traffic counters.
Only the standard library.
"""
import argparse
import glob
import json
import os
import re
import statistics
import sys
import time
import urllib.request


def targets(run_dir):
    """[(process, host:port)] from prometheus.yml."""
    out, pending = [], None
    with open(os.path.join(run_dir, "prometheus.yml")) as f:
        for line in f:
            m = re.search(r'targets: \["([^"]+)"\]', line)
            if m:
                pending = m.group(1)
            m = re.search(r'process: "([^"]+)"', line)
            if m and pending:
                out.append((m.group(1), pending))
                pending = None
    return out


def parse(text):
    samples = {}
    for line in text.splitlines():
        if line.startswith("kappa_"):
            name, _, value = line.rpartition(" ")
            try:
                samples[name] = float(value)
            except ValueError:
                pass
    return samples


def scrape(a):
    os.makedirs(a.out_dir, exist_ok=True)
    found = []
    while True:
        if not found and os.path.exists(os.path.join(a.run_dir, "prometheus.yml")):
            found = targets(a.run_dir)
        for process, address in found:
            try:
                with urllib.request.urlopen(f"http://{address}/metrics", timeout=1) as r:
                    samples = parse(r.read().decode())
            except Exception:  # not up yet, or gone
                continue
            with open(os.path.join(a.out_dir, process + ".jsonl"), "a") as f:
                f.write(json.dumps({"t": time.time(), "samples": samples}) + "\n")
        time.sleep(a.interval)


def series(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def value(snapshot, prefix):
    """Sum of the samples whose name{labels} starts with prefix."""
    return sum(v for k, v in snapshot["samples"].items() if k == prefix or k.startswith(prefix + "{"))


def rate(points, name):
    """(Δvalue, Δt) between the first and last scrape where the counter moved."""
    moving = [p for p in points if value(p, name) > 0]
    if len(moving) < 2:
        return 0.0, 0.0
    return value(moving[-1], name) - value(moving[0], name), moving[-1]["t"] - moving[0]["t"]


def fmt(x, digits=3):
    return "n/a" if x is None else f"{x:.{digits}g}" if abs(x) < 1000 else f"{x:,.0f}"


def report(a):
    lines = []
    say = lines.append
    records = []
    with open(os.path.join(a.run_dir, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("step", 0) > 0 and "samples" in r:
                records.append(r)
    cfg = json.load(open(os.path.join(a.student, "config.json")))
    d, layers, vocab, ffn = (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"],
                             cfg["intermediate_size"])
    hd = d // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * hd
    body = layers * (d * d * 2 + 2 * d * kv + 3 * d * ffn + 2 * d + d + 2 * kv) + d  # + biases, norms
    say(f"run: {a.run_dir}")
    say(f"student: d={d} layers={layers} ffn={ffn} vocab={vocab}: {body / 1e6:.1f} M parameters "
        f"outside the embedding, {(body + vocab * d) / 1e6:.1f} M in all (tied)")
    say(f"steps trained: {len(records)}")
    if not records:
        say("no training step in metrics.jsonl: see logs/learner.log")
        print("\n".join(lines))
        return 1
    later = records[1:] or records
    sps = [r["samples_per_second"] for r in later if r.get("samples_per_second")]
    total_samples = sum(r["samples"] for r in records)
    span = records[-1]["elapsed_seconds"] - records[0]["elapsed_seconds"] + records[0].get("step_seconds", 0)
    say(f"samples/s (learner, steps 2..{records[-1]['step']}): median {fmt(statistics.median(sps) if sps else None)}; "
        f"{total_samples} samples over {span:.1f} s of training = {fmt(total_samples / span if span else None)}")
    tokens = [r["tokens"] for r in records]
    say(f"response tokens trained on: {sum(tokens)} ({fmt(statistics.mean(tokens))} per step, "
        f"{fmt(sum(tokens) / total_samples)} per sample); truncated fraction "
        f"{fmt(statistics.mean(r.get('truncated_fraction', 0) for r in records))}")
    say(f"response tokens/s through the system: {fmt(sum(tokens) / span if span else None)}")

    # Rollout engine, from the workers' scrapes.
    busy = sent = steps_total = 0.0
    busy_window = 0.0
    occupancy = []
    workers = sorted(glob.glob(os.path.join(a.scrape_dir, "rollout-*.jsonl")))
    for path in workers:
        points = series(path)
        db, dt = rate(points, "kappa_worker_engine_busy_slot_steps_total")
        ds, dts = rate(points, "kappa_worker_engine_steps_total")
        dtok, dtt = rate(points, "kappa_worker_tokens_total")
        slots = value(points[-1], "kappa_worker_engine_slots") if points else 0
        if dt > 0:
            busy += db / dt
            busy_window = max(busy_window, dt)
        if dtt > 0:
            sent += dtok / dtt
        if ds > 0 and slots > 0:
            occupancy.append(db / (ds * slots))
        steps_total += value(points[-1], "kappa_worker_engine_steps_total") if points else 0
    say(f"rollout engine tokens/s (Σ over {len(workers)} workers, engine busy-slot steps over each "
        f"worker's scraped window, up to {busy_window:.0f} s): {fmt(busy)}; tokens sent to the learner/s: "
        f"{fmt(sent)}; slot occupancy: {', '.join(f'{o:.2f}' for o in occupancy) or 'n/a'}")

    # MFU, computed here.
    flops, secs = [], []
    for r in later:
        samples, resp = r["samples"], r["tokens"]
        seq_tokens = samples * a.prompt_tokens + resp
        mean_len = seq_tokens / samples
        f = 6 * body * seq_tokens + 6 * vocab * d * resp + 6 * layers * d * samples * mean_len ** 2
        flops.append(f)
        secs.append(r["step_seconds"])
    mfu = [f / s / (a.peak_tflops * 1e12) for f, s in zip(flops, secs) if s > 0]
    say(f"learner step seconds: median {fmt(statistics.median(secs))}, max {fmt(max(secs))}; model "
        f"TFLOP per step {fmt(statistics.mean(flops) / 1e12)} (prompt {a.prompt_tokens} tokens)")
    say(f"learner MFU (computed by bench/gpu/system_report.py, not reported by the learner; plain-step "
        f"model FLOPs over step_seconds against {a.peak_tflops:g} TFLOP/s): median "
        f"{fmt(100 * statistics.median(mfu) if mfu else None)} %, best {fmt(100 * max(mfu) if mfu else None)} %")

    # Weight sync.
    loads = []
    pattern = re.compile(r"policy version (\d+) loaded on (\S+) \((\d+) parameters, (\d+) (\S+) bytes( as a delta)?, ([\d.]+) ms\)")
    for log in sorted(glob.glob(os.path.join(a.run_dir, "logs", "rollout-*.log"))):
        with open(log, errors="replace") as f:
            for line in f:
                m = pattern.search(line)
                if m:
                    loads.append((int(m.group(1)), m.group(2), int(m.group(4)), m.group(5),
                                  bool(m.group(6)), float(m.group(7)) / 1e3))
    later_loads = [l for l in loads if l[0] > 0]
    if loads:
        s = [l[5] for l in later_loads or loads]
        say(f"weight sync (workers' logs: first chunk to version in use, {len(loads)} loads, versions "
            f"after 0: {len(later_loads)}): median {fmt(statistics.median(s))} s, max {fmt(max(s))} s; "
            f"{loads[-1][2]} bytes per version as {loads[-1][3]} on {loads[-1][1]}; "
            f"deltas {sum(l[4] for l in loads)}")
    else:
        say("weight sync: no 'policy version N loaded' line in logs/rollout-*.log")
    learner = os.path.join(a.scrape_dir, "learner.jsonl")
    if os.path.exists(learner):
        last = series(learner)[-1]["samples"]
        keep = {k: v for k, v in last.items() if "policy" in k or "publish" in k or "sync" in k}
        say("learner policy counters (last scrape): " +
            (", ".join(f"{k}={fmt(v)}" for k, v in sorted(keep.items())) or "none"))
    mism = [r.get("mismatch_abs_mean") for r in records if r.get("mismatch_abs_mean") is not None]
    if mism:
        say(f"training-inference mismatch |Δlog π| on on-policy tokens: median {fmt(statistics.median(mism))}")
    print("\n".join(lines))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("scrape")
    s.add_argument("run_dir")
    s.add_argument("out_dir")
    s.add_argument("--interval", type=float, default=2.0)
    r = sub.add_parser("report")
    r.add_argument("run_dir")
    r.add_argument("scrape_dir")
    r.add_argument("--student", required=True)
    r.add_argument("--prompt-tokens", type=float, required=True)
    r.add_argument("--peak-tflops", type=float, default=790.0)
    a = ap.parse_args()
    return scrape(a) if a.cmd == "scrape" else report(a)


if __name__ == "__main__":
    sys.exit(main())
