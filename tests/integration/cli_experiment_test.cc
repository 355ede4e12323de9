// `kappa experiment` without processes: the ablation file (parsing, errors
// that name file and line, override validation naming the arm, the baseline
// key, the shipped configs/ablation.yaml), the statistics (Student t against
// tabulated values, confidence intervals, paired differences) and the
// results (metrics.jsonl summaries, per-subset columns, mean ± 95 % CI per
// arm, differences against the baseline, "–" for what is missing).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_format.h"
#include "cli/ablation_spec.h"
#include "cli/experiment_results.h"
#include "cli/experiment_trend.h"
#include "cli/stats.h"
#include "tests/integration/cli_test_util.h"

namespace kappa::cli {
namespace {

namespace fs = std::filesystem;
using testing::MakeTempDir;
using testing::WriteFile;

::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << part << "' not in:\n" << text;
}

class ExperimentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("kappa_experiment");
    ASSERT_FALSE(dir_.empty());
    WriteFile(dir_ + "/base.yaml", "name: base\ntrainer: {steps: 50}\n");
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    WriteFile(path, text);
    return path;
  }
  // The error of parsing `text` as abl.yaml ("" when it parses).
  std::string ParseError(const std::string& text) {
    absl::StatusOr<AblationSpec> spec = LoadAblationSpec(Write("abl.yaml", text));
    return spec.ok() ? "" : std::string(spec.status().message());
  }

  std::string dir_;
};

// --- the ablation file

constexpr const char* kGoodAblation = R"(base: base.yaml
seeds: [3, 1]
overrides: [trainer.steps=20, trainer.eval_every=10]
quick:
  seeds: [7]
  overrides: [trainer.steps=5]
arms:
  - name: plain
    description: "nothing changed"
  - name: listy
    overrides:
      - trainer.balance=[m3_norm,m3_project]
      - "trainer.lambda=0.5"
)";

TEST_F(ExperimentTest, ParsesAGoodFile) {
  absl::StatusOr<AblationSpec> spec = LoadAblationSpec(Write("abl.yaml", kGoodAblation));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(fs::path(spec->base_config), fs::path(dir_) / "base.yaml")
      << "base is relative to the ablation file's directory";
  EXPECT_EQ(spec->seeds, (std::vector<uint64_t>{3, 1}));
  EXPECT_EQ(spec->overrides, (std::vector<std::string>{"trainer.steps=20", "trainer.eval_every=10"}));
  ASSERT_EQ(spec->arms.size(), 2u);
  EXPECT_EQ(spec->arms[0].name, "plain");
  EXPECT_EQ(spec->arms[0].description, "nothing changed");
  EXPECT_TRUE(spec->arms[0].overrides.empty());
  EXPECT_EQ(spec->arms[0].line, 8);
  EXPECT_EQ(spec->arms[1].overrides,
            (std::vector<std::string>{"trainer.balance=[m3_norm,m3_project]", "trainer.lambda=0.5"}));

  const std::vector<PlannedRun> runs = PlanRuns(*spec, "/out/runs");
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_EQ(runs[0].name, "plain-s3");
  EXPECT_EQ(runs[1].name, "plain-s1");
  EXPECT_EQ(runs[3].name, "listy-s1");
  EXPECT_EQ(runs[3].overrides,
            (std::vector<std::string>{"name=listy-s1", "runs_dir='/out/runs'", "trainer.seed=1",
                                      "trainer.steps=20", "trainer.eval_every=10",
                                      "trainer.balance=[m3_norm,m3_project]",
                                      "trainer.lambda=0.5"}));

  absl::StatusOr<std::vector<services::Config>> configs = ResolveRunConfigs(*spec, runs);
  ASSERT_TRUE(configs.ok()) << configs.status();
  const services::Config& listy = (*configs)[3];
  EXPECT_EQ(listy.name, "listy-s1");
  EXPECT_EQ(listy.runs_dir, "/out/runs");
  EXPECT_EQ(listy.seed, 1u);
  EXPECT_EQ(listy.trainer.steps, 20);
  EXPECT_EQ(listy.trainer.balance,
            (std::vector<services::BalanceMethod>{services::BalanceMethod::kM3Norm,
                                                  services::BalanceMethod::kM3Project}));
  EXPECT_DOUBLE_EQ(listy.trainer.lambda, 0.5);
  EXPECT_EQ((*configs)[0].trainer.balance,
            (std::vector<services::BalanceMethod>{services::BalanceMethod::kNaive}));
}

TEST_F(ExperimentTest, QuickReplacesSeedsAndAppendsOverrides) {
  absl::StatusOr<AblationSpec> spec = LoadAblationSpec(Write("abl.yaml", kGoodAblation));
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(ApplyQuick(&*spec).ok());
  EXPECT_EQ(spec->seeds, (std::vector<uint64_t>{7}));
  absl::StatusOr<std::vector<services::Config>> configs =
      ResolveRunConfigs(*spec, PlanRuns(*spec, dir_));
  ASSERT_TRUE(configs.ok()) << configs.status();
  ASSERT_EQ(configs->size(), 2u);
  EXPECT_EQ((*configs)[0].trainer.steps, 5) << "the quick override comes after the common one";
  EXPECT_EQ((*configs)[0].trainer.eval_every, 10);

  absl::StatusOr<AblationSpec> no_quick =
      LoadAblationSpec(Write("nq.yaml", "base: base.yaml\nseeds: [1]\narms: [{name: a}]\n"));
  ASSERT_TRUE(no_quick.ok()) << no_quick.status();
  absl::Status status = ApplyQuick(&*no_quick);
  EXPECT_FALSE(status.ok());
  EXPECT_TRUE(Contains(std::string(status.message()), "nq.yaml"));
}

TEST_F(ExperimentTest, ArmWithoutNameNamesFileAndLine) {
  const std::string error = ParseError(R"(base: base.yaml
seeds: [1]
arms:
  - name: a
  - description: "forgot the name"
    overrides: [trainer.lambda=2]
)");
  EXPECT_TRUE(Contains(error, "abl.yaml:5: arm #2"));
  EXPECT_TRUE(Contains(error, "has no name"));
}

TEST_F(ExperimentTest, StructuralErrorsNameFileAndLine) {
  EXPECT_TRUE(Contains(ParseError("base: base.yaml\nseeds: [1]\nmodes: 3\narms: [{name: a}]\n"), "abl.yaml:3: unknown key 'modes'"));
  EXPECT_TRUE(Contains(ParseError("base: base.yaml\nseeds: [1, two]\narms: [{name: a}]\n"), "abl.yaml:2: seed 'two'"));
  EXPECT_TRUE(Contains(ParseError("base: base.yaml\nseeds: [1, -4]\narms: [{name: a}]\n"), "abl.yaml:2: seed '-4'"));
  EXPECT_TRUE(Contains(ParseError("base: base.yaml\nseeds: [1]\narms:\n  - name: a\n  - name: a\n"), "abl.yaml:5: arm 'a' is defined twice"));
  EXPECT_TRUE(Contains(ParseError("base: base.yaml\nseeds: [1]\narms:\n  - name: a\n    colour: red\n"), "abl.yaml:5: unknown arm key 'colour'"));
  EXPECT_TRUE(Contains(ParseError("base: base.yaml\nseeds: [1]\narms:\n  - name: a/b\n"), "abl.yaml:4: arm name 'a/b'"));
  EXPECT_TRUE(Contains(ParseError("base: base.yaml\nseeds: [1]\narms:\n  - name: a\n    overrides: [lambda]\n"), "abl.yaml:5: overrides: expected key=value"));
  EXPECT_TRUE(Contains(ParseError("base: base.yaml\nseeds: [1]\noverrides: [trainer.seed=4]\narms: [{name: a}]\n"), "abl.yaml:3: overrides: 'trainer.seed' is set by kappa experiment"));
  EXPECT_TRUE(Contains(ParseError("seeds: [1]\narms: [{name: a}]\n"), "abl.yaml:1: missing 'base'"));
  EXPECT_TRUE(Contains(ParseError("base: base.yaml\nseeds: [1]\narms: [{name: a}\n"), "abl.yaml:"));
  EXPECT_EQ(ParseError("base: base.yaml\nseeds: [1]\narms: [{name: a}]\n"), "");
}

