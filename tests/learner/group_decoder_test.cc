// DecodeScoredGroup on teacher demonstrations (RSTG teacher SFT) and on
// top-k teacher rows (SCORE_FORM_TOPK): what the learner accepts, and
// INVALID_ARGUMENT naming the field for everything else.
#include "learner/group_decoder.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "kappa/v1/teacher.pb.h"
#include "services/tensor_codec.h"
#include "services/torch_tensor_codec.h"

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

// ---- SCORE_FORM_TOPK ----

GroupExpectations ExpectTopk(int64_t k) {
  GroupExpectations expect = Expect(0);
  expect.teacher_form = kappa::v1::SCORE_FORM_TOPK;
  expect.teacher_top_k = k;
  return expect;
}

// Top-k rows for every sample of Group() (responses of 2 tokens): ids and
// log-probs [2, k], sample s's log-probs shifted by -0.1 s, and each row's
// tail log(1 − Σ top-k), computed in double (−inf when k is the whole row).
kappa::v1::ScoredGroup TopkGroup(const std::vector<std::vector<int64_t>>& ids,
                                 const std::vector<std::vector<float>>& logprobs) {
  kappa::v1::ScoredGroup group = Group({1.0f, 0.0f});
  const int64_t rows = static_cast<int64_t>(ids.size());
  const int64_t k = static_cast<int64_t>(ids[0].size());
  for (int s = 0; s < group.samples_size(); ++s) {
    torch::Tensor id_tensor = torch::empty({rows, k}, torch::kInt32);
    torch::Tensor values = torch::empty({rows, k}, torch::kFloat32);
    for (int64_t t = 0; t < rows; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        id_tensor[t][j] = ids[t][j];
        values[t][j] = logprobs[t][j] - 0.1f * static_cast<float>(s);
      }
    }
    services::EncodeTensor(id_tensor, group.mutable_samples(s)->mutable_teacher_topk_ids());
    services::EncodeTensor(values, group.mutable_samples(s)->mutable_teacher_logprobs());
    const torch::Tensor tail =
        (1.0 - values.to(torch::kFloat64).exp().sum(-1)).clamp_min(0.0).log().to(torch::kFloat32);
    services::EncodeTensor(tail, group.mutable_samples(s)->mutable_teacher_tail_logmass());
  }
  return group;
}

const std::vector<std::vector<int64_t>> kIds = {{5, 1, 50}, {0, 2, 33}};
const std::vector<std::vector<float>> kLogProbs = {{-0.2f, -2.0f, -3.5f}, {-0.7f, -1.0f, -4.0f}};

TEST(GroupDecoderTopk, RowsStayCompactAsIdsAndValues) {
  const absl::StatusOr<ScoredGroup> decoded =
      DecodeScoredGroup(TopkGroup(kIds, kLogProbs), ExpectTopk(3));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->samples.size(), 2u);
  for (int s = 0; s < 2; ++s) {
    const torch::Tensor& values = decoded->samples[s].teacher_logprobs;
    const torch::Tensor& ids = decoded->samples[s].teacher_topk_ids;
    // [T, k], never [T, V]: the wire's ids and values as they came.
    ASSERT_EQ(values.sizes(), (std::vector<int64_t>{2, 3}));
    ASSERT_EQ(values.scalar_type(), torch::kFloat32);
    ASSERT_EQ(ids.scalar_type(), torch::kInt64);
    for (int64_t t = 0; t < 2; ++t) {
      for (int64_t j = 0; j < 3; ++j) {
        EXPECT_EQ(ids[t][j].item<int64_t>(), kIds[t][j]) << s << " " << t << " " << j;
        EXPECT_FLOAT_EQ(values[t][j].item<float>(), kLogProbs[t][j] - 0.1f * static_cast<float>(s));
      }
    }
  }
}

