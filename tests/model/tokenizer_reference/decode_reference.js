// The reference decodings of random id sequences: COUNT (default 2000) JSON
// object lines {"ids": [...], "decoded": decode(ids, {skip_special_tokens:
// false}), "decoded_skip_special": decode(ids, {skip_special_tokens: true})},
// the same for the same tokenizer and seed. decode keeps transformers.js's
// clean_up_tokenization_spaces default (tokenizer_config.json's value).
//   NODE_PATH=.../node_modules node decode_reference.js TOKENIZER_DIR OUT.jsonl [--count N] [--seed S]
//
// Every sequence has 1..40 ids (the single-token cases have 1); categories,
// each a fixed share of COUNT, in this order in the output:
//   singles   each byte token alone (byte-level: the 256 one-byte tokens;
//             SentencePiece: <0x00>..<0xFF>), then each added token alone
//   uniform   ids uniform over the whole vocabulary, added tokens included
//   invalid   byte tokens forming invalid UTF-8: lone continuation bytes,
//             truncated multi-byte sequences, overlong forms, surrogates,
//             > U+10FFFF, bytes F5..FF, a leading BOM, split by word and
//             added tokens; byte-level vocab tokens that are partial UTF-8
//   slices    encodings of multi-byte text cut at random token boundaries
//   cleanup   the patterns clean_up_tokenization rewrites (" .", " n't", ...)
//   special   added/special tokens mixed with words, repeated, alone
'use strict';
const fs = require('fs');
const { loadTokenizer, decode } = require('./load_tokenizer.js');

const { parseCountSeedArgs, Rng } = require('./seeded.js');
const parseArgs = (argv) => parseCountSeedArgs(argv, 'decode_reference.js', 2000);

// GPT-2's byte <-> printable-character map (the byte-level alphabet).
function bytesToUnicode() {
  const bs = [];
  for (let b = 0x21; b <= 0x7e; ++b) bs.push(b);
  for (let b = 0xa1; b <= 0xac; ++b) bs.push(b);
  for (let b = 0xae; b <= 0xff; ++b) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; ++b) {
    if (!bs.includes(b)) { bs.push(b); cs.push(256 + n); n += 1; }
  }
  const map = new Array(256);
  bs.forEach((b, i) => { map[b] = String.fromCharCode(cs[i]); });
  return map;
}

// Byte patterns that are not valid UTF-8 (and some valid ones to mix in).
function invalidBytes(r) {
  const cont = () => r.int(0x80, 0xbf);
  switch (r.int(0, 11)) {
    case 0: return Array.from({ length: r.int(1, 3) }, cont); // lone continuation bytes
    case 1: return [r.int(0xc2, 0xdf)]; // truncated 2-byte
    case 2: return [r.int(0xe1, 0xef), cont()]; // truncated 3-byte
    case 3: return [0xf0, r.int(0x90, 0xbf), cont()]; // truncated 4-byte (e.g. an emoji's first 3)
    case 4: return [r.int(0xc0, 0xc1), cont()]; // overlong 2-byte
    case 5: return [0xe0, r.int(0x80, 0x9f), cont()]; // overlong 3-byte
    case 6: return [0xed, r.int(0xa0, 0xbf), cont()]; // UTF-16 surrogate
    case 7: return [0xf4, r.int(0x90, 0xbf), cont(), cont()]; // > U+10FFFF
    case 8: return [r.int(0xf5, 0xff)]; // never valid
    case 9: return [0xef, 0xbb, 0xbf]; // BOM (valid; TextDecoder may strip it)
    case 10: return [...Buffer.from(r.pick(['\u00e9', '\u4e2d', '\u{1F600}', 'a', ' ', '\u20ac', '\n']), 'utf8')]; // valid
    default: return [r.int(0xf0, 0xf4)]; // a lone 4-byte lead
  }
}