TEST_F(ExperimentTest, BaselineDefaultsToNaiveAndMustNameAnArm) {
  auto baseline_of = [&](const std::string& text) {
    absl::StatusOr<AblationSpec> spec = LoadAblationSpec(Write("abl.yaml", text));
    EXPECT_TRUE(spec.ok()) << spec.status();
    return spec.ok() ? spec->baseline : std::string("<error>");
  };
  EXPECT_EQ(baseline_of("base: base.yaml\nseeds: [1]\narms: [{name: a}, {name: naive}]\n"), "naive")
      << "no key: the arm named naive";
  EXPECT_EQ(baseline_of("base: base.yaml\nseeds: [1]\narms: [{name: a}, {name: b}]\n"), "")
      << "no key and no naive arm: none";
  EXPECT_EQ(baseline_of("base: base.yaml\nseeds: [1]\nbaseline: b\narms: [{name: naive}, "
                        "{name: b}]\n"),
            "b")
      << "the key may come before the arms";
  EXPECT_EQ(baseline_of("base: base.yaml\nseeds: [1]\narms: [{name: naive}]\nbaseline:\n"), "")
      << "an empty value asks for none";
  EXPECT_EQ(baseline_of("base: base.yaml\nseeds: [1]\narms: [{name: naive}]\nbaseline: null\n"),
            "");

  EXPECT_TRUE(Contains(
      ParseError("base: base.yaml\nseeds: [1]\nbaseline: naiv\narms: [{name: a}, {name: naive}]\n"),
      "abl.yaml:3: 'baseline': 'naiv' is not an arm (arms: a, naive)"));
  EXPECT_TRUE(
      Contains(ParseError("base: base.yaml\nseeds: [1]\narms: [{name: a}]\nbaseline: [a]\n"),
               "abl.yaml:4: 'baseline' expects the name of an arm"));
  EXPECT_TRUE(
      Contains(ParseError("base: base.yaml\nseeds: [1]\nbaseline: {x: 1}\narms: [{name: a}]\n"),
               "abl.yaml:3: 'baseline' expects"));
}

