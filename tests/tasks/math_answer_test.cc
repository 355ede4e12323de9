// The math grader (tasks/math_answer.h): every row of
// tests/tasks/math_grader_cases.jsonl (cases from Math-Verify, verl's gsm8k and
// math_dapo rewards, Hendrycks' MATH and DeepScaleR, with kappa's expected
// reward), then the pieces one by one and the "math"/"math_strict" families.
#include "tasks/math_answer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "tasks/answer.h"

namespace kappa::tasks {
namespace {

std::string Show(const std::optional<std::string>& text) {
  return text.has_value() ? "'" + *text + "'" : "none";
}

TEST(MathGraderCasesTest, EveryRowGetsItsExpectedReward) {
  const std::string path = std::string(KAPPA_SOURCE_DIR) + "/tests/tasks/math_grader_cases.jsonl";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot open " << path;
  int rows = 0;
  int passed = 0;
  for (std::string line; std::getline(in, line);) {
    ++rows;
    const nlohmann::json row = nlohmann::json::parse(line);
    const std::string response = row.at("response").get<std::string>();
    const std::string answer = row.at("answer").get<std::string>();
    const bool strict = row.at("strict").get<bool>();
    const float expected = row.at("expected").get<float>();
    // The verifier's path: the task family picks the grader.
    const absl::StatusOr<float> reward =
        ExactAnswerReward(strict ? kMathStrictTask : kMathTask, answer, response);
    if (reward.ok() && *reward == expected) {
      ++passed;
      continue;
    }
    const std::optional<std::string> got = ExtractMathAnswer(response, strict);
    ADD_FAILURE() << path << " row " << rows << ": rule " << row.at("rule").get<std::string>()
                  << ", source " << row.at("source").get<std::string>() << "\n  expected "
                  << expected << ", got "
                  << (reward.ok() ? std::to_string(*reward) : reward.status().ToString())
                  << "\n  extracted " << Show(got) << " -> "
                  << Show(got ? std::optional(NormalizeMathAnswer(*got)) : std::nullopt)
                  << "\n  reference -> '" << NormalizeMathAnswer(MathReferenceAnswer(answer))
                  << "'";
  }
  EXPECT_GE(rows, 80);
  std::cout << passed << " of " << rows << " rows pass\n";
}

TEST(LastBoxedAnswerTest, Boxes) {
  EXPECT_EQ(LastBoxedAnswer("so $\\boxed{\\frac{\\sqrt{3}}{2}}$."), "\\frac{\\sqrt{3}}{2}");
  EXPECT_EQ(LastBoxedAnswer("\\boxed{1} then \\fbox{2}"), "2");
  EXPECT_EQ(LastBoxedAnswer("\\boxed {7}"), "7");
  EXPECT_EQ(LastBoxedAnswer("$\\boxed 5$ and more"), "5");
  EXPECT_EQ(LastBoxedAnswer("\\boxed 5"), "5");
  EXPECT_EQ(LastBoxedAnswer("\\boxed{}"), "");
  // \{ and \} are characters, not braces.
  EXPECT_EQ(LastBoxedAnswer("\\boxed{\\{1\\}}"), "\\{1\\}");
  EXPECT_EQ(LastBoxedAnswer("\\boxed{[0,1\\}}"), "[0,1\\}");
  // The last box decides: unclosed means no box, not the earlier one.
  EXPECT_EQ(LastBoxedAnswer("\\boxed{3} and \\boxed{4"), std::nullopt);
  EXPECT_EQ(LastBoxedAnswer("no box"), std::nullopt);
  EXPECT_EQ(LastBoxedAnswer("\\boxedstyle{3}"), std::nullopt);
  EXPECT_EQ(LastBoxedAnswer("ends with \\boxed"), std::nullopt);
}

TEST(LastNumberTest, Numbers) {
  EXPECT_EQ(LastNumber("it is 18."), "18");
  EXPECT_EQ(LastNumber("ends at -7 degrees"), "-7");
  EXPECT_EQ(LastNumber("16 - 3 = 13"), "13");
  EXPECT_EQ(LastNumber("costs 3.50 dollars"), "3.50");
  EXPECT_EQ(LastNumber("value $.9x$"), ".9");
  EXPECT_EQ(LastNumber("1,000.99 euro"), "1,000.99");
  EXPECT_EQ(LastNumber("14{,}916 is it"), "14{,}916");
  EXPECT_EQ(LastNumber("11,\\! 111,\\! 100"), "11,\\! 111,\\! 100");
  EXPECT_EQ(LastNumber("1,22"), "22");      // not a group of three
  EXPECT_EQ(LastNumber("32, 349"), "349");  // a comma and a space is a list
  EXPECT_EQ(LastNumber("1234,567"), "567");
  EXPECT_EQ(LastNumber("no digits"), std::nullopt);
  EXPECT_EQ(LastNumber(""), std::nullopt);
}

TEST(ExtractMathAnswerTest, BoxThenHashesThenLastNumber) {
  EXPECT_EQ(ExtractMathAnswer("$\\boxed{5}$\n#### 6 and 7", false), "5");
  EXPECT_EQ(ExtractMathAnswer("#### 5\nthen\n#### 6 apples\n7 steps", false), "6 apples");
  EXPECT_EQ(ExtractMathAnswer("3 and 4.", false), "4");
  EXPECT_EQ(ExtractMathAnswer("\\boxed{42", false), "42");
  EXPECT_EQ(ExtractMathAnswer("nothing", false), std::nullopt);
  // Strict: the box or nothing.
  EXPECT_EQ(ExtractMathAnswer("$\\boxed{5}$ in 3 steps", true), "5");
  EXPECT_EQ(ExtractMathAnswer("#### 42", true), std::nullopt);
  EXPECT_EQ(ExtractMathAnswer("42", true), std::nullopt);
  EXPECT_EQ(ExtractMathAnswer("\\boxed{42", true), std::nullopt);
}

TEST(MathReferenceAnswerTest, CutAtTheLastHashes) {
  EXPECT_EQ(MathReferenceAnswer("48/2 = 24\n#### 72 "), "72");
  EXPECT_EQ(MathReferenceAnswer("#### 1\n#### 2"), "2");
  EXPECT_EQ(MathReferenceAnswer(" \\frac{1}{2} "), "\\frac{1}{2}");
}

TEST(NormalizeMathAnswerTest, Steps) {
  const std::pair<const char*, const char*> cases[] = {
      {" $\\$10$ ", "10"},
      {"\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"},
      {"x \\leftarrow y", "x\\leftarrowy"},
      {"\\dfrac{1}{2}+\\tfrac{1}{3}", "\\frac{1}{2}+\\frac{1}{3}"},
      {"28\\%", "28"},
      {"100%", "100"},
      {"90^\\circ", "90"},
      {"90^{\\circ}", "90"},
      {"10\\text{ units}", "10"},
      {"10\\text{ cm}^2", "10"},
      {"5 \\text{ dollars} ", "5"},
      {"10\\text{cm}", "10cm"},  // no space: not a unit, just unwrapped
      {"6 \\text{ and } 8", "6and8"},
      {"\\text{(A)}", "(A)"},
      {"\\text{13}", "13"},
      {"14{,}916", "14916"},
      {"11,\\! 111,\\! 100", "11111100"},
      {"-1,234,567.5", "-1234567.5"},
      {"1,22", "1,22"},
      {"32, 349", "32,349"},
      {"(1, 2)", "(1,2)"},
      {"\\frac34i", "\\frac{3}{4}i"},
      {"\\frac3{4}", "\\frac{3}{4}"},
      {"\\frac{3}4", "\\frac{3}{4}"},
      {"\\frac 1 {72}", "\\frac{1}{72}"},
      {"10\\sqrt3", "10\\sqrt{3}"},
      {"\\sqrt[3]{2}", "\\sqrt[3]{2}"},
      {"\\frac{\\sqrt3}{2}", "\\frac{\\sqrt{3}}{2}"},
      {"$ $", ""},
  };
  for (const auto& [raw, normalized] : cases) {
    EXPECT_EQ(NormalizeMathAnswer(raw), normalized) << "'" << raw << "'";
  }
}

TEST(ParseExactNumberTest, ExactRationals) {
  const Rational half{false, 1, 2};
  for (const char* text : {"0.5", ".5", "0.50", "1/2", "2/4", "\\frac{1}{2}", "\\frac{0.5}{1}",
                           "-\\frac{-1}{2}", "\\frac{1.5}{3}"}) {
    EXPECT_EQ(ParseExactNumber(text), half) << text;
  }
  const Rational minus_half{true, 1, 2};
  for (const char* text : {"-0.5", "-1/2", "-\\frac{1}{2}", "\\frac{-1}{2}", "\\frac{1}{-2}"}) {
    EXPECT_EQ(ParseExactNumber(text), minus_half) << text;
  }
  EXPECT_EQ(ParseExactNumber("004"), (Rational{false, 4, 1}));
  EXPECT_EQ(ParseExactNumber("5."), (Rational{false, 5, 1}));
  EXPECT_EQ(ParseExactNumber("-0"), (Rational{false, 0, 1}));
  EXPECT_EQ(ParseExactNumber("0.333"), (Rational{false, 333, 1000}));
  // The 64-bit bound: 2^64 - 1 fits, 2^64 does not; trailing zeros after the
  // point do not count.
  EXPECT_EQ(ParseExactNumber("18446744073709551615"), (Rational{false, UINT64_MAX, 1}));
  EXPECT_EQ(ParseExactNumber("18446744073709551616"), std::nullopt);
  EXPECT_EQ(ParseExactNumber("5.000000000000000000000000"), (Rational{false, 5, 1}));
  EXPECT_EQ(ParseExactNumber("0.00000000000000000001"), std::nullopt);
  for (const char* text : {"", "-", ".", "1/0", "\\frac{1}{0}", "1.2.3", "1/2/3", "--5", "+5",
                           "1,000", "\\frac{x}{2}", "\\frac{1}{2}x", "x", "1e5", "\\sqrt{4}"}) {
    EXPECT_EQ(ParseExactNumber(text), std::nullopt) << text;
  }
}

TEST(MathAnswersEqualTest, NumbersThenStrings) {
  EXPECT_TRUE(MathAnswersEqual("\\dfrac{3}{4}", "0.75"));
  EXPECT_TRUE(MathAnswersEqual("\\frac{2}{4}", "1/2"));
  EXPECT_TRUE(MathAnswersEqual("1000.0", "1,000"));
  EXPECT_FALSE(MathAnswersEqual("\\frac13", "0.333"));
  EXPECT_TRUE(MathAnswersEqual("(1, 2)", "(1,2)"));
  EXPECT_FALSE(MathAnswersEqual("(2, 1)", "(1,2)"));
  EXPECT_FALSE(MathAnswersEqual("E", "e"));  // case matters
  EXPECT_FALSE(MathAnswersEqual("", ""));
  EXPECT_FALSE(MathAnswersEqual("$$", "$"));
  // Beyond the bound, a number compares as a string.
  EXPECT_TRUE(MathAnswersEqual("123456789012345678901234567890", "123456789012345678901234567890"));
  EXPECT_FALSE(
      MathAnswersEqual("123456789012345678901234567890", "123456789012345678901234567890.0"));
}

TEST(AssignedValueTest, OneLetterOneEquals) {
  EXPECT_EQ(AssignedValue("x=2"), "2");
  EXPECT_EQ(AssignedValue("k=\\frac{1}{3}"), "\\frac{1}{3}");
  EXPECT_EQ(AssignedValue("D=(0,1.5)"), "(0,1.5)");
  for (const char* unchanged :
       {"x=2,y=3", "x==2", "2x=4", "x_1=2", "xy=2", "x=", "=2", "x<=2", "x:=2", "2", ""}) {
    EXPECT_EQ(AssignedValue(unchanged), std::string_view(unchanged));
  }
}

TEST(MathRewardTest, OnlyTheResponsesAssignmentIsStripped) {
  EXPECT_EQ(MathReward("2", "\\boxed{x = 2}", true), 1.0f);
  EXPECT_EQ(MathReward("2", "\\boxed{\\text{x} = 2}", true), 1.0f);    // unwrapped first
  EXPECT_EQ(MathReward("0.5", "#### x = \\frac{1}{2}", false), 1.0f);  // any extracted answer
  EXPECT_EQ(MathReward("x=2", "\\boxed{x = 2}", true), 1.0f);          // an equation against one
  EXPECT_EQ(MathReward("x=2", "\\boxed{2}", true), 0.0f);              // the reference keeps its x=
  EXPECT_EQ(MathReward("2", "\\boxed{x=2, y=3}", true), 0.0f);
  // Symmetric MathAnswersEqual does not strip.
  EXPECT_FALSE(MathAnswersEqual("x=2", "2"));
}

TEST(MathRewardTest, LongNestedAnswersAreCheap) {
  // 50,000 nested \frac in one box: linear time, no recursion.
  std::string nested;
  for (int i = 0; i < 50000; ++i) nested += "\\frac{1}{";
  nested += "2" + std::string(50000, '}');
  const std::string response = "so \\boxed{" + nested + "}";
  EXPECT_EQ(LastBoxedAnswer(response), nested);
  EXPECT_EQ(MathReward(nested, response, true), 1.0f);
  EXPECT_EQ(MathReward("1", response, false), 0.0f);
}

TEST(MathTaskTest, ValidateTaskAndReference) {
  EXPECT_TRUE(ValidateTask("math").ok());
  EXPECT_TRUE(ValidateTask("math_strict").ok());
  EXPECT_EQ(ValidateTask("Math").code(), absl::StatusCode::kInvalidArgument);
  for (const char* reference : {"\\frac{1}{2}", "x^2+1", "#### 72", "Natalia ... \n#### 72"}) {
    EXPECT_TRUE(ValidateReference("math", reference).ok()) << reference;
    EXPECT_TRUE(ValidateReference("math_strict", reference).ok()) << reference;
  }
  for (const char* reference : {"", "  ", "$ $", "#### ", "12\n####"}) {
    const absl::Status status = ValidateReference("math", reference);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << "'" << reference << "'";
    EXPECT_NE(status.message().find("has no math answer"), std::string::npos) << status;
  }
}

TEST(MathTaskTest, ExactAnswerRewardDispatches) {
  EXPECT_EQ(ExactAnswerReward("math", "\\frac{1}{2}", "so \\boxed{0.5}").value(), 1.0f);
  EXPECT_EQ(ExactAnswerReward("math", "42", "The answer is 42.").value(), 1.0f);
  EXPECT_EQ(ExactAnswerReward("math_strict", "42", "The answer is 42.").value(), 0.0f);
  EXPECT_EQ(ExactAnswerReward("math_strict", "42", "The answer is \\boxed{42}.").value(), 1.0f);
  EXPECT_EQ(ExactAnswerReward("math", "", "42").status().code(),
            absl::StatusCode::kInvalidArgument);
  // Arithmetic is unchanged: the last token, an integer.
  EXPECT_EQ(ExactAnswerReward("arithmetic", "42", "\\boxed{42}").value(), 0.0f);
  EXPECT_EQ(ExactAnswerReward("arithmetic", "42", "42.").value(), 0.0f);
  EXPECT_EQ(ExactAnswerReward("arithmetic", "0.5", "0.5").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kappa::tasks
