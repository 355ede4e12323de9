#!/usr/bin/env bash
# A soak with random faults (issue 21; not in CI):
#
#   bash scripts/soak.sh --minutes 60 --seed 1 [--workdir DIR] [--build DIR] [key=value ...]
#
# Runs `kappa run configs/demo.yaml` with 3 rollout workers and a checkpoint
# every 50 steps for --minutes, and every 20-60 s (drawn from --seed) injects
# one fault:
#   * SIGKILL of a worker, the teacher or the verifier (kappa run restarts it);
#   * SIGSTOP of one of them for 2-10 s, then SIGCONT;
#   * SIGKILL of the learner, then `kappa run --resume` (a new segment).
# Every 10 s it samples the resident memory of every process (their pids come
# from <run_dir>/ready/*.json). At the end it stops the run (SIGTERM) and
# prints the report of scripts/soak_report.py (also <workdir>/report.md):
# steps trained, each step once after deduplicating by the last resume, each
# lease consumed at most once across segments, memory growth per process,
# groups dropped by reason, restarts.
#
# Extra key=value arguments go to `kappa run` (e.g. trainer.group_size=4).
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=60
seed=1
workdir=""
build="${KAPPA_BUILD_DIR:-build}"
overrides=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --minutes) minutes="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --workdir) workdir="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    *=*) overrides+=("$1"); shift ;;
    *) echo "soak.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
workdir="${workdir:-/tmp/kappa-soak-$seed}"
kappa="$build/cli/kappa"
[[ -x "$kappa" ]] || { echo "soak.sh: $kappa not built (bash scripts/build.sh)" >&2; exit 2; }
python=/usr/bin/python3

rm -rf "$workdir"
mkdir -p "$workdir"
run_dir="$workdir/runs/soak"
events="$workdir/events.jsonl"   # one line per fault, restart and segment
rss="$workdir/rss.jsonl"         # one line per process per sample
RANDOM="$seed"

now() { date +%s.%N; }
event() {  # event KIND [key value ...]
  local line="{\"t\": $(now), \"kind\": \"$1\""
  shift
  while [[ $# -gt 1 ]]; do line+=", \"$1\": \"$2\""; shift 2; done
  echo "$line}" >> "$events"
}

segment=0
run_pid=0
start_segment() {  # start_segment [--resume]
  segment=$((segment + 1))
  "$kappa" run configs/demo.yaml --no-progress "$@" name=soak "runs_dir=$workdir/runs" \
    workers=3 trainer.checkpoint_every=50 trainer.steps=1000000 trainer.eval_every=500 \
    "${overrides[@]}" >> "$workdir/kappa-run.$segment.out" 2>&1 &
  run_pid=$!
  event segment number "$segment" pid "$run_pid" resume "${1:-}"
}

# The pid a process reported in its ready file, or nothing.
pid_of() {
  local file="$run_dir/ready/$1.json"
  [[ -f "$file" ]] && "$python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$file"
}

sample_rss() {
  local t file name pid kb
  t=$(now)
  for file in "$run_dir"/ready/*.json; do
    [[ -f "$file" ]] || continue
    name=$(basename "$file" .json)
    pid=$(pid_of "$name") || continue
    kb=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null) || continue
    [[ -n "$kb" ]] && echo "{\"t\": $t, \"process\": \"$name\", \"pid\": $pid, \"rss_kb\": $kb, \"segment\": $segment}" >> "$rss"
  done
}

# Waits until kappa run has started its workers (the ready files are there).
await_workers() {
  local deadline=$((SECONDS + 600))
  until [[ -f "$run_dir/ready/rollout-2.json" ]]; do
    if ! kill -0 "$run_pid" 2>/dev/null; then
      echo "soak.sh: kappa run exited while starting; see $workdir/kappa-run.$segment.out" >&2
      exit 1
    fi
    (( SECONDS < deadline )) || { echo "soak.sh: workers never started" >&2; exit 1; }
    sleep 1
  done
}

inject_fault() {
  local targets=(rollout-0 rollout-1 rollout-2 teacher verifier)
  local roll=$((RANDOM % 10)) target pid
  target="${targets[$((RANDOM % ${#targets[@]}))]}"
  if (( roll == 0 )); then
    pid=$(pid_of learner) || return 0
    event sigkill process learner pid "$pid"
    kill -KILL "$pid" 2>/dev/null || true
    wait "$run_pid" || true   # kappa run reports the learner's death and stops
    start_segment --resume
    await_workers
  elif (( roll <= 5 )); then
    pid=$(pid_of "$target") || return 0
    event sigkill process "$target" pid "$pid"
    kill -KILL "$pid" 2>/dev/null || true
  else
    pid=$(pid_of "$target") || return 0
    local pause=$((2 + RANDOM % 9))
    event sigstop process "$target" pid "$pid" seconds "$pause"
    kill -STOP "$pid" 2>/dev/null || true
    sleep "$pause"
    kill -CONT "$pid" 2>/dev/null || true
  fi
}

trap 'kill -TERM "$run_pid" 2>/dev/null || true' EXIT
start_segment
await_workers
end=$((SECONDS + minutes * 60))
next_fault=$((SECONDS + 20 + RANDOM % 41))
next_sample=$SECONDS
while (( SECONDS < end )); do
  if ! kill -0 "$run_pid" 2>/dev/null; then
    wait "$run_pid" && code=0 || code=$?
    event run_exited code "$code"
    echo "soak.sh: kappa run exited ($code) by itself; see $workdir/kappa-run.$segment.out" >&2
    break
  fi
  if (( SECONDS >= next_sample )); then
    sample_rss
    next_sample=$((SECONDS + 10))
  fi
  if (( SECONDS >= next_fault )); then
    inject_fault
    next_fault=$((SECONDS + 20 + RANDOM % 41))
  fi
  sleep 1
done
event stop
kill -TERM "$run_pid" 2>/dev/null || true
wait "$run_pid" || true
trap - EXIT
"$python" scripts/soak_report.py "$workdir" --minutes "$minutes" --seed "$seed" | tee "$workdir/report.md"
