#!/usr/bin/env bash
# The demo command: installs what is missing, builds, runs the local demo.
# Extra arguments are passed to `kappa run` (e.g. trainer.steps=20 workers=3).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
exec "${KAPPA_BUILD_DIR:-build}/cli/kappa" run configs/demo.yaml "$@"
