// `kappa tokenize` and `kappa detokenize` on real tokenizer files (the
// hf_tokenizers fixture): what they print is transformers.js's answer for the
// same strings (the hf_tokenizer_reference fixture), a bad line stops with its
// line number after every earlier line was printed, and a directory without
// tokenizer.json is refused naming the file.
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
struct Result {
  int exit_code = -1;
  std::vector<std::string> lines;  // stdout
  std::string errors;              // stderr
};

Result RunWithInput(const std::vector<std::string>& args, const std::string& input) {
  const std::string dir = testing::MakeTempDir("kappa_cli_tok");
  testing::WriteFile(dir + "/in", input);
  std::string command = testing::ShellQuote(KAPPA_BIN);
  for (const std::string& arg : args) command += " " + testing::ShellQuote(arg);
  command += " <" + dir + "/in >" + dir + "/out 2>" + dir + "/err";
  Result result;
  const int status = std::system(command.c_str());
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream out(dir + "/out");
  for (std::string line; std::getline(out, line);) result.lines.push_back(line);
  std::ifstream err(dir + "/err");
  result.errors.assign(std::istreambuf_iterator<char>(err), std::istreambuf_iterator<char>());
  std::filesystem::remove_all(dir);
  return result;
}

// The first `n` corpus strings and their transformers.js answers.
std::vector<Json> FirstLines(const std::string& path, size_t n) {
  std::ifstream in(path);
  std::vector<Json> lines;
  for (std::string line; lines.size() < n && std::getline(in, line);) lines.push_back(Json::parse(line));
  return lines;
}

TEST(CliTokenizerCommands, TokenizeAndDetokenizeGiveTheReferenceAnswers) {
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

TEST(CliTokenizerCommands, ABadLineStopsAfterTheLinesBeforeIt) {
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

TEST(CliTokenizerCommands, MissingTokenizerAndBadArgumentsAreNamed) {
  const Result missing = RunWithInput({"tokenize", "/nonexistent/model"}, "\"x\"\n");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.errors.find("/nonexistent/model/tokenizer.json: no such file"), std::string::npos)
      << missing.errors;
  const Result bad_flag = RunWithInput({"tokenize", Tokenizer("qwen3"), "--bogus"}, "");
  EXPECT_EQ(bad_flag.exit_code, 2);
  EXPECT_NE(bad_flag.errors.find("--bogus"), std::string::npos) << bad_flag.errors;
}

}  // namespace
}  // namespace kappa::cli
