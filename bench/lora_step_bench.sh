#!/usr/bin/env bash
# LoRA against full training in the learner step at the Qwen2.5-0.5B
# vocabulary (bench/README.md, "LoRA r = 16 against full training"): runs
# kappa_bench_vocab_scale twice, one process each (peak RSS is per process),
# full training (--lora-rank 0) then LoRA adapters only (--lora-rank R,
# alpha 2R, all seven projections), on the same batch: 4 layers, 4 × 512
# tokens, top-64 teacher rows, chunked vocabulary head (512 positions), no
# activation checkpointing, two steps. Prints both JSON lines' numbers and
# the ratios LoRA / full of peak RSS and of the second step's time (the
# first includes the allocator's warm-up), and checks that the first step's
# losses agree (fresh adapters have B = 0: the same forward).
#
# Each process runs under an address-space cap (ulimit -v, default 20 GiB),
# as bench/vocab_scale_bench.sh does.
#
# Usage: bash bench/lora_step_bench.sh [BUILD_DIR] [extra bench flags]
# Env:   KAPPA_BENCH_MEM_GIB (the cap), KAPPA_LORA_RANK (default 16),
#        KAPPA_BENCH_OUT (the JSON lines, default /tmp/lora_step_bench.jsonl).
# Run it with nothing else compiling: flock /tmp/kappa-build.lock bash bench/lora_step_bench.sh
set -u
build=${1:-build}
if [[ $# -gt 0 ]]; then shift; fi
bin=$build/bench/kappa_bench_vocab_scale
if [[ ! -x $bin ]]; then
  echo "no $bin: cmake --build $build --target kappa_bench_vocab_scale" >&2
  exit 2
fi
cap_gib=${KAPPA_BENCH_MEM_GIB:-20}
rank=${KAPPA_LORA_RANK:-16}
out=${KAPPA_BENCH_OUT:-/tmp/lora_step_bench.jsonl}
: >"$out"
common=(--teacher topk --chunk 512 --checkpointing 0 --layers 4 --rows 4 --steps 2)

echo "kappa_bench_vocab_scale ${common[*]} $* (cap ${cap_gib} GiB; JSON lines: $out)"
for lora in 0 "$rank"; do
  echo "== --lora-rank $lora" >&2
  start=$(date +%s)
  (
    ulimit -v $((cap_gib * 1024 * 1024))
    exec "$build/bench/kappa_bench_vocab_scale" "${common[@]}" "$@" --lora-rank "$lora"
  ) >>"$out"
  echo "   exit $?, $(($(date +%s) - start)) s" >&2
done

python3 - "$out" <<'EOF'
import json, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
if len(rows) != 2 or any(r.get("oom") for r in rows):
    sys.exit(f"expected two completed runs, got: {rows}")
full, lora = rows
print()
print("| training | parameters | trainable | peak RSS MiB | step 1 s | step 2 s | CPU s (step 2) |")
print("|---|---|---|---|---|---|---|")
for name, r in (("full", full), (f"LoRA r = {lora['lora_rank']}", lora)):
    print(f"| {name} | {r['parameters']:,} | {r['trainable_parameters']:,} | "
          f"{r['peak_rss_mib']:,.0f} | {r['step_s'][0]:.1f} | {r['last_step_s']:.1f} | "
          f"{r['cpu_s'][-1]:.1f} |")
print()
print(f"LoRA/full peak_rss_ratio={lora['peak_rss_mib'] / full['peak_rss_mib']:.3f} "
      f"step_s_ratio={lora['last_step_s'] / full['last_step_s']:.3f} "
      f"trainable_ratio={lora['trainable_parameters'] / full['trainable_parameters']:.5f}")
for key in ("reward_loss", "distill_loss", "entropy"):
    diff = abs(lora[key] - full[key]) / max(abs(full[key]), 1e-30)
    print(f"first step {key}: full {full[key]:.9g}, LoRA {lora[key]:.9g} (relative difference {diff:.1e})")
print(f"first step grad_norm: full {full['grad_norm']:.6g}, LoRA {lora['grad_norm']:.6g} "
      "(LoRA: the adapters' gradients only)")
EOF
