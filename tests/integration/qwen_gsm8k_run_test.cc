// configs/qwen2.5-gsm8k.yaml, the one-GPU GSM8K config, on the CPU with tiny
// Qwen2 models in place of Qwen2.5-0.5B/7B: embeddings of the real
// vocabulary sizes (151,936 tied rows for the student, 152,064 untied for the
// teacher; hidden size 32, one layer), the real Qwen3 tokenizer and chat
// template, and a GSM8K-layout JSONL (tests/integration/fixtures). Both are
// random but for a few rows that make them guess small numbers (MakeGuesser),
// so that the student's groups have reward variance and the teacher's top-k
// rows hold most of its mass.
// `kappa run` starts the learner, teacher, verifier and two workers and
// trains three steps of GRPO + top-k-with-tail reverse KL (k = 8, the
// vocabulary head in chunks of 64 positions, activation checkpointing, bf16
// autocast, two micro-batches: the file's settings but for k and the chunk).
// Both workers receive the policy in the learner's c10d weight group
// (rollout.weight_transport: c10d), not over WatchPolicy. Then:
//   - κ and K_DR are finite numbers at every step, and non-zero where the
//     reward gradient is; the teacher's tail mass is in [0, 1]; teacher_bytes
//     is exactly B·L·(12k + 4) for an L the prompts and responses allow: the
//     teacher rows stay [B, L, k], thousands of times smaller than a
//     [B, L, V] tensor;
//   - the final checkpoint is a Hugging Face directory that the independent
//     reference (tests/model/reference/hf_forward.py, via
//     check_hf_checkpoint.py) loads, with logits equal to `kappa logits`.
// Without its model paths, the config stops `kappa run` before anything
// starts, naming the missing checkpoint.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/strip.h"
#include "model/checkpoint.h"
#include "model/model_config.h"
#include "model/transformer.h"
#include "services/config.h"
#include "tests/integration/cli_test_util.h"
#include "tests/integration/run_files.h"
#include "tests/integration/tiny_qwen.h"