TEST(GroupDecoderTopk, BfloatValuesDecodeToTheirFloat32Values) {
  // trainer.teacher_values: bf16 — the same rows on a bfloat16 wire.
  kappa::v1::ScoredGroup group = TopkGroup(kIds, kLogProbs);
  std::vector<torch::Tensor> sent;
  for (int s = 0; s < group.samples_size(); ++s) {
    kappa::v1::Tensor* values = group.mutable_samples(s)->mutable_teacher_logprobs();
    const absl::StatusOr<torch::Tensor> fp32 = services::DecodeTensor(*values, "values");
    ASSERT_TRUE(fp32.ok()) << fp32.status();
    services::EncodeTensor(*fp32, values, kappa::v1::DTYPE_BFLOAT16);
    ASSERT_EQ(values->dtype(), kappa::v1::DTYPE_BFLOAT16);
    sent.push_back(fp32->to(torch::kBFloat16).to(torch::kFloat32));
  }
  const absl::StatusOr<ScoredGroup> decoded = DecodeScoredGroup(group, ExpectTopk(3));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  for (int s = 0; s < 2; ++s) {
    const torch::Tensor& values = decoded->samples[s].teacher_logprobs;
    ASSERT_EQ(values.scalar_type(), torch::kFloat32);
    for (int64_t t = 0; t < 2; ++t) {
      EXPECT_TRUE(torch::equal(values[t], sent[s][t])) << s << " " << t;
      // Rounded, not garbled: within bfloat16's 2^-8 relative step.
      for (int64_t j = 0; j < 3; ++j) {
        const float exact = kLogProbs[t][j] - 0.1f * static_cast<float>(s);
        EXPECT_NEAR(sent[s][t][j].item<float>(), exact, std::abs(exact) / 256);
      }
    }
  }
}

TEST(GroupDecoderTopk, KPastTheVocabularyMeansTheWholeRow) {
  // A work item's k above V: the worker asks for min(k, V), every id once.
  std::vector<std::vector<int64_t>> ids(2);
  std::vector<std::vector<float>> logprobs(2);
  for (int64_t t = 0; t < 2; ++t) {
    for (int64_t v = 0; v < kVocab; ++v) {
      ids[t].push_back((v * 7 + t) % kVocab);
      logprobs[t].push_back(-std::log(static_cast<float>(kVocab)));
    }
  }
  const absl::StatusOr<ScoredGroup> decoded =
      DecodeScoredGroup(TopkGroup(ids, logprobs), ExpectTopk(100));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->samples[0].teacher_topk_ids.size(1), kVocab);
  // k = V exactly is the same request.
  EXPECT_TRUE(DecodeScoredGroup(TopkGroup(ids, logprobs), ExpectTopk(kVocab)).ok());
}

TEST(GroupDecoderTopk, WrongKIsRejected) {
  ExpectRejected(TopkGroup(kIds, kLogProbs), ExpectTopk(4), "samples[0].teacher_logprobs",
                 "shape [2, 3] does not match [2, 4] (top_k 4)");
  ExpectRejected(TopkGroup(kIds, kLogProbs), ExpectTopk(2), "samples[0].teacher_logprobs",
                 "does not match [2, 2]");
  // Log-probs of the right k, ids of another.
  kappa::v1::ScoredGroup ids_short = TopkGroup(kIds, kLogProbs);
  services::EncodeTensor(torch::zeros({2, 2}, torch::kInt32),
                         ids_short.mutable_samples(1)->mutable_teacher_topk_ids());
  ExpectRejected(ids_short, ExpectTopk(3), "samples[1].teacher_topk_ids",
                 "shape [2, 2] does not match [2, 3] (top_k 3)");
}

TEST(GroupDecoderTopk, WrongShapeIsRejected) {
  // One row per response token: three rows for two tokens.
  ExpectRejected(TopkGroup({{5, 1, 50}, {0, 2, 33}, {3, 4, 6}},
                           {{-1.f, -2.f, -3.f}, {-1.f, -2.f, -3.f}, {-1.f, -2.f, -3.f}}),
                 ExpectTopk(3), "samples[0].teacher_logprobs",
                 "shape [3, 3] does not match [2, 3]");
  kappa::v1::ScoredGroup flat = TopkGroup(kIds, kLogProbs);
  services::EncodeTensor(torch::full({2}, -1.0f),
                         flat.mutable_samples(0)->mutable_teacher_logprobs());
  ExpectRejected(flat, ExpectTopk(3), "samples[0].teacher_logprobs", "shape [2] does not match");
  // The full form where the work item asked for the top-k.
  kappa::v1::ScoredGroup full = TopkGroup(kIds, kLogProbs);
  services::EncodeTensor(torch::full({2, kVocab}, -std::log(51.0f)),
                         full.mutable_samples(1)->mutable_teacher_logprobs());
  ExpectRejected(full, ExpectTopk(3), "samples[1].teacher_logprobs",
                 "shape [2, 51] does not match [2, 3]");
}

