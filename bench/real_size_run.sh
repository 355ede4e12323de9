#!/usr/bin/env bash
# The whole loop at real size on this machine's CPU (issue 38): `kappa run`
# on configs/qwen2.5-gsm8k.yaml with random Qwen2.5-0.5B-shaped student and
# teacher (24 layers, d 896, the real 151,936-row vocabulary, the real
# Qwen2.5 tokenizer and ChatML template), GSM8K-layout data, two workers, the
# math verifier, top-64 bf16 teacher rows, the chunked vocab head, activation
# checkpointing, κ and cheap K_DR every step. Then the learner is SIGKILLed
# after the step-5 checkpoint, the run is resumed to the last step, and the
# final checkpoint (HF layout) is checked against an independent reference
# forward (tests/integration/check_hf_checkpoint.py).
#
#   bash bench/real_size_run.sh [WORK_DIR]      (default /tmp/kappa-real-size)
#
# Needs build/ (scripts/build.sh), the real tokenizer files under
# build/tests/hf_tokenizers (ctest -R hf_tokenizers_install), /usr/bin/python3
# with torch, ~20 GiB of free memory and 15-40 minutes on 2 cores. Every
# override below is one this machine forces (CPU, bf16 copies, 2 cores, time);
# the rest is the file's. Writes WORK_DIR/summary.txt: per-process peak RSS
# (sampled VmHWM, and each process's own exit line), per-stage seconds from
# the logs and metrics.jsonl, bytes per message kind.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
W=${1:-/tmp/kappa-real-size}
STEPS=${KAPPA_REAL_STEPS:-8}
KILL_AFTER=${KAPPA_REAL_KILL_AFTER:-5}   # the checkpoint the learner is killed after
read -r -a RUN_FLAGS <<<"${KAPPA_REAL_RUN_FLAGS:-}"  # e.g. --ignore-plan
CHECKPOINT_EVERY=$KILL_AFTER
# shellcheck source=bench/real_size_common.sh
source "$ROOT/bench/real_size_common.sh"

# VmHWM (peak RSS) of every child of `kappa run`, every 2 s, by process name.
sample_peaks() {
  local parent=$1 out=$2
  while kill -0 "$parent" 2>/dev/null; do
    for p in $(ps --ppid "$parent" -o pid= 2>/dev/null); do
      local comm hwm
      comm=$(cat /proc/$p/comm 2>/dev/null) || continue
      hwm=$(awk '/VmHWM/{print $2}' /proc/$p/status 2>/dev/null) || continue
      [[ -n $hwm ]] && echo "$comm $p $hwm"
    done
    sleep 2
  done >>"$out"
}

learner_pid() { ps --ppid "$1" -o pid=,comm= | awk '$2=="kappa-learner"{print $1}'; }

# Leg 1: train until the step-KILL_AFTER checkpoint, then SIGKILL the learner.
rm -rf "$RUN"
start=$(date +%s)
"$KAPPA" run "${ARGS[@]}" "${RUN_FLAGS[@]}" --no-progress >"$W/leg1.log" 2>&1 &
K=$!
sample_peaks $K "$W/hwm_leg1.txt" &
until [[ -f $RUN/checkpoints/latest ]] && grep -q "step-$KILL_AFTER" "$RUN/checkpoints/latest"; do
  kill -0 $K 2>/dev/null || { echo "kappa run ended before step $KILL_AFTER; see $W/leg1.log"; exit 1; }
  sleep 2
done
echo "leg 1: step-$KILL_AFTER checkpoint after $(( $(date +%s) - start )) s; killing the learner"
kill -9 "$(learner_pid $K)"
wait $K || true
leg1_end=$(date +%s)

# Leg 2: --resume to the last step.
"$KAPPA" run "${ARGS[@]}" "${RUN_FLAGS[@]}" --resume --no-progress >"$W/leg2.log" 2>&1 &
K=$!
sample_peaks $K "$W/hwm_leg2.txt" &
wait $K
echo "leg 2: resumed run finished in $(( $(date +%s) - leg1_end )) s"

# The final checkpoint is the export (HF layout): kappa's logits on it
# against the independent reference forward, and trained away from the start.
FINAL=$RUN/checkpoints/step-$STEPS
"$KAPPA" logits "$FINAL" --ids 151644,872,198,18,220,19,151645 >"$W/kappa_logits.json"
$PY "$ROOT/tests/integration/check_hf_checkpoint.py" "$FINAL" --kappa-logits "$W/kappa_logits.json" \
  --tokenizer-from "$TOK" --initial "$W/models/student" --tolerance 1e-4 --rtol 1e-4 --ulp-trials 4 >"$W/export_check.json"
echo "export check passed: $(cat "$W/export_check.json")"

$PY "$ROOT/bench/real_size_report.py" "$W" | tee "$W/summary.txt"