namespace kappa::cli {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using testing::CommandResult;
using testing::MakeTempDir;
using testing::ReadFile;
using testing::RunKappa;
using testing::RunKappaWithInput;
using testing::ShellQuote;
using testing::WriteFile;

const std::string kSource = KAPPA_SOURCE_DIR;
const std::string kConfig = kSource + "/configs/qwen2.5-gsm8k.yaml";
const std::string kTrain = kSource + "/tests/integration/fixtures/gsm8k_tiny_train.jsonl";
const std::string kHeldout = kSource + "/tests/integration/fixtures/gsm8k_tiny_heldout.jsonl";
const std::string kChecker = kSource + "/tests/integration/check_hf_checkpoint.py";
const std::string kTokenizer = std::string(KAPPA_HF_TOKENIZERS) + "/qwen3";

constexpr int64_t kStudentRows = 151936;  // Qwen2.5-0.5B's embedding
constexpr int64_t kTeacherRows = 152064;  // Qwen2.5-7B's
constexpr int64_t kTopk = 8;
constexpr int64_t kGroups = 2;
constexpr int64_t kMaxNewTokens = 16;
constexpr int kSteps = 3;

// Qwen token ids.
constexpr int64_t kNewline = 198;  // "\n", the last token of every prompt
constexpr int64_t kSpace = 220;
constexpr int64_t kImEnd = 151645;                       // <|im_end|>, the stop id
const std::vector<int64_t> kGuesses = {18, 19, 20, 21};  // "3" "4" "5" "6"

// A random decoder made to guess small numbers, so that the student's groups
// get reward variance (∇L_R, hence κ and K_DR, are zero without it) and the
// teacher's top-k rows hold most of its mass: after "\n" or " " it says one
// of 3, 4, 5, 6, after a guess " " or <|im_end|>. A student's response's
// last number is then right with probability 1/4 on the fixture, whose
// answers are 3 to 6. Three hidden dimensions carry the features, A ("\n"),
// B (a guess), C (" ", <|im_end|>); the MLP maps A and C to B and B to C, the
// final norm drops A, the attention writes nothing. Every other row and
// weight stays random. Tied (the student): the features are the output rows
// too, a logit of 0.95·√d·5 ≈ 27, so random rows get ~1e-7 of the mass and
// the four guesses (then " " and <|im_end|>) have even odds. Untied (the
// teacher): output rows of feature `head`, plus `prefer` for "4" and "5".
void MakeGuesser(model::Decoder& decoder, double head = 0, double prefer = 0) {
  torch::NoGradGuard no_grad;
  std::map<std::string, torch::Tensor> w = model::NamedWeights(decoder);
  constexpr int64_t A = 0, B = 1, C = 2;
  constexpr double kFeature = 5.0, kMapped = 15.0;
  const std::vector<std::pair<int64_t, int64_t>> rows = {
      {kNewline, A},    {kGuesses[0], B}, {kGuesses[1], B}, {kGuesses[2], B},
      {kGuesses[3], B}, {kSpace, C},      {kImEnd, C}};
  torch::Tensor embed = w.at("model.embed_tokens.weight");
  for (const auto& [id, dim] : rows) {
    embed[id].zero_();
    embed[id][dim].fill_(kFeature);
  }
  if (!decoder->config().tie_word_embeddings) {
    torch::Tensor out = w.at("lm_head.weight");
    for (const auto& [id, dim] : rows) {
      out[id].zero_();
      out[id][dim].fill_(head + (id == kGuesses[1] || id == kGuesses[2] ? prefer : 0.0));
    }
  }
  w.at("model.layers.0.self_attn.o_proj.weight").zero_();
  // Neuron 0 fires on A or C, neuron 1 on B. After the RMSNorm a feature is
  // √d on its dimension, so a firing neuron is silu(√d)·√d.
  torch::Tensor down = w.at("model.layers.0.mlp.down_proj.weight");
  for (const char* name :
       {"model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"}) {
    torch::Tensor t = w.at(name);
    t.narrow(0, 0, 2).zero_();
    t[0][A].fill_(1.0);
    t[0][C].fill_(1.0);
    t[1][B].fill_(1.0);
  }
  const double root_d = std::sqrt(static_cast<double>(down.size(0)));
  const double fired = root_d / (1.0 + std::exp(-root_d)) * root_d;
  down.narrow(1, 0, 2).zero_();
  down[B][0].fill_(kMapped / fired);
  down[C][1].fill_(kMapped / fired);
  w.at("model.norm.weight")[A].fill_(0.0);
}

// A random Qwen2 decoder with `rows` embedding rows and the Qwen3 tokenizer's
// files, as a Hugging Face directory.
void WriteTinyQwen(const std::string& dir, int64_t rows, bool tied, uint64_t seed, double head = 0,
                   double prefer = 0) {
  torch::manual_seed(seed);
  model::Decoder decoder(kappa::testing::TinyQwenConfig(rows, tied, kImEnd));
  MakeGuesser(decoder, head, prefer);
  kappa::testing::SaveWithTokenizer(dir, decoder, kTokenizer);
}

// Qwen2.5-0.5B ties its embeddings, Qwen2.5-7B does not. The teacher's
// guesses have logits ≈ 13 ("3", "6") and 14.3 ("4", "5", 4× as likely):
// ≈ 4 % of its mass after "\n" or " " and ≈ 16 % after a guess are outside
// its top 8, in the 152k random rows.
void WriteStudent(const std::string& dir) { WriteTinyQwen(dir, kStudentRows, true, 1); }
void WriteTeacher(const std::string& dir) {
  WriteTinyQwen(dir, kTeacherRows, false, 2, /*head=*/2.4, /*prefer=*/0.26);
}

// The token ids of every training prompt as the learner renders it: the
// student's chat template with the config's system prompt.
std::vector<std::vector<int64_t>> PromptIds(const std::string& model_dir,
                                            const std::string& system_prompt) {
  std::string conversations;
  std::ifstream in(kTrain);
  for (std::string line; std::getline(in, line);) {
    Json messages = Json::array();
    if (!system_prompt.empty()) {
      messages.push_back({{"role", "system"}, {"content", system_prompt}});
    }
    messages.push_back({{"role", "user"}, {"content", Json::parse(line)["question"]}});
    conversations += messages.dump() + "\n";
  }
  const auto rendered = RunKappaWithInput({"render-prompt", model_dir}, conversations);
  EXPECT_EQ(rendered.exit_code, 0) << rendered.errors;
  std::string texts;
  for (const std::string& text : rendered.lines) texts += text + "\n";
  const auto tokenized = RunKappaWithInput({"tokenize", model_dir}, texts);
  EXPECT_EQ(tokenized.exit_code, 0) << tokenized.errors;
  std::vector<std::vector<int64_t>> ids;
  for (const std::string& line : tokenized.lines) {
    ids.push_back(Json::parse(line).get<std::vector<int64_t>>());
  }
  return ids;
}

bool IsFiniteNumber(const Json& value) {
  return value.is_number() && std::isfinite(value.get<double>());
}

class QwenGsm8kRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = MakeTempDir("kappa_qwen_gsm8k");
    ASSERT_FALSE(root_.empty());
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(root_);
  }
  std::string root_;
};

