#!/usr/bin/env bash
# Installs the Debian 12 packages kappa needs, in one of two sets:
#
#   bash scripts/setup.sh          # or `setup.sh build`: PACKAGES, what the
#                                  # build and `kappa run` need (scripts/demo.sh)
#   bash scripts/setup.sh test     # PACKAGES + TEST_PACKAGES + FUZZ_PACKAGES +
#                                  # Node.js/npm (scripts/test.sh)
#
# Idempotent: packages already present are skipped, so a warm machine costs
# only one dpkg query. Exit status: 0, apt-get's on a failed install, 2 for an
# unknown mode.
set -euo pipefail

MODE=${1:-build}
case "$MODE" in
  build | test) ;;
  *)
    echo "usage: setup.sh [build|test]" >&2
    exit 2
    ;;
esac

# What the build and the demo run need (deploy/docker/Dockerfile's build stage
# installs exactly these; tests/deploy checks it). `kappa run` needs nothing
# more: the run report is written by C++ (cli/), and python3 is only the
# interpreter of the verifier's sandbox for `code` tasks (the demo's task is
# arithmetic). The test libraries (libgtest, libgmock, libbenchmark) stay in
# this set: scripts/demo.sh configures the build directory scripts/test.sh
# later builds in full, and with KAPPA_BUILD_TESTS on (the default)
# configuring needs GTest.
PACKAGES=(
  build-essential clang cmake ninja-build ccache pkg-config git
  libtorch-dev libopenblas0-pthread libgloo-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libyaml-cpp-dev
  nlohmann-json3-dev
  libpcre2-dev libutf8proc-dev
)
# The real tools the tests drive: Prometheus (promtool and the server),
# headless Chromium for the report, docker-compose/python for the deploy
# checks, openssl for certificates, PyTorch for the independent Hugging Face
# reference forward (tests/model/reference, run with /usr/bin/python3),
# jinja2 for the chat-template reference, Node.js/npm for transformers.js,
# the tokenizer reference (tests/model/tokenizer_reference), nftables for
# the packet-loss rules of tests/integration/fault_network_test. Not here:
# kubectl >= 1.27 (Debian's kubernetes-client is 1.20, too old for the
# overlays' kustomize); without one the deploy_k8s_* rendering checks are
# reported as skipped, naming it (tests/deploy/k8s_render.py).
TEST_PACKAGES=(
  prometheus
  curl openssl nftables
  python3 python3-yaml jq docker-compose
  python3-torch python3-numpy python3-jinja2 python3-protobuf
  chromium fonts-dejavu-core
)

# The sanitizer and fuzz builds (scripts/sanitize.sh, scripts/fuzz.sh): clang's
# sanitizer/libFuzzer runtimes (clang itself is in PACKAGES: it builds
# everything), and llvm-symbolizer for readable stacks;
# clang-format (and git clang-format) for scripts/check_format.sh.
FUZZ_PACKAGES=(
  libclang-rt-14-dev llvm clang-format
)
WANTED=("${PACKAGES[@]}")
if [[ $MODE == test ]]; then
  WANTED+=("${TEST_PACKAGES[@]}" "${FUZZ_PACKAGES[@]}")
fi

missing=()
for pkg in "${WANTED[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

# Node.js and npm (test set only): a machine may already have them from
# elsewhere (NodeSource's nodejs bundles npm and conflicts with Debian's npm),
# so only a machine without them gets Debian's.
if [[ $MODE == test ]] && { ! command -v node >/dev/null || ! command -v npm >/dev/null; }; then
  missing+=(nodejs npm)
fi

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#WANTED[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
