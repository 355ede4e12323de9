// Held-out accuracy, the number every run's verdict rests on: the learner's
// periodic eval (TrainerLoop::EvaluateHeldOut, every trainer.eval_every
// steps) and `kappa sft` score the student with DatasetCorrectness /
// DatasetAccuracy: greedy decoding, then the verifier's exact-answer reward
// (tasks::ExactAnswerReward). Here on a policy whose greedy output is fixed
// by construction and a hand-built set where exactly 5 of 11 answers are
// right under that grader, so the accuracy must be 5/11 exactly.
#include "learner/dataset_accuracy.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "learner/algo/evaluate.h"
#include "learner/coordinator.h"
#include "learner/policy_publisher.h"
#include "learner/prompt_encoder.h"
#include "learner/trainer_loop.h"
#include "model/tokenizer.h"
#include "model/transformer.h"
#include "tasks/vector_dataset.h"

namespace kappa::learner {
namespace {

// A decoder whose next token depends on the current one alone, by the
// table `next` (every other character is followed by EOS): every attention
// and MLP output projection is zero, so the last hidden state is the
// embedding of the current token, here one-hot, and lm_head maps it.
model::Decoder BigramPolicy(const model::CharTokenizer& chars, const std::map<char, char>& next) {
  model::ModelConfig c;
  c.vocab_size = chars.vocab_size();
  c.hidden_size = 64;
  c.intermediate_size = 16;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 32;
  c.eos_token_ids = {model::CharTokenizer::kEos};
  model::Decoder m(c);
  torch::NoGradGuard no_grad;
  for (auto& item : m->named_parameters()) {
    item.value().fill_(item.key().find("norm") != std::string::npos ? 1.0 : 0.0);
  }
  m->named_parameters()["model.embed_tokens.weight"].copy_(torch::eye(c.vocab_size, c.hidden_size));
  torch::Tensor w = m->lm_head()->weight;  // [V, D]: logit of v = w[v] · e_current
  for (int64_t id = 0; id < c.vocab_size; ++id) w[model::CharTokenizer::kEos][id] = 1.0;
  for (const auto& [from, to] : next) {
    const int64_t a = chars.Encode(std::string(1, from))[0];
    const int64_t b = chars.Encode(std::string(1, to))[0];
    w[model::CharTokenizer::kEos][a] = 0.0;
    w[b][a] = 1.0;
  }
  return m;
}

tasks::Example Arithmetic(std::string prompt, std::string answer) {
  tasks::Example e;
  e.id = prompt;
  e.prompt = std::move(prompt);
  e.answer = std::move(answer);
  return e;
}

TEST(DatasetAccuracyTest, AFixedPolicyScoresExactlyTheAnswersTheGraderAccepts) {
  const model::CharTokenizer chars;
  // After "=" the policy says "12"; after "= " (a trailing space) it says "7".
  model::Decoder policy = BigramPolicy(chars, {{'=', '1'}, {'1', '2'}, {' ', '7'}});
  const PromptEncoder prompts = PromptEncoder::Character();

  std::vector<tasks::Example> examples = {
      Arithmetic("5+7=", "12"),    // "12": right
      Arithmetic("3+4= ", "7"),    // "7": right
      Arithmetic("9+4=", "13"),    // "12": wrong
      Arithmetic("6+6=", "012"),   // "12": right (compared as integers)
      Arithmetic("2+5= ", "12"),   // "7": wrong
      Arithmetic("1+1=", "-12"),   // "12": wrong
      Arithmetic("0+7= ", "+7"),   // "7": right (a '+' sign is ignored)
      Arithmetic("8+4=", "120"),   // "12": wrong
      Arithmetic("9+9=", "21"),    // "12": wrong
      Arithmetic("7+5=", "12.0"),  // "12": right under its own family, math (exact rationals)
      Arithmetic("3+3=", "1"),     // "12": wrong
  };
  examples[9].task = "math";
  const std::vector<bool> want = {true, true,  false, true, false, false,
                                  true, false, false, true, false};
  const tasks::VectorDataset heldout(examples);

  // The policy is what the table says: greedy responses "12" and "7", then EOS.
  std::vector<std::vector<int64_t>> ids;
  for (const tasks::Example& e : examples) ids.push_back(*prompts.Encode(e));
  std::vector<std::string> responses(examples.size());
  GreedyAccuracy(policy, ids, 6, [&](size_t i, const std::vector<int64_t>& response) {
    responses[i] = prompts.DecodeResponse(response);
    EXPECT_EQ(response.back(), model::CharTokenizer::kEos) << "example " << i;
    return false;
  });
  for (size_t i = 0; i < examples.size(); ++i) {
    const bool space = examples[i].prompt.back() == ' ';
    EXPECT_EQ(responses[i], space ? "7" : "12") << "example " << i;
  }

  EXPECT_EQ(DatasetCorrectness(policy, prompts, heldout, examples.size(), 6), want);
  EXPECT_DOUBLE_EQ(DatasetAccuracy(policy, prompts, heldout, examples.size(), 6), 5.0 / 11.0);
  // The first `count` examples only, and `count` clamped to the set.
  EXPECT_DOUBLE_EQ(DatasetAccuracy(policy, prompts, heldout, 4, 6), 3.0 / 4.0);
  EXPECT_EQ(DatasetCorrectness(policy, prompts, heldout, 4, 6),
            std::vector<bool>(want.begin(), want.begin() + 4));
  EXPECT_DOUBLE_EQ(DatasetAccuracy(policy, prompts, heldout, 1000, 6), 5.0 / 11.0);
  // No example (trainer.eval_examples: 0): no verdict and accuracy 0, not a throw.
  EXPECT_TRUE(DatasetCorrectness(policy, prompts, heldout, 0, 6).empty());
  EXPECT_DOUBLE_EQ(DatasetAccuracy(policy, prompts, heldout, 0, 6), 0.0);
  // A budget of one token cuts "12" to "1": only the "1" and "7" answers hold.
  EXPECT_EQ(DatasetCorrectness(policy, prompts, heldout, examples.size(), 1),
            (std::vector<bool>{false, true, false, false, false, false, true, false, false, false,
                               true}));
}

// TrainerLoop::Create validates the step, gate, balance and alarm settings
// up front: a bad one is refused by key before anything is created or
// published; a good one gives a loop ready to Run.
TEST(TrainerLoopTest, CreateRefusesABadSettingByKeyBeforeAnythingRuns) {
  const model::CharTokenizer chars;
  const PromptEncoder prompts = PromptEncoder::Character();
  const tasks::VectorDataset heldout({Arithmetic("5+7=", "12")});
  Coordinator coordinator(heldout.size(), /*seed=*/1, /*data_position=*/0, CoordinatorOptions{});
  PolicyPublisher publisher;
  const std::string run_dir =
      (std::filesystem::path(::testing::TempDir()) / "trainer_loop_create").string();
  std::filesystem::remove_all(run_dir);
  auto create = [&](const services::Config& config) {
    model::Decoder student = BigramPolicy(chars, {});
    auto optimizer = std::make_unique<PolicyOptimizer>(student, 1e-3, 0.0, 1.0);
    return TrainerLoop::Create(config, run_dir, student, std::move(optimizer), TrainerState{},
                               &coordinator, &publisher, heldout, prompts, /*vocab_limit=*/0);
  };
  services::Config bad_balance;
  bad_balance.trainer.kappa_target = 0;
  services::Config bad_alarm;
  bad_alarm.alarms.ema_alpha = 0;
  for (const auto& [config, key] :
       {std::pair{bad_balance, "trainer.kappa_target"}, std::pair{bad_alarm, "ema_alpha"}}) {
    const absl::StatusOr<std::unique_ptr<TrainerLoop>> loop = create(config);
    ASSERT_FALSE(loop.ok()) << key;
    EXPECT_EQ(loop.status().code(), absl::StatusCode::kInvalidArgument) << loop.status();
    EXPECT_NE(loop.status().message().find(key), absl::string_view::npos) << loop.status();
  }
  EXPECT_FALSE(std::filesystem::exists(run_dir + "/checkpoints"));

  const absl::StatusOr<std::unique_ptr<TrainerLoop>> loop = create(services::Config{});
  ASSERT_TRUE(loop.ok()) << loop.status();
  EXPECT_TRUE(std::filesystem::exists(run_dir + "/checkpoints"));
  EXPECT_EQ(publisher.version(), -1) << "Create publishes nothing; Run does";
}

}  // namespace
}  // namespace kappa::learner
