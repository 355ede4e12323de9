// DecodeScoredGroup on teacher demonstrations (RSTG teacher SFT): what the
// learner accepts, and INVALID_ARGUMENT naming the field for everything else.
#include "learner/group_decoder.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "services/tensor_codec.h"

namespace kappa::learner {
namespace {

constexpr int kVocab = 51;
constexpr int kMaxNewTokens = 6;

GroupExpectations Expect(int64_t demonstrations) {
  GroupExpectations expect;
  expect.group_size = 2;
  expect.vocab_size = kVocab;
  expect.max_new_tokens = kMaxNewTokens;
  expect.teacher_demonstrations = demonstrations;
  return expect;
}

// A valid negative zero-variance group of two samples.
kappa::v1::ScoredGroup Group(const std::vector<float>& rewards = {0.0f, 0.0f}) {
  kappa::v1::ScoredGroup group;
  group.set_lease_id("lease");
  group.set_policy_version(3);
  for (int token : {1, 10, 20}) group.add_prompt_tokens(token);
  for (float reward : rewards) {
    kappa::v1::ScoredSample* sample = group.add_samples();
    for (int token : {11, 2}) sample->add_response_tokens(token);
    const std::vector<float> logprobs = {-0.5f, -1.5f};
    services::SetFloat32(sample->mutable_behavior_logprobs(), {2}, logprobs.data());
    sample->set_reward(reward);
  }
  return group;
}

void AddDemonstration(kappa::v1::ScoredGroup& group, const std::vector<int>& tokens) {
  kappa::v1::TeacherDemonstration* demonstration = group.add_demonstrations();
  for (int token : tokens) demonstration->add_response_tokens(token);
  demonstration->set_response_text("7");
}

// The status must be INVALID_ARGUMENT with a message starting with `field`.
void ExpectRejected(const kappa::v1::ScoredGroup& group, const GroupExpectations& expect,
                    const std::string& field, const std::string& detail) {
  const absl::StatusOr<ScoredGroup> decoded = DecodeScoredGroup(group, expect);
  ASSERT_FALSE(decoded.ok()) << "accepted; expected an error on " << field;
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument) << decoded.status();
  const std::string message(decoded.status().message());
  EXPECT_EQ(message.rfind(field + ":", 0), 0u) << message;
  EXPECT_NE(message.find(detail), std::string::npos) << message;
}

TEST(GroupDecoderDemonstrations, ValidDemonstrationsDecodeInOrder) {
  kappa::v1::ScoredGroup group = Group();
  AddDemonstration(group, {17, 2});
  AddDemonstration(group, {3, 4, 5, 6, 7, 2});  // exactly max_new_tokens
  const absl::StatusOr<ScoredGroup> decoded = DecodeScoredGroup(group, Expect(4));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->teacher_demonstrations.size(), 2u);
  EXPECT_EQ(decoded->teacher_demonstrations[0], (std::vector<int64_t>{17, 2}));
  EXPECT_EQ(decoded->teacher_demonstrations[1], (std::vector<int64_t>{3, 4, 5, 6, 7, 2}));
  EXPECT_EQ(decoded->samples.size(), 2u);
  EXPECT_EQ(decoded->prompt_tokens, (std::vector<int64_t>{1, 10, 20}));
}

TEST(GroupDecoderDemonstrations, NoneGivenIsFineWhetherOrNotAsked) {
  for (int64_t asked : {0, 4}) {
    for (const std::vector<float>& rewards :
         {std::vector<float>{0, 0}, std::vector<float>{1, 0}}) {
      const absl::StatusOr<ScoredGroup> decoded = DecodeScoredGroup(Group(rewards), Expect(asked));
      ASSERT_TRUE(decoded.ok()) << decoded.status();
      EXPECT_TRUE(decoded->teacher_demonstrations.empty());
    }
  }
}

TEST(GroupDecoderDemonstrations, EmptyResponseIsRejected) {
  kappa::v1::ScoredGroup group = Group();
  AddDemonstration(group, {17, 2});
  AddDemonstration(group, {});
  ExpectRejected(group, Expect(4), "demonstrations[1].response_tokens", "empty");
}

TEST(GroupDecoderDemonstrations, TokenOutsideTheVocabularyIsRejected) {
  kappa::v1::ScoredGroup group = Group();
  AddDemonstration(group, {17, 2});
  AddDemonstration(group, {3, 4, 5, 99, 2});
  ExpectRejected(group, Expect(4), "demonstrations[1].response_tokens[3]",
                 "token id 99 outside [0, 51)");

  kappa::v1::ScoredGroup negative = Group();
  AddDemonstration(negative, {-1, 2});
  ExpectRejected(negative, Expect(4), "demonstrations[0].response_tokens[0]", "token id -1");

  kappa::v1::ScoredGroup vocab_edge = Group();
  AddDemonstration(vocab_edge, {kVocab, 2});
  ExpectRejected(vocab_edge, Expect(4), "demonstrations[0].response_tokens[0]",
                 "token id 51 outside");
}

TEST(GroupDecoderDemonstrations, LongerThanMaxNewTokensIsRejected) {
  kappa::v1::ScoredGroup group = Group();
  AddDemonstration(group, {3, 4, 5, 6, 7, 8, 2});
  ExpectRejected(group, Expect(4), "demonstrations[0].response_tokens",
                 "length 7 exceeds max_new_tokens 6");
}

TEST(GroupDecoderDemonstrations, RejectedWhenTheWorkItemAskedForNone) {
  kappa::v1::ScoredGroup group = Group();
  AddDemonstration(group, {17, 2});
  ExpectRejected(group, Expect(0), "demonstrations", "asked for none");
}

TEST(GroupDecoderDemonstrations, RejectedWhenAnySampleHasReward) {
  kappa::v1::ScoredGroup group = Group({0.0f, 1.0f});
  AddDemonstration(group, {17, 2});
  ExpectRejected(group, Expect(4), "demonstrations", "samples[1].reward is 1");
}

TEST(GroupDecoderDemonstrations, MoreThanKIsRejected) {
  kappa::v1::ScoredGroup group = Group();
  for (int i = 0; i < 3; ++i) AddDemonstration(group, {17, 2});
  ExpectRejected(group, Expect(2), "demonstrations", "3 given, the work item asked for at most 2");
  EXPECT_TRUE(DecodeScoredGroup(group, Expect(3)).ok());
}

TEST(GroupDecoderDemonstrations, SampleFieldsStillReportedByName) {
  // The shared response check keeps the samples' messages as they were.
  kappa::v1::ScoredGroup group = Group();
  group.mutable_samples(1)->set_response_tokens(0, 77);
  ExpectRejected(group, Expect(0), "samples[1].response_tokens[0]", "token id 77");
  kappa::v1::ScoredGroup empty = Group();
  empty.mutable_samples(0)->clear_response_tokens();
  ExpectRejected(empty, Expect(0), "samples[0].response_tokens", "empty");
}

}  // namespace
}  // namespace kappa::learner