TEST_F(QwenGsm8kRunTest, ConfigParsesAndNamesTheMissingCheckpoints) {
  absl::StatusOr<services::Config> config = services::LoadConfig(kConfig, {});
  ASSERT_TRUE(config.ok()) << config.status();
  // What the file promises (docs/running.md's throughput settings).
  EXPECT_EQ(config->task.kind, services::TaskKind::kJsonl);
  EXPECT_EQ(config->task.format, "gsm8k");
  EXPECT_EQ(config->learner.device, "cuda");
  EXPECT_EQ(config->teacher.device, "cuda");
  EXPECT_EQ(config->rollout.device, "cuda");
  EXPECT_EQ(config->trainer.precision, services::Precision::kBFloat16);
  EXPECT_EQ(config->trainer.distill_loss, services::DistillLoss::kTopkTailReverseKl);
  EXPECT_EQ(config->trainer.distill_topk, 64);
  EXPECT_EQ(config->trainer.teacher_values, services::Precision::kBFloat16);
  EXPECT_EQ(config->trainer.vocab_chunk_positions, 1024);
  EXPECT_TRUE(config->trainer.activation_checkpointing);
  EXPECT_GT(config->trainer.micro_batch_sequences, 0);
  EXPECT_EQ(config->trainer.group_size, 8);
  EXPECT_EQ(config->rollout.max_new_tokens, 1024);
  EXPECT_EQ(config->rollout.temperature, 1.0);
  EXPECT_EQ(config->monitor.kappa_every, 4);

  // `kappa run` checks every training key before the checkpoints; with the
  // placeholder paths it stops at the teacher's, then at the student's.
  const std::string teacher = config->teacher.checkpoint;
  const std::string student = config->student.checkpoint;
  if (fs::exists(teacher) || fs::exists(student)) {
    GTEST_SKIP() << "this machine has " << teacher << " or " << student;
  }
  const std::string runs = "runs_dir=" + root_ + "/runs";
  CommandResult result = RunKappa({"run", kConfig, runs, "--no-progress"});
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("teacher.checkpoint '" + teacher + "' holds no checkpoint"),
            std::string::npos)
      << result.output;
  EXPECT_EQ(result.output.find("config key"), std::string::npos) << result.output;

  const std::string tiny_teacher = root_ + "/teacher";
  WriteTeacher(tiny_teacher);
  result = RunKappa({"run", kConfig, runs, "teacher.checkpoint=" + tiny_teacher, "--no-progress"});
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("student.checkpoint '" + student + "' holds no checkpoint"),
            std::string::npos)
      << result.output;
  EXPECT_FALSE(fs::exists(root_ + "/runs/qwen2.5-gsm8k/metrics.jsonl")) << "a learner started";
}

