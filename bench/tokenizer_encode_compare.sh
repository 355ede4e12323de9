#!/usr/bin/env bash
# kappa's tokenizer against transformers.js, encode MB/s on the same corpus and
# machine, one after the other in one run (bench/README.md, "Tokenizer encode
# throughput"). Needs the build (kappa_bench_tokenizer_encode) and the npm
# fixture (ctest -R hf_tokenizer_reference_generate, or install.sh +
# generate_reference.sh).
#   bench/tokenizer_encode_compare.sh [BUILD_DIR] [SECONDS]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$repo/build}
seconds=${2:-5}
tokenizers=$build/tests/hf_tokenizers
export NODE_PATH=$tokenizers/node_modules
printf '%-8s %-12s %10s %10s %8s %9s %9s\n' tokenizer corpus kappa_MB/s js_MB/s ratio kappa_tok js_tok
for name in qwen3 qwen2_5 llama3 llama2; do
  dir=$tokenizers/$name
  # The test corpus (mixed scripts, specials, 2-20 KB strings) and plain
  # English prose (the repository's docs, one text per line).
  cat "$repo"/docs/*.md > "$dir/bench_prose.txt"
  for corpus in corpus.jsonl bench_prose.txt; do
    k=$("$build/bench/kappa_bench_tokenizer_encode" "$dir" "$dir/$corpus" --seconds "$seconds")
    j=$(node "$repo/tests/model/tokenizer_reference/bench_encode.js" "$dir" "$dir/$corpus" --seconds "$seconds")
    python3 - "$name" "$corpus" "$k" "$j" <<'PY'
import json, sys
name, corpus, k, j = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
# Tokens per pass: equal but for the documented \s divergence (U+0085/U+FEFF).
kt, jt = k["tokens"] // k["passes"], j["tokens"] // j["passes"]
print(f'{name:<8} {corpus:<12} {k["mb_per_s"]:10.2f} {j["mb_per_s"]:10.2f} {k["mb_per_s"] / j["mb_per_s"]:7.1f}x {kt:9d} {jt:9d}')
PY
  done
done
