// Writes the tokenizer test corpus: COUNT strings (default 12000), one JSON
// string per line, the same for the same tokenizer, seed and repository (the
// only inputs are the tokenizer's added_tokens and the repository's *.jsonl
// fixtures). Each category below has a fixed share of COUNT; per-category
// counts and first line numbers go to stderr.
//   node make_corpus.js TOKENIZER_DIR OUT.jsonl [--count N] [--seed S]
//
// Only code points assigned by Unicode 11 (2018) are generated (the
// reference's answers must not depend on the Node/ICU version that runs it),
// never lone surrogates (not valid UTF-8, so not valid JSON text either), and
// no Cn code points (unassigned; noncharacters).
'use strict';
const fs = require('fs');
const path = require('path');

// ---------------------------------------------------------------- arguments, PRNG
const { parseCountSeedArgs, Rng } = require('./seeded.js');
const parseArgs = (argv) => parseCountSeedArgs(argv, 'make_corpus.js', 12000);

// ---------------------------------------------------------------- pools
const R = {
  latin1: [[0xc0, 0xd6], [0xd8, 0xf6], [0xf8, 0xff]],
  latinExtA: [[0x100, 0x17f]],
  greek: [[0x391, 0x3a1], [0x3a3, 0x3a9], [0x3b1, 0x3c9]],
  cyrillic: [[0x410, 0x44f]],
  cjk: [[0x4e00, 0x9fa5]],
  cjkExtB: [[0x20000, 0x2a6d6]],
  hiragana: [[0x3041, 0x3096]],
  katakana: [[0x30a1, 0x30fa]],
  hangul: [[0xac00, 0xd7a3]],
  fullwidth: [[0xff01, 0xff5e]],
  emoji: [[0x1f600, 0x1f64f], [0x1f680, 0x1f6c5], [0x1f400, 0x1f43e], [0x1f442, 0x1f4f7],
          [0x1f300, 0x1f320], [0x1f910, 0x1f918], [0x1f980, 0x1f984], [0x2600, 0x2613]],
  regional: [[0x1f1e6, 0x1f1ff]],
  arabic: [[0x621, 0x63a], [0x641, 0x64a]],
  hebrew: [[0x5d0, 0x5ea]],
  thai: [[0xe01, 0xe2e]],
  devanagari: [[0x915, 0x939]],
  combining: [[0x300, 0x36f]],
  symbols: [[0x2190, 0x21ff], [0x2200, 0x22ff], [0x2500, 0x257f], [0x20a0, 0x20b9]],
};
const ASCII_PUNCT = '!"#$%&\'()*+,-./:;<=>?@[\\]^_`{|}~';
const WORDS = ('the of and to in is you that it he was for on are as with his they I at be ' +
  'this have from or one had by word but not what all were we when your can said there use ' +
  'an each which she do how their if will up other about out many then them these so some her ' +
  'would make like him into time has look two more write go see number no way could people my ' +
  'than first water been call who oil its now find long down day did get come made may part ' +
  'Hello World Python JavaScript tokenizer BPE SentencePiece Qwen Llama transformer kappa ' +
  'reinforcement learning policy gradient reward rollout teacher learner verifier GRPO PPO ' +
  'antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis supercalifragilistic ' +
  'naïve café résumé façade coöperate Zürich São Paulo Ångström').split(' ');
const SENT_END = ['.', '!', '?', '...', '?!', ';', ':', '', '.\n', '!!!'];

// Text in other scripts, precomposed (NFC) as written.
const SCRIPT_TEXT = {
  chinese: ['你好，世界！', '我们今天学习机器学习。', '这是一个测试句子，包含标点符号：“引号”和（括号）。',
    '北京是中国的首都', '请计算：三加五等于几？答案是八。', '人工智能正在改变世界'],
  japanese: ['こんにちは世界', 'カタカナとひらがなの混合テキストです。', '東京タワーに行きました！',
    'ラーメンを食べたい', 'これはテストです。ありがとうございます。', 'ｶﾀｶﾅ半角もあります'],
  korean: ['안녕하세요 세계', '한국어 문장을 토큰화합니다.', '서울은 대한민국의 수도입니다!',
    '감사합니다', '프로그래밍 언어'],
  vietnamese: ['Tiếng Việt có nhiều dấu thanh', 'Xin chào thế giới', 'Người Việt Nam',
    'Phở bò rất ngon', 'Hà Nội mùa thu'],
  devanagari: ['नमस्ते दुनिया', 'हिन्दी भाषा', 'क़िला और ज़मीन', 'संस्कृतम्', 'भारत एक विशाल देश है।'],
  arabic: ['مرحبا بالعالم', 'مَرْحَبًا', 'اللغة العربية جميلة', 'بِسْمِ اللَّهِ', 'السَّلَامُ عَلَيْكُمْ'],
  hebrew: ['שלום עולם', 'שָׁלוֹם', 'עִבְרִית', 'בְּרֵאשִׁית בָּרָא'],
  thai: ['สวัสดีครับ', 'ภาษาไทย', 'กรุงเทพมหานคร', 'ขอบคุณมากค่ะ'],
  greek: ['Γειά σου Κόσμε', 'ελληνικά', 'Ἀθῆναι'],
  cyrillic: ['Привет, мир!', 'Ёлка и йод', 'Україна', 'Съешь же ещё этих мягких французских булок'],
};

