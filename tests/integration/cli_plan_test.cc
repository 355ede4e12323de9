// `kappa plan` against what the processes of the same `kappa run` measure,
// and `kappa run` refusing a plan that cannot fit.
//
// The run is configs/qwen2.5-gsm8k.yaml on the CPU with tiny random Qwen2
// models of the real vocabularies (151,936 tied rows for the student,
// 152,064 untied for the teacher; d 32, one layer), the real Qwen3
// tokenizer and a GSM8K-layout JSONL, with qwen_gsm8k_run_test's overrides:
// the case where the O(V) terms (the vocabulary head, the teacher's logits
// and rows, the evaluation's prefill) are most of each process above its
// base. Every process's peak RSS (the `peak_rss_bytes=` line it logs at
// exit, services/logging.h) is within 25 % of the plan's host bytes for it.
//
// Refusals, each before anything starts (no run directory):
//   - plan.host_memory_bytes below the run's total names the learner, the
//     vocab head and trainer.vocab_chunk_positions (the head unchunked);
//   - full teacher rows (trainer.distill_loss=reverse_kl) at V = 151,936
//     against the default 64 MiB message limit name
//     security.max_message_bytes.
//
// With student.lora the plan counts the adapters of the student's shape.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "model/transformer.h"
#include "tests/integration/cli_test_util.h"
#include "tests/integration/tiny_qwen.h"

namespace kappa::cli {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using testing::CommandResult;
using testing::MakeTempDir;
using testing::RunKappa;

const std::string kSource = KAPPA_SOURCE_DIR;
const std::string kConfig = kSource + "/configs/qwen2.5-gsm8k.yaml";
const std::string kTrain = kSource + "/tests/integration/fixtures/gsm8k_tiny_train.jsonl";
const std::string kHeldout = kSource + "/tests/integration/fixtures/gsm8k_tiny_heldout.jsonl";
const std::string kTokenizer = std::string(KAPPA_HF_TOKENIZERS) + "/qwen3";

// A random Qwen2 decoder with `rows` embedding rows and the Qwen3
// tokenizer's files, as a Hugging Face directory.
void WriteTinyQwen(const std::string& dir, int64_t rows, bool tied, uint64_t seed) {
  torch::manual_seed(seed);
  model::Decoder decoder(kappa::testing::TinyQwenConfig(rows, tied, /*eos=*/151645));
  kappa::testing::SaveWithTokenizer(dir, decoder, kTokenizer);
}

class PlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = MakeTempDir("kappa_plan");
    ASSERT_FALSE(root_.empty());
    WriteTinyQwen(root_ + "/student", 151936, /*tied=*/true, 1);
    WriteTinyQwen(root_ + "/teacher", 152064, /*tied=*/false, 2);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(root_);
  }

  // qwen_gsm8k_run_test's overrides: the shipped config with what a 2-core
  // machine and tiny models need (devices, sizes, threads), two steps.
  std::vector<std::string> Overrides(const std::string& name) const {
    return {"name=" + name,
            "runs_dir=" + root_ + "/runs",
            "data_dir=" + root_ + "/cache",
            "student.checkpoint=" + root_ + "/student",
            "teacher.checkpoint=" + root_ + "/teacher",
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
            "rollout.max_new_tokens=16",
            "trainer.steps=2",
            "trainer.groups_per_step=2",
            "trainer.micro_batch_sequences=8",
            "trainer.distill_topk=8",
            "trainer.vocab_chunk_positions=64",
            "trainer.eval_every=2",
            "trainer.eval_examples=4",
            "trainer.checkpoint_every=0",
            "trainer.truncated=keep",
            "monitor.kappa_every=1",
            "monitor.kdr_every=1",
            "rollout.weight_transport=c10d"};
  }

  CommandResult Kappa(const std::string& command, const std::vector<std::string>& overrides,
                      const std::vector<std::string>& extra) const {
    std::vector<std::string> args = {command, kConfig};
    args.insert(args.end(), overrides.begin(), overrides.end());
    args.insert(args.end(), extra.begin(), extra.end());
    return RunKappa(args);
  }

  std::string root_;
};

// The last `peak_rss_bytes=N` a log holds.
int64_t PeakRss(const fs::path& log) {
  const std::string text = kappa::cli::testing::ReadFile(log.string());
  static const std::regex kPeak("peak_rss_bytes=([0-9]+)");
  int64_t peak = -1;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kPeak);
       it != std::sregex_iterator(); ++it) {
    peak = std::stoll((*it)[1].str());
  }
  return peak;
}

TEST_F(PlanTest, EveryProcessPeaksWithinAQuarterOfItsPlan) {
  const std::vector<std::string> overrides = Overrides("plan-tiny");
  const CommandResult planned = Kappa("plan", overrides, {"--json"});
  ASSERT_EQ(planned.exit_code, 0) << planned.output;
  const Json plan = Json::parse(planned.output);
  EXPECT_TRUE(plan["fits"].get<bool>());
  EXPECT_EQ(plan["student"]["vocab"].get<int64_t>(), 151936);
  EXPECT_EQ(plan["teacher"]["vocab"].get<int64_t>(), 152064);
  EXPECT_GT(plan["prompt_tokens"].get<int64_t>(), 40);  // the chat-rendered GSM8K prompts

  const CommandResult run = Kappa("run", overrides, {"--no-progress"});
  const fs::path logs = fs::path(root_) / "runs" / "plan-tiny" / "logs";
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::map<std::string, std::string> log_of = {{"learner", "learner.log"},
                                                     {"rollout-0", "rollout-0.log"},
                                                     {"rollout-1", "rollout-1.log"},
                                                     {"teacher", "teacher.log"},
                                                     {"verifier", "verifier.log"}};
  int checked = 0;
  for (const Json& process : plan["processes"]) {
    const std::string name = process["name"];
    ASSERT_EQ(log_of.count(name), 1u) << name;
    const int64_t planned_bytes = process["bytes_by_device"]["host"].get<int64_t>();
    const int64_t measured = PeakRss(logs / log_of.at(name));
    ASSERT_GT(measured, 0) << name << " logged no peak RSS";
    const double ratio = static_cast<double>(planned_bytes) / static_cast<double>(measured);
    std::cout << name << ": planned " << (planned_bytes >> 20) << " MiB, peak RSS "
              << (measured >> 20) << " MiB, ratio " << ratio << "\n";
    EXPECT_GT(ratio, 0.75) << name;
    EXPECT_LT(ratio, 1.25) << name;
    ++checked;
  }
  EXPECT_EQ(checked, 5);
}

