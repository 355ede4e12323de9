#!/usr/bin/env bash
# kappa's learner step against the eager PyTorch step at the Qwen2.5-0.5B
# vocabulary, like for like (bench/README.md, "Like for like against eager
# PyTorch"): for each batch size (KAPPA_COMPARE_ROWS sequences of 64 + 448
# tokens) it runs, one process after the other, the plain step (one
# backward pass: --kappa 0 --kdr 0) with checkpointing off on both sides:
#   kappa topk      kappa_bench_vocab_scale --teacher topk --chunk C (top-64 + tail
#                   rows, the fused chunked head)      vs  eager vocab_step.py --teacher topk
#   kappa hidden    --teacher hidden (the teacher's hidden states and head:
#                   the exact reverse KL)              vs  eager vocab_step.py --teacher full
# then kappa's own rows with activation checkpointing (ckpt). With
# KAPPA_COMPARE_MONITORED=1 (the default) also the step that measures κ
# (both gradients apart) on both sides, kappa with its cheap K_DR, once with
# the fused head (which the learner runs on such steps) and once with the
# head that recomputes each chunk in backward (--fused 0, recompute):
#   kappa ... --kappa 1 --kdr 1 [--fused 0]   eager vocab_step.py --teacher topk --kappa 1
# (The plain steps run the fused head too, which precombines the two losses
# into one stored gradient; learner/algo/hybrid_step.h Fuses.)
# A last table gives where each kappa step's time goes (median seconds of
# the decoder layers' forward, the head's forward, the L_R and L_D backward
# passes — the second is what κ costs — and the update), and another where
# its memory peaks (the highest VmRSS the bench sampled in each phase of the
# last step).
# Every process runs under an address-space cap (ulimit -v, default 20 GiB, as
# bench/vocab_scale_bench.sh): running out is a failed allocation the process
# reports ({"oom": true}), shown as "> cap"; a memory ratio against it is then
# a bound. Prints a table of peak RSS (getrusage ru_maxrss), seconds and CPU
# seconds per step (the median of the steps after the first, which warms the
# allocator up) and the ratios kappa/eager, and the first step's losses (both
# sides draw the same weights and rows, so they must agree to rounding).
#
# With --device cuda among the flags (bench/gpu/run.sh) the memory compared is
# the GPU's: nvidia-smi's memory.used sampled every 50 ms while the process
# runs, its peak less the reading before it started (CUDA context and the
# caching allocator's pool included, the same for both sides); set
# KAPPA_BENCH_MEM_GIB=0 there (no address-space cap: CUDA reserves more
# address space than any cap allows). Exits 1 when a run fails other than by
# running out of memory (a crash, a bad flag), after printing the tables.
#
# Usage: bash bench/eager_reference/vocab_compare.sh [BUILD_DIR] [flags for both, e.g. --layers 4]
# Env:   KAPPA_BENCH_MEM_GIB (cap, 20; 0: none), KAPPA_COMPARE_ROWS ("4 8"),
#        KAPPA_COMPARE_CHUNK (512), KAPPA_COMPARE_STEPS (2), KAPPA_COMPARE_THREADS (2),
#        KAPPA_COMPARE_MONITORED (1), KAPPA_COMPARE_CKPT (1: the checkpointing rows),
#        KAPPA_COMPARE_OUT (/tmp/vocab_compare.jsonl),
#        KAPPA_COMPARE_PYTHON (/usr/bin/python3: Debian's torch 1.13, the libtorch
#        and OpenBLAS the bench links; the GPU machine: its python3)
# Run it on a quiet machine: flock /tmp/kappa-build.lock bash bench/eager_reference/vocab_compare.sh build --layers 4
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
if [[ $# -gt 0 ]]; then shift; fi
bin=$build/bench/kappa_bench_vocab_scale
if [[ ! -x $bin ]]; then
  echo "no $bin: cmake --build $build --target kappa_bench_vocab_scale" >&2
  exit 2
fi
python=${KAPPA_COMPARE_PYTHON:-/usr/bin/python3}
cap_gib=${KAPPA_BENCH_MEM_GIB:-20}
rows_list=${KAPPA_COMPARE_ROWS:-"4 8"}
chunk=${KAPPA_COMPARE_CHUNK:-512}
steps=${KAPPA_COMPARE_STEPS:-2}
threads=${KAPPA_COMPARE_THREADS:-2}
monitored=${KAPPA_COMPARE_MONITORED:-1}
ckpt=${KAPPA_COMPARE_CKPT:-1}
out=${KAPPA_COMPARE_OUT:-/tmp/vocab_compare.jsonl}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
: >"$out"
on_gpu=0
[[ " $* " == *" --device cuda "* ]] && command -v nvidia-smi >/dev/null && on_gpu=1
failures=0

gpu_memory_used_mib() {
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -n 1
}

# run LABEL CMD...: one process under the cap; appends its JSON line, with the
# label, /usr/bin/time's peak RSS and the exit status, to $out.
run() {
  local label=$1
  shift
  echo "== $label: $*" >&2
  local start=$SECONDS sampler="" gpu_before=""
  if ((on_gpu)); then
    gpu_before=$(gpu_memory_used_mib)
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 50 >"$work/gpu" &
    sampler=$!
  fi
  (
    if ((cap_gib > 0)); then ulimit -v $((cap_gib * 1024 * 1024)); fi
    if [[ -x /usr/bin/time ]]; then exec /usr/bin/time -v -o "$work/time" "$@"; fi
    exec "$@"  # a bare machine without GNU time: the JSON line's own peak RSS
  ) >"$work/json" 2>"$work/err"
  local rc=$?
  local gpu_peak=null
  if [[ -n $sampler ]]; then
    kill "$sampler" 2>/dev/null
    wait "$sampler" 2>/dev/null
    gpu_peak=$(sort -n "$work/gpu" | tail -n 1)
    gpu_peak=$((${gpu_peak:-0} - gpu_before))
  fi
  grep -v '^$' "$work/err" | tail -n 3 >&2
  local time_rss line
  time_rss=$(awk -F': ' '/Maximum resident set size/ { print $2 }' "$work/time" 2>/dev/null)
  line=$(grep '^{' "$work/json" | tail -n 1)
  if [[ -z $line ]]; then  # killed or failed without a JSON line
    local oom=false
    if [[ $rc -eq 137 ]] || grep -q 'signal 9' "$work/time" 2>/dev/null; then oom=true; fi
    echo "   no result (exit $rc): $(tail -n 1 "$work/err")" >&2
    line="{\"oom\": $oom, \"error\": $([[ $oom == true ]] && echo false || echo true)}"
  fi
  if [[ $rc -ne 0 && $rc -ne 3 && $line != *'"oom": true'* ]]; then failures=$((failures + 1)); fi
  echo "{\"label\": \"$label\", \"cap_gib\": $cap_gib, \"time_v_max_rss_kib\": ${time_rss:-null}, \"gpu_peak_mib\": $gpu_peak, \"wall_s\": $((SECONDS - start)), \"exit\": $rc, ${line#\{}" >>"$out"
  echo "   exit $rc, $((SECONDS - start)) s" >&2
}

common=(--steps "$steps" --threads "$threads")
echo "kappa against eager at V = 151,936: rows {$rows_list}, $* (cap ${cap_gib} GiB per process; JSON lines: $out)"
for rows in $rows_list; do
  shape=(--rows "$rows" "${common[@]}" "$@")
  plain=(--chunk "$chunk" --kappa 0 --kdr 0)
  run "kappa topk rows=$rows" "$bin" --teacher topk "${plain[@]}" --checkpointing 0 "${shape[@]}"
  run "eager topk rows=$rows" "$python" "$here/vocab_step.py" --teacher topk "${shape[@]}"
  run "kappa hidden rows=$rows" "$bin" --teacher hidden "${plain[@]}" --checkpointing 0 "${shape[@]}"
  run "eager full rows=$rows" "$python" "$here/vocab_step.py" --teacher full "${shape[@]}"
  if [[ $ckpt == 1 ]]; then
    run "kappa topk ckpt rows=$rows" "$bin" --teacher topk "${plain[@]}" --checkpointing 1 "${shape[@]}"
    run "kappa hidden ckpt rows=$rows" "$bin" --teacher hidden "${plain[@]}" --checkpointing 1 "${shape[@]}"
  fi
  if [[ $monitored == 1 ]]; then
    run "kappa topk monitored rows=$rows" "$bin" --teacher topk --chunk "$chunk" --checkpointing 0 --kappa 1 --kdr 1 "${shape[@]}"
    run "kappa topk monitored recompute rows=$rows" "$bin" --teacher topk --chunk "$chunk" --checkpointing 0 --kappa 1 --kdr 1 --fused 0 "${shape[@]}"
    run "eager topk monitored rows=$rows" "$python" "$here/vocab_step.py" --teacher topk --kappa 1 "${shape[@]}"
  fi
done

"$python" - "$out" <<'EOF'
import json, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
# The memory compared: the GPU's peak where it was sampled, else peak RSS.
on_gpu = any(r.get("gpu_peak_mib") is not None for r in rows)
memory = (lambda r: r["gpu_peak_mib"]) if on_gpu else (lambda r: r["peak_rss_mib"])
memory_name = "GPU peak MiB" if on_gpu else "peak RSS MiB"
later = lambda v: sorted(v[1:] if len(v) > 1 else v)
median = lambda v: later(v)[len(later(v)) // 2] if v else None  # upper median, after the first step
for r in rows:
    r["ok"] = not r.get("oom") and not r.get("error")
    r["t"] = median(r.get("step_s") or []) if r["ok"] else None
    r["c"] = median(r.get("cpu_s") or []) if r["ok"] else None

def rss(r):
    if r["ok"]:
        return f"{memory(r):,.0f}"
    if r.get("oom"):
        cap = f"> {r['cap_gib']} GiB" if r["cap_gib"] else "> the device's memory"
        return cap + " (OOM" + (f" in step {r['oom_step']}" if r.get("oom_step") else "") + ")"
    return "failed"

print()
print(f"| run | {memory_name} | step s | CPU s | L_R | L_D | entropy | ‖g‖ |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    if r["ok"]:
        print(f"| {r['label']} | {rss(r)} | {r['t']:.1f} | {r['c']:.1f} | {r['reward_loss']:.7g} | "
              f"{r['distill_loss']:.7g} | {r['entropy']:.7g} | {r['grad_norm']:.7g} |")
    else:
        print(f"| {r['label']} | {rss(r)} | | | | | | |")

print()
print(f"kappa / eager (memory: {memory_name[:-4]}; time: step seconds, wall and CPU; speed = eager s / kappa s):")
print()
print("| kappa run | against | memory ×eager | wall ×eager | CPU ×eager | speed ×eager |")
print("|---|---|---|---|---|---|")
by = {r["label"]: r for r in rows}
for k in rows:
    if not k["label"].startswith("kappa "):
        continue
    rest = k["label"][len("kappa "):]
    monitored = " monitored" in rest
    size = rest.split()[-1]
    # Like for like: top-64 rows against top-64 rows, the exact hidden-state
    # form against eager's exact full rows.
    teacher = {"topk": "topk", "hidden": "full", "full": "full"}[rest.split()[0]]
    for teacher in [teacher]:
        e = by.get(f"eager {teacher}{' monitored' if monitored else ''} {size}")
        if e is None or not k["ok"]:
            continue
        if e["ok"]:
            mem = f"{memory(k) / memory(e):.2f}"
            wall, cpu = k["t"] / e["t"], k["c"] / e["c"]
            print(f"| {k['label']} | {e['label']} | {mem} | {wall:.2f} | {cpu:.2f} | {1 / wall:.2f} |")
        elif e.get("oom") and e["cap_gib"] > 0:
            mem = f"< {memory(k) / (e['cap_gib'] * 1024):.2f}"
            print(f"| {k['label']} | {e['label']} | {mem} (eager > cap) | | | |")
print()
print("Where kappa's step time goes (median seconds after the first step):")
print()
print("| kappa run | step | layers fwd | head fwd | L_R bwd | L_D bwd (κ) | update |")
print("|---|---|---|---|---|---|---|")
for k in rows:
    if not (k["label"].startswith("kappa ") and k["ok"] and k.get("phases")):
        continue
    phase = lambda name: median([p[name] for p in k["phases"]])
    print(f"| {k['label']} | {k['t']:.1f} | {phase('layers_fwd'):.1f} | {phase('head_fwd'):.1f} | "
          f"{phase('bwd_reward'):.1f} | {phase('bwd_distill'):.1f} | {phase('update'):.1f} |")
print()
print("Where kappa's peak memory is (highest VmRSS, MiB, in each phase of the last step):")
print()
print("| kappa run | peak RSS | layers fwd | head fwd | backward | update | rest |")
print("|---|---|---|---|---|---|---|")
for k in rows:
    if not (k["label"].startswith("kappa ") and k["ok"] and k.get("phase_peak_rss_mib")):
        continue
    p = k["phase_peak_rss_mib"][-1]
    print(f"| {k['label']} | {k['peak_rss_mib']:,.0f} | {p['layers_fwd']:,.0f} | {p['head_fwd']:,.0f} | "
          f"{p['bwd']:,.0f} | {p['update']:,.0f} | {p['rest']:,.0f} |")
print()
for k in rows:
    if k["label"].startswith("kappa ") and k["ok"]:
        e = by.get("eager " + k["label"][len("kappa "):])
        if e and e["ok"]:
            worst = max(abs(k[x] - e[x]) / max(abs(e[x]), 1e-30)
                        for x in ("reward_loss", "distill_loss", "entropy", "grad_norm"))
            print(f"{k['label']}: first-step L_R, L_D, entropy, ‖g‖ within {worst:.1e} (relative) of eager's")
EOF
((failures == 0)) || { echo "vocab_compare.sh: $failures run(s) failed" >&2; exit 1; }
