// `kappa experiment` end to end on a tiny config: three arms x one seed x
// three steps, the middle arm broken so that its `kappa run` fails at once.
// The experiment must record the failure, still run the last arm, and write
// results.csv / results.md / summary.csv / differences.csv / report.html
// covering all three. Also: a typo in an arm's
// overrides stops everything before any run starts.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/integration/cli_test_util.h"

namespace kappa::cli {
namespace {

namespace fs = std::filesystem;
using testing::MakeTempDir;
using testing::ReadFile;
using testing::RunKappa;
using testing::WriteFile;

::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << part << "' not in:\n" << text;
}

// The cells of the results.csv row of `arm` (no quoted cells expected).
std::vector<std::string> CsvRow(const std::string& csv, const std::string& arm) {
  const size_t at = csv.find("\n" + arm + ",");
  if (at == std::string::npos) return {};
  const std::string line = csv.substr(at + 1, csv.find('\n', at + 1) - at - 1);
  std::vector<std::string> cells;
  size_t start = 0;
  for (size_t comma; (comma = line.find(',', start)) != std::string::npos; start = comma + 1) {
    cells.push_back(line.substr(start, comma - start));
  }
  cells.push_back(line.substr(start));
  return cells;
}

class ExperimentEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("kappa_experiment_e2e");
    ASSERT_FALSE(dir_.empty());
    // The e2e_loop_test shapes, even smaller: seconds per run.
    WriteFile(dir_ + "/tiny.yaml", "name: tiny\ndata_dir: " + dir_ + R"(/cache
workers: 1
task: {kind: arithmetic, min_digits: 1, max_digits: 1, operators: "+", train_size: 40, heldout_size: 10}
teacher:
  shape: {hidden_size: 16, intermediate_size: 32, num_hidden_layers: 1, num_attention_heads: 2,
          num_key_value_heads: 1, max_position_embeddings: 12}
  bootstrap: {steps: 5, batch_size: 8}
student:
  shape: {hidden_size: 16, intermediate_size: 32, num_hidden_layers: 1, num_attention_heads: 2,
          num_key_value_heads: 1, max_position_embeddings: 12}
  bootstrap: {steps: 2, batch_size: 8}
learner: {buffer_groups: 4, max_staleness: 2}
rollout: {max_new_tokens: 3, max_outstanding: 2}
trainer: {steps: 50, groups_per_step: 2, group_size: 4, eval_every: 0, eval_examples: 10,
          checkpoint_every: 0}
)");
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string dir_;
};

