// tokenizer.json "model" of type BPE: the vocabulary and the merges by rank,
// as Hugging Face tokenizers' bpe/model.rs applies them (lowest rank first,
// leftmost first among equal ranks; later duplicates of a merge win), with
// byte_fallback (<0xXX> tokens), unk_token with fuse_unk, and ignore_merges.
// Other model types (WordPiece, Unigram, WordLevel), dropout and subword
// prefixes/suffixes are refused at load.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/hf_tokenizer/json_path.h"

namespace kappa::model::hf {

class BpeModel {
 public:
  // `byte_level`: the pre-tokenizer ends with ByteLevel, so words are raw
  // bytes and the vocabulary's alphabet spellings are translated to bytes.
  // Throws std::invalid_argument naming the JSON path (and merge index) of
  // what it refuses: an unimplemented type or option, a merge whose parts or
  // result are not in the vocabulary, duplicate ids.
  static BpeModel FromJson(const JsonNode& model, bool byte_level);

  // Appends the ids of one pre-tokenized word. Throws std::runtime_error when
  // a character has no token and the model has neither byte_fallback nor an
  // unk_token. REQUIRES: word is non-empty (and valid UTF-8 unless byte-level).
  void EncodeWord(std::string_view word, std::vector<int64_t>* ids) const;

  // The token of `id` in the model's own spelling (raw bytes when byte-level),
  // or nullptr when the vocabulary has no such id.
  const std::string* IdToToken(int64_t id) const;
  // The token as tokenizer.json spells it (the byte-level alphabet).
  std::optional<std::string> IdToFileToken(int64_t id) const;
  // Looks up a token in the file's spelling.
  std::optional<int64_t> FileTokenToId(std::string_view token) const;
  // One past the largest id.
  int64_t id_limit() const { return static_cast<int64_t>(id_to_token_.size()); }
  bool byte_level() const { return byte_level_; }
  bool byte_fallback() const { return byte_fallback_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    uint32_t len;  // bytes of the word it covers; 0 once merged into its left neighbour
  };
  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  const Merge* FindMerge(int32_t left, int32_t right) const;
  std::optional<int32_t> Lookup(std::string_view token) const;
  std::vector<Symbol> InitialSymbols(std::string_view word) const;
  void MergeAll(std::vector<Symbol>* symbols) const;

  bool byte_level_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  bool fuse_unk_ = false;
  std::optional<int32_t> unk_id_;
  std::unordered_map<std::string, int32_t> token_to_id_;  // the model's spelling
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  std::unordered_map<uint64_t, Merge> merges_;
  // Byte-level: the id of each single byte (or -1).
  int32_t byte_id_[256];
  // byte_fallback: the id of <0xXX> for each byte (or -1).
  int32_t fallback_id_[256];
};

}  // namespace kappa::model::hf