// Combining-mark strings: NFC differs from the input.
const NFC_CHANGES = [
  'e\u0301', 'E\u0301', 'a\u0300', 'n\u0303', 'o\u0308', 'c\u0327', 'u\u0308\u0301',
  'e\u0302\u0323', 'e\u0323\u0302', 'a\u0323\u0306', 'o\u031b\u0301', // Vietnamese, both mark orders
  'A\u030a', '\u212b', '\u2126', '\u212a', '\u0340', '\u0341', '\u0343', '\u0374', '\u037e', '\u0387',
  '\u1100\u1161', '\u1100\u1161\u11a8', '\u1112\u1161\u11ab\u1100\u1173\u11af', // conjoining jamo
  '\u0915\u093c', '\u0958', '\u0959', '\u095e', // Devanagari nukta (0958.. are composition exclusions)
  '\u05e9\u05b8\u05c1', '\u05e9\u05c1\u05b8', '\ufb2a', // Hebrew points, reordered; presentation form
  '\u0627\u0653', '\u0627\u0654', '\u0648\u0654', '\u064a\u0654', // Arabic hamza/madda compositions
  '\u0e4d\u0e32', '\u0e33', // Thai nikhahit + aa (NFC keeps 0E33)
  '\uf900', '\uf9dc', '\ufa10', '\u{2F800}', // CJK compatibility ideographs (singletons)
  'q\u0307\u0323', 'x\u0323\u0307', 's\u0323\u0307', '\u1e9b\u0323',
  'i\u0307', '\u0069\u0308\u0301', 'Z\u030c', 'g\u0301', 'w\u030a', 'y\u030a',
  '\u0041\u0301\u0301\u0301', 'e\u0301\u0301', 'a\u0308\u0304',
  '\u00e9\u0301', '\u00c5\u0327',
  '\uff76\uff9e', '\u30ab\u3099', '\u304b\u3099', '\u306f\u309a', // kana + (semi-)voiced marks
  '\ufb01', '\u2460', '\u2167', '\u00bd', // compatibility characters NFC keeps
];

const EMOJI_SEQS = [
  '\u{1F468}\u200d\u{1F469}\u200d\u{1F467}\u200d\u{1F466}', '\u{1F469}\u200d\u{1F4BB}',
  '\u{1F3F3}\ufe0f\u200d\u{1F308}', '\u{1F441}\ufe0f\u200d\u{1F5E8}\ufe0f',
  '\u2764\ufe0f\u200d\u{1F525}', '\u{1F9D1}\u200d\u{1F91D}\u200d\u{1F9D1}',
  '\u{1F468}\u{1F3FD}\u200d\u{1F9B0}', '\u{1F3F4}\u200d\u2620\ufe0f',
  '\u{1F3F4}\u{E0067}\u{E0062}\u{E0065}\u{E006E}\u{E0067}\u{E007F}', // England (tag sequence)
  '1\ufe0f\u20e3', '#\ufe0f\u20e3', '*\u20e3', '\u2764\ufe0f', '\u2764', '\u263a\ufe0f', '\u263a\ufe0e',
  '\u{1F44D}\u{1F3FB}', '\u{1F44B}\u{1F3FF}', '\u{1F64F}\u{1F3FD}', '\u{1F3FB}', '\u200d', '\ufe0f',
  '\u{1F1FA}\u{1F1F8}', '\u{1F1EF}\u{1F1F5}', '\u{1F1E9}\u{1F1EA}', '\u{1F1EB}\u{1F1F7}',
  '\u{1F1E8}\u{1F1F3}', '\u{1F1F0}\u{1F1F7}', '\u{1F1EC}\u{1F1E7}', '\u{1F1FA}\u{1F1E6}',
];

