// RSTG teacher demonstrations end to end: a rollout worker against a fake
// learner and the REAL teacher and verifier services on loopback. The teacher
// and the student are tiny models trained here in a fraction of a second to
// answer fixed prompts, so whether the teacher is right, and whether the
// student's group is negative zero-variance, is known in advance:
//
//   prompt  student  teacher
//   3+4=    "8"      "7"
//   1+1=    "2"      "2"
#include "rollout_worker/teacher_demonstrations.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "model/tokenizer.h"
#include "rollout_worker/worker.h"
#include "services/grpc_util.h"
#include "services/server.h"
#include "tasks/answer.h"
#include "teacher_server/teacher_service.h"
#include "tests/rollout/fake_learner.h"
#include "tests/rollout/test_policy.h"
#include "verifier/verifier_service.h"

namespace kappa::rollout {
namespace {

using testing::ChunkWeights;
using testing::FakeLearner;
using testing::ReferenceLogprobs;
using testing::TinyConfig;

constexpr int kGroupSize = 4;
constexpr int kMaxNewTokens = 4;
constexpr uint64_t kWorkerSeed = 1234;
const absl::Duration kWait = absl::Seconds(20);

std::vector<int64_t> Tokens(const google::protobuf::RepeatedField<int32_t>& ids) {
  return std::vector<int64_t>(ids.begin(), ids.end());
}

std::vector<int64_t> Prompt(const std::string& text) {
  return model::CharTokenizer().Encode(text, /*add_bos=*/true);
}

std::vector<int64_t> Answer(const std::string& text) {
  return model::CharTokenizer().Encode(text, /*add_bos=*/false, /*add_eos=*/true);
}

// Memorises prompt -> answer + EOS for every pair (teacher forcing, Adam);
// then checks each answer has probability > 0.99 at temperature 1, so the
// sampled responses below are known.
model::Decoder TrainToAnswer(const std::map<std::string, std::string>& answers, uint64_t seed) {
  torch::manual_seed(seed);
  model::Decoder decoder(TinyConfig());
  std::vector<torch::Tensor> inputs, targets, masks;
  for (const auto& [prompt_text, answer_text] : answers) {
    std::vector<int64_t> sequence = Prompt(prompt_text);
    const int64_t prompt_length = static_cast<int64_t>(sequence.size());
    for (int64_t id : Answer(answer_text)) sequence.push_back(id);
    const torch::Tensor all = torch::tensor(sequence, torch::kInt64);
    const int64_t length = all.size(0) - 1;
    inputs.push_back(all.slice(0, 0, length));
    targets.push_back(all.slice(0, 1));
    masks.push_back((torch::arange(length) >= prompt_length - 1).to(torch::kFloat32));
  }
  // Every prompt here has the same length, so the batch needs no padding.
  const torch::Tensor input = torch::stack(inputs), target = torch::stack(targets),
                      mask = torch::stack(masks);
  torch::optim::Adam optimizer(decoder->parameters(), torch::optim::AdamOptions(1e-2));
  decoder->train();
  for (int step = 0; step < 150; ++step) {
    const torch::Tensor logits = decoder->forward(input);  // [B, L, V]
    const torch::Tensor nll =
        torch::nn::functional::cross_entropy(logits.flatten(0, 1), target.flatten(),
                                             torch::nn::functional::CrossEntropyFuncOptions()
                                                 .reduction(torch::kNone));
    const torch::Tensor loss = (nll * mask.flatten()).sum() / mask.sum();
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
  }
  decoder->eval();
  for (const auto& [prompt_text, answer_text] : answers) {
    const std::vector<float> logprobs =
        ReferenceLogprobs(decoder, Prompt(prompt_text), Answer(answer_text), 1.0);
    for (float logprob : logprobs) {
      EXPECT_GT(logprob, std::log(0.99f)) << prompt_text << " -> " << answer_text;
    }
  }
  return decoder;
}

class TeacherDemonstrationsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    student_ = TrainToAnswer({{"3+4=", "8"}, {"1+1=", "2"}}, 7);
    auto teacher =
        teacher::TeacherService::Create(TrainToAnswer({{"3+4=", "7"}, {"1+1=", "2"}}, 8), {});
    ASSERT_TRUE(teacher.ok()) << teacher.status();
    teacher_ = *std::move(teacher);
    verifier_ = std::make_unique<verifier::VerifierService>(verifier::VerifierOptions{});
    auto scorers = services::GrpcServer::Start("127.0.0.1:0", {teacher_.get(), verifier_.get()});
    ASSERT_TRUE(scorers.ok()) << scorers.status();
    scorers_ = *std::move(scorers);
    learner_ = std::make_unique<FakeLearner>();
    auto learner = services::GrpcServer::Start("127.0.0.1:0", {learner_.get()});
    ASSERT_TRUE(learner.ok()) << learner.status();
    learner_server_ = *std::move(learner);
    learner_->Publish(0, ChunkWeights(0, student_));
  }

