// kappa's tokenizer follows the Hugging Face tokenizers (Rust, Oniguruma) in
// what the Split regex's `\s` matches: Unicode White_Space, which includes
// U+0085 (NEL) and excludes U+FEFF. JavaScript's `\s` is the reverse on those
// two code points, so transformers.js tokenizes strings holding them
// differently from the Rust library. For those strings only, this writes a
// variant of the tokenizer whose regex spells `\s`/`\S` as the White_Space
// class, so that transformers.js (still the reference for everything else in
// the pipeline) answers with the Rust library's whitespace:
//   node white_space_variant.js TOKENIZER_DIR CORPUS.jsonl OUT_DIR
// writes OUT_DIR/{tokenizer.json,tokenizer_config.json,corpus.jsonl}, the
// corpus being the lines (in order) that hold U+0085 or U+FEFF. Writes
// nothing when the tokenizer has no Split regex.
'use strict';
const fs = require('fs');
const path = require('path');

// Unicode White_Space (PropList.txt), as class items.
const WHITE_SPACE = '\\t-\\r \\x85\\xA0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000';

function spellWhiteSpace(pattern) {
  let out = '';
  let inClass = false;
  for (let i = 0; i < pattern.length; ++i) {
    const c = pattern[i];
    if (c === '\\' && i + 1 < pattern.length) {
      const e = pattern[++i];
      if (e === 's') out += inClass ? WHITE_SPACE : `[${WHITE_SPACE}]`;
      else if (e === 'S' && !inClass) out += `[^${WHITE_SPACE}]`;
      else if (e === 'S') throw new Error(`\\S inside a class in ${pattern}`);
      else out += c + e;
      continue;
    }
    if (c === '[' && !inClass) inClass = true;
    else if (c === ']' && inClass) inClass = false;
    out += c;
  }
  return out;
}

function rewriteSplits(node, counter) {
  if (node === null || typeof node !== 'object') return;
  if (node.type === 'Split' && node.pattern && typeof node.pattern.Regex === 'string') {
    node.pattern.Regex = spellWhiteSpace(node.pattern.Regex);
    counter.n++;
  }
  for (const child of node.pretokenizers || []) rewriteSplits(child, counter);
}

function main() {
  const [dir, corpus, out] = process.argv.slice(2);
  const tokenizer = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8'));
  const counter = { n: 0 };
  rewriteSplits(tokenizer.pre_tokenizer, counter);
  fs.rmSync(out, { recursive: true, force: true });
  if (counter.n === 0) return;
  fs.mkdirSync(out, { recursive: true });
  fs.writeFileSync(path.join(out, 'tokenizer.json'), JSON.stringify(tokenizer));
  fs.copyFileSync(path.join(dir, 'tokenizer_config.json'), path.join(out, 'tokenizer_config.json'));
  const lines = fs.readFileSync(corpus, 'utf8').split('\n').filter((l) => l.length > 0);
  const chosen = lines.filter((l) => /[\u0085\uFEFF]/u.test(JSON.parse(l)));
  fs.writeFileSync(path.join(out, 'corpus.jsonl'), chosen.join('\n') + (chosen.length ? '\n' : ''));
  process.stderr.write(`white_space_variant: ${dir}: ${counter.n} Split regex(es), ${chosen.length} strings\n`);
}

main();