// Whitespace-like characters: JS \s, PCRE2/Rust Unicode \s and Python
// str.isspace() disagree on some of them (U+0085, U+FEFF, U+180E, U+001C..1F).
const SPACES = [' ', ' ', ' ', '\t', '\n', '\n', '\r\n', '\r', '\v', '\f', '\u00a0', '\u3000',
  '\u2003', '\u2002', '\u2009', '\u200a', '\u202f', '\u205f', '\u1680', '\u2028', '\u2029',
  '\u0085', '\ufeff', '\u200b', '\u180e', '\u001c', '\u001d', '\u001e', '\u001f', '\u2000', '\u2007'];

// ---------------------------------------------------------------- generators
function word(r) {
  const k = r.int(0, 9);
  if (k < 6) return r.pick(WORDS);
  if (k < 8) return r.repeat(r.int(1, 12), () => String.fromCharCode(r.int(97, 122)));
  if (k < 9) { const w = r.pick(WORDS); return w[0].toUpperCase() + w.slice(1); }
  return r.pick(WORDS).toUpperCase();
}

function sentence(r) {
  const n = r.int(1, 18);
  const ws = [];
  for (let i = 0; i < n; ++i) {
    let w = word(r);
    if (r.chance(0.12)) w += r.pick([',', ';', ':', ' -', ' --', '\u2014', '"', "'", ')', '/']);
    if (r.chance(0.05)) w = r.pick(['(', '"', "'", '[', '\u201c', '\u00ab']) + w;
    ws.push(w);
  }
  let s = ws.join(r.chance(0.9) ? ' ' : r.pick(['  ', '\t', '_', '-', '']));
  s = s[0].toUpperCase() + s.slice(1);
  return s + r.pick(SENT_END);
}

// ASCII: generated words, sentences and punctuation runs.
function genAscii(r) {
  const k = r.int(0, 9);
  if (k < 5) return r.repeat(r.int(1, 4), (i) => (i ? ' ' : '') + sentence(r));
  if (k < 6) return r.repeat(r.int(1, 30), () => r.pick(ASCII_PUNCT.split('')));
  if (k < 7) return r.repeat(r.int(1, 8), () => word(r) + r.repeat(r.int(0, 4), () => r.pick(ASCII_PUNCT.split(''))));
  if (k < 8) return r.repeat(r.int(1, 60), () => String.fromCharCode(r.int(0x20, 0x7e)));
  if (k < 9) return r.pick(['...', '--', '!!!', '?!', '\'"\'', '``', "''", '"', '<<>>', '->', '=>', '::',
    '&&', '||', '/*', '*/', '<!--', '-->', '@@', '##', '###', '####', '.', ',']) + word(r);
  return r.repeat(r.int(1, 5), () => word(r)).toUpperCase();
}

// Contractions in all cases, and near-misses of the (?i:'s|'t|...) branch.
const CONTR = ['s', 't', 're', 've', 'm', 'll', 'd'];
function randCase(r, s) {
  return s.split('').map((c) => (r.chance(0.5) ? c.toUpperCase() : c)).join('');
}
function genContractions(r) {
  const fixed = ["DON'T", "don't", "Don'T", "it's", "IT'S", "It'S", "We'LL", "we'll", "WE'LL",
    "you're", "YOU'RE", "You'Re", "I'm", "I'M", "i'M", "they've", "THEY'VE", "he'd", "HE'D",
    "'s", "'S", "''s", "x's's", "'sup", "'till", "'dog", "'ll've", "rock'n'roll", "o'clock",
    "'ſ", "it'ſ", "'\u212a", "it\u2019s", "DON\u2019T", "'s'", "''", "'", "' s", "'\u00e9",
    "'\u0073\u0301", "l'homme", "aujourd'hui", "'12", "'\u4e2d", "ma'am", "y'all'd've"];
  const k = r.int(0, 4);
  if (k === 0) return r.pick(fixed);
  const parts = [];
  const n = r.int(1, 6);
  for (let i = 0; i < n; ++i) {
    const base = r.chance(0.8) ? word(r) : r.pick(['', ' ', '"', '(', '1', '\u00e9', '\u4e2d']);
    const suffix = randCase(r, r.pick(CONTR));
    const apos = r.chance(0.9) ? "'" : r.pick(['\u2019', '`', "''"]);
    let p = base + apos + suffix;
    if (r.chance(0.3)) p += r.pick(['', 'a', 'x', 'S', '1', ' ', '.', "'", "'s"]);
    parts.push(p);
  }
  return parts.join(r.pick([' ', ' ', '', '\n', ', ']));
}

