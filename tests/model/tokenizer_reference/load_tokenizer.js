// Shared by the reference scripts: loads a Hugging Face model directory's
// tokenizer.json + tokenizer_config.json with transformers.js's tokenizers
// (@lenml/tokenizers, resolved through NODE_PATH), and reads JSONL corpora.
'use strict';
const fs = require('fs');
const path = require('path');

function loadTokenizer(dir) {
  const { TokenizerLoader } = require('@lenml/tokenizers');
  const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8'));
  const tokenizerConfig = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8'));
  const tokenizer = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
  return { tokenizer, tokenizerJSON, tokenizerConfig };
}

// The installed @lenml/tokenizers version (from its package.json).
function libraryVersion() {
  const main = require.resolve('@lenml/tokenizers');
  let dir = path.dirname(main);
  while (dir !== path.dirname(dir)) {
    const p = path.join(dir, 'package.json');
    if (fs.existsSync(p)) {
      const pkg = JSON.parse(fs.readFileSync(p, 'utf8'));
      if (pkg.name === '@lenml/tokenizers') return pkg.version;
    }
    dir = path.dirname(dir);
  }
  return 'unknown';
}

// decode() throws on an empty id list ("token_ids must be a non-empty array
// of integers"); the decoding of no tokens is the empty string.
function decode(tokenizer, ids, skipSpecial) {
  if (ids.length === 0) return '';
  return tokenizer.decode(ids, { skip_special_tokens: skipSpecial });
}

// One JSON string per line; a trailing newline ends the last line (an empty
// last line is not an entry).
function readJsonlStrings(file) {
  const text = fs.readFileSync(file, 'utf8');
  const lines = text.split('\n');
  if (lines.length && lines[lines.length - 1] === '') lines.pop();
  return lines.map((line, i) => {
    const v = JSON.parse(line);
    if (typeof v !== 'string') throw new Error(`${file}:${i + 1}: not a JSON string`);
    return v;
  });
}

module.exports = { loadTokenizer, libraryVersion, decode, readJsonlStrings };
