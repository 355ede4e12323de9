#include "model/tokenizer.h"

#include <cstdio>
#include <stdexcept>
#include <utility>

namespace kappa::model {
namespace {

// Digits, operators and parentheses cover the arithmetic tasks; the
// lowercase letters and a little punctuation leave room for worded prompts
// ("what is 3+4? answer: 7") without changing the vocabulary later.
constexpr char kDefaultAlphabet[] = "0123456789+-*/=() abcdefghijklmnopqrstuvwxyz.,:?";

std::string Printable(unsigned char c) {
  if (c >= 0x20 && c < 0x7f) return std::string("'") + static_cast<char>(c) + "'";
  char buf[8];
  std::snprintf(buf, sizeof(buf), "0x%02x", c);
  return buf;
}

}  // namespace

CharTokenizer::CharTokenizer() : CharTokenizer(kDefaultAlphabet) {}

CharTokenizer::CharTokenizer(std::string alphabet) : alphabet_(std::move(alphabet)) {
  for (int64_t& id : char_to_id_) id = -1;
  for (size_t i = 0; i < alphabet_.size(); ++i) {
    const auto c = static_cast<unsigned char>(alphabet_[i]);
    if (char_to_id_[c] != -1) {
      throw std::invalid_argument("CharTokenizer: character " + Printable(c) +
                                  " appears twice in the alphabet");
    }
    char_to_id_[c] = 3 + static_cast<int64_t>(i);
  }
}

int64_t CharTokenizer::vocab_size() const { return 3 + static_cast<int64_t>(alphabet_.size()); }

std::vector<int64_t> CharTokenizer::Encode(std::string_view text, bool add_bos,
                                           bool add_eos) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size() + 2);
  if (add_bos) ids.push_back(kBos);
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    const int64_t id = char_to_id_[c];
    if (id < 0) {
      throw std::invalid_argument("CharTokenizer: character " + Printable(c) + " at offset " +
                                  std::to_string(i) + " is not in the alphabet");
    }
    ids.push_back(id);
  }
  if (add_eos) ids.push_back(kEos);
  return ids;
}

std::string CharTokenizer::Decode(const std::vector<int64_t>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (int64_t id : ids) {
    if (id == kEos) break;
    if (id == kPad || id == kBos) continue;
    if (id < 0 || id >= vocab_size()) {
      throw std::invalid_argument("CharTokenizer: token id " + std::to_string(id) +
                                  " is outside the vocabulary [0, " +
                                  std::to_string(vocab_size()) + ")");
    }
    text.push_back(alphabet_[static_cast<size_t>(id - 3)]);
  }
  return text;
}

}  // namespace kappa::model
