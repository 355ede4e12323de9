// `kappa tokenize`, `kappa detokenize` and `kappa render-prompt` on real
// tokenizer files (the hf_tokenizers fixture): what tokenize/detokenize print
// is transformers.js's answer for the same strings (the hf_tokenizer_reference
// fixture); render-prompt prints the models' published prompt formats (the
// template engine itself is checked against jinja2 in tests/tasks); a bad
// line stops with its line number after every earlier line was printed, and
// a directory without tokenizer.json or chat template is refused naming it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/integration/cli_test_util.h"

namespace kappa::cli {
namespace {

using Json = nlohmann::json;

std::string Tokenizer(const std::string& name) {
  return std::string(KAPPA_HF_TOKENIZERS) + "/" + name;
}

// Runs kappa with `input` on stdin; output is stdout only (stderr apart).
using Result = testing::LinesResult;

Result RunWithInput(const std::vector<std::string>& args, const std::string& input) {
  return testing::RunKappaWithInput(args, input);
}

// The first `n` corpus strings and their transformers.js answers.
std::vector<Json> FirstLines(const std::string& path, size_t n) {
  std::ifstream in(path);
  std::vector<Json> lines;
  for (std::string line; lines.size() < n && std::getline(in, line);) lines.push_back(Json::parse(line));
  return lines;
}

TEST(CliTextCommands, TokenizeAndDetokenizeGiveTheReferenceAnswers) {
  for (const std::string name : {"qwen3", "llama2"}) {
    const auto corpus = FirstLines(Tokenizer(name) + "/corpus.jsonl", 300);
    const auto reference = FirstLines(Tokenizer(name) + "/reference.jsonl", 300);
    ASSERT_EQ(corpus.size(), 300u);
    std::string strings, id_lists;
    for (size_t i = 0; i < corpus.size(); ++i) {
      strings += corpus[i].dump() + "\n";
      id_lists += reference[i]["ids"].dump() + "\n";
    }
    const Result plain = RunWithInput({"tokenize", Tokenizer(name)}, strings);
    const Result special = RunWithInput({"tokenize", Tokenizer(name), "--add-special-tokens"}, strings);
    const Result text = RunWithInput({"detokenize", Tokenizer(name)}, id_lists);
    const Result skip = RunWithInput({"detokenize", Tokenizer(name), "--skip-special-tokens"}, id_lists);
    for (const Result* r : {&plain, &special, &text, &skip}) {
      ASSERT_EQ(r->exit_code, 0) << r->errors;
      ASSERT_EQ(r->lines.size(), corpus.size()) << r->errors;
    }
    for (size_t i = 0; i < corpus.size(); ++i) {
      EXPECT_EQ(Json::parse(plain.lines[i]), reference[i]["ids"]) << name << " " << corpus[i].dump();
      EXPECT_EQ(Json::parse(special.lines[i]), reference[i]["ids_with_special"]) << name << " " << i;
      EXPECT_EQ(Json::parse(text.lines[i]), reference[i]["decoded"]) << name << " " << i;
      EXPECT_EQ(Json::parse(skip.lines[i]), reference[i]["decoded_skip_special"]) << name << " " << i;
    }
  }
}

TEST(CliTextCommands, ABadLineStopsAfterTheLinesBeforeIt) {
  const Result result =
      RunWithInput({"tokenize", Tokenizer("qwen2_5")}, "\"one\"\n\"two\"\n42\n\"four\"\n");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.lines.size(), 2u);
  EXPECT_NE(result.errors.find("stdin line 3: expected a JSON string"), std::string::npos) << result.errors;

  const Result not_json = RunWithInput({"detokenize", Tokenizer("qwen2_5")}, "[1, 2]\n[3,\n");
  EXPECT_EQ(not_json.exit_code, 1);
  EXPECT_EQ(not_json.lines.size(), 1u);
  EXPECT_NE(not_json.errors.find("stdin line 2"), std::string::npos) << not_json.errors;

  const Result unknown_id = RunWithInput({"detokenize", Tokenizer("qwen2_5")}, "[9999999]\n");
  EXPECT_EQ(unknown_id.exit_code, 1);
  EXPECT_NE(unknown_id.errors.find("id 9999999"), std::string::npos) << unknown_id.errors;
}

TEST(CliTextCommands, MissingTokenizerAndBadArgumentsAreNamed) {
  const Result missing = RunWithInput({"tokenize", "/nonexistent/model"}, "\"x\"\n");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.errors.find("/nonexistent/model/tokenizer.json: no such file"), std::string::npos)
      << missing.errors;
  const Result bad_flag = RunWithInput({"tokenize", Tokenizer("qwen3"), "--bogus"}, "");
  EXPECT_EQ(bad_flag.exit_code, 2);
  EXPECT_NE(bad_flag.errors.find("--bogus"), std::string::npos) << bad_flag.errors;
}

TEST(CliTextCommands, RenderPromptPrintsTheModelsChatFormat) {
  const std::string messages =
      R"([{"role": "user", "content": "What is 2+3?"}])" "\n"
      R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])" "\n";
  const Result qwen25 = RunWithInput({"render-prompt", Tokenizer("qwen2_5")}, messages);
  ASSERT_EQ(qwen25.exit_code, 0) << qwen25.errors;
  ASSERT_EQ(qwen25.lines.size(), 2u);
  // Qwen2.5-Instruct's format, with its default system message when none is given.
  EXPECT_EQ(Json::parse(qwen25.lines[0]),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(Json::parse(qwen25.lines[1]),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");

  const Result no_generation = RunWithInput(
      {"render-prompt", Tokenizer("qwen2_5"), "--no-generation-prompt"}, messages);
  ASSERT_EQ(no_generation.exit_code, 0) << no_generation.errors;
  EXPECT_EQ(Json::parse(no_generation.lines[1]),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  // Llama 3's original template appends the assistant header unconditionally.
  const Result llama3 = RunWithInput({"render-prompt", Tokenizer("llama3")}, messages);
  ASSERT_EQ(llama3.exit_code, 0) << llama3.errors;
  EXPECT_EQ(Json::parse(llama3.lines[0]),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+3?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");

  // Qwen3 with thinking off: an empty think block opens the answer.
  const Result no_thinking = RunWithInput(
      {"render-prompt", Tokenizer("qwen3"), "--context", R"({"enable_thinking": false})"}, messages);
  ASSERT_EQ(no_thinking.exit_code, 0) << no_thinking.errors;
  EXPECT_EQ(Json::parse(no_thinking.lines[0]),
            "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(CliTextCommands, RenderPromptRefusalsNameTheLineOrTheDirectory) {
  const Result bad_message = RunWithInput(
      {"render-prompt", Tokenizer("qwen2_5")},
      "[{\"role\": \"user\", \"content\": \"ok\"}]\n[{\"role\": \"user\"}]\n");
  EXPECT_EQ(bad_message.exit_code, 1);
  EXPECT_EQ(bad_message.lines.size(), 1u);
  EXPECT_NE(bad_message.errors.find("stdin line 2: message 0 must be"), std::string::npos)
      << bad_message.errors;
  // The SentencePiece fixture is a base model's tokenizer: no chat template.
  const Result no_template = RunWithInput({"render-prompt", Tokenizer("llama2")}, "[]\n");
  EXPECT_EQ(no_template.exit_code, 1);
  EXPECT_NE(no_template.errors.find("no chat template"), std::string::npos) << no_template.errors;
}

}  // namespace
}  // namespace kappa::cli
