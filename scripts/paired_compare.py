#!/usr/bin/env python3
"""Paired-by-seed t-tests of one arm against several others, Holm-adjusted
over those comparisons: the tests a pre-registered rule names that are not
against the experiment's baseline (e.g. "M3 beats both the fixed-λ baseline
and the annealed λ"). Reads the results.csv `kappa experiment` writes.

    /usr/bin/python3 scripts/paired_compare.py [--effect D] EXP/results.csv METRIC ARM OTHER [...]

--effect D adds each comparison's power to find a true mean difference D at
Holm's strictest level (alpha / comparisons), with the observed spread of
its differences: the share of 200,000 simulated paired samples (normal, seeded)
whose t-test rejects. The t distribution's tail is integrated numerically
from its density (no scipy), independent of kappa's C++ statistics.
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


def t_quantile(p_two_sided, df):
    """The t with P(|T| >= t) = p_two_sided, by bisection on t_two_sided_p."""
    lo, hi = 0.0, 1000.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if t_two_sided_p(mid, df) > p_two_sided:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def power(n, effect, sd, alpha, trials=200000):
    import numpy as np
    if n < 2 or not sd > 0:
        return float("nan")
    rng = np.random.default_rng(12345)
    samples = rng.normal(effect, sd, size=(trials, n))
    t = samples.mean(axis=1) / (samples.std(axis=1, ddof=1) / math.sqrt(n))
    return float((np.abs(t) >= t_quantile(alpha, n - 1)).mean())


def holm(ps):
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    adjusted, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, ps[i] * (len(ps) - rank)))
        adjusted[i] = running
    return adjusted


def main(path, metric, arm, others, effect=None):
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
            t, p, sd = float("nan"), float("nan"), float("nan")
        rows.append((other, n, mean, t, p, diffs, sd))
    adjusted = holm([r[4] for r in rows])
    print(f"{metric}: {arm} minus each, paired by seed; Holm over {len(rows)} comparisons")
    for (other, n, mean, t, p, diffs, sd), p_holm in zip(rows, adjusted):
        powered = ""
        if effect is not None:
            powered = f"; power for {effect:+g}: {power(n, effect, sd, 0.05 / len(rows)):.2f}"
        print(f"  vs {other}: n {n}, diffs {', '.join(f'{d:+.3f}' for d in diffs)}; mean "
              f"{mean:+.4f}, t {t:.3f}, p {p:.4f}, p Holm {p_holm:.4f}"
              f"{' (significant)' if p_holm < 0.05 and n >= 3 else ''}{powered}")


if __name__ == "__main__":
    args = sys.argv[1:]
    effect = None
    if args[:1] == ["--effect"] and len(args) > 1:
        effect, args = float(args[1]), args[2:]
    if len(args) < 4:
        sys.exit(__doc__)
    main(args[0], args[1], args[2], args[3:], effect)
