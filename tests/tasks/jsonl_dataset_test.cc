#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "services/config.h"
#include "tasks/dataset.h"
#include "tasks/from_config.h"

namespace kappa::tasks {
namespace {

class JsonlDatasetTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& contents) {
    path_ = ::testing::TempDir() + "/jsonl_dataset_test_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".jsonl";
    std::ofstream(path_) << contents;
    return path_;
  }
  void TearDown() override { std::remove(path_.c_str()); }

  absl::Status LoadError(const std::string& contents) {
    return LoadJsonlDataset(Write(contents)).status();
  }

  std::string path_;
};

TEST_F(JsonlDatasetTest, LoadsExamplesAndSkipsBlankLines) {
  const std::string path = Write(
      "{\"prompt\": \"1+2=\", \"answer\": \"3\"}\n"
      "\n"
      "   \n"
      "{\"prompt\": \"5-9=\", \"answer\": \"-4\", \"id\": \"custom\", \"task\": \"arithmetic\"}\n"
      "{\"prompt\": \"2*2=\", \"answer\": \"4\"}");  // no trailing newline
  auto dataset = LoadJsonlDataset(path);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  ASSERT_EQ((*dataset)->size(), 3u);
  EXPECT_EQ((*dataset)->at(0).id, "jsonl-0");
  EXPECT_EQ((*dataset)->at(0).prompt, "1+2=");
  EXPECT_EQ((*dataset)->at(0).answer, "3");
  EXPECT_EQ((*dataset)->at(0).task, "arithmetic");
  EXPECT_EQ((*dataset)->at(1).id, "custom");
  EXPECT_EQ((*dataset)->at(1).answer, "-4");
  EXPECT_EQ((*dataset)->at(2).id, "jsonl-2");
}

// Code lines (the answer is Python tests) load only for the verifier
// (JsonlOptions::code_tasks); the learner's loader refuses them as any
// unknown task, naming the line, and empty tests are refused either way.
TEST_F(JsonlDatasetTest, CodeLinesLoadOnlyWhenAskedFor) {
  const std::string path = Write(
      "{\"prompt\": \"1+2=\", \"answer\": \"3\"}\n"
      "{\"prompt\": \"write add\", \"answer\": \"assert add(1, 2) == 3\", \"id\": \"add\","
      " \"task\": \"code\"}\n");
  const absl::Status refused = LoadJsonlDataset(path).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find(":2:"), std::string::npos) << refused;
  EXPECT_NE(refused.message().find("code"), std::string::npos) << refused;
  JsonlOptions options;
  options.code_tasks = true;
  auto dataset = LoadJsonlDataset(path, options);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  ASSERT_EQ((*dataset)->size(), 2u);
  EXPECT_EQ((*dataset)->at(1).id, "add");
  EXPECT_EQ((*dataset)->at(1).task, "code");
  EXPECT_EQ((*dataset)->at(1).answer, "assert add(1, 2) == 3");
  EXPECT_EQ((*dataset)->at(0).task, "arithmetic");
  const absl::Status empty =
      LoadJsonlDataset(Write("{\"prompt\": \"p\", \"answer\": \"  \", \"task\": \"code\"}\n"),
                       options)
          .status();
  EXPECT_NE(empty.message().find("code tests are empty"), std::string::npos) << empty;
}

