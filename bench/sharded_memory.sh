#!/usr/bin/env bash
# Issue 54's memory table: the learner step at the Qwen2.5-0.5B shape
# (24 layers, V = 151,936, full training) as one process, as two
# data-parallel ranks each holding the whole AdamW state, as two ranks with
# learner.shard: optimizer, and as two with learner.shard: gradients — one
# configuration after the other, the
# ranks of one configuration at the same time (c10d Gloo over a loopback
# TCP store), each rank a kappa_bench_vocab_scale process with its own
# --rows. Prints, per rank: peak RSS, the RSS between steps (the fixed
# state: weights, gradient, moments), the median step (steps after the
# first) and the AdamW moments it should hold (8·N, or 8·⌈N / 2⌉).
# SHARDED_KAPPA=1 measures κ every step (∇L_R and ∇L_D apart: the step whose
# second gradient buffer learner.shard: gradients replaces by segments).
#
# Usage: bench/sharded_memory.sh [BUILD_DIR] [extra kappa_bench_vocab_scale flags]
#   SHARDED_ROWS (2), SHARDED_STEPS (3), SHARDED_LAYERS (24), SHARDED_THREADS (1 per rank),
#   SHARDED_KAPPA (0)
set -euo pipefail

build=${1:-build}
shift || true
bench="$build/bench/kappa_bench_vocab_scale"
[ -x "$bench" ] || { echo "sharded_memory.sh: no $bench (build first)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

common=(--teacher topk --chunk 256 --checkpointing 1 --kappa "${SHARDED_KAPPA:-0}" --kdr 0
        --rows "${SHARDED_ROWS:-2}" --group-size 2 --steps "${SHARDED_STEPS:-3}"
        --layers "${SHARDED_LAYERS:-24}" --threads "${SHARDED_THREADS:-1}" "$@")

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# run NAME RANKS SHARD: every rank of one configuration, their JSON in $work/NAME-r.json.
run() {
  local name=$1 ranks=$2 shard=$3 port pids=()
  port=$(free_port)
  echo "== $name: $ranks rank(s), shard $shard" >&2
  for ((r = 0; r < ranks; ++r)); do
    local flags=()
    if ((ranks > 1)); then
      flags=(--world-size "$ranks" --rank "$r" --dist-store "tcp://127.0.0.1:$port" --shard "$shard")
    fi
    "$bench" "${common[@]}" "${flags[@]}" > "$work/$name-$r.json" 2> "$work/$name-$r.err" &
    pids+=($!)
  done
  local failed=0
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  if ((failed)); then
    cat "$work/$name"-*.err >&2
    echo "sharded_memory.sh: FAILED at $name" >&2
    exit 1
  fi
}

run "R=1" 1 none
run "R=2" 2 none
run "R=2 shard optimizer" 2 optimizer
run "R=2 shard gradients" 2 gradients

/usr/bin/python3 - "$work" <<'EOF'
import glob, json, os, statistics, sys
work = sys.argv[1]
print("| configuration | rank | peak RSS MiB | between steps MiB | step s | AdamW moments MiB (8·N or 8·⌈N/R⌉) |")
print("|---|---|---|---|---|---|")
for name in ("R=1", "R=2", "R=2 shard optimizer", "R=2 shard gradients"):
    for path in sorted(glob.glob(os.path.join(work, name + "-*.json"))):
        d = json.load(open(path))
        n = d["trainable_parameters"]
        owned = -(-n // d["world_size"]) if d["shard"] != "none" else n
        rest = max(p["rest"] for p in d["phase_peak_rss_mib"])  # 0: too short to sample
        step = statistics.median(d["step_s"][1:] or d["step_s"])
        print(f"| {name} | {d['rank']} | {d['peak_rss_mib']:,.0f} | {rest:,.0f} | {step:.1f} | {8 * owned / 2**20:,.0f} |")
EOF