TEST_F(PlanTest, ARunThatCannotFitIsRefusedBeforeAnythingStarts) {
  // The vocabulary head unchunked: 6 × [8 × S, V] float32 tensors, the
  // learner's largest term.
  std::vector<std::string> overrides = Overrides("plan-refused");
  overrides.push_back("trainer.vocab_chunk_positions=0");
  // Against a 1 TiB host first, for the run's total whatever this machine has free.
  const CommandResult planned =
      Kappa("plan", overrides, {"plan.host_memory_bytes=1099511627776", "--json"});
  ASSERT_EQ(planned.exit_code, 0) << planned.output;
  int64_t total = 0;
  const Json plan = Json::parse(planned.output);
  for (const Json& device : plan["devices"]) {
    if (device["device"] == "host") total = device["bytes"].get<int64_t>();
  }
  ASSERT_GT(total, 0);
  overrides.push_back("plan.host_memory_bytes=" + std::to_string(total));  // 0.9 × it is short

  const CommandResult refused = Kappa("run", overrides, {"--no-progress"});
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  for (const char* part : {"the memory plan does not fit: learner needs", "'vocab head'",
                           "trainer.vocab_chunk_positions=0; try 1024", "--ignore-plan"}) {
    EXPECT_NE(refused.output.find(part), std::string::npos) << part << "\n" << refused.output;
  }
  EXPECT_FALSE(fs::exists(fs::path(root_) / "runs" / "plan-refused")) << "the run started";
  // `kappa plan` says the same, and exits 1.
  const CommandResult text = Kappa("plan", overrides, {});
  EXPECT_EQ(text.exit_code, 1) << text.output;
  EXPECT_NE(text.output.find("plan: does not fit: learner needs"), std::string::npos)
      << text.output;
}

TEST_F(PlanTest, FullTeacherRowsOverTheMessageLimitAreRefusedByTheKey) {
  // 8 samples × 16 tokens × 152,064 bf16 values = 38.9 MB per ScoredGroup:
  // the bf16 rows fit 64 MiB, float32 ones (77.9 MB) do not.
  std::vector<std::string> overrides = Overrides("plan-messages");
  overrides.push_back("trainer.distill_loss=reverse_kl");
  overrides.push_back("trainer.teacher_values=fp32");
  const CommandResult refused = Kappa("run", overrides, {"--no-progress"});
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  for (const char* part : {"ScoredGroup message would be", "security.max_message_bytes=67108864",
                           "trainer.distill_loss=reverse_kl"}) {
    EXPECT_NE(refused.output.find(part), std::string::npos) << part << "\n" << refused.output;
  }
  EXPECT_FALSE(fs::exists(fs::path(root_) / "runs" / "plan-messages")) << "the run started";

  // Raised as the message says: the plan fits.
  overrides.push_back("security.max_message_bytes=134217728");
  const CommandResult planned = Kappa("plan", overrides, {"--json"});
  EXPECT_EQ(planned.exit_code, 0) << planned.output;
}

// `kappa plan` reads student.lora: the adapters of the student's checkpoint
// (d 32, f 64, one layer, 2 heads and 1 KV head of 16) are what the
// optimizer holds and what a version sends; a target the learner would
// refuse is refused by the plan.
TEST_F(PlanTest, ALoraPlanCountsTheAdaptersOfTheStudentsCheckpoint) {
  std::vector<std::string> overrides = Overrides("plan-lora");
  overrides.push_back("student.lora.rank=4");
  overrides.push_back("rollout.weights_dtype=float32");
  // q_proj [32, 32]: 4·(32 + 32) = 256; v_proj [16, 32]: 4·(32 + 16) = 192.
  const int64_t adapters = 256 + 192;
  const CommandResult planned =
      Kappa("plan", overrides, {"student.lora.target_modules=[q_proj,v_proj]", "--json"});
  ASSERT_EQ(planned.exit_code, 0) << planned.output;
  const Json plan = Json::parse(planned.output);
  EXPECT_EQ(plan["student"]["adapter_parameters"].get<int64_t>(), adapters);
  int64_t moments = -1;
  for (const Json& term : plan["processes"][0]["terms"]) {
    if (term["name"] == "AdamW moments") moments = term["bytes"].get<int64_t>();
  }
  EXPECT_EQ(moments, 8 * adapters);
  // float32 on the wire to two workers' WatchPolicy streams.
  EXPECT_EQ(plan["sync_bytes_per_version"].get<int64_t>(), adapters * 4 * 2);

  const CommandResult refused =
      Kappa("plan", overrides, {"student.lora.target_modules=[q_proj,qkv_proj]"});
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_NE(refused.output.find("student.lora.target_modules"), std::string::npos)
      << refused.output;
}

}  // namespace
}  // namespace kappa::cli
