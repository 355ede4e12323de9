# The real-size run's setup, shared by bench/real_size_run.sh and
# bench/weight_sync_in_run.sh (sourced; they set ROOT, W, STEPS and
# CHECKPOINT_EVERY first): random Qwen2.5-0.5B-shaped student and teacher
# under $W/models (written once), and ARGS, the `kappa run` arguments of
# configs/qwen2.5-gsm8k.yaml with the overrides this machine forces (CPU,
# bf16 copies, 2 cores, time).
PY=/usr/bin/python3
KAPPA=$ROOT/build/cli/kappa
TOK=$ROOT/build/tests/hf_tokenizers/qwen2_5
FIX=$ROOT/tests/integration/fixtures
mkdir -p "$W"

if [[ ! -f $W/models/student/model.safetensors ]]; then
  $PY "$ROOT/bench/gpu/write_qwen_checkpoints.py" "$W/models" --device cpu --tokenizer "$TOK" \
    --shapes student=qwen2.5-0.5b,teacher=qwen2.5-0.5b --guesser
fi

RUN=$W/runs/qwen-real
ARGS=(
  "$ROOT/configs/qwen2.5-gsm8k.yaml" name=qwen-real "runs_dir=$W/runs" "data_dir=$W/cache"
  "student.checkpoint=$W/models/student" "teacher.checkpoint=$W/models/teacher"
  "task.train_path=$FIX/gsm8k_tiny_train.jsonl" "task.heldout_path=$FIX/gsm8k_tiny_heldout.jsonl"
  # this machine: CPU, bf16 sampling/scoring copies (fp32 ones do not fit beside the learner)
  learner.device=cpu teacher.device=cpu rollout.device=cpu
  student.dtype=bfloat16 teacher.dtype=bfloat16
  # 2 cores
  workers=2 threads_per_process=1 teacher.threads=1 rollout.threads=1 learner.threads=2
  teacher.max_batch_sequences=4
  # time: 2 groups of 4 per step, short responses, few steps, a small evaluation
  learner.buffer_groups=4 rollout.max_outstanding=1 rollout.max_new_tokens=64
  "trainer.steps=$STEPS" trainer.groups_per_step=2 trainer.group_size=4
  trainer.micro_batch_sequences=8 trainer.eval_every=4 trainer.eval_examples=4
  "trainer.checkpoint_every=$CHECKPOINT_EVERY"
  monitor.kappa_every=1 monitor.kdr_every=1
)

