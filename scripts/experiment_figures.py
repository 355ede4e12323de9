#!/usr/bin/env python3
"""Draws docs/results.md's figures from `kappa experiment` results.

usage: scripts/experiment_figures.py OUT_DIR EXPERIMENT_DIR...

Reads EXPERIMENT_DIR/results.csv (one row per run, written by `kappa
experiment`) and writes plain SVG files (no script, no external resources)
into OUT_DIR, chosen by the experiment directory's name:

  kappa_regimes*       kappa_regimes_accuracy.svg, kappa_regimes_ld_trend.svg:
                       final held-out accuracy and the L_D trend of every run
                       against its median κ_eff (log axis), one series per
                       balance (arms named naive_* and m3_norm_*).
  unreliable_teacher*  unreliable_teacher_subsets.svg: final accuracy on the
                       corrupted subset and on the rest, per arm (mean and
                       95 % CI over seeds), unreliable_teacher_kdr.svg:
                       the K_DR < 0 fraction by subset (median over steps),
                       and unreliable_teacher_kdr_tokens.svg: K_DR by subset
                       and answer token, pooled over every step of every run
                       of an arm (from runs/*/metrics.jsonl); the pooled
                       numbers are also printed as a Markdown table.
  anything else        <name>_accuracy.svg: final accuracy per arm.

Standard library only; runs with any python3.
"""
import csv
import json
import math
import os
import sys
from xml.sax.saxutils import escape

# Two-sided 95 % Student-t quantiles by degrees of freedom (published table).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"]
W, H, LEFT, RIGHT, TOP, BOTTOM = 760, 340, 64, 210, 40, 62


def number(text):
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def read_runs(directory):
    with open(os.path.join(directory, "results.csv"), newline="") as f:
        return [row for row in csv.DictReader(f) if row.get("status") == "ok"]


def arms_in_order(runs):
    seen = []
    for run in runs:
        if run["arm"] not in seen:
            seen.append(run["arm"])
    return seen


def mean_ci(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, T95.get(len(values) - 1, 1.96) * math.sqrt(var / len(values))


def nice_range(lo, hi):
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    pad = 0.05 * (hi - lo)
    return lo - pad, hi + pad


def svg_frame(title, x_label, y_label):
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
        f'viewBox="0 0 {W} {H}" font-family="DejaVu Sans, sans-serif" font-size="11">',
        f'<rect width="{W}" height="{H}" fill="white"/>',
        f'<text x="{LEFT}" y="20" font-size="13" font-weight="bold">{escape(title)}</text>',
        f'<text x="{LEFT + (W - LEFT - RIGHT) / 2}" y="{H - 6}" text-anchor="middle">'
        f"{escape(x_label)}</text>",
        f'<text transform="translate(14,{TOP + (H - TOP - BOTTOM) / 2}) rotate(-90)" '
        f'text-anchor="middle">{escape(y_label)}</text>',
    ]


def nice_ticks(lo, hi):
    step = 10.0 ** math.floor(math.log10((hi - lo) / 5))
    for factor in (1, 2, 5, 10):
        if (hi - lo) / (step * factor) <= 6:
            step *= factor
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def y_axis(parts, y_lo, y_hi, to_y):
    for value in nice_ticks(y_lo, y_hi):
        y = to_y(value)
        parts.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
                     'stroke="#ddd"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{value:.4g}</text>')


def legend(parts, names):
    for i, name in enumerate(names):
        y = TOP + 16 * i
        parts.append(f'<rect x="{W - RIGHT + 12}" y="{y}" width="10" height="10" '
                     f'fill="{COLORS[i % len(COLORS)]}"/>')
        parts.append(f'<text x="{W - RIGHT + 26}" y="{y + 9}">{escape(name)}</text>')


