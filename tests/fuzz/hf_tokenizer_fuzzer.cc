// Fuzzes the Hugging Face tokenizer (model/hf_tokenizer/). The first byte
// picks what the rest is:
//   0: text to Encode with a byte-level tokenizer (no normalizer): valid UTF-8
//      must round-trip exactly through Decode; invalid UTF-8 must be refused
//      with std::invalid_argument;
//   1: token ids for Decode, two bytes each, over both tokenizers' whole id
//      range: must never throw and must give valid UTF-8 (invalid bytes become
//      U+FFFD), which is what keeps a worker alive on any model output;
//   2: text for the SentencePiece-style tokenizer (byte fallback): the same
//      round trip, up to the leading space its Prepend normalizer adds;
//   3: a whole tokenizer.json: loading may only fail with std::runtime_error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "base/utf8.h"
#include "model/hf_tokenizer/hf_tokenizer.h"
#include "tests/model/synthetic_tokenizers.h"

namespace {

using kappa::model::HfTokenizer;
namespace testing_tokenizers = kappa::model::testing_tokenizers;

void Check(bool condition) {
  if (!condition) std::abort();
}

// transformers' clean-up (" ." -> ".") would break the exact round trip.
constexpr char kNoCleanUp[] = R"({"clean_up_tokenization_spaces": false})";

const HfTokenizer& ByteLevel() {
  static const HfTokenizer tokenizer = [] {
    auto file = testing_tokenizers::ByteLevelTokenizer();
    file["normalizer"] = nullptr;
    return HfTokenizer::FromJson(file.dump(), kNoCleanUp, "fuzz/byte_level.json");
  }();
  return tokenizer;
}

const HfTokenizer& SentencePiece() {
  static const HfTokenizer tokenizer = HfTokenizer::FromJson(
      testing_tokenizers::SentencePieceTokenizer(/*byte_fallback=*/true).dump(), kNoCleanUp,
      "fuzz/sentencepiece.json");
  return tokenizer;
}

bool ValidUtf8(std::string_view text) {
  return kappa::base::FirstInvalidUtf8(text) == std::string_view::npos;
}

void EncodeRoundTrip(const HfTokenizer& tokenizer, std::string_view text, bool prepends_space) {
  if (!ValidUtf8(text)) {
    try {
      tokenizer.Encode(text);
      std::abort();  // invalid UTF-8 accepted
    } catch (const std::invalid_argument&) {
    }
    return;
  }
  const std::vector<int64_t> ids = tokenizer.Encode(text);
  for (int64_t id : ids) Check(id >= 0 && id < tokenizer.vocab_size());
  std::string decoded = tokenizer.Decode(ids);
  if (prepends_space && !decoded.empty() && decoded[0] == ' ' && !text.empty() && text[0] != ' ') {
    decoded.erase(0, 1);
  }
  // Added tokens in the text survive as themselves, so the text comes back.
  Check(decoded == text || prepends_space);
}

void DecodeAnything(const uint8_t* data, size_t size) {
  for (const HfTokenizer* tokenizer : {&ByteLevel(), &SentencePiece()}) {
    std::vector<int64_t> ids;
    for (size_t i = 0; i + 1 < size; i += 2) {
      const int64_t raw = data[i] | (data[i + 1] << 8);
      const int64_t id = raw % tokenizer->vocab_size();
      if (tokenizer->IdToToken(id)) ids.push_back(id);
    }
    Check(ValidUtf8(tokenizer->Decode(ids)));
    Check(ValidUtf8(tokenizer->Decode(ids, /*skip_special_tokens=*/true)));
  }
}

void LoadAnything(std::string_view file) {
  try {
    const HfTokenizer tokenizer = HfTokenizer::FromJson(std::string(file), "", "fuzz/input.json");
    (void)tokenizer.Encode("hello <|end|> world");
  } catch (const std::runtime_error&) {
  } catch (const std::invalid_argument&) {
    // Encode's own refusal (never for this valid text) or a regex the
    // translation rejects before PCRE2: both documented.
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 4) {
    case 0:
      EncodeRoundTrip(ByteLevel(), rest, /*prepends_space=*/false);
      break;
    case 1:
      DecodeAnything(data + 1, size - 1);
      break;
    case 2:
      EncodeRoundTrip(SentencePiece(), rest, /*prepends_space=*/true);
      break;
    case 3:
      LoadAnything(rest);
      break;
  }
  return 0;
}