TEST_F(QwenGsm8kRunTest, TrainsTinyQwenModelsOnGsm8kWithTopkTailRows) {
  const std::string student = root_ + "/student";
  const std::string teacher = root_ + "/teacher";
  WriteStudent(student);
  WriteTeacher(teacher);

  // The shipped config, with what a 2-core machine and tiny models need in
  // place of the GPU's: devices, sizes, threads; k and the chunk as small as
  // the models.
  const std::vector<std::string> overrides = {
      "name=qwen-tiny",
      "runs_dir=" + root_ + "/runs",
      "data_dir=" + root_ + "/cache",
      "student.checkpoint=" + student,
      "teacher.checkpoint=" + teacher,
      "task.train_path=" + kTrain,
      "task.heldout_path=" + kHeldout,
      "learner.device=cpu",
      "teacher.device=cpu",
      "rollout.device=cpu",
      "workers=2",
      "threads_per_process=1",
      "teacher.threads=1",
      "learner.buffer_groups=4",
      "rollout.max_outstanding=1",
      "rollout.max_new_tokens=" + std::to_string(kMaxNewTokens),
      "trainer.steps=" + std::to_string(kSteps),
      "trainer.groups_per_step=" + std::to_string(kGroups),
      "trainer.micro_batch_sequences=8",  // two micro-batches of the 16 sequences
      "trainer.distill_topk=" + std::to_string(kTopk),
      "trainer.vocab_chunk_positions=64",
      "trainer.eval_every=3",
      "trainer.eval_examples=4",
      "trainer.checkpoint_every=0",
      "monitor.kappa_every=1",
      "monitor.kdr_every=1",
      // Both workers take every version in the learner's c10d weight group
      // (Gloo here: CPU tensors), 151,936 embedding rows a version.
      "rollout.weight_transport=c10d",
  };
  absl::StatusOr<services::Config> config = services::LoadConfig(kConfig, overrides);
  ASSERT_TRUE(config.ok()) << config.status();
  const int64_t batch = kGroups * config->trainer.group_size;

  std::vector<std::string> args = {"run", kConfig};
  args.insert(args.end(), overrides.begin(), overrides.end());
  args.push_back("--no-progress");
  const auto start = std::chrono::steady_clock::now();
  const CommandResult run = RunKappa(args);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const fs::path run_dir = fs::path(root_) / "runs" / "qwen-tiny";
  ASSERT_EQ(run.exit_code, 0) << run.output << "\n"
                              << kappa::testing::ReadAll(run_dir / "logs" / "learner.log");
  std::cout << "kappa run: " << seconds << " s\n";

  // Every version reached both workers through the weight group: none came
  // over WatchPolicy, and the learner logged a broadcast per version.
  for (const char* worker : {"rollout-0.log", "rollout-1.log"}) {
    const std::string log = kappa::testing::ReadAll(run_dir / "logs" / worker);
    EXPECT_NE(log.find("from the weight group"), std::string::npos) << worker << ":\n" << log;
    EXPECT_EQ(log.find(" loaded on cpu ("), std::string::npos)
        << worker << " loaded a version over WatchPolicy:\n"
        << log;
  }
  EXPECT_NE(kappa::testing::ReadAll(run_dir / "logs" / "learner.log")
                .find("weight group formed at tcp://"),
            std::string::npos);

  // The bounds of L, the batch's padded row length: prompt + response − 1.
  const std::vector<std::vector<int64_t>> prompts = PromptIds(student, config->task.system_prompt);
  ASSERT_EQ(prompts.size(), 16u);
  size_t shortest = SIZE_MAX, longest = 0;
  for (const auto& ids : prompts) {
    shortest = std::min(shortest, ids.size());
    longest = std::max(longest, ids.size());
  }

  int trained = 0;
  int rewarded = 0;  // steps whose reward gradient was not zero
  for (const Json& record : kappa::testing::StepRecords(run_dir / "metrics.jsonl")) {
    const int64_t step = record.value("step", int64_t{0});
    if (step == 0) continue;
    ++trained;
    SCOPED_TRACE("step " + std::to_string(step));
    // κ and K_DR measured at every step (monitor.kappa_every/kdr_every 1).
    ASSERT_TRUE(IsFiniteNumber(record["kappa"])) << record["kappa"];
    ASSERT_TRUE(IsFiniteNumber(record["kdr_mean"])) << record["kdr_mean"];
    EXPECT_GT(record["grad_norm_distill"].get<double>(), 0);
    EXPECT_GT(record["kdr_positions"].get<int64_t>(), 0);
    if (record["grad_norm_reward"].get<double>() > 0) {
      ++rewarded;
      EXPECT_GT(record["kappa"].get<double>(), 0);
      EXPECT_NE(record["kdr_mean"].get<double>(), 0);
    }
    ASSERT_TRUE(IsFiniteNumber(record["loss_distill"])) << record["loss_distill"];
    EXPECT_GT(record["loss_distill"].get<double>(), 0);

    // [B, L, k] fp32 log-probs + int64 ids + the [B, L] fp32 tail, nothing
    // of width V.
    const int64_t bytes = record["teacher_bytes"].get<int64_t>();
    const int64_t tokens = record["tokens"].get<int64_t>();
    const int64_t per_position = kTopk * 12 + 4;
    ASSERT_GT(bytes, 0);
    ASSERT_EQ(bytes % (batch * per_position), 0) << bytes << " bytes of teacher rows for " << tokens
                                                 << " response tokens are not B·L·(12k + 4)";
    const int64_t length = bytes / (batch * per_position);
    EXPECT_GE(length, static_cast<int64_t>(shortest));
    EXPECT_LE(length, static_cast<int64_t>(longest) + kMaxNewTokens - 1);
    EXPECT_LT(bytes * 100, kStudentRows * 4 * tokens)
        << "teacher rows of " << bytes << " bytes for " << tokens << " response tokens";
    EXPECT_LT(bytes * 1000, batch * length * kStudentRows * 4) << "not far below B·L·V·4";

    for (const char* key : {"teacher_tail_mass_mean", "teacher_tail_mass_p95"}) {
      ASSERT_TRUE(IsFiniteNumber(record[key])) << key << " " << record[key];
      EXPECT_GE(record[key].get<double>(), 0) << key;
      EXPECT_LE(record[key].get<double>(), 1) << key;
    }
    // The teacher's own tail (WriteTeacher): ≈ 4 % or ≈ 16 % at each position.
    EXPECT_GT(record["teacher_tail_mass_mean"].get<double>(), 0.03);
    EXPECT_LT(record["teacher_tail_mass_mean"].get<double>(),
              record["teacher_tail_mass_p95"].get<double>());
    EXPECT_GT(record["teacher_tail_mass_p95"].get<double>(), 0.12);
    EXPECT_LT(record["teacher_tail_mass_p95"].get<double>(), 0.20);

    std::cout << "step " << step << ": teacher_bytes " << bytes << " (B " << batch << ", L "
              << length << ", k " << kTopk << "; B·L·V·4 would be "
              << batch * length * kStudentRows * 4 << "), tokens " << tokens << ", kappa "
              << record["kappa"] << ", kdr_mean " << record["kdr_mean"] << ", tail mass mean "
              << record["teacher_tail_mass_mean"] << " p95 " << record["teacher_tail_mass_p95"]
              << ", loss_distill " << record["loss_distill"] << ", reward_mean "
              << record["reward_mean"] << "\n";
  }
  EXPECT_EQ(trained, kSteps);
  // P(none of the six groups has reward variance) = ((3/4)^8 + (1/4)^8)^6 ≈ 1e-6.
  EXPECT_GT(rewarded, 0) << "no step had a reward gradient";

  // The final checkpoint as Hugging Face would load it.
  const std::string latest = std::string(
      absl::StripAsciiWhitespace(ReadFile((run_dir / "checkpoints" / "latest").string())));
  EXPECT_EQ(latest, "step-" + std::to_string(kSteps));
  const std::string final_dir = (run_dir / "checkpoints" / latest).string();
  ASSERT_TRUE(model::CheckpointExists(final_dir)) << final_dir;
  // Ids of real text and specials (<|im_start|>, <|im_end|>) and the
  // tokenizer's highest id.
  std::vector<int64_t> ids(prompts[0].begin(), prompts[0].begin() + 12);
  ids.push_back(151668);
  std::string id_list;
  for (int64_t id : ids) id_list += (id_list.empty() ? "" : ",") + std::to_string(id);
  const CommandResult logits = RunKappa({"logits", final_dir, "--ids", id_list});
  ASSERT_EQ(logits.exit_code, 0) << logits.output.substr(0, 2000);
  const std::string logits_file = root_ + "/kappa_logits.json";
  WriteFile(logits_file, logits.output);

  const std::string check_out = root_ + "/check.out";
  const std::string command = ShellQuote(KAPPA_REFERENCE_PYTHON) + " " + ShellQuote(kChecker) +
                              " " + ShellQuote(final_dir) + " --kappa-logits " +
                              ShellQuote(logits_file) + " --tokenizer-from " +
                              ShellQuote(kTokenizer) + " --initial " + ShellQuote(student) +
                              " --tolerance 1e-4 >" + ShellQuote(check_out) + " 2>&1";
  const int status = std::system(command.c_str());
  const std::string checked = ReadFile(check_out);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << command << "\n" << checked;
  const Json report = Json::parse(checked);
  std::cout << "check_hf_checkpoint: " << report.dump() << "\n";
  EXPECT_EQ(report["vocab"].get<int64_t>(), kStudentRows);
  EXPECT_LE(report["max_abs_diff"].get<double>(), 1e-4);
  EXPECT_GT(report["max_weight_change"].get<double>(), 0);
}

}  // namespace
}  // namespace kappa::cli