TEST_F(ExperimentTest, ParsesATrendAndRefusesABadOne) {
  absl::StatusOr<AblationSpec> spec = LoadAblationSpec(Write("abl.yaml", R"(base: base.yaml
seeds: [1]
trend:
  metric: eval_accuracy_auc
  against: kappa_effective_median
  log10: true
  arms: [a, b]
arms: [{name: a}, {name: b}, {name: c}]
)"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(spec->trend);
  EXPECT_EQ(spec->trend->metric, "eval_accuracy_auc");
  EXPECT_EQ(spec->trend->against, "kappa_effective_median");
  EXPECT_TRUE(spec->trend->log10);
  EXPECT_EQ(spec->trend->arms, (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(LoadAblationSpec(Write("abl.yaml", kGoodAblation))->trend) << "no key: no trend";

  const std::string head = "base: base.yaml\nseeds: [1]\narms: [{name: a}, {name: b}]\n";
  EXPECT_TRUE(Contains(ParseError(head + "trend: {metric: m, against: x, arms: [a, z]}\n"),
                       "abl.yaml:4: 'trend.arms': 'z' is not an arm"));
  EXPECT_TRUE(Contains(ParseError(head + "trend: {metric: m, against: x, arms: [a]}\n"),
                       "'trend.arms' expects a list of at least two arms"));
  EXPECT_TRUE(Contains(ParseError(head + "trend: {metric: m, arms: [a, b]}\n"),
                       "abl.yaml:4: 'trend' needs metric, against and arms"));
  EXPECT_TRUE(
      Contains(ParseError(head + "trend: {metric: m, against: x, log10: yes, arms: [a, b]}\n"),
               "'trend.log10' expects true or false"));
  EXPECT_TRUE(
      Contains(ParseError(head + "trend: {metric: m, against: x, slope: 1, arms: [a, b]}\n"),
               "unknown key 'trend.slope'"));
}

TEST_F(ExperimentTest, UnknownOverrideKeyNamesTheArm) {
  absl::StatusOr<AblationSpec> spec = LoadAblationSpec(Write("abl.yaml", R"(base: base.yaml
seeds: [1, 2]
arms:
  - name: fine
    overrides: [trainer.lambda=2]
  - name: typo
    overrides: [trainer.lambdaa=2]
)"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<std::vector<services::Config>> configs =
      ResolveRunConfigs(*spec, PlanRuns(*spec, dir_));
  ASSERT_FALSE(configs.ok());
  const std::string error(configs.status().message());
  EXPECT_TRUE(Contains(error, "abl.yaml:6: arm 'typo'"));
  EXPECT_TRUE(Contains(error, "trainer.lambdaa"));

  // A wrong type too, and a mistake in the common overrides is not blamed on
  // an arm.
  spec->arms[1].overrides = {"trainer.steps=many"};
  configs = ResolveRunConfigs(*spec, PlanRuns(*spec, dir_));
  ASSERT_FALSE(configs.ok());
  EXPECT_TRUE(Contains(std::string(configs.status().message()), "arm 'typo'"));
  EXPECT_TRUE(Contains(std::string(configs.status().message()), "many"));
  spec->arms[1].overrides.clear();
  ASSERT_TRUE(AppendCommonOverrides(&*spec, {"trainer.stepz=3"}).ok());
  configs = ResolveRunConfigs(*spec, PlanRuns(*spec, dir_));
  ASSERT_FALSE(configs.ok());
  EXPECT_TRUE(Contains(std::string(configs.status().message()), "common overrides"));
  EXPECT_FALSE(Contains(std::string(configs.status().message()), "arm '"));

  EXPECT_FALSE(AppendCommonOverrides(&*spec, {"runs_dir=/x"}).ok());
}

TEST_F(ExperimentTest, ShippedAblationFileIsValid) {
  const std::string path = std::string(KAPPA_SOURCE_DIR) + "/configs/ablation.yaml";
  absl::StatusOr<AblationSpec> spec = LoadAblationSpec(path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(fs::path(spec->base_config).filename(), "demo.yaml");
  EXPECT_EQ(spec->seeds, (std::vector<uint64_t>{1, 2, 3}));
  std::vector<std::string> names;
  for (const AblationArm& arm : spec->arms) {
    names.push_back(arm.name);
    EXPECT_FALSE(arm.description.empty()) << arm.name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"grpo_only", "opd_only", "naive", "naive_high_kappa",
                                             "m3_norm", "m3_mask", "m3_project", "m3_adapt",
                                             "m3_norm_project", "rstg"}));
  EXPECT_EQ(spec->baseline, "naive");

  absl::StatusOr<std::vector<services::Config>> configs =
      ResolveRunConfigs(*spec, PlanRuns(*spec, dir_));
  ASSERT_TRUE(configs.ok()) << configs.status();
  ASSERT_EQ(configs->size(), 30u);
  auto config_of = [&](const std::string& arm) -> const services::Config& {
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == arm) return (*configs)[i * 3];
    }
    return (*configs)[0];
  };
  EXPECT_EQ(config_of("grpo_only").trainer.distill_gate, services::DistillGate::kNone);
  EXPECT_EQ(config_of("grpo_only").trainer.steps, 250);
  EXPECT_EQ(config_of("grpo_only").trainer.eval_every, 125);
  EXPECT_EQ(config_of("opd_only").trainer.reward_weight, 0.0);
  EXPECT_EQ(config_of("naive").trainer.balance,
            (std::vector<services::BalanceMethod>{services::BalanceMethod::kNaive}));
  EXPECT_DOUBLE_EQ(config_of("naive_high_kappa").trainer.lambda, 0.002);
  EXPECT_EQ(config_of("m3_mask").trainer.balance,
            (std::vector<services::BalanceMethod>{services::BalanceMethod::kM3Mask}));
  EXPECT_EQ(config_of("m3_norm_project").trainer.balance,
            (std::vector<services::BalanceMethod>{services::BalanceMethod::kM3Norm,
                                                  services::BalanceMethod::kM3Project}));
  EXPECT_EQ(config_of("rstg").trainer.distill_gate, services::DistillGate::kRstg);
  // Every arm shares the base's bootstrap cache.
  for (const services::Config& config : *configs) {
    EXPECT_EQ(config.data_dir, (*configs)[0].data_dir);
  }

  ASSERT_TRUE(ApplyQuick(&*spec).ok());
  configs = ResolveRunConfigs(*spec, PlanRuns(*spec, dir_));
  ASSERT_TRUE(configs.ok()) << configs.status();
  ASSERT_EQ(configs->size(), 10u);
  EXPECT_EQ((*configs)[0].trainer.steps, 100);
}

// The science experiments (issue 20) and their shared testbed: every run of
// every file resolves, the arms set what their names say, and --quick keeps
// one seed.
struct ScienceFile {
  std::string file;
  size_t arms;
  int64_t steps = 1500;  // trainer.steps of every run
};

TEST_F(ExperimentTest, ShippedScienceExperimentsAreValid) {
  const std::string dir = std::string(KAPPA_SOURCE_DIR) + "/configs/experiments/";
  for (const ScienceFile& file :
       {ScienceFile{"unreliable_teacher.yaml", 5}, ScienceFile{"kappa_regimes.yaml", 10},
        ScienceFile{"all_zero_groups.yaml", 4}, ScienceFile{"second_task.yaml", 1, 3000},
        ScienceFile{"teacher_error.yaml", 8, 1000}, ScienceFile{"mirror_control.yaml", 2, 1000},
        ScienceFile{"silent_grpo.yaml", 5}, ScienceFile{"kappa_threshold.yaml", 9, 1000}}) {
    SCOPED_TRACE(file.file);
    absl::StatusOr<AblationSpec> spec = LoadAblationSpec(dir + file.file);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(fs::path(spec->base_config).filename(), "testbed.yaml");
    ASSERT_EQ(spec->arms.size(), file.arms);
    absl::StatusOr<std::vector<services::Config>> configs =
        ResolveRunConfigs(*spec, PlanRuns(*spec, dir_));
    ASSERT_TRUE(configs.ok()) << configs.status();
    ASSERT_EQ(configs->size(), 3 * file.arms);
    for (const services::Config& config : *configs) {
      EXPECT_EQ(config.task.heldout_size, 1000);
      EXPECT_EQ(config.trainer.eval_examples, 1000);
      EXPECT_EQ(config.task.heldout_draw, services::HeldOutDraw::kInterleaved);
      EXPECT_EQ(config.trainer.steps, file.steps);
    }
    if (file.file == "unreliable_teacher.yaml") {
      EXPECT_EQ((*configs)[0].teacher.bootstrap.corrupt, "hundreds_plus_one");
      EXPECT_EQ((*configs)[3].trainer.distill_gate, services::DistillGate::kNone);  // grpo_only
    } else if (file.file == "kappa_regimes.yaml") {
      EXPECT_DOUBLE_EQ((*configs)[4 * 3].trainer.lambda, 0.001);  // naive_l0.001
      EXPECT_EQ((*configs)[9 * 3].trainer.balance,
                (std::vector<services::BalanceMethod>{services::BalanceMethod::kM3Norm}));
      EXPECT_DOUBLE_EQ((*configs)[9 * 3].trainer.kappa_target, 50.0);
    } else if (file.file == "second_task.yaml") {
      EXPECT_EQ((*configs)[0].task.operators, "+-");
      EXPECT_DOUBLE_EQ((*configs)[0].teacher.bootstrap.target_accuracy, 0.99);
      EXPECT_DOUBLE_EQ((*configs)[0].student.bootstrap.target_accuracy, 0.43);
      EXPECT_EQ((*configs)[0].task.train_size, 16000);
    } else if (file.file == "teacher_error.yaml") {
      EXPECT_EQ((*configs)[0].teacher.bootstrap.corrupt, "hundreds_plus_one");
      EXPECT_EQ((*configs)[0].monitor.kdr_exact_every, 25);
      EXPECT_EQ((*configs)[4 * 3].m3.mask_target,
                services::MaskTarget::kDistill);  // m3_mask_distill
      EXPECT_EQ((*configs)[3 * 3].trainer.lambda_schedule,
                services::Schedule::kCosine);  // lambda_cosine
    } else if (file.file == "mirror_control.yaml") {
      EXPECT_EQ((*configs)[0].student.bootstrap.corrupt, "hundreds_plus_one");
      EXPECT_TRUE((*configs)[0].teacher.bootstrap.corrupt.empty());
      EXPECT_DOUBLE_EQ((*configs)[0].student.bootstrap.corrupt_fraction, 0.8);
    } else if (file.file == "silent_grpo.yaml") {
      EXPECT_DOUBLE_EQ((*configs)[0].teacher.bootstrap.target_accuracy, 0.78);
      EXPECT_EQ((*configs)[3 * 3].rstg.token_selector,
                services::RstgTokenSelector::kUnion);  // rstg_union
    } else if (file.file == "kappa_threshold.yaml") {
      EXPECT_DOUBLE_EQ((*configs)[3 * 3].trainer.lambda, 1e-5);
      EXPECT_EQ((*configs)[6 * 3].trainer.balance,
                (std::vector<services::BalanceMethod>{services::BalanceMethod::kM3Adapt}));
      EXPECT_EQ((*configs)[7 * 3].seed, 2u);  // naive_l1_draw2
      ASSERT_TRUE(spec->trend);
      EXPECT_EQ(spec->trend->arms.size(), 4u);
      EXPECT_TRUE(spec->trend->log10);
    } else {
      EXPECT_EQ((*configs)[0].student.bootstrap.steps, 200);
      EXPECT_EQ((*configs)[3].trainer.distill_gate, services::DistillGate::kRstg);
    }
    ASSERT_TRUE(ApplyQuick(&*spec).ok());
    configs = ResolveRunConfigs(*spec, PlanRuns(*spec, dir_));
    ASSERT_TRUE(configs.ok()) << configs.status();
    EXPECT_EQ(configs->size(), file.arms);
  }
}

// --- results

nlohmann::json Step(int64_t step, double distill) {
  return {{"step", step}, {"reward_mean", 0.1 * step}, {"loss_reward", 0.0},
          {"loss_distill", distill}, {"elapsed_seconds", 0.5 * step}};
}

// Steps 1..8, L_D 8, 7, ..., 1; κ on some steps, null or missing on others;
// alarms at steps 3 (two kinds) and 6; evals at 0, 4 and 8.
std::vector<nlohmann::json> SyntheticRun(double final_accuracy) {
  std::vector<nlohmann::json> records = {{{"step", 0}, {"eval_accuracy", 0.1}}};
  for (int64_t step = 1; step <= 8; ++step) {
    nlohmann::json record = Step(step, 9.0 - static_cast<double>(step));
    if (step % 2 == 0) {
      record["kappa"] = static_cast<double>(step);  // 2, 4, 6, 8
      record["kappa_effective"] = 10.0 * step;
    }
    if (step == 3) record["kappa"] = nullptr;
    record["kdr_negative_fraction"] = step <= 4 ? 0.2 : 0.4;
    if (step != 5) record["kdr_negative_weighted_fraction"] = 0.1 * step;
    if (step == 3) {
      record["alarms"] = {{{"kind", "magnitude_drowning"}, {"step", 3}, {"message", "m"}},
                          {{"kind", "collapse"}, {"step", 3}}};
    }
    if (step == 6) record["alarms"] = {{{"kind", "magnitude_drowning"}, {"step", 6}}};
    if (step == 4) record["eval_accuracy"] = 0.2;
    if (step == 8) record["eval_accuracy"] = final_accuracy;
    records.push_back(record);
  }
  return records;
}

TEST(ExperimentResultsTest, SummarizesOneRun) {
  const RunMetrics m = SummarizeMetrics(SyntheticRun(0.75));
  EXPECT_EQ(m.records, 8);
  EXPECT_EQ(m.last_step, 8);
  ASSERT_TRUE(m.final_accuracy);
  EXPECT_DOUBLE_EQ(*m.final_accuracy, 0.75);
  EXPECT_EQ(m.final_accuracy_step, 8);
  // Evaluations 0.1 (step 0), 0.2 (4), 0.75 (8): the peak is the last; the
  // area is (0.15·4 + 0.475·4) / 8.
  EXPECT_EQ(m.peak_accuracy, 0.75);
  EXPECT_EQ(m.peak_accuracy_step, 8);
  ASSERT_TRUE(m.accuracy_auc);
  EXPECT_NEAR(*m.accuracy_auc, 0.3125, 1e-12);
  // A run that peaks early and falls: the peak keeps its step.
  const RunMetrics falls = SummarizeMetrics(SyntheticRun(0.05));
  EXPECT_EQ(falls.peak_accuracy, 0.2);
  EXPECT_EQ(falls.peak_accuracy_step, 4);
  // Quarters of 8 steps: steps 1-2 (L_D 8, 7) and 7-8 (L_D 2, 1).
  ASSERT_TRUE(m.distill_first_quarter && m.distill_last_quarter && m.distill_trend);
  EXPECT_DOUBLE_EQ(*m.distill_first_quarter, 7.5);
  EXPECT_DOUBLE_EQ(*m.distill_last_quarter, 1.5);
  EXPECT_DOUBLE_EQ(*m.distill_trend, -6.0);
  ASSERT_TRUE(m.reward_last_quarter);
  EXPECT_NEAR(*m.reward_last_quarter, 0.75, 1e-12);
  // κ over 2, 4, 6, 8 only: the null at step 3 and the missing odd steps are
  // skipped, not read as 0.
  ASSERT_TRUE(m.kappa_median);
  EXPECT_DOUBLE_EQ(*m.kappa_median, 5.0);
  ASSERT_TRUE(m.kappa_effective_median);
  EXPECT_DOUBLE_EQ(*m.kappa_effective_median, 50.0);
  ASSERT_TRUE(m.kdr_negative_fraction_median);
  EXPECT_DOUBLE_EQ(*m.kdr_negative_fraction_median, 0.3);
  ASSERT_TRUE(m.kdr_negative_weighted_fraction_median);
  EXPECT_DOUBLE_EQ(*m.kdr_negative_weighted_fraction_median, 0.4);  // of .1 .2 .3 .4 .6 .7 .8
  EXPECT_EQ(m.alarms.at("magnitude_drowning").count, 2);
  EXPECT_EQ(m.alarms.at("magnitude_drowning").first_step, 3);
  EXPECT_EQ(m.alarms.at("collapse").count, 1);
  EXPECT_EQ(m.alarms.at("collapse").first_step, 3);
  EXPECT_EQ(m.alarms.at("directional_conflict").count, 0);
  EXPECT_FALSE(m.alarms.at("directional_conflict").first_step);
  ASSERT_TRUE(m.train_seconds);
  EXPECT_DOUBLE_EQ(*m.train_seconds, 4.0);
}

// The learner writes cos 0 where a gradient is zero (GRPO alone, nothing
// distilled); those steps have no angle and leave the median, and a run
// with no angle at all has none.
TEST(ExperimentResultsTest, GradCosineMedianSkipsStepsWithAZeroGradient) {
  std::vector<nlohmann::json> records;
  const double cosines[] = {0.5, 0.0, 0.7, 0.0, 0.6};
  const double distill_norms[] = {1.0, 0.0, 2.0, 0.0, 1.5};
  for (int64_t step = 1; step <= 5; ++step) {
    nlohmann::json record = Step(step, 1.0);
    record["grad_norm_reward"] = 0.3;
    record["grad_norm_distill"] = distill_norms[step - 1];
    record["grad_cosine"] = cosines[step - 1];
    records.push_back(record);
  }
  records.push_back(Step(6, 1.0));  // not measured: no norms, no cosine
  EXPECT_EQ(SummarizeMetrics(records).grad_cosine_median, 0.6) << "median of 0.5, 0.7, 0.6";
  for (nlohmann::json& record : records) record["grad_norm_distill"] = 0.0;
  EXPECT_FALSE(SummarizeMetrics(records).grad_cosine_median);
}

TEST(ExperimentResultsTest, MissingFieldsStayUnset) {
  const RunMetrics m = SummarizeMetrics({{{"step", 0}}, {{"step", 1}, {"reward_mean", 0.5}}});
  EXPECT_EQ(m.records, 1);
  EXPECT_FALSE(m.final_accuracy);
  EXPECT_FALSE(m.distill_trend);
  EXPECT_FALSE(m.kappa_median);
  EXPECT_FALSE(m.kdr_negative_fraction_median);
  EXPECT_FALSE(m.train_seconds);
}

TEST(ExperimentResultsTest, StepsThatDistilledNothingHaveNoDistillLoss) {
  // GRPO only: every step logs loss_distill 0 over 0 positions.
  std::vector<nlohmann::json> grpo;
  for (int64_t step = 1; step <= 8; ++step) {
    nlohmann::json record = Step(step, 0.0);
    record["distill_positions"] = 0;
    grpo.push_back(record);
  }
  EXPECT_FALSE(SummarizeMetrics(grpo).distill_trend) << "no L_D, not an L_D of 0";
  // RSTG: only some steps distil; the quarters are over those.
  std::vector<nlohmann::json> rstg = grpo;
  rstg[1]["loss_distill"] = 4.0;
  rstg[1]["distill_positions"] = 12;
  rstg[6]["loss_distill"] = 1.0;
  rstg[6]["distill_positions"] = 3;
  const RunMetrics m = SummarizeMetrics(rstg);
  ASSERT_TRUE(m.distill_trend);
  EXPECT_DOUBLE_EQ(*m.distill_first_quarter, 4.0);
  EXPECT_DOUBLE_EQ(*m.distill_last_quarter, 1.0);
}

TEST(ExperimentResultsTest, ResumedStepsCountOnce) {
  std::vector<nlohmann::json> records = SyntheticRun(0.5);
  // A resume from step 6 repeats steps 7 and 8 with new numbers.
  records.push_back(Step(7, 20.0));
  nlohmann::json last = Step(8, 30.0);
  last["eval_accuracy"] = 0.9;
  records.push_back(last);
  const RunMetrics m = SummarizeMetrics(records);
  EXPECT_EQ(m.records, 8);
  EXPECT_DOUBLE_EQ(*m.final_accuracy, 0.9);
  EXPECT_DOUBLE_EQ(*m.distill_last_quarter, 25.0);
}

TEST(ExperimentResultsTest, AggregateIsMeanAndSampleStd) {
  std::optional<MeanEstimate> a = Aggregate({1.0, std::nullopt, 2.0, 3.0});
  ASSERT_TRUE(a);
  EXPECT_EQ(a->n, 3);
  EXPECT_DOUBLE_EQ(a->mean, 2.0);
  EXPECT_DOUBLE_EQ(a->std, 1.0);
  ASSERT_TRUE(a->ci_half_width);
  EXPECT_NEAR(*a->ci_half_width, 4.302653 / std::sqrt(3.0), 1e-5);
  a = Aggregate({4.0});
  ASSERT_TRUE(a);
  EXPECT_DOUBLE_EQ(a->std, 0.0);
  EXPECT_FALSE(a->ci_half_width) << "one value: no interval";
  EXPECT_FALSE(Aggregate({std::nullopt}));
  EXPECT_FALSE(Median({}));
  EXPECT_DOUBLE_EQ(*Median({3.0, 1.0, 2.0}), 2.0);
  EXPECT_DOUBLE_EQ(*Median({4.0, 1.0, 2.0, 3.0}), 2.5);
}

// Writes `records` as a metrics.jsonl and reads it back the way the
// experiment does.
RunMetrics ThroughFile(const std::string& path, const std::vector<nlohmann::json>& records,
                       const std::string& trailer = "") {
  std::string text;
  for (const nlohmann::json& record : records) text += record.dump() + "\n";
  WriteFile(path, text + trailer);
  absl::StatusOr<RunMetrics> metrics = ReadRunMetrics(path);
  EXPECT_TRUE(metrics.ok()) << metrics.status();
  return metrics.ok() ? *metrics : RunMetrics{};
}

// Splits "| a | b |" into its cells.
std::vector<std::string> Cells(const std::string& row) {
  std::vector<std::string> cells;
  size_t start = row.find('|');
  while (start != std::string::npos) {
    size_t end = row.find(" |", start + 1);
    if (end == std::string::npos) break;
    std::string cell = row.substr(start + 1, end - start - 1);
    cell.erase(0, cell.find_first_not_of(' '));
    cells.push_back(cell);
    start = end + 1;
  }
  return cells;
}

std::string RowOf(const std::string& markdown, const std::string& arm) {
  const size_t at = markdown.find("| " + arm + " |");
  if (at == std::string::npos) return "";
  return markdown.substr(at, markdown.find('\n', at) - at);
}

TEST_F(ExperimentTest, ReportsMeanAndStdPerArmFromMetricsFiles) {
  std::vector<RunResult> runs;
  const double accuracies[] = {0.5, 0.6, 0.7};
  for (int seed = 1; seed <= 3; ++seed) {
    RunResult run;
    run.arm = "mixed";
    run.seed = seed;
    run.name = "mixed-s" + std::to_string(seed);
    run.status = "ok";
    run.wall_seconds = 10.0 * seed;
    std::vector<nlohmann::json> records = SyntheticRun(accuracies[seed - 1]);
    if (seed == 3) records[7]["alarms"] = {{{"kind", "directional_conflict"}, {"step", 7}}};
    run.metrics = ThroughFile(dir_ + "/" + run.name + ".jsonl", records);
    runs.push_back(run);
  }
  // An arm whose metrics have no κ, no K_DR and no evaluation, and a run that
  // failed before writing any metrics.
  RunResult bare;
  bare.arm = "bare";
  bare.seed = 1;
  bare.name = "bare-s1";
  bare.status = "ok";
  bare.wall_seconds = 5.0;
  bare.metrics = ThroughFile(dir_ + "/bare.jsonl",
                             {{{"step", 1}, {"loss_distill", 2.0}}, {{"step", 2}, {"loss_distill", 3.0}}},
                             "{\"step\": 3, \"loss_di");  // killed mid-line
  EXPECT_EQ(bare.metrics->skipped_lines, 1);
  runs.push_back(bare);
  RunResult broken;
  broken.arm = "bare";
  broken.seed = 2;
  broken.name = "bare-s2";
  broken.status = "failed";
  broken.error = "kappa run exited with status 1, see \"log\"";
  broken.wall_seconds = 1.0;
  runs.push_back(broken);
  EXPECT_EQ(ReadRunMetrics(dir_ + "/none.jsonl").status().code(), absl::StatusCode::kNotFound);

  const std::vector<AblationArm> arms = {{"mixed", "both | signals", {"trainer.lambda=1"}, 1},
                                         {"bare", "", {}, 2}};
  const std::string md = ResultsMarkdown("t", "context line", arms, runs, "");
  EXPECT_TRUE(Contains(md, "mean ± half-width of the 95 % confidence interval"));
  const std::vector<std::string> mixed = Cells(RowOf(md, "mixed"));
  ASSERT_EQ(mixed.size(), 20u) << md;
  EXPECT_EQ(mixed[1], "3/3");
  // 0.5, 0.6, 0.7: std 0.1, half-width t_{.975,2} 4.303 x 0.1 / √3 = 0.248.
  EXPECT_EQ(mixed[2], "0.600 ± 0.248");  // final accuracy
  EXPECT_EQ(mixed[5], "0.750 ± 0.000");  // reward, last quarter
  EXPECT_EQ(mixed[6], "7.5 ± 0");        // L_D first quarter
  EXPECT_EQ(mixed[7], "1.5 ± 0");        // L_D last quarter
  EXPECT_EQ(mixed[8], "-6 ± 0");         // trend (signed; no sign on the half-width)
  EXPECT_EQ(mixed[9], "5 ± 0");          // κ median
  EXPECT_EQ(mixed[10], "50 ± 0");        // κ_eff median
  EXPECT_EQ(mixed[11], "0.300 ± 0.000");
  EXPECT_EQ(mixed[12], "0.400 ± 0.000");
  EXPECT_EQ(mixed[15], "2 ± 0 (first @3)");         // magnitude_drowning
  EXPECT_EQ(mixed[16], "0.333 ± 1.43 (first @7)");  // directional_conflict: 0, 0, 1
  EXPECT_EQ(mixed[17], "1 ± 0 (first @3)");         // collapse
  EXPECT_EQ(mixed[18], "0 ± 0");                    // inference_mismatch
  EXPECT_EQ(mixed[19], "20 ± 25");                  // wall seconds: 10, 20, 30

  const std::vector<std::string> bare_row = Cells(RowOf(md, "bare"));
  ASSERT_EQ(bare_row.size(), 20u) << md;
  EXPECT_EQ(bare_row[1], "1/2");
  EXPECT_EQ(bare_row[2], "–") << "no evaluation: a dash, not 0";
  EXPECT_EQ(bare_row[8], "+1 ± –") << "one run: no interval";
  EXPECT_EQ(bare_row[9], "–");
  EXPECT_EQ(bare_row[10], "–");
  EXPECT_EQ(bare_row[11], "–");
  EXPECT_EQ(bare_row[15], "0 ± –");
  EXPECT_TRUE(Contains(md, "No baseline arm"));
  EXPECT_TRUE(Contains(md, "context line"));
  EXPECT_TRUE(Contains(md, "- `mixed`: both | signals (`trainer.lambda=1`)"));
  EXPECT_TRUE(Contains(md, "`bare-s2`: failed: kappa run exited with status 1"));

  const std::string csv = ResultsCsv(runs);
  std::vector<std::string> lines;
  for (size_t start = 0, nl; (nl = csv.find('\n', start)) != std::string::npos; start = nl + 1) {
    lines.push_back(csv.substr(start, nl - start));
  }
  ASSERT_EQ(lines.size(), 6u) << csv;
  EXPECT_TRUE(Contains(lines[0], "arm,seed,name,status,wall_seconds"));
  EXPECT_TRUE(Contains(lines[0], "kappa_median"));
  EXPECT_TRUE(Contains(lines[0], "alarms_directional_conflict,first_step_directional_conflict"));
  EXPECT_TRUE(Contains(lines[1], "mixed,1,mixed-s1,ok,10,4,8,0.5,8,7.5,1.5,-6,"));
  EXPECT_TRUE(Contains(lines[3], ",1,7,"));  // seed 3: one directional_conflict at step 7
  // bare-s1: no eval, no κ: empty cells, not 0.
  EXPECT_TRUE(Contains(lines[0], "alarms_inference_mismatch,first_step_inference_mismatch"));
  EXPECT_TRUE(Contains(lines[4], "bare,1,bare-s1,ok,5,,2,,,2,3,1,,,,,,0,,0,,0,,0,,0,"));
  EXPECT_TRUE(Contains(lines[5], "bare,2,bare-s2,failed,1,"));
  EXPECT_TRUE(Contains(lines[5], "\"kappa run exited with status 1, see \"\"log\"\"\""));
}

// --- statistics

TEST(StatsTest, StudentTQuantileMatchesTheTables) {
  // t_{0.975, df}, as tabulated.
  EXPECT_NEAR(StudentTQuantile(0.975, 1), 12.706, 5e-4);
  EXPECT_NEAR(StudentTQuantile(0.975, 2), 4.303, 5e-4);
  EXPECT_NEAR(StudentTQuantile(0.975, 4), 2.776, 5e-4);
  EXPECT_NEAR(StudentTQuantile(0.975, 9), 2.262, 5e-4);
  EXPECT_NEAR(StudentTQuantile(0.975, 30), 2.042, 5e-4);
  EXPECT_NEAR(StudentTQuantile(0.975, std::numeric_limits<double>::infinity()), 1.960, 5e-4);
  EXPECT_NEAR(StudentTQuantile(0.975, 1e7), 1.960, 5e-4) << "large df tends to the normal";
  EXPECT_NEAR(StudentTQuantile(0.95, 4), 2.132, 5e-4);
  EXPECT_NEAR(StudentTQuantile(0.025, 4), -2.776, 5e-4) << "symmetric";
  EXPECT_EQ(StudentTQuantile(0.5, 3), 0.0);
  EXPECT_TRUE(std::isnan(StudentTQuantile(1.5, 3)));
  EXPECT_TRUE(std::isnan(StudentTQuantile(0.9, 0)));
  // The quantile inverts the CDF.
  for (double df : {1.0, 2.5, 7.0, 60.0}) {
    for (double p : {0.6, 0.9, 0.99, 0.9999}) {
      EXPECT_NEAR(StudentTCdf(StudentTQuantile(p, df), df), p, 1e-10) << df << " " << p;
    }
  }
}

TEST(StatsTest, HolmAdjustsStepDownKeepingTheOrder) {
  // Sorted: 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 → 0.06 (monotone).
  const std::vector<double> adjusted = HolmAdjust({0.01, 0.04, 0.03, 0.005});
  ASSERT_EQ(adjusted.size(), 4u);
  EXPECT_NEAR(adjusted[0], 0.03, 1e-15);
  EXPECT_NEAR(adjusted[1], 0.06, 1e-15);
  EXPECT_NEAR(adjusted[2], 0.06, 1e-15);
  EXPECT_NEAR(adjusted[3], 0.02, 1e-15);
  EXPECT_EQ(HolmAdjust({0.6, 0.7})[1], 1.0) << "capped at 1";
  EXPECT_TRUE(HolmAdjust({}).empty());
}

// The power against an independent estimate: simulated paired samples
// tested the same way (two-sided t at α), 200,000 draws each.
TEST(StatsTest, PairedTPowerMatchesSimulation) {
  std::mt19937_64 random(20261205);
  for (const auto& [n, effect, sd, alpha] :
       std::vector<std::tuple<int, double, double, double>>{{3, 1.0, 1.0, 0.05},
                                                            {3, 0.2, 0.05, 0.05 / 4},
                                                            {5, 0.1, 0.08, 0.0125},
                                                            {10, 0.5, 1.0, 0.05},
                                                            {2, 3.0, 1.0, 0.05}}) {
    std::normal_distribution<double> draw(effect, sd);
    const double critical = StudentTQuantile(1 - alpha / 2, n - 1);
    const int trials = 200000;
    int rejected = 0;
    for (int trial = 0; trial < trials; ++trial) {
      double sum = 0, squares = 0;
      std::vector<double> x(n);
      for (double& v : x) sum += (v = draw(random));
      const double mean = sum / n;
      for (double v : x) squares += (v - mean) * (v - mean);
      const double t = mean / std::sqrt(squares / (n - 1) / n);
      rejected += std::abs(t) > critical;
    }
    const double simulated = static_cast<double>(rejected) / trials;
    EXPECT_NEAR(PairedTPower(n, effect, sd, alpha), simulated, 0.004)
        << "n " << n << " effect " << effect << " sd " << sd << " alpha " << alpha;
  }
  // No effect: the power is the level; large n: the normal approximation.
  EXPECT_NEAR(PairedTPower(4, 0.0, 1.0, 0.05), 0.05, 1e-6);
  const double z = 1.959964, shift = 0.3 * std::sqrt(400.0);
  EXPECT_NEAR(PairedTPower(400, 0.3, 1.0, 0.05), 0.5 * std::erfc(-(shift - z) / std::sqrt(2.0)),
              2e-3);
  EXPECT_TRUE(std::isnan(PairedTPower(1, 0.1, 1.0, 0.05)));
  EXPECT_TRUE(std::isnan(PairedTPower(3, 0.1, 0.0, 0.05)));
}

// Against numpy.linalg.lstsq on the same points, and the t CDF's closed form
// for 3 df: F(t) = 1/2 + (u/(1 + u²) + atan u)/π with u = t/√3.
TEST(StatsTest, FitLineMatchesAnIndependentLeastSquares) {
  const std::optional<LineFit> fit = FitLine({0, 1, 2, 3, 4}, {1, 3, 2, 5, 4});
  ASSERT_TRUE(fit);
  EXPECT_EQ(fit->n, 5);
  EXPECT_NEAR(fit->slope, 0.8, 1e-12);
  EXPECT_NEAR(fit->intercept, 1.4, 1e-12);
  EXPECT_NEAR(fit->slope_standard_error, 0.3464101615137754, 1e-12);
  EXPECT_NEAR(fit->t, 2.3094010767585034, 1e-10);
  EXPECT_NEAR(fit->p_value, 0.10408803866182792, 1e-9);
  EXPECT_NEAR(fit->ci_half_width, 1.1024317386224394, 1e-8);
  EXPECT_NEAR(fit->r_squared, 0.64, 1e-12);
  // A falling exact line: p 0; a flat one: p 1.
  const std::optional<LineFit> exact = FitLine({1, 2, 3}, {5, 3, 1});
  ASSERT_TRUE(exact);
  EXPECT_NEAR(exact->slope, -2.0, 1e-12);
  EXPECT_EQ(exact->p_value, 0.0);
  EXPECT_EQ(FitLine({1, 2, 3}, {4, 4, 4})->p_value, 1.0);
  // Too few points, one x, or sizes that differ: no line.
  EXPECT_FALSE(FitLine({1, 2}, {1, 2}));
  EXPECT_FALSE(FitLine({2, 2, 2}, {1, 2, 3}));
  EXPECT_FALSE(FitLine({1, 2, 3}, {1, 2}));
}

TEST(StatsTest, StudentTCdfMatchesClosedForms) {
  EXPECT_NEAR(StudentTTwoSidedP(2.776, 4), 0.05, 1e-4);
  EXPECT_NEAR(StudentTTwoSidedP(1.0, 1), 0.5, 1e-12);
  EXPECT_NEAR(StudentTTwoSidedP(-1.0, 1), 0.5, 1e-12);
  EXPECT_NEAR(StudentTTwoSidedP(12.706, 1), 0.05, 1e-5);
  EXPECT_NEAR(StudentTTwoSidedP(1.96, std::numeric_limits<double>::infinity()), 0.05, 1e-4);
  EXPECT_EQ(StudentTTwoSidedP(0.0, 5), 1.0);
  EXPECT_EQ(StudentTTwoSidedP(std::numeric_limits<double>::infinity(), 5), 0.0);
  for (double t : {-3.0, -0.4, 0.7, 2.0, 25.0}) {
    // df 1 is Cauchy; df 2: 1/2 + t / (2 √(2 + t²)); df 4: P(|T| < t) = u (1 + (1 - u²) / 2)
    // with u = t / √(4 + t²).
    EXPECT_NEAR(StudentTCdf(t, 1), 0.5 + std::atan(t) / M_PI, 1e-12) << t;
    EXPECT_NEAR(StudentTCdf(t, 2), 0.5 + t / (2 * std::sqrt(2 + t * t)), 1e-12) << t;
    const double u = std::fabs(t) / std::sqrt(4 + t * t);
    EXPECT_NEAR(StudentTTwoSidedP(t, 4), 1 - u * (1 + (1 - u * u) / 2), 1e-12) << t;
  }
  EXPECT_NEAR(RegularizedIncompleteBeta(2, 3, 0.5), 11.0 / 16, 1e-13);
  EXPECT_NEAR(RegularizedIncompleteBeta(1, 1, 0.3), 0.3, 1e-13);
  EXPECT_EQ(RegularizedIncompleteBeta(2, 3, 0), 0.0);
  EXPECT_EQ(RegularizedIncompleteBeta(2, 3, 1), 1.0);
  EXPECT_TRUE(std::isnan(RegularizedIncompleteBeta(0, 3, 0.5)));
}

TEST(StatsTest, MeanEstimateOfAKnownSample) {
  std::optional<MeanEstimate> e = EstimateMean({1, 2, 3, 4, 5});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->n, 5);
  EXPECT_DOUBLE_EQ(e->mean, 3.0);
  EXPECT_NEAR(e->std, 1.5811, 1e-4);
  ASSERT_TRUE(e->ci_half_width);
  EXPECT_NEAR(*e->ci_half_width, 2.776 * 1.5811 / std::sqrt(5.0), 1e-3);
  EXPECT_NEAR(*e->ci_half_width, 1.963, 1e-3);
  EXPECT_NEAR(*e->ci_low(), 3 - 1.963, 1e-3);
  EXPECT_NEAR(*e->ci_high(), 3 + 1.963, 1e-3);
  // t = 3 / (1.5811 / √5) = √18, df 4: the closed form above.
  const double u = std::sqrt(18.0 / 22.0);
  ASSERT_TRUE(e->p_value);
  EXPECT_NEAR(*e->p_value, 1 - u * (1 + (1 - u * u) / 2), 1e-10);

  e = EstimateMean({0.25});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->n, 1);
  EXPECT_FALSE(e->ci_half_width);
  EXPECT_FALSE(e->ci_low());
  EXPECT_FALSE(e->p_value);
  EXPECT_FALSE(EstimateMean({}));
  // No spread: a zero-width interval; p is 0 off zero, 1 at zero.
  e = EstimateMean({2, 2, 2});
  EXPECT_EQ(*e->ci_half_width, 0.0);
  EXPECT_EQ(*e->p_value, 0.0);
  EXPECT_EQ(*EstimateMean({0, 0})->p_value, 1.0);
  EXPECT_EQ(FormatMeanAndCi(EstimateMean({1, 2, 3, 4, 5}), "%.3f"), "3.000 ± 1.963");
  EXPECT_EQ(FormatMeanAndCi(EstimateMean({0.25}), "%.3f"), "0.250 ± –");
  EXPECT_EQ(FormatMeanAndCi(std::nullopt, "%.3f"), "–");
}

