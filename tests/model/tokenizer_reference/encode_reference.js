// The reference encodings of a corpus (make_corpus.js): for each corpus line,
// one JSON object line, in the same order:
//   {"ids": encode(text, {add_special_tokens: false}),
//    "ids_with_special": encode(text, {add_special_tokens: true}),
//    "decoded": decode(ids, {skip_special_tokens: false}),
//    "decoded_skip_special": decode(ids, {skip_special_tokens: true})}
// decode keeps transformers.js's clean_up_tokenization_spaces default, i.e.
// tokenizer_config.json's value (true when absent): of the four test
// tokenizers only llama3 has it true. Decoding no ids gives "".
//   NODE_PATH=.../node_modules node encode_reference.js TOKENIZER_DIR CORPUS.jsonl OUT.jsonl
'use strict';
const fs = require('fs');
const { loadTokenizer, decode, readJsonlStrings } = require('./load_tokenizer.js');

function main() {
  const [dir, corpus, out] = process.argv.slice(2);
  if (!dir || !corpus || !out) {
    process.stderr.write('usage: encode_reference.js TOKENIZER_DIR CORPUS.jsonl OUT.jsonl\n');
    process.exit(2);
  }
  const t0 = process.hrtime.bigint();
  const { tokenizer } = loadTokenizer(dir);
  const t1 = process.hrtime.bigint();
  const texts = readJsonlStrings(corpus);
  const lines = new Array(texts.length);
  let tokens = 0;
  for (let i = 0; i < texts.length; ++i) {
    const text = texts[i];
    const ids = tokenizer.encode(text, { add_special_tokens: false });
    const idsWithSpecial = tokenizer.encode(text, { add_special_tokens: true });
    tokens += ids.length;
    lines[i] = JSON.stringify({
      ids,
      ids_with_special: idsWithSpecial,
      decoded: decode(tokenizer, ids, false),
      decoded_skip_special: decode(tokenizer, ids, true),
    });
  }
  fs.writeFileSync(out, lines.join('\n') + (lines.length ? '\n' : ''));
  const t2 = process.hrtime.bigint();
  process.stderr.write(`encode_reference: ${dir}: ${texts.length} strings, ${tokens} tokens, ` +
    `clean_up_tokenization_spaces=${tokenizer.clean_up_tokenization_spaces}, ` +
    `load ${(Number(t1 - t0) / 1e9).toFixed(2)} s, encode+decode ${(Number(t2 - t1) / 1e9).toFixed(2)} s\n`);
}

main();
