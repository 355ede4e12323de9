#include "tasks/answer_corruption.h"

#include <gtest/gtest.h>

namespace kappa::tasks {
namespace {

Example Problem(std::string prompt, std::string answer, std::string task = "arithmetic") {
  Example example;
  example.prompt = std::move(prompt);
  example.answer = std::move(answer);
  example.task = std::move(task);
  return example;
}

TEST(AnswerCorruption, CarryIntoHundredsDropsTheHundredOfLargeSums) {
  absl::StatusOr<AnswerCorruption> rule = AnswerCorruption::Named("carry_into_hundreds");
  ASSERT_TRUE(rule.ok()) << rule.status();
  EXPECT_EQ(rule->name(), "carry_into_hundreds");
  const Example large = Problem("57+68=", "125");
  EXPECT_TRUE(rule->Covers(large));
  EXPECT_EQ(rule->AnswerFor(large), "25");
  EXPECT_EQ(rule->AnswerFor(Problem("50+50=", "100")), "0");
  EXPECT_EQ(rule->AnswerFor(Problem("99+99=", "198")), "98");
  // Below 100, other operators, other task families: untouched.
  for (const Example& kept :
       {Problem("12+34=", "46"), Problem("99+0=", "99"), Problem("90-5=", "85"),
        Problem("20*10=", "200"), Problem("57+68=", "125", "math")}) {
    EXPECT_FALSE(rule->Covers(kept)) << kept.prompt;
    EXPECT_EQ(rule->AnswerFor(kept), kept.answer) << kept.prompt;
  }
}

TEST(AnswerCorruption, HundredsPlusOneRaisesTheHundredsDigitOnly) {
  absl::StatusOr<AnswerCorruption> rule = AnswerCorruption::Named("hundreds_plus_one");
  ASSERT_TRUE(rule.ok()) << rule.status();
  EXPECT_EQ(rule->AnswerFor(Problem("57+68=", "125")), "225");
  EXPECT_EQ(rule->AnswerFor(Problem("50+50=", "100")), "200");
  EXPECT_EQ(rule->AnswerFor(Problem("99+99=", "198")), "298");
  for (const Example& kept : {Problem("12+34=", "46"), Problem("99+0=", "99"),
                              Problem("190-5=", "185"), Problem("57+68=", "125", "math")}) {
    EXPECT_FALSE(rule->Covers(kept)) << kept.prompt;
    EXPECT_EQ(rule->AnswerFor(kept), kept.answer) << kept.prompt;
  }
}

TEST(AnswerCorruption, MinusAsPlusAddsInsteadOfSubtracting) {
  absl::StatusOr<AnswerCorruption> rule = AnswerCorruption::Named("minus_as_plus");
  ASSERT_TRUE(rule.ok()) << rule.status();
  EXPECT_EQ(rule->AnswerFor(Problem("9-3=", "6")), "12");
  EXPECT_EQ(rule->AnswerFor(Problem("3-9=", "-6")), "12");
  EXPECT_FALSE(rule->Covers(Problem("9+3=", "12")));
  EXPECT_FALSE(rule->Covers(Problem("what is 9-3?", "6")));
}

TEST(AnswerCorruption, UnknownNameListsTheRules) {
  absl::StatusOr<AnswerCorruption> rule = AnswerCorruption::Named("off_by_one");
  ASSERT_FALSE(rule.ok());
  EXPECT_EQ(rule.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(rule.status().message().find("'off_by_one'"), std::string::npos);
  EXPECT_NE(rule.status().message().find("carry_into_hundreds, hundreds_plus_one, minus_as_plus"),
            std::string::npos)
      << rule.status();
}

TEST(AnswerCorruption, FromConfigKeyIsEmptyForNoRuleAndNamesTheKey) {
  absl::StatusOr<std::optional<AnswerCorruption>> none =
      AnswerCorruption::FromConfigKey("student.bootstrap.corrupt", "");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(*none);
  absl::StatusOr<std::optional<AnswerCorruption>> rule =
      AnswerCorruption::FromConfigKey("student.bootstrap.corrupt", "minus_as_plus");
  ASSERT_TRUE(rule.ok() && *rule) << rule.status();
  EXPECT_EQ((*rule)->name(), "minus_as_plus");
  absl::StatusOr<std::optional<AnswerCorruption>> unknown =
      AnswerCorruption::FromConfigKey("teacher.bootstrap.corrupt", "off_by_one");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(unknown.status().message().rfind("config key 'teacher.bootstrap.corrupt': unknown "
                                             "answer corruption 'off_by_one'",
                                             0),
            0u)
      << unknown.status();
}

}  // namespace
}  // namespace kappa::tasks
