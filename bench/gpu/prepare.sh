#!/usr/bin/env bash
# Run here (the Debian machine) before bench/gpu/run.sh: the GPU machine has
# no nlohmann_json, so this copies Debian's header-only package (headers and
# CMake files, relocatable: the targets file finds the headers relative to
# itself) into .gpu_deps/, which the device tool carries with the tree:
#   bash bench/gpu/prepare.sh
#   run(command="bash bench/gpu/run.sh", carry=[".gpu_deps"], timeout_s=420)
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ -d /usr/include/nlohmann && -d /usr/share/cmake/nlohmann_json ]] || {
  echo "prepare: nlohmann-json3-dev is not installed (bash scripts/setup.sh installs it)" >&2
  exit 1
}
rm -rf .gpu_deps
mkdir -p .gpu_deps/include .gpu_deps/share/cmake
cp -r /usr/include/nlohmann .gpu_deps/include/
cp -r /usr/share/cmake/nlohmann_json .gpu_deps/share/cmake/
grep -qx '/.gpu_deps/' .git/info/exclude 2>/dev/null || echo '/.gpu_deps/' >> .git/info/exclude
echo "prepare: .gpu_deps/ ready ($(du -sh .gpu_deps | cut -f1)); carry it to the GPU machine"
