#include "model/hf_tokenizer/byte_level.h"

#include <array>

#include "base/utf8.h"

namespace kappa::model::hf {
namespace {

bool IsPrintedAsItself(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Tables {
  std::array<char32_t, 256> to_alphabet{};
  std::array<int, 512> to_byte{};  // every alphabet code point is below 512
  Tables() {
    to_byte.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      to_alphabet[b] = IsPrintedAsItself(b) ? static_cast<char32_t>(b) : next++;
      to_byte[to_alphabet[b]] = b;
    }
  }
};

const Tables& GetTables() {
  static const Tables tables;
  return tables;
}

}  // namespace

char32_t ByteToAlphabet(unsigned char byte) { return GetTables().to_alphabet[byte]; }

std::optional<std::string> AlphabetToBytes(std::string_view token) {
  const Tables& tables = GetTables();
  std::string bytes;
  size_t offset = 0;
  while (offset < token.size()) {
    const char32_t c = base::NextCodePoint(token, &offset);
    if (c >= tables.to_byte.size() || tables.to_byte[c] < 0) return std::nullopt;
    bytes.push_back(static_cast<char>(tables.to_byte[c]));
  }
  return bytes;
}

std::string BytesToAlphabet(std::string_view bytes) {
  std::string text;
  for (char b : bytes) base::AppendUtf8(ByteToAlphabet(static_cast<unsigned char>(b)), &text);
  return text;
}

}  // namespace kappa::model::hf
