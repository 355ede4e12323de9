#include "model/hf_tokenizer/added_vocabulary.h"

#include <algorithm>

#include "base/utf8.h"

namespace kappa::model::hf {
namespace {

// End of the whitespace run that starts at `offset`.
size_t SkipWhitespaceForward(std::string_view text, size_t offset) {
  while (offset < text.size()) {
    size_t next = offset;
    if (!base::IsUnicodeWhitespace(base::NextCodePoint(text, &next))) break;
    offset = next;
  }
  return offset;
}

// Start of the whitespace run that ends at `offset`, not before `floor`.
size_t SkipWhitespaceBackward(std::string_view text, size_t offset, size_t floor) {
  while (offset > floor) {
    size_t start = offset - 1;
    while (start > floor && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    size_t probe = start;
    if (!base::IsUnicodeWhitespace(base::NextCodePoint(text, &probe))) break;
    offset = start;
  }
  return offset;
}

}  // namespace

AddedVocabulary::AddedVocabulary(const JsonNode& added_tokens, const Normalizer* normalizer)
    : normalizer_(normalizer) {
  if (added_tokens.value.is_null()) return;
  const std::vector<JsonNode> items = added_tokens.Items();
  tokens_.reserve(items.size());  // pointers into tokens_ stay valid
  for (const JsonNode& item : items) {
    AddedToken token;
    const JsonNode id = item.Field("id");
    if (!id.value.is_number_integer() || id.value.get<int64_t>() < 0) {
      id.Fail("must be a non-negative integer");
    }
    token.id = id.value.get<int64_t>();
    token.content = item.String("content");
    if (token.content.empty()) item.Field("content").Fail("must not be empty");
    if (base::FirstInvalidUtf8(token.content) != std::string::npos) {
      item.Field("content").Fail("is not valid UTF-8");
    }
    token.special = item.BoolOr("special", false);
    token.lstrip = item.BoolOr("lstrip", false);
    token.rstrip = item.BoolOr("rstrip", false);
    token.normalized = item.BoolOr("normalized", !token.special);
    if (item.BoolOr("single_word", false)) {
      item.Field("single_word").Fail("single_word added tokens are not implemented by kappa");
    }
    tokens_.push_back(std::move(token));
  }
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& token = tokens_[i];
    if (!index_of_id_.emplace(token.id, i).second) {
      items[i].Field("id").Fail("id " + std::to_string(token.id) + " is given to two added tokens");
    }
    index_of_content_.emplace(token.content, i);
    if (!token.normalized) {
      raw_.Add(&token, token.content);
      continue;
    }
    std::string pattern = token.content;
    if (normalizer_ != nullptr) normalizer_->Apply(&pattern);
    if (!pattern.empty()) normalized_.Add(&token, std::move(pattern));
  }
}

void AddedVocabulary::MatchSet::Add(const AddedToken* token, std::string pattern) {
  auto& bucket = by_first_byte[static_cast<unsigned char>(pattern[0])];
  bucket.push_back({token, std::move(pattern)});
  std::stable_sort(bucket.begin(), bucket.end(), [](const Candidate& a, const Candidate& b) {
    return a.pattern.size() > b.pattern.size();
  });
  empty = false;
}

template <typename OnText>
void AddedVocabulary::SplitBy(const MatchSet& set, std::string_view text,
                              std::vector<TextSegment>* out, OnText on_text) const {
  size_t emitted = 0;  // text[0, emitted) is already in `out`
  size_t pos = 0;
  while (pos < text.size()) {
    const AddedToken* match = nullptr;
    size_t match_len = 0;
    if (!set.empty) {
      for (const Candidate& c : set.by_first_byte[static_cast<unsigned char>(text[pos])]) {
        if (text.compare(pos, c.pattern.size(), c.pattern) == 0) {
          match = c.token;
          match_len = c.pattern.size();
          break;  // longest first
        }
      }
    }
    if (match == nullptr) {
      ++pos;
      continue;
    }
    size_t begin = pos, end = pos + match_len;
    if (match->lstrip) begin = SkipWhitespaceBackward(text, begin, emitted);
    if (match->rstrip) end = SkipWhitespaceForward(text, end);
    if (begin > emitted) on_text(text.substr(emitted, begin - emitted), out);
    out->push_back({match->id, {}});
    emitted = pos = end;
  }
  if (emitted < text.size()) on_text(text.substr(emitted), out);
}

std::vector<TextSegment> AddedVocabulary::Split(std::string_view text) const {
  std::vector<TextSegment> segments;
  auto add_normalized = [](std::string_view piece, std::vector<TextSegment>* out) {
    out->push_back({-1, std::string(piece)});
  };
  SplitBy(raw_, text, &segments, [&](std::string_view piece, std::vector<TextSegment>* out) {
    std::string normalized(piece);
    if (normalizer_ != nullptr) normalizer_->Apply(&normalized);
    if (normalized.empty()) return;
    SplitBy(normalized_, normalized, out, add_normalized);
  });
  return segments;
}

const AddedToken* AddedVocabulary::Find(int64_t id) const {
  const auto it = index_of_id_.find(id);
  return it == index_of_id_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedVocabulary::Find(std::string_view content) const {
  const auto it = index_of_content_.find(std::string(content));
  return it == index_of_content_.end() ? nullptr : &tokens_[it->second];
}

}  // namespace kappa::model::hf