// A finished run of `arm` with only a final accuracy (and, optionally, κ).
RunResult RunWith(const std::string& arm, uint64_t seed, std::optional<double> accuracy,
                  const std::string& status = "ok", std::optional<double> kappa = std::nullopt) {
  RunResult run;
  run.arm = arm;
  run.seed = seed;
  run.name = arm + "-s" + std::to_string(seed);
  run.status = status;
  RunMetrics m;
  m.records = 10;
  m.final_accuracy = accuracy;
  m.kappa_median = kappa;
  run.metrics = m;
  return run;
}

const ArmDifference* FindDifference(const std::vector<ArmDifference>& differences,
                                    const std::string& arm, const std::string& metric) {
  for (const ArmDifference& d : differences) {
    if (d.arm == arm && d.metric == metric) return &d;
  }
  return nullptr;
}

// The trend's points are the runs of its arms that finished with both
// numbers; log10 leaves out x <= 0, naming the run; the line is FitLine's.
TEST(ExperimentResultsTest, TrendFitsEveryRunOfItsArmsAgainstLog10) {
  std::vector<RunResult> runs = {
      RunWith("l1", 1, 0.30, "ok", 0.1),    RunWith("l1", 2, 0.32, "ok", 0.1),
      RunWith("l01", 1, 0.50, "ok", 1.0),   RunWith("l01", 2, 0.49, "ok", 1.0),
      RunWith("l001", 1, 0.71, "ok", 10.0), RunWith("l001", 2, 0.90, "failed", 10.0),
      RunWith("l001", 3, 0.70, "ok", 0.0),  RunWith("other", 1, 0.0, "ok", 100.0)};
  TrendSpec spec;
  spec.metric = "final_eval_accuracy";
  spec.against = "kappa_median";
  spec.log10 = true;
  spec.arms = {"l1", "l01", "l001"};
  const TrendResult trend = FitTrend(spec, runs, ComparedMetrics(runs));
  ASSERT_EQ(trend.points.size(), 5u);
  EXPECT_EQ(trend.points[0].run, "l1-s1");
  EXPECT_NEAR(trend.points[0].x, -1.0, 1e-12);
  EXPECT_NEAR(trend.points[4].x, 1.0, 1e-12);
  EXPECT_EQ(trend.left_out, (std::vector<std::string>{"l001-s2: status failed",
                                                      "l001-s3: kappa_median = 0, no logarithm"}));
  const std::optional<LineFit> expected =
      FitLine({-1, -1, 0, 0, 1}, {0.30, 0.32, 0.50, 0.49, 0.71});
  ASSERT_TRUE(trend.fit && expected);
  EXPECT_NEAR(trend.fit->slope, expected->slope, 1e-12);
  EXPECT_NEAR(trend.fit->p_value, expected->p_value, 1e-12);
  EXPECT_TRUE(Contains(TrendCsv(trend),
                       "run,arm,log10(kappa_median),final_eval_accuracy\nl1-s1,l1,-1,0.3\n"));
  const std::string md = TrendMarkdown(trend);
  EXPECT_TRUE(Contains(md, "## Trend: final_eval_accuracy against log10(kappa_median)"));
  EXPECT_TRUE(Contains(md, absl::StrFormat("slope **%+.4g**", expected->slope)));
  EXPECT_TRUE(Contains(md, "n = 5 runs"));
  EXPECT_TRUE(Contains(md, "(significant at 0.05)"));

  spec.against = "kappa_medain";
  const TrendResult misspelt = FitTrend(spec, runs, ComparedMetrics(runs));
  EXPECT_TRUE(misspelt.points.empty());
  EXPECT_TRUE(Contains(TrendMarkdown(misspelt), "'kappa_medain' is not a results.csv column"));
}

