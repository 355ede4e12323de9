// Fuzzes the character tokenizer (model/tokenizer.h). The first byte picks
// what the rest is:
//   0: text for Encode with the default alphabet;
//   1: token ids for Decode, one signed byte each (negative, special, in and
//      out of the vocabulary);
//   2: "<alphabet>\0<text>": a custom alphabet, then text to encode with it.
// The tokenizer reports bad input with std::invalid_argument (its documented
// contract); anything else escaping, a crash, or a broken round trip is a
// finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer.h"

namespace {

using kappa::model::CharTokenizer;

void Check(bool condition) {
  if (!condition) std::abort();
}

// Every id Encode returns is an alphabet id, and Decode gives the text back.
void EncodeRoundTrip(const CharTokenizer& tokenizer, std::string_view text) {
  std::vector<int64_t> ids;
  try {
    ids = tokenizer.Encode(text, /*add_bos=*/true, /*add_eos=*/true);
  } catch (const std::invalid_argument&) {
    return;
  }
  Check(ids.size() == text.size() + 2);
  for (size_t i = 1; i + 1 < ids.size(); ++i) {
    Check(ids[i] >= 3 && ids[i] < tokenizer.vocab_size());
  }
  Check(tokenizer.Decode(ids) == text);
}

void DecodeIds(const CharTokenizer& tokenizer, std::string_view bytes) {
  std::vector<int64_t> ids;
  for (char byte : bytes) ids.push_back(static_cast<int8_t>(byte));
  std::string text;
  try {
    text = tokenizer.Decode(ids);
  } catch (const std::invalid_argument&) {
    return;
  }
  Check(text.size() <= ids.size());
  // Decoded text is made of alphabet characters, so it encodes again.
  Check(tokenizer.Encode(text).size() == text.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  static const CharTokenizer default_tokenizer;
  switch (data[0] % 3) {
    case 0:
      EncodeRoundTrip(default_tokenizer, rest);
      break;
    case 1:
      DecodeIds(default_tokenizer, rest);
      break;
    default: {
      const size_t split = rest.find('\0');
      const std::string_view alphabet = rest.substr(0, split);
      const std::string_view text =
          split == std::string_view::npos ? std::string_view() : rest.substr(split + 1);
      try {
        const CharTokenizer tokenizer{std::string(alphabet)};
        Check(tokenizer.vocab_size() == 3 + static_cast<int64_t>(alphabet.size()));
        EncodeRoundTrip(tokenizer, text);
        DecodeIds(tokenizer, text);
      } catch (const std::invalid_argument&) {
        // A repeated character in the alphabet.
      }
      break;
    }
  }
  return 0;
}