  void TearDown() override {
    if (worker_) worker_->Stop();
    if (worker_thread_.joinable()) worker_thread_.join();
    if (learner_) learner_->Close();
    if (learner_server_) learner_server_->Shutdown(absl::Milliseconds(200));
    if (scorers_) scorers_->Shutdown(absl::Milliseconds(200));
    if (teacher_) teacher_->Shutdown();
  }

  std::string ScorersAddress() const {
    return "127.0.0.1:" + std::to_string(scorers_->port());
  }

  void StartWorker(const std::string& teacher_address, const WorkerOptions& base = {}) {
    WorkerOptions options = base;
    options.worker_id = "worker-under-test";
    options.max_outstanding = 8;
    options.initial_backoff = absl::Milliseconds(20);
    options.max_backoff = absl::Milliseconds(200);
    options.sampler.seed = kWorkerSeed;
    if (base.sampler.rpc_deadline == GroupSamplerOptions{}.rpc_deadline) {
      options.sampler.rpc_deadline = absl::Seconds(5);
    }
    worker_ = std::make_unique<RolloutWorker>(
        services::MakeChannel("127.0.0.1:" + std::to_string(learner_server_->port())),
        services::MakeChannel(ScorersAddress()), services::MakeChannel(teacher_address), options);
    worker_thread_ = std::thread([this] { run_status_ = worker_->Run(); });
  }

  static kappa::v1::WorkItem Item(const std::string& lease, const std::string& prompt,
                                  const std::string& reference, int demonstrations,
                                  float teacher_temperature = 1.0f) {
    kappa::v1::WorkItem item;
    item.set_lease_id(lease);
    item.set_prompt_id("p-" + lease);
    item.set_prompt_text(prompt);
    for (int64_t id : Prompt(prompt)) item.add_prompt_tokens(static_cast<int32_t>(id));
    item.set_reference_answer(reference);
    item.set_task("arithmetic");
    item.set_policy_version(0);
    item.set_group_size(kGroupSize);
    item.set_max_new_tokens(kMaxNewTokens);
    item.set_temperature(1.0f);
    item.set_top_p(1.0f);
    item.set_teacher_form(0);
    item.set_teacher_demonstrations(demonstrations);
    item.set_teacher_temperature(teacher_temperature);
    item.set_lease_deadline_unix_ms(absl::ToUnixMillis(absl::Now() + absl::Seconds(60)));
    return item;
  }

  // Sends `items`, returns their groups by lease id.
  std::map<std::string, kappa::v1::ScoredGroup> RunItems(
      const std::vector<kappa::v1::WorkItem>& items) {
    EXPECT_TRUE(learner_->WaitForHellos(1, kWait));
    learner_->SendCredit(static_cast<int32_t>(items.size()));
    for (const kappa::v1::WorkItem& item : items) learner_->SendWork(item);
    EXPECT_TRUE(learner_->WaitForGroups(items.size(), kWait));
    std::map<std::string, kappa::v1::ScoredGroup> by_lease;
    for (kappa::v1::ScoredGroup& group : learner_->groups()) {
      by_lease[group.lease_id()] = std::move(group);
    }
    return by_lease;
  }

