// `kappa grade`: the binary prints the reward of every line of the math
// grader's case table (tests/tasks/math_grader_cases.jsonl: its extra members
// are ignored) as the table expects, grades "exact" as the arithmetic task and
// "task" by each line's own family, refuses "code", and stops at a bad line
// naming it after printing every earlier line.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/integration/cli_test_util.h"

namespace kappa::cli {
namespace {

using Result = testing::LinesResult;

Result Grade(std::vector<std::string> args, const std::string& input) {
  args.insert(args.begin(), "grade");
  return testing::RunKappaWithInput(args, input);
}

std::string Line(const std::string& response, const std::string& answer) {
  return nlohmann::json{{"response", response}, {"answer", answer}}.dump() + "\n";
}

TEST(GradeCommandTest, MathRewardsMatchTheCaseTable) {
  // The table's rows, split by strictness: one `kappa grade` run each.
  std::ifstream table(std::string(KAPPA_SOURCE_DIR) + "/tests/tasks/math_grader_cases.jsonl");
  ASSERT_TRUE(table);
  std::string input[2];
  std::vector<std::string> expected[2];
  for (std::string line; std::getline(table, line);) {
    const nlohmann::json row = nlohmann::json::parse(line);
    const int strict = row.at("strict").get<bool>() ? 1 : 0;
    input[strict] += line + "\n";
    expected[strict].push_back(std::to_string(row.at("expected").get<int>()));
  }
  ASSERT_GE(expected[0].size() + expected[1].size(), 80u);
  for (int strict : {0, 1}) {
    const Result result = Grade({"--reward", strict ? "math_strict" : "math"}, input[strict]);
    EXPECT_EQ(result.exit_code, 0) << result.errors;
    EXPECT_EQ(result.lines, expected[strict]) << (strict ? "math_strict" : "math");
  }
}

TEST(GradeCommandTest, ExactIsTheArithmeticReward) {
  const std::string input = Line("so 7 * 6 = 042", "42") + Line("\\boxed{42}", "42") +
                            Line("42.", "42") + Line("-0", "0");
  const Result result = Grade({"--reward=exact"}, input);
  EXPECT_EQ(result.exit_code, 0) << result.errors;
  EXPECT_EQ(result.lines, (std::vector<std::string>{"1", "0", "0", "1"}));
  // The same lines as math.
  const Result math = Grade({"--reward", "math"}, input);
  EXPECT_EQ(math.lines, (std::vector<std::string>{"1", "1", "1", "1"})) << math.errors;
}

std::string TaskLine(const std::string& response, const std::string& answer,
                     const std::string& task) {
  return nlohmann::json{{"response", response}, {"answer", answer}, {"task", task}}.dump() + "\n";
}

TEST(GradeCommandTest, TaskGradesEachLineByItsOwnFamily) {
  // verifier.reward's names: "task" (or empty) is the verifier's default.
  const std::string input = TaskLine("\\boxed{x=2}", "2", "math") + Line("\\boxed{2}", "2") +
                            TaskLine("so 2", "2", "arithmetic") +
                            TaskLine("the answer is 2", "2", "math_strict") +
                            TaskLine("#### 72", "Natalia ... #### 72", "math");
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"--reward", "task"}, {"--reward="}}) {
    const Result result = Grade(args, input);
    EXPECT_EQ(result.exit_code, 0) << result.errors;
    EXPECT_EQ(result.lines, (std::vector<std::string>{"1", "0", "1", "0", "1"}));
  }
  // A fixed reward ignores the member.
  const Result math = Grade({"--reward", "math"}, input);
  EXPECT_EQ(math.lines, (std::vector<std::string>{"1", "1", "1", "1", "1"})) << math.errors;
}

TEST(GradeCommandTest, CodeIsRefused) {
  const Result result = Grade({"--reward", "code"}, Line("5", "5"));
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_TRUE(result.lines.empty());
  EXPECT_NE(result.errors.find("kappa grade: reward 'code' runs Python tests in the verifier's "
                               "code sandbox, which kappa grade does not"),
            std::string::npos)
      << result.errors;
}

TEST(GradeCommandTest, BadLineStopsWithItsNumber) {
  struct Case {
    std::string reward, bad_line, message;
  };
  const Case cases[] = {
      {"math", "not json\n", "stdin line 2: "},
      {"math", "[1]\n", "stdin line 2: expected a JSON object"},
      {"math",
       R"({"response": "5"})"
       "\n",
       "stdin line 2: missing \"answer\""},
      {"math",
       R"({"response": 5, "answer": "5"})"
       "\n",
       "stdin line 2: \"response\" must be a string, got number"},
      {"math", Line("5", "#### "), "stdin line 2: \"answer\": '#### ' has no math answer"},
      {"exact", Line("5", "0.5"), "stdin line 2: \"answer\": '0.5' is not an integer answer"},
      {"task", TaskLine("5", "5", "chess"), "stdin line 2: \"task\": unknown task 'chess'"},
      {"task", TaskLine("5", "5", "code"),
       "stdin line 2: \"task\": code runs Python tests in the verifier's code sandbox"},
      {"task", TaskLine("5", "0.5", ""),
       "stdin line 2: \"answer\": '0.5' is not an integer answer"},
      {"task",
       R"({"response": "5", "answer": "5", "task": 1})"
       "\n",
       "stdin line 2: \"task\" must be a string, got number"},
  };
  for (const Case& c : cases) {
    const Result result =
        Grade({"--reward", c.reward}, Line("5", "5") + c.bad_line + Line("5", "5"));
    EXPECT_EQ(result.exit_code, 1) << c.bad_line;
    EXPECT_EQ(result.lines, std::vector<std::string>{"1"}) << c.bad_line;
    EXPECT_NE(result.errors.find("kappa grade: " + c.message), std::string::npos)
        << c.bad_line << " -> " << result.errors;
  }
}

TEST(GradeCommandTest, BadArguments) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {}, {"--reward"}, {"--reward", "maths"}, {"--reward", "math", "extra"}, {"--strict"}}) {
    const Result result = Grade(args, Line("5", "5"));
    EXPECT_EQ(result.exit_code, 2) << result.errors;
    EXPECT_TRUE(result.lines.empty());
    EXPECT_NE(result.errors.find("usage: kappa grade --reward"), std::string::npos)
        << result.errors;
  }
  EXPECT_NE(Grade({"--reward", "maths"}, "")
                .errors.find("unknown reward 'maths' (known: \"\" or task, exact, math, "
                             "math_strict, code)"),
            std::string::npos);
}

}  // namespace
}  // namespace kappa::cli
