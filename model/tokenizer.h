// Character tokenizer for the arithmetic tasks. Ids 0..2 are PAD, BOS, EOS;
// every other id is one character of a fixed alphabet.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kappa::model {

class CharTokenizer {
 public:
  static constexpr int64_t kPad = 0;
  static constexpr int64_t kBos = 1;
  static constexpr int64_t kEos = 2;

  // Default alphabet: "0123456789+-*/= ()" and space and a few letters
  // (enough for arithmetic prompts and answers).
  CharTokenizer();
  explicit CharTokenizer(std::string alphabet);

  int64_t vocab_size() const;
  // Throws std::invalid_argument naming the offending character and its
  // offset when `text` has a character outside the alphabet.
  std::vector<int64_t> Encode(std::string_view text, bool add_bos = false,
                              bool add_eos = false) const;
  // Stops at the first EOS; skips PAD and BOS. Unknown ids throw.
  std::string Decode(const std::vector<int64_t>& ids) const;
  const std::string& alphabet() const { return alphabet_; }

 private:
  std::string alphabet_;
  int64_t char_to_id_[256];
};

}  // namespace kappa::model