TEST(ExperimentResultsTest, PairedDifferencesPairBySeedOverRunsThatFinished) {
  const std::vector<AblationArm> arms = {
      {"treat", "", {}, 1}, {"naive", "", {}, 2}, {"solo", "", {}, 3}, {"noisy", "", {}, 4}};
  std::vector<RunResult> runs = {
      // naive: seeds 1-4 ok (κ only here), seed 5 failed (its numbers must not count).
      RunWith("naive", 1, 0.50, "ok", 1.0), RunWith("naive", 2, 0.40, "ok", 1.0),
      RunWith("naive", 3, 0.60, "ok", 1.0), RunWith("naive", 4, 0.55, "ok", 1.0),
      RunWith("naive", 5, 0.90, "failed"),
      // treat: +0.10, +0.11, +0.12 on seeds 1-3; seed 4 never ran; seed 5 has no partner.
      RunWith("treat", 1, 0.60), RunWith("treat", 2, 0.51), RunWith("treat", 3, 0.72),
      RunWith("treat", 4, std::nullopt, "not run"), RunWith("treat", 5, 0.10),
      // solo: one pair; noisy: three pairs that do not agree.
      RunWith("solo", 2, 0.45), RunWith("noisy", 1, 0.70), RunWith("noisy", 2, 0.30),
      RunWith("noisy", 3, 0.65)};
  runs[8].metrics.reset();

  const std::vector<ComparedMetric> metrics = ComparedMetrics(runs);
  const std::vector<ArmDifference> differences = PairedDifferences(arms, runs, "naive", metrics);
  EXPECT_EQ(differences.size(), 3 * metrics.size()) << "every arm but the baseline";
  EXPECT_EQ(FindDifference(differences, "naive", "final_eval_accuracy"), nullptr);

  const ArmDifference* treat = FindDifference(differences, "treat", "final_eval_accuracy");
  ASSERT_NE(treat, nullptr);
  EXPECT_EQ(treat->baseline, "naive");
  EXPECT_EQ(treat->n_pairs(), 3) << "seeds 1-3: seed 4 did not run, seed 5 failed in naive";
  ASSERT_TRUE(treat->difference && treat->difference->p_value);
  EXPECT_NEAR(treat->difference->mean, 0.11, 1e-12);
  EXPECT_NEAR(treat->difference->std, 0.01, 1e-12);
  EXPECT_NEAR(*treat->difference->ci_half_width, 4.302653 * 0.01 / std::sqrt(3.0), 1e-6);
  // t = 0.11 / (0.01 / √3), df 2: p = 1 - t / √(2 + t²).
  const double t = 0.11 / (0.01 / std::sqrt(3.0));
  EXPECT_NEAR(*treat->difference->p_value, 1 - t / std::sqrt(2 + t * t), 1e-8);
  // Holm over the family {treat, noisy} (solo has no p): treat's is the
  // smaller, so × 2.
  ASSERT_TRUE(treat->p_holm);
  EXPECT_NEAR(*treat->p_holm, 2 * (1 - t / std::sqrt(2 + t * t)), 1e-8);
  EXPECT_TRUE(treat->significant);
  EXPECT_FALSE(treat->power) << "no effect named";
  // With an effect named, the power at Holm's strictest level, α / 2.
  const ArmDifference* powered = FindDifference(
      PairedDifferences(arms, runs, "naive", metrics, {{"final_eval_accuracy", 0.05}}), "treat",
      "final_eval_accuracy");
  ASSERT_TRUE(powered && powered->power);
  EXPECT_EQ(powered->effect, 0.05);
  EXPECT_NEAR(*powered->power, PairedTPower(3, 0.05, 0.01, 0.025), 1e-12);

  const ArmDifference* noisy = FindDifference(differences, "noisy", "final_eval_accuracy");
  ASSERT_NE(noisy, nullptr);
  EXPECT_EQ(noisy->n_pairs(), 3);
  EXPECT_GT(*noisy->difference->p_value, 0.05);  // +0.2, -0.1, +0.05
  EXPECT_FALSE(noisy->significant);

  const ArmDifference* solo = FindDifference(differences, "solo", "final_eval_accuracy");
  ASSERT_NE(solo, nullptr);
  EXPECT_EQ(solo->n_pairs(), 1);
  EXPECT_NEAR(solo->difference->mean, 0.05, 1e-12);
  EXPECT_FALSE(solo->difference->ci_half_width);
  EXPECT_FALSE(solo->difference->p_value);
  EXPECT_FALSE(solo->significant);
  EXPECT_EQ(FormatDifference(*solo, "%.3f"), "+0.050 [–]");

  // κ only in naive: no pair.
  const ArmDifference* kappa = FindDifference(differences, "treat", "kappa_median");
  ASSERT_NE(kappa, nullptr);
  EXPECT_EQ(kappa->n_pairs(), 0);
  EXPECT_EQ(FormatDifference(*kappa, "%.3f"), "–");

  // Two pairs with a tiny p are still not "significant": too few.
  std::vector<RunResult> two = {RunWith("naive", 1, 0.5), RunWith("naive", 2, 0.5),
                                RunWith("treat", 1, 0.7), RunWith("treat", 2, 0.7001)};
  const ArmDifference* few = FindDifference(
      PairedDifferences(arms, two, "naive", ComparedMetrics(two)), "treat", "final_eval_accuracy");
  ASSERT_NE(few, nullptr);
  EXPECT_LT(*few->difference->p_value, 0.05);
  EXPECT_FALSE(few->significant);

  EXPECT_TRUE(PairedDifferences(arms, runs, "", metrics).empty());
  EXPECT_TRUE(PairedDifferences(arms, runs, "nobody", metrics).empty());

  // The files and the markdown.
  const std::string csv = DifferencesCsv(differences);
  EXPECT_TRUE(Contains(csv,
                       "arm,baseline,metric,n_pairs,mean_diff,ci_low,ci_high,p_value,"
                       "significant,p_holm,effect,power\n"));
  EXPECT_TRUE(Contains(csv, "\ntreat,naive,final_eval_accuracy,3,0.11,0.0851"));
  EXPECT_TRUE(Contains(csv, ",true,"));
  EXPECT_TRUE(Contains(csv, "\nsolo,naive,final_eval_accuracy,1,0.05,,,,false,,,\n"));
  EXPECT_TRUE(Contains(csv, "\ntreat,naive,kappa_median,0,,,,,false,,,\n"));

  const std::string summary = SummaryCsv(SummarizeArms(arms, runs, metrics));
  EXPECT_TRUE(Contains(summary, "arm,metric,n,mean,std,ci_low,ci_high\n"));
  // naive over its four ok runs (not the failed fifth): 0.5, 0.4, 0.6, 0.55.
  EXPECT_TRUE(Contains(summary, "\nnaive,final_eval_accuracy,4,0.5125,"));
  EXPECT_TRUE(Contains(summary, "\nsolo,final_eval_accuracy,1,0.45,,,\n"));
  EXPECT_TRUE(Contains(summary, "\nsolo,kappa_median,0,,,,\n"));

  const std::string md = ResultsMarkdown("t", "", arms, runs, "naive");
  EXPECT_TRUE(Contains(md, "## Differences against naive (paired by seed)"));
  EXPECT_TRUE(Contains(
      md, "| treat | final acc | 3 | +0.110 [+0.085, +0.135] | 0.003 | 0.005 | **yes** | – |"));
  EXPECT_TRUE(Contains(md, "| solo | final acc | 1 | +0.050 [–] | – | – | – | – |"));
  EXPECT_TRUE(Contains(md, "| treat | κ_eff median | 0 | – | – | – | – | – |"));
  EXPECT_FALSE(Contains(md, "| treat | κ median |")) << "not a headline metric";
  EXPECT_TRUE(Contains(md,
                       "Significant against naive (p Holm < 0.05 with at least 3 pairs): treat "
                       "final acc +0.110 (p Holm = 0.005)."));
  EXPECT_TRUE(Contains(md, "| naive | 4/5 | 0.512 ± "));

  runs.erase(runs.begin() + 5, runs.begin() + 8);  // treat's significant pairs
  EXPECT_TRUE(Contains(ResultsMarkdown("t", "", arms, runs, "naive"),
                       "No difference against naive is significant"));
}

