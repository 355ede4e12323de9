// tokenizer.json "added_tokens": tokens matched in the text before it is
// normalized and split (special tokens like <|im_start|>, and plain added
// ones like <think>), as Hugging Face tokenizers' AddedVocabulary does:
// leftmost-longest match; tokens with normalized=false are matched in the raw
// text, normalized=true ones in each normalized remainder; lstrip/rstrip take
// the whitespace beside a match into it. single_word is refused at load.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/hf_tokenizer/json_path.h"
#include "model/hf_tokenizer/normalizer.h"

namespace kappa::model::hf {

struct AddedToken {
  int64_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

// A piece of input: an added token, or normalized text for the pre-tokenizer.
struct TextSegment {
  int64_t added_id = -1;  // >= 0: this piece is that added token
  std::string text;       // otherwise: normalized text (non-empty)
};

class AddedVocabulary {
 public:
  AddedVocabulary() = default;
  // `normalizer` may be null; it must outlive this object. Throws
  // std::invalid_argument naming the JSON path of a malformed entry.
  AddedVocabulary(const JsonNode& added_tokens, const Normalizer* normalizer);
  // Holds pointers into itself.
  AddedVocabulary(const AddedVocabulary&) = delete;
  AddedVocabulary& operator=(const AddedVocabulary&) = delete;

  // Splits `text` into added tokens and normalized remainders, in order.
  // REQUIRES: text is valid UTF-8.
  std::vector<TextSegment> Split(std::string_view text) const;

  const AddedToken* Find(int64_t id) const;
  const AddedToken* Find(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  // Tokens of one matching pass, grouped by first byte, longest first.
  struct Candidate {
    const AddedToken* token;
    std::string pattern;  // content as matched (normalized for pass 2)
  };
  struct MatchSet {
    std::vector<std::vector<Candidate>> by_first_byte = std::vector<std::vector<Candidate>>(256);
    bool empty = true;
    void Add(const AddedToken* token, std::string pattern);
  };
  // Appends the pieces of `text` split by `set`; `on_text` receives each
  // remainder (to normalize and split further).
  template <typename OnText>
  void SplitBy(const MatchSet& set, std::string_view text, std::vector<TextSegment>* out,
               OnText on_text) const;

  std::vector<AddedToken> tokens_;
  std::unordered_map<int64_t, size_t> index_of_id_;
  std::unordered_map<std::string, size_t> index_of_content_;
  const Normalizer* normalizer_ = nullptr;
  MatchSet raw_;         // normalized == false
  MatchSet normalized_;  // normalized == true, matched after normalization
};

}  // namespace kappa::model::hf
