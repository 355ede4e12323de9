#!/usr/bin/env bash
# Weight sync inside a real `kappa run` (issue 54, item 7): the real-size
# loop of bench/real_size_run.sh (Qwen2.5-0.5B shape, the real vocabulary,
# two workers on this host, bf16 sampling copies) run once with
# `rollout.weight_transport: shm` and once with `grpc`, policies sent in
# bf16 (`rollout.weights_dtype: bfloat16`). From the processes' own logs
# (one clock: every process is on this host, millisecond timestamps) it
# prints, per policy version and worker:
#   publish → in use: from the learner's "policy version V snapshot" line
#     (logged as the snapshot is handed to the publisher) to the worker's
#     "policy version V loaded" line (logged once V is the model it samples
#     with);
#   load: the worker's own figure in that line (receive + write, ms).
#
#   bash bench/weight_sync_in_run.sh [WORK_DIR]   (default /tmp/kappa-real-size)
#   KAPPA_SYNC_STEPS (4), KAPPA_SYNC_TRANSPORTS ("shm grpc"), KAPPA_SYNC_SHARD (none):
#   with KAPPA_SYNC_SHARD=optimizer|gradients the learner runs as two sharded
#   ranks (learner.world_size=2; ~8 GiB more memory), each rank publishing to
#   its own worker.
#
# Needs what bench/real_size_run.sh needs; ~10 minutes per transport on 2 cores.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
W=${1:-/tmp/kappa-real-size}
STEPS=${KAPPA_SYNC_STEPS:-4}
CHECKPOINT_EVERY=0
SHARD=${KAPPA_SYNC_SHARD:-none}
# shellcheck source=bench/real_size_common.sh
source "$ROOT/bench/real_size_common.sh"
# κ and K_DR off: the sync does not depend on them, and the second
# gradient buffer would not fit beside two shm segments (kappa plan).
ARGS+=(rollout.weights_dtype=bfloat16 trainer.eval_every=0 monitor.kappa_every=0
       monitor.kdr_every=0)
if [[ $SHARD != none ]]; then
  ARGS+=(learner.world_size=2 "learner.shard=$SHARD" trainer.groups_per_step=2)
fi

for transport in ${KAPPA_SYNC_TRANSPORTS:-shm grpc}; do
  name=sync-$transport
  rm -rf "$W/runs/$name"
  echo "== rollout.weight_transport: $transport ($STEPS steps, learner.shard: $SHARD)" >&2
  "$KAPPA" run "${ARGS[@]}" "name=$name" "rollout.weight_transport=$transport" --no-progress \
    >"$W/$name.out" 2>&1 || { tail -20 "$W/$name.out" >&2; exit 1; }
done

$PY - "$W" ${KAPPA_SYNC_TRANSPORTS:-shm grpc} <<'EOF'
import datetime, glob, os, re, statistics, sys

work, transports = sys.argv[1], sys.argv[2:]
stamp = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})\]")
published = re.compile(r"policy version (\d+) snapshot:")
loaded = re.compile(r"policy version (\d+) loaded on .*?([0-9.]+) ms\)$")


def when(line):
    return datetime.datetime.strptime(stamp.match(line).group(1), "%Y-%m-%d %H:%M:%S.%f")


print("| transport | version | worker | publish → in use s | worker's load s |")
print("|---|---|---|---|---|")
summary = {}
for transport in transports:
    logs = os.path.join(work, "runs", f"sync-{transport}", "logs")
    publish = {}
    for path in sorted(glob.glob(os.path.join(logs, "learner*.log"))):
        for line in open(path, errors="replace"):
            m = published.search(line)
            if m and stamp.match(line):
                publish.setdefault(int(m.group(1)), when(line))
    for path in sorted(glob.glob(os.path.join(logs, "rollout-*.log"))):
        worker = os.path.basename(path)[: -len(".log")]
        for line in open(path, errors="replace"):
            m = loaded.search(line.rstrip())
            if not (m and stamp.match(line)):
                continue
            version = int(m.group(1))
            if version not in publish:
                continue
            seconds = (when(line) - publish[version]).total_seconds()
            print(f"| {transport} | {version} | {worker} | {seconds:.3f} | {float(m.group(2)) / 1000:.3f} |")
            if version >= 2:  # v0 and v1 allocate the worker's copies: cold
                summary.setdefault(transport, []).append(seconds)
for transport, values in summary.items():
    print(f"\n{transport}: steady (v ≥ 2) publish → in use mean {statistics.mean(values):.3f} s, "
          f"median {statistics.median(values):.3f} s over {len(values)}")
EOF