TEST_F(JsonlDatasetTest, ErrorsNameFileAndLine) {
  struct Case {
    std::string contents;
    std::string expected;
  };
  const std::string ok = "{\"prompt\": \"1+1=\", \"answer\": \"2\"}\n";
  const Case cases[] = {
      {ok + "\n{not json\n", ":3: not valid JSON"},
      {ok + "[1, 2]\n", ":2: expected a JSON object, got array"},
      {"{\"answer\": \"2\"}\n", ":1: missing \"prompt\""},
      {ok + ok + "{\"prompt\": \"x\"}\n", ":3: missing \"answer\""},
      {"{\"prompt\": \"1+1=\", \"answer\": 2}\n", ":1: \"answer\" must be a string, got number"},
      {"{\"prompt\": \"1+1=\", \"answer\": \"two\"}\n", ":1: \"answer\": 'two' is not an integer"},
      {"{\"prompt\": \"a\", \"answer\": \"2\", \"task\": \"chess\"}\n",
       ":1: \"answer\": unknown task 'chess'"},
      {"{\"prompt\": \"a\", \"answer\": \"2\", \"id\": \"x\"}\n"
       "{\"prompt\": \"b\", \"answer\": \"3\", \"id\": \"x\"}\n",
       ":2: duplicate id 'x'"},
  };
  for (const Case& c : cases) {
    const absl::Status status = LoadError(c.contents);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.contents;
    EXPECT_EQ(std::string(status.message()).rfind(path_ + c.expected, 0), 0u)
        << "got: " << status << "\nexpected prefix: " << path_ + c.expected;
  }
}

// Two lines of GSM8K's train split, as the dataset ships them.
const char kGsm8k[] =
    R"({"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?", "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"})"
    "\n"
    R"({"question": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?", "answer": "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = $<<0.2*50=10>>10.\n#### 10"})"
    "\n";

void ExpectGsm8k(const Dataset& dataset) {
  ASSERT_EQ(dataset.size(), 2u);
  EXPECT_EQ(dataset.at(0).id, "jsonl-0");
  EXPECT_EQ(dataset.at(0).prompt.rfind("Natalia sold clips", 0), 0u);
  // The whole solution: the math grader cuts it after its last "####".
  EXPECT_EQ(dataset.at(0).answer.substr(dataset.at(0).answer.size() - 8), "\n#### 72");
  EXPECT_EQ(dataset.at(0).task, "math");
  EXPECT_EQ(dataset.at(1).prompt.rfind("Weng earns", 0), 0u);
  EXPECT_EQ(dataset.at(1).task, "math");
  EXPECT_EQ(dataset.skipped_lines(), 0u);
}

TEST_F(JsonlDatasetTest, Gsm8kLayoutByKeys) {
  JsonlOptions options;
  options.prompt_key = "question";
  options.answer_key = "answer";
  options.family = "math";
  auto dataset = LoadJsonlDataset(Write(kGsm8k), options);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  ExpectGsm8k(**dataset);
}

TEST_F(JsonlDatasetTest, Gsm8kLayoutByPreset) {
  JsonlOptions options;
  options.format = "gsm8k";
  auto dataset = LoadJsonlDataset(Write(kGsm8k), options);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  ExpectGsm8k(**dataset);
}

TEST_F(JsonlDatasetTest, Gsm8kKeysWithoutAFamilyAreArithmetic) {
  // The default family stays arithmetic, whose reference is one integer.
  JsonlOptions options;
  options.prompt_key = "question";
  const absl::Status status = LoadJsonlDataset(Write(kGsm8k), options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(status.message()).rfind(path_ + ":1: \"answer\": ", 0), 0u) << status;
}

TEST_F(JsonlDatasetTest, MathLayoutByPresetUsesTheLastBox) {
  JsonlOptions options;
  options.format = "math";
  const std::string path = Write(
      R"({"problem": "What is $\\frac{1}{2} + \\frac{1}{4}$?", "solution": "We get $\\frac{2}{4} + \\frac{1}{4} = \\boxed{\\frac{3}{4}}$.", "level": "Level 1", "type": "Prealgebra"})"
      "\n"
      R"({"problem": "Compute $2^3$.", "solution": "First \\boxed{6}? No: $2^3 = \\boxed{8}$.", "task": "math_strict", "id": "p2"})"
      "\n");
  auto dataset = LoadJsonlDataset(path, options);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  ASSERT_EQ((*dataset)->size(), 2u);
  EXPECT_EQ((*dataset)->at(0).prompt, "What is $\\frac{1}{2} + \\frac{1}{4}$?");
  EXPECT_EQ((*dataset)->at(0).answer, "\\frac{3}{4}");
  EXPECT_EQ((*dataset)->at(0).task, "math");
  EXPECT_EQ((*dataset)->at(1).answer, "8");
  EXPECT_EQ((*dataset)->at(1).task, "math_strict");  // the line's own family wins
  EXPECT_EQ((*dataset)->at(1).id, "p2");
}

