#include "tasks/answer.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

namespace kappa::tasks {
namespace {

struct ParseCase {
  const char* response;
  std::optional<std::string> expected;
};

TEST(ParseFinalAnswerTest, Table) {
  const ParseCase cases[] = {
      {"46", "46"},
      {" 46 ", "46"},
      {"046", "46"},
      {"+46", "46"},
      {"-46", "-46"},
      {"-046", "-46"},
      {"-0", "0"},
      {"+0", "0"},
      {"000", "0"},
      {"4 6", "6"},  // the last whitespace-separated token is the answer
      {"the answer is\t12\n", "12"},
      {"12 abc", std::nullopt},
      {"abc", std::nullopt},
      {"", std::nullopt},
      {"   ", std::nullopt},
      {"12a", std::nullopt},
      {"a12", std::nullopt},
      {"4.6", std::nullopt},
      {"46.", std::nullopt},
      {"1,000", std::nullopt},
      {"+", std::nullopt},
      {"-", std::nullopt},
      {"--4", std::nullopt},
      {"+-4", std::nullopt},
      {"4-", std::nullopt},
      {"123456789012345678901234567890", "123456789012345678901234567890"},
      {"-000123456789012345678901234567890", "-123456789012345678901234567890"},
  };
  for (const ParseCase& c : cases) {
    EXPECT_EQ(ParseFinalAnswer(c.response), c.expected) << "response '" << c.response << "'";
  }
}

struct RewardCase {
  const char* reference;
  const char* response;
  float expected;
};

TEST(ExactAnswerRewardTest, Table) {
  const RewardCase cases[] = {
      {"46", "46", 1.0f},
      {"46", " 46 ", 1.0f},
      {"46", "046", 1.0f},
      {"46", "+46", 1.0f},
      {"46", "45", 0.0f},
      {"46", "-46", 0.0f},
      {"-46", "-46", 1.0f},
      {"0", "-0", 1.0f},
      {"-0", "0", 1.0f},
      {"6", "4 6", 1.0f},
      {"46", "4 6", 0.0f},
      {"46", "abc", 0.0f},
      {"46", "", 0.0f},
      {"12", "12a", 0.0f},
      {" 7 ", "7", 1.0f},  // surrounding whitespace of the reference is ignored
      {"123456789012345678901234567890", "123456789012345678901234567890", 1.0f},
      {"123456789012345678901234567890", "123456789012345678901234567891", 0.0f},
      // Not equal modulo 2^64: no overflow anywhere.
      {"18446744073709551616", "0", 0.0f},
  };
  for (const RewardCase& c : cases) {
    absl::StatusOr<float> reward = ExactAnswerReward("arithmetic", c.reference, c.response);
    ASSERT_TRUE(reward.ok()) << reward.status();
    EXPECT_EQ(*reward, c.expected) << "reference '" << c.reference << "' response '"
                                   << c.response << "'";
  }
}

TEST(ExactAnswerRewardTest, EmptyTaskMeansArithmetic) {
  absl::StatusOr<float> reward = ExactAnswerReward("", "5", "5");
  ASSERT_TRUE(reward.ok()) << reward.status();
  EXPECT_EQ(*reward, 1.0f);
}

TEST(ExactAnswerRewardTest, RejectsUnknownTask) {
  absl::StatusOr<float> reward = ExactAnswerReward("poetry", "5", "5");
  EXPECT_EQ(reward.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(reward.status().message().find("unknown task 'poetry'"), std::string::npos)
      << reward.status();
}

TEST(ExactAnswerRewardTest, RejectsInvalidReference) {
  for (const char* reference : {"", "abc", "4 6", "4.5", "+", "12a"}) {
    absl::StatusOr<float> reward = ExactAnswerReward("arithmetic", reference, "5");
    EXPECT_EQ(reward.status().code(), absl::StatusCode::kInvalidArgument)
        << "reference '" << reference << "'";
  }
}

TEST(ValidateReferenceTest, AcceptsIntegers) {
  for (const char* reference : {"0", "-3", "+3", "007", " 12\n"}) {
    EXPECT_TRUE(ValidateReference("arithmetic", reference).ok()) << reference;
  }
}

}  // namespace
}  // namespace kappa::tasks