TEST(GroupDecoderTopk, IdsMissingOrNotIntegersAreRejected) {
  kappa::v1::ScoredGroup missing = TopkGroup(kIds, kLogProbs);
  missing.mutable_samples(1)->clear_teacher_topk_ids();
  ExpectRejected(missing, ExpectTopk(3), "samples[1].teacher_topk_ids",
                 "is not an integer type (int32 or int64)");
  kappa::v1::ScoredGroup floats = TopkGroup(kIds, kLogProbs);
  services::EncodeTensor(torch::ones({2, 3}),
                         floats.mutable_samples(0)->mutable_teacher_topk_ids());
  ExpectRejected(floats, ExpectTopk(3), "samples[0].teacher_topk_ids",
                 "dtype float32 is not an integer type");
  // int64 ids are fine.
  kappa::v1::ScoredGroup wide = TopkGroup(kIds, kLogProbs);
  services::EncodeTensor(torch::tensor({5, 1, 50, 0, 2, 33}, torch::kInt64).view({2, 3}),
                         wide.mutable_samples(0)->mutable_teacher_topk_ids());
  EXPECT_TRUE(DecodeScoredGroup(wide, ExpectTopk(3)).ok());
}

TEST(GroupDecoderTopk, IdOutsideTheVocabularyIsRejected) {
  ExpectRejected(TopkGroup({{5, 1, 50}, {0, 2, 51}}, kLogProbs), ExpectTopk(3),
                 "samples[0].teacher_topk_ids[1, 2]", "token id 51 outside [0, 51)");
  ExpectRejected(TopkGroup({{5, -1, 50}, {0, 2, 33}}, kLogProbs), ExpectTopk(3),
                 "samples[0].teacher_topk_ids[0, 1]", "token id -1 outside [0, 51)");
}

TEST(GroupDecoderTopk, RepeatedIdInARowIsRejected) {
  ExpectRejected(TopkGroup({{5, 1, 50}, {33, 2, 33}}, kLogProbs), ExpectTopk(3),
                 "samples[0].teacher_topk_ids[1]", "token id 33 appears twice");
  // The same id in different rows is fine.
  EXPECT_TRUE(
      DecodeScoredGroup(TopkGroup({{5, 1, 50}, {5, 1, 50}}, kLogProbs), ExpectTopk(3)).ok());
}

TEST(GroupDecoderTopk, ValuesThatAreNoLogProbsAreRejected) {
  ExpectRejected(TopkGroup(kIds, {{-0.2f, 0.5f, -3.5f}, {-0.7f, -1.0f, -4.0f}}), ExpectTopk(3),
                 "samples[0].teacher_logprobs[0, 1]", "0.5 is not a log-probability");
  ExpectRejected(TopkGroup(kIds, {{-0.2f, -2.0f, std::nanf("")}, {-0.7f, -1.0f, -4.0f}}),
                 ExpectTopk(3), "samples[0].teacher_logprobs", "non-finite value nan");
  ExpectRejected(TopkGroup(kIds, {{-0.2f, -2.0f, -3.5f}, {-INFINITY, -1.0f, -4.0f}}),
                 ExpectTopk(3), "samples[0].teacher_logprobs", "non-finite value -inf");
  // 0 (a one-hot teacher) is a log-prob, and so is any finite negative
  // value (the rows are kept as sent; nothing is filled in beside them).
  EXPECT_TRUE(DecodeScoredGroup(TopkGroup(kIds, {{0.0f, -2.0f, -3.5f}, {0.0f, -1.0f, -4.0f}}),
                                ExpectTopk(3))
                  .ok());
  EXPECT_TRUE(DecodeScoredGroup(TopkGroup(kIds, {{-0.2f, -2.0f, -3.5f}, {-0.7f, -1.0f, -2e30f}}),
                                ExpectTopk(3))
                  .ok());
}

TEST(GroupDecoderTopk, OtherFormsAreUnchanged) {
  // A FULL work item still wants [T, V] and ignores topk_ids.
  kappa::v1::ScoredGroup group = TopkGroup(kIds, kLogProbs);
  GroupExpectations full = Expect(0);
  full.teacher_form = kappa::v1::SCORE_FORM_FULL;
  ExpectRejected(group, full, "samples[0].teacher_logprobs", "teacher vocabulary size 3");
}

}  // namespace
}  // namespace kappa::learner