TEST_F(JsonlDatasetTest, PresetKeepsKeysThatWereSet) {
  JsonlOptions options;
  options.format = "math";
  options.prompt_key = "query";
  auto dataset = LoadJsonlDataset(Write(R"({"query": "q", "solution": "so \\boxed{5}"})"
                                        "\n"),
                                  options);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ((*dataset)->at(0).prompt, "q");
  EXPECT_EQ((*dataset)->at(0).answer, "5");
}

TEST_F(JsonlDatasetTest, MessagesKey) {
  JsonlOptions options;
  options.messages_key = "messages";
  options.family = "math";
  const std::string path = Write(
      R"({"messages": [{"role": "system", "content": "Reason step by step."}, {"role": "user", "content": "1+1?"}], "answer": "2"})"
      "\n"
      R"({"messages": [{"role": "user", "content": "first"}, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "3*3?"}], "answer": "9", "system": "Be brief."})"
      "\n");
  auto dataset = LoadJsonlDataset(path, options);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  ASSERT_EQ((*dataset)->size(), 2u);
  EXPECT_EQ((*dataset)->at(0).prompt, "1+1?");
  EXPECT_EQ((*dataset)->at(0).system, "Reason step by step.");
  EXPECT_EQ((*dataset)->at(0).task, "math");
  EXPECT_EQ((*dataset)->at(1).prompt, "3*3?");       // the last user message
  EXPECT_EQ((*dataset)->at(1).system, "Be brief.");  // no system message: the line's "system"
}

