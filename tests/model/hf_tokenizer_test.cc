// The tokenizer's own contract, on small synthetic tokenizer.json files:
// refusals by name, added-token flags (lstrip/rstrip/normalized), the
// SentencePiece pieces (byte fallback, unk fusing), invalid input, the
// fingerprint. Exactness on real files is hf_tokenizer_reference_test's job.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "model/hf_tokenizer/hf_tokenizer.h"
#include "model/hf_tokenizer/regex.h"
#include "tests/model/synthetic_tokenizers.h"

namespace kappa::model {
namespace {

using nlohmann::json;
using testing_tokenizers::ByteLevelTokenizer;
using testing_tokenizers::SentencePieceTokenizer;

HfTokenizer FromJson(const json& tokenizer, const json& config = json::object()) {
  return HfTokenizer::FromJson(tokenizer.dump(), config.dump(), "test/tokenizer.json");
}

std::string LoadError(const json& tokenizer) {
  try {
    FromJson(tokenizer);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(loaded)";
}

TEST(HfTokenizerTest, MergesByRankAndDecodesBack) {
  const HfTokenizer tok = FromJson(ByteLevelTokenizer());
  // "hello" -> h e l l o -> he ll o -> hell o; " w" merges to Ġw.
  EXPECT_EQ(tok.Encode("hello"), (std::vector<int64_t>{258, 'o'}));
  EXPECT_EQ(tok.Encode("hello w"), (std::vector<int64_t>{258, 'o', 259}));
  EXPECT_EQ(tok.Decode(tok.Encode("hello w")), "hello w");
  EXPECT_EQ(tok.vocab_size(), 302);
  EXPECT_EQ(tok.TokenToId("Ġw"), 259);
  EXPECT_EQ(tok.IdToToken(259), "Ġw");
}

TEST(HfTokenizerTest, AddedTokensSplitBeforeNormalizationAndSkipOnlySpecial) {
  const HfTokenizer tok = FromJson(ByteLevelTokenizer());
  const auto ids = tok.Encode("he<think>he<|end|>");
  EXPECT_EQ(ids, (std::vector<int64_t>{256, 301, 256, 300}));
  EXPECT_TRUE(tok.IsSpecial(300));
  EXPECT_FALSE(tok.IsSpecial(301));
  EXPECT_EQ(tok.Decode(ids), "he<think>he<|end|>");
  EXPECT_EQ(tok.Decode(ids, /*skip_special_tokens=*/true), "he<think>he");
}

TEST(HfTokenizerTest, LstripAndRstripTakeTheWhitespaceBesideTheToken) {
  json file = ByteLevelTokenizer();
  file["added_tokens"][0]["lstrip"] = true;
  file["added_tokens"][1]["rstrip"] = true;
  const HfTokenizer tok = FromJson(file);
  const HfTokenizer plain = FromJson(ByteLevelTokenizer());
  // The whitespace before <|end|> and after <think> belongs to the token.
  EXPECT_EQ(tok.Encode("he  \t<|end|>"), (std::vector<int64_t>{256, 300}));
  EXPECT_EQ(tok.Encode("<think> \n he"), (std::vector<int64_t>{301, 256}));
  // Without the flags the whitespace is text of its own.
  EXPECT_NE(plain.Encode("he  \t<|end|>"), (std::vector<int64_t>{256, 300}));
  // Only one side: rstrip on <think> leaves the space before it alone.
  EXPECT_EQ(tok.Encode("he <think>"), (std::vector<int64_t>{256, ' ', 301}));
}

TEST(HfTokenizerTest, NormalizedAddedTokensMatchAfterNormalization) {
  json file = ByteLevelTokenizer();
  // U+00E9 precomposed; the text spells it e + U+0301, which NFC composes.
  file["added_tokens"].push_back({{"id", 302}, {"content", "caf\u00e9"}, {"special", false},
                                  {"lstrip", false}, {"rstrip", false}, {"normalized", true},
                                  {"single_word", false}});
  EXPECT_EQ(FromJson(file).Encode("cafe\u0301"), (std::vector<int64_t>{302}));
  file["added_tokens"][2]["normalized"] = false;
  EXPECT_NE(FromJson(file).Encode("cafe\u0301"), (std::vector<int64_t>{302}));
}

TEST(HfTokenizerTest, InvalidUtf8InModelOutputDecodesToReplacementCharacters) {
  const HfTokenizer tok = FromJson(ByteLevelTokenizer());
  // E4 B8 is a truncated 3-byte sequence (one maximal subpart), FF is never valid.
  EXPECT_EQ(tok.Decode({0xE4, 0xB8, 'a', 0xFF, 300}), "\uFFFDa\uFFFD<|end|>");
  EXPECT_THROW(tok.Decode({5000}), std::out_of_range);
  try {
    tok.Encode("ok\xC3(");
    FAIL() << "invalid UTF-8 was encoded";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("byte 2"), std::string::npos) << e.what();
  }
}

TEST(HfTokenizerTest, UnimplementedComponentsAreRefusedByNameAndPath) {
  struct Case {
    std::string json_pointer;
    json value;
    std::string must_mention;
  };
  const std::vector<Case> cases = {
      {"/model/type", "WordPiece", "model: type \"WordPiece\" is not implemented"},
      {"/model/dropout", 0.1, "model.dropout: BPE dropout is not implemented"},
      {"/model/continuing_subword_prefix", "##", "continuing_subword_prefix"},
      {"/normalizer", {{"type", "Lowercase"}}, "normalizer: type \"Lowercase\""},
      {"/normalizer", {{"type", "Precompiled"}, {"precompiled_charsmap", "x"}}, "\"Precompiled\""},
      {"/pre_tokenizer/pretokenizers/0", {{"type", "Metaspace"}}, "pretokenizers[0]: type \"Metaspace\""},
      {"/pre_tokenizer/pretokenizers/0/behavior", "Sideways", "unknown behavior \"Sideways\""},
      {"/pre_tokenizer/pretokenizers/0/pattern", {{"Regex", "(unclosed"}}, "pretokenizers[0].pattern"},
      {"/decoder", {{"type", "WordPiece"}}, "decoder: type \"WordPiece\""},
      {"/post_processor", {{"type", "RobertaProcessing"}}, "post_processor: type \"RobertaProcessing\""},
      {"/added_tokens/0/single_word", true, "added_tokens[0].single_word"},
      {"/model/merges/1", "l q", "model.merges[1]: \"l\" + \"q\""},
  };
  for (const Case& c : cases) {
    json file = ByteLevelTokenizer();
    file[json::json_pointer(c.json_pointer)] = c.value;
    const std::string error = LoadError(file);
    EXPECT_NE(error.find("test/tokenizer.json: "), std::string::npos) << error;
    EXPECT_NE(error.find(c.must_mention), std::string::npos)
        << c.json_pointer << ": " << error;
  }
  // ByteLevel must come last: kappa runs BPE over raw bytes after it.
  json file = ByteLevelTokenizer();
  auto& steps = file["pre_tokenizer"]["pretokenizers"];
  steps.push_back(steps[0]);
  EXPECT_NE(LoadError(file).find("follows a ByteLevel step"), std::string::npos) << LoadError(file);
}

// Ids index a dense table: one far past the vocabulary's size is refused
// by name instead of allocating gigabytes (found by hf_tokenizer_fuzzer).
TEST(HfTokenizerTest, AnIdFarPastTheVocabularyIsRefused) {
  json file = ByteLevelTokenizer();
  file["model"]["vocab"]["zzz"] = 712140173;
  const std::string error = LoadError(file);
  EXPECT_NE(error.find("the id of \"zzz\" (712140173) is far past the vocabulary's"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("model.vocab"), std::string::npos) << error;
}

TEST(HfTokenizerTest, SentencePieceBpeWithByteFallbackAndTemplate) {
  const HfTokenizer tok = FromJson(SentencePieceTokenizer(/*byte_fallback=*/true));
  // "ab a" -> "▁ab▁a": ▁+a merges first (rank 0), then a+b cannot (a is taken).
  EXPECT_EQ(tok.Encode("ab a"), (std::vector<int64_t>{6, 5, 6}));
  EXPECT_EQ(tok.Encode("ab a", /*add_special_tokens=*/true), (std::vector<int64_t>{1, 6, 5, 6}));
  // "bab" -> "▁bab": no ▁+a pair, so a+b merges.
  EXPECT_EQ(tok.Encode("bab"), (std::vector<int64_t>{3, 5, 7}));
  // "é" is not in the vocabulary: its two UTF-8 bytes become <0xC3> <0xA9>.
  EXPECT_EQ(tok.Encode("\u00e9"), (std::vector<int64_t>{3, 8 + 0xC3, 8 + 0xA9}));
  EXPECT_EQ(tok.Decode(tok.Encode("ab a \u00e9")), "ab a \u00e9");
  // A run of byte tokens that is not UTF-8 decodes to U+FFFD, never throws.
  EXPECT_EQ(tok.Decode({4, 8 + 0xC3}), "a\uFFFD");
  EXPECT_EQ(tok.special_ids().bos, std::nullopt);  // no tokenizer_config.json here
}

TEST(HfTokenizerTest, WithoutByteFallbackUnknownCharactersFuseIntoOneUnk) {
  const HfTokenizer tok = FromJson(SentencePieceTokenizer(/*byte_fallback=*/false));
  EXPECT_EQ(tok.Encode("a\u00e9\u00e8b"), (std::vector<int64_t>{6, 0, 5}));
}

TEST(HfTokenizerTest, SpecialTokensOfTokenizerConfig) {
  const json config = {{"bos_token", "<s>"},
                       {"eos_token", {{"content", "</s>"}, {"lstrip", false}}},
                       {"pad_token", nullptr}};
  const HfTokenizer tok = FromJson(SentencePieceTokenizer(true), config);
  EXPECT_EQ(tok.special_ids().bos, 1);
  EXPECT_EQ(tok.special_ids().eos, 2);
  EXPECT_EQ(tok.special_ids().pad, std::nullopt);
  try {
    FromJson(SentencePieceTokenizer(true), {{"eos_token", "<|im_end|>"}});
    FAIL() << "an eos_token that is no token was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("eos_token \"<|im_end|>\""), std::string::npos) << e.what();
  }
}

TEST(HfTokenizerTest, CleanUpTokenizationSpacesFollowsTheConfig) {
  const json file = ByteLevelTokenizer();
  const auto ids = FromJson(file).Encode("a , b .");
  EXPECT_EQ(FromJson(file, {{"clean_up_tokenization_spaces", true}}).Decode(ids), "a, b.");
  EXPECT_EQ(FromJson(file, {{"clean_up_tokenization_spaces", false}}).Decode(ids), "a , b .");
}

TEST(HfTokenizerTest, FingerprintChangesWithTheVocabularyOnly) {
  const json file = ByteLevelTokenizer();
  json renamed = file;
  renamed["model"]["vocab"].erase("Ġw");
  renamed["model"]["vocab"]["Ġx"] = 259;
  renamed["model"]["merges"][3] = "Ġ x";
  json other_decoder = file;
  other_decoder["normalizer"] = nullptr;
  EXPECT_EQ(FromJson(file).fingerprint(), FromJson(file).fingerprint());
  EXPECT_NE(FromJson(file).fingerprint(), FromJson(renamed).fingerprint());
  EXPECT_EQ(FromJson(file).fingerprint(), FromJson(other_decoder).fingerprint());
  EXPECT_EQ(FromJson(file).fingerprint().size(), 16u);
}

TEST(HfTokenizerTest, MissingTokenizerJsonNamesWhatTheDirectoryHas) {
  const auto dir = std::filesystem::temp_directory_path() / "kappa_hf_tokenizer_test_dir";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.model") << "x";
  try {
    HfTokenizer::Load(dir.string());
    FAIL() << "loaded without tokenizer.json";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json: no such file"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("tokenizer.model"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(HfTokenizer::Exists(dir.string()));
  std::filesystem::remove_all(dir);
}

TEST(HfRegexTest, WhitespaceIsUnicodeWhiteSpaceAsInOniguruma) {
  const hf::Regex spaces(R"(\s+)");
  // U+0085 (NEL) is White_Space; U+FEFF and U+180E are not.
  EXPECT_EQ(spaces.FindAll("a\u0085b").size(), 1u);
  EXPECT_TRUE(spaces.FindAll("a\uFEFFb").empty());
  EXPECT_TRUE(spaces.FindAll("a\u180Eb").empty());
  const hf::Regex not_space(R"([^\s\p{L}]+)");
  EXPECT_EQ(not_space.FindAll("ab 12\u3000!").size(), 2u);
  EXPECT_THROW(hf::Regex(R"([\S])"), std::invalid_argument);
  // The look-ahead the real patterns use: trailing spaces before a word stay
  // apart from it.
  const hf::Regex lookahead(R"(\s+(?!\S)|\s+)");
  const auto spans = lookahead.FindAll("a   b");
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0], (std::pair<size_t, size_t>{1, 3}));
  EXPECT_EQ(spans[1], (std::pair<size_t, size_t>{3, 4}));
}

}  // namespace
}  // namespace kappa::model