// Steps with per-subset K_DR, evaluations with per-subset accuracy.
std::vector<nlohmann::json> SubsetRun(const std::string& subset, double accuracy) {
  std::vector<nlohmann::json> records = {
      {{"step", 0},
       {"eval_accuracy", 0.1},
       {"eval_accuracy_by_subset", {{subset, 0.0}, {"rest", 0.2}}}}};
  for (int64_t step = 1; step <= 4; ++step) {
    nlohmann::json record = Step(step, 1.0);
    record["kdr_mean_by_subset"] = {{subset, 0.1 * step},
                                    {"rest", step == 2 ? nlohmann::json() : nlohmann::json(-1.0)}};
    record["kdr_negative_fraction_by_subset"] = {{subset, 0.5}, {"rest", 0.25 * step}};
    if (step == 4) {
      record["eval_accuracy"] = accuracy;
      record["eval_accuracy_by_subset"] = {{subset, accuracy}, {"rest", nullptr}};
    }
    records.push_back(record);
  }
  return records;
}

TEST(ExperimentResultsTest, PerSubsetMetricsBecomeColumnsAndStatistics) {
  const RunMetrics m = SummarizeMetrics(SubsetRun("hard", 0.3));
  ASSERT_EQ(m.final_accuracy_by_subset.size(), 2u);
  EXPECT_EQ(m.final_accuracy_by_subset.at("hard"), 0.3) << "the last record that has it";
  EXPECT_FALSE(m.final_accuracy_by_subset.at("rest")) << "null there: unset, not 0";
  EXPECT_NEAR(*m.kdr_mean_median_by_subset.at("hard"), 0.25, 1e-12);  // .1 .2 .3 .4
  EXPECT_EQ(m.kdr_mean_median_by_subset.at("rest"), -1.0) << "the null step is skipped";
  EXPECT_EQ(m.kdr_negative_fraction_median_by_subset.at("rest"), 0.625);  // .25 .5 .75 1
  // Early: the first quarter of 4 steps, step 1 alone.
  EXPECT_NEAR(*m.kdr_mean_early_by_subset.at("hard"), 0.1, 1e-12);
  EXPECT_EQ(m.kdr_mean_early_by_subset.at("rest"), -1.0);
  EXPECT_TRUE(SummarizeMetrics(SyntheticRun(0.5)).final_accuracy_by_subset.empty());

  std::vector<RunResult> runs;
  for (uint64_t seed : {1, 2, 3}) {
    RunResult a;
    a.arm = "naive";
    a.seed = seed;
    a.name = "naive-s" + std::to_string(seed);
    a.status = "ok";
    a.metrics = SummarizeMetrics(SubsetRun("hard", 0.2 + 0.01 * seed));
    runs.push_back(a);
    RunResult b = a;
    b.arm = "other";
    b.name = "other-s" + std::to_string(seed);
    b.metrics = SummarizeMetrics(SubsetRun("hard", 0.5 + 0.02 * seed));
    runs.push_back(b);
  }
  RunResult plain;  // a run of the old schema: no subsets
  plain.arm = "plain";
  plain.seed = 1;
  plain.name = "plain-s1";
  plain.status = "ok";
  plain.metrics = SummarizeMetrics(SyntheticRun(0.5));
  runs.push_back(plain);
  RunResult easy = plain;  // another subset name
  easy.name = "plain-s2";
  easy.seed = 2;
  easy.metrics = SummarizeMetrics(SubsetRun("easy", 0.9));
  runs.push_back(easy);
  EXPECT_EQ(SubsetNames(runs), (std::vector<std::string>{"easy", "hard", "rest"}));

  const std::string csv = ResultsCsv(runs);
  const std::string header = csv.substr(0, csv.find('\n'));
  EXPECT_TRUE(Contains(header,
                       ",alarms_other,final_accuracy_easy,final_accuracy_hard,final_accuracy_rest,"
                       "kdr_mean_median_easy,kdr_mean_median_hard,kdr_mean_median_rest,"
                       "kdr_negative_fraction_median_easy,kdr_negative_fraction_median_hard,"
                       "kdr_negative_fraction_median_rest,peak_eval_accuracy,peak_eval_step,"
                       "eval_accuracy_auc,kdr_sign_agreement_logit_median,grad_cosine_median,"
                       "kdr_mean_early_easy,"
                       "kdr_mean_early_hard,kdr_mean_early_rest,error"));
  // naive-s1: no easy, hard 0.21, rest null; K_DR means -, 0.25, -1; fractions -, 0.5, 0.625;
  // peak 0.21 at step 4, AUC (0.1 + 0.21) / 2; no exact K_DR; early K_DR -, 0.1, -1.
  EXPECT_TRUE(Contains(csv, "\nnaive,1,naive-s1,ok,"));
  EXPECT_TRUE(Contains(csv, ",0,,0.21,,,0.25,-1,,0.5,0.625,0.21,4,0.155,,,,0.1,-1,\n"));
  EXPECT_TRUE(Contains(csv, ",0,,,,,,,,,,0.5,8,0.25,,,,,,\n")) << "plain-s1: no subset";

  const std::vector<AblationArm> arms = {
      {"naive", "", {}, 1}, {"other", "", {}, 2}, {"plain", "", {}, 3}};
  const std::vector<ComparedMetric> metrics = ComparedMetrics(runs);
  const std::string summary = SummaryCsv(SummarizeArms(arms, runs, metrics));
  EXPECT_TRUE(Contains(summary, "\nnaive,final_accuracy_hard,3,0.22,0.01,"));
  EXPECT_TRUE(Contains(summary, "\nnaive,final_accuracy_rest,0,,,,\n"));
  EXPECT_TRUE(Contains(summary, "\nplain,final_accuracy_easy,1,0.9,,,\n"));

  const ArmDifference* hard = FindDifference(PairedDifferences(arms, runs, "naive", metrics),
                                             "other", "final_accuracy_hard");
  ASSERT_NE(hard, nullptr);
  EXPECT_EQ(hard->n_pairs(), 3);
  EXPECT_NEAR(hard->difference->mean, 0.32, 1e-12);  // 0.31, 0.32, 0.33

  const std::string md = ResultsMarkdown("t", "", arms, runs, "naive");
  EXPECT_TRUE(Contains(md, "| arm | runs ok | acc easy | acc hard | acc rest | K_DR mean easy |"));
  EXPECT_TRUE(Contains(md, "| other | final acc"));
  EXPECT_TRUE(Contains(md, "| other | acc hard | 3 | +0.320 ["));
}

}  // namespace
}  // namespace kappa::cli