TEST_F(JsonlDatasetTest, MappedErrorsNameFileAndLine) {
  struct Case {
    JsonlOptions options;
    std::string contents;
    std::string expected;
  };
  JsonlOptions gsm8k;
  gsm8k.format = "gsm8k";
  JsonlOptions math;
  math.format = "math";
  JsonlOptions messages;
  messages.messages_key = "messages";
  const std::string ok = "{\"question\": \"q\", \"answer\": \"#### 1\"}\n";
  const Case cases[] = {
      {gsm8k, ok + "{\"prompt\": \"q\", \"answer\": \"#### 2\"}\n", ":2: missing \"question\""},
      {gsm8k, "{\"question\": \"q\"}\n", ":1: missing \"answer\""},
      {gsm8k, ok + ok + "{\"question\": \"q\", \"answer\": \"#### \"}\n",
       ":3: \"answer\": '#### ' has no math answer"},
      {math, "{\"problem\": \"p\", \"solution\": \"it is 4\"}\n",
       ":1: \"solution\" has no \\boxed{} answer"},
      {math, "{\"problem\": \"p\", \"solution\": \"\\\\boxed{}\"}\n",
       ":1: \"solution\": '' has no math answer"},
      {messages, "{\"messages\": \"hi\", \"answer\": \"1\"}\n",
       ":1: \"messages\" must be a list of messages, got string"},
      {messages,
       "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}], \"answer\": \"1\"}\n",
       ":1: \"messages\" has no user message"},
      {messages, "{\"messages\": [{\"role\": \"user\"}], \"answer\": \"1\"}\n",
       ":1: \"messages\"[0]: missing \"content\""},
  };
  for (const Case& c : cases) {
    const absl::Status status = LoadJsonlDataset(Write(c.contents), c.options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.contents;
    EXPECT_EQ(std::string(status.message()).rfind(path_ + c.expected, 0), 0u)
        << "got: " << status << "\nexpected prefix: " << path_ + c.expected;
  }
}

TEST_F(JsonlDatasetTest, SkipBadLinesSkipsAndCounts) {
  JsonlOptions options;
  options.format = "gsm8k";
  options.skip_bad_lines = true;
  const std::string path = Write(
      "{\"question\": \"a\", \"answer\": \"#### 1\"}\n"
      "{not json\n"
      "\n"
      "{\"question\": \"b\"}\n"
      "{\"question\": \"c\", \"answer\": \"#### 3\", \"id\": \"jsonl-0\"}\n"
      "{\"question\": \"d\", \"answer\": \"#### 4\"}\n");
  auto dataset = LoadJsonlDataset(path, options);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  ASSERT_EQ((*dataset)->size(), 2u);
  EXPECT_EQ((*dataset)->at(0).prompt, "a");
  EXPECT_EQ((*dataset)->at(1).prompt, "d");
  EXPECT_EQ((*dataset)->skipped_lines(), 3u);  // bad JSON, no answer, duplicate id
  EXPECT_EQ((*dataset)->first_skipped_error(), path + ":2: not valid JSON");

  // Without the option the first bad line stops the load.
  options.skip_bad_lines = false;
  const absl::Status status = LoadJsonlDataset(path, options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(status.message()), path + ":2: not valid JSON");
}

TEST_F(JsonlDatasetTest, SkipBadLinesRefusesAFileOfOnlyBadLines) {
  JsonlOptions options;
  options.skip_bad_lines = true;
  const std::string path = Write("{\"question\": \"a\", \"answer\": \"1\"}\n[]\n");
  const absl::Status status = LoadJsonlDataset(path, options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(status.message()).find("every non-blank line (2) is malformed"),
            std::string::npos)
      << status;
  EXPECT_NE(std::string(status.message()).find(path + ":1: missing \"prompt\""), std::string::npos)
      << status;
}

TEST_F(JsonlDatasetTest, InvalidOptions) {
  JsonlOptions options;
  options.format = "aime";
  EXPECT_EQ(std::string(ValidateJsonlOptions(options).message()),
            "format: unknown format 'aime' (expected gsm8k or math)");
  EXPECT_EQ(LoadJsonlDataset(Write(""), options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = JsonlOptions();
  options.family = "code";
  EXPECT_EQ(std::string(ValidateJsonlOptions(options).message()).rfind("family: unknown task", 0),
            0u);
  options = JsonlOptions();
  options.answer_key = "";
  EXPECT_EQ(std::string(ValidateJsonlOptions(options).message()), "answer_key: empty");
  EXPECT_TRUE(ValidateJsonlOptions(JsonlOptions()).ok());
}

TEST_F(JsonlDatasetTest, MakeDatasetMapsTheTaskKeys) {
  services::Config config;
  config.task.kind = services::TaskKind::kJsonl;
  config.task.train_path = Write(std::string(kGsm8k) + "{\"question\": 3}\n");
  config.task.format = "gsm8k";
  config.task.skip_bad_lines = true;
  auto dataset = MakeDataset(config, Split::kTrain);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ((*dataset)->size(), 2u);
  EXPECT_EQ((*dataset)->skipped_lines(), 1u);
  EXPECT_EQ((*dataset)->at(1).task, "math");

  config.task.format = "gsm9k";
  EXPECT_EQ(std::string(MakeDataset(config, Split::kTrain).status().message()),
            "task.format: unknown format 'gsm9k' (expected gsm8k or math)");
}

TEST_F(JsonlDatasetTest, MakeDatasetMapsTheArithmeticHeldOutDraw) {
  services::Config config;
  config.task.train_size = 40;
  config.task.heldout_size = 10;
  config.task.heldout_draw = services::HeldOutDraw::kInterleaved;
  auto first = MakeDataset(config, Split::kHeldOut);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ((*first)->size(), 10u);
  // (A value other than first and interleaved is refused when the
  // configuration loads: services_config_test.)
}

TEST_F(JsonlDatasetTest, MissingFileIsNotFound) {
  EXPECT_EQ(LoadJsonlDataset("/nonexistent/kappa.jsonl").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kappa::tasks