function main() {
  const args = parseArgs(process.argv.slice(2));
  const { tokenizer, tokenizerJSON } = loadTokenizer(args.dir);
  const vocab = tokenizerJSON.model.vocab;
  const added = tokenizerJSON.added_tokens;
  const byteFallback = !!tokenizerJSON.model.byte_fallback;

  const idSet = new Set(Object.values(vocab));
  for (const t of added) idSet.add(t.id);
  const allIds = [...idSet].sort((a, b) => a - b);
  const addedIds = added.map((t) => t.id);
  const specialIds = added.filter((t) => t.special).map((t) => t.id);

  // The 256 single-byte tokens, by byte value.
  const b2u = bytesToUnicode();
  const byteIds = [];
  for (let b = 0; b < 256; ++b) {
    const tok = byteFallback ? `<0x${b.toString(16).toUpperCase().padStart(2, '0')}>` : b2u[b];
    const id = vocab[tok];
    if (id === undefined) throw new Error(`no byte token for 0x${b.toString(16)} in ${args.dir}`);
    byteIds.push(id);
  }
  // Byte-level tokens that are not whole UTF-8 (partial characters).
  const partialIds = [];
  if (!byteFallback) {
    const u2b = new Map(b2u.map((c, b) => [c, b]));
    const strict = new TextDecoder('utf-8', { fatal: true });
    for (const [tok, id] of Object.entries(vocab)) {
      const bytes = [];
      for (const c of tok) { const b = u2b.get(c); if (b === undefined) { bytes.length = 0; break; } bytes.push(b); }
      if (bytes.length < 2) continue;
      try { strict.decode(Uint8Array.from(bytes)); } catch { partialIds.push(id); }
    }
    partialIds.sort((a, b) => a - b);
  }
  const enc = (s) => tokenizer.encode(s, { add_special_tokens: false });
  const wordIds = enc(' the quick brown fox jumps over the lazy dog. Hello, world! 12345 \u4e2d\u6587 caf\u00e9');
  const cap = (ids) => ids.slice(0, 40);

  const categories = [
    ['singles', 0.15, null],
    ['uniform', 0.35, (r) => Array.from({ length: r.int(1, 40) }, () => r.pick(allIds))],
    ['invalid', 0.20, (r) => {
      const ids = [];
      const n = r.int(1, 8);
      for (let i = 0; i < n && ids.length < 40; ++i) {
        const k = r.int(0, 9);
        if (k < 6) ids.push(...invalidBytes(r).map((b) => byteIds[b]));
        else if (k < 7 && partialIds.length) ids.push(r.pick(partialIds));
        else if (k < 8) ids.push(r.pick(wordIds));
        else if (k < 9) ids.push(r.pick(addedIds));
        else ids.push(byteIds[r.int(0x20, 0x7e)]);
      }
      return cap(ids.length ? ids : [byteIds[0x80]]);
    }],
    ['slices', 0.15, (r) => {
      const texts = ['\u4f60\u597d\uff0c\u4e16\u754c\uff01\u{1F600}\u{1F44D}\u{1F3FD}', 'caf\u00e9 na\u00efve \u00c5ngstr\u00f6m',
        '\u{1F468}\u200d\u{1F469}\u200d\u{1F467} \u{1F1EF}\u{1F1F5} \u2764\ufe0f', '\u3053\u3093\u306b\u3061\u306f \uc548\ub155\ud558\uc138\uc694',
        '\u0928\u092e\u0938\u094d\u0924\u0947 \u0645\u0631\u062d\u0628\u0627 \u05e9\u05dc\u05d5\u05dd', '\u{20000}\u{2A6A5} \u20ac100 \u00a3 \u00a5',
        ' \u2003\u3000 tabs\t\tand\nnewlines\r\n', "DON'T it's We'LL \u201cquoted\u201d"];
      const ids = enc(r.pick(texts) + r.pick(texts));
      const a = r.int(0, ids.length - 1);
      const b = r.int(a + 1, Math.min(ids.length, a + 40));
      return ids.slice(a, b);
    }],
    ['cleanup', 0.08, (r) => {
      const pieces = [' .', ' ?', ' !', ' ,', " '", " ' ", " n't", " 'm", " 's", " 've", " 're", "n't", "'s",
        ' word', 'word', ' ', '  ', '.', ' . .', " ' s", ' Don', ' I'];
      const ids = [];
      const n = r.int(1, 10);
      for (let i = 0; i < n; ++i) ids.push(...enc(r.pick(pieces)));
      return cap(ids.length ? ids : enc(' .'));
    }],
    ['special', 0.07, (r) => {
      const ids = [];
      const n = r.int(1, 12);
      const sp = specialIds.length ? specialIds : addedIds;
      for (let i = 0; i < n; ++i) {
        const k = r.int(0, 4);
        if (k < 2) ids.push(r.pick(sp));
        else if (k < 3) ids.push(r.pick(addedIds));
        else ids.push(r.pick(k < 4 ? wordIds : byteIds));
      }
      return cap(ids);
    }],
  ];
  const counts = categories.map(([, share]) => Math.floor(args.count * share));
  counts[1] += args.count - counts.reduce((a, b) => a + b, 0);

  const lines = [];
  const report = [];
  categories.forEach(([name, , gen], ci) => {
    const r = new Rng((args.seed * 1000003 + ci * 7919) >>> 0);
    const n = counts[ci];
    const fixed = name === 'singles' ? [...byteIds.map((id) => [id]), ...addedIds.map((id) => [id])] : [];
    for (let i = 0; i < n; ++i) {
      const ids = i < fixed.length ? fixed[i] : gen ? gen(r) : [r.pick(allIds)];
      lines.push(JSON.stringify({ ids, decoded: decode(tokenizer, ids, false), decoded_skip_special: decode(tokenizer, ids, true) }));
    }
    report.push(`${name}=${n}`);
  });
  fs.writeFileSync(args.out, lines.join('\n') + (lines.length ? '\n' : ''));
  process.stderr.write(`decode_reference: ${args.dir}: ${lines.length} sequences over ${allIds.length} ids ` +
    `(${addedIds.length} added, ${partialIds.length} partial-UTF-8 tokens), seed ${args.seed}: ${report.join(' ')}\n`);
}

main();
