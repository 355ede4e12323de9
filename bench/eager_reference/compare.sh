#!/bin/bash
# kappa's learner step against the same step in plain eager PyTorch.
#
# Alternates, for K rounds, kappa_bench_learner_step --modes plain,kappa and
# hybrid_step.py (the eager reference) with the same reps and thread count
# (the one going first swaps every round, so drift and other load hit both
# alike), keeps each run's per-mode median, and prints per model and mode the
# median over rounds for kappa and eager and eager/kappa (> 1: kappa faster),
# with the lowest and highest per-round ratio. Builds nothing.
#
# Usage: bench/eager_reference/compare.sh PATH/TO/kappa_bench_learner_step
#          [--rounds K] [--models demo,large] [--demo-reps N] [--large-reps N]
#          [--demo-threads T] [--large-threads T]
# Defaults: 3 rounds; demo 10 reps on 1 thread, large 2 reps on 2 threads
# (large's step takes seconds on the 2-core machine; each run also does two
# warm-up rounds). The eager side runs Debian's python3-torch (/usr/bin/python3).
set -euo pipefail

bench=${1:?usage: $0 PATH/TO/kappa_bench_learner_step [--rounds K] [--models demo,large] ...}
shift
[[ -x $bench ]] || { echo "not an executable: $bench" >&2; exit 2; }
rounds=3 models=demo,large
declare -A reps=([demo]=10 [large]=2 [gpt]=1) threads=([demo]=1 [large]=2 [gpt]=2)
while (($#)); do
  case $1 in
    --rounds) rounds=$2 ;;
    --models) models=$2 ;;
    --demo-reps) reps[demo]=$2 ;;
    --large-reps) reps[large]=$2 ;;
    --demo-threads) threads[demo]=$2 ;;
    --large-threads) threads[large]=$2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
  shift 2
done
here=$(cd "$(dirname "$0")" && pwd)
python=/usr/bin/python3
"$python" -c 'import torch' 2>/dev/null || { echo "$python has no torch (apt-get install python3-torch)" >&2; exit 2; }
log=$(mktemp /tmp/kappa_eager_compare.XXXXXX)
trap 'rm -f "$log"' EXIT

# "impl model round mode median_ms" lines from one run's table.
medians() {  # impl model round < output
  awk -v impl="$1" -v model="$2" -v round="$3" \
    '$1 == "plain" || $1 == "kappa" { if ($2 ~ /^[0-9.]+$/) print impl, model, round, $1, $2 }'
}

start=$(date +%s)
for model in ${models//,/ }; do
  n=${reps[$model]} t=${threads[$model]}
  for ((r = 1; r <= rounds; r++)); do
    order=(kappa eager)
    ((r % 2 == 0)) && order=(eager kappa)
    for impl in "${order[@]}"; do
      echo "[$(($(date +%s) - start)) s] $model round $r/$rounds: $impl ($n reps, $t threads)" >&2
      if [[ $impl == kappa ]]; then
        out=$("$bench" --model "$model" --modes plain,kappa --reps "$n" --threads "$t" \
              --exact-positions 0 2>/dev/null)
      else
        out=$("$python" "$here/hybrid_step.py" --model "$model" --modes plain,kappa --reps "$n" \
              --threads "$t" 2>/dev/null)
      fi
      grep -qE "threads=$t( |$)" <<<"$out" || { echo "$impl did not run on $t threads:" >&2; echo "$out" >&2; exit 1; }
      medians "$impl" "$model" "$r" <<<"$out" >>"$log"
    done
  done
done

echo
echo "kappa: $bench; eager: $($python -c 'import torch; print("PyTorch", torch.__version__)') ($python)"
echo "rounds=$rounds total $(($(date +%s) - start)) s; per model: reps, threads = $(for m in ${models//,/ }; do printf '%s %s,%s  ' "$m" "${reps[$m]}" "${threads[$m]}"; done)"
"$python" - "$log" <<'EOF'
import collections, statistics, sys
runs = collections.defaultdict(dict)  # (model, mode) -> {(impl, round): ms}
for line in open(sys.argv[1]):
    impl, model, rnd, mode, ms = line.split()
    runs[(model, mode)][(impl, int(rnd))] = float(ms)
print("| model | mode | kappa ms | eager ms | eager/kappa | per-round eager/kappa (min–max) |")
print("|---|---|---|---|---|---|")
for (model, mode), v in runs.items():
    rounds = sorted({r for _, r in v})
    k = [v[("kappa", r)] for r in rounds]
    e = [v[("eager", r)] for r in rounds]
    per = [b / a for a, b in zip(k, e)]
    km, em = statistics.median(k), statistics.median(e)
    fmt = (lambda x: f"{x:.0f}") if km > 1000 else (lambda x: f"{x:.1f}")
    print(f"| {model} | {mode} | {fmt(km)} | {fmt(em)} | {em / km:.2f} | "
          f"{min(per):.2f}–{max(per):.2f} |")
EOF
