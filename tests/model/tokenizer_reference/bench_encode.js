// Encode throughput of transformers.js's tokenizers, the baseline the C++
// tokenizer's benchmark is compared to in the same run. Loading the
// tokenizer is not timed. The corpus is a JSONL file of JSON strings (as
// make_corpus.js writes) or, when any non-empty line is not a JSON string, a
// plain text file whose lines (each with its "\n") are the texts. One warm-up
// pass, then whole passes over all texts, encode(text, {add_special_tokens:
// false}) each, until at least SECONDS (default 5) have passed. Prints one
// JSON line: {"tokenizer", "bytes" (UTF-8 bytes encoded, all timed passes),
// "seconds", "mb_per_s" (bytes / 1e6 / seconds), "tokens" (all timed
// passes), "passes", "texts", "library"}.
//   NODE_PATH=.../node_modules node bench_encode.js TOKENIZER_DIR CORPUS_FILE [--seconds S]
'use strict';
const fs = require('fs');
const path = require('path');
const { loadTokenizer, libraryVersion } = require('./load_tokenizer.js');

function readTexts(file) {
  const raw = fs.readFileSync(file, 'utf8');
  const lines = raw.split('\n');
  if (lines.length && lines[lines.length - 1] === '') lines.pop();
  const parsed = [];
  let jsonl = true;
  for (const line of lines) {
    if (line === '') continue;
    try {
      const v = JSON.parse(line);
      if (typeof v !== 'string') { jsonl = false; break; }
      parsed.push(v);
    } catch {
      jsonl = false;
      break;
    }
  }
  if (jsonl) return parsed;
  return raw.split(/(?<=\n)/).filter((s) => s.length > 0);
}

function main() {
  const argv = process.argv.slice(2);
  const pos = [];
  let seconds = 5;
  for (let i = 0; i < argv.length; ++i) {
    if (argv[i] === '--seconds') seconds = Number(argv[++i]);
    else pos.push(argv[i]);
  }
  if (pos.length !== 2 || !(seconds >= 0)) {
    process.stderr.write('usage: bench_encode.js TOKENIZER_DIR CORPUS_FILE [--seconds S]\n');
    process.exit(2);
  }
  const [dir, corpus] = pos;
  const { tokenizer } = loadTokenizer(dir);
  const texts = readTexts(corpus);
  let passBytes = 0;
  for (const t of texts) passBytes += Buffer.byteLength(t, 'utf8');

  const pass = () => {
    let tokens = 0;
    for (const t of texts) tokens += tokenizer.encode(t, { add_special_tokens: false }).length;
    return tokens;
  };
  pass(); // warm-up: JIT, and transformers.js's BPE word cache (10000 entries)

  let passes = 0;
  let tokens = 0;
  const start = process.hrtime.bigint();
  let elapsed = 0;
  do {
    tokens += pass();
    passes += 1;
    elapsed = Number(process.hrtime.bigint() - start) / 1e9;
  } while (elapsed < seconds);

  const bytes = passBytes * passes;
  process.stdout.write(JSON.stringify({
    tokenizer: path.basename(path.resolve(dir)),
    bytes,
    seconds: Number(elapsed.toFixed(4)),
    mb_per_s: Number((bytes / 1e6 / elapsed).toFixed(4)),
    tokens,
    passes,
    texts: texts.length,
    library: `@lenml/tokenizers@${libraryVersion()}`,
  }) + '\n');
}

main();