def scatter_log_x(title, x_label, y_label, series):
    """series: [(name, [(x, y)...])]; x > 0 on a log axis; per-x means joined."""
    points = [(x, y) for _, pts in series for x, y in pts if x and x > 0 and y is not None]
    if not points:
        return None
    x_lo, x_hi = nice_range(math.log10(min(p[0] for p in points)),
                            math.log10(max(p[0] for p in points)))
    y_lo, y_hi = nice_range(min(p[1] for p in points), max(p[1] for p in points))
    to_x = lambda x: LEFT + (math.log10(x) - x_lo) / (x_hi - x_lo) * (W - LEFT - RIGHT)
    to_y = lambda y: H - BOTTOM - (y - y_lo) / (y_hi - y_lo) * (H - TOP - BOTTOM)
    parts = svg_frame(title, x_label, y_label)
    y_axis(parts, y_lo, y_hi, to_y)
    for decade in range(math.ceil(x_lo), math.floor(x_hi) + 1):
        x = to_x(10.0 ** decade)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{H - BOTTOM}" '
                     'stroke="#ddd"/>')
        parts.append(f'<text x="{x:.1f}" y="{H - BOTTOM + 14}" text-anchor="middle">'
                     f"{10.0 ** decade:g}</text>")
    for i, (name, pts) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        pts = [(x, y) for x, y in pts if x and x > 0 and y is not None]
        for x, y in pts:
            parts.append(f'<circle cx="{to_x(x):.1f}" cy="{to_y(y):.1f}" r="3" '
                         f'fill="{color}" fill-opacity="0.55"/>')
        line = " ".join(f"{to_x(x):.1f},{to_y(y):.1f}" for x, y in sorted(pts))
        if line:
            parts.append(f'<polyline points="{line}" fill="none" stroke="{color}" '
                         'stroke-width="1.2" stroke-opacity="0.6"/>')
    legend(parts, [name for name, _ in series])
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def bars(title, y_label, groups, bar_names):
    """groups: [(group label, [(mean, ci) per bar name])]; CI whiskers."""
    values = [m + (c or 0) for _, bs in groups for m, c in bs if m is not None]
    lows = [m - (c or 0) for _, bs in groups for m, c in bs if m is not None]
    if not values:
        return None
    y_lo, y_hi = nice_range(min(0.0, min(lows)), max(values))
    to_y = lambda y: H - BOTTOM - (y - y_lo) / (y_hi - y_lo) * (H - TOP - BOTTOM)
    parts = svg_frame(title, "arm", y_label)
    y_axis(parts, y_lo, y_hi, to_y)
    slot = (W - LEFT - RIGHT) / len(groups)
    width = slot * 0.8 / len(bar_names)
    for g, (label, bs) in enumerate(groups):
        x0 = LEFT + g * slot + slot * 0.1
        lines = "".join(f'<tspan x="{LEFT + (g + 0.5) * slot:.1f}" dy="{0 if i == 0 else 12}">'
                        f"{escape(part)}</tspan>" for i, part in enumerate(label.split(":")))
        parts.append(f'<text y="{H - BOTTOM + 14}" text-anchor="middle">{lines}</text>')
        for b, (mean, ci) in enumerate(bs):
            if mean is None:
                continue
            x = x0 + b * width
            top, base = to_y(max(mean, 0.0)), to_y(min(mean, 0.0))
            parts.append(f'<rect x="{x:.1f}" y="{top:.1f}" width="{width * 0.9:.1f}" '
                         f'height="{max(base - top, 0.5):.1f}" fill="{COLORS[b % len(COLORS)]}">'
                         f"<title>{escape(label)} {escape(bar_names[b])}: {mean:.3f}"
                         f"{'' if ci is None else f' ± {ci:.3f}'}</title></rect>")
            if ci is not None:
                cx = x + width * 0.45
                parts.append(f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{to_y(mean - ci):.1f}" '
                             f'y2="{to_y(mean + ci):.1f}" stroke="black"/>')
    legend(parts, bar_names)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def kappa_regime_figures(name, runs):
    families = {"naive": [], "m3_norm": []}
    for run in runs:
        family = "m3_norm" if run["arm"].startswith("m3_norm") else "naive"
        families[family].append(run)
    out = {}
    for column, y_label, suffix in [("final_eval_accuracy", "final held-out accuracy", "accuracy"),
                                    ("loss_distill_trend", "L_D trend (last − first quarter)",
                                     "ld_trend")]:
        series = [(family, [(number(r["kappa_effective_median"]), number(r[column]))
                            for r in rows]) for family, rows in families.items()]
        out[f"{name}_{suffix}.svg"] = scatter_log_x(
            f"{y_label} against median κ_eff", "median κ_eff (log)", y_label, series)
    return out


