// A Hugging Face tokenizer read from a model directory's tokenizer.json (and
// tokenizer_config.json), encoding and decoding exactly as the reference
// implementations do (Hugging Face tokenizers; transformers.js, which the
// tests compare against on real files):
//
//   encode: added tokens matched in the raw text -> normalizer -> pre-tokenizer
//           -> BPE per word -> post-processor (only with add_special_tokens)
//   decode: ids -> tokens (skipping special ones if asked) -> decoder
//           -> clean_up_tokenization_spaces (tokenizer_config.json)
//
// Implemented: byte-level BPE (GPT-2, Llama 3, Qwen2/2.5, Qwen3) and the
// SentencePiece-style BPE of Llama 2 / Mistral tokenizer.json files (Prepend +
// Replace normalizer, byte fallback). Everything else — WordPiece, Unigram,
// Metaspace, BERT normalizers, single_word added tokens, ... — is refused at
// load naming the component and where it is in the file, never approximated.
//
// Immutable after load; copies share the tables; all methods are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kappa::model {

struct SpecialTokenIds {
  std::optional<int64_t> bos, eos, pad, unk;
};

class HfTokenizer {
 public:
  // Reads dir/tokenizer.json (required) and dir/tokenizer_config.json (if
  // present). Throws std::runtime_error naming the file and the JSON path of
  // what it cannot read or refuses.
  static HfTokenizer Load(const std::string& model_dir);
  // The same from file contents; `source` names them in errors.
  static HfTokenizer FromJson(const std::string& tokenizer_json,
                              const std::string& tokenizer_config_json, const std::string& source);
  // True when dir has a tokenizer.json.
  static bool Exists(const std::string& model_dir);

  // Throws std::invalid_argument naming the byte offset when `text` is not
  // valid UTF-8.
  std::vector<int64_t> Encode(std::string_view text, bool add_special_tokens = false) const;
  // Never fails on ids the tokenizer knows: invalid UTF-8 decodes to U+FFFD as
  // the reference does. Throws std::out_of_range naming an unknown id.
  std::string Decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const;

  // One past the largest id (model vocabulary and added tokens): the rows an
  // embedding table needs. A model's table may have more (padding rows).
  int64_t vocab_size() const;
  std::optional<int64_t> TokenToId(std::string_view token) const;  // as tokenizer.json spells it
  std::optional<std::string> IdToToken(int64_t id) const;
  bool IsSpecial(int64_t id) const;
  // tokenizer_config.json's bos/eos/pad/unk tokens, as ids.
  const SpecialTokenIds& special_ids() const;
  // Hex FNV-1a 64 of the vocabulary, merges and added tokens: two tokenizers
  // with the same fingerprint give every id the same meaning.
  const std::string& fingerprint() const;
  const std::string& source() const;  // the file it was read from

 private:
  struct Impl;
  explicit HfTokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace kappa::model
