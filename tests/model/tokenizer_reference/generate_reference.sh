#!/usr/bin/env bash
# Test setup (a ctest fixture, after install.sh): for each exported tokenizer
# OUT_DIR/<name>/, writes the corpus (make_corpus.js) and transformers.js's
# answers for it (encode_reference.js, decode_reference.js) next to the
# tokenizer files. Deterministic; skipped when the outputs are newer than the
# scripts and the tokenizer files.
#   generate_reference.sh OUT_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$1
export NODE_PATH="$out/node_modules"
for name in qwen3 qwen2_5 llama3 llama2; do
  dir="$out/$name"
  outputs=("$dir/corpus.jsonl" "$dir/reference.jsonl" "$dir/decode_reference.jsonl")
  fresh=1
  for f in "${outputs[@]}"; do
    for input in "$here"/*.js "$dir/tokenizer.json" "$dir/tokenizer_config.json"; do
      if [[ ! -f $f || $input -nt $f ]]; then fresh=0; fi
    done
  done
  if ((fresh)); then continue; fi
  node "$here/make_corpus.js" "$dir" "$dir/corpus.jsonl" 2>/dev/null
  node "$here/encode_reference.js" "$dir" "$dir/corpus.jsonl" "$dir/reference.jsonl"
  node "$here/decode_reference.js" "$dir" "$dir/decode_reference.jsonl"
  node "$here/white_space_variant.js" "$dir" "$dir/corpus.jsonl" "$dir/white_space"
  if [[ -f $dir/white_space/corpus.jsonl ]]; then
    node "$here/encode_reference.js" "$dir/white_space" "$dir/white_space/corpus.jsonl" \
      "$dir/white_space/reference.jsonl"
  fi
done