// CJK: Chinese, Japanese kana, Korean hangul (and their punctuation).
function genCjk(r) {
  const k = r.int(0, 9);
  const cjkPunct = ['\u3001', '\u3002', '\u300c', '\u300d', '\uff01', '\uff1f', '\uff0c', '\u30fb', '\u30fc'];
  if (k < 2) return r.pick([...SCRIPT_TEXT.chinese, ...SCRIPT_TEXT.japanese, ...SCRIPT_TEXT.korean]);
  if (k < 4) return r.repeat(r.int(1, 40), () => (r.chance(0.1) ? r.pick(cjkPunct) : r.fromRanges(R.cjk)));
  if (k < 5) return r.repeat(r.int(1, 30), () => r.fromRanges(r.chance(0.5) ? R.hiragana : R.katakana));
  if (k < 6) return r.repeat(r.int(1, 8), () => r.repeat(r.int(1, 5), () => r.fromRanges(R.hangul))).replace(/(.)(.)/gu, '$1$2 ');
  if (k < 7) return r.repeat(r.int(1, 6), () => r.fromRanges(R.cjkExtB) + (r.chance(0.5) ? r.fromRanges(R.cjk) : ''));
  if (k < 8) return r.repeat(r.int(1, 20), () => r.fromRanges(R.fullwidth));
  // CJK mixed with ASCII and spaces
  return r.repeat(r.int(2, 8), () => r.pick([
    () => r.fromRanges(R.cjk) + r.fromRanges(R.cjk), () => ' ' + word(r), () => word(r),
    () => r.fromRanges(R.hiragana), () => r.fromRanges(R.hangul), () => String(r.int(0, 999)),
    () => r.pick(cjkPunct)])());
}

// Emoji: single, ZWJ sequences, flags, skin tones, keycaps, VS15/VS16.
function genEmoji(r) {
  const k = r.int(0, 9);
  const one = () => (r.chance(0.4) ? r.pick(EMOJI_SEQS) : r.fromRanges(R.emoji) +
    (r.chance(0.15) ? String.fromCodePoint(r.int(0x1f3fb, 0x1f3ff)) : '') + (r.chance(0.1) ? '\ufe0f' : ''));
  if (k < 3) return r.repeat(r.int(1, 12), one);
  if (k < 5) return r.repeat(r.int(1, 8), () => (r.chance(0.5) ? word(r) + ' ' : '') + one() + (r.chance(0.5) ? ' ' : ''));
  if (k < 6) return r.repeat(r.int(1, 9), () => r.fromRanges(R.regional)); // odd and random flag pairs
  if (k < 7) return r.repeat(r.int(1, 5), () => r.fromRanges(R.emoji) + '\u200d').replace(/\u200d$/, r.chance(0.5) ? '' : '\u200d');
  if (k < 8) return sentence(r) + ' ' + one() + one();
  if (k < 9) return r.repeat(r.int(1, 6), () => r.pick(EMOJI_SEQS));
  return r.fromRanges(R.emoji) + r.fromRanges(R.symbols) + r.fromRanges(R.emoji);
}

// Combining marks: decomposed Latin, Vietnamese, Devanagari, Arabic, Hebrew,
// Thai; strings whose NFC differs from the input (qwen normalizes with NFC).
function genCombining(r) {
  const k = r.int(0, 9);
  const scripts = ['vietnamese', 'devanagari', 'arabic', 'hebrew', 'thai', 'greek', 'korean', 'japanese'];
  if (k < 3) return r.repeat(r.int(1, 6), () => r.pick(NFC_CHANGES) + (r.chance(0.3) ? ' ' : ''));
  if (k < 5) return r.pick(SCRIPT_TEXT[r.pick(scripts)]).normalize('NFD');
  if (k < 6) return r.pick(SCRIPT_TEXT[r.pick(scripts)]);
  if (k < 7) return word(r).normalize('NFD') + ' ' + r.pick(WORDS).normalize('NFD');
  if (k < 8) { // random base + random marks (any order; often not canonical order)
    return r.repeat(r.int(1, 6), () => String.fromCharCode(r.int(97, 122)) +
      r.repeat(r.int(1, 4), () => r.fromRanges(R.combining)));
  }
  if (k < 9) return r.repeat(r.int(1, 4), () => r.fromRanges(r.pick([R.devanagari, R.arabic, R.hebrew, R.thai])) +
    r.pick(['\u093c', '\u094d', '\u093f', '\u064e', '\u0651', '\u05b8', '\u05bc', '\u0e34', '\u0e48', '']));
  return r.fromRanges(R.combining) + word(r); // leading lone combining mark
}

