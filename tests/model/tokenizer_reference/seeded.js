// What the seeded generators (make_corpus.js, decode_reference.js) share:
// their command line and a deterministic PRNG.
'use strict';

// SCRIPT DIR OUT [--count N] [--seed S]; exits with the usage on a bad line.
function parseCountSeedArgs(argv, script, defaultCount) {
  const pos = [];
  const opt = { count: defaultCount, seed: 1 };
  for (let i = 0; i < argv.length; ++i) {
    if (argv[i] === '--count') opt.count = Number(argv[++i]);
    else if (argv[i] === '--seed') opt.seed = Number(argv[++i]);
    else pos.push(argv[i]);
  }
  if (pos.length !== 2 || !Number.isInteger(opt.count) || opt.count < 0 ||
      !Number.isInteger(opt.seed)) {
    process.stderr.write(`usage: ${script} TOKENIZER_DIR OUT.jsonl [--count N] [--seed S]\n`);
    process.exit(2);
  }
  return { dir: pos[0], out: pos[1], ...opt };
}

// mulberry32: 32-bit state, deterministic on every platform.
function mulberry32(seed) {
  let a = seed >>> 0;
  return function next() {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

class Rng {
  constructor(seed) { this.next = mulberry32(seed); }
  int(lo, hi) { return lo + Math.floor(this.next() * (hi - lo + 1)); } // inclusive
  pick(arr) { return arr[Math.floor(this.next() * arr.length)]; }
  chance(p) { return this.next() < p; }
  // A code point from [[lo, hi], ...] ranges (weighted by range size).
  fromRanges(ranges) {
    let total = 0;
    for (const [lo, hi] of ranges) total += hi - lo + 1;
    let k = Math.floor(this.next() * total);
    for (const [lo, hi] of ranges) {
      if (k <= hi - lo) return String.fromCodePoint(lo + k);
      k -= hi - lo + 1;
    }
    throw new Error('unreachable');
  }
  repeat(n, fn) { let s = ''; for (let i = 0; i < n; ++i) s += fn(i); return s; }
}

module.exports = { parseCountSeedArgs, Rng };
