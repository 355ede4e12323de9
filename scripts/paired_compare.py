#!/usr/bin/env python3
"""Paired-by-seed t-tests of one arm against several others, Holm-adjusted
over those comparisons: the tests a pre-registered rule names that are not
against the experiment's baseline (e.g. "M3 beats both the fixed-λ baseline
and the annealed λ"). Reads the results.csv `kappa experiment` writes.

    /usr/bin/python3 scripts/paired_compare.py EXP/results.csv METRIC ARM OTHER [OTHER ...]

The t distribution's tail is integrated numerically from its density (no
scipy), independent of kappa's C++ statistics.
"""
import csv
import math
import sys


def t_two_sided_p(t, df):
    if math.isinf(t):
        return 0.0
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    density = lambda x: math.exp(log_c - (df + 1) / 2 * math.log1p(x * x / df))
    steps = 20000  # Simpson's rule on [0, |t|]
    h = abs(t) / steps
    area = density(0) + density(abs(t))
    for i in range(1, steps):
        area += (4 if i % 2 else 2) * density(i * h)
    return max(0.0, 1.0 - 2.0 * area * h / 3.0)


def holm(ps):
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    adjusted, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, ps[i] * (len(ps) - rank)))
        adjusted[i] = running
    return adjusted


def main(path, metric, arm, others):
    by_arm = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            if row["status"] == "ok" and row.get(metric) not in ("", None):
                by_arm.setdefault(row["arm"], {})[row["seed"]] = float(row[metric])
    rows = []
    for other in others:
        seeds = sorted(set(by_arm.get(arm, {})) & set(by_arm.get(other, {})))
        diffs = [by_arm[arm][s] - by_arm[other][s] for s in seeds]
        n = len(diffs)
        mean = sum(diffs) / n if n else float("nan")
        if n >= 2:
            sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
            t = mean / (sd / math.sqrt(n)) if sd > 0 else math.copysign(math.inf, mean)
            p = t_two_sided_p(t, n - 1) if mean != 0 else 1.0
        else:
            t, p = float("nan"), float("nan")
        rows.append((other, n, mean, t, p, diffs))
    adjusted = holm([r[4] for r in rows])
    print(f"{metric}: {arm} minus each, paired by seed; Holm over {len(rows)} comparisons")
    for (other, n, mean, t, p, diffs), p_holm in zip(rows, adjusted):
        print(f"  vs {other}: n {n}, diffs {', '.join(f'{d:+.3f}' for d in diffs)}; mean "
              f"{mean:+.4f}, t {t:.3f}, p {p:.4f}, p Holm {p_holm:.4f}"
              f"{' (significant)' if p_holm < 0.05 and n >= 3 else ''}")


if __name__ == "__main__":
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