// Whitespace runs: spaces, tabs, \n, \r\n, mixed, leading/trailing, NBSP,
// ideographic and em spaces, and the characters the \s flavours disagree on.
function genWhitespace(r) {
  const run = (max) => r.repeat(r.int(1, max), () => (r.chance(0.6) ? r.pick([' ', '\t', '\n', '\r\n']) : r.pick(SPACES)));
  const k = r.int(0, 9);
  if (k < 2) return run(40);
  if (k < 3) return ' '.repeat(r.int(1, 80));
  if (k < 4) return r.pick(['\n', '\r\n', '\t', '\r']).repeat(r.int(1, 30));
  if (k < 7) return r.repeat(r.int(1, 8), () => (r.chance(0.8) ? word(r) : r.pick(['.', ',', '!', '{', '}', '1']))
    + run(r.chance(0.7) ? 3 : 12));
  if (k < 8) return run(5) + sentence(r) + run(5);
  if (k < 9) return r.pick(SPACES) + word(r) + r.pick(SPACES) + word(r) + r.pick(SPACES);
  return r.repeat(r.int(1, 6), () => '  ' + word(r) + '\n' + '    ' + word(r) + ' \n\n');
}

// Digit runs of length 1..40, numbers with separators, non-ASCII digits.
function genDigits(r) {
  const digits = (n) => r.repeat(n, () => String.fromCharCode(r.int(48, 57)));
  const k = r.int(0, 11);
  if (k < 3) return digits(r.int(1, 40));
  if (k < 4) {
    const n = digits(r.int(4, 16));
    const sep = r.pick([',', '.', ' ', '_', '\u00a0', '\u202f', "'"]);
    return n.replace(/\B(?=(\d{3})+(?!\d))/g, sep) + (r.chance(0.4) ? r.pick(['.', ',']) + digits(r.int(1, 4)) : '');
  }
  if (k < 5) return r.pick(['', '-', '+', '\u2212', '$', '\u20ac', '~']) + digits(r.int(1, 6)) + '.' + digits(r.int(1, 10)) +
    r.pick(['', 'e-10', 'E+5', '%', 'km', ' kg', 'x', 'th', '\u00b0C']);
  if (k < 6) return r.pick(['0x', '0b', '0o', '#']) + r.repeat(r.int(1, 16), () => r.pick('0123456789abcdefABCDEF'.split('')));
  if (k < 7) return `${r.int(1900, 2100)}-${String(r.int(1, 12)).padStart(2, '0')}-${String(r.int(1, 28)).padStart(2, '0')}` +
    (r.chance(0.5) ? `T${r.int(0, 23)}:${String(r.int(0, 59)).padStart(2, '0')}:00Z` : '');
  if (k < 8) return `${digits(r.int(1, 4))}${r.pick(['+', '-', '*', '/', '^', '=', ' + ', ' = '])}${digits(r.int(1, 4))}${r.pick(['=', ' = ', ''])}${r.chance(0.5) ? digits(r.int(1, 8)) : ''}`;
  if (k < 9) { // non-ASCII \p{N}: Arabic-Indic, Devanagari, fullwidth, superscripts, fractions, roman, circled
    const pools = [[[0x660, 0x669]], [[0x966, 0x96f]], [[0xff10, 0xff19]], [[0x2070, 0x2070], [0x00b2, 0x00b3], [0x2074, 0x2079]],
      [[0x00bc, 0x00be], [0x2153, 0x215e]], [[0x2160, 0x216f]], [[0x2460, 0x2473]], [[0x6f0, 0x6f9]], [[0xe50, 0xe59]]];
    const p = r.pick(pools);
    return r.repeat(r.int(1, 12), () => r.fromRanges(p)) + (r.chance(0.5) ? digits(r.int(1, 5)) : '');
  }
  if (k < 10) return word(r) + digits(r.int(1, 6)) + (r.chance(0.5) ? word(r) : '');
  if (k < 11) return r.repeat(r.int(1, 10), () => digits(r.int(1, 5))).split('').join(r.pick([' ', ',', '', '\n']));
  return `(${digits(3)}) ${digits(3)}-${digits(4)}`;
}