  // What the worker must return for `item`, computed independently: the same
  // Generate request straight to the teacher, each response checked with the
  // reward function the verifier uses.
  std::vector<std::vector<int64_t>> ExpectedDemonstrations(const kappa::v1::WorkItem& item,
                                                           int* generated_correct = nullptr) {
    auto teacher = kappa::v1::Teacher::NewStub(services::MakeChannel(ScorersAddress()));
    kappa::v1::GenerateRequest request;
    *request.mutable_prompt_tokens() = item.prompt_tokens();
    request.set_num_samples(item.teacher_demonstrations());
    request.set_max_new_tokens(kMaxNewTokens);
    request.set_temperature(item.teacher_temperature());
    request.set_seed(DemonstrationSeed(kWorkerSeed, item.lease_id()));
    kappa::v1::GenerateResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const grpc::Status status = teacher->Generate(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    std::vector<std::vector<int64_t>> correct;
    for (const kappa::v1::GeneratedSample& sample : response.samples()) {
      const std::string text = model::CharTokenizer().Decode(Tokens(sample.tokens()));
      const absl::StatusOr<float> reward =
          tasks::ExactAnswerReward(item.task(), item.reference_answer(), text);
      EXPECT_TRUE(reward.ok()) << reward.status();
      if (reward.ok() && *reward == 1.0f) correct.push_back(Tokens(sample.tokens()));
    }
    if (generated_correct != nullptr) *generated_correct = static_cast<int>(correct.size());
    return correct;
  }

  static std::vector<std::vector<int64_t>> Demonstrations(const kappa::v1::ScoredGroup& group) {
    std::vector<std::vector<int64_t>> out;
    for (const kappa::v1::TeacherDemonstration& d : group.demonstrations()) {
      out.push_back(Tokens(d.response_tokens()));
    }
    return out;
  }

  static std::vector<float> Rewards(const kappa::v1::ScoredGroup& group) {
    std::vector<float> rewards;
    for (const kappa::v1::ScoredSample& sample : group.samples()) rewards.push_back(sample.reward());
    return rewards;
  }

  model::Decoder student_{nullptr};
  std::unique_ptr<teacher::TeacherService> teacher_;
  std::unique_ptr<verifier::VerifierService> verifier_;
  std::unique_ptr<services::GrpcServer> scorers_;
  std::unique_ptr<FakeLearner> learner_;
  std::unique_ptr<services::GrpcServer> learner_server_;
  std::unique_ptr<RolloutWorker> worker_;
  std::thread worker_thread_;
  absl::Status run_status_ = absl::UnknownError("not run");
};

TEST_F(TeacherDemonstrationsTest, ReturnsExactlyTheVerifiedTeacherResponses) {
  StartWorker(ScorersAddress());
  const std::vector<kappa::v1::WorkItem> items = {
      // Student wrong ("8"), teacher right ("7"): demonstrations.
      Item("teacher-right", "3+4=", "7", 4),
      // A hot teacher: some of its samples are wrong; only verified ones travel.
      Item("teacher-hot", "3+4=", "7", 8, /*teacher_temperature=*/2.5f),
      // Student wrong, teacher wrong ("7" for reference 9): asked, but none correct.
      Item("teacher-wrong", "3+4=", "9", 4),
      // Student right ("2") and the teacher would be too: GRPO has signal, no demonstrations.
      Item("student-right", "1+1=", "2", 4),
      // Negative zero-variance, teacher right, but the learner did not ask.
      Item("not-asked", "3+4=", "7", 0),
  };
  std::map<std::string, kappa::v1::ScoredGroup> groups = RunItems(items);
  ASSERT_EQ(groups.size(), items.size());
  const model::CharTokenizer tokenizer;

  // The student's rewards are what its training makes them.
  for (const char* lease : {"teacher-right", "teacher-hot", "teacher-wrong", "not-asked"}) {
    EXPECT_EQ(Rewards(groups[lease]), std::vector<float>(kGroupSize, 0.0f)) << lease;
  }
  EXPECT_EQ(Rewards(groups["student-right"]), std::vector<float>(kGroupSize, 1.0f));

  // Teacher right: at least one demonstration, exactly the verified teacher
  // samples in teacher order, each decoding to the reference answer.
  const kappa::v1::ScoredGroup& right = groups["teacher-right"];
  EXPECT_GE(right.demonstrations_size(), 1);
  EXPECT_EQ(Demonstrations(right), ExpectedDemonstrations(items[0]));
  for (const kappa::v1::TeacherDemonstration& d : right.demonstrations()) {
    EXPECT_EQ(d.response_text(), "7");
    EXPECT_EQ(tokenizer.Decode(Tokens(d.response_tokens())), "7");
    EXPECT_EQ(Tokens(d.response_tokens()), Answer("7"));
  }

  // Hot teacher: still exactly the verified subset (whatever its size).
  const kappa::v1::ScoredGroup& hot = groups["teacher-hot"];
  int hot_correct = 0;
  EXPECT_EQ(Demonstrations(hot), ExpectedDemonstrations(items[1], &hot_correct));
  // Precondition (the temperature was chosen for it: 4 of 8 here): a mix of
  // right and wrong teacher samples, so the filter inside one group is tested.
  EXPECT_GT(hot_correct, 0);
  EXPECT_LT(hot_correct, 8);
  for (const kappa::v1::TeacherDemonstration& d : hot.demonstrations()) {
    const absl::StatusOr<float> reward = tasks::ExactAnswerReward("arithmetic", "7",
                                                                  d.response_text());
    EXPECT_TRUE(reward.ok() && *reward == 1.0f) << d.response_text();
    EXPECT_EQ(d.response_text(), tokenizer.Decode(Tokens(d.response_tokens())));
    EXPECT_GT(d.response_tokens_size(), 0);
    EXPECT_LE(d.response_tokens_size(), kMaxNewTokens);
  }

  // Teacher wrong: it was asked (its samples exist) but none verified.
  EXPECT_TRUE(ExpectedDemonstrations(items[2]).empty());
  EXPECT_EQ(groups["teacher-wrong"].demonstrations_size(), 0);
  // Some reward 1: none, although the teacher would have answered correctly.
  EXPECT_FALSE(ExpectedDemonstrations(items[3]).empty());
  EXPECT_EQ(groups["student-right"].demonstrations_size(), 0);
  // Not asked: none.
  EXPECT_EQ(groups["not-asked"].demonstrations_size(), 0);
  EXPECT_EQ(learner_->protocol_errors(), 0);
}

TEST_F(TeacherDemonstrationsTest, UnreachableTeacherStillSendsTheGroupWithout) {
  // A teacher address with nothing listening: demonstrations are optional, so
  // the group goes out without them after a bounded number of attempts.
  verifier::VerifierService placeholder_service{verifier::VerifierOptions{}};
  auto placeholder = services::GrpcServer::Start("127.0.0.1:0", {&placeholder_service});
  ASSERT_TRUE(placeholder.ok()) << placeholder.status();
  const int dead_port = (*placeholder)->port();
  (*placeholder)->Shutdown(absl::Milliseconds(10));
  placeholder->reset();

  WorkerOptions options;
  options.sampler.initial_backoff = absl::Milliseconds(20);
  options.sampler.max_backoff = absl::Milliseconds(100);
  options.sampler.rpc_deadline = absl::Seconds(1);
  options.sampler.demonstration_attempts = 2;
  StartWorker("127.0.0.1:" + std::to_string(dead_port), options);
  const absl::Time start = absl::Now();
  std::map<std::string, kappa::v1::ScoredGroup> groups =
      RunItems({Item("no-teacher", "3+4=", "7", 4)});
  ASSERT_EQ(groups.count("no-teacher"), 1u);
  const kappa::v1::ScoredGroup& group = groups["no-teacher"];
  EXPECT_EQ(group.samples_size(), kGroupSize);
  EXPECT_EQ(Rewards(group), std::vector<float>(kGroupSize, 0.0f));
  EXPECT_EQ(group.demonstrations_size(), 0);
  EXPECT_LT(absl::Now() - start, absl::Seconds(8));
  EXPECT_EQ(worker_->stats().items_dropped, 0);
}

TEST(DemonstrationSeed, ReproduciblePerWorkerAndLeaseAndNeverZero) {
  EXPECT_EQ(DemonstrationSeed(1, "lease-a"), DemonstrationSeed(1, "lease-a"));
  EXPECT_NE(DemonstrationSeed(1, "lease-a"), DemonstrationSeed(1, "lease-b"));
  EXPECT_NE(DemonstrationSeed(1, "lease-a"), DemonstrationSeed(2, "lease-a"));
  EXPECT_NE(DemonstrationSeed(0, ""), 0u);
}

}  // namespace
}  // namespace kappa::rollout
