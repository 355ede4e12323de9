#!/usr/bin/env bash
# Installs the Debian 12 packages kappa needs to build, test and run.
# Idempotent: packages already present are skipped, so a warm machine costs
# only one dpkg query.
set -euo pipefail

# What the build needs (deploy/docker/Dockerfile's build stage installs
# exactly these; tests/deploy checks it).
PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
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
# the packet-loss rules of tests/integration/fault_network_test.
TEST_PACKAGES=(
  prometheus
  curl openssl nftables
  python3 python3-yaml jq docker-compose
  python3-torch python3-numpy python3-jinja2
  chromium fonts-dejavu-core
)

# The sanitizer and fuzz builds (scripts/sanitize.sh, scripts/fuzz.sh): clang,
# its sanitizer/libFuzzer runtimes, and llvm-symbolizer for readable stacks;
# clang-format (and git clang-format) for scripts/check_format.sh.
FUZZ_PACKAGES=(
  clang libclang-rt-14-dev llvm clang-format
)
ALL_PACKAGES=("${PACKAGES[@]}" "${TEST_PACKAGES[@]}" "${FUZZ_PACKAGES[@]}")

missing=()
for pkg in "${ALL_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

# Node.js and npm: a machine may already have them from elsewhere (NodeSource's
# nodejs bundles npm and conflicts with Debian's npm), so only a machine
# without them gets Debian's.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  missing+=(nodejs npm)
fi

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#ALL_PACKAGES[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