// Source code: Python, C++, JSON, LaTeX math (GSM8K/MATH-style answers).
function ident(r) {
  return r.pick(['x', 'i', 'n', 'foo', 'bar', 'total', 'self', 'value', 'kMax', 'tokens', 'ids',
    'my_var', 'fooBar', 'HTTPServer', '__init__', '_private', 'std', 'vec', 'count2']);
}
function genCode(r) {
  const k = r.int(0, 11);
  const id = () => ident(r);
  const num = () => String(r.int(0, 10000));
  switch (k) {
    case 0: return `def ${id()}(${id()}, ${id()}=${num()}):\n    """${sentence(r)}"""\n    return ${id()} + ${num()}\n`;
    case 1: return `for ${id()} in range(${num()}):\n\tif ${id()} % 2 == 0:\n\t\tprint(f"{${id()}!r:>10}")\n`;
    case 2: return `import numpy as np\nx = np.array([${num()}, ${num()}])  # ${sentence(r)}\nprint(x.shape)`;
    case 3: return `#include <vector>\nint ${id()}(const std::vector<int>& v) {\n  return v.size() > ${num()} ? v[0] : -1;\n}\n`;
    case 4: return `template <typename T>\nauto ${id()}(T&& t) -> decltype(t.${id()}()) { return std::forward<T>(t).${id()}(); }`;
    case 5: return `for (size_t ${id()} = 0; ${id()} < ${num()}; ++${id()}) { ${id()} += ${id()}[${id()}] << 2; }  // ${word(r)}`;
    case 6: return JSON.stringify({ [id()]: Number(num()), text: sentence(r), list: [1, 2.5, null, true], nested: { k: word(r) } },
      null, r.chance(0.5) ? 2 : undefined);
    case 7: return `{"role": "user", "content": "${sentence(r).replace(/"/g, '\\"')}"}\n{"role": "assistant", "content": "${num()}"}`;
    case 8: return r.pick([`The answer is $\\boxed{${num()}}$.`, `\\boxed{\\frac{${r.int(1, 99)}}{${r.int(2, 99)}}}`,
      `#### ${num()}`, `$x^2 + ${r.int(1, 9)}x - ${r.int(1, 9)} = 0$`, `\\[\\sum_{i=1}^{n} i = \\frac{n(n+1)}{2}\\]`,
      `$\\sqrt{${num()}} \\approx ${r.int(1, 99)}.${r.int(0, 99)}$`, `\\begin{align} a &= b \\\\ c &= d \\end{align}`,
      `<<${r.int(1, 99)}*${r.int(1, 99)}=${num()}>>`, `\\left( \\dfrac{\\pi}{${r.int(2, 9)}} \\right)`,
      `$\\boxed{${r.int(-99, 99)}}$`, `\\text{${word(r)}} \\cdot \\mathbb{R}^{${r.int(1, 9)}}`]);
    case 9: return `Natalia sold clips to ${num()} of her friends in April, and then she sold half as many clips in May. ` +
      `How many clips did Natalia sell altogether in April and May?\nNatalia sold ${num()}/2 = <<48/2=24>>24 clips in May.\n#### ${num()}`;
    case 10: return `SELECT ${id()}, COUNT(*) FROM ${id()} WHERE ${id()} >= ${num()} GROUP BY 1;\n$ ls -la | grep "${word(r)}" > /tmp/out.txt 2>&1`;
    default: return `<div class="${word(r)}"><a href="https://example.com/${word(r)}?q=${num()}&lang=en">${sentence(r)}</a></div>`;
  }
}

// Special/added tokens of this tokenizer (tokenizer.json added_tokens), glued
// to words and spaces on both sides, partial and repeated ones; and other
// tokenizers' special tokens, which are plain text here.
const FOREIGN_SPECIALS = ['<s>', '</s>', '<unk>', '<pad>', '[INST]', '[/INST]', '<<SYS>>', '<</SYS>>',
  '<|begin_of_text|>', '<|end_of_text|>', '<|eot_id|>', '<|start_header_id|>', '<|end_header_id|>',
  '<|im_start|>', '<|im_end|>', '<|endoftext|>', '<think>', '</think>', '<tool_call>', '<|reserved_special_token_0|>',
  '[CLS]', '[SEP]', '<mask>', '<|user|>'];
function genSpecial(r, specials) {
  const sp = () => r.pick(specials);
  const glue = () => r.pick(['', '', ' ', '  ', '\n', '\n\n', 'a', word(r), ' ' + word(r), word(r) + ' ', '\t', '.', '\u4e2d', '\u00e9', '\u{1F600}', "'s"]);
  const k = r.int(0, 11);
  if (k < 3) return r.repeat(r.int(1, 5), () => glue() + sp() + glue());
  if (k < 4) return sp().repeat(r.int(2, 6)) + (r.chance(0.5) ? word(r) : '');
  if (k < 5) { // partial special tokens: prefixes, suffixes, middles, wrong case, nested
    const s = sp();
    const a = r.int(1, Math.max(1, s.length - 1));
    return r.pick([s.slice(0, a), s.slice(a), s.slice(1, -1), s.toUpperCase(), '<' + s + '>', s.slice(0, a) + s,
      s + s.slice(a), s.replace('|', '| '), ' ' + s.slice(0, a) + ' ' + s.slice(a), s.slice(0, -1) + ' ' + s.slice(-1)]) + glue();
  }
  if (k < 6) return r.pick(FOREIGN_SPECIALS) + glue() + r.pick(FOREIGN_SPECIALS) + sentence(r);
  if (k < 8) { // chat-template-shaped
    const im = specials.includes('<|im_start|>');
    if (im) {
      return `<|im_start|>system\n${sentence(r)}<|im_end|>\n<|im_start|>user\n${sentence(r)}<|im_end|>\n<|im_start|>assistant\n` +
        (r.chance(0.5) ? `<think>\n${sentence(r)}\n</think>\n\n` : '') + `${sentence(r)}<|im_end|>` + (r.chance(0.5) ? '\n' : '');
    }
    if (specials.includes('<|start_header_id|>')) {
      return `<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n${sentence(r)}<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n${sentence(r)}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n`;
    }
    return `<s>[INST] <<SYS>>\n${sentence(r)}\n<</SYS>>\n\n${sentence(r)} [/INST] ${sentence(r)} </s><s>[INST] ${word(r)} [/INST]`;
  }
  if (k < 9) return sentence(r).split(' ').map((w) => (r.chance(0.3) ? w + sp() : w)).join(r.chance(0.5) ? ' ' : '');
  if (k < 10) return sp() + ' ' + sp() + '  ' + sp() + '\n' + sp();
  if (k < 11) return r.pick(SPACES) + sp() + r.pick(SPACES) + r.pick(NFC_CHANGES) + sp();
  return sp() + r.pick(specials.map((s) => s.slice(0, 2)));
}

