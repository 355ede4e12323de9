// A model directory's tokenizer: tokenizer.json when present, kappa's
// character tokenizer otherwise; teacher/student agreement by fingerprint;
// padded embedding rows never reach the text.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "model/text_tokenizer.h"

namespace kappa::model {
namespace {

std::string Real(const std::string& name) { return std::string(KAPPA_HF_TOKENIZERS) + "/" + name; }

TEST(TextTokenizerTest, ToyDirectoryWithoutTokenizerFilesUsesTheCharacterTokenizer) {
  const auto dir = std::filesystem::temp_directory_path() / "kappa_text_tokenizer_toy";
  std::filesystem::create_directories(dir);
  const TextTokenizer tokenizer = TextTokenizer::ForModel(dir.string());
  EXPECT_EQ(tokenizer.hf(), nullptr);
  EXPECT_EQ(tokenizer.vocab_size(), CharTokenizer().vocab_size());
  EXPECT_EQ(tokenizer.Encode("1+2=", /*add_special_tokens=*/true),
            CharTokenizer().Encode("1+2=", /*add_bos=*/true));
  std::filesystem::remove_all(dir);
}

TEST(TextTokenizerTest, HuggingFaceDirectoryUsesItsTokenizerJson) {
  const TextTokenizer tokenizer = TextTokenizer::ForModel(Real("qwen2_5"));
  ASSERT_NE(tokenizer.hf(), nullptr);
  EXPECT_EQ(tokenizer.vocab_size(), 151665);
  EXPECT_EQ(tokenizer.Decode(tokenizer.Encode("Hello, world", false), false), "Hello, world");
}

TEST(TextTokenizerTest, PaddedRowsAreLeftOutOfTheText) {
  // Qwen2.5-0.5B's embedding has 151,936 rows for 151,665 ids.
  const TextTokenizer tokenizer = TextTokenizer::ForModel(Real("qwen2_5"));
  std::vector<int64_t> ids = tokenizer.Encode("42", false);
  ids.push_back(151700);
  ids.push_back(151935);
  EXPECT_EQ(tokenizer.Decode(ids, false), "42");
}

TEST(TextTokenizerTest, MismatchNamesBothTokenizers) {
  const TextTokenizer qwen3 = TextTokenizer::ForModel(Real("qwen3"));
  const TextTokenizer qwen25 = TextTokenizer::ForModel(Real("qwen2_5"));
  EXPECT_EQ(TokenizerMismatch(qwen25, TextTokenizer::ForModel(Real("qwen2_5"))), std::nullopt);
  const auto mismatch = TokenizerMismatch(qwen25, qwen3);
  ASSERT_TRUE(mismatch.has_value());
  EXPECT_NE(mismatch->find(Real("qwen2_5") + "/tokenizer.json"), std::string::npos) << *mismatch;
  EXPECT_NE(mismatch->find(Real("qwen3") + "/tokenizer.json"), std::string::npos) << *mismatch;
  EXPECT_TRUE(TokenizerMismatch(qwen25, TextTokenizer::Character()).has_value());
}

}  // namespace
}  // namespace kappa::model