TEST_F(ExperimentEndToEndTest, RunsEveryArmAndReportsTheFailedOne) {
  WriteFile(dir_ + "/abl.yaml", R"(base: tiny.yaml
seeds: [1]
overrides: [trainer.steps=40]
quick: {overrides: [trainer.steps=3]}
arms:
  - name: grpo_only
    overrides: [trainer.distill_gate=none]
  - name: broken
    description: "no rollout workers: kappa run refuses it"
    overrides: [workers=0]
  - name: naive
    # With an unreliable teacher: the learner reports the subset the rule
    # covers apart and writes the conflict atlas.
    overrides: [trainer.distill_gate=all, task.operators=+-, teacher.bootstrap.corrupt=minus_as_plus,
                trainer.eval_every=1]
)");
  const std::string out = dir_ + "/out";
  const auto result = RunKappa({"experiment", dir_ + "/abl.yaml", "--quick", "--out", out});
  EXPECT_EQ(result.exit_code, 1) << "one run failed: " << result.output;

  // Progress on stderr and the table on stdout (both captured together).
  EXPECT_TRUE(Contains(result.output, "[experiment 1/3] arm grpo_only, seed 1"));
  EXPECT_TRUE(Contains(result.output, "[experiment 3/3] arm naive, seed 1"));
  EXPECT_TRUE(Contains(result.output, "broken-s1 FAILED"));
  EXPECT_TRUE(Contains(result.output, "workers must be >= 1")) << "the failed run's log tail";
  EXPECT_TRUE(Contains(result.output, "| grpo_only | 1/1 |"));

  for (const char* run : {"grpo_only-s1", "naive-s1"}) {
    const std::string metrics = ReadFile(out + "/runs/" + run + "/metrics.jsonl");
    EXPECT_TRUE(Contains(metrics, "\"step\":3")) << run << ": --quick set trainer.steps=3";
    EXPECT_FALSE(Contains(metrics, "\"step\":4")) << run;
    EXPECT_TRUE(fs::exists(out + "/logs/" + std::string(run) + ".log")) << run;
  }
  EXPECT_TRUE(Contains(ReadFile(out + "/commands.txt"), "trainer.distill_gate=none"));
  // The corrupted teacher's subset, end to end: the learner's by-subset
  // keys, the atlas file, the experiment's subset columns.
  const std::string naive_run = out + "/runs/naive-s1";
  const std::string naive_metrics = ReadFile(naive_run + "/metrics.jsonl");
  EXPECT_TRUE(Contains(naive_metrics, "\"eval_accuracy_by_subset\":{\"minus_as_plus\":"));
  EXPECT_TRUE(Contains(naive_metrics, "\"kdr_mean_by_subset\":{\"minus_as_plus\":"));
  // Opened at start (this tiny student scores 0 everywhere, so K_DR is 0
  // and the atlas has no line; learner_conflict_atlas_test checks lines).
  EXPECT_TRUE(fs::exists(naive_run + "/conflict_atlas.jsonl"));
  EXPECT_TRUE(Contains(ReadFile(out + "/results.csv"), "final_accuracy_minus_as_plus"));
  // And how often the student gives the teacher's wrong answer.
  EXPECT_TRUE(Contains(naive_metrics, "\"minus_as_plus_followed\":"));
  EXPECT_TRUE(Contains(ReadFile(out + "/results.csv"), "final_accuracy_minus_as_plus_followed"));

  const std::string csv = ReadFile(out + "/results.csv");
  EXPECT_TRUE(Contains(csv, "\nbroken,1,broken-s1,failed,")) << csv;
  for (const char* arm : {"grpo_only", "naive"}) {
    const std::vector<std::string> row = CsvRow(csv, arm);
    ASSERT_GT(row.size(), 9u) << arm << "\n" << csv;
    EXPECT_EQ(row[3], "ok") << arm;
    EXPECT_EQ(row[6], "3") << arm << ": last step";
    EXPECT_FALSE(row[7].empty()) << arm << ": the last step is always evaluated";
    EXPECT_EQ(row[8], "3") << arm << ": final eval step";
  }
  // L_D first quarter: measured when distilling, absent (not 0) for GRPO alone.
  EXPECT_FALSE(CsvRow(csv, "naive").at(9).empty()) << csv;
  EXPECT_TRUE(CsvRow(csv, "grpo_only").at(9).empty()) << csv;

  const std::string md = ReadFile(out + "/results.md");
  EXPECT_TRUE(Contains(md, "| grpo_only | 1/1 |"));
  EXPECT_TRUE(Contains(md, "| broken | 0/1 | – |"));
  EXPECT_TRUE(Contains(md, "| naive | 1/1 |"));
  EXPECT_TRUE(Contains(md, "`broken-s1`: failed"));
  // naive is the default baseline; one seed: one pair per arm, so no
  // interval and no p.
  EXPECT_TRUE(Contains(md, "## Differences against naive (paired by seed)"));
  EXPECT_TRUE(Contains(md, "| grpo_only | final acc | 1 | "));
  EXPECT_TRUE(Contains(md, "| broken | final acc | 0 | – | – | – |"));

  const std::string summary = ReadFile(out + "/summary.csv");
  EXPECT_TRUE(Contains(summary, "arm,metric,n,mean,std,ci_low,ci_high\n")) << summary;
  EXPECT_TRUE(Contains(summary, "\nnaive,final_eval_accuracy,1,")) << summary;
  EXPECT_TRUE(Contains(summary, "\nbroken,final_eval_accuracy,0,,,,\n")) << summary;
  const std::string differences = ReadFile(out + "/differences.csv");
  EXPECT_TRUE(Contains(differences, "\ngrpo_only,naive,final_eval_accuracy,1,")) << differences;
  EXPECT_TRUE(Contains(differences, "\nbroken,naive,final_eval_accuracy,0,,,,,false,,,\n"))
      << differences;
  const std::string html = ReadFile(out + "/report.html");
  EXPECT_TRUE(Contains(html, "95 % confidence interval of the mean"));
  EXPECT_TRUE(Contains(html, "Differences against naive (paired by seed)"));
  EXPECT_TRUE(Contains(html, "data-diff=\"grpo_only:final_eval_accuracy\""));

  // --resume keeps DIR: the two runs that finished are read back, not run
  // again; the failed one runs (and fails) again.
  const auto metrics_time = fs::last_write_time(out + "/runs/naive-s1/metrics.jsonl");
  const auto resumed =
      RunKappa({"experiment", dir_ + "/abl.yaml", "--quick", "--resume", "--out", out});
  EXPECT_EQ(resumed.exit_code, 1) << resumed.output;
  EXPECT_TRUE(Contains(resumed.output,
                       "[experiment 1/3] grpo_only-s1 finished in an earlier "
                       "attempt, kept: final acc"));
  EXPECT_TRUE(Contains(resumed.output, "[experiment 3/3] naive-s1 finished in an earlier attempt"));
  EXPECT_TRUE(Contains(resumed.output, "[experiment 2/3] arm broken, seed 1"));
  EXPECT_FALSE(Contains(resumed.output, "arm naive, seed 1")) << "not run again";
  EXPECT_EQ(fs::last_write_time(out + "/runs/naive-s1/metrics.jsonl"), metrics_time);
  EXPECT_TRUE(Contains(resumed.output, "| grpo_only | 1/1 |"));
  const std::string resumed_csv = ReadFile(out + "/results.csv");
  EXPECT_EQ(CsvRow(resumed_csv, "naive").at(3), "ok") << resumed_csv;
  EXPECT_EQ(CsvRow(resumed_csv, "naive").at(6), "3") << resumed_csv;
  EXPECT_TRUE(Contains(resumed_csv, "\nbroken,1,broken-s1,failed,")) << resumed_csv;

  // A bad override on the command line is refused before the previous
  // results in DIR are moved aside.
  const auto again =
      RunKappa({"experiment", dir_ + "/abl.yaml", "--quick", "--out", out, "trainer.stepz=1"});
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_TRUE(Contains(again.output, "trainer.stepz"));
  EXPECT_TRUE(fs::exists(out + "/results.md")) << "a rejected experiment touches nothing";
}

TEST_F(ExperimentEndToEndTest, TypoInAnArmStopsBeforeAnyRun) {
  WriteFile(dir_ + "/abl.yaml", R"(base: tiny.yaml
seeds: [1, 2]
arms:
  - name: fine
  - name: typo
    overrides: [trainer.lamda=0.5]
)");
  const auto result = RunKappa({"experiment", dir_ + "/abl.yaml", "--out", dir_ + "/out"});
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_TRUE(Contains(result.output, "abl.yaml:5: arm 'typo'"));
  EXPECT_TRUE(Contains(result.output, "trainer.lamda"));
  EXPECT_FALSE(fs::exists(dir_ + "/out")) << "nothing started";
  EXPECT_FALSE(fs::exists(dir_ + "/cache")) << "no bootstrap either";

  const auto usage = RunKappa({"experiment"});
  EXPECT_EQ(usage.exit_code, 2) << usage.output;
  const auto missing = RunKappa({"experiment", dir_ + "/nope.yaml"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_TRUE(Contains(missing.output, "nope.yaml"));
}

}  // namespace
}  // namespace kappa::cli