// Strings from the repository's task fixtures: every *.jsonl under tests/,
// configs/ and tasks/, their prompt/answer and other string fields (capped).
// With none in the repository, arithmetic-task-shaped prompts/answers
// ("12+34=" -> "46", as tasks/arithmetic_dataset.cc) fill the share.
function findJsonl(root) {
  const out = [];
  const walk = (dir) => {
    let entries;
    try { entries = fs.readdirSync(dir, { withFileTypes: true }); } catch { return; }
    entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    for (const e of entries) {
      if (e.name === 'node_modules' || e.name.startsWith('.')) continue;
      const p = path.join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.isFile() && e.name.endsWith('.jsonl')) out.push(p);
    }
  };
  walk(root);
  return out;
}
function fixtureStrings(repo) {
  const strings = [];
  const files = [];
  for (const sub of ['tests', 'configs', 'tasks']) files.push(...findJsonl(path.join(repo, sub)));
  const collect = (v, depth) => {
    if (typeof v === 'string') strings.push(v);
    else if (depth < 3 && v && typeof v === 'object') {
      for (const x of Array.isArray(v) ? v : Object.values(v)) collect(x, depth + 1);
    }
  };
  for (const f of files) {
    for (const line of fs.readFileSync(f, 'utf8').split('\n')) {
      if (!line.trim()) continue;
      let obj;
      try { obj = JSON.parse(line); } catch { continue; }
      if (obj && typeof obj === 'object' && !Array.isArray(obj)) {
        for (const key of ['prompt', 'answer', 'string', 'text', 'question', 'solution', 'completion', 'response']) {
          if (typeof obj[key] === 'string') strings.push(obj[key]);
        }
        for (const [key, v] of Object.entries(obj)) {
          if (!['prompt', 'answer', 'string', 'text', 'question', 'solution', 'completion', 'response'].includes(key)) collect(v, 1);
        }
      } else collect(obj, 0);
    }
  }
  return { files, strings: strings.filter(isWellFormed) };
}
function genArithmetic(r) {
  const digits = (n) => String(r.int(n === 1 ? 0 : 10 ** (n - 1), 10 ** n - 1));
  const a = digits(r.int(1, 6));
  const b = digits(r.int(1, 6));
  const op = r.pick(['+', '-', '*']);
  const v = op === '+' ? BigInt(a) + BigInt(b) : op === '-' ? BigInt(a) - BigInt(b) : BigInt(a) * BigInt(b);
  return r.chance(0.5) ? `${a}${op}${b}=` : String(v);
}

// Mixed: random characters from every pool, words in many scripts.
function genMixed(r) {
  const pools = Object.values(R);
  const k = r.int(0, 3);
  if (k === 0) return r.repeat(r.int(1, 40), () => r.fromRanges(r.pick(pools)));
  if (k === 1) return r.repeat(r.int(2, 10), () => r.pick(SCRIPT_TEXT[r.pick(Object.keys(SCRIPT_TEXT))]) + r.pick([' ', '', '\n', ', ']));
  if (k === 2) return r.repeat(r.int(1, 30), () => (r.chance(0.5) ? String.fromCharCode(r.int(0x20, 0x7e)) : r.fromRanges(r.pick(pools))));
  return r.repeat(r.int(2, 8), () => r.pick([genAscii, genCjk, genEmoji, genCombining, genDigits, genContractions])(r) + r.pick([' ', '', '\n']));
}

