#!/usr/bin/env bash
# kappa container entrypoint (/usr/local/bin/kappa-entrypoint): dispatches by
# its first argument to one of the five binaries.
#
#   learner  ARGS...   kappa-learner ARGS...  (+ data-parallel flags from env, below)
#   teacher  ARGS...   kappa-teacher ARGS...
#   verifier ARGS...   kappa-verifier ARGS...
#   rollout  ARGS...   kappa-rollout-worker ARGS...
#   kappa    ARGS...   kappa ARGS...           (the CLI: sft, report, ...)
#   bootstrap [--config FILE] [--data-dir DIR] [--role teacher|student] [key=value ...]
#                      one-shot: `kappa sft` the teacher and the student (or
#                      only --role) into DIR/teacher and DIR/student unless
#                      they are already there for the same config (see below)
#   help               this text
#   anything else      executed as is (e.g. `bash`)
#
# Data-parallel learner (only when KAPPA_WORLD_SIZE > 1 and the command line
# has no --world-size of its own): appends
#   --world-size $KAPPA_WORLD_SIZE --rank ${KAPPA_RANK:-auto}
#   [--dist-store $KAPPA_DIST_STORE]
# so Compose overrides and the Kubernetes gpu overlay set ranks by env.
#
# KAPPA_BIN_DIR (default /usr/local/bin) is where the binaries are; the
# compose-equivalent local run (deploy/compose/local_run.py) points it at a
# build tree and runs this very script.
set -euo pipefail

BIN_DIR=${KAPPA_BIN_DIR:-/usr/local/bin}

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}

# The bootstrap is redone when the config that shapes the checkpoints changes:
# the key hashes the config file, the bootstrap's own overrides and every
# KAPPA_CFG_ variable of the sections it reads (seed, task, teacher, student,
# trainer.eval_examples, rollout.max_new_tokens). Each checkpoint is written
# to a temporary directory and moved into place, so a killed bootstrap leaves
# nothing half-written behind.
bootstrap() {
  local config=${KAPPA_CONFIG:-/etc/kappa/kappa.yaml} data_dir=${KAPPA_DATA_DIR:-/data}
  local overrides=() roles=(teacher student)
  while (($#)); do
    case "$1" in
      --config) config=$2; shift 2 ;;
      --config=*) config=${1#--config=}; shift ;;
      --data-dir) data_dir=$2; shift 2 ;;
      --data-dir=*) data_dir=${1#--data-dir=}; shift ;;
      --role) roles=("$2"); shift 2 ;;
      --role=*) roles=("${1#--role=}"); shift ;;
      *=*) overrides+=("$1"); shift ;;
      *) echo "kappa-entrypoint bootstrap: unknown argument '$1'" >&2; return 2 ;;
    esac
  done
  mkdir -p "$data_dir"
  local key
  key=$( {
    cat "$config"
    printf '%s\n' "${overrides[@]+"${overrides[@]}"}"
    env | grep -E '^KAPPA_CFG_(SEED|TASK__|TEACHER__(SHAPE|BOOTSTRAP)|STUDENT__(SHAPE|BOOTSTRAP)|TRAINER__EVAL_EXAMPLES|ROLLOUT__MAX_NEW_TOKENS)' | sort || true
  } | sha256sum | cut -d' ' -f1)
  local role dir tmp
  for role in "${roles[@]}"; do
    if [[ $role != teacher && $role != student ]]; then
      echo "kappa-entrypoint bootstrap: --role teacher|student, got '$role'" >&2; return 2
    fi
    dir=$data_dir/$role
    if [[ -f $dir/model.safetensors && -f $dir/.bootstrap-key && $(cat "$dir/.bootstrap-key") == "$key" ]]; then
      echo "bootstrap: $dir is current (key ${key:0:12}); skipping"
      continue
    fi
    tmp=$data_dir/.$role.tmp
    rm -rf "$tmp"
    echo "bootstrap: kappa sft --role $role -> $dir (key ${key:0:12})"
    "$BIN_DIR/kappa" sft "$config" "${overrides[@]+"${overrides[@]}"}" --role "$role" --out "$tmp"
    echo "$key" > "$tmp/.bootstrap-key"
    rm -rf "$dir"
    mv "$tmp" "$dir"
  done
  echo "bootstrap: done"
}

cmd=${1:-help}
if (($#)); then shift; fi
case "$cmd" in
  learner)
    args=("$@")
    if [[ -n ${KAPPA_WORLD_SIZE:-} && ${KAPPA_WORLD_SIZE} != 1 ]] && ! printf '%s\n' "$@" | grep -q -- '^--world-size'; then
      args+=(--world-size "$KAPPA_WORLD_SIZE" --rank "${KAPPA_RANK:-auto}")
      if [[ -n ${KAPPA_DIST_STORE:-} ]]; then args+=(--dist-store "$KAPPA_DIST_STORE"); fi
    fi
    exec "$BIN_DIR/kappa-learner" "${args[@]+"${args[@]}"}" ;;
  teacher) exec "$BIN_DIR/kappa-teacher" "$@" ;;
  verifier) exec "$BIN_DIR/kappa-verifier" "$@" ;;
  rollout) exec "$BIN_DIR/kappa-rollout-worker" "$@" ;;
  kappa) exec "$BIN_DIR/kappa" "$@" ;;
  bootstrap) bootstrap "$@" ;;
  help|-h|--help) usage ;;
  *) exec "$cmd" "$@" ;;
esac
