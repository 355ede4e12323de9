#!/usr/bin/env bash
# The learner step at the Qwen2.5-0.5B vocabulary (bench/README.md, "Learner
# step at a real vocabulary"): runs kappa_bench_vocab_scale once per
# configuration of {full, topk} × {chunk 0, chunk 512} × {checkpointing 0, 1},
# one after the other, each its own process (peak RSS is per process), and
# prints a table of peak RSS and step time, both also as ratios to the
# baseline (full, chunk 0, checkpointing 0). A configuration that runs out of
# memory is "OOM" and the next one in that order becomes the baseline (the
# table says which).
#
# Each process runs under an address-space cap (ulimit -v, default 20 GiB:
# the machine has 24 GiB and is shared), so running out of memory is a failed
# allocation the bench reports, not the kernel's OOM killer picking a
# process. The cap is on virtual memory, which is ~0.7 GiB above the RSS here.
#
# Usage: bash bench/vocab_scale_bench.sh [BUILD_DIR] [bench flags, e.g. --layers 4]
# Env:   KAPPA_BENCH_MEM_GIB (the cap), KAPPA_BENCH_OUT (the JSON lines file,
#        default /tmp/vocab_scale_bench.jsonl), KAPPA_BENCH_CHUNK (default 512).
# Run it with nothing else on the machine: flock /tmp/kappa-build.lock bash bench/vocab_scale_bench.sh
set -u
build=${1:-build}
if [[ $# -gt 0 ]]; then shift; fi
bin=$build/bench/kappa_bench_vocab_scale
if [[ ! -x $bin ]]; then
  echo "no $bin: cmake --build $build --target kappa_bench_vocab_scale" >&2
  exit 2
fi
cap_gib=${KAPPA_BENCH_MEM_GIB:-20}
out=${KAPPA_BENCH_OUT:-/tmp/vocab_scale_bench.jsonl}
chunk_on=${KAPPA_BENCH_CHUNK:-512}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
: >"$out"

echo "kappa_bench_vocab_scale $* (cap ${cap_gib} GiB address space per process; JSON lines: $out)"
for teacher in full topk; do
  for chunk in 0 "$chunk_on"; do
    for ckpt in 0 1; do
      args=(--teacher "$teacher" --chunk "$chunk" --checkpointing "$ckpt" "$@")
      echo "== ${args[*]}" >&2
      start=$(date +%s)
      (
        ulimit -v $((cap_gib * 1024 * 1024))
        exec /usr/bin/time -v -o "$work/time" "$bin" "${args[@]}"
      ) >"$work/json" 2>"$work/err"
      rc=$?
      tail -n 3 "$work/err" | grep -v '^$' >&2
      time_rss=$(awk -F': ' '/Maximum resident set size/ { print $2 }' "$work/time" 2>/dev/null)
      line=$(grep '^{' "$work/json" | tail -n 1)
      if [[ $rc -ne 0 && $rc -ne 3 && $rc -ne 137 ]] && ! grep -q 'signal 9' "$work/time" 2>/dev/null; then
        echo "   failed (exit $rc): $(tail -n 1 "$work/err")" >&2
        line=""
      fi
      if [[ -z $line ]]; then  # killed (no JSON) or failed
        status=$([[ $rc -eq 137 ]] || grep -q 'signal 9' "$work/time" 2>/dev/null && echo oom || echo error)
        line="{\"teacher\": \"$teacher\", \"chunk\": $chunk, \"checkpointing\": $ckpt, \"oom\": $([[ $status == oom ]] && echo true || echo false), \"error\": $([[ $status == error ]] && echo true || echo false)}"
      fi
      # /usr/bin/time's peak RSS (KiB) and the wall time, beside the bench's own.
      echo "${line%\}}, \"time_v_max_rss_kib\": ${time_rss:-null}, \"wall_s\": $(($(date +%s) - start)), \"exit\": $rc}" >>"$out"
      echo "   exit $rc, $(($(date +%s) - start)) s" >&2
    done
  done
done

python3 - "$out" <<'EOF'
import json, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ok = [r for r in rows if not r.get("oom") and not r.get("error")]
name = lambda r: f"{r['teacher']}, chunk {r['chunk']}, ckpt {r['checkpointing']}"
base = ok[0] if ok else None
if base is None:
    print("every configuration ran out of memory or failed: no baseline")
elif base is not rows[0]:
    print(f"baseline: {name(base)} (the ones before it did not run: "
          + ", ".join(f"{name(r)} {'OOM' if r.get('oom') else 'failed'}" for r in rows[:rows.index(base)]) + ")")
else:
    print(f"baseline: {name(base)}")
print()
print("| teacher | chunk | ckpt | peak RSS MiB | × base | step s (last) | × base | first step s | teacher MiB | L_R | L_D | ‖g‖ | κ |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    head = f"| {r['teacher']} | {r['chunk']} | {r['checkpointing']} |"
    if r.get("oom") or r.get("error"):
        what = "OOM" if r.get("oom") else "failed"
        rss = r.get("peak_rss_mib")
        where = f"step {r['oom_step']}" if r.get("oom_step") else r.get("phase", "")
        at = f" in {where}, at {rss:,.0f}" if rss and where else ""
        done = r.get("step_s") or []
        steps = ", ".join(f"{s:.1f}" for s in done) + " (then OOM)" if done else ""
        print(f"{head} {what}{at} | | | | {steps} | | | | | |")
        continue
    last = r["last_step_s"]
    print(f"{head} {r['peak_rss_mib']:,.0f} | {r['peak_rss_mib'] / base['peak_rss_mib']:.2f} | "
          f"{last:.1f} | {last / base['last_step_s']:.2f} | {r['step_s'][0]:.1f} | "
          f"{r['teacher_bytes'] / 2**20:,.1f} | {r['reward_loss']:.7g} | {r['distill_loss']:.7g} | "
          f"{r['grad_norm']:.7g} | {r['kappa']:.7g} |")
print()
# The same computation: within a teacher form, every configuration's first
# step against that form's first configuration that ran.
for teacher in ("full", "topk"):
    same = [r for r in ok if r["teacher"] == teacher]
    if len(same) < 2:
        continue
    ref = same[0]
    for key in ("reward_loss", "distill_loss", "grad_norm", "reward_grad_norm", "distill_grad_norm", "entropy"):
        worst = max(abs(r[key] - ref[key]) / max(abs(ref[key]), 1e-30) for r in same[1:])
        print(f"{teacher}: {key} max relative difference to {name(ref)}: {worst:.2e}")
print()
for r in ok:
    print(f"{name(r)}: peak RSS after building the batch {r['peak_rss_after_build_mib']:,.0f} MiB "
          f"(model alone {r['rss_model_mib']:,.0f}, model + batch {r['rss_batch_mib']:,.0f}), "
          f"steps {', '.join(f'{s:.1f}' for s in r['step_s'])} s, VmPeak {r['vm_peak_mib']:,.0f} MiB")
EOF