// Long strings: 2..20 KB (UTF-8) mixes of every other category.
function genLong(r, specials, fixtures) {
  const target = r.int(2048, 20480);
  const gens = [genAscii, genAscii, genAscii, genContractions, genCjk, genEmoji, genCombining, genWhitespace,
    genDigits, genCode, genCode, (q) => genSpecial(q, specials), genMixed];
  let s = '';
  let bytes = 0;
  const sep = r.pick([' ', '\n', '\n\n', '']);
  while (bytes < target) {
    const piece = (r.chance(0.05) && fixtures.length ? r.pick(fixtures) : r.pick(gens)(r)) + sep;
    s += piece;
    bytes += Buffer.byteLength(piece, 'utf8');
  }
  return s;
}

// Empty string and single characters: every ASCII byte 0x00..0x7F, every C1
// control 0x80..0x9F, then single characters from the pools.
function singlesFixed() {
  const out = [''];
  for (let c = 0; c < 0x80; ++c) out.push(String.fromCharCode(c));
  for (let c = 0x80; c < 0xa0; ++c) out.push(String.fromCharCode(c));
  out.push('\u00a0', '\u00ad', '\u00e9', '\u00ff', '\u017f', '\u0301', '\u200b', '\u200c', '\u200d', '\u2028',
    '\u3000', '\u4e2d', '\ufeff', '\ufe0f', '\ufffd', '\ue000', '\uf8ff', '\u{1F600}', '\u{1F1FA}', '\u{1F3FB}',
    '\u{20000}', '\u{E0001}', '\u{10FFFD}', '\u0e33', '\u212b', '\u2126', '\uf900', '\u1100', '\u0958', '\u20ac');
  return out;
}
function genSingle(r) {
  return r.fromRanges(r.pick(Object.values(R)));
}

// ---------------------------------------------------------------- main
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;
function isWellFormed(s) { return !LONE_SURROGATE.test(s); }

function main() {
  const args = parseArgs(process.argv.slice(2));
  const tj = JSON.parse(fs.readFileSync(path.join(args.dir, 'tokenizer.json'), 'utf8'));
  const specials = tj.added_tokens.map((t) => t.content);
  const repo = path.resolve(__dirname, '..', '..', '..');
  const fx = fixtureStrings(repo);

  // [name, share, generator]; shares sum to 1.
  const categories = [
    ['singles', 0.02, null],
    ['ascii', 0.15, genAscii],
    ['contractions', 0.07, genContractions],
    ['cjk', 0.08, genCjk],
    ['emoji', 0.07, genEmoji],
    ['combining', 0.09, genCombining],
    ['whitespace', 0.09, genWhitespace],
    ['digits', 0.08, genDigits],
    ['code', 0.08, genCode],
    ['special_tokens', 0.10, (r) => genSpecial(r, specials)],
    ['fixtures', 0.05, null],
    ['mixed', 0.115, genMixed],
    ['long', 0.005, (r) => genLong(r, specials, fx.strings)],
  ];
  const counts = categories.map(([, share]) => Math.floor(args.count * share));
  counts[1] += args.count - counts.reduce((a, b) => a + b, 0); // remainder: ascii

  const lines = [];
  const report = [];
  categories.forEach(([name, , gen], ci) => {
    // One independent stream per category: changing one category's code or
    // share leaves the others' strings as they were.
    const r = new Rng((args.seed * 1000003 + ci * 7919) >>> 0);
    const first = lines.length;
    const n = counts[ci];
    if (name === 'singles') {
      const fixed = singlesFixed();
      for (let i = 0; i < n; ++i) lines.push(i < fixed.length ? fixed[i] : genSingle(r));
    } else if (name === 'fixtures') {
      for (let i = 0; i < n; ++i) lines.push(i < fx.strings.length ? fx.strings[i] : genArithmetic(r));
    } else {
      for (let i = 0; i < n; ++i) lines.push(gen(r));
    }
    report.push(`${name}=${n} (lines ${first + 1}..${lines.length})`);
  });

  let bytes = 0;
  const outLines = lines.map((s) => {
    if (!isWellFormed(s)) throw new Error(`generated a lone surrogate: ${JSON.stringify(s)}`);
    bytes += Buffer.byteLength(s, 'utf8');
    return JSON.stringify(s);
  });
  fs.writeFileSync(args.out, outLines.join('\n') + (outLines.length ? '\n' : ''));
  process.stderr.write(`make_corpus: ${lines.length} strings, ${bytes} bytes, seed ${args.seed}, ` +
    `${specials.length} added tokens, ${fx.files.length} fixture files (${fx.strings.length} strings)\n  ` +
    report.join('\n  ') + '\n');
}

main();