def subset_figures(name, runs):
    arms = arms_in_order(runs)
    out = {}
    for prefix, y_label, suffix in [("final_accuracy_", "final held-out accuracy", "subsets"),
                                    ("kdr_negative_fraction_median_", "median K_DR < 0 fraction",
                                     "kdr")]:
        subsets = sorted({k[len(prefix):] for r in runs for k in r
                          if k.startswith(prefix) and number(r[k]) is not None})
        groups = [(arm, [mean_ci([number(r.get(prefix + s)) for r in runs if r["arm"] == arm])
                         for s in subsets]) for arm in arms]
        out[f"{name}_{suffix}.svg"] = bars(f"{y_label} by subset (mean, 95 % CI)", y_label,
                                           groups, subsets)
    return out


def pooled_kdr(directory, runs):
    """{arm: {subset: (pooled K_DR<0 fraction, [mean K_DR per answer token])}}.

    Over every step of every run of the arm: the negative fraction weighted
    by the step's positions in the subset, and per answer token the mean of
    the steps' token means (steps where the subset had the token)."""
    out = {}
    for run in runs:
        path = os.path.join(directory, "runs", run["name"], "metrics.jsonl")
        if not os.path.exists(path):
            continue
        arm = out.setdefault(run["arm"], {})
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                positions = record.get("kdr_positions_by_subset") or {}
                fractions = record.get("kdr_negative_fraction_by_subset") or {}
                tokens = record.get("kdr_token_mean_by_subset") or {}
                for subset, count in positions.items():
                    sums = arm.setdefault(subset, {"neg": 0.0, "n": 0, "tok": {}})
                    if fractions.get(subset) is not None and count:
                        sums["neg"] += fractions[subset] * count
                        sums["n"] += count
                    for t, value in enumerate(tokens.get(subset) or []):
                        if value is not None:
                            sums["tok"].setdefault(t, []).append(value)
    return {arm: {subset: (sums["neg"] / sums["n"] if sums["n"] else None,
                           [sum(v) / len(v) for _, v in sorted(sums["tok"].items())])
                  for subset, sums in subsets.items()} for arm, subsets in out.items()}


def kdr_token_figure(name, directory, runs):
    pooled = pooled_kdr(directory, runs)
    print(f"\n{directory}: K_DR pooled over every step of every run\n")
    print("| arm | subset | positions' K_DR<0 fraction | mean K_DR at answer token 0 / 1 / 2 |")
    print("|---|---|---|---|")
    groups = []
    for arm, subsets in pooled.items():
        for subset, (negative, tokens) in sorted(subsets.items()):
            text = " / ".join(f"{v:.3g}" for v in tokens[:3])
            print(f"| {arm} | {subset} | {'–' if negative is None else f'{negative:.3f}'} | {text} |")
            short = "rest" if subset == "rest" else "covered"
            groups.append((f"{arm}:{short}", [(v, None) for v in tokens[:3]]
                           + [(None, None)] * (3 - len(tokens[:3]))))
    return {f"{name}_kdr_tokens.svg": bars("mean K_DR by answer token (covered: the rule's subset), pooled over steps",
                                           "mean K_DR", groups,
                                           ["token 0", "token 1", "token 2"])}


def accuracy_figure(name, runs):
    groups = [(arm, [mean_ci([number(r["final_eval_accuracy"]) for r in runs
                              if r["arm"] == arm])]) for arm in arms_in_order(runs)]
    return {f"{name}_accuracy.svg": bars("final held-out accuracy (mean, 95 % CI)",
                                         "final held-out accuracy", groups, ["accuracy"])}


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    out_dir = argv[1]
    os.makedirs(out_dir, exist_ok=True)
    for directory in argv[2:]:
        name = os.path.basename(os.path.normpath(directory))
        runs = read_runs(directory)
        if name.startswith("kappa_regimes"):
            figures = kappa_regime_figures("kappa_regimes", runs)
        elif name.startswith("unreliable_teacher"):
            figures = subset_figures("unreliable_teacher", runs)
            figures.update(kdr_token_figure("unreliable_teacher", directory, runs))
        else:
            figures = accuracy_figure(name, runs)
        for file, svg in figures.items():
            if svg is None:
                print(f"{directory}: no data for {file}", file=sys.stderr)
                continue
            with open(os.path.join(out_dir, file), "w") as f:
                f.write(svg)
            print(os.path.join(out_dir, file))


if __name__ == "__main__":
    main(sys.argv)
