#!/usr/bin/env bash
# The demo command: installs what is missing of the build set (scripts/setup.sh
# build: no test, fuzz or Node.js packages), builds what the demo runs, runs
# the local demo. It builds only `kappa_suite` (cli/CMakeLists.txt: the
# `kappa` command and the four service binaries `kappa run` starts), not the
# test binaries or benchmarks: on a fresh 2-core machine those were 96 of the
# 243 compile steps. scripts/test.sh builds everything.
# Extra arguments are passed to `kappa run` (e.g. trainer.steps=20 workers=3).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh build
KAPPA_BUILD_TARGETS=kappa_suite bash scripts/build.sh
exec "${KAPPA_BUILD_DIR:-build}/cli/kappa" run configs/demo.yaml "$@"
