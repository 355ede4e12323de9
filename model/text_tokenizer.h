// The tokenizer of a model directory, whichever kind it is: the directory's
// tokenizer.json (HfTokenizer) when it has one, else kappa's character
// tokenizer — the only directories without tokenizer files are the toy models
// kappa trains from scratch (the demo), whose vocabulary is that alphabet.
//
// Immutable, cheap to copy, thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/hf_tokenizer/hf_tokenizer.h"
#include "model/tokenizer.h"

namespace kappa::model {

class TextTokenizer {
 public:
  // Throws std::runtime_error naming the file and JSON path of a tokenizer
  // file kappa cannot read or refuses (model/hf_tokenizer/hf_tokenizer.h).
  static TextTokenizer ForModel(const std::string& model_dir);
  static TextTokenizer Character();

  // add_special_tokens: the tokenizer's own (tokenizer.json's post-processor;
  // the character tokenizer's BOS). Throws std::invalid_argument on text it
  // cannot encode (invalid UTF-8; a character outside the alphabet).
  std::vector<int64_t> Encode(std::string_view text, bool add_special_tokens) const;
  // Never throws: ids the tokenizer does not know (padding rows) are left out
  // of the text, invalid UTF-8 becomes U+FFFD. The character tokenizer stops
  // at its EOS as it always has.
  std::string Decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const;

  // One past the largest id: sampling and scoring are over [0, vocab_size()).
  int64_t vocab_size() const;
  // Identity of the id -> token mapping (HfTokenizer::fingerprint; a fixed
  // name for the character tokenizer).
  std::string fingerprint() const;
  // Where it came from, for messages: the tokenizer.json path, or
  // "kappa's character tokenizer".
  std::string source() const;
  // The Hugging Face tokenizer, or nullptr for the character one.
  const HfTokenizer* hf() const { return hf_ ? &*hf_ : nullptr; }

 private:
  std::optional<HfTokenizer> hf_;
  CharTokenizer character_;
};

// nullopt when `student` and `teacher` give every id the same meaning, else
// the message that refuses the pair, naming both sources: on-policy
// distillation compares their distributions id by id.
std::optional<std::string> TokenizerMismatch(const TextTokenizer& student,
                                             const TextTokenizer& teacher);

}  // namespace kappa::model
